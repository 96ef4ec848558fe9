/*
 * verdict.c: turns the facts of a run (compare.c) into verdicts and stores
 * them as a new verdict set: the verdict_set row, the compare rows of every
 * arm leg, the contested steps with their resolution sentences, and the
 * verdict rows (run-level keys with arm NULL, per-arm keys, per arm x prompt
 * keys). The rules are in docs/verdicts.md; this file is their only
 * implementation.
 */
#include "verdict.h"

#include <math.h>
#include <stdarg.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "calibrate.h"
#include "common.h"
#include "compare.h"
#include "noise.h"

verdict_options verdict_options_default(void)
{
    verdict_options o = {NULL, -1.0};
    return o;
}

void verdict_wilson(int k, int n, double *lo, double *hi)
{
    if (n <= 0) {
        *lo = 0, *hi = 1;
        return;
    }
    const double z = 1.96;
    double p = (double)k / n, z2 = z * z;
    double den = 1 + z2 / n;
    double mid = (p + z2 / (2.0 * n)) / den;
    double half = z * sqrt(p * (1 - p) / n + z2 / (4.0 * n * n)) / den;
    *lo = mid - half < 0 ? 0 : mid - half;
    *hi = mid + half > 1 ? 1 : mid + half;
}

/* ------------------------------------------------------------------ */
/* Decisions                                                           */

enum { V_PASS, V_FAIL, V_NM, V_SKIP };
static const char *const VWORD[] = {"PASS", "FAIL", "NOT_MEASURABLE", "NOT_RUN"};

typedef struct arm_verdict {
    int v;
    char reason[512];
    int *pv;                  /* per prompt */
    char (*preason)[256];
} arm_verdict;

static void decide_prompt(const cmp_run *r, const cmp_arm *arm, int p, int *v, char *why,
                          size_t cap)
{
    const cmp_arm_prompt *ap = &arm->ap[p];
    const cmp_leg *g = arm->scoring >= 0 ? &arm->legs[arm->scoring] : NULL;
    *v = V_PASS;
    why[0] = 0;
    if (ap->not_planned) {
        *v = V_SKIP;
        snprintf(why, cap, "not run: the arm's prompts: list leaves it out");
    } else if (!g) {
        *v = V_NM;
        snprintf(why, cap, "no leg");
    } else if (ap->tokenizer_known && ap->tokenizer_diff) {
        *v = V_FAIL;
        snprintf(why, cap, "tokenization differs from the reference's");
    } else if (ap->first_bad >= 0) {
        /* the first step the arm fails; a step whose reference logits are
         * degenerate judges nothing, so it makes the prompt not measurable
         * unless the arm fails elsewhere */
        const cmp_row *bad = NULL, *ref_degen = NULL;
        for (int i = ap->first_bad; i < g->n_rows && !bad; i++) {
            const cmp_row *row = &g->rows[i];
            if (row->prompt != p || row->cls == CMP_UNCOMPARABLE || compare_class_ok(row->cls, r->policy)) continue;
            if (row->degenerate == 1) {
                if (!ref_degen) ref_degen = row;
            } else
                bad = row;
        }
        if (bad) {
            *v = V_FAIL;
            snprintf(why, cap, "step %d: %s (token %d, reference %d, rank %d)%s", bad->step,
                     compare_class_name(bad->cls), bad->token, bad->ref_token, bad->rank,
                     bad->degenerate ? ": the arm's logits have a NaN or infinity" : "");
        } else {
            *v = V_NM;
            snprintf(why, cap, "step %d: the reference's logits are degenerate (NaN, infinite or all equal): "
                     "no token can be judged", ref_degen->step);
        }
    } else if (ap->missing_steps > 0) {
        *v = V_FAIL;
        snprintf(why, cap, "%d steps fewer than the reference", ap->missing_steps);
    } else if (ap->n_uncomparable > 0 && !strcmp(r->mode, "teacher-forced")) {
        *v = V_NM;
        snprintf(why, cap, "%d steps decoded over a prefix other than the reference's",
                 ap->n_uncomparable);
    } else if (ap->n_compared == 0) {
        *v = V_NM;
        snprintf(why, cap, "no step comparable with the reference");
    }
}

/* Verdict of one scored arm (not the reference, not custody). */
static void decide_arm(const cmp_run *r, const cmp_arm *arm, arm_verdict *av)
{
    int any_fail = 0, any_nm = 0;
    char first_fail[256] = "", first_nm[256] = "";
    for (int p = 0; p < r->n_prompts; p++) {
        decide_prompt(r, arm, p, &av->pv[p], av->preason[p], sizeof av->preason[p]);
        if (av->pv[p] == V_FAIL && !any_fail++)
            snprintf(first_fail, sizeof first_fail, "%.60s: %.180s", r->prompts[p].name,
                     av->preason[p]);
        if (av->pv[p] == V_NM && !any_nm++)
            snprintf(first_nm, sizeof first_nm, "%.60s: %.180s", r->prompts[p].name,
                     av->preason[p]);
    }
    const char *why_legs = NULL;
    char buf[512];
    if (!r->ref_ok) {
        why_legs = r->ref_why;   /* a broken reference: resuming would not help */
    } else if (r->unfinished) {
        why_legs = r->unfinished_why;
    } else if (arm->legs_clean < 2) {
        const char *leg_why = "";
        int leg_no = 0;
        for (int l = 0; l < arm->n_legs; l++)
            if (!arm->legs[l].clean) {
                leg_why = arm->legs[l].why, leg_no = arm->legs[l].leg;
                break;
            }
        if (leg_no)
            snprintf(buf, sizeof buf, "%d/%d legs clean, fewer than 2 (leg %d: %.200s)",
                     arm->legs_clean, arm->legs_expected, leg_no, leg_why);
        else
            snprintf(buf, sizeof buf, "%d/%d legs clean, fewer than 2", arm->legs_clean,
                     arm->legs_expected);
        why_legs = buf;
    } else if (!arm->legs_identical) {
        snprintf(buf, sizeof buf, "clean legs differ: %.300s", arm->identical_why);
        why_legs = buf;
    }
    if (why_legs) {
        av->v = V_NM;
        snprintf(av->reason, sizeof av->reason, "%s", why_legs);
        for (int p = 0; p < r->n_prompts; p++) {
            if (av->pv[p] == V_SKIP) continue;
            if (av->pv[p] == V_FAIL)
                snprintf(av->preason[p] + strlen(av->preason[p]),
                         sizeof av->preason[p] - strlen(av->preason[p]), " (not measurable)");
            av->pv[p] = V_NM;
            if (!av->preason[p][0]) snprintf(av->preason[p], sizeof av->preason[p], "%.250s", why_legs);
        }
    } else if (any_fail) {
        av->v = V_FAIL;
        snprintf(av->reason, sizeof av->reason, "%d prompt(s) fail; first %s", any_fail, first_fail);
    } else if (calibrate_arm_fails(r, (int)(arm - r->arms), buf, sizeof buf)) {
        av->v = V_FAIL;
        snprintf(av->reason, sizeof av->reason, "%s", buf);
    } else if (any_nm) {
        av->v = V_NM;
        snprintf(av->reason, sizeof av->reason, "%s", first_nm);
    } else {
        av->v = V_PASS;
        snprintf(av->reason, sizeof av->reason, "every prompt tokenizes and decodes within policy %s",
                 r->policy);
    }
}

/* ------------------------------------------------------------------ */
/* Writing                                                             */

typedef struct writer {
    sqlite3 *db;
    sqlite3_stmt *v, *c, *k;
    int64_t run;
    int set;
    const char *policy;
    double band;
} writer;

static int put_kv(writer *w, const char *arm, const char *prompt, const char *key, const char *fmt,
                  ...) __attribute__((format(printf, 5, 6)));

static int put_kv(writer *w, const char *arm, const char *prompt, const char *key, const char *fmt,
                  ...)
{
    char val[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof val, fmt, ap);
    va_end(ap);
    int rc = common_sql_step(w->v, "Iittttdt", w->run, w->set, arm, prompt, key, val, w->band, w->policy);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* The noise band of every step that has oracle variants (noise_band rows). */
static int put_bands(writer *w, const cmp_run *r)
{
    if (r->n_bands == 0) return 0;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(w->db,
                           "INSERT INTO noise_band(run_id, set_no, prompt, step, n_views, ref_gap,"
                           " spread, tokens) VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
                           -1, &s, NULL) != SQLITE_OK)
        return -1;
    for (int i = 0; i < r->n_bands; i++) {
        const struct cmp_band *b = &r->bands[i];
        char toks[128];
        size_t k = 0;
        toks[0] = 0;
        for (int t = 0; t < b->n_tokens && k < sizeof toks; t++)
            k += (size_t)snprintf(toks + k, sizeof toks - k, "%s%d", t ? "," : "", b->tokens[t]);
        if (common_sql_step(s, "IitiiDDt", w->run, w->set, r->prompts[b->prompt].name, b->step, b->n_views,
                            b->ref_gap, b->spread, toks) != SQLITE_DONE) {
            sqlite3_finalize(s);
            return -1;
        }
    }
    sqlite3_finalize(s);
    return 0;
}

/* Paired test of arm a's divergence rate against every later scored arm's
 * over the steps both compared (McNemar, exact): RATE_VS.<other> on arm a. */
static int put_rate_tests(writer *w, const cmp_run *r, int a)
{
    const cmp_arm *x = &r->arms[a];
    if (x->scoring < 0) return 0;
    const cmp_leg *gx = &x->legs[x->scoring];
    for (int b = a + 1; b < r->n_arms; b++) {
        const cmp_arm *y = &r->arms[b];
        if (y->is_ref || y->is_custody || y->scoring < 0) continue;
        const cmp_leg *gy = &y->legs[y->scoring];
        int only_x = 0, only_y = 0, both = 0, n = 0, j = 0;
        for (int i = 0; i < gx->n_rows; i++) {
            const cmp_row *rx = &gx->rows[i];
            if (rx->cls == CMP_UNCOMPARABLE) continue;
            while (j < gy->n_rows && (gy->rows[j].prompt < rx->prompt ||
                                      (gy->rows[j].prompt == rx->prompt && gy->rows[j].step < rx->step)))
                j++;
            if (j >= gy->n_rows) break;
            const cmp_row *ry = &gy->rows[j];
            if (ry->prompt != rx->prompt || ry->step != rx->step || ry->cls == CMP_UNCOMPARABLE) continue;
            int dx = rx->cls != CMP_EXACT, dy = ry->cls != CMP_EXACT;
            n++;
            only_x += dx && !dy, only_y += dy && !dx, both += dx && dy;
        }
        double p = noise_mcnemar(only_x, only_y);
        char key[160];
        snprintf(key, sizeof key, "RATE_VS.%.140s", y->name);
        if (put_kv(w, x->name, NULL, key,
                   "%d/%d vs %d/%d paired steps, discordant %d/%d, McNemar exact p=%.4g: %s",
                   only_x + both, n, only_y + both, n, only_x, only_y, p,
                   p < 0.05 ? "DIFFER" : "NOT_DIFFERENT") < 0)
            return -1;
    }
    return 0;
}

/* Steps the policy's rules decided on arm's scoring leg: passed EXACT,
 * passed by the near-tie or noise rule, failed. */
static int put_policy_counts(writer *w, const cmp_run *r, const cmp_arm *arm)
{
    int n_exact = 0, n_rule = 0, n_fail = 0;
    for (int p = 0; p < r->n_prompts; p++) {
        const cmp_arm_prompt *ap = &arm->ap[p];
        n_exact += ap->count[CMP_EXACT];
        for (int c = 0; c < CMP_N_CLASSES; c++) {
            if (c == CMP_EXACT || c == CMP_UNCOMPARABLE) continue;
            if (compare_class_ok((cmp_class)c, r->policy)) n_rule += ap->count[c];
            else n_fail += ap->count[c];
        }
    }
    const char *rule = !strcmp(r->policy, "noise")          ? "noise"
                       : !strcmp(r->policy, "near-tie")     ? "near_tie"
                       : !strcmp(r->policy, "calibrated")   ? "calibrated"
                       : !strcmp(r->policy, "error-budget") ? "budget"
                                                            : "none";
    if (put_kv(w, arm->name, NULL, "POLICY_DECIDED", "exact=%d %s=%d fail=%d", n_exact, rule, n_rule,
               n_fail) < 0)
        return -1;
    if (r->n_variants > 0 &&
        (put_kv(w, arm->name, NULL, "NOISE_WITHIN", "%d", arm->noise_within) < 0 ||
         put_kv(w, arm->name, NULL, "VARIANT_SEARCH", "%d", arm->noise_search) < 0))
        return -1;
    return 0;
}

/* Calibration and exact-arbiter keys of arm a (docs/verdicts.md
 * "Calibration"): CONTROL_LIMITS, LIMIT.<metric>, EXACT_ERR, ERROR_BUDGET. */
static int put_cal_keys(writer *w, const cmp_run *r, int a)
{
    const cal_run *c = r->cal;
    if (!c) return 0;
    const cal_arm *ca = &c->arms[a];
    const char *name = r->arms[a].name;
    int known = 0, fail = 0;
    for (int m = 0; m < CAL_N_METRICS; m++) {
        const cal_limit *l = &ca->lim[m];
        char key[64];
        snprintf(key, sizeof key, "LIMIT.%s", calibrate_metric_name(m));
        if (!l->known) {
            if (isfinite(l->value) &&
                put_kv(w, name, NULL, key, "%.6g (no limit: %d panel values)", l->value, l->n) < 0)
                return -1;
            continue;
        }
        known++;
        fail += !l->ok;
        if (put_kv(w, name, NULL, key, "%.6g %s %.6g (mean %.6g + %g x sd %.3g of %d: %.160s)", l->value,
                   l->ok ? "<=" : ">", l->upper, l->mean, c->limit_k, l->sd, l->n, l->basis) < 0)
            return -1;
    }
    if (put_kv(w, name, NULL, "CONTROL_LIMITS", "%s", !known ? "UNKNOWN" : fail ? "FAIL" : "PASS") < 0) return -1;
    if (c->exact < 0 || a == c->exact) return 0;
    if (ca->n_exact > 0 &&
        put_kv(w, name, NULL, "EXACT_ERR", "%.6f median |dlogit|, %.6f max, KL %.3g over %d steps", ca->exact_err,
               ca->exact_max, ca->exact_kl, ca->n_exact) < 0)
        return -1;
    if (!ca->budget_known) return put_kv(w, name, NULL, "ERROR_BUDGET", "NOT_MEASURABLE");
    return put_kv(w, name, NULL, "ERROR_BUDGET", "%s", ca->budget_ok ? "PASS" : "FAIL") < 0 ||
                   put_kv(w, name, NULL, "ERROR_BUDGET_RATIO", "%.3f (budget %g)", ca->budget_ratio, c->budget) < 0
               ? -1
               : 0;
}

/* Run-level calibration keys: CALIBRATION, FRAGILE_STEPS, EXACT_ARBITER,
 * and the reference's own EXACT_ERR. */
static int put_cal_run_keys(writer *w, const cmp_run *r)
{
    const cal_run *c = r->cal;
    if (!c) return 0;
    int fragile = 0, known = 0;
    for (int j = 0; j < c->n_steps; j++) fragile += c->steps[j].fragile, known += isfinite(c->steps[j].spread);
    if (c->from_run) {
        if (put_kv(w, NULL, NULL, "CALIBRATION", "stored: run %lld of spec %s, factor %g, limit_k %g",
                   (long long)c->from_run, c->from, c->factor, c->limit_k) < 0)
            return -1;
    } else if (put_kv(w, NULL, NULL, "CALIBRATION", "%s%d panel arms (%s), factor %g, limit_k %g",
                      c->from[0] ? "this run (no stored calibration found): " : "", c->n_panel, c->panel,
                      c->factor, c->limit_k) < 0)
        return -1;
    if (put_kv(w, NULL, NULL, "FRAGILE_STEPS", "%d/%d", fragile, c->n_steps) < 0 ||
        put_kv(w, NULL, NULL, "BANDS_KNOWN", "%d/%d", known, c->n_steps) < 0)
        return -1;
    if (c->exact < 0) return 0;
    const cal_arm *rf = &c->arms[r->ref];
    if (put_kv(w, NULL, NULL, "EXACT_ARBITER", "%s", c->exact_name) < 0) return -1;
    if (rf->n_exact > 0 &&
        put_kv(w, r->arms[r->ref].name, NULL, "EXACT_ERR", "%.6f median |dlogit|, %.6f max, KL %.3g over %d steps",
               rf->exact_err, rf->exact_max, rf->exact_kl, rf->n_exact) < 0)
        return -1;
    return 0;
}

static int put_rows(writer *w, const cmp_run *r)
{
    for (int a = 0; a < r->n_arms; a++) {
        const cmp_arm *arm = &r->arms[a];
        for (int l = 0; l < arm->n_legs; l++) {
            const cmp_leg *g = &arm->legs[l];
            for (int i = 0; i < g->n_rows; i++) {
                const cmp_row *row = &g->rows[i];
                if (common_sql_step(w->c, "IititiiinniDDtiD", w->run, w->set, arm->name, g->leg,
                                    r->prompts[row->prompt].name, row->step, row->ref_leg, (int)row->token,
                                    (int)row->ref_token, (int)row->ref_top2, row->rank, row->ref_gap, row->own_gap,
                                    compare_class_name(row->cls), row->oracle_split, row->kl) != SQLITE_DONE)
                    return -1;
            }
        }
    }
    for (int c = 0; c < r->n_contested; c++) {
        const cmp_contested *ct = &r->contested[c];
        if (common_sql_step(w->k, "Iitiitt", w->run, w->set, r->prompts[ct->prompt].name, ct->step, ct->oracle_split,
                            ct->tokens, ct->sentence) != SQLITE_DONE)
            return -1;
    }
    return put_bands(w, r);
}

static int custody_rank(const char *c)
{
    return !strcmp(c, "EXACT") ? 0 : !strcmp(c, "PREFIX") ? 1 : !strcmp(c, "UNKNOWN") ? 2 : 3;
}

/* Writes every verdict row; fills out. Returns 0 or -1 (sqlite error). */
static int put_verdicts(writer *w, const cmp_run *r, arm_verdict *avs, verdict_result *out)
{
    int gate_test = 0;
    for (int a = 0; a < r->n_arms; a++) gate_test |= r->arms[a].is_test;
    /* which arms the overall verdict covers: test arms, or when there is
     * none, the oracle arms other than the reference */
    int n_gate = 0, n_pass = 0, any_fail = 0, any_nm = 0;
    int tk_k = 0, tk_n = 0, gen_k = 0, gen_n = 0, lc_k = 0, lc_n = 0, ident = 1;
    int64_t rth = 0, dops = 0;
    int repro_no = 0, repro_yes = 0, repro_first = 0, custody_worst = -1;
    int budget_any = 0, budget_fail = 0, budget_nm = 0;
    /* near-tie set of the reference's leg 1 */
    const cmp_arm *ref = &r->arms[r->ref];
    int n_near = 0;
    for (int a = 0; a < r->n_arms; a++) {
        const cmp_arm *arm = &r->arms[a];
        const char *name = arm->name;
        if (put_kv(w, name, NULL, "ROLE", "%s", arm->is_ref ? "reference" : arm->role) < 0) return -1;
        if (put_kv(w, name, NULL, "LEGS_CLEAN", "%d/%d", arm->legs_clean, arm->legs_expected) < 0) return -1;
        if (put_kv(w, name, NULL, "LEGS_IDENTICAL", "%s",
                   !arm->identical_known ? "UNKNOWN" : arm->legs_identical ? "YES" : "NO") < 0)
            return -1;
        if (!arm->legs_identical &&
            put_kv(w, name, NULL, "LEGS_IDENTICAL_WHY", "%s", arm->identical_why) < 0) return -1;
        for (int l = 0; l < arm->n_legs; l++)
            if (!arm->legs[l].clean) {
                char key[32];
                snprintf(key, sizeof key, "LEG%d_NOT_CLEAN", arm->legs[l].leg);
                if (put_kv(w, name, NULL, key, "%s", arm->legs[l].why) < 0) return -1;
            }
        if (put_kv(w, name, NULL, "REFERENCE_TIER_HITS", "%lld", (long long)arm->reference_tier_hits) < 0) return -1;
        if (put_kv(w, name, NULL, "DEVICE_OPS", "%lld", (long long)arm->device_ops) < 0) return -1;
        if (arm->scoring >= 0 &&
            put_kv(w, name, NULL, "SCORED_LEG", "%d", arm->legs[arm->scoring].leg) < 0) return -1;
        if (arm->is_oracle) {
            if (put_kv(w, name, NULL, "ORACLE_REPRO", "%s", arm->oracle_repro) < 0) return -1;
            if (put_kv(w, name, NULL, "ORACLE_REPRO_WHY", "%s", arm->repro_why) < 0) return -1;
            if (!strcmp(arm->oracle_repro, "NO")) repro_no++;
            else if (!strcmp(arm->oracle_repro, "YES")) repro_yes++;
            else repro_first++;
        }
        if (arm->is_custody) {
            int worst = 0;
            for (int p = 0; p < r->n_prompts; p++) {
                const cmp_arm_prompt *ap = &arm->ap[p];
                const char *c = ap->custody[0] ? ap->custody : "UNKNOWN";
                int rk = custody_rank(c);
                if (rk > worst) worst = rk;
                if (!strcmp(c, "EXACT")) {
                    if (put_kv(w, name, r->prompts[p].name, "CHAIN_OF_CUSTODY", "EXACT") < 0) return -1;
                } else if (!strcmp(c, "PREFIX")) {
                    if (put_kv(w, name, r->prompts[p].name, "CHAIN_OF_CUSTODY", "PREFIX") < 0 ||
                        put_kv(w, name, r->prompts[p].name, "CUSTODY_SHARED_BYTES", "%lld",
                               (long long)ap->custody_at) < 0) return -1;
                } else if (!strcmp(c, "DIVERGE")) {
                    if (put_kv(w, name, r->prompts[p].name, "CHAIN_OF_CUSTODY", "DIVERGE") < 0 ||
                        put_kv(w, name, r->prompts[p].name, "CUSTODY_FIRST_DIFF_BYTE", "%lld",
                               (long long)ap->custody_at) < 0) return -1;
                } else if (put_kv(w, name, r->prompts[p].name, "CHAIN_OF_CUSTODY", "UNKNOWN") < 0)
                    return -1;
            }
            static const char *const CW[] = {"EXACT", "PREFIX", "UNKNOWN", "DIVERGE"};
            if (put_kv(w, name, NULL, "CHAIN_OF_CUSTODY", "%s", CW[worst]) < 0) return -1;
            if (worst > custody_worst) custody_worst = worst;
            continue;
        }
        if (arm->is_ref) continue;
        arm_verdict *av = &avs[a];
        int in_gate = gate_test ? arm->is_test : arm->is_oracle;
        int t_k = 0, t_n = 0, g_k = 0, g_n = 0, kl_n = 0, near_n = 0, near_won = 0;
        double kl = 0;
        for (int p = 0; p < r->n_prompts; p++) {
            const cmp_arm_prompt *ap = &arm->ap[p];
            const char *pn = r->prompts[p].name;
            t_k += ap->tokenizer_known && ap->tokenizer_diff;
            t_n += ap->tokenizer_known;
            g_k += ap->n_compared - ap->count[CMP_EXACT];
            g_n += ap->n_compared;
            kl += ap->kl_sum, kl_n += ap->kl_n;
            if (put_kv(w, name, pn, "TOKEN_GATE", "%s", VWORD[av->pv[p]]) < 0) return -1;
            if (av->preason[p][0] && put_kv(w, name, pn, "REASON", "%s", av->preason[p]) < 0) return -1;
            if (put_kv(w, name, pn, "TOKENIZER", "%s",
                       !ap->tokenizer_known ? "UNKNOWN" : ap->tokenizer_diff ? "DIFF" : "SAME") < 0)
                return -1;
            const cmp_leg *g = arm->scoring >= 0 ? &arm->legs[arm->scoring] : NULL;
            if (put_kv(w, name, pn, "FIRST_DIFF", "%d",
                       g && ap->first_diff >= 0 ? g->rows[ap->first_diff].step : -1) < 0) return -1;
            if (put_kv(w, name, pn, "FIRST_FAIL", "%d",
                       g && ap->first_bad >= 0 ? g->rows[ap->first_bad].step : -1) < 0) return -1;
            if (g)
                for (int i = 0; i < g->n_rows; i++) {
                    const cmp_row *row = &g->rows[i];
                    if (row->prompt != p || row->cls == CMP_UNCOMPARABLE) continue;
                    if (isfinite(row->ref_gap) && row->ref_gap < r->band) {
                        near_n++;
                        near_won += row->token == row->ref_token;
                    }
                }
        }
        double lo, hi;
        verdict_wilson(g_k, g_n, &lo, &hi);
        if (put_kv(w, name, NULL, "TOKEN_GATE", "%s", VWORD[av->v]) < 0 ||
            put_kv(w, name, NULL, "REASON", "%s", av->reason) < 0 ||
            put_kv(w, name, NULL, "TOKENIZER_DIVERGENCES", "%d/%d", t_k, t_n) < 0 ||
            put_kv(w, name, NULL, "GENERATION_DIVERGENCES", "%d/%d", g_k, g_n) < 0 ||
            put_kv(w, name, NULL, "DIVERGENCE_RATE", "%.6f [%.6f, %.6f]",
                   g_n ? (double)g_k / g_n : 0.0, lo, hi) < 0 ||
            put_kv(w, name, NULL, "SAME_TOP1", "%.6f", g_n ? 1.0 - (double)g_k / g_n : 0.0) < 0 ||
            put_kv(w, name, NULL, "KL_MEAN", "%.9g", kl_n ? kl / kl_n : 0.0) < 0 ||
            put_kv(w, name, NULL, "NEAR_TIES_WON", "%d/%d", near_won, near_n) < 0 ||
            put_kv(w, name, NULL, "IN_GATE", "%s", in_gate ? "YES" : "NO") < 0)
            return -1;
        if (put_policy_counts(w, r, arm) < 0 || put_rate_tests(w, r, a) < 0 || put_cal_keys(w, r, a) < 0)
            return -1;
        if (in_gate && r->cal && r->cal->exact >= 0) {
            const cal_arm *ca = &r->cal->arms[a];
            budget_any |= 1;
            budget_fail |= ca->budget_known && !ca->budget_ok;
            budget_nm |= !ca->budget_known && a != r->cal->exact;
        }
        if (!in_gate) continue;
        n_gate++;
        n_pass += av->v == V_PASS;
        any_fail |= av->v == V_FAIL;
        any_nm |= av->v == V_NM;
        tk_k += t_k, tk_n += t_n, gen_k += g_k, gen_n += g_n;
        lc_k += arm->legs_clean, lc_n += arm->legs_expected;
        /* YES only when every gate arm had two clean legs to compare */
        if (!arm->legs_identical) ident = 0;
        else if (!arm->identical_known && ident == 1) ident = 2;
        rth = common_add_sat(rth, arm->reference_tier_hits);
        dops = common_add_sat(dops, arm->device_ops);
    }
    if (ref->n_legs && ref->legs[0].leg == 1)
        for (int p = 0; p < r->n_prompts; p++) {
            const cmp_lp *y = &ref->legs[0].lp[p];
            for (int i = 0; i < y->n_steps; i++)
                if (y->n_top[i] >= 2 &&
                    (double)y->top[i][0].logit - (double)y->top[i][1].logit < r->band)
                    n_near++;
        }
    int overall = n_gate == 0 ? V_NM : any_fail ? V_FAIL : any_nm ? V_NM : V_PASS;
    if (!r->ref_ok && overall != V_FAIL) overall = V_NM;
    if (r->unfinished) overall = V_NM;   /* whatever the stored legs say */
    if (n_gate == 0) ident = 2;          /* no arm had legs to compare */
    int n_split = 0;
    for (int c = 0; c < r->n_contested; c++) n_split += r->contested[c].oracle_split;
    if (put_kv(w, NULL, NULL, "TOKEN_GATE", "%s", VWORD[overall]) < 0 ||
        put_kv(w, NULL, NULL, "TOKENIZER_DIVERGENCES", "%d/%d", tk_k, tk_n) < 0 ||
        put_kv(w, NULL, NULL, "GENERATION_DIVERGENCES", "%d/%d", gen_k, gen_n) < 0 ||
        put_kv(w, NULL, NULL, "LEGS_CLEAN", "%d/%d", lc_k, lc_n) < 0 ||
        put_kv(w, NULL, NULL, "LEGS_IDENTICAL", "%s", ident == 1 ? "YES" : ident == 2 ? "UNKNOWN" : "NO") < 0 ||
        put_kv(w, NULL, NULL, "ORACLE_REPRO", "%s",
               repro_no ? "NO" : (repro_yes && !repro_first) ? "YES" : "FIRST") < 0 ||
        put_kv(w, NULL, NULL, "REFERENCE_TIER_HITS", "%lld", (long long)rth) < 0 ||
        put_kv(w, NULL, NULL, "DEVICE_OPS", "%lld", (long long)dops) < 0 ||
        put_kv(w, NULL, NULL, "NEAR_TIES", "%d", n_near) < 0 ||
        put_kv(w, NULL, NULL, "CONTESTED", "%d", r->n_contested) < 0 ||
        put_kv(w, NULL, NULL, "ORACLE_SPLITS", "%d", n_split) < 0 ||
        put_kv(w, NULL, NULL, "GATE_ARMS", "%d", n_gate) < 0 ||
        (r->n_degenerate && put_kv(w, NULL, NULL, "DEGENERATE_STEPS", "%d", r->n_degenerate) < 0))
        return -1;
    if (r->n_variants > 0) {
        int split = 0, known = 0;
        for (int i = 0; i < r->n_bands; i++) {
            split += r->bands[i].n_tokens > 1;
            known += isfinite(r->bands[i].spread);
        }
        if (put_kv(w, NULL, NULL, "NOISE_VARIANTS", "%d", r->n_variants) < 0 ||
            put_kv(w, NULL, NULL, "NOISE_STEPS", "%d/%d", split, r->n_bands) < 0 ||
            put_kv(w, NULL, NULL, "NOISE_BANDS_KNOWN", "%d/%d", known, r->n_bands) < 0)
            return -1;
    }
    if (!r->ref_ok) {
        if (put_kv(w, NULL, NULL, "REASON", "%s", r->ref_why) < 0) return -1;
    } else if (r->unfinished && put_kv(w, NULL, NULL, "REASON", "%s", r->unfinished_why) < 0)
        return -1;
    if (budget_any && put_kv(w, NULL, NULL, "ERROR_BUDGET", "%s",
                             budget_fail ? "FAIL" : budget_nm ? "NOT_MEASURABLE" : "PASS") < 0)
        return -1;
    if (put_cal_run_keys(w, r) < 0) return -1;
    if (custody_worst >= 0) {
        static const char *const CW[] = {"EXACT", "PREFIX", "UNKNOWN", "DIVERGE"};
        if (put_kv(w, NULL, NULL, "CHAIN_OF_CUSTODY", "%s", CW[custody_worst]) < 0) return -1;
    }
    snprintf(out->verdict, sizeof out->verdict, "%s", VWORD[overall]);
    out->exit_code = overall == V_PASS ? 0 : 1;
    out->n_test_arms = n_gate;
    out->n_pass = n_pass;
    return 0;
}

/* ------------------------------------------------------------------ */

int verdict_score_run(tg_store *st, int64_t run_id, const verdict_options *opt,
                      verdict_result *out, tg_err *e)
{
    sqlite3 *db = store_db(st);
    memset(out, 0, sizeof *out);
    out->run_id = run_id;
    verdict_options o = opt ? *opt : verdict_options_default();
    char policy[16] = "";
    double band = 0;
    sqlite3_stmt *s = NULL;
    s = common_sql_prepare(db, "SELECT policy, band FROM run WHERE id=?1", "I", run_id);
    if (!s)
        return common_sql_err(db, e, "reading the run");
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        snprintf(policy, sizeof policy, "%s", (const char *)sqlite3_column_text(s, 0));
        band = sqlite3_column_double(s, 1);
    }
    sqlite3_finalize(s);
    if (rc == SQLITE_DONE) return tg_errf(e, "store: no run %lld", (long long)run_id);
    if (rc != SQLITE_ROW) return common_sql_err(db, e, "reading the run");
    if (o.policy_kind) snprintf(policy, sizeof policy, "%s", o.policy_kind);
    if (o.band >= 0 && isfinite(o.band)) band = o.band;
    if (strcmp(policy, "exact") && strcmp(policy, "near-tie") && strcmp(policy, "noise") &&
        strcmp(policy, "calibrated") && strcmp(policy, "error-budget"))
        return tg_errf(e, "policy \"%s\": expected exact, near-tie, noise, calibrated or error-budget", policy);
    if (!(band >= 0) || !isfinite(band))
        return tg_errf(e, "band %g: expected a finite number >= 0 (logits)", band);
    snprintf(out->policy_kind, sizeof out->policy_kind, "%s", policy);
    out->band = band;

    cmp_run *r = NULL;
    writer w = {db, NULL, NULL, NULL, run_id, 0, policy, band};
    if (compare_run(st, run_id, policy, band, &r, e) < 0) return -1;
    int ret = -1;
    arm_verdict *avs = xcalloc((size_t)r->n_arms, sizeof *avs);
    for (int a = 0; a < r->n_arms; a++) {
        avs[a].pv = xcalloc((size_t)(r->n_prompts + 1), sizeof *avs[a].pv);
        avs[a].preason = xcalloc((size_t)(r->n_prompts + 1), sizeof *avs[a].preason);
        if (!r->arms[a].is_ref && !r->arms[a].is_custody) decide_arm(r, &r->arms[a], &avs[a]);
    }

    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        common_sql_err(db, e, "starting the verdict transaction");
        goto out;
    }
    s = common_sql_prepare(db, "SELECT coalesce(max(set_no), 0) + 1 FROM verdict_set WHERE run_id=?1", "I", run_id);
    if (!s)
        goto sqlfail;
    if (sqlite3_step(s) != SQLITE_ROW) {
        sqlite3_finalize(s);
        goto sqlfail;
    }
    w.set = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO verdict(run_id, set_no, arm, prompt, key, value, band, policy)"
                           " VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
                           -1, &w.v, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "INSERT INTO compare(run_id, set_no, arm, leg, prompt, step, ref_leg, token,"
                           " ref_token, ref_top2, rank, ref_gap, own_gap, class, oracle_split, kl)"
                           " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)",
                           -1, &w.c, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "INSERT INTO contested(run_id, set_no, prompt, step, oracle_split, tokens,"
                           " sentence) VALUES(?1,?2,?3,?4,?5,?6,?7)",
                           -1, &w.k, NULL) != SQLITE_OK)
        goto sqlfail;
    out->set = w.set;
    /* the set row first (overall filled in after the verdicts) */
    char now[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm);
    s = common_sql_prepare(db,
                           "INSERT INTO verdict_set(run_id, set_no, created, policy, band, overall)"
                           " VALUES(?1,?2,?3,?4,?5,'')",
                           "Iittd", run_id, w.set, now, policy, band);
    if (!s)
        goto sqlfail;
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) goto sqlfail;
    if (put_rows(&w, r) < 0 || put_verdicts(&w, r, avs, out) < 0) goto sqlfail;
    if (calibrate_store(db, r, w.set, e) < 0) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        goto out;
    }
    s = common_sql_prepare(db, "UPDATE verdict_set SET overall=?3 WHERE run_id=?1 AND set_no=?2", "Iit", run_id,
                           w.set, out->verdict);
    if (!s)
        goto sqlfail;
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) goto sqlfail;
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) goto sqlfail;
    out->run_id = run_id;
    ret = 0;
    goto out;
sqlfail:
    common_sql_err(db, e, "writing the verdict set");
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
out:
    sqlite3_finalize(w.v);
    sqlite3_finalize(w.c);
    sqlite3_finalize(w.k);
    if (avs)
        for (int a = 0; a < r->n_arms; a++) free(avs[a].pv), free(avs[a].preason);
    free(avs);
    compare_free(r);
    return ret;
}

int verdict_latest_set(tg_store *st, int64_t run_id, int *set, tg_err *e)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, "SELECT coalesce(max(set_no), 0) FROM verdict_set WHERE run_id=?1", -1,
                           &s, NULL) != SQLITE_OK)
        return common_sql_err(db, e, "reading verdict sets");
    sqlite3_bind_int64(s, 1, run_id);
    int rc = sqlite3_step(s);
    *set = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) : 0;
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW) return common_sql_err(db, e, "reading verdict sets");
    return 0;
}

int verdict_get_overall(tg_store *st, int64_t run_id, int set, char word[16], tg_err *e)
{
    sqlite3 *db = store_db(st);
    if (set == 0 && verdict_latest_set(st, run_id, &set, e) < 0) return -1;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, "SELECT overall FROM verdict_set WHERE run_id=?1 AND set_no=?2", -1,
                           &s, NULL) != SQLITE_OK)
        return common_sql_err(db, e, "reading a verdict set");
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_int(s, 2, set);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) snprintf(word, 16, "%s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    if (rc == SQLITE_DONE)
        return tg_errf(e, "run %lld has no verdict set %d: run `tokgate rescore %lld`",
                       (long long)run_id, set, (long long)run_id);
    if (rc != SQLITE_ROW) return common_sql_err(db, e, "reading a verdict set");
    return 0;
}

int verdict_gate_passed(tg_store *st, const char *spec_name, const char *artifact_sha256,
                        int n_binaries, const char *const *binary_sha256, int64_t *run_id,
                        tg_err *e)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *s = NULL, *b = NULL;
    int ret = -1;
    *run_id = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT run.id FROM run JOIN spec ON spec.id = run.spec_id"
                           " JOIN artifact ON artifact.id = run.artifact_id"
                           " WHERE spec.name=?1 AND artifact.sha256=?2 ORDER BY run.id DESC",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "SELECT 1 FROM leg JOIN binary ON binary.id = leg.binary_id"
                           " WHERE leg.run_id=?1 AND binary.sha256=?2 LIMIT 1",
                           -1, &b, NULL) != SQLITE_OK) {
        common_sql_err(db, e, "looking up gate runs");
        goto out;
    }
    sqlite3_bind_text(s, 1, spec_name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, artifact_sha256, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(s, 0);
        int all = 1;
        for (int i = 0; i < n_binaries && all; i++) {
            sqlite3_reset(b);
            sqlite3_bind_int64(b, 1, id);
            sqlite3_bind_text(b, 2, binary_sha256[i], -1, SQLITE_STATIC);
            all = sqlite3_step(b) == SQLITE_ROW;
        }
        if (!all) continue;
        *run_id = id;
        char word[16];
        int set = 0;
        if (verdict_latest_set(st, id, &set, e) < 0) goto out;
        if (set == 0) {
            tg_errf(e, "the latest gate run of %s with these binaries and artifact (run %lld) was "
                       "never scored", spec_name, (long long)id);
            ret = 0;
            goto out;
        }
        if (verdict_get_overall(st, id, set, word, e) < 0) goto out;
        if (strcmp(word, "PASS")) {
            tg_errf(e, "the latest gate run of %s with these binaries and artifact (run %lld) "
                       "says TOKEN_GATE=%s", spec_name, (long long)id, word);
            ret = 0;
            goto out;
        }
        ret = 1;
        goto out;
    }
    if (rc != SQLITE_DONE) {
        common_sql_err(db, e, "looking up gate runs");
        goto out;
    }
    tg_errf(e, "no gate run of %s on artifact %.16s... with these binaries: run `tokgate gate` first",
            spec_name, artifact_sha256);
    ret = 0;
out:
    sqlite3_finalize(s);
    sqlite3_finalize(b);
    return ret;
}
