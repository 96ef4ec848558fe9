/*
 * test_store.c: the SQLite evidence store. Schema creation and version
 * refusal, the plain top-k rows (bit-exact round trips of every kind of f32
 * and id, the SQL form of NaN and -0.0, steps handed over in any order,
 * hand-edited rows that are not a top-k), old stores (v3 and v4 fixtures
 * written by that code) refused with a message or migrated when they hold
 * no steps, leg writes all or nothing, identical legs stored once
 * (same_as), dumps and stderr round trips, latest-run and has-leg lookups,
 * and the queries of docs/store.md run with the sqlite3 shell.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <sqlite3.h>
#include <zstd.h>

#include "arm.h"
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
                            "contested", "v_step_compare", "v_near_tie", "v_rank_hist", "v_step", "step_top", "v_top"};
    for (size_t i = 0; i < sizeof tables / sizeof *tables; i++) {
        char q[256];
        snprintf(q, sizeof q, "SELECT count(*) FROM sqlite_master WHERE name='%s'", tables[i]);
        if (count(c->st, q) != 1) fail_msg("schema lacks %s", tables[i]);
    }
    /* the top-k columns and leg.same_as, and no binary chunk table */
    assert_int_equal(count(c->st, "SELECT count(*) FROM pragma_table_info('step_top') WHERE"
                                  " (name, type) IN (VALUES ('rank', 'INTEGER'), ('id', 'INTEGER'),"
                                  " ('logit', 'REAL'), ('bits', 'INTEGER'))"), 4);
    assert_int_equal(count(c->st, "SELECT count(*) FROM pragma_table_info('step') WHERE name = 'gap' AND type = 'REAL'"), 1);
    assert_int_equal(count(c->st, "SELECT count(*) FROM pragma_foreign_key_list('leg') WHERE \"from\" = 'same_as'"
                                  " AND \"table\" = 'leg'"), 1);
    assert_int_equal(count(c->st, "SELECT count(*) FROM sqlite_master WHERE name IN ('leg_top', 'v_step_top')"), 0);
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

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Stores top[0..n-1] as step 0 of p1 of leg `leg` of arm cpu and reads it
 * back through store_tops_read (the only public path): every id and f32
 * bit pattern must come back. The SQL columns must say what docs/store.md
 * says: logit the value as a REAL, bits NULL, except NaN (logit NULL) and
 * -0.0 (logit 0.0), whose bits hold the f32 pattern. */
static void roundtrip(tg_store *st, int64_t run, int leg, const tg_top *top, int n)
{
    store_step sp = {.step = 0, .token = n ? top[0].id : 0, .forced = -1, .n_top = n, .top = top};
    store_leg_prompt lp = {.prompt_id = "p1", .n_steps = 1, .steps = &sp};
    store_leg L = {.run_id = run, .arm = "cpu", .leg = leg, .n_prompts = 1, .prompts = &lp};
    tg_err e = {{0}};
    if (store_put_leg(st, &L, &e) < 0) fail_msg("put: %s", e.msg);
    static tg_top back[600];
    int k = read_top(st, run, leg, back, &e);
    if (k != n) fail_msg("leg %d: read %d of %d entries: %s", leg, k, n, e.msg);
    for (int i = 0; i < n; i++)
        if (back[i].id != top[i].id || memcmp(&back[i].logit, &top[i].logit, 4))
            fail_msg("leg %d entry %d: (%d, %a) came back as (%d, %a)", leg, i, top[i].id, top[i].logit,
                     back[i].id, back[i].logit);
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(st), "SELECT t.rank, t.id, t.logit, t.bits, typeof(t.logit) FROM step_top t"
                                     " JOIN leg l ON l.id = t.leg_id WHERE l.run_id = ?1 AND l.leg = ?2"
                                     " ORDER BY t.rank", -1, &s, NULL);
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_int(s, 2, leg);
    for (int i = 0; i < n; i++) {
        assert_int_equal(sqlite3_step(s), SQLITE_ROW);
        assert_int_equal(sqlite3_column_int(s, 0), i + 1);
        assert_int_equal(sqlite3_column_int64(s, 1), top[i].id);
        uint32_t u;
        memcpy(&u, &top[i].logit, 4);
        int special = isnan(top[i].logit) || (top[i].logit == 0.0f && signbit(top[i].logit));
        if (special) {
            if (sqlite3_column_type(s, 3) != SQLITE_INTEGER || sqlite3_column_int64(s, 3) != (int64_t)u)
                fail_msg("leg %d rank %d (%a): bits should hold 0x%08x", leg, i + 1, top[i].logit, u);
            if (isnan(top[i].logit)) assert_int_equal(sqlite3_column_type(s, 2), SQLITE_NULL);
            else assert_true(sqlite3_column_double(s, 2) == 0.0);
        } else {
            double d = sqlite3_column_double(s, 2);
            if (sqlite3_column_type(s, 3) != SQLITE_NULL || strcmp((const char *)sqlite3_column_text(s, 4), "real") ||
                memcmp(&(double){(double)top[i].logit}, &d, 8))
                fail_msg("leg %d rank %d: %a should be the REAL %a with bits NULL", leg, i + 1, top[i].logit, d);
        }
    }
    assert_int_equal(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
}

static void test_top_lossless(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 1, 2, ARMS, 1);
    uint64_t rng = 42;
    static tg_top top[512];
    int leg = 1;
    for (int trial = 0; trial < 12; trial++) {
        int n = trial == 0 ? 1 : trial < 10 ? 32 : 512;
        float x = (float)(20.0 - trial);
        for (int i = 0; i < n; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            top[i].id = (int32_t)(rng % 151936);
            top[i].logit = x;
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            x -= (float)((rng >> 40) % 1000) * 1e-3f; /* ties included (step 0) */
            if (trial > 5) x -= 5.0f;                  /* through zero into negatives */
        }
        roundtrip(c->st, run, leg++, top, n);
    }
    /* ids a top-k list of a broken arm may hold: repeated, negative, extreme */
    tg_top odd[6] = {{5, 1.0f}, {5, 0.5f}, {7, 0.25f}, {-8, 0.0f}, {INT32_MAX, -1.0f}, {INT32_MIN, -2.0f}};
    roundtrip(c->st, run, leg++, odd, 6);
    tg_top unordered[3] = {{1, 0.5f}, {2, 1.5f}, {3, 0.0f}};
    roundtrip(c->st, run, leg++, unordered, 3);
    /* non-finite values, NaN payloads and signs included */
    tg_top special[8] = {{1, INFINITY}, {2, NAN}, {-3, -0.0f}, {4, -INFINITY}, {5, f32_of(0x7fc00001u)},
                         {6, f32_of(0xffc00000u)}, {7, f32_of(0x7f800001u)}, {8, f32_of(0xffffffffu)}};
    roundtrip(c->st, run, leg++, special, 8);
    /* zeros, subnormals, the f32 extremes */
    tg_top edge[10] = {{9, 0.0f}, {10, -0.0f}, {11, -1e-45f}, {12, 1e-45f}, {13, f32_of(0x007fffffu)},
                       {14, FLT_MIN}, {15, -FLT_MIN}, {16, FLT_MAX}, {17, -FLT_MAX}, {18, FLT_EPSILON}};
    roundtrip(c->st, run, leg++, edge, 10);
    tg_top tiny[3] = {{9, 1e-30f}, {10, 1e-38f}, {11, -3e38f}};
    roundtrip(c->st, run, leg++, tiny, 3);
    roundtrip(c->st, run, leg++, top, 0);   /* an empty top-k */
    /* the gap is REAL in every row (NULL without two finite logits) */
    assert_int_equal(count(c->st, "SELECT count(*) FROM step WHERE typeof(gap) NOT IN ('real', 'null')"), 0);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step WHERE typeof(gap) = 'null'"), 3);
}

/* Prompts and steps handed over in any order read back in ascending step
 * order, every entry exact, with 40 steps of 32 entries in two prompts. */
static void test_top_many_steps(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 1, 2, ARMS, 2);
    enum { S = 40, K = 32 };
    static tg_top top[2][S][K];
    store_step steps[2][S];
    uint64_t rng = 7;
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < S; i++) {
            float x = 12.0f;
            for (int j = 0; j < K; j++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                top[p][i][j].id = (int32_t)(rng % 100) * (j % 7 == 3 ? 1500 : 1);
                top[p][i][j].logit = x;
                x -= (float)((rng >> 33) % 500) * 1e-3f;
            }
            /* step numbers descending, 3 apart */
            steps[p][i] = (store_step){.step = 3 * (S - 1 - i), .token = top[p][i][0].id, .forced = -1, .n_top = K,
                                       .top = top[p][i]};
        }
    store_leg_prompt lp[2] = {{.prompt_id = "p2", .n_steps = S, .steps = steps[1]},
                              {.prompt_id = "p1", .n_steps = S, .steps = steps[0]}};
    store_leg L = {.run_id = run, .arm = "cpu", .leg = 1, .n_prompts = 2, .prompts = lp};
    tg_err e = {{0}};
    if (store_put_leg(c->st, &L, &e) < 0) fail_msg("put: %s", e.msg);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step_top"), 2 * S * K);
    int64_t leg = count(c->st, "SELECT id FROM leg");
    for (int p = 0; p < 2; p++) {
        char q[96];
        snprintf(q, sizeof q, "SELECT id FROM prompt WHERE name = 'p%d'", p + 1);
        store_tops t;
        if (store_tops_read(store_db(c->st), leg, count(c->st, q), &t, &e) < 0) fail_msg("read: %s", e.msg);
        assert_int_equal(t.n, S);
        for (int i = 0; i < S; i++) {
            const tg_top *want = top[p][S - 1 - i];
            assert_int_equal(t.step[i], 3 * i);
            assert_int_equal(store_tops_find(&t, 3 * i), i);
            assert_int_equal(t.n_top[i], K);
            if (memcmp(t.top + t.off[i], want, sizeof(tg_top) * K))
                fail_msg("p%d step %d: the top-k differs after the round trip", p + 1, 3 * i);
        }
        assert_int_equal(store_tops_find(&t, 1), -1);
        store_tops_free(&t);
    }
    store_tops_free(NULL);
}

/* Rows edited by hand into something that is not a top-k are an error
 * naming the leg, prompt, step and rank and what is wrong, never a crash
 * or a silent half answer; a lenient value (an INTEGER logit) reads. */
static void test_corrupt_rows(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 2, 2, ARMS, 1);
    tg_top top[4] = {{10, 3.0f}, {11, 2.0f}, {12, 1.0f}, {13, 0.5f}};
    roundtrip(c->st, run, 1, top, 4);
    static const struct { const char *edit, *undo, *says; } CASES[] = {
        {"DELETE FROM step_top WHERE rank = 2", "INSERT INTO step_top SELECT leg_id, prompt_id, step, 2, 11, 2.0,"
         " NULL FROM step_top WHERE rank = 1", "step 0: step_top rank 3 of leg 1: ranks are not 1, 2, 3"},
        {"UPDATE step_top SET rank = 0 WHERE rank = 1", "UPDATE step_top SET rank = 1 WHERE rank = 0", "rank 0"},
        {"UPDATE step_top SET id = 4294967296 WHERE rank = 3", "UPDATE step_top SET id = 12 WHERE rank = 3",
         "rank 3 of leg 1: id is not a 32-bit integer"},
        {"UPDATE step_top SET id = 'x' WHERE rank = 3", "UPDATE step_top SET id = 12 WHERE rank = 3", "id is not"},
        {"UPDATE step_top SET logit = 'abc' WHERE rank = 2", "UPDATE step_top SET logit = 2.0 WHERE rank = 2",
         "logit is not a number"},
        {"UPDATE step_top SET logit = NULL WHERE rank = 2", "UPDATE step_top SET logit = 2.0 WHERE rank = 2",
         "logit and bits are both NULL"},
        {"UPDATE step_top SET bits = -1 WHERE rank = 4", "UPDATE step_top SET bits = NULL WHERE rank = 4",
         "bits is not an f32 bit pattern"},
        {"UPDATE step_top SET bits = 8589934592 WHERE rank = 4", "UPDATE step_top SET bits = NULL WHERE rank = 4",
         "bits is not"},
        {"UPDATE step_top SET bits = 'nan' WHERE rank = 4", "UPDATE step_top SET bits = NULL WHERE rank = 4",
         "bits is not"},
    };
    sqlite3 *db = store_db(c->st);
    tg_top back[600];
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        if (sqlite3_exec(db, CASES[i].edit, NULL, NULL, NULL) != SQLITE_OK) fail_msg("%s: %s", CASES[i].edit, sqlite3_errmsg(db));
        tg_err e = {{0}};
        if (read_top(c->st, run, 1, back, &e) != -1) fail_msg("after \"%s\" the top-k still reads", CASES[i].edit);
        if (!strstr(e.msg, CASES[i].says) || !strstr(e.msg, "leg 1 prompt 1 step 0"))
            fail_msg("after \"%s\": the error should name the row and say \"%s\": %s", CASES[i].edit, CASES[i].says,
                     e.msg);
        if (sqlite3_exec(db, CASES[i].undo, NULL, NULL, NULL) != SQLITE_OK) fail_msg("%s: %s", CASES[i].undo, sqlite3_errmsg(db));
        assert_int_equal(read_top(c->st, run, 1, back, &e), 4);
        assert_memory_equal(back, top, sizeof top);
    }
    /* a logit typed as an integer reads; bits over another logit wins (0x3f000000 is 0.5f) */
    sqlite3_exec(db, "UPDATE step_top SET logit = 3 WHERE rank = 1;"
                     " UPDATE step_top SET logit = 7.0, bits = 1056964608 WHERE rank = 4", NULL, NULL, NULL);
    tg_err e = {{0}};
    assert_int_equal(read_top(c->st, run, 1, back, &e), 4);
    assert_memory_equal(back, top, sizeof top);
    /* a same_as naming no leg, or a leg that has no rows of its own */
    top[3].logit = 0.25f;
    roundtrip(c->st, run, 2, top, 4);
    sqlite3_exec(db, "PRAGMA foreign_keys = OFF; UPDATE leg SET same_as = 99 WHERE leg = 2", NULL, NULL, NULL);
    assert_int_equal(read_top(c->st, run, 2, back, &e), -1);
    if (!strstr(e.msg, "leg 2: same_as 99 names no leg")) fail_msg("%s", e.msg);
    sqlite3_exec(db, "UPDATE leg SET same_as = 2 WHERE leg = 1; UPDATE leg SET same_as = 1 WHERE leg = 2", NULL, NULL, NULL);
    assert_int_equal(read_top(c->st, run, 2, back, &e), -1);
    if (!strstr(e.msg, "no rows of its own")) fail_msg("%s", e.msg);
    sqlite3_exec(db, "UPDATE leg SET same_as = NULL; PRAGMA foreign_keys = ON", NULL, NULL, NULL);
    assert_int_equal(read_top(c->st, run, 2, back, &e), 4);
}

/* Legs whose top-k equals the arm's first leg's in every step are stored
 * once: same_as names that leg and they have no step_top rows; a leg that
 * differs in one entry has its own rows. Every leg reads back its own
 * top-k, in C and through v_top. The base leg cannot be deleted while
 * legs depend on it (foreign key). */
static void test_identical_legs_stored_once(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 4, 2, ARMS, 2);
    int32_t t[5] = {10, 20, 30, 40, 50};
    craft_lp lp[2] = {craft_prompt(5, t), craft_prompt(3, t)};
    assert_int_equal(craft_legs(c->st, run, "cpu", 2, 2, lp, NULL), 0);
    lp[0].gap[2] = 0.3; /* leg 3 differs at step 2 of p1 */
    tg_err e = {{0}};
    assert_int_equal(craft_leg(c->st, run, "cpu", 3, 2, lp, NULL, &e), 0);
    lp[0].gap[2] = 0;
    lp[1].n = 2;        /* leg 4 lacks the last step of p2 */
    assert_int_equal(craft_leg(c->st, run, "cpu", 4, 2, lp, NULL, &e), 0);
    int64_t leg1 = count(c->st, "SELECT id FROM leg WHERE leg = 1");
    assert_int_equal(count(c->st, "SELECT count(*) FROM leg WHERE same_as IS NOT NULL"), 1);
    assert_int_equal(count(c->st, "SELECT same_as FROM leg WHERE leg = 2"), leg1);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step_top t JOIN leg l ON l.id = t.leg_id WHERE l.leg = 2"), 0);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step_top t JOIN leg l ON l.id = t.leg_id WHERE l.leg = 3"),
                     8 * CRAFT_K);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step WHERE leg_id = (SELECT id FROM leg WHERE leg = 2)"), 8);
    /* every leg's top-k reads back; leg 3 differs from leg 1 at p1 step 2 only */
    for (int p = 0; p < 2; p++) {
        char q[128];
        snprintf(q, sizeof q, "SELECT id FROM prompt WHERE name = 'p%d'", p + 1);
        int64_t pid = count(c->st, q);
        store_tops tt[4];
        for (int l = 0; l < 4; l++) {
            snprintf(q, sizeof q, "SELECT id FROM leg WHERE leg = %d", l + 1);
            if (store_tops_read(store_db(c->st), count(c->st, q), pid, &tt[l], &e) < 0) fail_msg("leg %d: %s", l + 1, e.msg);
            assert_int_equal(tt[l].n, p == 0 ? 5 : l == 3 ? 2 : 3);
        }
        for (int k = 0; k < tt[0].n; k++)
            for (int l = 1; l < 4; l++) {
                if (k >= tt[l].n) continue;
                int same = tt[l].n_top[k] == CRAFT_K && tt[0].n_top[k] == CRAFT_K &&
                           !memcmp(tt[l].top + tt[l].off[k], tt[0].top + tt[0].off[k], sizeof(tg_top) * CRAFT_K);
                if (same != !(l == 2 && p == 0 && k == 2)) fail_msg("leg %d p%d step %d: same as leg 1: %d", l + 1, p + 1, k, same);
            }
        for (int l = 0; l < 4; l++) store_tops_free(&tt[l]);
    }
    /* v_top gives leg 2 the rows of leg 1 */
    assert_int_equal(count(c->st, "SELECT count(*) FROM v_top v JOIN leg l ON l.id = v.leg_id WHERE l.leg = 2"),
                     8 * CRAFT_K);
    assert_int_equal(count(c->st, "SELECT count(*) FROM (SELECT v.prompt_id, v.step, v.rank, v.id, v.logit FROM v_top v"
                                  " JOIN leg l ON l.id = v.leg_id WHERE l.leg = 2 EXCEPT SELECT t.prompt_id, t.step,"
                                  " t.rank, t.id, t.logit FROM step_top t JOIN leg l ON l.id = t.leg_id WHERE l.leg = 1)"), 0);
    /* the base leg stays while a leg depends on it */
    assert_int_equal(sqlite3_exec(store_db(c->st), "DELETE FROM leg WHERE leg = 1", NULL, NULL, NULL), SQLITE_CONSTRAINT);
    assert_int_equal(count(c->st, "SELECT count(*) FROM leg"), 4);
    assert_int_equal(count(c->st, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
}

#include "v3fixture.h"

/* Loads tests/data/NAME (SQL) into a fresh database file at dbpath. */
static void load_fixture(const char *name, char *dbpath)
{
    const char *root = getenv("TG_ROOT");
    char sqlpath[600];
    snprintf(sqlpath, sizeof sqlpath, "%s/tests/data/%s", root ? root : ".", name);
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
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) fail_msg("fixture %s: %s", name, msg);
    sqlite3_close(db);
}

static int64_t count_db(const char *path, const char *sql)
{
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) fail_msg("bad SQL: %s", sql);
    int64_t n = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

static void unlink_db(const char *path)
{
    char side[700];
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
}

/* Stores of schema versions 3 and 4 written by the code of those versions
 * (tests/data/store-v3.sql, store-v4.sql; their data is v3fixture.h's) keep
 * their top-k in blobs this code no longer decodes: store_open refuses them
 * with a message that names the file, its version and what to do, and
 * leaves them as they were. The same stores without step rows migrate. */
static void test_old_store_refused(void **state)
{
    (void)state;
    static const struct { const char *file; int version; } OLD[] = {{"store-v3.sql", 3}, {"store-v4.sql", 4}};
    for (int i = 0; i < 2; i++) {
        char dbpath[] = "/tmp/tg-test-store-old-XXXXXX";
        load_fixture(OLD[i].file, dbpath);
        tg_store *st = NULL;
        tg_err e = {{0}};
        assert_int_equal(store_open(&st, dbpath, &e), -1);
        assert_null(st);
        char want[64];
        snprintf(want, sizeof want, "schema version %d (tokgate before schema version 5)", OLD[i].version);
        if (!strstr(e.msg, dbpath) || !strstr(e.msg, want) || !strstr(e.msg, "its 16 steps") ||
            !strstr(e.msg, "run the gate again into a new store (--db NEW.db"))
            fail_msg("%s: the refusal should name the store, its version and what to do: %s", OLD[i].file, e.msg);
        assert_int_equal(count_db(dbpath, "PRAGMA user_version"), OLD[i].version);
        assert_int_equal(count_db(dbpath, "SELECT count(*) FROM step"), 16);
        if (OLD[i].version == 4) assert_int_equal(count_db(dbpath, "SELECT count(*) FROM leg_top"), 2);
        /* without step rows there is nothing to convert: it migrates */
        sqlite3 *db;
        sqlite3_open(dbpath, &db);
        assert_int_equal(sqlite3_exec(db, "DELETE FROM step", NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
        if (store_open(&st, dbpath, &e) < 0) fail_msg("%s without steps: %s", OLD[i].file, e.msg);
        assert_int_equal(count(st, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
        assert_int_equal(count(st, "SELECT count(*) FROM leg WHERE same_as IS NULL"), 2);
        assert_int_equal(count(st, "SELECT count(*) FROM sqlite_master WHERE name IN ('leg_top', 'v_step_top')"), 0);
        assert_int_equal(count(st, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
        store_close(st);
        unlink_db(dbpath);
    }
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
    assert_int_equal(count(c->st, "SELECT count(*) FROM step_top"), 0);
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
    assert_int_equal(count(c->st, "SELECT count(*) FROM step_top"), 16);
    assert_int_equal(store_has_leg(c->st, run, "cpu", 1), 1);
    assert_int_equal(store_has_leg(c->st, run, "cpu", 2), 0);
    /* the same leg twice is refused (UNIQUE run, arm, leg) */
    assert_int_equal(store_put_leg(c->st, &L, &e), -1);
    assert_int_equal(count(c->st, "SELECT count(*) FROM step"), 8);
    /* too many entries in a step is an input error naming the step */
    steps[1].n_top = 4097;
    L.leg = 2;
    assert_int_equal(store_put_leg(c->st, &L, &e), -1);
    assert_non_null(strstr(e.msg, "step 1: n_top 4097"));
    steps[1].n_top = 2;
    assert_int_equal(count(c->st, "SELECT count(*) FROM leg"), 1);
    (void)lp;
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(c->st), "PRAGMA integrity_check", -1, &s, NULL);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    assert_int_equal(count(c->st, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
}

/* A second connection (a long merge, a database browser) holding a write
 * transaction for hold_s seconds, from its own thread. */
typedef struct holder {
    const char *path;
    double hold_s;
    int began;                 /* 1 once BEGIN IMMEDIATE succeeded, -1 on failure */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} holder;

static void *hold_write_lock(void *ud)
{
    holder *h = ud;
    sqlite3 *db = NULL;
    int ok = sqlite3_open(h->path, &db) == SQLITE_OK &&
             sqlite3_exec(db, "BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS busy_t(x)", NULL, NULL, NULL) ==
                 SQLITE_OK;
    pthread_mutex_lock(&h->mu);
    h->began = ok ? 1 : -1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (ok) {
        usleep((useconds_t)(h->hold_s * 1e6));
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    }
    sqlite3_close(db);
    return NULL;
}

/* Starts a holder of the write lock and returns once it holds it. */
static void holder_start(holder *h, pthread_t *th, const char *path, double hold_s)
{
    *h = (holder){.path = path, .hold_s = hold_s};
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    assert_int_equal(pthread_create(th, NULL, hold_write_lock, h), 0);
    pthread_mutex_lock(&h->mu);
    while (!h->began) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    assert_int_equal(h->began, 1);
}

/* Runs craft_leg with stderr sent to a file; returns its result and the
 * stderr text in err[cap]. */
static int leg_capturing_stderr(tg_store *st, int64_t run, int leg, const craft_lp *lp, tg_err *e,
                                char *err, size_t cap)
{
    char tmp[] = "/tmp/tg-store-err-XXXXXX";
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    int r = craft_leg(st, run, "cpu", leg, 1, lp, NULL, e);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, err, cap - 1, 0);
    err[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(tmp);
    return r;
}

/* A write lock held by another connection for over 10 s is waited out (it
 * used to abort the gate with "BEGIN IMMEDIATE: database is locked"), with
 * progress on stderr; past $TOKGATE_STORE_WAIT the leg fails with a message
 * naming the leg and the run, and the store is as it was. */
static void test_write_lock_waited(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 2, 2, ARMS, 1);
    int32_t t[4] = {10, 20, 30, 40};
    craft_lp lp[1] = {craft_prompt(4, t)};
    tg_err e = {{0}};
    char err[4096];
    holder h;
    pthread_t th;
    holder_start(&h, &th, c->path, 12.0);
    double t0 = tg_now();
    int r = leg_capturing_stderr(c->st, run, 1, lp, &e, err, sizeof err);
    double waited = tg_now() - t0;
    pthread_join(th, NULL);
    if (r < 0) fail_msg("the leg was not stored: %s", e.msg);
    assert_true(waited >= 11.0);
    if (!strstr(err, "tokgate: waiting for the store's write lock (10 s): another process holds it"))
        fail_msg("no progress line on stderr: '%s'", err);
    assert_int_equal(store_has_leg(c->st, run, "cpu", 1), 1);

    /* a short limit: the leg gives up, names itself, and nothing is written */
    setenv("TOKGATE_STORE_WAIT", "1", 1);
    tg_store *st2;
    assert_int_equal(store_open(&st2, c->path, &e), 0);
    unsetenv("TOKGATE_STORE_WAIT");
    holder_start(&h, &th, c->path, 3.0);
    r = leg_capturing_stderr(st2, run, 2, lp, &e, err, sizeof err);
    pthread_join(th, NULL);
    assert_int_equal(r, -1);
    if (!strstr(e.msg, "leg cpu/2 of run") || !strstr(e.msg, "not stored") ||
        !strstr(e.msg, "database is locked") || !strstr(e.msg, "TOKGATE_STORE_WAIT"))
        fail_msg("unexpected message: %s", e.msg);
    assert_int_equal(store_has_leg(st2, run, "cpu", 2), 0);
    store_close(st2);
    assert_int_equal(count(c->st, "SELECT count(*) FROM leg"), 1);
}

/* store_open_ro: a missing path is "no such store" and nothing is created;
 * the store is read, never written. */
static void test_open_read_only(void **state)
{
    ctx *c = *state;
    int64_t run = craft_run(c->st, "s", "a", "teacher-forced", "llama-cpu", "exact", 0.2, 1, 2, ARMS, 1);
    tg_store *ro;
    tg_err e;
    char missing[300];
    snprintf(missing, sizeof missing, "%s-missing", c->path);
    assert_int_equal(store_open_ro(&ro, missing, &e), -1);
    if (strncmp(e.msg, "no such store: ", 15) || !strstr(e.msg, missing)) fail_msg("%s", e.msg);
    assert_int_not_equal(access(missing, F_OK), 0);
    if (store_open_ro(&ro, c->path, &e) < 0) fail_msg("%s", e.msg);
    int64_t latest = 0;
    assert_int_equal(store_latest_run(ro, NULL, &latest, &e), 1);
    assert_int_equal(latest, run);
    assert_int_equal(sqlite3_exec(store_db(ro), "DELETE FROM run", NULL, NULL, NULL), SQLITE_READONLY);
    store_close(ro);
    assert_int_equal(count(c->st, "SELECT count(*) FROM run"), 1);
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

/* ------------------------------------------------------------------ */
/* The queries of docs/store.md, run with the stock sqlite3 shell      */

/* The SQL of the fenced block after the heading that starts with `head`
 * in docs/store.md (malloc'ed), so the documented text is what runs. */
static char *doc_query(const char *head)
{
    const char *root = getenv("TG_ROOT");
    char path[600];
    snprintf(path, sizeof path, "%s/docs/store.md", root ? root : ".");
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("missing %s (run from the repository or set TG_ROOT)", path);
    char line[1024];
    size_t cap = 8192, n = 0;
    char *sql = calloc(1, cap);
    int state = 0;   /* 0: before the heading, 1: before the fence, 2: in it */
    while (fgets(line, sizeof line, f)) {
        if (state == 0 && !strncmp(line, head, strlen(head))) state = 1;
        else if (state == 1 && !strncmp(line, "```sql", 6)) state = 2;
        else if (state == 2 && !strncmp(line, "```", 3)) {
            state = 3;
            break;
        } else if (state == 2) {
            size_t l = strlen(line);
            if (n + l + 1 > cap) sql = realloc(sql, cap = 2 * (n + l + 1));
            memcpy(sql + n, line, l + 1);
            n += l;
        }
    }
    fclose(f);
    if (state != 3) fail_msg("%s: no ```sql block after a heading \"%s\"", path, head);
    return sql;
}

/* Runs sql with `sqlite3 db` (argv, no shell; list mode, no header, no
 * ~/.sqliterc) and returns its output lines (malloc'ed; *n lines). */
static char **sqlite3_lines(const char *db, const char *sql, int *n)
{
    char *argv[] = {"sqlite3", "-init", "/dev/null", "-batch", "-bail", "-list", "-noheader", "-separator", "|",
                    (char *)db, (char *)sql, NULL};
    char *out = NULL;
    size_t len = 0;
    arm_exit x;
    tg_err e = {{0}};
    if (arm_run_command(argv, 60, 0, 0, NULL, &out, &len, &x, &e) < 0)
        fail_msg("sqlite3 (the Debian package sqlite3, scripts/setup-deps.sh) on %s: %s; stderr: %s", db, e.msg,
                 x.stderr_text ? x.stderr_text : "");
    arm_exit_free(&x);
    char **lines = NULL;
    *n = 0;
    for (char *p = out, *nl; p < out + len; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(out + len - p));
        if (!nl) nl = out + len;
        lines = realloc(lines, sizeof *lines * (size_t)(*n + 1));
        lines[(*n)++] = strndup(p, (size_t)(nl - p));
    }
    free(out);
    return lines;
}

static void lines_free(char **l, int n)
{
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

static uint64_t doc_rng = 0x2545f4914f6cdd1dull;

static uint32_t doc_rand(uint32_t n)
{
    doc_rng ^= doc_rng << 13, doc_rng ^= doc_rng >> 7, doc_rng ^= doc_rng << 17;
    return (uint32_t)((doc_rng >> 16) % n);
}

enum { DQ_P = 3, DQ_S = 16, DQ_K = 32 };

/* Writes the doc queries' run: reference arm llama-cpu and test arm cpu, 2
 * identical legs each (leg 2 stored as same_as leg 1), prompts p1..p3 of
 * 16 steps, top-32 lists over a 151,936-id vocabulary. cpu's list is the
 * reference's with its logits moved by up to 0.04 and its last two ids
 * replaced; at p3/14 cpu's top-1 is the reference's rank 2, at p3/9 an id
 * outside the reference's top-k. Scored, so compare has rank and kl. */
static void doc_store(tg_store *st, tg_top ref[DQ_P][DQ_S][DQ_K], tg_top cpu[DQ_P][DQ_S][DQ_K])
{
    static const craft_arm DA[] = {{"llama-cpu", "llama", "reference", NULL}, {"cpu", "engine", "test", NULL}};
    int64_t run = craft_run(st, "doc", "a", "teacher-forced", "llama-cpu", "near-tie", 0.2, 2, 2, DA, DQ_P);
    for (int p = 0; p < DQ_P; p++)
        for (int s = 0; s < DQ_S; s++) {
            float x = 14.0f + (float)doc_rand(1000) * 1e-3f;
            for (int k = 0; k < DQ_K; k++) {
                int dup;
                do {
                    ref[p][s][k].id = (int32_t)doc_rand(151936);
                    dup = 0;
                    for (int j = 0; j < k; j++) dup |= ref[p][s][j].id == ref[p][s][k].id;
                } while (dup);
                ref[p][s][k].logit = x;
                x -= 0.02f + (float)doc_rand(400) * 1e-3f;
            }
            tg_top *c = cpu[p][s];
            memcpy(c, ref[p][s], sizeof cpu[p][s]);
            for (int k = 0; k < DQ_K; k++) c[k].logit += (float)((int)doc_rand(81) - 40) * 1e-3f;
            c[DQ_K - 2].id = 200000 + 2 * s, c[DQ_K - 1].id = 200001 + 2 * s;   /* not in the reference's list */
            if (p == 2 && s == 14) c[1].logit = c[0].logit + 0.1f;
            if (p == 2 && s == 9) c[DQ_K - 1].logit = c[0].logit + 0.5f;
            for (int i = 1; i < DQ_K; i++)   /* descending (insertion sort, stable) */
                for (int j = i; j > 0 && c[j].logit > c[j - 1].logit; j--) {
                    tg_top t = c[j];
                    c[j] = c[j - 1], c[j - 1] = t;
                }
        }
    int32_t ids[3] = {1, 2, 3};
    for (int a = 0; a < 2; a++)
        for (int leg = 1; leg <= 2; leg++) {
            store_step steps[DQ_P][DQ_S];
            store_leg_prompt lps[DQ_P];
            static const char *const names[DQ_P] = {"p1", "p2", "p3"};
            for (int p = 0; p < DQ_P; p++) {
                for (int s = 0; s < DQ_S; s++) {
                    const tg_top *t = a ? cpu[p][s] : ref[p][s];
                    steps[p][s] = (store_step){.step = s, .token = t[0].id, .forced = a ? ref[p][s][0].id : -1,
                                               .n_top = DQ_K, .top = t};
                }
                lps[p] = (store_leg_prompt){.prompt_id = names[p], .ids = ids, .n_ids = 3, .decoded_from = ids,
                                            .n_decoded_from = 3, .n_steps = DQ_S, .steps = steps[p]};
            }
            store_leg L = {.run_id = run, .arm = DA[a].name, .leg = leg, .binary_path = "w", .binary_sha256 = "b",
                           .version = "1", .n_prompts = DQ_P, .prompts = lps};
            tg_err e = {{0}};
            if (store_put_leg(st, &L, &e) < 0) fail_msg("doc store: %s", e.msg);
        }
    verdict_options vo = verdict_options_default();
    verdict_result vr;
    tg_err e = {{0}};
    if (verdict_score_run(st, run, &vo, &vr, &e) < 0) fail_msg("doc store: scoring: %s", e.msg);
}

/* Each query of docs/store.md's "Reading the top-k with sqlite3" runs in
 * the sqlite3 shell on a scored store written through the store API, and
 * answers what the store API and the comparison (compare.c) say. */
static void test_doc_queries(void **state)
{
    (void)state;
    char path[256];
    tg_store *st = craft_store(path);
    assert_non_null(st);
    static tg_top ref[DQ_P][DQ_S][DQ_K], cpu[DQ_P][DQ_S][DQ_K];
    doc_store(st, ref, cpu);
    assert_int_equal(count(st, "SELECT count(*) FROM leg WHERE same_as IS NOT NULL"), 2);
    /* what compare.c made of each step of cpu's leg 1 */
    double kl[DQ_P][DQ_S];
    int rank[DQ_P][DQ_S];
    sqlite3_stmt *q;
    sqlite3_prepare_v2(store_db(st), "SELECT prompt, step, rank, kl FROM v_step_compare WHERE arm = 'cpu' AND leg = 1",
                       -1, &q, NULL);
    int n_cmp = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        int p = ((const char *)sqlite3_column_text(q, 0))[1] - '1', s = sqlite3_column_int(q, 1);
        assert_true(p >= 0 && p < DQ_P && s >= 0 && s < DQ_S);
        rank[p][s] = sqlite3_column_int(q, 2);
        kl[p][s] = sqlite3_column_double(q, 3);
        n_cmp++;
    }
    sqlite3_finalize(q);
    assert_int_equal(n_cmp, DQ_P * DQ_S);
    /* the reference's leg 2 (stored as same_as its leg 1), for Q4 */
    int64_t ref2 = count(st, "SELECT l.id FROM leg l JOIN arm a ON a.id = l.arm_id WHERE a.name = 'llama-cpu' AND l.leg = 2");
    assert_int_equal(count(st, "SELECT same_as FROM leg WHERE id = (SELECT min(id) FROM leg WHERE same_as IS NOT NULL)"), 1);
    store_close(st);

    /* Q1: cpu's top-8 at p3/14 */
    char *sql = doc_query("### Q1.");
    int n;
    char **l = sqlite3_lines(path, sql, &n);
    assert_int_equal(n, 8);
    for (int i = 0; i < 8; i++) {
        int r, id;
        char num[64];
        if (sscanf(l[i], "%d|%d|%63s", &r, &id, num) != 3) fail_msg("Q1 line %d: \"%s\"", i + 1, l[i]);
        float f = (float)strtod(num, NULL);
        if (r != i + 1 || id != cpu[2][14][i].id || memcmp(&f, &cpu[2][14][i].logit, 4))
            fail_msg("Q1 line %d: \"%s\", expected %d|%d|%.9g", i + 1, l[i], i + 1, cpu[2][14][i].id,
                     cpu[2][14][i].logit);
    }
    lines_free(l, n), free(sql);

    /* Q2: the rank of cpu's token in the reference's top-k, every step of p3 */
    sql = doc_query("### Q2.");
    l = sqlite3_lines(path, sql, &n);
    assert_int_equal(n, DQ_S);
    for (int s = 0; s < DQ_S; s++) {
        int want = 0;
        for (int k = 0; k < DQ_K && !want; k++)
            if (ref[2][s][k].id == cpu[2][s][0].id) want = k + 1;
        char exp_line[64];
        if (want) snprintf(exp_line, sizeof exp_line, "%d|%d|%d", s, cpu[2][s][0].id, want);
        else snprintf(exp_line, sizeof exp_line, "%d|%d|", s, cpu[2][s][0].id);
        if (strcmp(l[s], exp_line) || want != rank[2][s])
            fail_msg("Q2 step %d: \"%s\", expected \"%s\" (compare.rank %d)", s, l[s], exp_line, rank[2][s]);
    }
    assert_true(strstr(l[14], "|2") && l[9][strlen(l[9]) - 1] == '|');   /* rank 2 and outside */
    lines_free(l, n), free(sql);

    /* Q3: KL(reference || cpu) per step, as compare.kl */
    sql = doc_query("### Q3.");
    l = sqlite3_lines(path, sql, &n);
    assert_int_equal(n, DQ_P * DQ_S);
    for (int i = 0; i < n; i++) {
        char pn[8];
        int s;
        double v;
        if (sscanf(l[i], "%7[^|]|%d|%lf", pn, &s, &v) != 3 || pn[0] != 'p') fail_msg("Q3 line %d: \"%s\"", i + 1, l[i]);
        int p = pn[1] - '1';
        assert_true(p == i / DQ_S && s == i % DQ_S);
        if (!(kl[p][s] > 0) || fabs(v - kl[p][s]) > 1e-12 + 1e-9 * kl[p][s])
            fail_msg("Q3 %s/%d: KL %.15g, compare.kl %.15g", pn, s, v, kl[p][s]);
    }
    lines_free(l, n), free(sql);

    /* Q4: deleting a leg others are stored against (leg id 1) keeps theirs */
    sql = doc_query("### Q4.");
    l = sqlite3_lines(path, sql, &n);
    lines_free(l, n), free(sql);
    tg_err e = {{0}};
    if (store_open(&st, path, &e) < 0) fail_msg("%s", e.msg);
    assert_int_equal(count(st, "SELECT count(*) FROM leg WHERE id = 1"), 0);
    assert_int_equal(count(st, "SELECT count(*) FROM step WHERE leg_id = 1"), 0);
    assert_int_equal(count(st, "SELECT count(*) FROM step_top WHERE leg_id = 1"), 0);
    assert_int_equal(count(st, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    char qs[160];
    snprintf(qs, sizeof qs, "SELECT count(*) FROM leg WHERE id = %lld AND same_as IS NULL", (long long)ref2);
    assert_int_equal(count(st, qs), 1);
    for (int p = 0; p < DQ_P; p++) {
        store_tops t;
        if (store_tops_read(store_db(st), ref2, count(st, "SELECT min(id) FROM prompt") + p, &t, &e) < 0)
            fail_msg("after Q4: %s", e.msg);
        assert_int_equal(t.n, DQ_S);
        for (int s = 0; s < DQ_S; s++)
            if (t.n_top[s] != DQ_K || memcmp(t.top + t.off[s], ref[p][s], sizeof ref[p][s]))
                fail_msg("after Q4: the reference's leg 2 p%d step %d differs", p + 1, s);
        store_tops_free(&t);
    }
    craft_store_drop(st, path);
}

TG_TEST_MAIN_WITH(
    setup, teardown, test_schema, test_newer_schema_refused, test_top_lossless, test_top_many_steps,
    test_corrupt_rows, test_old_store_refused, test_leg_all_or_nothing, test_identical_legs_stored_once,
    test_dumps_stderr_lookups, test_write_lock_waited, test_open_read_only, test_begin_run_validates,
    test_doc_queries)
