"""What a block's parts (its mixer and its feed-forward) have in common.

A part holds named projections (``ROLES``: ``q`` ... ``o`` for attention, ``gate`` /
``up`` / ``down`` for a dense feed-forward). Adapters replace them after load, through
the block (``_Layer.__setattr__``), which also drops the block's fused step. Replacing
one here drops the groups built from it (``project``), so the next call multiplies by
the new projection.
"""
from __future__ import annotations

import numpy as np

from .linear import Projections


class Part:
    """Base of a block's mixer or feed-forward: projections by role, grouped on demand."""

    #: Projection roles this part exposes to adapters and the fused step.
    ROLES: tuple[str, ...] = ()

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name in self.ROLES and "_grouped" in self.__dict__:
            self._grouped.clear()

    def project(self, roles: tuple, x: np.ndarray) -> tuple:
        """The projections ``roles`` of x, computed together (``Projections``; built on first
        use, again after a projection is replaced)."""
        grouped = self.__dict__.setdefault("_grouped", {})
        g = grouped.get(roles)
        if g is None:
            g = grouped[roles] = Projections(tuple(getattr(self, r) for r in roles))
        return g(x)

    def read_order(self) -> list[tuple]:
        """The groups of projections one decoded token multiplies, in order (for read-ahead)."""
        return []
