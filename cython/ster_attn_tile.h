/* Prefill attention in tiles: several query rows (consecutive rows of the heads sharing a
 * key/value head) against each block of keys, so that every key and value loaded serves
 * all of them (ster_attn_group_nh reads the keys once per query row).
 *
 * The keys are read from a transposed float32 copy made by the caller (ster_attn_kt_fill):
 * blocks of KB keys stored [D][KB], so that the scores of one query row against a block
 * are KB / (lanes) vector registers filled by FMAs of a broadcast query element with a row
 * of the block (a matrix-product register tile, as in BLIS / GotoBLAS: Goto & van de Geijn
 * 2008), with no horizontal sums. The scores then stay in registers for the scale,
 * soft-cap, bias, causal / window mask, the block max and exp (online softmax: Milakov &
 * Gimelshein 2018; Dao et al. 2022), and the values (float32 rows) are added per query
 * row in column slabs held in registers.
 *
 * Two instances chosen at run time: AVX-512 (KB = 32 keys as two zmm per query row, up to
 * 12 query rows: 24 accumulators of 32 registers) and AVX2 (KB = 16 keys as two ymm, up to
 * 6 query rows: 12 of 16 registers). Results equal ster_attn_row_scalar's up to float32
 * rounding in another order (tests/test_qmatmul.py compares both with the numpy
 * definition in ster_py/decoder/attention.py). Included by ster_ops.h inside its x86
 * section.
 */
#ifndef STER_ATTN_TILE_H
#define STER_ATTN_TILE_H

/* One query row of a tile: its vector, its visible keys [lo, hi) (absolute key indices),
 * its bias row (bias[j] for key j, or NULL), its head's sink and its output row. */
typedef struct {
    const float* q;
    const float* bias;
    int lo, hi;
    int has_sink;
    float sink;
    float* out;
} ster_attn_qrow;

/* The query rows of a tile can hold (a register budget: see the file comment). */
#define STER_TILE_Q512 12
#define STER_TILE_Q256 6
#define STER_TILE_KB512 32
#define STER_TILE_KB256 16
#define STER_REP6(M) M(0) M(1) M(2) M(3) M(4) M(5)
#define STER_REP12(M) STER_REP6(M) M(6) M(7) M(8) M(9) M(10) M(11)

/* Kt[b][d][kk] = K[k0 + b * KB + kk][d] (element stride ldk; float16 when f16) for the
 * blocks b covering keys [k0, k1), keys past k1 zero. Kt: ceil((k1 - k0) / KB) * D * KB floats. */
static void ster_attn_kt_fill(const void* K, long ldk, int f16, int D, int k0, int k1, int KB, float* Kt) {
    const int nblk = (k1 - k0 + KB - 1) / KB;
    int b, kk, d;
    for (b = 0; b < nblk; b++) {
        float* blk = Kt + (long)b * D * KB;
        for (kk = 0; kk < KB; kk++) {
            const long key = (long)k0 + (long)b * KB + kk;
            if (key >= k1) {
                for (d = 0; d < D; d++) blk[(long)d * KB + kk] = 0.0f;
                continue;
            }
            if (f16) {
                const uint16_t* row = (const uint16_t*)K + key * ldk;
                for (d = 0; d < D; d++) blk[(long)d * KB + kk] = ster_half_to_float(row[d]);
            } else {
                const float* row = (const float*)K + key * ldk;
                for (d = 0; d < D; d++) blk[(long)d * KB + kk] = row[d];
            }
        }
    }
}

/* 1 when the n rows of D elements at element stride ld (float32, or float16 when f16) are all
 * finite. The tiles add every value row of a block times its weight, 0 for keys a row does
 * not see, and 0 * inf is NaN: a call whose values hold an infinity or NaN runs row by row,
 * which reads only the rows each query sees. */
static int ster_rows_finite(const void* rows, long n, long ld, int D, int f16) {
    long r;
    int d;
    unsigned bad = 0;
    for (r = 0; r < n; r++) {
        if (f16) {
            const uint16_t* x = (const uint16_t*)rows + r * ld;
            for (d = 0; d < D; d++) bad |= (x[d] & 0x7c00u) == 0x7c00u;
        } else {
            const uint32_t* x = (const uint32_t*)rows + r * ld;
            for (d = 0; d < D; d++) bad |= (x[d] & 0x7f800000u) == 0x7f800000u;
        }
        if (bad) return 0;
    }
    return 1;
}

/* The running max/denominator update shared by both instances, for one query row: bm is
 * the block's max, bad whether a score is NaN. Returns the new max; a NaN or +inf score
 * makes it NaN (the row is then NaN, as the reference's inf - inf makes it). */
static inline float ster_tile_new_max(float m, float bm, int bad) {
    float mn = bm > m ? bm : m;
    if (bad || mn == INFINITY) mn = NAN;
    return mn;
}

/* Normalise a finished query row: out *= 1 / (l + exp(sink - m)) at the common max. */
static inline float ster_tile_inv(float m, float l, int has_sink, float sink) {
    if (has_sink) {
        float M = sink > m ? sink : m;
        float f = expf(m - M);
        return f / (l * f + expf(sink - M));
    }
    return l > 0 ? 1.0f / l : 0.0f;
}

#if STER_OPS_X86
#define STER_OPS_X512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define STER_OPS_X512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

/* ------------------------------------------------------------------------- */
/* AVX-512                                                                   */

/* exp(x) for x <= 0 as ster_exp8, sixteen lanes. */
STER_OPS_X512_INLINE __m512 ster_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

/* tanh(x) as ster_tanh8, sixteen lanes. */
STER_OPS_X512_INLINE __m512 ster_tanh16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i signbit = _mm512_set1_epi32((int)0x80000000u);
    __m512 ax = _mm512_castsi512_ps(_mm512_andnot_si512(signbit, _mm512_castps_si512(x)));
    __m512 e = ster_exp16(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
    __m512 big = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    __m512 x2 = _mm512_mul_ps(ax, ax);
    __m512 p = _mm512_set1_ps(62.0f / 2835.0f);
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), ax, ax);
    __m512 t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.25f), _CMP_LT_OQ), big, small);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t),
                                               _mm512_and_si512(signbit, _mm512_castps_si512(x))));
}

/* Lanes of keys j0 + base + 0..15 inside [lo, hi). */
STER_OPS_X512_INLINE __mmask16 ster_tile_mask16(int j0, int base, int lo, int hi) {
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(j0 + base),
                                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return _mm512_cmp_epi32_mask(idx, _mm512_set1_epi32(lo), _MM_CMPINT_NLT) &
           _mm512_cmp_epi32_mask(idx, _mm512_set1_epi32(hi), _MM_CMPINT_LT);
}

/* scale, soft-cap, bias and mask of 16 scores of one row (keys j0 + base..). */
STER_OPS_X512_INLINE __m512 ster_tile_score16(__m512 s, const ster_attn_qrow* r, int j0, int base, float scale,
                                              float cap) {
    const __mmask16 k = ster_tile_mask16(j0, base, r->lo, r->hi);
    __m512 x = _mm512_mul_ps(s, _mm512_set1_ps(scale));
    if (cap > 0) x = _mm512_mul_ps(ster_tanh16(_mm512_mul_ps(x, _mm512_set1_ps(1.0f / cap))), _mm512_set1_ps(cap));
    if (r->bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, r->bias + j0 + base));
    return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), k, x);
}

/* NQ query rows (1..12) over the keys each may see; Kt: the transposed blocks from key k0
 * (a multiple of 32 apart from the rows' keys: block b holds keys k0 + 32 b ..); V: float32
 * value rows (element stride ldv), row j - k0 for key j. */
STER_OPS_X512_INLINE void ster_attn_tile512_nq(const ster_attn_qrow* r, const float* Kt, int k0, const float* V,
                                               long ldv, int D, float scale, float cap, const int NQ) {
    const int KB = STER_TILE_KB512;
    float m[STER_TILE_Q512], l[STER_TILE_Q512], alpha[STER_TILE_Q512];
    float p[STER_TILE_Q512][STER_TILE_KB512] __attribute__((aligned(64)));
    int i, d, jlo = INT32_MAX, jhi = INT32_MIN, j0, c0, jj;
    for (i = 0; i < NQ; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        for (d = 0; d < D; d++) r[i].out[d] = 0.0f;
        if (r[i].lo < r[i].hi) {
            if (r[i].lo < jlo) jlo = r[i].lo;
            if (r[i].hi > jhi) jhi = r[i].hi;
        }
    }
    if (jlo >= jhi) return;
    float qt[D * NQ];   /* the queries interleaved, qt[d * NQ + i]: one pointer for the broadcasts */
    for (i = 0; i < NQ; i++) for (d = 0; d < D; d++) qt[d * NQ + i] = r[i].q[d];
    for (j0 = k0 + (jlo - k0) / KB * KB; j0 < jhi; j0 += KB) {
        const float* kt = Kt + (long)(j0 - k0) * D;
        const int nb = jhi - j0 < KB ? jhi - j0 : KB;
        /* the accumulators are named registers (arrays of vectors indexed in a loop were
         * stored to the stack at every step by GCC) */
#define STER_DECL(k) __m512 s0_##k = _mm512_setzero_ps(), s1_##k = _mm512_setzero_ps();
        STER_REP12(STER_DECL)
#undef STER_DECL
        for (d = 0; d < D; d++) {
            const __m512 ka = _mm512_loadu_ps(kt + (long)d * KB), kb = _mm512_loadu_ps(kt + (long)d * KB + 16);
            const float* qd = qt + d * NQ;
#define STER_QK(k) if (k < NQ) { const __m512 qb = _mm512_set1_ps(qd[k]); \
            s0_##k = _mm512_fmadd_ps(qb, ka, s0_##k); s1_##k = _mm512_fmadd_ps(qb, kb, s1_##k); }
            STER_REP12(STER_QK)
#undef STER_QK
        }
        __m512 s0[STER_TILE_Q512], s1[STER_TILE_Q512];
#define STER_PUT(k) if (k < NQ) { s0[k] = s0_##k; s1[k] = s1_##k; }
        STER_REP12(STER_PUT)
#undef STER_PUT
        for (i = 0; i < NQ; i++) {
            __m512 x0 = ster_tile_score16(s0[i], &r[i], j0, 0, scale, cap);
            __m512 x1 = ster_tile_score16(s1[i], &r[i], j0, 16, scale, cap);
            int bad = (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) != 0;
            float mn = ster_tile_new_max(m[i], _mm512_reduce_max_ps(_mm512_max_ps(x0, x1)), bad);
            if (mn == -INFINITY) {   /* nothing visible yet: weights 0 */
                alpha[i] = 1.0f;
                _mm512_store_ps(p[i], _mm512_setzero_ps());
                _mm512_store_ps(p[i] + 16, _mm512_setzero_ps());
                continue;
            }
            alpha[i] = expf(m[i] - mn);
            const __m512 m16 = _mm512_set1_ps(mn);
            __m512 e0 = ster_exp16(_mm512_sub_ps(x0, m16)), e1 = ster_exp16(_mm512_sub_ps(x1, m16));
            _mm512_store_ps(p[i], e0);
            _mm512_store_ps(p[i] + 16, e1);
            l[i] = l[i] * alpha[i] + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
            m[i] = mn;
        }
        /* values: 32 columns at a time (masked at the row's end) */
        for (c0 = 0; c0 < D; c0 += 32) {
            const int w = D - c0;
            const __mmask16 ma = w >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1u);
            const __mmask16 mb = w >= 32 ? (__mmask16)0xffff : (w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1u));
#define STER_DECL(k) __m512 a0_##k = _mm512_setzero_ps(), a1_##k = _mm512_setzero_ps(); \
            if (k < NQ) { const __m512 al = _mm512_set1_ps(alpha[k]); \
                a0_##k = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(ma, r[k].out + c0)); \
                a1_##k = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(mb, r[k].out + c0 + 16)); }
            STER_REP12(STER_DECL)
#undef STER_DECL
            for (jj = 0; jj < nb; jj++) {
                const float* v = V + (long)(j0 + jj - k0) * ldv + c0;
                const __m512 va = _mm512_maskz_loadu_ps(ma, v), vb = _mm512_maskz_loadu_ps(mb, v + 16);
#define STER_PV(k) if (k < NQ) { const __m512 pb = _mm512_set1_ps(p[k][jj]); \
                a0_##k = _mm512_fmadd_ps(pb, va, a0_##k); a1_##k = _mm512_fmadd_ps(pb, vb, a1_##k); }
                STER_REP12(STER_PV)
#undef STER_PV
            }
            __m512 a0[STER_TILE_Q512], a1[STER_TILE_Q512];
#define STER_PUT(k) if (k < NQ) { a0[k] = a0_##k; a1[k] = a1_##k; }
            STER_REP12(STER_PUT)
#undef STER_PUT
            for (i = 0; i < NQ; i++) {
                _mm512_mask_storeu_ps(r[i].out + c0, ma, a0[i]);
                _mm512_mask_storeu_ps(r[i].out + c0 + 16, mb, a1[i]);
            }
        }
    }
    for (i = 0; i < NQ; i++) {
        const float inv = ster_tile_inv(m[i], l[i], r[i].has_sink, r[i].sink);
        for (d = 0; d < D; d++) r[i].out[d] *= inv;
    }
}

static STER_OPS_X512 void ster_attn_tile512(int nq, const ster_attn_qrow* r, const float* Kt, int k0,
                                            const float* V, long ldv, int D, float scale, float cap) {
#define STER_T512_CASE(N) case N: ster_attn_tile512_nq(r, Kt, k0, V, ldv, D, scale, cap, N); break;
    switch (nq) {
    STER_T512_CASE(1) STER_T512_CASE(2) STER_T512_CASE(3) STER_T512_CASE(4) STER_T512_CASE(5)
    STER_T512_CASE(6) STER_T512_CASE(7) STER_T512_CASE(8) STER_T512_CASE(9) STER_T512_CASE(10)
    STER_T512_CASE(11) default: ster_attn_tile512_nq(r, Kt, k0, V, ldv, D, scale, cap, 12); break;
    }
#undef STER_T512_CASE
}

/* ------------------------------------------------------------------------- */
/* AVX2 (D a multiple of 8)                                                  */

STER_OPS_INLINE __m256 ster_tile_score8(__m256 s, const ster_attn_qrow* r, int j0, int base, float scale, float cap) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(j0 + base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    /* lanes with lo <= j < hi: !(lo > j) & (hi > j) */
    const __m256i k = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(r->lo), idx),
                                          _mm256_cmpgt_epi32(_mm256_set1_epi32(r->hi), idx));
    __m256 x = _mm256_mul_ps(s, _mm256_set1_ps(scale));
    if (cap > 0) x = _mm256_mul_ps(ster_tanh8(_mm256_mul_ps(x, _mm256_set1_ps(1.0f / cap))), _mm256_set1_ps(cap));
    if (r->bias) x = _mm256_add_ps(x, _mm256_maskload_ps(r->bias + j0 + base, k));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, _mm256_castsi256_ps(k));
}

STER_OPS_INLINE float ster_hmax8(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* As ster_attn_tile512_nq: NQ (1..6) rows, blocks of 16 keys, D % 8 == 0. */
STER_OPS_INLINE void ster_attn_tile256_nq(const ster_attn_qrow* r, const float* Kt, int k0, const float* V, long ldv,
                                          int D, float scale, float cap, const int NQ) {
    const int KB = STER_TILE_KB256;
    float m[STER_TILE_Q256], l[STER_TILE_Q256], alpha[STER_TILE_Q256];
    float p[STER_TILE_Q256][STER_TILE_KB256] __attribute__((aligned(32)));
    int i, d, jlo = INT32_MAX, jhi = INT32_MIN, j0, c0, jj;
    for (i = 0; i < NQ; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        for (d = 0; d < D; d++) r[i].out[d] = 0.0f;
        if (r[i].lo < r[i].hi) {
            if (r[i].lo < jlo) jlo = r[i].lo;
            if (r[i].hi > jhi) jhi = r[i].hi;
        }
    }
    if (jlo >= jhi) return;
    float qt[D * NQ];   /* the queries interleaved, qt[d * NQ + i]: one pointer for the broadcasts */
    for (i = 0; i < NQ; i++) for (d = 0; d < D; d++) qt[d * NQ + i] = r[i].q[d];
    for (j0 = k0 + (jlo - k0) / KB * KB; j0 < jhi; j0 += KB) {
        const float* kt = Kt + (long)(j0 - k0) * D;
        const int nb = jhi - j0 < KB ? jhi - j0 : KB;
#define STER_DECL(k) __m256 s0_##k = _mm256_setzero_ps(), s1_##k = _mm256_setzero_ps();
        STER_REP6(STER_DECL)
#undef STER_DECL
        for (d = 0; d < D; d++) {
            const __m256 ka = _mm256_loadu_ps(kt + (long)d * KB), kb = _mm256_loadu_ps(kt + (long)d * KB + 8);
            const float* qd = qt + d * NQ;
#define STER_QK(k) if (k < NQ) { const __m256 qb = _mm256_broadcast_ss(qd + k); \
            s0_##k = _mm256_fmadd_ps(qb, ka, s0_##k); s1_##k = _mm256_fmadd_ps(qb, kb, s1_##k); }
            STER_REP6(STER_QK)
#undef STER_QK
        }
        __m256 s0[STER_TILE_Q256], s1[STER_TILE_Q256];
#define STER_PUT(k) if (k < NQ) { s0[k] = s0_##k; s1[k] = s1_##k; }
        STER_REP6(STER_PUT)
#undef STER_PUT
        for (i = 0; i < NQ; i++) {
            __m256 x0 = ster_tile_score8(s0[i], &r[i], j0, 0, scale, cap);
            __m256 x1 = ster_tile_score8(s1[i], &r[i], j0, 8, scale, cap);
            int bad = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(x0, x0, _CMP_UNORD_Q),
                                                      _mm256_cmp_ps(x1, x1, _CMP_UNORD_Q))) != 0;
            float mn = ster_tile_new_max(m[i], ster_hmax8(_mm256_max_ps(x0, x1)), bad);
            if (mn == -INFINITY) {
                alpha[i] = 1.0f;
                _mm256_store_ps(p[i], _mm256_setzero_ps());
                _mm256_store_ps(p[i] + 8, _mm256_setzero_ps());
                continue;
            }
            alpha[i] = expf(m[i] - mn);
            const __m256 m8 = _mm256_set1_ps(mn);
            __m256 e0 = ster_exp8(_mm256_sub_ps(x0, m8)), e1 = ster_exp8(_mm256_sub_ps(x1, m8));
            _mm256_store_ps(p[i], e0);
            _mm256_store_ps(p[i] + 8, e1);
            l[i] = l[i] * alpha[i] + ster_hsum8_ops(_mm256_add_ps(e0, e1));
            m[i] = mn;
        }
        for (c0 = 0; c0 + 16 <= D; c0 += 16) {
#define STER_DECL(k) __m256 a0_##k = _mm256_setzero_ps(), a1_##k = _mm256_setzero_ps(); \
            if (k < NQ) { const __m256 al = _mm256_set1_ps(alpha[k]); \
                a0_##k = _mm256_mul_ps(al, _mm256_loadu_ps(r[k].out + c0)); \
                a1_##k = _mm256_mul_ps(al, _mm256_loadu_ps(r[k].out + c0 + 8)); }
            STER_REP6(STER_DECL)
#undef STER_DECL
            for (jj = 0; jj < nb; jj++) {
                const float* v = V + (long)(j0 + jj - k0) * ldv + c0;
                const __m256 va = _mm256_loadu_ps(v), vb = _mm256_loadu_ps(v + 8);
#define STER_PV(k) if (k < NQ) { const __m256 pb = _mm256_broadcast_ss(&p[k][jj]); \
                a0_##k = _mm256_fmadd_ps(pb, va, a0_##k); a1_##k = _mm256_fmadd_ps(pb, vb, a1_##k); }
                STER_REP6(STER_PV)
#undef STER_PV
            }
            __m256 a0[STER_TILE_Q256], a1[STER_TILE_Q256];
#define STER_PUT(k) if (k < NQ) { a0[k] = a0_##k; a1[k] = a1_##k; }
            STER_REP6(STER_PUT)
#undef STER_PUT
            for (i = 0; i < NQ; i++) {
                _mm256_storeu_ps(r[i].out + c0, a0[i]);
                _mm256_storeu_ps(r[i].out + c0 + 8, a1[i]);
            }
        }
        if (c0 < D) {   /* D % 16 == 8 */
            __m256 a0[STER_TILE_Q256];
            for (i = 0; i < NQ; i++) a0[i] = _mm256_mul_ps(_mm256_set1_ps(alpha[i]), _mm256_loadu_ps(r[i].out + c0));
            for (jj = 0; jj < nb; jj++) {
                const __m256 va = _mm256_loadu_ps(V + (long)(j0 + jj - k0) * ldv + c0);
                for (i = 0; i < NQ; i++) a0[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(&p[i][jj]), va, a0[i]);
            }
            for (i = 0; i < NQ; i++) _mm256_storeu_ps(r[i].out + c0, a0[i]);
        }
    }
    for (i = 0; i < NQ; i++) {
        const float inv = ster_tile_inv(m[i], l[i], r[i].has_sink, r[i].sink);
        for (d = 0; d < D; d++) r[i].out[d] *= inv;
    }
}

static STER_OPS_AVX2 void ster_attn_tile256(int nq, const ster_attn_qrow* r, const float* Kt, int k0,
                                            const float* V, long ldv, int D, float scale, float cap) {
#define STER_T256_CASE(N) case N: ster_attn_tile256_nq(r, Kt, k0, V, ldv, D, scale, cap, N); break;
    switch (nq) {
    STER_T256_CASE(1) STER_T256_CASE(2) STER_T256_CASE(3) STER_T256_CASE(4) STER_T256_CASE(5)
    default: ster_attn_tile256_nq(r, Kt, k0, V, ldv, D, scale, cap, 6); break;
    }
#undef STER_T256_CASE
}

/* AVX512 F/BW/VL/DQ (the set the tile512 instance is compiled for). */
static int ster_ops_cpu_avx512(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    }
    return cached;
}
#else
static int ster_ops_cpu_avx512(void) { return 0; }
static void ster_attn_tile512(int nq, const ster_attn_qrow* r, const float* Kt, int k0, const float* V, long ldv,
                              int D, float scale, float cap) {
    (void)nq; (void)r; (void)Kt; (void)k0; (void)V; (void)ldv; (void)D; (void)scale; (void)cap;
}
static void ster_attn_tile256(int nq, const ster_attn_qrow* r, const float* Kt, int k0, const float* V, long ldv,
                              int D, float scale, float cap) {
    (void)nq; (void)r; (void)Kt; (void)k0; (void)V; (void)ldv; (void)D; (void)scale; (void)cap;
}
#endif /* STER_OPS_X86 */

#endif /* STER_ATTN_TILE_H */
