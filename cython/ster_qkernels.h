/* Quantized GGML matrix products that decode blocks inside the product.
 *
 * Every supported block type is seen through one shape: a block is 1 or 8
 * "units" of 32 weights, each unit 32 small integer codes (they fit int8) with a
 * scale s and an offset m per 16 weights, so weight i of a unit is s * q_i + m.
 * Only the code/scale extraction differs per type (ster_units_scalar and
 * the *_units_avx2 functions); the products are written once on top of it:
 *
 *   - row dot (mat-vec, one token): sum_i (s q_i + m) x_i
 *       = sum over 16-weight halves of s * (q . x) + m * sum(x),
 *     with the per-16 sums of x computed once per call;
 *   - mat-mat (several tokens): a panel of 16 rows x 256 inputs is decoded to
 *     float32 once, stored input-major, and a 6 x 16 register tile runs over it
 *     (the BLIS shape: every weight decoded once per call, reused by every token).
 *
 * Block layouts: llama.cpp ggml-common.h, restated by the numpy reference in
 * ster_py/gguf/quants.py (dequantize_reference), which the tests compare against.
 *
 * x86-64 with GCC or Clang gets AVX2/FMA/F16C versions selected at run time
 * (function target attributes, so the rest of the module needs no -mavx2); every
 * other machine runs the portable scalar path.
 */
#ifndef STER_QKERNELS_H
#define STER_QKERNELS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* STER_NO_SIMD forces the portable path (to check that it builds and runs). */
#if !defined(STER_NO_SIMD) && (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define STER_HAVE_X86 1
#include <immintrin.h>
#define STER_AVX2 __attribute__((target("avx2,fma,f16c")))
#define STER_AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#else
#define STER_HAVE_X86 0
#endif

enum {
    STER_F32 = 0,   /* float32 rows: only ster_matmul_range's panels read them (a checkpoint's multi-row products) */
    STER_F16 = 1, STER_BF16 = 30,   /* 16-bit floats as stored (safetensors bf16 / f16 weights) */
    STER_Q4_0 = 2, STER_Q4_1 = 3, STER_Q5_0 = 6, STER_Q5_1 = 7, STER_Q8_0 = 8,
    STER_Q2_K = 10, STER_Q3_K = 11, STER_Q4_K = 12, STER_Q5_K = 13, STER_Q6_K = 14,
    STER_IQ4_NL = 20, STER_IQ4_XS = 23, STER_MXFP4 = 39
};

#define STER_KC 256        /* inputs per packed panel (a K-quant super-block, 8 legacy blocks) */
#define STER_NR 16         /* rows per packed panel */
#define STER_MR 6          /* tokens per register tile */

/* llama.cpp's kvalues_iq4nl: IQ4_NL / IQ4_XS non-linear 4-bit grid. */
static const int8_t ster_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1, 13, 25, 38, 53, 69, 89, 113};

/* llama.cpp's kvalues_mxfp4: the 16 E2M1 (OCP microscaling FP4) values, doubled so that they
 * are integers; the block's E8M0 scale is halved to match (ster_e8m0_half). */
static const int8_t ster_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* (block_size, type_size) of a supported type; 0 for any other id. */
static inline int ster_block_size(int type) {
    switch (type) {
    case STER_Q4_0: case STER_Q4_1: case STER_Q5_0: case STER_Q5_1: case STER_Q8_0: case STER_IQ4_NL:
    case STER_MXFP4:
        return 32;
    case STER_F16: case STER_BF16:
        return 1;
    case STER_Q2_K: case STER_Q3_K: case STER_Q4_K: case STER_Q5_K: case STER_Q6_K: case STER_IQ4_XS:
        return 256;
    }
    return 0;
}

static inline int ster_type_size(int type) {
    switch (type) {
    case STER_Q4_0: return 18; case STER_Q4_1: return 20; case STER_Q5_0: return 22;
    case STER_Q5_1: return 24; case STER_Q8_0: return 34; case STER_IQ4_NL: return 18;
    case STER_Q2_K: return 84; case STER_Q3_K: return 110; case STER_Q4_K: return 144;
    case STER_Q5_K: return 176; case STER_Q6_K: return 210; case STER_IQ4_XS: return 136;
    case STER_MXFP4: return 17;   /* E8M0 exponent byte + 16 bytes of 4-bit codes */
    case STER_F16: case STER_BF16: return 2;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Scalar helpers                                                            */

static inline float ster_bits_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }

/* IEEE half (little-endian bytes at p) -> float, exactly, subnormals included. */
static inline float ster_f16(const uint8_t* p) {
    uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-08f;   /* man * 2^-24, exact */
        return sign ? -f : f;
    }
    if (exp == 31) return ster_bits_f32(sign | 0x7F800000u | (man << 13));
    return ster_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* MXFP4's E8M0 scale byte e -> 2^(e - 127) / 2 = 2^(e - 128) as float (ggml_e8m0_to_fp32_half):
 * e >= 2 is a normal float with biased exponent e - 1, e = 0 and 1 are the subnormals 2^-128
 * and 2^-127. e = 255 (NaN in the OCP spec) gives 2^127, as in llama.cpp. Exact. */
static inline float ster_e8m0_half(uint8_t e) {
    return ster_bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

static inline uint32_t ster_le32(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline int ster_is_half(int type) { return type == STER_F16 || type == STER_BF16; }

/* One stored 16-bit float (little-endian bytes at p) -> float, exactly: bfloat16 is the top
 * half of a float32; IEEE half via ster_f16. */
static inline float ster_half(int type, const uint8_t* p) {
    if (type == STER_BF16) return ster_bits_f32(((uint32_t)p[0] | ((uint32_t)p[1] << 8)) << 16);
    return ster_f16(p);
}

/* float -> bfloat16 bits, rounded to nearest even (NaN stays a quiet NaN). */
static inline uint16_t ster_to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((b >> 16) | 0x40);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

/* x [K] -> two bfloat16 arrays with x ~= hi + lo: hi = bf16(x), lo = bf16(x - hi) (the
 * difference is exact in float32). |x - hi - lo| <= 2^-17 |x| for normal numbers: the
 * input of the AVX512_BF16 row dots. Returns 0 (arrays unspecified) when some x is not
 * finite; the caller then multiplies in float32, which propagates inf/NaN as IEEE does. */
static int ster_split_bf16(const float* x, int K, uint16_t* hi, uint16_t* lo) {
    int k;
    for (k = 0; k < K; k++) {
        if (!(fabsf(x[k]) < INFINITY)) return 0;
        hi[k] = ster_to_bf16(x[k]);
        lo[k] = ster_to_bf16(x[k] - ster_bits_f32((uint32_t)hi[k] << 16));
    }
    return 1;
}

/* Q4_K / Q5_K: six-bit scale and min of sub-block j (0..7) from the 12 packed bytes. */
static inline void ster_scale_min_k4(const uint8_t* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q3_K: the 16 six-bit scales (bias 32 removed) from the 12 packed bytes. */
static inline int ster_q3k_scale(const uint8_t* s, int i) {
    int low = (s[i & 7] >> (4 * (i >> 3))) & 0x0F;
    int high = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (low | (high << 4)) - 32;
}

/* Scales (d or d*sc) and offsets (m or -dmin*min) of every 16-weight half of a block:
 * s[2u], s[2u+1], m[2u], m[2u+1] belong to unit u. Returns the unit count. */
static inline int ster_block_scales(int type, const uint8_t* x, float* s, float* m) {
    int u, j, sc, mn;
    float d, dmin;
    switch (type) {
    case STER_Q4_0: case STER_Q5_0: case STER_Q8_0: case STER_IQ4_NL:
        s[0] = s[1] = ster_f16(x); m[0] = m[1] = 0.0f;
        return 1;
    case STER_Q4_1: case STER_Q5_1:
        s[0] = s[1] = ster_f16(x); m[0] = m[1] = ster_f16(x + 2);
        return 1;
    case STER_MXFP4:
        s[0] = s[1] = ster_e8m0_half(x[0]); m[0] = m[1] = 0.0f;
        return 1;
    case STER_Q2_K:
        d = ster_f16(x + 80); dmin = ster_f16(x + 82);
        for (j = 0; j < 16; j++) {
            s[j] = d * (float)(x[j] & 0x0F);
            m[j] = -(dmin * (float)(x[j] >> 4));
        }
        return 8;
    case STER_Q3_K:
        d = ster_f16(x + 108);
        for (j = 0; j < 16; j++) { s[j] = d * (float)ster_q3k_scale(x + 96, j); m[j] = 0.0f; }
        return 8;
    case STER_Q4_K: case STER_Q5_K:
        d = ster_f16(x); dmin = ster_f16(x + 2);
        for (u = 0; u < 8; u++) {
            ster_scale_min_k4(x + 4, u, &sc, &mn);
            s[2 * u] = s[2 * u + 1] = d * (float)sc;
            m[2 * u] = m[2 * u + 1] = -(dmin * (float)mn);
        }
        return 8;
    case STER_Q6_K:
        d = ster_f16(x + 208);
        for (j = 0; j < 16; j++) { s[j] = d * (float)(int8_t)x[192 + j]; m[j] = 0.0f; }
        return 8;
    case STER_IQ4_XS: {
        uint32_t sh = (uint32_t)x[2] | ((uint32_t)x[3] << 8);
        d = ster_f16(x);
        for (u = 0; u < 8; u++) {
            int ls = ((x[4 + (u >> 1)] >> (4 * (u & 1))) & 0x0F) | (((sh >> (2 * u)) & 3) << 4);
            s[2 * u] = s[2 * u + 1] = d * (float)(ls - 32);
            m[2 * u] = m[2 * u + 1] = 0.0f;
        }
        return 8;
    }
    }
    return 0;
}

/* The 32 codes of unit u of a block (portable path). */
static inline void ster_unit_codes(int type, const uint8_t* x, int u, int8_t* q) {
    int l, h = u >> 2, j = u & 3;
    uint32_t qh;
    const uint8_t* p;
    switch (type) {
    case STER_Q4_0:
        for (l = 0; l < 16; l++) { q[l] = (int8_t)((x[2 + l] & 0x0F) - 8); q[l + 16] = (int8_t)((x[2 + l] >> 4) - 8); }
        return;
    case STER_Q4_1:
        for (l = 0; l < 16; l++) { q[l] = (int8_t)(x[4 + l] & 0x0F); q[l + 16] = (int8_t)(x[4 + l] >> 4); }
        return;
    case STER_Q5_0:
        qh = ster_le32(x + 2);
        for (l = 0; l < 16; l++) {
            q[l] = (int8_t)(((x[6 + l] & 0x0F) | (((qh >> l) & 1) << 4)) - 16);
            q[l + 16] = (int8_t)(((x[6 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16);
        }
        return;
    case STER_Q5_1:
        qh = ster_le32(x + 4);
        for (l = 0; l < 16; l++) {
            q[l] = (int8_t)((x[8 + l] & 0x0F) | (((qh >> l) & 1) << 4));
            q[l + 16] = (int8_t)((x[8 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4));
        }
        return;
    case STER_Q8_0:
        for (l = 0; l < 32; l++) q[l] = (int8_t)x[2 + l];
        return;
    case STER_IQ4_NL:
        for (l = 0; l < 16; l++) {
            q[l] = ster_iq4nl_values[x[2 + l] & 0x0F];
            q[l + 16] = ster_iq4nl_values[x[2 + l] >> 4];
        }
        return;
    case STER_MXFP4:   /* as IQ4_NL with the E2M1 table, codes from byte 1 */
        for (l = 0; l < 16; l++) {
            q[l] = ster_mxfp4_values[x[1 + l] & 0x0F];
            q[l + 16] = ster_mxfp4_values[x[1 + l] >> 4];
        }
        return;
    case STER_Q2_K:   /* weight 128h + 32j + l: bits 2j of qs[32h + l] */
        for (l = 0; l < 32; l++) q[l] = (int8_t)((x[16 + 32 * h + l] >> (2 * j)) & 3);
        return;
    case STER_Q3_K:   /* plus a high bit from hmask[l] (bit 4h + j); clear means -4 */
        for (l = 0; l < 32; l++) {
            int lo = (x[32 + 32 * h + l] >> (2 * j)) & 3;
            int hb = (x[l] >> (4 * h + j)) & 1;
            q[l] = (int8_t)(lo - (hb ? 0 : 4));
        }
        return;
    case STER_Q4_K:   /* unit u = 2c + s: nibble s of qs[32c + l] */
        p = x + 16 + 32 * (u >> 1);
        for (l = 0; l < 32; l++) q[l] = (int8_t)((p[l] >> (4 * (u & 1))) & 0x0F);
        return;
    case STER_Q5_K:   /* as Q4_K, fifth bit = bit u of qh[l] */
        p = x + 48 + 32 * (u >> 1);
        for (l = 0; l < 32; l++)
            q[l] = (int8_t)(((p[l] >> (4 * (u & 1))) & 0x0F) | (((x[16 + l] >> u) & 1) << 4));
        return;
    case STER_Q6_K: { /* half h, j: low nibble/high nibble of ql[64h + 32(j&1) + l], bits 2j of qh[32h + l] */
        const uint8_t* ql = x + 64 * h + 32 * (j & 1);
        const uint8_t* qhp = x + 128 + 32 * h;
        for (l = 0; l < 32; l++) {
            int lo = (j < 2) ? (ql[l] & 0x0F) : (ql[l] >> 4);
            q[l] = (int8_t)((lo | (((qhp[l] >> (2 * j)) & 3) << 4)) - 32);
        }
        return;
    }
    case STER_IQ4_XS:
        p = x + 8 + 16 * u;
        for (l = 0; l < 16; l++) {
            q[l] = ster_iq4nl_values[p[l] & 0x0F];
            q[l + 16] = ster_iq4nl_values[p[l] >> 4];
        }
        return;
    }
}

/* ------------------------------------------------------------------------- */
/* Portable path                                                             */

/* Row of nb blocks . x (x: nb * block_size floats). */
static float ster_row_dot_scalar(int type, const uint8_t* row, int nb, const float* x) {
    int bs = ster_block_size(type), ts = ster_type_size(type), b, u, l, nu;
    float s[16], m[16], total = 0.0f;
    int8_t q[32];
    if (ster_is_half(type)) {   /* nb weights, one accumulator */
        for (b = 0; b < nb; b++) total += ster_half(type, row + 2 * (size_t)b) * x[b];
        return total;
    }
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * ts;
        nu = ster_block_scales(type, blk, s, m);
        for (u = 0; u < nu; u++) {
            const float* xu = x + (size_t)b * bs + 32 * u;
            float qa = 0, qb = 0, xa = 0, xb = 0;
            ster_unit_codes(type, blk, u, q);
            for (l = 0; l < 16; l++) { qa += (float)q[l] * xu[l]; xa += xu[l]; }
            for (l = 16; l < 32; l++) { qb += (float)q[l] * xu[l]; xb += xu[l]; }
            total += s[2 * u] * qa + s[2 * u + 1] * qb + m[2 * u] * xa + m[2 * u + 1] * xb;
        }
    }
    return total;
}

/* nb blocks -> nb * block_size floats. */
static void ster_decode_scalar(int type, const uint8_t* src, int nb, float* dst) {
    int ts = ster_type_size(type), b, u, l, nu;
    float s[16], m[16];
    int8_t q[32];
    if (ster_is_half(type)) {
        for (b = 0; b < nb; b++) dst[b] = ster_half(type, src + 2 * (size_t)b);
        return;
    }
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = src + (size_t)b * ts;
        nu = ster_block_scales(type, blk, s, m);
        for (u = 0; u < nu; u++) {
            ster_unit_codes(type, blk, u, q);
            for (l = 0; l < 32; l++) dst[32 * u + l] = s[2 * u + (l >> 4)] * (float)q[l] + m[2 * u + (l >> 4)];
        }
        dst += 32 * nu;
    }
}

/* C[t, n] (+)= sum_k A[t, k] * B[k, n] for t < mt, n < nv (B: packed [kc][16]). */
static void ster_micro_scalar(int kc, const float* A, int lda, int mt, const float* B, float* C, int ldc,
                              int nv, int accumulate) {
    int t, n, k;
    for (t = 0; t < mt; t++) {
        float acc[STER_NR];
        for (n = 0; n < STER_NR; n++) acc[n] = 0.0f;
        for (k = 0; k < kc; k++) {
            float a = A[(size_t)t * lda + k];
            for (n = 0; n < STER_NR; n++) acc[n] += a * B[k * STER_NR + n];
        }
        for (n = 0; n < nv; n++) C[(size_t)t * ldc + n] = accumulate ? C[(size_t)t * ldc + n] + acc[n] : acc[n];
    }
}

/* ------------------------------------------------------------------------- */
/* AVX2 path                                                                 */

#if STER_HAVE_X86

static int ster_cpu_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                 __builtin_cpu_supports("f16c");
    }
    return cached;
}

/* Instruction-set levels of the kernels, each including the ones below it. */
enum { STER_ISA_PORTABLE = 0, STER_ISA_AVX2 = 1, STER_ISA_AVX512 = 2, STER_ISA_VNNI = 3, STER_ISA_BF16 = 4,
       STER_ISA_AMX = 5 };

static int ster_amx_granted(void);   /* ster_amx.h */

/* The highest level this CPU (and OS: libgcc checks the saved register state) runs:
 * AVX2 = AVX2 + FMA + F16C; AVX512 = AVX512 F/BW/VL/DQ; VNNI = + AVX512_VNNI;
 * BF16 = + AVX512_BF16; AMX = + AMX-TILE and AMX-BF16, granted to this process by the OS. */
static int ster_cpu_level(void) {
    static int cached = -1;
    if (cached < 0) {
        int level = 0;
        __builtin_cpu_init();
        if (ster_cpu_avx2()) {
            level = STER_ISA_AVX2;
            if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
                level = STER_ISA_AVX512;
                if (__builtin_cpu_supports("avx512vnni")) {
                    level = STER_ISA_VNNI;
                    if (__builtin_cpu_supports("avx512bf16")) level = ster_amx_granted() ? STER_ISA_AMX : STER_ISA_BF16;
                }
            }
        }
        cached = level;
    }
    return cached;
}

/* Whether bfloat16 inputs multiply faster than the float32 FMA tile does the same products: on AMD's
 * AVX512_BF16 cores (Zen 4, Zen 5) vdpbf16ps issues as often as an FMA with twice the products (the
 * bf16 tile ran 1.8-2.0x the float32 one on a Zen 5); on Intel's (Cooper Lake, Sapphire Rapids and
 * later) it issues half as often (0.66-0.71x on an AMX Xeon), but there AMX's tiles take the product
 * where the OS grants them. Chooses set_bf16_inputs' default. */
static int ster_cpu_fast_bf16_dot(void) {
    __builtin_cpu_init();
    return ster_cpu_level() >= STER_ISA_AMX || (ster_cpu_level() >= STER_ISA_BF16 && __builtin_cpu_is("amd"));
}

STER_AVX2_INLINE float ster_hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

STER_AVX2_INLINE float ster_f16_avx2(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 codes: low nibbles are codes 0..15, high nibbles 16..31. */
STER_AVX2_INLINE __m256i ster_nibbles32(const uint8_t* p) {
    __m128i b = _mm_loadu_si128((const __m128i*)p);
    __m128i mask = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

/* 32 bits -> 32 bytes, 0xFF where bit i of v is set. */
STER_AVX2_INLINE __m256i ster_bits32(uint32_t v) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
}

/* The codes of unit u of a block, as 32 int8 in a register. */
STER_AVX2_INLINE __m256i ster_codes_avx2(int type, const uint8_t* x, int u) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    int h = u >> 2, j = u & 3;
    __m256i q, t;
    switch (type) {
    case STER_Q4_0:
        return _mm256_sub_epi8(ster_nibbles32(x + 2), _mm256_set1_epi8(8));
    case STER_Q4_1:
        return ster_nibbles32(x + 4);
    case STER_Q5_0:
        q = _mm256_or_si256(ster_nibbles32(x + 6), _mm256_and_si256(ster_bits32(ster_le32(x + 2)), _mm256_set1_epi8(16)));
        return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    case STER_Q5_1:
        return _mm256_or_si256(ster_nibbles32(x + 8), _mm256_and_si256(ster_bits32(ster_le32(x + 4)), _mm256_set1_epi8(16)));
    case STER_Q8_0:
        return _mm256_loadu_si256((const __m256i*)(x + 2));
    case STER_IQ4_NL: case STER_IQ4_XS: case STER_MXFP4: {
        const __m128i tbl = _mm_loadu_si128((const __m128i*)(type == STER_MXFP4 ? ster_mxfp4_values : ster_iq4nl_values));
        const uint8_t* p = type == STER_IQ4_NL ? x + 2 : type == STER_MXFP4 ? x + 1 : x + 8 + 16 * u;
        __m128i b = _mm_loadu_si128((const __m128i*)p);
        __m128i mask = _mm_set1_epi8(0x0F);
        __m128i lo = _mm_shuffle_epi8(tbl, _mm_and_si128(b, mask));
        __m128i hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
        return _mm256_set_m128i(hi, lo);
    }
    case STER_Q2_K:
        q = _mm256_loadu_si256((const __m256i*)(x + 16 + 32 * h));
        return _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
    case STER_Q3_K:
        q = _mm256_loadu_si256((const __m256i*)(x + 32 + 32 * h));
        q = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
        t = _mm256_loadu_si256((const __m256i*)x);
        t = _mm256_and_si256(_mm256_srl_epi16(t, _mm_cvtsi32_si128(4 * h + j)), one);
        return _mm256_sub_epi8(_mm256_or_si256(q, _mm256_slli_epi16(t, 2)), _mm256_set1_epi8(4));
    case STER_Q4_K:
        q = _mm256_loadu_si256((const __m256i*)(x + 16 + 32 * (u >> 1)));
        return _mm256_and_si256((u & 1) ? _mm256_srli_epi16(q, 4) : q, m15);
    case STER_Q5_K:
        q = _mm256_loadu_si256((const __m256i*)(x + 48 + 32 * (u >> 1)));
        q = _mm256_and_si256((u & 1) ? _mm256_srli_epi16(q, 4) : q, m15);
        t = _mm256_loadu_si256((const __m256i*)(x + 16));
        t = _mm256_and_si256(_mm256_srl_epi16(t, _mm_cvtsi32_si128(u)), one);
        return _mm256_or_si256(q, _mm256_slli_epi16(t, 4));
    case STER_Q6_K:
        q = _mm256_loadu_si256((const __m256i*)(x + 64 * h + 32 * (j & 1)));
        q = _mm256_and_si256(j < 2 ? q : _mm256_srli_epi16(q, 4), m15);
        t = _mm256_loadu_si256((const __m256i*)(x + 128 + 32 * h));
        t = _mm256_and_si256(_mm256_srl_epi16(t, _mm_cvtsi32_si128(2 * j)), m3);
        return _mm256_sub_epi8(_mm256_or_si256(q, _mm256_slli_epi16(t, 4)), _mm256_set1_epi8(32));
    }
    return _mm256_setzero_si256();
}

/* Codes 8g .. 8g+7 of a unit as floats. */
STER_AVX2_INLINE __m256 ster_codes_f32(__m256i q, int g) {
    __m128i half = g < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
    if (g & 1) half = _mm_unpackhi_epi64(half, half);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(half));
}

/* Scales with the F16C conversion (same values as ster_block_scales). */
STER_AVX2_INLINE int ster_block_scales_avx2(int type, const uint8_t* x, float* s, float* m) {
    switch (type) {
    case STER_Q4_0: case STER_Q5_0: case STER_Q8_0: case STER_IQ4_NL:
        s[0] = s[1] = ster_f16_avx2(x); m[0] = m[1] = 0.0f;
        return 1;
    case STER_Q4_1: case STER_Q5_1:
        s[0] = s[1] = ster_f16_avx2(x); m[0] = m[1] = ster_f16_avx2(x + 2);
        return 1;
    }
    return ster_block_scales(type, x, s, m);
}

/* One row of nb blocks . x; xs16: sums of x over each 16 inputs (offset types only). */
STER_AVX2_INLINE float ster_row_dot_avx2_t(const int type, const uint8_t* row, int nb, const float* x,
                                           const float* xs16) {
    const int ts = ster_type_size(type), bs = ster_block_size(type);
    const int per16 = (type == STER_Q2_K || type == STER_Q3_K || type == STER_Q6_K);
    const int offset = (type == STER_Q4_1 || type == STER_Q5_1 || type == STER_Q2_K ||
                        type == STER_Q4_K || type == STER_Q5_K);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float macc = 0.0f, s[16], m[16];
    int b, u, nu;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * ts;
        const float* xb = x + (size_t)b * bs;
        nu = ster_block_scales_avx2(type, blk, s, m);
        for (u = 0; u < nu; u++) {
            const float* xu = xb + 32 * u;
            __m256i q = ster_codes_avx2(type, blk, u);
            __m256 sa = _mm256_mul_ps(ster_codes_f32(q, 0), _mm256_loadu_ps(xu));
            __m256 sb = _mm256_mul_ps(ster_codes_f32(q, 2), _mm256_loadu_ps(xu + 16));
            sa = _mm256_fmadd_ps(ster_codes_f32(q, 1), _mm256_loadu_ps(xu + 8), sa);
            sb = _mm256_fmadd_ps(ster_codes_f32(q, 3), _mm256_loadu_ps(xu + 24), sb);
            if (per16) {
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * u]), sa, acc0);
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * u + 1]), sb, acc1);
            } else {
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * u]), _mm256_add_ps(sa, sb), acc0);
            }
            if (offset) {
                const float* xs = xs16 + ((size_t)b * bs + 32 * u) / 16;
                macc += m[2 * u] * xs[0] + m[2 * u + 1] * xs[1];
            }
        }
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) + macc;
}

/* Specialised row dots for the common types. They widen bytes straight from memory into
 * 32-bit lanes (vpmovzxbd m64), so a 4-bit block costs two loads, two masks/shifts, four
 * conversions and four FMAs; a constant code offset (Q4_0's -8, Q5_0's -16, Q6_K's -32)
 * moves into the sum-of-x term. Two accumulators break the FMA latency chain. */

STER_AVX2_INLINE __m256 ster_u8x8(const uint8_t* p) {       /* 8 bytes -> 8 int32 lanes */
    return _mm256_castsi256_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
#define STER_I(v) _mm256_castps_si256(v)
#define STER_CVT(v) _mm256_cvtepi32_ps(v)

/* Q4_0 / Q4_1 (and the nibble half of Q5_*): codes 0..15, byte l = weights l and l + 16. */
STER_AVX2_INLINE __m256 ster_nib_dot(const uint8_t* qs, const float* x) {
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256i v0 = STER_I(ster_u8x8(qs)), v1 = STER_I(ster_u8x8(qs + 8));
    __m256 s0 = _mm256_mul_ps(STER_CVT(_mm256_and_si256(v0, m15)), _mm256_loadu_ps(x));
    __m256 s1 = _mm256_mul_ps(STER_CVT(_mm256_and_si256(v1, m15)), _mm256_loadu_ps(x + 8));
    s0 = _mm256_fmadd_ps(STER_CVT(_mm256_srli_epi32(v0, 4)), _mm256_loadu_ps(x + 16), s0);
    s1 = _mm256_fmadd_ps(STER_CVT(_mm256_srli_epi32(v1, 4)), _mm256_loadu_ps(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

static STER_AVX2 float ster_dot_q4_0(const uint8_t* row, int nb, const float* x, const float* xs16) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float macc = 0.0f;
    int b;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * 18;
        float d = ster_f16_avx2(blk);
        __m256 s = ster_nib_dot(blk + 2, x + 32 * b);
        if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc0);
        macc += d * (xs16[2 * b] + xs16[2 * b + 1]);
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) - 8.0f * macc;
}

static STER_AVX2 float ster_dot_q4_1(const uint8_t* row, int nb, const float* x, const float* xs16) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float macc = 0.0f;
    int b;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * 20;
        __m256 s = ster_nib_dot(blk + 4, x + 32 * b);
        if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_set1_ps(ster_f16_avx2(blk)), s, acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_set1_ps(ster_f16_avx2(blk)), s, acc0);
        macc += ster_f16_avx2(blk + 2) * (xs16[2 * b] + xs16[2 * b + 1]);
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) + macc;
}

static STER_AVX2 float ster_dot_q8_0(const uint8_t* row, int nb, const float* x, const float* xs16) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int b;
    (void)xs16;
    for (b = 0; b < nb; b++) {
        const uint8_t* q = row + (size_t)b * 34 + 2;
        const float* xb = x + 32 * b;
        __m256 s0 = _mm256_mul_ps(STER_CVT(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)q))), _mm256_loadu_ps(xb));
        __m256 s1 = _mm256_mul_ps(STER_CVT(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + 8)))), _mm256_loadu_ps(xb + 8));
        s0 = _mm256_fmadd_ps(STER_CVT(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + 16)))), _mm256_loadu_ps(xb + 16), s0);
        s1 = _mm256_fmadd_ps(STER_CVT(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + 24)))), _mm256_loadu_ps(xb + 24), s1);
        if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_set1_ps(ster_f16_avx2(q - 2)), _mm256_add_ps(s0, s1), acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_set1_ps(ster_f16_avx2(q - 2)), _mm256_add_ps(s0, s1), acc0);
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1));
}

/* Q5_0 / Q5_1: the fifth bits come from a table: byte v of qh -> 8 lanes of ((v >> i) & 1) << 4,
 * one 32-byte load per 8 weights (8 KiB, stays in L1). */
static int32_t ster_q5_high[256][8] __attribute__((aligned(32)));
static uint16_t ster_q5_words[256][8] __attribute__((aligned(16)));   /* byte v -> 8 words, ((v >> i) & 1) << 4 */
static int ster_q5_high_ready = 0;

static void ster_init_tables(void) {
    int v, i;
    if (ster_q5_high_ready) return;
    for (v = 0; v < 256; v++) {
        for (i = 0; i < 8; i++) {
            ster_q5_high[v][i] = ((v >> i) & 1) << 4;
            ster_q5_words[v][i] = (uint16_t)(((v >> i) & 1) << 4);
        }
    }
    ster_q5_high_ready = 1;
}

STER_AVX2_INLINE __m256 ster_q5_dot(const uint8_t* qs, uint32_t qh, const float* x) {
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256i v0 = STER_I(ster_u8x8(qs)), v1 = STER_I(ster_u8x8(qs + 8));
    __m256i h0 = _mm256_load_si256((const __m256i*)ster_q5_high[qh & 0xFF]);
    __m256i h1 = _mm256_load_si256((const __m256i*)ster_q5_high[(qh >> 8) & 0xFF]);
    __m256i h2 = _mm256_load_si256((const __m256i*)ster_q5_high[(qh >> 16) & 0xFF]);
    __m256i h3 = _mm256_load_si256((const __m256i*)ster_q5_high[qh >> 24]);
    __m256 s0 = _mm256_mul_ps(STER_CVT(_mm256_or_si256(_mm256_and_si256(v0, m15), h0)), _mm256_loadu_ps(x));
    __m256 s1 = _mm256_mul_ps(STER_CVT(_mm256_or_si256(_mm256_and_si256(v1, m15), h1)), _mm256_loadu_ps(x + 8));
    s0 = _mm256_fmadd_ps(STER_CVT(_mm256_or_si256(_mm256_srli_epi32(v0, 4), h2)), _mm256_loadu_ps(x + 16), s0);
    s1 = _mm256_fmadd_ps(STER_CVT(_mm256_or_si256(_mm256_srli_epi32(v1, 4), h3)), _mm256_loadu_ps(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

static STER_AVX2 float ster_dot_q5_0(const uint8_t* row, int nb, const float* x, const float* xs16) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float macc = 0.0f;
    int b;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * 22;
        float d = ster_f16_avx2(blk);
        __m256 s = ster_q5_dot(blk + 6, ster_le32(blk + 2), x + 32 * b);
        if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc0);
        macc += d * (xs16[2 * b] + xs16[2 * b + 1]);
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) - 16.0f * macc;
}

static STER_AVX2 float ster_dot_q5_1(const uint8_t* row, int nb, const float* x, const float* xs16) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float macc = 0.0f;
    int b;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * 24;
        __m256 s = ster_q5_dot(blk + 8, ster_le32(blk + 4), x + 32 * b);
        if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_set1_ps(ster_f16_avx2(blk)), s, acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_set1_ps(ster_f16_avx2(blk)), s, acc0);
        macc += ster_f16_avx2(blk + 2) * (xs16[2 * b] + xs16[2 * b + 1]);
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) + macc;
}

/* Q4_K: each 32-byte chunk c holds sub-block 2c (low nibbles) and 2c + 1 (high nibbles). */
static STER_AVX2 float ster_dot_q4_k(const uint8_t* row, int nb, const float* x, const float* xs16) {
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float macc = 0.0f, s[16], m[16];
    int b, c, g;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * 144;
        const float* xb = x + 256 * b;
        const float* xs = xs16 + 16 * b;
        ster_block_scales_avx2(STER_Q4_K, blk, s, m);
        for (c = 0; c < 4; c++) {
            const uint8_t* q = blk + 16 + 32 * c;
            const float* xc = xb + 64 * c;
            __m256 sa = _mm256_setzero_ps(), sb = _mm256_setzero_ps();
            for (g = 0; g < 4; g++) {
                __m256i v = STER_I(ster_u8x8(q + 8 * g));
                sa = _mm256_fmadd_ps(STER_CVT(_mm256_and_si256(v, m15)), _mm256_loadu_ps(xc + 8 * g), sa);
                sb = _mm256_fmadd_ps(STER_CVT(_mm256_srli_epi32(v, 4)), _mm256_loadu_ps(xc + 32 + 8 * g), sb);
            }
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s[4 * c]), sa, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(s[4 * c + 2]), sb, acc1);
            macc += m[4 * c] * (xs[4 * c] + xs[4 * c + 1]) + m[4 * c + 2] * (xs[4 * c + 2] + xs[4 * c + 3]);
        }
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) + macc;
}

/* Q6_K, lanes l..l+7 of half h: ql[l], ql[32 + l] and qh[l] give four units' codes. */
static STER_AVX2 float ster_dot_q6_k(const uint8_t* row, int nb, const float* x, const float* xs16) {
    const __m256i m15 = _mm256_set1_epi32(15), m3 = _mm256_set1_epi32(3), m48 = _mm256_set1_epi32(48);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float macc = 0.0f;
    int b, h, g, j;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * 210;
        const float d = ster_f16_avx2(blk + 208);
        const float* xs = xs16 + 16 * b;
        for (h = 0; h < 2; h++) {
            const uint8_t* ql = blk + 64 * h;
            const uint8_t* qh = blk + 128 + 32 * h;
            const float* xh = x + 256 * b + 128 * h;
            const int8_t* sc = (const int8_t*)(blk + 192 + 8 * h);
            __m256 part[8];   /* unit j (0..3) x half of its 32 lanes (0, 1) */
            for (j = 0; j < 8; j++) part[j] = _mm256_setzero_ps();
            for (g = 0; g < 4; g++) {
                __m256i a = STER_I(ster_u8x8(ql + 8 * g)), c = STER_I(ster_u8x8(ql + 32 + 8 * g));
                __m256i e = STER_I(ster_u8x8(qh + 8 * g));
                __m256i q0 = _mm256_or_si256(_mm256_and_si256(a, m15), _mm256_slli_epi32(_mm256_and_si256(e, m3), 4));
                __m256i q1 = _mm256_or_si256(_mm256_and_si256(c, m15), _mm256_and_si256(_mm256_slli_epi32(e, 2), m48));
                __m256i q2 = _mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_and_si256(e, m48));
                __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_and_si256(_mm256_srli_epi32(e, 2), m48));
                int k = g >> 1;
                part[0 + k] = _mm256_fmadd_ps(STER_CVT(q0), _mm256_loadu_ps(xh + 8 * g), part[0 + k]);
                part[2 + k] = _mm256_fmadd_ps(STER_CVT(q1), _mm256_loadu_ps(xh + 32 + 8 * g), part[2 + k]);
                part[4 + k] = _mm256_fmadd_ps(STER_CVT(q2), _mm256_loadu_ps(xh + 64 + 8 * g), part[4 + k]);
                part[6 + k] = _mm256_fmadd_ps(STER_CVT(q3), _mm256_loadu_ps(xh + 96 + 8 * g), part[6 + k]);
            }
            for (j = 0; j < 8; j++) {
                float sj = d * (float)sc[j];
                if (j & 1) acc1 = _mm256_fmadd_ps(_mm256_set1_ps(sj), part[j], acc1);
                else acc0 = _mm256_fmadd_ps(_mm256_set1_ps(sj), part[j], acc0);
                macc += sj * xs[8 * h + j];
            }
        }
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) - 32.0f * macc;
}

/* The other types go through the generic unit path. */
#define STER_DOT_FN(NAME, TYPE) \
    static STER_AVX2 float NAME(const uint8_t* row, int nb, const float* x, const float* xs16) { \
        return ster_row_dot_avx2_t(TYPE, row, nb, x, xs16); }
STER_DOT_FN(ster_dot_q2_k, STER_Q2_K)
STER_DOT_FN(ster_dot_q3_k, STER_Q3_K)
STER_DOT_FN(ster_dot_q5_k, STER_Q5_K)
STER_DOT_FN(ster_dot_iq4_nl, STER_IQ4_NL)
STER_DOT_FN(ster_dot_iq4_xs, STER_IQ4_XS)
STER_DOT_FN(ster_dot_mxfp4, STER_MXFP4)

/* 16-bit float rows (safetensors bf16 / f16 weights used as stored): 8 weights widened to
 * float32 per FMA (bf16: zero-extend and shift into the top half; f16: vcvtph2ps), four
 * accumulators; nb counts weights. */
STER_AVX2_INLINE __m256 ster_bf16x8(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
STER_AVX2_INLINE __m256 ster_f16x8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

#define STER_HALF_DOT_AVX2(NAME, WIDEN, TYPE) \
    static STER_AVX2 float NAME(const uint8_t* row, int n, const float* x, const float* xs16) { \
        const uint16_t* w = (const uint16_t*)row; \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps(); \
        float tail = 0.0f; \
        int k = 0; \
        (void)xs16; \
        for (; k + 32 <= n; k += 32) { \
            a0 = _mm256_fmadd_ps(WIDEN(w + k), _mm256_loadu_ps(x + k), a0); \
            a1 = _mm256_fmadd_ps(WIDEN(w + k + 8), _mm256_loadu_ps(x + k + 8), a1); \
            a2 = _mm256_fmadd_ps(WIDEN(w + k + 16), _mm256_loadu_ps(x + k + 16), a2); \
            a3 = _mm256_fmadd_ps(WIDEN(w + k + 24), _mm256_loadu_ps(x + k + 24), a3); \
        } \
        for (; k + 8 <= n; k += 8) a0 = _mm256_fmadd_ps(WIDEN(w + k), _mm256_loadu_ps(x + k), a0); \
        for (; k < n; k++) tail += ster_half(TYPE, row + 2 * (size_t)k) * x[k]; \
        return ster_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + tail; \
    }
STER_HALF_DOT_AVX2(ster_dot_bf16, ster_bf16x8, STER_BF16)
STER_HALF_DOT_AVX2(ster_dot_f16, ster_f16x8, STER_F16)
#undef STER_HALF_DOT_AVX2

typedef float (*ster_dot_fn)(const uint8_t*, int, const float*, const float*);

static ster_dot_fn ster_dot_avx2_for(int type) {
    switch (type) {
    case STER_Q4_0: return ster_dot_q4_0; case STER_Q4_1: return ster_dot_q4_1;
    case STER_Q5_0: return ster_dot_q5_0; case STER_Q5_1: return ster_dot_q5_1;
    case STER_Q8_0: return ster_dot_q8_0; case STER_Q2_K: return ster_dot_q2_k;
    case STER_Q3_K: return ster_dot_q3_k; case STER_Q4_K: return ster_dot_q4_k;
    case STER_Q5_K: return ster_dot_q5_k; case STER_Q6_K: return ster_dot_q6_k;
    case STER_IQ4_NL: return ster_dot_iq4_nl; case STER_IQ4_XS: return ster_dot_iq4_xs;
    case STER_MXFP4: return ster_dot_mxfp4;
    case STER_BF16: return ster_dot_bf16; case STER_F16: return ster_dot_f16;
    }
    return 0;
}

/* nb blocks -> floats (s * q + m, one rounding). */
STER_AVX2_INLINE void ster_decode_avx2_t(const int type, const uint8_t* src, int nb, float* dst) {
    const int ts = ster_type_size(type);
    float s[16], m[16];
    int b, u, g, nu;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = src + (size_t)b * ts;
        nu = ster_block_scales_avx2(type, blk, s, m);
        for (u = 0; u < nu; u++) {
            __m256i q = ster_codes_avx2(type, blk, u);
            for (g = 0; g < 4; g++) {
                __m256 w = _mm256_fmadd_ps(ster_codes_f32(q, g), _mm256_set1_ps(s[2 * u + (g >> 1)]),
                                           _mm256_set1_ps(m[2 * u + (g >> 1)]));
                _mm256_storeu_ps(dst + 32 * u + 8 * g, w);
            }
        }
        dst += 32 * nu;
    }
}

#define STER_DEC_FN(NAME, TYPE) \
    static STER_AVX2 void NAME(const uint8_t* src, int nb, float* dst) { ster_decode_avx2_t(TYPE, src, nb, dst); }
STER_DEC_FN(ster_dec_q4_0, STER_Q4_0)
STER_DEC_FN(ster_dec_q4_1, STER_Q4_1)
STER_DEC_FN(ster_dec_q5_0, STER_Q5_0)
STER_DEC_FN(ster_dec_q5_1, STER_Q5_1)
STER_DEC_FN(ster_dec_q8_0, STER_Q8_0)
STER_DEC_FN(ster_dec_q2_k, STER_Q2_K)
STER_DEC_FN(ster_dec_q3_k, STER_Q3_K)
STER_DEC_FN(ster_dec_q4_k, STER_Q4_K)
STER_DEC_FN(ster_dec_q5_k, STER_Q5_K)
STER_DEC_FN(ster_dec_q6_k, STER_Q6_K)
STER_DEC_FN(ster_dec_iq4_nl, STER_IQ4_NL)
STER_DEC_FN(ster_dec_iq4_xs, STER_IQ4_XS)
STER_DEC_FN(ster_dec_mxfp4, STER_MXFP4)

/* 16-bit float weights -> float32 (panels of the mat-mat product). */
static STER_AVX2 void ster_dec_bf16(const uint8_t* src, int n, float* dst) {
    const uint16_t* w = (const uint16_t*)src;
    int k = 0;
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(dst + k, ster_bf16x8(w + k));
    for (; k < n; k++) dst[k] = ster_half(STER_BF16, src + 2 * (size_t)k);
}
static STER_AVX2 void ster_dec_f16(const uint8_t* src, int n, float* dst) {
    const uint16_t* w = (const uint16_t*)src;
    int k = 0;
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(dst + k, ster_f16x8(w + k));
    for (; k < n; k++) dst[k] = ster_half(STER_F16, src + 2 * (size_t)k);
}

typedef void (*ster_dec_fn)(const uint8_t*, int, float*);

static ster_dec_fn ster_dec_avx2_for(int type) {
    switch (type) {
    case STER_Q4_0: return ster_dec_q4_0; case STER_Q4_1: return ster_dec_q4_1;
    case STER_Q5_0: return ster_dec_q5_0; case STER_Q5_1: return ster_dec_q5_1;
    case STER_Q8_0: return ster_dec_q8_0; case STER_Q2_K: return ster_dec_q2_k;
    case STER_Q3_K: return ster_dec_q3_k; case STER_Q4_K: return ster_dec_q4_k;
    case STER_Q5_K: return ster_dec_q5_k; case STER_Q6_K: return ster_dec_q6_k;
    case STER_IQ4_NL: return ster_dec_iq4_nl; case STER_IQ4_XS: return ster_dec_iq4_xs;
    case STER_MXFP4: return ster_dec_mxfp4;
    case STER_BF16: return ster_dec_bf16; case STER_F16: return ster_dec_f16;
    }
    return 0;
}

/* 6 x 16 register tile over a packed panel; rows t >= mt repeat row mt - 1 and are dropped.
 * Twelve named accumulators (not an array) so the compiler keeps them in registers. */
static STER_AVX2 void ster_micro_avx2(int kc, const float* A, int lda, int mt, const float* B, float* C, int ldc,
                                      int nv, int accumulate) {
    const float* a0 = A;
    const float* a1 = A + (size_t)(mt > 1 ? 1 : mt - 1) * lda;
    const float* a2 = A + (size_t)(mt > 2 ? 2 : mt - 1) * lda;
    const float* a3 = A + (size_t)(mt > 3 ? 3 : mt - 1) * lda;
    const float* a4 = A + (size_t)(mt > 4 ? 4 : mt - 1) * lda;
    const float* a5 = A + (size_t)(mt > 5 ? 5 : mt - 1) * lda;
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    float out[STER_MR][STER_NR];
    int t, k, n;
    for (k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(B + STER_NR * k), b1 = _mm256_loadu_ps(B + STER_NR * k + 8);
        __m256 x;
        x = _mm256_broadcast_ss(a0 + k); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a1 + k); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a2 + k); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a3 + k); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a4 + k); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a5 + k); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    _mm256_storeu_ps(out[0], c00); _mm256_storeu_ps(out[0] + 8, c01);
    _mm256_storeu_ps(out[1], c10); _mm256_storeu_ps(out[1] + 8, c11);
    _mm256_storeu_ps(out[2], c20); _mm256_storeu_ps(out[2] + 8, c21);
    _mm256_storeu_ps(out[3], c30); _mm256_storeu_ps(out[3] + 8, c31);
    _mm256_storeu_ps(out[4], c40); _mm256_storeu_ps(out[4] + 8, c41);
    _mm256_storeu_ps(out[5], c50); _mm256_storeu_ps(out[5] + 8, c51);
    for (t = 0; t < mt; t++) {
        float* ct = C + (size_t)t * ldc;
        if (nv == STER_NR) {
            __m256 r0 = _mm256_loadu_ps(out[t]), r1 = _mm256_loadu_ps(out[t] + 8);
            if (accumulate) {
                r0 = _mm256_add_ps(r0, _mm256_loadu_ps(ct));
                r1 = _mm256_add_ps(r1, _mm256_loadu_ps(ct + 8));
            }
            _mm256_storeu_ps(ct, r0);
            _mm256_storeu_ps(ct + 8, r1);
        } else {
            for (n = 0; n < nv; n++) ct[n] = accumulate ? ct[n] + out[t][n] : out[t][n];
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Decoding with int16 activations: x ~= dx[b] * x16[i] per 32-input block b   */
/* (ster_quantize16), so a 32-weight unit is two vpmaddwd of int16 codes and     */
/* int16 inputs, one conversion and one FMA by s * dx; offsets use the sums of   */
/* the quantized inputs. The result is the float dot with the quantized inputs.  */

STER_AVX2_INLINE __m256i ster_madd32(__m128i lo16, __m128i hi16, const int16_t* x, int is_signed, __m256i* p1) {
    __m256i a = is_signed ? _mm256_cvtepi8_epi16(lo16) : _mm256_cvtepu8_epi16(lo16);
    __m256i b = is_signed ? _mm256_cvtepi8_epi16(hi16) : _mm256_cvtepu8_epi16(hi16);
    *p1 = _mm256_madd_epi16(b, _mm256_loadu_si256((const __m256i*)(x + 16)));
    return _mm256_madd_epi16(a, _mm256_loadu_si256((const __m256i*)x));
}

/* Any type, through the 32-code unit view. */
STER_AVX2_INLINE float ster_row_dot16_t(const int type, const uint8_t* row, int nb, const int16_t* x,
                                        const float* dx, const float* xs16) {
    const int ts = ster_type_size(type), bs = ster_block_size(type);
    const int per16 = (type == STER_Q2_K || type == STER_Q3_K || type == STER_Q6_K);
    const int offset = (type == STER_Q4_1 || type == STER_Q5_1 || type == STER_Q2_K ||
                        type == STER_Q4_K || type == STER_Q5_K);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float macc = 0.0f, s[16], m[16];
    int b, u, nu;
    for (b = 0; b < nb; b++) {
        const uint8_t* blk = row + (size_t)b * ts;
        const int g0 = b * (bs / 32);
        nu = ster_block_scales_avx2(type, blk, s, m);
        for (u = 0; u < nu; u++) {
            const int g = g0 + u;
            __m256i q = ster_codes_avx2(type, blk, u), p1;
            __m256i p0 = ster_madd32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1), x + 32 * g, 1, &p1);
            if (per16) {
                acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(s[2 * u] * dx[g]), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(s[2 * u + 1] * dx[g]), acc1);
            } else if (u & 1) {
                acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), _mm256_set1_ps(s[2 * u] * dx[g]), acc1);
            } else {
                acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), _mm256_set1_ps(s[2 * u] * dx[g]), acc0);
            }
            if (offset) macc += m[2 * u] * xs16[2 * g] + m[2 * u + 1] * xs16[2 * g + 1];
        }
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) + macc;
}

#define STER_DOT16_FN(NAME, TYPE) \
    static STER_AVX2 float NAME(const uint8_t* row, int nb, const int16_t* x, const float* dx, const float* xs16) { \
        return ster_row_dot16_t(TYPE, row, nb, x, dx, xs16); }
STER_DOT16_FN(ster_dot16_q2_k, STER_Q2_K)
STER_DOT16_FN(ster_dot16_q3_k, STER_Q3_K)
STER_DOT16_FN(ster_dot16_iq4_nl, STER_IQ4_NL)
STER_DOT16_FN(ster_dot16_iq4_xs, STER_IQ4_XS)

/* Per-32 sums of the quantized inputs of one 256-block, in order: from xs16[16]. */
STER_AVX2_INLINE __m256 ster_xs32(const float* xs16) {
    __m256 h = _mm256_hadd_ps(_mm256_loadu_ps(xs16), _mm256_loadu_ps(xs16 + 8));   /* 0 1 4 5 | 2 3 6 7 */
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(h), 0xD8));
}

/* Legacy 32-weight blocks with nibbles. The 16 bytes are widened to words once: a word's
 * low nibble is weight l and the rest (never above 15) weight l + 16, so one mask and one
 * shift give both halves as int16 for vpmaddwd (widening each half of the nibbles
 * separately measured 1.4-1.5x slower). Fifth bits: a 4 KiB table, byte of qh -> 8 words
 * of 16 or 0. Q4_0 and Q5_0 then subtract their offsets (8, 16) as words, so they need no
 * sum-of-inputs term; Q4_1 / Q5_1 keep codes 0..15 / 0..31 and their block minimum goes
 * to that term. */
STER_AVX2_INLINE __m256 ster_legacy16_block_x(const int type, const uint8_t* blk, __m256i x0, __m256i x1);

STER_AVX2_INLINE __m256 ster_legacy16_block(const int type, const uint8_t* blk, const int16_t* x) {
    return ster_legacy16_block_x(type, blk, _mm256_loadu_si256((const __m256i*)x),
                                 _mm256_loadu_si256((const __m256i*)(x + 16)));
}

/* The same with the block's 32 inputs already in registers (x0: 0..15, x1: 16..31). */
STER_AVX2_INLINE __m256 ster_legacy16_block_x(const int type, const uint8_t* blk, __m256i x0, __m256i x1) {
    const uint8_t* qs = blk + (type == STER_Q4_0 ? 2 : type == STER_Q4_1 ? 4 : type == STER_Q5_0 ? 6 : 8);
    __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)qs));
    __m256i lo = _mm256_and_si256(w, _mm256_set1_epi16(15)), hi = _mm256_srli_epi16(w, 4);
    if (type == STER_Q5_0 || type == STER_Q5_1) {
        const uint8_t* qh = blk + (type == STER_Q5_0 ? 2 : 4);
        lo = _mm256_or_si256(lo, _mm256_set_m128i(_mm_load_si128((const __m128i*)ster_q5_words[qh[1]]),
                                                  _mm_load_si128((const __m128i*)ster_q5_words[qh[0]])));
        hi = _mm256_or_si256(hi, _mm256_set_m128i(_mm_load_si128((const __m128i*)ster_q5_words[qh[3]]),
                                                  _mm_load_si128((const __m128i*)ster_q5_words[qh[2]])));
    }
    if (type == STER_Q4_0 || type == STER_Q5_0) {
        const __m256i off = _mm256_set1_epi16(type == STER_Q4_0 ? 8 : 16);
        lo = _mm256_sub_epi16(lo, off);
        hi = _mm256_sub_epi16(hi, off);
    }
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(lo, x0), _mm256_madd_epi16(hi, x1)));
}

STER_AVX2_INLINE float ster_legacy16_offset(const int type, const uint8_t* blk, float xsum) {
    (void)type;
    return ster_f16_avx2(blk + 2) * xsum;   /* Q4_1 / Q5_1: the block minimum */
}

STER_AVX2_INLINE float ster_dot16_legacy(const int type, const uint8_t* row, int nb, const int16_t* x,
                                         const float* dx, const float* xs16) {
    /* Two blocks per iteration with their own accumulators (FMA latency); pointers that
     * advance. (Eight blocks with their scales gathered into one vector measured slower.)
     * Q4_1 / Q5_1: the two blocks' (scale, minimum) pairs are converted in one vcvtph2ps
     * and multiplied by (dx, sum of the 32 inputs) in one vmulps: lanes 0 and 2 are the
     * blocks' factors, lanes 1 and 3 their offset terms, summed in a vector. */
    const size_t ts = (size_t)ster_type_size(type);
    const int offset = (type == STER_Q4_1 || type == STER_Q5_1);
    const uint8_t* k = row;
    const uint8_t* end2 = row + (size_t)(nb & ~1) * ts;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 macc = _mm_setzero_ps();
    float mtail = 0.0f;
    for (; k < end2; k += 2 * ts, x += 64, dx += 2, xs16 += 4) {
        __m256 f0, f1;
        if (offset) {
            uint32_t a, b;
            memcpy(&a, k, 4);
            memcpy(&b, k + ts, 4);
            __m128 dm = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)a), (int)b, 1));
            __m128 s = _mm_loadu_ps(xs16);
            __m128 dxs = _mm_unpacklo_ps(_mm_castpd_ps(_mm_load_sd((const double*)dx)), _mm_hadd_ps(s, s));
            __m128 f = _mm_mul_ps(dm, dxs);
            macc = _mm_add_ps(macc, f);
            f0 = _mm256_broadcastss_ps(f);
            f1 = _mm256_broadcastss_ps(_mm_movehl_ps(f, f));
        } else {   /* (the same pairing for the scales alone measured no faster) */
            f0 = _mm256_set1_ps(ster_f16_avx2(k) * dx[0]);
            f1 = _mm256_set1_ps(ster_f16_avx2(k + ts) * dx[1]);
        }
        acc0 = _mm256_fmadd_ps(ster_legacy16_block(type, k, x), f0, acc0);
        acc1 = _mm256_fmadd_ps(ster_legacy16_block(type, k + ts, x + 32), f1, acc1);
    }
    if (nb & 1) {
        float d0 = ster_f16_avx2(k);
        acc0 = _mm256_fmadd_ps(ster_legacy16_block(type, k, x), _mm256_set1_ps(d0 * dx[0]), acc0);
        if (offset) mtail = ster_legacy16_offset(type, k, xs16[0] + xs16[1]);
    }
    /* lanes 1 and 3 of macc: (even blocks' offsets + the tail's) + odd blocks' offsets */
    __m128 odd = _mm_movehdup_ps(macc);
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) + ((_mm_cvtss_f32(odd) + mtail) + _mm_cvtss_f32(_mm_movehl_ps(odd, odd)));
}

/* Two rows of a legacy type at once (rows of a few hundred inputs spend a visible part of
 * their time outside the block loop): one block of each per iteration, the inputs loaded
 * once for both, the two blocks' scales (and minimums) converted in one vcvtph2ps, one
 * horizontal sum for both rows. Each row's sums run in the order ster_dot16_legacy uses
 * (even blocks in one accumulator, odd in another), so the results are the same bits. */
STER_AVX2_INLINE void ster_dot16_legacy_x2(const int type, const uint8_t* ra, const uint8_t* rb, int nb,
                                           const int16_t* x, const float* dx, const float* xs16, float* ya, float* yb) {
    const size_t ts = (size_t)ster_type_size(type);
    const int offset = (type == STER_Q4_1 || type == STER_Q5_1);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    /* offsets (lanes 1 and 3: rows a and b) of even blocks (the odd-length tail last among
     * them, as in ster_dot16_legacy) and of odd blocks */
    __m128 me = _mm_setzero_ps(), mo = _mm_setzero_ps();
    int i;
    for (i = 0; i < nb; i++, x += 32, xs16 += 2) {
        const uint8_t* ka = ra + (size_t)i * ts;
        const uint8_t* kb = rb + (size_t)i * ts;
        __m256i x0 = _mm256_loadu_si256((const __m256i*)x), x1 = _mm256_loadu_si256((const __m256i*)(x + 16));
        __m256 fa, fb;
        if (offset) {
            uint32_t u, v;
            memcpy(&u, ka, 4);
            memcpy(&v, kb, 4);
            __m128 dm = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)u), (int)v, 1));
            __m128 f = _mm_mul_ps(dm, _mm_blend_ps(_mm_set1_ps(dx[i]), _mm_set1_ps(xs16[0] + xs16[1]), 0xA));
            if (i & 1) mo = _mm_add_ps(mo, f);
            else me = _mm_add_ps(me, f);
            fa = _mm256_broadcastss_ps(f);
            fb = _mm256_broadcastss_ps(_mm_movehl_ps(f, f));
        } else {
            fa = _mm256_set1_ps(ster_f16_avx2(ka) * dx[i]);
            fb = _mm256_set1_ps(ster_f16_avx2(kb) * dx[i]);
        }
        if (i & 1) {
            a1 = _mm256_fmadd_ps(ster_legacy16_block_x(type, ka, x0, x1), fa, a1);
            b1 = _mm256_fmadd_ps(ster_legacy16_block_x(type, kb, x0, x1), fb, b1);
        } else {
            a0 = _mm256_fmadd_ps(ster_legacy16_block_x(type, ka, x0, x1), fa, a0);
            b0 = _mm256_fmadd_ps(ster_legacy16_block_x(type, kb, x0, x1), fb, b0);
        }
    }
    __m128 m = _mm_add_ps(me, mo);   /* even (tail included) + odd, per lane */
    *ya = ster_hsum8(_mm256_add_ps(a0, a1)) + _mm_cvtss_f32(_mm_movehdup_ps(m));
    *yb = ster_hsum8(_mm256_add_ps(b0, b1)) + _mm_cvtss_f32(_mm_movehdup_ps(_mm_movehl_ps(m, m)));
}

/* MXFP4: the 16 code bytes' low nibbles (weights 0..15) and high nibbles (16..31) index the
 * E2M1 table with vpshufb, giving int8 codes -12..12 that are widened to words for vpmaddwd.
 * The block scale is a power of two (E8M0), so scale * dx is exact. Even blocks and odd blocks
 * have their own accumulators (FMA latency), in the one- and the two-row kernel alike, so the
 * two give the same bits. */
STER_AVX2_INLINE __m256 ster_mxfp4_16_block(const uint8_t* blk, __m256i x0, __m256i x1) {
    const __m128i tbl = _mm_loadu_si128((const __m128i*)ster_mxfp4_values), m15 = _mm_set1_epi8(0x0F);
    __m128i b = _mm_loadu_si128((const __m128i*)(blk + 1));
    __m128i lo = _mm_shuffle_epi8(tbl, _mm_and_si128(b, m15));
    __m128i hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(b, 4), m15));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(lo), x0),
                                               _mm256_madd_epi16(_mm256_cvtepi8_epi16(hi), x1)));
}

static STER_AVX2 float ster_dot16_mxfp4(const uint8_t* row, int nb, const int16_t* x, const float* dx,
                                        const float* xs16) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i;
    (void)xs16;
    for (i = 0; i + 1 < nb; i += 2) {
        const uint8_t* k = row + (size_t)i * 17;
        const int16_t* xi = x + 32 * i;
        acc0 = _mm256_fmadd_ps(ster_mxfp4_16_block(k, _mm256_loadu_si256((const __m256i*)xi),
                                                   _mm256_loadu_si256((const __m256i*)(xi + 16))),
                               _mm256_set1_ps(ster_e8m0_half(k[0]) * dx[i]), acc0);
        acc1 = _mm256_fmadd_ps(ster_mxfp4_16_block(k + 17, _mm256_loadu_si256((const __m256i*)(xi + 32)),
                                                   _mm256_loadu_si256((const __m256i*)(xi + 48))),
                               _mm256_set1_ps(ster_e8m0_half(k[17]) * dx[i + 1]), acc1);
    }
    if (nb & 1) {
        const uint8_t* k = row + (size_t)i * 17;
        acc0 = _mm256_fmadd_ps(ster_mxfp4_16_block(k, _mm256_loadu_si256((const __m256i*)(x + 32 * i)),
                                                   _mm256_loadu_si256((const __m256i*)(x + 32 * i + 16))),
                               _mm256_set1_ps(ster_e8m0_half(k[0]) * dx[i]), acc0);
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1));
}

/* Two MXFP4 rows at once, the inputs loaded once for both (as ster_dot16_legacy_x2). */
static STER_AVX2 void ster_dot16x2_mxfp4(const uint8_t* ra, const uint8_t* rb, int nb, const int16_t* x,
                                         const float* dx, const float* xs16, float* ya, float* yb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    int i;
    (void)xs16;
    for (i = 0; i < nb; i++, x += 32) {
        const uint8_t* ka = ra + (size_t)i * 17;
        const uint8_t* kb = rb + (size_t)i * 17;
        __m256i x0 = _mm256_loadu_si256((const __m256i*)x), x1 = _mm256_loadu_si256((const __m256i*)(x + 16));
        __m256 fa = _mm256_set1_ps(ster_e8m0_half(ka[0]) * dx[i]), fb = _mm256_set1_ps(ster_e8m0_half(kb[0]) * dx[i]);
        if (i & 1) {
            a1 = _mm256_fmadd_ps(ster_mxfp4_16_block(ka, x0, x1), fa, a1);
            b1 = _mm256_fmadd_ps(ster_mxfp4_16_block(kb, x0, x1), fb, b1);
        } else {
            a0 = _mm256_fmadd_ps(ster_mxfp4_16_block(ka, x0, x1), fa, a0);
            b0 = _mm256_fmadd_ps(ster_mxfp4_16_block(kb, x0, x1), fb, b0);
        }
    }
    *ya = ster_hsum8(_mm256_add_ps(a0, a1));
    *yb = ster_hsum8(_mm256_add_ps(b0, b1));
}

typedef void (*ster_dot16x2_fn)(const uint8_t*, const uint8_t*, int, const int16_t*, const float*, const float*,
                                float*, float*);
#define STER_DOT16X2_FN(NAME, TYPE) \
    static STER_AVX2 void NAME(const uint8_t* a, const uint8_t* b, int nb, const int16_t* x, const float* dx, \
                               const float* xs, float* ya, float* yb) { \
        ster_dot16_legacy_x2(TYPE, a, b, nb, x, dx, xs, ya, yb); }
STER_DOT16X2_FN(ster_dot16x2_q4_0, STER_Q4_0)
STER_DOT16X2_FN(ster_dot16x2_q4_1, STER_Q4_1)
STER_DOT16X2_FN(ster_dot16x2_q5_0, STER_Q5_0)
STER_DOT16X2_FN(ster_dot16x2_q5_1, STER_Q5_1)

/* The two-row kernel of a type, or NULL (one row at a time). */
static ster_dot16x2_fn ster_dot16x2_for(int type) {
    switch (type) {
    case STER_Q4_0: return ster_dot16x2_q4_0; case STER_Q4_1: return ster_dot16x2_q4_1;
    case STER_Q5_0: return ster_dot16x2_q5_0; case STER_Q5_1: return ster_dot16x2_q5_1;
    case STER_MXFP4: return ster_dot16x2_mxfp4;
    }
    return 0;
}

static STER_AVX2 float ster_dot16_q4_0(const uint8_t* r, int nb, const int16_t* x, const float* dx, const float* xs) {
    return ster_dot16_legacy(STER_Q4_0, r, nb, x, dx, xs); }
static STER_AVX2 float ster_dot16_q4_1(const uint8_t* r, int nb, const int16_t* x, const float* dx, const float* xs) {
    return ster_dot16_legacy(STER_Q4_1, r, nb, x, dx, xs); }
static STER_AVX2 float ster_dot16_q5_0(const uint8_t* r, int nb, const int16_t* x, const float* dx, const float* xs) {
    return ster_dot16_legacy(STER_Q5_0, r, nb, x, dx, xs); }
static STER_AVX2 float ster_dot16_q5_1(const uint8_t* r, int nb, const int16_t* x, const float* dx, const float* xs) {
    return ster_dot16_legacy(STER_Q5_1, r, nb, x, dx, xs); }

STER_AVX2_INLINE __m256 ster_q8_16_block(const uint8_t* blk, const int16_t* x) {
    __m256i p1, p0 = ster_madd32(_mm_loadu_si128((const __m128i*)(blk + 2)),
                                 _mm_loadu_si128((const __m128i*)(blk + 18)), x, 1, &p1);
    return _mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1));
}

static STER_AVX2 float ster_dot16_q8_0(const uint8_t* row, int nb, const int16_t* x, const float* dx, const float* xs16) {
    const uint8_t* k = row;
    const uint8_t* end2 = row + (size_t)(nb & ~1) * 34;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    (void)xs16;
    for (; k < end2; k += 68, x += 64, dx += 2) {
        acc0 = _mm256_fmadd_ps(ster_q8_16_block(k, x), _mm256_set1_ps(ster_f16_avx2(k) * dx[0]), acc0);
        acc1 = _mm256_fmadd_ps(ster_q8_16_block(k + 34, x + 32), _mm256_set1_ps(ster_f16_avx2(k + 34) * dx[1]), acc1);
    }
    if (nb & 1) acc0 = _mm256_fmadd_ps(ster_q8_16_block(k, x), _mm256_set1_ps(ster_f16_avx2(k) * dx[0]), acc0);
    return ster_hsum8(_mm256_add_ps(acc0, acc1));
}

/* Q4_K / Q5_K: the eight 6-bit scales and mins of a block (12 packed bytes) as floats. The
 * bit layout: sub-blocks 0-3 keep the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
 * sub-blocks 4-7 take their low 4 bits from bytes 8-11 and their top 2 bits from the top
 * bits of bytes 0-3 (scales) and 4-7 (mins). */
STER_AVX2_INLINE void ster_k4_scales(const uint8_t* p, __m256* sc, __m256* mn) {
    uint32_t a, b, c;
    memcpy(&a, p, 4); memcpy(&b, p + 4, 4); memcpy(&c, p + 8, 4);
    const uint32_t sc_lo = a & 0x3F3F3F3Fu, sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
    const uint32_t mn_lo = b & 0x3F3F3F3Fu, mn_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
    __m128i v = _mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo);
    *sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    *mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
}

#define STER_LANE(v, i) _mm256_permutevar8x32_ps((v), _mm256_set1_epi32(i))

/* A Q4_K / Q5_K block (d, dmin, packed scales first): the eight factors d * scale * dx of
 * its sub-blocks, and dmin * min * (per-32 input sum) added to *macc. */
STER_AVX2_INLINE __m256 ster_k4_factors(const uint8_t* blk, const float* dx, const float* xs16, __m256* macc) {
    __m256 sc, mn;
    ster_k4_scales(blk + 4, &sc, &mn);
    *macc = _mm256_fmadd_ps(_mm256_mul_ps(mn, _mm256_set1_ps(ster_f16_avx2(blk + 2))), ster_xs32(xs16), *macc);
    return _mm256_mul_ps(_mm256_mul_ps(sc, _mm256_set1_ps(ster_f16_avx2(blk))), _mm256_loadu_ps(dx));
}

/* Q4_K: chunk c's 32 bytes are sub-block 2c (low nibbles) and 2c + 1 (high nibbles). The
 * eight factors d * scale * dx of a block are one vector (a lane broadcast per sub-block),
 * and its mins meet the per-32 input sums in one vector FMA. */
static STER_AVX2 float ster_dot16_q4_k(const uint8_t* row, int nb, const int16_t* x, const float* dx,
                                       const float* xs16) {
    const __m256i m15 = _mm256_set1_epi16(15);   /* on nibble bytes widened to words, as the legacy types */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    int b;
    for (b = 0; b < nb; b++, x += 256, dx += 8, xs16 += 16) {
        const uint8_t* blk = row + (size_t)b * 144;
        const __m256 f = ster_k4_factors(blk, dx, xs16, &macc);
#define STER_Q4K_CHUNK(c) { \
            __m256i w0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(blk + 16 + 32 * (c)))); \
            __m256i w1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(blk + 32 + 32 * (c)))); \
            const int16_t* xc = x + 64 * (c); \
            __m256i p0 = _mm256_madd_epi16(_mm256_and_si256(w0, m15), _mm256_loadu_si256((const __m256i*)xc)); \
            __m256i p1 = _mm256_madd_epi16(_mm256_and_si256(w1, m15), _mm256_loadu_si256((const __m256i*)(xc + 16))); \
            __m256i r0 = _mm256_madd_epi16(_mm256_srli_epi16(w0, 4), _mm256_loadu_si256((const __m256i*)(xc + 32))); \
            __m256i r1 = _mm256_madd_epi16(_mm256_srli_epi16(w1, 4), _mm256_loadu_si256((const __m256i*)(xc + 48))); \
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), STER_LANE(f, 2 * (c)), acc0); \
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(r0, r1)), STER_LANE(f, 2 * (c) + 1), acc1); }
        STER_Q4K_CHUNK(0) STER_Q4K_CHUNK(1) STER_Q4K_CHUNK(2) STER_Q4K_CHUNK(3)
#undef STER_Q4K_CHUNK
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) - ster_hsum8(macc);
}

/* Q5_K: Q4_K's scales and nibbles (from byte 48) plus a fifth bit per weight: bit u of qh
 * byte l belongs to weight l of unit u. */
static STER_AVX2 float ster_dot16_q5_k(const uint8_t* row, int nb, const int16_t* x, const float* dx,
                                       const float* xs16) {
    const __m256i m15 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    int b;
    for (b = 0; b < nb; b++, x += 256, dx += 8, xs16 += 16) {
        const uint8_t* blk = row + (size_t)b * 176;
        const __m256 f = ster_k4_factors(blk, dx, xs16, &macc);
        const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 16));
#define STER_Q5K_UNIT(u, Q, A) { \
            __m256i t = _mm256_and_si256(_mm256_srli_epi16(qh, (u)), one); \
            __m256i c5 = _mm256_or_si256(Q, _mm256_slli_epi16(t, 4)); \
            __m256i p1, p0 = ster_madd32(_mm256_castsi256_si128(c5), _mm256_extracti128_si256(c5, 1), x + 32 * (u), 0, &p1); \
            A = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), STER_LANE(f, (u)), A); }
#define STER_Q5K_CHUNK(c) { \
            const __m256i q = _mm256_loadu_si256((const __m256i*)(blk + 48 + 32 * (c))); \
            STER_Q5K_UNIT(2 * (c), _mm256_and_si256(q, m15), acc0) \
            STER_Q5K_UNIT(2 * (c) + 1, _mm256_and_si256(_mm256_srli_epi16(q, 4), m15), acc1) }
        STER_Q5K_CHUNK(0) STER_Q5K_CHUNK(1) STER_Q5K_CHUNK(2) STER_Q5K_CHUNK(3)
#undef STER_Q5K_CHUNK
#undef STER_Q5K_UNIT
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) - ster_hsum8(macc);
}

/* Q6_K: unit u = 4h + j (32 weights) takes the low (j < 2) or high nibbles of ql bytes
 * 64h + 32(j & 1) .. +31 and bits 2j, 2j + 1 of qh bytes 32h .. 32h + 31; codes 0..63 are
 * multiplied unsigned and the -32 goes to the sum-of-inputs term. Sub-block (16 weights)
 * i has the int8 scale sc[i]: its factor d * sc[i] * dx[i / 2] is a lane of fa (i < 8) or
 * fb. */
static STER_AVX2 float ster_dot16_q6_k(const uint8_t* row, int nb, const int16_t* x, const float* dx,
                                       const float* xs16) {
    const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    const __m256i pair_lo = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0), pair_hi = _mm256_set_epi32(7, 7, 6, 6, 5, 5, 4, 4);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    int b;
    for (b = 0; b < nb; b++, x += 256, dx += 8, xs16 += 16) {
        const uint8_t* blk = row + (size_t)b * 210;
        const __m256 d = _mm256_set1_ps(ster_f16_avx2(blk + 208));
        const __m256 sa = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 192)))));
        const __m256 sb = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 200)))));
        const __m256 dxv = _mm256_loadu_ps(dx);
        const __m256 fa = _mm256_mul_ps(sa, _mm256_permutevar8x32_ps(dxv, pair_lo));
        const __m256 fb = _mm256_mul_ps(sb, _mm256_permutevar8x32_ps(dxv, pair_hi));
        macc = _mm256_fmadd_ps(sa, _mm256_loadu_ps(xs16), macc);
        macc = _mm256_fmadd_ps(sb, _mm256_loadu_ps(xs16 + 8), macc);
#define STER_Q6K_UNIT(h, j, F, L) { \
            __m256i q = _mm256_loadu_si256((const __m256i*)(blk + 64 * (h) + 32 * ((j) & 1))); \
            q = _mm256_and_si256((j) < 2 ? q : _mm256_srli_epi16(q, 4), m15); \
            __m256i t = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * (j)), m3); \
            q = _mm256_or_si256(q, _mm256_slli_epi16(t, 4)); \
            __m256i p1, p0 = ster_madd32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1), \
                                         x + 128 * (h) + 32 * (j), 0, &p1); \
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), STER_LANE(F, 2 * (L)), acc0); \
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), STER_LANE(F, 2 * (L) + 1), acc1); }
        {
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 128));
            STER_Q6K_UNIT(0, 0, fa, 0) STER_Q6K_UNIT(0, 1, fa, 1) STER_Q6K_UNIT(0, 2, fa, 2) STER_Q6K_UNIT(0, 3, fa, 3)
        }
        {
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 160));
            STER_Q6K_UNIT(1, 0, fb, 0) STER_Q6K_UNIT(1, 1, fb, 1) STER_Q6K_UNIT(1, 2, fb, 2) STER_Q6K_UNIT(1, 3, fb, 3)
        }
#undef STER_Q6K_UNIT
    }
    return ster_hsum8(_mm256_add_ps(acc0, acc1)) - 32.0f * ster_hsum8(macc);
}
#undef STER_LANE

typedef float (*ster_dot16_fn)(const uint8_t*, int, const int16_t*, const float*, const float*);

static ster_dot16_fn ster_dot16_for(int type) {
    switch (type) {
    case STER_Q4_0: return ster_dot16_q4_0; case STER_Q4_1: return ster_dot16_q4_1;
    case STER_Q5_0: return ster_dot16_q5_0; case STER_Q5_1: return ster_dot16_q5_1;
    case STER_Q8_0: return ster_dot16_q8_0; case STER_Q2_K: return ster_dot16_q2_k;
    case STER_Q3_K: return ster_dot16_q3_k; case STER_Q4_K: return ster_dot16_q4_k;
    case STER_Q5_K: return ster_dot16_q5_k; case STER_Q6_K: return ster_dot16_q6_k;
    case STER_IQ4_NL: return ster_dot16_iq4_nl; case STER_IQ4_XS: return ster_dot16_iq4_xs;
    case STER_MXFP4: return ster_dot16_mxfp4;
    }
    return 0;
}

#include "ster_x512.h"
#include "ster_amx.h"

#else
static int ster_cpu_avx2(void) { return 0; }
static int ster_cpu_level(void) { return 0; }
static int ster_cpu_fast_bf16_dot(void) { return 0; }
static void ster_init_tables(void) {}
#endif /* STER_HAVE_X86 */

#include "ster_il16.h"

/* ------------------------------------------------------------------------- */
/* Drivers (called by qmatmul.pyx, one call per thread task)                 */

/* Sums of x over each 16 inputs: xs16[K / 16]. */
static void ster_sums16(const float* x, int K, float* xs16) {
    int i, l;
    for (i = 0; i < K / 16; i++) {
        float s = 0.0f;
        for (l = 0; l < 16; l++) s += x[16 * i + l];
        xs16[i] = s;
    }
}

/* x [K] -> int16 codes q and per-32 scales dx (x ~= dx * q, |q| <= 32767, round to
 * nearest even), plus xs16: sums of dx * q over each 16 inputs. Returns 0 if some block
 * is not finite (the caller then multiplies in float, which propagates inf/NaN). */
#if STER_HAVE_X86
static int ster_quantize16_avx2(const float* x, int K, int16_t* q, float* dx, float* xs16);
#endif

static int ster_quantize16(const float* x, int K, int16_t* q, float* dx, float* xs16) {
    int b, i;
#if STER_HAVE_X86
    if (ster_cpu_avx2()) return ster_quantize16_avx2(x, K, q, dx, xs16);
#endif
    for (b = 0; b < K / 32; b++) {
        const float* xb = x + 32 * b;
        float amax = 0.0f;
        int finite = 1;
        for (i = 0; i < 32; i++) {
            float a = xb[i] < 0 ? -xb[i] : xb[i];
            finite &= (a < INFINITY);   /* false for inf and NaN */
            if (a > amax) amax = a;
        }
        if (!finite) return 0;
        int32_t s0 = 0, s1 = 0;
        if (amax > 0.0f) {
            float inv = 32767.0f / amax;
            dx[b] = amax / 32767.0f;
            for (i = 0; i < 32; i++) {
                long v = lrintf(xb[i] * inv);
                if (v > 32767) v = 32767;
                if (v < -32767) v = -32767;
                q[32 * b + i] = (int16_t)v;
                if (i < 16) s0 += (int32_t)v; else s1 += (int32_t)v;
            }
        } else {
            dx[b] = 0.0f;
            for (i = 0; i < 32; i++) q[32 * b + i] = 0;
        }
        xs16[2 * b] = dx[b] * (float)s0;
        xs16[2 * b + 1] = dx[b] * (float)s1;
    }
    return 1;
}

#if STER_HAVE_X86
/* ster_quantize16 with AVX2: same arithmetic (x * (32767 / amax), rounded to nearest even by
 * cvtps, as lrintf does in the default rounding mode), so identical codes. */
static STER_AVX2 int ster_quantize16_avx2(const float* x, int K, int16_t* q, float* dx, float* xs16) {
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    int b;
    for (b = 0; b < K / 32; b++) {
        const float* xb = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 a0 = _mm256_andnot_ps(sign, v0), a1 = _mm256_andnot_ps(sign, v1);
        __m256 a2 = _mm256_andnot_ps(sign, v2), a3 = _mm256_andnot_ps(sign, v3);
        __m256 bad = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(a0, inf, _CMP_NLT_UQ), _mm256_cmp_ps(a1, inf, _CMP_NLT_UQ)),
                                  _mm256_or_ps(_mm256_cmp_ps(a2, inf, _CMP_NLT_UQ), _mm256_cmp_ps(a3, inf, _CMP_NLT_UQ)));
        if (_mm256_movemask_ps(bad)) return 0;   /* inf or NaN */
        __m256 m = _mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        int16_t* qb = q + 32 * b;
        if (amax > 0.0f) {
            const __m256 inv = _mm256_set1_ps(32767.0f / amax);
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
            /* packs interleaves 128-bit lanes; permute restores the order */
            __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8);
            __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i2, i3), 0xD8);
            _mm256_storeu_si256((__m256i*)qb, p01);
            _mm256_storeu_si256((__m256i*)(qb + 16), p23);
            __m256i s01 = _mm256_add_epi32(i0, i1), s23 = _mm256_add_epi32(i2, i3);
            __m128i t0 = _mm_add_epi32(_mm256_castsi256_si128(s01), _mm256_extracti128_si256(s01, 1));
            __m128i t1 = _mm_add_epi32(_mm256_castsi256_si128(s23), _mm256_extracti128_si256(s23, 1));
            t0 = _mm_hadd_epi32(t0, t1);
            t0 = _mm_hadd_epi32(t0, t0);
            dx[b] = amax / 32767.0f;
            xs16[2 * b] = dx[b] * (float)_mm_cvtsi128_si32(t0);
            xs16[2 * b + 1] = dx[b] * (float)_mm_extract_epi32(t0, 1);
        } else {
            _mm256_storeu_si256((__m256i*)qb, _mm256_setzero_si256());
            _mm256_storeu_si256((__m256i*)(qb + 16), _mm256_setzero_si256());
            dx[b] = 0.0f;
            xs16[2 * b] = xs16[2 * b + 1] = 0.0f;
        }
    }
    return 1;
}
#endif

#define STER_PF_ROWS 2

/* y[r] = row(rows[r]) . (dx * q) for r in [r0, r1), int16-activation kernels (AVX2 and up;
 * level >= STER_ISA_VNNI takes the VNNI row dot where the type has one). */
static void ster_matvec16_range(int type, const uint8_t* W, size_t row_bytes, const int32_t* rows, int r0, int r1,
                                int K, const int16_t* q, const float* dx, const float* xs16, float* y, int level) {
#if STER_HAVE_X86
    if (type & STER_IL) {
        ster_il_matvec16(type & ~STER_IL, W, row_bytes, r0, r1, K, q, dx, xs16, y, level);
        return;
    }
    int nb = K / ster_block_size(type), r;
    size_t c;
    ster_dot16_fn vnni = level >= STER_ISA_VNNI ? ster_dot16_vnni_for(type) : 0;
    ster_dot16_fn dot = vnni ? vnni : ster_dot16_for(type);
    /* Decoding streams every weight from memory once: the row STER_PF_ROWS ahead is
     * prefetched while this one is multiplied, so each chunk does not wait for the
     * hardware prefetcher to notice its stream (loads of the weights were the stalls). */
    ster_dot16x2_fn dot2 = vnni ? 0 : ster_dot16x2_for(type);
#define STER_ROW(i) (W + (size_t)(rows ? rows[i] : (i)) * row_bytes)
    for (r = r0; r < r1;) {
        const int n = dot2 && r + 1 < r1 ? 2 : 1, last = r + n - 1 + STER_PF_ROWS;
        int a;
        for (a = r + STER_PF_ROWS; a <= last && a < r1; a++)
            for (c = 0; c < row_bytes; c += 64) _mm_prefetch((const char*)STER_ROW(a) + c, _MM_HINT_T0);
        if (n == 2) dot2(STER_ROW(r), STER_ROW(r + 1), nb, q, dx, xs16, y + r, y + r + 1);
        else y[r] = dot(STER_ROW(r), nb, q, dx, xs16);
        r += n;
    }
#undef STER_ROW
#else
    (void)type; (void)W; (void)row_bytes; (void)rows; (void)r0; (void)r1; (void)K; (void)q; (void)dx; (void)xs16; (void)y;
    (void)level;
#endif
}

/* y[r] = row(rows[r]) . x for r in [r0, r1); rows NULL means the identity. simd is the
 * instruction-set level (STER_ISA_*). xbf: NULL, or for bfloat16 weights at level
 * STER_ISA_BF16 the input split by ster_split_bf16 (hi at xbf, lo at xbf + K), which the
 * vdpbf16ps row dots multiply instead of x. */
static void ster_matvec_range(int type, const uint8_t* W, size_t row_bytes, const int32_t* rows, int r0, int r1,
                              int K, const float* x, const float* xs16, float* y, int simd, const uint16_t* xbf) {
    if (type & STER_IL) {   /* each row back in the file layout, then its row dot as below */
        uint8_t* buf = (uint8_t*)malloc(row_bytes);
        int r;
        type &= ~STER_IL;
        if (!buf) {   /* out of memory: NaN rather than a wrong number */
            for (r = r0; r < r1; r++) y[r] = NAN;
            return;
        }
        for (r = r0; r < r1; r++) {
            ster_il_row(type, W, row_bytes, r, 0, (int)(row_bytes / (size_t)ster_type_size(type)), buf);
            ster_matvec_range(type, buf, row_bytes, 0, 0, 1, K, x, xs16, y + r, simd, xbf);
        }
        free(buf);
        return;
    }
    int nb = K / ster_block_size(type), r;
#if STER_HAVE_X86
    if (type == STER_BF16 && xbf && simd >= STER_ISA_BF16) {
        for (r = r0; r < r1; r++) {
            const uint8_t* row = W + (size_t)(rows ? rows[r] : r) * row_bytes;
            if (r + 2 < r1)   /* the weights stream from memory once: prefetch two rows ahead */
                for (size_t c = 0; c < row_bytes; c += 64)
                    _mm_prefetch((const char*)W + (size_t)(rows ? rows[r + 2] : r + 2) * row_bytes + c, _MM_HINT_T0);
            y[r] = ster_dot_bf16_dp(row, K, xbf, xbf + K);
        }
        return;
    }
    if (simd) {
        ster_dot_fn dot = simd >= STER_ISA_AVX512 && ster_dot_x512_for(type) ? ster_dot_x512_for(type)
                                                                             : ster_dot_avx2_for(type);
        const int half = ster_is_half(type);
        for (r = r0; r < r1; r++) {
            if (half && r + 2 < r1)
                for (size_t c = 0; c < row_bytes; c += 64)
                    _mm_prefetch((const char*)W + (size_t)(rows ? rows[r + 2] : r + 2) * row_bytes + c, _MM_HINT_T0);
            y[r] = dot(W + (size_t)(rows ? rows[r] : r) * row_bytes, nb, x, xs16);
        }
        return;
    }
#endif
    (void)xs16; (void)simd; (void)xbf;
    for (r = r0; r < r1; r++)
        y[r] = ster_row_dot_scalar(type, W + (size_t)(rows ? rows[r] : r) * row_bytes, nb, x);
}

#if STER_HAVE_X86
/* Panel p's pairs for ster_micro_bf16dp: lane rr of pair j = row n0 + 16p + rr's bfloat16
 * weights kc0 + 2j, kc0 + 2j + 1 as one 32-bit word; rows past n1 and an odd last input
 * are zero. */
static void ster_pack_bf16_pairs(const uint8_t* W, size_t row_bytes, const int32_t* rows, int n0, int n1, int p,
                                 int kc0, int kcl, uint32_t* P) {
    const int kp = (kcl + 1) / 2;
    int rr, j;
    for (rr = 0; rr < STER_NR; rr++) {
        const int n = n0 + STER_NR * p + rr;
        if (n < n1) {
            const uint8_t* src = W + (size_t)(rows ? rows[n] : n) * row_bytes + (size_t)kc0 * 2;
            for (j = 0; j < kcl / 2; j++) memcpy(P + (size_t)j * STER_NR + rr, src + 4 * j, 4);
            if (kcl & 1) {
                uint16_t last;
                memcpy(&last, src + 2 * (kcl - 1), 2);
                P[(size_t)(kp - 1) * STER_NR + rr] = last;   /* weight 2j (low half), 0 for 2j + 1 */
            }
        } else {
            for (j = 0; j < kp; j++) P[(size_t)j * STER_NR + rr] = 0;
        }
    }
}
#endif

#ifdef STER_HAVE_AMX
static void ster_amx_decode_rows(int type, int il, const uint8_t* W, size_t row_bytes, const int32_t* rows, int n0,
                                 int n1, int p, int K, uint16_t* Wb) {
    const int bs = ster_block_size(type), ts = ster_type_size(type), first = n0 + STER_NR * p;
    uint8_t ilgrp[STER_ILG][(STER_KC / 32) * 34];   /* an interleaved panel's rows (one group), file layout */
    float tmp[STER_KC];
    ster_dec_fn dec = ster_dec_avx2_for(type);
    int kc0, kcl, rr;
    for (kc0 = 0; kc0 < K; kc0 += STER_KC) {
        kcl = K - kc0 < STER_KC ? K - kc0 : STER_KC;
        if (il) ster_il_ungroup(type, W + (size_t)first * row_bytes, kc0 / bs, kcl / bs, ilgrp[0], sizeof ilgrp[0]);
        for (rr = 0; rr < STER_NR; rr++) {
            const int n = first + rr;
            uint16_t* out = Wb + (size_t)rr * K + kc0;
            if (n < n1) {
                const uint8_t* src = il ? ilgrp[rr] : W + (size_t)(rows ? rows[n] : n) * row_bytes + (size_t)(kc0 / bs) * ts;
                if (dec) dec(src, kcl / bs, tmp); else ster_decode_scalar(type, src, kcl / bs, tmp);
                ster_round_bf16_rows(tmp, 1, kcl, out);
            } else {
                memset(out, 0, (size_t)kcl * 2);
            }
        }
    }
}
#endif

/* The inputs of ster_matmul_range's bfloat16 tile: X [T, K] -> Xb [T, Kp] rounded to nearest
 * even (Kp = K + (K & 1), the pad zero). Only called at STER_ISA_BF16. */
static void ster_round_inputs_bf16(const float* X, int T, int K, uint16_t* Xb) {
#if STER_HAVE_X86
    ster_round_bf16_rows(X, T, K, Xb);
#else
    (void)X; (void)T; (void)K; (void)Xb;
#endif
}

/* Y[t, n] = sum_k X[t, k] W[rows[n], k] for t < T and n in [n0, n1).
 * With STER_IL on type (rows interleaved, ster_il16.h; rows NULL), n0 is a multiple of 16.
 * X: [T, K] (row stride K); Y: row stride ldy; pack: scratch of
 * ceil((n1 - n0) / 16) * STER_KC * 16 floats (32-byte aligned). Xb: NULL, or for a BF16
 * matrix at STER_ISA_BF16 the inputs rounded to bfloat16 by ster_round_bf16_rows ([T, Kp],
 * Kp = K + (K & 1)), which the vdpbf16ps tile then multiplies instead of X. */
static void ster_matmul_range(int type, const uint8_t* W, size_t row_bytes, const int32_t* rows, int n0, int n1,
                              int K, const float* X, int T, float* Y, int ldy, float* pack, int simd,
                              const uint16_t* Xb) {
    const int il = type & STER_IL;
    type &= ~STER_IL;
    const int f32 = type == STER_F32;   /* not a block type: ster_block_size knows nothing of it */
    const int bs = f32 ? 1 : ster_block_size(type), ts = f32 ? 4 : ster_type_size(type);
    uint8_t ilgrp[STER_ILG][(STER_KC / 32) * 34];   /* an interleaved panel's rows (one group), file layout */
    const int npanel = (n1 - n0 + STER_NR - 1) / STER_NR;
    float tmp[STER_KC];
    int kc0, kcl, p, rr, k, t0;
#if STER_HAVE_X86
    ster_dec_fn dec = simd ? ster_dec_avx2_for(type) : 0;
    const int mr = simd >= STER_ISA_AVX512 ? STER_MR512 : STER_MR;
#else
    const int mr = STER_MR;
    (void)simd;
#endif
#if STER_HAVE_X86
#ifdef STER_HAVE_AMX
    /* Xb given: a bfloat16 matrix, or a block type the caller put on the tiles (qmatmul's _rounds_inputs).
     * K: whole tiles; without the tiles' scratch, the vdpbf16ps tile (bfloat16) or float32 tile below */
    if (Xb && !f32 && type != STER_F16 && !(il && type == STER_BF16) && simd >= STER_ISA_AMX && K % 32 == 0 &&
        ster_amx_product(type, il, W, row_bytes, rows, n0, n1, K, Xb, T, Y, ldy))
        return;
#endif
    if (Xb && type == STER_BF16 && !il && simd >= STER_ISA_BF16) {
        const int Kp = K + (K & 1);
        for (kc0 = 0; kc0 < K; kc0 += STER_KC) {
            kcl = K - kc0 < STER_KC ? K - kc0 : STER_KC;
            for (p = 0; p < npanel; p++)
                ster_pack_bf16_pairs(W, row_bytes, rows, n0, n1, p, kc0, kcl, (uint32_t*)(pack + (size_t)p * STER_KC * STER_NR));
            for (t0 = 0; t0 < T; t0 += STER_MR512) {
                const int mt = T - t0 < STER_MR512 ? T - t0 : STER_MR512;
                for (p = 0; p < npanel; p += 2) {   /* panels p and p + 1 at once (p alone if last) */
                    const int two = p + 1 < npanel, nv = n1 - n0 - STER_NR * p;
                    const int nv1 = two ? n1 - n0 - STER_NR * (p + 1) : 0;
                    const uint16_t* P0 = (const uint16_t*)(pack + (size_t)p * STER_KC * STER_NR);
                    ster_micro_bf16dp((kcl + 1) / 2, Xb + (size_t)t0 * Kp + kc0, Kp, mt, P0,
                                      two ? P0 + 2 * STER_KC * STER_NR : P0, Y + (size_t)t0 * ldy + n0 + STER_NR * p,
                                      ldy, nv > STER_NR ? STER_NR : nv, nv1 > STER_NR ? STER_NR : nv1, kc0 > 0);
                    if (!two) break;
                }
            }
        }
        return;
    }
#else
    (void)Xb;
#endif
    for (kc0 = 0; kc0 < K; kc0 += STER_KC) {
        kcl = K - kc0 < STER_KC ? K - kc0 : STER_KC;
        for (p = 0; p < npanel; p++) {
            float* P = pack + (size_t)p * STER_KC * STER_NR;
            const int first = n0 + STER_NR * p;
            if (il)   /* the panel is one group: its 16 rows back in the file layout at once */
                ster_il_ungroup(type, W + (size_t)first * row_bytes, kc0 / bs, kcl / bs, ilgrp[0], sizeof ilgrp[0]);
            for (rr = 0; rr < STER_NR; rr++) {
                int n = first + rr;
                if (n < n1) {
                    const uint8_t* src = W + (size_t)(rows ? rows[n] : n) * row_bytes + (size_t)(kc0 / bs) * ts;
                    if (il) src = ilgrp[rr];
                    if (f32) memcpy(tmp, src, sizeof(float) * (size_t)kcl); else
#if STER_HAVE_X86
                    if (dec) dec(src, kcl / bs, tmp); else
#endif
                    ster_decode_scalar(type, src, kcl / bs, tmp);
                    for (k = 0; k < kcl; k++) P[k * STER_NR + rr] = tmp[k];
                } else {
                    for (k = 0; k < kcl; k++) P[k * STER_NR + rr] = 0.0f;
                }
            }
        }
        for (t0 = 0; t0 < T; t0 += mr) {
            int mt = T - t0 < mr ? T - t0 : mr;
            for (p = 0; p < npanel; p++) {
                int nv = n1 - n0 - STER_NR * p;
                const float* A = X + (size_t)t0 * K + kc0;
                float* C = Y + (size_t)t0 * ldy + n0 + STER_NR * p;
                const float* P = pack + (size_t)p * STER_KC * STER_NR;
                if (nv > STER_NR) nv = STER_NR;
#if STER_HAVE_X86
                if (simd >= STER_ISA_AVX512) {   /* panels p and p + 1 at once (p alone if last) */
                    const int two = p + 1 < npanel, nv1 = two ? n1 - n0 - STER_NR * (p + 1) : 0;
                    ster_micro_x512(kcl, A, K, mt, P, two ? P + STER_KC * STER_NR : P, C, ldy, nv,
                                    nv1 > STER_NR ? STER_NR : nv1, kc0 > 0);
                    p += two;
                    continue;
                }
                if (simd) { ster_micro_avx2(kcl, A, K, mt, P, C, ldy, nv, kc0 > 0); continue; }
#endif
                ster_micro_scalar(kcl, A, K, mt, P, C, ldy, nv, kc0 > 0);
            }
        }
    }
}

#endif /* STER_QKERNELS_H */
