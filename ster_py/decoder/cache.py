"""The key/value cache: one growing buffer of rotated keys and values per layer.

Each decoded token costs one new position: attention reads the cached keys and
values instead of recomputing the prefix.
"""
from __future__ import annotations

import numpy as np


class KVCache:
    """Keys and values per layer, float32 [num_key_value_heads, capacity, head_dim].

    ``length`` counts the positions already committed; ``append`` stages the new
    positions of one forward call for a layer and returns the keys/values visible to
    it (committed + staged); ``advance`` commits them once every layer has run.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int = 256,
                 dtype=np.float32):
        if np.dtype(dtype) != np.float32:
            raise ValueError("the KV cache holds float32 keys and values")
        self.length = 0
        self._shape = (num_kv_heads, capacity, head_dim)
        self._k = [np.empty(self._shape, np.float32) for _ in range(num_layers)]
        self._v = [np.empty(self._shape, np.float32) for _ in range(num_layers)]

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """k, v float32 [kv_heads, T, head_dim] -> views [kv_heads, length + T, head_dim]."""
        end = self.length + k.shape[1]
        if end > self._k[layer].shape[1]:
            cap = max(end, 2 * self._k[layer].shape[1])
            for buf in (self._k, self._v):
                grown = np.empty((self._shape[0], cap, self._shape[2]), np.float32)
                grown[:, :self.length] = buf[layer][:, :self.length]
                buf[layer] = grown
        self._k[layer][:, self.length:end] = k
        self._v[layer][:, self.length:end] = v
        return self._k[layer][:, :end], self._v[layer][:, :end]

    def advance(self, n: int) -> None:
        """Commit ``n`` positions staged by the last forward call."""
        self.length += n

    def nbytes_per_position(self) -> int:
        """Bytes one position costs across all layers (keys and values)."""
        return 2 * len(self._k) * self._shape[0] * self._shape[2] * 4
