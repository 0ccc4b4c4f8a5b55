/* AVX-512 kernels, chosen at run time beside the AVX2 and portable ones (ster_qkernels.h
 * includes this inside its x86 section; ster_cpu_level says what the CPU runs):
 *
 *   - STER_ISA_AVX512 (F/BW/VL/DQ): 16-bit float row dots sixteen weights per FMA, and the
 *     mat-mat register tile of 12 tokens x 32 outputs (two panels) in zmm registers (the AVX2
 *     tile is 6 x 16 in ymm);
 *   - STER_ISA_VNNI (+ AVX512_VNNI): Q6_K's int16-activation row dot with vpdpwssd: 32
 *     weights' codes (widened to words) times 32 int16 inputs summed in pairs into 16 int32
 *     lanes in one instruction, where AVX2 needs two vpmaddwd and an add (1.2x). The other
 *     types keep their AVX2 row dots at this level: their VNNI versions measured slower
 *     (ster_dot16_vnni_for);
 *   - STER_ISA_BF16 (+ AVX512_BF16): bfloat16 row dots with vdpbf16ps, the input split
 *     into two bfloat16 halves (ster_split_bf16) so that it keeps 16 of float32's 24 bits:
 *     two vdpbf16ps per 32 weights, no widening of the weights; and, for prefill, the
 *     register tile on bfloat16 inputs (ster_micro_bf16dp), when the caller rounds them.
 *
 * Every function computes what its AVX2 counterpart computes (same codes, scales and
 * inputs), with float32 sums in another order; tests/test_qmatmul.py checks each level
 * against the numpy references with the others forced off.
 */
#ifndef STER_X512_H
#define STER_X512_H

#define STER_T512 "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define STER_X512 __attribute__((target(STER_T512)))
#define STER_X512_INLINE static inline __attribute__((always_inline, target(STER_T512)))
#define STER_VNNI __attribute__((target(STER_T512 ",avx512vnni")))
#define STER_VNNI_INLINE static inline __attribute__((always_inline, target(STER_T512 ",avx512vnni")))
#define STER_X512BF16 __attribute__((target(STER_T512 ",avx512vnni,avx512bf16")))

/* ------------------------------------------------------------------------- */
/* 16-bit float rows                                                         */

STER_X512_INLINE __m512 ster_bf16x16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
STER_X512_INLINE __m512 ster_f16x16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }

/* The last n < 16 weights: masked loads (lanes past n are zero in both operands). */
STER_X512_INLINE __m512 ster_half_tail16(int type, const uint16_t* w, const float* x, int n) {
    const __mmask16 m = (__mmask16)((1u << n) - 1u);
    __m256i h = _mm256_maskz_loadu_epi16(m, w);
    __m512 wf = type == STER_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                                  : _mm512_cvtph_ps(h);
    return _mm512_mul_ps(wf, _mm512_maskz_loadu_ps(m, x));
}

#define STER_HALF_DOT_512(NAME, WIDEN, TYPE) \
    static STER_X512 float NAME(const uint8_t* row, int n, const float* x, const float* xs16) { \
        const uint16_t* w = (const uint16_t*)row; \
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps(); \
        int k = 0; \
        (void)xs16; \
        for (; k + 64 <= n; k += 64) { \
            a0 = _mm512_fmadd_ps(WIDEN(w + k), _mm512_loadu_ps(x + k), a0); \
            a1 = _mm512_fmadd_ps(WIDEN(w + k + 16), _mm512_loadu_ps(x + k + 16), a1); \
            a2 = _mm512_fmadd_ps(WIDEN(w + k + 32), _mm512_loadu_ps(x + k + 32), a2); \
            a3 = _mm512_fmadd_ps(WIDEN(w + k + 48), _mm512_loadu_ps(x + k + 48), a3); \
        } \
        for (; k + 16 <= n; k += 16) a0 = _mm512_fmadd_ps(WIDEN(w + k), _mm512_loadu_ps(x + k), a0); \
        if (k < n) a1 = _mm512_add_ps(a1, ster_half_tail16(TYPE, w + k, x + k, n - k)); \
        return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))); \
    }
STER_HALF_DOT_512(ster_dot_bf16_x512, ster_bf16x16, STER_BF16)
STER_HALF_DOT_512(ster_dot_f16_x512, ster_f16x16, STER_F16)
#undef STER_HALF_DOT_512

/* bfloat16 row . (hi + lo): vdpbf16ps multiplies 32 weights by 32 bfloat16 inputs, summing
 * each pair into one of 16 float32 lanes. Weights pair up as stored, so they are used as
 * loaded. Lanes past n are masked to zero in both operands. */
static STER_X512BF16 float ster_dot_bf16_dp(const uint8_t* row, int n, const uint16_t* xh, const uint16_t* xl) {
    const uint16_t* w = (const uint16_t*)row;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int k = 0;
#define STER_BH(p) ((__m512bh)_mm512_loadu_si512((const void*)(p)))
    for (; k + 64 <= n; k += 64) {
        __m512bh w0 = STER_BH(w + k), w1 = STER_BH(w + k + 32);
        a0 = _mm512_dpbf16_ps(a0, w0, STER_BH(xh + k));
        a1 = _mm512_dpbf16_ps(a1, w0, STER_BH(xl + k));
        a2 = _mm512_dpbf16_ps(a2, w1, STER_BH(xh + k + 32));
        a3 = _mm512_dpbf16_ps(a3, w1, STER_BH(xl + k + 32));
    }
#undef STER_BH
    for (; k < n; k += 32) {
        const __mmask32 m = n - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (n - k)) - 1u);
        __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + k);
        a0 = _mm512_dpbf16_ps(a0, wv, (__m512bh)_mm512_maskz_loadu_epi16(m, xh + k));
        a1 = _mm512_dpbf16_ps(a1, wv, (__m512bh)_mm512_maskz_loadu_epi16(m, xl + k));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
}

static ster_dot_fn ster_dot_x512_for(int type) {
    switch (type) {
    case STER_BF16: return ster_dot_bf16_x512;
    case STER_F16: return ster_dot_f16_x512;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* int16-activation row dots with AVX512_VNNI                                 */

/* 32 int16 codes (in input order) . 32 int16 inputs -> 16 int32 pair sums. */
STER_VNNI_INLINE __m512i ster_dpw(__m512i codes, const int16_t* x) {
    return _mm512_dpwssd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512((const void*)x));
}

/* Q6_K: unit u = 4h + j (32 weights): codes 0..63 from the low (j < 2) or high nibbles of
 * ql bytes 64h + 32(j & 1) .. +31 and bits 2j, 2j + 1 of qh bytes 32h .. +31, built as bytes
 * then widened to words for one vpdpwssd; its 16 lanes are sub-blocks 2u (lanes 0-7) and
 * 2u + 1 (lanes 8-15), whose factors d * sc * dx are one permutation of the block's sixteen.
 * The codes' -32 goes to the sum-of-inputs term, as in the AVX2 kernel. */
static STER_VNNI float ster_dot16_q6_k_vnni(const uint8_t* row, int nb, const int16_t* x, const float* dx,
                                            const float* xs16) {
    const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    const __m512i pairs = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), macc = _mm512_setzero_ps();
    int b, h, j;
    for (b = 0; b < nb; b++, x += 256, dx += 8, xs16 += 16) {
        const uint8_t* blk = row + (size_t)b * 210;
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(ster_f16_avx2(blk + 208)),
                                       _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 192)))));
        const __m512 fac = _mm512_mul_ps(s, _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_loadu_ps(dx))));
        macc = _mm512_fmadd_ps(s, _mm512_loadu_ps(xs16), macc);
        for (h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * h));
            for (j = 0; j < 4; j++) {
                const int u = 4 * h + j;
                __m256i q = _mm256_loadu_si256((const __m256i*)(blk + 64 * h + 32 * (j & 1)));
                q = _mm256_and_si256(j < 2 ? q : _mm256_srli_epi16(q, 4), m15);
                __m256i t = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), m3);
                q = _mm256_or_si256(q, _mm256_slli_epi16(t, 4));
                __m512 p = _mm512_cvtepi32_ps(ster_dpw(_mm512_cvtepu8_epi16(q), x + 32 * u));
                __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2 * u)),
                                                 _mm256_set1_epi32(2 * u + 1), 1);
                if (u & 1) acc1 = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(idx, fac), acc1);
                else acc0 = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(idx, fac), acc0);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) - 32.0f * _mm512_reduce_add_ps(macc);
}

/* The VNNI row dot of a type, or NULL (the AVX2 one serves that type at this level).
 * Measured and left out (one thread, 512 x 2048 matrices in cache, against the AVX2 kernels
 * in the same process): zmm VNNI row dots for Q4_0 (0.80x), Q4_1 (0.56x), Q8_0 (0.92x) and
 * Q4_K (0.86x), and a Q4_K with 256-bit vpdpwssd (0.88x); see runbook/performance.md. */
static ster_dot16_fn ster_dot16_vnni_for(int type) {
    return type == STER_Q6_K ? ster_dot16_q6_k_vnni : 0;
}

/* ------------------------------------------------------------------------- */
/* Mat-mat register tile: 12 tokens x 32 outputs                             */

#define STER_MR512 12

/* A 12 x 32 tile's start: row pointers a0..a11 into A (row stride lda; rows t >= mt repeat row
 * mt - 1, computed and dropped) and its 24 accumulators c0..c11 (outputs 0..15), d0..d11 (16..31). */
#define STER_AROW(i) const ELEM_T_* a##i = A + (size_t)((i) < mt ? (i) : mt - 1) * lda;
#define STER_Z2(i) __m512 c##i = _mm512_setzero_ps(), d##i = _mm512_setzero_ps();
#define STER_EACH12(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
/* ... and its end: the accumulators' rows t < mt stored (ster_store_tile512). */
#define STER_TILE512_END { \
        const __m512 acc0[STER_MR512] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11}; \
        const __m512 acc1[STER_MR512] = {d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11}; \
        ster_store_tile512(acc0, acc1, mt, C, ldc, nv0, nv1, accumulate); }
#define STER_TILE512_BEGIN(ELEM) \
    typedef ELEM ELEM_T_; \
    STER_EACH12(STER_AROW) STER_EACH12(STER_Z2)

/* Rows t < mt of a 12 x 32 tile's sums to C (row stride ldc): outputs 0..nv0-1 from acc0,
 * 16..16+nv1-1 from acc1, added to what C holds when accumulate. */
STER_X512_INLINE void ster_store_tile512(const __m512* acc0, const __m512* acc1, int mt, float* C, int ldc,
                                         int nv0, int nv1, int accumulate) {
    const __mmask16 m0 = (__mmask16)((1u << nv0) - 1u), m1 = (__mmask16)((1u << nv1) - 1u);
    int t;
    for (t = 0; t < mt; t++) {
        float* ct = C + (size_t)t * ldc;
        __m512 r0 = acc0[t], r1 = acc1[t];
        if (accumulate) {
            r0 = _mm512_add_ps(r0, _mm512_maskz_loadu_ps(m0, ct));
            r1 = _mm512_add_ps(r1, _mm512_maskz_loadu_ps(m1, ct + STER_NR));
        }
        _mm512_mask_storeu_ps(ct, m0, r0);
        _mm512_mask_storeu_ps(ct + STER_NR, m1, r1);
    }
}

/* C[t, n] (+)= sum_k A[t, k] * B[k, n] for t < mt (<= 12) over two adjacent packed panels
 * B0, B1 ([kc][16] each; outputs 0..15 from B0, 16..31 from B1), as ster_micro_avx2 does
 * with 6 tokens and one panel: 24 zmm accumulators, per k two panel loads and 12 broadcasts
 * for 24 FMAs. (A one-panel tile, 13 loads for 12 FMAs, waited on the two 512-bit loads an
 * Intel core issues per cycle: 1.12-1.32x slower, runbook/performance.md.) nv0 (1..16) and
 * nv1 (0..16) outputs of each panel are stored; a lone last panel passes B1 = B0, nv1 = 0.
 * Rows t >= mt repeat row mt - 1 and are dropped. Each output is one FMA chain over k. */
static STER_X512 void ster_micro_x512(int kc, const float* A, int lda, int mt, const float* B0, const float* B1,
                                      float* C, int ldc, int nv0, int nv1, int accumulate) {
    STER_TILE512_BEGIN(float)
    int k;
    for (k = 0; k < kc; k++) {
        const __m512 b = _mm512_loadu_ps(B0 + STER_NR * k), e = _mm512_loadu_ps(B1 + STER_NR * k);
        __m512 s;
#define STER_F2(i) s = _mm512_set1_ps(a##i[k]); c##i = _mm512_fmadd_ps(s, b, c##i); d##i = _mm512_fmadd_ps(s, e, d##i);
        STER_EACH12(STER_F2)
#undef STER_F2
    }
    STER_TILE512_END
}

/* ------------------------------------------------------------------------- */
/* bfloat16 weights on bfloat16 inputs: 12 tokens x 32 outputs with vdpbf16ps */

/* X [T, K] float32 -> Xb [T, Kp] bfloat16 (Kp = K + (K & 1), the pad zero), rounded to
 * nearest even by vcvtneps2bf16 (which reads subnormal inputs as zero). */
static STER_X512BF16 void ster_round_bf16_rows(const float* X, int T, int K, uint16_t* Xb) {
    const int Kp = K + (K & 1);
    int t, k;
    for (t = 0; t < T; t++) {
        const float* x = X + (size_t)t * K;
        uint16_t* y = Xb + (size_t)t * Kp;
        for (k = 0; k + 16 <= K; k += 16)
            _mm256_storeu_si256((__m256i*)(y + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + k)));
        if (k < Kp) {
            const __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
            _mm256_mask_storeu_epi16(y + k, (__mmask16)((1u << (Kp - k)) - 1u),
                                     (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k)));
        }
    }
}

/* C[t, n] (+)= sum_k A[t, k] * B[k, n] as ster_micro_x512, on bfloat16: A rows of bfloat16
 * (row stride lda elements, pairs k, k + 1 adjacent), panels B0, B1 of kp pairs [kp][16][2]
 * (lane n of pair j holds rows n's weights 2j, 2j + 1). Per pair two panel loads and 12
 * 32-bit broadcasts feed 24 vdpbf16ps: 768 products where the float32 tile's 24 FMAs make
 * 384. Each lane adds its two products to its sum per instruction (exact products, the sum
 * rounded to nearest even, subnormals read and written as zero). */
static STER_X512BF16 void ster_micro_bf16dp(int kp, const uint16_t* A, int lda, int mt, const uint16_t* B0,
                                            const uint16_t* B1, float* C, int ldc, int nv0, int nv1, int accumulate) {
    STER_TILE512_BEGIN(uint16_t)
    int k;
    for (k = 0; k < kp; k++) {
        const __m512bh b = (__m512bh)_mm512_loadu_si512((const void*)(B0 + 2 * STER_NR * k));
        const __m512bh e = (__m512bh)_mm512_loadu_si512((const void*)(B1 + 2 * STER_NR * k));
        __m512bh s;
        uint32_t w;
#define STER_F2(i) memcpy(&w, a##i + 2 * k, 4); s = (__m512bh)_mm512_set1_epi32((int)w); \
                   c##i = _mm512_dpbf16_ps(c##i, s, b); d##i = _mm512_dpbf16_ps(d##i, s, e);
        STER_EACH12(STER_F2)
#undef STER_F2
    }
    STER_TILE512_END
}

#endif /* STER_X512_H */
