/*
 * test_compare.c: comparison classes, verdict rules and provenance keys on
 * crafted runs (tests/craft.h) written through the store API, scored with
 * verdict_score_run. Covers every class, the exact vs near-tie policy and a
 * rescore with another band (history kept), NOT_MEASURABLE (one clean leg;
 * clean legs differing), faulted legs and device fallback, tokenizer
 * divergence, ORACLE_REPRO FIRST/YES/NO, chain of custody
 * EXACT/PREFIX/DIVERGE, the four-way resolution sentences, free mode, and
 * the bench lookup.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sqlite3.h>

#include "compare.h"
#include "craft.h"
#include "testenv.h"
#include "verdict.h"

typedef struct ctx {
    tg_store *st;
    char path[256];
} ctx;

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    c->st = craft_store(c->path);
    if (!c->st) return -1;
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    craft_store_drop(c->st, c->path);
    free(c);
    return 0;
}

/* Value of a verdict key in the latest set of run ("" if absent). */
static const char *key(tg_store *st, int64_t run, const char *arm, const char *prompt, const char *k)
{
    static char buf[8][512];
    static int slot;
    char *out = buf[slot++ % 8];
    out[0] = 0;
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(st),
                       "SELECT value FROM verdict WHERE run_id=?1 AND arm IS ?2 AND prompt IS ?3 AND key=?4"
                       " AND set_no=(SELECT max(set_no) FROM verdict_set WHERE run_id=?1)",
                       -1, &s, NULL);
    sqlite3_bind_int64(s, 1, run);
    if (arm) sqlite3_bind_text(s, 2, arm, -1, SQLITE_STATIC); else sqlite3_bind_null(s, 2);
    if (prompt) sqlite3_bind_text(s, 3, prompt, -1, SQLITE_STATIC); else sqlite3_bind_null(s, 3);
    sqlite3_bind_text(s, 4, k, -1, SQLITE_STATIC);
    if (sqlite3_step(s) == SQLITE_ROW) snprintf(out, 512, "%s", sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    return out;
}

/* Class of (arm, leg, prompt, step) in the latest set. */
static const char *cls(tg_store *st, int64_t run, const char *arm, int leg, const char *prompt, int step)
{
    static char out[32];
    out[0] = 0;
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(st),
                       "SELECT class FROM v_step_compare WHERE run_id=?1 AND arm=?2 AND leg=?3"
                       " AND prompt=?4 AND step=?5",
                       -1, &s, NULL);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_text(s, 2, arm, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 3, leg);
    sqlite3_bind_text(s, 4, prompt, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 5, step);
    if (sqlite3_step(s) == SQLITE_ROW) snprintf(out, sizeof out, "%s", sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    return out;
}

static verdict_result score(tg_store *st, int64_t run, const char *policy, double band)
{
    verdict_options o = verdict_options_default();
    o.policy_kind = policy;
    if (band >= 0) o.band = band;
    verdict_result r;
    tg_err e = {{0}};
    int rc = verdict_score_run(st, run, &o, &r, &e);
    if (rc != 0) fprintf(stderr, "score: %s\n", e.msg);
    assert_int_equal(rc, 0);
    return r;
}

static const craft_arm ARMS2[] = {
    {"llama-cpu", "llama", "oracle", NULL},
    {"cpu", "engine", "test", "{\"engine\":\"cpu\"}"},
};

/* Reference p1: tokens 100..600 with gaps 1, 0.05, 0.5, 1, 1, 1. */
static craft_lp ref_p1(void)
{
    int32_t t[6] = {100, 200, 300, 400, 500, 600};
    craft_lp p = craft_prompt(6, t);
    p.gap[1] = 0.05;
    p.gap[2] = 0.5;
    return p;
}

/* A two-arm run: the reference with `legs` clean legs, cpu with tokens t. */
static int64_t two_arm_run(tg_store *st, const char *policy, double band, const int32_t *t,
                           int legs)
{
    int64_t run = craft_run(st, "spec-a", "art1", "teacher-forced", "llama-cpu", policy, band, legs,
                            2, ARMS2, 1);
    assert_true(run > 0);
    craft_lp r = ref_p1();
    assert_int_equal(craft_legs(st, run, "llama-cpu", legs, 1, &r, NULL), 0);
    craft_lp a = craft_prompt(6, t);
    craft_force(&a, &r);
    assert_int_equal(craft_legs(st, run, "cpu", legs, 1, &a, NULL), 0);
    return run;
}

static void test_every_class(void **state)
{
    ctx *c = *state;
    /* EXACT, NEAR_TIE (rank 2, gap .05 < .2), RANK2 (gap .5), TOPK (rank
     * 5), OUTSIDE, EXACT */
    int32_t t[6] = {100, 201, 301, 404, 9999, 600};
    int64_t run = two_arm_run(c->st, "near-tie", 0.2, t, 2);
    verdict_result v = score(c->st, run, NULL, -1);
    const char *want[6] = {"EXACT", "NEAR_TIE", "RANK2", "TOPK", "OUTSIDE", "EXACT"};
    for (int s = 0; s < 6; s++) {
        const char *got = cls(c->st, run, "cpu", 1, "p1", s);
        if (strcmp(got, want[s])) fail_msg("step %d: class %s, expected %s", s, got, want[s]);
    }
    /* ranks as stored */
    sqlite3_stmt *q;
    sqlite3_prepare_v2(store_db(c->st),
                       "SELECT group_concat(rank, ',') FROM (SELECT rank FROM v_step_compare"
                       " WHERE run_id=?1 AND arm='cpu' AND leg=1 ORDER BY step)", -1, &q, NULL);
    sqlite3_bind_int64(q, 1, run);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(q, 0), "1,2,2,5,0,1");
    sqlite3_finalize(q);
    assert_string_equal(v.verdict, "FAIL");
    assert_int_equal(v.exit_code, 1);
    assert_string_equal(key(c->st, run, NULL, NULL, "GENERATION_DIVERGENCES"), "4/6");
    assert_string_equal(key(c->st, run, "cpu", "p1", "FIRST_DIFF"), "1");
    /* near-tie passes the policy, so the first failing step is the RANK2 one */
    assert_string_equal(key(c->st, run, "cpu", "p1", "FIRST_FAIL"), "2");
    /* the rank histogram view agrees */
    sqlite3_prepare_v2(store_db(c->st),
                       "SELECT n FROM v_rank_hist WHERE run_id=?1 AND arm='cpu' AND rank=2", -1, &q, NULL);
    sqlite3_bind_int64(q, 1, run);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), 4); /* 2 legs x 2 rank-2 steps */
    sqlite3_finalize(q);
}

/* A multi-way tie: a token the reference ranks 3rd but within the band of
 * its top-1 is a NEAR_TIE; beyond the band rank 2 is RANK2 and rank 4 TOPK.
 * Crafted logits: top-1 10, rank k >= 2 at 10 - gap - 0.5 (k - 2). */
static void test_multiway_near_tie(void **state)
{
    ctx *c = *state;
    int32_t t[6] = {100, 202, 303, 401, 500, 600};
    int64_t run = two_arm_run(c->st, "near-tie", 0.6, t, 2);
    score(c->st, run, NULL, -1);
    const char *want[4] = {"EXACT", "NEAR_TIE", "TOPK", "RANK2"};
    for (int s = 0; s < 4; s++) {
        const char *got = cls(c->st, run, "cpu", 1, "p1", s);
        if (strcmp(got, want[s])) fail_msg("step %d: class %s, expected %s", s, got, want[s]);
    }
}

static void test_policy_switch_and_rescore(void **state)
{
    ctx *c = *state;
    int32_t t[6] = {100, 201, 300, 400, 500, 600}; /* one near tie at step 1 */
    int64_t run = two_arm_run(c->st, "exact", 0.2, t, 2);
    verdict_result v1 = score(c->st, run, NULL, -1);
    assert_string_equal(v1.verdict, "FAIL");
    assert_int_equal(v1.set, 1);
    verdict_result v2 = score(c->st, run, "near-tie", -1);
    assert_string_equal(v2.verdict, "PASS");
    assert_int_equal(v2.exit_code, 0);
    assert_int_equal(v2.set, 2);
    assert_string_equal(key(c->st, run, "cpu", NULL, "NEAR_TIES_WON"), "0/1");
    /* a band below the step's gap makes it RANK2: FAIL again, as set 3 */
    verdict_result v3 = score(c->st, run, "near-tie", 0.01);
    assert_string_equal(v3.verdict, "FAIL");
    assert_int_equal(v3.set, 3);
    assert_string_equal(cls(c->st, run, "cpu", 1, "p1", 1), "RANK2");
    /* history: every set kept with its own policy, band and overall */
    sqlite3_stmt *q;
    sqlite3_prepare_v2(store_db(c->st),
                       "SELECT group_concat(policy || ':' || band || ':' || overall, ' ') FROM"
                       " (SELECT * FROM verdict_set WHERE run_id=?1 ORDER BY set_no)", -1, &q, NULL);
    sqlite3_bind_int64(q, 1, run);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(q, 0),
                        "exact:0.2:FAIL near-tie:0.2:PASS near-tie:0.01:FAIL");
    sqlite3_finalize(q);
    /* an unknown policy or a negative band is refused */
    verdict_options o = verdict_options_default();
    o.policy_kind = "sloppy";
    verdict_result r;
    tg_err e = {{0}};
    assert_int_equal(verdict_score_run(c->st, run, &o, &r, &e), -1);
    assert_non_null(strstr(e.msg, "sloppy"));
}

static void test_exact_run_passes(void **state)
{
    ctx *c = *state;
    int32_t t[6] = {100, 200, 300, 400, 500, 600};
    int64_t run = two_arm_run(c->st, "exact", 0.2, t, 3);
    verdict_result v = score(c->st, run, NULL, -1);
    assert_string_equal(v.verdict, "PASS");
    assert_string_equal(key(c->st, run, NULL, NULL, "LEGS_CLEAN"), "3/3");
    assert_string_equal(key(c->st, run, NULL, NULL, "LEGS_IDENTICAL"), "YES");
    assert_string_equal(key(c->st, run, NULL, NULL, "TOKENIZER_DIVERGENCES"), "0/1");
    assert_string_equal(key(c->st, run, NULL, NULL, "GENERATION_DIVERGENCES"), "0/6");
    assert_string_equal(key(c->st, run, NULL, NULL, "CONTESTED"), "0");
}

static void test_not_measurable_one_clean_leg(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "spec-b", "art1", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                            2, ARMS2, 1);
    craft_lp r = ref_p1();
    assert_int_equal(craft_legs(c->st, run, "llama-cpu", 2, 1, &r, NULL), 0);
    craft_lp a = r;
    craft_force(&a, &r);
    tg_err e = {{0}};
    assert_int_equal(craft_leg(c->st, run, "cpu", 1, 1, &a, NULL, &e), 0);
    craft_legopt crash = {.exit_status = -1, .term_signal = 11, .cause = "crash: SIGSEGV"};
    a.n = 3; /* the crashed leg stored what arrived */
    assert_int_equal(craft_leg(c->st, run, "cpu", 2, 1, &a, &crash, &e), 0);
    verdict_result v = score(c->st, run, NULL, -1);
    assert_string_equal(v.verdict, "NOT_MEASURABLE");
    assert_int_equal(v.exit_code, 1);
    assert_string_equal(key(c->st, run, NULL, NULL, "LEGS_CLEAN"), "1/2");
    assert_non_null(strstr(key(c->st, run, "cpu", NULL, "REASON"), "fewer than 2"));
    assert_non_null(strstr(key(c->st, run, "cpu", NULL, "LEG2_NOT_CLEAN"), "crash: SIGSEGV"));
}

static void test_not_measurable_legs_differ(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "spec-c", "art1", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                            2, ARMS2, 1);
    craft_lp r = ref_p1();
    assert_int_equal(craft_legs(c->st, run, "llama-cpu", 2, 1, &r, NULL), 0);
    craft_lp a = r;
    craft_force(&a, &r);
    tg_err e = {{0}};
    assert_int_equal(craft_leg(c->st, run, "cpu", 1, 1, &a, NULL, &e), 0);
    a.gap[4] = 0.75; /* same tokens, other logits: the digest differs */
    assert_int_equal(craft_leg(c->st, run, "cpu", 2, 1, &a, NULL, &e), 0);
    verdict_result v = score(c->st, run, NULL, -1);
    assert_string_equal(v.verdict, "NOT_MEASURABLE");
    assert_string_equal(key(c->st, run, NULL, NULL, "LEGS_IDENTICAL"), "NO");
    assert_non_null(strstr(key(c->st, run, "cpu", NULL, "LEGS_IDENTICAL_WHY"), "step 4"));
}

static void test_faulted_and_fallback_legs(void **state)
{
    ctx *c = *state;
    static const craft_arm arms[] = {
        {"llama-cpu", "llama", "oracle", NULL},
        {"cpu", "engine", "test", "{\"engine\":\"cpu\"}"},
        {"gpu", "engine", "test", "{\"engine\":\"gpu\"}"},
    };
    int64_t run = craft_run(c->st, "spec-d", "art1", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                            3, arms, 1);
    craft_lp r = ref_p1();
    assert_int_equal(craft_legs(c->st, run, "llama-cpu", 2, 1, &r, NULL), 0);
    craft_lp a = r;
    craft_force(&a, &r);
    tg_err e = {{0}};
    /* cpu: leg 2 exits 0 but its stderr matched a fault pattern */
    craft_legopt cnt = {.counters = "{\"ops\":{\"matmul_q4_K/cpu\":10,\"rmsnorm/ref\":3}}"};
    assert_int_equal(craft_leg(c->st, run, "cpu", 1, 1, &a, &cnt, &e), 0);
    craft_legopt fault = {.fault_lines = "Memory access fault by GPU node-1",
                          .counters = cnt.counters};
    assert_int_equal(craft_leg(c->st, run, "cpu", 2, 1, &a, &fault, &e), 0);
    /* gpu: a device arm whose leg 2 fell back to the host */
    craft_legopt dev = {.device_ops = 500, .counters = "{\"ops\":{\"matmul_q4_K/gpu\":500}}"};
    craft_legopt fb = {.device_ops = 490, .host_ops = 10};
    assert_int_equal(craft_leg(c->st, run, "gpu", 1, 1, &a, &dev, &e), 0);
    assert_int_equal(craft_leg(c->st, run, "gpu", 2, 1, &a, &fb, &e), 0);
    verdict_result v = score(c->st, run, NULL, -1);
    assert_string_equal(v.verdict, "NOT_MEASURABLE");
    assert_string_equal(key(c->st, run, "cpu", NULL, "TOKEN_GATE"), "NOT_MEASURABLE");
    assert_non_null(strstr(key(c->st, run, "cpu", NULL, "LEG2_NOT_CLEAN"), "Memory access fault"));
    assert_non_null(strstr(key(c->st, run, "gpu", NULL, "LEG2_NOT_CLEAN"), "fell back"));
    assert_string_equal(key(c->st, run, NULL, NULL, "LEGS_CLEAN"), "2/4");
    assert_string_equal(key(c->st, run, NULL, NULL, "DEVICE_OPS"), "990");
    assert_string_equal(key(c->st, run, "cpu", NULL, "REFERENCE_TIER_HITS"), "6");
    assert_string_equal(key(c->st, run, NULL, NULL, "REFERENCE_TIER_HITS"), "6");
}

static void test_reference_not_clean(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "spec-e", "art1", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                            2, ARMS2, 1);
    craft_lp r = ref_p1();
    craft_legopt to = {.exit_status = -1, .term_signal = 9, .cause = "timeout: leg over 600 s"};
    tg_err e = {{0}};
    assert_int_equal(craft_leg(c->st, run, "llama-cpu", 1, 1, &r, &to, &e), 0);
    craft_lp a = r;
    craft_force(&a, &r);
    assert_int_equal(craft_legs(c->st, run, "cpu", 2, 1, &a, NULL), 0);
    verdict_result v = score(c->st, run, NULL, -1);
    assert_string_equal(v.verdict, "NOT_MEASURABLE");
    assert_non_null(strstr(key(c->st, run, NULL, NULL, "REASON"), "leg 1 is not clean"));
}

static void test_tokenizer_divergence(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "spec-f", "art1", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                            2, ARMS2, 2);
    craft_lp r[2] = {ref_p1(), ref_p1()};
    assert_int_equal(craft_legs(c->st, run, "llama-cpu", 2, 2, r, NULL), 0);
    craft_lp a[2] = {r[0], r[1]};
    craft_force(&a[0], &r[0]);
    craft_force(&a[1], &r[1]);
    a[1].ids[2] = 99; /* own tokenization of p2 differs; decoding was over the reference's ids */
    assert_int_equal(craft_legs(c->st, run, "cpu", 2, 2, a, NULL), 0);
    verdict_result v = score(c->st, run, NULL, -1);
    assert_string_equal(v.verdict, "FAIL");
    assert_string_equal(key(c->st, run, NULL, NULL, "TOKENIZER_DIVERGENCES"), "1/2");
    assert_string_equal(key(c->st, run, "cpu", "p1", "TOKEN_GATE"), "PASS");
    assert_string_equal(key(c->st, run, "cpu", "p2", "TOKEN_GATE"), "FAIL");
    assert_string_equal(key(c->st, run, "cpu", "p2", "TOKENIZER"), "DIFF");
    assert_string_equal(key(c->st, run, NULL, NULL, "GENERATION_DIVERGENCES"), "0/12");
}

static void test_oracle_repro(void **state)
{
    ctx *c = *state;
    int32_t t[6] = {100, 200, 300, 400, 500, 600};
    int64_t r1 = two_arm_run(c->st, "exact", 0.2, t, 2);
    score(c->st, r1, NULL, -1);
    assert_string_equal(key(c->st, r1, NULL, NULL, "ORACLE_REPRO"), "FIRST");
    int64_t r2 = two_arm_run(c->st, "exact", 0.2, t, 2);
    score(c->st, r2, NULL, -1);
    assert_string_equal(key(c->st, r2, NULL, NULL, "ORACLE_REPRO"), "YES");
    /* run 3: the oracle says something else at step 3 */
    int64_t r3 = craft_run(c->st, "spec-a", "art1", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                           2, ARMS2, 1);
    craft_lp r = ref_p1();
    r.tok[3] = 401;
    assert_int_equal(craft_legs(c->st, r3, "llama-cpu", 2, 1, &r, NULL), 0);
    score(c->st, r3, NULL, -1);
    assert_string_equal(key(c->st, r3, NULL, NULL, "ORACLE_REPRO"), "NO");
    assert_non_null(strstr(key(c->st, r3, "llama-cpu", NULL, "ORACLE_REPRO_WHY"), "step 3"));
    /* another oracle library (sha256): nothing to compare with */
    int64_t r4 = craft_run(c->st, "spec-a", "art1", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                           2, ARMS2, 1);
    craft_legopt other = {.bin_sha = "0ther"};
    assert_int_equal(craft_legs(c->st, r4, "llama-cpu", 2, 1, &r, &other), 0);
    score(c->st, r4, NULL, -1);
    assert_string_equal(key(c->st, r4, NULL, NULL, "ORACLE_REPRO"), "FIRST");
    /* another artifact: FIRST as well */
    int64_t r5 = craft_run(c->st, "spec-a", "art2", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                           2, ARMS2, 1);
    assert_int_equal(craft_legs(c->st, r5, "llama-cpu", 2, 1, &r, NULL), 0);
    score(c->st, r5, NULL, -1);
    assert_string_equal(key(c->st, r5, NULL, NULL, "ORACLE_REPRO"), "FIRST");
}

static void test_chain_of_custody(void **state)
{
    ctx *c = *state;
    static const craft_arm arms[] = {
        {"llama-cpu", "llama", "oracle", NULL},
        {"cpu", "engine", "test", NULL},
        {"stock", "command", "custody", NULL},
    };
    int64_t run = craft_run(c->st, "spec-g", "art1", "teacher-forced", "llama-cpu", "exact", 0.2, 2,
                            3, arms, 3);
    craft_lp r[3] = {ref_p1(), ref_p1(), ref_p1()};
    r[0].text = " Paris. It is";
    r[1].text = " Paris. It is";
    r[2].text = " Paris. It is";
    assert_int_equal(craft_legs(c->st, run, "llama-cpu", 2, 3, r, NULL), 0);
    craft_lp a[3] = {r[0], r[1], r[2]};
    for (int p = 0; p < 3; p++) craft_force(&a[p], &r[p]), a[p].text = NULL;
    assert_int_equal(craft_legs(c->st, run, "cpu", 2, 3, a, NULL), 0);
    craft_lp s[3];
    memset(s, 0, sizeof s);
    s[0].text = " Paris. It is";      /* EXACT */
    s[1].text = " Paris.";            /* PREFIX, 7 shared bytes */
    s[2].text = " Paris! It is";      /* DIVERGE at byte 6 */
    assert_int_equal(craft_legs(c->st, run, "stock", 2, 3, s, NULL), 0);
    verdict_result v = score(c->st, run, NULL, -1);
    assert_string_equal(v.verdict, "PASS"); /* custody is provenance, not the gate */
    assert_string_equal(key(c->st, run, "stock", "p1", "CHAIN_OF_CUSTODY"), "EXACT");
    assert_string_equal(key(c->st, run, "stock", "p2", "CHAIN_OF_CUSTODY"), "PREFIX");
    assert_string_equal(key(c->st, run, "stock", "p2", "CUSTODY_SHARED_BYTES"), "7");
    assert_string_equal(key(c->st, run, "stock", "p3", "CHAIN_OF_CUSTODY"), "DIVERGE");
    assert_string_equal(key(c->st, run, "stock", "p3", "CUSTODY_FIRST_DIFF_BYTE"), "6");
    assert_string_equal(key(c->st, run, NULL, NULL, "CHAIN_OF_CUSTODY"), "DIVERGE");
}

/* The rule set of docs/verdicts.md, one case per sentence. */
static void test_sentences(void **state)
{
    (void)state;
    char out[512];
    const char *n4[] = {"llama-cpu", "llama-aarch64", "gpu", "cpu"};
    int eng4[] = {0, 0, 1, 1}, orc4[] = {1, 1, 0, 0};
#define S(tok, truth) compare_sentence(4, n4, eng4, orc4, tok, truth, out, sizeof out)
    int32_t a[] = {5, 5, 6, 5};
    S(a, 5);
    assert_string_equal(out, "engine arms DIFFER; gpu is wrong");
    int32_t b[] = {5, 6, 6, 6};
    S(b, 5);
    assert_string_equal(out, "engine arms AGREE; the oracles disagree with each other");
    int32_t b2[] = {5, 6, 6, 5};
    S(b2, 5);
    assert_string_equal(out, "engine arms DIFFER; the oracles disagree with each other");
    int32_t d[] = {5, 5, 6, 6};
    S(d, 5);
    assert_string_equal(out, "engine arms AGREE; both are wrong");
    int32_t f[] = {5, 5, 6, 7};
    S(f, 5);
    assert_string_equal(out, "engine arms DIFFER; both are wrong");
#undef S
    /* three engines, one right: the right one is named */
    const char *n5[] = {"ref", "gpu", "cpu", "remote"};
    int eng5[] = {0, 1, 1, 1}, orc5[] = {1, 0, 0, 0};
    int32_t g[] = {5, 5, 6, 7};
    compare_sentence(4, n5, eng5, orc5, g, 5, out, sizeof out);
    assert_string_equal(out, "engine arms DIFFER; gpu is right");
    int32_t h[] = {5, 5, 5, 7};
    compare_sentence(4, n5, eng5, orc5, h, 5, out, sizeof out);
    assert_string_equal(out, "engine arms DIFFER; remote is wrong");
    int32_t h2[] = {5, 6, 6, 6};
    compare_sentence(4, n5, eng5, orc5, h2, 5, out, sizeof out);
    assert_string_equal(out, "engine arms AGREE; all are wrong");
    /* one engine arm */
    const char *n2[] = {"llama-cpu", "cpu"};
    int eng2[] = {0, 1}, orc2[] = {1, 0};
    int32_t i2[] = {5, 6};
    compare_sentence(2, n2, eng2, orc2, i2, 5, out, sizeof out);
    assert_string_equal(out, "engine arm cpu is wrong");
    /* no engine arm: only oracles */
    const char *n3[] = {"llama-cpu", "llama-aarch64"};
    int eng3[] = {0, 0}, orc3[] = {1, 1};
    int32_t j[] = {5, 6};
    compare_sentence(2, n3, eng3, orc3, j, 5, out, sizeof out);
    assert_string_equal(out, "no engine arm; the oracles disagree with each other");
}

/* Contested steps and ORACLE_SPLIT over a four-arm run. */
static void test_four_way_run(void **state)
{
    ctx *c = *state;
    static const craft_arm arms[] = {
        {"llama-cpu", "llama", "oracle", NULL},
        {"llama-aarch64", "llama", "oracle", NULL},
        {"gpu", "engine", "test", "{\"engine\":\"gpu\"}"},
        {"cpu", "engine", "test", "{\"engine\":\"cpu\"}"},
    };
    int64_t run = craft_run(c->st, "spec-h", "art1", "teacher-forced", "llama-cpu", "near-tie", 0.2,
                            2, 4, arms, 1);
    craft_lp r = ref_p1();
    assert_int_equal(craft_legs(c->st, run, "llama-cpu", 2, 1, &r, NULL), 0);
    craft_lp o = r, g = r, cp = r;
    craft_force(&o, &r), craft_force(&g, &r), craft_force(&cp, &r);
    g.tok[3] = 401;                  /* step 3: gpu alone is wrong */
    o.tok[1] = 201, g.tok[1] = 201, cp.tok[1] = 201; /* step 1: the oracles split */
    assert_int_equal(craft_legs(c->st, run, "llama-aarch64", 2, 1, &o, NULL), 0);
    craft_legopt dev = {.device_ops = 100};
    assert_int_equal(craft_legs(c->st, run, "gpu", 2, 1, &g, &dev), 0);
    assert_int_equal(craft_legs(c->st, run, "cpu", 2, 1, &cp, NULL), 0);
    verdict_result v = score(c->st, run, NULL, -1);
    sqlite3_stmt *q;
    sqlite3_prepare_v2(store_db(c->st),
                       "SELECT step, oracle_split, sentence, tokens FROM contested WHERE run_id=?1"
                       " ORDER BY step", -1, &q, NULL);
    sqlite3_bind_int64(q, 1, run);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), 1);
    assert_int_equal(sqlite3_column_int(q, 1), 1);
    assert_string_equal((const char *)sqlite3_column_text(q, 2),
                        "engine arms AGREE; the oracles disagree with each other");
    assert_string_equal((const char *)sqlite3_column_text(q, 3),
                        "llama-cpu=200 llama-aarch64=201 gpu=201 cpu=201");
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), 3);
    assert_int_equal(sqlite3_column_int(q, 1), 0);
    assert_string_equal((const char *)sqlite3_column_text(q, 2), "engine arms DIFFER; gpu is wrong");
    assert_int_equal(sqlite3_step(q), SQLITE_DONE);
    sqlite3_finalize(q);
    assert_string_equal(key(c->st, run, NULL, NULL, "ORACLE_SPLITS"), "1");
    /* cpu: a near tie at the split step, within the band: passes near-tie;
     * gpu: rank 2 at step 3 with gap 1.0: RANK2, fails */
    assert_string_equal(key(c->st, run, "cpu", NULL, "TOKEN_GATE"), "PASS");
    assert_string_equal(key(c->st, run, "gpu", NULL, "TOKEN_GATE"), "FAIL");
    assert_string_equal(cls(c->st, run, "gpu", 1, "p1", 3), "RANK2");
    assert_string_equal(v.verdict, "FAIL");
    assert_int_equal(v.n_test_arms, 2);
    assert_int_equal(v.n_pass, 1);
    /* the oracle arm is scored but not part of the gate */
    assert_string_equal(key(c->st, run, "llama-aarch64", NULL, "IN_GATE"), "NO");
}

/* Free mode: steps after an arm's first divergence are UNCOMPARABLE. */
static void test_free_mode(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "spec-i", "art1", "free", "llama-cpu", "near-tie", 0.2, 2, 2,
                            ARMS2, 1);
    craft_lp r = ref_p1();
    assert_int_equal(craft_legs(c->st, run, "llama-cpu", 2, 1, &r, NULL), 0);
    int32_t t[6] = {100, 201, 777, 778, 779, 780}; /* near tie at 1, then its own path */
    craft_lp a = craft_prompt(6, t);
    assert_int_equal(craft_legs(c->st, run, "cpu", 2, 1, &a, NULL), 0);
    verdict_result v = score(c->st, run, NULL, -1);
    assert_string_equal(cls(c->st, run, "cpu", 1, "p1", 1), "NEAR_TIE");
    for (int s = 2; s < 6; s++) assert_string_equal(cls(c->st, run, "cpu", 1, "p1", s), "UNCOMPARABLE");
    assert_string_equal(v.verdict, "PASS");
    assert_string_equal(key(c->st, run, NULL, NULL, "GENERATION_DIVERGENCES"), "1/2");
    /* the same in teacher-forced mode is not measurable: a forced arm must
     * decode over the reference's prefix */
    int64_t run2 = craft_run(c->st, "spec-j", "art1", "teacher-forced", "llama-cpu", "near-tie", 0.2,
                             2, 2, ARMS2, 1);
    assert_int_equal(craft_legs(c->st, run2, "llama-cpu", 2, 1, &r, NULL), 0);
    assert_int_equal(craft_legs(c->st, run2, "cpu", 2, 1, &a, NULL), 0);
    verdict_result v2 = score(c->st, run2, NULL, -1);
    assert_string_equal(v2.verdict, "NOT_MEASURABLE");
}

static void test_gate_passed_for_bench(void **state)
{
    ctx *c = *state;
    int32_t ok[6] = {100, 200, 300, 400, 500, 600}, bad[6] = {100, 200, 300, 400, 9, 600};
    int64_t run = 0, r1 = two_arm_run(c->st, "exact", 0.2, ok, 2);
    tg_err e = {{0}};
    const char *bins[] = {"b1n"};
    /* not scored yet */
    assert_int_equal(verdict_gate_passed(c->st, "spec-a", "art1", 1, bins, &run, &e), 0);
    assert_non_null(strstr(e.msg, "never scored"));
    score(c->st, r1, NULL, -1);
    assert_int_equal(verdict_gate_passed(c->st, "spec-a", "art1", 1, bins, &run, &e), 1);
    assert_int_equal(run, r1);
    const char *other[] = {"f00"};
    assert_int_equal(verdict_gate_passed(c->st, "spec-a", "art1", 1, other, &run, &e), 0);
    assert_non_null(strstr(e.msg, "no gate run"));
    assert_int_equal(verdict_gate_passed(c->st, "spec-a", "art9", 1, bins, &run, &e), 0);
    int64_t r2 = two_arm_run(c->st, "exact", 0.2, bad, 2);
    score(c->st, r2, NULL, -1);
    assert_int_equal(verdict_gate_passed(c->st, "spec-a", "art1", 1, bins, &run, &e), 0);
    assert_non_null(strstr(e.msg, "TOKEN_GATE=FAIL"));
}

static void test_wilson(void **state)
{
    (void)state;
    double lo, hi;
    verdict_wilson(0, 0, &lo, &hi);
    assert_true(lo == 0 && hi == 1);
    verdict_wilson(0, 100, &lo, &hi);
    assert_true(lo == 0 && fabs(hi - 0.0370) < 1e-3);
    verdict_wilson(10, 100, &lo, &hi); /* textbook: [0.0552, 0.1744] */
    assert_true(fabs(lo - 0.0552) < 1e-3 && fabs(hi - 0.1744) < 1e-3);
}

TG_TEST_MAIN_WITH(
    setup, teardown, test_multiway_near_tie, test_every_class, test_policy_switch_and_rescore,
    test_exact_run_passes, test_not_measurable_one_clean_leg, test_not_measurable_legs_differ,
    test_faulted_and_fallback_legs, test_reference_not_clean, test_tokenizer_divergence, test_oracle_repro,
    test_chain_of_custody, test_sentences, test_four_way_run, test_free_mode, test_gate_passed_for_bench,
    test_wilson)
