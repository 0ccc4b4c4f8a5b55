# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Block quantizers for GGML types (built as ster_py._kernels.quantize).

The per-type quantizers are C (ster_quantize.h): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 as gguf-py
rounds them, Q4_K, Q5_K, Q6_K as llama.cpp's reference quantizers search their scales.
This module splits a tensor into chunks of blocks and runs them with OpenMP ``prange``
(each block is quantized on its own, so the bytes do not depend on the thread count).
The numpy reference each kernel is tested against is ster_py/gguf/quantize.py.
"""
from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t, uint16_t

SOURCE_VERSION = 14

cdef extern from "ster_quantize.h" nogil:
    ctypedef void (*sq_fn)(const float* x, uint8_t* y, int64_t nb)
    sq_fn sq_lookup(int type, int* block, int* nbytes)
    uint16_t sq_f32_to_f16(float f)


def supported_type_ids():
    """GGML type ids this module quantizes."""
    cdef int bs, ts
    return tuple(t for t in range(64) if sq_lookup(t, &bs, &ts) != NULL)


def quantize_into(const float[::1] src, uint8_t[::1] dst, int type_id, int n_threads=0):
    """Quantize ``src`` (float32, whole blocks of ``type_id``) into ``dst`` (uint8, its blocks).

    src: float32 [n_blocks * block_size]; dst: uint8 [n_blocks * type_size], written in place.
    n_threads: OpenMP threads; 0 = the OpenMP default. Raises ValueError on a size mismatch or
    a type without a quantizer (the Python layer checks both before calling).
    """
    cdef int bs, ts
    cdef sq_fn fn = sq_lookup(type_id, &bs, &ts)
    if fn == NULL:
        raise ValueError(f"no quantizer for GGML type id {type_id}")
    cdef Py_ssize_t n_in = src.shape[0]
    if n_in % bs:
        raise ValueError(f"input length {n_in} is not a whole number of {bs}-weight blocks")
    cdef Py_ssize_t nb = n_in // bs
    if dst.shape[0] != nb * ts:
        raise ValueError(f"{nb} blocks need {nb * ts} bytes, got {dst.shape[0]}")
    if nb == 0:
        return
    # K-quant blocks cost ~100x a legacy block: smaller chunks keep the threads balanced.
    cdef Py_ssize_t chunk = 64 if bs == 256 else 2048
    cdef Py_ssize_t n_chunks = (nb + chunk - 1) // chunk
    cdef const float* sp = &src[0]
    cdef uint8_t* dp = &dst[0]
    cdef Py_ssize_t c, start, cnt
    with nogil:
        if n_chunks == 1 or n_threads == 1:
            fn(sp, dp, nb)
        elif n_threads <= 0:
            for c in prange(n_chunks, schedule="dynamic"):
                start = c * chunk
                cnt = min(chunk, nb - start)
                fn(sp + start * bs, dp + start * ts, cnt)
        else:
            for c in prange(n_chunks, schedule="dynamic", num_threads=n_threads):
                start = c * chunk
                cnt = min(chunk, nb - start)
                fn(sp + start * bs, dp + start * ts, cnt)


def f32_to_f16_bits(const float[::1] src, uint16_t[::1] dst):
    """IEEE half bits of each float (round to nearest even), the conversion the quantizers use
    for their scales; tested against numpy's astype(float16)."""
    cdef Py_ssize_t i, n = src.shape[0]
    if dst.shape[0] != n:
        raise ValueError("src and dst differ in length")
    with nogil:
        for i in range(n):
            dst[i] = sq_f32_to_f16(src[i])
