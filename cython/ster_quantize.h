/* Block quantizers: float32 rows -> GGML Q8_0, Q4_0, Q5_0 and Q4_K blocks.
 *
 * The blocks llama.cpp's reference quantizers make (ggml-quants.c, no importance
 * matrix), restated in numpy by ster_py/gguf/quantize.py (*_reference), which these
 * must equal byte for byte: every float operation below is a float32 operation in
 * the order the definition gives it, and the build keeps the compiler from fusing
 * multiplies and adds (setup.py: -ffp-contract=off), so no rounding differs.
 */
#ifndef STER_QUANTIZE_H
#define STER_QUANTIZE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* float -> IEEE half bits, round to nearest even (NaN and inf kept; inputs are finite). */
static uint16_t ster_to_f16(float f) {
    uint32_t b, sign, mant;
    int exp;
    memcpy(&b, &f, 4);
    sign = (b >> 16) & 0x8000u;
    b &= 0x7FFFFFFFu;
    if (b >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (b > 0x7F800000u ? 0x200u : 0));
    if (b >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);   /* rounds to inf (>= 65520) */
    exp = (int)(b >> 23) - 127;
    if (exp < -14) {   /* a subnormal half (or zero): value / 2^-24, rounded to nearest even */
        if (exp < -25) return (uint16_t)sign;
        mant = (b & 0x7FFFFFu) | 0x800000u;
        {
            int shift = -exp - 1;   /* mant * 2^(exp - 23) / 2^-24 = mant >> (-1 - exp) */
            uint32_t q = mant >> shift, rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
            if (rest > half || (rest == half && (q & 1u))) q++;
            return (uint16_t)(sign | q);
        }
    }
    mant = b & 0x7FFFFFu;
    {
        uint32_t h = ((uint32_t)(exp + 15) << 10) | (mant >> 13), rest = mant & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;   /* a carry moves into the exponent */
        return (uint16_t)(sign | h);
    }
}

static float ster_from_f16(uint16_t h) {
    uint8_t p[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
    return ster_f16(p);
}

static void ster_put16(uint8_t* p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

/* ggml's nearest_int: add 1.5 * 2^23 in float32 and read the low mantissa bits. */
static inline int ster_nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007FFFFF) - 0x00400000;
}

static void ster_quantize_q8_0(const float* x, uint8_t* y, int nb) {
    int i, j;
    for (i = 0; i < nb; i++, x += 32, y += 34) {
        float amax = 0.0f;
        for (j = 0; j < 32; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        ster_put16(y, ster_to_f16(d));
        for (j = 0; j < 32; j++) {   /* roundf (halves away from zero), exactly: |x * id| <= 127 */
            const float v = x[j] * id;
            int t = (int)v;
            const float rest = v - (float)t;   /* exact */
            t += (rest >= 0.5f) - (rest <= -0.5f);
            y[2 + j] = (uint8_t)(int8_t)t;
        }
    }
}

/* Q4_0 (levels 8, 4 bits) and Q5_0 (levels 16, 5 bits): d = (the value of largest
 * magnitude, the first of a tie) / -levels; codes min(2 levels - 1, trunc(x / d + levels + 0.5)). */
static void ster_quantize_q4_0_q5_0(const float* x, uint8_t* y, int nb, int five) {
    const int levels = five ? 16 : 8, top = 2 * levels - 1, ts = five ? 22 : 18;
    int i, j;
    for (i = 0; i < nb; i++, x += 32, y += ts) {
        float amax = 0.0f, max = 0.0f;
        for (j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / (float)-levels, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t* qs = y + (five ? 6 : 2);
        uint32_t qh = 0;
        ster_put16(y, ster_to_f16(d));
        for (j = 0; j < 16; j++) {
            int a = (int8_t)(x[j] * id + ((float)levels + 0.5f)), b = (int8_t)(x[j + 16] * id + ((float)levels + 0.5f));
            a = a < top ? a : top;
            b = b < top ? b : top;
            qs[j] = (uint8_t)((a & 15) | ((b & 15) << 4));
            qh |= ((uint32_t)(a >> 4) & 1u) << j;
            qh |= ((uint32_t)(b >> 4) & 1u) << (j + 16);
        }
        if (five) { y[2] = (uint8_t)qh; y[3] = (uint8_t)(qh >> 8); y[4] = (uint8_t)(qh >> 16); y[5] = (uint8_t)(qh >> 24); }
    }
}

/* ggml's make_qkx2_quants for n = 32, nmax 15, rmin -1, rdelta 0.1, 20 steps, squared
 * error: codes L and (scale, -min) with x ~= scale * L + min, the best weighted fit among
 * 21 trial scales (each trial starts from the min of the best fit so far). */
static float ster_qkx2(const float* x, const float* w, uint8_t* L, float* the_min) {
    uint8_t La[32];
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0], best, scale, iscale;
    int i, is;
    for (i = 1; i < 32; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, 32);
        *the_min = -min;
        return 0.0f;
    }
    iscale = 15.0f / (max - min);
    scale = 1.0f / iscale;
    best = 0.0f;
    for (i = 0; i < 32; i++) {
        int l = ster_nearest_int(iscale * (x[i] - min));
        l = l < 0 ? 0 : l > 15 ? 15 : l;
        L[i] = (uint8_t)l;
        float diff = scale * (float)l + min - x[i];
        best += w[i] * (diff * diff);
    }
    for (is = 0; is <= 20; is++) {
        float sum_l = 0, sum_l2 = 0, sum_xl = 0, D;
        iscale = (-1.0f + 0.1f * (float)is + 15.0f) / (max - min);
        for (i = 0; i < 32; i++) {
            int l = ster_nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > 15 ? 15 : l;
            La[i] = (uint8_t)l;
            float wl = w[i] * (float)l;
            sum_l += wl;
            sum_l2 += wl * (float)l;
            sum_xl += wl * x[i];
        }
        D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            float cur = 0.0f;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            for (i = 0; i < 32; i++) {
                float diff = this_scale * (float)La[i] + this_min - x[i];
                cur += w[i] * (diff * diff);
            }
            if (cur < best) {
                memcpy(L, La, 32);
                best = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

#if STER_HAVE_X86
/* ster_qkx2 on the eight sub-blocks of a Q4_K block at once, one per AVX2 lane: each lane
 * runs the scalar function's float32 operations in its order (separate multiplies and adds,
 * correctly rounded divisions and square roots), so the results are the same bits.
 * x: the block's 256 weights; L [256] codes; scales, mins [8]. */
STER_AVX2_INLINE __m256i ster_nearest8(__m256 f) {
    __m256i i = _mm256_castps_si256(_mm256_add_ps(f, _mm256_set1_ps(12582912.0f)));
    return _mm256_sub_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007FFFFF)), _mm256_set1_epi32(0x00400000));
}
STER_AVX2_INLINE __m256i ster_clamp15(__m256i v) {
    return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), _mm256_set1_epi32(15));
}

static STER_AVX2 void ster_qkx2_x8(const float* x, uint8_t* L, float* scales, float* mins) {
    __m256 xt[32], wt[32];
    int32_t La[32][8] __attribute__((aligned(32))), Lb[32][8] __attribute__((aligned(32)));
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lane = _mm256_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224);
    int i, is, j;
    for (i = 0; i < 32; i++) xt[i] = _mm256_i32gather_ps(x + i, lane, 4);   /* lane j: weight i of sub-block j */
    {   /* weights: rms of the sub-block + |x| */
        __m256 s2 = _mm256_mul_ps(xt[0], xt[0]);
        for (i = 1; i < 32; i++) s2 = _mm256_add_ps(s2, _mm256_mul_ps(xt[i], xt[i]));
        __m256 av = _mm256_sqrt_ps(_mm256_div_ps(s2, _mm256_set1_ps(32.0f)));
        for (i = 0; i < 32; i++) wt[i] = _mm256_add_ps(av, _mm256_andnot_ps(sign, xt[i]));
    }
    /* (the scalar sums start from 0 + x[0] * x[0] = x[0] * x[0]; the same bits) */
    __m256 mn = xt[0], mx = xt[0], sum_w = wt[0], sum_x = _mm256_mul_ps(wt[0], xt[0]);
    for (i = 1; i < 32; i++) {
        mn = _mm256_min_ps(xt[i], mn);
        mx = _mm256_max_ps(xt[i], mx);
        sum_w = _mm256_add_ps(sum_w, wt[i]);
        sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(wt[i], xt[i]));
    }
    mn = _mm256_min_ps(mn, _mm256_setzero_ps());
    const __m256 flat = _mm256_cmp_ps(mx, mn, _CMP_EQ_OQ);
    __m256 iscale = _mm256_div_ps(_mm256_set1_ps(15.0f), _mm256_sub_ps(mx, mn));
    __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale), best = _mm256_setzero_ps();
    for (i = 0; i < 32; i++) {
        __m256i l = ster_clamp15(ster_nearest8(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], mn))));
        _mm256_store_si256((__m256i*)Lb[i], l);
        __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(l)), mn), xt[i]);
        best = _mm256_add_ps(best, _mm256_mul_ps(wt[i], _mm256_mul_ps(diff, diff)));
    }
    for (is = 0; is <= 20; is++) {
        __m256 sl = _mm256_setzero_ps(), sl2 = _mm256_setzero_ps(), sxl = _mm256_setzero_ps();
        const float num = -1.0f + 0.1f * (float)is + 15.0f;
        iscale = _mm256_div_ps(_mm256_set1_ps(num), _mm256_sub_ps(mx, mn));
        for (i = 0; i < 32; i++) {
            __m256i l = ster_clamp15(ster_nearest8(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], mn))));
            _mm256_store_si256((__m256i*)La[i], l);
            __m256 lf = _mm256_cvtepi32_ps(l), wl = _mm256_mul_ps(wt[i], lf);
            sl = _mm256_add_ps(sl, wl);
            sl2 = _mm256_add_ps(sl2, _mm256_mul_ps(wl, lf));
            sxl = _mm256_add_ps(sxl, _mm256_mul_ps(wl, xt[i]));
        }
        __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sl2), _mm256_mul_ps(sl, sl));
        __m256 ok = _mm256_cmp_ps(D, _mm256_setzero_ps(), _CMP_GT_OQ);
        if (!_mm256_movemask_ps(ok)) continue;
        __m256 ts = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sxl), _mm256_mul_ps(sum_x, sl)), D);
        __m256 tm = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sl2, sum_x), _mm256_mul_ps(sl, sxl)), D);
        __m256 pos = _mm256_cmp_ps(tm, _mm256_setzero_ps(), _CMP_GT_OQ);
        ts = _mm256_blendv_ps(ts, _mm256_div_ps(sxl, sl2), pos);
        tm = _mm256_blendv_ps(tm, _mm256_setzero_ps(), pos);
        __m256 cur = _mm256_setzero_ps();
        for (i = 0; i < 32; i++) {
            __m256 lf = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i*)La[i]));
            __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(ts, lf), tm), xt[i]);
            cur = _mm256_add_ps(cur, _mm256_mul_ps(wt[i], _mm256_mul_ps(diff, diff)));
        }
        __m256 better = _mm256_and_ps(ok, _mm256_cmp_ps(cur, best, _CMP_LT_OQ));
        if (!_mm256_movemask_ps(better)) continue;
        for (i = 0; i < 32; i++)
            _mm256_store_si256((__m256i*)Lb[i], _mm256_castps_si256(_mm256_blendv_ps(
                _mm256_castsi256_ps(_mm256_load_si256((const __m256i*)Lb[i])),
                _mm256_castsi256_ps(_mm256_load_si256((const __m256i*)La[i])), better)));
        best = _mm256_blendv_ps(best, cur, better);
        scale = _mm256_blendv_ps(scale, ts, better);
        mn = _mm256_blendv_ps(mn, tm, better);
    }
    /* flat sub-blocks: codes 0, scale 0, min as found */
    scale = _mm256_blendv_ps(scale, _mm256_setzero_ps(), flat);
    _mm256_storeu_ps(scales, scale);
    _mm256_storeu_ps(mins, _mm256_sub_ps(_mm256_setzero_ps(), mn));
    {
        int fl = _mm256_movemask_ps(flat);
        for (j = 0; j < 8; j++)
            for (i = 0; i < 32; i++) L[32 * j + i] = (fl >> j) & 1 ? 0 : (uint8_t)Lb[i][j];
    }
}
#endif

/* simd: use the AVX2 search (the same bits) when the CPU has AVX2. */
static void ster_quantize_q4_k(const float* x, uint8_t* y, int nb, int simd) {
    uint8_t L[256];
    float w[32], scales[8], mins[8];
    int i, j, l;
#if STER_HAVE_X86
    simd = simd && ster_cpu_avx2();
#else
    (void)simd;
#endif
    for (i = 0; i < nb; i++, x += 256, y += 144) {
        float max_scale = 0.0f, max_min = 0.0f;
        uint8_t* sc = y + 4;
#if STER_HAVE_X86
        if (simd) ster_qkx2_x8(x, L, scales, mins); else
#endif
        for (j = 0; j < 8; j++) {
            const float* xs = x + 32 * j;
            float sum_x2 = 0.0f, av;
            for (l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
            av = sqrtf(sum_x2 / 32.0f);
            for (l = 0; l < 32; l++) w[l] = av + fabsf(xs[l]);
            scales[j] = ster_qkx2(xs, w, L + 32 * j, &mins[j]);
        }
        for (j = 0; j < 8; j++) {
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        {
            const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
            const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
            uint8_t ls[8], lm[8];
            for (j = 0; j < 8; j++) {
                ls[j] = (uint8_t)ster_nearest_int(inv_scale * scales[j]);
                lm[j] = (uint8_t)ster_nearest_int(inv_min * mins[j]);
                if (ls[j] > 63) ls[j] = 63;
                if (lm[j] > 63) lm[j] = 63;
            }
            for (j = 0; j < 4; j++) {
                sc[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
                sc[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
                sc[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
            }
            const uint16_t dh = ster_to_f16(max_scale / 63.0f), mh = ster_to_f16(max_min / 63.0f);
            ster_put16(y, dh);
            ster_put16(y + 2, mh);
            const float d = ster_from_f16(dh), dmin = ster_from_f16(mh);
            for (j = 0; j < 8; j++) {
                const float dj = d * (float)ls[j];
                if (dj == 0.0f) continue;   /* the search's codes stay */
                const float dm = dmin * (float)lm[j];
                for (l = 0; l < 32; l++) {
                    int q = ster_nearest_int((x[32 * j + l] + dm) / dj);
                    L[32 * j + l] = (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
                }
            }
        }
        for (j = 0; j < 4; j++)
            for (l = 0; l < 32; l++) y[16 + 32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + 32 + l] << 4));
    }
}

/* rows [r0, r1) of X [*, K] -> their blocks (row_bytes each) in Y; 0 for an unknown type.
 * simd 0 forces the portable code (tests). */
static int ster_quantize_rows(int type, const float* X, int K, uint8_t* Y, size_t row_bytes, long r0, long r1,
                              int simd) {
    long r;
    for (r = r0; r < r1; r++) {
        const float* x = X + (size_t)r * K;
        uint8_t* y = Y + (size_t)r * row_bytes;
        switch (type) {
        case STER_Q8_0: ster_quantize_q8_0(x, y, K / 32); break;
        case STER_Q4_0: ster_quantize_q4_0_q5_0(x, y, K / 32, 0); break;
        case STER_Q5_0: ster_quantize_q4_0_q5_0(x, y, K / 32, 1); break;
        case STER_Q4_K: ster_quantize_q4_k(x, y, K / 256, simd); break;
        default: return 0;
        }
    }
    return 1;
}

#endif /* STER_QUANTIZE_H */
