"""Compiled Cython kernels (built from ../../cython/*.pyx by setup.py).

Kernels know nothing of models: they take arrays and return arrays. Each has
a plain numpy reference in the module that calls it, and a test against it.
"""

# The kernels' Python interface as of these sources. Each .pyx states the number it was
# written for; a build from older sources (an editable checkout updated without
# `python setup.py build_ext --inplace`) then fails its import check instead of failing
# later on a missing function.
SOURCE_VERSION = 14


def check_built(module) -> None:
    """Raise ImportError when ``module`` (a built kernel) is not from these sources."""
    if getattr(module, "SOURCE_VERSION", None) != SOURCE_VERSION:
        raise ImportError(f"{module.__name__} was built from other sources than this checkout; rebuild it")
