/*
 * calibrate.h: the calibrated gate and the exact arbiter.
 *
 * A spec may declare a *panel* of legitimate variants: arms with
 * `variant_of: X` (the cpu tier on other kernels, thread counts or KV
 * types, llama.cpp with flash attention off or on another backend) and the
 * arms they name. Every panel arm is a legitimate build of the same model,
 * so the panel measures how far legitimate builds move the logits. From a
 * run's panel (or from a calibration stored by an earlier run, `from:`)
 * this module derives, with stated factors (docs/verdicts.md "Calibration"):
 *
 *   - per step, the band the panel spans: the spread of the reference gap
 *     across the panel's views; a step is *fragile* when some legitimate
 *     view emits another top-1 there. An arm is judged with the band of the
 *     views outside its own family (the arms sharing its variant_of root,
 *     whose code it shares; an oracle, not under test, only without its own
 *     view), times `factor`;
 *   - per arm, control limits on KL mean, divergence rate and distance
 *     from exact arithmetic: the panel's mean + limit_k x its standard
 *     deviation (again without the arm's own family);
 *   - with an exact arm (`exact:`, an engine arm of tier ref, which agrees
 *     with an fp64 evaluation of the quantized model to about 1e-5), every
 *     arm's distance from exact arithmetic per step (max and median
 *     |logit difference| over the shared top-k, KL) and the error budget:
 *     an arm's mean distance may be at most `budget` times the reference
 *     oracle's own.
 *
 * Policies: `calibrated` judges a step by its calibrated band and an arm
 * also by its control limits; `error-budget` tolerates a flip when exact
 * arithmetic's own margin between the two tokens is within budget x the
 * reference oracle's error at that step, and fails an arm over its budget.
 * Under every policy the facts are computed and stored when the run has a
 * panel or an exact arm, so a rescore needs no new run.
 *
 * compare.c calls calibrate_steps() after the noise pass (it reclassifies
 * rows under the two policies) and calibrate_arms() after the per-prompt
 * facts; verdict.c calls calibrate_store() inside its transaction and
 * calibrate_arm_fails() when deciding an arm. Nothing here runs a process.
 *
 * Ownership: cal_run belongs to its cmp_run (compare_free frees it).
 */
#ifndef TG_CALIBRATE_H
#define TG_CALIBRATE_H

#include <stdint.h>
#include <stdio.h>

#include "compare.h"
#include "spec.h"
#include "store.h"
#include "util.h"

struct sqlite3;

/* Metrics with control limits: KL mean against the reference, divergence
 * rate, and the distance from exact arithmetic as the mean of each step's
 * median |logit difference| (EXACT_ERR) and of each step's KL (EXACT_KL). */
enum { CAL_KL, CAL_DIV, CAL_EXACT, CAL_EXACT_KL, CAL_N_METRICS };

/* "KL_MEAN", "DIVERGENCE_RATE", "EXACT_ERR", "EXACT_KL" (static strings). */
const char *calibrate_metric_name(int metric);

typedef struct cal_limit {
    int known;               /* a limit exists (at least two panel values) */
    double value;            /* the arm's own value (NaN when unknown) */
    int n;                   /* panel values the limit comes from */
    double mean, sd, upper;  /* upper = mean + limit_k * sd */
    int ok;                  /* value <= upper (1 when unknown) */
    char basis[256];         /* the arms the panel values came from */
} cal_limit;

/* One step of the reference's leg 1, over every panel view. */
typedef struct cal_step {
    int prompt, step;
    int n_views;
    double ref_gap;          /* reference top1 - top2 */
    double spread;           /* max - min of the views' margin of r over r2 (NaN < 2 views) */
    double band;             /* factor * spread (NaN when unknown) */
    int fragile;             /* some view's top-1 is not the reference's */
    char flipped_by[256];    /* those views, comma-separated */
    int32_t exact_token;     /* the exact arm's top-1, -1 when unknown */
    double exact_gap;        /* the exact arm's margin of r over r2 (NaN unknown) */
} cal_step;

/* One arm at one reference step (same index as cal_run.steps). */
typedef struct cal_arm_step {
    double band;             /* the calibrated band the arm is judged with here (NaN: none) */
    int n_shared;            /* ids shared with the exact arm's top-k (0: no distance) */
    double ex_max, ex_med, ex_kl; /* distance from exact arithmetic */
} cal_arm_step;

typedef struct cal_arm {
    int panel;               /* a panel member */
    int family;              /* index of its variant_of root */
    int n_exact;             /* steps with a distance from exact */
    double exact_err, exact_max, exact_kl; /* means over those steps */
    cal_limit lim[CAL_N_METRICS];
    int budget_known, budget_ok;
    double budget_ratio;     /* exact_err / the reference's */
    cal_arm_step *st;        /* (cal_run.n_steps) */
} cal_arm;

typedef struct cal_run {
    char exact_name[128];    /* the exact arm ("" none) */
    int exact;               /* its index, -1 none */
    double factor, limit_k, budget;
    char from[128];          /* stored calibration's spec name ("" this run) */
    int64_t from_run;        /* the run it came from (0: this run) */
    struct {                 /* its whole panel's statistics per metric (from_run) */
        int known, n;
        double mean, sd;
        char basis[256];
    } stored[CAL_N_METRICS];
    int n_panel;
    char panel[512];         /* panel arm names, comma-separated */
    int n_steps;
    cal_step *steps;
    int n_arms;
    cal_arm *arms;           /* (n_arms = cmp_run.n_arms) */
} cal_run;

/* Stores the spec's calibration parameters (exact arm, factors, from) for
 * run_id, so a scoring pass reads them from the store. Called by the gate
 * after store_begin_run. Returns 0 or -1 with e. */
int calibrate_put_params(tg_store *st, int64_t run_id, const tg_spec *s, tg_err *e);

/* After compare.c's noise pass: reads the run's parameters, finds the
 * panel, computes every step's band, every arm's per-step band and its
 * distance from exact arithmetic, and under policy calibrated or
 * error-budget reclassifies the non-EXACT rows (NEAR_TIE when tolerated).
 * Leaves r->cal NULL when the run has neither a panel nor an exact arm nor
 * a stored calibration to use. Returns 0 or -1 with e. */
int calibrate_steps(struct sqlite3 *db, cmp_run *r, tg_err *e);

/* After the per-prompt facts and the contested steps: control limits, the
 * error budget, and the contested sentences (a step where no arm fails
 * under the policy says "near tie (gap g, band b)" and what exact
 * arithmetic says). Returns 0 or -1 with e. */
int calibrate_arms(cmp_run *r, tg_err *e);

/* Writes calib_set, calib_step, calib_limit and calib_arm_step rows of
 * verdict set `set` (inside the caller's transaction). Returns 0 or -1
 * with e. No-op when r->cal is NULL. */
int calibrate_store(struct sqlite3 *db, const cmp_run *r, int set, tg_err *e);

/* Under policy calibrated (control limits) or error-budget (the budget):
 * 1 when arm a fails, with the reason in why[cap]; else 0. */
int calibrate_arm_fails(const cmp_run *r, int a, char *why, size_t cap);

void calibrate_free(cal_run *c); /* NULL is a no-op */

/* The calibration section of a report of verdict set `set` of run, from
 * the store only (calreport.c): the panel, the fragile steps, every arm's
 * control limits and error budget and the distribution of its distance
 * from exact arithmetic; markdown adds the plots (gaps on a log scale with
 * the band and the fragile steps, each arm's distance from exact per
 * step). Writes nothing for a set without calibration rows. Returns 0, or
 * -1 on a write error. */
int calibrate_report(struct sqlite3 *db, int64_t run, int set, int markdown, FILE *out);

/* `tokgate calibrate SPEC [--db FILE] [--jobs N]` (calibrate_cmd.c): runs
 * the spec, scores it under policy calibrated, stores the calibration and
 * prints the report. Returns the exit code: 0 when every panel arm passes,
 * 1 when one fails, 2 on a usage or input error. */
int calibrate_main(int argc, char **argv);

#endif
