/* Q4_0, Q4_1, Q8_0 and Q4_K matrices stored with their rows interleaved in groups of 16
 * ("IL16"), for the one-token (decode) product. Included by ster_qkernels.h after its kernels.
 *
 * Why: the row-at-a-time kernels spend most of each 32-weight block on one row's scale
 * work and on reducing one row's vector to a number (~14 instructions per block and row
 * for Q4_1). With 16 rows side by side, lane r of a vector belongs to row r for the whole
 * product: vpmaddwd multiplies two weights of each of 8 rows (16 with AVX-512) by the same
 * two int16 inputs, broadcast, and the 32-bit sums stay in their row's lane; the scales of
 * 16 rows convert in one vcvtph2ps and nothing is reduced across lanes. Measured on one
 * thread of an AMD EPYC (Zen 4), a Q4_1 [1536, 576] product with its weights in cache:
 * 1.3-1.8x faster with AVX2, 2.7-3.3x with AVX512_VNNI (runbook/performance.md).
 *
 * Layout: a matrix of N rows becomes ceil(N / 16) groups of 16 rows (rows past N are zero);
 * group g takes 16 * row_bytes bytes at g * 16 * row_bytes and holds its rows' block b at
 * b * 16 * type_size within the group. A block's bytes are cut into "planes" (ster_il_planes):
 * runs of equal pieces (e.g. the float16 scale, or the code bytes two at a time); piece p of
 * a plane holds that piece of every row side by side (row r at r * piece size), so
 *     Q4_0:  16 scales d, then 8 chunks of 32 bytes (chunk c: code bytes 2c, 2c + 1 of each row);
 *     Q4_1:  16 d, 16 minimums m, 8 chunks;
 *     Q8_0:  16 d, 16 chunks (the 32 code bytes);
 *     Q4_K:  16 d, 16 dmin, 12 planes of 16 bytes (the packed 6-bit scales, byte k of each
 *            row in plane k), 64 chunks (the 128 nibble bytes).
 * A legacy nibble byte l holds weights l and l + 16 (ggml-common.h): the low nibbles of chunk c
 * are weights 2c, 2c + 1 and the high nibbles weights 2c + 16, 2c + 17. Q4_K's bytes 32j..32j+31
 * hold sub-block 2j in their low nibbles and 2j + 1 in their high ones: chunk 16j + c has
 * weights 2c, 2c + 1 of both.
 *
 * A type id with STER_IL set names the layout to the drivers; ster_il_row gives any row's
 * blocks back in the file layout (the float-input row dots read those) and ster_il_ungroup a
 * whole group's (a prefill panel is one group), so their arithmetic is unchanged. Each row's
 * decode result is computed in its own lane, the same whichever rows are computed beside it.
 */
#ifndef STER_IL16_H
#define STER_IL16_H

#define STER_IL 0x100   /* flag on a type id: rows interleaved in groups of 16 */
#define STER_ILG 16
#define STER_IL_MAX_BLOCKS 4096   /* rows of at most 131072 weights are interleaved */

/* The types with an interleaved layout. */
static inline int ster_il_type(int type) {
    return type == STER_Q4_0 || type == STER_Q4_1 || type == STER_Q8_0 || type == STER_Q4_K;
}

/* A block's planes, in order: {piece bytes, pieces}; 0-terminated. They cover the block. */
static const int* ster_il_planes(int type) {
    static const int q4_0[] = {2, 1, 2, 8, 0}, q4_1[] = {2, 2, 2, 8, 0}, q8_0[] = {2, 1, 2, 16, 0};
    static const int q4_k[] = {2, 2, 1, 12, 2, 64, 0};
    switch (type) {
    case STER_Q4_0: return q4_0; case STER_Q4_1: return q4_1; case STER_Q8_0: return q8_0;
    }
    return q4_k;
}

/* Row r's block of a block of 16 interleaved rows, back in the file layout. */
static void ster_il_unblock(int type, const uint8_t* grp_blk, int r, uint8_t* row_blk) {
    const int* pl = ster_il_planes(type);
    size_t at = 0, off = 0;   /* in the group block; in the row's block */
    int i, p;
    for (i = 0; pl[i]; i += 2) {
        const int sz = pl[i], n = pl[i + 1];
        for (p = 0; p < n; p++, off += (size_t)sz)
            memcpy(row_blk + off, grp_blk + at + ((size_t)p * STER_ILG + (size_t)r) * sz, (size_t)sz);
        at += (size_t)n * STER_ILG * sz;
    }
}

#if STER_HAVE_X86
/* An 8 x 8 transpose of 16-bit words: v[i] word k becomes v[k] word i. */
static inline void ster_il_tr8x8(__m128i v[8]) {
    const __m128i t0 = _mm_unpacklo_epi16(v[0], v[1]), t1 = _mm_unpackhi_epi16(v[0], v[1]);
    const __m128i t2 = _mm_unpacklo_epi16(v[2], v[3]), t3 = _mm_unpackhi_epi16(v[2], v[3]);
    const __m128i t4 = _mm_unpacklo_epi16(v[4], v[5]), t5 = _mm_unpackhi_epi16(v[4], v[5]);
    const __m128i t6 = _mm_unpacklo_epi16(v[6], v[7]), t7 = _mm_unpackhi_epi16(v[6], v[7]);
    const __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
    const __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
    const __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
    const __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
    v[0] = _mm_unpacklo_epi64(u0, u4); v[1] = _mm_unpackhi_epi64(u0, u4);
    v[2] = _mm_unpacklo_epi64(u1, u5); v[3] = _mm_unpackhi_epi64(u1, u5);
    v[4] = _mm_unpacklo_epi64(u2, u6); v[5] = _mm_unpackhi_epi64(u2, u6);
    v[6] = _mm_unpacklo_epi64(u3, u7); v[7] = _mm_unpackhi_epi64(u3, u7);
}
#endif

/* Eight 2-byte pieces of 16 rows (16 bytes at rows[r] + off) to eight 32-byte chunks at out
 * (chunk k: piece k of rows 0..15): two 8 x 8 transposes of 16-bit words in SSE2 registers.
 * (Copying the pieces one by one took ~0.3 s for SmolLM2's 96 MB, the transposes ~0.05 s.) */
static void ster_il_transpose16x8(const uint8_t* const* rows, size_t off, uint8_t* out) {
    int h, k;
    for (h = 0; h < 2; h++) {
#if STER_HAVE_X86
        __m128i v[8];
        for (k = 0; k < 8; k++) v[k] = _mm_loadu_si128((const __m128i*)(rows[8 * h + k] + off));
        ster_il_tr8x8(v);
        for (k = 0; k < 8; k++) _mm_storeu_si128((__m128i*)(out + 32 * k + 16 * h), v[k]);
#else
        int r;
        for (k = 0; k < 8; k++)
            for (r = 0; r < 8; r++) memcpy(out + 32 * k + 16 * h + 2 * r, rows[8 * h + r] + off + 2 * k, 2);
#endif
    }
}

/* The inverse: eight 32-byte chunks at in back to eight 2-byte pieces of each of 16 rows. */
static void ster_il_untranspose16x8(const uint8_t* in, uint8_t* const* rows, size_t off) {
    int h, k;
    for (h = 0; h < 2; h++) {
#if STER_HAVE_X86
        __m128i v[8];
        for (k = 0; k < 8; k++) v[k] = _mm_loadu_si128((const __m128i*)(in + 32 * k + 16 * h));
        ster_il_tr8x8(v);
        for (k = 0; k < 8; k++) _mm_storeu_si128((__m128i*)(rows[8 * h + k] + off), v[k]);
#else
        int r;
        for (k = 0; k < 8; k++)
            for (r = 0; r < 8; r++) memcpy(rows[8 * h + r] + off + 2 * k, in + 32 * k + 16 * h + 2 * r, 2);
#endif
    }
}

/* Interleave groups [g0, g1) of a matrix: src row n is raw row rows[n] (rows NULL: n) of
 * row_bytes bytes, for n < n_rows; dst as described above. */
static void ster_il_pack(int type, const uint8_t* src, size_t rb, const int32_t* rows, int n_rows, int g0, int g1,
                         uint8_t* dst) {
    static const uint8_t zeros[256] = {0};   /* a row past the end: a block of zeros */
    const int ts = ster_type_size(type), nb = (int)(rb / (size_t)ts);
    const int* pl = ster_il_planes(type);
    const uint8_t* row[STER_ILG];
    const uint8_t* blk[STER_ILG];
    int g, b, r, i, p;
    for (g = g0; g < g1; g++) {
        uint8_t* grp = dst + (size_t)g * STER_ILG * rb;
        for (r = 0; r < STER_ILG; r++) {
            const int n = STER_ILG * g + r;
            row[r] = n < n_rows ? src + (size_t)(rows ? rows[n] : n) * rb : 0;
        }
        for (b = 0; b < nb; b++) {
            uint8_t* o = grp + (size_t)b * STER_ILG * ts;
            size_t at = 0, off = 0;
            for (r = 0; r < STER_ILG; r++) blk[r] = row[r] ? row[r] + (size_t)b * ts : zeros;
            for (i = 0; pl[i]; i += 2) {
                const int sz = pl[i], n = pl[i + 1];
                p = 0;
                if (sz == 2)   /* the codes: eight pieces of every row at a time */
                    for (; p + 8 <= n; p += 8) ster_il_transpose16x8(blk, off + 2 * (size_t)p, o + at + (size_t)p * 32);
                for (; p < n; p++)
                    for (r = 0; r < STER_ILG; r++)
                        memcpy(o + at + ((size_t)p * STER_ILG + (size_t)r) * sz, blk[r] + off + (size_t)p * sz, (size_t)sz);
                at += (size_t)n * STER_ILG * sz;
                off += (size_t)n * sz;
            }
        }
    }
}

/* Blocks [b0, b0 + cnt) of row n of an interleaved matrix, in the file layout, to out. */
static void ster_il_row(int type, const uint8_t* P, size_t rb, int n, int b0, int cnt, uint8_t* out) {
    const int ts = ster_type_size(type);
    const uint8_t* grp = P + (size_t)(n / STER_ILG) * STER_ILG * rb;
    int b;
    for (b = b0; b < b0 + cnt; b++, out += ts)
        ster_il_unblock(type, grp + (size_t)b * STER_ILG * ts, n % STER_ILG, out);
}

/* Blocks [b0, b0 + cnt) of the 16 rows of one group (grp: its 16 * row_bytes bytes), back in
 * the file layout: row r's at out + r * stride (a decoded prefill panel is one group). */
static void ster_il_ungroup(int type, const uint8_t* grp, int b0, int cnt, uint8_t* out, size_t stride) {
    const int ts = ster_type_size(type);
    const int* pl = ster_il_planes(type);
    uint8_t* row[STER_ILG];
    int r, b, i, p;
    for (r = 0; r < STER_ILG; r++) row[r] = out + (size_t)r * stride;
    for (b = 0; b < cnt; b++) {
        const uint8_t* g = grp + (size_t)(b0 + b) * STER_ILG * ts;
        size_t at = 0, off = (size_t)b * ts;
        for (i = 0; pl[i]; i += 2) {
            const int sz = pl[i], n = pl[i + 1];
            p = 0;
            if (sz == 2)   /* the codes: eight pieces of every row at a time */
                for (; p + 8 <= n; p += 8) ster_il_untranspose16x8(g + at + (size_t)p * 32, row, off + 2 * (size_t)p);
            for (; p < n; p++)
                for (r = 0; r < STER_ILG; r++)
                    memcpy(row[r] + off + (size_t)p * sz, g + at + ((size_t)p * STER_ILG + (size_t)r) * sz, (size_t)sz);
            at += (size_t)n * STER_ILG * sz;
            off += (size_t)n * sz;
        }
    }
}

/* Bytes of scales per row before a legacy block's codes: d, and for Q4_1 m. */
static inline int ster_il_head(int type) { return type == STER_Q4_1 ? 4 : 2; }

/* ------------------------------------------------------------------------- */
/* The copy, in the background                                               */
/*
 * A model's matrices are copied by one worker thread while the rest of the model loads (the
 * tokenizer's construction holds Python's lock on one core; the copy takes the other), so
 * loading does not wait for it. The worker takes the largest queued matrix first: a prompt
 * needs no copy but the output head's (its last product is one token's), and the head is
 * nearly always a model's largest matrix; equal sizes go in the order they came.
 * A row-dot product (one token) that needs a matrix whose copy has not finished makes it, or
 * joins the threads already making it (a copy is cut in slices of about 4 MB, each taken by
 * one thread), and returns when it exists: a matrix's row dots always run on one layout, so
 * their results do not depend on timing, and no thread sits idle while a copy it needs is made.
 * Decoded panels (a prompt) give the same bits from either layout, so until the copy exists
 * they read the rows where they are.
 * The source's pages are released slice by slice as they are copied (release): another
 * thread reading them meanwhile (an embedding's row lookup) maps them again from the page
 * cache, so this is safe while they are in use.
 */
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

enum { STER_IL_IDLE = 0, STER_IL_QUEUED = 1, STER_IL_RUNNING = 2, STER_IL_DONE = 3 };

typedef struct ster_il_job {
    int type, n_rows, release;
    int src_rows;                 /* rows of src (with a row order, not n_rows) */
    const uint8_t* src;           /* the rows as given (row order rows, or NULL) */
    size_t rb;
    const int32_t* rows;
    uint8_t* dst;                 /* ceil(n_rows / 16) * 16 * rb bytes */
    int state;                    /* STER_IL_*, under ster_il_mu (as the next three) */
    int next_group;               /* the first group no thread has taken (RUNNING) */
    int copiers;                  /* threads copying a slice of it or about to take one */
    struct ster_il_job* next;     /* in the queue */
    struct ster_il_job* next_running;
} ster_il_job;

static pthread_mutex_t ster_il_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ster_il_cv = PTHREAD_COND_INITIALIZER;   /* the queue or a job's state changed */
static ster_il_job* ster_il_first = 0;
static int ster_il_worker_up = 0;
static ster_il_job* ster_il_running = 0;   /* the jobs some thread is copying now */

/* Under ster_il_mu: a job starts being copied (by the calling thread, which others may join). */
static void ster_il_start(ster_il_job* j) {
    j->state = STER_IL_RUNNING;
    j->next_group = 0;
    j->copiers = 1;
    j->next_running = ster_il_running;
    ster_il_running = j;
}
static void ster_il_stop(ster_il_job* j) {
    ster_il_job** p = &ster_il_running;
    while (*p && *p != j) p = &(*p)->next_running;
    if (*p) *p = j->next_running;
    j->state = STER_IL_DONE;
    pthread_cond_broadcast(&ster_il_cv);
}

/* fork(): the child has only the forking thread. Its queued jobs, and those other threads were
 * copying, are made again by ster_il_finish when first needed (the lock is held across the
 * fork, so the lists are whole). The lock and the condition are made anew in the child: the
 * condition still counts the parent's waiting worker, which the child does not have, and a
 * broadcast there would wait for it forever (glibc 2.36; a breaker's finding). */
static void ster_il_before_fork(void) { pthread_mutex_lock(&ster_il_mu); }
static void ster_il_after_fork_parent(void) { pthread_mutex_unlock(&ster_il_mu); }
static void ster_il_after_fork_child(void) {
    const pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    const pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    ster_il_job* j;
    for (j = ster_il_first; j; j = j->next) j->state = STER_IL_IDLE;
    for (j = ster_il_running; j; j = j->next_running) j->state = STER_IL_IDLE;
    ster_il_first = ster_il_running = 0;
    ster_il_worker_up = 0;
    ster_il_cv = cv;
    ster_il_mu = mu;
}

/* Once per process, before any job: the fork handlers. Returns 0 if they cannot be set (then
 * no job goes to a worker: each is made by the thread that needs it). */
static int ster_il_init(void) {
    static int state = -1;
    if (state < 0) state = pthread_atfork(ster_il_before_fork, ster_il_after_fork_parent, ster_il_after_fork_child) == 0;
    return state;
}

/* madvise(MADV_DONTNEED) on the whole pages of [p, p + n): advice, a failure changes nothing. */
static void ster_il_release(const uint8_t* p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + n) / page * page;
    if (hi > lo) madvise((void*)lo, hi - lo, MADV_DONTNEED);
}

/* Copy slices of a RUNNING job the calling thread counts among its copiers, until none is left
 * to take; the last copier out releases the source and marks the job done. Called and returns
 * under ster_il_mu. Slices are about 4 MB of the source, each one's pages released after it
 * when the rows are in order (else all of them at the end); never a page past the source's
 * src_rows rows. */
static void ster_il_work(ster_il_job* j) {
    const int groups = (j->n_rows + STER_ILG - 1) / STER_ILG;
    const size_t gbytes = (size_t)STER_ILG * j->rb, src_bytes = (size_t)j->src_rows * j->rb;
    const int each = j->release && !j->rows;
    int step = (int)((4u << 20) / gbytes), g0, g1;
    if (step < 1) step = 1;
    while (j->next_group < groups) {
        g0 = j->next_group;
        g1 = g0 + step < groups ? g0 + step : groups;
        j->next_group = g1;
        pthread_mutex_unlock(&ster_il_mu);
        ster_il_pack(j->type, j->src, j->rb, j->rows, j->n_rows, g0, g1, j->dst);
        if (each) {
            const size_t a = (size_t)g0 * gbytes, b = (size_t)g1 * gbytes < src_bytes ? (size_t)g1 * gbytes : src_bytes;
            if (b > a) ster_il_release(j->src + a, b - a);
        }
        pthread_mutex_lock(&ster_il_mu);
    }
    if (--j->copiers == 0) {
        if (j->release) {   /* whole pages shared by two slices, or every page of a row order's source */
            pthread_mutex_unlock(&ster_il_mu);
            ster_il_release(j->src, src_bytes);
            pthread_mutex_lock(&ster_il_mu);
        }
        ster_il_stop(j);
    }
}

/* Under ster_il_mu: the largest queued job (the first of equal ones), taken off the queue. */
static ster_il_job* ster_il_take_largest(void) {
    ster_il_job **p, **best = &ster_il_first, *j;
    size_t most = 0;
    for (p = &ster_il_first; *p; p = &(*p)->next) {
        const size_t n = (size_t)(*p)->n_rows * (*p)->rb;
        if (n > most) most = n, best = p;
    }
    j = *best;
    *best = j->next;
    return j;
}

static void* ster_il_worker(void* arg) {
    (void)arg;
    pthread_mutex_lock(&ster_il_mu);
    for (;;) {
        ster_il_job* j;
        while (!ster_il_first) pthread_cond_wait(&ster_il_cv, &ster_il_mu);
        j = ster_il_take_largest();
        ster_il_start(j);
        ster_il_work(j);
    }
    return 0;
}

/* Take a queued job off the queue (under ster_il_mu); it becomes idle. */
static void ster_il_unqueue(ster_il_job* j) {
    ster_il_job** p = &ster_il_first;
    while (*p && *p != j) p = &(*p)->next;
    if (*p) *p = j->next;
    j->state = STER_IL_IDLE;
}

/* Queue a job for the worker (started on first use). Returns 0 when no worker can be
 * started: the caller then copies on first use (ster_il_finish does). */
static int ster_il_submit(ster_il_job* j) {
    int ok = 1;
    if (!ster_il_init()) return 0;
    pthread_mutex_lock(&ster_il_mu);
    if (!ster_il_worker_up) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        ster_il_worker_up = pthread_create(&t, &at, ster_il_worker, 0) == 0;
        pthread_attr_destroy(&at);
        ok = ster_il_worker_up;
    }
    if (ok) {
        ster_il_job** p = &ster_il_first;
        while (*p) p = &(*p)->next;   /* at the end: equal sizes are taken in the order they came */
        j->next = 0;
        j->state = STER_IL_QUEUED;
        *p = j;
        pthread_cond_broadcast(&ster_il_cv);
    }
    pthread_mutex_unlock(&ster_il_mu);
    return ok;
}

/* Return once the job's copy exists: made here if it is still queued or was never submitted
 * (then it leaves the queue), joined if other threads are making it and slices are left,
 * else waited for. (After a fork the worker is gone from the child; queued jobs are then made
 * here.) */
static void ster_il_finish(ster_il_job* j) {
    pthread_mutex_lock(&ster_il_mu);
    if (j->state == STER_IL_QUEUED) ster_il_unqueue(j);
    if (j->state == STER_IL_IDLE) {
        ster_il_start(j);
        ster_il_work(j);
    } else if (j->state == STER_IL_RUNNING && j->next_group < (j->n_rows + STER_ILG - 1) / STER_ILG) {
        j->copiers++;
        ster_il_work(j);
    }
    while (j->state != STER_IL_DONE) pthread_cond_wait(&ster_il_cv, &ster_il_mu);
    pthread_mutex_unlock(&ster_il_mu);
}

/* Whether the job's copy exists now (no waiting). */
static int ster_il_done(ster_il_job* j) {
    int done;
    pthread_mutex_lock(&ster_il_mu);
    done = j->state == STER_IL_DONE;
    pthread_mutex_unlock(&ster_il_mu);
    return done;
}

/* Take a job out of the worker's hands without making it: unqueued if queued, waited for if
 * threads are on it (its memory is about to be freed). */
static void ster_il_cancel(ster_il_job* j) {
    pthread_mutex_lock(&ster_il_mu);
    if (j->state == STER_IL_QUEUED) ster_il_unqueue(j);
    while (j->state == STER_IL_RUNNING) pthread_cond_wait(&ster_il_cv, &ster_il_mu);
    pthread_mutex_unlock(&ster_il_mu);
}

#if STER_HAVE_X86

/* Sums of the int16 inputs of each 32-block (Q4_0 subtracts 8 times it, exactly in int32). */
static STER_AVX2 void ster_il_xsums(const int16_t* x, int nb, int32_t* out) {
    const __m256i one = _mm256_set1_epi16(1);
    int b;
    for (b = 0; b < nb; b++, x += 32) {
        __m256i s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)x), one),
                                     _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)(x + 16)), one));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
        out[b] = _mm_cvtsi128_si32(h);
    }
}

/* Prefetch the next group's block while this group's is multiplied (the weights stream from
 * memory once per product); returns the pointer to that group's next block, or NULL. */
static inline const uint8_t* ster_il_prefetch(const uint8_t* next, int bstride) {
    int p;
    if (!next) return 0;
    for (p = 0; p < bstride; p += 64) _mm_prefetch((const char*)next + p, _MM_HINT_T0);
    return next + bstride;
}

STER_AVX2_INLINE __m256i ster_bcast32(const int16_t* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* One group, AVX2: y[r] for its 16 rows (rows 0..7 in the L vectors, 8..15 in H). next: the
 * following group (prefetched block by block) or NULL. */
STER_AVX2_INLINE void ster_il_group_avx2(const int type, const uint8_t* G, const uint8_t* next, int nb,
                                         const int16_t* x, const float* dx, const float* xs16, const int32_t* xsum,
                                         float* y) {
    const int ts = ster_type_size(type), hb = ster_il_head(type), bstride = STER_ILG * ts;
    const __m256i m15 = _mm256_set1_epi16(15);
    __m256 fL = _mm256_setzero_ps(), fH = _mm256_setzero_ps(), mL = _mm256_setzero_ps(), mH = _mm256_setzero_ps();
    int b, c;
    for (b = 0; b < nb; b++, G += bstride, x += 32) {
        next = ster_il_prefetch(next, bstride);
        const uint8_t* Q = G + 16 * hb;
        __m256i aL, aH;
        if (type == STER_Q8_0) {
            __m256i bL = _mm256_setzero_si256(), bH = _mm256_setzero_si256();
            aL = _mm256_setzero_si256(); aH = _mm256_setzero_si256();
            for (c = 0; c < 16; c += 2) {   /* two accumulators per half: madd latency */
                __m256i xa = ster_bcast32(x + 2 * c), xb = ster_bcast32(x + 2 * c + 2);
                aL = _mm256_add_epi32(aL, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(Q + 32 * c))), xa));
                aH = _mm256_add_epi32(aH, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(Q + 32 * c + 16))), xa));
                bL = _mm256_add_epi32(bL, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(Q + 32 * c + 32))), xb));
                bH = _mm256_add_epi32(bH, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(Q + 32 * c + 48))), xb));
            }
            aL = _mm256_add_epi32(aL, bL);
            aH = _mm256_add_epi32(aH, bH);
        } else {
            aL = _mm256_setzero_si256(); aH = _mm256_setzero_si256();
            for (c = 0; c < 8; c++) {
                __m256i wl = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(Q + 32 * c)));
                __m256i wh = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(Q + 32 * c + 16)));
                __m256i xa = ster_bcast32(x + 2 * c), xb = ster_bcast32(x + 16 + 2 * c);
                aL = _mm256_add_epi32(aL, _mm256_add_epi32(_mm256_madd_epi16(_mm256_and_si256(wl, m15), xa),
                                                           _mm256_madd_epi16(_mm256_srli_epi16(wl, 4), xb)));
                aH = _mm256_add_epi32(aH, _mm256_add_epi32(_mm256_madd_epi16(_mm256_and_si256(wh, m15), xa),
                                                           _mm256_madd_epi16(_mm256_srli_epi16(wh, 4), xb)));
            }
            if (type == STER_Q4_0) {   /* codes are q - 8 */
                const __m256i off = _mm256_set1_epi32(8 * xsum[b]);
                aL = _mm256_sub_epi32(aL, off);
                aH = _mm256_sub_epi32(aH, off);
            }
        }
        const __m256 bdx = _mm256_set1_ps(dx[b]);
        fL = _mm256_fmadd_ps(_mm256_cvtepi32_ps(aL), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)G)), bdx), fL);
        fH = _mm256_fmadd_ps(_mm256_cvtepi32_ps(aH), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(G + 16))), bdx), fH);
        if (type == STER_Q4_1) {
            const __m256 bxs = _mm256_set1_ps(xs16[2 * b] + xs16[2 * b + 1]);
            mL = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(G + 32))), bxs, mL);
            mH = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(G + 48))), bxs, mH);
        }
    }
    _mm256_storeu_ps(y, _mm256_add_ps(fL, mL));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(fH, mH));
}

/* The same with AVX512_VNNI: 16 rows per zmm, vpdpwssd multiplying and accumulating. */
static inline __attribute__((always_inline, target(STER_T512 ",avx512vnni")))
void ster_il_group_vnni(const int type, const uint8_t* G, const uint8_t* next, int nb, const int16_t* x,
                        const float* dx, const float* xs16, const int32_t* xsum, float* y) {
    const int ts = ster_type_size(type), hb = ster_il_head(type), bstride = STER_ILG * ts;
    const __m512i m15 = _mm512_set1_epi16(15);
    __m512 f = _mm512_setzero_ps(), m = _mm512_setzero_ps();
    int b, c;
    for (b = 0; b < nb; b++, G += bstride, x += 32) {
        next = ster_il_prefetch(next, bstride);
        const uint8_t* Q = G + 16 * hb;
        __m512i a = _mm512_setzero_si512(), a2 = _mm512_setzero_si512();
        if (type == STER_Q8_0) {
            for (c = 0; c < 16; c += 2) {
                int32_t u, v;
                memcpy(&u, x + 2 * c, 4);
                memcpy(&v, x + 2 * c + 2, 4);
                a = _mm512_dpwssd_epi32(a, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(Q + 32 * c))),
                                        _mm512_set1_epi32(u));
                a2 = _mm512_dpwssd_epi32(a2, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(Q + 32 * c + 32))),
                                         _mm512_set1_epi32(v));
            }
        } else {
            for (c = 0; c < 8; c++) {
                int32_t u, v;
                memcpy(&u, x + 2 * c, 4);
                memcpy(&v, x + 16 + 2 * c, 4);
                __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(Q + 32 * c)));
                a = _mm512_dpwssd_epi32(a, _mm512_and_si512(w, m15), _mm512_set1_epi32(u));
                a2 = _mm512_dpwssd_epi32(a2, _mm512_srli_epi16(w, 4), _mm512_set1_epi32(v));
            }
            if (type == STER_Q4_0) a2 = _mm512_sub_epi32(a2, _mm512_set1_epi32(8 * xsum[b]));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)G));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a, a2)), _mm512_mul_ps(d, _mm512_set1_ps(dx[b])), f);
        if (type == STER_Q4_1)
            m = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(G + 32))),
                                _mm512_set1_ps(xs16[2 * b] + xs16[2 * b + 1]), m);
    }
    _mm512_storeu_ps(y, _mm512_add_ps(f, m));
}

/* Q4_K: the 16 rows' 6-bit scale (want_min 0) or minimum (1) of sub-block j, from the 12
 * scale planes at S (ggml's get_scale_min_k4, for 16 rows at once; bytes, 0..63). */
STER_AVX2_INLINE __m128i ster_il_k4_scale(const uint8_t* S, int j, int want_min) {
    const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
#define STER_PL(k) _mm_loadu_si128((const __m128i*)(S + 16 * (k)))
    if (j < 4) return _mm_and_si128(STER_PL(want_min ? j + 4 : j), m63);
    __m128i low = want_min ? _mm_and_si128(_mm_srli_epi16(STER_PL(j + 4), 4), m15) : _mm_and_si128(STER_PL(j + 4), m15);
    __m128i high = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(STER_PL(want_min ? j : j - 4), 6), m3), 4);
#undef STER_PL
    return _mm_or_si128(low, high);
}

/* Bytes 0..7 (half 0) or 8..15 (half 1) of v as 8 floats. */
STER_AVX2_INLINE __m256 ster_il_u8f(__m128i v, int half) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(half ? _mm_srli_si128(v, 8) : v));
}

/* One group of Q4_K rows, AVX2. Per 256-block: d * sum_s sc_s dx_s (q . x)_s - dmin * sum_s m_s
 * sum(x)_s, the sums over s in float32 per row (rows 0..7 in L, 8..15 in H). */
static STER_AVX2 void ster_il_q4_k_avx2(const uint8_t* G, const uint8_t* next, int nb, const int16_t* x,
                                        const float* dx, const float* xs16, const int32_t* xsum, float* y) {
    const int bstride = STER_ILG * 144;
    const __m256i m15 = _mm256_set1_epi16(15);
    __m256 fL = _mm256_setzero_ps(), fH = _mm256_setzero_ps(), mL = _mm256_setzero_ps(), mH = _mm256_setzero_ps();
    int b, j, c;
    (void)xsum;
    for (b = 0; b < nb; b++, G += bstride, x += 256, dx += 8, xs16 += 16) {
        const uint8_t *S = G + 64, *Q = G + 256;
        __m256 sL = _mm256_setzero_ps(), sH = _mm256_setzero_ps(), nL = _mm256_setzero_ps(), nH = _mm256_setzero_ps();
        next = ster_il_prefetch(next, bstride);
        for (j = 0; j < 4; j++) {
            __m256i aL = _mm256_setzero_si256(), aH = _mm256_setzero_si256();   /* sub-block 2j */
            __m256i bL = _mm256_setzero_si256(), bH = _mm256_setzero_si256();   /* sub-block 2j + 1 */
            for (c = 0; c < 16; c++) {
                const uint8_t* ch = Q + (size_t)(16 * j + c) * 32;
                __m256i wl = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)ch));
                __m256i wh = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(ch + 16)));
                __m256i xa = ster_bcast32(x + 64 * j + 2 * c), xb = ster_bcast32(x + 64 * j + 32 + 2 * c);
                aL = _mm256_add_epi32(aL, _mm256_madd_epi16(_mm256_and_si256(wl, m15), xa));
                aH = _mm256_add_epi32(aH, _mm256_madd_epi16(_mm256_and_si256(wh, m15), xa));
                bL = _mm256_add_epi32(bL, _mm256_madd_epi16(_mm256_srli_epi16(wl, 4), xb));
                bH = _mm256_add_epi32(bH, _mm256_madd_epi16(_mm256_srli_epi16(wh, 4), xb));
            }
            const __m128i sa = ster_il_k4_scale(S, 2 * j, 0), sb = ster_il_k4_scale(S, 2 * j + 1, 0);
            const __m128i ma = ster_il_k4_scale(S, 2 * j, 1), mb = ster_il_k4_scale(S, 2 * j + 1, 1);
            const __m256 da = _mm256_set1_ps(dx[2 * j]), db = _mm256_set1_ps(dx[2 * j + 1]);
            const __m256 xa = _mm256_set1_ps(xs16[4 * j] + xs16[4 * j + 1]), xb = _mm256_set1_ps(xs16[4 * j + 2] + xs16[4 * j + 3]);
            sL = _mm256_fmadd_ps(_mm256_cvtepi32_ps(aL), _mm256_mul_ps(ster_il_u8f(sa, 0), da), sL);
            sH = _mm256_fmadd_ps(_mm256_cvtepi32_ps(aH), _mm256_mul_ps(ster_il_u8f(sa, 1), da), sH);
            sL = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bL), _mm256_mul_ps(ster_il_u8f(sb, 0), db), sL);
            sH = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bH), _mm256_mul_ps(ster_il_u8f(sb, 1), db), sH);
            nL = _mm256_fmadd_ps(ster_il_u8f(ma, 0), xa, nL);
            nH = _mm256_fmadd_ps(ster_il_u8f(ma, 1), xa, nH);
            nL = _mm256_fmadd_ps(ster_il_u8f(mb, 0), xb, nL);
            nH = _mm256_fmadd_ps(ster_il_u8f(mb, 1), xb, nH);
        }
        fL = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)G)), sL, fL);
        fH = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(G + 16))), sH, fH);
        mL = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(G + 32))), nL, mL);
        mH = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(G + 48))), nH, mH);
    }
    _mm256_storeu_ps(y, _mm256_sub_ps(fL, mL));
    _mm256_storeu_ps(y + 8, _mm256_sub_ps(fH, mH));
}

/* The same with AVX512_VNNI: 16 rows per zmm, two vpdpwssd chains per sub-block. */
static STER_VNNI void ster_il_q4_k_vnni(const uint8_t* G, const uint8_t* next, int nb, const int16_t* x,
                                        const float* dx, const float* xs16, const int32_t* xsum, float* y) {
    const int bstride = STER_ILG * 144;
    const __m512i m15 = _mm512_set1_epi16(15);
    __m512 f = _mm512_setzero_ps(), m = _mm512_setzero_ps();
    int b, j, c;
    (void)xsum;
    for (b = 0; b < nb; b++, G += bstride, x += 256, dx += 8, xs16 += 16) {
        const uint8_t *S = G + 64, *Q = G + 256;
        __m512 sc = _mm512_setzero_ps(), mn = _mm512_setzero_ps();
        next = ster_il_prefetch(next, bstride);
        for (j = 0; j < 4; j++) {
            __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
            __m512i b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
            for (c = 0; c < 16; c += 2) {
                int32_t u0, u1, v0, v1;
                const uint8_t* ch = Q + (size_t)(16 * j + c) * 32;
                memcpy(&u0, x + 64 * j + 2 * c, 4);
                memcpy(&u1, x + 64 * j + 2 * c + 2, 4);
                memcpy(&v0, x + 64 * j + 32 + 2 * c, 4);
                memcpy(&v1, x + 64 * j + 32 + 2 * c + 2, 4);
                __m512i w0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)ch));
                __m512i w1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(ch + 32)));
                a0 = _mm512_dpwssd_epi32(a0, _mm512_and_si512(w0, m15), _mm512_set1_epi32(u0));
                a1 = _mm512_dpwssd_epi32(a1, _mm512_and_si512(w1, m15), _mm512_set1_epi32(u1));
                b0 = _mm512_dpwssd_epi32(b0, _mm512_srli_epi16(w0, 4), _mm512_set1_epi32(v0));
                b1 = _mm512_dpwssd_epi32(b1, _mm512_srli_epi16(w1, 4), _mm512_set1_epi32(v1));
            }
            const __m512 sa = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ster_il_k4_scale(S, 2 * j, 0)));
            const __m512 sb = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ster_il_k4_scale(S, 2 * j + 1, 0)));
            const __m512 ma = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ster_il_k4_scale(S, 2 * j, 1)));
            const __m512 mb = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ster_il_k4_scale(S, 2 * j + 1, 1)));
            sc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), _mm512_mul_ps(sa, _mm512_set1_ps(dx[2 * j])), sc);
            sc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(b0, b1)), _mm512_mul_ps(sb, _mm512_set1_ps(dx[2 * j + 1])), sc);
            mn = _mm512_fmadd_ps(ma, _mm512_set1_ps(xs16[4 * j] + xs16[4 * j + 1]), mn);
            mn = _mm512_fmadd_ps(mb, _mm512_set1_ps(xs16[4 * j + 2] + xs16[4 * j + 3]), mn);
        }
        f = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)G)), sc, f);
        m = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(G + 32))), mn, m);
    }
    _mm512_storeu_ps(y, _mm512_sub_ps(f, m));
}

typedef void (*ster_il_group_fn)(const uint8_t*, const uint8_t*, int, const int16_t*, const float*, const float*,
                                 const int32_t*, float*);
#define STER_IL_FN(NAME, IMPL, TARGET, TYPE) \
    static TARGET void NAME(const uint8_t* G, const uint8_t* next, int nb, const int16_t* x, const float* dx, \
                            const float* xs16, const int32_t* xsum, float* y) { \
        IMPL(TYPE, G, next, nb, x, dx, xs16, xsum, y); }
STER_IL_FN(ster_il_q4_0_avx2, ster_il_group_avx2, STER_AVX2, STER_Q4_0)
STER_IL_FN(ster_il_q4_1_avx2, ster_il_group_avx2, STER_AVX2, STER_Q4_1)
STER_IL_FN(ster_il_q8_0_avx2, ster_il_group_avx2, STER_AVX2, STER_Q8_0)
STER_IL_FN(ster_il_q4_0_vnni, ster_il_group_vnni, STER_VNNI, STER_Q4_0)
STER_IL_FN(ster_il_q4_1_vnni, ster_il_group_vnni, STER_VNNI, STER_Q4_1)
STER_IL_FN(ster_il_q8_0_vnni, ster_il_group_vnni, STER_VNNI, STER_Q8_0)
#undef STER_IL_FN

static ster_il_group_fn ster_il_group_for(int type, int level) {
    const int vnni = level >= STER_ISA_VNNI;
    switch (type) {
    case STER_Q4_0: return vnni ? ster_il_q4_0_vnni : ster_il_q4_0_avx2;
    case STER_Q4_1: return vnni ? ster_il_q4_1_vnni : ster_il_q4_1_avx2;
    case STER_Q8_0: return vnni ? ster_il_q8_0_vnni : ster_il_q8_0_avx2;
    case STER_Q4_K: return vnni ? ster_il_q4_k_vnni : ster_il_q4_k_avx2;
    }
    return 0;
}

/* y[r] for r in [r0, r1) of an interleaved matrix (type without the flag), int16 inputs
 * (level >= STER_ISA_AVX2). A group cut by the range is computed whole into a scratch. */
static void ster_il_matvec16(int type, const uint8_t* W, size_t rb, int r0, int r1, int K, const int16_t* q,
                             const float* dx, const float* xs16, float* y, int level) {
    const int nb = K / ster_block_size(type), g1 = (r1 + STER_ILG - 1) / STER_ILG;
    const size_t gbytes = STER_ILG * rb;
    ster_il_group_fn fn = ster_il_group_for(type, level);
    int32_t xsum[STER_IL_MAX_BLOCKS];   /* QMatrix interleaves rows of at most this many blocks */
    float tmp[STER_ILG];
    int g;
    if (type == STER_Q4_0) ster_il_xsums(q, nb, xsum);
    for (g = r0 / STER_ILG; g < g1; g++) {
        const int lo = STER_ILG * g;
        const uint8_t* G = W + (size_t)g * gbytes;
        const uint8_t* next = g + 1 < g1 ? G + gbytes : 0;
        if (lo >= r0 && lo + STER_ILG <= r1) {
            fn(G, next, nb, q, dx, xs16, xsum, y + lo);
        } else {
            int r;
            fn(G, next, nb, q, dx, xs16, xsum, tmp);
            for (r = lo < r0 ? r0 : lo; r < lo + STER_ILG && r < r1; r++) y[r] = tmp[r - lo];
        }
    }
}

#endif /* STER_HAVE_X86 */

#endif /* STER_IL16_H */
