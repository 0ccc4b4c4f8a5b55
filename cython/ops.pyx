# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Fused float32 decoder ops (built as ster_py._kernels.ops): norms, RoPE, attention
(over a float32 or float16 key/value cache).

The numpy functions in ster_py/decoder (norms.py, rope.py, attention.py) are the
references; those modules call these kernels for float32 C-contiguous inputs and
keep the numpy path for everything else. Arithmetic: ``ster_ops.h``.
"""
import os

from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdlib cimport free, malloc

import numpy as np

cimport numpy as cnp

cnp.import_array()

from ster_py._kernels.qmatmul import MAX_THREADS, _default_threads, _pool_capsule

ctypedef void (*ster_task_fn)(void* ctx, long chunk, int tid) noexcept nogil
ctypedef void (*pool_run_t)(long n, ster_task_fn fn, void* ctx, int nthreads) noexcept nogil
# qmatmul's thread pool (one pool per process; see ster_pool.h).
cdef pool_run_t _pool_run = <pool_run_t>PyCapsule_GetPointer(_pool_capsule, b"ster_pool_run")

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


cdef int _threads = _default_threads()
cdef int _simd_ok = ster_ops_cpu_avx2()
cdef int _simd = _simd_ok
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
    """Use the AVX2 paths (when the CPU has them) or force the portable ones (tests)."""
    global _simd
    _simd = 1 if (on and _simd_ok) else 0


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


cdef inline bint _f32_3d(object a):
    return cnp.PyArray_Check(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_FLOAT32 \
        and cnp.PyArray_NDIM(<cnp.ndarray>a) == 3


cdef inline int _kv_type(object a):
    # 4 for a float32 3-D array, 2 for float16, 0 otherwise
    if not (cnp.PyArray_Check(a) and cnp.PyArray_NDIM(<cnp.ndarray>a) == 3):
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
    cdef int G = H // KV
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
    cdef long ldk = cnp.PyArray_STRIDE(ka, 1) // esz, ldv = cnp.PyArray_STRIDE(va, 1) // esz
    cdef long kvs = cnp.PyArray_STRIDE(ka, 0), vvs = cnp.PyArray_STRIDE(va, 0)
    cdef long rows = <long>KV * T
    cdef long work = <long>H * T * S * D
    cdef int nt = _threads if work >= _PARALLEL_MIN_WORK and H * T > 1 else 1
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
        raise MemoryError()
    cdef _Attn j
    j.qp = <const float*>cnp.PyArray_DATA(qa)
    j.kp = <const char*>cnp.PyArray_DATA(ka)
    j.vp = <const char*>cnp.PyArray_DATA(va)
    j.op = <float*>cnp.PyArray_DATA(out)
    j.pos = <const long long*>cnp.PyArray_DATA(pa)
    j.sinks = <const float*>cnp.PyArray_DATA(sa) if sa is not None else NULL
    j.bias = bp
    j.bsh, j.bst = bsh, bst
    j.T, j.G, j.S, j.D = T, G, S, D
    j.ldk, j.ldv, j.kvs, j.vvs = ldk, ldv, kvs, vvs
    j.window = window
    j.scale, j.softcap = scale, softcap
    j.f16 = esz == 2
    j.simd = _simd and (_f16c_ok or esz == 4)
    j.total = total
    j.scratch = scratch
    j.sg, j.n_sub, j.n_part = sg, n_sub, n_part
    j.acc = scratch + (<size_t>S + 8) * sg * nt
    j.ml = j.acc + <size_t>total * sg * D
    j.per_chunk = 1 if total <= 8 * nt else 4
    cdef long b
    cdef int h, nh
    with nogil:
        _pool_run((total + j.per_chunk - 1) // j.per_chunk, _attn_task, &j, nt)
        if n_part > 1:
            for b in range(rows * n_sub):
                nh = min(sg, G - <int>(b % n_sub) * sg)
                for h in range(nh):
                    _merge(&j, b, h)
    free(scratch)
    return out


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



# ster_py._kernels.SOURCE_VERSION these sources implement (see ster_py/_kernels/__init__.py).
SOURCE_VERSION = 3
