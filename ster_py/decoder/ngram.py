"""Hashed n-gram embeddings beside the token embedding (LongCat-Flash-Lite, seed 002).

For n = ``neighbors`` (emb_neighbor_num) and k = ``splits`` (emb_split_num) there are k * (n - 1)
tables. Table ``index = (order - 2) * k + j`` (order 2..n, j 0..k-1) has ``rows[index]`` rows
(ngram_vocab_size_ratio * vocab_size + 2 * index + 1) of ``width`` = hidden_size // (k * (n - 1))
columns, and its own projection ``post_proj[index]`` [hidden_size, width]. For a token t at
position p, with prev_d the token d positions before it (0 when that position lies before the
start of t's run; a run restarts after each end-of-sequence token), order o and table index i:

    row = (t + sum_{d=1}^{o-1} prev_d * (vocab_size^d mod rows[i])) mod rows[i]

and the embedding is (token_embedding(t) + sum_i post_proj[i](table_i[row_i])) / (1 + k * (n - 1)).
A decode step needs the last n - 1 tokens before it, which the cache keeps (``KVCache.tokens``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SterError
from .linear import make_linear


@dataclass(frozen=True)
class NgramSpec:
    """The n-gram embedding's shape (module docstring).

    Attributes:
        neighbors: the highest n-gram order (emb_neighbor_num, at least 2).
        splits: tables per order (emb_split_num).
        rows: each table's row count, by table index.
        width: each table's columns (hidden_size // (splits * (neighbors - 1))).
        vocab_size: the token vocabulary (the hash's base).
        eos: the end-of-sequence ids after which a run restarts.
    """

    neighbors: int
    splits: int
    rows: tuple[int, ...]
    width: int
    vocab_size: int
    eos: tuple[int, ...] = ()

    @property
    def tables(self) -> int:
        return self.splits * (self.neighbors - 1)


def ngram_rows(spec: NgramSpec, context: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The table rows of the new tokens: int64 [tables, T].

    Args:
        context: int [C] the tokens before ``ids`` in the sequence (only the last neighbors - 1 matter).
        ids: int [T] the new tokens.
    """
    n = spec.neighbors
    ctx = np.asarray(context, np.int64)[-(n - 1):] if n > 1 else np.zeros(0, np.int64)
    seq = np.concatenate([ctx, np.asarray(ids, np.int64)])
    c, T = len(ctx), len(ids)
    # run[p]: the first position of p's run (after the last end-of-sequence token before p)
    is_eos = np.isin(seq, np.asarray(spec.eos, np.int64)) if spec.eos else np.zeros(len(seq), bool)
    last_eos = np.maximum.accumulate(np.where(is_eos, np.arange(len(seq)), -1))
    run = np.concatenate([[0], last_eos[:-1] + 1]) if len(seq) else np.zeros(0, np.int64)
    # the context may begin mid-run: positions before it are unknown, hence only prev_d with d < n are read
    run = np.maximum(run, 0)
    pos = np.arange(c, c + T)
    prev = []
    for d in range(1, n):
        src = pos - d
        ok = (src >= 0) & (src >= run[pos])
        prev.append(np.where(ok, seq[np.clip(src, 0, None)], 0))
    out = np.empty((spec.tables, T), np.int64)
    tok = seq[pos]
    for order in range(2, n + 1):
        for j in range(spec.splits):
            i = (order - 2) * spec.splits + j
            r = spec.rows[i]
            h = tok % r
            for d in range(1, order):
                h = (h + prev[d - 1] * pow(spec.vocab_size, d, r)) % r
            out[i] = h
    return out


class NgramEmbedding:
    """The embedding of module docstring: ``__call__(ids, context, token_embedding)`` -> float32 [T, hidden].

    Args:
        spec: the ``NgramSpec``.
        tables: per table index, its rows float [rows[i], width].
        projections: per table index, ``post_proj`` weight float [hidden, width].

    Raises:
        SterError: a table or projection whose shape is not the configuration's.
    """

    def __init__(self, spec: NgramSpec, tables: list, projections: list):
        self.spec = spec
        for i, t in enumerate(tables):
            if tuple(t.shape) != (spec.rows[i], spec.width):
                raise SterError(f"n-gram table {i} has shape {list(t.shape)}, but the configuration implies "
                                f"[{spec.rows[i]}, {spec.width}] (ngram_vocab_size_ratio * vocab_size + 2 * {i} + 1 "
                                "rows of hidden_size / (emb_split_num * (emb_neighbor_num - 1)) columns); the weights "
                                "and the config disagree")
        self.tables = tables
        self.proj = [make_linear(p) for p in projections]

    def __call__(self, ids: np.ndarray, context: np.ndarray, tok: np.ndarray) -> np.ndarray:
        """ids int [T], context int [C] (the tokens before them), tok float32 [T, hidden] (their token
        embeddings) -> float32 [T, hidden]."""
        rows = ngram_rows(self.spec, context, ids)
        h = np.array(tok, dtype=np.float32, copy=True)
        for i, (table, proj) in enumerate(zip(self.tables, self.proj)):
            h += proj(np.asarray(table[rows[i]], dtype=np.float32))
        return h * np.float32(1.0 / (1 + self.spec.tables))
