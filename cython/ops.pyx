# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Fused float32 decoder ops (built as ster_py._kernels.ops): norms, RoPE, attention
(over a float32 or float16 key/value cache), and ``LayerStep``: a whole block's decode
step in one call.

The numpy functions in ster_py/decoder (norms.py, rope.py, attention.py) are the
references; those modules call these kernels for float32 C-contiguous inputs and
keep the numpy path for everything else. Arithmetic: ``ster_ops.h``.
"""
import operator
import os

from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdlib cimport free, malloc
from libc.stdint cimport uint16_t
from libc.string cimport memcpy

import numpy as np

cimport numpy as cnp

cnp.import_array()

from ster_py._kernels.qmatmul import (MAX_THREADS, QMatrix, _default_threads, _group_capsule, _level_cap,
                                      _multi_capsule, _pool_capsule)

ctypedef void (*ster_task_fn)(void* ctx, long chunk, int tid) noexcept nogil
ctypedef void (*pool_run_t)(long n, ster_task_fn fn, void* ctx, int nthreads) noexcept nogil
# qmatmul's thread pool (one pool per process; see ster_pool.h).
cdef pool_run_t _pool_run = <pool_run_t>PyCapsule_GetPointer(_pool_capsule, b"ster_pool_run")
# qmatmul's driver of decode products (LayerStep's projections).
ctypedef int (*group_fn)(tuple mats, const float* x, int K, float** ys) except -1
cdef group_fn _group = <group_fn>PyCapsule_GetPointer(_group_capsule, b"ster_group_rowdots")
# ... and of several inputs (a token's chosen experts): ys[m] = mats[m] xs[which[m]], up to 16.
ctypedef int (*multi_fn)(tuple mats, const int* which, const float** xs, float** ys) except -1
cdef multi_fn _multi = <multi_fn>PyCapsule_GetPointer(_multi_capsule, b"ster_multi_rowdots")

cdef extern from "ster_ops.h" nogil:
    ctypedef struct ster_attn_args:
        int D
        float scale
        float softcap
        const float* bias
        int has_sink
        float sink
    int ster_ops_cpu_avx2()
    int ster_ops_cpu_f16c()
    void ster_glu(float* g, const float* u, long n, int kind, int simd)
    void ster_rms_norm_row(const float* x, int d, const float* w, float eps, float* y)
    void ster_layer_norm_row(const float* x, int d, const float* w, const float* b, float eps, float* y)
    void ster_rope_row(float* x, int rotary_dim, const float* cos_, const float* sin_, int interleaved)
    void ster_attn_group(int nh, const float* q, long qs, const void* K, long ldk, const void* V, long ldv,
                         int f16, int lo, int hi, const ster_attn_args* a, float* sc, float* out, long ostride, int simd,
                         float* ml)
    void ster_attn_merge(int P, int D, const float* acc, long acc_stride, const float* ml, long ml_stride,
                         int has_sink, float sink, float* out)
    void ster_store_kv_row(const float* x, void* row, int n, int f16, int simd)
    ctypedef struct ster_attn_qrow:
        const float* q
        const float* bias
        int lo
        int hi
        int has_sink
        float sink
        float* out
    int ster_ops_cpu_avx512()
    float ster_half_to_float(uint16_t h)
    int ster_rows_finite(const void* rows, long n, long ld, int D, int f16)
    void ster_attn_kt_fill(const void* K, long ldk, int f16, int D, int k0, int k1, int KB, float* Kt)
    void ster_attn_tile512(int nq, const ster_attn_qrow* r, const float* Kt, int k0, const float* V, long ldv,
                           int D, float scale, float cap)
    void ster_attn_tile256(int nq, const ster_attn_qrow* r, const float* Kt, int k0, const float* V, long ldv,
                           int D, float scale, float cap)


cdef int _threads = _default_threads()
# $STER_SIMD_LEVEL=portable turns the AVX2 paths off, =avx2 the AVX-512 ones (see qmatmul._level_cap).
# Levels here: 0 portable, 1 AVX2, 2 AVX-512 (only the prefill attention tiles have a third).
cdef int _level_max = min((2 if ster_ops_cpu_avx512() else 1) if ster_ops_cpu_avx2() else 0, _level_cap())
cdef int _simd_ok = _level_max > 0
cdef int _simd = _simd_ok
cdef int _level = _level_max
# Query rows from which attention runs in tiles (_attend_tiled): every call of more than one
# row (a prompt or a part of one), so that a position's output does not depend on how the
# prompt was cut into calls (ster_py/prefix.py reuses a cache bit for bit; it never prefills a
# single token, which is a decode step's row-by-row kernel). The transposed key copy costs one
# pass over the keys, shared by every row.
cdef int _TILE_MIN_ROWS = 2
# Calls that ran in tiles (tests check that the tiled path is the one they exercise).
cdef long _tile_calls = 0
cdef int _f16c_ok = ster_ops_cpu_f16c()
# Attention work (query rows x keys x head_dim) below which one thread does it all.
cdef long _PARALLEL_MIN_WORK = 131072


def set_threads(n):
    """Threads for attention from now on (1 <= n <= MAX_THREADS)."""
    global _threads
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"threads must be from 1 to {MAX_THREADS}, got {n}")
    _threads = n


def set_simd(bint on):
    """Use the SIMD paths (the highest level the CPU and $STER_SIMD_LEVEL allow) or force the
    portable ones (tests)."""
    global _simd, _level
    _level = _level_max if on else 0
    _simd = 1 if _level else 0


def set_simd_level(int level) -> int:
    """Use at most ``level`` (0 portable, 1 AVX2, 2 AVX-512) from now on, as far as the CPU and
    $STER_SIMD_LEVEL allow (tests force each level this way). Returns the level in effect."""
    global _simd, _level
    _level = max(0, min(level, _level_max))
    _simd = 1 if _level else 0
    return _level


def set_tile_min_rows(int n) -> int:
    """Query rows from which attention runs in tiles (``_attend_tiled``; default 2); returns the
    previous value. Tests and probes set a huge value to run the row-by-row kernel instead."""
    global _TILE_MIN_ROWS
    cdef int old = _TILE_MIN_ROWS
    _TILE_MIN_ROWS = max(1, n)
    return old


def tile_calls() -> int:
    """How many attention calls of this process ran in tiles (``_attend_tiled``)."""
    return _tile_calls


def simd_level() -> int:
    """The level in use: 0 portable, 1 AVX2, 2 AVX-512 (see ``set_simd_level``)."""
    return _level


def simd_enabled() -> bool:
    """True when the AVX2 paths are in use (the CPU runs them, $STER_SIMD_LEVEL allows them and
    ``set_simd`` has not turned them off)."""
    return bool(_simd)


def rms_norm(const float[:, ::1] x, const float[::1] w, float eps, float[:, ::1] out):
    """out[n] = x[n] / sqrt(mean(x[n]^2) + eps) * w for each row; w may be None (no scale)."""
    cdef Py_ssize_t n, rows = x.shape[0]
    cdef int d = x.shape[1]
    cdef const float* wp = NULL
    if w is not None:
        if w.shape[0] != d:
            raise ValueError(f"norm weight has {w.shape[0]} entries for rows of {d}")
        wp = &w[0]
    if out.shape[0] != rows or out.shape[1] != d:
        raise ValueError("output shape differs from the input's")
    if rows == 0 or d == 0:
        return
    with nogil:
        for n in range(rows):
            ster_rms_norm_row(&x[n, 0], d, wp, eps, &out[n, 0])


def layer_norm(const float[:, ::1] x, const float[::1] w, const float[::1] b, float eps, float[:, ::1] out):
    """out[n] = (x[n] - mean) / sqrt(var + eps) * w + b per row; w and b may be None."""
    cdef Py_ssize_t n, rows = x.shape[0]
    cdef int d = x.shape[1]
    cdef const float* wp = NULL
    cdef const float* bp = NULL
    if w is not None:
        if w.shape[0] != d:
            raise ValueError(f"norm weight has {w.shape[0]} entries for rows of {d}")
        wp = &w[0]
    if b is not None:
        if b.shape[0] != d:
            raise ValueError(f"norm bias has {b.shape[0]} entries for rows of {d}")
        bp = &b[0]
    if out.shape[0] != rows or out.shape[1] != d:
        raise ValueError("output shape differs from the input's")
    if rows == 0 or d == 0:
        return
    with nogil:
        for n in range(rows):
            ster_layer_norm_row(&x[n, 0], d, wp, bp, eps, &out[n, 0])


def glu(float[:, ::1] gate, const float[:, ::1] up, int kind):
    """gate = act(gate) * up in place, float32 [T, I] each; kind 0: SiLU, 1: tanh GELU."""
    if gate.shape[0] != up.shape[0] or gate.shape[1] != up.shape[1]:
        raise ValueError("gate and up shapes differ")
    if kind not in (0, 1):
        raise ValueError("kind must be 0 (silu) or 1 (gelu_tanh)")
    cdef long n = <long>gate.shape[0] * gate.shape[1]
    if n == 0:
        return
    with nogil:
        ster_glu(&gate[0, 0], &up[0, 0], n, kind, _simd)


def rope(float[:, :, ::1] x, const float[:, ::1] cos, const float[:, ::1] sin, int rotary_dim, bint interleaved,
         float[:, :, ::1] x2=None):
    """Rotate x [heads, T, head_dim] (and x2 [heads2, T, head_dim2], e.g. the keys beside the
    queries, in the same call) in place by cos/sin [T, rotary_dim // 2]."""
    cdef Py_ssize_t h, t, H = x.shape[0], T = x.shape[1], H2 = 0
    if rotary_dim > x.shape[2] or rotary_dim % 2 or cos.shape[0] != T or sin.shape[0] != T \
            or cos.shape[1] != rotary_dim // 2 or sin.shape[1] != rotary_dim // 2:
        raise ValueError("rope tables do not match the input")
    if x2 is not None:
        if x2.shape[1] != T or rotary_dim > x2.shape[2]:
            raise ValueError("rope tables do not match the second input")
        H2 = x2.shape[0]
    if T == 0 or rotary_dim == 0:
        return
    with nogil:
        for h in range(H):
            for t in range(T):
                ster_rope_row(&x[h, t, 0], rotary_dim, &cos[t, 0], &sin[t, 0], interleaved)
        for h in range(H2):
            for t in range(T):
                ster_rope_row(&x2[h, t, 0], rotary_dim, &cos[t, 0], &sin[t, 0], interleaved)


ctypedef struct _Attn:
    const float* qp
    const char* kp   # float32 or float16 rows (f16)
    const char* vp
    float* op
    const long long* pos
    const float* sinks
    const float* bias
    long bsh, bst, ldk, ldv   # ldk, ldv in elements
    long kvs, vvs             # bytes between key/value heads
    int T, G, S, D, window, simd, sg, n_sub, per_chunk, n_part, f16
    long total
    float scale, softcap
    float* scratch
    float* acc      # n_part > 1: [base][part][sg][D] partial sums
    float* ml       # n_part > 1: [base][part][sg][2] (max, sum of exp)
    # tiled prefill (level > 0, see _attend_tiled): R query rows x sg heads per item
    int level, KV, R, n_rt, k0, n_vk
    float* kt       # [KV][blocks][D][KB] transposed float32 keys from key k0
    long kt_stride  # floats per key/value head
    float* vf       # float16 values widened: [KV][k1 - k0][D], or NULL (values read in place)


cdef void _attn_task(void* ctx, long chunk, int tid) noexcept nogil:
    cdef _Attn* j = <_Attn*>ctx
    cdef long item
    for item in range(chunk * j.per_chunk, min((chunk + 1) * j.per_chunk, j.total)):
        _one(j, item, j.scratch + <long>(j.S + 8) * j.sg * tid)


cdef inline void _one(const _Attn* j, long item, float* sc) noexcept nogil:
    # item = (((g * T) + t) * n_sub + sub) * n_part + part: query row t of the heads
    # sub*sg.. of group g, over part `part` of its visible keys
    cdef int part = <int>(item % j.n_part)
    cdef long base = item // j.n_part
    cdef int sub = <int>(base % j.n_sub)
    cdef long rest = base // j.n_sub
    cdef long long n
    cdef int t = <int>(rest % j.T), g = <int>(rest // j.T)
    cdef int h0 = g * j.G + sub * j.sg
    cdef int nh = min(j.sg, j.G - sub * j.sg), i
    cdef long long p = j.pos[t]
    cdef long long lo = 0, hi = p + 1
    cdef ster_attn_args a[4]
    if j.window > 0 and p - j.window + 1 > 0:
        lo = p - j.window + 1
    if hi > j.S:
        hi = j.S
    if lo > hi:
        lo = hi
    if j.n_part > 1:
        n = hi - lo
        hi = lo + n * (part + 1) // j.n_part
        lo = lo + n * part // j.n_part
    for i in range(nh):
        a[i].D = j.D
        a[i].scale = j.scale
        a[i].softcap = j.softcap
        a[i].bias = j.bias + (h0 + i) * j.bsh + t * j.bst if j.bias != NULL else NULL
        a[i].has_sink = j.sinks != NULL
        a[i].sink = j.sinks[h0 + i] if j.sinks != NULL else 0
    if j.n_part > 1:
        ster_attn_group(nh, j.qp + (<long>h0 * j.T + t) * j.D, <long>j.T * j.D, j.kp + g * j.kvs, j.ldk,
                        j.vp + g * j.vvs, j.ldv, j.f16, <int>lo, <int>hi, a, sc,
                        j.acc + item * j.sg * j.D, j.D, j.simd, j.ml + item * j.sg * 2)
        return
    ster_attn_group(nh, j.qp + (<long>h0 * j.T + t) * j.D, <long>j.T * j.D, j.kp + g * j.kvs, j.ldk,
                    j.vp + g * j.vvs, j.ldv, j.f16, <int>lo, <int>hi, a, sc,
                    j.op + (<long>h0 * j.T + t) * j.D, <long>j.T * j.D, j.simd, NULL)


# --- float32 products on the pool ----------------------------------------------------------
# cblas_sgemm of the OpenBLAS numpy loaded, ILP64 (64-bit integer arguments: numpy's wheels'
# scipy_openblas64_); set by ster_py.decoder.linear (set_blas_sgemm) when that library is found.
ctypedef void (*sgemm64_t)(int order, int ta, int tb, long long M, long long N, long long K, float alpha,
                           const float* A, long long lda, const float* B, long long ldb, float beta,
                           float* C, long long ldc) noexcept nogil
ctypedef void (*sgemv64_t)(int order, int ta, long long M, long long N, float alpha, const float* A, long long lda,
                           const float* x, long long incx, float beta, float* y, long long incy) noexcept nogil
cdef sgemm64_t _sgemm = NULL
cdef sgemv64_t _sgemv = NULL
# Products smaller than this (M x N/threads x K multiply-adds) run as one call: OpenBLAS's
# small-matrix kernels (below about 1e6) sum in another order, and a row's result must not
# depend on the rows beside it (see ster_py.decoder.linear.MIN_ROWS).
cdef long long _GEMM_SPLIT_MIN = 1 << 21


def set_blas_sgemm(size_t address, size_t gemv_address) -> None:
    """Use the ILP64 ``cblas_sgemm`` and ``cblas_sgemv`` at these addresses (0: none) for
    ``gemm_nt``. The caller keeps that library at one thread of its own: the pool's threads
    call it side by side."""
    global _sgemm, _sgemv
    _sgemm = <sgemm64_t>address
    _sgemv = <sgemv64_t>gemv_address


def blas_sgemm_set() -> bool:
    """True when ``gemm_nt`` has a ``cblas_sgemm`` to call."""
    return _sgemm != NULL


ctypedef struct _Gemm:
    const float* x
    const float* w
    float* y
    long long M, N, K, ldx, ldw, ldy, cw


cdef void _gemm_task(void* ctx, long chunk, int tid) noexcept nogil:
    cdef _Gemm* g = <_Gemm*>ctx
    cdef long long n0 = chunk * g.cw, n1 = min(g.N, (chunk + 1) * g.cw)
    if n1 > n0 and g.M == 1:   # y[n0:n1] = w[n0:n1] x: the vector product numpy calls for one row
        _sgemv(101, 111, n1 - n0, g.K, 1.0, g.w + n0 * g.ldw, g.ldw, g.x, 1, 0.0, g.y + n0, 1)
    elif n1 > n0:
        _sgemm(101, 111, 112, g.M, n1 - n0, g.K, 1.0, g.x, g.ldx, g.w + n0 * g.ldw, g.ldw, 0.0, g.y + n0, g.ldy)


def gemm_nt(x, w, out) -> None:
    """out = x @ w.T for float32 x [M, K], w [N, K], out [M, N] (each with contiguous rows and a
    positive row stride), by the BLAS ``cblas_sgemm`` given to ``set_blas_sgemm`` (``cblas_sgemv``
    for one row, as numpy's matmul), its output
    columns split over the pool's threads (one call per thread: each packs x once): OpenBLAS's
    own threads stay idle, so that they do not spin beside the pool's between products, and
    a thread that does not start in time leaves its share to the caller instead of holding
    the product up. Raises ValueError for arrays that do not fit, RuntimeError when no
    ``cblas_sgemm`` was set."""
    if _sgemm == NULL or _sgemv == NULL:
        raise RuntimeError("no cblas_sgemm / cblas_sgemv set (set_blas_sgemm)")
    cdef const float[:, :] xv = x
    cdef const float[:, :] wv = w
    cdef float[:, :] ov = out
    if xv.strides[1] != 4 or wv.strides[1] != 4 or ov.strides[1] != 4 or xv.strides[0] <= 0 \
            or wv.strides[0] <= 0 or ov.strides[0] <= 0:
        raise ValueError("gemm_nt needs rows with contiguous elements")
    if wv.shape[1] != xv.shape[1] or ov.shape[0] != xv.shape[0] or ov.shape[1] != wv.shape[0]:
        raise ValueError("gemm_nt: x [M, K], w [N, K] and out [M, N] do not fit")
    cdef _Gemm g
    g.M, g.N, g.K = xv.shape[0], wv.shape[0], xv.shape[1]
    if g.M == 0 or g.N == 0:
        return
    if g.K == 0:
        out[...] = 0
        return
    g.x, g.w, g.y = &xv[0, 0], &wv[0, 0], &ov[0, 0]
    g.ldx, g.ldw, g.ldy = xv.strides[0] // 4, wv.strides[0] // 4, ov.strides[0] // 4
    cdef int nt = _threads
    if nt > 1 and g.M > 1 and g.M * ((g.N + nt - 1) // nt) * g.K < _GEMM_SPLIT_MIN:
        nt = 1
    g.cw = ((g.N + nt - 1) // nt + 15) // 16 * 16   # column chunks, 16-column aligned
    cdef long chunks = <long>((g.N + g.cw - 1) // g.cw)
    with nogil:
        _pool_run(chunks, _gemm_task, &g, nt if chunks > 1 else 1)


cdef inline bint _f32_3d(object a):
    return cnp.PyArray_Check(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_FLOAT32 \
        and cnp.PyArray_NDIM(<cnp.ndarray>a) == 3 and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)


cdef inline int _kv_type(object a):
    # 4 for a float32 3-D array, 2 for float16, 0 otherwise
    if not (cnp.PyArray_Check(a) and cnp.PyArray_NDIM(<cnp.ndarray>a) == 3
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)):
        return 0
    cdef int t = cnp.PyArray_TYPE(<cnp.ndarray>a)
    return 4 if t == cnp.NPY_FLOAT32 else (2 if t == cnp.NPY_FLOAT16 else 0)


cdef inline bint _kv_layout(cnp.ndarray a, int esz):
    # rows of esz-byte elements with a contiguous last axis at a positive stride (cache views qualify)
    cdef cnp.npy_intp* st = cnp.PyArray_STRIDES(a)
    return st[2] == esz and st[1] > 0 and st[1] % esz == 0 and st[0] % esz == 0


def attention(q, k, v, positions, float scale, int window, float softcap, bias, sinks):
    """Attention of q [H, T, D] over k, v [KV, S, D] (key j at position j): float32 [H, T, D].

    q is float32; k and v are both float32 or both float16 (read as their exact float32
    values, converted row by row inside the kernel).

    positions: int [T] (absolute positions of the query rows); window: sliding window in
    positions (0: none); softcap: logit soft-cap (0: none); bias: None or float32
    [H or 1, T or 1, S] with a contiguous last axis (added after scaling and soft-capping);
    sinks: None or float [H]. Returns None, computing nothing, when q is not a float32 3-D
    array, k and v are not both float32 or both float16 3-D arrays, k or v lack a
    contiguous last axis, or sinks is not [H]: the caller then uses the numpy reference. Raises ValueError for shapes that do not fit.
    (numpy arrays are read through the C API, not typed memoryviews: this runs once per
    layer and token, and the memoryview set-up was a visible part of a short call.)
    """
    cdef int esz = _kv_type(k)
    if not (_f32_3d(q) and esz and _kv_type(v) == esz):
        return None
    cdef cnp.ndarray qa = <cnp.ndarray>q, ka = <cnp.ndarray>k, va = <cnp.ndarray>v
    if not (_kv_layout(ka, esz) and _kv_layout(va, esz)):
        return None
    cdef int H = <int>cnp.PyArray_DIM(qa, 0), T = <int>cnp.PyArray_DIM(qa, 1), D = <int>cnp.PyArray_DIM(qa, 2)
    cdef int KV = <int>cnp.PyArray_DIM(ka, 0), S = <int>cnp.PyArray_DIM(ka, 1)
    cdef cnp.ndarray sa = None
    if sinks is not None:
        sa = np.ascontiguousarray(sinks, dtype=np.float32)
        if cnp.PyArray_NDIM(sa) != 1 or cnp.PyArray_DIM(sa, 0) != H:
            return None
    if KV == 0 or H % KV or cnp.PyArray_DIM(va, 0) != KV or cnp.PyArray_DIM(va, 1) != S \
            or cnp.PyArray_DIM(ka, 2) != D or cnp.PyArray_DIM(va, 2) != D:
        raise ValueError("q, k and v shapes do not fit grouped-query attention")
    if not cnp.PyArray_IS_C_CONTIGUOUS(qa):
        qa = np.ascontiguousarray(qa)
    cdef cnp.ndarray pa
    if cnp.PyArray_Check(positions) and cnp.PyArray_TYPE(<cnp.ndarray>positions) == cnp.NPY_INT64 \
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>positions):
        pa = <cnp.ndarray>positions
    else:
        pa = np.ascontiguousarray(positions, dtype=np.int64)
    if cnp.PyArray_NDIM(pa) != 1 or cnp.PyArray_DIM(pa, 0) != T:
        raise ValueError("positions do not match the query rows")
    cdef cnp.ndarray out = cnp.PyArray_EMPTY(3, cnp.PyArray_DIMS(qa), cnp.NPY_FLOAT32, 0)
    cdef const float[:, :, :] bv
    cdef const float* bp = NULL
    cdef long bsh = 0, bst = 0
    if bias is not None:
        bv = bias
        if bv.strides[2] != 4:
            raise ValueError("bias needs a contiguous last axis")
        if bv.shape[2] != S or bv.shape[0] not in (1, H) or bv.shape[1] not in (1, T):
            raise ValueError("bias must be [H or 1, T or 1, S]")
        bp = &bv[0, 0, 0]
        bsh = bv.strides[0] // 4 if bv.shape[0] == H else 0
        bst = bv.strides[1] // 4 if bv.shape[1] == T else 0
    if H == 0 or T == 0 or D == 0:
        return out
    cdef _Attn j
    j.qp = <const float*>cnp.PyArray_DATA(qa)
    j.kp = <const char*>cnp.PyArray_DATA(ka)
    j.vp = <const char*>cnp.PyArray_DATA(va)
    j.op = <float*>cnp.PyArray_DATA(out)
    j.pos = <const long long*>cnp.PyArray_DATA(pa)
    j.sinks = <const float*>cnp.PyArray_DATA(sa) if sa is not None else NULL
    j.bias = bp
    j.bsh, j.bst = bsh, bst
    j.T, j.G, j.S, j.D = T, H // KV, S, D
    j.ldk, j.ldv = cnp.PyArray_STRIDE(ka, 1) // esz, cnp.PyArray_STRIDE(va, 1) // esz
    j.kvs, j.vvs = cnp.PyArray_STRIDE(ka, 0), cnp.PyArray_STRIDE(va, 0)
    j.window = window
    j.scale, j.softcap = scale, softcap
    j.f16 = esz == 2
    cdef int rc
    with nogil:
        rc = _attend(&j, KV)
    if rc:
        raise MemoryError()
    return out


# ... and the most memory that copy (and the widened float16 values) may take.
cdef size_t _TILE_MAX_BYTES = <size_t>256 << 20


cdef inline void _rows_of(const _Attn* j, int t, long long* lo, long long* hi) noexcept nogil:
    # the keys [lo, hi) query row t sees: causal, sliding window, within the cache
    cdef long long p = j.pos[t]
    lo[0] = 0
    hi[0] = p + 1
    if j.window > 0 and p - j.window + 1 > 0:
        lo[0] = p - j.window + 1
    if hi[0] > j.S:
        hi[0] = j.S
    if hi[0] < 0:
        hi[0] = 0
    if lo[0] > hi[0]:
        lo[0] = hi[0]


cdef void _tile_task(void* ctx, long chunk, int tid) noexcept nogil:
    cdef _Attn* j = <_Attn*>ctx
    cdef long item
    for item in range(chunk * j.per_chunk, min((chunk + 1) * j.per_chunk, j.total)):
        _tile_one(j, item)


cdef inline void _tile_one(const _Attn* j, long item) noexcept nogil:
    # item = (k * KV + g) * n_sub + sub: row tile n_rt - 1 - k (the last rows, which see the
    # most keys, go first), heads sub*sg.. of group g
    cdef int sub = <int>(item % j.n_sub)
    cdef long rest = item // j.n_sub
    cdef int g = <int>(rest % j.KV)
    cdef int rt = j.n_rt - 1 - <int>(rest // j.KV)
    cdef int t0 = rt * j.R, nr = min(j.R, j.T - rt * j.R)
    cdef int h0 = g * j.G + sub * j.sg, nh = min(j.sg, j.G - sub * j.sg)
    cdef ster_attn_qrow r[12]
    cdef int ri, hh, i, t, head
    cdef long long lo, hi
    for ri in range(nr):
        t = t0 + ri
        _rows_of(j, t, &lo, &hi)
        for hh in range(nh):
            i = ri * nh + hh
            head = h0 + hh
            r[i].q = j.qp + (<long>head * j.T + t) * j.D
            r[i].bias = j.bias + head * j.bsh + t * j.bst if j.bias != NULL else NULL
            r[i].lo = <int>lo
            r[i].hi = <int>hi
            r[i].has_sink = j.sinks != NULL
            r[i].sink = j.sinks[head] if j.sinks != NULL else 0
            r[i].out = j.op + (<long>head * j.T + t) * j.D
    cdef const float* V
    cdef long ldv
    if j.vf != NULL:
        V = j.vf + <long>g * j.n_vk * j.D
        ldv = j.D
    else:
        V = <const float*>(j.vp + g * j.vvs) + <long>j.k0 * j.ldv
        ldv = j.ldv
    if j.level >= 2:
        ster_attn_tile512(nr * nh, r, j.kt + g * j.kt_stride, j.k0, V, ldv, j.D, j.scale, j.softcap)
    else:
        ster_attn_tile256(nr * nh, r, j.kt + g * j.kt_stride, j.k0, V, ldv, j.D, j.scale, j.softcap)


cdef int _attend_tiled(_Attn* j, int KV, int level) noexcept nogil:
    """Prefill attention in tiles (ster_attn_tile.h): each item is up to 12 (AVX-512; 6 with
    AVX2) query rows -- consecutive rows of heads sharing a key/value head -- over blocks of
    a transposed float32 copy of that head's keys, made here for the keys any row sees.
    Returns -1 when memory is short, 1 when the copy would pass _TILE_MAX_BYTES or a value
    is not finite (the caller then runs row by row)."""
    cdef int T = j.T, G = j.G, D = j.D, t, d, s
    cdef int qmax = 12 if level >= 2 else 6
    cdef int KB = 32 if level >= 2 else 16
    cdef long long lo, hi, k0 = -1, k1 = 0
    for t in range(T):
        _rows_of(j, t, &lo, &hi)
        if lo < hi:
            if k0 < 0 or lo < k0:
                k0 = lo
            if hi > k1:
                k1 = hi
    if k0 < 0:
        k0 = k1 = 0
    k0 = k0 // KB * KB
    cdef long nblk = (k1 - k0 + KB - 1) // KB
    cdef size_t kt_floats = <size_t>KV * nblk * D * KB
    cdef size_t vf_floats = <size_t>KV * (k1 - k0) * D if j.f16 else 0
    if (kt_floats + vf_floats) * sizeof(float) > _TILE_MAX_BYTES:
        return 1
    cdef int g
    for g in range(KV):   # an infinite or NaN value: row by row (see ster_rows_finite)
        if not ster_rows_finite(j.vp + g * j.vvs + k0 * j.ldv * (2 if j.f16 else 4), k1 - k0, j.ldv, D, j.f16):
            return 1
    # heads per item: a divisor of G (so that every item is full) giving the most rows per tile
    cdef int sg = 1, best = 0, c
    for c in range(1, min(G, qmax) + 1):
        if G % c == 0 and c * min(qmax // c, T) >= best:
            best = c * min(qmax // c, T)
            sg = c
    cdef float* kt = <float*>malloc(sizeof(float) * (kt_floats + vf_floats + 1))
    if kt == NULL:
        return -1
    cdef long key
    for g in range(KV):
        ster_attn_kt_fill(j.kp + g * j.kvs + k0 * j.ldk * (2 if j.f16 else 4), j.ldk, j.f16, D, 0,
                          <int>(k1 - k0), KB, kt + g * nblk * D * KB)
    j.vf = NULL
    j.n_vk = <int>(k1 - k0)
    if j.f16:
        j.vf = kt + kt_floats
        for g in range(KV):
            for key in range(k0, k1):
                for d in range(D):
                    j.vf[(g * (k1 - k0) + key - k0) * D + d] = ster_half_to_float(
                        (<const uint16_t*>(j.vp + g * j.vvs))[key * j.ldv + d])
    j.level = level
    j.KV = KV
    j.kt = kt
    j.kt_stride = nblk * D * KB
    j.k0 = <int>k0
    j.sg = sg
    j.n_sub = G // sg
    j.R = max(1, qmax // sg)
    j.n_rt = (T + j.R - 1) // j.R
    j.total = <long>j.n_rt * KV * j.n_sub
    j.per_chunk = 1
    _pool_run(j.total, _tile_task, j, _threads if <long>G * KV * T * (k1 - k0) * D >= _PARALLEL_MIN_WORK else 1)
    free(kt)
    return 0


cdef int _attend(_Attn* j, int KV) noexcept nogil:
    """Run the attention described by j (inputs, shapes, strides, masks set; the split and
    the scratch are chosen here) on the pool: in tiles (_attend_tiled) from _TILE_MIN_ROWS
    query rows on a SIMD level, else row by row. Returns -1 when scratch memory is short."""
    global _tile_calls
    cdef int T = j.T, G = j.G, S = j.S, D = j.D, H = G * KV
    cdef long rows = <long>KV * T
    cdef long work = <long>H * T * S * D
    cdef int nt = _threads if work >= _PARALLEL_MIN_WORK and H * T > 1 else 1
    cdef int rc
    # (D <= 1024: the tile packs its queries on the stack, D x 12 floats)
    if T >= _TILE_MIN_ROWS and _level and (_f16c_ok or not j.f16) and (_level >= 2 or D % 8 == 0) and D <= 1024:
        rc = _attend_tiled(j, KV, _level)
        if rc == 0:
            _tile_calls += 1
        if rc <= 0:
            return rc
    # Heads sharing a key/value head go together (up to 4: each key/value row is read once
    # for all of them). Too few items to keep every thread busy (decoding with few key/value
    # heads): split each row's keys into parts merged afterwards, so that the threads share
    # the reading of the cache; with too few keys for that, fewer heads per item instead.
    cdef int sg = min(G, 4)
    cdef long items = rows * ((G + sg - 1) // sg)
    cdef int n_part = 1
    if nt > 1 and items < 2 * nt and S >= 256:
        # the fewest parts that give every thread the same number of items (more parts,
        # say to balance a late helper, measured slower: each part has its start-up)
        while (items * n_part) % nt:
            n_part += 1
        n_part = min(n_part, S // 128)
    elif items < nt:
        sg = max(1, (G + (nt + rows - 1) // rows - 1) // ((nt + rows - 1) // rows))
    cdef int n_sub = (G + sg - 1) // sg
    cdef long total = rows * n_sub * n_part
    cdef float* scratch = <float*>malloc(sizeof(float) * ((<size_t>S + 8) * sg * nt
                                                          + <size_t>total * sg * (D + 2) * (n_part > 1)))
    if scratch == NULL:
        return -1
    j.simd = _simd and (_f16c_ok or not j.f16)
    j.total = total
    j.scratch = scratch
    j.sg, j.n_sub, j.n_part = sg, n_sub, n_part
    j.acc = scratch + (<size_t>S + 8) * sg * nt
    j.ml = j.acc + <size_t>total * sg * D
    j.per_chunk = 1 if total <= 8 * nt else 4
    cdef long b
    cdef int h, nh
    _pool_run((total + j.per_chunk - 1) // j.per_chunk, _attn_task, j, nt)
    if n_part > 1:
        for b in range(rows * n_sub):
            nh = min(sg, G - <int>(b % n_sub) * sg)
            for h in range(nh):
                _merge(j, b, h)
    free(scratch)
    return 0


cdef inline void _merge(const _Attn* j, long b, int h) noexcept nogil:
    # base b = (g * T + t) * n_sub + sub; head h of its sg
    cdef int sub = <int>(b % j.n_sub)
    cdef long rest = b // j.n_sub
    cdef int t = <int>(rest % j.T), g = <int>(rest // j.T)
    cdef int head = g * j.G + sub * j.sg + h
    ster_attn_merge(j.n_part, j.D, j.acc + (b * j.n_part * j.sg + h) * j.D, <long>j.sg * j.D,
                    j.ml + (b * j.n_part * j.sg + h) * 2, <long>j.sg * 2,
                    j.sinks != NULL, j.sinks[head] if j.sinks != NULL else 0,
                    j.op + (<long>head * j.T + t) * j.D)




def float_to_half(const float[::1] x not None, uint16_t[::1] out not None, bint simd=True):
    """out = x rounded to IEEE float16 bits (nearest even: numpy's ``astype(np.float16)``;
    NaNs come out quiet, so a signalling NaN's bits differ from numpy's), as the fused
    decode step stores a float16 cache; simd: F16C when the CPU has it."""
    if out.shape[0] != x.shape[0]:
        raise ValueError("out must have x's length")
    if x.shape[0]:
        ster_store_kv_row(&x[0], &out[0], <int>x.shape[0], 1, simd and _simd_ok and _f16c_ok)

# --- one block's decode step ----------------------------------------------------------------

DEF _N_NORMS = 6
_NORM_ROLES = ("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm", "q_norm", "k_norm")
_MAT_ROLES = ("q", "k", "v", "o", "gate", "up", "down")


cdef class LayerStep:
    """One decoded token through one block, in one call: the same kernels, in the same
    order and with the same float32 arithmetic, as ster_py/decoder/model.py's ``_Layer``
    on one token, without the Python between them (about 50 us per block per token).

    The block (ster_py/decoder/step.py decides which blocks qualify and builds this)::

        x = attn_norm(h); q, k, v = x Wq^T + bq, ...   (one quantized input, one pool job)
        q/k norm (per head, or over the whole projection), RoPE at position p, the norm after
        RoPE when the family puts it there; k, v stored at row p of the cache
        a = attn_post_norm(attention(q, cache[:p + 1]) Wo^T + bo); h2 = h + r * a
        x = ffn_norm(h2); m = ffn_post_norm(down(act(x Wg^T + bg) * (x Wu^T + bu))); h2 + r * m

    Args:
        mats: the seven ``QMatrix`` q [H*D, E], k and v [KV*D, E], o [E, H*D], gate and up
            [I, E], down [E, I].
        biases: seven float32 arrays of their output sizes, or None.
        norms: role -> float32 weight, or None for a norm without one; an absent role is a
            norm the block does not have. attn_norm, attn_post_norm, ffn_norm and
            ffn_post_norm weigh [E]; q_norm and k_norm [D] (``qk_norm`` 1, per head) or
            [H*D] and [KV*D] (``qk_norm`` 2, over the projection).
        eps: the RMSNorm epsilon. rotary_dim: 0 for no RoPE. act: 0 SiLU, 1 tanh GELU.
        scale, window (0: none), softcap (0: none), sinks (None or float32 [H]): attention.
        residual_scale: r above.
        ffn: None, or a callable that replaces the gated feed-forward: it takes x = ffn_norm(h2)
            (float32 [1, E], a new array) and returns m (float32 [1, E], C-contiguous), as a
            routed feed-forward (``ster_py.decoder.moe.MoE``) does; ``mats`` and ``biases``
            then hold q, k, v, o only, and ``act`` is unused.

    Raises ValueError when the shapes do not fit each other.
    """
    cdef tuple qkv, o, gu, down
    cdef object ffn
    cdef list _keep
    cdef bint _ready
    cdef const float* nw[_N_NORMS]
    cdef int has[_N_NORMS]
    cdef const float* bias[7]
    cdef const float* sinks
    cdef int E, H, KV, D, F, rot, interleaved, act, window, qk_norm, qk_after_rope
    cdef float eps, scale, softcap, r

    def __init__(self, tuple mats, tuple biases, dict norms, *, int num_heads, int num_kv_heads, int head_dim,
                 float eps, int qk_norm, bint qk_norm_after_rope, int rotary_dim, bint interleaved, float scale,
                 int window, float softcap, sinks, int act, float residual_scale, ffn=None):
        cdef int i
        if self._keep is not None:   # the pointers below would outlive the arrays they point into
            raise TypeError("a LayerStep is initialised once; build a new one")
        cdef int n_mats = 4 if ffn is not None else 7
        if len(mats) != n_mats or len(biases) != n_mats or not all(isinstance(m, QMatrix) for m in mats):
            raise ValueError("seven QMatrix (q, k, v, o, gate, up, down) and seven biases or None; with ffn, "
                             "the first four")
        if ffn is not None and not callable(ffn):
            raise TypeError("ffn must be callable")
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads or head_dim < 1:
            raise ValueError("head counts do not fit grouped-query attention")
        if qk_norm not in (0, 1, 2) or act not in (0, 1) or rotary_dim < 0 or rotary_dim % 2 \
                or rotary_dim > head_dim or window < 0:
            raise ValueError("qk_norm, act, rotary_dim or window out of range")
        E, H, KV, D = mats[0].n_cols, num_heads, num_kv_heads, head_dim
        F = mats[4].n_rows if ffn is None else 0
        want = ((H * D, E), (KV * D, E), (KV * D, E), (E, H * D), (F, E), (F, E), (E, F))
        for i in range(n_mats):
            if (mats[i].n_rows, mats[i].n_cols) != want[i]:
                raise ValueError(f"{_MAT_ROLES[i]} is [{mats[i].n_rows}, {mats[i].n_cols}], expected {list(want[i])}")
        self.E, self.H, self.KV, self.D, self.F = E, H, KV, D, F
        self.qkv, self.o = tuple(mats[:3]), (mats[3],)
        self.gu, self.down = ((mats[4], mats[5]), (mats[6],)) if ffn is None else ((), ())
        self.ffn = ffn
        self._keep = []
        for i in range(7):
            self.bias[i] = self._vector(biases[i], want[i][0], _MAT_ROLES[i] + " bias") if i < n_mats else NULL
        sizes = (E, E, E, E, D if qk_norm == 1 else H * D, D if qk_norm == 1 else KV * D)
        for i in range(_N_NORMS):
            role = _NORM_ROLES[i]
            self.has[i] = role in norms and (i < 4 or qk_norm != 0)
            self.nw[i] = self._vector(norms.get(role), sizes[i], role) if self.has[i] else NULL
        self.sinks = self._vector(sinks, H, "sinks")
        self.eps, self.qk_norm, self.qk_after_rope = eps, qk_norm, qk_norm_after_rope
        self.rot, self.interleaved = rotary_dim, interleaved
        self.scale, self.window, self.softcap = scale, window, softcap
        self.act, self.r = act, residual_scale
        self._ready = True

    cdef const float* _vector(self, a, Py_ssize_t n, str what) except? NULL:
        if a is None:
            return NULL
        arr = np.ascontiguousarray(a, dtype=np.float32)
        if arr.ndim != 1 or arr.shape[0] != n:
            raise ValueError(f"{what} must be float32 [{n}], got shape {list(arr.shape)}")
        self._keep.append(arr)
        return <const float*>cnp.PyArray_DATA(<cnp.ndarray>arr)

    def __call__(self, h, k_cache, v_cache, position, cos, sin):
        """h float32 [1, E] -> the block's output, float32 [1, E] (a new array).

        k_cache, v_cache: the layer's cache buffers, both float32 or both float16
        [KV, capacity, D] with capacity > pos and a contiguous last axis; row pos of each
        key/value head is written (rounded to nearest even for float16), rows 0..pos are
        attended. pos: the token's position. cos, sin: float32 [rotary_dim // 2] (or
        [1, rotary_dim // 2]) tables at pos, None without RoPE.
        """
        if not self._ready:
            raise TypeError("this LayerStep was not initialised (or its __init__ failed)")
        cdef long long pos = operator.index(position)   # an integer, never a truncated float
        if pos >= 2147483647:
            raise ValueError("position past the int32 range the attention kernel indexes")
        cdef int E = self.E, H = self.H, KV = self.KV, D = self.D, F = self.F, i, g
        if not (cnp.PyArray_Check(h) and cnp.PyArray_TYPE(<cnp.ndarray>h) == cnp.NPY_FLOAT32
                and cnp.PyArray_NDIM(<cnp.ndarray>h) == 2 and cnp.PyArray_DIM(<cnp.ndarray>h, 0) == 1
                and cnp.PyArray_DIM(<cnp.ndarray>h, 1) == E and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>h)
                and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>h)):
            raise ValueError(f"h must be a C-contiguous float32 array [1, {E}]")
        cdef int esz = _kv_type(k_cache)
        if not (esz and _kv_type(v_cache) == esz):
            raise ValueError("the key and value caches must both be float32 or both float16 3-D arrays")
        cdef cnp.ndarray ka = <cnp.ndarray>k_cache, va = <cnp.ndarray>v_cache
        if not (_kv_layout(ka, esz) and _kv_layout(va, esz) and cnp.PyArray_ISWRITEABLE(ka)
                and cnp.PyArray_ISWRITEABLE(va)):
            raise ValueError("the caches need a contiguous last axis and must be writable")
        if (cnp.PyArray_DIM(ka, 0) != KV or cnp.PyArray_DIM(va, 0) != KV or cnp.PyArray_DIM(ka, 2) != D
                or cnp.PyArray_DIM(va, 2) != D or pos < 0 or pos >= cnp.PyArray_DIM(ka, 1)
                or pos >= cnp.PyArray_DIM(va, 1)):
            raise ValueError(f"the caches must be [{KV}, > {pos}, {D}]")
        cdef const float* cp = NULL
        cdef const float* sp = NULL
        cdef cnp.ndarray ca, sa
        if self.rot:
            ca = np.ascontiguousarray(cos, dtype=np.float32)
            sa = np.ascontiguousarray(sin, dtype=np.float32)
            if cnp.PyArray_SIZE(ca) != self.rot // 2 or cnp.PyArray_SIZE(sa) != self.rot // 2:
                raise ValueError(f"cos and sin must hold {self.rot // 2} values")
            cp, sp = <const float*>cnp.PyArray_DATA(ca), <const float*>cnp.PyArray_DATA(sa)
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(2, cnp.PyArray_DIMS(<cnp.ndarray>h), cnp.NPY_FLOAT32, 0)
        cdef float* hp = <float*>cnp.PyArray_DATA(<cnp.ndarray>h)
        cdef float* op = <float*>cnp.PyArray_DATA(out)
        cdef long HD = <long>H * D, KD = <long>KV * D
        cdef float* buf = <float*>malloc(sizeof(float) * (3 * E + 2 * HD + 2 * KD + 2 * F + 16))
        if buf == NULL:
            raise MemoryError()
        cdef float* x = buf
        cdef float* q = x + E
        cdef float* k = q + HD
        cdef float* v = k + KD
        cdef float* att = v + KD
        cdef float* a = att + HD
        cdef float* h2 = a + E
        cdef float* gt = h2 + E
        cdef float* up = gt + F
        cdef float* ys[3]
        cdef _Attn j
        cdef int rc = 0
        try:
            self._norm(0, hp, E, x)
            ys[0], ys[1], ys[2] = q, k, v
            _group(self.qkv, x, E, ys)
            _add(q, self.bias[0], HD)
            _add(k, self.bias[1], KD)
            _add(v, self.bias[2], KD)
            if self.qk_norm == 2:
                self._norm(4, q, HD, q)
                self._norm(5, k, KD, k)
            elif self.qk_norm == 1 and not self.qk_after_rope:
                self._head_norms(q, k)
            if self.rot:
                for i in range(H):
                    ster_rope_row(q + <long>i * D, self.rot, cp, sp, self.interleaved)
                for i in range(KV):
                    ster_rope_row(k + <long>i * D, self.rot, cp, sp, self.interleaved)
            if self.qk_norm == 1 and self.qk_after_rope:
                self._head_norms(q, k)
            for g in range(KV):
                ster_store_kv_row(k + <long>g * D, <char*>cnp.PyArray_DATA(ka) + g * cnp.PyArray_STRIDE(ka, 0)
                                  + pos * cnp.PyArray_STRIDE(ka, 1), D, esz == 2, _simd and _f16c_ok)
                ster_store_kv_row(v + <long>g * D, <char*>cnp.PyArray_DATA(va) + g * cnp.PyArray_STRIDE(va, 0)
                                  + pos * cnp.PyArray_STRIDE(va, 1), D, esz == 2, _simd and _f16c_ok)
            j.qp, j.op, j.pos = q, att, &pos
            j.kp, j.vp = <const char*>cnp.PyArray_DATA(ka), <const char*>cnp.PyArray_DATA(va)
            j.sinks, j.bias, j.bsh, j.bst = self.sinks, NULL, 0, 0
            j.T, j.G, j.S, j.D = 1, H // KV, <int>(pos + 1), D
            j.ldk, j.ldv = cnp.PyArray_STRIDE(ka, 1) // esz, cnp.PyArray_STRIDE(va, 1) // esz
            j.kvs, j.vvs = cnp.PyArray_STRIDE(ka, 0), cnp.PyArray_STRIDE(va, 0)
            j.window, j.scale, j.softcap, j.f16 = self.window, self.scale, self.softcap, esz == 2
            with nogil:
                rc = _attend(&j, KV)
            if rc:
                raise MemoryError()
            ys[0] = a
            _group(self.o, att, <int>HD, ys)
            _add(a, self.bias[3], E)
            if self.has[1]:
                self._norm(1, a, E, a)
            for i in range(E):
                h2[i] = hp[i] + a[i] * self.r
            self._norm(2, h2, E, x)
            if self.ffn is not None:
                self._call_ffn(x, a)
            else:
                ys[0], ys[1] = gt, up
                _group(self.gu, x, E, ys)
                _add(gt, self.bias[4], F)
                _add(up, self.bias[5], F)
                ster_glu(gt, up, F, self.act, _simd)
                ys[0] = a
                _group(self.down, gt, F, ys)
                _add(a, self.bias[6], E)
            if self.has[3]:
                self._norm(3, a, E, a)
            for i in range(E):
                op[i] = h2[i] + a[i] * self.r
        finally:
            free(buf)
        return out

    cdef int _call_ffn(self, const float* x, float* out) except -1:
        # the feed-forward given as a callable (a routed one): float32 [1, E] -> float32 [1, E]
        cdef cnp.npy_intp dims[2]
        dims[0], dims[1] = 1, self.E
        cdef cnp.ndarray xa = cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT32, 0)
        memcpy(cnp.PyArray_DATA(xa), x, sizeof(float) * self.E)
        m = self.ffn(xa)
        if not (cnp.PyArray_Check(m) and cnp.PyArray_TYPE(<cnp.ndarray>m) == cnp.NPY_FLOAT32
                and cnp.PyArray_SIZE(<cnp.ndarray>m) == self.E and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>m)
                and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>m)):
            raise ValueError(f"the feed-forward must return a C-contiguous float32 array [1, {self.E}]")
        memcpy(out, cnp.PyArray_DATA(<cnp.ndarray>m), sizeof(float) * self.E)
        return 0

    cdef void _norm(self, int which, const float* src, long n, float* dst) noexcept:
        # norm ``which`` of the block (an absent one copies)
        if self.has[which]:
            ster_rms_norm_row(src, <int>n, self.nw[which], self.eps, dst)
        elif src != dst:
            memcpy(dst, src, sizeof(float) * n)

    cdef void _head_norms(self, float* q, float* k) noexcept:
        cdef int i
        for i in range(self.H if self.has[4] else 0):
            ster_rms_norm_row(q + <long>i * self.D, self.D, self.nw[4], self.eps, q + <long>i * self.D)
        for i in range(self.KV if self.has[5] else 0):
            ster_rms_norm_row(k + <long>i * self.D, self.D, self.nw[5], self.eps, k + <long>i * self.D)


cdef inline void _add(float* y, const float* b, long n) noexcept nogil:
    cdef long i
    if b != NULL:
        for i in range(n):
            y[i] = y[i] + b[i]

def moe_experts(x, ids, weights, tuple gates, tuple ups, tuple downs, int act, out):
    """A decoded token through its chosen experts: out = sum over i of
    ``weights[i] * down[e](act(gate[e] x) * up[e] x)`` with e = ids[i], summed in the order of
    ``ids`` from zero, each product as ``QMatrix.matmul`` computes it (the decode driver of
    ``qmatmul``), the gate as ``glu`` computes it: the same float32 arithmetic, in the same
    order, as ``ster_py.decoder.moe.MoE`` over ``DenseFFN`` experts (its reference, compared
    bit for bit in tests/test_step.py). The gate and up products of (up to eight) experts
    share one threaded job, their down products another.

    Args:
        x: float32 [1, E], C-contiguous.
        ids: int64 [k] expert ids (each below len(gates)); weights: float32 [k].
        gates, ups: per expert, a ``QMatrix`` [F, E]; downs: per expert, a ``QMatrix`` [E, F].
        act: 0 SiLU, 1 tanh GELU.
        out: float32 [1, E], C-contiguous, writable (overwritten).

    Raises ValueError for shapes that do not fit, an expert id out of range or an unknown act.
    """
    cdef int n_exp = len(gates)
    if len(ups) != n_exp or len(downs) != n_exp or n_exp == 0:
        raise ValueError("one gate, up and down matrix per expert")
    if act not in (0, 1):
        raise ValueError("act must be 0 (SiLU) or 1 (tanh GELU)")
    cdef const long long[::1] idv = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    cdef const float[::1] wv = np.ascontiguousarray(weights, dtype=np.float32).reshape(-1)
    cdef int k = idv.shape[0], i, r, nm
    if wv.shape[0] != k:
        raise ValueError("one weight per chosen expert")
    if not (_f32_2d_row(x) and _f32_2d_row(out) and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>out)):
        raise ValueError("x and out must be C-contiguous float32 arrays [1, E] (out writable)")
    g0 = gates[0]
    if not isinstance(g0, QMatrix):
        raise ValueError("gates, ups and downs must hold QMatrix")
    cdef int E = g0.n_cols, F = g0.n_rows
    if cnp.PyArray_DIM(<cnp.ndarray>x, 1) != E or cnp.PyArray_DIM(<cnp.ndarray>out, 1) != E:
        raise ValueError(f"x and out must be [1, {E}]")
    cdef list chosen = []
    for i in range(k):
        if not 0 <= idv[i] < n_exp:
            raise ValueError(f"expert id {idv[i]} out of range for {n_exp} experts")
        mg, mu, md = gates[idv[i]], ups[idv[i]], downs[idv[i]]
        if not (isinstance(mg, QMatrix) and isinstance(mu, QMatrix) and isinstance(md, QMatrix)):
            raise ValueError("gates, ups and downs must hold QMatrix")
        if (mg.n_rows, mg.n_cols, mu.n_rows, mu.n_cols, md.n_rows, md.n_cols) != (F, E, F, E, E, F):
            raise ValueError(f"expert {idv[i]}: gate and up must be [{F}, {E}], down [{E}, {F}]")
        chosen.append((mg, mu, md))
    cdef const float* xp = <const float*>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef float* op = <float*>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef float* buf = <float*>malloc(sizeof(float) * (2 * <size_t>k * F + <size_t>k * E + 16))
    if buf == NULL:
        raise MemoryError()
    cdef float* downs_out = buf + 2 * <size_t>k * F   # [k, E]
    cdef float* y
    cdef float* ys[16]
    cdef const float* xs[8]
    cdef int which[16]
    cdef int a, b
    cdef float w
    try:
        for a in range(0, k, 8):   # eight experts per job: their gates and ups, then their downs
            b = min(k, a + 8)
            for i in range(a, b):
                ys[2 * (i - a)] = buf + <size_t>(2 * i) * F
                ys[2 * (i - a) + 1] = ys[2 * (i - a)] + F
                which[2 * (i - a)] = which[2 * (i - a) + 1] = 0
            xs[0] = xp
            _multi(tuple([m for i in range(a, b) for m in chosen[i][:2]]), which, xs, ys)
            for i in range(a, b):
                ster_glu(buf + <size_t>(2 * i) * F, buf + <size_t>(2 * i + 1) * F, F, act, _simd)
                xs[i - a] = buf + <size_t>(2 * i) * F
                ys[i - a] = downs_out + <size_t>i * E
                which[i - a] = i - a
            _multi(tuple([chosen[i][2] for i in range(a, b)]), which, xs, ys)
        for r in range(E):
            op[r] = 0.0
        for i in range(k):
            w = wv[i]
            y = downs_out + <size_t>i * E
            for r in range(E):
                op[r] = op[r] + y[r] * w
    finally:
        free(buf)


cdef inline bint _f32_2d_row(object a):
    return (cnp.PyArray_Check(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_FLOAT32
            and cnp.PyArray_NDIM(<cnp.ndarray>a) == 2 and cnp.PyArray_DIM(<cnp.ndarray>a, 0) == 1
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a) and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a))


# ster_py._kernels.SOURCE_VERSION these sources implement (see ster_py/_kernels/__init__.py).
SOURCE_VERSION = 14
