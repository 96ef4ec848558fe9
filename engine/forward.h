/*
 * forward.h: what model.c shares with the tiers' forward passes
 * (forward_ref.c, forward_cpu.c). Not a public interface: callers use
 * model.h.
 *
 * model.c owns the session (options, position, logits, counters, dump hook)
 * and calls the tier through a small table; each tier keeps its KV cache and
 * buffers in its own state. A tier's eval gets a batch of tokens that fits
 * the cache and n_batch, with valid ids; it writes the last token's logits
 * into s->logits and advances nothing: model.c moves s->pos afterwards.
 */
#ifndef TG_FORWARD_H
#define TG_FORWARD_H

#include "model.h"

typedef struct tg_tier_impl {
    /* Allocates the tier state into s->tier. Returns 0 or -1 with e. */
    int (*init)(tg_session *s, tg_err *e);
    void (*fini)(tg_session *s);
    /* Evaluates tokens[0..n) at positions s->pos .. s->pos+n-1. Returns 0,
     * or -1 with e (only a dump callback can fail). */
    int (*eval)(tg_session *s, const int32_t *tokens, int n, int want_dump, tg_err *e);
} tg_tier_impl;

struct tg_session {
    const tg_model *m;
    tg_opts o;               /* with defaults resolved */
    int pos;                 /* filled cache positions */
    float *logits;           /* (n_vocab) */
    tg_ops ops;
    tg_dump_fn dump_fn;
    void *dump_ud;
    const tg_tier_impl *impl;
    void *tier;              /* the tier's state */
    char device[96];
};

extern const tg_tier_impl tg_tier_ref_impl;
extern const tg_tier_impl tg_tier_cpu_impl;

/* "x86-64 AVX2" style name of the machine and the cpu tier's kernels. */
const char *tg_cpu_tier_isa(void);

/* Rounds n floats to bfloat16 in place (the perturbation). */
void tg_round_bf16(float *x, int64_t n);

/* Calls the dump hook for (layer, stage) with n floats. Returns 0 or -1. */
static inline int tg_dump(tg_session *s, int layer, int stage, const float *x, int64_t n, tg_err *e)
{
    return s->dump_fn ? s->dump_fn(s->dump_ud, layer, stage, x, n, e) : 0;
}

/* Whether (layer, stage) is the perturbed one. */
static inline int tg_perturbed(const tg_session *s, int layer, int stage)
{
    return s->o.perturb_layer == layer && s->o.perturb_stage == stage;
}

#endif
