"""CLI commands on text alone: ``ster tokenize`` and ``ster detokenize``.

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end).
"""
from __future__ import annotations
