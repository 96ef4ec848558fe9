/*
 * calibrate.c: the calibration panel, the calibrated bands and control
 * limits, and the exact arbiter (calibrate.h). docs/verdicts.md
 * ("Calibration", "The exact arbiter") states the rules; this file is their
 * only implementation. It reads compare.c's facts (cmp_run) and the run's
 * calibration parameters from the store, adds its own facts in r->cal and
 * reclassifies rows under the policies calibrated and error-budget.
 */
#include "calibrate.h"

#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "noise.h"

static const char *const METRIC_NAMES[CAL_N_METRICS] = {"KL_MEAN", "DIVERGENCE_RATE", "EXACT_ERR", "EXACT_KL"};

const char *calibrate_metric_name(int metric)
{
    return tg_name_at(METRIC_NAMES, CAL_N_METRICS, metric);
}

void calibrate_free(cal_run *c)
{
    if (!c) return;
    free(c->steps);
    for (int a = 0; c->arms && a < c->n_arms; a++) free(c->arms[a].st);
    free(c->arms);
    free(c);
}

/* ------------------------------------------------------------------ */
/* Parameters                                                          */

int calibrate_put_params(tg_store *st, int64_t run_id, const tg_spec *s, tg_err *e)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *q = NULL;
    q = common_sql_prepare(db,
                           "INSERT OR REPLACE INTO run_calibration(run_id, exact, factor, limit_k, budget,"
                           " cal_from) VALUES(?1,?2,?3,?4,?5,?6)",
                           "Itdddt", run_id, s->exact, s->cal_factor, s->cal_limit_k, s->cal_budget, s->cal_from);
    if (!q)
        return common_sql_err(db, e, "writing the calibration parameters");
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? 0 : common_sql_err(db, e, "writing the calibration parameters");
}

/* Reads the run's parameters into c (defaults when the run has none). */
static int load_params(sqlite3 *db, int64_t run_id, cal_run *c, tg_err *e)
{
    c->factor = 2.0, c->limit_k = 3.0, c->budget = 2.0;
    sqlite3_stmt *q = NULL;
    q = common_sql_prepare(db,
                           "SELECT exact, factor, limit_k, budget, cal_from FROM run_calibration"
                           " WHERE run_id=?1",
                           "I", run_id);
    if (!q)
        return common_sql_err(db, e, "reading the calibration parameters");
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        const unsigned char *x = sqlite3_column_text(q, 0), *f = sqlite3_column_text(q, 4);
        if (x) snprintf(c->exact_name, sizeof c->exact_name, "%s", (const char *)x);
        c->factor = sqlite3_column_double(q, 1);
        c->limit_k = sqlite3_column_double(q, 2);
        c->budget = sqlite3_column_double(q, 3);
        if (f) snprintf(c->from, sizeof c->from, "%s", (const char *)f);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return common_sql_err(db, e, "reading the calibration parameters");
    return 0;
}

/* ------------------------------------------------------------------ */
/* Panel and families                                                  */

static void config_str(const char *config, const char *key, char *out, size_t cap)
{
    out[0] = 0;
    json_error_t je;
    json_t *root = config ? json_loads(config, 0, &je) : NULL;
    json_t *v = root ? json_object_get(root, key) : NULL;
    if (json_is_string(v)) snprintf(out, cap, "%s", json_string_value(v));
    json_decref(root);
}

static int arm_index(const cmp_run *r, const char *name)
{
    for (int a = 0; name && name[0] && a < r->n_arms; a++)
        if (!strcmp(r->arms[a].name, name)) return a;
    return -1;
}

/* The root of arm a's variant_of chain (a itself when it has none). */
static int family_of(const cmp_run *r, int a)
{
    for (int hops = 0; hops < 64; hops++) {
        char of[128];
        config_str(r->arms[a].config, "variant_of", of, sizeof of);
        int next = arm_index(r, of);
        if (next < 0 || next == a) return a;
        a = next;
    }
    return a;
}

/* ------------------------------------------------------------------ */
/* Views                                                               */

typedef struct view {
    int arm;
    int32_t token;
    int n_top;
    const tg_top *top;
} view;

/* Arm a's view of (prompt p, step): the reference's leg 1, else its
 * scoring leg where the step is comparable and the prompt planned.
 * Returns 1 with *v, else 0. */
static int arm_view(cmp_run *r, int a, int p, int step, view *v)
{
    cmp_arm *arm = &r->arms[a];
    const cmp_lp *lp = NULL;
    if (a == r->ref) {
        if (arm->n_legs == 0 || arm->legs[0].leg != 1) return 0;
        lp = &arm->legs[0].lp[p];
    } else {
        if (!compare_planned(arm, p) || !compare_scoring_row(arm, p, step)) return 0;
        lp = &arm->legs[arm->scoring].lp[p];
    }
    int k = compare_lp_index(lp, step);
    if (k < 0 || lp->n_top[k] < 1) return 0;
    *v = (view){a, lp->token[k], lp->n_top[k], lp->top[k]};
    return 1;
}

/* The margin of r over t in view v (NaN when either is absent). */
static double margin(const view *v, int32_t r, int32_t t)
{
    return noise_logit(v->top, v->n_top, r) - noise_logit(v->top, v->n_top, t);
}

/* 1 when arm b may not vouch for arm `judged`: b is judged itself, or
 * judged is an arm under test (role test) and b is of its family (they
 * share the code under test, so a defect of that code would widen its own
 * band). An oracle (not under test) is judged by every view but its own. */
static int excluded(const cmp_run *r, const cal_run *c, int judged, int b)
{
    return b == judged || (r->arms[judged].is_test && c->arms[b].family == c->arms[judged].family);
}

/* Spread (max - min) of the margin of r over t across the views vs[0..n-1]
 * that `judged` may use: the reference always, the others unless excluded()
 * (judged < 0: every view). NaN with fewer than two. */
static double spread_for(const cmp_run *r, const cal_run *c, const view *vs, int n, int judged,
                         int32_t rt, int32_t t)
{
    double lo = INFINITY, hi = -INFINITY;
    int k = 0;
    for (int i = 0; i < n; i++) {
        int a = vs[i].arm;
        if (judged >= 0 && a != r->ref && excluded(r, c, judged, a)) continue;
        double d = margin(&vs[i], rt, t);
        if (!isfinite(d)) continue;
        lo = d < lo ? d : lo, hi = d > hi ? d : hi, k++;
    }
    return k >= 2 ? hi - lo : NAN;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Distance of view a from the exact view x over the ids both top-k lists
 * hold: max and median |logit difference|, and KL(x || a) over x's top-k
 * (an id missing from a's list takes a's lowest logit, an upper bound).
 * Returns the number of shared ids. */
static int distance(const view *x, const view *a, double *mx, double *med, double *kl)
{
    double d[512];
    int n = 0;
    for (int i = 0; i < x->n_top && n < 512; i++) {
        double l = noise_logit(a->top, a->n_top, x->top[i].id);
        if (isfinite(l) && isfinite(x->top[i].logit)) d[n++] = fabs(l - x->top[i].logit);
    }
    *mx = *med = *kl = NAN;
    if (n == 0) return 0;
    qsort(d, (size_t)n, sizeof *d, cmp_double);
    *mx = d[n - 1];
    *med = n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2]);
    double pm = -INFINITY, qm = -INFINITY, q[512];
    int m = x->n_top < 512 ? x->n_top : 512;
    double floor_l = a->top[a->n_top - 1].logit;
    for (int i = 0; i < m; i++) {
        double l = noise_logit(a->top, a->n_top, x->top[i].id);
        q[i] = isfinite(l) ? l : floor_l;
        if (x->top[i].logit > pm) pm = x->top[i].logit;
        if (q[i] > qm) qm = q[i];
    }
    double ps = 0, qs = 0;
    for (int i = 0; i < m; i++) ps += exp(x->top[i].logit - pm), qs += exp(q[i] - qm);
    double k = 0;
    for (int i = 0; i < m; i++) {
        double lp = x->top[i].logit - pm - log(ps), lq = q[i] - qm - log(qs);
        k += exp(lp) * (lp - lq);
    }
    *kl = k < 0 ? 0 : k;
    return n;
}

/* ------------------------------------------------------------------ */
/* A calibration stored by an earlier run (calibration.from)           */

typedef struct stored_cal {
    int64_t run;
    int n;
    char (*prompt)[64];
    int *step;
    double *spread;
    int have_metric[CAL_N_METRICS];
    double mean[CAL_N_METRICS], sd[CAL_N_METRICS];
    int count[CAL_N_METRICS];
    char basis[CAL_N_METRICS][256];
} stored_cal;

static void stored_free(stored_cal *s)
{
    free(s->prompt), free(s->step), free(s->spread);
    memset(s, 0, sizeof *s);
}

/* Loads the latest calibration set of spec `from` on this run's artifact
 * whose prompts of the same name have the same text. Returns 1 found, 0
 * none, -1 with e. */
static int stored_load(sqlite3 *db, const cmp_run *r, const char *from, stored_cal *out, tg_err *e)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *q = NULL;
    q = common_sql_prepare(db,
                           "SELECT c.run_id, c.set_no FROM calib_set c JOIN run ON run.id = c.run_id"
                           " JOIN spec ON spec.id = run.spec_id JOIN artifact ON artifact.id = run.artifact_id"
                           " WHERE spec.name = ?1 AND artifact.sha256 = ?2 AND c.run_id <> ?3"
                           " AND c.panel <> '' ORDER BY c.run_id DESC, c.set_no DESC LIMIT 1",
                           "ttI", from, r->artifact_sha256 ? r->artifact_sha256 : "", r->run_id);
    if (!q)
        return common_sql_err(db, e, "looking up a stored calibration");
    int rc = sqlite3_step(q);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(q);
        return rc == SQLITE_DONE ? 0 : common_sql_err(db, e, "looking up a stored calibration");
    }
    int64_t run = sqlite3_column_int64(q, 0);
    int set = sqlite3_column_int(q, 1);
    sqlite3_finalize(q);
    out->run = run;
    q = common_sql_prepare(db,
                           "SELECT s.prompt, s.step, s.spread, p.text FROM calib_step s"
                           " JOIN prompt p ON p.run_id = s.run_id AND p.name = s.prompt"
                           " WHERE s.run_id = ?1 AND s.set_no = ?2 ORDER BY p.no, s.step",
                           "Ii", run, set);
    if (!q)
        return common_sql_err(db, e, "reading a stored calibration");
    int cap = 0;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *pn = (const char *)sqlite3_column_text(q, 0), *text = (const char *)sqlite3_column_text(q, 3);
        int same = 0;
        for (int p = 0; pn && text && p < r->n_prompts; p++)
            same |= !strcmp(r->prompts[p].name, pn) && r->prompts[p].text && !strcmp(r->prompts[p].text, text);
        if (!same) continue;
        if (out->n == cap) {
            cap = cap ? 2 * cap : 256;
            void *a = realloc(out->prompt, sizeof *out->prompt * (size_t)cap);
            void *b = a ? realloc(out->step, sizeof *out->step * (size_t)cap) : NULL;
            if (a) out->prompt = a;
            if (b) out->step = b;
            void *c = b ? realloc(out->spread, sizeof *out->spread * (size_t)cap) : NULL;
            if (c) out->spread = c;
            if (!a || !b || !c) {
                sqlite3_finalize(q);
                stored_free(out);
                return tg_errf(e, "out of memory");
            }
        }
        snprintf(out->prompt[out->n], sizeof out->prompt[0], "%s", pn);
        out->step[out->n] = sqlite3_column_int(q, 1);
        out->spread[out->n] = sqlite3_column_type(q, 2) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 2);
        out->n++;
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) {
        stored_free(out);
        return common_sql_err(db, e, "reading a stored calibration");
    }
    if (sqlite3_prepare_v2(db,
                           "SELECT metric, n, mean, sd, basis FROM calib_limit"
                           " WHERE run_id = ?1 AND set_no = ?2 AND arm = '*'",
                           -1, &q, NULL) != SQLITE_OK) {
        stored_free(out);
        return common_sql_err(db, e, "reading a stored calibration");
    }
    sqlite3_bind_int64(q, 1, run);
    sqlite3_bind_int(q, 2, set);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(q, 0);
        for (int k = 0; m && k < CAL_N_METRICS; k++)
            if (!strcmp(m, METRIC_NAMES[k]) && sqlite3_column_type(q, 2) != SQLITE_NULL) {
                out->have_metric[k] = 1;
                out->count[k] = sqlite3_column_int(q, 1);
                out->mean[k] = sqlite3_column_double(q, 2);
                out->sd[k] = sqlite3_column_double(q, 3);
                const unsigned char *b = sqlite3_column_text(q, 4);
                snprintf(out->basis[k], sizeof out->basis[k], "run %lld: %s", (long long)run,
                         b ? (const char *)b : "");
            }
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) {
        stored_free(out);
        return common_sql_err(db, e, "reading a stored calibration");
    }
    return 1;
}

static double stored_spread(const stored_cal *s, const char *prompt, int step)
{
    for (int i = 0; i < s->n; i++)
        if (s->step[i] == step && !strcmp(s->prompt[i], prompt)) return s->spread[i];
    return NAN;
}

/* ------------------------------------------------------------------ */
/* Steps                                                               */

/* Index into c->steps of (prompt p, step), or -1. */
static int step_index(const cal_run *c, int p, int step)
{
    int lo = 0, hi = c->n_steps;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        const cal_step *m = &c->steps[mid];
        if (m->prompt < p || (m->prompt == p && m->step < step)) lo = mid + 1;
        else hi = mid;
    }
    return lo < c->n_steps && c->steps[lo].prompt == p && c->steps[lo].step == step ? lo : -1;
}

/* The views of (prompt p, step): the reference, the panel and the exact
 * arm. Returns their count. */
static int step_views(cmp_run *r, const cal_run *c, int p, int step, view *vs, int cap)
{
    int n = 0;
    for (int a = 0; a < r->n_arms && n < cap; a++) {
        if (a != r->ref && !c->arms[a].panel && a != c->exact) continue;
        if (arm_view(r, a, p, step, &vs[n])) n++;
    }
    return n;
}

/* The exact arbiter's rule for a differing step (docs/verdicts.md, "Error
 * budget"): 1 when exact arithmetic's own margin between the reference's
 * token and the arm's is at most budget x the reference's max |logit
 * difference| from exact arithmetic at this step (a build as far from exact
 * as the reference could flip it), 0 when larger, -1 without an exact arm
 * or its view of the step. */
static int exact_tolerates(cmp_run *r, const cal_run *c, const cmp_row *row, const tg_top *rt, int j)
{
    if (c->exact < 0) return -1;
    view x;
    double eref = c->arms[r->ref].st[j].ex_max;
    if (!arm_view(r, c->exact, row->prompt, row->step, &x) || !isfinite(eref)) return -1;
    double lr = noise_logit(x.top, x.n_top, rt[0].id), lt = noise_logit(x.top, x.n_top, row->token);
    if (!isfinite(lt)) lt = x.top[x.n_top - 1].logit; /* an upper bound of its logit */
    if (!isfinite(lr)) return -1;
    return lr - lt <= c->budget * eref;
}

/* Reclassifies row (of an arm leg compared with reference leg rl) under
 * the policy: NEAR_TIE when tolerated, else RANK2 / TOPK by rank. */
static void reclassify(cmp_run *r, cal_run *c, int a, cmp_row *row, const cmp_lp *rlp, const view *vs,
                       int nv, const stored_cal *sc, int j)
{
    if (row->cls != CMP_NEAR_TIE && row->cls != CMP_RANK2 && row->cls != CMP_TOPK) return;
    int k = compare_lp_index(rlp, row->step);
    if (k < 0 || row->rank < 2 || row->rank > rlp->n_top[k]) return;
    const tg_top *rt = rlp->top[k];
    double m = (double)rt[0].logit - (double)rt[row->rank - 1].logit;
    int tolerated = -1; /* -1: no rule applies, keep the spec band's class */
    if (!strcmp(r->policy, "calibrated")) {
        double sp = sc && sc->run ? stored_spread(sc, r->prompts[row->prompt].name, row->step)
                                  : spread_for(r, c, vs, nv, a, rt[0].id, row->token);
        if (isfinite(sp)) tolerated = m < c->factor * sp;
        /* the panel's spread is a floor-less estimate: where its views
         * stray together (one code base, a machine whose builds coincide)
         * it can be far below the rounding the reference itself shows at
         * this step, so the exact arbiter's rule also tolerates */
        if (tolerated != 1 && exact_tolerates(r, c, row, rt, j) == 1) tolerated = 1;
    } else if (!strcmp(r->policy, "error-budget")) {
        tolerated = exact_tolerates(r, c, row, rt, j);
    }
    if (tolerated < 0) return;
    row->cls = tolerated ? CMP_NEAR_TIE : row->rank == 2 ? CMP_RANK2 : CMP_TOPK;
}

/* The reference leg rows of leg number `leg` were compared with. */
static const cmp_leg *ref_leg(const cmp_run *r, int leg)
{
    const cmp_arm *ref = &r->arms[r->ref];
    for (int l = 0; l < ref->n_legs; l++)
        if (ref->legs[l].leg == leg) return &ref->legs[l];
    return NULL;
}

int calibrate_steps(sqlite3 *db, cmp_run *r, tg_err *e)
{
    cal_run *c = calloc(1, sizeof *c);
    if (!c) return tg_errf(e, "out of memory");
    stored_cal sc;
    memset(&sc, 0, sizeof sc);
    int ret = -1;
    if (load_params(db, r->run_id, c, e) < 0) goto out;
    c->exact = arm_index(r, c->exact_name);
    c->arms = calloc((size_t)r->n_arms, sizeof *c->arms);
    if (!c->arms) {
        tg_errf(e, "out of memory");
        goto out;
    }
    c->n_arms = r->n_arms;
    for (int a = 0; a < r->n_arms; a++) c->arms[a].family = family_of(r, a);
    for (int a = 0; a < r->n_arms; a++) {
        if (r->arms[a].is_custody) continue;
        char of[128];
        config_str(r->arms[a].config, "variant_of", of, sizeof of);
        int b = arm_index(r, of);
        if (b < 0 || r->arms[b].is_custody) continue;
        c->arms[a].panel = c->arms[b].panel = 1;
    }
    size_t k = 0;
    for (int a = 0; a < r->n_arms; a++)
        if (c->arms[a].panel) {
            c->n_panel++;
            k += (size_t)snprintf(c->panel + k, k < sizeof c->panel ? sizeof c->panel - k : 0, "%s%s",
                                  k ? ", " : "", r->arms[a].name);
            if (k >= sizeof c->panel) k = sizeof c->panel - 1;
        }
    if (c->from[0]) {
        int got = stored_load(db, r, c->from, &sc, e);
        if (got < 0) goto out;
    }
    int calibrating = !strcmp(r->policy, "calibrated") || !strcmp(r->policy, "error-budget");
    if (c->n_panel == 0 && c->exact < 0 && !sc.run && !calibrating) {
        ret = 0; /* nothing to calibrate with: r->cal stays NULL */
        goto out;
    }
    c->from_run = sc.run;
    for (int m = 0; sc.run && m < CAL_N_METRICS; m++) {
        c->stored[m].known = sc.have_metric[m] && sc.count[m] >= 2;
        c->stored[m].n = sc.count[m];
        c->stored[m].mean = sc.mean[m];
        c->stored[m].sd = sc.sd[m];
        snprintf(c->stored[m].basis, sizeof c->stored[m].basis, "%s", sc.basis[m]);
    }
    /* the reference's leg-1 steps */
    cmp_arm *ref = &r->arms[r->ref];
    const cmp_leg *rl = ref->n_legs && ref->legs[0].leg == 1 ? &ref->legs[0] : NULL;
    int total = 0;
    for (int p = 0; rl && p < r->n_prompts; p++) total += rl->lp[p].n_steps;
    c->steps = calloc((size_t)(total ? total : 1), sizeof *c->steps);
    for (int a = 0; c->steps && a < r->n_arms; a++) {
        c->arms[a].st = calloc((size_t)(total ? total : 1), sizeof *c->arms[a].st);
        if (!c->arms[a].st) break;
    }
    for (int a = 0; a < r->n_arms; a++)
        if (!c->steps || !c->arms[a].st) {
            tg_errf(e, "out of memory");
            goto out;
        }
    enum { MAXV = 64 };
    view vs[MAXV];
    for (int p = 0; rl && p < r->n_prompts; p++) {
        const cmp_lp *y = &rl->lp[p];
        for (int i = 0; i < y->n_steps; i++) {
            int j = c->n_steps++;
            cal_step *s = &c->steps[j];
            s->prompt = p, s->step = y->step_no[i];
            s->ref_gap = s->spread = s->band = s->exact_gap = NAN;
            s->exact_token = -1;
            for (int a = 0; a < r->n_arms; a++) {
                cal_arm_step *as = &c->arms[a].st[j];
                as->band = as->ex_max = as->ex_med = as->ex_kl = NAN;
            }
            if (y->n_top[i] < 2) continue;
            int32_t rt = y->top[i][0].id, r2 = y->top[i][1].id;
            s->ref_gap = (double)y->top[i][0].logit - (double)y->top[i][1].logit;
            int nv = step_views(r, c, p, s->step, vs, MAXV);
            s->n_views = nv;
            s->spread = sc.run ? stored_spread(&sc, r->prompts[p].name, s->step)
                               : spread_for(r, c, vs, nv, -1, rt, r2);
            s->band = c->factor * s->spread;
            size_t fk = 0;
            for (int v = 0; v < nv; v++)
                if (vs[v].token != y->token[i]) {
                    s->fragile = 1;
                    fk += (size_t)snprintf(s->flipped_by + fk, fk < sizeof s->flipped_by ? sizeof s->flipped_by - fk : 0,
                                           "%s%s", fk ? ", " : "", r->arms[vs[v].arm].name);
                    if (fk >= sizeof s->flipped_by) fk = sizeof s->flipped_by - 1;
                }
            view x;
            int have_x = c->exact >= 0 && arm_view(r, c->exact, p, s->step, &x);
            if (have_x) s->exact_token = x.token, s->exact_gap = margin(&x, rt, r2);
            for (int a = 0; a < r->n_arms; a++) {
                if (r->arms[a].is_custody) continue;
                cal_arm_step *as = &c->arms[a].st[j];
                if (a != r->ref)
                    as->band = sc.run ? c->factor * s->spread : c->factor * spread_for(r, c, vs, nv, a, rt, r2);
                view av;
                if (have_x && a != c->exact && arm_view(r, a, p, s->step, &av))
                    as->n_shared = distance(&x, &av, &as->ex_max, &as->ex_med, &as->ex_kl);
            }
        }
    }
    /* the arms' means of the distance from exact arithmetic */
    for (int a = 0; a < r->n_arms; a++) {
        cal_arm *ca = &c->arms[a];
        double s1 = 0, s2 = 0, s3 = 0;
        for (int j = 0; j < c->n_steps; j++)
            if (ca->st[j].n_shared > 0)
                s1 += ca->st[j].ex_med, s2 += ca->st[j].ex_max, s3 += ca->st[j].ex_kl, ca->n_exact++;
        ca->exact_err = ca->n_exact ? s1 / ca->n_exact : NAN;
        ca->exact_max = ca->n_exact ? s2 / ca->n_exact : NAN;
        ca->exact_kl = ca->n_exact ? s3 / ca->n_exact : NAN;
    }
    /* reclassify every leg's rows under the policy */
    if (calibrating) {
        for (int a = 0; a < r->n_arms; a++) {
            cmp_arm *arm = &r->arms[a];
            if (a == r->ref || arm->is_custody) continue;
            for (int l = 0; l < arm->n_legs; l++) {
                cmp_leg *g = &arm->legs[l];
                int last_p = -1, last_step = -1, nv = 0;
                for (int i = 0; i < g->n_rows; i++) {
                    cmp_row *row = &g->rows[i];
                    if (row->cls == CMP_EXACT || row->cls == CMP_UNCOMPARABLE) continue;
                    const cmp_leg *rg = ref_leg(r, row->ref_leg);
                    int j = step_index(c, row->prompt, row->step);
                    if (!rg || j < 0) continue;
                    if (row->prompt != last_p || row->step != last_step) {
                        nv = step_views(r, c, row->prompt, row->step, vs, MAXV);
                        last_p = row->prompt, last_step = row->step;
                    }
                    reclassify(r, c, a, row, &rg->lp[row->prompt], vs, nv, &sc, j);
                }
            }
        }
    }
    r->cal = c;
    c = NULL;
    ret = 0;
out:
    stored_free(&sc);
    calibrate_free(c);
    return ret;
}

/* ------------------------------------------------------------------ */
/* Arms: control limits, budget, sentences                            */

/* Per-step values of a mean-type metric (KL_MEAN: the compare row's KL;
 * EXACT_ERR, EXACT_KL: the step's distance from exact arithmetic) of arm a
 * over the prompts `mask` selects, into v[c->n_steps] (NaN where none). */
static void metric_series(const cmp_run *r, const cal_run *c, int a, int m, const int *mask, double *v)
{
    const cmp_arm *arm = &r->arms[a];
    for (int j = 0; j < c->n_steps; j++) v[j] = NAN;
    if (m == CAL_EXACT || m == CAL_EXACT_KL) {
        const cal_arm *ca = &c->arms[a];
        for (int j = 0; j < c->n_steps; j++)
            if (ca->st[j].n_shared > 0 && mask[c->steps[j].prompt])
                v[j] = m == CAL_EXACT ? ca->st[j].ex_med : ca->st[j].ex_kl;
        return;
    }
    if (m != CAL_KL || a == r->ref || arm->scoring < 0) return;
    const cmp_leg *g = &arm->legs[arm->scoring];
    for (int i = 0; i < g->n_rows; i++) {
        const cmp_row *row = &g->rows[i];
        if (row->cls == CMP_UNCOMPARABLE || !isfinite(row->kl) || !mask[row->prompt]) continue;
        int j = step_index(c, row->prompt, row->step);
        if (j >= 0) v[j] = row->kl;
    }
}

/* The arm's value of a metric on its scoring leg over the prompts `mask`
 * selects (NaN when unknown); *steps receives the number of steps. buf
 * holds c->n_steps doubles (scratch). */
static double metric_value(const cmp_run *r, const cal_run *c, int a, int m, const int *mask, int *steps,
                           double *buf)
{
    const cmp_arm *arm = &r->arms[a];
    *steps = 0;
    if (m != CAL_DIV) {
        metric_series(r, c, a, m, mask, buf);
        double s = 0;
        int n = 0;
        for (int j = 0; j < c->n_steps; j++)
            if (isfinite(buf[j])) s += buf[j], n++;
        *steps = n;
        return n ? s / n : NAN;
    }
    if (a == r->ref || arm->scoring < 0) return NAN;
    int n = 0, k = 0;
    for (int p = 0; p < r->n_prompts; p++) {
        if (!mask[p]) continue;
        n += arm->ap[p].n_compared, k += arm->ap[p].n_compared - arm->ap[p].count[CMP_EXACT];
    }
    *steps = n;
    return n ? (double)k / n : NAN;
}

/* Fills lim with the panel's statistics for arm `judged` (-1: the whole
 * panel, stored for later runs) on metric m over the prompts of mask: the
 * panel members excluded() does not leave out (and the exact arm and the
 * reference where the metric applies to them) that run every prompt of
 * mask, byte-identical values counted once. lim->sd is the larger of the
 * values' standard deviation and, for the mean-type metrics, the paired
 * one: legitimate builds differ from step to step about as independent
 * draws, so sqrt(mean over pairs of var(step differences) / 2N) estimates
 * how far one build's mean strays, from every step of every pair. */
static void panel_limit(const cmp_run *r, const cal_run *c, int judged, int m, const int *mask, cal_limit *lim)
{
    double v[64];
    int who[64], n = 0;
    size_t k = 0;
    lim->basis[0] = 0;
    lim->mean = lim->sd = lim->upper = NAN;
    if (c->from_run) {
        lim->n = c->stored[m].n;
        lim->mean = c->stored[m].mean, lim->sd = c->stored[m].sd;
        lim->known = c->stored[m].known;
        snprintf(lim->basis, sizeof lim->basis, "%s", c->stored[m].basis);
        return;
    }
    size_t ns = (size_t)c->n_steps + 1;
    double *buf = malloc(ns * sizeof *buf), *sa = malloc(ns * sizeof *sa), *sb = malloc(ns * sizeof *sb);
    if (!buf || !sa || !sb) goto out; /* out of memory: no limit */
    for (int b = 0; b < r->n_arms && n < 64; b++) {
        if (r->arms[b].is_custody || b == judged) continue;
        if (!c->arms[b].panel && b != c->exact && b != r->ref) continue;
        if (judged >= 0 && excluded(r, c, judged, b)) continue;
        int runs_all = 1, steps;
        for (int p = 0; p < r->n_prompts; p++) runs_all &= !mask[p] || compare_planned(&r->arms[b], p);
        if (!runs_all) continue;
        double x = metric_value(r, c, b, m, mask, &steps, buf);
        if (!isfinite(x) || ((m == CAL_EXACT || m == CAL_EXACT_KL) && b == c->exact)) continue;
        /* byte-identical builds (threads, batch sizes) give the same value:
         * one sample, not several */
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= v[i] == x;
        if (dup) continue;
        who[n] = b;
        v[n++] = x;
        k += (size_t)snprintf(lim->basis + k, k < sizeof lim->basis ? sizeof lim->basis - k : 0, "%s%s",
                              k ? ", " : "", r->arms[b].name);
        if (k >= sizeof lim->basis) k = sizeof lim->basis - 1;
    }
    lim->n = n;
    if (n < 2) goto out;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += v[i];
    lim->mean = s / n;
    for (int i = 0; i < n; i++) s2 += (v[i] - lim->mean) * (v[i] - lim->mean);
    lim->sd = sqrt(s2 / (n - 1));
    if (m != CAL_DIV) {
        double acc = 0;
        int pairs = 0;
        for (int i = 0; i < n; i++)
            for (int i2 = i + 1; i2 < n; i2++) {
                metric_series(r, c, who[i], m, mask, sa);
                metric_series(r, c, who[i2], m, mask, sb);
                double d1 = 0, d2 = 0;
                int nd = 0;
                for (int j = 0; j < c->n_steps; j++)
                    if (isfinite(sa[j]) && isfinite(sb[j])) d1 += sa[j] - sb[j], d2 += (sa[j] - sb[j]) * (sa[j] - sb[j]), nd++;
                if (nd < 2) continue;
                double var = (d2 - d1 * d1 / nd) / (nd - 1);
                acc += var / (2.0 * nd), pairs++;
            }
        if (pairs && sqrt(acc / pairs) > lim->sd) lim->sd = sqrt(acc / pairs);
    }
    lim->known = 1;
out:
    free(buf), free(sa), free(sb);
}

int calibrate_arms(cmp_run *r, tg_err *e)
{
    cal_run *c = r->cal;
    if (!c) return 0;
    double ref_err = c->arms[r->ref].exact_err;
    for (int a = 0; a < r->n_arms; a++) {
        cmp_arm *arm = &r->arms[a];
        cal_arm *ca = &c->arms[a];
        if (a == r->ref || arm->is_custody) continue;
        int *mask = calloc((size_t)r->n_prompts + 1, sizeof *mask);
        double *buf = calloc((size_t)c->n_steps + 1, sizeof *buf);
        if (!mask || !buf) {
            free(mask), free(buf);
            return tg_errf(e, "out of memory");
        }
        for (int p = 0; p < r->n_prompts; p++) mask[p] = compare_planned(arm, p);
        for (int m = 0; m < CAL_N_METRICS; m++) {
            cal_limit *lim = &ca->lim[m];
            int nsteps;
            lim->value = metric_value(r, c, a, m, mask, &nsteps, buf);
            lim->ok = 1;
            panel_limit(r, c, a, m, mask, lim);
            if (!lim->known || !isfinite(lim->value)) {
                lim->known = 0;
                continue;
            }
            double sd = lim->sd;
            if (m == CAL_DIV) {
                /* a rate's own binomial error over the arm's steps (p-chart),
                 * the rate taken by Laplace's rule so that a panel with no
                 * divergence still allows the binomial noise of one */
                double p = (lim->mean * nsteps + 1) / (nsteps + 2);
                double sb = nsteps > 0 ? sqrt(p * (1 - p) / nsteps) : 0;
                if (sb > sd) sd = sb;
            }
            lim->sd = sd;
            /* a new build against n panel values: the prediction form */
            lim->upper = lim->mean + c->limit_k * sd * sqrt(1.0 + 1.0 / lim->n);
            lim->ok = lim->value <= lim->upper;
        }
        free(mask), free(buf);
        if (isfinite(ca->exact_err) && isfinite(ref_err) && ref_err > 0) {
            ca->budget_known = 1;
            ca->budget_ratio = ca->exact_err / ref_err;
            ca->budget_ok = ca->budget_ratio <= c->budget;
        }
    }
    /* the contested steps: a step where no arm fails under the policy is a
     * near tie, and exact arithmetic says which token it gives */
    for (int i = 0; i < r->n_contested; i++) {
        cmp_contested *ct = &r->contested[i];
        int j = step_index(c, ct->prompt, ct->step);
        if (j < 0) continue;
        const cal_step *s = &c->steps[j];
        int any_fail = 0, closest = -1;
        double band = INFINITY, best = INFINITY;
        char agree[256] = "";
        size_t ak = 0;
        int32_t xt = s->exact_token;
        for (int a = 0; a < r->n_arms; a++) {
            cmp_arm *arm = &r->arms[a];
            if (arm->is_custody) continue;
            view v;
            if (!arm_view(r, a, ct->prompt, ct->step, &v)) continue;
            if (a != r->ref) {
                cmp_row *row = compare_scoring_row(arm, ct->prompt, ct->step);
                if (row && !compare_class_ok(row->cls, r->policy)) any_fail = 1;
                if (row && row->cls != CMP_EXACT && isfinite(c->arms[a].st[j].band) &&
                    c->arms[a].st[j].band < band)
                    band = c->arms[a].st[j].band;
            }
            if (a != c->exact && v.token == xt) {
                ak += (size_t)snprintf(agree + ak, ak < sizeof agree ? sizeof agree - ak : 0, "%s%s",
                                       ak ? ", " : "", arm->name);
                if (ak >= sizeof agree) ak = sizeof agree - 1;
            }
            if (a != c->exact && c->arms[a].st[j].n_shared > 0 && c->arms[a].st[j].ex_med < best)
                best = c->arms[a].st[j].ex_med, closest = a;
        }
        if (!strcmp(r->policy, "error-budget") && isfinite(c->arms[r->ref].st[j].ex_max))
            band = c->budget * c->arms[r->ref].st[j].ex_max;
        else if (strcmp(r->policy, "calibrated"))
            band = r->band;
        char exact[640] = "", out[1024];
        if (xt >= 0) {
            int n = snprintf(exact, sizeof exact, "exact arithmetic (%s) says %d%s%s%s", c->exact_name, xt,
                             ak ? " (with " : " (no other arm)", agree, ak ? ")" : "");
            if (closest >= 0 && n > 0 && (size_t)n < sizeof exact)
                snprintf(exact + n, sizeof exact - (size_t)n, "; closest to exact arithmetic: %s (median |dlogit| %.3f)",
                         r->arms[closest].name, best);
        }
        if (!any_fail && isfinite(s->ref_gap)) {
            if (isfinite(band))
                snprintf(out, sizeof out, "near tie (gap %.3f, band %.3f)%s%s", s->ref_gap, band, xt >= 0 ? "; " : "",
                         exact);
            else
                snprintf(out, sizeof out, "near tie (gap %.3f)%s%s", s->ref_gap, xt >= 0 ? "; " : "", exact);
        } else if (xt >= 0) {
            snprintf(out, sizeof out, "%s; %s", ct->sentence, exact);
        } else {
            continue;
        }
        char *d = strdup(out);
        if (!d) return tg_errf(e, "out of memory");
        free(ct->sentence);
        ct->sentence = d;
    }
    return 0;
}

int calibrate_arm_fails(const cmp_run *r, int a, char *why, size_t cap)
{
    const cal_run *c = r->cal;
    if (!c || a < 0 || a >= r->n_arms) return 0;
    const cal_arm *ca = &c->arms[a];
    if (!strcmp(r->policy, "calibrated")) {
        for (int m = 0; m < CAL_N_METRICS; m++) {
            const cal_limit *l = &ca->lim[m];
            if (!l->known || l->ok) continue;
            snprintf(why, cap, "control limit: %s %.4g > %.4g (mean %.4g + %g x sd %.3g of %d panel arms: %.120s)",
                     METRIC_NAMES[m], l->value, l->upper, l->mean, c->limit_k, l->sd, l->n, l->basis);
            return 1;
        }
    } else if (!strcmp(r->policy, "error-budget") && ca->budget_known && !ca->budget_ok) {
        snprintf(why, cap, "error budget: distance from exact arithmetic %.4g = %.2fx the reference's %.4g (budget %gx)",
                 ca->exact_err, ca->budget_ratio, c->arms[r->ref].exact_err, c->budget);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Store                                                               */

int calibrate_store(sqlite3 *db, const cmp_run *r, int set, tg_err *e)
{
    const cal_run *c = r->cal;
    if (!c) return 0;
    sqlite3_stmt *q = NULL;
    int64_t run = r->run_id;
    q = common_sql_prepare(db,
                           "INSERT INTO calib_set(run_id, set_no, exact, factor, limit_k, budget, source_run,"
                           " panel) VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
                           "IitdddNt", run, set, c->exact >= 0 ? c->exact_name : NULL, c->factor, c->limit_k,
                           c->budget, c->from_run, c->from_run ? "" : c->panel);
    if (!q)
        goto fail;
    if (sqlite3_step(q) != SQLITE_DONE) goto fail;
    sqlite3_finalize(q);
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO calib_step(run_id, set_no, prompt, step, n_views, ref_gap, spread, band,"
                           " fragile, flipped_by, exact_token, exact_gap) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)",
                           -1, &q, NULL) != SQLITE_OK)
        goto fail;
    for (int j = 0; j < c->n_steps; j++) {
        const cal_step *s = &c->steps[j];
        if (common_sql_step(q, "IitiiDDDitnD", run, set, r->prompts[s->prompt].name, s->step, s->n_views,
                            s->ref_gap, s->spread, s->band, s->fragile, s->flipped_by, (int)s->exact_token,
                            s->exact_gap) != SQLITE_DONE)
            goto fail;
    }
    sqlite3_finalize(q);
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO calib_limit(run_id, set_no, arm, metric, value, n, mean, sd, upper, ok,"
                           " basis) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)",
                           -1, &q, NULL) != SQLITE_OK)
        goto fail;
    for (int a = -1; a < r->n_arms; a++) {
        if (a >= 0 && (a == r->ref || r->arms[a].is_custody)) continue;
        for (int m = 0; m < CAL_N_METRICS; m++) {
            cal_limit whole;
            const cal_limit *l = a >= 0 ? &c->arms[a].lim[m] : &whole;
            if (a >= 0 && !isfinite(l->value)) continue; /* the metric does not apply (the exact arm's own distance) */
            if (a < 0) {
                /* the whole panel, for runs that take this calibration (from:) */
                if (c->from_run || c->n_panel == 0) continue;
                memset(&whole, 0, sizeof whole);
                int *all = calloc((size_t)r->n_prompts + 1, sizeof *all);
                if (!all) goto fail;
                for (int p = 0; p < r->n_prompts; p++) all[p] = 1;
                panel_limit(r, c, -1, m, all, &whole);
                free(all);
                whole.value = NAN;
                if (!whole.known) continue;
            }
            /* mean and sd where a limit is known; upper and ok for an arm's own limit only */
            const int own = l->known && a >= 0;
            if (common_sql_step(q, "IittDiDDDnt", run, set, a >= 0 ? r->arms[a].name : "*", METRIC_NAMES[m],
                                l->value, l->n, l->known ? l->mean : NAN, l->known ? l->sd : NAN,
                                own ? l->upper : NAN, own ? l->ok : -1, l->basis) != SQLITE_DONE)
                goto fail;
        }
    }
    sqlite3_finalize(q);
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO calib_arm_step(run_id, set_no, arm, prompt, step, band, exact_n, exact_max,"
                           " exact_median, exact_kl) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
                           -1, &q, NULL) != SQLITE_OK)
        goto fail;
    for (int a = 0; a < r->n_arms; a++) {
        if (r->arms[a].is_custody) continue;
        for (int j = 0; j < c->n_steps; j++) {
            const cal_arm_step *as = &c->arms[a].st[j];
            if (!isfinite(as->band) && as->n_shared == 0) continue;
            if (common_sql_step(q, "IittiDiDDD", run, set, r->arms[a].name, r->prompts[c->steps[j].prompt].name,
                                c->steps[j].step, as->band, as->n_shared, as->n_shared ? as->ex_max : NAN,
                                as->n_shared ? as->ex_med : NAN, as->n_shared ? as->ex_kl : NAN) != SQLITE_DONE)
                goto fail;
        }
    }
    sqlite3_finalize(q);
    return 0;
fail:
    common_sql_err(db, e, "writing the calibration");
    sqlite3_finalize(q);
    return -1;
}
