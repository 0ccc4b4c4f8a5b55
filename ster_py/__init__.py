"""ster-py: run, inspect and adapt open-weight language models on the CPU.

The library is organised as a one-way flow: ``resolve`` turns a model
reference into a ``Resolved`` (config, tokenizer, weights), ``families`` and
``config`` normalise the configuration into a ``ModelSpec``, the generic
``decoder`` runs it, and ``generate`` / ``capture`` / ``parity`` / ``tune``
build on the decoder.

The names below are the library's front door (README.md, "As a library"); each is
imported on first use, so ``import ster_py`` stays as light as the CLI's start needs:

- ``load_model(model)`` -> ``LoadedModel`` (``.decoder``, ``.tokenizer``, ``.spec``,
  ``.stop_ids()``); ``load_tokenizer(model)``; ``set_threads(n)``; ``with float_activations():`` around
  forward passes to compare with another implementation (every product on float32 inputs, as ``capture``
  and ``parity`` run; generation's defaults round some products' inputs to 16 bits for speed).
- ``Session(loaded).reply(messages, Sampling(...))``: a chat answer as the CLI gives it
  (template, end tokens, stop strings, prompt cache); ``ster_py.generate.generate(decoder, ids,
  sampling, loaded.stop_ids())`` the token-level loop under it.
- ``ster_py.capture.capture(loaded, prompts, layers)``: hidden states; ``caa`` / ``pca`` build a
  ``SteeringVector`` from two captures,
  ``steering_hook(vector, strength)`` applies one, ``read_vector`` / ``write_vector``.
- ``load_adapter_for(path, loaded)`` + ``apply_adapter``: a LoRA at run time;
  ``merge_adapter(model, adapter, output)``: merged weights on disk (``model`` a checkpoint's name or
  path and ``adapter`` the adapter's, not loaded objects).
"""
from .errors import SterError

__version__ = "0.1.0"

# name -> module (relative) that defines it
_LAZY = {
    "load_model": "load", "load_tokenizer": "load", "LoadedModel": "load",
    "set_threads": "decoder.qlinear", "float_activations": "decoder.qlinear",
    # not ``generate`` nor ``capture``: those names are modules of this package, which an import binds here
    "Sampling": "generate", "Generation": "generate",
    "Session": "conversation",
    "caa": "steering", "pca": "steering", "steering_hook": "steering", "read_vector": "steering",
    "write_vector": "steering", "SteeringVector": "steering",
    "load_adapter_for": "adapters", "apply_adapter": "adapters",
    "merge_adapter": "tune.merge",
}
__all__ = ["SterError", "__version__", *_LAZY]


def __getattr__(name: str):
    """Import a front-door name's module when the name is first used (PEP 562)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ster_py' has no attribute {name!r}")


def __dir__():
    """The module's names and the front door's, each once (a lazy name is a global too once used)."""
    return sorted(set(globals()) | set(_LAZY))
