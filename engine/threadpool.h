/*
 * threadpool.h: a fixed pool of worker threads for the cpu tier.
 *
 * One job at a time: tg_pool_run() splits a job into n_chunks chunks and
 * returns when every chunk has run exactly once. Chunks are claimed
 * dynamically (an atomic counter), so a worker that the OS has not
 * scheduled yet simply takes none and the caller's thread (which works too)
 * does its share; on a busy machine the job still finishes at single-thread
 * speed instead of waiting for a sleeping thread. Which thread runs a chunk
 * must not change its result: a job writes each output from one chunk only
 * (e.g. a row range of a matmul), so the bytes do not depend on the thread
 * count or on timing.
 *
 * Idle workers spin briefly for the next job (decode dispatches a few
 * hundred jobs per token) and then sleep on a condition variable, so an idle
 * pool costs no CPU.
 */
#ifndef TG_THREADPOOL_H
#define TG_THREADPOOL_H

typedef struct tg_pool tg_pool;

/* Runs chunk `chunk` of a job; ith in [0, pool size) names the thread (for
 * per-thread scratch buffers; 0 is the caller). */
typedef void (*tg_pool_fn)(void *ctx, int chunk, int ith);

#define TG_POOL_MAX_CHUNKS (1 << 24)

/* Starts nth-1 worker threads (nth >= 1; 1 means the caller works alone).
 * Returns the pool, or NULL when a thread cannot be created. */
tg_pool *tg_pool_new(int nth);
/* Stops and joins the workers; NULL is a no-op. */
void tg_pool_free(tg_pool *p);
/* Threads in the pool, the caller included. */
int tg_pool_size(const tg_pool *p);
/* Calls fn(ctx, c, ith) once for every c in [0, n_chunks) (n_chunks <=
 * TG_POOL_MAX_CHUNKS) on the pool's threads and waits for all of them.
 * Not reentrant: one caller thread at a time. */
void tg_pool_run(tg_pool *p, int n_chunks, tg_pool_fn fn, void *ctx);

#endif
