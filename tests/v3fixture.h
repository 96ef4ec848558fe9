/*
 * v3fixture.h: the data of the old store fixtures tests/data/store-v3.sql
 * and tests/data/store-v4.sql (written by the v3 and the v4 store code with
 * fixture_put below; test_store.c's test_old_store_refused opens them).
 * Arm "a", legs 1 and 2 (leg 2 equal to leg 1 except step 2 of prompt p1,
 * so leg 2's other steps were stored as same_as references), prompts p1 and
 * p2 with 4 steps each, a raw-format step (negative id), a repeated id, a
 * single-entry step (gap NULL) and a missing digest.
 *
 * The SQL was made by the v3 (v4) store code with fixture_put below: build
 * a program calling it against a checkout of that version, then `sqlite3
 * DB .dump` (plus PRAGMA user_version=3 or 4). Compiled only with
 * V3_FIXTURE_PUT defined.
 */
#ifndef TG_V3FIXTURE_H
#define TG_V3FIXTURE_H

#include <stdio.h>

#include "store.h"

static inline void v3_fixture_step(int leg, int p, int s, store_step *sp, tg_top *t)
{
    int n = (p == 1 && s == 3) ? 1 : 5;        /* one step with a single entry: gap NULL */
    for (int i = 0; i < n; i++) {
        t[i].id = (p * 7919 + s * 104729 + i * 15485863) % 151936;
        t[i].logit = 12.5f - 0.37f * (float)i - 0.011f * (float)(s + p);
    }
    if (leg == 2 && p == 0 && s == 2) t[1].logit -= 0.001f;
    if (p == 1 && s == 1) { t[3].id = -5; }     /* raw format: a negative id */
    if (p == 0 && s == 1) { t[4].id = t[2].id; } /* raw format: a repeated id */
    *sp = (store_step){.step = s, .token = t[0].id, .forced = p == 0 ? t[0].id : -1, .n_top = n, .top = t};
    snprintf(sp->digest, sizeof sp->digest, "%016llx", (unsigned long long)(0x9e3779b97f4a7c15ull * (unsigned)(1 + s + 10 * p + 100 * leg)));
    if (s == 0 && p == 1) sp->digest[0] = 0;
}
#ifdef V3_FIXTURE_PUT
static int fixture_put(tg_store *st, int64_t *run, tg_err *e)
{
    store_arm arms[] = {{"a", "engine", "reference", "{}"}};
    store_prompt pr[] = {{"p1", "hello"}, {"p2", "world"}};
    store_run_info ri = {.spec_name = "v3", .spec_sha256 = "00", .artifact_path = "m.gguf",
                         .artifact_sha256 = "11", .mode = "teacher-forced", .reference = "a",
                         .policy_kind = "exact", .steps = 4, .top_k = 5, .legs = 2, .n_arms = 1,
                         .arms = arms, .n_prompts = 2, .prompts = pr};
    if (store_begin_run(st, &ri, run, e) < 0) return -1;
    int32_t ids[3] = {1, 2, 3};
    for (int leg = 1; leg <= 2; leg++) {
        static tg_top tops[2][4][8];
        store_step steps[2][4];
        store_leg_prompt lps[2];
        for (int p = 0; p < 2; p++) {
            for (int s = 0; s < 4; s++) v3_fixture_step(leg, p, s, &steps[p][s], tops[p][s]);
            lps[p] = (store_leg_prompt){.prompt_id = pr[p].id, .ids = ids, .n_ids = 3, .decoded_from = ids,
                                        .n_decoded_from = 3, .n_steps = 4, .steps = steps[p]};
        }
        store_leg leg_ = {.run_id = *run, .arm = "a", .leg = leg, .binary_path = "w", .binary_sha256 = "22",
                          .version = "0", .n_prompts = 2, .prompts = lps};
        if (store_put_leg(st, &leg_, e) < 0) return -1;
    }
    return 0;
}
#endif

/* SQL that turns a current (version 5) store back into the version-3
 * layout: no step_top, leg without same_as, the step table with its top and
 * same_as columns (both NULL: the top-k is dropped), the view v_step_top.
 * For tests that make an older store by taking a current one apart;
 * user_version is the caller's. */
__attribute__((unused)) static const char STORE_TO_V3_SQL[] =
    "DROP VIEW v_top; DROP VIEW v_step; DROP TABLE step_top; ALTER TABLE leg DROP COLUMN same_as;\n"
    "ALTER TABLE step RENAME TO step_v4;\n"
    "CREATE TABLE step(\n"
    "  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,\n"
    "  token INTEGER NOT NULL, forced INTEGER, gap REAL, digest INTEGER, top BLOB,\n"
    "  same_as INTEGER,\n"
    "  PRIMARY KEY(leg_id, prompt_id, step),\n"
    "  FOREIGN KEY(leg_id, prompt_id) REFERENCES leg_prompt(leg_id, prompt_id) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "INSERT INTO step SELECT leg_id, prompt_id, step, token, forced, gap, digest, NULL, NULL FROM step_v4;\n"
    "DROP TABLE step_v4;\n"
    "CREATE VIEW v_step_top AS\n"
    "  SELECT s.leg_id, s.prompt_id, s.step, s.token, s.forced, s.gap, s.digest,\n"
    "         coalesce(s.top, (SELECT b.top FROM step b WHERE b.leg_id = s.same_as\n"
    "                          AND b.prompt_id = s.prompt_id AND b.step = s.step)) AS top\n"
    "  FROM step s;\n"
    "PRAGMA user_version=3;\n";

#endif
