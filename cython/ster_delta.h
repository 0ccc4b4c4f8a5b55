/* The delta rule's inner loop (delta.pyx): rows [j0, j1) of one value head's state over T tokens.
 *
 * The state of value head h is kept transposed, [V, K] (row j: how value channel j reads every
 * key channel), so that each row is one contiguous recurrence of its own:
 *
 *     row   = row * decay                 (a scalar per token, or one factor per key channel)
 *     delta = beta * (v[j] - row . k)
 *     row   = row + delta * k
 *     out[j] = row . q
 *
 * (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks", arXiv:2412.06464; Kimi Linear's
 * per-channel decay, arXiv:2510.26692.) q and k arrive normalised and q scaled; the decay factors
 * arrive as exp(g). A portable loop and an AVX2/FMA one (8 key channels at a time, the two dot
 * products summed in 8 lanes then added across) are chosen at run time, as ster_scan.h's are.
 */
#ifndef STER_DELTA_H
#define STER_DELTA_H

#include "ster_ops.h"

static void ster_delta_rows_c(const float* q, long ldq, const float* k, long ldk, const float* v, long ldv,
                              const float* dec, long lddec, int per_channel, const float* beta, long ldb,
                              float* state, float* out, long ldo, int T, int K, int V, int h, int hk,
                              int j0, int j1) {
    int t, j, i;
    for (t = 0; t < T; t++) {
        const float* qt = q + (long)t * ldq + (long)hk * K;
        const float* kt = k + (long)t * ldk + (long)hk * K;
        const float* vt = v + (long)t * ldv + (long)h * V;
        const float* dt = dec + (long)t * lddec + (long)h * (per_channel ? K : 1);
        float b = beta[(long)t * ldb + h];
        float* ot = out + (long)t * ldo + (long)h * V;
        for (j = j0; j < j1; j++) {
            float* s = state + ((long)h * V + j) * K;
            float dot = 0.0f, read = 0.0f, d;
            if (per_channel)
                for (i = 0; i < K; i++) { s[i] = s[i] * dt[i]; dot += s[i] * kt[i]; }
            else
                for (i = 0; i < K; i++) { s[i] = s[i] * dt[0]; dot += s[i] * kt[i]; }
            d = b * (vt[j] - dot);
            for (i = 0; i < K; i++) { s[i] = s[i] + d * kt[i]; read += s[i] * qt[i]; }
            ot[j] = read;
        }
    }
}

#if STER_OPS_X86
static STER_OPS_AVX2 void ster_delta_rows_avx2(const float* q, long ldq, const float* k, long ldk, const float* v,
                                               long ldv, const float* dec, long lddec, int per_channel,
                                               const float* beta, long ldb, float* state, float* out, long ldo,
                                               int T, int K, int V, int h, int hk, int j0, int j1) {
    int t, j, i, K8 = K & ~7;
    for (t = 0; t < T; t++) {
        const float* qt = q + (long)t * ldq + (long)hk * K;
        const float* kt = k + (long)t * ldk + (long)hk * K;
        const float* vt = v + (long)t * ldv + (long)h * V;
        const float* dt = dec + (long)t * lddec + (long)h * (per_channel ? K : 1);
        float b = beta[(long)t * ldb + h];
        float* ot = out + (long)t * ldo + (long)h * V;
        __m256 scalar = _mm256_set1_ps(dt[0]);
        for (j = j0; j < j1; j++) {
            float* s = state + ((long)h * V + j) * K;
            __m256 acc = _mm256_setzero_ps(), d8;
            float dot, read, d;
            for (i = 0; i < K8; i += 8) {
                __m256 f = per_channel ? _mm256_loadu_ps(dt + i) : scalar;
                __m256 si = _mm256_mul_ps(_mm256_loadu_ps(s + i), f);
                _mm256_storeu_ps(s + i, si);
                acc = _mm256_fmadd_ps(si, _mm256_loadu_ps(kt + i), acc);
            }
            dot = ster_hsum8_ops(acc);
            for (; i < K; i++) { s[i] = s[i] * (per_channel ? dt[i] : dt[0]); dot += s[i] * kt[i]; }
            d = b * (vt[j] - dot);
            d8 = _mm256_set1_ps(d);
            acc = _mm256_setzero_ps();
            for (i = 0; i < K8; i += 8) {
                __m256 si = _mm256_fmadd_ps(d8, _mm256_loadu_ps(kt + i), _mm256_loadu_ps(s + i));
                _mm256_storeu_ps(s + i, si);
                acc = _mm256_fmadd_ps(si, _mm256_loadu_ps(qt + i), acc);
            }
            read = ster_hsum8_ops(acc);
            for (; i < K; i++) { s[i] = s[i] + d * kt[i]; read += s[i] * qt[i]; }
            ot[j] = read;
        }
    }
}
#endif

static void ster_delta_rows(const float* q, long ldq, const float* k, long ldk, const float* v, long ldv,
                            const float* dec, long lddec, int per_channel, const float* beta, long ldb,
                            float* state, float* out, long ldo, int T, int K, int V, int h, int hk,
                            int j0, int j1, int simd) {
#if STER_OPS_X86
    if (simd) {
        ster_delta_rows_avx2(q, ldq, k, ldk, v, ldv, dec, lddec, per_channel, beta, ldb, state, out, ldo, T, K, V,
                             h, hk, j0, j1);
        return;
    }
#endif
    (void)simd;
    ster_delta_rows_c(q, ldq, k, ldk, v, ldv, dec, lddec, per_channel, beta, ldb, state, out, ldo, T, K, V, h, hk,
                      j0, j1);
}

#endif
