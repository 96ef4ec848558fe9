/*
 * test_cli.c: the tokgate command line (harness/main.c) through the built
 * binary: `tokgate CMD --help` prints that command's usage (naming it) on
 * stdout and exits 0 for every command, those whose options are parsed in
 * their own module (sweep, trend, plan, run, merge) included; an unknown
 * option is one line naming the option and the command, exit 2; `tokgate
 * rescore` without a RUN scores the latest run, as report and step do;
 * --out never overwrites the store (report, gate, trend), outputs are
 * checked before a gate runs, a --db typo is "no such store".
 * The runs use tests/helpers/tg-fault-arm, a TEST DOUBLE worker (not an
 * engine), in its well-behaved mode.
 */
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <ftw.h>
#include <spawn.h>
#include <sys/wait.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "testenv.h"
#include "util.h"

extern char **environ;


/* A file's whole contents (malloc'ed, NUL-terminated). */
static char *slurp(FILE *f)
{
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    size_t k = fread(b, 1, (size_t)n, f);
    b[k] = 0;
    return b;
}

/* Runs tokgate with the words (NULL-terminated); returns its exit status
 * (-1 when killed) with stdout in *out (caller frees) and stderr in err. */
static int tokgate(const char *const *words, char **out, char *err, size_t errn)
{
    if (!exists(g_tokgate)) {
        print_message("missing %s: build tokgate first\n", g_tokgate);
        fail();
    }
    char *argv[24];
    int n = 0;
    argv[n++] = g_tokgate;
    for (int i = 0; words[i] && n < 23; i++) argv[n++] = (char *)words[i];
    argv[n] = NULL;
    FILE *fo = tmpfile(), *fe = tmpfile();
    assert_non_null(fo);
    assert_non_null(fe);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fileno(fo), 1);
    posix_spawn_file_actions_adddup2(&fa, fileno(fe), 2);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, g_tokgate, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    *out = slurp(fo);
    char *e = slurp(fe);
    snprintf(err, errn, "%s", e);
    free(e);
    fclose(fo);
    fclose(fe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void help_of_every_command(void **st)
{
    (void)st;
    static const char *const cmds[] = {"gate", "report", "step", "localize", "rescore", "bench", "sweep",
                                       "trend", "plan", "run", "merge", "version", "help", NULL};
    for (int i = 0; cmds[i]; i++) {
        char want[64], err[4096], *out;
        snprintf(want, sizeof want, "usage: tokgate %s", cmds[i]);
        const char *w1[] = {cmds[i], "--help", NULL};
        int rc = tokgate(w1, &out, err, sizeof err);
        if (rc != 0 || strncmp(out, want, strlen(want)))
            print_message("%s --help: exit %d, stdout '%.80s', stderr '%.200s'\n", cmds[i], rc, out, err);
        assert_int_equal(rc, 0);
        assert_true(strncmp(out, want, strlen(want)) == 0);
        assert_string_equal(err, "");
        char *first = strdup(out);
        free(out);
        /* -h, after other arguments, and `tokgate help CMD` print the same text */
        const char *w2[] = {cmds[i], "x", "-h", NULL};
        assert_int_equal(tokgate(w2, &out, err, sizeof err), 0);
        assert_string_equal(out, first);
        free(out);
        const char *w3[] = {"help", cmds[i], NULL};
        assert_int_equal(tokgate(w3, &out, err, sizeof err), 0);
        assert_string_equal(out, first);
        free(out);
        free(first);
    }
    /* the summary names every command */
    char err[4096], *out;
    const char *w[] = {"help", NULL};
    assert_int_equal(tokgate(w, &out, err, sizeof err), 0);
    for (int i = 0; cmds[i]; i++) {
        char k[32];
        snprintf(k, sizeof k, "\n  %s ", cmds[i]);
        assert_non_null(strstr(out, k));
    }
    free(out);
}

static void unknown_option_is_one_line(void **st)
{
    (void)st;
    static const char *const cmds[] = {"gate",  "report", "step",     "localize", "rescore", "bench",
                                       "sweep", "trend",  "baseline", "plan",     "run",     "merge", NULL};
    for (int i = 0; cmds[i]; i++) {
        char err[4096], *out, want[128];
        const char *w[] = {cmds[i], "--frobnicate", "1", NULL};
        assert_int_equal(tokgate(w, &out, err, sizeof err), 2);
        snprintf(want, sizeof want, "tokgate %s: unknown option '--frobnicate' (see tokgate %s --help)\n",
                 cmds[i], cmds[i]);
        assert_string_equal(err, want);
        assert_string_equal(out, "");
        free(out);
    }
    char err[4096], *out;
    const char *w[] = {"report", "--db", NULL};
    assert_int_equal(tokgate(w, &out, err, sizeof err), 2);
    assert_string_equal(err, "tokgate report: option '--db' needs a value (see tokgate report --help)\n");
    free(out);
    const char *w2[] = {"frob", NULL};
    assert_int_equal(tokgate(w2, &out, err, sizeof err), 2);
    assert_string_equal(err, "tokgate: unknown command 'frob' (see tokgate help)\n");
    free(out);
}

/* Writes g_dir/s.yaml (a spec over the test double, reference and one
 * test arm; legs 2) and its stand-in model; returns the spec's path. */
static const char *write_spec(void)
{
    static char sp[2 * PATH_MAX];
    char fa[PATH_MAX + 96], m[2 * PATH_MAX];
    snprintf(fa, sizeof fa, "%s/tg-fault-arm", g_bin);
    if (!exists(fa)) {
        print_message("missing %s (the test double)\n", fa);
        fail();
    }
    char sha[65];
    make_model(sha, m, sizeof m);
    write_in(sp, sizeof sp, "s.yaml",
             "name: cli\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: xy}]\n"
             "steps: 3\ntop_k: 3\nlegs: 2\nreference: ref\npolicy: {kind: exact}\n"
             "arms:\n  - {name: ref, exec: [%s, ok]}\n  - {name: good, exec: [%s, ok]}\n",
             m, sha, fa, fa);
    return sp;
}

/* Writes the spec (write_spec) and runs `tokgate gate SPEC --db DB` n times
 * into DB = g_dir/t.db (its path into db, n_db bytes); each must pass.
 * Returns the spec's path. */
static const char *gate_runs(char *db, size_t n_db, int n)
{
    path_in(db, n_db, "t.db");
    const char *sp = write_spec();
    char err[8192], *out;
    const char *g[] = {"gate", sp, "--db", db, NULL};
    for (int i = 0; i < n; i++) {
        int rc = tokgate(g, &out, err, sizeof err);
        if (rc) print_message("gate: %s\n", err);
        assert_int_equal(rc, 0);
        free(out);
    }
    return sp;
}

/* Two runs of a spec over the test double; `rescore` without RUN takes the
 * latest (run 2), as `report` does. */
static void rescore_defaults_to_latest_run(void **st)
{
    (void)st;
    char db[2 * PATH_MAX];
    gate_runs(db, sizeof db, 2);
    char err[8192], *out;
    const char *r[] = {"rescore", "--db", db, "--band", "0.5", NULL};
    assert_int_equal(tokgate(r, &out, err, sizeof err), 0);
    assert_non_null(strstr(out, "run 2 rescored as verdict set 2 (policy exact, band 0.5)"));
    assert_non_null(strstr(out, "TOKEN_GATE=PASS"));
    free(out);
    /* a RUN still picks that run */
    const char *r1[] = {"rescore", "1", "--db", db, NULL};
    assert_int_equal(tokgate(r1, &out, err, sizeof err), 0);
    assert_non_null(strstr(out, "run 1 rescored as verdict set 2"));
    free(out);
    /* report shows the latest run's latest set */
    const char *rp[] = {"report", "--db", db, NULL};
    assert_int_equal(tokgate(rp, &out, err, sizeof err), 0);
    assert_non_null(strstr(out, "tokgate run 2 "));
    assert_non_null(strstr(out, "verdict set 2: policy exact, band 0.5"));
    free(out);
}

/* The first column of sql's first row in the store db (opened read-only),
 * as text into out (n bytes). */
static void db_value(const char *db, const char *sql, char *out, size_t n)
{
    sqlite3 *h;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(h, sql, -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    snprintf(out, n, "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    sqlite3_close(h);
}

/* The store's bytes as a sha256, its run count and its integrity check. */
static void store_state(const char *db, char sha[65], long long *runs)
{
    tg_err e;
    assert_int_equal(tg_sha256_file(db, sha, &e), 0);
    char v[64];
    db_value(db, "PRAGMA integrity_check", v, sizeof v);
    assert_string_equal(v, "ok");
    db_value(db, "SELECT count(*) FROM run", v, sizeof v);
    *runs = atoll(v);
}

/* --out naming the store (or its -wal / -shm) is refused before anything is
 * written: report truncated the store to 0 bytes, gate --format junit left
 * a malformed database, trend the same. */
static void out_naming_the_store_is_refused(void **st)
{
    (void)st;
    char db[2 * PATH_MAX], wal[2 * PATH_MAX + 8], sha0[65], sha1[65];
    const char *sp = gate_runs(db, sizeof db, 1);
    snprintf(wal, sizeof wal, "%s-wal", db);
    long long runs0, runs1;
    store_state(db, sha0, &runs0);
    char err[8192], *out;
    const char *w1[] = {"report", "1", "--db", db, "--out", db, NULL};
    assert_int_equal(tokgate(w1, &out, err, sizeof err), 2);
    assert_non_null(strstr(err, "refusing to overwrite it"));
    free(out);
    const char *w2[] = {"gate", sp, "--db", db, "--out", db, "--format", "junit", NULL};
    assert_int_equal(tokgate(w2, &out, err, sizeof err), 2);
    assert_non_null(strstr(err, "that is the store"));
    free(out);
    const char *w3[] = {"trend", "--db", db, "--out", db, NULL};
    assert_int_equal(tokgate(w3, &out, err, sizeof err), 2);
    assert_non_null(strstr(err, "that is the store"));
    free(out);
    const char *w4[] = {"report", "--db", db, "--out", wal, NULL};
    assert_int_equal(tokgate(w4, &out, err, sizeof err), 2);
    assert_non_null(strstr(err, "-wal"));
    free(out);
    store_state(db, sha1, &runs1);
    assert_string_equal(sha0, sha1);
    assert_int_equal(runs0, runs1);   /* the gate did not even run */
    /* the store still reports */
    const char *w5[] = {"report", "--db", db, NULL};
    assert_int_equal(tokgate(w5, &out, err, sizeof err), 0);
    free(out);
}

/* --out and --evidence are checked (and their folders made) before the
 * gate runs: a bad one costs no run. */
static void outputs_checked_before_the_run(void **st)
{
    (void)st;
    char db[2 * PATH_MAX], deep[2 * PATH_MAX + 32], ev[2 * PATH_MAX + 32], sha[65];
    snprintf(deep, sizeof deep, "%s/a/b/r.xml", g_dir);
    snprintf(ev, sizeof ev, "%s/ev/dence", g_dir);
    const char *sp = gate_runs(db, sizeof db, 1);
    long long runs0, runs1;
    store_state(db, sha, &runs0);
    char err[8192], *out;
    /* --evidence naming a file, not a folder: refused, no run */
    const char *w1[] = {"gate", sp, "--db", db, "--evidence", sp, NULL};
    assert_int_equal(tokgate(w1, &out, err, sizeof err), 2);
    assert_non_null(strstr(err, "--evidence"));
    free(out);
    store_state(db, sha, &runs1);
    assert_int_equal(runs1, runs0);
    /* nested folders that do not exist yet are made */
    const char *w2[] = {"gate", sp, "--db", db, "--out", deep, "--format", "junit", "--evidence", ev, NULL};
    assert_int_equal(tokgate(w2, &out, err, sizeof err), 0);
    assert_non_null(strstr(out, "TOKEN_GATE=PASS"));
    free(out);
    assert_true(exists(deep));
    char md[3 * PATH_MAX];
    snprintf(md, sizeof md, "%s/cli-run%lld.md", ev, runs0 + 1);
    assert_true(exists(md));
}

/* report, step and rescore read runs: a --db typo is "no such store", and
 * no empty store is left behind. */
static void db_typo_is_no_such_store(void **st)
{
    (void)st;
    char db[2 * PATH_MAX];
    snprintf(db, sizeof db, "%s/typo.db", g_dir);
    static const char *const cmds[][3] = {{"report", NULL}, {"step", "p1/0"}, {"rescore", NULL}};
    for (int i = 0; i < 3; i++) {
        char err[4096], *out;
        const char *w[] = {cmds[i][0], "--db", db, cmds[i][1], NULL};
        assert_int_equal(tokgate(w, &out, err, sizeof err), 2);
        assert_non_null(strstr(err, "no such store"));
        free(out);
        assert_false(exists(db));
    }
}

/* Runs SQL on the store file (foreign keys on, so deletes cascade). */
static void sql(const char *db, const char *q)
{
    sqlite3 *h;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    char *err = NULL;
    if (sqlite3_exec(h, "PRAGMA foreign_keys=ON", NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(h, q, NULL, NULL, &err) != SQLITE_OK) {
        print_message("sql %s: %s\n", q, err ? err : sqlite3_errmsg(h));
        fail();
    }
    sqlite3_close(h);
}

/* A run killed during the reference's second leg (legs are stored whole,
 * so the store holds every leg but that one, and no verdict set) is
 * NOT_MEASURABLE on rescore and report, names the run to resume, and does
 * not unlock bench; --resume completes it. Before the fix it was PASS with
 * LEGS_CLEAN counted over the stored legs only. */
static void interrupted_run_is_not_measurable(void **st)
{
    (void)st;
    char db[2 * PATH_MAX];
    const char *sp = gate_runs(db, sizeof db, 1);
    char err[8192], *out;
    const char *b[] = {"bench", sp, "--db", db, NULL};
    assert_int_equal(tokgate(b, &out, err, sizeof err), 0);   /* a complete PASS unlocks bench */
    free(out);
    sql(db, "DELETE FROM leg WHERE run_id = 1 AND leg = 2 AND arm_id = (SELECT id FROM arm WHERE run_id = 1"
            " AND name = 'ref'); DELETE FROM verdict_set WHERE run_id = 1;"
            " UPDATE run SET verdict = NULL, finished = NULL WHERE id = 1");
    const char *r[] = {"rescore", "--db", db, NULL};
    assert_int_equal(tokgate(r, &out, err, sizeof err), 1);
    assert_non_null(strstr(out, "\nTOKEN_GATE=NOT_MEASURABLE\n"));
    assert_non_null(strstr(out, "REASON=run 1 is unfinished: arm ref has 1 of 2 legs stored; resume it with --resume 1\n"));
    assert_non_null(strstr(out, "ARM.ref.LEGS_CLEAN=1/2\n"));
    assert_non_null(strstr(out, "ARM.good.TOKEN_GATE=NOT_MEASURABLE\n"));
    free(out);
    const char *rp[] = {"report", "--db", db, NULL};
    assert_int_equal(tokgate(rp, &out, err, sizeof err), 1);
    assert_non_null(strstr(out, "resume it with --resume 1"));
    free(out);
    assert_int_equal(tokgate(b, &out, err, sizeof err), 1);
    assert_non_null(strstr(err, "bench refused"));
    assert_non_null(strstr(err, "TOKEN_GATE=NOT_MEASURABLE"));
    free(out);
    /* a test arm's missing leg counts against its LEGS_CLEAN */
    sql(db, "DELETE FROM leg WHERE run_id = 1 AND leg = 2 AND arm_id = (SELECT id FROM arm WHERE run_id = 1"
            " AND name = 'good')");
    assert_int_equal(tokgate(r, &out, err, sizeof err), 1);
    assert_non_null(strstr(out, "ARM.good.LEGS_CLEAN=1/2\n"));
    assert_non_null(strstr(out, "\nLEGS_CLEAN=1/2\n"));
    assert_non_null(strstr(out, "\nLEGS_IDENTICAL=UNKNOWN\n"));   /* one clean leg: nothing to compare */
    free(out);
    /* the remedy: --resume runs the missing legs, and the run passes */
    const char *g[] = {"gate", sp, "--db", db, "--resume", "1", NULL};
    assert_int_equal(tokgate(g, &out, err, sizeof err), 0);
    assert_non_null(strstr(out, "\nTOKEN_GATE=PASS\n"));
    assert_non_null(strstr(out, "\nLEGS_CLEAN=2/2\n"));
    assert_non_null(strstr(out, "\nLEGS_IDENTICAL=YES\n"));
    free(out);
}

/* SIGTERM / SIGINT to a running gate: tokgate ends its workers (one of
 * them ignores SIGTERM and never answers), marks the run INTERRUPTED, stores
 * no leg cut short, and exits 143 / 130; no worker is left running. Before,
 * tokgate died and the workers (in their own process groups) ran on. */
static void signal_ends_workers(void **st)
{
    (void)st;
    static const int sigs[] = {SIGTERM, SIGINT};
    for (int k = 0; k < 2; k++) {
        char fa[PATH_MAX + 96], m[2 * PATH_MAX], sp[2 * PATH_MAX], db[2 * PATH_MAX], pf[2 * PATH_MAX];
        snprintf(fa, sizeof fa, "%s/tg-fault-arm", g_bin);
        snprintf(m, sizeof m, "%s/m.bin", g_dir);
        snprintf(sp, sizeof sp, "%s/sig.yaml", g_dir);
        snprintf(db, sizeof db, "%s/sig%d.db", g_dir, k);
        snprintf(pf, sizeof pf, "%s/pids%d", g_dir, k);
        write_spec();   /* the stand-in model */
        char sha[65];
        tg_err e;
        assert_int_equal(tg_sha256_file(m, sha, &e), 0);
        FILE *f = fopen(sp, "w");
        assert_non_null(f);
        fprintf(f, "name: sig\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: xy}]\n"
                   "steps: 3\ntop_k: 3\nlegs: 2\nreference: ref\npolicy: {kind: exact}\njobs: 2\n"
                   "timeout: {request: 300, leg: 600}\n"
                   "arms:\n  - {name: ref, exec: [%s, ok]}\n  - {name: stuck, exec: [%s, ignore-term]}\n",
                m, sha, fa, fa);
        fclose(f);
        setenv("TG_FAULT_PIDFILE", pf, 1);
        char *argv[] = {g_tokgate, "gate", sp, "--db", db, NULL};
        posix_spawn_file_actions_t fa_;
        posix_spawn_file_actions_init(&fa_);
        posix_spawn_file_actions_addopen(&fa_, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa_, 2, "/dev/null", O_WRONLY, 0);
        pid_t pid;
        assert_int_equal(posix_spawn(&pid, g_tokgate, &fa_, NULL, argv, environ), 0);
        posix_spawn_file_actions_destroy(&fa_);
        unsetenv("TG_FAULT_PIDFILE");
        /* wait until both stuck legs run (the reference's leg 1 first, then 3 workers) */
        int n = 0, pids[16];
        double t0 = tg_now();
        while (n < 3 && tg_now() - t0 < 30) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            n = 0;
            f = fopen(pf, "r");
            while (f && n < 16 && fscanf(f, "%d", &pids[n]) == 1) n++;
            if (f) fclose(f);
        }
        assert_true(n >= 3);
        nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
        double ts = tg_now();
        kill(pid, sigs[k]);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        double took = tg_now() - ts;
        print_message("signal %d: tokgate exited in %.2f s, status %d\n", sigs[k], took,
                      WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 128 + sigs[k]);
        assert_true(took < 10);
        /* every worker is gone (reaped by tokgate, or by init right after) */
        f = fopen(pf, "r");
        n = 0;
        while (f && n < 16 && fscanf(f, "%d", &pids[n]) == 1) n++;
        if (f) fclose(f);
        for (int i = 0; i < n; i++) {
            int alive = 1;
            for (int t = 0; t < 100 && alive; t++) {
                alive = kill(pids[i], 0) == 0;
                if (alive) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
            }
            if (alive) {
                kill(pids[i], SIGKILL);
                fail_msg("worker %d outlived tokgate", pids[i]);
            }
        }
        /* the run is marked, the cut legs are not stored */
        char v[64];
        db_value(db, "SELECT verdict FROM run WHERE id = 1", v, sizeof v);
        assert_string_equal(v, "INTERRUPTED");
        db_value(db, "SELECT count(*) FROM leg l JOIN arm a ON a.id = l.arm_id WHERE a.name = 'stuck'", v, sizeof v);
        assert_string_equal(v, "0");
    }
}

TG_TEST_MAIN(
    help_of_every_command, unknown_option_is_one_line, rescore_defaults_to_latest_run,
    out_naming_the_store_is_refused, outputs_checked_before_the_run, db_typo_is_no_such_store,
    interrupted_run_is_not_measurable, signal_ends_workers)
