"""Multi-head latent attention: the DeepSeek-V2 line's attention, with a compressed cache.

DeepSeek-V2 (arXiv:2405.04434, section 2.1); Transformers' ``DeepseekV2Attention`` /
``DeepseekV3Attention`` / ``MiniCPM3Attention``; llama.cpp's ``src/models/deepseek2.cpp``.
For a token's normed input x [hidden] and H heads, each ``nope + rope`` wide for queries and
keys and ``v`` wide for values::

    q      = q_b(norm_q(q_a(x)))    (or one q(x) without a query bottleneck)  -> per head [q_nope | q_pe]
    c      = kv_a(x) = [latent (r) | k_pe (rope)],  latent = norm_kv(latent)
    q_pe, k_pe rotated (only the rope part rotates; k_pe is one part shared by every head)
    kv_b(latent) = per head [k_nope (nope) | value (v)]
    score_h(s) = scale * (q_nope_h . k_nope_h(s) + q_pe_h . k_pe(s)),  causal softmax,  out = o(values)

The cache keeps, per position, the row ``[latent | k_pe]``: r + rope numbers per layer
(``LatentSlot``) instead of H * (nope + rope + v) for expanded keys and values.

Two ways to attend, equal up to float rounding:

- expand (prompts): kv_b is applied to every cached latent, giving each head's keys and values,
  and attention runs as usual (what Transformers does);
- absorb (decoded tokens, or every call when the file stores kv_b only split per head): kv_b's key
  rows fold into the query, ``q_abs_h = K_h^T q_nope_h`` (r wide), and its value rows into the
  output, ``out_h = V_h o_h``, so a token attends with one key/value head over the cached rows
  themselves: keys ``[latent | k_pe]`` (r + rope wide) against queries ``[q_abs | q_pe]``, values
  the latent (llama.cpp's deepseek2 graph with ``wk_b`` / ``wv_b``). A decoded token never
  re-expands the cache.

Rotation pairs adjacent components (DeepSeek, ``rope_interleave``) or halves (MiniCPM3), as the
layer's ``Rope`` says; the score scale is the model's ``attn_scale`` (DeepSeek's YaRN sharpens it
by the square of the mscale ``mscale_all_dim`` gives: ``config.latent_attn_scale``), or the layer's
own (``LatentSpec.attn_scale``).

What the descendants add, each as data (``LatentSpec``, ``LayerSpec``, ``ModelSpec``):

- the bottlenecks' normed outputs multiplied by ``q_scale`` / ``kv_scale`` (LongCat-Flash's
  ``mla_scale_*_lora``, Dots3-Note's ``apply_mla_qkv_lora_rescale``: sqrt(hidden / rank)); the cached
  latent is the scaled one;
- the shared rotated key part RMS-normed before it rotates (``k_rope_norm``, Dots3-Note);
- a sliding window (``LayerSpec.sliding_window``), a learned sink logit per head (``ModelSpec.sinks``,
  HY V4) and an output gate, ``sigmoid(g(x))`` per head or per element (``ModelSpec.attn_gate``);
- DeepSeek Sparse Attention (``decoder/indexer.py``): on a layer whose ``LayerSpec.indexer`` is
  ``"full"`` the indexer chooses each query's keys (its keys cached beside the latent rows in the
  ``LatentSlot``); a ``"shared"`` layer takes the last indexed layer's choice from the forward call's
  ``tables`` (``INDEX_CHOICE``). The choice is a -inf score bias on the keys not chosen;
- a layer whose latent differs from the model's (Dots3-Note's sliding-window layers:
  ``LayerSpec.latent``, ``ModelSpec.latent_of``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .activations import GATES
from .attention import attention
from .indexer import Indexer, choice_bias
from . import qlinear
from .linear import Linear, make_linear
from .norms import Norm
from .parts import Part
from .qlinear import QuantTensor


@dataclass(frozen=True)
class LatentSpec:
    """The shape of a model's latent attention (every latent layer has the model's head count).

    Attributes:
        kv_lora_rank: r, the width of the cached latent (``kv_lora_rank``).
        q_lora_rank: the query bottleneck's width, or None for one ``q`` projection.
        qk_nope_head_dim: the position-free part of each query/key head.
        qk_rope_head_dim: the rotated part of each query head and of the shared key part.
        v_head_dim: each value head's width.
        norm_eps: epsilon of the two bottleneck RMS norms (Transformers fixes 1e-6 for them;
            llama.cpp uses the model's) and of the rotated key part's norm.
        q_scale, kv_scale: the query and key/value bottlenecks' normed outputs are multiplied by
            them (LongCat-Flash, Dots3-Note: sqrt(hidden_size / rank)).
        k_rope_norm: the shared rotated key part passes an RMS norm (``k_rope_norm`` role) before
            it rotates (Dots3-Note's ``k_rope_only_layernorm``).
        attn_scale: the score scale of the layers of this shape (None: the model's ``attn_scale``).
    """

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    norm_eps: float = 1e-6
    q_scale: float = 1.0
    kv_scale: float = 1.0
    k_rope_norm: bool = False
    attn_scale: float | None = None

    @property
    def qk_head_dim(self) -> int:
        """A query/key head's width, nope + rope."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """Numbers one position costs in a latent layer's cache: r + rope."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class LatentSlot:
    """A latent layer's cache: rows ``[latent (r) | k_pe (rope)]``, one per position.

    A layer with an indexer also keeps its index keys, one float32 row [index_width] per position
    (kept exact whatever the cache dtype: they decide which keys a query sees).

    Args:
        width: r + rope.
        dtype: float32, or float16 (each number rounded once, to nearest even, when stored).
        capacity: positions held before the buffer first grows (it doubles).
        index_width: the index key's width (0: no indexer on this layer).
    """

    def __init__(self, width: int, dtype=np.float32, capacity: int = 256, index_width: int = 0):
        self.width, self.dtype = int(width), np.dtype(dtype)
        self.rows = np.empty((capacity, self.width), self.dtype)
        self.index_width = int(index_width)
        self.index = np.empty((capacity if index_width else 0, self.index_width), np.float32)

    @staticmethod
    def _put(buf: np.ndarray, start: int, rows: np.ndarray) -> np.ndarray:
        end = start + rows.shape[0]
        if end > buf.shape[0]:
            grown = np.empty((max(end, 2 * buf.shape[0]), buf.shape[1]), buf.dtype)
            grown[:start] = buf[:start]
            buf = grown
        buf[start:end] = rows
        return buf

    def append(self, start: int, rows: np.ndarray) -> np.ndarray:
        """Store float32 ``rows`` [T, width] at positions start..start+T-1 (the cache's committed
        length is ``start``) and return the rows of positions 0..start+T-1, a view of the buffer
        [start + T, width] in the cache dtype."""
        self.rows = self._put(self.rows, start, rows)
        return self.rows[:start + rows.shape[0]]

    def append_index(self, start: int, keys: np.ndarray) -> np.ndarray:
        """``append`` for the index keys (float32 [T, index_width]); returns float32 [start + T, index_width]."""
        self.index = self._put(self.index, start, keys)
        return self.index[:start + keys.shape[0]]

    def nbytes_per_position(self) -> int:
        """Bytes one position costs: width numbers at the cache dtype (and the float32 index key)."""
        return self.width * self.dtype.itemsize + self.index_width * 4

    def rollback(self, length: int) -> bool:
        """Rows are kept by position: going back to ``length`` needs nothing (``KVCache.rollback``)."""
        return True

    def nbytes_fixed(self) -> int:
        """Bytes held whatever the length: none."""
        return 0


class PerHead:
    """One linear map per head: x [H, T, in] -> [H, T, out], head h through ``weights[h]`` [out, in].

    Float weights are stacked once as float32 [H, out, in] and applied in one batched product;
    quantized ones (``QuantTensor``: rows of a GGUF tensor, kept in their blocks) each go through
    their own ``QuantLinear``.
    """

    def __init__(self, weights: list):
        if all(isinstance(w, np.ndarray) for w in weights):
            self.stack = np.ascontiguousarray(np.stack([np.asarray(w, np.float32) for w in weights]))
            self.parts = None
        else:
            self.stack, self.parts = None, [make_linear(w) for w in weights]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.stack is not None:
            if qlinear.POOL_BLAS and x.dtype == np.float32 and x.ndim == 3:
                # per head on the kernels' pool: OpenBLAS is kept at one thread (qlinear.pool_blas)
                return np.stack([Linear._product(np.ascontiguousarray(x[h]), self.stack[h])
                                 for h in range(self.stack.shape[0])])
            return np.matmul(x, self.stack.transpose(0, 2, 1))
        return np.stack([p(np.ascontiguousarray(x[h])) for h, p in enumerate(self.parts)])

    def read_order(self) -> list[tuple]:
        """One group per head, in the order ``__call__`` multiplies them (a group reads at most four
        matrices ahead: ``QMatrix.set_read_ahead``)."""
        return [(p,) for p in self.parts] if self.parts is not None else []


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, scale: float, **kw) -> np.ndarray:
    """``attention`` for values narrower or wider than the keys: the narrower side is padded with
    zeros (which add nothing to a dot product or an output), so the fused kernel runs. ``kw``:
    ``attention``'s window, bias and sinks."""
    d, dv = q.shape[-1], v.shape[-1]
    if dv < d:
        wide = np.zeros(v.shape[:-1] + (d,), np.float32)
        wide[..., :dv] = v
        return attention(q, k, wide, positions, scale=scale, **kw)[..., :dv]
    if dv > d:
        qp = np.zeros(q.shape[:-1] + (dv,), np.float32)
        qp[..., :d] = q
        kp = np.zeros(k.shape[:-1] + (dv,), np.float32)
        kp[..., :d] = k
        return attention(qp, kp, v, positions, scale=scale, **kw)
    return attention(q, k, v, positions, scale=scale, **kw)


#: The key of a forward call's ``tables`` under which an indexed layer leaves its choice (bool
#: [T, S], or None: every visible key) for the ``shared`` layers after it.
INDEX_CHOICE = "latent.index_choice"


class LatentAttention(Part):
    """The latent-attention mixer of one layer (module docstring), with its ``LatentSlot``.

    Its adapter targets (``ROLES``) are the output projection ``o`` and, without a query
    bottleneck, the query projection ``q`` (seed 002).

    Args:
        spec: the ``ModelSpec`` (``spec.latent_of(i)``: ranks and head widths; ``attn_scale``; sinks,
            output gate and indexer).
        i: the layer (its ``LayerSpec`` gives the rotation, the window and the indexer kind;
            ``spec.attention_shape(i)`` the heads).
        load: ``load(role, kind="weight", required=False)`` -> the layer's array (``Layout.get``):
            ``q_a``, ``q_a_norm``, ``q_b`` (or ``q``), ``kv_a``, ``kv_a_norm``, ``o``, and ``kv_b``
            [H * (nope + v), r] or, as llama.cpp's converter splits it, ``k_b`` [H, r, nope] and
            ``v_b`` [H, v, r]; ``k_rope_norm``, ``sinks``, ``g`` and the indexer's ``idx_*`` where the
            layer has them.
        norm: unused (the bottleneck norms have their own epsilon, ``LatentSpec.norm_eps``).

    Attributes:
        absorb_prompts: attend prompts (more than one token) the absorbed way too (default
            False: they expand, unless only the split ``k_b`` / ``v_b`` are quantized).

    Raises:
        SterError: a tensor is missing or disagrees with the configuration (from ``load``).
    """

    def __init__(self, spec, i: int, load, norm=None):
        m = spec.latent_of(i)
        self.spec, self.i, self.layer, self.m = spec, i, spec.layers[i], m
        self.heads = spec.attention_shape(i)[0]
        H, r, nope, v = self.heads, m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim
        self.ROLES = ("q", "o") if m.q_lora_rank is None else ("o",)
        self.q = self.q_a = self.q_a_norm = self.q_b = None
        if m.q_lora_rank is None:
            self.q = make_linear(load("q", required=True), load("q", "bias"))
        else:
            self.q_a = make_linear(load("q_a", required=True), load("q_a", "bias"))
            self.q_a_norm = Norm("rms", m.norm_eps, load("q_a_norm", required=True), None)
            self.q_b = make_linear(load("q_b", required=True))
        self.kv_a = make_linear(load("kv_a", required=True), load("kv_a", "bias"))
        self.kv_a_norm = Norm("rms", m.norm_eps, load("kv_a_norm", required=True), None)
        self.k_rope_norm = Norm("rms", m.norm_eps, load("k_rope_norm", required=True), None) if m.k_rope_norm else None
        self.o = make_linear(load("o", required=True), load("o", "bias"))
        self.sinks = load("sinks", "", required=True).astype(np.float32) if spec.layer_sinks(i) else None
        self.g = make_linear(load("g", required=True)) if spec.attn_gate else None
        self.indexer = Indexer(spec.indexer, load, self.layer.rope) if self.layer.indexer == "full" else None
        kv_b = load("kv_b")
        if kv_b is not None:
            self.expand = make_linear(kv_b)
            if isinstance(kv_b, QuantTensor):  # key rows transposed per head: decoded once, float32
                per_head = np.asarray(kv_b).reshape(H, nope + v, r)
                k_up = [np.ascontiguousarray(per_head[h, :nope].T) for h in range(H)]
                v_up = [kv_b[h * (nope + v) + nope:(h + 1) * (nope + v)] for h in range(H)]
            else:
                per_head = np.asarray(kv_b, np.float32).reshape(H, nope + v, r)
                k_up = [per_head[h, :nope].T for h in range(H)]
                v_up = [per_head[h, nope:] for h in range(H)]
        else:
            k_b, v_b = load("k_b", required=True), load("v_b", required=True)  # [H, r, nope], [H, v, r]
            k_up, v_up = [k_b[h] for h in range(H)], [v_b[h] for h in range(H)]
            self.expand = None
            if all(isinstance(w, np.ndarray) for w in k_up + v_up):  # float: kv_b rebuilt, prompts expand
                self.expand = make_linear(np.concatenate(
                    [np.concatenate([np.asarray(k_b[h], np.float32).T, np.asarray(v_b[h], np.float32)])
                     for h in range(H)]))
        self.k_up, self.v_up = PerHead(k_up), PerHead(v_up)
        self.absorb_prompts = False

    def new_slot(self, dtype) -> LatentSlot:
        """This layer's cache: ``LatentSlot`` rows of r + rope numbers at ``dtype`` (and the float32
        index keys of an indexed layer)."""
        return LatentSlot(self.m.cache_width, dtype,
                          index_width=self.spec.indexer.key_width if self.indexer is not None else 0)

    def read_order(self) -> list[tuple]:
        first = (self.q_a, self.kv_a) if self.q is None else (self.q, self.kv_a)
        return ([first] + ([(self.q_b,)] if self.q_b is not None else [])
                + (self.indexer.read_order() if self.indexer is not None else []) + self.k_up.read_order()
                + self.v_up.read_order() + ([(self.g,)] if self.g is not None else []) + [(self.o,)])

    def rope_tables(self, positions: np.ndarray, tables: dict) -> tuple:
        """This layer's RoPE cos/sin at ``positions``, shared by layers with the same Rope in one call."""
        rope = self.layer.rope
        if id(rope) not in tables:
            tables[id(rope)] = rope.cos_sin(positions, int(positions[-1]) + 1)
        return tables[id(rope)]

    def _choice(self, x, q_latent, cache, positions, tables):
        """The keys each query attends to (``Indexer.choose``), or None: every visible key."""
        kind = self.layer.indexer
        if kind == "full":
            cos_sin = self.rope_tables(positions, tables) if self.layer.rope is not None else None
            keys = cache.slot(self.i).append_index(cache.length, self.indexer.keys(x, cos_sin))
            tables[INDEX_CHOICE] = self.indexer.choose(x, q_latent, keys, positions, cos_sin)
        if kind in ("full", "shared"):
            return tables[INDEX_CHOICE]
        return None

    def __call__(self, x: np.ndarray, cache, positions: np.ndarray, bias, tables: dict) -> np.ndarray:
        """x float32 [T, hidden_size] (normed) -> float32 [T, hidden_size]; stores this layer's rows
        ``[latent | k_pe]`` for ``positions`` in its ``LatentSlot`` (``cache.slot(i)``)."""
        m, T, H = self.m, x.shape[0], self.heads
        r, nope, rope_d = m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim
        q_latent = None
        if self.q is None:
            a, c = self.project(("q_a", "kv_a"), x)
            q_latent = self.q_a_norm(a)
            if m.q_scale != 1.0:
                q_latent *= np.float32(m.q_scale)
            q = self.q_b(q_latent)
        else:
            q, c = self.project(("q", "kv_a"), x)
        q = q.reshape(T, H, nope + rope_d).transpose(1, 0, 2)  # [H, T, nope + rope]
        q_pe = np.ascontiguousarray(q[..., nope:])
        k_pe = np.ascontiguousarray(c[None, :, r:])  # [1, T, rope]
        if self.k_rope_norm is not None:
            k_pe = self.k_rope_norm(k_pe)
        if self.layer.rope is not None:
            self.layer.rope.apply_pair(q_pe, k_pe, *self.rope_tables(positions, tables))
        row = np.empty((T, r + rope_d), np.float32)
        row[:, :r] = self.kv_a_norm(np.ascontiguousarray(c[:, :r]))
        if m.kv_scale != 1.0:
            row[:, :r] *= np.float32(m.kv_scale)
        row[:, r:] = k_pe[0]
        rows = cache.slot(self.i).append(cache.length, row)  # [S, r + rope], the cache dtype
        keep = self._choice(x, q_latent, cache, positions, tables) if self.layer.indexer else None
        kw = dict(window=self.layer.sliding_window, bias=choice_bias(keep), sinks=self.sinks)
        scale = m.attn_scale if m.attn_scale is not None else self.spec.attn_scale
        if T == 1 or self.absorb_prompts or self.expand is None:
            qc = np.empty((H, T, r + rope_d), np.float32)
            qc[..., :r] = self.k_up(q[..., :nope])
            qc[..., r:] = q_pe
            kv = rows[None]  # one key/value head: keys [latent | k_pe], values the same rows
            out = self.v_up(np.ascontiguousarray(attention(qc, kv, kv, positions, scale=scale, **kw)[..., :r]))
        else:
            S, v = rows.shape[0], m.v_head_dim
            lat = rows[:, :r] if rows.dtype == np.float32 else rows[:, :r].astype(np.float32)
            kv = self.expand(np.ascontiguousarray(lat)).reshape(S, H, nope + v).transpose(1, 0, 2)
            keys = np.empty((H, S, nope + rope_d), np.float32)
            keys[..., :nope] = kv[..., :nope]
            keys[..., nope:] = rows[None, :, r:]
            qf = np.empty((H, T, nope + rope_d), np.float32)
            qf[..., :nope] = q[..., :nope]
            qf[..., nope:] = q_pe
            out = _attend(qf, keys, np.ascontiguousarray(kv[..., nope:]), positions, scale, **kw)
        v = m.v_head_dim
        out = out.reshape(1, H * v) if T == 1 else out.transpose(1, 0, 2).reshape(T, H * v)
        if self.g is not None:  # act(g(x)) scales each head's (or element's) output
            gate = GATES[self.spec.attn_gate](self.g(x))
            out = (out.reshape(T, H, v) * gate[:, :, None]).reshape(T, H * v) if self.spec.attn_gate_per_head \
                else out * gate
        return self.o(out)
