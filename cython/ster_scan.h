/* The recurrent mixers' inner loops (scan.pyx): the short causal convolution over a block of
 * channels, Mamba's selective scan over a block of channels, Mamba-2's scan of one head.
 *
 * Each has a portable C loop and an AVX2/FMA one (chosen at run time, as ster_ops.h's are),
 * which runs 8 channels (convolution) or 8 state entries (scans) at a time: exp through
 * ster_ops.h's ster_exp8 (Cephes' polynomial, about 1 ulp; the scans' decays
 * exp(dt * A) have dt >= 0 and A < 0, and SiLU is x / (1 + exp(-x)) taken through
 * exp(-|x|), so it only ever sees arguments <= 0), products summed with FMA and the
 * state's dot products in 8 lanes then added across. The numpy references are compared
 * within 2e-5 (tests/test_parity_ssm.py).
 */
#ifndef STER_SCAN_H
#define STER_SCAN_H

#include "ster_ops.h"

#define STER_SCAN_BLOCK 64   /* channels per convolution / selective-scan task */

static inline float ster_softplus(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

static inline float ster_silu1(float v) {
    return v / (1.0f + expf(-v));
}

/* ----------------------------------------------------------------- portable loops */

/* out[t, c] = act(bias[c] + sum_k wt[k, c] * u[t + k, c]) for c in [c0, c1), u = [state; x]
 * (wt: the taps transposed, [K, C]); then the state keeps the last K - 1 rows of u. */
static void ster_conv_block_c(const float* x, long ldx, const float* wt, const float* b, float* state,
                              float* out, long ldo, int T, int C, int K, int silu, int c0, int c1) {
    int t, k, c, i, K1 = K - 1;
    for (t = 0; t < T; t++) {
        float* o = out + (long)t * ldo;
        for (c = c0; c < c1; c++) o[c] = b ? b[c] : 0.0f;
        for (k = 0; k < K; k++) {
            const float* row = (t + k < K1) ? state + (long)(t + k) * C : x + (long)(t + k - K1) * ldx;
            const float* w = wt + (long)k * C;
            for (c = c0; c < c1; c++) o[c] = o[c] + w[c] * row[c];
        }
        if (silu)
            for (c = c0; c < c1; c++) o[c] = ster_silu1(o[c]);
    }
    for (i = 0; i < K1; i++) {  /* row i of the new state is row i + T of u */
        long src = i + T;
        const float* from = src < K1 ? state + src * C : x + (src - K1) * ldx;
        memmove(state + (long)i * C + c0, from + c0, sizeof(float) * (c1 - c0));
    }
}

/* Mamba's scan of channels [d0, d1) over T tokens (see scan.pyx). */
static void ster_selective_block_c(const float* x, long ldx, const float* dt, long lddt, const float* dtb,
                                   const float* A, const float* B, long ldb, const float* Cm, long ldc,
                                   const float* D, const float* z, long ldz, float* state, float* out,
                                   long ldo, int T, int N, int d0, int d1) {
    int t, d, n;
    for (t = 0; t < T; t++) {
        const float* bt = B + (long)t * ldb;
        const float* ct = Cm + (long)t * ldc;
        for (d = d0; d < d1; d++) {
            float delta = ster_softplus(dt[(long)t * lddt + d] + (dtb ? dtb[d] : 0.0f));
            float xv = x[(long)t * ldx + d], bx = delta * xv, acc = 0.0f, y;
            float* h = state + (long)d * N;
            const float* a = A + (long)d * N;
            for (n = 0; n < N; n++) {
                h[n] = expf(delta * a[n]) * h[n] + bt[n] * bx;
                acc += h[n] * ct[n];
            }
            y = acc + D[d] * xv;
            if (z) y = y * ster_silu1(z[(long)t * ldz + d]);
            out[(long)t * ldo + d] = y;
        }
    }
}

static inline float ster_step(const float* dt, long lddt, const float* dtb, int t, int hd, float lo, float hi) {
    float delta = ster_softplus(dt[(long)t * lddt + hd] + (dtb ? dtb[hd] : 0.0f));
    if (delta < lo) delta = lo;
    if (delta > hi) delta = hi;
    return delta;
}

/* Mamba-2's scan of head hd over T tokens (see scan.pyx). */
static void ster_multihead_one_c(const float* x, long ldx, const float* dt, long lddt, const float* dtb,
                                 const float* A, const float* B, long ldb, const float* Cm, long ldc,
                                 const float* D, float* state, float* out, long ldo, float lo, float hi,
                                 int T, int P, int N, int group, int hd) {
    int t, p, n;
    for (t = 0; t < T; t++) {
        float delta = ster_step(dt, lddt, dtb, t, hd, lo, hi), decay = expf(delta * A[hd]);
        const float* bt = B + (long)t * ldb + (long)group * N;
        const float* ct = Cm + (long)t * ldc + (long)group * N;
        for (p = 0; p < P; p++) {
            float* s = state + ((long)hd * P + p) * N;
            float xv = x[(long)t * ldx + (long)hd * P + p], bx = delta * xv, acc = 0.0f;
            for (n = 0; n < N; n++) {
                s[n] = decay * s[n] + bt[n] * bx;
                acc += s[n] * ct[n];
            }
            out[(long)t * ldo + (long)hd * P + p] = acc + D[hd] * xv;
        }
    }
}

/* ----------------------------------------------------------------- AVX2 / FMA loops */
#if STER_OPS_X86

STER_OPS_INLINE __m256 ster_silu8(__m256 v) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = ster_exp8(_mm256_or_ps(v, _mm256_set1_ps(-0.0f)));   /* exp(-|v|) */
    __m256 num = _mm256_blendv_ps(one, e, v);                         /* v < 0: e / (1 + e) */
    return _mm256_mul_ps(v, _mm256_div_ps(num, _mm256_add_ps(one, e)));
}

static STER_OPS_AVX2 void ster_conv_block_avx2(const float* x, long ldx, const float* wt, const float* b,
                                               float* state, float* out, long ldo, int T, int C, int K,
                                               int silu, int c0, int c1) {
    int t, k, c, i, K1 = K - 1, c8 = c0 + ((c1 - c0) & ~7);
    for (t = 0; t < T; t++) {
        float* o = out + (long)t * ldo;
        for (c = c0; c < c8; c += 8) {
            __m256 acc = b ? _mm256_loadu_ps(b + c) : _mm256_setzero_ps();
            for (k = 0; k < K; k++) {
                const float* row = (t + k < K1) ? state + (long)(t + k) * C : x + (long)(t + k - K1) * ldx;
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(wt + (long)k * C + c), _mm256_loadu_ps(row + c), acc);
            }
            _mm256_storeu_ps(o + c, silu ? ster_silu8(acc) : acc);
        }
    }
    if (c8 < c1)  /* the block's last channels (and the state update below) */
        ster_conv_block_c(x, ldx, wt, b, state, out, ldo, T, C, K, silu, c8, c1);
    for (i = 0; i < K1; i++) {
        long src = i + T;
        const float* from = src < K1 ? state + src * C : x + (src - K1) * ldx;
        memmove(state + (long)i * C + c0, from + c0, sizeof(float) * (c8 - c0));
    }
}

static STER_OPS_AVX2 void ster_selective_block_avx2(const float* x, long ldx, const float* dt, long lddt,
                                                    const float* dtb, const float* A, const float* B, long ldb,
                                                    const float* Cm, long ldc, const float* D, const float* z,
                                                    long ldz, float* state, float* out, long ldo, int T, int N,
                                                    int d0, int d1) {
    int t, d, n, N8 = N & ~7;
    for (t = 0; t < T; t++) {
        const float* bt = B + (long)t * ldb;
        const float* ct = Cm + (long)t * ldc;
        for (d = d0; d < d1; d++) {
            float delta = ster_softplus(dt[(long)t * lddt + d] + (dtb ? dtb[d] : 0.0f));
            float xv = x[(long)t * ldx + d], bx = delta * xv, acc, y;
            float* h = state + (long)d * N;
            const float* a = A + (long)d * N;
            __m256 dl = _mm256_set1_ps(delta), bx8 = _mm256_set1_ps(bx), acc8 = _mm256_setzero_ps();
            for (n = 0; n < N8; n += 8) {
                __m256 e = ster_exp8(_mm256_mul_ps(dl, _mm256_loadu_ps(a + n)));
                __m256 hn = _mm256_fmadd_ps(e, _mm256_loadu_ps(h + n), _mm256_mul_ps(_mm256_loadu_ps(bt + n), bx8));
                _mm256_storeu_ps(h + n, hn);
                acc8 = _mm256_fmadd_ps(hn, _mm256_loadu_ps(ct + n), acc8);
            }
            acc = ster_hsum8_ops(acc8);
            for (; n < N; n++) {
                h[n] = expf(delta * a[n]) * h[n] + bt[n] * bx;
                acc += h[n] * ct[n];
            }
            y = acc + D[d] * xv;
            if (z) y = y * ster_silu1(z[(long)t * ldz + d]);
            out[(long)t * ldo + d] = y;
        }
    }
}

static STER_OPS_AVX2 void ster_multihead_one_avx2(const float* x, long ldx, const float* dt, long lddt,
                                                  const float* dtb, const float* A, const float* B, long ldb,
                                                  const float* Cm, long ldc, const float* D, float* state,
                                                  float* out, long ldo, float lo, float hi, int T, int P, int N,
                                                  int group, int hd) {
    int t, p, n, N8 = N & ~7;
    for (t = 0; t < T; t++) {
        float delta = ster_step(dt, lddt, dtb, t, hd, lo, hi), decay = expf(delta * A[hd]);
        const float* bt = B + (long)t * ldb + (long)group * N;
        const float* ct = Cm + (long)t * ldc + (long)group * N;
        __m256 dec8 = _mm256_set1_ps(decay);
        for (p = 0; p < P; p++) {
            float* s = state + ((long)hd * P + p) * N;
            float xv = x[(long)t * ldx + (long)hd * P + p], bx = delta * xv, acc;
            __m256 bx8 = _mm256_set1_ps(bx), acc8 = _mm256_setzero_ps();
            for (n = 0; n < N8; n += 8) {
                __m256 sn = _mm256_fmadd_ps(dec8, _mm256_loadu_ps(s + n), _mm256_mul_ps(_mm256_loadu_ps(bt + n), bx8));
                _mm256_storeu_ps(s + n, sn);
                acc8 = _mm256_fmadd_ps(sn, _mm256_loadu_ps(ct + n), acc8);
            }
            acc = ster_hsum8_ops(acc8);
            for (; n < N; n++) {
                s[n] = decay * s[n] + bt[n] * bx;
                acc += s[n] * ct[n];
            }
            out[(long)t * ldo + (long)hd * P + p] = acc + D[hd] * xv;
        }
    }
}
#endif

/* ----------------------------------------------------------------- dispatch (simd: 1 for AVX2) */

static void ster_conv_block(const float* x, long ldx, const float* wt, const float* b, float* state, float* out,
                            long ldo, int T, int C, int K, int silu, int c0, int c1, int simd) {
#if STER_OPS_X86
    if (simd) { ster_conv_block_avx2(x, ldx, wt, b, state, out, ldo, T, C, K, silu, c0, c1); return; }
#endif
    (void)simd;
    ster_conv_block_c(x, ldx, wt, b, state, out, ldo, T, C, K, silu, c0, c1);
}

static void ster_selective_block(const float* x, long ldx, const float* dt, long lddt, const float* dtb,
                                 const float* A, const float* B, long ldb, const float* Cm, long ldc,
                                 const float* D, const float* z, long ldz, float* state, float* out, long ldo,
                                 int T, int N, int d0, int d1, int simd) {
#if STER_OPS_X86
    if (simd) {
        ster_selective_block_avx2(x, ldx, dt, lddt, dtb, A, B, ldb, Cm, ldc, D, z, ldz, state, out, ldo, T, N, d0, d1);
        return;
    }
#endif
    (void)simd;
    ster_selective_block_c(x, ldx, dt, lddt, dtb, A, B, ldb, Cm, ldc, D, z, ldz, state, out, ldo, T, N, d0, d1);
}

static void ster_multihead_one(const float* x, long ldx, const float* dt, long lddt, const float* dtb,
                               const float* A, const float* B, long ldb, const float* Cm, long ldc,
                               const float* D, float* state, float* out, long ldo, float lo, float hi,
                               int T, int P, int N, int group, int hd, int simd) {
#if STER_OPS_X86
    if (simd) {
        ster_multihead_one_avx2(x, ldx, dt, lddt, dtb, A, B, ldb, Cm, ldc, D, state, out, ldo, lo, hi, T, P, N,
                                group, hd);
        return;
    }
#endif
    (void)simd;
    ster_multihead_one_c(x, ldx, dt, lddt, dtb, A, B, ldb, Cm, ldc, D, state, out, ldo, lo, hi, T, P, N, group, hd);
}

#endif
