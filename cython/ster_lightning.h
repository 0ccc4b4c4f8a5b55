/* Lightning attention's recurrence for one head (lightning.pyx).
 *
 * Per token t, the head's [D, D] state S (rows: key channels, columns: value channels) decays
 * by one factor and takes the outer product of the token's key and value, and the token's
 * query reads it:  S = decay * S + k_t^T v_t,  o_t = q_t S.  Each row of S is updated and
 * read in the same pass (one trip through the state per token). A portable C loop and an
 * AVX2/FMA one (8 value channels at a time), chosen at run time as ster_ops.h's are; the
 * numpy reference (ster_py/decoder/lightning.py) is compared within 2e-5.
 */
#ifndef STER_LIGHTNING_H
#define STER_LIGHTNING_H

#include "ster_ops.h"

static void ster_lightning_one_c(const float* q, long ldq, const float* k, long ldk, const float* v, long ldv,
                                 float decay, float* S, float* out, long ldo, int T, int D, int hd) {
    int t, d, e;
    long off = (long)hd * D;
    for (t = 0; t < T; t++) {
        const float* qt = q + (long)t * ldq + off;
        const float* kt = k + (long)t * ldk + off;
        const float* vt = v + (long)t * ldv + off;
        float* o = out + (long)t * ldo + off;
        for (e = 0; e < D; e++) o[e] = 0.0f;
        for (d = 0; d < D; d++) {
            float* s = S + (long)d * D;
            float kd = kt[d], qd = qt[d];
            for (e = 0; e < D; e++) {
                s[e] = decay * s[e] + kd * vt[e];
                o[e] = o[e] + qd * s[e];
            }
        }
    }
}

#if STER_OPS_X86
static STER_OPS_AVX2 void ster_lightning_one_avx2(const float* q, long ldq, const float* k, long ldk,
                                                  const float* v, long ldv, float decay, float* S, float* out,
                                                  long ldo, int T, int D, int hd) {
    int t, d, e, D8 = D & ~7;
    long off = (long)hd * D;
    __m256 dec8 = _mm256_set1_ps(decay);
    for (t = 0; t < T; t++) {
        const float* qt = q + (long)t * ldq + off;
        const float* kt = k + (long)t * ldk + off;
        const float* vt = v + (long)t * ldv + off;
        float* o = out + (long)t * ldo + off;
        for (e = 0; e < D; e++) o[e] = 0.0f;
        for (d = 0; d < D; d++) {
            float* s = S + (long)d * D;
            float kd = kt[d], qd = qt[d];
            __m256 k8 = _mm256_set1_ps(kd), q8 = _mm256_set1_ps(qd);
            for (e = 0; e < D8; e += 8) {
                __m256 se = _mm256_fmadd_ps(dec8, _mm256_loadu_ps(s + e), _mm256_mul_ps(k8, _mm256_loadu_ps(vt + e)));
                _mm256_storeu_ps(s + e, se);
                _mm256_storeu_ps(o + e, _mm256_fmadd_ps(q8, se, _mm256_loadu_ps(o + e)));
            }
            for (; e < D; e++) {
                s[e] = decay * s[e] + kd * vt[e];
                o[e] = o[e] + qd * s[e];
            }
        }
    }
}
#endif

static void ster_lightning_one(const float* q, long ldq, const float* k, long ldk, const float* v, long ldv,
                               float decay, float* S, float* out, long ldo, int T, int D, int hd, int simd) {
#if STER_OPS_X86
    if (simd) { ster_lightning_one_avx2(q, ldq, k, ldk, v, ldv, decay, S, out, ldo, T, D, hd); return; }
#endif
    (void)simd;
    ster_lightning_one_c(q, ldq, k, ldk, v, ldv, decay, S, out, ldo, T, D, hd);
}

#endif
