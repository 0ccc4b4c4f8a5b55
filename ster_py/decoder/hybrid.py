"""Attention and a Mamba-2 scan side by side (``LayerSpec.mixer`` ``"hybrid"``, Falcon-H1).

Both read the layer's normed input; their outputs are added (Transformers'
``FalconH1DecoderLayer``, llama.cpp's ``falcon-h1.cpp``). Falcon-H1's muP multipliers
(``ModelSpec.mup``) scale attention's input and output here, the keys inside ``Attention``,
and the scan's input, projection parts and output inside ``Mamba2``. The layer keeps its
keys and values in the cache's key/value buffers and the scan's state in its
``RecurrentState`` slot.
"""
from __future__ import annotations

import numpy as np

from .attention import Attention
from .mamba2 import Mamba2
from .parts import Part


class Hybrid(Part):
    """Attention + Mamba-2 on the same input, summed.

    Args: as ``Attention`` and ``Mamba2`` (both are built from the layer's tensors).

    Calling it maps float32 [T, hidden] to float32 [T, hidden]. Adapters have no projection
    to take here (``ROLES`` is empty: seed 002 refuses adapters on state-space families).
    """

    KV = True

    def __init__(self, spec, i: int, load, norm):
        self.spec, self.i = spec, i
        self.attn = Attention(spec, i, load, norm)
        self.scan = Mamba2(spec, i, load, norm)

    def new_slot(self, dtype=None):
        return self.scan.new_slot(dtype)

    def read_order(self) -> list[tuple]:
        return self.attn.read_order() + self.scan.read_order()

    def rope_tables(self, positions, tables):
        return self.attn.rope_tables(positions, tables)

    def __call__(self, x: np.ndarray, cache, positions, bias, tables: dict) -> np.ndarray:
        m = self.spec.mup
        a_in = x * np.float32(m.attn_in) if m is not None and m.attn_in != 1.0 else x
        a = self.attn(a_in, cache, positions, bias, tables)
        if m is not None and m.attn_out != 1.0:
            a = a * np.float32(m.attn_out)
        return self.scan(x, cache, positions) + a
