/*
 * compare.h: the facts of a stored run, computed from its rows only. For
 * every step of every arm (every leg) against the reference arm over the
 * same prefix: the class (EXACT | NEAR_TIE | RANK2 | TOPK | OUTSIDE, and
 * UNCOMPARABLE when the prefixes differ), the rank of the arm's token in the
 * reference top-k, both top1-top2 gaps and the KL divergence over the
 * reference top-k. Per run: clean and identical legs, tokenizer
 * divergences, ORACLE_SPLIT and the four-way resolution sentence of every
 * contested step, ORACLE_REPRO against the previous run, chain of custody,
 * reference-tier hits and device ops. verdict.c turns these facts into
 * verdicts and stores them; docs/verdicts.md states every rule.
 *
 * Ownership: compare_run returns a cmp_run the caller frees with
 * compare_free; every string inside belongs to it.
 */
#ifndef TG_COMPARE_H
#define TG_COMPARE_H

#include <stdint.h>

#include "store.h"
#include "util.h"

typedef enum cmp_class {
    CMP_EXACT = 0,
    CMP_NEAR_TIE,
    CMP_RANK2,
    CMP_TOPK,
    CMP_OUTSIDE,
    CMP_WITHIN_NOISE,   /* policy noise: an oracle variant emits it, inside the band (noise.h) */
    CMP_DEGENERATE,     /* the reference's top-k has a NaN/inf or is all equal, or the arm's
                         * has a NaN/inf: nothing to judge the token by; fails every policy */
    CMP_UNCOMPARABLE,   /* prefix differs from the reference's: not scored */
    CMP_N_CLASSES
} cmp_class;

/* "EXACT", "NEAR_TIE", ... (static strings). */
const char *compare_class_name(cmp_class c);

/* Does class c satisfy policy ("exact" | "near-tie" | "noise")? exact:
 * EXACT; near-tie: EXACT, NEAR_TIE; noise: EXACT, WITHIN_NOISE (a near tie
 * is not enough without the oracle's band). UNCOMPARABLE is never a
 * failure (it is not scored). */
int compare_class_ok(cmp_class c, const char *policy);

/* One compared step of one arm leg against the reference. */
typedef struct cmp_row {
    int prompt;              /* index into cmp_run.prompts */
    int step;
    int ref_leg;             /* reference leg number compared against */
    int32_t token, ref_token, ref_top2; /* ref_top2 -1 if none */
    int rank;                /* 1-based rank of token in the reference top-k, 0 outside */
    double ref_gap, own_gap; /* NaN when a top list has fewer than 2 entries */
    double kl;               /* KL(ref || arm) over the reference top-k, NaN if unknown */
    cmp_class cls;
    int oracle_split;        /* the oracle arms disagree at this (prompt, step) */
    int degenerate;          /* DEGENERATE: 1 the reference's logits, 2 the arm's */
    int noise;               /* noise_call (noise.h): 0 none, 1 within, 2 search hit only */
    double noise_dev, noise_band; /* the arm's deviation and band(token); NaN when unknown */
} cmp_row;

/* A prompt of one arm leg. */
typedef struct cmp_lp {
    int present;
    char *ids, *decoded_from; /* JSON arrays as stored, or NULL */
    char *text, *error;
    int n_steps;
    int32_t *token, *forced;  /* n_steps each; forced -1 if none */
    int *step_no;
    int *has_digest;
    int64_t *digest;
    int *n_top;
    tg_top **top;             /* n_steps lists */
} cmp_lp;

typedef struct cmp_leg {
    int64_t id;
    int leg;
    int exit_status, term_signal;
    char *cause, *fault_lines, *counters, *hello, *binary_sha256, *binary_path;
    int64_t device_ops, host_ops;
    int clean;
    char why[256];            /* why not clean */
    cmp_lp *lp;               /* one per run prompt */
    int n_rows;
    cmp_row *rows;            /* compare rows of this leg (not for the reference's leg 1) */
} cmp_leg;

/* Per arm x prompt facts on the arm's scoring leg. */
typedef struct cmp_arm_prompt {
    int tokenizer_diff;       /* own ids differ from the reference's */
    int tokenizer_known;      /* both id lists present */
    int n_compared;           /* steps scored (not UNCOMPARABLE) */
    int n_uncomparable;
    int missing_steps;        /* the reference has more steps */
    int count[CMP_N_CLASSES];
    int first_diff;           /* first non-EXACT compared step (row index), -1 none */
    int first_bad;            /* first step failing the policy (row index), -1 none */
    double kl_sum;
    int kl_n;
    char custody[16];         /* custody arms: EXACT | PREFIX | DIVERGE | UNKNOWN */
    int64_t custody_at;       /* PREFIX: shared bytes; DIVERGE: first differing byte */
} cmp_arm_prompt;

typedef struct cmp_arm {
    int64_t id;
    char *name, *kind, *role, *config;
    int is_ref, is_test, is_oracle, is_custody, is_device;
    char tier[16];            /* from hello/config: gpu | cpu | ref | "" */
    int n_legs;
    cmp_leg *legs;            /* ordered by leg number */
    int legs_expected;        /* the run's legs (the spec's), or n_legs when unknown */
    int legs_clean;
    int legs_identical;       /* clean legs byte-identical (1 with fewer than 2) */
    int identical_known;      /* at least 2 clean legs: legs_identical means something */
    char identical_why[256];
    int scoring;              /* index of the scoring leg (first clean, else first), -1 none */
    cmp_arm_prompt *ap;       /* one per run prompt */
    int64_t reference_tier_hits, device_ops, host_ops;
    char oracle_repro[8];     /* oracle arms: YES | NO | FIRST, else "" */
    int64_t repro_run;        /* the previous run compared with, 0 if none */
    char repro_why[256];
    int rank_hist[66];        /* scoring leg: [0] outside, [1..64] rank, [65] above 64 */
    int is_variant;           /* an oracle variant of the reference (variant_of chain) */
    int noise_within, noise_search; /* scoring leg: steps the noise rule passed / search hits */
} cmp_arm;

typedef struct cmp_prompt {
    int64_t id;
    char *name, *text;
} cmp_prompt;

/* A step where at least two arms emit different tokens. */
typedef struct cmp_contested {
    int prompt, step;
    int oracle_split;
    char *tokens;             /* "cpu=12 gpu=40 llama-cpu=12" */
    char *sentence;           /* four-way resolution */
} cmp_contested;

typedef struct cmp_run {
    int64_t run_id;
    char *spec_name, *spec_sha256, *artifact_sha256, *artifact_path, *mode, *reference;
    char policy[16];          /* policy scored with */
    double band;              /* band scored with */
    int steps, top_k;
    int legs;                 /* legs per arm the run was planned with (0: unknown) */
    int unfinished;           /* an arm has fewer legs stored than planned */
    char unfinished_why[320]; /* "run 7 is unfinished: ...; resume it with --resume 7" */
    int n_prompts;
    cmp_prompt *prompts;
    int n_arms;
    cmp_arm *arms;
    int ref;                  /* index of the reference arm */
    int ref_ok;               /* the reference's leg 1 exists and is clean */
    char ref_why[256];
    int n_contested;
    cmp_contested *contested;
    int n_degenerate;         /* steps of the reference's leg 1 whose top-k is degenerate */
    int n_variants;           /* oracle variants of the reference (noise band views - 1) */
    int n_bands;              /* steps of the reference's leg 1 with at least two views */
    struct cmp_band {
        int prompt, step;
        int n_views;          /* the reference and the variants comparable at the step */
        double ref_gap, spread; /* spread: band of the reference gap (NaN if unknown) */
        int n_tokens;
        int32_t tokens[8];    /* distinct top-1 tokens, the reference's first */
    } *bands;
} cmp_run;

/* Computes the facts of run_id under policy / band (the caller resolves
 * defaults). Returns 0 with *out, or -1 with e (no such run, the reference
 * names no arm, a corrupt step blob, a store error). */
int compare_run(tg_store *st, int64_t run_id, const char *policy, double band, cmp_run **out,
                tg_err *e);
void compare_free(cmp_run *r); /* NULL is a no-op */

/* Four-way resolution sentence for one step: n arms with their names, roles
 * (is_engine: role test; is_oracle: role oracle or the reference) and
 * tokens; truth is the reference's token. Writes into out[cap]. Exposed for
 * the tests of the rule set. */
void compare_sentence(int n, const char *const *names, const int *is_engine,
                      const int *is_oracle, const int32_t *tokens, int32_t truth, char *out,
                      size_t cap);

#endif
