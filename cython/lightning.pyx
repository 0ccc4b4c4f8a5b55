# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Lightning attention's recurrence (built as ster_py._kernels.lightning).

``lightning_scan``: per head h, a [D, D] state S_h carried across calls; for each token t in
order, S_h = decay[h] * S_h + k_t,h^T v_t,h and the output is q_t,h S_h (the linear attention
with a per-head exponential decay of MiniMax-01, arXiv:2501.08313, as Transformers'
``MiniMaxLightningAttention`` and llama.cpp's minimax-01.cpp compute it, here in its recurrent
form). Heads are independent recurrences: the work is split over them on qmatmul's thread pool,
each keeping the token order. The inner loop (``ster_lightning.h``) has a portable C form and an
AVX2/FMA one chosen at run time (``set_simd``). The numpy reference is
ster_py/decoder/lightning.py's ``lightning_scan_reference``; tests/test_parity_ssm_b1.py compares them.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer

import numpy as np

cimport numpy as cnp

cnp.import_array()

from ster_py._kernels.qmatmul import MAX_THREADS, _default_threads, _level_cap, _pool_capsule

ctypedef void (*ster_task_fn)(void* ctx, long chunk, int tid) noexcept nogil
ctypedef void (*pool_run_t)(long n, ster_task_fn fn, void* ctx, int nthreads) noexcept nogil
cdef pool_run_t _pool_run = <pool_run_t>PyCapsule_GetPointer(_pool_capsule, b"ster_pool_run")

cdef extern from "ster_lightning.h" nogil:
    int ster_ops_cpu_avx2()
    void ster_lightning_one(const float* q, long ldq, const float* k, long ldk, const float* v, long ldv,
                            float decay, float* S, float* out, long ldo, int T, int D, int hd, int simd)

# $STER_SIMD_LEVEL=portable turns the AVX2 path off (see qmatmul._level_cap).
cdef int _simd_ok = ster_ops_cpu_avx2() and _level_cap() > 0
cdef int _simd = _simd_ok


def set_simd(bint on):
    """Use the AVX2/FMA loop (when the CPU has it) or force the portable one (tests)."""
    global _simd
    _simd = 1 if (on and _simd_ok) else 0


def simd_enabled() -> bool:
    """True when the AVX2 path is in use (CPU, $STER_SIMD_LEVEL and ``set_simd`` allowing it)."""
    return bool(_simd)


cdef int _threads = _default_threads()
# Below this many multiply-adds a call runs on the caller's thread alone.
cdef long _PARALLEL_MIN_WORK = 32768


def set_threads(n):
    """Threads for the recurrence from now on (1 <= n <= MAX_THREADS)."""
    global _threads
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"threads must be from 1 to {MAX_THREADS}, got {n}")
    _threads = n


cdef long _rows(object a, str name, long cols) except -1:
    """The row stride (in floats) of a float32 [rows, cols] array whose rows are contiguous."""
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 2 or a.shape[1] != cols:
        raise ValueError(f"{name} must be a float32 [rows, {cols}] array")
    if a.shape[0] == 0:
        return cols
    if a.shape[0] > 1 and a.strides[0] % 4:
        raise ValueError(f"{name} rows must be float32-aligned")
    if cols > 1 and a.strides[1] != 4:
        raise ValueError(f"{name} needs contiguous rows")
    return a.strides[0] // 4 if a.shape[0] > 1 else cols


cdef inline float* _ptr(object a):
    return <float*>cnp.PyArray_DATA(<cnp.ndarray>a)


cdef struct _Light:
    const float* q
    long ldq
    const float* k
    long ldk
    const float* v
    long ldv
    const float* decay
    float* state
    float* out
    long ldo
    int T, H, D, per_chunk, simd


cdef void _light_task(void* ctx, long chunk, int tid) noexcept nogil:
    cdef _Light* j = <_Light*>ctx
    cdef int hd
    for hd in range(<int>(chunk * j.per_chunk), <int>min(<long>j.H, (chunk + 1) * j.per_chunk)):
        ster_lightning_one(j.q, j.ldq, j.k, j.ldk, j.v, j.ldv, j.decay[hd], j.state + <long>hd * j.D * j.D,
                           j.out, j.ldo, j.T, j.D, hd, j.simd)


def lightning_scan(q, k, v, decay, state, out, int threads=0):
    """The recurrence over T tokens from ``state`` (module docstring); ``state`` ends as the last
    token's.

    Args:
        q, k, v: float32 [T, H * D] (head h in columns h * D ... h * D + D - 1; rows contiguous,
            a column slice of a wider array is fine).
        decay: float32 [H], each head's factor per token (exp(-slope)).
        state: float32 [H, D, D] C-contiguous (key channel, value channel), updated in place.
        out: float32 [T, H * D] (rows contiguous), written.
        threads: 0 for the module's setting (``set_threads``).
    """
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32 and state.ndim == 3
            and state.shape[1] == state.shape[2] and state.flags.c_contiguous):
        raise ValueError("state must be a C-contiguous float32 [H, D, D] array")
    cdef int H = state.shape[0], D = state.shape[1]
    cdef long ldq = _rows(q, "q", <long>H * D), ldk = _rows(k, "k", <long>H * D)
    cdef long ldv = _rows(v, "v", <long>H * D), ldo = _rows(out, "out", <long>H * D)
    cdef int T = q.shape[0]
    if any(a.shape[0] != T for a in (k, v, out)):
        raise ValueError("q, k, v and out must have the same rows")
    if not (isinstance(decay, np.ndarray) and decay.dtype == np.float32 and decay.shape == (H,)
            and decay.flags.c_contiguous):
        raise ValueError(f"decay must be a contiguous float32 [{H}] array")
    if T == 0 or H == 0 or D == 0:
        return
    cdef _Light j
    j.q, j.ldq, j.k, j.ldk, j.v, j.ldv = _ptr(q), ldq, _ptr(k), ldk, _ptr(v), ldv
    j.decay, j.state, j.out, j.ldo = _ptr(decay), _ptr(state), _ptr(out), ldo
    j.T, j.H, j.D, j.simd = T, H, D, _simd
    cdef int nt = threads if threads > 0 else _threads
    if <long>T * H * D * D * 2 < _PARALLEL_MIN_WORK or H < 2:
        nt = 1
    nt = min(nt, H)
    j.per_chunk = max(1, (H + 2 * nt - 1) // (2 * nt)) if nt > 1 else H
    with nogil:
        _pool_run((H + j.per_chunk - 1) // j.per_chunk, _light_task, &j, nt)


# ster_py._kernels.SOURCE_VERSION these sources implement (see ster_py/_kernels/__init__.py).
SOURCE_VERSION = 14
