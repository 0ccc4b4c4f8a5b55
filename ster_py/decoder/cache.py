"""The cache: one slot per layer, of the layer's mixer's kind.

An attention layer's slot is a growing buffer of rotated keys and values (below); a
layer whose mixer keeps another kind of state (a latent, a fixed-size recurrent state)
gets the slot object its mixer makes (``mixer.new_slot(dtype)``), reached through
``KVCache.slot(layer)``: the cache only holds it, counts its bytes and commits positions.
A layer may have both (Falcon-H1 runs attention and a scan side by side): its keys and
values are sized by ``layer_shapes``, (0, 0, 0) meaning none.

A recurrent mixer's slot is a ``RecurrentState``: named float32 arrays sized once when the
cache is made (a short convolution's last inputs, a scan's state), updated in place by
each forward call and never growing with the context.

Each decoded token costs one new position: attention reads the cached keys and
values instead of recomputing the prefix. The buffers are float32 (the default,
exact) or float16 (half the memory and half the bytes attention reads per token,
as llama.cpp keeps its cache by default; each key and value is rounded once, to
nearest even, when it is stored). Each layer's buffers have that layer's own
key/value head count and key and value widths (``layer_shapes``), which differ
between layers in some families (MiMo-V2-Flash's sliding-window layers).
"""
from __future__ import annotations

import numpy as np

from ..errors import SterError

_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
#: --kv-cache's names for the two dtypes
KV_CACHE_DTYPES = {"f32": np.float32, "f16": np.float16}


def cache_dtype(dtype) -> np.dtype:
    """float32 or float16 from a numpy dtype or ``--kv-cache``'s names "f32" / "f16".

    Raises:
        SterError: anything else.
    """
    try:
        out = np.dtype(KV_CACHE_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)
    except TypeError:
        out = None
    if out not in _DTYPES:
        raise SterError(f"the KV cache holds float32 or float16 keys and values (\"f32\" or \"f16\"), not {dtype!r}")
    return out


class KVCache:
    """Keys and values per layer: keys ``dtype`` [num_key_value_heads, capacity, head_dim],
    values [num_key_value_heads, capacity, v_head_dim].

    ``length`` counts the positions already committed; ``append`` stages the new
    positions of one forward call for a layer and returns the keys/values visible to
    it (committed + staged); ``advance`` commits them once every layer has run.

    Args:
        num_layers, num_kv_heads, head_dim: every layer's shape (values as wide as keys)...
        layer_shapes: ...unless given here: one (kv_heads, head_dim, v_head_dim) per layer,
            (0, 0, 0) for a layer without keys and values.
        slots: per layer, the slot object of a mixer that keeps its own state, or None. Without
            ``layer_shapes``, a layer with a slot gets no key/value buffers.
        keep_tokens: also keep the token id of every committed position (``tokens``; a model whose
            embedding reads the tokens before each one, LongCat-Flash-Lite's n-grams).

    Raises:
        SterError: ``dtype`` is neither float32 nor float16 (numpy dtypes, or the names "f32", "f16" that
            ``--kv-cache`` takes: numpy alone reads "f16" as a 16-byte float128).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int = 256,
                 dtype=np.float32, layer_shapes: list[tuple[int, int, int]] | None = None,
                 slots: list | None = None, keep_tokens: bool = False):
        dtype = cache_dtype(dtype)
        self.dtype = dtype
        self.length = 0
        self._slots = list(slots) if slots is not None else [None] * num_layers
        self._shapes = (list(layer_shapes) if layer_shapes is not None else
                        [(0, 0, 0) if slot is not None else (num_kv_heads, head_dim, head_dim) for slot in self._slots])
        self._k = [np.empty((kv, capacity if kv else 0, dk), dtype) for kv, dk, _ in self._shapes]
        self._v = [np.empty((kv, capacity if kv else 0, dv), dtype) for kv, _, dv in self._shapes]
        self._tokens = np.zeros(capacity, np.int64) if keep_tokens else None

    def tokens(self) -> np.ndarray:
        """The committed positions' token ids, int64 [length] (empty when the cache keeps none)."""
        return self._tokens[:self.length] if self._tokens is not None else np.zeros(0, np.int64)

    def store_tokens(self, ids: np.ndarray) -> None:
        """Stage the token ids of the positions the current forward call adds (committed by ``advance``);
        nothing when the cache keeps no tokens."""
        if self._tokens is None:
            return
        end = self.length + len(ids)
        if end > len(self._tokens):
            grown = np.zeros(max(end, 2 * len(self._tokens)), np.int64)
            grown[:self.length] = self._tokens[:self.length]
            self._tokens = grown
        self._tokens[self.length:end] = ids

    def slot(self, layer: int):
        """The state slot of a layer whose mixer keeps its own (None for an attention layer)."""
        return self._slots[layer]

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """k float32 [kv_heads, T, head_dim], v [kv_heads, T, v_head_dim] -> views of the cache dtype
        [kv_heads, length + T, head_dim] and [kv_heads, length + T, v_head_dim].

        The new rows are stored rounded to the cache dtype (numpy's cast: round to nearest even)."""
        end = self.length + k.shape[1]
        keys, values = self.buffers(layer, end)
        keys[:, self.length:end] = k
        values[:, self.length:end] = v
        return keys[:, :end], values[:, :end]

    def buffers(self, layer: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The whole key and value buffers of ``layer``, [kv_heads, capacity, head_dim or v_head_dim]
        with capacity >= ``end`` (grown, doubling, keeping the committed rows). For kernels that
        store the new rows themselves (the fused decode step)."""
        if end > self._k[layer].shape[1]:
            cap = max(end, 2 * self._k[layer].shape[1])
            for buf in (self._k, self._v):
                old = buf[layer]
                grown = np.empty((old.shape[0], cap, old.shape[2]), self.dtype)
                grown[:, :self.length] = old[:, :self.length]
                buf[layer] = grown
        return self._k[layer], self._v[layer]

    def advance(self, n: int) -> None:
        """Commit ``n`` positions staged by the last forward call."""
        self.length += n

    def rollback(self, length: int) -> bool:
        """Forget every position from ``length`` on, so the next forward call continues at
        ``length`` (a prompt cache reusing a shared prefix: ``ster_py.prefix``).

        Keys and values are rows by position: the committed length just moves back (the rows
        beyond are overwritten). A slot of another kind is asked with its own
        ``rollback(length)`` (True when it could go back); a slot without that method, such
        as a recurrent state that holds no checkpoint at ``length``, refuses, and then
        nothing changes.

        Returns:
            True when the cache now holds exactly ``length`` positions; False when a slot
            refused (the caller starts a fresh cache instead).
        """
        if not 0 <= length <= self.length:
            return False
        slots = [s for s in self._slots if s is not None]
        if length < self.length and not all(hasattr(s, "rollback") for s in slots):
            return False
        if length < self.length and not all(s.rollback(length) for s in slots):
            return False
        self.length = length
        return True

    def nbytes_per_position(self) -> int:
        """Bytes one position costs across all layers (keys and values, at the cache dtype, and
        what each other slot's ``nbytes_per_position()`` says)."""
        return (sum(kv * (dk + dv) for kv, dk, dv in self._shapes) * self.dtype.itemsize
                + sum(s.nbytes_per_position() for s in self._slots if s is not None)
                + (8 if self._tokens is not None else 0))

    def nbytes_fixed(self) -> int:
        """Bytes the slots hold whatever the length (recurrent states), from their ``nbytes_fixed()``."""
        return sum(s.nbytes_fixed() for s in self._slots if s is not None)

    def checkpoint(self) -> None:
        """Keep a copy of every recurrent state as it stands at ``length`` (one per state: it
        replaces the one before), so that ``rollback(length)`` can come back here later (seed 000's
        prompt reuse for hybrids: ``ster_py.prefix``). Keys, values and latent rows need no copy."""
        for s in self._slots:
            if isinstance(s, RecurrentState):
                s.save(self.length)

    def checkpoint_length(self) -> int | None:
        """The length every recurrent state holds a checkpoint at (``checkpoint``), or None (no
        recurrent state, or no common checkpoint)."""
        at = {s.saved_at for s in self._slots if isinstance(s, RecurrentState)}
        return at.pop() if len(at) == 1 else None

    def has_slots(self) -> bool:
        """True when a layer keeps a state of its own (``slot``) beside plain keys and values."""
        return any(s is not None for s in self._slots)

    def has_recurrent_state(self) -> bool:
        """True when a layer keeps a recurrent state (which cannot roll back without a checkpoint)."""
        return any(isinstance(s, RecurrentState) for s in self._slots)


class RecurrentState:
    """A recurrent mixer's cache slot: named float32 arrays of fixed shapes, zero at the start.

    A mixer reads and updates them in place (``state["conv"]``, ``state["ssm"]``); prefill over
    a prompt and token-by-token decoding leave the same values, so the slot carries everything
    the next call needs, whatever the context length. State is kept in float32 whatever the
    key/value dtype (llama.cpp keeps recurrent states in f32 as well).

    Args:
        shapes: name -> shape (ints), e.g. {"conv": (K - 1, C), "ssm": (H, P, N)}.
    """

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self._arrays = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._arrays)

    def nbytes_fixed(self) -> int:
        """Bytes the state holds (the same at every length)."""
        return sum(a.nbytes for a in self._arrays.values())

    def nbytes_per_position(self) -> int:
        """A recurrent state does not grow with the context: 0."""
        return 0

    saved_at: int | None = None  # the length ``save`` was called at (None: no checkpoint)

    def save(self, length: int) -> None:
        """Keep a copy of the state as it stands after ``length`` positions (``KVCache.checkpoint``);
        it replaces an earlier copy and costs ``nbytes_fixed()`` more bytes."""
        self._saved = {name: a.copy() for name, a in self._arrays.items()}
        self.saved_at = int(length)

    def rollback(self, length: int) -> bool:
        """Go back to the copy ``save`` kept when it was taken at ``length`` (True); any other length
        cannot be reached, as the state cannot be truncated (False, nothing changes)."""
        if self.saved_at is None or length != self.saved_at:
            return False
        for name, a in self._arrays.items():
            a[...] = self._saved[name]
        return True
