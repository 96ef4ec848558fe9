/*
 * test_merge.c: merging stores (harness/merge.c) and the run uid of schema
 * version 2 (harness/store.c). The stores are written through the store API
 * (store_begin_run / store_put_leg) and scored by verdict.c, so their rows
 * are what a gate run writes; no arm runs here.
 */
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

#include "testenv.h"
#include "v3fixture.h"

#include "merge.h"
#include "store.h"
#include "verdict.h"

/* Writes a scored run of spec `spec` into the store at name: a reference arm
 * and a test arm, 2 legs, 2 prompts, 4 steps; the test arm differs from the
 * reference at step `diff` of p2 (-1: never). */
static void make_run(const char *name, const char *spec, int diff)
{
    char p[2 * PATH_MAX];
    path_in(p, sizeof p, name);
    tg_err e;
    tg_store *st;
    if (store_open(&st, p, &e) < 0) fail_msg("%s", e.msg);
    store_arm arms[2] = {{"llama", "llama", "reference", "{}"}, {"cpu", "engine", "test", "{}"}};
    store_prompt prompts[2] = {{"p1", "hello"}, {"p2", "world"}};
    store_run_info ri = {.spec_name = spec, .spec_path = "s.yaml", .spec_text = spec,
                         .spec_sha256 = "00aa", .artifact_path = "/m.gguf", .artifact_sha256 = "11bb",
                         .artifact_size = 42, .host = "h", .tokgate_version = "t", .mode = "teacher-forced",
                         .reference = "llama", .policy_kind = "near-tie", .band = 0.2, .steps = 4,
                         .top_k = 3, .legs = 2, .n_arms = 2, .arms = arms, .n_prompts = 2, .prompts = prompts};
    int64_t run;
    if (store_begin_run(st, &ri, &run, &e) < 0) fail_msg("%s", e.msg);
    int32_t ids[3] = {5, 6, 7};
    for (int a = 0; a < 2; a++)
        for (int leg = 1; leg <= 2; leg++) {
            store_step steps[2][4];
            tg_top tops[2][4][3];
            store_leg_prompt lps[2];
            for (int q = 0; q < 2; q++) {
                for (int s = 0; s < 4; s++) {
                    int ref_tok = 10 + s + q;
                    int tok = (a == 1 && q == 1 && s == diff) ? 99 : ref_tok;
                    tops[q][s][0] = (tg_top){tok, 5.0f};
                    tops[q][s][1] = (tg_top){tok == 99 ? ref_tok : 99, 4.0f - 0.5f * s};
                    tops[q][s][2] = (tg_top){3, 1.0f};
                    steps[q][s] = (store_step){.step = s, .token = tok, .forced = a ? ref_tok : -1,
                                               .n_top = 3, .top = tops[q][s]};
                }
                lps[q] = (store_leg_prompt){.prompt_id = prompts[q].id, .ids = ids, .n_ids = 3,
                                            .decoded_from = ids, .n_decoded_from = 3, .n_steps = 4,
                                            .steps = steps[q]};
            }
            store_leg lg = {.run_id = run, .arm = arms[a].name, .leg = leg, .binary_path = "/bin/x",
                            .binary_sha256 = a ? "b1" : "b0", .version = "v", .device = "cpu",
                            .n_prompts = 2, .prompts = lps};
            if (store_put_leg(st, &lg, &e) < 0) fail_msg("%s", e.msg);
        }
    verdict_options vo = verdict_options_default();
    verdict_result vr;
    if (verdict_score_run(st, run, &vo, &vr, &e) < 0) fail_msg("scoring: %s", e.msg);
    if (store_finish_run(st, run, vr.verdict, &e) < 0) fail_msg("%s", e.msg);
    store_close(st);
}

/* The sqlite database g_dir/name, opened (its path into p, n bytes; NULL:
 * not wanted). */
static sqlite3 *open_in(const char *name, char *p, size_t n)
{
    char own[2 * PATH_MAX];
    if (!p) p = own, n = sizeof own;
    path_in(p, n, name);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(p, &db), SQLITE_OK);
    return db;
}

static int64_t count(const char *name, const char *sql)
{
    sqlite3 *db = open_in(name, NULL, 0);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    int64_t v = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

/* Row counts of every table merged, as one string. */
static void census(const char *name, char *buf, size_t n)
{
    static const char *const T[] = {"spec", "artifact", "binary", "run", "arm", "prompt", "leg", "leg_prompt",
                                    "step", "verdict_set", "verdict", "compare", "contested", NULL};
    size_t k = 0;
    for (int i = 0; T[i]; i++) {
        char q[128];
        snprintf(q, sizeof q, "SELECT count(*) FROM %s", T[i]);
        k += (size_t)snprintf(buf + k, n - k, "%s=%lld ", T[i], (long long)count(name, q));
    }
}

static int merge_into(const char *out, const char *in, merge_stats *ms, tg_err *e)
{
    char po[2 * PATH_MAX], pi[2 * PATH_MAX];
    path_in(po, sizeof po, out);
    path_in(pi, sizeof pi, in);
    tg_store *st;
    if (store_open(&st, po, e) < 0) return -1;
    memset(ms, 0, sizeof *ms);
    int rc = merge_store(st, pi, ms, e);
    store_close(st);
    return rc;
}

/* Every run gets a distinct 32-hex-digit uid. */
static void test_run_uid(void **state)
{
    (void)state;
    make_run("a.db", "s1", -1);
    make_run("a.db", "s1", -1);
    assert_int_equal(count("a.db", "SELECT count(DISTINCT uid) FROM run WHERE length(uid) = 32"), 2);
    assert_int_equal(count("a.db", "PRAGMA user_version"), STORE_SCHEMA_VERSION);
}

/* A version-1 store (no uid column) with step rows is refused (its top-k
 * blobs are not read any more); without step rows it is migrated and its
 * runs get uids. */
static void test_migrate_v1(void **state)
{
    (void)state;
    make_run("v1.db", "s1", -1);
    char p[2 * PATH_MAX];
    sqlite3 *db = open_in("v1.db", p, sizeof p);
    /* back to version 1: the tables of SCHEMA_V1 only, run without uid */
    static const char *const V1[] = {"spec", "artifact", "binary", "run", "arm", "prompt", "leg", "leg_prompt",
                                     "step", "dump", "verdict_set", "verdict", "compare", "contested", NULL};
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT name FROM sqlite_master WHERE type = 'table'", -1, &s, NULL), SQLITE_OK);
    char later[32][64];
    int n_later = 0;
    while (sqlite3_step(s) == SQLITE_ROW && n_later < 32) {
        const char *t = (const char *)sqlite3_column_text(s, 0);
        int v1 = 0;
        for (int i = 0; V1[i]; i++) v1 |= !strcmp(V1[i], t);
        if (!v1 && strcmp(t, "step_top")) snprintf(later[n_later++], 64, "%s", t);
    }
    sqlite3_finalize(s);
    char *msg = NULL;
    /* first back to the version-3 layout of the step and leg tables */
    if (sqlite3_exec(db, STORE_TO_V3_SQL, NULL, NULL, &msg) != SQLITE_OK) fail_msg("making a v3 store: %s", msg);
    for (int i = 0; i < n_later; i++) {
        char q[128];
        snprintf(q, sizeof q, "DROP TABLE \"%.60s\"", later[i]);
        if (sqlite3_exec(db, q, NULL, NULL, &msg) != SQLITE_OK) fail_msg("making a v1 store: %s", msg);
    }
    if (sqlite3_exec(db, "DROP INDEX run_uid; ALTER TABLE run DROP COLUMN uid; PRAGMA user_version=1;", NULL,
                     NULL, &msg) != SQLITE_OK)
        fail_msg("making a v1 store: %s", msg);
    sqlite3_close(db);
    tg_err e;
    tg_store *st;
    assert_int_equal(store_open(&st, p, &e), -1);
    if (!strstr(e.msg, "v1.db: schema version 1 (tokgate before schema version 5)") || !strstr(e.msg, "--db"))
        fail_msg("opening a v1 store with steps: %s", e.msg);
    assert_int_equal(count("v1.db", "PRAGMA user_version"), 1);
    /* merge refuses it with the same message */
    merge_stats ms;
    assert_int_equal(merge_into("c.db", "v1.db", &ms, &e), -1);
    if (!strstr(e.msg, "v1.db: schema version 1")) fail_msg("merging a v1 store with steps: %s", e.msg);
    assert_int_equal(sqlite3_open(p, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "DELETE FROM step", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    if (store_open(&st, p, &e) < 0) fail_msg("opening a v1 store: %s", e.msg);
    store_close(st);
    assert_int_equal(count("v1.db", "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    assert_int_equal(count("v1.db", "SELECT count(*) FROM run WHERE length(uid) = 32"), 1);
}

/* A hash of every top-k entry of the run of spec `spec` in store `name`,
 * read through store_tops_read and keyed by names (arm, leg number,
 * prompt, step, rank), so stores with other ids compare. */
static uint64_t tops_hash(const char *name, const char *spec)
{
    sqlite3 *db = open_in(name, NULL, 0);
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT lp.leg_id, lp.prompt_id, a.name, l.leg, pr.name FROM leg_prompt lp"
                                            " JOIN leg l ON l.id = lp.leg_id JOIN arm a ON a.id = l.arm_id"
                                            " JOIN prompt pr ON pr.id = lp.prompt_id JOIN run r ON r.id = l.run_id"
                                            " JOIN spec s ON s.id = r.spec_id WHERE s.name = ?1", -1, &q, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(q, 1, spec, -1, SQLITE_STATIC);
    uint64_t h = 0;
    int n = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        store_tops t;
        tg_err e;
        if (store_tops_read(db, sqlite3_column_int64(q, 0), sqlite3_column_int64(q, 1), &t, &e) < 0)
            fail_msg("%s: %s", name, e.msg);
        uint64_t k = 1469598103934665603ull;
        for (const char *c = (const char *)sqlite3_column_text(q, 2); *c; c++) k = (k ^ (unsigned char)*c) * 1099511628211ull;
        for (const char *c = (const char *)sqlite3_column_text(q, 4); *c; c++) k = (k ^ (unsigned char)*c) * 1099511628211ull;
        k = (k ^ (uint64_t)sqlite3_column_int(q, 3)) * 1099511628211ull;
        for (int i = 0; i < t.n; i++)
            for (int j = 0; j < t.n_top[i]; j++) {
                uint32_t u;
                memcpy(&u, &t.top[t.off[i] + (size_t)j].logit, 4);
                k = (k ^ (uint64_t)t.step[i]) * 1099511628211ull;
                k = (k ^ ((uint64_t)(uint32_t)t.top[t.off[i] + (size_t)j].id << 32 | u)) * 1099511628211ull;
                n++;
            }
        h += k;   /* order-free over (leg, prompt) */
        store_tops_free(&t);
    }
    sqlite3_finalize(q);
    sqlite3_close(db);
    assert_true(n > 0);
    return h;
}

/* Two shards merge into the sum of their rows; verdicts and step blobs survive re-keying. */
static void test_merge_two_shards(void **state)
{
    (void)state;
    make_run("a.db", "s1", -1);
    make_run("b.db", "s2", 2);
    make_run("d.db", "s0", -1);   /* the target already holds a run: ids must be re-keyed */
    int64_t d0 = count("d.db", "SELECT count(*) FROM verdict");
    tg_err e;
    merge_stats ms;
    if (merge_into("d.db", "a.db", &ms, &e) < 0) fail_msg("%s", e.msg);
    assert_int_equal(ms.runs_added, 1);
    if (merge_into("d.db", "b.db", &ms, &e) < 0) fail_msg("%s", e.msg);
    assert_int_equal(ms.runs_added, 1);
    assert_int_equal(count("d.db", "SELECT count(*) FROM run"), 3);
    assert_int_equal(count("d.db", "SELECT count(*) FROM step"),
                     3 * count("a.db", "SELECT count(*) FROM step"));
    assert_int_equal(count("d.db", "SELECT count(*) FROM verdict"),
                     d0 + count("a.db", "SELECT count(*) FROM verdict") + count("b.db", "SELECT count(*) FROM verdict"));
    /* every top-k row came along, the legs stored once re-keyed to their run's first leg */
    assert_int_equal(count("d.db", "SELECT count(*) FROM step_top"),
                     3 * count("a.db", "SELECT count(*) FROM step_top"));
    assert_int_equal(count("d.db", "SELECT count(*) FROM leg WHERE same_as IS NOT NULL"),
                     3 * count("a.db", "SELECT count(*) FROM leg WHERE same_as IS NOT NULL"));
    assert_true(count("a.db", "SELECT count(*) FROM leg WHERE same_as IS NOT NULL") > 0);
    assert_int_equal(count("d.db", "SELECT count(*) FROM leg l WHERE l.same_as IS NOT NULL AND NOT EXISTS"
                                   " (SELECT 1 FROM leg b WHERE b.id = l.same_as AND b.arm_id = l.arm_id"
                                   " AND b.run_id = l.run_id AND b.leg = 1)"), 0);
    /* and every step's top-k reads back as in its shard */
    assert_true(tops_hash("d.db", "s1") == tops_hash("a.db", "s1"));
    assert_true(tops_hash("d.db", "s2") == tops_hash("b.db", "s2"));
    assert_true(tops_hash("d.db", "s1") != tops_hash("b.db", "s2"));
    assert_int_equal(count("d.db", "PRAGMA foreign_key_check"), -1);   /* no violations: no rows */
    /* the verdicts travel with their run */
    assert_int_equal(count("d.db", "SELECT count(*) FROM run r JOIN spec s ON s.id = r.spec_id"
                                   " WHERE s.name = 's1' AND r.verdict = 'PASS'"), 1);
    assert_int_equal(count("d.db", "SELECT count(*) FROM run r JOIN spec s ON s.id = r.spec_id"
                                   " WHERE s.name = 's2' AND r.verdict = 'FAIL'"), 1);
    assert_int_equal(count("d.db", "SELECT count(*) FROM compare c JOIN run r ON r.id = c.run_id"
                                   " JOIN spec s ON s.id = r.spec_id WHERE s.name = 's2' AND c.class <> 'EXACT'"),
                     count("b.db", "SELECT count(*) FROM compare WHERE class <> 'EXACT'"));
    assert_int_equal(count("d.db", "SELECT count(DISTINCT uid) FROM run"), 3);
}

/* Merging the same shard twice changes nothing. */
static void test_merge_idempotent(void **state)
{
    (void)state;
    make_run("a.db", "s1", 1);
    tg_err e;
    merge_stats ms;
    if (merge_into("c.db", "a.db", &ms, &e) < 0) fail_msg("%s", e.msg);
    char before[1024], after[1024];
    census("c.db", before, sizeof before);
    if (merge_into("c.db", "a.db", &ms, &e) < 0) fail_msg("second merge: %s", e.msg);
    assert_int_equal(ms.runs_added, 0);
    assert_int_equal(ms.runs_same, 1);
    census("c.db", after, sizeof after);
    assert_string_equal(before, after);
}

/* The same run uid with other content is a conflict naming the run, and the target is unchanged. */
static void test_merge_conflict(void **state)
{
    (void)state;
    make_run("a.db", "s1", -1);
    make_run("b.db", "s2", -1);
    tg_err e;
    merge_stats ms;
    if (merge_into("c.db", "a.db", &ms, &e) < 0) fail_msg("%s", e.msg);
    /* a2.db: a copy of a.db whose run has one other token, plus another run */
    sqlite3 *src = open_in("a.db", NULL, 0), *dst = open_in("a2.db", NULL, 0);
    sqlite3_backup *bk = sqlite3_backup_init(dst, "main", src, "main");
    assert_non_null(bk);
    sqlite3_backup_step(bk, -1);
    sqlite3_backup_finish(bk);
    sqlite3_close(src);
    assert_int_equal(sqlite3_exec(dst, "UPDATE step SET token = 77 WHERE step = 3 AND leg_id = (SELECT min(leg_id) FROM step)"
                                       " AND prompt_id = (SELECT min(prompt_id) FROM step)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(dst);
    if (merge_into("a2.db", "b.db", &ms, &e) < 0) fail_msg("%s", e.msg);
    char before[1024], after[1024];
    census("c.db", before, sizeof before);
    assert_int_equal(merge_into("c.db", "a2.db", &ms, &e), -1);
    if (!strstr(e.msg, "conflict") || !strstr(e.msg, "a2.db") || !strstr(e.msg, "steps") || !strstr(e.msg, "spec s1"))
        fail_msg("the conflict message should name the run, the store and the part: %s", e.msg);
    census("c.db", after, sizeof after);
    assert_string_equal(before, after);   /* b's run was rolled back with it */
}

/* Bad inputs: a missing store, the target itself, a file that is not a store. */
static void test_merge_bad_input(void **state)
{
    (void)state;
    make_run("c.db", "s1", -1);
    tg_err e;
    merge_stats ms;
    assert_int_equal(merge_into("c.db", "nope.db", &ms, &e), -1);
    if (!strstr(e.msg, "nope.db")) fail_msg("should name the missing store: %s", e.msg);
    assert_int_equal(merge_into("c.db", "c.db", &ms, &e), -1);
    if (!strstr(e.msg, "output store itself")) fail_msg("merging a store into itself: %s", e.msg);
    char p[2 * PATH_MAX];
    write_in(p, sizeof p, "d.db", "not a database");
    assert_int_equal(merge_into("c.db", "d.db", &ms, &e), -1);
    if (!strstr(e.msg, "d.db")) fail_msg("should name the bad file: %s", e.msg);
}

/* `tokgate merge` that fails leaves no output file it created (the db and
 * its -wal/-shm are removed again); an output that existed stays, the
 * failed input rolled back. Also: -o and --out, an unknown option. */
static void test_merge_failed_leaves_no_output(void **state)
{
    (void)state;
    make_run("a.db", "s1", -1);
    char pa[2 * PATH_MAX], pn[2 * PATH_MAX], pout[2 * PATH_MAX], pw[2 * PATH_MAX + 8];
    path_in(pa, sizeof pa, "a.db");
    path_in(pn, sizeof pn, "nope.db");
    path_in(pout, sizeof pout, "d.db");
    char *argv1[] = {"tokgate", "merge", pa, pn, "-o", pout, NULL};
    assert_int_equal(merge_main(6, argv1), 2);
    struct stat sb;
    assert_int_not_equal(lstat(pout, &sb), 0);
    snprintf(pw, sizeof pw, "%s-wal", pout);
    assert_int_not_equal(lstat(pw, &sb), 0);
    snprintf(pw, sizeof pw, "%s-shm", pout);
    assert_int_not_equal(lstat(pw, &sb), 0);
    /* an existing output is kept, with what merged before the failure */
    char *argv2[] = {"tokgate", "merge", pa, "--out", pout, NULL};
    assert_int_equal(merge_main(5, argv2), 0);
    char *argv3[] = {"tokgate", "merge", pn, "-o", pout, NULL};
    assert_int_equal(merge_main(5, argv3), 2);
    assert_int_equal(lstat(pout, &sb), 0);
    assert_int_equal(count("d.db", "SELECT count(*) FROM run"), 1);
    char *argv4[] = {"tokgate", "merge", pa, "--frob", "-o", pout, NULL};
    assert_int_equal(merge_main(6, argv4), 2);
}

TG_TEST_MAIN(
    test_run_uid, test_migrate_v1, test_merge_two_shards, test_merge_idempotent, test_merge_conflict,
    test_merge_bad_input, test_merge_failed_leaves_no_output)
