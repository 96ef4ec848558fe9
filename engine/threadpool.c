/*
 * threadpool.c: the cpu tier's worker threads (see threadpool.h).
 *
 * A job is published as a generation number `gen`, after fn, ctx, n and
 * every thread's share: one 64-bit word per thread packing
 * (generation:16 | lo:24 | hi:24), the items [lo, hi) of that share not
 * claimed yet. The owner claims [lo, lo + k) and a thief [hi - k, hi),
 * each by a compare-and-swap of the whole word, so a piece is claimed once
 * and a claim names the job's generation: a late thread that still holds a
 * word of an earlier job fails its swap. While a claimed piece runs, its
 * job cannot finish, so fn/ctx are stable for the claimant. `done` counts
 * finished items of the current job, each thread adding what it ran once
 * it finds nothing left (one atomic add per thread and job, on a cache
 * line of its own); the caller returns when it reaches n.
 *
 * Workers wait for a new generation: a short spin, then a sleep on `cond`
 * (the publisher broadcasts only when someone sleeps). The caller waits for
 * the last pieces with a spin that yields the CPU after a while.
 */
#include "threadpool.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

enum { SPIN_WAIT = 20000, SPIN_DONE = 1000 };

#define S_LO(w) ((int)((w) >> 24 & 0xffffffu))
#define S_HI(w) ((int)((w) & 0xffffffu))
#define S_GEN(w) ((uint32_t)((w) >> 48))
#define S_PACK(g, lo, hi) ((uint64_t)(g) << 48 | (uint64_t)(lo) << 24 | (uint64_t)(hi))

typedef struct worker {
    tg_pool *pool;
    int ith;
    pthread_t tid;
} worker;

/* One thread's share of the current job, on a cache line of its own. */
typedef struct share {
    _Atomic uint64_t word;      /* gen | lo | hi */
    char pad[64 - sizeof(uint64_t)];
} share;

struct tg_pool {
    int nth;
    worker *workers;            /* nth - 1 entries (thread 0 is the caller) */
    share *shares;              /* nth entries, 64-byte aligned */
    tg_pool_range_fn fn;        /* the current job */
    void *ctx;
    _Atomic uint32_t gen;       /* the current job's generation (16 bits) */
    char pad[64];               /* done apart from what claims read */
    atomic_int done;            /* items of the current job finished */
    atomic_int sleeping;        /* workers blocked on cond */
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cond;
};

/* Claims a quarter (at least one) of what is left of share s of job gen,
 * from the front (own share) or the back (stealing), and runs it. Returns
 * the items run, 0 when the share is empty or of another job. */
static int claim_run(tg_pool *p, share *s, uint32_t gen, int front, int ith)
{
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    for (;;) {
        const int lo = S_LO(w), hi = S_HI(w);
        if (S_GEN(w) != gen || lo >= hi)
            return 0;
        const int k = (hi - lo) / 4 > 0 ? (hi - lo) / 4 : 1;
        const uint64_t nw = front ? S_PACK(gen, lo + k, hi) : S_PACK(gen, lo, hi - k);
        if (atomic_compare_exchange_weak_explicit(&s->word, &w, nw, memory_order_acq_rel, memory_order_acquire)) {
            const int i0 = front ? lo : hi - k;
            p->fn(p->ctx, i0, i0 + k, ith);
            return k;
        }
    }
}

/* Runs thread ith's share of job gen, then steals from the others until
 * every share is empty. */
static void work(tg_pool *p, int ith, uint32_t gen)
{
    int ran = 0, k;
    while ((k = claim_run(p, &p->shares[ith], gen, 1, ith)) > 0)
        ran += k;
    for (int j = 1; j < p->nth; j++) {
        share *v = &p->shares[(ith + j) % p->nth];
        while ((k = claim_run(p, v, gen, 0, ith)) > 0)
            ran += k;
    }
    if (ran)
        atomic_fetch_add_explicit(&p->done, ran, memory_order_release);
}

/* Waits for a generation other than seen; returns it. */
static uint32_t wait_job(tg_pool *p, uint32_t seen)
{
    for (int i = 0; i < SPIN_WAIT; i++) {
        uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
            return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleeping, 1);
    uint32_t g;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->cond, &p->mu);
    atomic_fetch_sub(&p->sleeping, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *arg)
{
    worker *wk = arg;
    tg_pool *p = wk->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_job(p, seen);
        if (atomic_load(&p->stop))
            return NULL;
        work(p, wk->ith, seen);
    }
}

static void wake(tg_pool *p)
{
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->mu);
    }
}

tg_pool *tg_pool_new(int nth)
{
    if (nth < 1)
        nth = 1;
    tg_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->nth = 1;
    atomic_init(&p->gen, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleeping, 0);
    atomic_init(&p->stop, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->workers = calloc((size_t)nth, sizeof *p->workers);
    p->shares = aligned_alloc(64, (size_t)nth * sizeof *p->shares);
    if (!p->workers || !p->shares) {
        tg_pool_free(p);
        return NULL;
    }
    for (int i = 0; i < nth; i++)
        atomic_init(&p->shares[i].word, 0);
    for (int i = 1; i < nth; i++) {
        worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            tg_pool_free(p);     /* joins the p->nth - 1 started so far */
            return NULL;
        }
        p->nth = i + 1;
    }
    return p;
}

void tg_pool_free(tg_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nth; i++)
        pthread_join(p->workers[i - 1].tid, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cond);
    free(p->workers);
    free(p->shares);
    free(p);
}

int tg_pool_size(const tg_pool *p)
{
    return p ? p->nth : 1;
}

void tg_pool_run_ranges(tg_pool *p, int n, tg_pool_range_fn fn, void *ctx)
{
    assert(n >= 0 && n <= TG_POOL_MAX_CHUNKS);
    if (n == 0)
        return;
    if (!p || p->nth == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint32_t gen = (atomic_load_explicit(&p->gen, memory_order_relaxed) + 1) & 0xffffu;
    for (int i = 0; i < p->nth; i++) {
        const int lo = (int)((int64_t)n * i / p->nth), hi = (int)((int64_t)n * (i + 1) / p->nth);
        atomic_store_explicit(&p->shares[i].word, S_PACK(gen, lo, hi), memory_order_release);
    }
    atomic_store_explicit(&p->gen, gen, memory_order_release);
    wake(p);
    work(p, 0, gen);
    for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n; i++) {
        if (i < SPIN_DONE)
            cpu_relax();
        else
            sched_yield();
    }
}

/* tg_pool_run's job: one call of fn per item of a run. */
typedef struct per_item {
    tg_pool_fn fn;
    void *ctx;
} per_item;

static void run_items(void *ctx, int i0, int i1, int ith)
{
    const per_item *pi = ctx;
    for (int c = i0; c < i1; c++)
        pi->fn(pi->ctx, c, ith);
}

void tg_pool_run(tg_pool *p, int n_chunks, tg_pool_fn fn, void *ctx)
{
    per_item pi = {fn, ctx};
    tg_pool_run_ranges(p, n_chunks, run_items, &pi);
}
