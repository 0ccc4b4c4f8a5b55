# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The delta rule of the linear-attention mixers (built as ster_py._kernels.delta), carrying its
state across calls.

``delta_rule``: for each value head h (of Hv) and token t, with the head's key/query head hk
(of Hk; ``kv_map`` 0: hk = h // (Hv / Hk), the value heads of one key head adjacent, as
Transformers repeats them; 1: hk = h % Hk, tiled, as llama.cpp's qwen35 files order them), the
head's state S [V, K] (row j: value channel j) is decayed (a scalar exp(g) per token, or one
factor per key channel: Kimi Delta Attention), corrected toward the value along the key
(row_j += beta * (v_j - row_j . k) * k) and read by the query (out_j = row_j . q). Gated
DeltaNet (Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464), as Transformers'
``torch_recurrent_gated_delta_rule`` and ``recurrent_kimi_delta_attention`` and llama.cpp's
``ggml_gated_delta_net`` compute it.

Every row of every head is an independent recurrence: the work is split over (head, block of
rows) on qmatmul's thread pool, each keeping the token order. The inner loops (``ster_delta.h``)
have a portable C form and an AVX2/FMA one chosen at run time (``set_simd``). The numpy
reference is ``ster_py.decoder.delta.delta_rule_reference``; tests/test_parity_ssm_b2.py compares
them.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer

import numpy as np

cimport numpy as cnp

cnp.import_array()

from ster_py._kernels.qmatmul import MAX_THREADS, _default_threads, _pool_capsule

ctypedef void (*ster_task_fn)(void* ctx, long chunk, int tid) noexcept nogil
ctypedef void (*pool_run_t)(long n, ster_task_fn fn, void* ctx, int nthreads) noexcept nogil
cdef pool_run_t _pool_run = <pool_run_t>PyCapsule_GetPointer(_pool_capsule, b"ster_pool_run")

cdef extern from "ster_delta.h" nogil:
    int ster_ops_cpu_avx2()
    void ster_delta_rows(const float* q, long ldq, const float* k, long ldk, const float* v, long ldv,
                         const float* dec, long lddec, int per_channel, const float* beta, long ldb,
                         float* state, float* out, long ldo, int T, int K, int V, int h, int hk,
                         int j0, int j1, int simd)

cdef int _simd_ok = ster_ops_cpu_avx2()
cdef int _simd = _simd_ok


def set_simd(bint on):
    """Use the AVX2/FMA loop (when the CPU has it) or force the portable one (tests)."""
    global _simd
    _simd = 1 if (on and _simd_ok) else 0


cdef int _threads = _default_threads()
# Below this many multiply-adds a call runs on the caller's thread alone.
cdef long _PARALLEL_MIN_WORK = 32768


def set_threads(n):
    """Threads for the delta rule from now on (1 <= n <= MAX_THREADS)."""
    global _threads
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"threads must be from 1 to {MAX_THREADS}, got {n}")
    _threads = n


cdef long _rows(object a, str name, long cols, long T) except -1:
    """The row stride (in floats) of a float32 [T, cols] array whose rows are contiguous."""
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 2 or a.shape[1] != cols \
            or a.shape[0] != T:
        raise ValueError(f"{name} must be a float32 [{T}, {cols}] array")
    if T > 1 and a.strides[0] % 4:
        raise ValueError(f"{name} rows must be float32-aligned")
    if cols > 1 and a.strides[1] != 4:
        raise ValueError(f"{name} needs contiguous rows")
    return a.strides[0] // 4 if T > 1 else cols


cdef inline float* _ptr(object a):
    return <float*>cnp.PyArray_DATA(<cnp.ndarray>a)


cdef struct _Delta:
    const float* q
    long ldq
    const float* k
    long ldk
    const float* v
    long ldv
    const float* dec
    long lddec
    int per_channel
    const float* beta
    long ldb
    float* state
    float* out
    long ldo
    int T, K, V, Hv, Hk, tiled, block, blocks, simd


cdef void _delta_task(void* ctx, long chunk, int tid) noexcept nogil:
    cdef _Delta* j = <_Delta*>ctx
    cdef int h = <int>(chunk // j.blocks), b = <int>(chunk % j.blocks)
    cdef int hk = h % j.Hk if j.tiled else h // (j.Hv // j.Hk)
    cdef int j0 = b * j.block, j1 = min(j.V, (b + 1) * j.block)
    ster_delta_rows(j.q, j.ldq, j.k, j.ldk, j.v, j.ldv, j.dec, j.lddec, j.per_channel, j.beta, j.ldb, j.state,
                    j.out, j.ldo, j.T, j.K, j.V, h, hk, j0, j1, j.simd)


def delta_rule(q, k, v, decay, beta, state, out, int kv_map=0, int threads=0):
    """The delta rule over T tokens from ``state`` (module docstring); ``state`` ends as the last
    token's.

    Args:
        q, k: float32 [T, Hk * K] (rows contiguous; column slices of a wider array are fine), the
            query L2-normalised and scaled, the key L2-normalised.
        v: float32 [T, Hv * V].
        decay: float32 [T, Hv] (one factor per head and token) or [T, Hv * K] (one per key
            channel), the factors exp(g) in (0, 1].
        beta: float32 [T, Hv], the write strength.
        state: float32 [Hv, V, K] C-contiguous, updated in place.
        out: float32 [T, Hv * V] (rows contiguous), written.
        kv_map: 0: value head h reads key head h // (Hv / Hk); 1: h % Hk.
        threads: 0 for the module's setting (``set_threads``).
    """
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32 and state.ndim == 3
            and state.flags.c_contiguous):
        raise ValueError("state must be a C-contiguous float32 [Hv, V, K] array")
    cdef int Hv = state.shape[0], V = state.shape[1], K = state.shape[2]
    if not isinstance(q, np.ndarray) or q.ndim != 2 or K == 0 or q.shape[1] % K:
        raise ValueError(f"q must be float32 [T, heads * {K}]")
    cdef int T = q.shape[0], Hk = q.shape[1] // K
    if Hk == 0 or Hv % Hk:
        raise ValueError(f"{Hv} value heads do not split over {Hk} key heads")
    if kv_map not in (0, 1):
        raise ValueError("kv_map must be 0 (grouped) or 1 (tiled)")
    cdef long ldq = _rows(q, "q", <long>Hk * K, T), ldk = _rows(k, "k", <long>Hk * K, T)
    cdef long ldv = _rows(v, "v", <long>Hv * V, T), ldo = _rows(out, "out", <long>Hv * V, T)
    cdef long ldb = _rows(beta, "beta", Hv, T)
    if not isinstance(decay, np.ndarray) or decay.ndim != 2 or decay.shape[1] not in (Hv, <long>Hv * K):
        raise ValueError(f"decay must be float32 [T, {Hv}] or [T, {Hv * K}]")
    cdef int per_channel = decay.shape[1] == <long>Hv * K and K > 1
    cdef long lddec = _rows(decay, "decay", decay.shape[1], T)
    if T == 0 or Hv == 0 or V == 0:
        return
    cdef _Delta j
    j.q, j.ldq, j.k, j.ldk, j.v, j.ldv = _ptr(q), ldq, _ptr(k), ldk, _ptr(v), ldv
    j.dec, j.lddec, j.per_channel = _ptr(decay), lddec, per_channel
    j.beta, j.ldb, j.state, j.out, j.ldo = _ptr(beta), ldb, _ptr(state), _ptr(out), ldo
    j.T, j.K, j.V, j.Hv, j.Hk, j.tiled, j.simd = T, K, V, Hv, Hk, kv_map, _simd
    cdef int nt = threads if threads > 0 else _threads
    cdef long work = <long>T * Hv * V * K * 2
    if work < _PARALLEL_MIN_WORK:
        nt = 1
    # rows split so that there are at least two tasks per thread (when the heads alone are fewer)
    j.blocks = 1
    if nt > 1 and Hv < 2 * nt:
        j.blocks = min(V, (2 * nt + Hv - 1) // Hv)
    j.block = (V + j.blocks - 1) // j.blocks
    j.blocks = (V + j.block - 1) // j.block
    cdef long tasks = <long>Hv * j.blocks
    nt = <int>min(<long>nt, tasks)
    with nogil:
        _pool_run(tasks, _delta_task, &j, nt)


# ster_py._kernels.SOURCE_VERSION these sources implement (see ster_py/_kernels/__init__.py).
SOURCE_VERSION = 14
