/*
 * tier.h: the one interface of the engine's tiers (ref, cpu, gpu), in the
 * manner of ggml's ggml_backend_i: each tier is a table of functions over a
 * session (tg_tier_i below), and sessions (model.h) reach a tier only
 * through its table. A new tier (another GPU API, another ISA) is one more
 * table, not a parallel API with #ifdefs in its callers.
 *
 * Registry: tg_tier_find(id) returns the table of a tier compiled into this
 * program, or NULL. ref (forward_ref.c) and cpu (forward_cpu.c) are always
 * there. The GPU objects (engine/gpu/, built by engine/gpu/gpu.mk) define
 * tg_tier_gpu, which the registry (session.c) names as a weak symbol: a
 * program linked without them simply has no gpu tier.
 *
 * Layers, each using only those below it:
 *   session.c        options, positions, batching, logits, selection,
 *                    dumps, counters, the registry (model.h's session API)
 *   the tier tables  forward_ref.c, forward_cpu.c, engine/gpu/gpu.cu
 *   model.c, quant, ops, this header's inline helpers
 * A tier calls nothing in session.c: what it needs of a session is the
 * struct below and the inline helpers.
 *
 * Internal to the engine and its tests: callers outside the engine use
 * model.h.
 */
#ifndef TG_TIER_H
#define TG_TIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus   /* engine/gpu/gpu.cu implements a table */
extern "C" {
#endif

#include "model.h"
#include "ops.h"
#include "quant.h"
#include "replay_hook.h"
#include "util.h"

/* Flags of one eval call of a tier. */
enum {
    TG_EVAL_LAST = 1,   /* the last batch of the session's call: its last token's
                         * logits are the session's (and a device selection, if
                         * asked for, is made over them) */
    TG_EVAL_DUMP = 2,   /* call the dump hook for every stage of the last token */
};

typedef struct tg_tier_i {
    enum tg_tier id;          /* TG_TIER_REF | TG_TIER_CPU | TG_TIER_GPU */
    const char *name;         /* "ref" | "cpu" | "gpu" */
    int n_batch_default;      /* tokens per batch when the n_batch option is 0 */
    int top_k_max;            /* the largest top-k the tier selects on its device; 0: none */

    /* Describes where the tier runs, from its real configuration, into
     * buf (n bytes): with s NULL, a session with options o (defaults
     * resolved) before any model is loaded (a worker's hello); else the live
     * session s (o is then s->o): machine, kernel ISA, threads actually
     * used, KV cache type and every switch that changes the numerics.
     * Returns 0, or -1 with buf saying why when the tier cannot run on this
     * machine (no usable GPU). */
    int (*describe)(const tg_session *s, const tg_opts *o, char *buf, size_t n);

    /* Allocates the tier's state into s->tier for s->m with the resolved
     * options s->o (refusing the ones the tier does not serve), and writes
     * nothing else of s but s->o's tier-resolved fields. Returns 0, or -1
     * with e (out of memory, an unsupported weight type or option). */
    int (*init)(tg_session *s, tg_err *e);
    /* Frees s->tier and sets it to NULL; a NULL state is a no-op. */
    void (*free)(tg_session *s);

    /* Evaluates tokens[0..n) (1 <= n <= s->o.n_batch, valid ids, room in the
     * cache) at positions s->pos .. s->pos+n-1, appending to the KV cache;
     * flags TG_EVAL_*. The last token's logits go to s->logits, or, for a
     * tier with a logits function, stay on its device. Counts every op in
     * s->ops. Never moves s->pos (the session does). Returns 0, or -1 with
     * e (a failing dump callback, a device runtime failure). */
    int (*eval)(tg_session *s, const int32_t *tokens, int n, unsigned flags, tg_err *e);

    /* Optional (NULL: the session evaluates one token at a time through
     * eval and copies each token's logits): eval that also writes the
     * logits of every token, row t of logits (n, n_vocab) being those after
     * tokens[0..t], byte for byte what a one-token eval at that position
     * gives, and the last row into s->logits. Returns 0, or -1 with e. */
    int (*eval_all)(tg_session *s, const int32_t *tokens, int n, unsigned flags, float *logits, tg_err *e);

    /* Optional, for a tier whose logits stay on its device (NULL: they are
     * in s->logits after every eval): copies the last eval's logits
     * (n_vocab floats) to out. Returns 0, or -1 with e. */
    int (*logits)(tg_session *s, float *out, tg_err *e);

    /* Optional, for a tier that selects on its device: the top k entries
     * (k <= s->top_k, ordered as tg_topk orders them) and the XXH3-64 hex
     * digest of all logits, of the last eval, into top and digest. Returns
     * 1 when the last eval made that selection (its last batch had
     * TG_EVAL_LAST and 1 <= s->top_k <= top_k_max), 0 when it did not (the
     * session then selects on the host over the logits), -1 with e on a
     * device failure. */
    int (*top)(tg_session *s, int k, tg_top *top, char digest[17], tg_err *e);

    /* Optional, for a tier that can replay (NULL: it cannot; its hello
     * says "replay": false): the tier calls the stage hooks below
     * (tg_hook, tg_hook_f64, tg_hook_score) at every stage of its forward
     * pass, where its own code computes the stage, so a session with a
     * replay set (tg_session_set_replay, replay_hook.h) records and
     * overwrites every stage, and the calibrated perturbations (model.h,
     * pert_*) apply. Writes the numerics the tier declares for options o
     * (docs/protocol.md, "Declaring numerics") as a JSON object text into
     * buf (n bytes). */
    void (*numerics)(const tg_opts *o, char *buf, size_t n);
} tg_tier_i;

/* The table of tier id in this program, or NULL when it is not compiled in
 * (or id is out of range). */
const tg_tier_i *tg_tier_find(int id);

/* The session: what the tier-independent code (session.c) keeps, plus the
 * tier's own state. Tiers read m, o, pos, top_k and the dump hook, write
 * logits (unless they keep them on a device) and count into ops. */
struct tg_session {
    const tg_model *m;
    const tg_tier_i *t;      /* the tier's table */
    void *tier;              /* the tier's state (owned by the tier) */
    tg_opts o;               /* options, defaults resolved */
    int pos;                 /* filled cache positions */
    float *logits;           /* (n_vocab) the last logits on the host */
    int logits_ok;           /* whether logits holds the last eval's (a tier
                              * with a logits function copies on demand) */
    int top_k;               /* the selection the evals should make on the
                              * device (tg_session_set_top); 0: none */
    tg_ops ops;
    tg_dump_fn dump_fn;
    void *dump_ud;
    tg_replay *replay;       /* a stage replay in progress, or NULL (replay_hook.h) */
    char device[512];        /* the tier's describe() of this session */
};

/* Calls the dump hook for (layer, stage) with n floats. Returns 0 or -1. */
static inline int tg_dump(tg_session *s, int layer, int stage, const float *x, int64_t n, tg_err *e)
{
    return s->dump_fn ? s->dump_fn(s->dump_ud, layer, stage, x, n, e) : 0;
}

/* The stage hooks (replay_hook.h), called by a tier that can replay at
 * every stage boundary with the rows of the batch's tokens (positions
 * pos0..pos0+nb-1, columns [c0, c1)): the calibrated perturbation of the
 * options (model.h, pert_*), then the replay's record and overwrite.
 * No-ops unless one of them is active. */
static inline void tg_hook_rows(tg_session *s, int layer, int stage, int pos0, int nb, void *x, int f64,
                                int64_t stride, int64_t c0, int64_t c1)
{
    if (s->o.pert_kind && s->o.pert_layer == layer && s->o.pert_stage == stage)
        tg_pert_rows(&s->o, pos0, nb, x, f64, stride, c0, c1);
    if (s->replay)
        tg_replay_rows(s->replay, layer, stage, pos0, nb, x, f64, stride, c0, c1);
}

/* tg_hook_rows over float rows (the cpu tier's) and double rows (the ref tier's). */
static inline void tg_hook(tg_session *s, int layer, int stage, int pos0, int nb, float *x, int64_t stride,
                           int64_t c0, int64_t c1)
{
    tg_hook_rows(s, layer, stage, pos0, nb, x, 0, stride, c0, c1);
}
static inline void tg_hook_f64(tg_session *s, int layer, int stage, int pos0, int nb, double *x, int64_t stride,
                               int64_t c0, int64_t c1)
{
    tg_hook_rows(s, layer, stage, pos0, nb, x, 1, stride, c0, c1);
}

/* The score hook of (head, position j) of the token at pos: returns the
 * value the tier goes on with. */
static inline double tg_hook_score(tg_session *s, int layer, int pos, int head, int j, double v)
{
    if (s->o.pert_kind && s->o.pert_layer == layer && s->o.pert_stage == TG_RS_SCORES)
        v = tg_pert_value(&s->o, v, pos, head * 65536 + j);
    return s->replay ? tg_replay_score(s->replay, layer, pos, head, j, v) : v;
}

#ifdef __cplusplus
}
#endif
#endif
