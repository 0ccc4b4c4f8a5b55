"""Access to the fused Cython ops (``ster_py._kernels.ops``), or None when they are not built.

The numpy functions stay the reference and the fallback: a source checkout without a
build still runs (slowly) and the tests compare the two.
"""
from __future__ import annotations

try:
    from .._kernels import ops
except ImportError:  # pragma: no cover - depends on the build
    ops = None
