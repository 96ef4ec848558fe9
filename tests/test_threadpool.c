/*
 * test_threadpool.c: the cpu tier's thread pool (engine/threadpool.c):
 * - tg_pool_run_ranges runs every item of [0, n) exactly once, in runs of
 *   consecutive items with a valid thread index, for pools of 1 to 5
 *   threads and n from 0 to past a few thousand;
 * - a thread that stalls mid-job loses what is left of its share to the
 *   others (stealing), and the job still covers every item once;
 * - many jobs in a row (generations) never mix their items;
 * - tg_pool_run calls fn once per item; a NULL pool runs on the caller.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "threadpool.h"

enum { NMAX = 5000, THREADS_MAX = 5 };

/* What a job saw: how many times each item ran, by which thread, and the
 * number of runs. */
typedef struct seen {
    atomic_int hits[NMAX];
    atomic_int runs;
    atomic_int bad_ith;
    int nth;
    int stall_ith;      /* a thread that sleeps in its first run (-1: none) */
    atomic_int stalled;
    int job;            /* tag written into out[] by each run */
    int out[NMAX];
} seen;

static void reset(seen *s, int nth, int job)
{
    for (int i = 0; i < NMAX; i++) atomic_store(&s->hits[i], 0);
    atomic_store(&s->runs, 0);
    atomic_store(&s->bad_ith, 0);
    atomic_store(&s->stalled, 0);
    s->nth = nth;
    s->job = job;
}

static void mark(void *ctx, int i0, int i1, int ith)
{
    seen *s = ctx;
    if (ith < 0 || ith >= s->nth || i0 >= i1)
        atomic_fetch_add(&s->bad_ith, 1);
    if (ith == s->stall_ith && !atomic_exchange(&s->stalled, 1)) {
        const struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&s->runs, 1);
    for (int i = i0; i < i1; i++) {
        atomic_fetch_add(&s->hits[i], 1);
        s->out[i] = s->job;
    }
}

/* Fails unless every item of [0, n) ran once and nothing else did. */
static void check_once(const seen *s, int n, const char *what)
{
    if (atomic_load(&s->bad_ith))
        fail_msg("%s: a run with a bad thread index or an empty range", what);
    for (int i = 0; i < NMAX; i++) {
        const int h = atomic_load(&s->hits[i]);
        if (h != (i < n))
            fail_msg("%s: item %d ran %d times (n %d)", what, i, h, n);
    }
}

static void ranges_cover_once(void **state)
{
    (void)state;
    static const int ns[] = {0, 1, 2, 3, 7, 16, 100, 257, 4999};
    static seen s;
    for (int nth = 1; nth <= THREADS_MAX; nth++) {
        tg_pool *p = tg_pool_new(nth);
        assert_non_null(p);
        assert_int_equal(tg_pool_size(p), nth);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            char what[64];
            snprintf(what, sizeof what, "%d threads, n %d", nth, ns[k]);
            s.stall_ith = -1;
            reset(&s, nth, 1);
            tg_pool_run_ranges(p, ns[k], mark, &s);
            check_once(&s, ns[k], what);
            /* pieces, not items: far fewer runs than items */
            if (ns[k] >= 1000 && atomic_load(&s.runs) > ns[k] / 8)
                fail_msg("%s: %d runs for %d items (one per item?)", what, atomic_load(&s.runs), ns[k]);
        }
        tg_pool_free(p);
    }
}

static void stalled_thread_is_robbed(void **state)
{
    (void)state;
    static seen s;
    for (int nth = 2; nth <= 3; nth++) {
        tg_pool *p = tg_pool_new(nth);
        assert_non_null(p);
        for (int stall = 0; stall < nth; stall++) {
            char what[64];
            snprintf(what, sizeof what, "%d threads, thread %d stalls", nth, stall);
            s.stall_ith = stall;
            reset(&s, nth, 2);
            tg_pool_run_ranges(p, 4000, mark, &s);
            check_once(&s, 4000, what);
        }
        tg_pool_free(p);
    }
}

static void jobs_do_not_mix(void **state)
{
    (void)state;
    static seen s;
    tg_pool *p = tg_pool_new(3);
    assert_non_null(p);
    s.stall_ith = -1;
    for (int job = 0; job < 70000; job++) {   /* past the 16-bit generation's wrap */
        const int n = 1 + job % 37;
        reset(&s, 3, job);
        tg_pool_run_ranges(p, n, mark, &s);
        for (int i = 0; i < n; i++)
            if (atomic_load(&s.hits[i]) != 1 || s.out[i] != job)
                fail_msg("job %d (n %d): item %d ran %d times, tag %d", job, n, i, atomic_load(&s.hits[i]),
                         s.out[i]);
    }
    tg_pool_free(p);
}

typedef struct items {
    atomic_int hits[64];
} items;

static void one_item(void *ctx, int c, int ith)
{
    (void)ith;
    items *it = ctx;
    atomic_fetch_add(&it->hits[c], 1);
}

static void run_calls_each_item(void **state)
{
    (void)state;
    for (int nth = 0; nth <= 4; nth++) {
        tg_pool *p = nth ? tg_pool_new(nth) : NULL;   /* 0: a NULL pool */
        items it;
        for (int i = 0; i < 64; i++) atomic_store(&it.hits[i], 0);
        tg_pool_run(p, 50, one_item, &it);
        for (int i = 0; i < 64; i++)
            if (atomic_load(&it.hits[i]) != (i < 50))
                fail_msg("tg_pool_run, %d threads: item %d ran %d times", nth, i, atomic_load(&it.hits[i]));
        tg_pool_free(p);
    }
    assert_int_equal(tg_pool_size(NULL), 1);
    tg_pool_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranges_cover_once),
        cmocka_unit_test(stalled_thread_is_robbed),
        cmocka_unit_test(jobs_do_not_mix),
        cmocka_unit_test(run_calls_each_item),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
