# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Recurrent mixers' kernels (built as ster_py._kernels.scan): the short causal depthwise
convolution and the two selective scans, each carrying its state across calls.

- ``causal_conv1d``: per channel c, out[t, c] = bias[c] + sum_k w[c, k] * u[t + k, c] over
  u = [state; x] (the last K - 1 inputs of earlier calls, then this call's T), optionally
  through SiLU; the state becomes the last K - 1 rows of u (Mamba's ``conv1d``, Gu & Dao 2023,
  arXiv:2312.00752; the same short convolution runs in Mamba-2 and the hybrids).
- ``selective_scan``: Mamba's scan, a [N] state per channel d decayed by exp(dt * A[d, n])
  (dt = softplus(dt_raw + dt_bias), per token and channel) and fed dt * B[t, n] * x[t, d]; the
  output is the state read through C[t] plus D[d] * x, times SiLU of the gate z.
- ``multihead_scan``: Mamba-2's scan (Dao & Gu 2024, arXiv:2405.21060), a [P, N] state per
  head with one scalar decay exp(dt * A[h]) per token, dt clamped to [lo, hi]; B and C are
  shared by the heads of a group; the output is C[t] . state + D[h] * x (no gate: Mamba-2
  gates inside its grouped norm, done in numpy).

Every channel, or head, is an independent recurrence, so the work is split over them on
qmatmul's thread pool; each keeps the token order. The inner loops (``ster_scan.h``) have a portable C
form and an AVX2/FMA one chosen at run time (``set_simd``); arithmetic is float32, softplus as
torch and ggml take it (the identity above 20). The numpy references are in
ster_py/decoder/conv.py, mamba.py and mamba2.py; tests/test_parity_ssm.py compares them.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer

import numpy as np

cimport numpy as cnp

cnp.import_array()

from ster_py._kernels.qmatmul import MAX_THREADS, _level_cap, _default_threads, _pool_capsule

ctypedef void (*ster_task_fn)(void* ctx, long chunk, int tid) noexcept nogil
ctypedef void (*pool_run_t)(long n, ster_task_fn fn, void* ctx, int nthreads) noexcept nogil
cdef pool_run_t _pool_run = <pool_run_t>PyCapsule_GetPointer(_pool_capsule, b"ster_pool_run")

cdef extern from "ster_scan.h" nogil:
    int STER_SCAN_BLOCK
    int ster_ops_cpu_avx2()
    void ster_conv_block(const float* x, long ldx, const float* wt, const float* b, float* state, float* out,
                         long ldo, int T, int C, int K, int silu, int c0, int c1, int simd)
    void ster_selective_block(const float* x, long ldx, const float* dt, long lddt, const float* dtb,
                              const float* A, const float* B, long ldb, const float* Cm, long ldc, const float* D,
                              const float* z, long ldz, float* state, float* out, long ldo, int T, int N,
                              int d0, int d1, int simd)
    void ster_multihead_one(const float* x, long ldx, const float* dt, long lddt, const float* dtb,
                            const float* A, const float* B, long ldb, const float* Cm, long ldc, const float* D,
                            float* state, float* out, long ldo, float lo, float hi, int T, int P, int N,
                            int group, int hd, int simd)

# $STER_SIMD_LEVEL=portable turns the AVX2 paths off (see qmatmul._level_cap).
cdef int _simd_ok = ster_ops_cpu_avx2() and _level_cap() > 0
cdef int _simd = _simd_ok


def set_simd(bint on):
    """Use the AVX2/FMA loops (when the CPU has them) or force the portable ones (tests)."""
    global _simd
    _simd = 1 if (on and _simd_ok) else 0


def simd_enabled() -> bool:
    """True when the AVX2 paths are in use (the CPU runs them, $STER_SIMD_LEVEL allows them and
    ``set_simd`` has not turned them off)."""
    return bool(_simd)


cdef int _threads = _default_threads()
# Below this many multiply-adds a call runs on the caller's thread alone.
cdef long _PARALLEL_MIN_WORK = 32768


def set_threads(n):
    """Threads for the scans and convolutions from now on (1 <= n <= MAX_THREADS)."""
    global _threads
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"threads must be from 1 to {MAX_THREADS}, got {n}")
    _threads = n


cdef inline int _team(long work, long items, int threads) noexcept nogil:
    cdef int nt = threads if threads > 0 else _threads
    if work < _PARALLEL_MIN_WORK or items < 2:
        return 1
    return <int>min(<long>nt, items)


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


# ---------------------------------------------------------------- short causal convolution

cdef struct _Conv:
    const float* x
    long ldx
    const float* wt
    const float* b
    float* state
    float* out
    long ldo
    int T, C, K, silu, simd


cdef void _conv_task(void* ctx, long chunk, int tid) noexcept nogil:
    cdef _Conv* j = <_Conv*>ctx
    cdef int c0 = <int>(chunk * STER_SCAN_BLOCK), c1 = <int>min(<long>j.C, (chunk + 1) * STER_SCAN_BLOCK)
    ster_conv_block(j.x, j.ldx, j.wt, j.b, j.state, j.out, j.ldo, j.T, j.C, j.K, j.silu, c0, c1, j.simd)


def causal_conv1d(x, w, bias, state, out, bint silu, int threads=0):
    """Depthwise causal convolution of x with the state's earlier inputs (module docstring).

    Args:
        x: float32 [T, C] (rows contiguous; a column slice of a wider array is fine).
        w: float32 [C, K] C-contiguous (K >= 1).
        bias: float32 [C] or None.
        state: float32 [K - 1, C] C-contiguous, updated in place to the last K - 1 inputs.
        out: float32 [T, C] (rows contiguous), written.
        silu: apply SiLU to each output.
        threads: 0 for the module's setting (``set_threads``).
    """
    if not (isinstance(w, np.ndarray) and w.dtype == np.float32 and w.ndim == 2 and w.flags.c_contiguous):
        raise ValueError("w must be a C-contiguous float32 [C, K] array")
    cdef int C = w.shape[0], K = w.shape[1]
    cdef long ldx = _rows(x, "x", C), ldo = _rows(out, "out", C)
    cdef int T = x.shape[0]
    if out.shape[0] != T or K < 1:
        raise ValueError("out must have x's rows and w at least one tap")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32 and state.shape == (K - 1, C)
            and state.flags.c_contiguous):
        raise ValueError(f"state must be a C-contiguous float32 [{K - 1}, {C}] array")
    if bias is not None and not (isinstance(bias, np.ndarray) and bias.dtype == np.float32
                                 and bias.shape == (C,) and bias.flags.c_contiguous):
        raise ValueError(f"bias must be a contiguous float32 [{C}] array or None")
    if T == 0 or C == 0:
        return
    wt = np.ascontiguousarray(w.T)  # the taps as [K, C]: each tap's channels contiguous
    cdef _Conv j
    j.x, j.ldx, j.wt = _ptr(x), ldx, _ptr(wt)
    j.b = _ptr(bias) if bias is not None else NULL
    j.state = _ptr(state) if K > 1 else NULL
    j.out, j.ldo = _ptr(out), ldo
    j.T, j.C, j.K, j.silu, j.simd = T, C, K, silu, _simd
    cdef long chunks = (C + STER_SCAN_BLOCK - 1) // STER_SCAN_BLOCK
    cdef int nt = _team(<long>T * C * K, chunks, threads)
    with nogil:
        _pool_run(chunks, _conv_task, &j, nt)


# ---------------------------------------------------------------- Mamba's selective scan

cdef struct _Sel:
    const float* x
    long ldx
    const float* dt
    long lddt
    const float* dtb
    const float* A
    const float* B
    long ldb
    const float* Cm
    long ldc
    const float* D
    const float* z
    long ldz
    float* state
    float* out
    long ldo
    int T, Dn, N, simd


cdef void _sel_task(void* ctx, long chunk, int tid) noexcept nogil:
    cdef _Sel* j = <_Sel*>ctx
    cdef int d0 = <int>(chunk * STER_SCAN_BLOCK), d1 = <int>min(<long>j.Dn, (chunk + 1) * STER_SCAN_BLOCK)
    ster_selective_block(j.x, j.ldx, j.dt, j.lddt, j.dtb, j.A, j.B, j.ldb, j.Cm, j.ldc, j.D, j.z, j.ldz,
                         j.state, j.out, j.ldo, j.T, j.N, d0, d1, j.simd)


def selective_scan(x, dt, dt_bias, A, B, C, D, z, state, out, int threads=0):
    """Mamba's scan over T tokens from ``state`` (module docstring); ``state`` ends as the last
    token's.

    Args:
        x: float32 [T, Dn] (the convolved stream); dt: float32 [T, Dn], the step before its bias
            and softplus; dt_bias: float32 [Dn] or None.
        A: float32 [Dn, N] C-contiguous (negative: -exp(A_log)).
        B, C: float32 [T, N] (rows contiguous). D: float32 [Dn]. z: float32 [T, Dn] gate, or None.
        state: float32 [Dn, N] C-contiguous, updated in place.
        out: float32 [T, Dn] (rows contiguous), written.
        threads: 0 for the module's setting.
    """
    if not (isinstance(A, np.ndarray) and A.dtype == np.float32 and A.ndim == 2 and A.flags.c_contiguous):
        raise ValueError("A must be a C-contiguous float32 [Dn, N] array")
    cdef int Dn = A.shape[0], N = A.shape[1]
    cdef long ldx = _rows(x, "x", Dn), lddt = _rows(dt, "dt", Dn), ldo = _rows(out, "out", Dn)
    cdef long ldb = _rows(B, "B", N), ldc = _rows(C, "C", N)
    cdef long ldz = _rows(z, "z", Dn) if z is not None else 0
    cdef int T = x.shape[0]
    if any(a.shape[0] != T for a in (dt, B, C, out)) or (z is not None and z.shape[0] != T):
        raise ValueError("x, dt, B, C, z and out must have the same rows")
    for name, v in (("D", D), ("dt_bias", dt_bias)):
        if v is not None and not (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == (Dn,)
                                  and v.flags.c_contiguous):
            raise ValueError(f"{name} must be a contiguous float32 [{Dn}] array")
    if D is None:
        raise ValueError("D is required")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32 and state.shape == (Dn, N)
            and state.flags.c_contiguous):
        raise ValueError(f"state must be a C-contiguous float32 [{Dn}, {N}] array")
    if T == 0 or Dn == 0:
        return
    cdef _Sel j
    j.x, j.ldx, j.dt, j.lddt = _ptr(x), ldx, _ptr(dt), lddt
    j.dtb = _ptr(dt_bias) if dt_bias is not None else NULL
    j.A, j.B, j.ldb, j.Cm, j.ldc, j.D = _ptr(A), _ptr(B), ldb, _ptr(C), ldc, _ptr(D)
    j.z = _ptr(z) if z is not None else NULL
    j.ldz = ldz
    j.state, j.out, j.ldo = _ptr(state), _ptr(out), ldo
    j.T, j.Dn, j.N, j.simd = T, Dn, N, _simd
    cdef long chunks = (Dn + STER_SCAN_BLOCK - 1) // STER_SCAN_BLOCK
    cdef int nt = _team(<long>T * Dn * N * 4, chunks, threads)
    with nogil:
        _pool_run(chunks, _sel_task, &j, nt)


# ---------------------------------------------------------------- Mamba-2's multi-head scan

cdef struct _Multi:
    const float* x
    long ldx
    const float* dt
    long lddt
    const float* dtb
    const float* A
    const float* B
    long ldb
    const float* Cm
    long ldc
    const float* D
    float* state
    float* out
    long ldo
    float lo, hi
    int T, H, P, N, heads_per_group, per_chunk, simd


cdef void _multi_task(void* ctx, long chunk, int tid) noexcept nogil:
    cdef _Multi* j = <_Multi*>ctx
    cdef int hd
    for hd in range(<int>(chunk * j.per_chunk), <int>min(<long>j.H, (chunk + 1) * j.per_chunk)):
        ster_multihead_one(j.x, j.ldx, j.dt, j.lddt, j.dtb, j.A, j.B, j.ldb, j.Cm, j.ldc, j.D, j.state, j.out,
                           j.ldo, j.lo, j.hi, j.T, j.P, j.N, hd // j.heads_per_group, hd, j.simd)


def multihead_scan(x, dt, dt_bias, A, B, C, D, state, out, float lo=0.0, float hi=np.inf, int threads=0):
    """Mamba-2's scan over T tokens from ``state`` (module docstring); ``state`` ends as the
    last token's.

    Args:
        x: float32 [T, H * P] (heads of P channels). dt: float32 [T, H], the step before its
            bias and softplus; dt_bias: float32 [H] or None. A: float32 [H] (negative).
        B, C: float32 [T, G * N] (G groups of N; H a multiple of G). D: float32 [H].
        state: float32 [H, P, N] C-contiguous, updated in place.
        out: float32 [T, H * P] (rows contiguous), written.
        lo, hi: the step's clamp (time_step_limit; -inf / inf: none).
        threads: 0 for the module's setting.
    """
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32 and state.ndim == 3
            and state.flags.c_contiguous):
        raise ValueError("state must be a C-contiguous float32 [H, P, N] array")
    cdef int H = state.shape[0], P = state.shape[1], N = state.shape[2]
    cdef long ldx = _rows(x, "x", <long>H * P), lddt = _rows(dt, "dt", H), ldo = _rows(out, "out", <long>H * P)
    if B.ndim != 2 or N == 0 or B.shape[1] % N:
        raise ValueError("B must be float32 [T, groups * N]")
    cdef int G = B.shape[1] // N
    if G == 0 or H % G:
        raise ValueError(f"{H} heads do not split over {G} groups")
    cdef long ldb = _rows(B, "B", <long>G * N), ldc = _rows(C, "C", <long>G * N)
    cdef int T = x.shape[0]
    if any(a.shape[0] != T for a in (dt, B, C, out)):
        raise ValueError("x, dt, B, C and out must have the same rows")
    for name, v in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if (v is not None or name != "dt_bias") and not (
                isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == (H,) and v.flags.c_contiguous):
            raise ValueError(f"{name} must be a contiguous float32 [{H}] array")
    if T == 0 or H == 0 or P == 0:
        return
    cdef _Multi j
    j.x, j.ldx, j.dt, j.lddt = _ptr(x), ldx, _ptr(dt), lddt
    j.dtb = _ptr(dt_bias) if dt_bias is not None else NULL
    j.A, j.B, j.ldb, j.Cm, j.ldc, j.D = _ptr(A), _ptr(B), ldb, _ptr(C), ldc, _ptr(D)
    j.state, j.out, j.ldo = _ptr(state), _ptr(out), ldo
    j.lo, j.hi = lo, hi
    j.T, j.H, j.P, j.N, j.heads_per_group, j.simd = T, H, P, N, H // G, _simd
    cdef int nt = _team(<long>H * P * T * N * 2, H, threads)
    j.per_chunk = max(1, (H + 2 * nt - 1) // (2 * nt)) if nt > 1 else H
    with nogil:
        _pool_run((H + j.per_chunk - 1) // j.per_chunk, _multi_task, &j, nt)


# ster_py._kernels.SOURCE_VERSION these sources implement (see ster_py/_kernels/__init__.py).
SOURCE_VERSION = 14
