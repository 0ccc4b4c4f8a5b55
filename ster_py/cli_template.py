"""CLI command ``ster template render``: print the prompt a model would see.

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end).
"""
from __future__ import annotations
