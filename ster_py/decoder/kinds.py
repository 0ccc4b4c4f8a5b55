"""The layer kinds a ``LayerSpec.mixer`` names, grouped by what the cache and the spec need of them.

Plain data with no imports, so reading a configuration (``config.py``, ``gguf/config.py``)
never imports a mixer's module: a dense model's load leaves the state-space, delta-rule,
latent and routed parts unimported (their dataclasses alone cost ~1 ms each to create).
"""

#: Kinds that keep a recurrent state (a ``cache.RecurrentState`` slot); the delta-rule kinds
#: (``decoder/delta.py``) are sized by ``ModelSpec.delta``, the others by ``ModelSpec.ssm``.
RECURRENT_MIXERS = ("mamba", "mamba2", "hybrid", "shortconv", "lightning", "shared_hybrid", "gated_delta", "kda")
#: Kinds that keep keys and values.
ATTENTION_MIXERS = ("attention", "latent", "hybrid", "shared_hybrid", "block_sparse", "relative")
#: Kinds of the delta-rule mixers.
DELTA_MIXERS = ("gated_delta", "kda")
