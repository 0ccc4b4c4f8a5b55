"""A linear projection y = x W^T + b over a stored weight.

The weight keeps its stored dtype (float32, float16 or bfloat16) and is widened
to float32 for the product, so compute is float32 whatever the storage. A
GGML-quantized weight (``QuantTensor``) stays in its blocks and goes to
``QuantLinear``.
"""
from __future__ import annotations

import numpy as np

from .qlinear import QuantLinear, QuantTensor


class Linear:
    """weight [out_features, in_features] (any float dtype), bias [out_features] or None."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None):
        self.weight = weight
        self.bias = None if bias is None else np.asarray(bias, dtype=np.float32)
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x float32 [T, in_features] -> float32 [T, out_features]."""
        w = self.weight if self.weight.dtype == np.float32 else self.weight.astype(np.float32)
        y = x @ w.T
        return y + self.bias if self.bias is not None else y


def make_linear(weight, bias: np.ndarray | None = None):
    """The projection for a stored weight: ``QuantLinear`` for a ``QuantTensor``, else ``Linear``.

    The one place the decoder turns a weight into a callable, so other weight kinds
    plug in here without the decoder knowing.
    """
    if isinstance(weight, QuantTensor):
        return QuantLinear(weight, bias)
    return Linear(weight, bias)
