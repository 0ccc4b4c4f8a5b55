"""Normalisations over the last axis, in float32.

RMSNorm: Zhang & Sennrich 2019 (arXiv:1910.07467); LayerNorm: Ba et al. 2016.
Gemma stores its RMSNorm weight as an offset from one (``unit_offset``).
"""
from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float, unit_offset: bool = False) -> np.ndarray:
    """x float32 [..., d] -> x / sqrt(mean(x^2) + eps) * w (or * (1 + w)); weight float [d] or None."""
    out = x * (1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)).astype(np.float32)
    if weight is None:
        return out
    w = weight.astype(np.float32)
    return out * (1.0 + w if unit_offset else w)


def layer_norm(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """x float32 [..., d] -> (x - mean) / sqrt(var + eps) * w + b; weight/bias float [d] or None."""
    mean = np.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    out = centered * (1.0 / np.sqrt(np.mean(np.square(centered), axis=-1, keepdims=True) + eps)).astype(np.float32)
    if weight is not None:
        out = out * weight.astype(np.float32)
    if bias is not None:
        out = out + bias.astype(np.float32)
    return out
