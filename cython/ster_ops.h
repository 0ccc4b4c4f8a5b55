/* Fused float32 kernels for the non-matmul part of a decoder step: RMSNorm /
 * LayerNorm over rows, rotary embedding in place, and attention of a few query
 * rows over the key/value cache (GQA, causal + sliding window, soft-cap,
 * additive bias, sinks) with a two-pass softmax.
 *
 * Each has a numpy reference in ster_py/decoder (norms.py, rope.py,
 * attention.py) that the tests compare against. AVX2/FMA versions are chosen at
 * run time on x86-64 (function target attributes); the plain C loops are the
 * portable path.
 */
#ifndef STER_OPS_H
#define STER_OPS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(STER_NO_SIMD) && (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define STER_OPS_X86 1
#include <immintrin.h>
#define STER_OPS_AVX2 __attribute__((target("avx2,fma")))
#define STER_OPS_INLINE static inline __attribute__((always_inline, target("avx2,fma")))
#else
#define STER_OPS_X86 0
#endif

/* ------------------------------------------------------------------------- */
/* Norms: y = (x - mean?) / sqrt(mean(sq) + eps) * w (+ b), one row of d.    */

static void ster_rms_norm_row(const float* x, int d, const float* w, float eps, float* y) {
    double ss = 0.0;   /* float64 sum: no cancellation worries for long rows */
    int i;
    for (i = 0; i < d; i++) ss += (double)x[i] * (double)x[i];
    float inv = (float)(1.0 / sqrt(ss / d + (double)eps));
    if (w) for (i = 0; i < d; i++) y[i] = (x[i] * inv) * w[i];
    else for (i = 0; i < d; i++) y[i] = x[i] * inv;
}

static void ster_layer_norm_row(const float* x, int d, const float* w, const float* b, float eps, float* y) {
    double s = 0.0, ss = 0.0;
    int i;
    for (i = 0; i < d; i++) s += x[i];
    float mean = (float)(s / d);
    for (i = 0; i < d; i++) { double c = (double)(x[i] - mean); ss += c * c; }
    float inv = (float)(1.0 / sqrt(ss / d + (double)eps));
    for (i = 0; i < d; i++) {
        float v = (x[i] - mean) * inv;
        if (w) v *= w[i];
        if (b) v += b[i];
        y[i] = v;
    }
}

/* ------------------------------------------------------------------------- */
/* RoPE in place on one row of a head: pairs (i, i + d/2) or (2i, 2i + 1).   */

static void ster_rope_row(float* x, int rotary_dim, const float* cos_, const float* sin_, int interleaved) {
    int h = rotary_dim / 2, i;
    if (interleaved) {
        for (i = 0; i < h; i++) {
            float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * cos_[i] - b * sin_[i];
            x[2 * i + 1] = b * cos_[i] + a * sin_[i];
        }
    } else {
        for (i = 0; i < h; i++) {
            float a = x[i], b = x[i + h];
            x[i] = a * cos_[i] - b * sin_[i];
            x[i + h] = b * cos_[i] + a * sin_[i];
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Attention for one query row.                                              */

typedef struct {
    int D;              /* head_dim */
    float scale;        /* multiplies q.k */
    float softcap;      /* 0: none */
    const float* bias;  /* per key (already offset to this head and row), or NULL */
    int has_sink;
    float sink;
} ster_attn_args;

static float ster_dot_scalar(const float* a, const float* b, int n) {
    float s = 0.0f;
    int i;
    for (i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* scores -> probabilities in place (unnormalised), returns their sum (sink included)
 * and stores the max subtracted in *mx_out. */
static float ster_softmax_scalar(float* sc, int n, int has_sink, float sink, float* mx_out) {
    float mx = -INFINITY, sum = 0.0f;
    int j;
    for (j = 0; j < n; j++) if (sc[j] > mx) mx = sc[j];
    if (has_sink && sink > mx) mx = sink;
    for (j = 0; j < n; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
    if (has_sink) sum += expf(sink - mx);
    *mx_out = mx;
    return sum;
}

/* ml == NULL: out = softmax-weighted values. ml != NULL (one part of a split key range):
 * out = the unnormalised weighted sum, ml[0] = the max score subtracted, ml[1] = the sum
 * of exp(score - max); ster_attn_merge combines the parts (sinks are added there). */
static void ster_attn_row_scalar(const float* q, const float* K, long ldk, const float* V, long ldv,
                                 int lo, int hi, const ster_attn_args* a, float* sc, float* out, float* ml) {
    int n = hi - lo, j, i, D = a->D;
    for (j = 0; j < n; j++) {
        float s = ster_dot_scalar(q, K + (long)(lo + j) * ldk, D) * a->scale;
        if (a->softcap > 0) s = tanhf(s / a->softcap) * a->softcap;
        if (a->bias) s += a->bias[lo + j];
        sc[j] = s;
    }
    float mx, sum = ster_softmax_scalar(sc, n, a->has_sink && !ml, a->sink, &mx);
    for (i = 0; i < D; i++) out[i] = 0.0f;
    for (j = 0; j < n; j++) {
        const float* v = V + (long)(lo + j) * ldv;
        for (i = 0; i < D; i++) out[i] += sc[j] * v[i];
    }
    if (ml) { ml[0] = mx; ml[1] = sum; return; }
    float inv = sum > 0 ? 1.0f / sum : 0.0f;
    for (i = 0; i < D; i++) out[i] *= inv;
}

#if STER_OPS_X86

/* exp(x) for x <= 0 (scores minus their max): Cephes' expf range reduction and
 * polynomial (about 1 ulp), results below 2^-126 flushed to 0. */
STER_OPS_INLINE __m256 ster_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

STER_OPS_INLINE float ster_hsum8_ops(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* 4 dot products of q with 4 key rows, D a multiple of 8. */
STER_OPS_INLINE __m128 ster_dot4(const float* q, const float* k0, long ldk, int D) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int i;
    for (i = 0; i < D; i += 8) {
        __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + ldk + i), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * ldk + i), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * ldk + i), a3);
    }
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Up to 4 query heads that share one key/value head (GQA), one query row: every key and
 * value row is loaded once for all of them. q: nh rows of D at stride qs; out likewise;
 * sc: scratch nh * n floats; a[i] per head (bias, sink); scale and softcap shared. */
static STER_OPS_AVX2 void ster_attn_group_avx2(int nh, const float* q, long qs, const float* K, long ldk,
                                               const float* V, long ldv, int lo, int hi,
                                               const ster_attn_args* a, float* sc, float* out, long os, float* ml) {
    const int n = hi - lo, D = a[0].D;
    int i, j, c0, h;
    /* scores, 4 keys x each head at a time (the 4 key rows stay in L1). The value rows of
     * the same keys are prefetched meanwhile: decoding reads the cache from memory, and the
     * weighted-value pass below walks each row in 16-column slabs (strided), which the
     * hardware prefetchers serve poorly; fetched here they overlap with the key reads. */
    const int vlines = (int)((D * sizeof(float) + 63) / 64);
    for (j = 0; j + 4 <= n; j += 4) {
        int r, c;
        for (r = 0; r < 4; r++) {
            const char* vr = (const char*)(V + (long)(lo + j + r) * ldv);
            for (c = 0; c < vlines; c++) _mm_prefetch(vr + 64 * c, _MM_HINT_T1);
        }
        for (h = 0; h < nh; h++)
            _mm_storeu_ps(sc + (long)h * n + j, ster_dot4(q + h * qs, K + (long)(lo + j) * ldk, ldk, D));
    }
    for (; j < n; j++) {
        const float* k = K + (long)(lo + j) * ldk;
        for (h = 0; h < nh; h++) {
            __m256 acc = _mm256_setzero_ps();
            for (i = 0; i < D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * qs + i), _mm256_loadu_ps(k + i), acc);
            sc[(long)h * n + j] = ster_hsum8_ops(acc);
        }
    }
    /* per head: scale, bias, max, exp, sum */
    float inv[4];
    for (h = 0; h < nh; h++) {
        float* s = sc + (long)h * n;
        const float* bias = a[h].bias;
        const __m256 scale = _mm256_set1_ps(a[h].scale);
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        for (j = 0; j + 8 <= n; j += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + j), scale);
            if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + lo + j));
            _mm256_storeu_ps(s + j, v);
            vmax = _mm256_max_ps(vmax, v);
        }
        float t8[8], mx = -INFINITY;
        _mm256_storeu_ps(t8, vmax);
        for (i = 0; i < 8; i++) if (t8[i] > mx) mx = t8[i];
        for (; j < n; j++) {
            float v = s[j] * a[h].scale;
            if (bias) v += bias[lo + j];
            s[j] = v;
            if (v > mx) mx = v;
        }
        if (a[h].has_sink && !ml && a[h].sink > mx) mx = a[h].sink;
        __m256 vsum = _mm256_setzero_ps();
        const __m256 m8 = _mm256_set1_ps(mx);
        for (j = 0; j + 8 <= n; j += 8) {
            __m256 e = ster_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m8));
            _mm256_storeu_ps(s + j, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        float sum = ster_hsum8_ops(vsum);
        for (; j < n; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
        if (a[h].has_sink && !ml) sum += expf(a[h].sink - mx);
        inv[h] = sum > 0 ? 1.0f / sum : 0.0f;
        if (ml) { ml[2 * h] = mx; ml[2 * h + 1] = sum; inv[h] = 1.0f; }
    }
    /* weighted values: 16 columns x nh heads of accumulators per pass over the keys, with
     * one loop per head count so the accumulators are named registers, not an array */
    const float* p0 = sc;
    const float* p1 = sc + (long)n;
    const float* p2 = sc + 2L * n;
    const float* p3 = sc + 3L * n;
    for (c0 = 0; c0 < D; c0 += 16) {
        const int two = D - c0 >= 16;
        const float* vb = V + (long)lo * ldv + c0;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, e0 = a0, e1 = a0, f0 = a0, f1 = a0;
#define STER_PV_LOOP(BODY) \
        for (j = 0; j < n; j++) { \
            const float* v = vb + (long)j * ldv; \
            __m256 v0 = _mm256_loadu_ps(v), v1 = two ? _mm256_loadu_ps(v + 8) : _mm256_setzero_ps(), p; \
            BODY \
        }
#define STER_PV_HEAD(P, X0, X1) \
            p = _mm256_broadcast_ss(P + j); X0 = _mm256_fmadd_ps(p, v0, X0); X1 = _mm256_fmadd_ps(p, v1, X1);
        switch (nh) {
        case 1: STER_PV_LOOP(STER_PV_HEAD(p0, a0, a1)) break;
        case 2: STER_PV_LOOP(STER_PV_HEAD(p0, a0, a1) STER_PV_HEAD(p1, b0, b1)) break;
        case 3: STER_PV_LOOP(STER_PV_HEAD(p0, a0, a1) STER_PV_HEAD(p1, b0, b1) STER_PV_HEAD(p2, e0, e1)) break;
        default: STER_PV_LOOP(STER_PV_HEAD(p0, a0, a1) STER_PV_HEAD(p1, b0, b1) STER_PV_HEAD(p2, e0, e1)
                              STER_PV_HEAD(p3, f0, f1)) break;
        }
#undef STER_PV_HEAD
#undef STER_PV_LOOP
        __m256 res[4][2] = {{a0, a1}, {b0, b1}, {e0, e1}, {f0, f1}};
        for (h = 0; h < nh; h++) {
            __m256 vi = _mm256_set1_ps(inv[h]);
            _mm256_storeu_ps(out + h * os + c0, _mm256_mul_ps(res[h][0], vi));
            if (two) _mm256_storeu_ps(out + h * os + c0 + 8, _mm256_mul_ps(res[h][1], vi));
        }
    }
}

static int ster_ops_cpu_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}
#else
static int ster_ops_cpu_avx2(void) { return 0; }
#endif

/* ------------------------------------------------------------------------- */
/* Gated activations in place: g = act(g) * u, for act = SiLU (kind 0) or the tanh
 * GELU (kind 1). Both are x * sigmoid(z): z = x for SiLU (Elfwing et al. 2017), and
 * z = 2 sqrt(2/pi) (x + 0.044715 x^3) for the tanh GELU, since 0.5 (1 + tanh(z/2)) =
 * sigmoid(z) (Hendrycks & Gimpel 2016). sigmoid is computed from e = exp(-|z|) <= 1
 * (1 / (1 + e) or e / (1 + e)), so exp never overflows. */

static inline float ster_glu_z(float x, int kind) {
    return kind ? 1.5957691216057308f * (x + 0.044715f * x * x * x) : x;
}

static void ster_glu_scalar(float* g, const float* u, long n, int kind) {
    long i;
    for (i = 0; i < n; i++) {
        float x = g[i], z = ster_glu_z(x, kind), e = expf(-fabsf(z));
        float sig = z >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
        g[i] = x * sig * u[i];
    }
}

#if STER_OPS_X86
static STER_OPS_AVX2 void ster_glu_avx2(float* g, const float* u, long n, int kind) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 c = _mm256_set1_ps(1.5957691216057308f), c3 = _mm256_set1_ps(0.044715f);
    long i;
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i), z = x;
        if (kind) z = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(c3, x), _mm256_mul_ps(x, x), x));
        __m256 e = ster_exp8(_mm256_or_ps(z, sign));           /* exp(-|z|) */
        __m256 num = _mm256_blendv_ps(one, e, z);              /* z < 0 (sign bit): e */
        __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + i)));
    }
    ster_glu_scalar(g + i, u + i, n - i, kind);
}
#endif

static void ster_glu(float* g, const float* u, long n, int kind, int simd) {
#if STER_OPS_X86
    if (simd) { ster_glu_avx2(g, u, n, kind); return; }
#endif
    (void)simd;
    ster_glu_scalar(g, u, n, kind);
}

/* nh (<= 4) heads sharing K/V, one query row each (q/out rows at strides qs/os).
 * ml: NULL, or 2 * nh floats for a part of a split key range (see ster_attn_row_scalar). */
static void ster_attn_group(int nh, const float* q, long qs, const float* K, long ldk, const float* V, long ldv,
                            int lo, int hi, const ster_attn_args* a, float* sc, float* out, long os, int simd,
                            float* ml) {
    int h, i;
    if (hi <= lo) {
        for (h = 0; h < nh; h++) for (i = 0; i < a[0].D; i++) out[h * os + i] = 0.0f;
        if (ml) for (h = 0; h < nh; h++) { ml[2 * h] = -INFINITY; ml[2 * h + 1] = 0.0f; }
        return;
    }
#if STER_OPS_X86
    if (simd && a[0].D % 8 == 0 && a[0].softcap <= 0) {
        ster_attn_group_avx2(nh, q, qs, K, ldk, V, ldv, lo, hi, a, sc, out, os, ml);
        return;
    }
#endif
    (void)simd;
    for (h = 0; h < nh; h++)
        ster_attn_row_scalar(q + h * qs, K, ldk, V, ldv, lo, hi, &a[h], sc, out + h * os, ml ? ml + 2 * h : 0);
}

/* Combine P parts of one query row's attention (a key range split P ways): part p left
 * its unnormalised weighted sum at acc + p * acc_stride and (max, sum of exp) at
 * ml + p * ml_stride. The
 * usual rescaling of partial softmaxes (as in flash-decoding): every part is brought to
 * the common max M, and the sink (if any) joins the denominator as exp(sink - M). */
static void ster_attn_merge(int P, int D, const float* acc, long acc_stride, const float* ml, long ml_stride,
                            int has_sink, float sink, float* out) {
    float M = has_sink ? sink : -INFINITY, den = 0.0f;
    int p, i;
    for (p = 0; p < P; p++) if (ml[p * ml_stride] > M) M = ml[p * ml_stride];
    for (i = 0; i < D; i++) out[i] = 0.0f;
    if (M == -INFINITY) return;
    for (p = 0; p < P; p++) {
        const float* m = ml + p * ml_stride;
        const float* x = acc + p * acc_stride;
        if (m[1] <= 0.0f) continue;
        float w = expf(m[0] - M);
        den += w * m[1];
        for (i = 0; i < D; i++) out[i] += w * x[i];
    }
    if (has_sink) den += expf(sink - M);
    float inv = den > 0 ? 1.0f / den : 0.0f;
    for (i = 0; i < D; i++) out[i] *= inv;
}

#endif /* STER_OPS_H */
