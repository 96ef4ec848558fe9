/*
 * localize.h: where does the error start? `tokgate localize P/S --arms A,B
 * [--third C]` runs two (or three) arms as worker processes over one
 * identical prefix (a stored run's reference tokens, or the first arm's own
 * greedy tokens), asks the engine arms to dump every stage of every layer
 * at step S, and compares the dumps stage by stage: relative L2 error,
 * cosine, max abs error, growth against the same stage one layer earlier,
 * and the first stage whose error exceeds the noise floor. The floor comes
 * from a third arm pair (A vs C, times LOC_THIRD_FACTOR) or, without a
 * third arm, from the earlier layers' trend (LOC_TREND_FACTOR times the
 * largest error of the same stage in any earlier layer, or of the stage
 * just before in forward order); docs/localize.md states the rule.
 *
 * The comparison (localize_table) is a pure function of the tensors, so
 * crafted dumps test it; localize_run does the processes, the store record
 * (tables localize, localize_arm, localize_dump, localize_row; the dumps
 * zstd-compressed after a byte shuffle) and the printed table.
 *
 * Ownership: a loc_table belongs to the caller (localize_table_free);
 * every pointer argument is borrowed for the call.
 */
#ifndef TG_LOCALIZE_H
#define TG_LOCALIZE_H

#include <stdint.h>
#include <stdio.h>

#include "spec.h"
#include "store.h"
#include "util.h"

#define LOC_ABS_FLOOR 1e-5     /* relative L2 below this is never an error (f32 reordering) */
#define LOC_THIRD_FACTOR 4.0   /* floor = factor x the third pair's error at the same stage */
#define LOC_TREND_FACTOR 8.0   /* floor = factor x the largest earlier error (see above) */

/* One dumped tensor: layer -1 for the final logits. */
typedef struct loc_tensor {
    int layer;
    const char *stage;
    int64_t n;
    const float *data;       /* (n) */
} loc_tensor;

/* One (layer, stage) of the main pair. */
typedef struct loc_row {
    int layer;
    char stage[16];
    int64_t n;
    double rel_l2;           /* |b - a| / |a| (|b - a| when |a| = 0) */
    double cosine;           /* a.b / (|a||b|); NaN when either is zero */
    double max_abs;          /* max |b - a| */
    double growth;           /* rel_l2 / rel_l2 of the same stage one layer earlier; NaN */
    double third;            /* the third pair's rel_l2 at this stage; NaN without it */
    double floor;            /* the noise floor this row was judged against; NaN: not judged */
    int exceeds;             /* rel_l2 > floor */
} loc_row;

typedef struct loc_table {
    int n_rows;
    loc_row *rows;           /* (n_rows) layers in order, stages in forward order, logits last */
    int first;               /* index of the first row that exceeds its floor, -1 none */
    char rule[32];           /* "third-pair" | "trend" */
} loc_table;

/* Compares b against a (and, when c is not NULL, c against a as the third
 * pair) over the (layer, stage) pairs present in both a and b. Returns 0
 * with *out, or -1 with e (a tensor present in both with different n). */
int localize_table(loc_table **out, const loc_tensor *a, int na, const loc_tensor *b, int nb,
                   const loc_tensor *c, int nc, tg_err *e);
void localize_table_free(loc_table *t);  /* NULL is a no-op */

/* Forward order of a stage name (attn_norm 0 .. residual 7, logits 8), or
 * 99 for an unknown name. */
int localize_stage_order(const char *stage);

/* What `tokgate localize` was asked. */
typedef struct loc_request {
    const tg_spec *spec;     /* arms, model, top_k */
    const char *bin_dir;     /* tokgate's executables (tg-engine, tg-llama) */
    const char *prompt_id;
    int step;
    const char *arm_a, *arm_b, *third; /* third may be NULL */
    int64_t run_id;          /* > 0: the prefix is this run's reference tokens */
    const char *evidence_dir;/* NULL: no markdown evidence */
    const char *db_path;     /* the store's file, never overwritten by the evidence (may be NULL) */
    int show_top;            /* top-k rows shown per arm (0: 8) */
    int no_replay;           /* skip the stage replay (--no-replay) */
} loc_request;

typedef struct loc_outcome {
    int64_t localize_id;     /* the stored record */
    int first_layer;         /* of the first stage over the floor; -2 when none */
    char first_stage[16];    /* "" when none */
    char evidence_path[1024];/* "" when none written */
} loc_outcome;

/* Runs the arms, stores the record, prints the table to out. Returns 0 with
 * *res, or -1 with e (unknown arm, a command arm, the prompt not in the
 * run, an arm failure with its cause, a store error). */
int localize_run(tg_store *st, const loc_request *req, FILE *out, loc_outcome *res, tg_err *e);

/* The `tokgate localize` command: argv[1] is "localize". Parses
 * P/S [RUN] --arms A,B [--third C] [--spec FILE] [--db FILE] [--evidence DIR]
 * [--top N]; without --spec the spec is the stored run's (RUN, else the
 * latest run) and the prefix its reference's tokens; with --spec the first
 * arm decodes greedily. Returns the exit code: 0 when no stage exceeds the
 * floor, 1 when one does, 2 on a usage, input or arm error; --help prints
 * the usage and returns 0. */
int localize_main(int argc, char **argv);

/* The prefix of a stored run's prompt at step: the reference's leg-1
 * prompt ids (*ids, *n_ids) and the step tokens it appended before step
 * (*force, step ids), both malloc'ed. Returns 0 or -1 with e. */
int localize_prefix(tg_store *st, int64_t run, const char *prompt, int step, int32_t **ids, int *n_ids,
                    int32_t **force, tg_err *e);

#endif
