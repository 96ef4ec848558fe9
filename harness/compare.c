/*
 * compare.c: computes the facts of a stored run (compare.h) from its rows:
 * loads the run, its arms, prompts, legs and steps (top-k blobs decoded),
 * classifies every step of every arm leg against the reference over the
 * same prefix, decides which legs are clean and whether clean legs are
 * identical, finds contested steps and writes their four-way resolution
 * sentences, and looks up the previous run for ORACLE_REPRO. Nothing here
 * writes to the store; verdict.c does.
 */
#include "compare.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "common.h"
#include "noise.h"

static const char *const CLASS_NAMES[CMP_N_CLASSES] = {
    "EXACT", "NEAR_TIE", "RANK2", "TOPK", "OUTSIDE", "WITHIN_NOISE", "DEGENERATE", "UNCOMPARABLE"};

const char *compare_class_name(cmp_class c)
{
    assert(c >= 0 && c < CMP_N_CLASSES);
    return CLASS_NAMES[c];
}

int compare_class_ok(cmp_class c, const char *policy)
{
    if (c == CMP_EXACT || c == CMP_UNCOMPARABLE) return 1;
    if (c == CMP_DEGENERATE || !strcmp(policy, "exact")) return 0;
    if (!strcmp(policy, "noise")) return c == CMP_WITHIN_NOISE;
    return c == CMP_NEAR_TIE;
}

static char *dup_col(sqlite3_stmt *s, int i)
{
    const unsigned char *t = sqlite3_column_text(s, i);
    return t ? xstrdup((const char *)t) : NULL;
}

/* ------------------------------------------------------------------ */
/* Freeing                                                             */

static void lp_free(cmp_lp *lp)
{
    free(lp->ids), free(lp->decoded_from), free(lp->text), free(lp->error);
    free(lp->token), free(lp->forced), free(lp->step_no), free(lp->has_digest);
    free(lp->digest), free(lp->n_top);
    if (lp->top)
        for (int i = 0; i < lp->n_steps; i++) free(lp->top[i]);
    free(lp->top);
}

void compare_free(cmp_run *r)
{
    if (!r) return;
    for (int a = 0; a < r->n_arms; a++) {
        cmp_arm *arm = &r->arms[a];
        for (int l = 0; l < arm->n_legs; l++) {
            cmp_leg *g = &arm->legs[l];
            if (g->lp)
                for (int p = 0; p < r->n_prompts; p++) lp_free(&g->lp[p]);
            free(g->lp), free(g->rows), free(g->cause), free(g->fault_lines);
            free(g->counters), free(g->hello), free(g->binary_sha256), free(g->binary_path);
        }
        free(arm->legs), free(arm->ap), free(arm->planned);
        free(arm->name), free(arm->kind), free(arm->role), free(arm->config);
    }
    free(r->arms);
    for (int p = 0; p < r->n_prompts; p++) free(r->prompts[p].name), free(r->prompts[p].text);
    free(r->prompts);
    for (int c = 0; c < r->n_contested; c++) free(r->contested[c].tokens), free(r->contested[c].sentence);
    free(r->contested);
    free(r->bands);
    calibrate_free(r->cal);
    free(r->spec_name), free(r->spec_sha256), free(r->artifact_sha256), free(r->artifact_path);
    free(r->mode), free(r->reference);
    free(r);
}

/* ------------------------------------------------------------------ */
/* Loading                                                             */

static int load_run(sqlite3 *db, cmp_run *r, tg_err *e)
{
    sqlite3_stmt *s = NULL;
    int rc = -1;
    s = common_sql_prepare(db,
                           "SELECT spec.name, spec.sha256, artifact.sha256, artifact.path,"
                           " run.mode, run.reference, run.steps, run.top_k, run.legs"
                           " FROM run JOIN spec ON spec.id = run.spec_id"
                           " JOIN artifact ON artifact.id = run.artifact_id WHERE run.id = ?1",
                           "I", r->run_id);
    if (!s)
        return common_sql_err(db, e, "reading the run");
    int st = sqlite3_step(s);
    if (st == SQLITE_ROW) {
        r->spec_name = dup_col(s, 0);
        r->spec_sha256 = dup_col(s, 1);
        r->artifact_sha256 = dup_col(s, 2);
        r->artifact_path = dup_col(s, 3);
        r->mode = dup_col(s, 4);
        r->reference = dup_col(s, 5);
        r->steps = sqlite3_column_int(s, 6);
        r->top_k = sqlite3_column_int(s, 7);
        r->legs = sqlite3_column_type(s, 8) == SQLITE_NULL ? 0 : sqlite3_column_int(s, 8);
        rc = 0;
    } else if (st == SQLITE_DONE) {
        tg_errf(e, "store: no run %lld", (long long)r->run_id);
    } else {
        common_sql_err(db, e, "reading the run");
    }
    sqlite3_finalize(s);
    return rc;
}

static int load_prompts(sqlite3 *db, cmp_run *r, tg_err *e)
{
    sqlite3_stmt *s = NULL;
    s = common_sql_prepare(db, "SELECT id, name, text FROM prompt WHERE run_id=?1 ORDER BY no", "I", r->run_id);
    if (!s)
        return common_sql_err(db, e, "reading prompts");
    int cap = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (r->n_prompts == cap) {
            cap = cap ? 2 * cap : 8;
            r->prompts = xrealloc(r->prompts, sizeof *r->prompts * (size_t)cap);
        }
        cmp_prompt *p = &r->prompts[r->n_prompts++];
        p->id = sqlite3_column_int64(s, 0);
        p->name = dup_col(s, 1);
        p->text = dup_col(s, 2);
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return common_sql_err(db, e, "reading prompts");
    return 0;
}

/* Reads a string field of a JSON object text (NULL when absent). */
static void json_str(const char *text, const char *outer, const char *key, char *out, size_t cap)
{
    out[0] = 0;
    if (!text) return;
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) return;
    json_t *o = outer ? json_object_get(root, outer) : root;
    json_t *v = o ? json_object_get(o, key) : NULL;
    if (json_is_string(v)) snprintf(out, cap, "%s", json_string_value(v));
    json_decref(root);
}

/* a->planned from the "prompts" list of its config (NULL when none).
 * Returns 0, or -1 out of memory. */
static int load_planned(const cmp_run *r, cmp_arm *a)
{
    json_error_t je;
    json_t *root = a->config ? json_loads(a->config, 0, &je) : NULL;
    json_t *list = root ? json_object_get(root, "prompts") : NULL;
    int rc = 0;
    if (json_is_array(list)) {
        a->planned = calloc((size_t)(r->n_prompts ? r->n_prompts : 1), sizeof *a->planned);
        if (!a->planned) rc = -1;
        for (int p = 0; !rc && p < r->n_prompts; p++) {
            size_t i;
            json_t *v;
            json_array_foreach(list, i, v)
            if (json_is_string(v) && !strcmp(json_string_value(v), r->prompts[p].name)) a->planned[p] = 1;
        }
    }
    json_decref(root);
    return rc;
}

int compare_planned(const cmp_arm *a, int p)
{
    return !a->planned || a->planned[p];
}

static int load_arms(sqlite3 *db, cmp_run *r, tg_err *e)
{
    sqlite3_stmt *s = NULL;
    s = common_sql_prepare(db, "SELECT id, name, kind, role, config FROM arm WHERE run_id=?1 ORDER BY id",
                           "I", r->run_id);
    if (!s)
        return common_sql_err(db, e, "reading arms");
    int cap = 0, rc;
    r->ref = -1;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (r->n_arms == cap) {
            cap = cap ? 2 * cap : 8;
            r->arms = xrealloc(r->arms, sizeof *r->arms * (size_t)cap);
        }
        cmp_arm *a = &r->arms[r->n_arms++];
        memset(a, 0, sizeof *a);
        a->id = sqlite3_column_int64(s, 0);
        a->name = dup_col(s, 1);
        a->kind = dup_col(s, 2);
        a->role = dup_col(s, 3);
        a->config = dup_col(s, 4);
        a->scoring = -1;
        if (!a->name || !a->kind || !a->role) {
            sqlite3_finalize(s);
            return tg_errf(e, "run %lld: arm row %lld lacks name, kind or role",
                           (long long)r->run_id, (long long)a->id);
        }
        a->is_ref = r->reference && !strcmp(a->name, r->reference);
        a->is_custody = !strcmp(a->role, "custody");
        a->is_test = !a->is_ref && !a->is_custody && !strcmp(a->role, "test");
        a->is_oracle = a->is_ref || (!a->is_custody && !strcmp(a->role, "oracle"));
        if (a->is_ref) r->ref = r->n_arms - 1;
        json_str(a->config, NULL, "engine", a->tier, sizeof a->tier);
        if (load_planned(r, a) < 0) {
            sqlite3_finalize(s);
            return tg_errf(e, "out of memory");
        }
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return common_sql_err(db, e, "reading arms");
    if (r->ref < 0)
        return tg_errf(e, "run %lld: the reference \"%s\" is not one of its arms",
                       (long long)r->run_id, r->reference ? r->reference : "");
    return 0;
}

static int load_steps(sqlite3 *db, sqlite3_stmt *s, int64_t leg_id, int64_t prompt_id, cmp_lp *lp,
                      tg_err *e)
{
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, leg_id);
    sqlite3_bind_int64(s, 2, prompt_id);
    int cap = 0, rc, n = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
#define GROW(f) lp->f = xrealloc(lp->f, sizeof *lp->f * (size_t)cap)
            GROW(token); GROW(forced); GROW(step_no); GROW(has_digest); GROW(digest);
            GROW(n_top); GROW(top);
#undef GROW
        }
        lp->step_no[n] = sqlite3_column_int(s, 0);
        lp->token[n] = sqlite3_column_int(s, 1);
        lp->forced[n] = sqlite3_column_type(s, 2) == SQLITE_NULL ? -1 : sqlite3_column_int(s, 2);
        lp->has_digest[n] = sqlite3_column_type(s, 3) != SQLITE_NULL;
        lp->digest[n] = sqlite3_column_int64(s, 3);
        lp->top[n] = NULL;
        lp->n_top[n] = 0;
        lp->n_steps = n + 1;
        n++;
    }
    lp->n_steps = n;
    if (rc != SQLITE_DONE) return common_sql_err(db, e, "reading steps");
    if (n == 0) return 0;
    /* the top-k of every step, from its step_top rows */
    store_tops t;
    if (store_tops_read(db, leg_id, prompt_id, &t, e) < 0) return -1;
    for (int i = 0; i < n; i++) {
        int k = store_tops_find(&t, lp->step_no[i]);
        if (k < 0) continue;
        lp->top[i] = xcalloc((size_t)t.n_top[k], sizeof(tg_top));
        memcpy(lp->top[i], t.top + t.off[k], sizeof(tg_top) * (size_t)t.n_top[k]);
        lp->n_top[i] = t.n_top[k];
    }
    store_tops_free(&t);
    return 0;
}

static int load_legs(sqlite3 *db, cmp_run *r, tg_err *e)
{
    sqlite3_stmt *sl = NULL, *sp = NULL, *ss = NULL;
    int rc = -1;
    if (sqlite3_prepare_v2(db,
                           "SELECT leg.id, leg.leg, leg.exit_status, leg.term_signal, leg.cause,"
                           " leg.fault_lines, leg.counters, leg.hello, leg.device_ops, leg.host_ops,"
                           " binary.sha256, binary.path"
                           " FROM leg LEFT JOIN binary ON binary.id = leg.binary_id"
                           " WHERE leg.arm_id = ?1 ORDER BY leg.leg, leg.id",
                           -1, &sl, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "SELECT ids, decoded_from, text, error, n_steps FROM leg_prompt"
                           " WHERE leg_id=?1 AND prompt_id=?2",
                           -1, &sp, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "SELECT step, token, forced, digest FROM step"
                           " WHERE leg_id=?1 AND prompt_id=?2 ORDER BY step",
                           -1, &ss, NULL) != SQLITE_OK) {
        common_sql_err(db, e, "preparing leg queries");
        goto out;
    }
    for (int a = 0; a < r->n_arms; a++) {
        cmp_arm *arm = &r->arms[a];
        sqlite3_reset(sl);
        sqlite3_bind_int64(sl, 1, arm->id);
        int cap = 0, st;
        while ((st = sqlite3_step(sl)) == SQLITE_ROW) {
            if (arm->n_legs == cap) {
                cap = cap ? 2 * cap : 8;
                arm->legs = xrealloc(arm->legs, sizeof *arm->legs * (size_t)cap);
            }
            cmp_leg *g = &arm->legs[arm->n_legs++];
            memset(g, 0, sizeof *g);
            g->id = sqlite3_column_int64(sl, 0);
            g->leg = sqlite3_column_int(sl, 1);
            g->exit_status = sqlite3_column_int(sl, 2);
            g->term_signal = sqlite3_column_int(sl, 3);
            g->cause = dup_col(sl, 4);
            g->fault_lines = dup_col(sl, 5);
            g->counters = dup_col(sl, 6);
            g->hello = dup_col(sl, 7);
            g->device_ops = sqlite3_column_int64(sl, 8);
            g->host_ops = sqlite3_column_int64(sl, 9);
            g->binary_sha256 = dup_col(sl, 10);
            g->binary_path = dup_col(sl, 11);
            g->lp = xcalloc((size_t)r->n_prompts, sizeof *g->lp);
            if (!arm->tier[0]) json_str(g->hello, "arm", "tier", arm->tier, sizeof arm->tier);
            for (int p = 0; p < r->n_prompts; p++) {
                cmp_lp *lp = &g->lp[p];
                sqlite3_reset(sp);
                sqlite3_bind_int64(sp, 1, g->id);
                sqlite3_bind_int64(sp, 2, r->prompts[p].id);
                int s2 = sqlite3_step(sp);
                if (s2 == SQLITE_DONE) continue;
                if (s2 != SQLITE_ROW) {
                    common_sql_err(db, e, "reading leg prompts");
                    goto out;
                }
                lp->present = 1;
                lp->ids = dup_col(sp, 0);
                lp->decoded_from = dup_col(sp, 1);
                lp->text = dup_col(sp, 2);
                lp->error = dup_col(sp, 3);
                if (load_steps(db, ss, g->id, r->prompts[p].id, lp, e) < 0) {
                    tg_err_prefix(e, "arm %s leg %d prompt %s", arm->name, g->leg,
                                  r->prompts[p].name);
                    goto out;
                }
            }
        }
        if (st != SQLITE_DONE) {
            common_sql_err(db, e, "reading legs");
            goto out;
        }
    }
    rc = 0;
out:
    sqlite3_finalize(sl);
    sqlite3_finalize(sp);
    sqlite3_finalize(ss);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Legs: clean, identical, counters                                    */

static int empty(const char *s)
{
    return !s || !s[0];
}

/* Sums the counters' per-op entries whose name ends in "/ref". */
static int64_t ref_tier_hits(const char *counters)
{
    if (!counters) return 0;
    json_error_t je;
    json_t *root = json_loads(counters, 0, &je);
    if (!root) return 0;
    json_t *ops = json_object_get(root, "ops");
    if (!json_is_object(ops)) ops = root;
    int64_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(ops, k, v)
    {
        size_t len = strlen(k);
        if (len >= 4 && !strcmp(k + len - 4, "/ref") && json_is_integer(v))
            n = common_add_sat(n, json_integer_value(v));
    }
    json_decref(root);
    return n;
}

/* A reference top-k no verdict can rest on: a NaN or infinite logit, or
 * every logit equal (a flat distribution has no argmax to test against). */
static int ref_degenerate(const tg_top *t, int n)
{
    for (int i = 0; i < n; i++)
        if (!isfinite(t[i].logit)) return 1;
    return n >= 2 && t[0].logit == t[n - 1].logit;
}

/* An arm's own top-k with a NaN or infinite logit. */
static int arm_nonfinite(const tg_top *t, int n)
{
    for (int i = 0; i < n; i++)
        if (!isfinite(t[i].logit)) return 1;
    return 0;
}

static void judge_legs(cmp_run *r)
{
    for (int a = 0; a < r->n_arms; a++) {
        cmp_arm *arm = &r->arms[a];
        if (!strcmp(arm->tier, "gpu")) arm->is_device = 1;
        for (int l = 0; l < arm->n_legs; l++)
            if (arm->legs[l].device_ops > 0) arm->is_device = 1;
        for (int l = 0; l < arm->n_legs; l++) {
            cmp_leg *g = &arm->legs[l];
            /* a worker's counters are its word: sums saturate, never wrap */
            arm->device_ops = common_add_sat(arm->device_ops, g->device_ops);
            arm->host_ops = common_add_sat(arm->host_ops, g->host_ops);
            if (strcmp(arm->tier, "ref"))
                arm->reference_tier_hits = common_add_sat(arm->reference_tier_hits, ref_tier_hits(g->counters));
            g->clean = 1;
            /* the stored cause first: "killed by signal 15" is usually the
             * harness ending a worker that timed out, the cause says so */
            if (!empty(g->cause))
                snprintf(g->why, sizeof g->why, "%s", g->cause), g->clean = 0;
            else if (g->term_signal)
                snprintf(g->why, sizeof g->why, "killed by signal %d", g->term_signal), g->clean = 0;
            else if (g->exit_status != 0)
                snprintf(g->why, sizeof g->why, "exit status %d", g->exit_status), g->clean = 0;
            if (g->clean && !empty(g->fault_lines)) {
                char safe[220];
                snprintf(g->why, sizeof g->why, "fault lines in stderr: %s",
                         common_text_safe(g->fault_lines, safe, sizeof safe));
                g->clean = 0;
            }
            if (g->clean && arm->is_device && g->host_ops > 0)
                snprintf(g->why, sizeof g->why, "device arm fell back to the host for %lld ops",
                         (long long)g->host_ops), g->clean = 0;
            for (int p = 0; g->clean && p < r->n_prompts; p++) {
                if (!compare_planned(arm, p)) continue;
                if (!g->lp[p].present)
                    snprintf(g->why, sizeof g->why, "prompt %s missing", r->prompts[p].name),
                        g->clean = 0;
                else if (!empty(g->lp[p].error))
                    snprintf(g->why, sizeof g->why, "prompt %s: %.200s", r->prompts[p].name,
                             g->lp[p].error), g->clean = 0;
            }
            if (g->clean) {
                arm->legs_clean++;
                if (arm->scoring < 0) arm->scoring = l;
            }
        }
        if (arm->scoring < 0 && arm->n_legs > 0) arm->scoring = 0;
        /* the denominators come from the run's plan: a leg never stored
         * (the run was interrupted) counts as not clean, and the run as
         * unfinished */
        arm->legs_expected = r->legs > arm->n_legs ? r->legs : arm->n_legs;
        int stored = 0;
        for (int k = 1; k <= arm->legs_expected; k++) {
            int have = 0;
            for (int l = 0; l < arm->n_legs; l++) have |= arm->legs[l].leg == k;
            stored += have;
        }
        if (stored < arm->legs_expected && !r->unfinished) {
            r->unfinished = 1;
            snprintf(r->unfinished_why, sizeof r->unfinished_why,
                     "run %lld is unfinished: arm %.60s has %d of %d legs stored; resume it with --resume %lld",
                     (long long)r->run_id, arm->name, stored, arm->legs_expected, (long long)r->run_id);
        }
        arm->identical_known = arm->legs_clean >= 2;
        /* identical: every clean leg equals the first clean one */
        arm->legs_identical = 1;
        cmp_leg *base = NULL;
        for (int l = 0; l < arm->n_legs && arm->legs_identical; l++) {
            cmp_leg *g = &arm->legs[l];
            if (!g->clean) continue;
            if (!base) {
                base = g;
                continue;
            }
            for (int p = 0; p < r->n_prompts && arm->legs_identical; p++) {
                cmp_lp *x = &base->lp[p], *y = &g->lp[p];
                if (x->n_steps != y->n_steps) {
                    snprintf(arm->identical_why, sizeof arm->identical_why,
                             "leg %d prompt %s: %d steps, leg %d has %d", g->leg, r->prompts[p].name,
                             y->n_steps, base->leg, x->n_steps);
                    arm->legs_identical = 0;
                    break;
                }
                if ((x->text || y->text) && (!x->text || !y->text || strcmp(x->text, y->text))) {
                    snprintf(arm->identical_why, sizeof arm->identical_why,
                             "leg %d prompt %s: text differs from leg %d", g->leg,
                             r->prompts[p].name, base->leg);
                    arm->legs_identical = 0;
                    break;
                }
                for (int i = 0; i < x->n_steps; i++) {
                    int same = x->token[i] == y->token[i];
                    if (same && x->has_digest[i] && y->has_digest[i])
                        same = x->digest[i] == y->digest[i];
                    else if (same)
                        same = x->n_top[i] == y->n_top[i] &&
                               (!x->n_top[i] || !memcmp(x->top[i], y->top[i],
                                                        sizeof(tg_top) * (size_t)x->n_top[i]));
                    if (!same) {
                        snprintf(arm->identical_why, sizeof arm->identical_why,
                                 "leg %d prompt %s step %d differs from leg %d", g->leg,
                                 r->prompts[p].name, x->step_no[i], base->leg);
                        arm->legs_identical = 0;
                        break;
                    }
                }
            }
        }
    }
    cmp_arm *ref = &r->arms[r->ref];
    if (ref->n_legs && ref->legs[0].leg == 1)
        for (int p = 0; p < r->n_prompts; p++) {
            const cmp_lp *y = &ref->legs[0].lp[p];
            for (int i = 0; i < y->n_steps; i++) r->n_degenerate += ref_degenerate(y->top[i], y->n_top[i]);
        }
    r->ref_ok = 0;
    if (ref->n_legs == 0 || ref->legs[0].leg != 1)
        snprintf(r->ref_why, sizeof r->ref_why, "reference %s has no leg 1", ref->name);
    else if (!ref->legs[0].clean)
        snprintf(r->ref_why, sizeof r->ref_why, "reference %.40s leg 1 is not clean: %.180s", ref->name,
                 ref->legs[0].why);
    else
        r->ref_ok = 1;
}

/* ------------------------------------------------------------------ */
/* Step comparison                                                     */

/* The token appended after step i (teacher forcing or the arm's own). */
static int32_t appended(const cmp_lp *lp, int i)
{
    return lp->forced[i] >= 0 ? lp->forced[i] : lp->token[i];
}

static double gap_of(const tg_top *t, int n)
{
    if (n < 2) return NAN;
    return (double)t[0].logit - (double)t[1].logit;
}

/* KL(P || Q): P = softmax of the reference logits over the reference top-k,
 * Q = softmax of the arm's logits over the same ids, an id missing from the
 * arm's top-k taking the arm's lowest top-k logit. An arm whose list is
 * shorter (a server that answers at most 20 log-probabilities) is compared
 * over the reference's first na ids: its missing ids would otherwise all
 * take its floor. Values that are log-probabilities (logits minus a
 * per-step constant) give the same KL. NaN when either list is empty or a
 * logit is not finite. */
static double kl_topk(const tg_top *ref, int nr, const tg_top *arm, int na)
{
    if (nr < 1 || na < 1) return NAN;
    if (na < nr) nr = na;
    double floor_l = arm[na - 1].logit, pm = -INFINITY, qm = -INFINITY;
    double q[4096];
    for (int i = 0; i < nr; i++) {
        q[i] = floor_l;
        for (int j = 0; j < na; j++)
            if (arm[j].id == ref[i].id) {
                q[i] = arm[j].logit;
                break;
            }
        if (!isfinite(q[i]) || !isfinite(ref[i].logit)) return NAN;
        if (ref[i].logit > pm) pm = ref[i].logit;
        if (q[i] > qm) qm = q[i];
    }
    double ps = 0, qs = 0;
    for (int i = 0; i < nr; i++) ps += exp(ref[i].logit - pm), qs += exp(q[i] - qm);
    double kl = 0;
    for (int i = 0; i < nr; i++) {
        double lp = ref[i].logit - pm - log(ps), lq = q[i] - qm - log(qs);
        kl += exp(lp) * (lp - lq);
    }
    return kl < 0 ? 0 : kl;
}

/* Reference leg to compare leg number `leg` with: the same number where
 * present, else leg 1. NULL when the reference has neither. */
static cmp_leg *ref_leg_for(cmp_run *r, int leg)
{
    cmp_arm *ref = &r->arms[r->ref];
    cmp_leg *one = NULL;
    for (int l = 0; l < ref->n_legs; l++) {
        if (ref->legs[l].leg == leg) return &ref->legs[l];
        if (ref->legs[l].leg == 1 && !one) one = &ref->legs[l];
    }
    return one;
}

static int compare_leg(cmp_run *r, cmp_arm *arm, cmp_leg *g, tg_err *e)
{
    cmp_leg *rl = ref_leg_for(r, g->leg);
    if (!rl || rl == g) return 0;
    int total = 0;
    for (int p = 0; p < r->n_prompts; p++) total += g->lp[p].n_steps;
    g->rows = xcalloc((size_t)total, sizeof *g->rows);
    for (int p = 0; p < r->n_prompts; p++) {
        cmp_lp *x = &g->lp[p], *y = &rl->lp[p];
        int prefix_ok = x->present && y->present && x->decoded_from && y->decoded_from &&
                        !strcmp(x->decoded_from, y->decoded_from);
        for (int i = 0; i < x->n_steps; i++) {
            cmp_row *row = &g->rows[g->n_rows++];
            row->prompt = p;
            row->step = x->step_no[i];
            row->ref_leg = rl->leg;
            row->token = x->token[i];
            row->ref_token = -1;
            row->ref_top2 = -1;
            row->ref_gap = row->own_gap = row->kl = NAN;
            row->noise_dev = row->noise_band = NAN;
            row->own_gap = gap_of(x->top[i], x->n_top[i]);
            /* same step index in the reference, with the same prefix */
            int ok = prefix_ok && i < y->n_steps && y->step_no[i] == x->step_no[i];
            for (int j = 0; ok && j < i; j++) ok = appended(x, j) == appended(y, j);
            if (!ok) {
                row->cls = CMP_UNCOMPARABLE;
                prefix_ok = prefix_ok && i < y->n_steps; /* later steps stay uncomparable */
                if (i < y->n_steps) row->ref_token = y->token[i];
                continue;
            }
            const tg_top *rt = y->top[i];
            int nr = y->n_top[i];
            row->ref_token = y->token[i];
            if (nr >= 2) row->ref_top2 = rt[1].id;
            row->ref_gap = gap_of(rt, nr);
            row->rank = 0;
            for (int k = 0; k < nr; k++)
                if (rt[k].id == row->token) {
                    row->rank = k + 1;
                    break;
                }
            row->degenerate = ref_degenerate(rt, nr) ? 1 : arm_nonfinite(x->top[i], x->n_top[i]) ? 2 : 0;
            if (row->degenerate) {
                row->cls = CMP_DEGENERATE;
            } else if (row->token == row->ref_token) {
                row->cls = CMP_EXACT;
                if (!row->rank) row->rank = 1;
            } else if (row->rank >= 2) {
                /* A near-tie is a token the reference itself ranks within the
                 * band of its top-1. For rank 2 that is the reference gap; a
                 * multi-way tie (five tokens within 0.03) is a tie too, not
                 * a TOPK defect signal. */
                double margin = (double)rt[0].logit - (double)rt[row->rank - 1].logit;
                if (isfinite(margin) && margin < r->band)
                    row->cls = CMP_NEAR_TIE;
                else
                    row->cls = row->rank == 2 ? CMP_RANK2 : CMP_TOPK;
            } else
                row->cls = CMP_OUTSIDE;
            row->kl = kl_topk(rt, nr, x->top[i], x->n_top[i]);
        }
    }
    (void)arm;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Four-way resolution                                                 */

static void join_names(char *out, size_t cap, int n, const char *const *names, const int *pick)
{
    size_t k = 0;
    int first = 1;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!pick[i]) continue;
        k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "%s%s", first ? "" : ", ", names[i]);
        first = 0;
        if (k >= cap) break;
    }
}

void compare_sentence(int n, const char *const *names, const int *is_engine, const int *is_oracle,
                      const int32_t *tokens, int32_t truth, char *out, size_t cap)
{
    int ne = 0, n_right = 0, n_wrong = 0, oracles_agree = 1, engines_agree = 1;
    int32_t first_o = 0, first_e = 0;
    int have_o = 0, have_e = 0;
    int right[64] = {0}, wrong[64] = {0};
    assert(n <= 64);
    for (int i = 0; i < n; i++) {
        if (is_oracle[i]) {
            if (have_o && tokens[i] != first_o) oracles_agree = 0;
            if (!have_o) first_o = tokens[i], have_o = 1;
        }
        if (is_engine[i]) {
            ne++;
            if (have_e && tokens[i] != first_e) engines_agree = 0;
            if (!have_e) first_e = tokens[i], have_e = 1;
            if (tokens[i] == truth) right[i] = 1, n_right++;
            else wrong[i] = 1, n_wrong++;
        }
    }
    char head[256], list[512];
    if (ne == 0)
        snprintf(head, sizeof head, "no engine arm");
    else if (ne == 1) {
        int eng[64] = {0};
        for (int i = 0; i < n; i++) eng[i] = is_engine[i];
        join_names(list, sizeof list, n, names, eng);
        snprintf(head, sizeof head, "engine arm %.200s", list);
    } else
        snprintf(head, sizeof head, "engine arms %s", engines_agree ? "AGREE" : "DIFFER");
    if (!oracles_agree) {
        snprintf(out, cap, "%s; the oracles disagree with each other", head);
        return;
    }
    if (n_wrong == 0) {
        snprintf(out, cap, "%s; every arm agrees with the oracles", head);
        return;
    }
    if (ne == 1) {
        snprintf(out, cap, "%s is wrong", head);
        return;
    }
    const char *all = ne == 2 ? "both are wrong" : "all are wrong";
    if (n_right == 0) {
        snprintf(out, cap, "%s; %s", head, all);
        return;
    }
    if (n_wrong <= n_right) {
        join_names(list, sizeof list, n, names, wrong);
        snprintf(out, cap, "%s; %s %s wrong", head, list, n_wrong == 1 ? "is" : "are");
    } else {
        join_names(list, sizeof list, n, names, right);
        snprintf(out, cap, "%s; %s %s right", head, list, n_right == 1 ? "is" : "are");
    }
}

/* The compare row of leg g for (prompt p, step), by binary search (rows are
 * ordered by prompt, then step); NULL when absent. */
static cmp_row *find_row(cmp_leg *g, int p, int step)
{
    int lo = 0, hi = g->n_rows;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        cmp_row *m = &g->rows[mid];
        if (m->prompt < p || (m->prompt == p && m->step < step))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < g->n_rows && g->rows[lo].prompt == p && g->rows[lo].step == step) return &g->rows[lo];
    return NULL;
}

/* The comparable row of arm a's scoring leg for (prompt, step), or NULL. */
static cmp_row *scoring_row(cmp_arm *a, int p, int step)
{
    if (a->scoring < 0) return NULL;
    cmp_row *row = find_row(&a->legs[a->scoring], p, step);
    return row && row->cls != CMP_UNCOMPARABLE ? row : NULL;
}

cmp_row *compare_leg_row(cmp_leg *g, int p, int step)
{
    return find_row(g, p, step);
}

cmp_row *compare_scoring_row(cmp_arm *a, int p, int step)
{
    return scoring_row(a, p, step);
}

static int contest(cmp_run *r, tg_err *e)
{
    cmp_arm *ref = &r->arms[r->ref];
    if (ref->n_legs == 0 || ref->legs[0].leg != 1) return 0;
    cmp_leg *rl = &ref->legs[0];
    int cap = 0;
    enum { MAXA = 64 };
    for (int p = 0; p < r->n_prompts; p++) {
        cmp_lp *y = &rl->lp[p];
        for (int i = 0; i < y->n_steps; i++) {
            const char *names[MAXA];
            int is_e[MAXA], is_o[MAXA], n = 0;
            int32_t tok[MAXA];
            names[n] = ref->name, is_e[n] = 0, is_o[n] = 1, tok[n] = y->token[i];
            n++;
            for (int a = 0; a < r->n_arms && n < MAXA; a++) {
                cmp_arm *arm = &r->arms[a];
                if (arm->is_ref || arm->is_custody) continue;
                cmp_row *row = scoring_row(arm, p, y->step_no[i]);
                if (!row) continue;
                names[n] = arm->name, is_e[n] = arm->is_test, is_o[n] = arm->is_oracle;
                tok[n] = row->token;
                n++;
            }
            int differ = 0, split = 0;
            for (int k = 1; k < n; k++) {
                if (tok[k] != tok[0]) differ = 1;
                if (is_o[k] && tok[k] != tok[0]) split = 1;
            }
            if (!differ) continue;
            if (split)
                for (int a = 0; a < r->n_arms; a++)
                    for (int l = 0; l < r->arms[a].n_legs; l++) {
                        cmp_row *row = find_row(&r->arms[a].legs[l], p, y->step_no[i]);
                        if (row) row->oracle_split = 1;
                    }
            if (r->n_contested == cap) {
                cap = cap ? 2 * cap : 16;
                r->contested = xrealloc(r->contested, sizeof *r->contested * (size_t)cap);
            }
            cmp_contested *c = &r->contested[r->n_contested++];
            c->prompt = p;
            c->step = y->step_no[i];
            c->oracle_split = split;
            char sentence[1024], tokens[2048];
            compare_sentence(n, names, is_e, is_o, tok, y->token[i], sentence, sizeof sentence);
            size_t k = 0;
            for (int j = 0; j < n && k < sizeof tokens; j++)
                k += (size_t)snprintf(tokens + k, sizeof tokens - k, "%s%s=%d", j ? " " : "",
                                      names[j], tok[j]);
            c->sentence = xstrdup(sentence);
            c->tokens = xstrdup(tokens);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* The oracle's noise band (noise.h, docs/verdicts.md)                 */

/* The root of an arm's variant_of chain (its own index when it has none). */
static int variant_root(const cmp_run *r, int a)
{
    for (int hops = 0; hops < 64; hops++) {
        char of[128];
        json_str(r->arms[a].config, NULL, "variant_of", of, sizeof of);
        int next = -1;
        for (int b = 0; of[0] && b < r->n_arms; b++)
            if (!strcmp(r->arms[b].name, of)) next = b;
        if (next < 0 || next == a) return a;
        a = next;
    }
    return a;
}

/* Index of `step` in lp (steps are ordered), or -1. */
static int lp_index(const cmp_lp *lp, int step)
{
    for (int i = 0; i < lp->n_steps; i++)
        if (lp->step_no[i] == step) return i;
    return -1;
}

int compare_lp_index(const cmp_lp *lp, int step)
{
    return lp_index(lp, step);
}

/* Marks the reference's variant family, records every step's band and
 * judges every non-EXACT compared row; under policy noise a row the rule
 * passes becomes WITHIN_NOISE. */
static int noise_pass(cmp_run *r, tg_err *e)
{
    cmp_arm *ref = &r->arms[r->ref];
    int root = variant_root(r, r->ref);
    int fam[64], n_fam = 0;
    for (int a = 0; a < r->n_arms && n_fam < 63; a++) {
        cmp_arm *arm = &r->arms[a];
        if (a == r->ref || !arm->is_oracle || arm->is_custody) continue;
        if (variant_root(r, a) != root) continue;
        arm->is_variant = 1;
        fam[n_fam++] = a;
    }
    r->n_variants = n_fam;
    if (n_fam == 0 || ref->n_legs == 0 || ref->legs[0].leg != 1) return 0;
    cmp_leg *rl = &ref->legs[0];
    int cap = 0;
    for (int p = 0; p < r->n_prompts; p++) {
        cmp_lp *y = &rl->lp[p];
        for (int i = 0; i < y->n_steps; i++) {
            int step = y->step_no[i];
            noise_view v[64];
            int owner[64], n = 0;
            v[n] = (noise_view){y->token[i], y->n_top[i], y->top[i]}, owner[n++] = r->ref;
            for (int f = 0; f < n_fam; f++) {
                cmp_arm *va = &r->arms[fam[f]];
                if (!scoring_row(va, p, step)) continue;
                cmp_lp *x = &va->legs[va->scoring].lp[p];
                int k = lp_index(x, step);
                if (k < 0) continue;
                v[n] = (noise_view){x->token[k], x->n_top[k], x->top[k]}, owner[n++] = fam[f];
            }
            if (n < 2) continue;
            noise_step ns;
            noise_band(v, n, &ns);
            if (r->n_bands == cap) {
                cap = cap ? 2 * cap : 64;
                r->bands = xrealloc(r->bands, sizeof *r->bands * (size_t)cap);
            }
            struct cmp_band *b = &r->bands[r->n_bands++];
            b->prompt = p, b->step = step, b->n_views = ns.n_views;
            b->ref_gap = ns.ref_gap, b->spread = ns.spread, b->n_tokens = ns.n_tokens;
            memcpy(b->tokens, ns.tokens, sizeof b->tokens);
            /* judge every arm leg's row at this step against the views
             * other than the arm's own */
            for (int a = 0; a < r->n_arms; a++) {
                cmp_arm *arm = &r->arms[a];
                if (a == r->ref || arm->is_custody) continue;
                noise_view w[64];
                int m = 0;
                for (int k = 0; k < n; k++)
                    if (owner[k] != a) w[m++] = v[k];
                for (int l = 0; l < arm->n_legs; l++) {
                    cmp_leg *g = &arm->legs[l];
                    cmp_row *row = find_row(g, p, step);
                    if (!row || row->cls == CMP_EXACT || row->cls == CMP_UNCOMPARABLE ||
                        row->cls == CMP_DEGENERATE)
                        continue;
                    int k = lp_index(&g->lp[p], step);
                    if (k < 0) continue;
                    row->noise = (int)noise_judge(w, m, row->token, g->lp[p].top[k], g->lp[p].n_top[k],
                                                  &row->noise_dev, &row->noise_band);
                    if (row->noise == NOISE_WITHIN && !strcmp(r->policy, "noise"))
                        row->cls = CMP_WITHIN_NOISE;
                    if (l == arm->scoring) {
                        arm->noise_within += row->noise == NOISE_WITHIN;
                        arm->noise_search += row->noise == NOISE_SEARCH;
                    }
                }
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Per arm x prompt facts                                              */

static void custody(cmp_arm_prompt *ap, const char *mine, const char *ref)
{
    if (!mine || !ref) {
        snprintf(ap->custody, sizeof ap->custody, "UNKNOWN");
        ap->custody_at = -1;
        return;
    }
    size_t i = 0;
    while (mine[i] && ref[i] && mine[i] == ref[i]) i++;
    if (!mine[i] && !ref[i])
        snprintf(ap->custody, sizeof ap->custody, "EXACT"), ap->custody_at = (int64_t)i;
    else if (!mine[i] || !ref[i])
        snprintf(ap->custody, sizeof ap->custody, "PREFIX"), ap->custody_at = (int64_t)i;
    else
        snprintf(ap->custody, sizeof ap->custody, "DIVERGE"), ap->custody_at = (int64_t)i;
}

static int arm_prompts(cmp_run *r, tg_err *e)
{
    cmp_arm *ref = &r->arms[r->ref];
    cmp_leg *rl = ref->n_legs && ref->legs[0].leg == 1 ? &ref->legs[0] : NULL;
    for (int a = 0; a < r->n_arms; a++) {
        cmp_arm *arm = &r->arms[a];
        arm->ap = xcalloc((size_t)r->n_prompts, sizeof *arm->ap);
        for (int p = 0; p < r->n_prompts; p++) {
            cmp_arm_prompt *ap = &arm->ap[p];
            ap->first_diff = ap->first_bad = -1;
            ap->not_planned = !compare_planned(arm, p);
            if (arm->scoring < 0 || ap->not_planned) continue;
            cmp_leg *g = &arm->legs[arm->scoring];
            cmp_lp *x = &g->lp[p];
            if (arm->is_custody) {
                custody(ap, x->text, rl ? rl->lp[p].text : NULL);
                continue;
            }
            if (rl && rl != g && x->ids && rl->lp[p].ids) {
                ap->tokenizer_known = 1;
                ap->tokenizer_diff = strcmp(x->ids, rl->lp[p].ids) != 0;
            }
            if (rl && x->n_steps < rl->lp[p].n_steps) ap->missing_steps = rl->lp[p].n_steps - x->n_steps;
            for (int i = 0; i < g->n_rows; i++) {
                cmp_row *row = &g->rows[i];
                if (row->prompt != p) continue;
                ap->count[row->cls]++;
                if (row->cls == CMP_UNCOMPARABLE) {
                    ap->n_uncomparable++;
                    continue;
                }
                ap->n_compared++;
                if (row->cls != CMP_EXACT && ap->first_diff < 0) ap->first_diff = i;
                if (!compare_class_ok(row->cls, r->policy) && ap->first_bad < 0) ap->first_bad = i;
                if (isfinite(row->kl)) ap->kl_sum += row->kl, ap->kl_n++;
                int rk = row->rank > 64 ? 65 : row->rank;
                arm->rank_hist[rk]++;
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* ORACLE_REPRO                                                        */

static int oracle_repro(sqlite3 *db, cmp_run *r, tg_err *e)
{
    sqlite3_stmt *s = NULL, *t = NULL;
    int rc = -1;
    /* the latest earlier run of the spec on the artifact whose arm of the
     * same name ran the same binary in its leg 1 */
    if (sqlite3_prepare_v2(db,
                           "SELECT run.id, leg.id FROM run"
                           " JOIN spec ON spec.id = run.spec_id"
                           " JOIN artifact ON artifact.id = run.artifact_id"
                           " JOIN arm ON arm.run_id = run.id AND arm.name = ?3"
                           " JOIN leg ON leg.arm_id = arm.id AND leg.leg = 1"
                           " JOIN binary ON binary.id = leg.binary_id"
                           " WHERE spec.name = ?1 AND artifact.sha256 = ?2 AND binary.sha256 = ?4"
                           " AND run.id < ?5 ORDER BY run.id DESC LIMIT 1",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "SELECT step.step, step.token FROM step"
                           " JOIN prompt ON prompt.id = step.prompt_id"
                           " WHERE step.leg_id = ?1 AND prompt.name = ?2 AND prompt.text = ?3"
                           " ORDER BY step.step",
                           -1, &t, NULL) != SQLITE_OK) {
        common_sql_err(db, e, "preparing ORACLE_REPRO queries");
        goto out;
    }
    for (int a = 0; a < r->n_arms; a++) {
        cmp_arm *arm = &r->arms[a];
        if (!arm->is_oracle) continue;
        if (arm->n_legs == 0 || arm->legs[0].leg != 1 || !arm->legs[0].binary_sha256) {
            snprintf(arm->oracle_repro, sizeof arm->oracle_repro, "FIRST");
            snprintf(arm->repro_why, sizeof arm->repro_why, "no leg 1 with a binary sha256");
            continue;
        }
        cmp_leg *g = &arm->legs[0];
        sqlite3_reset(s);
        sqlite3_bind_text(s, 1, r->spec_name, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, r->artifact_sha256, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, arm->name, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, g->binary_sha256, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 5, r->run_id);
        int st = sqlite3_step(s);
        if (st == SQLITE_DONE) {
            snprintf(arm->oracle_repro, sizeof arm->oracle_repro, "FIRST");
            snprintf(arm->repro_why, sizeof arm->repro_why,
                     "no earlier run of %s on this artifact with this %s binary", r->spec_name,
                     arm->name);
            continue;
        }
        if (st != SQLITE_ROW) {
            common_sql_err(db, e, "ORACLE_REPRO lookup");
            goto out;
        }
        arm->repro_run = sqlite3_column_int64(s, 0);
        int64_t prev_leg = sqlite3_column_int64(s, 1);
        sqlite3_reset(s);
        int same = 1, compared = 0;
        for (int p = 0; p < r->n_prompts && same; p++) {
            cmp_lp *x = &g->lp[p];
            sqlite3_reset(t);
            sqlite3_bind_int64(t, 1, prev_leg);
            sqlite3_bind_text(t, 2, r->prompts[p].name, -1, SQLITE_STATIC);
            sqlite3_bind_text(t, 3, r->prompts[p].text, -1, SQLITE_STATIC);
            int i = 0, st2;
            while ((st2 = sqlite3_step(t)) == SQLITE_ROW) {
                int step = sqlite3_column_int(t, 0);
                int32_t tok = sqlite3_column_int(t, 1);
                if (i >= x->n_steps || x->step_no[i] != step || x->token[i] != tok) {
                    snprintf(arm->repro_why, sizeof arm->repro_why,
                             "prompt %s step %d: run %lld said %d, this run %d", r->prompts[p].name,
                             step, (long long)arm->repro_run, tok,
                             i < x->n_steps ? x->token[i] : -1);
                    same = 0;
                    break;
                }
                i++, compared++;
            }
            if (st2 != SQLITE_ROW && st2 != SQLITE_DONE) {
                common_sql_err(db, e, "ORACLE_REPRO steps");
                goto out;
            }
            if (same && i > 0 && i != x->n_steps) {
                snprintf(arm->repro_why, sizeof arm->repro_why,
                         "prompt %s: run %lld has %d steps, this run %d", r->prompts[p].name,
                         (long long)arm->repro_run, i, x->n_steps);
                same = 0;
            }
        }
        if (same && compared == 0) {
            snprintf(arm->oracle_repro, sizeof arm->oracle_repro, "FIRST");
            snprintf(arm->repro_why, sizeof arm->repro_why, "run %lld shares no prompt",
                     (long long)arm->repro_run);
            arm->repro_run = 0;
            continue;
        }
        snprintf(arm->oracle_repro, sizeof arm->oracle_repro, "%s", same ? "YES" : "NO");
        if (same)
            snprintf(arm->repro_why, sizeof arm->repro_why, "%d steps equal to run %lld", compared,
                     (long long)arm->repro_run);
    }
    rc = 0;
out:
    sqlite3_finalize(s);
    sqlite3_finalize(t);
    return rc;
}

/* ------------------------------------------------------------------ */

int compare_run(tg_store *st, int64_t run_id, const char *policy, double band, cmp_run **out,
                tg_err *e)
{
    *out = NULL;
    sqlite3 *db = store_db(st);
    cmp_run *r = xcalloc(1, sizeof *r);
    r->run_id = run_id;
    snprintf(r->policy, sizeof r->policy, "%s", policy);
    r->band = band;
    r->ref = -1;
    /* one read transaction: a consistent snapshot of the run */
    sqlite3_exec(db, "SAVEPOINT compare_read", NULL, NULL, NULL);
    if (load_run(db, r, e) < 0 || load_prompts(db, r, e) < 0 || load_arms(db, r, e) < 0 ||
        load_legs(db, r, e) < 0)
        goto fail;
    if (r->n_arms > 63) {
        tg_errf(e, "run %lld: %d arms, at most 63 supported", (long long)run_id, r->n_arms);
        goto fail;
    }
    judge_legs(r);
    for (int a = 0; a < r->n_arms; a++) {
        cmp_arm *arm = &r->arms[a];
        if (arm->is_custody) continue;
        for (int l = 0; l < arm->n_legs; l++)
            if (compare_leg(r, arm, &arm->legs[l], e) < 0) goto fail;
    }
    if (noise_pass(r, e) < 0 || calibrate_steps(db, r, e) < 0 || contest(r, e) < 0 ||
        arm_prompts(r, e) < 0 || calibrate_arms(r, e) < 0 || oracle_repro(db, r, e) < 0)
        goto fail;
    sqlite3_exec(db, "RELEASE compare_read", NULL, NULL, NULL);
    *out = r;
    return 0;
fail:
    sqlite3_exec(db, "ROLLBACK TO compare_read; RELEASE compare_read", NULL, NULL, NULL);
    compare_free(r);
    return -1;
}
