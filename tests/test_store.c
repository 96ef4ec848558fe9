/*
 * test_store.c: the SQLite evidence store. Schema creation and version
 * refusal, the lossless top-k chunk (round trips, forms the packed code
 * cannot hold, truncated chunks), the v3 blob decoder and the migration of
 * a v3 store (tests/data/store-v3.sql, written by the v3 code), leg writes
 * all or nothing (a failure mid-transaction leaves no row), repeated
 * identical legs stored once, dumps and stderr round trips, latest-run and
 * has-leg lookups, and the integrity check.
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
                            "contested", "v_step_compare", "v_near_tie", "v_rank_hist", "v_step", "leg_top"};
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

/* The top-k of step 0 of prompt p1 of (run, arm cpu, leg) through
 * store_tops_read into back (cap 600). Returns the count, or -1 with e. */
static int read_top(tg_store *st, int64_t run, int leg, tg_top *back, tg_err *e)
{
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(st),
                       "SELECT step.leg_id, step.prompt_id FROM step JOIN leg ON leg.id = step.leg_id"
                       " WHERE leg.run_id=?1 AND leg.leg=?2 AND step.step=0", -1, &s, NULL);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int(s, 2, leg);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    store_tops t;
    int rc = store_tops_read(store_db(st), sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1), &t, e);
    sqlite3_finalize(s);
    if (rc < 0) return -1;
    int k = store_tops_find(&t, 0);
    assert_true(k >= 0);
    int n = t.n_top[k];
    if (n > 600) {
        store_tops_free(&t);
        snprintf(e->msg, sizeof e->msg, "%d entries, room for 600", n);
        return -1;
    }
    memcpy(back, t.top + t.off[k], sizeof *back * (size_t)n);
    store_tops_free(&t);
    return n;
}

/* Encodes through a real step row (token: the step's token, -1 for
 * top[0]'s id) and decodes: the only public path. *len: the chunk's bytes. */
static void roundtrip(tg_store *st, int64_t run, int leg, const tg_top *top, int n, int32_t token, int *len)
{
    store_step sp = {.step = 0, .token = token >= 0 ? token : n ? top[0].id : 0, .forced = -1, .n_top = n,
                     .top = top};
    store_leg_prompt lp = {.prompt_id = "p1", .n_steps = 1, .steps = &sp};
    store_leg L = {.run_id = run, .arm = "cpu", .leg = leg, .n_prompts = 1, .prompts = &lp};
    tg_err e = {{0}};
    if (store_put_leg(st, &L, &e) < 0) fail_msg("put: %s", e.msg);
    tg_top back[600];
    int k = read_top(st, run, leg, back, &e);
    if (k != n) fail_msg("decoded %d of %d entries: %s", k, n, e.msg);
    for (int i = 0; i < n; i++) {
        if (back[i].id != top[i].id || memcmp(&back[i].logit, &top[i].logit, 4))
            fail_msg("entry %d: (%d, %a) came back as (%d, %a)", i, top[i].id, top[i].logit,
                     back[i].id, back[i].logit);
    }
    /* every truncation of the chunk is an error, never a crash */
    sqlite3 *db = store_db(st);
    sqlite3_stmt *s;
    sqlite3_prepare_v2(db, "SELECT t.leg_id, t.data FROM leg_top t JOIN leg ON leg.id = t.leg_id"
                           " WHERE leg.run_id=?1 AND leg.leg=?2", -1, &s, NULL);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int(s, 2, leg);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    int64_t leg_id = sqlite3_column_int64(s, 0);
    *len = sqlite3_column_bytes(s, 1);
    unsigned char *full = malloc((size_t)*len);
    memcpy(full, sqlite3_column_blob(s, 1), (size_t)*len);
    sqlite3_finalize(s);
    sqlite3_prepare_v2(db, "UPDATE leg_top SET data=?2 WHERE leg_id=?1", -1, &s, NULL);
    for (int cut = 0; cut < *len; cut++) {
        sqlite3_reset(s);
        sqlite3_bind_int64(s, 1, leg_id);
        sqlite3_bind_blob(s, 2, full, cut, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(s), SQLITE_DONE);
        tg_err e2 = {{0}};
        if (read_top(st, run, leg, back, &e2) >= 0) fail_msg("a chunk cut to %d of %d bytes decoded", cut, *len);
        if (!strstr(e2.msg, "leg_top chunk")) fail_msg("cut to %d bytes: the error does not name the chunk: %s", cut, e2.msg);
    }
    /* a flipped byte decodes to something or fails, within bounds (ASan) */
    unsigned char *bad = malloc((size_t)*len);
    for (int at = 0; at < *len && *len <= 400; at++) {
        memcpy(bad, full, (size_t)*len);
        bad[at] ^= (unsigned char)(0x5a + at);
        sqlite3_reset(s);
        sqlite3_bind_int64(s, 1, leg_id);
        sqlite3_bind_blob(s, 2, bad, *len, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(s), SQLITE_DONE);
        tg_err e3 = {{0}};
        int k3 = read_top(st, run, leg, back, &e3);
        assert_true(k3 >= -1 && k3 <= 600);
    }
    free(bad);
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, leg_id);
    sqlite3_bind_blob(s, 2, full, *len, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
    free(full);
}

static void test_top_blob_lossless(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 1, 2, ARMS, 1);
    uint64_t rng = 42;
    tg_top top[512];
    int leg = 1, len;
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
        /* trials 10..14: a token other than the first id (no side information) */
        roundtrip(c->st, run, leg++, top, n, trial >= 10 && trial < 15 ? 7 : -1, &len);
        /* packed: under the 8 bytes an entry takes raw, code tables included */
        if (n >= 32 && len >= 8 * n) fail_msg("trial %d: %d entries took %d bytes", trial, n, len);
    }
    /* things the packed code cannot hold: stored raw, still exact */
    tg_top odd[4] = {{5, 1.0f}, {5, 0.5f}, {7, 0.25f}, {-8, 0.0f}}; /* repeated and negative id */
    roundtrip(c->st, run, leg++, odd, 4, -1, &len);
    tg_top unordered[3] = {{1, 0.5f}, {2, 1.5f}, {3, 0.0f}};
    roundtrip(c->st, run, leg++, unordered, 3, -1, &len);
    tg_top special[4] = {{1, INFINITY}, {2, NAN}, {-3, -0.0f}, {4, -INFINITY}};
    roundtrip(c->st, run, leg++, special, 4, -1, &len);
    tg_top zeros[3] = {{9, 0.0f}, {10, -0.0f}, {11, -1e-45f}}; /* +0, -0, denormal */
    roundtrip(c->st, run, leg++, zeros, 3, -1, &len);
    tg_top tiny[3] = {{9, 1e-30f}, {10, 1e-38f}, {11, -3e38f}}; /* a gap not in 2^-24 units */
    roundtrip(c->st, run, leg++, tiny, 3, -1, &len);
    /* empty top list */
    roundtrip(c->st, run, leg++, top, 0, -1, &len);
}

/* Many steps whose ids repeat (a pool of 100 ids, one id twice in a step):
 * ids coded by recency rank come back exact, every step, and a leg of the
 * same steps under another arm is equal. */
static void test_top_recency(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 1, 2, ARMS, 1);
    enum { S = 40, K = 32 };
    static tg_top top[S][K];
    store_step steps[S];
    uint64_t rng = 7;
    for (int i = 0; i < S; i++) {
        float x = 12.0f;
        for (int j = 0; j < K; j++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            top[i][j].id = (int32_t)(rng % 100) * (j % 7 == 3 ? 1500 : 1);
            top[i][j].logit = x;
            x -= (float)((rng >> 33) % 500) * 1e-3f;
        }
        top[i][K - 1].id = top[i][K - 2].id; /* a repeated id inside a step */
        steps[i] = (store_step){.step = i, .token = top[i][0].id, .forced = -1, .n_top = K, .top = top[i]};
    }
    store_leg_prompt lp = {.prompt_id = "p1", .n_steps = S, .steps = steps};
    store_leg L = {.run_id = run, .arm = "cpu", .leg = 1, .n_prompts = 1, .prompts = &lp};
    tg_err e = {{0}};
    if (store_put_leg(c->st, &L, &e) < 0) fail_msg("put: %s", e.msg);
    store_tops t;
    int64_t leg = count(c->st, "SELECT id FROM leg"), pid = count(c->st, "SELECT id FROM prompt WHERE name = 'p1'");
    if (store_tops_read(store_db(c->st), leg, pid, &t, &e) < 0) fail_msg("read: %s", e.msg);
    assert_int_equal(t.n, S);
    for (int i = 0; i < S; i++) {
        assert_int_equal(t.step[i], i);
        assert_int_equal(t.n_top[i], K);
        for (int j = 0; j < K; j++)
            if (t.top[t.off[i] + (size_t)j].id != top[i][j].id ||
                memcmp(&t.top[t.off[i] + (size_t)j].logit, &top[i][j].logit, 4))
                fail_msg("step %d entry %d: (%d, %a) came back as (%d, %a)", i, j, top[i][j].id, top[i][j].logit,
                         t.top[t.off[i] + (size_t)j].id, t.top[t.off[i] + (size_t)j].logit);
    }
    store_tops_free(&t);
    /* packed: well under the 8 bytes an entry takes raw */
    assert_true(count(c->st, "SELECT length(data) FROM leg_top") < S * K * 5);
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
    /* legs 2 and 3 point at leg 1, and their chunks hold (almost) nothing */
    assert_int_equal(count(c->st, "SELECT count(*) FROM leg_top t JOIN leg l ON l.id = t.leg_id"
                                  " WHERE l.leg > 1 AND t.base_leg = (SELECT id FROM leg WHERE leg = 1)"), 2);
    assert_true(count(c->st, "SELECT length(data) FROM leg_top t JOIN leg l ON l.id = t.leg_id WHERE l.leg = 2") <
                count(c->st, "SELECT length(data) FROM leg_top t JOIN leg l ON l.id = t.leg_id WHERE l.leg = 1"));
    /* every leg's top-k reads back; leg 3 differs from leg 1 at step 2 only */
    store_tops tt[3];
    tg_err e2 = {{0}};
    int64_t pid = count(c->st, "SELECT id FROM prompt WHERE name = 'p1'");
    for (int l = 0; l < 3; l++) {
        char q[128];
        snprintf(q, sizeof q, "SELECT id FROM leg WHERE leg = %d", l + 1);
        if (store_tops_read(store_db(c->st), count(c->st, q), pid, &tt[l], &e2) < 0) fail_msg("leg %d: %s", l + 1, e2.msg);
        assert_int_equal(tt[l].n, 5);
    }
    for (int k = 0; k < 5; k++) {
        for (int l = 1; l < 3; l++) {
            int same = tt[l].n_top[k] == tt[0].n_top[k] &&
                       !memcmp(tt[l].top + tt[l].off[k], tt[0].top + tt[0].off[k], sizeof(tg_top) * (size_t)tt[0].n_top[k]);
            if (same != !(l == 2 && k == 2)) fail_msg("leg %d step %d: same as leg 1: %d", l + 1, k, same);
        }
    }
    for (int l = 0; l < 3; l++) store_tops_free(&tt[l]);
    /* deleting the base leg (tokgate never does; a user might, to run it
     * again) loses the repeated steps' top-k, as v3's same_as did: they
     * read back empty, leg 3's own step stays, and a new leg goes in */
    assert_int_equal(sqlite3_exec(store_db(c->st), "DELETE FROM leg WHERE leg = 1", NULL, NULL, NULL), SQLITE_OK);
    for (int l = 1; l < 3; l++) {
        char q[128];
        snprintf(q, sizeof q, "SELECT id FROM leg WHERE leg = %d", l + 1);
        if (store_tops_read(store_db(c->st), count(c->st, q), pid, &tt[l], &e2) < 0) fail_msg("leg %d: %s", l + 1, e2.msg);
        for (int k = 0; k < 5; k++) assert_int_equal(tt[l].n_top[k], l == 2 && k == 2 ? CRAFT_K : 0);
        store_tops_free(&tt[l]);
    }
    lp.gap[2] = 0;
    assert_int_equal(craft_leg(c->st, run, "cpu", 1, 1, &lp, NULL, &e), 0);

    assert_int_equal(count(c->st, "SELECT count(*) FROM v_step v JOIN leg l ON l.id = v.leg_id"
                                  " WHERE l.leg = 3 AND v.step = 2 AND typeof(v.gap) = 'real' AND abs(v.gap - 0.3) < 1e-6"), 1);
}

#include "v3fixture.h"

/* A v3 store written by the v3 code (tests/data/store-v3.sql; its data is
 * v3fixture.h's) is migrated to the current version on open: every step's
 * top-k comes back exact from the new chunks, and the step columns keep
 * their values (gap as REAL through v_step). */
static void test_migrate_v3(void **state)
{
    (void)state;
    const char *root = getenv("TG_ROOT");
    char sqlpath[600], dbpath[] = "/tmp/tg-test-store-v3-XXXXXX";
    snprintf(sqlpath, sizeof sqlpath, "%s/tests/data/store-v3.sql", root ? root : ".");
    FILE *f = fopen(sqlpath, "r");
    if (!f) fail_msg("missing %s (run from the repository or set TG_ROOT)", sqlpath);
    static char sql[65536];
    size_t n = fread(sql, 1, sizeof sql - 1, f);
    fclose(f);
    sql[n] = 0;
    int fd = mkstemp(dbpath);
    assert_true(fd >= 0);
    close(fd);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) fail_msg("fixture: %s", msg);
    sqlite3_close(db);
    tg_store *st;
    tg_err e = {{0}};
    if (store_open(&st, dbpath, &e) < 0) fail_msg("migration: %s", e.msg);
    assert_int_equal(count(st, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    assert_int_equal(count(st, "SELECT count(*) FROM step"), 16);
    assert_int_equal(count(st, "SELECT count(*) FROM leg_top"), 2);
    assert_int_equal(count(st, "SELECT count(*) FROM sqlite_master WHERE name = 'v_step_top'"), 0);
    sqlite3_stmt *q;
    sqlite3_prepare_v2(store_db(st), "SELECT v.token, v.forced, v.gap, v.digest, v.leg_id, v.prompt_id"
                                     " FROM v_step v JOIN leg l ON l.id = v.leg_id JOIN prompt p ON p.id = v.prompt_id"
                                     " WHERE l.leg = ?1 AND p.name = ?2 AND v.step = ?3", -1, &q, NULL);
    for (int leg = 1; leg <= 2; leg++)
        for (int p = 0; p < 2; p++)
            for (int s2 = 0; s2 < 4; s2++) {
                store_step want;
                tg_top wt[8];
                v3_fixture_step(leg, p, s2, &want, wt);
                char name[4] = {'p', (char)('1' + p), 0};
                sqlite3_reset(q);
                sqlite3_bind_int(q, 1, leg);
                sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
                sqlite3_bind_int(q, 3, s2);
                assert_int_equal(sqlite3_step(q), SQLITE_ROW);
                assert_int_equal(sqlite3_column_int(q, 0), want.token);
                assert_int_equal(sqlite3_column_type(q, 1) == SQLITE_NULL ? -1 : sqlite3_column_int(q, 1), want.forced);
                if (want.n_top >= 2) {
                    double g = (double)wt[0].logit - (double)wt[1].logit;
                    if (sqlite3_column_double(q, 2) != g)
                        fail_msg("leg %d %s/%d: gap %.17g, expected %.17g", leg, name, s2, sqlite3_column_double(q, 2), g);
                } else
                    assert_int_equal(sqlite3_column_type(q, 2), SQLITE_NULL);
                if (want.digest[0]) {
                    char hex[17];
                    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sqlite3_column_int64(q, 3));
                    assert_string_equal(hex, want.digest);
                } else
                    assert_int_equal(sqlite3_column_type(q, 3), SQLITE_NULL);
                store_tops t;
                if (store_tops_read(store_db(st), sqlite3_column_int64(q, 4), sqlite3_column_int64(q, 5), &t, &e) < 0)
                    fail_msg("leg %d %s: %s", leg, name, e.msg);
                int k = store_tops_find(&t, s2);
                assert_true(k >= 0);
                assert_int_equal(t.n_top[k], want.n_top);
                for (int i = 0; i < want.n_top; i++)
                    if (t.top[t.off[k] + (size_t)i].id != wt[i].id || memcmp(&t.top[t.off[k] + (size_t)i].logit, &wt[i].logit, 4))
                        fail_msg("leg %d %s/%d entry %d differs after the migration", leg, name, s2, i);
                store_tops_free(&t);
            }
    sqlite3_finalize(q);
    store_close(st);
    char side[700];
    unlink(dbpath);
    snprintf(side, sizeof side, "%s-wal", dbpath);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", dbpath);
    unlink(side);
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
        cmocka_unit_test_setup_teardown(test_top_recency, setup, teardown),
        cmocka_unit_test(test_corrupt_blob),
        cmocka_unit_test(test_migrate_v3),
        cmocka_unit_test_setup_teardown(test_leg_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_identical_legs_stored_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dumps_stderr_lookups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_begin_run_validates, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
