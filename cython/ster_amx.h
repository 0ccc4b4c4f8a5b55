/* AMX tiles for the prefill of bfloat16 and quantized matrices (ster_qkernels.h includes this after
 * ster_x512.h, inside its x86 section; ster_matmul_range takes them at STER_ISA_AMX when its inputs were
 * rounded to bfloat16 and K is a multiple of 32). A quantized matrix's panel is decoded to float32 as the
 * float32 tile's is, then rounded to bfloat16: the tiles then multiply it as a bfloat16 matrix.
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

/* ster_pack_bf16_pairs' layout for panel p over the whole row (K a multiple of 32): P[j][rr] = the 32-bit
 * word of row n0 + 16p + rr's weights 2j, 2j + 1 (zero past n1), made 16 pairs at a time by transposing
 * 16 rows x 16 words in registers. */
static STER_AMXT void ster_amx_pack_pairs(const uint8_t* W, size_t row_bytes, const int32_t* rows, int n0, int n1,
                                          int p, int K, uint32_t* P) {
    const uint8_t* src[16];
    int rr, jb, c, L;
    for (rr = 0; rr < 16; rr++) {
        const int n = n0 + STER_NR * p + rr;
        src[rr] = n < n1 ? W + (size_t)(rows ? rows[n] : n) * row_bytes : 0;
    }
    for (jb = 0; jb < K / 32; jb++) {
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

/* Scratch of this thread for ster_amx_product (two panels' packed pairs over all K, and the last block
 * of tokens staged): kept between calls and grown to the largest product seen, 128 K bytes. NULL when
 * the allocation fails (the caller then takes the vdpbf16ps tile). */
static void* ster_amx_scratch(size_t bytes) {
    static __thread void* buf = 0;
    static __thread size_t size = 0;
    if (bytes > size) {
        free(buf);
        size = (bytes + 4095) & ~(size_t)4095;
        buf = aligned_alloc(64, size);
        if (!buf) size = 0;
    }
    return buf;
}

/* A 16 x 16 float32 tile of sums to Y: in place when whole, else the mt x nv part of a staged copy. */
static void ster_amx_put(float* C, int ldc, int mt, int nv, const float* tmp) {
    int t;
    for (t = 0; t < mt && t < 16; t++) memcpy(C + (size_t)t * ldc, tmp + 16 * t, (size_t)(nv < 16 ? nv : 16) * 4);
}

/* Rows n0 + 16p .. n0 + 16p + 15 of a block type (or float16), rows past n1 zero, as bfloat16 [16, K] in Wb:
 * each weight decoded to float32 as the float32 tile's panels have it, then rounded to nearest even (in
 * ster_qkernels.h, after the interleaved layout's helpers). */
static void ster_amx_decode_rows(int type, int il, const uint8_t* W, size_t row_bytes, const int32_t* rows, int n0,
                                 int n1, int p, int K, uint16_t* Wb);

/* Panel p's pairs over the whole row into P: a bfloat16 matrix's straight from its rows, another type's
 * from its rows decoded into Wb first. */
static STER_AMXT void ster_amx_panel(int type, int il, const uint8_t* W, size_t row_bytes, const int32_t* rows,
                                     int n0, int n1, int p, int K, uint16_t* Wb, uint32_t* P) {
    if (type == STER_BF16) {
        ster_amx_pack_pairs(W, row_bytes, rows, n0, n1, p, K, P);
        return;
    }
    ster_amx_decode_rows(type, il, W, row_bytes, rows, n0, n1, p, K, Wb);
    STER_AMX_FENCE();
    ster_amx_pack_pairs((const uint8_t*)Wb, (size_t)K * 2, 0, 0, STER_NR, 0, K, P);
}

/* Y[t, n] = sum_k Xb[t, k] W[rows[n], k] for t < T and n in [n0, n1), on tiles (ster_matmul_range's
 * product on bfloat16 inputs at STER_ISA_AMX). W: bfloat16 rows, or rows of a block type or float16
 * (type; il: interleaved, ster_il16.h, rows NULL and n0 a multiple of 16) whose panels are decoded and
 * rounded to bfloat16 (ster_amx_decode_rows). Xb: [T, K] bfloat16 (ster_round_bf16_rows), K a multiple
 * of 32; Y row stride ldy. Two panels (32 outputs) at a time are packed over all K, then every block of 32
 * tokens runs the whole K on four accumulator tiles, written once: sums carried in Y from chunk to
 * chunk cost a read and a write of Y per chunk, which left the tiles waiting on memory (0.7 of the
 * throughput at 512 tokens, an AMX Xeon). Returns 0 without the scratch (nothing done). */
static STER_AMXT int ster_amx_product(int type, int il, const uint8_t* W, size_t row_bytes, const int32_t* rows,
                                      int n0, int n1, int K, const uint16_t* Xb, int T, float* Y, int ldy) {
    const int npanel = (n1 - n0 + STER_NR - 1) / STER_NR, kp = K / 2, nb = K / 32, tfull = T & ~31;
    uint32_t* P0 = (uint32_t*)ster_amx_scratch((size_t)160 * K);
    uint32_t *P1, *b0, *b1;
    uint16_t *staged, *Wb;
    float ctmp[4][256];
    int p, t0, jb, t;
    if (!P0) return 0;
    P1 = P0 + (size_t)kp * STER_NR;
    staged = (uint16_t*)(P1 + (size_t)kp * STER_NR);   /* the last, partial block of tokens: 32 rows, zeros past T */
    Wb = staged + (size_t)32 * K;                      /* a block type's panel, decoded: 16 rows of K bfloat16 */
    if (T > tfull) {
        for (t = 0; t < 32; t++) {
            if (tfull + t < T) memcpy(staged + (size_t)t * K, Xb + (size_t)(tfull + t) * K, (size_t)K * 2);
            else memset(staged + (size_t)t * K, 0, (size_t)K * 2);
        }
    }
    ster_amx_begin();
    for (p = 0; p < npanel; p += 2) {
        const int two_n = p + 1 < npanel, nv0 = n1 - n0 - STER_NR * p, nv1 = n1 - n0 - STER_NR * (p + 1);
        ster_amx_panel(type, il, W, row_bytes, rows, n0, n1, p, K, Wb, P0);
        if (two_n) ster_amx_panel(type, il, W, row_bytes, rows, n0, n1, p + 1, K, Wb, P1);
        b0 = P0;
        b1 = P1;
        for (t0 = 0; t0 < T; t0 += 32) {
            const uint16_t* a = t0 < tfull ? Xb + (size_t)t0 * K : staged;
            const int mt0 = T - t0 < 16 ? T - t0 : 16, mt1 = T - t0 - 16 < 16 ? T - t0 - 16 : 16, two_m = mt1 > 0;
            const int whole0 = mt0 == 16 && nv0 >= 16, whole1 = mt0 == 16 && nv1 >= 16;
            const int whole2 = mt1 == 16 && nv0 >= 16, whole3 = mt1 == 16 && nv1 >= 16;
            float* y = Y + (size_t)t0 * ldy + n0 + STER_NR * p;
            STER_AMX_FENCE();   /* the packed weights and staged inputs are in memory */
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (jb = 0; jb < nb; jb++) {
                _tile_loadd(4, a + 32 * jb, K * 2);
                _tile_loadd(6, b0 + 256 * jb, 64);
                _tile_dpbf16ps(0, 4, 6);
                if (two_n) {
                    _tile_loadd(7, b1 + 256 * jb, 64);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (two_m) {
                    _tile_loadd(5, a + (size_t)16 * K + 32 * jb, K * 2);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two_n) _tile_dpbf16ps(3, 5, 7);
                }
            }
            if (whole0) _tile_stored(0, y, ldy * 4); else _tile_stored(0, ctmp[0], 64);
            if (two_n) { if (whole1) _tile_stored(1, y + STER_NR, ldy * 4); else _tile_stored(1, ctmp[1], 64); }
            if (two_m) {
                if (whole2) _tile_stored(2, y + (size_t)16 * ldy, ldy * 4); else _tile_stored(2, ctmp[2], 64);
                if (two_n) {
                    if (whole3) _tile_stored(3, y + (size_t)16 * ldy + STER_NR, ldy * 4);
                    else _tile_stored(3, ctmp[3], 64);
                }
            }
            STER_AMX_FENCE();   /* the staged sums are read only after the stores */
            if (!whole0) ster_amx_put(y, ldy, mt0, nv0, ctmp[0]);
            if (two_n && !whole1) ster_amx_put(y + STER_NR, ldy, mt0, nv1, ctmp[1]);
            if (two_m && !whole2) ster_amx_put(y + (size_t)16 * ldy, ldy, mt1, nv0, ctmp[2]);
            if (two_m && two_n && !whole3) ster_amx_put(y + (size_t)16 * ldy + STER_NR, ldy, mt1, nv1, ctmp[3]);
        }
    }
    ster_amx_end();
    return 1;
}

#else
static int ster_amx_granted(void) { return 0; }
#endif

#endif /* STER_AMX_H */
