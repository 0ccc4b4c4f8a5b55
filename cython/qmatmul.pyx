# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Quantized matrix products over GGML blocks read in place (ster_py._kernels.qmatmul).

``QMatrix`` wraps the raw blocks of a [rows, cols] GGML tensor (a zero-copy view
of the memory-mapped file) and computes y = x W^T for float32 x [T, cols]:

- T = 1 (decoding): one fused row dot per output, decoding each block inside it;
- T > 1 (prefill): panels of 16 rows x 256 inputs are decoded to float32 once
  and a 6 x 16 register tile runs every token over them.

Work is split over output rows with OpenMP ``prange`` (dynamic schedule: on a
shared machine a busy core must not hold the others up). The arithmetic lives in
``ster_qkernels.h`` (AVX2/FMA when the CPU has it, a portable path otherwise);
``ster_py.decoder.qlinear`` holds the numpy reference it is tested against.
"""
import os

from cython.parallel cimport prange, threadid
from libc.stdint cimport int32_t, uint8_t, uintptr_t
from libc.stdlib cimport free, malloc

import numpy as np

cdef extern from "ster_qkernels.h" nogil:
    int STER_KC
    int STER_NR
    int ster_block_size(int type)
    int ster_type_size(int type)
    int ster_cpu_avx2()
    void ster_init_tables()
    void ster_sums16(const float* x, int K, float* xs16)
    void ster_matvec_range(int type, const uint8_t* W, size_t row_bytes, const int32_t* rows, int r0, int r1,
                           int K, const float* x, const float* xs16, float* y, int simd)
    void ster_matmul_range(int type, const uint8_t* W, size_t row_bytes, const int32_t* rows, int n0, int n1,
                           int K, const float* X, int T, float* Y, int ldy, float* pack, int simd)


def _default_threads() -> int:
    env = os.environ.get("STER_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, os.cpu_count() or 1)


ster_init_tables()
cdef int _threads = _default_threads()
cdef int _simd_ok = ster_cpu_avx2()
cdef int _simd = _simd_ok
# Below this many weights a product runs on one thread: waking the team costs more.
cdef long _PARALLEL_MIN_WEIGHTS = 65536


def set_threads(int n):
    """Threads for every product from now on (``--threads``); n >= 1."""
    global _threads
    if n < 1:
        raise ValueError(f"threads must be at least 1, got {n}")
    _threads = n


def get_threads() -> int:
    """Threads the products use (default: $STER_THREADS, else every core)."""
    return _threads


def simd_available() -> bool:
    """True if this CPU runs the AVX2/FMA kernels."""
    return bool(_simd_ok)


def set_simd(bint on):
    """Use the AVX2 kernels (when the CPU has them) or force the portable path (tests)."""
    global _simd
    _simd = 1 if (on and _simd_ok) else 0


def supported_type_ids():
    """GGML type ids these kernels multiply."""
    return tuple(t for t in range(64) if ster_block_size(t))


cdef class QMatrix:
    """A GGML-quantized matrix [rows, cols] in place, with an optional output-row order.

    Args:
        raw: uint8 [n_raw_rows, row_bytes], C-contiguous (may be read-only: a view of the map).
        type_id: GGML type id (one of ``supported_type_ids()``).
        cols: weights per row (a whole number of blocks).
        rows: int32-convertible [rows] or None: output i is raw row ``rows[i]`` (a gather
            of rows, e.g. to undo llama.cpp's q/k permutation without copying the weights).
    """

    cdef const uint8_t[:, ::1] raw
    cdef object _rows_arr
    cdef const int32_t* _rows
    cdef readonly int type_id, n_rows, n_cols
    cdef size_t row_bytes

    def __cinit__(self, raw, int type_id, int cols, rows=None):
        cdef int bs = ster_block_size(type_id)
        if bs == 0:
            raise ValueError(f"no quantized product for GGML type id {type_id}")
        if cols <= 0 or cols % bs:
            raise ValueError(f"{cols} columns are not a whole number of {bs}-weight blocks")
        self.raw = raw
        self.type_id, self.n_cols = type_id, cols
        self.row_bytes = <size_t>(cols // bs) * ster_type_size(type_id)
        if self.raw.shape[1] != <Py_ssize_t>self.row_bytes:
            raise ValueError(f"rows of {cols} weights take {self.row_bytes} bytes, the raw array has {self.raw.shape[1]}")
        self._rows = NULL
        self._rows_arr = None
        self.n_rows = self.raw.shape[0]
        if rows is not None:
            arr = np.ascontiguousarray(rows, dtype=np.int32)
            if arr.ndim != 1 or (arr.size and (arr.min() < 0 or arr.max() >= self.raw.shape[0])):
                raise ValueError("row order must be a 1-D array of raw row indices")
            self._rows_arr = arr
            self.n_rows = arr.shape[0]
            if arr.shape[0]:
                self._rows = <const int32_t*><uintptr_t>arr.ctypes.data

    def matmul(self, const float[:, ::1] x, float[:, ::1] out, int force=0):
        """out[T, rows] = x[T, cols] @ W^T (float32, C-contiguous; ``out`` is overwritten).

        force: 0 chooses by T (fused row dots for T = 1, decoded panels for T > 1);
        1 forces the row dots, 2 the panels (tests).
        """
        cdef int T = x.shape[0], K = self.n_cols, N = self.n_rows
        if x.shape[1] != K:
            raise ValueError(f"input has {x.shape[1]} features, the matrix {K}")
        if out.shape[0] != T or out.shape[1] != N:
            raise ValueError(f"output must be [{T}, {N}], got [{out.shape[0]}, {out.shape[1]}]")
        if T == 0 or N == 0:
            return
        if (force == 0 and T == 1) or force == 1:
            self._rowdots(x, out)
        else:
            self._panels(x, out)

    cdef void _rowdots(self, const float[:, ::1] x, float[:, ::1] out):
        cdef int T = x.shape[0], K = self.n_cols, N = self.n_rows, t, c
        cdef int nt = _threads if <long>N * K >= _PARALLEL_MIN_WEIGHTS else 1
        cdef int simd = _simd, typ = self.type_id
        cdef int chunk = (N + 4 * nt - 1) // (4 * nt)
        cdef int n_chunks
        cdef size_t rb = self.row_bytes
        cdef const uint8_t* W = &self.raw[0, 0]
        cdef const int32_t* rows = self._rows
        cdef float* xs16 = <float*>malloc(sizeof(float) * (K // 16 + 1))
        if xs16 == NULL:
            raise MemoryError()
        chunk = max(chunk, 8)
        n_chunks = (N + chunk - 1) // chunk
        with nogil:
            for t in range(T):
                ster_sums16(&x[t, 0], K, xs16)
                if nt == 1 or n_chunks == 1:
                    ster_matvec_range(typ, W, rb, rows, 0, N, K, &x[t, 0], xs16, &out[t, 0], simd)
                else:
                    for c in prange(n_chunks, num_threads=nt, schedule="dynamic"):
                        ster_matvec_range(typ, W, rb, rows, c * chunk, min(N, (c + 1) * chunk), K,
                                          &x[t, 0], xs16, &out[t, 0], simd)
        free(xs16)

    cdef void _panels(self, const float[:, ::1] x, float[:, ::1] out):
        cdef int T = x.shape[0], K = self.n_cols, N = self.n_rows, c
        cdef int nt = _threads if <long>N * K * T >= _PARALLEL_MIN_WEIGHTS else 1
        cdef int simd = _simd, typ = self.type_id
        # Tasks of nc rows (a multiple of 16): about four per thread, 16..128 rows each.
        cdef int nc = (N + 4 * nt - 1) // (4 * nt)
        nc = min(128, max(STER_NR, (nc + STER_NR - 1) // STER_NR * STER_NR))
        cdef int n_tasks = (N + nc - 1) // nc
        cdef size_t rb = self.row_bytes
        cdef const uint8_t* W = &self.raw[0, 0]
        cdef const int32_t* rows = self._rows
        cdef size_t per_thread = <size_t>nc * STER_KC  # floats: nc/16 panels of STER_KC x 16
        cdef int teams = nt if n_tasks > 1 else 1
        cdef void* block = malloc(sizeof(float) * per_thread * teams + 64)
        if block == NULL:
            raise MemoryError()
        cdef float* pack = <float*>((<uintptr_t>block + 63) & ~(<uintptr_t>63))
        cdef float* X = <float*>&x[0, 0]
        cdef float* Y = &out[0, 0]
        with nogil:
            if teams == 1:
                for c in range(n_tasks):
                    ster_matmul_range(typ, W, rb, rows, c * nc, min(N, (c + 1) * nc), K, X, T, Y, N, pack, simd)
            else:
                for c in prange(n_tasks, num_threads=nt, schedule="dynamic"):
                    ster_matmul_range(typ, W, rb, rows, c * nc, min(N, (c + 1) * nc), K, X, T, Y, N,
                                      pack + per_thread * threadid(), simd)
        free(block)
