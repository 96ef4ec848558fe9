/*
 * report.h: reports of a scored run, read from the store only (the run's
 * rows, the compare rows and the verdict rows of one verdict set). Every
 * figure a report prints can be recomputed from those rows with sqlite3
 * (docs/store.md has the queries).
 *
 * Formats:
 *   text   terminal tables: per arm x prompt (first differing step, tokens,
 *          gaps, class), the four-way table of contested steps, the near-tie
 *          set, then the machine keys (KEY=VALUE, one a line).
 *   md     evidence file: identity block (sha256 of artifact, binaries,
 *          spec), the tables, the keys, SVG plots (rank histogram, gap vs
 *          step with divergences marked) inline.
 *   junit  one <testcase> per arm x prompt, a <failure> with the first
 *          differing step.
 *   json   everything above as one JSON object.
 *
 * Ownership: every pointer argument is borrowed for the call; out is not
 * closed.
 */
#ifndef TG_REPORT_H
#define TG_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "store.h"
#include "util.h"

typedef enum report_format {
    REPORT_TEXT = 0,
    REPORT_MD,
    REPORT_JUNIT,
    REPORT_JSON
} report_format;

/* Parses "text" | "md" | "junit" | "json" into *out. Returns 0, or -1 with e
 * naming the word and the accepted ones. */
int report_parse_format(const char *word, report_format *out, tg_err *e);

typedef struct report_options {
    report_format format;
    int verdict_set;         /* 0: the latest set of the run */
} report_options;

/* Writes the report of run_id in opt->format to out. The run must have been
 * scored (verdict_score_run) at least once. Returns 0, or -1 with e (no such
 * run, no verdict set: "run 7 has no verdicts: run `tokgate rescore 7`",
 * write error). */
int report_write(tg_store *st, int64_t run_id, const report_options *opt, FILE *out, tg_err *e);

/* Writes only the machine keys of run_id / verdict set (0 = latest), one
 * KEY=VALUE a line: the global block first (TOKEN_GATE=,
 * TOKENIZER_DIVERGENCES=k/n, GENERATION_DIVERGENCES=k/n, LEGS_CLEAN=k/n,
 * LEGS_IDENTICAL=, ORACLE_REPRO=, CHAIN_OF_CUSTODY= when a custody arm
 * exists, REFERENCE_TIER_HITS=, DEVICE_OPS=), then per arm
 * `ARM.<name>.<KEY>=<value>` lines. Returns 0 or -1 with e. */
int report_write_keys(tg_store *st, int64_t run_id, int verdict_set, FILE *out, tg_err *e);

/* Parses "P/S" (prompt id, '/', step number >= 0) into prompt[64] and *step.
 * Returns 0, or -1 with e naming what was expected. */
int report_parse_step_ref(const char *ref, char prompt[64], int *step, tg_err *e);

/* `tokgate step P/S [RUN]`: one step of one prompt across every arm and leg
 * 1 (token, top-2 with logits, own gap, class against the reference, rank)
 * and the step's resolution sentence, from the latest verdict set (set 0)
 * or the given one. Returns 0, or -1 with e (unknown prompt, step out of
 * range, run not scored). */
int report_step(tg_store *st, int64_t run_id, const char *prompt_id, int step,
                int verdict_set, FILE *out, tg_err *e);

#endif
