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
#include "replay_hook.h"

typedef struct tg_tier_impl {
    /* Allocates the tier state into s->tier. Returns 0 or -1 with e. */
    int (*init)(tg_session *s, tg_err *e);
    void (*fini)(tg_session *s);
    /* Evaluates tokens[0..n) at positions s->pos .. s->pos+n-1. Returns 0,
     * or -1 with e (only a dump callback can fail). */
    int (*eval)(tg_session *s, const int32_t *tokens, int n, int want_dump, tg_err *e);
    /* Optional (NULL: model.c evaluates one token at a time through eval):
     * eval that also writes the logits of every token, row t of logits
     * (n, n_vocab) being those after tokens[0..t], and the last row into
     * s->logits. The bytes of every row are those a one-token eval at that
     * position gives. Returns 0, or -1 with e as eval. */
    int (*eval_all)(tg_session *s, const int32_t *tokens, int n, int want_dump, float *logits, tg_err *e);
} tg_tier_impl;

struct tg_session {
    const tg_model *m;
    tg_opts o;               /* with defaults resolved */
    int pos;                 /* filled cache positions */
    float *logits;           /* (n_vocab) */
    tg_ops ops;
    tg_dump_fn dump_fn;
    void *dump_ud;
    tg_replay *replay;       /* a stage replay in progress, or NULL (replay_hook.h) */
    const tg_tier_impl *impl;
    void *tier;              /* the tier's state */
    char device[96];
};

extern const tg_tier_impl tg_tier_ref_impl;
extern const tg_tier_impl tg_tier_cpu_impl;

/* "x86-64 AVX2" style name of the machine and the cpu tier's kernels. */
const char *tg_cpu_tier_isa(void);

/* The ref tier's dot products (forward_ref.c), exported for the tests.
 * One fixed order on every machine and ISA for the f64 sum of w[j] * x[j]
 * (j < n): eight running sums (element j goes to sum j % 8, each a multiply
 * then an add, never fused), added as ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)),
 * then the elements from n8 = n & ~7 on in order. The sums live in acc (8
 * doubles, lane k = sum k) between calls, so a row may be taken in blocks
 * of columns whose lengths are multiples of 8:
 *   tg_ref_acc        acc += w x over [0, n8) (n8 a multiple of 8), w f32
 *                     (converted to f64 exactly)
 *   tg_ref_acc_f64    the same with w already in f64
 *   tg_ref_acc4_rows  acc + 8r for the rows r < 4 of w (f32, row r at
 *                     w + r*ldw) against one x
 *   tg_ref_acc4_tok   acc + 8t for one row w (f64) against the vectors
 *                     t < 4 at x + t*ldx
 *   tg_ref_acc_sum    returns the tree of acc plus w[j] * x[j] for j < nt
 *                     in order (the tail; w f32)
 *   tg_ref_dot        the whole dot of n in one call. */
void tg_ref_acc(const float *w, const double *x, int64_t n8, double acc[8]);
void tg_ref_acc_f64(const double *w, const double *x, int64_t n8, double acc[8]);
void tg_ref_acc4_rows(const float *w, int64_t ldw, const double *x, int64_t n8, double acc[32]);
void tg_ref_acc4_tok(const double *w, const double *x, int64_t ldx, int64_t n8, double acc[32]);
double tg_ref_acc_sum(const double acc[8], const float *w, const double *x, int64_t nt);
double tg_ref_dot(const float *w, const double *x, int64_t n);

/* The ref tier's matmul, exported for the tests: out (n, w->rows) = W x
 * for the n (1..32) vectors x (n, w->cols) of a ref-tier session s (its
 * threads), each output rounded to f32 unless the f64 option is set. */
void tg_ref_matmul(tg_session *s, double *out, const tg_weight *w, const double *x, int n);

/* Rounds n floats to bfloat16 in place (the perturbation). */
void tg_round_bf16(float *x, int64_t n);

/* Calls the dump hook for (layer, stage) with n floats. Returns 0 or -1. */
static inline int tg_dump(tg_session *s, int layer, int stage, const float *x, int64_t n, tg_err *e)
{
    return s->dump_fn ? s->dump_fn(s->dump_ud, layer, stage, x, n, e) : 0;
}

/* The stage replay hooks (replay_hook.h): no-ops unless a replay is running. */
static inline void tg_hook(tg_session *s, int layer, int stage, int pos0, int nb, float *x, int64_t stride,
                           int64_t c0, int64_t c1)
{
    if (s->o.pert_kind && s->o.pert_layer == layer && s->o.pert_stage == stage)
        tg_pert_f32(&s->o, pos0, nb, x, stride, c0, c1);
    if (s->replay)
        tg_replay_f32(s->replay, layer, stage, pos0, nb, x, stride, c0, c1);
}

static inline void tg_hook_f64(tg_session *s, int layer, int stage, int pos0, int nb, double *x, int64_t stride,
                               int64_t c0, int64_t c1)
{
    if (s->o.pert_kind && s->o.pert_layer == layer && s->o.pert_stage == stage)
        tg_pert_f64(&s->o, pos0, nb, x, stride, c0, c1);
    if (s->replay)
        tg_replay_f64(s->replay, layer, stage, pos0, nb, x, stride, c0, c1);
}

/* The score hook: the perturbation, then the replay. */
static inline double tg_hook_score(tg_session *s, int layer, int pos, int head, int j, double v)
{
    if (s->o.pert_kind && s->o.pert_layer == layer && s->o.pert_stage == TG_RS_SCORES)
        v = tg_pert_value(&s->o, v, pos, head * 65536 + j);
    return s->replay ? tg_replay_score_f64(s->replay, layer, pos, head, j, v) : v;
}

/* Whether (layer, stage) is the perturbed one. */
static inline int tg_perturbed(const tg_session *s, int layer, int stage)
{
    return s->o.perturb_layer == layer && s->o.perturb_stage == stage;
}

#endif
