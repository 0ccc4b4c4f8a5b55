"""Named weight arrays from safetensors files, at a chosen stored precision.

``SafetensorsWeights`` indexes every tensor of a (possibly sharded) checkpoint by
reading only the file headers; arrays are read when the decoder asks for them and
stored as ``precision`` (float32, float16 or bfloat16 via ml_dtypes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import ml_dtypes
import numpy as np
from safetensors import safe_open

from .errors import SterError

PRECISIONS: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}


def precision_dtype(precision: str) -> np.dtype:
    """'f32' | 'f16' | 'bf16' -> numpy dtype. Raises SterError for anything else."""
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise SterError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}") from None


class SafetensorsWeights:
    """The tensors of one checkpoint.

    Args:
        files: the checkpoint's .safetensors files (order does not matter; a name found
            in two files is refused).
        precision: stored dtype for floating tensors: 'f32', 'f16' or 'bf16'.

    Raises:
        SterError: a file cannot be opened as safetensors ("failed to map N model weight
            files"), or two files hold the same tensor name.
    """

    def __init__(self, files: Iterable[Path], precision: str = "f32"):
        self.dtype = precision_dtype(precision)
        self._handles = []
        self._where: dict[str, int] = {}
        files = [Path(f) for f in files]
        for n, path in enumerate(files):
            try:
                handle = safe_open(str(path), framework="numpy")
            except Exception as e:  # the library raises several types for a bad header
                raise SterError(f"failed to map {len(files)} model weight files: {path}: {e}") from None
            self._handles.append(handle)
            for name in handle.keys():
                if name in self._where:
                    raise SterError(f"tensor {name!r} is stored twice: in {files[self._where[name]]} "
                                    f"and in {path}; remove the stray shard")
                self._where[name] = n
        self.files = files

    def names(self) -> list[str]:
        """Every tensor name in the checkpoint."""
        return list(self._where)

    def get(self, name: str) -> np.ndarray | None:
        """The tensor ``name`` at the stored precision (floats) or as stored (others); None if absent."""
        n = self._where.get(name)
        if n is None:
            return None
        t = self._handles[n].get_tensor(name)
        if t.dtype.kind == "f" or t.dtype == ml_dtypes.bfloat16:
            t = t.astype(self.dtype, copy=False)
        return t
