/*
 * test_gate.c: the gate run (harness/gate.c) into a real store, scored by
 * verdict.c.
 *
 * Fault handling uses tests/helpers/tg-fault-arm, a TEST DOUBLE worker (not
 * an engine): a well-behaved double as reference and as a test arm, next to
 * doubles that crash mid-stream, hang and print garbage. The good arm must
 * finish and pass, the faulted arms must never pass, and the store must
 * stay intact. A real gate over the shipped tiny trained model runs when
 * tg-llama (and optionally tg-engine) are built; it is skipped otherwise.
 */
#include <limits.h>
#include <sched.h>
#include <math.h>
#include <setjmp.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <zstd.h>

#include "arm.h"
#include "gate.h"
#include "spec.h"
#include "store.h"
#include "report.h"
#include "verdict.h"

#include "testenv.h"




/* Writes text (malloc'ed: freed here) as g_dir/s.yaml and loads it. */
static tg_spec *write_spec(char *text)
{
    char p[2 * PATH_MAX];
    write_in(p, sizeof p, "s.yaml", "%s", text);
    free(text);
    tg_spec *s;
    tg_err e;
    if (spec_load(&s, p, &e) < 0) {
        print_message("spec: %s\n", e.msg);
        fail();
    }
    return s;
}

static char *fault_arm(void)
{
    static char p[2 * PATH_MAX];
    snprintf(p, sizeof p, "%s/tg-fault-arm", g_bin);
    if (!exists(p)) {
        print_message("missing %s (the test double): build tests/helpers\n", p);
        fail();
    }
    return p;
}

/* The fault spec: a good double as reference and as test arm, and three
 * faulted doubles. sha: the model's pinned hash. */
static tg_spec *fault_spec(const char *sha, int legs)
{
    char m[2 * PATH_MAX];
    path_in(m, sizeof m, "m.bin");
    const char *fa = fault_arm();
    char *t = NULL;
    int n = asprintf(&t,
                     "name: fault-gate\n"
                     "model: {path: %s, sha256: %s}\n"
                     "prompts: [{id: p1, text: ab}, {id: p2, text: cd}]\n"
                     "steps: 5\ntop_k: 4\nlegs: %d\nreference: ref\npolicy: {kind: exact}\n"
                     "timeout: {request: 3, leg: 30}\n"
                     "arms:\n"
                     "  - {name: ref, exec: [%s, ok], role: oracle}\n"
                     "  - {name: good, exec: [%s, ok]}\n"
                     "  - {name: crash, exec: [%s, segv-decode]}\n"
                     "  - {name: hang, exec: [%s, hang], timeout: 0.5}\n"
                     "  - {name: junk, exec: [%s, garbage]}\n"
                     "fault_patterns: [\"Memory access fault\"]\n",
                     m, sha, legs, fa, fa, fa, fa, fa);
    assert_true(n > 0);
    return write_spec(t);
}

static tg_store *open_db(void)
{
    char p[2 * PATH_MAX];
    path_in(p, sizeof p, "t.db");
    tg_store *st;
    tg_err e;
    if (store_open(&st, p, &e) < 0) {
        print_message("store: %s\n", e.msg);
        fail();
    }
    return st;
}

/* sql on st, prepared with ?1 run and ?2 arm (those it has), stepped once;
 * the test fails when sqlite refuses sql. */
static sqlite3_stmt *q_row(tg_store *st, const char *sql, int64_t run, const char *arm, int *row)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) {
        print_message("sql %s: %s\n", sql, sqlite3_errmsg(db));
        fail();
    }
    if (sqlite3_bind_parameter_count(q) >= 1) sqlite3_bind_int64(q, 1, run);
    if (sqlite3_bind_parameter_count(q) >= 2) sqlite3_bind_text(q, 2, arm, -1, SQLITE_STATIC);
    *row = sqlite3_step(q) == SQLITE_ROW;
    return q;
}

/* The integer of q_row's first column (-1: no row). */
static long long q_int(tg_store *st, const char *sql, int64_t run, const char *arm)
{
    int row;
    sqlite3_stmt *q = q_row(st, sql, run, arm, &row);
    long long v = row ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    return v;
}

/* The text of q_row's first column into out ("(none)": no row). */
static void q_text(tg_store *st, const char *sql, int64_t run, const char *arm, char *out, size_t n)
{
    int row;
    sqlite3_stmt *q = q_row(st, sql, run, arm, &row);
    const unsigned char *t = row ? sqlite3_column_text(q, 0) : NULL;
    snprintf(out, n, "%s", t ? (const char *)t : "(none)");
    sqlite3_finalize(q);
}

/* The arm's overall TOKEN_GATE in the latest verdict set, into word. */
static void arm_verdict(tg_store *st, int64_t run, const char *arm, char word[32])
{
    q_text(st, "SELECT value FROM verdict WHERE run_id = ?1 AND arm = ?2 AND prompt IS NULL "
               "AND key = 'TOKEN_GATE' ORDER BY set_no DESC LIMIT 1", run, arm, word, 32);
}

static void assert_integrity(tg_store *st)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    const char *r = (const char *)sqlite3_column_text(q, 0);
    if (strcmp(r, "ok")) {
        print_message("integrity_check: %s\n", r);
        fail();
    }
    sqlite3_finalize(q);
}

static gate_options opts(void)
{
    gate_options o = {.bin_dir = g_bin, .jobs = 2, .grace = 0.3};
    return o;
}

/* Scores run with the default options; an error fails the test. */
static verdict_result score(tg_store *st, int64_t run)
{
    verdict_options vo = verdict_options_default();
    verdict_result vr;
    tg_err e;
    if (verdict_score_run(st, run, &vo, &vr, &e) < 0) fail_msg("verdict_score_run: %s", e.msg);
    return vr;
}

/* Runs the gate of s into st with opts(); an error fails the test. */
static gate_result run_gate(tg_store *st, const tg_spec *s)
{
    gate_options o = opts();
    gate_result r;
    tg_err e;
    if (gate_run(st, s, &o, &r, &e) < 0) fail_msg("gate_run: %s", e.msg);
    return r;
}

static void test_faulted_arms(void **unused)
{
    (void)unused;
    char sha[65];
    make_model(sha, NULL, 0);
    tg_spec *s = fault_spec(sha, 2);
    tg_store *st = open_db();
    double t0 = tg_now();
    gate_result r = run_gate(st, s);
    double took = tg_now() - t0;
    if (took > 30) {
        print_message("the faulted gate took %.1f s, expected the timeouts to end it well within 30 s\n", took);
        fail();
    }
    assert_int_equal(r.legs_planned, 10);
    assert_int_equal(r.legs_run, 10);
    assert_int_equal(r.legs_faulted, 6);
    assert_integrity(st);
    /* every leg stored, with a cause exactly for the faulted arms */
    assert_int_equal(q_int(st, "SELECT count(*) FROM leg WHERE run_id = ?1", r.run_id, NULL), 10);
    const char *bad[] = {"crash", "hang", "junk"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(q_int(st, "SELECT count(*) FROM leg l JOIN arm a ON a.id = l.arm_id WHERE l.run_id = ?1 "
                                   "AND a.name = ?2 AND l.cause IS NOT NULL", r.run_id, bad[i]), 2);
    assert_int_equal(q_int(st, "SELECT count(*) FROM leg l JOIN arm a ON a.id = l.arm_id WHERE l.run_id = ?1 "
                               "AND a.name = ?2 AND l.cause IS NULL", r.run_id, "good"), 2);
    /* the crash arm's partial steps were kept (2 per prompt before the SIGSEGV of the first) */
    assert_int_equal(q_int(st, "SELECT count(*) FROM step s JOIN leg l ON l.id = s.leg_id JOIN arm a ON a.id = l.arm_id "
                               "WHERE l.run_id = ?1 AND a.name = ?2 AND l.leg = 1", r.run_id, "crash"), 2);
    /* teacher forcing: the good arm's forced tokens are the reference's leg-1 tokens */
    assert_int_equal(q_int(st,
                           "SELECT count(*) FROM step g JOIN leg lg ON lg.id = g.leg_id JOIN arm ag ON ag.id = lg.arm_id "
                           "JOIN step f ON f.prompt_id = g.prompt_id AND f.step = g.step "
                           "JOIN leg lf ON lf.id = f.leg_id JOIN arm af ON af.id = lf.arm_id "
                           "WHERE lg.run_id = ?1 AND ag.name = ?2 AND af.name = 'ref' AND lf.leg = 1 "
                           "AND g.forced = f.token", r.run_id, "good"), 2 * 2 * 5);

    verdict_result vr = score(st, r.run_id);
    assert_string_not_equal(vr.verdict, "PASS");
    char w[32];
    for (int i = 0; i < 3; i++) {
        arm_verdict(st, r.run_id, bad[i], w);
        if (!strcmp(w, "PASS")) {
            print_message("faulted arm %s got TOKEN_GATE=PASS\n", bad[i]);
            fail();
        }
    }
    arm_verdict(st, r.run_id, "good", w);
    assert_string_equal(w, "PASS");
    /* the hung arm's REASON is the stored cause, not the harness's own kill */
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                        "SELECT value FROM verdict WHERE run_id = ?1 AND arm = 'hang' AND"
                                        " prompt IS NULL AND key = ?2", -1, &q, NULL), SQLITE_OK);
    static const char *const keys[] = {"LEG1_NOT_CLEAN", "REASON"};
    for (int k = 0; k < 2; k++) {
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, r.run_id);
        sqlite3_bind_text(q, 2, keys[k], -1, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(q), SQLITE_ROW);
        const char *v = (const char *)sqlite3_column_text(q, 0);
        if (!strstr(v, "timeout: hello: no complete answer within 0.5 s")) print_message("%s=%s\n", keys[k], v);
        assert_non_null(strstr(v, "timeout: hello: no complete answer within 0.5 s"));
        assert_null(strstr(v, "killed by signal"));
    }
    sqlite3_finalize(q);
    assert_integrity(st);
    store_close(st);
    spec_free(s);
}

/* Non-finite and flat logits (docs/protocol.md spells NaN "nan"): a leg
 * that sends them is accepted and stored (it was a protocol error that
 * killed the arm), the step is classed DEGENERATE, and no step whose
 * reference logits are degenerate passes: a flat or NaN reference makes
 * the arm NOT_MEASURABLE, an arm's own NaN logits make it FAIL. */
static void test_degenerate_logits(void **unused)
{
    (void)unused;
    char sha[65], m[2 * PATH_MAX];
    make_model(sha, m, sizeof m);
    const char *fa = fault_arm();
    static const char *const cases[][4] = {
        /* reference mode, test arm mode, the arm's verdict, reason fragment */
        {"flat-logits", "ok", "NOT_MEASURABLE", "reference's logits are degenerate"},
        {"nan-logits", "ok", "NOT_MEASURABLE", "reference's logits are degenerate"},
        {"ok", "nan-logits", "FAIL", "the arm's logits have a NaN"},
    };
    for (int c = 0; c < 3; c++) {
        char *t;
        assert_true(asprintf(&t,
                             "name: degenerate\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: ab}]\n"
                             "steps: 3\ntop_k: 4\nlegs: 2\nreference: ref\npolicy: {kind: near-tie, band: 0.5}\n"
                             "arms:\n  - {name: ref, exec: [%s, %s], role: oracle}\n  - {name: arm, exec: [%s, %s]}\n",
                             m, sha, fa, cases[c][0], fa, cases[c][1]) > 0);
        tg_spec *s = write_spec(t);
        tg_store *st = open_db();
        gate_result r = run_gate(st, s);
        /* accepted: no leg has a cause, every step is stored */
        long long causes = q_int(st, "SELECT count(*) FROM leg WHERE run_id = ?1 AND cause IS NOT NULL", r.run_id, NULL);
        if (causes) {
            sqlite3_stmt *q;
            sqlite3_prepare_v2(store_db(st), "SELECT cause FROM leg WHERE run_id = ?1 AND cause IS NOT NULL", -1, &q, NULL);
            sqlite3_bind_int64(q, 1, r.run_id);
            if (sqlite3_step(q) == SQLITE_ROW) print_message("%s: cause %s\n", cases[c][0], sqlite3_column_text(q, 0));
            sqlite3_finalize(q);
        }
        assert_int_equal(causes, 0);
        assert_int_equal(q_int(st, "SELECT count(*) FROM step s JOIN leg l ON l.id = s.leg_id WHERE l.run_id = ?1",
                               r.run_id, NULL), 4 * 3);
        verdict_result vr = score(st, r.run_id);
        assert_string_equal(vr.verdict, cases[c][2]);
        char w[32];
        arm_verdict(st, r.run_id, "arm", w);
        assert_string_equal(w, cases[c][2]);
        assert_int_equal(q_int(st, "SELECT count(*) FROM compare WHERE run_id = ?1 AND class = 'DEGENERATE'",
                               r.run_id, NULL), 2 * 3);
        char why[1024];
        q_text(st, "SELECT value FROM verdict WHERE run_id = ?1 AND arm = 'arm' AND prompt = 'p1' AND key = 'REASON'",
               r.run_id, NULL, why, sizeof why);
        if (!strstr(why, cases[c][3])) print_message("%s/%s: REASON %s\n", cases[c][0], cases[c][1], why);
        assert_non_null(strstr(why, cases[c][3]));
        if (c < 2)
            assert_int_equal(q_int(st, "SELECT CAST(value AS INTEGER) FROM verdict WHERE run_id = ?1 AND arm IS NULL"
                                       " AND key = 'DEGENERATE_STEPS'", r.run_id, NULL), 3);
        /* the NaNs came back from the store as NaNs */
        if (c == 1) {
            store_tops tt;
            tg_err e;
            int64_t leg = q_int(st, "SELECT l.id FROM leg l JOIN arm a ON a.id = l.arm_id WHERE l.run_id = ?1"
                                    " AND a.name = 'ref' AND l.leg = 1", r.run_id, NULL);
            int64_t pid = q_int(st, "SELECT id FROM prompt WHERE run_id = ?1", r.run_id, NULL);
            assert_int_equal(store_tops_read(store_db(st), leg, pid, &tt, &e), 0);
            assert_int_equal(tt.n, 3);
            assert_true(isnan(tt.top[tt.off[0]].logit));
            store_tops_free(&tt);
        }
        store_close(st);
        spec_free(s);
    }
}

/* Without --jobs the threads of the running legs stay within the CPUs: on
 * 2 CPUs, 2-thread arms run one leg at a time (llama.cpp's spinning
 * threads made --jobs 2 with threads 2 four times slower), 1-thread arms
 * two at a time, an arm asking for more than all CPUs runs alone; --jobs N
 * runs N legs at a time regardless. The legs are made slow (200 ms a step)
 * so that they would overlap without the budget. */
static void test_cpu_budget(void **unused)
{
    (void)unused;
    cpu_set_t old, two;
    assert_int_equal(sched_getaffinity(0, sizeof old, &old), 0);
    if (CPU_COUNT(&old) < 2) {
        print_message("skip: fewer than 2 CPUs\n");
        skip();
    }
    CPU_ZERO(&two);
    for (int i = 0, k = 0; i < CPU_SETSIZE && k < 2; i++)
        if (CPU_ISSET(i, &old)) CPU_SET(i, &two), k++;
    assert_int_equal(sched_setaffinity(0, sizeof two, &two), 0);
    assert_int_equal(gate_cpus(), 2);
    setenv("TG_FAULT_DELAY_MS", "200", 1);
    char sha[65], m[2 * PATH_MAX];
    make_model(sha, m, sizeof m);
    const char *fa = fault_arm();
    static const int threads[] = {2, 1, 8};
    static const int peak[] = {2, 2, 2};
    for (int c = 0; c < 3; c++) {
        char *t;
        assert_true(asprintf(&t,
                             "name: jobs\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: ab}]\n"
                             "steps: 2\ntop_k: 2\nlegs: 2\njobs: 4\nreference: ref\npolicy: {kind: exact}\n"
                             "arms:\n  - {name: ref, exec: [%s, ok], options: {threads: %d}}\n"
                             "  - {name: a, exec: [%s, ok], options: {threads: %d}}\n"
                             "  - {name: b, exec: [%s, ok], options: {threads: %d}}\n",
                             m, sha, fa, threads[c], fa, threads[c], fa, threads[c]) > 0);
        tg_spec *s = write_spec(t);
        for (int i = 0; i < 3; i++) assert_int_equal(gate_arm_threads(s, i, 2), threads[c]);
        tg_store *st = open_db();
        gate_options o = opts();
        o.jobs = 0;
        gate_result r;
        tg_err e;
        assert_int_equal(gate_run(st, s, &o, &r, &e), 0);
        print_message("threads %d: peak %d threads at once\n", threads[c], r.peak_threads);
        assert_int_equal(r.cpu_budget, 2);
        assert_int_equal(r.jobs, 4);
        assert_true(r.peak_threads <= peak[c]);
        if (threads[c] == 1) assert_int_equal(r.peak_threads, 2);   /* 1-thread legs did run side by side */
        o.jobs = 3;   /* an explicit --jobs: no budget */
        assert_int_equal(gate_run(st, s, &o, &r, &e), 0);
        assert_int_equal(r.cpu_budget, 0);
        assert_int_equal(r.jobs, 3);
        store_close(st);
        spec_free(s);
    }
    unsetenv("TG_FAULT_DELAY_MS");
    sched_setaffinity(0, sizeof old, &old);
}

/* The spec of a gate over the stand-in model and tg-fault-arm arms, each
 * "NAME:MODE" of arms (NULL-terminated; the first is the reference): 2
 * legs, policy exact, with the lines of head (name, prompts, steps,
 * top_k). */
static tg_spec *double_spec(const char *head, const char *const *arms)
{
    char sha[65], m[2 * PATH_MAX];
    make_model(sha, m, sizeof m);
    const char *fa = fault_arm();
    char *t;
    assert_true(asprintf(&t, "%smodel: {path: %s, sha256: %s}\nlegs: 2\npolicy: {kind: exact}\narms:\n", head, m,
                         sha) > 0);
    for (int i = 0; arms[i]; i++) {
        const char *colon = strchr(arms[i], ':');
        assert_non_null(colon);
        char *u;
        assert_true(asprintf(&u, "%s  - {name: %.*s, exec: [%s, %s]}\n", t, (int)(colon - arms[i]),
                             arms[i], fa, colon + 1) > 0);
        free(t);
        t = u;
    }
    char *u;
    const char *ref = arms[0], *colon = strchr(ref, ':');
    assert_true(asprintf(&u, "%sreference: %.*s\n", t, (int)(colon - ref), ref) > 0);
    free(t);
    return write_spec(u);
}

/* Counters near INT64_MAX (a worker's word): two decodes a leg and two
 * legs sum past it; the sums saturate at INT64_MAX instead of wrapping to
 * negative numbers (signed overflow). */
static void test_counters_saturate(void **unused)
{
    (void)unused;
    static const char *const arms[] = {"ref:ok", "big:huge-counters", NULL};
    tg_spec *s = double_spec("name: counters\nprompts: [{id: p1, text: ab}, {id: p2, text: cd}]\nsteps: 2\ntop_k: 2\n",
                            arms);
    tg_store *st = open_db();
    gate_result r = run_gate(st, s);
    assert_true(q_int(st, "SELECT min(device_ops) FROM leg l JOIN arm a ON a.id = l.arm_id WHERE l.run_id = ?1"
                          " AND a.name = 'big'", r.run_id, NULL) == INT64_MAX);
    score(st, r.run_id);
    static const char *const keys[] = {"DEVICE_OPS", "REFERENCE_TIER_HITS"};
    for (int i = 0; i < 2; i++) {
        sqlite3_stmt *q;
        assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                            "SELECT value FROM verdict WHERE run_id = ?1 AND arm IS ?2 AND"
                                            " prompt IS NULL AND key = ?3", -1, &q, NULL), SQLITE_OK);
        for (int lvl = 0; lvl < 2; lvl++) {
            sqlite3_reset(q);
            sqlite3_bind_int64(q, 1, r.run_id);
            if (lvl) sqlite3_bind_text(q, 2, "big", -1, SQLITE_STATIC);
            else sqlite3_bind_null(q, 2);
            sqlite3_bind_text(q, 3, keys[i], -1, SQLITE_STATIC);
            assert_int_equal(sqlite3_step(q), SQLITE_ROW);
            assert_string_equal((const char *)sqlite3_column_text(q, 0), "9223372036854775807");
        }
        sqlite3_finalize(q);
    }
    store_close(st);
    spec_free(s);
}

/* A worker's refusal is stored once ("load: no such model", not "load:
 * arm x: load: load: load: ...") and its ANSI escapes never reach a
 * terminal: the cause and every report show them as \x1b. */
static void test_worker_error_text(void **unused)
{
    (void)unused;
    static const char *const arms[] = {"ref:ok", "x:error-load", NULL};
    tg_spec *s = double_spec("name: errtext\nprompts: [{id: p1, text: ab}]\nsteps: 2\ntop_k: 2\n", arms);
    tg_store *st = open_db();
    gate_result r = run_gate(st, s);
    char cause[256];
    q_text(st, "SELECT l.cause FROM leg l JOIN arm a ON a.id = l.arm_id WHERE l.run_id = ?1 AND a.name = 'x'",
           r.run_id, NULL, cause, sizeof cause);
    assert_string_equal(cause, "load: \\x1b[31mno such model\\x1b[0m");
    score(st, r.run_id);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    report_options ro = {REPORT_TEXT, 0};
    tg_err e;
    assert_int_equal(report_write(st, r.run_id, &ro, f, &e), 0);
    fclose(f);
    assert_null(strchr(buf, 0x1b));
    assert_non_null(strstr(buf, "load: \\x1b[31mno such model"));
    free(buf);
    store_close(st);
    spec_free(s);
}

/* `tokgate gate` of g_dir/s.yaml into g_dir/t.db refuses the spec: exit
 * status 2, with want (NULL: anything) on stderr. Returns 1, or 0 when
 * tokgate is not built (said, not checked). */
static int cli_gate_refused(const char *want)
{
    if (!exists(g_tokgate)) {
        print_message("(tokgate not built: CLI exit status not checked)\n");
        return 0;
    }
    char sp[2 * PATH_MAX], db[2 * PATH_MAX];
    path_in(sp, sizeof sp, "s.yaml");
    path_in(db, sizeof db, "t.db");
    char *argv[] = {g_tokgate, "gate", sp, "--db", db, NULL};
    char *out;
    size_t n;
    arm_exit x;
    tg_err e;
    assert_int_equal(arm_run_command(argv, 30, 0, 0, NULL, &out, &n, &x, &e), -1);
    assert_int_equal(x.exit_status, 2);
    if (want) assert_non_null(strstr(x.stderr_text, want));
    arm_exit_free(&x);
    return 1;
}

/* Input errors found before anything runs (exit 2, nothing stored): a
 * model that is not a whole GGUF file for an engine arm (every leg failed
 * and the run was NOT_MEASURABLE, exit 1), and steps x top_k whose scoring
 * would need far more memory than the machine has. */
static void test_inputs_checked_first(void **unused)
{
    (void)unused;
    char sha[65], m[2 * PATH_MAX], cut[2 * PATH_MAX], shipped[2 * PATH_MAX];
    make_model(sha, m, sizeof m);
    path_in(cut, sizeof cut, "cut.gguf");
    snprintf(shipped, sizeof shipped, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    const char *fa = fault_arm();
    /* the shipped model cut after 1 MiB: a truncated download */
    FILE *in = fopen(shipped, "rb"), *out = fopen(cut, "wb");
    assert_non_null(in);
    assert_non_null(out);
    static char buf[1 << 20];
    assert_int_equal(fread(buf, 1, sizeof buf, in), sizeof buf);
    assert_int_equal(fwrite(buf, 1, sizeof buf, out), sizeof buf);
    fclose(in);
    fclose(out);
    char cut_sha[65];
    tg_err e;
    assert_int_equal(tg_sha256_file(cut, cut_sha, &e), 0);
    const char *paths[] = {m, cut}, *shas[] = {sha, cut_sha};
    tg_store *st = open_db();
    long long runs = q_int(st, "SELECT count(*) FROM run", 0, NULL);
    for (int i = 0; i < 2; i++) {
        char *t;
        assert_true(asprintf(&t,
                             "name: notgguf\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: ab}]\n"
                             "steps: 2\ntop_k: 2\nlegs: 2\nreference: ref\npolicy: {kind: exact}\n"
                             "arms:\n  - {name: ref, exec: [%s, ok]}\n  - {name: eng, engine: ref}\n",
                             paths[i], shas[i], fa) > 0);
        tg_spec *s = write_spec(t);
        gate_options o = opts();
        gate_result r;
        assert_int_equal(gate_run(st, s, &o, &r, &e), -1);
        if (!strstr(e.msg, "expected a whole GGUF file for arm eng")) print_message("%s\n", e.msg);
        assert_non_null(strstr(e.msg, "expected a whole GGUF file for arm eng"));
        spec_free(s);
    }
    /* 3 arms x 1000 legs x 100000 steps x top-1024: terabytes */
    char *t;
    assert_true(asprintf(&t,
                         "name: huge\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: ab}]\n"
                         "steps: 100000\ntop_k: 1024\nlegs: 1000\nreference: ref\npolicy: {kind: exact}\n"
                         "arms:\n  - {name: ref, exec: [%s, ok]}\n  - {name: a, exec: [%s, ok]}\n"
                         "  - {name: b, exec: [%s, ok]}\n", m, sha, fa, fa, fa) > 0);
    tg_spec *s = write_spec(t);
    gate_options o = opts();
    gate_result r;
    assert_int_equal(gate_run(st, s, &o, &r, &e), -1);
    if (!strstr(e.msg, "GiB of memory (3 arms x 1000 legs x 1 prompts x 100000 steps x top-1024)"))
        print_message("%s\n", e.msg);
    assert_non_null(strstr(e.msg, "GiB of memory (3 arms x 1000 legs x 1 prompts x 100000 steps x top-1024)"));
    spec_free(s);
    assert_int_equal(q_int(st, "SELECT count(*) FROM run", 0, NULL), runs);
    store_close(st);
    /* the CLI: exit status 2, an input error */
    cli_gate_refused(NULL);
}

/* A pinned hash that does not match: nothing new is stored. */
static void test_artifact_mismatch_stores_nothing(void **unused)
{
    (void)unused;
    char sha[65];
    make_model(sha, NULL, 0);
    tg_store *st = open_db();
    long long runs = q_int(st, "SELECT count(*) FROM run", 0, NULL);
    long long legs = q_int(st, "SELECT count(*) FROM leg", 0, NULL);
    tg_spec *s = fault_spec("0000000000000000000000000000000000000000000000000000000000000000", 1);
    gate_options o = opts();
    gate_result r;
    tg_err e;
    assert_int_equal(gate_run(st, s, &o, &r, &e), -1);
    assert_non_null(strstr(e.msg, "sha256 mismatch"));
    assert_non_null(strstr(e.msg, sha));
    assert_int_equal(q_int(st, "SELECT count(*) FROM run", 0, NULL), runs);
    assert_int_equal(q_int(st, "SELECT count(*) FROM leg", 0, NULL), legs);
    store_close(st);
    spec_free(s);

    /* the CLI: exit status 2 */
    if (!cli_gate_refused("sha256 mismatch")) return;
    st = open_db();
    assert_int_equal(q_int(st, "SELECT count(*) FROM run", 0, NULL), runs);
    store_close(st);
}

/* The spec of the --resume tests: ref and good (tg-fault-arm ok), 2 legs
 * of `steps` steps over one prompt, teacher-forced. */
static tg_spec *resume_spec(int steps)
{
    static const char *const arms[] = {"ref:ok", "good:ok", NULL};
    char head[128];
    snprintf(head, sizeof head, "name: resume\nprompts: [{id: p1, text: xy}]\nsteps: %d\ntop_k: 3\n", steps);
    return double_spec(head, arms);
}

/* The first run of the resume tests: *s the spec (resume_spec(4)), *r its
 * result; returns the store it went into. */
/* A first run of the --resume tests (resume_spec(4) into a fresh store)
 * and the options that resume it. */
typedef struct resumable {
    tg_spec *s;
    tg_store *st;
    gate_result r;   /* the first run */
    gate_options o;  /* opts() resuming it */
} resumable;

static void resume_first_run(resumable *x)
{
    x->s = resume_spec(4);
    x->st = open_db();
    x->r = run_gate(x->st, x->s);
    x->o = opts();
    x->o.resume_run = x->r.run_id;
}

/* --resume: stored legs are skipped; a missing one is run again, forced
 * along the reference tokens read back from the store. */
static void test_resume(void **unused)
{
    (void)unused;
    resumable x;
    resume_first_run(&x);
    tg_err e;
    assert_int_equal(x.r.legs_run, 4);
    gate_result r2;
    assert_int_equal(gate_run(x.st, x.s, &x.o, &r2, &e), 0);
    assert_int_equal(r2.run_id, x.r.run_id);
    assert_int_equal(r2.legs_skipped, 4);
    assert_int_equal(r2.legs_run, 0);
    /* drop the good arm's leg 2 and resume (leg 2: the leg whose rows may be
     * shared with leg 1 through same_as is the one stored first, and with
     * two jobs that can be either; un-share before deleting, as
     * docs/store.md's Q4 does) */
    char *err0 = NULL;
    char sql0[512];
    snprintf(sql0, sizeof sql0,
             "INSERT INTO step_top SELECT o.id, t.prompt_id, t.step, t.rank, t.id, t.logit, t.bits "
             "FROM leg o JOIN step_top t ON t.leg_id = o.same_as WHERE o.run_id = %lld AND o.same_as IN "
             "(SELECT id FROM leg WHERE run_id = %lld AND leg = 2); "
             "UPDATE leg SET same_as = NULL WHERE same_as IN (SELECT id FROM leg WHERE run_id = %lld AND leg = 2)",
             (long long)x.r.run_id, (long long)x.r.run_id, (long long)x.r.run_id);
    assert_int_equal(sqlite3_exec(store_db(x.st), sql0, NULL, NULL, &err0), SQLITE_OK);
    char *err = NULL;
    char sql[256];
    snprintf(sql, sizeof sql, "DELETE FROM leg WHERE run_id = %lld AND leg = 2 AND arm_id = "
             "(SELECT id FROM arm WHERE run_id = %lld AND name = 'good')", (long long)x.r.run_id, (long long)x.r.run_id);
    assert_int_equal(sqlite3_exec(store_db(x.st), sql, NULL, NULL, &err), SQLITE_OK);
    assert_int_equal(gate_run(x.st, x.s, &x.o, &r2, &e), 0);
    assert_int_equal(r2.legs_run, 1);
    assert_int_equal(r2.legs_skipped, 3);
    assert_int_equal(r2.legs_faulted, 0);
    assert_int_equal(q_int(x.st,
                           "SELECT count(*) FROM step g JOIN leg lg ON lg.id = g.leg_id JOIN arm ag ON ag.id = lg.arm_id "
                           "JOIN step f ON f.prompt_id = g.prompt_id AND f.step = g.step "
                           "JOIN leg lf ON lf.id = f.leg_id JOIN arm af ON af.id = lf.arm_id "
                           "WHERE lg.run_id = ?1 AND ag.name = ?2 AND lg.leg = 2 AND af.name = 'ref' AND lf.leg = 1 "
                           "AND g.forced = f.token", x.r.run_id, "good"), 4);
    /* a run of another spec text cannot be resumed */
    spec_free(x.s);
    x.s = resume_spec(5);
    assert_int_equal(gate_run(x.st, x.s, &x.o, &r2, &e), -1);
    assert_non_null(strstr(e.msg, "another spec text"));
    assert_integrity(x.st);
    store_close(x.st);
    spec_free(x.s);
}

/* Two gates on one run: while another process holds run N's lock (as a
 * `tokgate gate --resume N` running it does), a second resume of N stops
 * before running or writing anything, names that process, and leaves the
 * run as it was (it used to fail with "UNIQUE constraint failed" and both
 * marked the run ERROR). Once the holder is gone the resume goes ahead. */
static void test_resume_locked(void **unused)
{
    (void)unused;
    resumable x;
    resume_first_run(&x);
    tg_err e;
    int64_t run = x.r.run_id;
    char *err = NULL;
    char sql[256];
    snprintf(sql, sizeof sql, "DELETE FROM leg WHERE run_id = %lld AND leg = 2", (long long)run);
    assert_int_equal(sqlite3_exec(store_db(x.st), sql, NULL, NULL, &err), SQLITE_OK);
    long long legs0 = q_int(x.st, "SELECT count(*) FROM leg WHERE run_id = ?1 AND ?2 IS NOT NULL", run, "x");
    store_close(x.st);                          /* this process's gate held the lock until here */
    x.st = open_db();

    /* the other process: takes the run's lock, says so, holds it until told */
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char p[2 * PATH_MAX];
        path_in(p, sizeof p, "t.db");
        tg_store *other;
        tg_err oe;
        long h;
        char c = store_open(&other, p, &oe) == 0 && store_run_lock(other, run, &h, &oe) == 0 ? 'L' : 'E';
        if (write(up[1], &c, 1) != 1) _exit(3);
        if (read(down[0], &c, 1) < 0) _exit(3);
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(up[0], &c, 1), 1);
    assert_int_equal(c, 'L');

    gate_result r2;
    assert_int_equal(gate_run(x.st, x.s, &x.o, &r2, &e), -1);
    char want[96];
    snprintf(want, sizeof want, "run %lld is being resumed by process %ld", (long long)run, (long)pid);
    if (!strstr(e.msg, want)) fail_msg("expected \"%s\" in: %s", want, e.msg);
    assert_int_equal(r2.run_id, 0);           /* main marks nothing */
    assert_int_equal(r2.legs_run, 0);
    assert_int_equal(q_int(x.st, "SELECT count(*) FROM leg WHERE run_id = ?1 AND ?2 IS NOT NULL", run, "x"), legs0);

    /* the holder ends: the lock goes with it, and the resume runs the two legs */
    assert_int_equal(write(down[1], "x", 1), 1);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
    assert_int_equal(gate_run(x.st, x.s, &x.o, &r2, &e), 0);
    assert_int_equal(r2.legs_run, 2);
    assert_int_equal(r2.legs_skipped, 2);
    assert_integrity(x.st);
    store_close(x.st);
    spec_free(x.s);
}

/* The real thing: llama.cpp's CPU build as reference, a second llama arm
 * (same library) that must pass, and the engine's cpu tier when built. */
static void test_real_gate(void **unused)
{
    (void)unused;
    char llama[2 * PATH_MAX], engine[2 * PATH_MAX], lib[2 * PATH_MAX], model[2 * PATH_MAX];
    snprintf(llama, sizeof llama, "%s/tg-llama", g_bin);
    snprintf(engine, sizeof engine, "%s/tg-engine", g_bin);
    snprintf(lib, sizeof lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", g_cache);
    snprintf(model, sizeof model, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    if (!exists(llama) || !exists(lib) || !exists(model)) {
        print_message("skipped: needs %s, %s and %s\n", llama, lib, model);
        skip();
    }
    int with_engine = exists(engine);
    char *t;
    assert_true(asprintf(&t,
                         "name: real-gate\n"
                         "model: {path: %s, sha256: 9159ed92d8ffb26f342a511bd3a34e021f38298c26f1a5fdbf3a373c70691657}\n"
                         "prompts: [{id: p1, text: \"The following options are supported:\"}, "
                         "{id: p2, text: \"def __init__(self, *args, **kwargs):\"}]\n"
                         "steps: 8\ntop_k: 8\nlegs: 2\nreference: llama-cpu\npolicy: {kind: near-tie, band: 0.2}\n"
                         "arms:\n"
                         "  - {name: llama-cpu, llama: {lib: %s, options: {threads: 1}}}\n"
                         "  - {name: llama-twin, llama: {lib: %s, options: {threads: 1}}, role: test}\n"
                         "%s",
                         model, lib, lib, with_engine ? "  - {name: cpu, engine: cpu, options: {threads: 1}}\n" : "") > 0);
    tg_spec *s = write_spec(t);
    tg_store *st = open_db();
    gate_result r = run_gate(st, s);
    if (r.legs_faulted) {
        sqlite3_stmt *q;
        sqlite3_prepare_v2(store_db(st), "SELECT a.name, l.leg, l.cause FROM leg l JOIN arm a ON a.id = l.arm_id "
                                         "WHERE l.cause IS NOT NULL", -1, &q, NULL);
        while (sqlite3_step(q) == SQLITE_ROW)
            print_message("faulted leg %s/%d: %s\n", sqlite3_column_text(q, 0), sqlite3_column_int(q, 1),
                          sqlite3_column_text(q, 2));
        sqlite3_finalize(q);
        fail();
    }
    score(st, r.run_id);
    char w[32];
    arm_verdict(st, r.run_id, "llama-twin", w);
    assert_string_equal(w, "PASS");
    if (with_engine) {
        arm_verdict(st, r.run_id, "cpu", w);
        print_message("engine cpu tier against llama.cpp: TOKEN_GATE=%s\n", w);
        /* the stored device is the loaded session's (threads: 1), not
         * hello's description of the defaults */
        assert_int_equal(q_int(st, "SELECT count(*) FROM leg l JOIN arm a ON a.id = l.arm_id WHERE l.run_id = ?1"
                                   " AND a.name = ?2 AND l.device LIKE '%, 1 thread,%'",
                               r.run_id, "cpu"), 2);
    }
    /* the step view renders the tokens with the artifact's own vocabulary */
    {
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        assert_non_null(m);
        tg_err e;
        assert_int_equal(report_step(st, r.run_id, "p1", 0, 0, m, &e), 0);
        fclose(m);
        if (!strstr(buf, "\ntokens: ") || !strstr(buf, "=\""))
            fail_msg("step view without token texts:\n%s", buf);
        free(buf);
    }
    /* the reference's generated text is stored for chain of custody */
    assert_int_equal(q_int(st, "SELECT count(*) FROM leg_prompt lp JOIN leg l ON l.id = lp.leg_id JOIN arm a "
                               "ON a.id = l.arm_id WHERE l.run_id = ?1 AND a.name = ?2 AND length(lp.text) > 0",
                           r.run_id, "llama-cpu"), 4);
    assert_integrity(st);
    store_close(st);
    spec_free(s);
}

/* Byte-unshuffles and decompresses a dump blob (zstd of the f32 array with
 * plane k holding byte k of every value) into n floats. Returns 0 or -1. */
static int dump_decode(const void *blob, int len, int64_t n, float *out)
{
    size_t raw = (size_t)n * 4;
    unsigned char *shuf = malloc(raw ? raw : 1);
    assert_non_null(shuf);
    size_t got = ZSTD_decompress(shuf, raw, blob, (size_t)len);
    int rc = ZSTD_isError(got) || got != raw ? -1 : 0;
    unsigned char *dst = (unsigned char *)out;
    for (int64_t k = 0; rc == 0 && k < n; k++)
        for (int b = 0; b < 4; b++) dst[4 * k + b] = shuf[(size_t)b * (size_t)n + (size_t)k];
    free(shuf);
    return rc;
}

/* A spec's dumps field: a real gate (the shipped model, engine ref and cpu
 * tiers, 1 prompt, 3 steps) asks both arms for dumps at step 1 and stores
 * the chosen stages in the dump table; the stored final logits agree with
 * the step's stored argmax. */
static void test_real_gate_dumps(void **unused)
{
    (void)unused;
    char engine[2 * PATH_MAX], model[2 * PATH_MAX];
    snprintf(engine, sizeof engine, "%s/tg-engine", g_bin);
    snprintf(model, sizeof model, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    if (!exists(engine) || !exists(model)) {
        print_message("skipped: needs %s and %s\n", engine, model);
        skip();
    }
    char *t;
    assert_true(asprintf(&t,
                         "name: dump-gate\n"
                         "model: {path: %s, sha256: 9159ed92d8ffb26f342a511bd3a34e021f38298c26f1a5fdbf3a373c70691657}\n"
                         "prompts: [{id: p1, text: \"The following options are supported:\"}]\n"
                         "steps: 3\ntop_k: 4\nlegs: 1\nreference: ref\npolicy: {kind: exact}\n"
                         "dumps: {steps: [1], stages: [logits, ffn_out]}\n"
                         "arms:\n"
                         "  - {name: ref, engine: ref, options: {threads: 1}}\n"
                         "  - {name: cpu, engine: cpu, options: {threads: 1}}\n",
                         model) > 0);
    tg_spec *s = write_spec(t);
    tg_store *st = open_db();
    gate_result r = run_gate(st, s);
    assert_int_equal(r.legs_faulted, 0);
    const char *arms[] = {"ref", "cpu"};
    for (int a = 0; a < 2; a++) {
        /* step 1 only; the 8 layers' ffn_out and the final logits (layer -1); no other stage */
        assert_int_equal(q_int(st, "SELECT count(*) FROM dump d JOIN leg l ON l.id = d.leg_id JOIN arm a "
                                   "ON a.id = l.arm_id WHERE l.run_id = ?1 AND a.name = ?2", r.run_id, arms[a]), 9);
        assert_int_equal(q_int(st, "SELECT count(*) FROM dump d JOIN leg l ON l.id = d.leg_id JOIN arm a "
                                   "ON a.id = l.arm_id WHERE l.run_id = ?1 AND a.name = ?2 AND d.step = 1 AND "
                                   "((d.stage = 'ffn_out' AND d.layer BETWEEN 0 AND 7) OR "
                                   "(d.stage = 'logits' AND d.layer = -1))", r.run_id, arms[a]), 9);
        sqlite3_stmt *q;
        assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                            "SELECT d.n, d.data, s.token FROM dump d JOIN leg l ON l.id = d.leg_id "
                                            "JOIN arm a ON a.id = l.arm_id JOIN step s ON s.leg_id = d.leg_id "
                                            "AND s.prompt_id = d.prompt_id AND s.step = d.step "
                                            "WHERE l.run_id = ?1 AND a.name = ?2 AND d.stage = 'logits'",
                                            -1, &q, NULL), SQLITE_OK);
        sqlite3_bind_int64(q, 1, r.run_id);
        sqlite3_bind_text(q, 2, arms[a], -1, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(q), SQLITE_ROW);
        int64_t n = sqlite3_column_int64(q, 0);
        assert_int_equal(n, 8192);   /* the model's vocabulary */
        float *v = malloc(sizeof *v * (size_t)n);
        assert_non_null(v);
        if (dump_decode(sqlite3_column_blob(q, 1), sqlite3_column_bytes(q, 1), n, v) < 0)
            fail_msg("arm %s: the logits dump does not decode to %lld f32 values", arms[a], (long long)n);
        int best = 0;
        for (int64_t i = 1; i < n; i++)
            if (v[i] > v[best]) best = (int)i;
        if (best != sqlite3_column_int(q, 2))
            fail_msg("arm %s: argmax of the dumped logits %d, the stored step token %d", arms[a], best,
                     sqlite3_column_int(q, 2));
        free(v);
        sqlite3_finalize(q);
    }
    assert_integrity(st);
    store_close(st);
    spec_free(s);
}

TG_TEST_MAIN(
    test_degenerate_logits, test_cpu_budget, test_counters_saturate, test_worker_error_text,
    test_inputs_checked_first, test_faulted_arms, test_artifact_mismatch_stores_nothing, test_resume,
    test_resume_locked, test_real_gate, test_real_gate_dumps)
