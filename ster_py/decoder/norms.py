"""Normalisations over the last axis, in float32.

RMSNorm: Zhang & Sennrich 2019 (arXiv:1910.07467); LayerNorm: Ba et al. 2016.
Gemma stores its RMSNorm weight as an offset from one (``unit_offset``).

Float32 inputs with a [d] float32 weight run the fused Cython rows
(``ster_py._kernels.ops``); ``rms_norm_reference`` / ``layer_norm_reference`` are
the numpy definitions they are tested against, and the fallback for anything else.
"""
from __future__ import annotations

import numpy as np

from ._fast import ops as _ops


def _vector_f32(w: np.ndarray | None, d: int) -> bool:
    return w is None or (isinstance(w, np.ndarray) and w.dtype == np.float32 and w.shape == (d,)
                         and w.flags.c_contiguous)


def _rows_f32(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim >= 1 and x.shape[-1] > 0


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float, unit_offset: bool = False) -> np.ndarray:
    """x float32 [..., d] -> x / sqrt(mean(x^2) + eps) * w (or * (1 + w)); weight float [d] or None.

    Returns a new float32 array; the fused kernel sums squares in float64.
    """
    if _ops is not None and not unit_offset and _rows_f32(x) and _vector_f32(weight, x.shape[-1]):
        d = x.shape[-1]
        x2 = np.ascontiguousarray(x).reshape(-1, d)
        out = np.empty(x.shape, np.float32)
        _ops.rms_norm(x2, weight, float(eps), out.reshape(-1, d))
        return out
    return rms_norm_reference(x, weight, eps, unit_offset)


def rms_norm_reference(x: np.ndarray, weight: np.ndarray | None, eps: float, unit_offset: bool = False) -> np.ndarray:
    """The numpy definition of ``rms_norm``."""
    out = x * (1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)).astype(np.float32)
    if weight is None:
        return out
    w = weight.astype(np.float32)
    return out * (1.0 + w if unit_offset else w)


def layer_norm(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """x float32 [..., d] -> (x - mean) / sqrt(var + eps) * w + b; weight/bias float [d] or None."""
    if _ops is not None and _rows_f32(x) and _vector_f32(weight, x.shape[-1]) and _vector_f32(bias, x.shape[-1]):
        d = x.shape[-1]
        x2 = np.ascontiguousarray(x).reshape(-1, d)
        out = np.empty(x.shape, np.float32)
        _ops.layer_norm(x2, weight, bias, float(eps), out.reshape(-1, d))
        return out
    return layer_norm_reference(x, weight, bias, eps)


def layer_norm_reference(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """The numpy definition of ``layer_norm``."""
    mean = np.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    out = centered * (1.0 / np.sqrt(np.mean(np.square(centered), axis=-1, keepdims=True) + eps)).astype(np.float32)
    if weight is not None:
        out = out * weight.astype(np.float32)
    if bias is not None:
        out = out + bias.astype(np.float32)
    return out


class Norm:
    """A model's RMS or Layer norm over the last axis, with its stored weight and bias.

    A bias stored beside an RMS norm is added after the weight (x / rms(x) * w + b: llama.cpp's
    ``build_norm``, which PhiMoE GGUF files meet).

    Args:
        kind: ``"rms"`` or ``"layer"``.
        eps: added to the variance.
        weight, bias: float [d] (or None); a 2-D weight [heads, d] norms each head of an
            x [heads, T, d] with its own row (per-head q/k norms, Cohere, StableLM).
        unit_offset: the weight is stored as ``w`` and applied as ``1 + w`` (Gemma).
        offset: a number added to the stored weight instead (PLaMo 3's post-sublayer norms:
            1/5 and 5 ** -1.5, modeling_plamo.py's RMSNorm offsets); 0 with ``unit_offset``'s 1.
        groups: an RMS norm over each of that many equal groups of the last axis apart, before
            the weight (K2-Horizon's layernorm_num_groups); 1: over the whole axis.

    Calling it maps float32 [..., d] to a new float32 array of the same shape.
    """

    def __init__(self, kind: str, eps: float, weight, bias, unit_offset: bool = False, offset: float = 0.0,
                 groups: int = 1):
        self.kind, self.eps, self.groups = kind, float(eps), int(groups)
        shift = np.float32(1.0 if unit_offset else offset)
        self.weight = None if weight is None else weight.astype(np.float32) + shift
        self.bias = None if bias is None else bias.astype(np.float32)
        if self.weight is not None and self.weight.ndim == 2:  # [heads, d] against x [heads, T, d]
            self.weight = self.weight[:, None, :]
            self.bias = None if self.bias is None else self.bias.reshape(self.weight.shape)
        # RMS over a [d] float32 weight, no bias: straight to the kernel (rms_norm's checks, done once)
        self._kernel = (_ops is not None and kind == "rms" and self.bias is None and self.groups == 1 and
                        (self.weight is None or (self.weight.ndim == 1 and self.weight.flags.c_contiguous)))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if (self._kernel and x.__class__ is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous
                and x.ndim >= 2 and x.shape[-1] > 0 and (self.weight is None or self.weight.shape[0] == x.shape[-1])):
            out = np.empty_like(x)
            _ops.rms_norm(x.reshape(-1, x.shape[-1]), self.weight, self.eps, out.reshape(-1, x.shape[-1]))
            return out
        if self.kind == "layer":
            return layer_norm(x, self.weight, self.bias, self.eps)
        if self.groups > 1:  # each group apart, then the weight over the whole width
            d = x.shape[-1]
            out = rms_norm(np.ascontiguousarray(x, np.float32).reshape(*x.shape[:-1], self.groups, d // self.groups),
                           None, self.eps).reshape(x.shape)
            out = out if self.weight is None else out * self.weight
            return out if self.bias is None else out + self.bias
        out = rms_norm(x, self.weight, self.eps)
        return out if self.bias is None else out + self.bias
