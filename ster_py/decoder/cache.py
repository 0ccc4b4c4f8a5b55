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

_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


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

    Raises:
        ValueError: ``dtype`` is neither float32 nor float16.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int = 256,
                 dtype=np.float32, layer_shapes: list[tuple[int, int, int]] | None = None,
                 slots: list | None = None):
        dtype = np.dtype(dtype)
        if dtype not in _DTYPES:
            raise ValueError(f"the KV cache holds float32 or float16 keys and values, not {dtype}")
        self.dtype = dtype
        self.length = 0
        self._slots = list(slots) if slots is not None else [None] * num_layers
        self._shapes = (list(layer_shapes) if layer_shapes is not None else
                        [(0, 0, 0) if slot is not None else (num_kv_heads, head_dim, head_dim) for slot in self._slots])
        self._k = [np.empty((kv, capacity if kv else 0, dk), dtype) for kv, dk, _ in self._shapes]
        self._v = [np.empty((kv, capacity if kv else 0, dv), dtype) for kv, _, dv in self._shapes]

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

    def nbytes_per_position(self) -> int:
        """Bytes one position costs across all layers (keys and values, at the cache dtype, and
        what each other slot's ``nbytes_per_position()`` says)."""
        return (sum(kv * (dk + dv) for kv, dk, dv in self._shapes) * self.dtype.itemsize
                + sum(s.nbytes_per_position() for s in self._slots if s is not None))

    def nbytes_fixed(self) -> int:
        """Bytes the slots hold whatever the length (recurrent states), from their ``nbytes_fixed()``."""
        return sum(s.nbytes_fixed() for s in self._slots if s is not None)

    def checkpoint(self) -> "CacheCheckpoint":
        """The cache as it stands, to come back to with ``restore``: the committed length and a
        copy of every recurrent state (``RecurrentState.copy_arrays``; its bytes are
        ``nbytes_fixed()``). Keys, values and latent rows are not copied: the cache only ever
        appends, so the rows of the first ``length`` positions stay as they are."""
        return CacheCheckpoint(self.length, [s.copy_arrays() if isinstance(s, RecurrentState) else None
                                             for s in self._slots])

    def restore(self, checkpoint: "CacheCheckpoint") -> None:
        """Return to ``checkpoint`` (taken from this cache by ``checkpoint()``): the length goes back
        and every recurrent state is copied back; what was staged or committed after it is
        dropped (its rows are overwritten by the next call).

        Raises:
            ValueError: a checkpoint of a cache with other slots, or one ahead of this cache.
        """
        if len(checkpoint.states) != len(self._slots) or checkpoint.length > self.length:
            raise ValueError("this checkpoint was not taken from this cache")
        for slot, arrays in zip(self._slots, checkpoint.states):
            if isinstance(slot, RecurrentState):
                slot.load_arrays(arrays)
        self.length = checkpoint.length


class CacheCheckpoint:
    """What ``KVCache.checkpoint`` keeps: ``length`` (positions committed) and, per layer, a copy
    of its recurrent state's arrays (None for a layer without one)."""

    def __init__(self, length: int, states: list):
        self.length, self.states = int(length), states

    def nbytes(self) -> int:
        """Bytes the copied states hold."""
        return sum(a.nbytes for st in self.states if st for a in st.values())


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

    def copy_arrays(self) -> dict[str, np.ndarray]:
        """A copy of every array (name -> float32 array), for ``load_arrays``."""
        return {name: a.copy() for name, a in self._arrays.items()}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Overwrite the state in place with ``copy_arrays()``'s arrays (same names and shapes)."""
        for name, a in self._arrays.items():
            a[...] = arrays[name]
