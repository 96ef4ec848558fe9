/*
 * test_crash.c: crash safety of the store. `tokgate gate` runs a short spec
 * on the shipped tiny trained model (2 prompts x 8 steps x 2 legs; arms:
 * llama.cpp's CPU build as reference, the engine's ref and cpu tiers) and
 * is killed with SIGKILL at a random moment, again and again (50 trials).
 * After every kill the test checks, with the sqlite3 API:
 *  - the store opens and passes PRAGMA integrity_check;
 *  - it holds only complete legs: every leg row has a leg_prompt row per
 *    prompt and as many step rows as each leg_prompt says (n_steps), all
 *    of them, since no arm here faults;
 *  - every leg seen after an earlier trial is still there, unchanged (same
 *    row id and stored timestamp): nothing complete is redone.
 * A killed run is continued by the next trial with `--resume RUN` (which
 * may itself be killed); the last one runs to the end, and then the run
 * must hold all its legs and a verdict.
 *
 * The seed of the random delays is printed; TG_CRASH_SEED replays it and
 * TG_CRASH_TRIALS changes the count (default 50; 10 under ASan). Skipped when tg-engine, tg-llama,
 * libllama.so or the model are missing.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

extern char **environ;

#define N_ARMS 3
#define N_LEGS 2
#define N_PROMPTS 2
#define N_STEPS 8
#define MAX_SEEN 4096

#include "testenv.h"
static char g_spec[PATH_MAX + 16], g_db[PATH_MAX + 16];


static int setup(void **st)
{
    (void)st;
    if (testenv_init("crash") < 0) return -1;
    snprintf(g_spec, sizeof g_spec, "%s/s.yaml", g_dir);
    snprintf(g_db, sizeof g_db, "%s/t.db", g_dir);
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    return testenv_clean();
}

/* Starts `tokgate gate SPEC --db DB [--resume RUN]` with output to
 * /dev/null. Returns its pid. */
static pid_t start_gate(long long resume)
{
    char rbuf[32];
    snprintf(rbuf, sizeof rbuf, "%lld", resume);
    char *argv[] = {g_tokgate, "gate", g_spec, "--db", g_db, "--jobs", "2", NULL, NULL, NULL};
    if (resume > 0) {
        argv[7] = "--resume";
        argv[8] = rbuf;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, g_tokgate, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) {
        print_message("posix_spawn %s: %s\n", g_tokgate, strerror(rc));
        fail();
    }
    return pid;
}

/* Waits for pid; returns its exit status, or 128 + signal. */
static int wait_gate(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) fail();
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static long long q1(sqlite3 *db, const char *sql, long long arg)
{
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) {
        print_message("sql %s: %s\n", sql, sqlite3_errmsg(db));
        fail();
    }
    if (sqlite3_bind_parameter_count(q) >= 1) sqlite3_bind_int64(q, 1, arg);
    long long v = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    return v;
}

typedef struct seen_leg {
    long long id;
    char stored[64];
} seen_leg;

static seen_leg g_seen[MAX_SEEN];
static int g_n_seen;

/* The store after a kill: opens, integrity_check, only complete legs, and
 * every leg seen before unchanged. Records the legs it sees. Returns the
 * number of leg rows. */
static int check_store(int trial)
{
    if (!exists(g_db)) return 0;   /* killed before the store was created */
    sqlite3 *db;
    if (sqlite3_open(g_db, &db) != SQLITE_OK) {
        print_message("trial %d: the store does not open: %s\n", trial, sqlite3_errmsg(db));
        fail();
    }
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL) != SQLITE_OK) {
        /* killed before the schema was written: an empty file is fine */
        print_message("trial %d: PRAGMA integrity_check: %s\n", trial, sqlite3_errmsg(db));
        fail();
    }
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    const char *r = (const char *)sqlite3_column_text(q, 0);
    if (strcmp(r, "ok")) {
        print_message("trial %d: integrity_check: %s\n", trial, r);
        fail();
    }
    sqlite3_finalize(q);
    if (q1(db, "SELECT count(*) FROM sqlite_master WHERE name = 'leg'", 0) != 1) {
        sqlite3_close(db);
        return 0;   /* killed before the schema existed */
    }
    /* only complete legs */
    long long bad = q1(db,
                       "SELECT count(*) FROM leg l WHERE l.cause IS NOT NULL "
                       "OR (SELECT count(*) FROM leg_prompt lp WHERE lp.leg_id = l.id) != 2 "
                       "OR EXISTS (SELECT 1 FROM leg_prompt lp WHERE lp.leg_id = l.id AND (lp.n_steps != 8 OR "
                       "  (SELECT count(*) FROM step s WHERE s.leg_id = l.id AND s.prompt_id = lp.prompt_id) != lp.n_steps))",
                       0);
    if (bad) {
        print_message("trial %d: %lld leg(s) incomplete or faulted\n", trial, bad);
        assert_int_equal(sqlite3_prepare_v2(db, "SELECT id, cause FROM leg", -1, &q, NULL), SQLITE_OK);
        while (sqlite3_step(q) == SQLITE_ROW)
            print_message("  leg %lld: %s\n", (long long)sqlite3_column_int64(q, 0),
                          sqlite3_column_text(q, 1) ? (const char *)sqlite3_column_text(q, 1) : "(clean)");
        sqlite3_finalize(q);
        fail();
    }
    /* nothing seen before changed or vanished */
    for (int i = 0; i < g_n_seen; i++) {
        assert_int_equal(sqlite3_prepare_v2(db, "SELECT stored FROM leg WHERE id = ?1", -1, &q, NULL), SQLITE_OK);
        sqlite3_bind_int64(q, 1, g_seen[i].id);
        if (sqlite3_step(q) != SQLITE_ROW) {
            print_message("trial %d: leg %lld vanished\n", trial, g_seen[i].id);
            fail();
        }
        const char *s = (const char *)sqlite3_column_text(q, 0);
        if (strcmp(s ? s : "", g_seen[i].stored)) {
            print_message("trial %d: leg %lld was stored again (%s, before %s)\n", trial, g_seen[i].id, s,
                          g_seen[i].stored);
            fail();
        }
        sqlite3_finalize(q);
    }
    g_n_seen = 0;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT id, stored FROM leg ORDER BY id", -1, &q, NULL), SQLITE_OK);
    while (sqlite3_step(q) == SQLITE_ROW && g_n_seen < MAX_SEEN) {
        g_seen[g_n_seen].id = sqlite3_column_int64(q, 0);
        const char *s = (const char *)sqlite3_column_text(q, 1);
        snprintf(g_seen[g_n_seen].stored, sizeof g_seen[g_n_seen].stored, "%s", s ? s : "");
        g_n_seen++;
    }
    sqlite3_finalize(q);
    sqlite3_close(db);
    return g_n_seen;
}

/* The latest run that still needs work (legs missing or no verdict), or 0. */
static long long unfinished_run(void)
{
    if (!exists(g_db)) return 0;
    sqlite3 *db;
    if (sqlite3_open_v2(g_db, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) fail();
    sqlite3_busy_timeout(db, 5000);
    long long run = -1;
    if (q1(db, "SELECT count(*) FROM sqlite_master WHERE name = 'run'", 0) == 1) {
        run = q1(db, "SELECT id FROM run ORDER BY id DESC LIMIT 1", 0);
        if (run > 0) {
            long long legs = q1(db, "SELECT count(*) FROM leg WHERE run_id = ?1", run);
            long long done = q1(db, "SELECT verdict IS NOT NULL FROM run WHERE id = ?1", run);
            if (legs == N_ARMS * N_LEGS && done == 1) run = 0;
        }
    }
    sqlite3_close(db);
    return run > 0 ? run : 0;
}

static void test_sigkill_trials(void **unused)
{
    (void)unused;
    char engine[2 * PATH_MAX], llama[2 * PATH_MAX], lib[2 * PATH_MAX], model[2 * PATH_MAX];
    snprintf(engine, sizeof engine, "%s/tg-engine", g_bin);
    snprintf(llama, sizeof llama, "%s/tg-llama", g_bin);
    snprintf(lib, sizeof lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", g_cache);
    snprintf(model, sizeof model, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    const char *need[] = {g_tokgate, engine, llama, lib, model};
    for (int i = 0; i < 5; i++)
        if (!exists(need[i])) {
            print_message("skipped: needs %s\n", need[i]);
            skip();
        }
    char sha[65];
    tg_err e;
    assert_int_equal(tg_sha256_file(model, sha, &e), 0);
    FILE *f = fopen(g_spec, "w");
    assert_non_null(f);
    fprintf(f,
            "name: crash\nmodel: {path: %s, sha256: %s}\n"
            "prompts: [{id: p1, text: \"The following options are supported:\"}, {id: p2, text: \"def main():\"}]\n"
            "steps: %d\ntop_k: 8\nlegs: %d\nreference: llama-cpu\npolicy: {kind: near-tie, band: 0.2}\n"
            "timeout: {request: 60, leg: 120}\n"
            "arms:\n"
            "  - {name: llama-cpu, llama: {lib: %s, options: {threads: 1}}}\n"
            "  - {name: ref, engine: ref}\n"
            "  - {name: cpu, engine: cpu, options: {threads: 1}}\n",
            model, sha, N_STEPS, N_LEGS, lib);
    fclose(f);

    /* one whole run first: it must work, and it sets the range of delays */
    double t0 = tg_now();
    int st = wait_gate(start_gate(0));
    double full = tg_now() - t0;
    if (st != 0 && st != 1) {
        print_message("the uninterrupted gate exited with %d, expected 0 or 1 (a verdict)\n", st);
        fail();
    }
    assert_int_equal(check_store(0), N_ARMS * N_LEGS);
    assert_int_equal(unfinished_run(), 0);

    const char *se = getenv("TG_CRASH_SEED"), *te = getenv("TG_CRASH_TRIALS");
    unsigned seed = se ? (unsigned)strtoul(se, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    /* 50 trials; 10 in a sanitizer build (make asan), where every gate is
     * several times slower */
#if defined(__SANITIZE_ADDRESS__)
    int trials = te ? atoi(te) : 10;
#else
    int trials = te ? atoi(te) : 50;
#endif
    srand(seed);
    print_message("uninterrupted gate: %.2f s; %d SIGKILL trials, seed %u (TG_CRASH_SEED)\n", full, trials, seed);
    int killed = 0, resumed = 0, resumes_finished = 0, exited = 0;
    for (int t = 1; t <= trials; t++) {
        long long run = unfinished_run();
        double delay = 0.05 + (double)rand() / RAND_MAX * full * 0.6;
        pid_t pid = start_gate(run);
        struct timespec ts = {(time_t)delay, (long)((delay - (time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
        int was_running = kill(pid, SIGKILL) == 0;
        int s = wait_gate(pid);
        if (s == 128 + SIGKILL) killed++;
        else {
            if (s != 0 && s != 1) {
                print_message("trial %d: tokgate exited with %d before the kill\n", t, s);
                fail();
            }
            exited++;
            if (run) resumes_finished++;
        }
        (void)was_running;
        if (run) resumed++;
        check_store(t);
    }
    /* finish whatever run is left, without a kill */
    long long run = unfinished_run();
    if (run) {
        sqlite3 *db0;
        assert_int_equal(sqlite3_open_v2(g_db, &db0, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        print_message("run %lld holds %lld of %d legs before the final --resume\n", run,
                      q1(db0, "SELECT count(*) FROM leg WHERE run_id = ?1", run), N_ARMS * N_LEGS);
        sqlite3_close(db0);
        int s = wait_gate(start_gate(run));
        if (s != 0 && s != 1) {
            print_message("the final --resume %lld exited with %d\n", run, s);
            fail();
        }
        resumed++, resumes_finished++;
        check_store(trials + 1);
    }
    assert_int_equal(unfinished_run(), 0);
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(g_db, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    long long runs = q1(db, "SELECT count(*) FROM run", 0);
    long long full_runs = q1(db, "SELECT count(*) FROM run r WHERE (SELECT count(*) FROM leg WHERE run_id = r.id) = 6 "
                                 "AND r.verdict IS NOT NULL", 0);
    sqlite3_close(db);
    print_message("%d trials: %d killed mid-run, %d finished before the kill; %d --resume runs (%d finished); "
                  "%lld runs, %lld complete with a verdict; every check passed after every kill\n",
                  trials, killed, exited, resumed, resumes_finished, runs, full_runs);
    assert_true(killed >= trials / 4);
}

TG_TEST_MAIN_WITH(setup, teardown, test_sigkill_trials)
