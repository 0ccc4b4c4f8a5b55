/* Fused float32 kernels for the non-matmul part of a decoder step: RMSNorm /
 * LayerNorm over rows, rotary embedding in place, and attention of a few query
 * rows over the key/value cache (GQA, causal + sliding window, soft-cap,
 * additive bias, sinks): one pass with an online softmax (AVX2), or scores then
 * a two-pass softmax (portable path). The cache's keys and values may be float32
 * or IEEE float16 (converted row by row as they are read: F16C, or per element
 * on the portable path); queries, arithmetic and outputs are float32.
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
#define STER_OPS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define STER_OPS_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
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

/* IEEE 754 binary16 -> binary32, exact for every input: normals re-biased (15 -> 127),
 * subnormals are man * 2^-24 (exact in float), infinities and NaNs keep sign and payload. */
static inline float ster_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (e == 0x1f) bits = sign | 0x7f800000u | (man << 13);
    else if (e) bits = sign | ((e + 112u) << 23) | (man << 13);
    else {
        f = (float)man * 5.9604644775390625e-8f;   /* 2^-24; 0 for man 0 */
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* IEEE 754 binary32 -> binary16, rounded to nearest even (numpy's cast and F16C's mode 0):
 * overflow goes to infinity, NaNs stay NaNs (quiet, sign and top payload bits kept, as F16C
 * does; numpy keeps a signalling NaN signalling, the one difference).
 * Normal results: round the 13 dropped bits to even, then re-bias (127 -> 15). Subnormal
 * results are multiples of 2^-24: adding 0.5f (whose ulp is 2^-24) rounds |x| to one
 * with the FPU's round-to-nearest-even, and the sum's low mantissa bits are the count. */
static inline uint16_t ster_float_to_half(float x) {
    uint32_t bits, sign, ax;
    memcpy(&bits, &x, 4);
    sign = (bits >> 16) & 0x8000u;
    ax = bits & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* >= 65520: infinity */
    if (ax >= 0x38800000u) {                                            /* >= 2^-14: normal */
        ax += 0xfffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((ax - 0x38000000u) >> 13));
    }
    {
        float f, half = 0.5f;
        uint32_t fb, hb;
        memcpy(&f, &ax, 4);
        f += half;
        memcpy(&fb, &f, 4);
        memcpy(&hb, &half, 4);
        return (uint16_t)(sign | (fb - hb));
    }
}

#if STER_OPS_X86
static STER_OPS_AVX2 void ster_store_half_f16c(const float* x, uint16_t* y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i*)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = ster_float_to_half(x[i]);
}
#endif

/* Store n floats as one key/value row: a copy (f16 == 0), or rounded to float16 (F16C when
 * simd, else ster_float_to_half; both round to nearest even, as KVCache's numpy cast). */
static void ster_store_kv_row(const float* x, void* row, int n, int f16, int simd) {
    int i;
    if (!f16) { memcpy(row, x, sizeof(float) * (size_t)n); return; }
#if STER_OPS_X86
    if (simd) { ster_store_half_f16c(x, (uint16_t*)row, n); return; }
#endif
    (void)simd;
    for (i = 0; i < n; i++) ((uint16_t*)row)[i] = ster_float_to_half(x[i]);
}

/* Element i of a key/value row stored as float32 (f16 == 0) or float16. */
static inline float ster_kv_at(const void* row, long i, int f16) {
    return f16 ? ster_half_to_float(((const uint16_t*)row)[i]) : ((const float*)row)[i];
}

typedef struct {
    int D;              /* head_dim */
    float scale;        /* multiplies q.k */
    float softcap;      /* 0: none */
    const float* bias;  /* per key (already offset to this head and row), or NULL */
    int has_sink;
    float sink;
} ster_attn_args;

static float ster_dot_scalar(const float* a, const void* b, int n, int f16) {
    float s = 0.0f;
    int i;
    if (f16) for (i = 0; i < n; i++) s += a[i] * ster_kv_at(b, i, 1);
    else for (i = 0; i < n; i++) s += a[i] * ((const float*)b)[i];
    return s;
}

/* scores -> probabilities in place (unnormalised), returns their sum (sink included)
 * and stores the max subtracted in *mx_out. */
static float ster_softmax_scalar(float* sc, int n, int has_sink, float sink, float* mx_out) {
    float mx = -INFINITY, sum = 0.0f;
    int j;
    /* a NaN score makes the max NaN (and so the row): a split row's parts then merge to NaN */
    for (j = 0; j < n; j++) if (sc[j] > mx || sc[j] != sc[j]) mx = sc[j];
    if (has_sink && sink > mx) mx = sink;
    for (j = 0; j < n; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
    if (has_sink) sum += expf(sink - mx);
    *mx_out = mx;
    return sum;
}

/* ml == NULL: out = softmax-weighted values. ml != NULL (one part of a split key range):
 * out = the unnormalised weighted sum, ml[0] = the max score subtracted, ml[1] = the sum
 * of exp(score - max); ster_attn_merge combines the parts (sinks are added there). */
static void ster_attn_row_scalar(const float* q, const void* K, long ldk, const void* V, long ldv, int f16,
                                 int lo, int hi, const ster_attn_args* a, float* sc, float* out, float* ml) {
    int n = hi - lo, j, i, D = a->D;
    const long esz = f16 ? 2 : 4;
    for (j = 0; j < n; j++) {
        float s = ster_dot_scalar(q, (const char*)K + (long)(lo + j) * ldk * esz, D, f16) * a->scale;
        if (a->softcap > 0) s = tanhf(s / a->softcap) * a->softcap;
        if (a->bias) s += a->bias[lo + j];
        sc[j] = s;
    }
    float mx, sum = ster_softmax_scalar(sc, n, a->has_sink && !ml, a->sink, &mx);
    for (i = 0; i < D; i++) out[i] = 0.0f;
    for (j = 0; j < n; j++) {
        const char* v = (const char*)V + (long)(lo + j) * ldv * esz;
        if (f16) for (i = 0; i < D; i++) out[i] += sc[j] * ster_kv_at(v, i, 1);
        else for (i = 0; i < D; i++) out[i] += sc[j] * ((const float*)v)[i];
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

/* Four horizontal sums at once: lane i of the result is the sum of the lanes of x_i. */
STER_OPS_INLINE __m128 ster_hsum4x8(__m256 x0, __m256 x1, __m256 x2, __m256 x3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(x0, x1), _mm256_hadd_ps(x2, x3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* tanh(x), about 2 ulp: an odd Taylor polynomial below |x| = 0.25, else
 * sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.61 (no cancellation to speak of). */
STER_OPS_INLINE __m256 ster_tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 e = ster_exp8(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    __m256 x2 = _mm256_mul_ps(ax, ax);
    __m256 p = _mm256_set1_ps(62.0f / 2835.0f);
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), ax, ax);
    __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.25f), _CMP_LT_OQ));
    return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

/* Keys per block of the one-pass kernel below: 16 or 32 rows, about 8 KiB of float32 keys
 * (and of values); rows of 512+ bytes take 16. */
#define STER_ATTN_BLOCK 32
STER_OPS_INLINE int ster_attn_block_keys(int D, const int F16) { return D * (F16 ? 2 : 4) >= 512 ? 16 : STER_ATTN_BLOCK; }

/* 8 floats from element i of a key/value row: float32, or float16 widened by F16C. */
STER_OPS_INLINE __m256 ster_kv8(const char* row, long i, const int F16) {
    if (F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(row + 2 * i)));
    return _mm256_loadu_ps((const float*)(row + 4 * i));
}

/* Dot products of NH query rows (q + h * qs) with NK consecutive key rows k (element stride
 * ldk; float16 rows when F16): s[h * SB + r].
 * pv, pk (or NULL): NK rows at strides pvs, pks bytes to prefetch meanwhile (the values of
 * these keys, and the keys a block ahead), NK lines per 64 bytes of row read (every 16
 * columns of float32, every 32 of float16). Rows that follow each other in memory (as in
 * the cache) are prefetched as one range in ascending order, which also gets the
 * hardware's stream prefetcher going (lines of the NK rows interleaved measured much
 * slower from DRAM; counting rows and lines in the loop cost more than it saved when the
 * cache was hot). */
STER_OPS_INLINE void ster_qk_tile(const float* q, long qs, const char* k, long ldk, int D, float* s,
                                  const char* pv, long pvs, const char* pk, long pks, const int NH, const int NK,
                                  const int F16) {
    __m256 acc[8];
    const long rb = (F16 ? 2L : 4L) * D;   /* bytes of one row */
    const long va = pvs == rb ? 64 : pvs, vb = pvs == rb ? 64 * NK : 64;   /* line (r, i/16) */
    const long ka = pks == rb ? 64 : pks, kb = pks == rb ? 64 * NK : 64;
    const long ldkb = ldk * (F16 ? 2 : 4);
    int x, r, h, i;
    for (x = 0; x < NH * NK; x++) acc[x] = _mm256_setzero_ps();
#define STER_QK_STEP(I) \
    do { \
        __m256 kr[8]; \
        for (r = 0; r < NK; r++) kr[r] = ster_kv8(k + r * ldkb, (I), F16); \
        for (h = 0; h < NH; h++) { \
            __m256 qv = _mm256_loadu_ps(q + h * qs + (I)); \
            for (r = 0; r < NK; r++) acc[h * NK + r] = _mm256_fmadd_ps(qv, kr[r], acc[h * NK + r]); \
        } \
    } while (0)
    /* float16 rows: 16 columns are half a line, so every other step prefetches */
#define STER_QK_PREFETCH(I) \
    do { \
        if (!F16 || !((I) & 16)) { \
            if (pv) { for (r = 0; r < NK; r++) _mm_prefetch(pv + r * va, _MM_HINT_T0); pv += vb; } \
            if (pk) { for (r = 0; r < NK; r++) _mm_prefetch(pk + r * ka, _MM_HINT_T0); pk += kb; } \
        } \
    } while (0)
    for (i = 0; i + 16 <= D; i += 16) {
        STER_QK_PREFETCH(i);
        STER_QK_STEP(i);
        STER_QK_STEP(i + 8);
    }
    if (i < D) {   /* D % 16 == 8 */
        STER_QK_PREFETCH(i);
        STER_QK_STEP(i);
    }
#undef STER_QK_STEP
#undef STER_QK_PREFETCH
    for (x = 0; x < NH * NK; x += 4) {
        const __m256 z = _mm256_setzero_ps();
        float t[4];
        _mm_storeu_ps(t, ster_hsum4x8(acc[x], x + 1 < NH * NK ? acc[x + 1] : z,
                                      x + 2 < NH * NK ? acc[x + 2] : z, x + 3 < NH * NK ? acc[x + 3] : z));
        for (r = 0; r < 4 && x + r < NH * NK; r++) s[((x + r) / NK) * STER_ATTN_BLOCK + (x + r) % NK] = t[r];
    }
}

/* acc[h][0..D) = alpha[h] * acc[h] + sum over the nb keys j of p[h * SB + j] * v_j, for NH
 * heads (acc rows at stride os), in 16-column slabs whose accumulators stay in registers.
 * V: the block's first value row (element stride ldv; float16 when F16). */
STER_OPS_INLINE void ster_pv_block(const float* p, const char* V, long ldv, int nb, int D, const float* alpha,
                                   float* acc, long os, const int NH, const int F16) {
    const long ldvb = ldv * (F16 ? 2 : 4);
    int c0, j, h;
    __m256 al[4];
    for (h = 0; h < NH; h++) al[h] = _mm256_set1_ps(alpha[h]);
    for (c0 = 0; c0 + 16 <= D; c0 += 16) {
        __m256 a0[4], a1[4];
        for (h = 0; h < NH; h++) {
            a0[h] = _mm256_mul_ps(al[h], _mm256_loadu_ps(acc + h * os + c0));
            a1[h] = _mm256_mul_ps(al[h], _mm256_loadu_ps(acc + h * os + c0 + 8));
        }
        for (j = 0; j < nb; j++) {
            const char* v = V + (long)j * ldvb;
            __m256 v0 = ster_kv8(v, c0, F16), v1 = ster_kv8(v, c0 + 8, F16);
            for (h = 0; h < NH; h++) {
                __m256 pj = _mm256_broadcast_ss(p + h * STER_ATTN_BLOCK + j);
                a0[h] = _mm256_fmadd_ps(pj, v0, a0[h]);
                a1[h] = _mm256_fmadd_ps(pj, v1, a1[h]);
            }
        }
        for (h = 0; h < NH; h++) {
            _mm256_storeu_ps(acc + h * os + c0, a0[h]);
            _mm256_storeu_ps(acc + h * os + c0 + 8, a1[h]);
        }
    }
    if (c0 < D) {   /* D % 16 == 8: the last 8 columns */
        __m256 a0[4];
        for (h = 0; h < NH; h++) a0[h] = _mm256_mul_ps(al[h], _mm256_loadu_ps(acc + h * os + c0));
        for (j = 0; j < nb; j++) {
            __m256 v0 = ster_kv8(V + (long)j * ldvb, c0, F16);
            for (h = 0; h < NH; h++) a0[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + h * STER_ATTN_BLOCK + j), v0, a0[h]);
        }
        for (h = 0; h < NH; h++) _mm256_storeu_ps(acc + h * os + c0, a0[h]);
    }
}

/* NH (1..4) query heads sharing one key/value head (GQA), one query row each, keys lo..hi-1,
 * in one pass (online softmax, as in flash attention: Milakov & Gimelshein 2018, Dao et al.
 * 2022): per block of keys, the scores of all heads, the running max m and denominator l
 * (the accumulators rescaled by exp(m_old - m_new) when the max grows), then the block's
 * values. The cache is read from memory once, and the block's value rows and the next
 * block's key rows are prefetched into L1 while its scores are computed: without that the
 * reads and the arithmetic hardly overlapped (the value pass walks its rows in 16-column
 * slabs, which the hardware prefetchers serve poorly). Measured on Zen 3, decoding from
 * DRAM: prefetching in the order the value pass reads, further ahead, into L2 only, or
 * during the value pass, were all slower. K, V: float32, or float16 when F16.
 * Same arguments and results as ster_attn_row_scalar (sc is unused). */
STER_OPS_INLINE void ster_attn_group_nh(const float* q, long qs, const void* K, long ldk, const void* V,
                                        long ldv, int lo, int hi, const ster_attn_args* a, float* out, long os,
                                        float* ml, const int NH, const int F16) {
    const int D = a[0].D, B = ster_attn_block_keys(D, F16);
    const int NK = NH >= 3 ? 2 : 4;
    const long esz = F16 ? 2 : 4, rb = esz * D;
    /* the next block's keys are prefetched for rows of 512+ bytes only */
    const int pf_keys = rb >= 512;
    const float cap = a[0].softcap, scale = a[0].scale;
    float s[4 * STER_ATTN_BLOCK] __attribute__((aligned(32)));
    float m[4], l[4], alpha[4];
    int h, j0, j, i;
    for (h = 0; h < NH; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
        for (i = 0; i < D; i++) out[h * os + i] = 0.0f;
    }
    for (j0 = lo; j0 < hi; j0 += B) {
        const int nb = hi - j0 < B ? hi - j0 : B;
        const char* kb = (const char*)K + (long)j0 * ldk * esz;
        const char* vb = (const char*)V + (long)j0 * ldv * esz;
        /* scores of the block; its value rows and (long rows) the next block's key rows are
         * prefetched meanwhile. Rows under 512 bytes: the hardware follows the key stream
         * alone (prefetching it too measured a little slower there, and 25% faster at 1 KiB). */
        for (j = 0; j + NK <= nb; j += NK)
            ster_qk_tile(q, qs, kb + (long)j * ldk * esz, ldk, D, s + j, vb + (long)j * ldv * esz, esz * ldv,
                         pf_keys && j0 + nb + j + NK <= hi ? kb + (long)(nb + j) * ldk * esz : NULL, esz * ldk,
                         NH, NK, F16);
        for (; j < nb; j++)
            ster_qk_tile(q, qs, kb + (long)j * ldk * esz, ldk, D, s + j, vb + (long)j * ldv * esz, esz * ldv,
                         pf_keys && j0 + nb + j + 1 <= hi ? kb + (long)(nb + j) * ldk * esz : NULL, esz * ldk,
                         NH, 1, F16);
        /* per head: scale, soft-cap, bias, block max, exp, running sums */
        for (h = 0; h < NH; h++) {
            float* sh = s + h * STER_ATTN_BLOCK;
            const float* bias = a[h].bias ? a[h].bias + j0 : NULL;
            __m256 vmax = _mm256_set1_ps(-INFINITY), vnan = _mm256_setzero_ps();
            for (j = 0; j < nb; j += 8) {
                __m256 x = _mm256_mul_ps(_mm256_load_ps(sh + j), _mm256_set1_ps(scale));
                if (cap > 0)
                    x = _mm256_mul_ps(ster_tanh8(_mm256_mul_ps(x, _mm256_set1_ps(1.0f / cap))), _mm256_set1_ps(cap));
                if (j + 8 <= nb) {
                    if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + j));
                } else {   /* partial last vector: keys past nb score -inf */
                    float t[8];
                    _mm256_storeu_ps(t, x);
                    for (i = 0; i < 8; i++) t[i] = j + i < nb ? t[i] + (bias ? bias[j + i] : 0.0f) : -INFINITY;
                    x = _mm256_loadu_ps(t);
                }
                _mm256_store_ps(sh + j, x);
                vmax = _mm256_max_ps(vmax, x);
                vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
            }
            float t8[8], bm = -INFINITY, mn;
            _mm256_storeu_ps(t8, vmax);
            for (i = 0; i < 8; i++) if (t8[i] > bm) bm = t8[i];
            mn = bm > m[h] ? bm : m[h];
            /* a NaN or +inf score (from a non-finite query or key) makes the row NaN, as
             * the reference's inf - inf does: max and exp8's clamps would drop it */
            if (_mm256_movemask_ps(vnan) || mn == INFINITY) mn = NAN;
            if (mn == -INFINITY) {   /* nothing visible yet (a -inf bias): weights 0 */
                alpha[h] = 1.0f;
                for (j = 0; j < nb; j++) sh[j] = 0.0f;
                continue;
            }
            alpha[h] = expf(m[h] - mn);
            const __m256 m8 = _mm256_set1_ps(mn);
            __m256 vsum = _mm256_setzero_ps();
            for (j = 0; j < nb; j += 8) {
                __m256 e = ster_exp8(_mm256_sub_ps(_mm256_load_ps(sh + j), m8));
                _mm256_store_ps(sh + j, e);
                vsum = _mm256_add_ps(vsum, e);
            }
            l[h] = l[h] * alpha[h] + ster_hsum8_ops(vsum);
            m[h] = mn;
        }
        /* values of the block */
        ster_pv_block(s, vb, ldv, nb, D, alpha, out, os, NH, F16);
    }
    for (h = 0; h < NH; h++) {
        float inv;
        if (ml) { ml[2 * h] = m[h]; ml[2 * h + 1] = l[h]; continue; }
        if (a[h].has_sink) {   /* the sink joins the denominator at the common max */
            float M = a[h].sink > m[h] ? a[h].sink : m[h];
            float f = expf(m[h] - M);
            float den = l[h] * f + expf(a[h].sink - M);
            inv = f / den;
        } else {
            inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
        }
        const __m256 vi = _mm256_set1_ps(inv);
        for (i = 0; i < D; i += 8) _mm256_storeu_ps(out + h * os + i, _mm256_mul_ps(_mm256_loadu_ps(out + h * os + i), vi));
    }
}

/* One instance per (heads, key/value dtype): the constants unroll the tiles. */
static STER_OPS_AVX2 void ster_attn_group_avx2(int nh, const float* q, long qs, const void* K, long ldk,
                                               const void* V, long ldv, int f16, int lo, int hi,
                                               const ster_attn_args* a, float* out, long os, float* ml) {
#define STER_ATTN_NH(F) \
    switch (nh) { \
    case 1: ster_attn_group_nh(q, qs, K, ldk, V, ldv, lo, hi, a, out, os, ml, 1, F); break; \
    case 2: ster_attn_group_nh(q, qs, K, ldk, V, ldv, lo, hi, a, out, os, ml, 2, F); break; \
    case 3: ster_attn_group_nh(q, qs, K, ldk, V, ldv, lo, hi, a, out, os, ml, 3, F); break; \
    default: ster_attn_group_nh(q, qs, K, ldk, V, ldv, lo, hi, a, out, os, ml, 4, F); break; \
    }
    if (f16) STER_ATTN_NH(1) else STER_ATTN_NH(0)
#undef STER_ATTN_NH
}

static int ster_ops_cpu_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}

/* F16C (float16 conversions): every AVX2 CPU known has it, but it is a separate flag. */
static int ster_ops_cpu_f16c(void) {
    static int cached = -1;
    if (cached < 0) {
        unsigned int eax, ebx, ecx, edx;
        __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
        cached = (ecx >> 29) & 1;
    }
    return cached;
}
#else
static int ster_ops_cpu_avx2(void) { return 0; }
static int ster_ops_cpu_f16c(void) { return 0; }
#endif

#include "ster_attn_tile.h"

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

/* nh (<= 4) heads sharing K/V, one query row each (q/out rows at strides qs/os); K, V rows
 * float32, or float16 when f16 (strides ldk, ldv in elements). simd: 1 for the AVX2 path
 * (the caller checks F16C for float16). ml: NULL, or 2 * nh floats for a part of a split
 * key range (see ster_attn_row_scalar). */
static void ster_attn_group(int nh, const float* q, long qs, const void* K, long ldk, const void* V, long ldv,
                            int f16, int lo, int hi, const ster_attn_args* a, float* sc, float* out, long os,
                            int simd, float* ml) {
    int h, i;
    if (hi <= lo) {
        for (h = 0; h < nh; h++) for (i = 0; i < a[0].D; i++) out[h * os + i] = 0.0f;
        if (ml) for (h = 0; h < nh; h++) { ml[2 * h] = -INFINITY; ml[2 * h + 1] = 0.0f; }
        return;
    }
#if STER_OPS_X86
    if (simd && a[0].D % 8 == 0) {
        ster_attn_group_avx2(nh, q, qs, K, ldk, V, ldv, f16, lo, hi, a, out, os, ml);
        return;
    }
#endif
    (void)simd;
    for (h = 0; h < nh; h++)
        ster_attn_row_scalar(q + h * qs, K, ldk, V, ldv, f16, lo, hi, &a[h], sc, out + h * os, ml ? ml + 2 * h : 0);
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
    /* a part's NaN max (a NaN or +inf score, see ster_attn_group_nh) must win: the row is NaN */
    for (p = 0; p < P; p++) if (ml[p * ml_stride] > M || ml[p * ml_stride] != ml[p * ml_stride]) M = ml[p * ml_stride];
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
