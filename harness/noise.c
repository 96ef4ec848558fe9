/*
 * noise.c: the noise band of a step over an oracle's variants, the
 * WITHIN_NOISE decision for one arm's token, and the paired test of two
 * arms' divergence rates (noise.h states the definitions; docs/verdicts.md
 * the rules). Pure functions over top-k lists: no store, no allocation.
 */
#include "noise.h"

#include <math.h>
#include <stddef.h>

double noise_logit(const tg_top *top, int n, int32_t id)
{
    for (int i = 0; i < n; i++)
        if (top[i].id == id) return (double)top[i].logit;
    return NAN;
}

/* d_v(t) = L_v(r) - L_v(t), NaN when either id is missing or not finite. */
static double margin(const noise_view *v, int32_t r, int32_t t)
{
    double lr = noise_logit(v->top, v->n_top, r), lt = noise_logit(v->top, v->n_top, t);
    if (!isfinite(lr) || !isfinite(lt)) return NAN;
    return lr - lt;
}

/* max - min of d_v(t) over the views that know it; NaN with fewer than 2.
 * *d_ref receives the reference's (views[0]) margin. */
static double spread_of(const noise_view *views, int n, int32_t r, int32_t t, double *d_ref)
{
    double lo = INFINITY, hi = -INFINITY;
    int known = 0;
    *d_ref = NAN;
    for (int i = 0; i < n; i++) {
        double d = margin(&views[i], r, t);
        if (i == 0) *d_ref = d;
        if (!isfinite(d)) continue;
        known++;
        if (d < lo) lo = d;
        if (d > hi) hi = d;
    }
    return known >= 2 ? hi - lo : NAN;
}

void noise_band(const noise_view *views, int n, noise_step *out)
{
    out->n_views = n > 0 ? n : 0;
    out->ref_gap = out->spread = NAN;
    out->n_tokens = 0;
    if (n < 1) return;
    const noise_view *ref = &views[0];
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < out->n_tokens; k++) seen |= out->tokens[k] == views[i].token;
        if (!seen && out->n_tokens < NOISE_MAX_TOKENS) out->tokens[out->n_tokens++] = views[i].token;
    }
    if (ref->n_top < 2) return;
    int32_t r = ref->top[0].id, r2 = ref->top[1].id;
    out->ref_gap = (double)ref->top[0].logit - (double)ref->top[1].logit;
    double d0;
    out->spread = spread_of(views, n, r, r2, &d0);
}

noise_call noise_judge(const noise_view *views, int n, int32_t token, const tg_top *arm_top,
                       int arm_n, double *dev, double *band)
{
    if (dev) *dev = NAN;
    if (band) *band = NAN;
    if (n < 1 || views[0].n_top < 1) return NOISE_NONE;
    int32_t r = views[0].top[0].id;
    if (token == r) return NOISE_NONE;
    int emitted = 0;
    for (int i = 1; i < n; i++) emitted |= views[i].token == token;
    double d_ref;
    double b = spread_of(views, n, r, token, &d_ref);
    noise_view self = {token, arm_n, arm_top};
    double d_arm = margin(&self, r, token);
    double x = d_ref - d_arm;
    if (dev) *dev = x;
    if (band) *band = b;
    if (!emitted) return NOISE_NONE;
    return isfinite(b) && isfinite(x) && x <= b ? NOISE_WITHIN : NOISE_SEARCH;
}

/* log of the binomial coefficient C(n, k). */
static double log_choose(int n, int k)
{
    return lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0);
}

double noise_mcnemar(int b, int c)
{
    int n = b + c;
    if (n <= 0) return 1.0;
    int k = b < c ? b : c;
    /* two-sided exact binomial test of k successes in n at p = 1/2 */
    double p = 0;
    for (int i = 0; i <= k; i++) p += exp(log_choose(n, i) - n * log(2.0));
    p *= 2;
    return p > 1 ? 1 : p;
}
