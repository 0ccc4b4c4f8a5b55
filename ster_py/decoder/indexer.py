"""DeepSeek Sparse Attention's indexer: which keys each query attends to.

DeepSeek-V3.2 (DeepSeek-AI 2025, "DeepSeek-V3.2: Boosting ... with DeepSeek Sparse Attention");
Transformers' ``DeepseekV32Indexer`` / ``GlmMoeDsaIndexer`` / ``HYV4Indexer`` / ``Dots3NoteTextIndexer``;
llama.cpp's ``src/models/deepseek32.cpp`` (its "lightning indexer"). For a layer's normed input x
[hidden], the query latent c_q (``q_a``'s normed output, the attention's own) and n index heads of
width d::

    q_h   = wq_b(c_q) per head [d],  k = LayerNorm(wk(x)) [d]   (one key per position, cached)
    q_h, k rotated over rope_dim of their components (the first, or the last under ``rope_last``;
           adjacent pairs under ``interleaved``, else halves) by the layer's own rotation tables
    w     = weights_proj(x) [n] / sqrt(n)
    score(s) = sum_h w_h * relu(q_h . k(s)) / sqrt(d)

A query at position p sees the keys 0..p. Once there are more of them than ``topk``, it attends
only to the ``topk`` whose score is highest (equal scores: the earlier key first); with no more
than ``topk`` every key is kept and the attention is the dense one. A layer without an indexer of
its own (GLM-5's and HY V4's ``shared`` layers) attends to the keys the last indexed layer chose
for the same query in the same forward pass (``Indexer.choose``'s result, passed on by the block).

The choice enters attention as an additive score bias: 0 on the chosen keys, -inf elsewhere.
Transformers' Hadamard rotation and FP8 scoring (the reference's) are left out there as here: the
rotation is orthogonal, so the dot products are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .activations import softmax
from .linear import make_linear
from .norms import Norm
from .parts import Part

#: Score-matrix entries (queries x heads x keys) computed at a time; longer prompts go in chunks.
_CHUNK = 1 << 22


@dataclass(frozen=True)
class IndexerSpec:
    """The indexer of a model's indexed layers (module docstring).

    Attributes:
        n_heads: index heads (``index_n_heads``).
        head_dim: each index head's width, and the key's (``index_head_dim``).
        topk: keys kept per query once more are visible (``index_topk``).
        rope_dim: rotated components of each index query head and of the key (the layer's
            ``qk_rope_head_dim``).
        rope_last: the rotated components are the last ``rope_dim`` (HY V4), not the first.
        interleaved: the rotation pairs adjacent components (GLM-5, Dots3-Note), not halves.
        norm_eps: epsilon of the key's LayerNorm.
        kpool: 0, or the keys per pool of a pooled indexer (GLM-5-Next's ``index_kpool``): each ``kpool``
            consecutive keys (from the first) form a pool whose key is their sum weighted per channel by the
            softmax over the pool of ``idx_pool_gate`` (x) + ``idx_pool_ape``; a query scores the pools that
            closed at or before it and keeps the keys of its ``topk // kpool`` best (``select_pools``).
        tail: with ``kpool``, a query also keeps the keys of its own unfinished pool
            (``index_kpool_always_select_tail``).
    """

    n_heads: int
    head_dim: int
    topk: int
    rope_dim: int
    rope_last: bool = False
    interleaved: bool = False
    norm_eps: float = 1e-6
    kpool: int = 0
    tail: bool = True

    @property
    def key_width(self) -> int:
        """Numbers cached per position: the key, and a pooled indexer's gate logits beside it."""
        return self.head_dim * (2 if self.kpool else 1)

    def nbytes_per_position(self) -> int:
        """Bytes one position's cached index key costs (float32)."""
        return self.key_width * 4


class Indexer(Part):
    """One layer's indexer (module docstring).

    Args:
        spec: the ``IndexerSpec``.
        load: ``load(role, kind="weight", required=False)``: ``idx_q_b`` [n * d, q_lora_rank],
            ``idx_k`` [d, hidden], ``idx_k_norm`` (weight and bias [d]), ``idx_w`` [n, hidden].
        rope: the layer's ``Rope`` (its frequencies; the pairing is ``spec.interleaved``'s).
    """

    def __init__(self, spec: IndexerSpec, load, rope):
        from dataclasses import replace

        self.spec = spec
        self.q_b = make_linear(load("idx_q_b", required=True))
        self.k = make_linear(load("idx_k", required=True))
        self.k_norm = Norm("layer", spec.norm_eps, load("idx_k_norm", required=True), load("idx_k_norm", "bias"))
        self.w = make_linear(load("idx_w", required=True))
        self.pool_gate = self.pool_ape = None
        if spec.kpool:  # GLM-5-Next's pooled keys
            self.pool_gate = make_linear(np.asarray(load("idx_pool_gate", "", required=True)))
            self.pool_ape = np.asarray(load("idx_pool_ape", "", required=True), np.float32)
        self.rope = None if rope is None else replace(rope, interleaved=spec.interleaved, rotary_dim=spec.rope_dim)

    def read_order(self) -> list[tuple]:
        return [(self.k, self.w), (self.q_b,)]

    def _rotate(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate float32 [heads, T, d] over the spec's rope components (in place where contiguous)."""
        if self.rope is None:
            return x
        s = self.spec
        if not s.rope_last:
            return self.rope.apply(np.ascontiguousarray(x), cos, sin)
        tail = np.ascontiguousarray(x[..., s.head_dim - s.rope_dim:])
        x = np.array(x, np.float32)
        x[..., s.head_dim - s.rope_dim:] = self.rope.apply(tail, cos, sin)
        return x

    def keys(self, x: np.ndarray, cos_sin) -> np.ndarray:
        """float32 [T, d]: the index keys of x float32 [T, hidden] (the layer's normed input), rotated
        by ``cos_sin`` (the layer's tables at the tokens' positions, or None without rotation)."""
        k = self.k_norm(self.k(x))[None]
        if cos_sin is not None:
            k = self._rotate(k, *cos_sin)
        if self.pool_gate is not None:  # [key | the pool gate's logits], both cached
            return np.ascontiguousarray(np.concatenate([k[0], self.pool_gate(x)], axis=1), np.float32)
        return np.ascontiguousarray(k[0], np.float32)

    def scores(self, x: np.ndarray, q_latent: np.ndarray, keys: np.ndarray, cos_sin) -> np.ndarray:
        """float32 [T, S]: every query's score for every cached key (future ones included; ``choose``
        masks them). x float32 [T, hidden], q_latent float32 [T, q_lora_rank], keys float32 [S, d]."""
        s, T = self.spec, x.shape[0]
        if self.pool_ape is not None:
            keys = self.pooled(keys)
        q = self.q_b(q_latent).reshape(T, s.n_heads, s.head_dim).transpose(1, 0, 2)  # [n, T, d]
        if cos_sin is not None:
            q = self._rotate(q, *cos_sin)
        q = np.ascontiguousarray(q.transpose(1, 0, 2))  # [T, n, d]
        w = self.w(x).astype(np.float32) * np.float32(s.n_heads ** -0.5 * s.head_dim ** -0.5)  # [T, n]
        S = keys.shape[0]
        out = np.empty((T, S), np.float32)
        step = max(1, _CHUNK // max(1, s.n_heads * S))
        for a in range(0, T, step):
            b = min(T, a + step)
            raw = np.maximum(q[a:b] @ keys.T, np.float32(0))  # [t, n, S]
            out[a:b] = np.einsum("tn,tns->ts", w[a:b], raw)
        return out

    def choose(self, x: np.ndarray, q_latent: np.ndarray, keys: np.ndarray, positions: np.ndarray,
               cos_sin) -> np.ndarray | None:
        """The keys each query attends to: bool [T, S] (True: kept), or None when no query sees more
        than ``topk`` keys (every visible key is kept: the dense attention).

        Args:
            x: float32 [T, hidden], the layer's normed input.
            q_latent: float32 [T, q_lora_rank], the attention's normed query latent.
            keys: float32 [S, d], the index keys of positions 0..S-1 (``keys`` of each call, cached).
            positions: int [T], the queries' positions.
            cos_sin: the layer's rotation tables at ``positions``, or None.
        """
        if self.spec.kpool:
            return select_pools(self.scores(x, q_latent, keys, cos_sin), positions, keys.shape[0], self.spec)
        return select_top(self.scores(x, q_latent, keys, cos_sin), positions, self.spec.topk)

    def pooled(self, cached: np.ndarray) -> np.ndarray:
        """float32 [P, d]: the keys of the P whole pools among the cached rows [S, 2d] ([key | gate logits])."""
        s = self.spec
        P = cached.shape[0] // s.kpool
        rows = cached[:P * s.kpool].reshape(P, s.kpool, 2 * s.head_dim)
        logits = rows[..., s.head_dim:] + self.pool_ape
        return (softmax(logits, axis=1) * rows[..., :s.head_dim]).sum(axis=1).astype(np.float32)


def select_top(scores: np.ndarray, positions: np.ndarray, topk: int) -> np.ndarray | None:
    """bool [T, S]: per query at ``positions[t]``, the ``topk`` keys among 0..positions[t] whose
    ``scores`` [T, S] are highest (equal scores: the earlier key), or all of them when there are no
    more than ``topk``; None when that holds for every query."""
    positions = np.asarray(positions, np.int64)
    T, S = scores.shape
    visible = np.arange(S)[None, :] <= positions[:, None]
    if int(positions.max()) + 1 <= topk:
        return None
    keep = visible.copy()
    rows = np.nonzero(positions + 1 > topk)[0]
    masked = np.where(visible[rows], scores[rows], -np.inf)
    best = np.argsort(-masked, axis=1, kind="stable")[:, :topk]
    chosen = np.zeros((rows.size, S), bool)
    np.put_along_axis(chosen, best, True, axis=1)
    keep[rows] = chosen
    return keep


def select_pools(scores: np.ndarray, positions: np.ndarray, S: int, spec: IndexerSpec) -> np.ndarray | None:
    """bool [T, S]: a pooled indexer's choice (GLM-5-Next, Transformers' ``Glm5NextTextIndexer``). scores [T, P]
    are every query's scores of the P whole pools among the S keys; a query at p sees the pools that closed by
    then (pool j: keys j*kpool .. (j+1)*kpool - 1 <= p) and keeps the keys of the best min(topk // kpool, P) of
    them (equal scores: the earlier pool), and under ``tail`` the keys of its own unfinished pool. None when
    every query keeps every key up to itself."""
    positions = np.asarray(positions, np.int64)
    T, P = scores.shape
    k = spec.kpool
    seen = np.arange(P)[None, :] < ((positions + 1) // k)[:, None]
    masked = np.where(seen, scores, -np.inf)
    n = min(spec.topk // k, P)
    chosen = np.zeros((T, P), bool)
    if n:
        best = np.argsort(-masked, axis=1, kind="stable")[:, :n]
        np.put_along_axis(chosen, best, True, axis=1)
    chosen &= seen
    keep = np.zeros((T, S), bool)
    keep[:, :P * k] = np.repeat(chosen, k, axis=1)
    if spec.tail:
        start = (positions + 1) - (positions + 1) % k
        cols = np.arange(S)[None, :]
        keep |= (cols >= start[:, None]) & (cols <= positions[:, None])
    visible = np.arange(S)[None, :] <= positions[:, None]
    return None if np.array_equal(keep, visible) else keep


def choice_bias(keep: np.ndarray | None) -> np.ndarray | None:
    """The additive score bias of a choice: float32 [1, T, S], 0 on kept keys and -inf elsewhere
    (None for None)."""
    if keep is None:
        return None
    return np.where(keep, np.float32(0), np.float32(-np.inf)).astype(np.float32)[None]
