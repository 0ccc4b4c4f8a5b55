"""LFM2's gated short convolution mixer (``LayerSpec.mixer`` ``"shortconv"``).

Liquid AI's LFM2 (Transformers' ``Lfm2ShortConv``, llama.cpp's ``build_shortconv_block`` in
src/models/lfm2.cpp). For x float32 [T, hidden]:

1. ``in_proj`` -> B, C and x', each hidden wide (in that order);
2. the causal depthwise convolution (``conv.causal_conv1d``, no activation) of B * x' over its
   ``d_conv`` taps, continued from the last d_conv - 1 products of earlier calls;
3. C times the convolution's output, through ``out_proj``.

The convolution's last d_conv - 1 inputs ([d_conv - 1, hidden]) are the layer's
``RecurrentState`` slot (``"conv"``); nothing else carries over, so one call over a prompt, the
prompt in pieces, or token by token leave the same state. The convolution runs the Cython kernel
``ster_py._kernels.scan.causal_conv1d``; ``shortconv_reference`` is this mixer's numpy
definition, which the tests compare with the kernel path and with Transformers.
"""
from __future__ import annotations

import numpy as np

from .cache import RecurrentState
from .conv import causal_conv1d, causal_conv1d_reference
from .linear import make_linear
from .parts import Part
from .ssm import vector


def shortconv_reference(bcx: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                        state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Steps 2-3 before ``out_proj`` in numpy: bcx float32 [T, 3 * C] (``in_proj``'s output: B, C,
    x') -> (C * conv(B * x') float32 [T, C], the new state [K - 1, C]); ``state`` float32
    [K - 1, C] is left as it was; weight float32 [C, K], bias [C] or None."""
    C = weight.shape[0]
    b, c, x = bcx[:, :C], bcx[:, C:2 * C], bcx[:, 2 * C:]
    y, new = causal_conv1d_reference(b * x, weight, bias, state, silu=False)
    return c * y, new


class ShortConv(Part):
    """The gated short convolution of one layer (module docstring).

    Args:
        spec: the ``ModelSpec`` (its ``ssm``: ``SSMSpec`` of kind ``"shortconv"``: d_inner =
            hidden_size channels, d_conv taps).
        i: the layer.
        load: ``load(role, kind="weight", required=False)`` -> the layer's array: ``ssm_in``
            (``conv.in_proj``, [3 * hidden, hidden]), ``ssm_conv`` (``conv.conv``, [hidden, 1,
            d_conv] or [hidden, d_conv]) and ``ssm_out`` (``conv.out_proj``), each with an optional
            bias (``conv_bias``).
        norm: unused.

    Calling it maps float32 [T, hidden] to float32 [T, hidden] and advances the layer's
    ``RecurrentState``. It has no projection adapters take (``ROLES``: seed 002 refuses adapters
    on LFM2).
    """

    KV = False

    def __init__(self, spec, i: int, load, norm):
        s = self.ssm = spec.ssm
        self.i = i
        self.in_proj = make_linear(load("ssm_in", required=True), load("ssm_in", "bias"))
        self.conv_w = vector(load("ssm_conv", required=True), (s.d_inner, s.d_conv))
        self.conv_b = vector(load("ssm_conv", "bias"), (s.d_inner,))
        self.out_proj = make_linear(load("ssm_out", required=True), load("ssm_out", "bias"))

    def new_slot(self, dtype=None) -> RecurrentState:
        """The layer's recurrent state: the convolution's last inputs (float32 whatever ``dtype``)."""
        return RecurrentState(self.ssm.state_shapes())

    def read_order(self) -> list[tuple]:
        return [(self.in_proj,), (self.out_proj,)]

    def __call__(self, x: np.ndarray, cache, positions, bias=None, tables=None) -> np.ndarray:
        C = self.ssm.d_inner
        bcx = self.in_proj(x)
        y = causal_conv1d(bcx[:, :C] * bcx[:, 2 * C:], self.conv_w, self.conv_b, cache.slot(self.i)["conv"],
                          silu=False)
        return self.out_proj(bcx[:, C:2 * C] * y)
