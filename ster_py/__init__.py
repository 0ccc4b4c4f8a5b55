"""ster-py: run, inspect and adapt open-weight language models on the CPU.

The library is organised as a one-way flow: ``resolve`` turns a model
reference into a ``Resolved`` (config, tokenizer, weights), ``families`` and
``config`` normalise the configuration into a ``ModelSpec``, the generic
``decoder`` runs it, and ``generate`` / ``capture`` / ``parity`` / ``tune``
build on the decoder.
"""
from .errors import SterError

__version__ = "0.1.0"
__all__ = ["SterError", "__version__"]
