"""Block-sparse attention chosen by an index branch (MiniMax Sparse Attention, MiniMax-M3).

Each key/value group g has one index query per token (``index_q``, ``index_dim`` wide, RMS-normed by
``index_q_norm`` and rotated like the main heads); every position has one index key shared by all
groups (``index_k``, normed and rotated the same way), kept in this layer's cache slot. A key j scores
``iq_g . ik_j`` (no scale) for a query at position p when j <= p; a block of ``block_size`` keys (counted
from key slot 0) scores as its best visible key. Each query of group g keeps the ``topk_blocks`` best
blocks, its own block and the ``local_blocks - 1`` before it always among them, and its heads attend
only the visible keys of those blocks. While a sequence holds no more blocks than a query keeps, every
key is kept and the layer is dense. Source: seed 002; Transformers 5.24's ``MiniMaxM3VLIndexer``
(``forward`` and ``build_block_mask``), which this module reproduces for one unpadded sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import Attention
from .linear import make_linear


@dataclass(frozen=True)
class BlockSparseSpec:
    """The index branch's shape (``ModelSpec.block_sparse``).

    Attributes:
        index_dim: the width of an index query or key (``index_head_dim`` / ``sparse_index_dim``).
        block_size: keys per block (``index_block_size`` / ``sparse_block_size``).
        topk_blocks: blocks a query keeps (``index_topk_blocks`` / ``sparse_topk_blocks``).
        local_blocks: the blocks ending at the query's own that it always keeps (``index_local_blocks``).
    """

    index_dim: int
    block_size: int
    topk_blocks: int
    local_blocks: int


def kept_keys(iq: np.ndarray, ik: np.ndarray, positions: np.ndarray, spec: BlockSparseSpec) -> np.ndarray | None:
    """Which keys each group's queries keep.

    Args:
        iq: float32 [groups, T, index_dim], the normed, rotated index queries at ``positions`` (int [T]).
        ik: float32 [S, index_dim], the index keys of positions 0..S-1.
        spec: the ``BlockSparseSpec``.

    Returns:
        bool [groups, T, S] (True: attended), or None when every visible key is kept (no query's
        blocks outnumber ``topk_blocks``).
    """
    S, bs = ik.shape[0], spec.block_size
    positions = np.asarray(positions, np.int64)
    if int(positions.max()) // bs + 1 <= spec.topk_blocks:
        return None
    n_blocks = -(-S // bs)
    visible = np.arange(S)[None, :] <= positions[:, None]                      # [T, S]
    scores = np.where(visible, iq @ ik.T, -np.inf)                              # [G, T, S]
    padded = np.full(scores.shape[:2] + (n_blocks * bs,), -np.inf, np.float32)
    padded[..., :S] = scores
    blocks = padded.reshape(scores.shape[:2] + (n_blocks, bs)).max(axis=-1)     # [G, T, n_blocks]
    own = positions // bs
    for back in range(spec.local_blocks):  # the local blocks win every choice
        blocks[:, np.arange(len(positions)), np.maximum(own - back, 0)] = np.inf
    k = min(spec.topk_blocks, n_blocks)
    best = np.argpartition(-blocks, k - 1, axis=-1)[..., :k]
    chosen = np.zeros(blocks.shape, bool)
    np.put_along_axis(chosen, best, True, axis=-1)
    chosen &= blocks > -np.inf  # a block with no visible key is never attended
    return np.repeat(chosen, bs, axis=-1)[..., :S] & visible


class IndexKeys:
    """A block-sparse layer's cache slot beside its keys and values: one float32 index key per position.

    Args:
        width: the index key's width; capacity: positions held before the buffer first grows (doubling).
    """

    def __init__(self, width: int, capacity: int = 256):
        self.keys = np.empty((capacity, int(width)), np.float32)

    def append(self, start: int, rows: np.ndarray) -> np.ndarray:
        """Store float32 ``rows`` [T, width] at positions start..start+T-1; returns the keys of positions
        0..start+T-1 (a view, float32 [start + T, width])."""
        end = start + rows.shape[0]
        if end > self.keys.shape[0]:
            grown = np.empty((max(end, 2 * self.keys.shape[0]), self.keys.shape[1]), np.float32)
            grown[:start] = self.keys[:start]
            self.keys = grown
        self.keys[start:end] = rows
        return self.keys[:end]

    def nbytes_per_position(self) -> int:
        return self.keys.shape[1] * 4

    def nbytes_fixed(self) -> int:
        return 0

    def rollback(self, length: int) -> bool:
        """Keys are kept by position: going back needs nothing (``KVCache.rollback``)."""
        return True


class BlockSparseAttention(Attention):
    """``Attention`` whose queries attend only the key blocks the index branch keeps (module docstring).

    Reads ``index_q`` [groups * index_dim, hidden], ``index_k`` [index_dim, hidden] and their norms
    ``index_q_norm`` / ``index_k_norm`` [index_dim] beside the attention's own tensors.
    """

    def __init__(self, spec, i: int, load, norm):
        super().__init__(spec, i, load, norm)
        self.index_q = make_linear(load("index_q", required=True))
        self.index_k = make_linear(load("index_k", required=True))
        self.index_q_norm, self.index_k_norm = norm("index_q_norm"), norm("index_k_norm")

    def new_slot(self, dtype) -> IndexKeys:
        return IndexKeys(self.spec.block_sparse.index_dim)

    def read_order(self) -> list[tuple]:
        return [(self.index_q, self.index_k)] + super().read_order()

    def __call__(self, x: np.ndarray, cache, positions: np.ndarray, bias, tables: dict) -> np.ndarray:
        """x float32 [T, hidden_size] (normed) -> float32 [T, hidden_size]; caches keys, values and index keys."""
        bs = self.spec.block_sparse
        T, (H, KV, _, _) = x.shape[0], self.shape
        iq = np.ascontiguousarray(self.index_q(x).reshape(T, KV, bs.index_dim).transpose(1, 0, 2))
        ik = np.ascontiguousarray(self.index_k(x).reshape(1, T, bs.index_dim))
        iq, ik = self.index_q_norm(iq), self.index_k_norm(ik)
        if self.layer.rope is not None:
            self.layer.rope.apply_pair(iq, ik, *self.rope_tables(positions, tables))
        keys = cache.slot(self.i).append(cache.length, ik[0])
        keep = kept_keys(iq, keys, positions, bs)
        if keep is not None:  # -inf where a head's group does not keep the key, as [H, T, S]
            mask = np.where(keep, np.float32(0), np.float32(-np.inf))
            sparse = np.repeat(mask, H // KV, axis=0)
            bias = sparse if bias is None else bias + sparse
        return super().__call__(x, cache, positions, bias, tables)
