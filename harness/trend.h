/*
 * trend.h: history of a spec across runs kept in one store (nightly sweeps,
 * merged shards). For each spec, the runs on the artifact of its latest run
 * are put in time order (run.started, then id) and, for every scored arm,
 * the latest run is compared with each earlier one on: the arm's
 * TOKEN_GATE (new FAILs, flips), its divergence rate and Wilson interval,
 * the near ties it lost, the largest reference gap it lost, and the mean KL
 * divergence over the top-k. Everything is read from the latest verdict
 * set of each run (verdict and compare rows); nothing runs.
 *
 * A regression is: a verdict worse than an earlier run's (PASS <
 * NOT_MEASURABLE < FAIL), a divergence-rate interval entirely above an
 * earlier run's, or a mean KL above TREND_KL_FACTOR times an earlier
 * run's plus TREND_KL_FLOOR. Its first run is the earliest run after the
 * most recent good baseline that is already worse than that baseline.
 * Other differences are reported as changes and do not fail.
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

typedef struct trend_result {
    int n_runs;              /* runs of the spec on the latest run's artifact, with a verdict set */
    int n_regressions;       /* (arm, metric) regressions found */
    int n_changes;           /* other differences from the previous run */
    int64_t first_run;       /* the earliest first run of any regression, or 0 */
} trend_result;

/* Writes the trend of spec_name to out (text, or markdown with an inline
 * SVG plot when md != 0) and fills *r. Returns 0 (the spec may have just one
 * run: nothing to compare), or -1 with e (no run of that spec, store errors). */
int trend_spec(tg_store *st, const char *spec_name, int md, FILE *out, trend_result *r, tg_err *e);

/* The SVG trend plot of spec_name (divergence rate per run and arm, with its
 * interval; FAIL runs marked) to out. Returns 0 or -1 with e. */
int trend_svg(tg_store *st, const char *spec_name, FILE *out, tg_err *e);

/* `tokgate trend [SPEC] [--db F] [--format text|md] [--out FILE] [--svg DIR]`:
 * every spec of the store when SPEC is not given. Exit code: 0 no
 * regression, 1 a regression, 2 usage or store error. */
int trend_main(int argc, char **argv);

#endif
