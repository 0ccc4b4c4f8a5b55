"""Activations and the feed-forward sublayer.

GELU: Hendrycks & Gimpel 2016 (exact erf form, and the tanh approximation that
Transformers calls gelu_pytorch_tanh / gelu_new / gelu_fast); SiLU: Elfwing et al.
2017; squared ReLU: So et al. 2021 (Primer). Gated feed-forward: Shazeer 2020.
"""
from __future__ import annotations

import numpy as np

_SQRT_2_OVER_PI = np.float32(0.7978845608028654)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64 by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7).

    numpy has no erf and scipy is not a dependency; the error is far below the
    float32 rounding of the activations it feeds.
    """
    x = x.astype(np.float64)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-a * a)
    return s * y


def gelu_exact(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def relu2(x: np.ndarray) -> np.ndarray:
    return np.square(np.maximum(x, 0))


ACT_FNS = {
    "silu": silu,
    "gelu": gelu_exact,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_tanh": gelu_tanh,
    "gelu_new": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "relu2": relu2,
    "relu": lambda x: np.maximum(x, 0),
}
