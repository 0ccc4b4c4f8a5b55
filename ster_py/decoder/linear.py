"""A linear projection y = x W^T + b over a stored weight.

The weight keeps its stored dtype and compute is float32 whatever the storage: a
float32 weight goes to numpy's BLAS (``Linear``); a float16 / bfloat16 matrix and a
GGML-quantized weight (``QuantTensor``, in its blocks) go to ``QuantLinear``, whose
Cython kernels widen the weights inside the product.
"""
from __future__ import annotations

import numpy as np

from . import qlinear
from .qlinear import QuantLinear, QuantTensor, is_half, matvec_group

#: Products of 2 to MIN_ROWS - 1 rows run as MIN_ROWS (zero rows added, then dropped). BLAS
#: picks other kernels for a few rows, and their sums round differently: without this, the
#: logits of a prompt prefilled in two calls (a reused prefix, then the rest) would differ from
#: one call's by ~1e-4. With it a row's result does not depend on the rows beside it, on OpenBLAS
#: for products above its small-matrix sizes (M*N*K over about 1e6: every real model's); one row,
#: a decode step, keeps BLAS's vector product (decoded positions are never reused).
MIN_ROWS = 16


class Linear:
    """weight [out_features, in_features] (float32, or any float dtype widened per call), bias
    [out_features] or None.

    Row-exact for T >= 2 where the BLAS is (``blas_rows_exact``): row t of ``x @ W^T`` is then the
    same whether x has 2 rows or 2000 (see ``MIN_ROWS``), which the prompt cache's bit-for-bit reuse
    relies on (``ster_py.prefix``).
    """

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None):
        self.weight = weight
        self.bias = None if bias is None else np.asarray(bias, dtype=np.float32)
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x float32 [T, in_features] -> float32 [T, out_features]."""
        w = self.weight if self.weight.dtype == np.float32 else self.weight.astype(np.float32)
        n = x.shape[0] if x.ndim == 2 else 0
        if 1 < n < MIN_ROWS:
            padded = np.zeros((MIN_ROWS, x.shape[1]), np.float32)
            padded[:n] = x
            y = self._product(padded, w)[:n]
        else:
            y = self._product(x, w)
        return y + self.bias if self.bias is not None else y


    @staticmethod
    def _product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """x @ w.T: several rows on the kernels' register tile where it beats numpy's OpenBLAS
        (``qlinear.f32_panels``); else on the kernels' pool (``ops.gemm_nt``) once ``set_threads``
        found numpy's OpenBLAS (``qlinear.pool_blas``), else numpy's matmul (the same BLAS routine)."""
        if qlinear.POOL_BLAS and x.ndim == 2 and x.dtype == np.float32 and w.ndim == 2 and x.shape[0]:
            y = np.empty((x.shape[0], w.shape[0]), np.float32)
            if x.shape[0] > 1 and _f32_panels() and w.flags.c_contiguous and w.dtype.isnative:
                _qmatmul().f32_matmul(np.ascontiguousarray(x), w, y)
            else:
                _ops().gemm_nt(x if x.strides[1] == 4 else np.ascontiguousarray(x), w, y)
            return y
        return x @ w.T


_ROWS_EXACT: bool | None = None


def blas_rows_exact() -> bool:
    """Whether this process's float32 products give a row the same bits whatever rows share the call
    (``Linear``'s row-exactness, which the prompt cache's bit-for-bit reuse of float32 checkpoints
    needs; quantized and 16-bit weights use ster's own kernels and do not depend on it). Probed once
    on real-model sizes: a 576-wide product of 40 rows against its rows 10.. alone. True on OpenBLAS's
    SkylakeX kernels (AVX-512 CPUs); False on its Haswell/Zen kernels (AVX2 CPUs, measured on an AMD
    EPYC), whose tiles of rows round a row by its place in the tile (~1e-5 relative)."""
    global _ROWS_EXACT
    if _ROWS_EXACT is None:
        rng = np.random.default_rng(0)
        lin = Linear(rng.standard_normal((1536, 576), dtype=np.float32))
        x = rng.standard_normal((40, 576), dtype=np.float32)
        _ROWS_EXACT = bool(np.array_equal(lin(x)[10:], lin(x[10:])) and np.array_equal(lin(x)[:5], lin(x[:5])))
    return _ROWS_EXACT


def _ops():
    from .._kernels import ops

    return ops


def _qmatmul():
    from .._kernels import qmatmul

    return qmatmul


_F32_PANELS: bool | None = None


def _f32_panels() -> bool:
    """``qlinear.f32_panels()``, decided once per process (it reads the CPU and numpy's BLAS)."""
    global _F32_PANELS
    if _F32_PANELS is None:
        _F32_PANELS = qlinear.f32_panels()
    return _F32_PANELS


def make_linear(weight, bias: np.ndarray | None = None):
    """The projection for a stored weight: ``QuantLinear`` for a ``QuantTensor`` or a 2-D
    float16 / bfloat16 array (read as stored by the Cython kernels), else ``Linear``
    (float32 through numpy's BLAS).

    The one place the decoder turns a weight into a callable, so other weight kinds
    plug in here without the decoder knowing.
    """
    if isinstance(weight, QuantTensor) or is_half(weight):
        return QuantLinear(weight, bias)
    return Linear(weight, bias)


class Projections:
    """Several projections of one input (q/k/v, gate/up), returned as a tuple.

    When every part is a ``QuantLinear`` and one token is decoded (x float32 [1, in]),
    the products run as one threaded job over a single quantized copy of the input
    (``qmatmul.matvec_group``: the same arithmetic as the parts one by one, without
    their per-call overhead and the threads' wake-ups in between). Anything else calls
    the parts in turn.
    """

    def __init__(self, parts: tuple):
        self.parts = parts
        self._mats = None
        if (1 < len(parts) <= 4 and all(type(p) is QuantLinear for p in parts)
                and len({p.in_features for p in parts}) == 1):
            self._mats = tuple(p._m for p in parts)
            self._shapes = [(1, p.out_features) for p in parts]
            self._biased = [(i, p.bias) for i, p in enumerate(parts) if p.bias is not None]

    def __call__(self, x: np.ndarray) -> tuple:
        if (self._mats is not None and x.__class__ is np.ndarray and x.ndim == 2 and x.shape[0] == 1
                and x.dtype == np.float32 and x.flags.c_contiguous):
            outs = tuple([np.empty(shape, np.float32) for shape in self._shapes])
            matvec_group(self._mats, x, outs)
            for i, bias in self._biased:
                np.add(outs[i], bias, out=outs[i])   # in place: a tuple's item cannot take +=
            return outs
        return tuple(p(x) for p in self.parts)
