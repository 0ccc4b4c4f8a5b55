"""The elementwise functions every part applies: one definition of each.

Each takes and returns float32 arrays of any shape (numpy 2 keeps Python scalars weak, so
nothing widens to float64); the Cython kernels that fuse one of them are tested against these. Sources: SiLU (x * sigmoid(x)): Elfwing et al. 2017; GELU: Hendrycks
& Gimpel 2016, the exact erf form and the tanh approximation Transformers names
gelu_pytorch_tanh / gelu_new / gelu_fast; squared ReLU: So et al. 2021 (Primer).
"""
from __future__ import annotations

import numpy as np

_SQRT_2_OVER_PI = np.float32(0.7978845608028654)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), float32. Below about -88 exp(-x) overflows to inf and the result is its limit 0,
    without numpy's overflow warning."""
    with np.errstate(over="ignore"):
        return (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) as x / (1 + exp(-x)) (torch's ``silu``), in x's dtype; -0 below about -88 in float32,
    without numpy's overflow warning."""
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), float32, computed without overflow (torch's and ggml's ``softplus``: they return x
    itself above 20, where log(1 + exp(x)) rounds to x in float32 anyway)."""
    return np.logaddexp(np.float32(0.0), np.asarray(x, np.float32))


def softplus2(x: np.ndarray) -> np.ndarray:
    """log2(1 + 2 ** x): softplus with beta = ln 2 (K2-Horizon's attention gate), float32, without overflow."""
    return np.logaddexp2(np.float32(0.0), np.asarray(x, np.float32))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)) along ``axis``, in x's dtype (float32 in the decoder); a row of
    -inf but one entry gives that entry 1."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


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
    """x * Phi(x), Phi the standard normal's CDF (Transformers' ``gelu``), float32."""
    return (0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), float32."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)))


def relu2(x: np.ndarray) -> np.ndarray:
    """max(x, 0) squared, float32."""
    return np.square(np.maximum(x, 0))


#: A config's ``hidden_act`` (Transformers' names) -> its function.
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

#: An attention output gate's function (``ModelSpec.attn_gate``) -> its function.
GATES = {"sigmoid": sigmoid, "softplus": softplus, "softplus2": softplus2, "silu": silu}
