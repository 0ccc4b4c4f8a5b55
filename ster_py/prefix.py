"""A prompt cache that reuses the longest shared prefix of consecutive prompts, exactly.

A conversation re-sends its whole history every turn, and the server's requests often share a
system prompt. ``PromptCache`` keeps one sequence's cache between calls: a new prompt rolls
the cache back to the longest prefix it shares with the tokens already there and prefills only
the rest.

The reuse is exact where the matrix products are row-exact: a position's keys and values do not
depend on how the prompt was cut into calls (quantized products work token by token; float products
of a few rows are padded, ``decoder.linear.MIN_ROWS``; attention reads each query's own rows). On
OpenBLAS's SkylakeX kernels (AVX-512 CPUs), products of real models' sizes are row-exact and a reply
equals a cold run's (a fresh cache, the whole prompt in one call) bit for bit (SmolLM2,
test_real_models.py); products as tiny as the test models' (M*N*K up to about 1e6) go through its
small-matrix kernels, whose sums depend on the row count, and differ in the last bits
(test_prefix.py). On its Haswell/Zen kernels (AVX2 CPUs) a float32 row is rounded by its place among
the rows of its call, so a float32 checkpoint's reuse agrees with a cold run to ~1e-5 relative, not
bit for bit (``decoder.linear.blas_rows_exact`` says which this process has); quantized weights go
through ster's own kernels either way. Decoded positions are not reused: a one-token step takes
other kernels (int16 activations in the quantized products, BLAS's vector product) whose sums round
differently, so after a reply the cache's exact part ends where its prompt ended, and ``extend`` can
prefill a history's known continuation (a chat's last answer, as the template renders it) while the
user reads. For the same reason the part after the reused prefix is never a single token (one token
would take the decode path): the prefix then gives one back.

The cache rolls back through ``KVCache.rollback(length)``; a slot that cannot go back (a
recurrent state without a checkpoint at that length) refuses, and the prompt is then prefilled
from a fresh cache.

Hybrids (seed 000): a recurrent state cannot be truncated, so ``prefill(..., checkpoint_at=n)``
prefills the first n tokens, keeps one copy of every recurrent state there
(``KVCache.checkpoint``; a new one replaces the last) and then the rest. ``generate`` passes the
end of the prompt's last complete message (``last_turn_end``: after its last end-of-turn token).
A later prompt that shares at least those n tokens rolls back to the checkpoint and prefills
only what follows; sharing fewer, it is prefilled from a fresh cache.
"""
from __future__ import annotations

import numpy as np

from .decoder.cache import KVCache, cache_dtype
from .errors import Cancelled


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest shared start of two id lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """One sequence's cache kept between calls (see the module docstring).

    Args:
        decoder: the model (``decoder.model.Decoder``).
        kv_dtype: the key/value dtype (np.float32 or np.float16, or "f32" / "f16"; ``cache_dtype``).

    Attributes:
        ids: the tokens whose positions the cache holds exactly (the last prompt, or what
            ``extend`` added); decoded positions beyond them are dropped by the next call.
        reused, prefilled: tokens of the last ``prefill`` taken from the cache and computed.
        key: what the cached positions were computed under besides the ids (a steering
            vector and strength): a call with another key starts afresh, and so does a call
            with a ``layer_hook`` but no key (nothing says two such hooks are equal), or after
            the decoder's weights changed (``Decoder.revision``, bumped by ``apply_adapter``).
    """

    def __init__(self, decoder, kv_dtype=np.float32):
        self.decoder = decoder
        self.kv_dtype = cache_dtype(kv_dtype)
        self.cache: KVCache | None = None
        self.ids: list[int] = []
        self.key = None
        self.revision = self._decoder_revision()   # the decoder's weights the cached positions were computed with
        self.reused = 0
        self.prefilled = 0

    def reset(self) -> None:
        """Forget everything (the next prompt is prefilled whole)."""
        self.cache, self.ids, self.key = None, [], None

    def _same(self, key) -> bool:
        """Whether the cached positions were computed as a call with ``key`` would compute them."""
        return self.cache is not None and key == self.key and self.revision == self._decoder_revision()

    def _decoder_revision(self) -> int:
        """``Decoder.revision`` (0 for a stand-in decoder without one)."""
        return getattr(self.decoder, "revision", 0)

    @staticmethod
    def _key_of(layer_hook, key):
        """``key``, or for a hook without one a key equal to no other (its positions are never reused)."""
        return object() if layer_hook is not None and key is None else key

    def _start(self, ids: list[int], key) -> int:
        """Roll the cache back to the part of ``ids`` it can reuse; returns that length."""
        keep = common_prefix(self.ids, ids) if self._same(key) else 0
        if getattr(self.decoder.spec, "prefix_lm", False):
            keep = 0  # a prefix-LM prompt attends both ways within itself: no part of it can be reused
        keep = min(keep, len(ids) - 1)  # at least one token is computed: the last row's logits
        if len(ids) - keep == 1 and keep > 0:
            keep -= 1  # never a one-token prefill (module docstring)
        if keep > 0 and self.cache.rollback(keep):
            return keep
        at = self.cache.checkpoint_length() if self.cache is not None else None
        if at and at <= keep and self.cache.rollback(at):  # a hybrid: back to its checkpoint
            return at
        new = self.decoder.new_cache
        self.cache = new() if self.kv_dtype == np.float32 else new(self.kv_dtype)
        return 0

    def prefill(self, ids, *, layer_hook=None, key=None, checkpoint_at: int | None = None,
                normed: list | None = None, cancelled=None, progress=None) -> np.ndarray:
        """Make the cache hold ``ids`` and return the logits of their last position.

        Args:
            ids: int token ids (at least one).
            layer_hook: passed to the decoder (steering); ``key`` must name it (equal keys
                mean equal hooks), as positions computed under another hook are not reused.
            checkpoint_at: for a cache with recurrent states, the number of tokens after which to
                keep their checkpoint (used when it lies inside the part to compute).
            normed: if a list is given, it receives the last position's final-norm output, float32
                [1, hidden_size] (``Decoder.forward``'s ``normed``).
            cancelled: polled between the decoder's layers (``Decoder.forward``); True stops the
                prefill and raises ``Cancelled``. The cache then holds what it held before the call
                that was cut (keys and values are rows by position, and the cut call's were never
                committed), so the next prompt reuses that and its reply equals a cold run's; a cache
                with other per-layer state (recurrent, latent...) is dropped instead, as a cut call may
                have changed it.
            progress: optional ``progress(f"prefill {n}", done, total)`` after each layer the prefill runs,
                n the tokens computed (not those reused), ``done``/``total`` in layers (a hybrid's
                split prefill counts both calls' layers in one total).

        Returns:
            float32 [vocab_size]: the last position's logits, equal to a fresh cache's.

        Raises:
            Cancelled: ``cancelled()`` returned True before the prefill ended.
        """
        ids = [int(t) for t in ids]
        key = self._key_of(layer_hook, key)
        keep = self._start(ids, key)
        self.revision = self._decoder_revision()
        start = keep
        split = checkpoint_at is not None and keep < checkpoint_at < len(ids) and self.cache.has_recurrent_state()
        calls = 2 if split else 1
        done = {"calls": 0}

        def on_layer(layer: int, layers: int) -> None:  # the calls' layers as one count
            progress(f"prefill {len(ids) - keep}", done["calls"] * layers + layer, calls * layers)
            if layer == layers:
                done["calls"] += 1

        on_layer = on_layer if progress is not None else None
        try:
            if split:
                self.decoder.forward(ids[keep:checkpoint_at], self.cache, layer_hook=layer_hook, last_only=True,
                                     cancelled=cancelled, on_layer=on_layer)
                self.cache.checkpoint()
                start = checkpoint_at
            logits = self.decoder.forward(ids[start:], self.cache, layer_hook=layer_hook, last_only=True,
                                          bidirectional=start == 0, cancelled=cancelled, on_layer=on_layer,
                                          **({} if normed is None else {"normed": normed}))[-1]
        except Cancelled:
            if self.cache.has_slots():
                self.reset()
            else:  # the committed rows are ids[:length]; the cut call's staged rows get overwritten
                self.ids, self.key = ids[:self.cache.length], key
            self.reused = self.prefilled = 0
            raise
        self.ids, self.key = ids, key
        self.reused, self.prefilled = keep, len(ids) - keep
        return logits

    def extend(self, ids, *, layer_hook=None, key=None, cancelled=None, progress=None) -> int:
        """Prefill ``ids`` ahead of the next call (a history the next prompt will start with),
        reusing what the cache shares with them. Returns the tokens computed (0 when nothing
        was new, or ``ids`` holds fewer than two tokens).

        ``cancelled`` is polled between the decoder's layers as ``prefill`` polls it, with its guarantee:
        the cache then holds what it held before the call that was cut (a cache with other per-layer state
        is dropped); ``progress`` is reported as ``prefill`` reports it.

        Raises:
            Cancelled: ``cancelled()`` returned True before the prefill ended.
        """
        ids = [int(t) for t in ids]
        key = self._key_of(layer_hook, key)
        if len(ids) < 2 or (self._same(key) and common_prefix(self.ids, ids) == len(ids)):
            return 0
        self.prefill(ids, layer_hook=layer_hook, key=key, cancelled=cancelled, progress=progress)
        return self.prefilled
