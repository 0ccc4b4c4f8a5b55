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

from .decoder.qlinear import QUANT_TYPES, QuantTensor
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


def unpermute_qk(w, n_head: int):
    """Undo llama.cpp's q/k row reordering for adjacent-pair rotation.

    llama.cpp's converter (``LlamaModel.permute`` in convert_hf_to_gguf.py) stores each
    head's rows as (pair, half) instead of Hugging Face's (half, pair); this puts
    them back. w: [n_head * head_dim, in_features] (or [n_head * head_dim]) -> same shape.
    A ``QuantTensor`` is not copied: it gets the row order, so its product's outputs
    come out in Hugging Face order.
    """
    rows = w.shape[0]
    if isinstance(w, QuantTensor):
        order = np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(-1)
        return w.permuted(order)
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFWeights:
    """The tensors of a GGUF file under llama.cpp's names.

    Quantized 2-D tensors (``QUANT_TYPES``: Q4_0 ... IQ4_XS) stay in the memory map as
    ``QuantTensor`` unless ``quantized`` is False; everything else (F32/F16/BF16 tensors,
    vectors, other block types) is dequantized at ``precision``.

    Args:
        gguf: an open ``ster_py.gguf.reader.GGUFFile``.
        precision: 'f32' | 'f16' | 'bf16' for the dequantized arrays.
        qk_heads: (num_attention_heads, num_key_value_heads) when the file's architecture
            had its q/k rows reordered by llama.cpp's converter (undone here), else None.
        rename: optional map from the names the decoder asks for to GGUF tensor names
            (a "GGUF directory" asks under Hugging Face names).
        quantized: keep quantized matrices in their blocks (default); False dequantizes
            every tensor at load (the f32 reference path).

    ``get`` accepts ``name.weight`` / ``name.bias`` and returns None when absent.
    """

    def __init__(self, gguf, precision: str = "f32", qk_heads: tuple[int, int] | None = None,
                 rename: dict[str, str] | None = None, quantized: bool = True):
        self.gguf, self.dtype, self.qk_heads, self.rename = gguf, precision_dtype(precision), qk_heads, rename
        self.quantized = quantized
        self._names = set(gguf.tensor_names())

    def names(self) -> list[str]:
        return sorted(self._names)

    def get(self, name: str):
        gname = self.rename.get(name, name) if self.rename is not None else name
        if gname not in self._names:
            return None
        t = self.gguf.tensor(gname)
        if self.quantized and len(t.shape) == 2 and t.type_name in QUANT_TYPES:
            w = QuantTensor(t)
        else:
            w = t.dequantize()
        if self.qk_heads is not None and gname.endswith((".attn_q.weight", ".attn_k.weight")):
            w = unpermute_qk(w, self.qk_heads[0] if ".attn_q." in gname else self.qk_heads[1])
        return w if isinstance(w, QuantTensor) else w.astype(self.dtype, copy=False)
