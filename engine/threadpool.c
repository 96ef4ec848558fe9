/*
 * threadpool.c: the cpu tier's worker threads (see threadpool.h).
 *
 * The job word packs (generation:16 | n_chunks:24 | next chunk:24) in one
 * 64-bit atomic. A thread claims a chunk by a compare-and-swap that bumps
 * `next` while next < n_chunks, both read from the same word, so a late
 * worker can never claim a chunk of a job that is over. While a claimed
 * chunk runs, its job cannot finish, so fn/ctx (written before the word is
 * published) are stable for the claimant. `done` counts finished chunks of
 * the current job; the caller returns when it reaches n_chunks.
 *
 * Workers wait for a new generation: a short spin, then a sleep on `cond`
 * (the publisher broadcasts only when someone sleeps). The caller waits for
 * the last chunks with a spin that yields the CPU after a while.
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

#define W_NEXT(w) ((uint32_t)((w) & 0xffffffu))
#define W_N(w) ((uint32_t)(((w) >> 24) & 0xffffffu))
#define W_GEN(w) ((uint32_t)((w) >> 48))

typedef struct worker {
    tg_pool *pool;
    int ith;
    pthread_t tid;
} worker;

struct tg_pool {
    int nth;
    worker *workers;            /* nth - 1 entries (thread 0 is the caller) */
    tg_pool_fn fn;              /* the current job */
    void *ctx;
    _Atomic uint64_t word;      /* gen | n_chunks | next */
    atomic_int done;            /* chunks of the current job finished */
    atomic_int sleeping;        /* workers blocked on cond */
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cond;
};

/* Claims and runs chunks of the current job until none is left. */
static void work(tg_pool *p, int ith)
{
    uint64_t w = atomic_load_explicit(&p->word, memory_order_acquire);
    while (W_NEXT(w) < W_N(w)) {
        if (atomic_compare_exchange_weak_explicit(&p->word, &w, w + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            p->fn(p->ctx, (int)W_NEXT(w), ith);
            atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
            w = atomic_load_explicit(&p->word, memory_order_acquire);
        }
    }
}

/* Waits for a generation other than seen; returns it. */
static uint32_t wait_job(tg_pool *p, uint32_t seen)
{
    for (int i = 0; i < SPIN_WAIT; i++) {
        uint32_t g = W_GEN(atomic_load_explicit(&p->word, memory_order_acquire));
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
            return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleeping, 1);
    uint32_t g;
    while ((g = W_GEN(atomic_load_explicit(&p->word, memory_order_acquire))) == seen && !atomic_load(&p->stop))
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
        work(p, wk->ith);
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
    atomic_init(&p->word, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleeping, 0);
    atomic_init(&p->stop, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->workers = calloc((size_t)nth, sizeof *p->workers);
    if (!p->workers) {
        tg_pool_free(p);
        return NULL;
    }
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
    free(p);
}

int tg_pool_size(const tg_pool *p)
{
    return p ? p->nth : 1;
}

void tg_pool_run(tg_pool *p, int n_chunks, tg_pool_fn fn, void *ctx)
{
    assert(n_chunks >= 0 && n_chunks <= TG_POOL_MAX_CHUNKS);
    if (!p || p->nth == 1 || n_chunks <= 1) {
        for (int c = 0; c < n_chunks; c++)
            fn(ctx, c, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint64_t w = atomic_load_explicit(&p->word, memory_order_relaxed);
    uint64_t gen = (uint64_t)((W_GEN(w) + 1) & 0xffffu);
    atomic_store_explicit(&p->word, gen << 48 | (uint64_t)n_chunks << 24, memory_order_release);
    wake(p);
    work(p, 0);
    for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_chunks; i++) {
        if (i < SPIN_DONE)
            cpu_relax();
        else
            sched_yield();
    }
}
