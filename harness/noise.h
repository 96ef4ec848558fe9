/*
 * noise.h: the oracle's own noise band, and the statistics beside it.
 *
 * A spec may name oracle variants (`variant_of: X`): the same llama.cpp
 * build with other load options (flash attention, n_ubatch, threads, KV
 * type) or other builds (x86, aarch64 under qemu, CUDA). In teacher-forced
 * mode they decode over the reference's prefix like every other arm, so at
 * every step each variant gives its own view of the same logits. This
 * module turns those views into the step's noise band and decides, for one
 * arm's token, whether the difference from the reference lies inside it.
 * docs/verdicts.md ("WITHIN_NOISE and the noise policy") states the rules;
 * this file is their only implementation. Nothing here touches the store:
 * compare.c feeds it rows, so crafted transcripts test it directly.
 *
 * Definitions, for a step whose reference top-1 is r and top-2 is r2:
 *   d_v(t)  = L_v(r) - L_v(t), the logit margin of r over t in view v
 *             (known when both ids are in v's top-k);
 *   band(t) = max_v d_v(t) - min_v d_v(t) over the variants that know it
 *             (the reference included; at least two are needed);
 *   the step's band = band(r2): the spread of the reference gap.
 * An arm emitting t != r is WITHIN the noise when some variant other than
 * the arm itself emits t as its top-1 AND its own deviation from the
 * reference, d_ref(t) - d_arm(t), is at most band(t). A variant that emits
 * t without the arm's deviation fitting the band is only a *search hit*
 * (one of many configurations happened to say t): never counted as right.
 *
 * Ownership: every pointer argument is borrowed for the call.
 */
#ifndef TG_NOISE_H
#define TG_NOISE_H

#include <stdint.h>

#include "util.h"

/* One view of a step: a variant's (or an arm's) top-1 and top-k logits. */
typedef struct noise_view {
    int32_t token;           /* its argmax */
    int n_top;
    const tg_top *top;       /* (n_top), descending */
} noise_view;

/* The noise band of one step over the reference's variant family. */
#define NOISE_MAX_TOKENS 8
typedef struct noise_step {
    int n_views;             /* variants seen at this step, the reference included */
    double ref_gap;          /* reference top1 - top2 (NaN when unknown) */
    double spread;           /* band(r2): spread of the reference gap; NaN with < 2 known */
    int n_tokens;            /* distinct top-1 tokens across the variants (reference first) */
    int32_t tokens[NOISE_MAX_TOKENS];
} noise_step;

/* Outcome of noise_judge. */
typedef enum noise_call {
    NOISE_NONE = 0,          /* no other variant emits the arm's token */
    NOISE_WITHIN,            /* WITHIN_NOISE: emitted by a variant, deviation inside the band */
    NOISE_SEARCH             /* emitted by a variant, but outside the band (or no band) */
} noise_call;

/* Logit of id in top[n], or NaN when absent. */
double noise_logit(const tg_top *top, int n, int32_t id);

/* The band of a step from views[0..n-1], views[0] being the reference.
 * Fills *out (n_views 0 when n < 1). Never fails. */
void noise_band(const noise_view *views, int n, noise_step *out);

/* Judges an arm that emitted token (its top list arm_top[arm_n]) against
 * the variant views (views[0] = the reference; the arm itself must not be
 * among them). *dev and *band (either may be NULL) receive the arm's
 * deviation d_ref - d_arm and band(token), NaN when unknown. Returns the
 * call; NOISE_NONE when token is the reference's top-1. */
noise_call noise_judge(const noise_view *views, int n, int32_t token, const tg_top *arm_top,
                       int arm_n, double *dev, double *band);

/* Exact two-sided McNemar test of two arms' divergence rates over the same
 * (paired) steps: b steps where only the first arm diverges, c where only
 * the second does. Returns the p-value (1 when b + c == 0). */
double noise_mcnemar(int b, int c);

#endif
