/*
 * fuzz_store.c: the evidence store's top-k rows (harness/store.c) over
 * arbitrary bytes, two ways.
 *
 * 1. Written and read back: the input's bytes become the step numbers, ids
 *    and f32 bit patterns (NaN payloads, -0.0, subnormals, infinities) of a
 *    leg, written by store_put_leg and read by store_tops_read: every entry
 *    must come back bit-exact. A second leg, equal or with one logit bit
 *    flipped, must be stored as same_as the first exactly when equal, and
 *    read back as itself either way.
 * 2. Rows edited by hand: the rest of the input becomes leg.same_as, step
 *    and step_top rows of any SQLite type and value, inserted with foreign
 *    keys off, and store_tops_read must refuse them with a message or give
 *    a well-formed answer (ascending steps, 0..4096 entries each, offsets
 *    that add up).
 *
 * One in-memory store serves every input; each input's rows are deleted
 * afterwards.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "fuzz.h"
#include "store.h"

typedef struct fz_in {
    const uint8_t *p;
    size_t n, at;
} fz_in;

static uint32_t fz_u8(fz_in *in)
{
    return in->at < in->n ? in->p[in->at++] : 0;
}

static uint32_t fz_u32(fz_in *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= fz_u8(in) << (8 * i);
    return v;
}

static tg_store *fz_st;
static int64_t fz_run, fz_arm, fz_pid[2];

/* The store and its run (arm "a", prompts p1 and p2), made once. Returns 0
 * or -1. */
static int fz_init(void)
{
    if (fz_st) return 0;
    tg_err e = {{0}};
    if (store_open(&fz_st, ":memory:", &e) < 0) return -1;
    store_arm arm = {"a", "engine", "test", "{}"};
    store_prompt pr[2] = {{"p1", "x"}, {"p2", "y"}};
    store_run_info ri = {.spec_name = "fuzz", .spec_sha256 = "0", .artifact_path = "m", .artifact_sha256 = "1",
                         .mode = "teacher-forced", .reference = "a", .policy_kind = "exact", .n_arms = 1,
                         .arms = &arm, .n_prompts = 2, .prompts = pr};
    if (store_begin_run(fz_st, &ri, &fz_run, &e) < 0) return -1;
    sqlite3_stmt *s;
    sqlite3_prepare_v2(store_db(fz_st), "SELECT (SELECT id FROM arm), (SELECT id FROM prompt WHERE name = 'p1'),"
                                        " (SELECT id FROM prompt WHERE name = 'p2')", -1, &s, NULL);
    int ok = sqlite3_step(s) == SQLITE_ROW;
    fz_arm = sqlite3_column_int64(s, 0), fz_pid[0] = sqlite3_column_int64(s, 1), fz_pid[1] = sqlite3_column_int64(s, 2);
    sqlite3_finalize(s);
    return ok ? 0 : -1;
}

static int64_t fz_int(const char *sql)
{
    sqlite3_stmt *s;
    int64_t v = -1;
    if (sqlite3_prepare_v2(store_db(fz_st), sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_type(s, 0) == SQLITE_NULL ? 0 : sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* A store_tops answer keeps its promises. */
static void fz_check_tops(const store_tops *t)
{
    size_t m = 0;
    assert(t->n >= 0);
    for (int i = 0; i < t->n; i++) {
        assert(i == 0 || t->step[i] > t->step[i - 1]);
        assert(t->n_top[i] >= 0 && t->n_top[i] <= 4096);
        assert(t->off[i] == m);
        assert(store_tops_find(t, t->step[i]) == i);
        m += (size_t)t->n_top[i];
    }
    for (size_t k = 0; k < m; k++) {
        volatile tg_top x = t->top[k];   /* in bounds (ASan) */
        (void)x;
    }
}

enum { FZ_STEPS = 6, FZ_TOP = 9 };

/* Part 1: a leg from the input, written twice and read back. */
static void fz_roundtrip(fz_in *in)
{
    static tg_top top[2][FZ_STEPS][FZ_TOP];
    store_step steps[2][FZ_STEPS];
    store_leg_prompt lp[2];
    int n_p = 1 + (int)(fz_u8(in) % 2), total = 0;
    for (int p = 0; p < n_p; p++) {
        int n_s = (int)(fz_u8(in) % (FZ_STEPS + 1));
        for (int s = 0; s < n_s; s++) {
            int n_t = (int)(fz_u8(in) % FZ_TOP);
            for (int k = 0; k < n_t; k++) {
                uint32_t bits = fz_u32(in);
                top[p][s][k].id = (int32_t)fz_u32(in);
                memcpy(&top[p][s][k].logit, &bits, 4);
            }
            steps[p][s] = (store_step){.step = (int)(fz_u8(in) % 16) - 2, .token = n_t ? top[p][s][0].id : 0,
                                       .forced = -1, .n_top = n_t, .top = top[p][s]};
            total += n_t;
        }
        lp[p] = (store_leg_prompt){.prompt_id = p ? "p2" : "p1", .n_steps = n_s, .steps = steps[p]};
    }
    int flip = (int)(fz_u8(in) & 1) && total > 0;
    for (int leg = 1; leg <= 2; leg++) {
        if (leg == 2 && flip) {   /* one bit of one logit: no longer the same */
            for (int p = 0; p < n_p && flip == 1; p++)
                for (int s = 0; s < lp[p].n_steps && flip == 1; s++)
                    if (steps[p][s].n_top) {
                        uint32_t b;
                        memcpy(&b, &top[p][s][0].logit, 4);
                        b ^= 1u << (fz_u8(in) % 32);
                        memcpy(&top[p][s][0].logit, &b, 4);
                        flip = 2;
                    }
        }
        store_leg L = {.run_id = fz_run, .arm = "a", .leg = leg, .n_prompts = n_p, .prompts = lp};
        tg_err e = {{0}};
        if (store_put_leg(fz_st, &L, &e) < 0) {
            assert(e.msg[0] && "store_put_leg failed without a message");
            return;   /* a repeated step number: refused, nothing written */
        }
        char q[128];
        snprintf(q, sizeof q, "SELECT id FROM leg WHERE run_id = %lld AND leg = %d", (long long)fz_run, leg);
        int64_t leg_id = fz_int(q);
        if (leg == 2) {
            snprintf(q, sizeof q, "SELECT same_as FROM leg WHERE id = %lld", (long long)leg_id);
            assert((fz_int(q) != 0) == (flip == 0) && "same_as exactly when the legs are equal");
        }
        for (int p = 0; p < n_p; p++) {
            store_tops t;
            if (store_tops_read(store_db(fz_st), leg_id, fz_pid[p], &t, &e) < 0) {
                fprintf(stderr, "fuzz_store: reading back: %s\n", e.msg);
                assert(!"a leg just written does not read back");
            }
            fz_check_tops(&t);
            assert(t.n == lp[p].n_steps);
            for (int s = 0; s < lp[p].n_steps; s++) {
                int k = store_tops_find(&t, steps[p][s].step);
                assert(k >= 0 && t.n_top[k] == steps[p][s].n_top);
                assert(!memcmp(t.top + t.off[k], steps[p][s].top, sizeof(tg_top) * (size_t)steps[p][s].n_top) &&
                       "an id or f32 bit pattern changed on the way through the store");
            }
            store_tops_free(&t);
        }
    }
}

/* Binds a value of any SQLite type and a hostile range to parameter i. */
static void fz_bind_any(sqlite3_stmt *s, int i, fz_in *in)
{
    static const char *const TEXTS[] = {"x", "1.5", "-0", "3", "nan", ""};
    uint32_t kind = fz_u8(in) % 7;
    if (kind == 0) sqlite3_bind_null(s, i);
    else if (kind == 1) sqlite3_bind_int(s, i, (int)fz_u8(in) - 8);
    else if (kind == 2) sqlite3_bind_int64(s, i, (int64_t)((uint64_t)fz_u32(in) << 32 | fz_u32(in)));
    else if (kind == 3) {
        uint64_t b = (uint64_t)fz_u32(in) << 32 | fz_u32(in);
        double d;
        memcpy(&d, &b, 8);
        sqlite3_bind_double(s, i, d);
    } else if (kind == 4) sqlite3_bind_int(s, i, (int)fz_u8(in) % 5);
    else if (kind == 5) sqlite3_bind_text(s, i, TEXTS[fz_u8(in) % 6], -1, SQLITE_STATIC);
    else {
        uint8_t blob[2] = {(uint8_t)fz_u8(in), (uint8_t)fz_u8(in)};
        sqlite3_bind_blob(s, i, blob, 2, SQLITE_TRANSIENT);
    }
}

/* Part 2: rows of any type and value, then every (leg, prompt) read. */
static void fz_rows(fz_in *in)
{
    sqlite3 *db = store_db(fz_st);
    sqlite3_exec(db, "PRAGMA foreign_keys = OFF", NULL, NULL, NULL);
    sqlite3_stmt *ql, *qs, *qt;
    sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO leg(id, run_id, arm_id, leg, same_as) VALUES(?1, ?2, ?3, ?1, ?4)",
                       -1, &ql, NULL);
    sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO step(leg_id, prompt_id, step, token) VALUES(?1, ?2, ?3, 0)", -1,
                       &qs, NULL);
    sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO step_top(leg_id, prompt_id, step, rank, id, logit, bits)"
                           " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)", -1, &qt, NULL);
    static const int64_t SAME[] = {0, 1, 2, 3, 99};
    for (int leg = 1; leg <= 3; leg++) {
        sqlite3_reset(ql);
        sqlite3_bind_int(ql, 1, leg);
        sqlite3_bind_int64(ql, 2, fz_run);
        sqlite3_bind_int64(ql, 3, fz_arm);
        int64_t sa = SAME[fz_u8(in) % 5];
        if (sa) sqlite3_bind_int64(ql, 4, sa);
        else sqlite3_bind_null(ql, 4);
        sqlite3_step(ql);
    }
    for (int r = 0; r < 512 && in->at < in->n; r++) {
        sqlite3_stmt *q = fz_u8(in) % 4 ? qt : qs;
        sqlite3_reset(q);
        sqlite3_clear_bindings(q);
        sqlite3_bind_int(q, 1, 1 + (int)fz_u8(in) % 3);
        sqlite3_bind_int64(q, 2, fz_pid[fz_u8(in) % 2]);
        if (fz_u8(in) % 4) sqlite3_bind_int(q, 3, (int)fz_u8(in) % 8);
        else fz_bind_any(q, 3, in);
        if (q == qt) {
            if (fz_u8(in) % 4) sqlite3_bind_int(q, 4, 1 + (int)fz_u8(in) % 6);
            else fz_bind_any(q, 4, in);
            for (int c = 5; c <= 7; c++) {
                if (c != 7 && fz_u8(in) % 3) {
                    if (c == 5) sqlite3_bind_int(q, c, (int)fz_u32(in));
                    else sqlite3_bind_double(q, c, (double)(int)fz_u32(in) / 1024.0);
                } else
                    fz_bind_any(q, c, in);
            }
        }
        sqlite3_step(q);
    }
    sqlite3_finalize(ql);
    sqlite3_finalize(qs);
    sqlite3_finalize(qt);
    for (int leg = 1; leg <= 3; leg++)
        for (int p = 0; p < 2; p++) {
            store_tops t;
            tg_err e = {{0}};
            if (store_tops_read(db, leg, fz_pid[p], &t, &e) < 0) {
                assert(e.msg[0] && "store_tops_read failed without a message");
                assert(t.n == 0 && !t.step && !t.top);
                continue;
            }
            fz_check_tops(&t);
            store_tops_free(&t);
        }
    sqlite3_exec(db, "DELETE FROM step_top; DELETE FROM step; DELETE FROM leg; PRAGMA foreign_keys = ON",
                 NULL, NULL, NULL);
}

int fuzz_store_one(const uint8_t *data, size_t size)
{
    if (fz_init() < 0) return 0;
    fz_in in = {data, size, 0};
    fz_roundtrip(&in);
    sqlite3_exec(store_db(fz_st), "DELETE FROM leg WHERE same_as IS NOT NULL; DELETE FROM leg", NULL, NULL, NULL);
    assert(fz_int("SELECT count(*) FROM step_top") == 0 && fz_int("SELECT count(*) FROM step") == 0);
    fz_rows(&in);
    return 0;
}

#ifdef TG_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_store_one(data, size); }
#endif
