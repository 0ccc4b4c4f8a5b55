"""Compiled Cython kernels (built from ../../cython/*.pyx by setup.py).

Kernels know nothing of models: they take arrays and return arrays. Each has
a plain numpy reference in the module that calls it, and a test against it.
"""
