/*
 * forward_ref.c: the ref tier, the portable yardstick every other arm is
 * measured against (see model.h).
 *
 * Plain C, one token at a time. Weights are dequantized row by row with the
 * type's scalar to_float; every sum (dot products, rmsnorm,
 * softmax, attention) is taken in f64. Activations are held as doubles but
 * rounded to f32 after every op, so the tier computes "f32 activations with
 * f64 accumulation"; with the f64 option the rounding is skipped, which
 * gives the test suite a near-exact value of the quantized model to judge
 * the other tiers and llama.cpp against. Nothing depends on timing or
 * threads: the same input gives the same bytes on every machine with
 * IEEE doubles and a correctly rounded libm for exp, sqrt, pow, cos and sin.
 *
 * Threads: one by default. With the threads option above 1, the mat-vecs
 * hand row ranges to a thread pool; every row is still one f64 dot product
 * taken in the same order by one thread, so the bytes do not change (the
 * large models of the GPU gates need it: one thread takes about 2 s a step
 * at the 0.6b shape).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "quant.h"
#include "threadpool.h"

typedef struct ref_state {
    double *x;        /* (n_embd) residual stream */
    double *h;        /* (n_embd) normed input of a block */
    double *q;        /* (n_head*head_dim) */
    double *k;        /* (n_head_kv*head_dim) */
    double *v;        /* (n_head_kv*head_dim) */
    double *att;      /* (n_head*head_dim) attention output, heads concatenated */
    double *o;        /* (n_embd) attn_out / ffn_out */
    double *g;        /* (n_ff) gate, then swiglu */
    double *u;        /* (n_ff) up */
    double *sc;       /* (n_ctx) attention scores of one head */
    double *kc;       /* (n_layer, n_ctx, n_head_kv*head_dim) K cache */
    double *vc;       /* (n_layer, n_ctx, n_head_kv*head_dim) V cache */
    float *row;       /* (nth, max cols) one dequantized weight row per thread */
    size_t row_n;     /* max cols */
    int nth;          /* threads (1: no pool) */
    tg_pool *pool;
    float *f;         /* (max(n_vocab, n_ff, q dims)) f32 copy for dumps */
    double *lg;       /* (n_vocab) logits before the final rounding */
} ref_state;

static double rnd(const tg_session *s, double x)
{
    return s->o.f64 ? x : (double)(float)x;
}

static void ref_fini(tg_session *s)
{
    ref_state *r = s->tier;
    if (!r)
        return;
    free(r->x); free(r->h); free(r->q); free(r->k); free(r->v); free(r->att); free(r->o);
    free(r->g); free(r->u); free(r->sc); free(r->kc); free(r->vc); free(r->row); free(r->f);
    free(r->lg);
    tg_pool_free(r->pool);
    free(r);
    s->tier = NULL;
}

static int ref_init(tg_session *s, tg_err *e)
{
    const tg_hparams *hp = &s->m->hp;
    size_t E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           KV = (size_t)hp->n_head_kv * hp->head_dim, F = (size_t)hp->n_ff, V = (size_t)hp->n_vocab;
    size_t maxc = E > F ? E : F;
    maxc = maxc > Q ? maxc : Q;
    size_t maxf = V > maxc ? V : maxc;
    ref_state *r = calloc(1, sizeof *r);
    if (!r)
        return tg_errf(e, "out of memory");
    s->tier = r;
    size_t cache = (size_t)hp->n_layer * (size_t)s->o.n_ctx * KV;
    r->x = calloc(E, sizeof(double));
    r->h = calloc(E, sizeof(double));
    r->q = calloc(Q, sizeof(double));
    r->k = calloc(KV, sizeof(double));
    r->v = calloc(KV, sizeof(double));
    r->att = calloc(Q, sizeof(double));
    r->o = calloc(E, sizeof(double));
    r->g = calloc(F, sizeof(double));
    r->u = calloc(F, sizeof(double));
    r->sc = calloc((size_t)s->o.n_ctx, sizeof(double));
    r->kc = calloc(cache, sizeof(double));
    r->vc = calloc(cache, sizeof(double));
    r->nth = s->o.threads > 1 ? s->o.threads : 1;
    r->row_n = maxc;
    r->row = calloc(maxc * (size_t)r->nth, sizeof(float));
    if (r->nth > 1 && !(r->pool = tg_pool_new(r->nth))) {
        ref_fini(s);
        return tg_errf(e, "ref tier: cannot start %d threads (option threads)", r->nth);
    }
    r->f = calloc(maxf, sizeof(float));
    r->lg = calloc(V, sizeof(double));
    if (!r->x || !r->h || !r->q || !r->k || !r->v || !r->att || !r->o || !r->g || !r->u || !r->sc ||
        !r->kc || !r->vc || !r->row || !r->f || !r->lg) {
        ref_fini(s);
        return tg_errf(e, "ref tier: out of memory for a KV cache of %d positions (option n_ctx)", s->o.n_ctx);
    }
    tg_tier_device(TG_TIER_REF, r->nth, s->device, sizeof s->device);
    return 0;
}

typedef struct ref_mm {
    const tg_session *s;
    double *out;
    const tg_weight *w;
    const double *x;
} ref_mm;

#define REF_MM_ROWS 16   /* rows per pool chunk */

/* Rows [chunk * REF_MM_ROWS, +REF_MM_ROWS) of a matmul, on thread ith's row buffer. */
static void matmul_rows(void *ctx, int chunk, int ith)
{
    const ref_mm *d = ctx;
    const ref_state *r = d->s->tier;
    const tg_type_traits *tr = tg_traits(d->w->type);
    float *row = r->row + (size_t)ith * r->row_n;
    int64_t i1 = (int64_t)(chunk + 1) * REF_MM_ROWS;
    if (i1 > d->w->rows)
        i1 = d->w->rows;
    const int64_t n = d->w->cols, n8 = n & ~(int64_t)7;
    for (int64_t i = (int64_t)chunk * REF_MM_ROWS; i < i1; i++) {
        tr->to_float((const char *)d->w->data + (size_t)i * d->w->row_size, row, n);
        /* eight running sums (element j goes to sum j % 8), added in a
         * fixed tree, then the tail in order: a fixed order on every
         * machine (no contraction: the Makefile builds this file with
         * -ffp-contract=off), and eight independent chains instead of one */
        double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t j = 0; j < n8; j += 8)
            for (int k = 0; k < 8; k++)
                a[k] += (double)row[j + k] * d->x[j + k];
        double sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (int64_t j = n8; j < n; j++)
            sum += (double)row[j] * d->x[j];
        d->out[i] = rnd(d->s, sum);
    }
}

/* out (w->rows) = W x: each row dequantized, the dot taken in f64 (one row
 * per dot, in the same order whichever thread takes it). */
static void matmul(tg_session *s, double *out, const tg_weight *w, const double *x)
{
    ref_state *r = s->tier;
    ref_mm d = {s, out, w, x};
    const int nchunks = (int)((w->rows + REF_MM_ROWS - 1) / REF_MM_ROWS);
    if (r->pool)
        tg_pool_run(r->pool, nchunks, matmul_rows, &d);
    else
        for (int c = 0; c < nchunks; c++)
            matmul_rows(&d, c, 0);
    tg_ops_count(&s->ops, TG_OP_MATMUL, w->type, TG_TIER_REF);
}

/* out (n) = x / sqrt(mean(x^2) + eps) * w; w an f32 vector of n. */
static void rmsnorm(tg_session *s, double *out, const double *x, const tg_weight *w, int n)
{
    const float *wf = w->data;
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / n + (double)s->m->hp.eps);
    for (int i = 0; i < n; i++)
        out[i] = rnd(s, x[i] * scale * (double)wf[i]);
    tg_ops_count(&s->ops, TG_OP_RMSNORM, 0, TG_TIER_REF);
}

/* Rotates each head of v (n_heads x head_dim) for position pos: pairs
 * (i, i + d/2) (neox) or (2i, 2i+1), angle pos * base^(-2i/d), in f64. */
static void rope(tg_session *s, double *v, int n_heads, int pos)
{
    const tg_hparams *hp = &s->m->hp;
    int d = hp->head_dim, half = d / 2;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * pow((double)hp->rope_base, -2.0 * i / d);
        double c = cos(theta), sn = sin(theta);
        for (int h = 0; h < n_heads; h++) {
            double *p = v + (size_t)h * d;
            int i0 = hp->rope_neox ? i : 2 * i, i1 = hp->rope_neox ? i + half : 2 * i + 1;
            double x0 = p[i0], x1 = p[i1];
            p[i0] = rnd(s, x0 * c - x1 * sn);
            p[i1] = rnd(s, x0 * sn + x1 * c);
        }
    }
    tg_ops_count(&s->ops, TG_OP_ROPE, 0, TG_TIER_REF);
}

static void perturb(tg_session *s, int layer, int stage, double *x, int64_t n)
{
    if (!tg_perturbed(s, layer, stage))
        return;
    for (int64_t i = 0; i < n; i++)
        x[i] = (double)tg_bf16_to_f32(tg_f32_to_bf16((float)x[i]));
    tg_ops_count(&s->ops, TG_OP_PERTURB, 0, TG_TIER_REF);
}

static int dump(tg_session *s, int want, int layer, int stage, const double *x, int64_t n, tg_err *e)
{
    if (!want || !s->dump_fn)
        return 0;
    ref_state *r = s->tier;
    for (int64_t i = 0; i < n; i++)
        r->f[i] = (float)x[i];
    return tg_dump(s, layer, stage, r->f, n, e);
}

/* One token at position pos; the logits only when last, dumps when want. */
static int ref_token(tg_session *s, int32_t token, int pos, int last, int want, tg_err *e)
{
    ref_state *r = s->tier;
    const tg_model *m = s->m;
    const tg_hparams *hp = &m->hp;
    const int E = hp->n_embd, d = hp->head_dim, KV = hp->n_head_kv * d, F = hp->n_ff;
    const int group = hp->n_head / hp->n_head_kv;
    const double scale = 1.0 / sqrt((double)d);

    // token embedding
    const tg_type_traits *etr = tg_traits(m->token_embd.type);
    etr->to_float((const char *)m->token_embd.data + (size_t)token * m->token_embd.row_size, r->row, E);
    for (int i = 0; i < E; i++)
        r->x[i] = r->row[i];
    tg_ops_count(&s->ops, TG_OP_EMBED, m->token_embd.type, TG_TIER_REF);

    for (int il = 0; il < hp->n_layer; il++) {
        const tg_layer *L = &m->layers[il];
        double *kc = r->kc + ((size_t)il * s->o.n_ctx) * KV;
        double *vc = r->vc + ((size_t)il * s->o.n_ctx) * KV;

        // attention rmsnorm
        rmsnorm(s, r->h, r->x, &L->attn_norm, E);
        perturb(s, il, TG_STAGE_ATTN_NORM, r->h, E);
        if (dump(s, want, il, TG_STAGE_ATTN_NORM, r->h, E, e))
            return -1;

        // q, k, v projections
        matmul(s, r->q, &L->wq, r->h);
        matmul(s, r->k, &L->wk, r->h);
        matmul(s, r->v, &L->wv, r->h);

        // per-head q/k rmsnorm (qwen3)
        if (hp->qk_norm) {
            for (int h = 0; h < hp->n_head; h++)
                rmsnorm(s, r->q + (size_t)h * d, r->q + (size_t)h * d, &L->q_norm, d);
            for (int h = 0; h < hp->n_head_kv; h++)
                rmsnorm(s, r->k + (size_t)h * d, r->k + (size_t)h * d, &L->k_norm, d);
        }

        // rope
        rope(s, r->q, hp->n_head, pos);
        rope(s, r->k, hp->n_head_kv, pos);
        perturb(s, il, TG_STAGE_Q, r->q, (int64_t)hp->n_head * d);
        perturb(s, il, TG_STAGE_K, r->k, KV);
        perturb(s, il, TG_STAGE_V, r->v, KV);
        if (dump(s, want, il, TG_STAGE_Q, r->q, (int64_t)hp->n_head * d, e) ||
            dump(s, want, il, TG_STAGE_K, r->k, KV, e) || dump(s, want, il, TG_STAGE_V, r->v, KV, e))
            return -1;

        // append k, v to the cache
        memcpy(kc + (size_t)pos * KV, r->k, (size_t)KV * sizeof(double));
        memcpy(vc + (size_t)pos * KV, r->v, (size_t)KV * sizeof(double));
        tg_ops_count(&s->ops, TG_OP_KV_STORE, 0, TG_TIER_REF);

        // attention: softmax(q.k / sqrt(d)) v over positions 0..pos
        for (int h = 0; h < hp->n_head; h++) {
            const double *qh = r->q + (size_t)h * d;
            const int g = h / group;
            double mx = -INFINITY;
            for (int j = 0; j <= pos; j++) {
                const double *kj = kc + (size_t)j * KV + (size_t)g * d;
                double dot = 0.0;
                for (int i = 0; i < d; i++)
                    dot += qh[i] * kj[i];
                r->sc[j] = dot * scale;
                if (r->sc[j] > mx)
                    mx = r->sc[j];
            }
            double sum = 0.0;
            for (int j = 0; j <= pos; j++) {
                r->sc[j] = exp(r->sc[j] - mx);
                sum += r->sc[j];
            }
            double *out = r->att + (size_t)h * d;
            for (int i = 0; i < d; i++)
                out[i] = 0.0;
            for (int j = 0; j <= pos; j++) {
                const double *vj = vc + (size_t)j * KV + (size_t)g * d;
                double a = r->sc[j] / sum;
                for (int i = 0; i < d; i++)
                    out[i] += a * vj[i];
            }
            for (int i = 0; i < d; i++)
                out[i] = rnd(s, out[i]);
        }
        tg_ops_count(&s->ops, TG_OP_ATTN, 0, TG_TIER_REF);

        // output projection
        matmul(s, r->o, &L->wo, r->att);
        perturb(s, il, TG_STAGE_ATTN_OUT, r->o, E);
        if (dump(s, want, il, TG_STAGE_ATTN_OUT, r->o, E, e))
            return -1;

        // residual
        for (int i = 0; i < E; i++)
            r->x[i] = rnd(s, r->x[i] + r->o[i]);
        tg_ops_count(&s->ops, TG_OP_ADD, 0, TG_TIER_REF);

        // ffn rmsnorm
        rmsnorm(s, r->h, r->x, &L->ffn_norm, E);
        perturb(s, il, TG_STAGE_FFN_NORM, r->h, E);
        if (dump(s, want, il, TG_STAGE_FFN_NORM, r->h, E, e))
            return -1;

        // swiglu: silu(Wgate h) * (Wup h), silu(x) = x / (1 + exp(-x))
        matmul(s, r->g, &L->gate, r->h);
        matmul(s, r->u, &L->up, r->h);
        for (int i = 0; i < F; i++)
            r->g[i] = rnd(s, r->g[i] / (1.0 + exp(-r->g[i])) * r->u[i]);
        tg_ops_count(&s->ops, TG_OP_SWIGLU, 0, TG_TIER_REF);

        // down projection
        matmul(s, r->o, &L->down, r->g);
        perturb(s, il, TG_STAGE_FFN_OUT, r->o, E);
        if (dump(s, want, il, TG_STAGE_FFN_OUT, r->o, E, e))
            return -1;

        // residual
        for (int i = 0; i < E; i++)
            r->x[i] = rnd(s, r->x[i] + r->o[i]);
        tg_ops_count(&s->ops, TG_OP_ADD, 0, TG_TIER_REF);
        perturb(s, il, TG_STAGE_RESIDUAL, r->x, E);
        if (dump(s, want, il, TG_STAGE_RESIDUAL, r->x, E, e))
            return -1;
    }

    if (!last)
        return 0;

    // output rmsnorm and projection
    rmsnorm(s, r->h, r->x, &m->output_norm, E);
    matmul(s, r->lg, &m->output, r->h);
    for (int i = 0; i < hp->n_vocab; i++)
        s->logits[i] = (float)r->lg[i];
    if (want && s->dump_fn && tg_dump(s, -1, TG_STAGE_LOGITS, s->logits, hp->n_vocab, e))
        return -1;
    return 0;
}

static int ref_eval(tg_session *s, const int32_t *tokens, int n, int want_dump, tg_err *e)
{
    for (int i = 0; i < n; i++)
        if (ref_token(s, tokens[i], s->pos + i, i == n - 1, want_dump && i == n - 1, e) != 0)
            return -1;
    return 0;
}

const tg_tier_impl tg_tier_ref_impl = {ref_init, ref_fini, ref_eval};
