/*
 * test_faults.c: arm fault injection through the real command line,
 * `tokgate gate` started with posix_spawn (arm_run_command). The spec runs
 * llama.cpp's CPU build on the shipped tiny trained model as the reference
 * (a real arm) beside one exec arm per fault mode of tests/helpers/
 * tg-fault-arm, a TEST DOUBLE worker that exists only to misbehave.
 *
 * For every mode the test checks, from the store alone (sqlite3 API):
 *  - its legs end with the expected cause class ("crash:", "timeout:",
 *    "eof:", "protocol:", "exit:", or stderr fault lines) within the
 *    arm's timeout (leg wall time);
 *  - the real arm's legs finish clean, with all their steps;
 *  - the store passes PRAGMA integrity_check;
 *  - the arm's TOKEN_GATE is NOT_MEASURABLE (fewer than two clean legs,
 *    docs/verdicts.md) or FAIL, never PASS; the run is not PASS and
 *    tokgate exits 1;
 *  - no process of a mode is left behind (the child that ignores SIGTERM
 *    included).
 * Skipped when tg-llama, libllama.so or the shipped model are missing.
 * A second test checks the arm layer alone (no llama.cpp needed) for the
 * child that ignores SIGTERM and holds the pipes.
 */
#include <dirent.h>
#include <limits.h>
#include <setjmp.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "arm.h"
#include "util.h"

#include "testenv.h"


/* One fault mode and what its legs must end with. */
typedef struct mode {
    const char *mode;
    const char *cause;   /* prefix of leg.cause; "" = no cause but fault lines; NULL: any cause */
    double timeout;      /* the arm's request timeout in the spec, seconds */
} mode;

static const mode MODES[] = {
    {"segv-hello", "crash:", 5},        /* segfault before the stream */
    {"segv-decode", "crash:", 5},       /* segfault mid-stream */
    {"hang", "timeout:", 1},
    {"garbage", "protocol:", 5},
    {"wrong-fields", "protocol:", 5},
    {"wrong-step", "protocol:", 5},
    {"eof-decode", "eof:", 5},          /* early EOF mid-stream */
    {"bigline", "protocol:", 5},        /* a 100 MB line */
    {"drip", "timeout:", 1},            /* slow drip, never a whole line */
    {"exit0", "eof:", 5},               /* exit 0 with no answer */
    {"ignore-term", "timeout:", 1},
    {"child-ignore-term", NULL, 1},     /* a child holding the pipes ignores SIGTERM */
    {"fault-stderr", "", 5},            /* a fault pattern on stderr, otherwise clean */
    {"exit3", "exit:", 5},
};
#define N_MODES (int)(sizeof MODES / sizeof *MODES)

static sqlite3 *open_db(void)
{
    char p[2 * PATH_MAX];
    snprintf(p, sizeof p, "%s/t.db", g_dir);
    sqlite3 *db;
    if (sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        print_message("cannot open the store %s: %s\n", p, sqlite3_errmsg(db));
        fail();
    }
    sqlite3_busy_timeout(db, 5000);
    return db;
}

static void assert_integrity(sqlite3 *db)
{
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    const char *r = (const char *)sqlite3_column_text(q, 0);
    if (strcmp(r, "ok")) {
        print_message("PRAGMA integrity_check: %s\n", r);
        fail();
    }
    sqlite3_finalize(q);
}

/* Processes whose command line holds both words (a fault arm left behind). */
static int count_procs(const char *a, const char *b)
{
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        char p[300], buf[4096];
        snprintf(p, sizeof p, "/proc/%s/cmdline", de->d_name);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        size_t m = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < m; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[m] = 0;
        if (strstr(buf, a) && strstr(buf, b)) n++;
    }
    closedir(d);
    return n;
}

static void test_faults_through_gate(void **unused)
{
    (void)unused;
    char tokgate[2 * PATH_MAX], llama[2 * PATH_MAX], lib[2 * PATH_MAX], model[2 * PATH_MAX],
        fa[2 * PATH_MAX];
    snprintf(tokgate, sizeof tokgate, "%s/tokgate", g_bin);
    snprintf(llama, sizeof llama, "%s/tg-llama", g_bin);
    snprintf(fa, sizeof fa, "%s/tg-fault-arm", g_bin);
    snprintf(lib, sizeof lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", g_cache);
    snprintf(model, sizeof model, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    const char *need[] = {tokgate, llama, fa, lib, model};
    for (int i = 0; i < 5; i++)
        if (!exists(need[i])) {
            print_message("skipped: needs %s\n", need[i]);
            skip();
        }
    char sha[65];
    tg_err e;
    assert_int_equal(tg_sha256_file(model, sha, &e), 0);

    /* the spec: the real reference, then one exec arm per mode */
    size_t cap = 1 << 16, len = 0;
    char *t = malloc(cap);
    assert_non_null(t);
    len += (size_t)snprintf(t + len, cap - len,
                            "name: faults\nmodel: {path: %s, sha256: %s}\n"
                            "prompts: [{id: p1, text: \"The following options are supported:\"}, "
                            "{id: p2, text: \"def main():\"}]\n"
                            "steps: 6\ntop_k: 4\nlegs: 2\nreference: llama-cpu\npolicy: {kind: exact}\n"
                            "timeout: {request: 30, leg: 60}\n"
                            "fault_patterns: [\"Memory access fault\"]\n"
                            "arms:\n  - {name: llama-cpu, llama: {lib: %s, options: {threads: 1}}}\n",
                            model, sha, lib);
    for (int i = 0; i < N_MODES; i++)
        len += (size_t)snprintf(t + len, cap - len, "  - {name: f-%s, exec: [%s, %s], timeout: {request: %g, leg: 20}}\n",
                                MODES[i].mode, fa, MODES[i].mode, MODES[i].timeout);
    assert_true(len < cap);
    char sp[2 * PATH_MAX], dbp[2 * PATH_MAX];
    write_in(sp, sizeof sp, "s.yaml", "%s", t);
    snprintf(dbp, sizeof dbp, "%s/t.db", g_dir);
    free(t);

    /* the gate, through the binary (argv, no shell) */
    char rp[2 * PATH_MAX];
    snprintf(rp, sizeof rp, "%s/report.txt", g_dir);
    char *argv[] = {tokgate, "gate", sp, "--db", dbp, "--jobs", "2", "--out", rp, NULL};
    char *out = NULL;
    size_t n_out = 0;
    arm_exit x;
    double t0 = tg_now();
    int rc = arm_run_command(argv, 300, 0, 0, NULL, &out, &n_out, &x, &e);
    double took = tg_now() - t0;
    print_message("tokgate gate with %d fault modes: exit status %d in %.1f s\n", N_MODES, x.exit_status, took);
    if (x.exit_status != 1) {
        print_message("expected exit status 1 (fail or not measurable); stderr:\n%s\nstdout:\n%.2000s\n",
                      x.stderr_text ? x.stderr_text : "", out ? out : "");
        fail();
    }
    assert_int_equal(rc, -1);   /* exit 1 is reported as an error by arm_run_command */
    free(out);
    arm_exit_free(&x);
    /* the report names every fault arm; the run's keys are not a pass */
    FILE *rf = fopen(rp, "r");
    assert_non_null(rf);
    static char rep[1 << 20];
    size_t rn = fread(rep, 1, sizeof rep - 1, rf);
    fclose(rf);
    rep[rn] = 0;
    for (int i = 0; i < N_MODES; i++)
        if (!strstr(rep, MODES[i].mode)) {
            print_message("the report does not name the arm f-%s:\n%.3000s\n", MODES[i].mode, rep);
            fail();
        }

    sqlite3 *db = open_db();
    assert_integrity(db);
    sqlite3_stmt *q;
    /* the run's overall verdict */
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT id, verdict FROM run ORDER BY id DESC LIMIT 1", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    long long run = sqlite3_column_int64(q, 0);
    const char *rv = (const char *)sqlite3_column_text(q, 1);
    if (!rv || (strcmp(rv, "FAIL") && strcmp(rv, "NOT_MEASURABLE"))) {
        print_message("run verdict %s, expected FAIL or NOT_MEASURABLE\n", rv ? rv : "(none)");
        fail();
    }
    sqlite3_finalize(q);

    /* the real arm: both legs clean, every step stored */
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT count(*), sum(l.cause IS NULL AND l.exit_status = 0), "
                                        "(SELECT count(*) FROM step s JOIN leg l2 ON l2.id = s.leg_id WHERE l2.arm_id = a.id) "
                                        "FROM leg l JOIN arm a ON a.id = l.arm_id WHERE l.run_id = ?1 AND a.name = 'llama-cpu'",
                                        -1, &q, NULL), SQLITE_OK);
    sqlite3_bind_int64(q, 1, run);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    if (sqlite3_column_int(q, 0) != 2 || sqlite3_column_int(q, 1) != 2 || sqlite3_column_int(q, 2) != 2 * 2 * 6) {
        print_message("the real arm: %d legs, %d clean, %d steps; expected 2, 2 and 24\n", sqlite3_column_int(q, 0),
                      sqlite3_column_int(q, 1), sqlite3_column_int(q, 2));
        fail();
    }
    sqlite3_finalize(q);

    /* every mode */
    int bad = 0;
    for (int i = 0; i < N_MODES; i++) {
        char name[64];
        snprintf(name, sizeof name, "f-%s", MODES[i].mode);
        assert_int_equal(sqlite3_prepare_v2(db,
                                            "SELECT l.leg, l.cause, l.fault_lines, l.wall_s FROM leg l JOIN arm a ON a.id = l.arm_id "
                                            "WHERE l.run_id = ?1 AND a.name = ?2 ORDER BY l.leg", -1, &q, NULL), SQLITE_OK);
        sqlite3_bind_int64(q, 1, run);
        sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
        int legs = 0;
        while (sqlite3_step(q) == SQLITE_ROW) {
            legs++;
            const char *cause = (const char *)sqlite3_column_text(q, 1);
            const char *lines = (const char *)sqlite3_column_text(q, 2);
            double wall = sqlite3_column_double(q, 3);
            int ok;
            if (!MODES[i].cause) ok = cause != NULL;
            else if (!MODES[i].cause[0]) ok = !cause && lines && strstr(lines, "Memory access fault");
            else ok = cause && !strncmp(cause, MODES[i].cause, strlen(MODES[i].cause));
            /* within the arm's timeout: the request timeout, the 2 s grace, start-up slack */
            double limit = MODES[i].timeout + 2 + 5;
            print_message("  %-20s leg %d: %.1f s, cause: %s%s%s\n", MODES[i].mode, sqlite3_column_int(q, 0), wall,
                          cause ? cause : "(none)", lines ? ", fault lines: " : "", lines ? lines : "");
            if (!ok) {
                print_message("  %s: expected a cause starting with '%s'\n", MODES[i].mode,
                              MODES[i].cause ? MODES[i].cause : "(any)");
                bad++;
            }
            if (wall > limit) {
                print_message("  %s: leg took %.1f s, expected under %.1f s\n", MODES[i].mode, wall, limit);
                bad++;
            }
        }
        sqlite3_finalize(q);
        if (legs != 2) {
            print_message("  %s: %d legs stored, expected 2\n", MODES[i].mode, legs);
            bad++;
        }
        /* the arm's verdict: never PASS; NOT_MEASURABLE as no leg is clean */
        assert_int_equal(sqlite3_prepare_v2(db,
                                            "SELECT value FROM verdict WHERE run_id = ?1 AND arm = ?2 AND prompt IS NULL "
                                            "AND key = 'TOKEN_GATE' ORDER BY set_no DESC LIMIT 1", -1, &q, NULL), SQLITE_OK);
        sqlite3_bind_int64(q, 1, run);
        sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
        const char *v = sqlite3_step(q) == SQLITE_ROW ? (const char *)sqlite3_column_text(q, 0) : NULL;
        if (!v || strcmp(v, "NOT_MEASURABLE")) {
            print_message("  %s: TOKEN_GATE=%s, expected NOT_MEASURABLE (no clean leg)\n", MODES[i].mode, v ? v : "(none)");
            bad++;
        }
        sqlite3_finalize(q);
        char word[80];
        snprintf(word, sizeof word, "tg-fault-arm %s", MODES[i].mode);
        int left = count_procs(word, g_bin);
        if (left) {
            print_message("  %s: %d process(es) left running after the gate\n", MODES[i].mode, left);
            bad++;
        }
    }
    assert_integrity(db);
    sqlite3_close(db);
    if (bad) {
        print_message("%d fault check(s) failed\n", bad);
        fail();
    }
}

/* The arm layer alone (no llama.cpp needed): a worker that exits at once
 * while a child it forked ignores SIGTERM and holds the pipes. The request
 * times out and the child dies with the worker's process group. Before the
 * fix in harness/arm.c (kill_group) the child outlived the leg. */
static void test_child_holding_pipes_is_killed(void **unused)
{
    (void)unused;
    char fa[2 * PATH_MAX];
    snprintf(fa, sizeof fa, "%s/tg-fault-arm", g_bin);
    if (!exists(fa)) {
        print_message("skipped: needs the test double %s\n", fa);
        skip();
    }
    char *argv[] = {fa, "child-ignore-term", NULL};
    arm_config cfg = {.name = "child", .argv = argv, .timeout_request = 0.5, .grace = 0.3};
    tg_arm *a;
    tg_err e;
    assert_int_equal(arm_start(&a, &cfg, &e), 0);
    double t0 = tg_now();
    assert_int_equal(arm_hello(a, NULL, &e), -1);
    assert_true(arm_failed(a));
    assert_non_null(strstr(arm_cause(a), "timeout:"));
    arm_exit x;
    arm_finish(a, &x);
    double took = tg_now() - t0;
    arm_free(a);
    if (took > 5) {
        print_message("ending the leg took %.1f s, expected the 0.5 s timeout and the 0.3 s grace\n", took);
        fail();
    }
    /* the kill is asynchronous: give the kernel a moment */
    char word[80];
    snprintf(word, sizeof word, "tg-fault-arm %s", "child-ignore-term");
    int left = 0;
    for (int i = 0; i < 50 && (left = count_procs(word, g_bin)); i++) usleep(20000);
    if (left) {
        print_message("%d child process(es) holding the pipes outlived the leg\n", left);
        fail();
    }
}

TG_TEST_MAIN(test_child_holding_pipes_is_killed, test_faults_through_gate)
