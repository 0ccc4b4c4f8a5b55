"""A transformer block shared between layers, then a Mamba-2 scan (``LayerSpec.mixer``
``"shared_hybrid"``, Zamba2).

Zamba2 (Glorioso et al. 2024, arXiv:2411.15242; Transformers' ``Zamba2HybridLayer``). A stack of
Mamba-2 layers in which some layers (the "hybrid" ones) first run one of ``blocks`` transformer
blocks, each block's weights shared by every ``blocks``-th hybrid layer (the k-th hybrid layer
runs block k mod blocks, stored once, under the first hybrid layer that runs it). For the
residual stream h float32 [T, hidden] and the token embeddings e (the stream before the first
layer), hybrid layer i computes::

    x = attn_norm_shared([h, e])                 2 * hidden wide (the block's input_layernorm)
    a = attention(x)                             queries, keys, values each + the layer's own
                                                 rank-r adapter B_k(A_k(x)); scores scaled by
                                                 (head_dim / 2) ** -0.5 (ModelSpec.attn_scale);
                                                 rotated only when the model rotates (use_mem_rope)
    m = down(act(g) * u), [g | u] = gate_up(y) + B_k(A_k(y)),  y = ffn_norm_shared(a)
    t = linear_i(m)                              the layer's own projection
    out = mamba2_i(attn_norm_i(h + t))           the layer's own scan; the block adds out to h

with no residual inside the shared block. The layer keeps its keys and values in the cache's
key/value buffers (each hybrid layer its own: the same weights see different inputs) and the
scan's state in its ``RecurrentState`` slot.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import Attention
from .ffn import gated
from .linear import make_linear
from .mamba2 import Mamba2
from .norms import Norm
from .parts import Part

#: The shared block's roles in the family's names table (read at the layer that stores the block,
#: the adapters with their slot ``{k}``), standing for Attention's q, k, v, o.
SHARED_ATTENTION_ROLES = {"q": "sb_q", "k": "sb_k", "v": "sb_v", "o": "sb_o"}


@dataclass(frozen=True)
class SharedBlockSpec:
    """The transformer blocks a model's hybrid layers share (Zamba2).

    Attributes:
        blocks: how many distinct blocks (``num_mem_blocks``); hybrid layer k runs block k mod blocks.
        width: the block's input width: the stream and the embeddings side by side
            (``attention_hidden_size``, 2 * hidden_size).
        intermediate: the block's feed-forward width (``intermediate_size``).
        adapter_rank: each hybrid layer's adapters' rank (``adapter_rank``).
        attention_adapters: the layers add their adapters to the queries, keys and values
            (``use_shared_attention_adapter``); the gate-and-up projection always has them.
    """

    blocks: int
    width: int
    intermediate: int
    adapter_rank: int
    attention_adapters: bool = False

    def tensor_shapes(self, spec) -> dict[tuple[str, str], tuple[int, ...]]:
        """(role, kind) -> shape of the block's tensors (``layout.expected_shapes``)."""
        h, kv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        w, f, r, hidden = self.width, self.intermediate, self.adapter_rank, spec.hidden_size
        shapes = {("sb_q", "weight"): (h * d, w), ("sb_k", "weight"): (kv * d, w), ("sb_v", "weight"): (kv * d, w),
                  ("sb_o", "weight"): (hidden, h * d), ("sb_attn_norm", "weight"): (w,),
                  ("sb_ffn_norm", "weight"): (hidden,), ("sb_gate_up", "weight"): (2 * f, hidden),
                  ("sb_gate_up", "bias"): (2 * f,), ("sb_down", "weight"): (hidden, f), ("sb_down", "bias"): (hidden,),
                  ("sb_linear", "weight"): (hidden, hidden),
                  ("sb_gate_up_a", "weight"): (r, hidden), ("sb_gate_up_b", "weight"): (2 * f, r)}
        for role, out in (("q", h * d), ("k", kv * d), ("v", kv * d)):
            shapes[(f"sb_{role}_a", "weight")] = (r, w)
            shapes[(f"sb_{role}_b", "weight")] = (out, r)
        return shapes


def hybrid_slot(spec, i: int) -> tuple[int, int]:
    """(k, the layer storing its block) for hybrid layer ``i``: it is the k-th hybrid layer (from
    0) and runs block k mod blocks, stored under the first hybrid layer that runs it."""
    hybrids = [j for j, layer in enumerate(spec.layers) if layer.mixer == "shared_hybrid"]
    k = hybrids.index(i)
    return k, hybrids[k % spec.shared_block.blocks]


class _Adapter:
    """x -> b(a(x)): a rank-r term added to a projection's output."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.b(self.a(x))


class _SharedAttention(Attention):
    """Attention over the shared block's weights, plus the layer's own adapters on q, k and v."""

    def __init__(self, spec, i: int, load, norm, source: int, adapters: dict):
        def shared(role, kind="weight", required=False):
            return load(SHARED_ATTENTION_ROLES.get(role, role), kind, required, layer=source)

        super().__init__(spec, i, shared, norm)
        self.adapters = adapters

    def project(self, roles: tuple, x: np.ndarray) -> tuple:
        out = super().project(roles, x)
        if not self.adapters:
            return out
        return tuple(o + self.adapters[r](x) if r in self.adapters else o for r, o in zip(roles, out))


class SharedHybrid(Part):
    """A shared transformer block, then the layer's own Mamba-2 scan (module docstring).

    Args:
        spec: the ``ModelSpec`` (``shared_block``: ``SharedBlockSpec``; ``ssm``: the Mamba-2 scan;
            the block's attention shape, score scale and rotation as for attention layers).
        i: the layer.
        load: ``load(role, kind="weight", required=False, layer=None, slot=None)`` -> an array:
            the block's ``sb_*`` roles at the layer storing it (adapters at this layer's slot),
            this layer's ``sb_linear``, ``attn_norm`` and the scan's ``ssm_*`` roles.
        norm: ``norm(role)`` -> a ``Norm`` of this layer (its ``attn_norm``, before the scan).

    Calling it maps the residual stream float32 [T, hidden] (not normed: the mixer norms what it
    reads, ``OWN_NORMS``) to the scan's output float32 [T, hidden]. Adapters have no projection
    to take here (``ROLES`` is empty: seed 002 refuses adapters on state-space families).
    """

    KV = True
    OWN_NORMS = ("attn_norm",)

    def __init__(self, spec, i: int, load, norm):
        self.spec, self.i = spec, i
        sb = spec.shared_block
        k, source = hybrid_slot(spec, i)

        def block_norm(role):
            return Norm(spec.norm, spec.norm_eps, load(role, required=True, layer=source), None, spec.norm_unit_offset)

        def adapter(role):
            return _Adapter(*(make_linear(load(f"{role}_{p}", required=True, layer=source, slot=k)) for p in "ab"))

        self.block_attn_norm, self.block_ffn_norm = block_norm("sb_attn_norm"), block_norm("sb_ffn_norm")
        self.attn = _SharedAttention(spec, i, load, norm, source,
                                     {r: adapter(f"sb_{r}") for r in "qkv"} if sb.attention_adapters else {})
        self.gate_up = make_linear(load("sb_gate_up", required=True, layer=source), load("sb_gate_up", "bias", layer=source))
        self.gate_up_adapter = adapter("sb_gate_up")
        self.down = make_linear(load("sb_down", required=True, layer=source), load("sb_down", "bias", layer=source))
        self.linear = make_linear(load("sb_linear", required=True))
        self.scan_norm = norm("attn_norm")
        self.scan = Mamba2(spec, i, load, norm)

    def new_slot(self, dtype=None):
        return self.scan.new_slot(dtype)

    def read_order(self) -> list[tuple]:
        return self.attn.read_order() + [(self.gate_up,), (self.down,), (self.linear,)] + self.scan.read_order()

    def rope_tables(self, positions, tables):
        return self.attn.rope_tables(positions, tables)

    def __call__(self, h: np.ndarray, cache, positions, bias, tables: dict) -> np.ndarray:
        x = self.block_attn_norm(np.concatenate([h, tables["embeddings"]], axis=-1))
        y = self.block_ffn_norm(self.attn(x, cache, positions, bias, tables))
        gu = self.gate_up(y) + self.gate_up_adapter(y)
        f = gu.shape[-1] // 2
        t = self.linear(self.down(gated(self.spec.hidden_act, np.ascontiguousarray(gu[:, :f]),
                                        np.ascontiguousarray(gu[:, f:]))))
        return self.scan(self.scan_norm(h + t), cache, positions)
