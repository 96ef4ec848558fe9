/*
 * test_store.c: the SQLite evidence store. Schema creation and version
 * refusal, the lossless top-k blob (round trips, raw fallback, corrupt
 * input), leg writes all or nothing (a failure mid-transaction leaves no
 * row), repeated identical legs stored once, dumps and stderr round trips,
 * latest-run and has-leg lookups, and the integrity check.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sqlite3.h>
#include <zstd.h>

#include "craft.h"

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

static int64_t count(tg_store *st, const char *sql)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL) != SQLITE_OK) fail_msg("bad SQL: %s", sql);
    int64_t n = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_finalize(s);
    return n;
}

static const craft_arm ARMS[] = {
    {"llama-cpu", "llama", "oracle", NULL},
    {"cpu", "engine", "test", NULL},
};

static void test_schema(void **state)
{
    ctx *c = *state;
    assert_int_equal(count(c->st, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    assert_int_equal(count(c->st, "PRAGMA foreign_keys"), 1);
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(c->st), "PRAGMA journal_mode", -1, &s, NULL);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    const char *tables[] = {"spec", "artifact", "binary", "run", "arm", "prompt", "leg",
                            "leg_prompt", "step", "dump", "verdict_set", "verdict", "compare",
                            "contested", "v_step_compare", "v_near_tie", "v_rank_hist", "v_step_top"};
    for (size_t i = 0; i < sizeof tables / sizeof *tables; i++) {
        char q[256];
        snprintf(q, sizeof q, "SELECT count(*) FROM sqlite_master WHERE name='%s'", tables[i]);
        if (count(c->st, q) != 1) fail_msg("schema lacks %s", tables[i]);
    }
    /* reopening an existing store keeps it */
    store_close(c->st);
    tg_err e = {{0}};
    assert_int_equal(store_open(&c->st, c->path, &e), 0);
    assert_int_equal(count(c->st, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
}

static void test_newer_schema_refused(void **state)
{
    ctx *c = *state;
    sqlite3_exec(store_db(c->st), "PRAGMA user_version=99", NULL, NULL, NULL);
    store_close(c->st);
    c->st = NULL;
    tg_store *st = NULL;
    tg_err e = {{0}};
    assert_int_equal(store_open(&st, c->path, &e), -1);
    assert_null(st);
    assert_non_null(strstr(e.msg, "schema version 99 is newer"));
    assert_non_null(strstr(e.msg, c->path));
    /* someone else's database (tables, user_version 0) is refused too */
    char other[300];
    snprintf(other, sizeof other, "%s.other", c->path);
    sqlite3 *db;
    sqlite3_open(other, &db);
    sqlite3_exec(db, "CREATE TABLE t(x)", NULL, NULL, NULL);
    sqlite3_close(db);
    assert_int_equal(store_open(&st, other, &e), -1);
    assert_non_null(strstr(e.msg, "not a tokgate store"));
    unlink(other);
    /* teardown needs a store */
    sqlite3_open(c->path, &db);
    char pv[64];
    snprintf(pv, sizeof pv, "PRAGMA user_version=%d", STORE_SCHEMA_VERSION);
    sqlite3_exec(db, pv, NULL, NULL, NULL);
    sqlite3_close(db);
    assert_int_equal(store_open(&c->st, c->path, &e), 0);
}

/* Encodes through a real step row and decodes: the only public path. */
static void roundtrip(tg_store *st, int64_t run, int leg, const tg_top *top, int n, int *raw)
{
    store_step sp = {.step = 0, .token = n ? top[0].id : 0, .forced = -1, .n_top = n, .top = top};
    store_leg_prompt lp = {.prompt_id = "p1", .n_steps = 1, .steps = &sp};
    store_leg L = {.run_id = run, .arm = "cpu", .leg = leg, .n_prompts = 1, .prompts = &lp};
    tg_err e = {{0}};
    if (store_put_leg(st, &L, &e) < 0) fail_msg("put: %s", e.msg);
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(st),
                       "SELECT top FROM v_step_top JOIN leg ON leg.id = v_step_top.leg_id"
                       " WHERE leg.run_id=?1 AND leg.leg=?2", -1, &s, NULL);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int(s, 2, leg);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    const unsigned char *b = sqlite3_column_blob(s, 0);
    int len = sqlite3_column_bytes(s, 0);
    *raw = b[0] == 0;
    tg_top back[600];
    int k = store_decode_top(b, (size_t)len, back, 600, &e);
    if (k != n) fail_msg("decoded %d of %d entries: %s", k, n, e.msg);
    for (int i = 0; i < n; i++) {
        if (back[i].id != top[i].id || memcmp(&back[i].logit, &top[i].logit, 4))
            fail_msg("entry %d: (%d, %a) came back as (%d, %a)", i, top[i].id, top[i].logit,
                     back[i].id, back[i].logit);
    }
    /* every truncation of the blob is an error, never a crash */
    for (int cut = 0; cut < len; cut++) {
        tg_err e2 = {{0}};
        if (store_decode_top(b, (size_t)cut, back, 600, &e2) >= 0)
            fail_msg("a blob cut to %d of %d bytes decoded", cut, len);
    }
    sqlite3_finalize(s);
}

static void test_top_blob_lossless(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 1, 2, ARMS, 1);
    uint64_t rng = 42;
    tg_top top[512];
    int leg = 1, raw;
    for (int trial = 0; trial < 40; trial++) {
        int n = trial == 0 ? 1 : trial < 30 ? 32 : 512;
        float x = (float)(20.0 - trial);
        for (int i = 0; i < n; i++) {
            int dup;
            do {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                top[i].id = (int32_t)(rng % 151936);
                dup = 0;
                for (int j = 0; j < i; j++) dup |= top[j].id == top[i].id;
            } while (dup);
            top[i].logit = x;
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            x -= (float)((rng >> 40) % 1000) * 1e-3f; /* ties included (step 0) */
            if (trial > 20) x -= 5.0f;                 /* through zero into negatives */
        }
        roundtrip(c->st, run, leg++, top, n, &raw);
        if (raw) fail_msg("trial %d: an ordered top list fell back to raw", trial);
    }
    /* things the packed form cannot hold: stored raw, still exact */
    tg_top odd[4] = {{5, 1.0f}, {5, 0.5f}, {7, 0.25f}, {8, 0.0f}}; /* repeated id */
    roundtrip(c->st, run, leg++, odd, 4, &raw);
    assert_true(raw);
    tg_top unordered[3] = {{1, 0.5f}, {2, 1.5f}, {3, 0.0f}};
    roundtrip(c->st, run, leg++, unordered, 3, &raw);
    assert_true(raw);
    tg_top special[4] = {{1, INFINITY}, {2, NAN}, {-3, -0.0f}, {4, -INFINITY}};
    roundtrip(c->st, run, leg++, special, 4, &raw);
    assert_true(raw);
    tg_top zeros[3] = {{9, 0.0f}, {10, -0.0f}, {11, -1e-45f}}; /* +0, -0, denormal */
    roundtrip(c->st, run, leg++, zeros, 3, &raw);
    /* empty top list */
    roundtrip(c->st, run, leg++, top, 0, &raw);
}

static void test_corrupt_blob(void **state)
{
    (void)state;
    tg_top out[8];
    tg_err e = {{0}};
    unsigned char junk[] = {9, 3, 1, 2, 3};
    assert_int_equal(store_decode_top(junk, sizeof junk, out, 8, &e), -1);
    assert_non_null(strstr(e.msg, "unknown format"));
    unsigned char big[] = {1, 0xff, 0xff, 0xff, 0x7f};
    assert_int_equal(store_decode_top(big, sizeof big, out, 8, &e), -1);
    unsigned char rawbad[] = {0, 2, 1, 0, 0, 0};
    assert_int_equal(store_decode_top(rawbad, sizeof rawbad, out, 8, &e), -1);
    assert_non_null(strstr(e.msg, "raw"));
    unsigned char rice[] = {1, 2, 40, 3, 0};
    assert_int_equal(store_decode_top(rice, sizeof rice, out, 8, &e), -1);
}

static void test_leg_all_or_nothing(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 2, 2, ARMS, 2);
    int32_t t[4] = {10, 20, 30, 40};
    craft_lp lp[2] = {craft_prompt(4, t), craft_prompt(4, t)};
    tg_err e = {{0}};
    /* a failure mid-transaction: the second prompt names no prompt of the
     * run, after the leg row and the first prompt's steps were written */
    store_step steps[4];
    tg_top tops[4][2];
    for (int i = 0; i < 4; i++) {
        tops[i][0] = (tg_top){t[i], 2.0f};
        tops[i][1] = (tg_top){t[i] + 1, 1.0f};
        steps[i] = (store_step){.step = i, .token = t[i], .forced = -1, .n_top = 2, .top = tops[i]};
    }
    store_leg_prompt slp[2] = {{.prompt_id = "p1", .n_steps = 4, .steps = steps},
                               {.prompt_id = "p9", .n_steps = 4, .steps = steps}};
    store_leg L = {.run_id = run, .arm = "cpu", .leg = 1, .n_prompts = 2, .prompts = slp,
                   .stderr_text = "x", .stderr_len = 1};
    assert_int_equal(store_put_leg(c->st, &L, &e), -1);
    assert_non_null(strstr(e.msg, "p9"));
    assert_int_equal(count(c->st, "SELECT count(*) FROM leg"), 0);
    assert_int_equal(count(c->st, "SELECT count(*) FROM leg_prompt"), 0);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step"), 0);
    assert_int_equal(store_has_leg(c->st, run, "cpu", 1), 0);
    /* a duplicate step number fails on the constraint, same outcome */
    steps[3].step = 2;
    slp[1].prompt_id = "p2";
    assert_int_equal(store_put_leg(c->st, &L, &e), -1);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step"), 0);
    /* an unknown arm and a bad digest are input errors */
    steps[3].step = 3;
    L.arm = "nope";
    assert_int_equal(store_put_leg(c->st, &L, &e), -1);
    assert_non_null(strstr(e.msg, "nope"));
    L.arm = "cpu";
    snprintf(steps[0].digest, sizeof steps[0].digest, "xyz");
    assert_int_equal(store_put_leg(c->st, &L, &e), -1);
    assert_non_null(strstr(e.msg, "digest"));
    steps[0].digest[0] = 0;
    /* and the good leg goes in whole; the store is usable afterwards */
    assert_int_equal(store_put_leg(c->st, &L, &e), 0);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step"), 8);
    assert_int_equal(store_has_leg(c->st, run, "cpu", 1), 1);
    assert_int_equal(store_has_leg(c->st, run, "cpu", 2), 0);
    /* the same leg twice is refused (UNIQUE run, arm, leg) */
    assert_int_equal(store_put_leg(c->st, &L, &e), -1);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step"), 8);
    (void)lp;
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(c->st), "PRAGMA integrity_check", -1, &s, NULL);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    assert_int_equal(count(c->st, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
}

static void test_identical_legs_stored_once(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 3, 2, ARMS, 1);
    int32_t t[5] = {10, 20, 30, 40, 50};
    craft_lp lp = craft_prompt(5, t);
    assert_int_equal(craft_legs(c->st, run, "cpu", 2, 1, &lp, NULL), 0);
    lp.gap[2] = 0.3; /* leg 3 differs at step 2 */
    tg_err e = {{0}};
    assert_int_equal(craft_leg(c->st, run, "cpu", 3, 1, &lp, NULL, &e), 0);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step WHERE top IS NULL"), 5 + 4);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step WHERE top IS NOT NULL"), 5 + 1);
    /* the view resolves every blob, equal to leg 1's except that step */
    assert_int_equal(count(c->st, "SELECT count(*) FROM v_step_top WHERE top IS NULL"), 0);
    assert_int_equal(count(c->st,
                           "SELECT count(*) FROM v_step_top a JOIN v_step_top b ON a.prompt_id=b.prompt_id"
                           " AND a.step=b.step JOIN leg la ON la.id=a.leg_id JOIN leg lb ON lb.id=b.leg_id"
                           " WHERE la.leg=1 AND lb.leg=3 AND a.top <> b.top"), 1);
}

static void test_dumps_stderr_lookups(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "spec-x", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 1, 2, ARMS, 1);
    float data[1000];
    for (int i = 0; i < 1000; i++) data[i] = sinf((float)i * 0.01f) * 3.0f;
    store_dump d = {.step = 4, .layer = 3, .stage = "ffn_out", .n = 1000, .data = data};
    store_leg_prompt lp = {.prompt_id = "p1", .n_dumps = 1, .dumps = &d};
    const char *err = "line one\nGPU Hang\n";
    store_leg L = {.run_id = run, .arm = "cpu", .leg = 1, .n_prompts = 1, .prompts = &lp,
                   .stderr_text = err, .stderr_len = strlen(err)};
    tg_err e = {{0}};
    assert_int_equal(store_put_leg(c->st, &L, &e), 0);
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(c->st), "SELECT n, data FROM dump", -1, &s, NULL);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(s, 0), 1000);
    unsigned char shuf[4000], back[4000];
    size_t n = ZSTD_decompress(shuf, sizeof shuf, sqlite3_column_blob(s, 1),
                               (size_t)sqlite3_column_bytes(s, 1));
    assert_int_equal(n, 4000);
    for (int k = 0; k < 1000; k++)
        for (int b = 0; b < 4; b++) back[4 * k + b] = shuf[b * 1000 + k];
    assert_memory_equal(back, data, 4000);
    sqlite3_finalize(s);
    sqlite3_prepare_v2(store_db(c->st), "SELECT stderr_len, stderr_zstd FROM leg", -1, &s, NULL);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    char text[64] = {0};
    n = ZSTD_decompress(text, sizeof text, sqlite3_column_blob(s, 1), (size_t)sqlite3_column_bytes(s, 1));
    assert_int_equal(n, strlen(err));
    assert_string_equal(text, err);
    sqlite3_finalize(s);
    int64_t latest = 0;
    int64_t run2 = craft_run(c->st, "spec-y", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 1, 2, ARMS, 1);
    assert_int_equal(store_latest_run(c->st, "spec-x", &latest, &e), 1);
    assert_int_equal(latest, run);
    assert_int_equal(store_latest_run(c->st, NULL, &latest, &e), 1);
    assert_int_equal(latest, run2);
    assert_int_equal(store_latest_run(c->st, "spec-none", &latest, &e), 0);
    assert_int_equal(store_finish_run(c->st, run, "PASS", &e), 0);
    assert_int_equal(count(c->st, "SELECT count(*) FROM run WHERE verdict='PASS' AND finished IS NOT NULL"), 1);
    assert_int_equal(store_finish_run(c->st, 999, "PASS", &e), -1);
    /* spec and artifact rows are shared between runs */
    assert_int_equal(count(c->st, "SELECT count(*) FROM artifact"), 1);
}

static void test_begin_run_validates(void **state)
{
    ctx *c = *state;
    store_arm dup[2] = {{"a", "engine", "test", "{}"}, {"a", "engine", "test", "{}"}};
    store_run_info ri = {.spec_name = "s", .spec_sha256 = "x", .artifact_path = "m",
                         .artifact_sha256 = "y", .mode = "free", .reference = "a",
                         .policy_kind = "exact", .n_arms = 2, .arms = dup};
    int64_t run;
    tg_err e = {{0}};
    assert_int_equal(store_begin_run(c->st, &ri, &run, &e), -1);
    assert_non_null(strstr(e.msg, "arms[1]"));
    assert_int_equal(count(c->st, "SELECT count(*) FROM run"), 0);
    ri.spec_sha256 = NULL;
    assert_int_equal(store_begin_run(c->st, &ri, &run, &e), -1);
    assert_non_null(strstr(e.msg, "sha256"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top_blob_lossless, setup, teardown),
        cmocka_unit_test(test_corrupt_blob),
        cmocka_unit_test_setup_teardown(test_leg_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_identical_legs_stored_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dumps_stderr_lookups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_begin_run_validates, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
