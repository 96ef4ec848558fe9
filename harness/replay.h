/*
 * replay.h: stage replay against the exact arbiter (docs/localize.md,
 * "Stage replay"; the request is docs/protocol.md's "replay").
 *
 * For one token sequence (a prompt and the prefix of a step), the arbiter
 * (tg-engine --tier ref, f64 sums, the yardstick) records every stage of
 * every layer for every position, applying the roundings the tested arm
 * declares (its "numerics": activations through the weights' vec_dot type,
 * an F16 KV cache, ...). The arm then replays the sequence with the
 * arbiter's values written over each stage's output, so each stage
 * computes from exact inputs, and records what it computed. The
 * difference per stage is the stage's own error, free of inherited error;
 * what legitimately remains is accumulation-order noise, and each stage is
 * judged against a budget: a stated noise model (replay_noise) times
 * RP_MARGIN.
 *
 * Attribution (replay_attribute): each layer's own contribution to the
 * shift of a logit gap, from the arm's layer run on exact inputs and the
 * arbiter running every other layer exactly.
 *
 * Ownership: tables and files belong to the caller (their _free; NULL is a
 * no-op); pointer arguments are borrowed for the call.
 */
#ifndef TG_REPLAY_HARNESS_H
#define TG_REPLAY_HARNESS_H

#include <stdint.h>
#include <stdio.h>

#include "spec.h"
#include "store.h"
#include "util.h"

#define RP_MARGIN 16.0        /* budget = RP_MARGIN x the noise model */
#define RP_U32 0x1p-24        /* f32 unit roundoff */
#define RP_U16 0x1p-11        /* f16 unit roundoff */
#define RP_N_STAGES 23        /* engine/replay_hook.h's enum (TG_RS_COUNT) */

/* A replay file (engine/replay_hook.h's format, read and written through its tg_rfile_*). */
typedef struct rp_record {
    int layer;                /* -1: after the last layer */
    int stage;                /* 0..RP_N_STAGES-1 */
    int64_t n;
    float *data;              /* (n) */
} rp_record;

typedef struct rp_file {
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_tokens;
    int n_rec;
    rp_record *rec;
} rp_file;

int rp_file_read(rp_file **out, const char *path, tg_err *e);
/* Writes the header of f and the records keep(i) selects (NULL: all).
 * Returns 0 or -1 with e. */
int rp_file_write(const rp_file *f, const char *path, int (*keep)(const rp_record *r, void *ud), void *ud,
                  tg_err *e);
void rp_file_free(rp_file *f);
const rp_record *rp_file_find(const rp_file *f, int layer, int stage);

const char *replay_stage_name(int stage);   /* "q_rope"; "?" */
int replay_stage_parse(const char *s);      /* the stage or -1 */

/* What an arm declares about its numerics (its load answer's "numerics",
 * else its hello's). */
typedef struct rp_numerics {
    int exact;                /* f64 sums, no rounding but f32 outputs */
    int act_vec_dot;          /* matmul inputs quantized to the weights' vec_dot type */
    int acc_f16;              /* attention V accumulated in f16 */
    int accum_f64;            /* dot products summed in f64 */
    int silu_approx;          /* a vectorized expf approximation in silu */
} rp_numerics;
/* Parses a numerics object text. Returns 0 or -1 with e. */
int replay_numerics_parse(const char *json, rp_numerics *n, tg_err *e);

/* The noise model of one token's output of a stage (relative L2), for an
 * arm with numerics n, a model of f's dimensions, at position pos
 * (docs/localize.md states it). */
double replay_noise(const rp_numerics *n, const rp_file *f, int stage, int pos);

/* One (layer, stage) of a replay comparison. */
typedef struct rp_row {
    int layer, stage;
    int64_t n;
    double rel_l2;            /* over all tokens */
    double max_rel;           /* the largest per-token relative L2 */
    int worst_pos;            /* the token of the largest ratio */
    double budget;            /* RP_MARGIN x noise at worst_pos */
    double ratio;             /* max over tokens of rel / budget (inf: NaN or a missing value) */
    int over;                 /* ratio > 1 */
} rp_row;

typedef struct rp_table {
    int n_rows;
    rp_row *rows;             /* forward order: layers, stages, then layer -1 */
    int first;                /* the first row over budget, -1 none */
    int n_over;
    int prefill;              /* replay_run: the arm took positions 0..prefill-1 in one batch, then one
                               * at a time (0: all in one batch) */
} rp_table;

/* Compares the arm's record with the arbiter's, (layer, stage) present in
 * both. Returns 0 with *out or -1 with e (different dimensions, sizes). */
int replay_compare(const rp_file *ref, const rp_file *arm, const rp_numerics *num, rp_table **out, tg_err *e);
void replay_table_free(rp_table *t);
void replay_table_print(FILE *out, const rp_table *t, int md);

/* Attribution of a logit gap's shift to the layers. */
typedef struct rp_attr {
    int tok1, tok2;           /* gap = logit[tok1] - logit[tok2] */
    double gap_exact;         /* the arbiter's gap */
    double gap_arm;           /* the arm's own gap (its free run) */
    int n_layer;
    double *shift;            /* (n_layer) gap with layer L the arm's - gap_exact */
} rp_attr;
void replay_attr_free(rp_attr *a);
void replay_attr_print(FILE *out, const rp_attr *a, int md);

/* What replay_run is asked. */
typedef struct rp_request {
    const tg_spec *spec;      /* the model and the arm */
    const char *bin_dir;      /* tg-engine for the arbiter */
    int arm;                  /* index of the arm in spec */
    const int32_t *tokens;    /* the sequence: prompt ids then the prefix's tokens */
    int n_tokens;
    int prefill;              /* the prompt's length: an arm whose hello says "replay_prefill" evaluates
                               * it in one batch and each later token alone, as in a run (0: all in one) */
    int attribute;            /* also attribute the gap shift to layers */
    int tok2;                 /* attribution: the second token (-1: the arbiter's top-2, or the arm's top-1 when it differs) */
} rp_request;

/* Runs the arbiter and the arm. Returns 1 with *table (and *attr when
 * asked), 0 when the arm cannot replay (its hello says so: *why says it),
 * -1 with e. */
int replay_run(const rp_request *q, rp_table **table, rp_attr **attr, char *why, size_t why_n, tg_err *e);

/* The gate's replay (spec field replay: {steps: N, gate: B}): every engine
 * or exec arm but the ref tier (the arbiter's own code) and custody arms,
 * over each prompt's reference prefix of max(N, the arm's last contested
 * step) steps. Adds verdict keys to set `set` of run: REPLAY per arm and
 * prompt (PASS | FAIL), per arm (PASS | FAIL | NONE: cannot replay |
 * ARBITER) and overall; with gate, a FAIL sets the overall TOKEN_GATE and
 * the set's verdict to FAIL and *fail_gate. Progress and OVER_BUDGET lines
 * go to log (NULL: none). No-op without the field. Returns 0 or -1 with e. */
int replay_gate(tg_store *st, const tg_spec *s, int64_t run, int set, const char *bin_dir, FILE *log,
                int *fail_gate, tg_err *e);

#endif
