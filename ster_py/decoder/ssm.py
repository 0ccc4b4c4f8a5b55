"""What the state-space mixers share: their shape as data, the muP scales of the hybrids
that have them, and reading their small tensors.

``SSMSpec`` describes the scan of every layer whose ``LayerSpec.mixer`` is ``"mamba"``
(``decoder/mamba.py``: Mamba's selective scan, a diagonal [d_inner, d_state] state) or
``"mamba2"`` (``decoder/mamba2.py``: Mamba-2's multi-head scan, [heads, head_dim, d_state]),
alone or beside attention (``"hybrid"``, ``decoder/hybrid.py``), or after a shared transformer
block (``"shared_hybrid"``, ``decoder/shared_block.py``, Zamba2); ``"shortconv"`` (LFM2's gated
short convolution, ``decoder/shortconv.py``: only a [d_conv - 1, hidden] state) and
``"lightning"`` (MiniMax's lightning attention, ``decoder/lightning.py``: a [head_dim, head_dim]
state per head) are described by the same spec. ``MupScales`` holds Falcon-H1's multipliers,
which llama.cpp's converter folds into the weights instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SSMSpec:
    """The shape of a model's state-space scan.

    Attributes:
        kind: ``"mamba"`` (selective scan, per-channel state), ``"mamba2"`` (multi-head scan),
            ``"shortconv"`` (LFM2's gated short convolution: d_inner channels, no scan) or
            ``"lightning"`` (lightning attention: num_heads heads of d_state channels, a
            [d_state, d_state] state each, no convolution).
        d_inner: the scanned stream's width (``intermediate_size``, ``mamba_expand * hidden``,
            ``mamba_d_ssm``, heads * head width; the short convolution's channels, hidden_size).
        d_state: the state width per channel (``state_size``, ``mamba_d_state``; lightning: the
            head width).
        d_conv: the causal convolution's taps (``conv_kernel``, ``mamba_d_conv``, ``conv_L_cache``).
        dt_rank: Mamba: the step's rank between ``x_proj`` and ``dt_proj`` (``time_step_rank``;
            "auto" is ceil(hidden / 16)).
        num_heads: Mamba-2: the heads (d_inner / num_heads channels each).
        n_groups: Mamba-2: the groups sharing one B and one C (heads split evenly over them).
        dt_min, dt_max: Mamba-2: the step is clamped to [dt_min, dt_max] after its softplus
            (``time_step_limit``; Nemotron-H: [time_step_min, inf)).
        bcdt_norm: Mamba: the step, B and C are RMS-normed before use: ``"weighted"`` (Jamba's
            dt_layernorm, b_layernorm, c_layernorm), ``"plain"`` (Falcon-Mamba, no scale) or None.
        bcdt_eps: that norm's epsilon (``mixer_rms_eps``, Jamba's ``rms_norm_eps``).
        gated_norm: Mamba-2: the output times SiLU of the gate is RMS-normed over each group's
            share with the stored ``norm`` scale (False: only gated, Falcon-H1 without
            ``mamba_rms_norm``).
        norm_eps: the gated norm's epsilon (lightning: its read-out norm's).
        slope_eps: lightning: the per-layer factor of the heads' decay rates is
            1 - i / (layers - 1 + slope_eps) + 1e-5 (Transformers adds 1e-5 in the divisor,
            llama.cpp does not: 0; Ling 2.5's release: 0).
        slopes: lightning: the heads' base slopes, ``"minimax"`` (2 ** (-8 / heads) to the powers 1..heads)
            or ``"alibi"`` (ALiBi's series, Ling 2.5's; the same for a power-of-two head count).
        slope_layer_offset: lightning: added to the layer's index in the per-layer factor (Ling 2.5's
            release: -1).
        qkv_layout: lightning: how ``ssm_in``'s rows hold the heads' queries, keys and values:
            ``"per_head"`` ([q_h | k_h | v_h] head after head, MiniMax) or ``"concat"`` (every
            query head, then every key head, then every value head: Ling 2.5's query_key_value).
        qkv_silu: lightning: the queries, keys and values pass SiLU (MiniMax; Ling 2.5 under
            linear_silu).
        qk_norm: lightning: each head's query and key pass an RMS norm of ``norm_eps`` with the
            per-head weights ``ssm_q_norm`` / ``ssm_k_norm`` ([d_state]; Ling 2.5's use_qk_norm).
        q_scaled: lightning: the query is multiplied by d_state ** -0.5 (Ling 2.5).
        norm_groups: lightning: the read-out RMS norm normalises this many equal groups of the
            d_inner channels apart (Ling 2.5's group_norm_size; MiniMax: 1, all heads together).
        rope: lightning: the ``Rope`` rotating each head's query and key after the norm (its
            leading ``rotary_dim`` channels, by halves; Ling 2.5's partial_rotary_factor); None: no
            rotation (MiniMax).
    """

    kind: str
    d_inner: int
    d_state: int
    d_conv: int
    dt_rank: int = 0
    num_heads: int = 0
    n_groups: int = 1
    dt_min: float = 0.0
    dt_max: float = math.inf
    bcdt_norm: str | None = None
    bcdt_eps: float = 1e-6
    gated_norm: bool = True
    norm_eps: float = 1e-5
    slope_eps: float = 1e-5
    slopes: str = "minimax"
    slope_layer_offset: int = 0
    qkv_layout: str = "per_head"
    qkv_silu: bool = True
    qk_norm: bool = False
    q_scaled: bool = False
    norm_groups: int = 1
    rope: Any = field(default=None, compare=False, repr=False)

    @property
    def head_dim(self) -> int:
        """Mamba-2: channels per head."""
        return self.d_inner // self.num_heads if self.num_heads else 1

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: the stream (Mamba, the short convolution), or the stream, B
        and C (Mamba-2)."""
        return self.d_inner + (2 * self.n_groups * self.d_state if self.kind == "mamba2" else 0)

    @property
    def in_proj_size(self) -> int:
        """Rows of ``in_proj``: stream and gate (Mamba); gate, stream, B, C and one step per head
        (Mamba-2); B, C and x (the short convolution); queries, keys and values (lightning)."""
        if self.kind in ("shortconv", "lightning"):
            return 3 * self.d_inner
        return 2 * self.d_inner if self.kind == "mamba" else self.d_inner + self.conv_dim + self.num_heads

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """The recurrent state of one layer: the convolution's last inputs and the scan's state
        (the short convolution: only its inputs; lightning attention: only [heads, D, D])."""
        if self.kind == "shortconv":
            return {"conv": (self.d_conv - 1, self.d_inner)}
        if self.kind == "lightning":
            return {"kv": (self.num_heads, self.d_state, self.d_state)}
        ssm = ((self.d_inner, self.d_state) if self.kind == "mamba"
               else (self.num_heads, self.head_dim, self.d_state))
        return {"conv": (self.d_conv - 1, self.conv_dim), "ssm": ssm}

    def state_bytes(self) -> int:
        """Bytes of one layer's recurrent state (float32)."""
        return 4 * sum(math.prod(s) for s in self.state_shapes().values())

    def tensor_shapes(self, hidden: int) -> dict[tuple[str, str], tuple[int, ...]]:
        """(role, kind) -> shape of the scan's tensors (``layout.expected_shapes``); the roles in
        ``layout.RESHAPED_ROLES`` may be stored in another shape of the same size."""
        di, n, k = self.d_inner, self.d_state, self.d_conv
        if self.kind == "lightning":
            return {("ssm_in", "weight"): (3 * di, hidden), ("ssm_in", "bias"): (3 * di,),
                    ("ssm_gate", "weight"): (di, hidden), ("ssm_norm", "weight"): (di,),
                    ("ssm_out", "weight"): (hidden, di), ("ssm_out", "bias"): (hidden,),
                    ("ssm_q_norm", "weight"): (n,), ("ssm_k_norm", "weight"): (n,)}
        out = {("ssm_in", "weight"): (self.in_proj_size, hidden), ("ssm_in", "bias"): (self.in_proj_size,),
               ("ssm_conv", "weight"): (self.conv_dim, k), ("ssm_conv", "bias"): (self.conv_dim,),
               ("ssm_out", "weight"): (hidden, di), ("ssm_out", "bias"): (hidden,)}
        if self.kind == "shortconv":
            return out
        if self.kind == "mamba":
            r = self.dt_rank
            out.update({("ssm_x", "weight"): (r + 2 * n, di), ("ssm_dt", "weight"): (di, r), ("ssm_dt", "bias"): (di,),
                        ("ssm_a_log", ""): (di, n), ("ssm_a", ""): (di, n), ("ssm_d", ""): (di,),
                        ("ssm_dt_norm", "weight"): (r,), ("ssm_b_norm", "weight"): (n,),
                        ("ssm_c_norm", "weight"): (n,)})
        else:
            h = self.num_heads
            out.update({("ssm_dt_bias", ""): (h,), ("ssm_a_log", ""): (h,), ("ssm_a", ""): (h,), ("ssm_d", ""): (h,),
                        ("ssm_norm", "weight"): (di,)})
        return out


@dataclass(frozen=True)
class MupScales:
    """Falcon-H1's muP multipliers (its config's names), each 1 when absent.

    ``attn_in`` scales attention's input and ``attn_out`` its output, ``key`` every key;
    ``ssm_in`` scales the scan's input, ``ssm_parts`` the five parts of its ``in_proj`` output
    (gate, stream, B, C, step), ``ssm_out`` its output; ``ffn_gate`` the feed-forward's gate
    before the activation and ``ffn_down`` its output.
    """

    attn_in: float = 1.0
    attn_out: float = 1.0
    key: float = 1.0
    ssm_in: float = 1.0
    ssm_parts: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    ssm_out: float = 1.0
    ffn_gate: float = 1.0
    ffn_down: float = 1.0


def vector(t, shape: tuple[int, ...]) -> np.ndarray | None:
    """A small stored tensor as a C-contiguous float32 array of ``shape`` (None stays None)."""
    if t is None:
        return None
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32).reshape(shape))
