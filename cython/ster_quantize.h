/* Block quantizers: float32 rows -> GGML blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
 *
 * Legacy types (32 weights a block) round to nearest in float32 exactly as gguf-py's
 * gguf/quants.py does (itself a restatement of llama.cpp's quantize_row_*_ref), so their
 * bytes are bit-equal to gguf-py's. K-quants (256-weight super-blocks) follow llama.cpp's
 * reference quantizers in ggml-quants.c (quantize_row_q{4,5,6}_K_ref, no importance
 * matrix): per 32-weight sub-block a weighted search over 21 (Q4_K) or 16 (Q5_K) candidate
 * scales for the scale/min pair that minimises squared error (make_qkx2_quants); per
 * 16-weight sub-block of Q6_K a search over 19 candidate scales weighted by x^2
 * (make_qx_quants); then the sub-block scales are themselves quantized against the
 * super-block's f16 scale, and the codes are recomputed from the stored scales.
 *
 * The arithmetic is float32 in the order the references write it; the module is compiled
 * with -ffp-contract=off (no fused multiply-add), so the numpy reference in
 * ster_py/gguf/quantize.py (which accumulates element by element in the same order) gives
 * the same bytes. Sums over a sub-block are sequential, never pairwise or vectorised.
 */
#ifndef STER_QUANTIZE_H
#define STER_QUANTIZE_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#define STER_QK_K 256

/* float -> IEEE half bits, round to nearest even; overflow -> inf, NaN stays NaN (quiet),
 * subnormal halves rounded correctly (as numpy's astype(float16) and GGML_FP32_TO_FP16). */
static inline uint16_t sq_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t e = (x >> 23) & 0xFFu;
    uint32_t m = x & 0x7FFFFFu;
    if (e == 0xFF) {                                   /* inf or NaN */
        return (uint16_t)(sign | 0x7C00u | (m ? (0x200u | (m >> 13)) : 0u));
    }
    int32_t he = (int32_t)e - 127 + 15;                /* biased half exponent */
    if (he >= 31) return (uint16_t)(sign | 0x7C00u);   /* too large: inf */
    if (he <= 0) {                                     /* half subnormal (or zero) */
        if (he < -10) return (uint16_t)sign;           /* below half the smallest subnormal */
        uint32_t mant = m | 0x800000u;                 /* implicit one */
        uint32_t shift = (uint32_t)(14 - he);          /* 24-bit mantissa -> 10 - (1 - he) bits */
        uint32_t h = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h += 1;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)he << 10) | (m >> 13);
    uint32_t rem = m & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;  /* may carry into the exponent: fine */
    return (uint16_t)(sign | h);
}

static inline float sq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;
    uint32_t bits;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-08f;          /* m * 2^-24, exact */
        return sign ? -f : f;
    }
    if (e == 31) bits = sign | 0x7F800000u | (m << 13);
    else bits = sign | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &bits, 4);
    return f;
}

static inline void sq_put_f16(uint8_t* p, float f) {
    uint16_t h = sq_f32_to_f16(f);
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
}

static inline float sq_get_f16(const uint8_t* p) {
    return sq_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* Round half away from zero (C's roundf; gguf-py's np_roundf). */
static inline float sq_round_away(float v) {
    return roundf(v);
}

/* Round to nearest, ties to even, for |v| < 2^22: the magic-number trick of llama.cpp's
 * nearest_int (adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits). */
static inline int sq_nearest_int(float v) {
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007FFFFF) - 0x00400000;
}

/* ------------------------------------------------------------------ legacy, 32 weights */

/* Q8_0: d = max|x| / 127, q = round(x / d). 34 bytes: d (f16), 32 x int8. */
static void sq_q8_0(const float* x, uint8_t* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, x += 32, y += 34) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) {
            float a = fabsf(x[i]);
            if (a > amax) amax = a;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        sq_put_f16(y, d);
        for (int i = 0; i < 32; ++i) y[2 + i] = (uint8_t)(int8_t)(int)sq_round_away(x[i] * id);
    }
}

/* The signed weight of largest magnitude (the first, on ties: numpy's argmax, so that a block of
 * negative zeros keeps gguf-py's sign of d). */
static inline float sq_signed_max(const float* x) {
    float amax = fabsf(x[0]), max = x[0];
    for (int i = 1; i < 32; ++i) {
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    }
    return max;
}

/* Q4_0 / Q5_0: d = max / -8 (or -16), q = min(top, trunc(x / d + 8.5 (16.5))). */
static void sq_q4_0(const float* x, uint8_t* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, x += 32, y += 18) {
        float d = sq_signed_max(x) / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        sq_put_f16(y, d);
        for (int j = 0; j < 16; ++j) {
            float a = truncf(x[j] * id + 8.5f), c = truncf(x[j + 16] * id + 8.5f);
            uint8_t lo = (uint8_t)(a > 15.0f ? 15.0f : a), hi = (uint8_t)(c > 15.0f ? 15.0f : c);
            y[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void sq_q5_0(const float* x, uint8_t* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, x += 32, y += 22) {
        float d = sq_signed_max(x) / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[32];
        uint32_t qh = 0;
        for (int i = 0; i < 32; ++i) {
            float a = truncf(x[i] * id + 16.5f);
            q[i] = (uint8_t)(a > 31.0f ? 31.0f : a);
            qh |= (uint32_t)(q[i] >> 4) << i;
        }
        sq_put_f16(y, d);
        for (int k = 0; k < 4; ++k) y[2 + k] = (uint8_t)(qh >> (8 * k));
        for (int j = 0; j < 16; ++j) y[6 + j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    }
}

/* Q4_1 / Q5_1: d = (max - min) / 15 (31), m = min, q = min(top, trunc((x - min) / d + 0.5)). */
static inline void sq_min_max(const float* x, float* lo, float* hi) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < 32; ++i) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    *lo = mn;
    *hi = mx;
}

static void sq_q4_1(const float* x, uint8_t* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, x += 32, y += 20) {
        float mn, mx;
        sq_min_max(x, &mn, &mx);
        float d = (mx - mn) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        sq_put_f16(y, d);
        sq_put_f16(y + 2, mn);
        for (int j = 0; j < 16; ++j) {
            float a = truncf((x[j] - mn) * id + 0.5f), c = truncf((x[j + 16] - mn) * id + 0.5f);
            uint8_t lo = (uint8_t)(a > 15.0f ? 15.0f : a), hi = (uint8_t)(c > 15.0f ? 15.0f : c);
            y[4 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void sq_q5_1(const float* x, uint8_t* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, x += 32, y += 24) {
        float mn, mx;
        sq_min_max(x, &mn, &mx);
        float d = (mx - mn) / 31.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[32];
        uint32_t qh = 0;
        for (int i = 0; i < 32; ++i) {
            float a = truncf((x[i] - mn) * id + 0.5f);
            q[i] = (uint8_t)(a > 31.0f ? 31.0f : a);
            qh |= (uint32_t)(q[i] >> 4) << i;
        }
        sq_put_f16(y, d);
        sq_put_f16(y + 2, mn);
        for (int k = 0; k < 4; ++k) y[4 + k] = (uint8_t)(qh >> (8 * k));
        for (int j = 0; j < 16; ++j) y[8 + j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    }
}

/* ------------------------------------------------------------------ K-quants, 256 weights */

/* Scale and min of one sub-block of n weights, codes 0..nmax, for w ~ scale * L + min (min <= 0):
 * start from the min/max range, then try nstep + 1 widened or narrowed ranges
 * (nmax + rmin + rdelta * is levels over it), fit scale and min to each candidate's codes by
 * weighted least squares, and keep the fit of least weighted squared error. Returns the scale;
 * *neg_min receives -min (>= 0); L receives the codes. (llama.cpp make_qkx2_quants, use_mad off.) */
static float sq_scale_min_search(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min,
                                 uint8_t* Laux, float rmin, float rdelta, int nstep) {
    float mn = x[0], mx = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0.0f) mn = 0.0f;
    if (mx == mn) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *neg_min = -mn;
        return 0.0f;
    }
    float iscale = (float)nmax / (mx - mn);
    float scale = 1.0f / iscale;
    float best = 0.0f;
    for (int i = 0; i < n; ++i) {
        int l = sq_nearest_int(iscale * (x[i] - mn));
        l = l < 0 ? 0 : (l > nmax ? nmax : l);
        L[i] = (uint8_t)l;
        float diff = scale * (float)L[i] + mn - x[i];
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (mx - mn);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            int l = sq_nearest_int(iscale * (x[i] - mn));
            l = l < 0 ? 0 : (l > nmax ? nmax : l);
            Laux[i] = (uint8_t)l;
            float fl = (float)l;
            sum_l += w[i] * fl;
            sum_l2 += w[i] * fl * fl;
            sum_xl += w[i] * fl * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0.0f) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0.0f) {
                this_min = 0.0f;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0.0f;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best) {
                memcpy(L, Laux, (size_t)n);
                best = err;
                scale = this_scale;
                mn = this_min;
            }
        }
    }
    *neg_min = -mn;
    return scale;
}

/* Sub-block j's 6-bit scale and min from the 12 packed bytes (get_scale_min_k4). */
static inline void sq_scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Shared part of Q4_K and Q5_K: 8 sub-blocks of 32, each searched, then the scales and mins
 * quantized to 6 bits against d and dmin (f16, written at y, y + 2; the 12 scale bytes at
 * y + 4), and the codes L recomputed from the stored values. */
static void sq_k_scales(const float* x, uint8_t* y, uint8_t* L, int nmax, float rmin, int nstep) {
    float weights[32], scales[8], mins[8];
    uint8_t Laux[32];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
        const float* xs = x + 32 * j;
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(xs[l]);
        scales[j] = sq_scale_min_search(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    uint8_t* s = y + 4;
    memset(s, 0, 12);
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = (uint8_t)sq_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)sq_nearest_int(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0x0F) | ((lm & 0x0F) << 4));
            s[j - 4] |= (uint8_t)((ls >> 4) << 6);
            s[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    sq_put_f16(y, max_scale / 63.0f);
    sq_put_f16(y + 2, max_min / 63.0f);
    float d_all = sq_get_f16(y), dmin_all = sq_get_f16(y + 2);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        sq_scale_min_k4(j, s, &sc, &m);
        float d = d_all * (float)sc;
        if (d == 0.0f) continue;                      /* keeps the search's codes, as the reference does */
        float dm = dmin_all * (float)m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = sq_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : (l > nmax ? nmax : l));
        }
    }
}

/* Q4_K: d | dmin | scales[12] | qs[128]; weight 64c + l (l < 32) is the low nibble of
 * qs[32c + l], weight 64c + 32 + l the high nibble. 144 bytes. */
static void sq_q4_k(const float* x, uint8_t* y, int64_t nb) {
    uint8_t L[STER_QK_K];
    for (int64_t b = 0; b < nb; ++b, x += STER_QK_K, y += 144) {
        sq_k_scales(x, y, L, 15, -1.0f, 20);
        uint8_t* q = y + 16;
        for (int j = 0; j < STER_QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        }
    }
}

/* Q5_K: d | dmin | scales[12] | qh[32] | qs[128]: Q4_K's nibbles plus a fifth bit per weight,
 * bit (w / 32) of qh[w % 32]. 176 bytes. */
static void sq_q5_k(const float* x, uint8_t* y, int64_t nb) {
    uint8_t L[STER_QK_K];
    for (int64_t b = 0; b < nb; ++b, x += STER_QK_K, y += 176) {
        sq_k_scales(x, y, L, 31, -0.5f, 15);
        uint8_t* qh = y + 16;
        uint8_t* ql = y + 48;
        memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < STER_QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

/* Symmetric scale of one 16-weight sub-block, codes -nmax..nmax-1 (stored + nmax in L):
 * from the signed weight of largest magnitude, then 18 nearby candidate scales, keeping the one
 * whose least-squares fit (weights x^2) explains most of the sub-block. (make_qx_quants, rmse 1.) */
static float sq_symmetric_search(int n, int nmax, const float* x, int8_t* L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < 1e-15f) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.0f;
    }
    float iscale = (float)(-nmax) / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        int l = sq_nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        float fl = (float)l;
        sumlx += w * x[i] * fl;
        suml2 += w * fl * fl;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            int l = sq_nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l);
            float w = x[i] * x[i];
            float fl = (float)l;
            sumlx += w * x[i] * fl;
            suml2 += w * fl * fl;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                int l = sq_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q6_K: ql[128] | qh[64] | scales[16] (int8) | d (f16). 210 bytes. */
static void sq_q6_k(const float* x, uint8_t* y, int64_t nb) {
    int8_t L[STER_QK_K];
    float scales[16];
    for (int64_t b = 0; b < nb; ++b, x += STER_QK_K, y += 210) {
        float max_scale = 0.0f, max_abs = 0.0f;
        for (int ib = 0; ib < 16; ++ib) {
            float s = sq_symmetric_search(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = s;
            if (fabsf(s) > max_abs) { max_abs = fabsf(s); max_scale = s; }
        }
        if (max_abs < 1e-15f) {
            memset(y, 0, 210);
            continue;
        }
        float iscale = -128.0f / max_scale;
        sq_put_f16(y + 208, 1.0f / iscale);
        int8_t* sc = (int8_t*)(y + 192);
        for (int ib = 0; ib < 16; ++ib) {
            int v = sq_nearest_int(iscale * scales[ib]);
            sc[ib] = (int8_t)(v > 127 ? 127 : v);
        }
        float d_all = sq_get_f16(y + 208);
        for (int j = 0; j < 16; ++j) {
            float d = d_all * (float)sc[j];
            if (d == 0.0f) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = sq_nearest_int(x[16 * j + ii] / d);
                l = l < -32 ? -32 : (l > 31 ? 31 : l);
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        uint8_t* ql = y;
        uint8_t* qh = y + 128;
        for (int j = 0; j < STER_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                uint8_t q1 = (uint8_t)(L[j + l] & 0x0F), q2 = (uint8_t)(L[j + l + 32] & 0x0F);
                uint8_t q3 = (uint8_t)(L[j + l + 64] & 0x0F), q4 = (uint8_t)(L[j + l + 96] & 0x0F);
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4)
                                  | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

typedef void (*sq_fn)(const float* x, uint8_t* y, int64_t nb);

/* The quantizer of a GGML type id with its block geometry, or NULL. */
static inline sq_fn sq_lookup(int type, int* block, int* bytes) {
    switch (type) {
    case 2:  *block = 32;  *bytes = 18;  return sq_q4_0;
    case 3:  *block = 32;  *bytes = 20;  return sq_q4_1;
    case 6:  *block = 32;  *bytes = 22;  return sq_q5_0;
    case 7:  *block = 32;  *bytes = 24;  return sq_q5_1;
    case 8:  *block = 32;  *bytes = 34;  return sq_q8_0;
    case 12: *block = 256; *bytes = 144; return sq_q4_k;
    case 13: *block = 256; *bytes = 176; return sq_q5_k;
    case 14: *block = 256; *bytes = 210; return sq_q6_k;
    default: return (sq_fn)0;
    }
}

#endif
