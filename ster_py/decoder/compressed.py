"""Compressed attention: DeepSeek-V4's sliding-window attention beside compressed entries.

DeepSeek-V4 (DeepSeek-AI 2026, sections 2.3.1-2.3.2: Compressed Sparse Attention and Heavily
Compressed Attention); Transformers' ``DeepseekV4Attention``, ``DeepseekV4HCACompressor``,
``DeepseekV4CSACompressor``, ``DeepseekV4Indexer``. For a layer's normed input x [hidden], H heads of
width D whose trailing r components rotate (adjacent pairs)::

    c_q  = RMSNorm(q_a(x)) [q_lora_rank];  q_h = q_b(c_q)_h / rms(q_b(c_q)_h)   (a weightless norm per head)
    kv   = RMSNorm(kv_proj(x)) [D]        one key/value head: the key is also the value
    q_h, kv rotated at the token's position (the layer's rotation: "main" on sliding layers, the
         compressed layers' "compress" base with its YaRN)
    keys = every kv within ``sliding_window`` of the query (p - s < window), and on compressed
           layers the compressor's entries below
    out_h = softmax(scale * q_h . keys, with a learned sink logit per head) @ keys,
           its rotated slice rotated back at the query's position,
    y    = o_b(concat over G groups of o_a_g(heads of group g))   (``o_groups``, ``o_lora_rank``)

A compressor turns every window of ``rate`` tokens into one entry [D]: kv_c = kv_proj_c(x),
z = gate_proj_c(x) + position_bias[offset in window], entry = RMSNorm(sum over the window of
softmax(z) * kv_c) (per channel), rotated at the window's first position by the compress rotation.
Heavily compressed layers (``"heavy"``) use one series per token; compressed sparse layers
(``"sparse"``) two (kv_c and z are 2D wide): an entry mixes its own window's second series with the
previous window's first. A query at position p sees the entries whose window closed by then
(e < (p + 1) // rate). On sparse layers the Lightning Indexer, a compressor of its own at the index
width, scores entries by sum_h w_h * relu(q_h . k_e) / sqrt(d) (q = its q_b(c_q), rotated; w =
weights_proj(x) / sqrt(n)) and each query keeps its ``topk`` best visible entries.

The slot (``CompressedSlot``) keeps the rotated kv rows, and per compressor the tokens past the last
whole window, the entries made so far and the last window's first series, so a decode continued
from the cache sees what the same text read whole sees. This is the numpy definition (no kernel).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .activations import softmax
from .linear import make_linear
from .norms import Norm, rms_norm
from .parts import Part
from .rope import Rope


@dataclass(frozen=True)
class CompressedSpec:
    """The shape of a model's compressed-attention layers (module docstring).

    Attributes:
        head_dim: D, each query head's and the one key/value head's width (``head_dim``).
        rope_dim: r, the rotated trailing components (``qk_rope_head_dim``).
        q_lora_rank: the query latent's width.
        window: keys within this many positions of the query are seen (``sliding_window``).
        sparse_rate / heavy_rate: tokens per entry on compressed sparse / heavily compressed layers.
        o_groups / o_lora_rank: the grouped output projection.
        index_heads / index_dim / index_topk: the Lightning Indexer's heads, width and entries kept.
        norm_eps: epsilon of every RMS norm (the model's).
        main_rope / compress_rope: the rotations (``Rope`` over r, adjacent pairs) of the sliding layers
            and of the compressed layers and the compressors.
    """

    head_dim: int
    rope_dim: int
    q_lora_rank: int
    window: int
    sparse_rate: int
    heavy_rate: int
    o_groups: int
    o_lora_rank: int
    index_heads: int
    index_dim: int
    index_topk: int
    norm_eps: float
    main_rope: Rope
    compress_rope: Rope

    def tensor_shapes(self, hidden: int, heads: int, kind: str | None) -> dict[tuple[str, str], tuple[int, ...]]:
        """(role, kind) -> shape of a layer's compressed-attention tensors (``kind``: its ``LayerSpec.compress``)."""
        D, q, n, d = self.head_dim, self.q_lora_rank, self.index_heads, self.index_dim
        out = {("q_a", "weight"): (q, hidden), ("q_a_norm", "weight"): (q,), ("q_b", "weight"): (heads * D, q),
               ("ckv", "weight"): (D, hidden), ("ckv_norm", "weight"): (D,),
               ("o_a", "weight"): (self.o_groups * self.o_lora_rank, heads * D // self.o_groups),
               ("o_b", "weight"): (hidden, self.o_groups * self.o_lora_rank), ("sinks", ""): (heads,)}
        if kind is not None:
            w, rate = (2 * D, self.sparse_rate) if kind == "sparse" else (D, self.heavy_rate)
            out.update({("cmp_kv", "weight"): (w, hidden), ("cmp_gate", "weight"): (w, hidden),
                        ("cmp_bias", ""): (rate, w), ("cmp_norm", "weight"): (D,)})
        if kind == "sparse":
            out.update({("icmp_kv", "weight"): (2 * d, hidden), ("icmp_gate", "weight"): (2 * d, hidden),
                        ("icmp_bias", ""): (self.sparse_rate, 2 * d), ("icmp_norm", "weight"): (d,),
                        ("idx_q_b", "weight"): (n * d, q), ("idx_w", "weight"): (n, hidden)})
        return out


def _rotate_tail(rope: Rope, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x float32 [..., T, width] with its trailing ``rope.rotary_dim`` components rotated (a new array)."""
    r = rope.rotary_dim
    x = np.array(x, np.float32)
    tail = np.ascontiguousarray(x[..., x.shape[-1] - r:])
    x[..., x.shape[-1] - r:] = rope.apply_reference(tail, cos, sin)
    return x


class Compressor:
    """One compressor (module docstring): ``rate`` tokens per entry, one series or two (``overlap``).

    Args:
        rate: tokens per window; width: each entry's width (D, or the index width).
        overlap: two series per token (compressed sparse layers), else one.
        kv, gate: projections [series * width, hidden]; bias: float [rate, series * width];
        norm: the entries' RMS norm (``Norm``); rope: the compress rotation (its ``Rope``).
    """

    def __init__(self, rate: int, width: int, overlap: bool, kv, gate, bias, norm: Norm, rope: Rope):
        self.rate, self.width, self.overlap = rate, width, overlap
        self.kv, self.gate, self.norm, self.rope = kv, gate, norm, rope
        self.bias = np.asarray(bias, np.float32)

    def new_state(self) -> dict:
        """The state a sequence keeps: tokens past the last window, entries, the last window's first series."""
        w = (2 if self.overlap else 1) * self.width
        return {"kv": np.zeros((0, w), np.float32), "gate": np.zeros((0, w), np.float32),
                "entries": np.zeros((0, self.width), np.float32), "prev": None}

    def __call__(self, x: np.ndarray, state: dict) -> np.ndarray:
        """Add x's tokens (float32 [T, hidden]) and return every entry so far, float32 [E, width]."""
        kv = np.concatenate([state["kv"], self.kv(x)])
        gate = np.concatenate([state["gate"], self.gate(x)])
        rate, d = self.rate, self.width
        usable = (kv.shape[0] // rate) * rate
        first = state["entries"].shape[0] * rate
        state["kv"], state["gate"] = kv[usable:], gate[usable:]
        if usable == 0:
            return state["entries"]
        n = usable // rate
        ck = kv[:usable].reshape(n, rate, -1)
        cg = gate[:usable].reshape(n, rate, -1) + self.bias
        if self.overlap:  # entry w: window w-1's first series beside window w's second
            wk = np.zeros((n, 2 * rate, d), np.float32)
            wg = np.full((n, 2 * rate, d), -np.inf, np.float32)
            wk[:, rate:], wg[:, rate:] = ck[..., d:], cg[..., d:]
            wk[1:, :rate], wg[1:, :rate] = ck[:-1, :, :d], cg[:-1, :, :d]
            if state["prev"] is not None:
                wk[0, :rate], wg[0, :rate] = state["prev"]
            state["prev"] = (ck[-1, :, :d].copy(), cg[-1, :, :d].copy())
            ck, cg = wk, wg
        pooled = (ck * softmax(cg, axis=1)).sum(axis=1).astype(np.float32)
        entries = self.norm(pooled)
        pos = first + np.arange(n) * rate
        entries = _rotate_tail(self.rope, entries[None], *self.rope.cos_sin(pos, int(pos[-1]) + 1))[0]
        state["entries"] = np.concatenate([state["entries"], entries])
        return state["entries"]


class CompressedSlot:
    """A compressed-attention layer's cache: the rotated kv rows [S, D] and the compressors' states."""

    def __init__(self, width: int, states: dict):
        self.rows = np.zeros((0, width), np.float32)
        self.states = states

    def append(self, start: int, rows: np.ndarray) -> np.ndarray:
        """Store float32 rows [T, D] after the first ``start``; return the rows of positions 0..start+T-1."""
        self.rows = np.concatenate([self.rows[:start], rows])
        return self.rows

    def nbytes_per_position(self) -> int:
        return self.rows.shape[1] * 4

    def nbytes_fixed(self) -> int:
        return 0

    def rollback(self, length: int) -> bool:
        """The compressors' entries cannot be taken back: a shorter length is refused (False)."""
        return False


class CompressedAttention(Part):
    """One compressed-attention layer (module docstring); its ``LayerSpec.compress`` is None (sliding
    only), ``"sparse"`` or ``"heavy"``.

    Args:
        spec: the ``ModelSpec`` (``spec.compressed``; heads from ``attention_shape``).
        i: the layer.
        load: ``load(role, kind="weight", required=False)``: q_a, q_a_norm, q_b, ckv, ckv_norm, o_a, o_b,
            sinks; the compressor's cmp_kv, cmp_gate, cmp_bias, cmp_norm; the indexer's icmp_* , idx_q_b, idx_w.
    """

    ROLES = ()

    def __init__(self, spec, i: int, load, norm=None):
        c = spec.compressed
        self.spec, self.c, self.i = spec, c, i
        self.kind = spec.layers[i].compress
        self.heads = spec.attention_shape(i)[0]
        eps = c.norm_eps
        self.q_a = make_linear(load("q_a", required=True))
        self.q_a_norm = Norm("rms", eps, load("q_a_norm", required=True), None)
        self.q_b = make_linear(load("q_b", required=True))
        self.ckv = make_linear(load("ckv", required=True))
        self.ckv_norm = Norm("rms", eps, load("ckv_norm", required=True), None)
        self.o_a = np.asarray(load("o_a", required=True), np.float32)
        self.o_b = make_linear(load("o_b", required=True))
        self.sinks = np.asarray(load("sinks", "", required=True), np.float32).reshape(-1)
        self.rope = c.main_rope if self.kind is None else c.compress_rope
        self.compressor = self.indexer = None
        if self.kind is not None:
            sparse = self.kind == "sparse"
            self.compressor = Compressor(c.sparse_rate if sparse else c.heavy_rate, c.head_dim, sparse,
                                         make_linear(load("cmp_kv", required=True)),
                                         make_linear(load("cmp_gate", required=True)), load("cmp_bias", "", required=True),
                                         Norm("rms", eps, load("cmp_norm", required=True), None), c.compress_rope)
        if self.kind == "sparse":
            self.indexer = Compressor(c.sparse_rate, c.index_dim, True, make_linear(load("icmp_kv", required=True)),
                                      make_linear(load("icmp_gate", required=True)), load("icmp_bias", "", required=True),
                                      Norm("rms", eps, load("icmp_norm", required=True), None), c.compress_rope)
            self.idx_q_b = make_linear(load("idx_q_b", required=True))
            self.idx_w = make_linear(load("idx_w", required=True))

    def new_slot(self, dtype=None) -> CompressedSlot:
        """This layer's cache (float32 whatever ``dtype``)."""
        states = {}
        if self.compressor is not None:
            states["compressor"] = self.compressor.new_state()
        if self.indexer is not None:
            states["indexer"] = self.indexer.new_state()
        return CompressedSlot(self.c.head_dim, states)

    def read_order(self) -> list[tuple]:
        return []

    def _choose(self, x, c_q, entries_idx, positions, cos_sin) -> np.ndarray:
        """bool [T, E]: the entries each query keeps (the indexer's best visible ``index_topk``)."""
        c = self.c
        T, E = x.shape[0], entries_idx.shape[0]
        q = self.idx_q_b(c_q).reshape(T, c.index_heads, c.index_dim).transpose(1, 0, 2)
        q = _rotate_tail(c.compress_rope, q, *cos_sin).transpose(1, 0, 2)  # [T, n, d]
        w = self.idx_w(x).astype(np.float32) * np.float32(c.index_heads ** -0.5)
        scores = np.einsum("tn,tne->te", w, np.maximum(q @ entries_idx.T, 0) * np.float32(c.index_dim ** -0.5))
        visible = np.arange(E)[None, :] < ((positions + 1) // c.sparse_rate)[:, None]
        masked = np.where(visible, scores, -np.inf)
        k = min(c.index_topk, E)
        best = np.argsort(-masked, axis=1, kind="stable")[:, :k]
        keep = np.zeros((T, E), bool)
        np.put_along_axis(keep, best, True, axis=1)
        return keep & visible

    def __call__(self, x: np.ndarray, cache, positions: np.ndarray, bias, tables: dict) -> np.ndarray:
        """x float32 [T, hidden] (normed) -> float32 [T, hidden]; stores this layer's rows and states."""
        c, T, H, D = self.c, x.shape[0], self.heads, self.c.head_dim
        slot = cache.slot(self.i)
        cos_sin = self.rope.cos_sin(positions, int(positions[-1]) + 1)
        c_q = self.q_a_norm(self.q_a(x))
        q = self.q_b(c_q).reshape(T, H, D)
        q = rms_norm(q, None, c.norm_eps)
        q = _rotate_tail(self.rope, q.transpose(1, 0, 2), *cos_sin)  # [H, T, D]
        kv = _rotate_tail(self.rope, self.ckv_norm(self.ckv(x))[None], *cos_sin)[0]
        rows = slot.append(cache.length, kv)  # [S, D]
        S = rows.shape[0]
        s_idx = np.arange(S)[None, :]
        p = positions[:, None]
        allowed = (s_idx <= p) & (p - s_idx < c.window)
        keys, mask = rows, allowed
        if self.compressor is not None:
            entries = self.compressor(x, slot.states["compressor"])
            E = entries.shape[0]
            if self.indexer is not None:
                idx_entries = self.indexer(x, slot.states["indexer"])
                seen = self._choose(x, c_q, idx_entries, positions, c.compress_rope.cos_sin(
                    positions, int(positions[-1]) + 1)) if E else np.zeros((T, 0), bool)
            else:
                seen = np.arange(E)[None, :] < ((positions + 1) // c.heavy_rate)[:, None]
            keys = np.concatenate([rows, entries])
            mask = np.concatenate([allowed, seen], axis=1)
        scores = (q @ keys.T) * np.float32(D ** -0.5)  # [H, T, S + E]
        scores = np.where(mask[None], scores, -np.inf)
        sinks = np.broadcast_to(self.sinks[:, None, None], (H, T, 1))
        top = np.maximum(scores.max(axis=-1, keepdims=True), sinks)
        e = np.exp(scores - top)
        probs = e / (e.sum(axis=-1, keepdims=True) + np.exp(sinks - top))
        out = (probs @ keys).astype(np.float32)  # [H, T, D]
        cos, sin = cos_sin
        out = _rotate_tail(self.rope, out, cos, -sin).transpose(1, 0, 2)  # rotated back: [T, H, D]
        G, R = c.o_groups, c.o_lora_rank
        grouped = out.reshape(T, G, H * D // G)
        w = self.o_a.reshape(G, R, H * D // G)
        mid = np.einsum("tgi,gri->tgr", grouped, w).reshape(T, G * R)
        return self.o_b(np.ascontiguousarray(mid, dtype=np.float32))
