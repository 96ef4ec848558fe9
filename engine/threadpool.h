/*
 * threadpool.h: a fixed pool of worker threads for the cpu tier.
 *
 * One job at a time over n items: each thread of the pool starts on its own
 * contiguous share of [0, n) (thread i: [n*i/nth, n*(i+1)/nth)) and takes
 * it from the front, a quarter of what is left at a time; a thread whose
 * share is used up steals a quarter of what is left of another thread's
 * share, from the back, until nothing is left anywhere. Every item runs
 * exactly once, and a thread's pieces are runs of consecutive items (a
 * matmul's rows stream in order). A worker that the OS has not scheduled
 * yet loses its share to the others, so on a busy machine a job still
 * finishes at single-thread speed instead of waiting for a sleeping
 * thread; there is one atomic operation per piece, not per item.
 *
 * Which thread runs an item must not change its result: a job writes each
 * output from one item only (e.g. a row range of a matmul), so the bytes do
 * not depend on the thread count or on timing.
 *
 * Idle workers spin briefly for the next job (decode dispatches a few
 * hundred jobs per token) and then sleep on a condition variable, so an idle
 * pool costs no CPU.
 */
#ifndef TG_THREADPOOL_H
#define TG_THREADPOOL_H

typedef struct tg_pool tg_pool;

/* Runs items [i0, i1) of a job (i0 < i1); ith in [0, pool size) names the
 * thread (for per-thread scratch buffers; 0 is the caller). */
typedef void (*tg_pool_range_fn)(void *ctx, int i0, int i1, int ith);
/* Runs item `chunk` of a job (tg_pool_run). */
typedef void (*tg_pool_fn)(void *ctx, int chunk, int ith);

#define TG_POOL_MAX_CHUNKS (1 << 24)

/* Starts nth-1 worker threads (nth >= 1; 1 means the caller works alone).
 * Returns the pool, or NULL when a thread cannot be created. */
tg_pool *tg_pool_new(int nth);
/* Stops and joins the workers; NULL is a no-op. */
void tg_pool_free(tg_pool *p);
/* Threads in the pool, the caller included. */
int tg_pool_size(const tg_pool *p);
/* Calls fn(ctx, i0, i1, ith) on runs [i0, i1) that together cover [0, n)
 * exactly once (n <= TG_POOL_MAX_CHUNKS), on the pool's threads, and waits
 * for all of them. A NULL pool or a pool of one thread calls fn(ctx, 0, n,
 * 0) once (n > 0). Not reentrant: one caller thread at a time. */
void tg_pool_run_ranges(tg_pool *p, int n, tg_pool_range_fn fn, void *ctx);
/* tg_pool_run_ranges with one call per item: fn(ctx, c, ith) for every c
 * in [0, n_chunks). */
void tg_pool_run(tg_pool *p, int n_chunks, tg_pool_fn fn, void *ctx);

#endif
