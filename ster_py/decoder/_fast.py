"""Access to the fused Cython ops (``ster_py._kernels.ops``) and the recurrent mixers'
kernels (``ster_py._kernels.scan``, ``ster_py._kernels.lightning``), each None when it is not built.

The numpy functions stay the reference and the fallback: a source checkout without a
build still runs (slowly) and the tests compare the two.
"""
from __future__ import annotations

try:
    from .._kernels import check_built, ops

    check_built(ops)
except ImportError:  # pragma: no cover - depends on the build (or a stale one)
    ops = None

try:
    from .._kernels import check_built as _check, scan

    _check(scan)
except ImportError:  # pragma: no cover - depends on the build (or a stale one)
    scan = None

try:
    from .._kernels import check_built as _check_lightning, lightning

    _check_lightning(lightning)
except ImportError:  # pragma: no cover - depends on the build (or a stale one)
    lightning = None
