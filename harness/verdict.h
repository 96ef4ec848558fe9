/*
 * verdict.h: scoring a stored run. A scoring pass reads the run's legs and
 * steps from the store, compares every step of every arm with the
 * reference arm over the same prefix (compare.h), decides a verdict per arm
 * and per arm x prompt under a policy (exact | near-tie with a band), and
 * writes the result as a new *verdict set* (verdict rows + compare rows),
 * so re-scoring a run with another band or policy keeps the history of
 * earlier sets. Nothing here runs a process: the store is the only input.
 *
 * The rules (classes, clean/identical legs, four-way resolution sentences,
 * provenance keys) are documented in docs/verdicts.md.
 *
 * Ownership: every pointer argument is borrowed for the call.
 */
#ifndef TG_VERDICT_H
#define TG_VERDICT_H

#include <stdint.h>

#include "store.h"
#include "util.h"

/* Options of a scoring pass. Zero-initialise, then override:
 *   policy_kind NULL   -> the run's own policy (run.policy)
 *   band < 0 or NaN    -> the run's own band   (run.band)
 * Use verdict_options_default() to get that zero state with band = -1. */
typedef struct verdict_options {
    const char *policy_kind; /* "exact" | "near-tie" | "noise" or NULL */
    double band;             /* near-tie band in logits, or < 0 for the run's */
} verdict_options;

/* The run's own policy and band (policy_kind NULL, band -1). */
verdict_options verdict_options_default(void);

/* What a scoring pass decided. */
typedef struct verdict_result {
    int64_t run_id;
    int set;                 /* the verdict set number written (1, 2, ...) */
    char verdict[16];        /* overall: PASS | FAIL | NOT_MEASURABLE */
    int exit_code;           /* 0 PASS, 1 FAIL or NOT_MEASURABLE */
    char policy_kind[16];    /* the policy actually used */
    double band;             /* the band actually used */
    int n_test_arms;         /* arms scored (every arm but the reference and custody arms) */
    int n_pass;              /* of those, how many passed */
} verdict_result;

/* Scores run_id and stores a new verdict set (one transaction). Used by
 * `tokgate gate` after the legs and by `tokgate rescore`. It does not change
 * run.verdict: the gate calls store_finish_run(result.verdict) itself, a
 * rescore leaves the gate's original verdict in place (the new set is
 * visible to report/step, which show the latest set unless told otherwise).
 * Returns 0 with *out filled, or -1 with e (unknown run, unknown policy,
 * band negative for near-tie, a reference arm without legs, store errors).
 * Policy "noise" passes EXACT and WITHIN_NOISE steps only (noise.h: an
 * oracle variant emits the token and the deviation is inside the band). */
int verdict_score_run(tg_store *st, int64_t run_id, const verdict_options *opt,
                      verdict_result *out, tg_err *e);

/* Number of the latest verdict set of run_id into *set (0 when the run has
 * never been scored). Returns 0, or -1 with e. */
int verdict_latest_set(tg_store *st, int64_t run_id, int *set, tg_err *e);

/* The overall TOKEN_GATE of a stored verdict set (set 0 = latest) into
 * word[16] (PASS | FAIL | NOT_MEASURABLE). Returns 0, or -1 with e (no
 * such set). */
int verdict_get_overall(tg_store *st, int64_t run_id, int set, char word[16], tg_err *e);

/* For `tokgate bench`: finds the latest run of spec_name on the artifact
 * with sha256 artifact_sha256 whose legs used every binary sha256 listed
 * (n_binaries of them; binaries the run used but not listed are ignored),
 * and checks that its latest verdict set says TOKEN_GATE=PASS.
 * Returns 1 (allowed; *run_id is that run), 0 (refused; e says why in one
 * sentence: no such run, or its verdict), -1 on a store error (e). */
int verdict_gate_passed(tg_store *st, const char *spec_name, const char *artifact_sha256,
                        int n_binaries, const char *const *binary_sha256,
                        int64_t *run_id, tg_err *e);

/* Wilson score interval (95%, z = 1.96) of k successes in n trials into
 * [*lo, *hi]; n == 0 gives [0, 1]. */
void verdict_wilson(int k, int n, double *lo, double *hi);

#endif
