/*
 * bench-store.c: ingest benchmark of the evidence store. Writes synthetic
 * arm legs (prompts x steps of top-k ids and logits shaped like a language
 * model's: a leading logit near 15, gaps between neighbours drawn from an
 * exponential distribution, ids drawn from a vocabulary with a heavy head)
 * through store_put_leg, one transaction per leg as a gate run does, and
 * prints step rows per second and bytes on disk per step.
 *
 *   bench-store [--steps N] [--top-k K] [--vocab V] [--uniform] [--legs R] [--db PATH] [--keep]
 *               [--replay STORE]
 *
 * --legs R stores every synthetic leg R times as legs 1..R of one arm
 * (identical legs, as a healthy gate run has); the default 1 makes every
 * step unique (the worst case). --keep leaves the database file in place
 * (for sqlite3's dbstat or sqlite3_analyzer). --replay STORE replaces the
 * synthetic steps by the real ones of a gate store (every leg and prompt
 * of it, cycled: tokens, forced tokens, digests and top-k as the arms
 * answered), a realistic workload next to the synthetic headline.
 *
 * It prints the bytes on disk per step (the whole database file after a WAL
 * checkpoint divided by the step rows, so primary keys, the plain columns
 * and SQLite's page overhead are in it) and the share of the step and
 * step_top tables (their pages, from SQLite's dbstat table).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store.h"
#include "util.h"

/* CPU seconds of this process (user + system): steadier than the wall
 * clock on a shared machine. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* The steps of every (leg, prompt) of a gate store, for --replay. */
typedef struct replay_lp {
    int n;
    store_step *steps;
    tg_top *tops;
} replay_lp;

/* Loads every (leg, prompt) with steps of the store at path into *out.
 * Returns the count, or -1 with a message on stderr. */
static int replay_load(const char *path, replay_lp **out)
{
    tg_store *src;
    tg_err e = {{0}};
    if (store_open(&src, path, &e) < 0) {
        fprintf(stderr, "bench-store: --replay: %s\n", e.msg);
        return -1;
    }
    sqlite3 *db = store_db(src);
    sqlite3_stmt *q, *qs;
    sqlite3_prepare_v2(db, "SELECT DISTINCT leg_id, prompt_id FROM step ORDER BY 1, 2", -1, &q, NULL);
    sqlite3_prepare_v2(db, "SELECT step, token, forced, digest FROM step WHERE leg_id=?1 AND prompt_id=?2"
                           " ORDER BY step", -1, &qs, NULL);
    int n = 0;
    replay_lp *v = NULL;
    while (sqlite3_step(q) == SQLITE_ROW) {
        int64_t leg = sqlite3_column_int64(q, 0), pid = sqlite3_column_int64(q, 1);
        store_tops t;
        if (store_tops_read(db, leg, pid, &t, &e) < 0) {
            fprintf(stderr, "bench-store: --replay: %s\n", e.msg);
            return -1;
        }
        v = realloc(v, sizeof *v * (size_t)(n + 1));
        replay_lp *r = &v[n++];
        r->n = t.n;
        r->steps = calloc((size_t)(t.n ? t.n : 1), sizeof *r->steps);
        size_t total = t.n ? t.off[t.n - 1] + (size_t)t.n_top[t.n - 1] : 0;
        r->tops = malloc(sizeof *r->tops * (total ? total : 1));
        if (total) memcpy(r->tops, t.top, sizeof *r->tops * total);
        sqlite3_reset(qs);
        sqlite3_bind_int64(qs, 1, leg);
        sqlite3_bind_int64(qs, 2, pid);
        for (int i = 0; i < t.n && sqlite3_step(qs) == SQLITE_ROW; i++) {
            store_step *sp = &r->steps[i];
            sp->step = sqlite3_column_int(qs, 0);
            sp->token = sqlite3_column_int(qs, 1);
            sp->forced = sqlite3_column_type(qs, 2) == SQLITE_NULL ? -1 : sqlite3_column_int(qs, 2);
            if (sqlite3_column_type(qs, 3) != SQLITE_NULL)
                snprintf(sp->digest, sizeof sp->digest, "%016llx", (unsigned long long)sqlite3_column_int64(qs, 3));
            sp->n_top = t.n_top[i];
            sp->top = r->tops + t.off[i];
        }
        store_tops_free(&t);
    }
    sqlite3_finalize(q);
    sqlite3_finalize(qs);
    store_close(src);
    if (n == 0) fprintf(stderr, "bench-store: --replay: %s has no steps\n", path);
    *out = v;
    return n ? n : -1;
}

int main(int argc, char **argv)
{
    int total = 200000, k = 32, vocab = 151936, uniform = 0, repeat = 1, keep = 0;
    const char *db = "/tmp/bench-store.db", *replay = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) total = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--top-k") && i + 1 < argc) k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--db") && i + 1 < argc) db = argv[++i];
        else if (!strcmp(argv[i], "--uniform")) uniform = 1;
        else if (!strcmp(argv[i], "--keep")) keep = 1;
        else if (!strcmp(argv[i], "--replay") && i + 1 < argc) replay = argv[++i];
        else if (!strcmp(argv[i], "--legs") && i + 1 < argc) repeat = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench-store [--steps N] [--top-k K] [--vocab V] [--uniform] [--legs R] [--db PATH] [--keep] [--replay STORE]\n");
            return 2;
        }
    }
    if (k < 2 || k > 4096 || vocab < k || total < 1 || repeat < 1) {
        fprintf(stderr, "bench-store: need 2 <= top-k <= 4096, vocab >= top-k, steps >= 1\n");
        return 2;
    }
    replay_lp *rp = NULL;
    int n_rp = 0;
    if (replay && (n_rp = replay_load(replay, &rp)) < 0) return 1;
    char wal[4200];
    snprintf(wal, sizeof wal, "%s-wal", db);
    unlink(db), unlink(wal);
    tg_err e = {{0}};
    tg_store *st;
    if (store_open(&st, db, &e) < 0) {
        fprintf(stderr, "bench-store: %s\n", e.msg);
        return 1;
    }
    enum { PROMPTS = 6, STEPS = 48 };
    int per_leg0 = PROMPTS * STEPS;
    int n_arms = ((total + per_leg0 - 1) / per_leg0 + repeat - 1) / repeat;
    store_arm *arms = calloc((size_t)n_arms, sizeof *arms);
    char (*names)[16] = calloc((size_t)n_arms, sizeof *names);
    for (int a = 0; a < n_arms; a++) {
        snprintf(names[a], sizeof names[a], "arm%d", a + 1);
        arms[a] = (store_arm){names[a], "engine", "test", "{}"};
    }
    store_prompt pr[PROMPTS] = {{"p1", "a"}, {"p2", "b"}, {"p3", "c"},
                                {"p4", "d"}, {"p5", "e"}, {"p6", "f"}};
    store_run_info ri = {.spec_name = "bench", .spec_sha256 = "00", .artifact_path = "m.gguf",
                         .artifact_sha256 = "11", .mode = "teacher-forced",
                         .reference = "cpu", .policy_kind = "exact", .steps = STEPS,
                         .top_k = k, .legs = repeat, .n_arms = n_arms, .arms = arms,
                         .n_prompts = PROMPTS, .prompts = pr};
    int64_t run;
    if (store_begin_run(st, &ri, &run, &e) < 0) {
        fprintf(stderr, "bench-store: %s\n", e.msg);
        return 1;
    }
    int per_leg = PROMPTS * STEPS;
    int n_legs = n_arms * repeat;
    tg_top *tops = malloc(sizeof *tops * (size_t)per_leg * (size_t)k);
    store_step *steps = malloc(sizeof *steps * (size_t)per_leg);
    store_leg_prompt lps[PROMPTS];
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double t_put = 0, c_put = 0;
    long rows = 0;
    for (int L = 0; L < n_legs; L++) {
        for (int i = 0; i < per_leg && L % repeat == 0 && !replay; i++) {
            tg_top *t = tops + (size_t)i * (size_t)k;
            float x = (float)(15.0 + 3.0 * (urand() - 0.5));
            for (int j = 0; j < k; j++) {
                int32_t id;
                int dup;
                do {
                    double u = urand();
                    id = uniform ? (int32_t)(u * vocab) : (int32_t)(pow(u, 3.0) * vocab);
                    dup = 0;
                    for (int q = 0; q < j; q++) dup |= t[q].id == id;
                } while (dup);
                t[j].id = id;
                t[j].logit = x;
                x -= (float)(-0.15 * log(1.0 - urand()));
            }
            steps[i].step = i % STEPS;
            steps[i].token = t[0].id;
            steps[i].forced = -1;
            snprintf(steps[i].digest, sizeof steps[i].digest, "%016llx",
                     (unsigned long long)(rng ^ (uint64_t)i));
            steps[i].n_top = k;
            steps[i].top = t;
        }
        for (int p = 0; p < PROMPTS; p++)
            lps[p] = (store_leg_prompt){.prompt_id = pr[p].id, .ids = ids, .n_ids = 8,
                                        .decoded_from = ids, .n_decoded_from = 8,
                                        .n_steps = STEPS, .steps = steps + p * STEPS};
        if (replay) /* the real steps, cycled over the store's (leg, prompt)s */
            for (int p = 0; p < PROMPTS; p++) {
                const replay_lp *r = &rp[((L / repeat) * PROMPTS + p) % n_rp];
                lps[p].n_steps = r->n < STEPS ? r->n : STEPS;
                lps[p].steps = r->steps;
            }
        int leg_rows = per_leg;
        if (replay) {
            leg_rows = 0;
            for (int p = 0; p < PROMPTS; p++) leg_rows += lps[p].n_steps;
        }
        store_leg leg = {.run_id = run, .arm = names[L / repeat], .leg = L % repeat + 1, .binary_path = "tg-engine",
                         .binary_sha256 = "22", .version = "0", .n_prompts = PROMPTS,
                         .prompts = lps, .stderr_text = "", .stderr_len = 0};
        double t0 = tg_now(), c0 = cpu_now();
        if (store_put_leg(st, &leg, &e) < 0) {
            fprintf(stderr, "bench-store: %s\n", e.msg);
            return 1;
        }
        t_put += tg_now() - t0;
        c_put += cpu_now() - c0;
        rows += leg_rows;
    }
    sqlite3_exec(store_db(st), "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    sqlite3_stmt *s;
    double top_b = 0, step_b = 0;
    sqlite3_prepare_v2(store_db(st), "SELECT name, sum(pgsize) FROM dbstat WHERE name IN ('step', 'step_top')"
                                     " GROUP BY name", -1, &s, NULL);
    while (sqlite3_step(s) == SQLITE_ROW) {
        double b = sqlite3_column_double(s, 1) / (double)rows;
        if (!strcmp((const char *)sqlite3_column_text(s, 0), "step")) step_b = b;
        else top_b = b;
    }
    sqlite3_finalize(s);
    store_close(st);
    struct stat sb;
    stat(db, &sb);
    if (replay)
        printf("bench-store: %ld step rows replayed from %s (%d prompt legs) in %d legs, %d identical per arm\n",
               rows, replay, n_rp, n_legs, repeat);
    else
        printf("bench-store: %ld step rows (top-%d, vocab %d, ids %s) in %d legs, %d identical per arm\n",
               rows, k, vocab, uniform ? "uniform" : "head-heavy", n_legs, repeat);
    printf("ingest: %.0f step rows/s wall (%.3f s in store_put_leg), %.0f step rows/s of CPU time (%.3f s)\n",
           rows / t_put, t_put, rows / c_put, c_put);
    printf("disk: %.1f bytes per step (file %lld bytes): step table %.1f, step_top table %.1f\n",
           (double)sb.st_size / (double)rows, (long long)sb.st_size, step_b, top_b);
    free(tops);
    free(arms);
    free(names);
    free(steps);
    for (int i = 0; i < n_rp; i++) free(rp[i].steps), free(rp[i].tops);
    free(rp);
    if (!keep) unlink(db);
    return 0;
}
