/*
 * forward_cpu.c: the cpu tier, the fast CPU forward pass (see model.h).
 *
 * Numerics follow llama.cpp's CPU backend where that is cheap:
 *  - a matmul quantizes its activation rows to the weight type's vec_dot
 *    type (Q8_K for K-quants, Q8_0 for Q8_0, F16, BF16, F32) and takes
 *    integer dot products (engine/cpu/kernels.h);
 *  - rmsnorm sums squares in f64 and scales in f32 (x * scale * w);
 *  - rope angles as ggml-cpu computes them: theta_scale = powf(base, -2/d),
 *    theta starts at the position and is multiplied by theta_scale pair by
 *    pair, all in f32, then cosf/sinf;
 *  - attention as llama.cpp's CPU flash attention (its default): q rounded
 *    to the K cache type (F16 by default), the q.k dot in ggml_vec_dot_f16's
 *    order on x86, an online softmax over the positions in order, V
 *    accumulated in the cache type (an F16 accumulator, rounded after each
 *    update), then scaled by 1/sum (see attn_chunk);
 *  - silu(x) = x / (1 + expf(-x)).
 *
 * A prompt is evaluated in batches: each weight row is streamed once per
 * batch and dotted with every token's activations. Matmuls hand chunks of
 * 16 output rows to the thread pool (gate and up together, with the swiglu
 * of the chunk's rows), which gives each thread runs of consecutive chunks
 * (threadpool.h); each output value is one dot product whichever thread
 * computes it, so the bytes depend neither on the thread count nor on
 * timing. Attention hands out (token, KV head) pairs the same way, each
 * query head computed whole by one thread. In batches of 8 tokens or more
 * the elementwise steps (norms, rope, cache stores, residual adds) go to
 * the pool too, whole tokens at a time.
 *
 * The tier's table, tg_tier_cpu (tier.h), is at the end of the file.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attn.h"
#include "cpu/kernels.h"
#include "quant.h"
#include "threadpool.h"
#include "tier.h"
#if defined(__x86_64__)
#include "cpu/forward_avx2.h"
#endif

typedef struct cpu_state {
    tg_pool *pool;
    int nth;
    int nb;           /* batch capacity (n_batch) */
    uint32_t kv_type; /* TG_TYPE_F16 | TG_TYPE_F32 */
    size_t kv_es;     /* bytes per cache element */
    float *x;         /* (nb, n_embd) residual stream */
    float *h;         /* (nb, n_embd) normed block input */
    float *q;         /* (nb, n_head*head_dim) */
    float *k;         /* (nb, n_head_kv*head_dim) */
    float *v;         /* (nb, n_head_kv*head_dim) */
    float *att;       /* (nb, n_head*head_dim) attention output */
    float *o;         /* (nb, n_embd) attn_out / ffn_out */
    float *g;         /* (nb, n_ff) gate, then swiglu */
    float *u;         /* (nb, n_ff) up */
    void *qa;         /* (nb, row of max cols) activations in a vec_dot type */
    void *qb;         /* (nb, ...) a second one when q/k/v or gate/up types differ */
    size_t qa_stride; /* bytes per row of qa / qb */
    void *kc;         /* (n_layer, n_head_kv, n_ctx, head_dim) K cache, kv_type: a head's rows are contiguous */
    void *vc;         /* (n_layer, n_head_kv, n_ctx, head_dim) V cache, kv_type */
    void *acc;        /* (nth, head_dim) per-thread attention accumulator (F32 cache) */
    float *fa_scratch; /* (nth, 2 * n_ctx) per-thread scores and weights (F16 cache) */
    void *qconv;      /* (nth, head_dim) per-thread q in the K cache type */
    float *rope_cs;   /* (nb, head_dim) cos, sin per pair and token */
    int layer;        /* the layer being evaluated (for the replay hooks) */
    int pos0;         /* position of the batch's first token (replay hooks) */
} cpu_state;

/* --- kernel glue ----------------------------------------------------------
 * The few entry points the tier needs from the kernels, in one place.
 */

/* out[b*out_stride + r] = W[r] . act[b] for rows [r0, r1) and nb tokens;
 * act rows packed (tg_row_size of the vec_dot type), out_stride == rows. */
static void k_matmul(uint32_t type, const void *w, size_t w_stride, int64_t cols, int64_t r0, int64_t r1,
                     const void *act, size_t act_stride, int nb, float *out, int64_t out_stride, int64_t rows)
{
    (void)w_stride;
    assert(out_stride == rows && "output rows are packed");
    assert(act_stride == tg_row_size(tg_traits(type)->vec_dot_type, cols) && "activation rows are packed");
    tg_cpu_matmul(type, w, rows, cols, act, nb, out, r0, r1);
}

/* x (n floats) into a row of type. */
static void k_quantize_row(uint32_t type, const float *x, void *y, int64_t n)
{
    int rc = tg_cpu_quantize_row(type, x, y, n);
    assert(rc == 0 && "activation type and length checked at load");
    (void)rc;
}

/* *s = x . y, x and y rows of n values of type (F16 or F32). */
static void k_vec_dot(uint32_t type, int n, float *s, const void *x, const void *y)
{
    tg_cpu_vec_dot(type)(n, s, x, y);
}

/* 0: portable code; 1: AVX2 helpers with ggml's 8-lane order; 2: ggml's
 * 16-lane (AVX-512) order (TG_FA_* of cpu/attn.h). Follows the kernels' ISA, as
 * llama.cpp's CPU backend picks its variant by the same features. */
static int fa_simd(void)
{
    static int simd = -1;
    if (simd < 0) {
        const char *isa = tg_cpu_isa();
        simd = strcmp(isa, "avx2") == 0 ? 1 : strncmp(isa, "avx512", 6) == 0 ? 2 : 0;
#if !defined(__x86_64__)
        simd = 0;
#endif
    }
    return simd;
}

static int k_has_matmul(uint32_t type)
{
    return tg_cpu_vec_dot(type) != NULL;
}

/* "x86-64 avx2, 2 threads, f16 KV": the machine and the kernels' ISA the
 * runtime dispatch picked, the pool's threads, the cache type. Returns 0. */
static int cpu_describe(const tg_session *s, const tg_opts *o, char *buf, size_t n)
{
    (void)s;
    const char *dt = tg_cpu_decode_tiles();
    snprintf(buf, n, "%s %s, %d thread%s, %s KV%s%s",
#if defined(__x86_64__)
             "x86-64",
#elif defined(__aarch64__)
             "aarch64",
#else
             "cpu",
#endif
             tg_cpu_isa(), o->threads, o->threads == 1 ? "" : "s", o->kv_f32 ? "f32" : "f16", *dt ? ", " : "", dt);
    return 0;
}

/* --- matmul -------------------------------------------------------------- */

/* One matmul of a dispatch: out[b*out_stride + r] = W[r] . act[b]. */
typedef struct mm_job {
    const tg_weight *w;
    const void *act;   /* (nb rows of act_stride bytes) in w's vec_dot type */
    size_t act_stride;
    float *out;
    int64_t out_stride;
} mm_job;

typedef struct mm_dispatch {
    tg_session *s;
    mm_job jobs[3];
    int n_jobs;
    int nb;
    int swiglu;        /* jobs[0] gate, jobs[1] up, chunked together: g = silu(g) * u */
    int first_chunk[4]; /* chunk index where job j starts; [n_jobs] = total */
} mm_dispatch;

/* Rows per chunk, the pool's unit of matmul work: whole gemm16 tiles.
 * Any split gives the same bytes (each output is one dot product); the
 * pool hands each thread runs of consecutive chunks (a quarter of what is
 * left of a share at a time), so a thread's weight rows stream in order
 * and its prefetch runs ahead across chunk boundaries. */
#define MM_CHUNK_ROWS 16

static void mm_rows(const mm_dispatch *d, const mm_job *jb, int64_t r0, int64_t r1)
{
    k_matmul(jb->w->type, jb->w->data, jb->w->row_size, jb->w->cols, r0, r1, jb->act, jb->act_stride, d->nb,
             jb->out, jb->out_stride, jb->w->rows);
}

/* Rows [r0, r1) of job j of the dispatch; with swiglu, the up projection
 * of the same rows and then g = silu(g) * u over them. */
static void mm_job_rows(const mm_dispatch *d, int j, int64_t r0, int64_t r1)
{
    const mm_job *jb = &d->jobs[j];
    mm_rows(d, jb, r0, r1);
    if (!d->swiglu)
        return;
    const cpu_state *c = d->s->tier;
    tg_hook(d->s, c->layer, TG_RS_GATE, c->pos0, d->nb, jb->out, jb->out_stride, r0, r1);
    // up projection of the same rows, then swiglu: silu(x) = x / (1 + exp(-x))
    const mm_job *uj = &d->jobs[1];
    mm_rows(d, uj, r0, r1);
    tg_hook(d->s, c->layer, TG_RS_UP, c->pos0, d->nb, uj->out, uj->out_stride, r0, r1);
    for (int b = 0; b < d->nb; b++) {
        float *g = jb->out + b * jb->out_stride;
        const float *u = uj->out + b * uj->out_stride;
#if defined(__x86_64__)
        if (fa_simd()) {
            // ggml's vectorized expf, as llama.cpp's swiglu on this ISA
            if (fa_simd() == 2)
                tg_swiglu_ggml_avx512(r0, r1, jb->w->rows, g, u);
            else
                tg_swiglu_ggml_avx2(r0, r1, jb->w->rows, g, u);
            continue;
        }
#endif
        for (int64_t r = r0; r < r1; r++)
            g[r] = g[r] / (1.0f + expf(-g[r])) * u[r];
    }
    tg_hook(d->s, c->layer, TG_RS_SWIGLU, c->pos0, d->nb, jb->out, jb->out_stride, r0, r1);
}

/* Chunks [c0, c1) of the dispatch (a pool run): the rows of each job that
 * the run covers, job by job. */
static void mm_chunks(void *ctx, int c0, int c1, int ith)
{
    (void)ith;
    const mm_dispatch *d = ctx;
    int j = 0;
    while (c0 < c1) {
        while (c0 >= d->first_chunk[j + 1])
            j++;
        const int ce = c1 < d->first_chunk[j + 1] ? c1 : d->first_chunk[j + 1];
        const int64_t rows = d->jobs[j].w->rows;
        const int64_t r0 = (int64_t)(c0 - d->first_chunk[j]) * MM_CHUNK_ROWS;
        const int64_t r1 = (int64_t)(ce - d->first_chunk[j]) * MM_CHUNK_ROWS;
        mm_job_rows(d, j, r0, r1 < rows ? r1 : rows);
        c0 = ce;
    }
}

/* Quantizes nb rows of x (cols floats each, x_stride apart) into dst in the
 * vec_dot type of w; returns dst. */
static const void *quantize_act(tg_session *s, void *dst, const tg_weight *w, const float *x, int64_t x_stride,
                                int nb)
{
    cpu_state *c = s->tier;
    uint32_t vt = tg_traits(w->type)->vec_dot_type;
    const size_t rs = tg_row_size(vt, w->cols);
    assert(rs <= c->qa_stride);
    for (int b = 0; b < nb; b++)
        k_quantize_row(vt, x + b * x_stride, (char *)dst + (size_t)b * rs, w->cols);
    tg_ops_count(&s->ops, TG_OP_QUANTIZE, vt, TG_TIER_CPU);
    return dst;
}

static void add_job(mm_dispatch *d, const tg_weight *w, const void *act, size_t act_stride, float *out,
                    int64_t out_stride)
{
    mm_job *j = &d->jobs[d->n_jobs++];
    j->w = w;
    j->act = act;
    j->act_stride = act_stride;
    j->out = out;
    j->out_stride = out_stride;
}

static void run_dispatch(tg_session *s, mm_dispatch *d)
{
    cpu_state *c = s->tier;
    int n_chunked = d->swiglu ? 1 : d->n_jobs;
    int total = 0;
    for (int j = 0; j < n_chunked; j++) {
        d->first_chunk[j] = total;
        total += (int)((d->jobs[j].w->rows + MM_CHUNK_ROWS - 1) / MM_CHUNK_ROWS);
    }
    d->first_chunk[n_chunked] = total;
    if (d->swiglu)
        assert(d->n_jobs == 2 && d->jobs[0].w->rows == d->jobs[1].w->rows);
    tg_pool_run_ranges(c->pool, total, mm_chunks, d);
    for (int j = 0; j < d->n_jobs; j++)
        tg_ops_count(&s->ops, TG_OP_MATMUL, d->jobs[j].w->type, TG_TIER_CPU);
    if (d->swiglu)
        tg_ops_count(&s->ops, TG_OP_SWIGLU, 0, TG_TIER_CPU);
}

/* Matmuls of up to three weights over the same input x (nb rows, x_stride
 * floats apart): activations quantized once per distinct vec_dot type. */
static void matmul_same_input(tg_session *s, const tg_weight *const *w, float *const *out, const int64_t *out_stride,
                              int n, const float *x, int64_t x_stride, int nb, int swiglu)
{
    cpu_state *c = s->tier;
    mm_dispatch d = {.s = s, .nb = nb, .swiglu = swiglu};
    uint32_t vt0 = tg_traits(w[0]->type)->vec_dot_type;
    const void *a0 = quantize_act(s, c->qa, w[0], x, x_stride, nb), *a1 = NULL;
    uint32_t vt1 = vt0;
    for (int i = 0; i < n; i++) {
        uint32_t vt = tg_traits(w[i]->type)->vec_dot_type;
        const void *a;
        if (vt == vt0) {
            a = a0;
        } else {
            if (!a1 || vt != vt1) {
                /* a third distinct type would overwrite qb: not reachable
                 * with two buffers unless q, k, v have three vec_dot types */
                assert(!a1 && "three distinct activation types in one dispatch");
                a1 = quantize_act(s, c->qb, w[i], x, x_stride, nb);
                vt1 = vt;
            }
            a = a1;
        }
        add_job(&d, w[i], a, tg_row_size(vt, w[i]->cols), out[i], out_stride[i]);
    }
    run_dispatch(s, &d);
}

/* --- the other ops ------------------------------------------------------- */

/* out = x / sqrt(mean(x^2) + eps) * w over n values: the sum in f64, the
 * scale in f32, as ggml. */
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

/* cos/sin of each rope pair for position pos, as ggml-cpu computes them. */
static void rope_cache(float *cs, int pos, int head_dim, float base)
{
    const float theta_scale = powf(base, -2.0f / (float)head_dim);
    float theta = (float)pos;
    for (int i = 0; i < head_dim; i += 2) {
        cs[i] = cosf(theta);
        cs[i + 1] = sinf(theta);
        theta *= theta_scale;
    }
}

/* Rotates n_heads heads of v with the pair cos/sin cs. */
static void rope(float *v, int n_heads, int d, int neox, const float *cs)
{
    for (int h = 0; h < n_heads; h++) {
        float *p = v + (size_t)h * d;
        for (int i = 0; i < d; i += 2) {
            const float c = cs[i], sn = cs[i + 1];
            const int i0 = neox ? i / 2 : i, i1 = neox ? i / 2 + d / 2 : i + 1;
            const float x0 = p[i0], x1 = p[i1];
            p[i0] = x0 * c - x1 * sn;
            p[i1] = x0 * sn + x1 * c;
        }
    }
}

/* --- attention ----------------------------------------------------------- */

typedef struct attn_job {
    tg_session *s;
    int layer;
    int nb;
    int pos0;          /* position of token 0 of the batch */
} attn_job;

/* The score hook of one query row (tg_fa_hook_fn). */
typedef struct score_hook {
    tg_session *s;
    int layer, pos, head;
} score_hook;

static float hook_score(void *ctx, int j, float sj)
{
    const score_hook *h = ctx;
    return (float)tg_hook_score(h->s, h->layer, h->pos, h->head, j, sj);
}

/* Attention of query head h of token b of the batch, as llama.cpp's CPU
 * flash attention computes one query row (ggml's flash_attn_ext, one chunk):
 * q rounded to the K cache type, s = (k . q) * scale for each position in
 * order, an online softmax (running max M and sum S: on a new maximum the
 * accumulator and S are rescaled by expf(Mold - M), else the position's
 * weight is expf(s - M)), V accumulated in the V cache type (F16: each
 * update rounded to f16), S = S * ms + vs fused, and at the end the
 * accumulator times 1/S. An F16 cache goes through cpu/attn.h (the dot in
 * ggml_vec_dot_f16's order on x86); an F32 one is summed here. */
static void attn_head(const attn_job *a, int b, int h, int ith)
{
    tg_session *s = a->s;
    cpu_state *c = s->tier;
    const tg_hparams *hp = &s->m->hp;
    const int d = hp->head_dim, KV = hp->n_head_kv * d, Qd = hp->n_head * d;
    const int group = hp->n_head / hp->n_head_kv;
    const float scale = 1.0f / sqrtf((float)d);
    const size_t lay = (size_t)a->layer * s->o.n_ctx * KV;
    void *qc = (char *)c->qconv + (size_t)ith * d * c->kv_es;
    const int g = h / group;
    const int pos = a->pos0 + b;
    const float *qh = c->q + (size_t)b * Qd + (size_t)h * d;
    float *out = c->att + (size_t)b * Qd + (size_t)h * d;
    const size_t off0 = (lay + (size_t)g * s->o.n_ctx * d) * c->kv_es;   /* row 0 of head g */
    const int n = pos + 1;   /* causal: positions 0..pos */

    k_quantize_row(c->kv_type, qh, qc, d);
    if (c->kv_type == TG_TYPE_F16) {
        score_hook hk = {s, a->layer, pos, h};
        tg_fa_row_f16(fa_simd(), n, d, (const tg_half *)((const char *)c->kc + off0),
                      (const tg_half *)((const char *)c->vc + off0), (size_t)d, qc, scale,
                      s->replay || s->o.pert_kind ? hook_score : NULL, &hk,
                      c->fa_scratch + (size_t)ith * 2 * s->o.n_ctx, out);
        return;
    }
    float *acc = (float *)c->acc + (size_t)ith * d;
    memset(acc, 0, (size_t)d * sizeof(float));
    float S = 0.0f, M = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *kj = (const float *)((const char *)c->kc + off0) + (size_t)j * d;
        const float *vf = (const float *)((const char *)c->vc + off0) + (size_t)j * d;
        float dot;
        k_vec_dot(TG_TYPE_F32, d, &dot, kj, qc);
        float sj = dot * scale;
        if (s->replay || s->o.pert_kind)
            sj = (float)tg_hook_score(s, a->layer, pos, h, j, sj);
        float ms = 1.0f, vs = 1.0f;
        if (sj > M) {
            // a new maximum: rescale what is summed so far, this weight is 1
            const float Mold = M;
            M = sj;
            ms = expf(Mold - M);
            for (int i = 0; i < d; i++)
                acc[i] *= ms;
        } else {
            vs = expf(sj - M);
        }
        for (int i = 0; i < d; i++)
            acc[i] = fmaf(vf[i], vs, acc[i]);
        S = fmaf(S, ms, vs);
    }
    const float S_inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < d; i++)
        out[i] = acc[i] * S_inv;
}

/* Task t = (token b, KV head g) of the batch: the query heads that share
 * KV head g, one after the other, so the second reads the cache rows the
 * first brought in. */
static void attn_chunk(void *ctx, int t, int ith)
{
    const attn_job *a = ctx;
    const tg_hparams *hp = &a->s->m->hp;
    const int group = hp->n_head / hp->n_head_kv;
    const int b = t / hp->n_head_kv, g = t % hp->n_head_kv;
    for (int h = g * group; h < (g + 1) * group; h++)
        attn_head(a, b, h, ith);
}

/* --- the forward pass ---------------------------------------------------- */

/* Byte offset of the cache row of KV head g at position pos of layer il
 * (the K and V caches alike). */
static size_t kv_off(const tg_session *s, int il, int pos, int g)
{
    const cpu_state *c = s->tier;
    const tg_hparams *hp = &s->m->hp;
    return (((size_t)il * hp->n_head_kv + (size_t)g) * s->o.n_ctx + (size_t)pos) * hp->head_dim * c->kv_es;
}

/* The replay hook of the K and V cache rows of the batch (positions pos0..
 * pos0+nb-1 of layer il): each row as stored, read back to f32 (into the
 * att buffer, free until the attention), recorded, and stored again from
 * what the hook leaves (the reference's values when it has them; they are
 * representable in the cache type when the reference applied it). */
static void replay_cache(tg_session *s, int il, int pos0, int nb)
{
    cpu_state *c = s->tier;
    const tg_hparams *hp = &s->m->hp;
    const int d = hp->head_dim, KV = hp->n_head_kv * d;
    const tg_type_traits *tr = tg_traits(c->kv_type);
    for (int kv = 0; kv < 2; kv++) {
        char *cache = kv ? c->vc : c->kc;
        for (int b = 0; b < nb; b++)
            for (int g = 0; g < hp->n_head_kv; g++)
                tr->to_float(cache + kv_off(s, il, pos0 + b, g), c->att + (size_t)b * KV + (size_t)g * d, d);
        tg_hook(s, il, kv ? TG_RS_V_CACHE : TG_RS_K_CACHE, pos0, nb, c->att, KV, 0, KV);
        for (int b = 0; b < nb; b++)
            for (int g = 0; g < hp->n_head_kv; g++)
                k_quantize_row(c->kv_type, c->att + (size_t)b * KV + (size_t)g * d, cache + kv_off(s, il, pos0 + b, g),
                               d);
    }
}

static int dump(tg_session *s, int want, int layer, int stage, const float *x, int64_t n, tg_err *e)
{
    return want ? tg_dump(s, layer, stage, x, n, e) : 0;
}

/* --- elementwise steps over the batch's tokens ---------------------------
 * Each step works on whole tokens (rows of the batch), so a run of tokens
 * [b0, b1) is a pool item range and the bytes do not depend on who runs
 * it.
 */

/* The layer a step belongs to. */
typedef struct tok_step {
    tg_session *s;
    const tg_layer *L;
    int il;
} tok_step;

/* Batches of at least this many tokens run their elementwise steps on the
 * pool; smaller ones (decode's single token) on the caller's thread, where
 * a pool job would cost more than the step. */
#define POOL_MIN_TOKENS 8

/* Runs fn(ctx, ...) over the tokens [0, nb) of the batch. */
static void for_tokens(tg_session *s, int nb, tg_pool_range_fn fn, void *ctx)
{
    cpu_state *c = s->tier;
    if (nb >= POOL_MIN_TOKENS)
        tg_pool_run_ranges(c->pool, nb, fn, ctx);
    else
        fn(ctx, 0, nb, 0);
}

/* A block's input rmsnorm: h = rmsnorm(x) * w, n values per token. */
typedef struct norm_step {
    cpu_state *c;
    const float *w;   /* (n) */
    int n;
    float eps;
} norm_step;

static void norm_rows(void *ctx, int b0, int b1, int ith)
{
    (void)ith;
    const norm_step *t = ctx;
    const size_t n = (size_t)t->n;
    for (int b = b0; b < b1; b++)
        rmsnorm(t->c->h + b * n, t->c->x + b * n, t->w, t->n, t->eps);
}

/* h = rmsnorm(x) * w for the batch's nb tokens. */
static void norm_tokens(tg_session *s, int nb, const float *w, float eps)
{
    norm_step t = {s->tier, w, s->m->hp.n_embd, eps};
    for_tokens(s, nb, norm_rows, &t);
}

/* Per-head q/k rmsnorm (qwen3) for tokens [b0, b1). */
static void qk_norm_tokens(void *ctx, int b0, int b1, int ith)
{
    (void)ith;
    const tok_step *t = ctx;
    const cpu_state *c = t->s->tier;
    const tg_layer *L = t->L;
    const tg_hparams *hp = &t->s->m->hp;
    const int il = t->il, d = hp->head_dim, KV = hp->n_head_kv * d, Qd = hp->n_head * d;
    (void)il;   /* in scope for the mutation suites' per-layer bugs */
    for (int b = b0; b < b1; b++) {
        float *qb = c->q + (size_t)b * Qd, *kb = c->k + (size_t)b * KV;
        for (int h = 0; h < hp->n_head; h++)
            rmsnorm(qb + (size_t)h * d, qb + (size_t)h * d, L->q_norm.data, d, hp->eps);
        for (int h = 0; h < hp->n_head_kv; h++)
            rmsnorm(kb + (size_t)h * d, kb + (size_t)h * d, L->k_norm.data, d, hp->eps);
    }
}

/* Rope of q and k for tokens [b0, b1). */
static void rope_tokens(void *ctx, int b0, int b1, int ith)
{
    (void)ith;
    const tok_step *t = ctx;
    const cpu_state *c = t->s->tier;
    const tg_hparams *hp = &t->s->m->hp;
    const int d = hp->head_dim, KV = hp->n_head_kv * d, Qd = hp->n_head * d;
    for (int b = b0; b < b1; b++) {
        float *qb = c->q + (size_t)b * Qd, *kb = c->k + (size_t)b * KV;
        rope(qb, hp->n_head, d, hp->rope_neox, c->rope_cs + (size_t)b * d);
        rope(kb, hp->n_head_kv, d, hp->rope_neox, c->rope_cs + (size_t)b * d);
    }
}

/* k, v of tokens [b0, b1) into the cache (in the cache type), head by
 * head. */
static void kv_store_tokens(void *ctx, int b0, int b1, int ith)
{
    (void)ith;
    const tok_step *t = ctx;
    tg_session *s = t->s;
    cpu_state *c = s->tier;
    const tg_hparams *hp = &s->m->hp;
    const int il = t->il, d = hp->head_dim, KV = hp->n_head_kv * d;
    for (int b = b0; b < b1; b++)
        for (int g = 0; g < hp->n_head_kv; g++) {
            const size_t off = kv_off(s, il, c->pos0 + b, g);
            k_quantize_row(c->kv_type, c->k + (size_t)b * KV + (size_t)g * d, (char *)c->kc + off, d);
            k_quantize_row(c->kv_type, c->v + (size_t)b * KV + (size_t)g * d, (char *)c->vc + off, d);
        }
}

/* x += o (the residual) for tokens [b0, b1). */
static void residual_tokens(void *ctx, int b0, int b1, int ith)
{
    (void)ith;
    const tok_step *t = ctx;
    cpu_state *c = t->s->tier;
    const size_t E = (size_t)t->s->m->hp.n_embd;
    for (size_t i = (size_t)b0 * E; i < (size_t)b1 * E; i++)
        c->x[i] += c->o[i];
}

static int cpu_eval(tg_session *s, const int32_t *tokens, int nb, unsigned flags, tg_err *e)
{
    const int want = (flags & TG_EVAL_DUMP) != 0;
    cpu_state *c = s->tier;
    const tg_model *m = s->m;
    const tg_hparams *hp = &m->hp;
    const int E = hp->n_embd, d = hp->head_dim, KV = hp->n_head_kv * d, Qd = hp->n_head * d, F = hp->n_ff;
    const int last = nb - 1;
    const int pos0 = s->pos;
    c->pos0 = pos0;

    // token embeddings
    const tg_type_traits *etr = tg_traits(m->token_embd.type);
    for (int b = 0; b < nb; b++)
        etr->to_float((const char *)m->token_embd.data + (size_t)tokens[b] * m->token_embd.row_size,
                      c->x + (size_t)b * E, E);
    tg_ops_count(&s->ops, TG_OP_EMBED, m->token_embd.type, TG_TIER_CPU);
    tg_hook(s, 0, TG_RS_EMBD, pos0, nb, c->x, E, 0, E);

    // rope cos/sin per token
    for (int b = 0; b < nb; b++)
        rope_cache(c->rope_cs + (size_t)b * d, pos0 + b, d, hp->rope_base);

    for (int il = 0; il < hp->n_layer; il++) {
        const tg_layer *L = &m->layers[il];
        tok_step ts = {s, L, il};
        c->layer = il;

        // attention rmsnorm
        norm_tokens(s, nb, L->attn_norm.data, hp->eps);
        tg_ops_count(&s->ops, TG_OP_RMSNORM, 0, TG_TIER_CPU);
        tg_hook(s, il, TG_RS_ATTN_NORM, pos0, nb, c->h, E, 0, E);
        if (dump(s, want, il, TG_STAGE_ATTN_NORM, c->h + (size_t)last * E, E, e))
            return -1;

        // q, k, v projections
        {
            const tg_weight *w[3] = {&L->wq, &L->wk, &L->wv};
            float *out[3] = {c->q, c->k, c->v};
            const int64_t os[3] = {Qd, KV, KV};
            matmul_same_input(s, w, out, os, 3, c->h, E, nb, 0);
        }
        tg_hook(s, il, TG_RS_Q_PROJ, pos0, nb, c->q, Qd, 0, Qd);
        tg_hook(s, il, TG_RS_K_PROJ, pos0, nb, c->k, KV, 0, KV);
        tg_hook(s, il, TG_RS_V_PROJ, pos0, nb, c->v, KV, 0, KV);

        // per-head q/k rmsnorm (qwen3), then rope
        if (hp->qk_norm) {
            for_tokens(s, nb, qk_norm_tokens, &ts);
            tg_hook(s, il, TG_RS_Q_NORM, pos0, nb, c->q, Qd, 0, Qd);
            tg_hook(s, il, TG_RS_K_NORM, pos0, nb, c->k, KV, 0, KV);
        }
        for_tokens(s, nb, rope_tokens, &ts);
        if (hp->qk_norm) {
            tg_ops_count(&s->ops, TG_OP_RMSNORM, 0, TG_TIER_CPU);
            tg_ops_count(&s->ops, TG_OP_RMSNORM, 0, TG_TIER_CPU);
        }
        tg_ops_count(&s->ops, TG_OP_ROPE, 0, TG_TIER_CPU);
        tg_ops_count(&s->ops, TG_OP_ROPE, 0, TG_TIER_CPU);
        tg_hook(s, il, TG_RS_Q_ROPE, pos0, nb, c->q, Qd, 0, Qd);
        tg_hook(s, il, TG_RS_K_ROPE, pos0, nb, c->k, KV, 0, KV);
        if (dump(s, want, il, TG_STAGE_Q, c->q + (size_t)last * Qd, Qd, e) ||
            dump(s, want, il, TG_STAGE_K, c->k + (size_t)last * KV, KV, e) ||
            dump(s, want, il, TG_STAGE_V, c->v + (size_t)last * KV, KV, e))
            return -1;

        // append k, v to the cache (in the cache type), head by head
        {
            for_tokens(s, nb, kv_store_tokens, &ts);
            tg_ops_count(&s->ops, TG_OP_KV_STORE, 0, TG_TIER_CPU);
            if (s->replay)
                replay_cache(s, il, pos0, nb);
        }

        // attention over positions 0..pos of each token
        {
            attn_job a = {.s = s, .layer = il, .nb = nb, .pos0 = pos0};
            tg_pool_run(c->pool, nb * hp->n_head_kv, attn_chunk, &a);
            tg_ops_count(&s->ops, TG_OP_ATTN, 0, TG_TIER_CPU);
        }
        tg_hook(s, il, TG_RS_ATTN, pos0, nb, c->att, Qd, 0, Qd);

        // output projection
        {
            const tg_weight *w[1] = {&L->wo};
            float *out[1] = {c->o};
            const int64_t os[1] = {E};
            matmul_same_input(s, w, out, os, 1, c->att, Qd, nb, 0);
        }
        tg_hook(s, il, TG_RS_ATTN_OUT, pos0, nb, c->o, E, 0, E);
        if (dump(s, want, il, TG_STAGE_ATTN_OUT, c->o + (size_t)last * E, E, e))
            return -1;

        // residual
        for_tokens(s, nb, residual_tokens, &ts);
        tg_ops_count(&s->ops, TG_OP_ADD, 0, TG_TIER_CPU);
        tg_hook(s, il, TG_RS_ATTN_RES, pos0, nb, c->x, E, 0, E);

        // ffn rmsnorm
        norm_tokens(s, nb, L->ffn_norm.data, hp->eps);
        tg_ops_count(&s->ops, TG_OP_RMSNORM, 0, TG_TIER_CPU);
        tg_hook(s, il, TG_RS_FFN_NORM, pos0, nb, c->h, E, 0, E);
        if (dump(s, want, il, TG_STAGE_FFN_NORM, c->h + (size_t)last * E, E, e))
            return -1;

        // gate and up projections, swiglu on each thread's rows
        {
            const tg_weight *w[2] = {&L->gate, &L->up};
            float *out[2] = {c->g, c->u};
            const int64_t os[2] = {F, F};
            matmul_same_input(s, w, out, os, 2, c->h, E, nb, 1);
        }

        // down projection
        {
            const tg_weight *w[1] = {&L->down};
            float *out[1] = {c->o};
            const int64_t os[1] = {E};
            matmul_same_input(s, w, out, os, 1, c->g, F, nb, 0);
        }
        tg_hook(s, il, TG_RS_FFN_OUT, pos0, nb, c->o, E, 0, E);
        if (dump(s, want, il, TG_STAGE_FFN_OUT, c->o + (size_t)last * E, E, e))
            return -1;

        // residual
        for_tokens(s, nb, residual_tokens, &ts);
        tg_ops_count(&s->ops, TG_OP_ADD, 0, TG_TIER_CPU);
        tg_hook(s, il, TG_RS_RESIDUAL, pos0, nb, c->x, E, 0, E);
        if (dump(s, want, il, TG_STAGE_RESIDUAL, c->x + (size_t)last * E, E, e))
            return -1;
    }

    // output rmsnorm and projection, last token only
    rmsnorm(c->h, c->x + (size_t)last * E, m->output_norm.data, E, hp->eps);
    tg_ops_count(&s->ops, TG_OP_RMSNORM, 0, TG_TIER_CPU);
    tg_hook(s, -1, TG_RS_OUT_NORM, pos0 + last, 1, c->h, E, 0, E);
    {
        const tg_weight *w[1] = {&m->output};
        float *out[1] = {s->logits};
        const int64_t os[1] = {hp->n_vocab};
        matmul_same_input(s, w, out, os, 1, c->h, E, 1, 0);
    }
    tg_hook(s, -1, TG_RS_LOGITS, pos0 + last, 1, s->logits, hp->n_vocab, 0, hp->n_vocab);
    if (dump(s, want, -1, TG_STAGE_LOGITS, s->logits, hp->n_vocab, e))
        return -1;
    return 0;
}

/* --- state --------------------------------------------------------------- */

static void cpu_fini(tg_session *s)
{
    cpu_state *c = s->tier;
    if (!c)
        return;
    tg_pool_free(c->pool);
    free(c->x); free(c->h); free(c->q); free(c->k); free(c->v); free(c->att); free(c->o);
    free(c->g); free(c->u); free(c->qa); free(c->qb); free(c->kc); free(c->vc); free(c->acc);
    free(c->fa_scratch); free(c->qconv); free(c->rope_cs);
    free(c);
    s->tier = NULL;
}

static int cpu_init(tg_session *s, tg_err *e)
{
    const tg_model *m = s->m;
    const tg_hparams *hp = &m->hp;
    if (s->o.f64)
        return tg_errf(e, "option f64 is for the ref tier only");
    // every matrix must have a fast kernel for its type
    const tg_weight *check[2] = {&m->output, &m->token_embd};
    for (int i = 0; i < 2; i++)
        if (!k_has_matmul(check[i]->type))
            return tg_errf(e, "cpu tier: no kernel for tensor '%s' of type %s", check[i]->name,
                           tg_type_name(check[i]->type));
    for (int il = 0; il < hp->n_layer; il++) {
        const tg_layer *L = &m->layers[il];
        const tg_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 7; i++)
            if (!k_has_matmul(ws[i]->type))
                return tg_errf(e, "cpu tier: no kernel for tensor '%s' of type %s", ws[i]->name,
                               tg_type_name(ws[i]->type));
    }

    cpu_state *c = calloc(1, sizeof *c);
    if (!c)
        return tg_errf(e, "out of memory");
    s->tier = c;
    const size_t nb = (size_t)s->o.n_batch, E = (size_t)hp->n_embd, d = (size_t)hp->head_dim,
                 Q = (size_t)hp->n_head * d, KV = (size_t)hp->n_head_kv * d, F = (size_t)hp->n_ff;
    size_t maxc = E > F ? E : F;
    maxc = maxc > Q ? maxc : Q;
    c->nb = (int)nb;
    c->kv_type = s->o.kv_f32 ? TG_TYPE_F32 : TG_TYPE_F16;
    c->kv_es = s->o.kv_f32 ? sizeof(float) : sizeof(tg_half);
    c->nth = s->o.threads;
    c->pool = tg_pool_new(c->nth);
    c->qa_stride = maxc * sizeof(float);   /* f32 rows are the largest vec_dot rows */
    size_t cache = (size_t)hp->n_layer * (size_t)s->o.n_ctx * KV * c->kv_es;
    c->x = calloc(nb * E, sizeof(float));
    c->h = calloc(nb * E, sizeof(float));
    c->q = calloc(nb * Q, sizeof(float));
    c->k = calloc(nb * KV, sizeof(float));
    c->v = calloc(nb * KV, sizeof(float));
    c->att = calloc(nb * Q, sizeof(float));
    c->o = calloc(nb * E, sizeof(float));
    c->g = calloc(nb * F, sizeof(float));
    c->u = calloc(nb * F, sizeof(float));
    c->qa = calloc(nb, c->qa_stride);
    c->qb = calloc(nb, c->qa_stride);
    c->kc = calloc(cache, 1);
    c->vc = calloc(cache, 1);
    c->acc = calloc((size_t)c->nth * d, sizeof(float));
    c->fa_scratch = calloc((size_t)c->nth * 2 * (size_t)s->o.n_ctx, sizeof(float));
    c->qconv = calloc((size_t)c->nth * d, sizeof(float));
    c->rope_cs = calloc(nb * d, sizeof(float));
    if (!c->pool || !c->x || !c->h || !c->q || !c->k || !c->v || !c->att || !c->o || !c->g || !c->u ||
        !c->qa || !c->qb || !c->kc || !c->vc || !c->acc || !c->fa_scratch || !c->qconv || !c->rope_cs) {
        cpu_fini(s);
        return tg_errf(e, "cpu tier: out of memory (or threads) for n_ctx %d, n_batch %d, %d threads",
                       s->o.n_ctx, s->o.n_batch, s->o.threads);
    }
    return 0;
}

/* No eval_all: the session evaluates forced tokens one at a time. */
/* The cpu tier's declared numerics (tier.h, numerics): llama.cpp's CPU
 * backend's roundings, which the ref tier can apply in a replay. */
static void cpu_numerics(const tg_opts *o, char *buf, size_t n)
{
    snprintf(buf, n,
             "{\"exact\":false,\"act\":\"vec_dot\",\"kv\":\"%s\",\"attn_q\":\"kv\",\"attn_acc\":\"kv\","
             "\"rope\":\"ggml-f32\",\"accum\":\"f32\",\"silu\":\"ggml-expf\"}",
             o->kv_f32 ? "f32" : "f16");
}

const tg_tier_i tg_tier_cpu = {
    .id = TG_TIER_CPU,
    .name = "cpu",
    .n_batch_default = 64,
    .describe = cpu_describe,
    .init = cpu_init,
    .free = cpu_fini,
    .eval = cpu_eval,
    .numerics = cpu_numerics,
};
