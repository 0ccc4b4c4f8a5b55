/* AMX tiles for the prefill of bfloat16 matrices (ster_qkernels.h includes this after ster_x512.h,
 * inside its x86 section; ster_matmul_range takes them at STER_ISA_AMX when K is a multiple of 32).
 *
 * The same product as ster_micro_bf16dp's tile -- inputs rounded to bfloat16 (ster_round_bf16_rows),
 * weights as stored, float32 sums -- on Intel's AMX units: tdpbf16ps multiplies a 16 x 32 tile of
 * inputs by a 32 x 16 tile of weights into a 16 x 16 float32 tile, 8,192 products per instruction,
 * where vdpbf16ps makes 32 (Intel, Architecture Instruction Set Extensions, AMX-BF16: each pair of
 * products summed exactly, the sum rounded to nearest even into the accumulator; subnormal inputs and
 * results flushed to zero, as vdpbf16ps does). The weights' tile is the layout ster_pack_bf16_pairs
 * already makes for vdpbf16ps (pair j of a panel's 16 rows: row n's weights 2j, 2j + 1 as one 32-bit
 * word); here ster_amx_pack_pairs makes it with 16 x 16 word transposes instead of word copies.
 *
 * Linux hands a process the AMX register state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XTILEDATA, kernel 5.16 and later; Documentation/arch/x86/xstate.rst); ster_amx_granted asks once (ster_cpu_level),
 * and a CPU, kernel or hypervisor that says no leaves the vdpbf16ps tile in charge.
 */
#ifndef STER_AMX_H
#define STER_AMX_H

#if defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define STER_HAVE_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define STER_AMXT __attribute__((target(STER_T512 ",avx512vnni,avx512bf16,amx-tile,amx-bf16")))

/* Whether this process may run AMX-BF16 tiles: the CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7,
 * EDX bits 24 and 22), the OS saves tile state (XCR0 bits 17, 18) and grants it to this process.
 * Asked once; the grant holds for every thread of the process, those started before it too. */
static int ster_amx_granted(void) {
    static int cached = -1;
    if (cached < 0) {
        unsigned a, b, c, d, lo, hi;
        cached = 0;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d) &&
            (d & (1u << 24)) && (d & (1u << 22)) && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27))) {
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            if ((lo & (3u << 17)) == (3u << 17) &&
                syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0)
                cached = 1;
        }
        (void)hi;
    }
    return cached;
}

/* GCC's tile intrinsics are asm statements that name their pointers but not the memory behind them: without
 * this fence the compiler may drop or move the plain stores a tile load reads (a staged block, the packed
 * weights) and the reads of what a tile store wrote. */
#define STER_AMX_FENCE() __asm__ volatile("" ::: "memory")

/* Palette 1, tiles 0-7 each 16 rows of 64 bytes: C tiles 0-3 (2 x 2 blocks of 16 x 16 float32),
 * input tiles 4-5 (16 tokens x 32 bfloat16), weight tiles 6-7 (16 pairs x 16 rows). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ster_tilecfg;

/* In static storage: GCC 12 does not see ldtilecfg read its operand and dropped the stores that filled a
 * configuration on the stack (ldtilecfg then faulted on palette 1 with every tile empty). */
static const ster_tilecfg ster_amx_cfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

static STER_AMXT void ster_amx_begin(void) { _tile_loadconfig(&ster_amx_cfg); }

/* Tiles off again: a thread holding tile state makes every context switch save 8 KB more. */
static STER_AMXT void ster_amx_end(void) { _tile_release(); }

/* ster_pack_bf16_pairs' panel p for kcl a multiple of 32: P[j][rr] = the 32-bit word of row
 * n0 + 16p + rr's weights kc0 + 2j, kc0 + 2j + 1 (zero past n1), made 16 pairs at a time by
 * transposing 16 rows x 16 words in registers. */
static STER_AMXT void ster_amx_pack_pairs(const uint8_t* W, size_t row_bytes, const int32_t* rows, int n0, int n1,
                                          int p, int kc0, int kcl, uint32_t* P) {
    const uint8_t* src[16];
    int rr, jb, c, L;
    for (rr = 0; rr < 16; rr++) {
        const int n = n0 + STER_NR * p + rr;
        src[rr] = n < n1 ? W + (size_t)(rows ? rows[n] : n) * row_bytes + (size_t)kc0 * 2 : 0;
    }
    for (jb = 0; jb < kcl / 32; jb++) {
        __m512i r[16], a[16], b[16];
        for (rr = 0; rr < 16; rr++)
            r[rr] = src[rr] ? _mm512_loadu_si512((const void*)(src[rr] + 64 * jb)) : _mm512_setzero_si512();
        for (rr = 0; rr < 16; rr += 2) {   /* words of rows rr, rr + 1 interleaved, per 128-bit lane */
            a[rr] = _mm512_unpacklo_epi32(r[rr], r[rr + 1]);
            a[rr + 1] = _mm512_unpackhi_epi32(r[rr], r[rr + 1]);
        }
        for (rr = 0; rr < 16; rr += 4) {   /* b[rr + c], lane L: column 4L + c of rows rr .. rr + 3 */
            b[rr] = _mm512_unpacklo_epi64(a[rr], a[rr + 2]);
            b[rr + 1] = _mm512_unpackhi_epi64(a[rr], a[rr + 2]);
            b[rr + 2] = _mm512_unpacklo_epi64(a[rr + 1], a[rr + 3]);
            b[rr + 3] = _mm512_unpackhi_epi64(a[rr + 1], a[rr + 3]);
        }
        for (c = 0; c < 4; c++) {          /* column 4L + c: lane L of b[c], b[4 + c], b[8 + c], b[12 + c] */
            const __m512i x0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
            const __m512i x2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
            const __m512i x3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
            __m512i o[4];
            o[0] = _mm512_shuffle_i32x4(x0, x2, 0x88);
            o[1] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
            o[2] = _mm512_shuffle_i32x4(x1, x3, 0x88);
            o[3] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
            for (L = 0; L < 4; L++)
                _mm512_storeu_si512((void*)(P + ((size_t)jb * 16 + 4 * L + c) * STER_NR), o[L]);
        }
    }
}

/* A block of up to 16 tokens' inputs as a tile can read it: rows of Xb in place when all 16 are
 * there, else copied into tmp ([16][kcl], the missing rows zero). Returns the rows and their stride
 * (bytes) through *stride. */
static const uint16_t* ster_amx_rows(const uint16_t* A, int lda, int mt, int kcl, uint16_t* tmp, int* stride) {
    int t;
    if (mt >= 16) {
        *stride = lda * 2;
        return A;
    }
    for (t = 0; t < 16; t++) {
        if (t < mt) memcpy(tmp + (size_t)t * kcl, A + (size_t)t * lda, (size_t)kcl * 2);
        else memset(tmp + (size_t)t * kcl, 0, (size_t)kcl * 2);
    }
    *stride = kcl * 2;
    return tmp;
}

/* Where a 16 x 16 float32 block of Y goes: in place when whole, else through tmp (the block's
 * mt x nv part copied in when the sums go on from an earlier chunk). */
static float* ster_amx_cblock(float* C, int ldc, int mt, int nv, int accumulate, float* tmp, int* stride) {
    int t;
    if (mt >= 16 && nv >= 16) {
        *stride = ldc * 4;
        return C;
    }
    memset(tmp, 0, 256 * sizeof(float));
    if (accumulate)
        for (t = 0; t < mt && t < 16; t++) memcpy(tmp + 16 * t, C + (size_t)t * ldc, (size_t)(nv < 16 ? nv : 16) * 4);
    *stride = 64;
    return tmp;
}

static void ster_amx_cdone(float* C, int ldc, int mt, int nv, const float* tmp, const float* block) {
    int t;
    if (block != tmp) return;
    for (t = 0; t < mt && t < 16; t++) memcpy(C + (size_t)t * ldc, tmp + 16 * t, (size_t)(nv < 16 ? nv : 16) * 4);
}

/* One chunk of ster_matmul_range's bfloat16 product on tiles: Y[t, n0 + 16p + r] (+)= sum over
 * the chunk's kcl inputs (a multiple of 32) of A[t, k] W[row, k], for t < T and every panel
 * (npanel, packed by ster_amx_pack_pairs into pack, STER_KC pairs' room each). A: the chunk's
 * first input of token 0, row stride lda elements; nvalid = n1 - n0. 2 x 2 blocks of 16 tokens x
 * 16 outputs at a time; the tiles must be configured (ster_amx_begin). */
static STER_AMXT void ster_amx_chunk(const uint16_t* A, int lda, int T, int kcl, const uint32_t* pack, int npanel,
                                     int nvalid, float* Y, int ldy, int accumulate) {
    uint16_t atmp[2][16 * STER_KC];
    float ctmp[4][256];
    int t0, p, jb;
    for (t0 = 0; t0 < T; t0 += 32) {
        const int mt0 = T - t0, mt1 = T - t0 - 16, two_m = mt1 > 0;
        int sa0, sa1 = 0;
        const uint16_t* a0 = ster_amx_rows(A + (size_t)t0 * lda, lda, mt0, kcl, atmp[0], &sa0);
        const uint16_t* a1 = two_m ? ster_amx_rows(A + (size_t)(t0 + 16) * lda, lda, mt1, kcl, atmp[1], &sa1) : 0;
        for (p = 0; p < npanel; p += 2) {
            const int two_n = p + 1 < npanel, nv0 = nvalid - STER_NR * p, nv1 = nvalid - STER_NR * (p + 1);
            const uint32_t* b0 = pack + (size_t)p * STER_KC * STER_NR;
            const uint32_t* b1 = b0 + (size_t)STER_KC * STER_NR;
            float* y = Y + (size_t)t0 * ldy + STER_NR * p;
            int s0, s1 = 0, s2 = 0, s3 = 0;
            float* c0 = ster_amx_cblock(y, ldy, mt0, nv0, accumulate, ctmp[0], &s0);
            float* c1 = two_n ? ster_amx_cblock(y + STER_NR, ldy, mt0, nv1, accumulate, ctmp[1], &s1) : 0;
            float* c2 = two_m ? ster_amx_cblock(y + (size_t)16 * ldy, ldy, mt1, nv0, accumulate, ctmp[2], &s2) : 0;
            float* c3 = two_m && two_n ? ster_amx_cblock(y + (size_t)16 * ldy + STER_NR, ldy, mt1, nv1, accumulate,
                                                         ctmp[3], &s3) : 0;
            STER_AMX_FENCE();   /* the staged inputs and sums, and the packed weights, are in memory */
            if (accumulate) {
                _tile_loadd(0, c0, s0);
                if (c1) _tile_loadd(1, c1, s1);
                if (c2) _tile_loadd(2, c2, s2);
                if (c3) _tile_loadd(3, c3, s3);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (jb = 0; jb < kcl / 32; jb++) {
                _tile_loadd(4, a0 + 32 * jb, sa0);
                _tile_loadd(6, b0 + 256 * jb, 64);
                _tile_dpbf16ps(0, 4, 6);
                if (two_n) {
                    _tile_loadd(7, b1 + 256 * jb, 64);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (two_m) {
                    _tile_loadd(5, a1 + 32 * jb, sa1);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two_n) _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, c0, s0);
            if (c1) _tile_stored(1, c1, s1);
            if (c2) _tile_stored(2, c2, s2);
            if (c3) _tile_stored(3, c3, s3);
            STER_AMX_FENCE();   /* the staged sums are read only after the stores */
            ster_amx_cdone(y, ldy, mt0, nv0, ctmp[0], c0);
            if (c1) ster_amx_cdone(y + STER_NR, ldy, mt0, nv1, ctmp[1], c1);
            if (c2) ster_amx_cdone(y + (size_t)16 * ldy, ldy, mt1, nv0, ctmp[2], c2);
            if (c3) ster_amx_cdone(y + (size_t)16 * ldy + STER_NR, ldy, mt1, nv1, ctmp[3], c3);
        }
    }
}

#else
static int ster_amx_granted(void) { return 0; }
#endif

#endif /* STER_AMX_H */
