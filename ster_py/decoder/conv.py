"""The short causal depthwise convolution of the recurrent mixers.

Each channel c of x [T, C] is convolved with its own K taps over the K - 1 inputs before it:
``out[t, c] = bias[c] + sum_k w[c, k] * u[t + k, c]`` with u = [state; x], the state holding the
last K - 1 inputs of the earlier calls (zeros at the start) and becoming the last K - 1 rows of
u afterwards. A prompt convolved whole or in pieces, or token by token, gives the same outputs
and the same state. Mamba's ``conv1d`` (Gu & Dao 2023, arXiv:2312.00752, section 3.4), run by
Mamba-2 and the hybrids (Transformers' ``causal_conv1d_fn`` / ``causal_conv1d_update``,
llama.cpp's ``ggml_ssm_conv``).

Float32 inputs run ``ster_py._kernels.scan.causal_conv1d``; ``causal_conv1d_reference`` is
the numpy definition it is tested against and the fallback.
"""
from __future__ import annotations

import numpy as np

from . import activations
from ._fast import scan as _scan


def causal_conv1d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, state: np.ndarray,
                  silu: bool = True) -> np.ndarray:
    """Convolve x float32 [T, C] (rows contiguous) with weight float32 [C, K] over
    ``state`` float32 [K - 1, C] (updated in place); bias float32 [C] or None.

    Returns float32 [T, C], through SiLU when ``silu``.
    """
    if _scan is not None and x.dtype == np.float32 and x.ndim == 2 and (x.shape[1] <= 1 or x.strides[1] == 4):
        out = np.empty(x.shape, np.float32)
        _scan.causal_conv1d(x, weight, bias, state, out, silu)
        return out
    out, new = causal_conv1d_reference(x, weight, bias, state, silu)
    state[...] = new
    return out


def causal_conv1d_reference(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, state: np.ndarray,
                            silu: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The numpy definition of ``causal_conv1d``: (out float32 [T, C], the new state [K - 1, C]);
    ``state`` is left as it was."""
    T, (C, K) = x.shape[0], weight.shape
    u = np.concatenate([state.astype(np.float32), x.astype(np.float32)])  # [K - 1 + T, C]
    out = np.zeros((T, C), np.float32) if bias is None else np.broadcast_to(bias.astype(np.float32), (T, C)).copy()
    for k in range(K):
        out += weight[:, k].astype(np.float32) * u[k:k + T]
    if silu:
        out = activations.silu(out)
    return out, u[T:].copy()
