/* A small thread pool for the kernels: the calling thread never waits for a
 * helper that has not started.
 *
 * A job is n chunks. The caller publishes it and claims chunks itself; helpers
 * claim chunks too when they are awake. Claims are a compare-and-swap on one
 * 64-bit word (job generation << 32 | next chunk), so a helper that wakes late
 * sees a finished or newer job and claims nothing. The caller then waits only
 * for chunks that were actually claimed (a done counter), not for every thread
 * to reach a barrier as an OpenMP parallel region does: on a machine where other
 * processes hold the cores, a region does not stall for a scheduler time slice
 * just because a helper is off-CPU; the work degrades to the caller's thread.
 *
 * Helpers spin briefly after a job (decode issues hundreds of small jobs per
 * token, a few microseconds apart), then sleep on a condition variable. When
 * helpers stall a job or keep missing whole jobs (their cores are taken), the
 * caller runs the next jobs alone (256 jobs, or 20 ms when they are long, as a
 * prefill's are): more runnable threads than free cores only slows the thread
 * that runs the Python between jobs. Sharing is also weighed as it goes: over each
 * window of 64 shared jobs, the time they took against what the caller alone would
 * have taken (its own time per chunk times the chunks); a window that sharing lost
 * starts a cooldown twice as long as the last one in a row (up to 32 times).
 * POSIX threads + C11 atomics; one job at a time (a second concurrent caller
 * runs its job alone). After fork() the child starts without helpers.
 */
#ifndef STER_POOL_H
#define STER_POOL_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L   /* clock_gettime when built as strict C */
#endif

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define STER_POOL_MAX 64
/* Helpers spin this long for the next job before sleeping ($STER_SPIN_US overrides). */
#define STER_POOL_SPIN_NS 50000L
static long ster_pool_spin_ns = -1;
#define STER_POOL_STALL_NS 100000L    /* a wait this long (or 4 chunks) for a claimed chunk is a stall */
#define STER_POOL_COOLDOWN 256        /* jobs run alone after a stall or repeated misses ... */
#define STER_POOL_COOLDOWN_NS 20000000L /* ... for at most this long: prefill's jobs are long */
#define STER_POOL_MISSES 8            /* consecutive jobs without helper work that trigger it */
#define STER_POOL_WINDOW 64           /* shared jobs whose time is weighed against going alone */
#define STER_POOL_MAX_MULT 32         /* the longest cooldown, in multiples of the first */

typedef void (*ster_task_fn)(void* ctx, long chunk, int tid);

/* Read-ahead hints: memory the caller will use next (the following weight matrices of a
 * decode step). Helpers that wait for the next job touch it with prefetches meanwhile, so
 * the time the caller spends between jobs (Python, small ops) moves weights toward the
 * caches instead of leaving the memory bus idle. Up to STER_HINTS ranges; a new hint
 * replaces the old one (gen counts hints; ranges are read after gen, written before). */
#define STER_HINTS 4
static struct {
    _Alignas(64) atomic_uint gen;
    const char* ptr[STER_HINTS];
    long len[STER_HINTS];
    int n;
} ster_hint;

static void ster_pool_hint(int n, const char* const* ptr, const long* len) {
    int i;
    if (n > STER_HINTS) n = STER_HINTS;
    for (i = 0; i < n; i++) { ster_hint.ptr[i] = ptr[i]; ster_hint.len[i] = len[i]; }
    ster_hint.n = n;
    atomic_fetch_add_explicit(&ster_hint.gen, 1, memory_order_release);
}

/* The claim word, the done counter and the job description live on separate cache lines:
 * helpers re-read the job on every claim while the word bounces between cores. */
#define STER_LINE 64
static struct {
    _Alignas(STER_LINE) atomic_uint_fast64_t word;   /* gen << 32 | next chunk */
    _Alignas(STER_LINE) atomic_long done;            /* chunks finished in the current job */
    /* the current job (written by the caller before the word is published) */
    _Alignas(STER_LINE) ster_task_fn fn;
    void* ctx;
    long n;
    int nthreads;
    _Alignas(STER_LINE) atomic_int sleepers;
    int started;                  /* helpers created */
    int cooldown;                 /* jobs left to run alone (helpers were not getting a core) */
    long cooldown_end;            /* ... until this time (ster_now_ns) at the latest */
    int misses;                   /* consecutive jobs in which no helper ran a chunk */
    /* throughput of sharing, measured: over a window of shared jobs, the time they took against
     * the time the caller alone would have taken (its own time per chunk in each job, times the
     * job's chunks). A window that sharing lost starts a cooldown, longer each time in a row. */
    long win_alone_ns, win_shared_ns;
    int win_jobs, mult;
    pthread_mutex_t mu;           /* with cv: sleeping helpers */
    pthread_cond_t cv;
    pthread_mutex_t caller;       /* one job at a time */
    /* statistics (caller side, read by ster_pool_stats) */
    long stat_jobs, stat_alone, stat_wait_ns, stat_work_ns;
} ster_pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
               .caller = PTHREAD_MUTEX_INITIALIZER};

static inline void ster_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline long ster_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Claim and run chunks of generation gen until none is left; returns how many ran. */
static long ster_pool_work(uint32_t gen, int tid) {
    long ran = 0;
    for (;;) {
        uint_fast64_t w = atomic_load_explicit(&ster_pool.word, memory_order_acquire);
        if ((uint32_t)(w >> 32) != gen) return ran;
        /* Read the job before claiming: if the claim succeeds the job is still gen's. */
        ster_task_fn fn = ster_pool.fn;
        void* ctx = ster_pool.ctx;
        long n = ster_pool.n;
        long c = (long)(uint32_t)w;
        if (c >= n || tid >= ster_pool.nthreads) return ran;
        if (!atomic_compare_exchange_weak_explicit(&ster_pool.word, &w, w + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(ctx, c, tid);
        atomic_fetch_add_explicit(&ster_pool.done, 1, memory_order_release);
        ran++;
    }
}

static void* ster_pool_helper(void* arg) {
    int tid = (int)(intptr_t)arg;
    const long spin_ns = ster_pool_spin_ns;
    uint32_t seen = (uint32_t)(atomic_load(&ster_pool.word) >> 32);
    unsigned hint_seen = atomic_load(&ster_hint.gen);
    int h_i = 0, h_n = 0;
    const char *h_ptr[STER_HINTS], *h_cur = 0, *h_end = 0;
    long h_len[STER_HINTS];
    for (;;) {
        uint32_t gen;
        long t0 = ster_now_ns();
        int spins = 0;
        for (;;) {   /* spin, then sleep, until a new generation is published */
            gen = (uint32_t)(atomic_load_explicit(&ster_pool.word, memory_order_acquire) >> 32);
            if (gen != seen) break;
            /* only the first helper reads ahead: one stream is enough to keep the bus busy */
            if (tid == 1) {
                unsigned hg = atomic_load_explicit(&ster_hint.gen, memory_order_acquire);
                if (hg != hint_seen) {   /* a new hint: start on its first range */
                    int i;
                    hint_seen = hg;
                    h_n = ster_hint.n;
                    for (i = 0; i < h_n; i++) { h_ptr[i] = ster_hint.ptr[i]; h_len[i] = ster_hint.len[i]; }
                    h_i = 0;
                    h_cur = h_n ? h_ptr[0] : 0;
                    h_end = h_n ? h_ptr[0] + h_len[0] : 0;
                }
                if (h_cur < h_end) {     /* a few lines per turn, then look for a job again */
                    int k;
                    for (k = 0; k < 4 && h_cur < h_end; k++, h_cur += 64) __builtin_prefetch(h_cur, 0, 2);
                    if (h_cur >= h_end) {
                        if (++h_i < h_n) { h_cur = h_ptr[h_i]; h_end = h_cur + h_len[h_i]; }
                        else t0 = ster_now_ns();  /* the spin time before sleeping starts after the read-ahead */
                    }
                    continue;            /* (no clock reads while reading ahead: they showed in profiles) */
                }
            }
            ster_cpu_relax();
            if (++spins % 256 == 0 && ster_now_ns() - t0 > spin_ns) {
                pthread_mutex_lock(&ster_pool.mu);
                atomic_fetch_add(&ster_pool.sleepers, 1);
                while ((uint32_t)(atomic_load(&ster_pool.word) >> 32) == seen)
                    pthread_cond_wait(&ster_pool.cv, &ster_pool.mu);
                atomic_fetch_sub(&ster_pool.sleepers, 1);
                pthread_mutex_unlock(&ster_pool.mu);
                t0 = ster_now_ns();
            }
        }
        seen = gen;
        ster_pool_work(gen, tid);
    }
    return 0;
}

static void ster_pool_after_fork(void) {
    /* The child has no helpers; every lock is re-made, the generation kept. */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER, c2 = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    ster_pool.mu = m;
    ster_pool.caller = c2;
    ster_pool.cv = cv;
    ster_pool.started = 0;
    atomic_store(&ster_pool.sleepers, 0);
}

/* Make sure helpers 1 .. want-1 exist (called with the caller lock held). */
static void ster_pool_grow(int want) {
    static int atfork_done = 0;
    if (!atfork_done) {
        const char* env = getenv("STER_SPIN_US");
        ster_pool_spin_ns = env && *env ? atol(env) * 1000L : STER_POOL_SPIN_NS;
        pthread_atfork(0, 0, ster_pool_after_fork);
        atfork_done = 1;
    }
    if (want > STER_POOL_MAX) want = STER_POOL_MAX;
    while (ster_pool.started + 1 < want) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &at, ster_pool_helper, (void*)(intptr_t)(ster_pool.started + 1)) != 0) {
            pthread_attr_destroy(&at);
            break;
        }
        pthread_attr_destroy(&at);
        ster_pool.started++;
    }
}

/* Run fn(ctx, chunk, tid) for chunk in [0, n) on up to nthreads threads (tid < nthreads;
 * the caller is tid 0). Returns when every chunk has finished. */
static void ster_pool_run(long n, ster_task_fn fn, void* ctx, int nthreads) {
    long c;
    if (n <= 0) return;
    if (nthreads <= 1 || n == 1 || pthread_mutex_trylock(&ster_pool.caller) != 0) {
        for (c = 0; c < n; c++) fn(ctx, c, 0);
        return;
    }
    ster_pool.stat_jobs++;
    if (ster_pool.cooldown > 0 && ster_now_ns() >= ster_pool.cooldown_end) ster_pool.cooldown = 0;
    if (ster_pool.cooldown > 0) {   /* helpers were not getting a core: go alone */
        ster_pool.cooldown--;
        ster_pool.stat_alone++;
        pthread_mutex_unlock(&ster_pool.caller);
        for (c = 0; c < n; c++) fn(ctx, c, 0);
        return;
    }
    ster_pool_grow(nthreads);
    if (nthreads > ster_pool.started + 1) nthreads = ster_pool.started + 1;
    uint32_t gen = (uint32_t)(atomic_load(&ster_pool.word) >> 32) + 1;
    ster_pool.fn = fn;
    ster_pool.ctx = ctx;
    ster_pool.n = n;
    ster_pool.nthreads = nthreads;
    atomic_store_explicit(&ster_pool.done, 0, memory_order_relaxed);
    /* Sequentially consistent publish, then read sleepers: pairs with a helper that counts
     * itself asleep, then re-reads the word (neither can miss the other). */
    atomic_store(&ster_pool.word, (uint_fast64_t)gen << 32);
    int asleep = atomic_load(&ster_pool.sleepers) > 0;
    if (asleep) {
        pthread_mutex_lock(&ster_pool.mu);
        pthread_cond_broadcast(&ster_pool.cv);
        pthread_mutex_unlock(&ster_pool.mu);
    }
    long t_start = ster_now_ns();
    long mine = ster_pool_work(gen, 0);
    long t_mine = ster_now_ns() - t_start;
    /* Helpers that were awake yet missed whole jobs are not getting a core (other processes
     * hold them) and only add contention: go alone for a while, then try again. */
    ster_pool.misses = (mine == n && !asleep) ? ster_pool.misses + 1 : 0;
    if (ster_pool.misses >= STER_POOL_MISSES) {
        ster_pool.misses = 0;
        ster_pool.cooldown = STER_POOL_COOLDOWN;
        ster_pool.cooldown_end = ster_now_ns() + STER_POOL_COOLDOWN_NS;
    }
    /* Every chunk is claimed; wait for the ones helpers are still running. A wait far longer
     * than a chunk takes here means a helper lost its core mid-chunk: the next jobs then run
     * on the calling thread alone rather than stall again. */
    long per_chunk = mine > 0 ? t_mine / mine : 0;
    long stall = 4 * per_chunk > STER_POOL_STALL_NS ? 4 * per_chunk : STER_POOL_STALL_NS;
    long spins = 0, t0 = 0, t_wait = ster_now_ns();
    ster_pool.stat_work_ns += t_mine;
    while (atomic_load_explicit(&ster_pool.done, memory_order_acquire) < n) {
        ster_cpu_relax();
        if (++spins % 4096 == 0) {
            if (!t0) t0 = ster_now_ns();
            else if (ster_now_ns() - t0 > stall) {
                ster_pool.cooldown = STER_POOL_COOLDOWN;
                ster_pool.cooldown_end = ster_now_ns() + STER_POOL_COOLDOWN_NS;
            }
            sched_yield();
        }
    }
    long t_end = ster_now_ns();
    ster_pool.stat_wait_ns += t_end - t_wait;
    if (mine > 0 && mine < n) {   /* the caller and helpers both ran chunks */
        ster_pool.win_alone_ns += n * (t_mine / mine);
        ster_pool.win_shared_ns += t_end - t_start;
        if (++ster_pool.win_jobs >= STER_POOL_WINDOW) {
            if (ster_pool.mult < 1) ster_pool.mult = 1;
            if (ster_pool.win_alone_ns < ster_pool.win_shared_ns) {   /* sharing lost: go alone, longer */
                ster_pool.cooldown = STER_POOL_COOLDOWN * ster_pool.mult;
                ster_pool.cooldown_end = t_end + STER_POOL_COOLDOWN_NS * ster_pool.mult;
                if (ster_pool.mult < STER_POOL_MAX_MULT) ster_pool.mult *= 2;
            } else {
                ster_pool.mult = 1;
            }
            ster_pool.win_alone_ns = ster_pool.win_shared_ns = 0;
            ster_pool.win_jobs = 0;
        }
    }
    pthread_mutex_unlock(&ster_pool.caller);
}

/* jobs run through the pool, jobs run alone during a cooldown, ns the caller spent on its
 * own chunks of shared jobs, ns it waited for helpers' chunks. */
static void ster_pool_stats(long* out4) {
    out4[0] = ster_pool.stat_jobs;
    out4[1] = ster_pool.stat_alone;
    out4[2] = ster_pool.stat_work_ns;
    out4[3] = ster_pool.stat_wait_ns;
}

#endif /* STER_POOL_H */
