/*
 * session.c: the tier-independent half of a session (model.h): options and
 * their defaults, positions, batching, the host copy of the logits, the
 * top-k selection, dumps and op counters, and the registry of tiers
 * (tier.h). Every tier is reached through its table; nothing here knows a
 * tier's internals, and no tier calls back into this file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tier.h"

/* --- the registry ------------------------------------------------------ */

extern const tg_tier_i tg_tier_ref;   /* forward_ref.c */
extern const tg_tier_i tg_tier_cpu;   /* forward_cpu.c */
/* engine/gpu/gpu.cu, in programs linked with the GPU objects (gpu.mk). A
 * weak reference: where those objects are not linked its address is NULL
 * and the tier is simply not registered. */
extern const tg_tier_i tg_tier_gpu __attribute__((weak));

static const tg_tier_i *const registry[TG_TIER_COUNT] = {
    [TG_TIER_REF] = &tg_tier_ref,
    [TG_TIER_CPU] = &tg_tier_cpu,
    [TG_TIER_GPU] = &tg_tier_gpu,
};

const tg_tier_i *tg_tier_find(int id)
{
    return id >= 0 && id < TG_TIER_COUNT ? registry[id] : NULL;
}

/* The error for a tier this program lacks. Returns -1. */
static int tier_missing(int id, tg_err *e)
{
    if (id == TG_TIER_GPU)
        return tg_errf(e, "tier gpu: the GPU arm is not part of this build (build it with `make gpu` (CUDA) "
                       "or `make hip` (ROCm), or use --tier cpu or --tier ref)");
    return tg_errf(e, "tier %d: expected ref, cpu or gpu", id);
}

/* --- options ----------------------------------------------------------- */

tg_opts tg_opts_default(void)
{
    tg_opts o;
    memset(&o, 0, sizeof o);
    o.tier = TG_TIER_CPU;
    return o;
}

/* The calibrated form "KIND:STAGE:LAYER" (model.h, pert_*). */
static int tg_opts_parse_pert(tg_opts *o, const char *spec, tg_err *e)
{
    char kind[32], stage[32];
    int layer, used = 0;
    double eps = 0;
    if (sscanf(spec, "%31[a-z0-9.=+-]:%31[a-z_]:%d%n", kind, stage, &layer, &used) != 3 || spec[used] != '\0')
        return tg_errf(e, "perturb '%s': expected \"KIND:STAGE:LAYER\" (KIND bf16, f16, scale=E, noise=E or drop), "
                       "e.g. \"bf16:ffn_out:3\" or \"scale=1e-4:q_rope:2\"", spec);
    int k = !strcmp(kind, "bf16") ? 1 : !strcmp(kind, "f16") ? 2 : !strncmp(kind, "scale=", 6) ? 3
          : !strncmp(kind, "noise=", 6) ? 4 : !strcmp(kind, "drop") ? 5 : 0;
    if (k == 3 || k == 4) {
        char *end;
        eps = strtod(kind + 6, &end);
        if (*end || !(eps > -1 && eps < 1e6) || eps == 0)
            return tg_errf(e, "perturb '%s': %.5s needs a nonzero number E > -1, e.g. scale=1e-4", spec, kind);
    }
    if (!k)
        return tg_errf(e, "perturb '%s': kind '%s' is not one of bf16, f16, scale=E, noise=E, drop", spec, kind);
    int st = tg_rstage_parse(stage);
    if (st < 0)
        return tg_errf(e, "perturb '%s': stage '%s' is not a replay stage (docs/protocol.md, \"replay\")", spec, stage);
    int last = st == TG_RS_OUT_NORM || st == TG_RS_LOGITS;
    if (last ? layer != -1 : st == TG_RS_EMBD ? layer != 0 : layer < 0)
        return tg_errf(e, "perturb '%s': layer must be %s for stage %s", spec,
                       last ? "-1" : st == TG_RS_EMBD ? "0" : ">= 0", stage);
    o->pert_kind = k;
    o->pert_stage = st;
    o->pert_layer = layer;
    o->pert_eps = eps;
    return 0;
}

int tg_opts_parse_perturb(tg_opts *o, const char *spec, tg_err *e)
{
    /* the dump stages' names of the first form "bf16:STAGE:LAYER" are
     * replay stages at the same point of the forward pass */
    static const struct { const char *dump, *replay; } alias[] = {
        {"q", "q_rope"}, {"k", "k_rope"}, {"v", "v_proj"},
    };
    char stage[32], buf[96];
    int layer, used = 0;
    if (spec && !strncmp(spec, "bf16:", 5) && sscanf(spec + 5, "%31[a-z_]:%d%n", stage, &layer, &used) == 2 &&
        spec[5 + used] == '\0')
        for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
            if (!strcmp(stage, alias[i].dump)) {
                snprintf(buf, sizeof buf, "bf16:%s:%d", alias[i].replay, layer);
                return tg_opts_parse_pert(o, buf, e);
            }
    if (!spec)
        return tg_errf(e, "perturb: expected \"KIND:STAGE:LAYER\", e.g. \"bf16:ffn_out:3\"");
    return tg_opts_parse_pert(o, spec, e);
}

/* Checks o and resolves its defaults for tier t: threads (0: the online
 * CPUs), n_batch (0: the tier's), and, with a model's hp, n_ctx (0:
 * min(n_ctx_train, 4096)) and the perturbed layer's range (hp NULL: before
 * a model is loaded, n_ctx stays as given). Returns 0, or -1 with e. */
static int opts_resolve(tg_opts *o, const tg_tier_i *t, const tg_hparams *hp, tg_err *e)
{
    if (o->threads < 0 || o->threads > 1024)
        return tg_errf(e, "option threads = %d: expected 0 (all CPUs) .. 1024", o->threads);
    if (o->threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = n > 0 ? (int)n : 1;
    }
    if (o->n_ctx < 0 || o->n_batch < 0)
        return tg_errf(e, "options n_ctx and n_batch must be >= 0 (0 = default)");
    if (o->n_ctx == 0 && hp)
        o->n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (o->n_ctx > (1 << 20))
        return tg_errf(e, "option n_ctx = %d: expected at most 1048576", o->n_ctx);
    if (o->n_batch == 0)
        o->n_batch = t->n_batch_default;
    if (o->n_batch > 4096)
        return tg_errf(e, "option n_batch = %d: expected 1..4096", o->n_batch);
    if (o->pert_kind && !t->numerics)
        return tg_errf(e, "perturb: the %s tier does not call the stage hooks (use cpu or ref)", t->name);
    if (hp && o->pert_kind && o->pert_layer >= hp->n_layer)
        return tg_errf(e, "perturb: layer %d is out of range (the model has %d layers)", o->pert_layer, hp->n_layer);
    return 0;
}

int tg_tier_device(const tg_opts *o, char *buf, size_t n)
{
    const tg_tier_i *t = tg_tier_find(o->tier);
    tg_err e = {{0}};
    if (!t) {
        snprintf(buf, n, "tier %s: not part of this build", tg_tier_name(o->tier));
        return -1;
    }
    tg_opts r = *o;
    if (opts_resolve(&r, t, NULL, &e) != 0) {
        snprintf(buf, n, "%s", e.msg);
        return -1;
    }
    return t->describe(NULL, &r, buf, n);
}

/* --- sessions ---------------------------------------------------------- */

int tg_session_new(tg_session **out, const tg_model *m, const tg_opts *o, tg_err *e)
{
    *out = NULL;
    tg_opts opt = o ? *o : tg_opts_default();
    const tg_tier_i *t = tg_tier_find(opt.tier);
    if (!t)
        return tier_missing(opt.tier, e);
    if (opts_resolve(&opt, t, &m->hp, e) != 0)
        return -1;

    tg_session *s = calloc(1, sizeof *s);
    if (!s)
        return tg_errf(e, "out of memory");
    s->m = m;
    s->t = t;
    s->o = opt;
    s->logits = calloc((size_t)m->hp.n_vocab, sizeof(float));
    if (!s->logits) {
        free(s);
        return tg_errf(e, "out of memory");
    }
    if (t->init(s, e) != 0) {
        free(s->logits);
        free(s);
        return -1;
    }
    t->describe(s, &s->o, s->device, sizeof s->device);
    *out = s;
    return 0;
}

void tg_session_free(tg_session *s)
{
    if (!s)
        return;
    s->t->free(s);
    free(s->logits);
    free(s);
}

void tg_session_reset(tg_session *s)
{
    s->pos = 0;
}

int tg_session_pos(const tg_session *s)
{
    return s->pos;
}

int tg_session_n_ctx(const tg_session *s)
{
    return s->o.n_ctx;
}

const tg_opts *tg_session_opts(const tg_session *s)
{
    return &s->o;
}

/* Whether n tokens fit the context and are valid ids. Returns 0, or -1 with e. */
static int eval_check(const tg_session *s, const int32_t *tokens, int n, tg_err *e)
{
    if (n < 1)
        return tg_errf(e, "eval: expected at least one token");
    if (n > s->o.n_ctx - s->pos)
        return tg_errf(e, "eval: %d tokens at position %d exceed the context of %d positions (option n_ctx)",
                       n, s->pos, s->o.n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->m->hp.n_vocab)
            return tg_errf(e, "eval: token %d (index %d) is out of range 0..%d", tokens[i], i,
                           s->m->hp.n_vocab - 1);
    return 0;
}

/* The flags of a batch: whether it is the call's last, and dumps then. */
static unsigned batch_flags(const tg_session *s, int last)
{
    return last ? TG_EVAL_LAST | (s->dump_fn ? TG_EVAL_DUMP : 0) : 0;
}

/* One perturb op per batch evaluated with the debug perturbation on (the
 * stage hooks apply it, possibly from pool threads, so the count is kept
 * here). */
static void count_perturb(tg_session *s)
{
    if (s->o.pert_kind)
        tg_ops_count(&s->ops, TG_OP_PERTURB, 0, s->o.tier);
}

int tg_session_eval(tg_session *s, const int32_t *tokens, int n, tg_err *e)
{
    if (eval_check(s, tokens, n, e) != 0)
        return -1;
    const int start = s->pos;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i += s->o.n_batch) {
        const int nb = n - i < s->o.n_batch ? n - i : s->o.n_batch;
        rc = s->t->eval(s, tokens + i, nb, batch_flags(s, i + nb == n), e);
        count_perturb(s);
        s->pos += nb;
    }
    if (rc != 0)
        s->pos = start;
    s->logits_ok = s->t->logits == NULL;
    return rc;
}

int tg_session_eval_all(tg_session *s, const int32_t *tokens, int n, float *logits, tg_err *e)
{
    if (eval_check(s, tokens, n, e) != 0)
        return -1;
    const tg_tier_i *t = s->t;
    const size_t V = (size_t)s->m->hp.n_vocab;
    const int start = s->pos;
    int rc = 0;
    for (int i = 0; i < n && rc == 0;) {
        // the tier's batches of n_batch, or one token at a time
        const int nb = t->eval_all ? (n - i < s->o.n_batch ? n - i : s->o.n_batch) : 1;
        const unsigned flags = batch_flags(s, i + nb == n);
        float *row = logits + (size_t)i * V;
        count_perturb(s);
        if (t->eval_all)
            rc = t->eval_all(s, tokens + i, nb, flags, row, e);
        else if ((rc = t->eval(s, tokens + i, 1, flags, e)) == 0)
            rc = t->logits ? t->logits(s, row, e) : (memcpy(row, s->logits, V * sizeof(float)), 0);
        s->pos += nb;
        i += nb;
    }
    if (rc != 0) {
        s->pos = start;
        s->logits_ok = t->logits == NULL;
        return -1;
    }
    if (t->logits)   /* the last row is the session's logits */
        memcpy(s->logits, logits + (size_t)(n - 1) * V, V * sizeof(float));
    s->logits_ok = 1;
    return 0;
}

/* Brings the last logits to s->logits where the tier keeps them on its
 * device. Returns 0, or -1 with e. */
static int logits_sync(tg_session *s, tg_err *e)
{
    if (s->logits_ok)
        return 0;
    if (s->t->logits(s, s->logits, e) != 0)
        return -1;
    s->logits_ok = 1;
    return 0;
}

const float *tg_session_logits(tg_session *s)
{
    tg_err e = {{0}};
    return logits_sync(s, &e) == 0 ? s->logits : NULL;
}

void tg_session_set_top(tg_session *s, int k)
{
    s->top_k = k > 0 ? k : 0;
}

int tg_session_top(tg_session *s, int k, tg_top *top, char digest[17], tg_err *e)
{
    const int V = s->m->hp.n_vocab;
    if (k < 1)
        return tg_errf(e, "top: k = %d, expected at least 1", k);
    if (k > V)
        k = V;
    if (s->t->top && k <= s->top_k) {
        int r = s->t->top(s, k, top, digest, e);
        if (r != 0)
            return r < 0 ? -1 : k;
    }
    if (logits_sync(s, e) != 0)
        return -1;
    k = tg_topk(s->logits, V, k, top);
    tg_digest_logits(s->logits, (size_t)V, digest);
    return k;
}

int tg_session_top_on_device(const tg_session *s)
{
    return s->t->top != NULL;
}

void tg_session_set_replay(tg_session *s, tg_replay *r)
{
    s->replay = r;
}

void tg_session_set_dump(tg_session *s, tg_dump_fn fn, void *ud)
{
    s->dump_fn = fn;
    s->dump_ud = ud;
}

tg_ops *tg_session_ops(tg_session *s)
{
    return &s->ops;
}

const char *tg_session_device(const tg_session *s)
{
    return s->device;
}
