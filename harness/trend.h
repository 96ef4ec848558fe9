/*
 * trend.h: history of a spec across runs kept in one store (nightly sweeps,
 * merged shards). For each spec, its runs with a verdict set are put in
 * time order (run.started, then id), each read from its latest verdict set,
 * and walked from the first: every run is compared with its baseline, the
 * last TREND_WINDOW (or --window) good runs before it. A run is good when
 * its verdict is PASS and it shows no regression against its own baseline,
 * or when a team accepted it (`tokgate baseline accept`); a run without
 * data (an arm that could not load) is never good, and runs a team
 * excluded (`tokgate baseline exclude`) take no part at all. The decisions
 * and their reasons are kept in the store (table trend_mark, keyed by
 * run.uid, so they travel with `tokgate merge`).
 *
 * Regressions of a run against its baseline, per scored arm:
 * - verdict: worse than a baseline run's (PASS < NOT_MEASURABLE < FAIL);
 * - divergence rate: its Wilson interval entirely above a baseline run's;
 * - KL divergence: above TREND_KL_FACTOR times a baseline run's plus
 *   TREND_KL_FLOOR;
 * - determinism: with the binaries (every arm's worker and library), the
 *   model and the spec text of the latest baseline run unchanged, any
 *   token or logits digest that differs from it;
 * - tokens: with one of those changed, any token that differs from it.
 * In teacher-forced mode every arm decodes over the reference's tokens, so
 * when the reference's tokens changed only the reference is blamed. Each
 * regression names the baseline run, the first run where it appeared and
 * the likely cause: what changed between the two (the model's sha256, an
 * arm's configuration or binaries, other spec keys; the device and host as
 * context), saying which arm changed. Other differences from the previous
 * run are reported as changes and do not fail.
 *
 * Ownership: every pointer argument is borrowed for the call.
 */
#ifndef TG_TREND_H
#define TG_TREND_H

#include <stdint.h>
#include <stdio.h>

#include "store.h"
#include "util.h"

#define TREND_KL_FACTOR 4.0
#define TREND_KL_FLOOR 1e-4
#define TREND_WINDOW 5           /* good runs a run is compared with, by default */

struct sqlite3;

typedef struct trend_result {
    int n_runs;              /* runs of the spec with a verdict set, excluded ones left out */
    int n_excluded;          /* runs a team excluded */
    int n_baseline;          /* good runs the latest was compared with */
    int n_regressions;       /* (arm, kind) regressions of the latest run */
    int n_changes;           /* other differences from the previous run */
    int64_t latest_run;      /* the run the trend is about (the latest not excluded), or 0 */
    int64_t first_run;       /* the earliest first run of any regression, or 0 */
    char word[16];           /* TREND: FIRST | CLEAN | REGRESSION | NO_BASELINE */
} trend_result;

/* Writes the trend of spec_name to out (text, or markdown with an inline
 * SVG plot when md != 0), comparing each run with the last window good runs
 * before it (window <= 0: TREND_WINDOW), and fills *r. Returns 0 (the spec
 * may have just one run: nothing to compare), or -1 with e (no run of that
 * spec, store errors). */
int trend_spec(tg_store *st, const char *spec_name, int md, int window, FILE *out, trend_result *r, tg_err *e);

/* The SVG trend plot of spec_name (divergence rate per run and scored arm,
 * with its interval; FAIL runs red, runs without data marked) to out.
 * Returns 0 or -1 with e. */
int trend_svg(tg_store *st, const char *spec_name, FILE *out, tg_err *e);

/* Copies the baseline decisions (trend_mark rows) of the store attached as
 * "src" into the main store of db, skipping those it already holds (for
 * `tokgate merge`). Returns 0 or -1 with e. */
int trend_copy_marks(struct sqlite3 *db, tg_err *e);

/* `tokgate trend [SPEC...] [--db F] [--window N] [--plan PLAN] [--format
 * text|md] [--out FILE] [--svg DIR]`: every spec of the store (or of the
 * plan) when no SPEC is given. Exit code: 0 no regression, 1 a regression,
 * 2 usage or store error. */
int trend_main(int argc, char **argv);

/* `tokgate baseline accept|exclude|clear RUN --reason TEXT [--db F]` and
 * `tokgate baseline list [SPEC] [--db F]`: the team's decisions about runs,
 * kept in the store with their reason. Exit code 0, or 2 on usage or store
 * errors (an unknown run, a run without data accepted, no reason). */
int trend_baseline_main(int argc, char **argv);

#endif
