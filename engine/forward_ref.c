/*
 * forward_ref.c: the ref tier, the portable yardstick every other arm is
 * measured against (see model.h).
 *
 * Plain C. Weights are dequantized row by row with the values of the
 * type's scalar to_float (Q4_K and Q6_K by loops of the same arithmetic
 * that the compiler vectorizes, tested bit for bit against it); every sum (dot products, rmsnorm, softmax, attention) is taken
 * in f64. Activations are held as doubles but rounded to f32 after every op,
 * so the tier computes "f32 activations with f64 accumulation"; with the f64
 * option the rounding is skipped, which gives the test suite a near-exact
 * value of the quantized model to judge the other tiers and llama.cpp
 * against. Nothing depends on timing, threads or batching: the same input
 * gives the same bytes on every machine with IEEE doubles and a correctly
 * rounded libm for exp, sqrt, pow, cos and sin.
 *
 * The one order of a dot product (tg_ref_dot, forward_ref.h): eight running
 * sums, element j into sum j % 8, each a separate f64 multiply then add,
 * added in a fixed tree, then the tail in order. The vector code holds the
 * eight sums in two 4-lane f64 vectors (lanes 0-3 and 4-7), so every lane
 * does exactly the scalar sum's operations; the Makefile builds this file
 * with -ffp-contract=off (no fused multiply-add on any ISA) and the x86-64
 * clones target AVX2 without FMA.
 *
 * Batches: an eval of n tokens runs layer by layer over up to REF_NB
 * tokens at a time. Each weight row is dequantized once, converted to f64
 * once and dotted with the batch's n activation vectors (each dot in the
 * order above, so a token's bytes are those of a one-token eval; rows are
 * taken in blocks of REF_KB columns, the eight sums of every dot kept
 * between blocks, so a block of the batch's vectors stays in cache); the
 * per-token ops (norms, rope, attention over positions 0..its own, swiglu,
 * residuals, the perturbation) are the same arithmetic per token. The KV
 * cache of a layer gets every token's k and v before the layer's attention,
 * which reads for token t only positions up to its own. This is what makes
 * the large models of the GPU gates affordable: a forced leg costs one
 * dequantization of the weights per batch instead of per token.
 *
 * Threads: as the threads option says (the session resolves 0 to the
 * online CPUs); above 1, the mat-vecs hand row ranges to a thread pool;
 * every output is still one dot product taken in the same order by one
 * thread, so the bytes do not change.
 *
 * The tier's table, tg_tier_ref (tier.h), is at the end of the file.
 */
/* No multiply-add contraction, whatever the build flags (the Makefile also
 * passes -ffp-contract=off): the sums' order is the tier's contract. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#else
#pragma STDC FP_CONTRACT OFF
#endif

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward_ref.h"
#include "quant.h"
#include "threadpool.h"
#include "tier.h"

#define REF_NB 64        /* tokens per internal batch (bounds the scratch buffers) */
#define REF_MM_ROWS 16   /* weight rows per pool chunk */
#define REF_ROWS1 4      /* rows dotted together with one token's vector */
#define REF_KB 512       /* columns per block of a row: whole quant blocks (a
                          * multiple of 256) and whole groups of 8 */

typedef struct ref_state {
    double *x;        /* (REF_NB, n_embd) residual stream */
    double *h;        /* (REF_NB, n_embd) normed input of a block */
    double *q;        /* (REF_NB, n_head*head_dim) */
    double *k;        /* (REF_NB, n_head_kv*head_dim) */
    double *v;        /* (REF_NB, n_head_kv*head_dim) */
    double *att;      /* (REF_NB, n_head*head_dim) attention output, heads concatenated */
    double *o;        /* (REF_NB, n_embd) attn_out / ffn_out */
    double *g;        /* (REF_NB, n_ff) gate, then swiglu */
    double *u;        /* (REF_NB, n_ff) up */
    double *sc;       /* (n_ctx) attention scores of one head */
    double *kc;       /* (n_layer, n_ctx, n_head_kv*head_dim) K cache */
    double *vc;       /* (n_layer, n_ctx, n_head_kv*head_dim) V cache */
    float *row;       /* (nth, REF_ROWS1, REF_KB) blocks of dequantized weight rows per thread */
    double *rowd;     /* (nth, REF_KB) a block in f64, for batches */
    double *acc;      /* (nth, REF_MM_ROWS, REF_NB, 8) the eight sums of every dot of a chunk */
    float *emb;       /* (n_embd) a token's embedding row */
    int nth;          /* threads (1: no pool) */
    tg_pool *pool;
    float *f;         /* (max(n_vocab, n_ff, q dims)) f32 copy for dumps */
    double *lg;       /* (REF_NB, n_vocab) logits before the final rounding */
    double *xr;       /* (REF_NB, max cols) matmul inputs rounded as a replay's numerics ask */
    float *xf;        /* (max cols) one such row in f32 */
    void *xq;         /* (max cols f32 bytes) one row in the vec_dot type */
    double *acc1;     /* (head_dim) the emulated attention accumulator */
    double *qr;       /* (head_dim) q rounded to the K cache type */
} ref_state;

/* --- the dot product ------------------------------------------------------ */

/* vectors are returned only by inlined helpers: no ABI crosses a call */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef double ref_v4d __attribute__((vector_size(32)));
typedef float ref_v4f __attribute__((vector_size(16)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define REF_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define REF_CLONES
#endif

static inline __attribute__((always_inline)) ref_v4d ld_d(const double *p)
{
    ref_v4d v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Four f32 converted to f64 (exact). */
static inline __attribute__((always_inline)) ref_v4d ld_f(const float *p)
{
    ref_v4f v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, ref_v4d);
}

/* The kernels keep a dot's eight sums in memory between calls (acc, 8
 * doubles: lane k is sum k), so a row can be taken in blocks of columns
 * (each a multiple of 8): the lanes see the same operations in the same
 * order as in one pass. */

REF_CLONES void tg_ref_acc(const float *w, const double *x, int64_t n8, double acc[8])
{
    ref_v4d lo = ld_d(acc), hi = ld_d(acc + 4);
    for (int64_t j = 0; j < n8; j += 8) {
        lo += ld_f(w + j) * ld_d(x + j);
        hi += ld_f(w + j + 4) * ld_d(x + j + 4);
    }
    memcpy(acc, &lo, sizeof lo);
    memcpy(acc + 4, &hi, sizeof hi);
}

REF_CLONES void tg_ref_acc_f64(const double *w, const double *x, int64_t n8, double acc[8])
{
    ref_v4d lo = ld_d(acc), hi = ld_d(acc + 4);
    for (int64_t j = 0; j < n8; j += 8) {
        lo += ld_d(w + j) * ld_d(x + j);
        hi += ld_d(w + j + 4) * ld_d(x + j + 4);
    }
    memcpy(acc, &lo, sizeof lo);
    memcpy(acc + 4, &hi, sizeof hi);
}

REF_CLONES void tg_ref_acc4_rows(const float *w, int64_t ldw, const double *x, int64_t n8, double acc[32])
{
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    ref_v4d lo0 = ld_d(acc), hi0 = ld_d(acc + 4), lo1 = ld_d(acc + 8), hi1 = ld_d(acc + 12);
    ref_v4d lo2 = ld_d(acc + 16), hi2 = ld_d(acc + 20), lo3 = ld_d(acc + 24), hi3 = ld_d(acc + 28);
    for (int64_t j = 0; j < n8; j += 8) {
        const ref_v4d xl = ld_d(x + j), xh = ld_d(x + j + 4);
        lo0 += ld_f(w0 + j) * xl;
        hi0 += ld_f(w0 + j + 4) * xh;
        lo1 += ld_f(w1 + j) * xl;
        hi1 += ld_f(w1 + j + 4) * xh;
        lo2 += ld_f(w2 + j) * xl;
        hi2 += ld_f(w2 + j + 4) * xh;
        lo3 += ld_f(w3 + j) * xl;
        hi3 += ld_f(w3 + j + 4) * xh;
    }
    memcpy(acc, &lo0, sizeof lo0);
    memcpy(acc + 4, &hi0, sizeof hi0);
    memcpy(acc + 8, &lo1, sizeof lo1);
    memcpy(acc + 12, &hi1, sizeof hi1);
    memcpy(acc + 16, &lo2, sizeof lo2);
    memcpy(acc + 20, &hi2, sizeof hi2);
    memcpy(acc + 24, &lo3, sizeof lo3);
    memcpy(acc + 28, &hi3, sizeof hi3);
}

REF_CLONES void tg_ref_acc4_tok(const double *w, const double *x, int64_t ldx, int64_t n8, double acc[32])
{
    const double *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    ref_v4d lo0 = ld_d(acc), hi0 = ld_d(acc + 4), lo1 = ld_d(acc + 8), hi1 = ld_d(acc + 12);
    ref_v4d lo2 = ld_d(acc + 16), hi2 = ld_d(acc + 20), lo3 = ld_d(acc + 24), hi3 = ld_d(acc + 28);
    for (int64_t j = 0; j < n8; j += 8) {
        const ref_v4d wl = ld_d(w + j), wh = ld_d(w + j + 4);
        lo0 += wl * ld_d(x0 + j);
        hi0 += wh * ld_d(x0 + j + 4);
        lo1 += wl * ld_d(x1 + j);
        hi1 += wh * ld_d(x1 + j + 4);
        lo2 += wl * ld_d(x2 + j);
        hi2 += wh * ld_d(x2 + j + 4);
        lo3 += wl * ld_d(x3 + j);
        hi3 += wh * ld_d(x3 + j + 4);
    }
    memcpy(acc, &lo0, sizeof lo0);
    memcpy(acc + 4, &hi0, sizeof hi0);
    memcpy(acc + 8, &lo1, sizeof lo1);
    memcpy(acc + 12, &hi1, sizeof hi1);
    memcpy(acc + 16, &lo2, sizeof lo2);
    memcpy(acc + 20, &hi2, sizeof hi2);
    memcpy(acc + 24, &lo3, sizeof lo3);
    memcpy(acc + 28, &hi3, sizeof hi3);
}

double tg_ref_acc_sum(const double acc[8], const float *w, const double *x, int64_t nt)
{
    double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (int64_t j = 0; j < nt; j++)
        sum += (double)w[j] * x[j];
    return sum;
}

double tg_ref_dot(const float *w, const double *x, int64_t n)
{
    const int64_t n8 = n & ~(int64_t)7;
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    tg_ref_acc(w, x, n8, acc);
    return tg_ref_acc_sum(acc, w + n8, x + n8, n - n8);
}

/* y (n) = x (n) converted to f64 (exact). */
REF_CLONES static void to_f64(const float *x, double *y, int64_t n)
{
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const ref_v4d v = ld_f(x + j);
        memcpy(y + j, &v, sizeof v);
    }
    for (; j < n; j++)
        y[j] = x[j];
}

/* --- state ------------------------------------------------------------------ */

static double rnd(const tg_session *s, double x)
{
    return s->o.f64 ? x : (double)(float)x;
}

/* The threads the tier runs on for options o: a pool of o->threads above 1,
 * else the calling thread. */
static int ref_threads(const tg_opts *o)
{
    return o->threads > 1 ? o->threads : 1;
}

static void ref_fini(tg_session *s)
{
    ref_state *r = s->tier;
    if (!r)
        return;
    free(r->x); free(r->h); free(r->q); free(r->k); free(r->v); free(r->att); free(r->o);
    free(r->g); free(r->u); free(r->sc); free(r->kc); free(r->vc); free(r->row); free(r->rowd);
    free(r->acc); free(r->emb);
    free(r->f); free(r->lg); free(r->xr); free(r->xf); free(r->xq); free(r->acc1); free(r->qr);
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
    r->x = calloc(REF_NB * E, sizeof(double));
    r->h = calloc(REF_NB * E, sizeof(double));
    r->q = calloc(REF_NB * Q, sizeof(double));
    r->k = calloc(REF_NB * KV, sizeof(double));
    r->v = calloc(REF_NB * KV, sizeof(double));
    r->att = calloc(REF_NB * Q, sizeof(double));
    r->o = calloc(REF_NB * E, sizeof(double));
    r->g = calloc(REF_NB * F, sizeof(double));
    r->u = calloc(REF_NB * F, sizeof(double));
    r->sc = calloc((size_t)s->o.n_ctx, sizeof(double));
    r->kc = calloc(cache, sizeof(double));
    r->vc = calloc(cache, sizeof(double));
    r->nth = ref_threads(&s->o);
    r->row = calloc((size_t)REF_ROWS1 * REF_KB * (size_t)r->nth, sizeof(float));
    r->rowd = calloc((size_t)REF_KB * (size_t)r->nth, sizeof(double));
    r->acc = calloc((size_t)REF_MM_ROWS * REF_NB * 8 * (size_t)r->nth, sizeof(double));
    r->emb = calloc(E, sizeof(float));
    if (r->nth > 1 && !(r->pool = tg_pool_new(r->nth))) {
        ref_fini(s);
        return tg_errf(e, "ref tier: cannot start %d threads (option threads)", r->nth);
    }
    r->f = calloc(maxf, sizeof(float));
    r->lg = calloc(REF_NB * V, sizeof(double));
    r->xr = calloc(REF_NB * maxc, sizeof(double));
    r->xf = calloc(maxc, sizeof(float));
    r->xq = calloc(maxc, sizeof(float));
    r->acc1 = calloc((size_t)hp->head_dim, sizeof(double));
    r->qr = calloc((size_t)hp->head_dim, sizeof(double));
    if (!r->xr || !r->xf || !r->xq || !r->acc1 || !r->qr ||
        !r->x || !r->h || !r->q || !r->k || !r->v || !r->att || !r->o || !r->g || !r->u || !r->sc ||
        !r->kc || !r->vc || !r->row || !r->rowd || !r->acc || !r->emb || !r->f || !r->lg) {
        ref_fini(s);
        return tg_errf(e, "ref tier: out of memory for a KV cache of %d positions (option n_ctx)", s->o.n_ctx);
    }
    s->o.kv_f32 = 1;   /* the cache is always F32 (f64 values rounded as the activations) */
    return 0;
}

/* "portable C reference, avx2 clones, 2 threads, f32 KV": the dot
 * kernels' clone (x86-64: what the loader's ifunc picks by the same test),
 * the threads, the cache, and f64 activations when set. Returns 0. */
static int ref_describe(const tg_session *s, const tg_opts *o, char *buf, size_t n)
{
    (void)s;
    const int nth = ref_threads(o);
    const char *clone = "";
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    clone = __builtin_cpu_supports("avx2") ? ", avx2 clones" : ", baseline clones";
#endif
    snprintf(buf, n, "portable C reference%s, %d thread%s, f32 KV%s", clone, nth, nth == 1 ? "" : "s",
             o->f64 ? ", f64 activations" : "");
    return 0;
}

/* --- ops ---------------------------------------------------------------------- */

/* The numerics a running replay asks for, or NULL. */
static const tg_replay_num *num(const tg_session *s)
{
    return s->replay ? tg_replay_numerics(s->replay) : NULL;
}

/* x rounded as an accumulator of `bits` (16: f16, 32: f32, else kept). */
static double acc_round(double x, int bits)
{
    if (bits == 16)
        return tg_half_to_f32(tg_f32_to_half((float)x));
    return bits == 32 ? (double)(float)x : x;
}

typedef struct ref_mm {
    const tg_session *s;
    double *out;          /* (n, w->rows) */
    const tg_weight *w;
    const double *x;      /* (n, w->cols) */
    int n;
} ref_mm;

/* Rows [chunk * REF_MM_ROWS, +REF_MM_ROWS) of a matmul, on thread ith's
 * buffers, in blocks of REF_KB columns: each block of a row is dequantized
 * once (and for batches converted to f64 once) and added into the eight
 * sums of every (row, token) pair; the last block ends each dot (the tree,
 * then the tail in order). One token: four rows at a time (eight
 * independent sums per step); several: four tokens at a time. A block of
 * the batch's vectors (REF_NB x REF_KB doubles) stays in cache across the
 * chunk's rows. */
static void matmul_rows(void *ctx, int chunk, int ith)
{
    const ref_mm *d = ctx;
    const ref_state *r = d->s->tier;
    const tg_weight *w = d->w;
    const int64_t rows = w->rows, n = w->cols, n8 = n & ~(int64_t)7;
    const int nt = d->n;
    const tg_to_float_fn to_float = tg_traits(w->type)->to_float;
    float *seg = r->row + (size_t)ith * REF_ROWS1 * REF_KB;          /* (REF_ROWS1, REF_KB) */
    double *segd = r->rowd + (size_t)ith * REF_KB;                    /* (REF_KB) */
    double *acc = r->acc + (size_t)ith * REF_MM_ROWS * REF_NB * 8;    /* (chunk rows, nt, 8) */
    const int64_t i0 = (int64_t)chunk * REF_MM_ROWS, i1 = i0 + REF_MM_ROWS < rows ? i0 + REF_MM_ROWS : rows;
    memset(acc, 0, (size_t)(i1 - i0) * (size_t)nt * 8 * sizeof(double));
    for (int64_t k0 = 0; k0 < n; k0 += REF_KB) {
        const int64_t kn = n - k0 < REF_KB ? n - k0 : REF_KB;
        const int64_t kn8 = k0 + kn <= n8 ? kn : n8 - k0;   /* whole groups of 8 in the block */
        const int last = k0 + kn == n;
        const char *base = (const char *)w->data + tg_row_size(w->type, k0);
        const double *x = d->x + k0;
        int64_t i = i0;
        if (nt == 1) {
            for (; i + REF_ROWS1 <= i1; i += REF_ROWS1) {
                double *a = acc + (size_t)(i - i0) * 8;
                for (int k = 0; k < REF_ROWS1; k++)
                    to_float(base + (size_t)(i + k) * w->row_size, seg + (size_t)k * REF_KB, kn);
                tg_ref_acc4_rows(seg, REF_KB, x, kn8, a);
                for (int k = 0; last && k < REF_ROWS1; k++)
                    d->out[i + k] = rnd(d->s, tg_ref_acc_sum(a + 8 * k, seg + (size_t)k * REF_KB + kn8, x + kn8,
                                                             kn - kn8));
            }
            for (; i < i1; i++) {
                double *a = acc + (size_t)(i - i0) * 8;
                to_float(base + (size_t)i * w->row_size, seg, kn);
                tg_ref_acc(seg, x, kn8, a);
                if (last)
                    d->out[i] = rnd(d->s, tg_ref_acc_sum(a, seg + kn8, x + kn8, kn - kn8));
            }
            continue;
        }
        for (; i < i1; i++) {
            double *a = acc + (size_t)(i - i0) * (size_t)nt * 8;
            to_float(base + (size_t)i * w->row_size, seg, kn);
            to_f64(seg, segd, kn8);
            int t = 0;
            for (; t + 4 <= nt; t += 4)
                tg_ref_acc4_tok(segd, x + (size_t)t * n, n, kn8, a + 8 * t);
            for (; t < nt; t++)
                tg_ref_acc_f64(segd, x + (size_t)t * n, kn8, a + 8 * t);
            for (t = 0; last && t < nt; t++)
                d->out[(size_t)t * rows + i] =
                    rnd(d->s, tg_ref_acc_sum(a + 8 * t, seg + kn8, x + (size_t)t * n + kn8, kn - kn8));
        }
    }
}

/* Q4_1 and Q5_1 against Q8_1 activations take each block's min term as
 * m * s with the activation block's s stored as a half (ggml's arithmetic,
 * declared by the arm), not as m * d * sum(q). q8_1_gap: c[b] = s - d *
 * sum(q) of each block of one quantized row; q8_1_min_terms: out gets, for
 * each row and token t, sum over blocks of m * c[t][b]. */
static void q8_1_gap(const block_q8_1 *a, int64_t nb, double *c)
{
    for (int64_t b = 0; b < nb; b++) {
        int sum = 0;
        for (int j = 0; j < QK8_0; j++) sum += a[b].qs[j];
        c[b] = (double)tg_half_to_f32(a[b].s) - (double)tg_half_to_f32(a[b].d) * sum;
    }
}

static void q8_1_min_terms(double *out, const tg_weight *w, const double *c, int n)
{
    const int64_t nb = w->cols / QK8_0;
    const size_t bs = tg_traits(w->type)->type_size;
    for (int64_t row = 0; row < w->rows; row++) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)row * w->row_size;
        for (int t = 0; t < n; t++) {
            double corr = 0;
            for (int64_t b = 0; b < nb; b++) {
                tg_half m;
                memcpy(&m, wr + (size_t)b * bs + 2, sizeof m);   /* m follows d in both layouts */
                corr += (double)tg_half_to_f32(m) * c[(size_t)t * nb + b];
            }
            out[(size_t)t * w->rows + row] += corr;
        }
    }
}

/* out (n, w->rows) = W x for the n vectors x (n, w->cols): one dot per
 * (token, row), in the same order whichever thread takes it. Counted as n
 * matmuls (one per token, as a one-token eval counts). */
static void matmul(tg_session *s, double *out, const tg_weight *w, const double *x, int n)
{
    assert(n >= 1 && n <= REF_NB);
    ref_state *r = s->tier;
    const tg_replay_num *nm = num(s);
    const uint32_t vt = tg_traits(w->type)->vec_dot_type;
    double *gap = NULL;   /* Q8_1: each token's block gaps (q8_1_gap); NULL when out of memory */
    if (nm && nm->act_vec_dot && vt != TG_TYPE_F32) {
        // a replay's declared numerics: the input rows through the vec_dot type
        const tg_type_traits *tr = tg_traits(vt);
        if (vt == TG_TYPE_Q8_1) gap = malloc((size_t)n * (size_t)(w->cols / QK8_0) * sizeof *gap);
        for (int t = 0; t < n; t++) {
            for (int64_t i = 0; i < w->cols; i++)
                r->xf[i] = (float)x[(size_t)t * w->cols + i];
            tr->from_float(r->xf, r->xq, w->cols);
            if (gap) q8_1_gap((const block_q8_1 *)r->xq, w->cols / QK8_0, gap + (size_t)t * (w->cols / QK8_0));
            tr->to_float(r->xq, r->xf, w->cols);
            for (int64_t i = 0; i < w->cols; i++)
                r->xr[(size_t)t * w->cols + i] = r->xf[i];
        }
        x = r->xr;
    }
    ref_mm d = {s, out, w, x, n};
    const int nchunks = (int)((w->rows + REF_MM_ROWS - 1) / REF_MM_ROWS);
    if (r->pool)
        tg_pool_run(r->pool, nchunks, matmul_rows, &d);
    else
        for (int c = 0; c < nchunks; c++)
            matmul_rows(&d, c, 0);
    if (gap) q8_1_min_terms(out, w, gap, n);
    free(gap);
    for (int t = 0; t < n; t++)
        tg_ops_count(&s->ops, TG_OP_MATMUL, w->type, TG_TIER_REF);
}

void tg_ref_matmul(tg_session *s, double *out, const tg_weight *w, const double *x, int n)
{
    assert(s->t->id == TG_TIER_REF && "tg_ref_matmul: a ref-tier session");
    matmul(s, out, w, x, n);
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
    const tg_replay_num *nm = num(s);
    int d = hp->head_dim, half = d / 2;
    const float theta_scale = powf(hp->rope_base, -2.0f / (float)d);
    float theta_f = (float)pos;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * pow((double)hp->rope_base, -2.0 * i / d);
        double c = cos(theta), sn = sin(theta);
        if (nm && nm->rope_ggml) {
            // a replay's declared numerics: ggml-cpu's f32 angles
            c = cosf(theta_f);
            sn = sinf(theta_f);
            theta_f *= theta_scale;
        }
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

static int dump(tg_session *s, int want, int layer, int stage, const double *x, int64_t n, tg_err *e)
{
    if (!want || !s->dump_fn)
        return 0;
    ref_state *r = s->tier;
    for (int64_t i = 0; i < n; i++)
        r->f[i] = (float)x[i];
    return tg_dump(s, layer, stage, r->f, n, e);
}

/* attention as a replay's declared numerics ask (the flash attention of
 * llama.cpp's CPU backend, which the cpu tier mirrors): q rounded to the K
 * cache type (attn_q_kv with kv_f16), the scores in f64 from those values,
 * an online softmax over the positions in order (on a new maximum the
 * accumulator and the sum are rescaled by exp(Mold - M), else the weight is
 * exp(s - M)), the V accumulator rounded after every update as attn_acc
 * says (f16, f32 or not at all), then times 1/S. */
static void attention_emul(tg_session *s, int layer, double *out, const double *q, const double *kc,
                           const double *vc, int pos, const tg_replay_num *nm)
{
    ref_state *r = s->tier;
    const tg_hparams *hp = &s->m->hp;
    const int d = hp->head_dim, KV = hp->n_head_kv * d, group = hp->n_head / hp->n_head_kv;
    const double scale = 1.0 / sqrt((double)d);
    const int qbits = nm->attn_q_kv ? (nm->kv_f16 ? 16 : 32) : 0;
    double *acc = r->acc1, *qr = r->qr;
    for (int h = 0; h < hp->n_head; h++) {
        const double *qh = q + (size_t)h * d;
        const int g = h / group;
        for (int i = 0; i < d; i++) {
            qr[i] = acc_round(qh[i], qbits);
            acc[i] = 0.0;
        }
        double M = -INFINITY, S = 0.0;
        for (int j = 0; j <= pos; j++) {
            const double *kj = kc + (size_t)j * KV + (size_t)g * d, *vj = vc + (size_t)j * KV + (size_t)g * d;
            double dot = 0.0;
            for (int i = 0; i < d; i++)
                dot += qr[i] * kj[i];
            double sj = dot * scale;
            if (s->replay || s->o.pert_kind)
                sj = tg_hook_score(s, layer, pos, h, j, sj);
            double ms = 1.0, vs = 1.0;
            if (sj > M) {
                const double Mold = M;
                M = sj;
                ms = exp(Mold - M);
                for (int i = 0; i < d; i++)
                    acc[i] = acc_round(acc[i] * ms, nm->attn_acc);
            } else {
                vs = exp(sj - M);
            }
            for (int i = 0; i < d; i++)
                acc[i] = acc_round(vj[i] * vs + acc[i], nm->attn_acc);
            S = S * ms + vs;
        }
        double *oh = out + (size_t)h * d;
        for (int i = 0; i < d; i++)
            oh[i] = rnd(s, acc[i] / S);
    }
    tg_ops_count(&s->ops, TG_OP_ATTN, 0, TG_TIER_REF);
}

/* attention of one token at position pos of a layer whose cache holds
 * positions 0..pos: out (n_head*head_dim) = softmax(q.k / sqrt(d)) v. */
static void attention(tg_session *s, int layer, double *out, const double *q, const double *kc, const double *vc,
                      int pos)
{
    ref_state *r = s->tier;
    const tg_hparams *hp = &s->m->hp;
    const int d = hp->head_dim, KV = hp->n_head_kv * d, group = hp->n_head / hp->n_head_kv;
    const double scale = 1.0 / sqrt((double)d);
    const tg_replay_num *nm = num(s);
    if (nm && (nm->attn_q_kv || nm->attn_acc)) {
        attention_emul(s, layer, out, q, kc, vc, pos, nm);
        return;
    }
    for (int h = 0; h < hp->n_head; h++) {
        const double *qh = q + (size_t)h * d;
        const int g = h / group;
        double mx = -INFINITY;
        for (int j = 0; j <= pos; j++) {
            const double *kj = kc + (size_t)j * KV + (size_t)g * d;
            double dot = 0.0;
            for (int i = 0; i < d; i++)
                dot += qh[i] * kj[i];
            r->sc[j] = dot * scale;
            if (s->replay || s->o.pert_kind)
                r->sc[j] = tg_hook_score(s, layer, pos, h, j, r->sc[j]);
            if (r->sc[j] > mx)
                mx = r->sc[j];
        }
        double sum = 0.0;
        for (int j = 0; j <= pos; j++) {
            r->sc[j] = exp(r->sc[j] - mx);
            sum += r->sc[j];
        }
        double *oh = out + (size_t)h * d;
        for (int i = 0; i < d; i++)
            oh[i] = 0.0;
        for (int j = 0; j <= pos; j++) {
            const double *vj = vc + (size_t)j * KV + (size_t)g * d;
            double a = r->sc[j] / sum;
            for (int i = 0; i < d; i++)
                oh[i] += a * vj[i];
        }
        for (int i = 0; i < d; i++)
            oh[i] = rnd(s, oh[i]);
    }
    tg_ops_count(&s->ops, TG_OP_ATTN, 0, TG_TIER_REF);
}

/* --- the forward pass ------------------------------------------------------- */

/* Tokens [0, n) (1 <= n <= REF_NB) at positions pos .. pos+n-1. all: NULL,
 * or (n, n_vocab) for the logits of every token; last: the last token's
 * logits into s->logits; want: dumps of the last token. Returns 0, or -1
 * with e (a failing dump callback). */
static int ref_batch(tg_session *s, const int32_t *tokens, int n, int pos, float *all, int last, int want,
                     tg_err *e)
{
    ref_state *r = s->tier;
    const tg_model *m = s->m;
    const tg_hparams *hp = &m->hp;
    const int E = hp->n_embd, d = hp->head_dim, Q = hp->n_head * d, KV = hp->n_head_kv * d, F = hp->n_ff;
    const int V = hp->n_vocab, z = n - 1;   /* z: the last token, whose stages are dumped */
    double *x = r->x, *h = r->h, *q = r->q, *k = r->k, *v = r->v, *att = r->att, *o = r->o, *g = r->g,
           *u = r->u;

    // token embedding
    const tg_type_traits *etr = tg_traits(m->token_embd.type);
    for (int t = 0; t < n; t++) {
        etr->to_float((const char *)m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_size, r->emb, E);
        for (int i = 0; i < E; i++)
            x[(size_t)t * E + i] = r->emb[i];
        tg_ops_count(&s->ops, TG_OP_EMBED, m->token_embd.type, TG_TIER_REF);
    }
    tg_hook_f64(s, 0, TG_RS_EMBD, pos, n, x, E, 0, E);

    for (int il = 0; il < hp->n_layer; il++) {
        const tg_layer *L = &m->layers[il];
        double *kc = r->kc + ((size_t)il * s->o.n_ctx) * KV;
        double *vc = r->vc + ((size_t)il * s->o.n_ctx) * KV;

        // attention rmsnorm
        for (int t = 0; t < n; t++) {
            rmsnorm(s, h + (size_t)t * E, x + (size_t)t * E, &L->attn_norm, E);
        }
        tg_hook_f64(s, il, TG_RS_ATTN_NORM, pos, n, h, E, 0, E);
        if (dump(s, want, il, TG_STAGE_ATTN_NORM, h + (size_t)z * E, E, e))
            return -1;

        // q, k, v projections
        matmul(s, q, &L->wq, h, n);
        matmul(s, k, &L->wk, h, n);
        matmul(s, v, &L->wv, h, n);
        tg_hook_f64(s, il, TG_RS_Q_PROJ, pos, n, q, Q, 0, Q);
        tg_hook_f64(s, il, TG_RS_K_PROJ, pos, n, k, KV, 0, KV);
        tg_hook_f64(s, il, TG_RS_V_PROJ, pos, n, v, KV, 0, KV);

        // per-head q/k rmsnorm (qwen3)
        for (int t = 0; t < n && hp->qk_norm; t++) {
            double *qt = q + (size_t)t * Q, *kt = k + (size_t)t * KV;
            for (int hh = 0; hh < hp->n_head; hh++)
                rmsnorm(s, qt + (size_t)hh * d, qt + (size_t)hh * d, &L->q_norm, d);
            for (int hh = 0; hh < hp->n_head_kv; hh++)
                rmsnorm(s, kt + (size_t)hh * d, kt + (size_t)hh * d, &L->k_norm, d);
        }
        if (hp->qk_norm) {
            tg_hook_f64(s, il, TG_RS_Q_NORM, pos, n, q, Q, 0, Q);
            tg_hook_f64(s, il, TG_RS_K_NORM, pos, n, k, KV, 0, KV);
        }
        for (int t = 0; t < n; t++) {
            double *qt = q + (size_t)t * Q, *kt = k + (size_t)t * KV;
            // rope
            rope(s, qt, hp->n_head, pos + t);
            rope(s, kt, hp->n_head_kv, pos + t);
        }
        tg_hook_f64(s, il, TG_RS_Q_ROPE, pos, n, q, Q, 0, Q);
        tg_hook_f64(s, il, TG_RS_K_ROPE, pos, n, k, KV, 0, KV);
        if (dump(s, want, il, TG_STAGE_Q, q + (size_t)z * Q, Q, e) ||
            dump(s, want, il, TG_STAGE_K, k + (size_t)z * KV, KV, e) ||
            dump(s, want, il, TG_STAGE_V, v + (size_t)z * KV, KV, e))
            return -1;

        // append every token's k, v to the cache
        memcpy(kc + (size_t)pos * KV, k, (size_t)n * KV * sizeof(double));
        memcpy(vc + (size_t)pos * KV, v, (size_t)n * KV * sizeof(double));
        for (int t = 0; t < n; t++)
            tg_ops_count(&s->ops, TG_OP_KV_STORE, 0, TG_TIER_REF);
        if (s->replay) {
            if (num(s)->kv_f16)   // a replay's declared numerics: an F16 cache
                for (size_t i = 0; i < (size_t)n * KV; i++) {
                    kc[(size_t)pos * KV + i] = acc_round(kc[(size_t)pos * KV + i], 16);
                    vc[(size_t)pos * KV + i] = acc_round(vc[(size_t)pos * KV + i], 16);
                }
            tg_hook_f64(s, il, TG_RS_K_CACHE, pos, n, kc + (size_t)pos * KV, KV, 0, KV);
            tg_hook_f64(s, il, TG_RS_V_CACHE, pos, n, vc + (size_t)pos * KV, KV, 0, KV);
        }

        // attention: softmax(q.k / sqrt(d)) v over positions 0..pos+t
        for (int t = 0; t < n; t++)
            attention(s, il, att + (size_t)t * Q, q + (size_t)t * Q, kc, vc, pos + t);
        tg_hook_f64(s, il, TG_RS_ATTN, pos, n, att, Q, 0, Q);

        // output projection
        matmul(s, o, &L->wo, att, n);
        for (int t = 0; t < n; t++)
        tg_hook_f64(s, il, TG_RS_ATTN_OUT, pos, n, o, E, 0, E);
        if (dump(s, want, il, TG_STAGE_ATTN_OUT, o + (size_t)z * E, E, e))
            return -1;

        for (int t = 0; t < n; t++) {
            double *xt = x + (size_t)t * E, *ot = o + (size_t)t * E;
            // residual
            for (int i = 0; i < E; i++)
                xt[i] = rnd(s, xt[i] + ot[i]);
            tg_ops_count(&s->ops, TG_OP_ADD, 0, TG_TIER_REF);
        }
        tg_hook_f64(s, il, TG_RS_ATTN_RES, pos, n, x, E, 0, E);
        for (int t = 0; t < n; t++) {
            // ffn rmsnorm
            rmsnorm(s, h + (size_t)t * E, x + (size_t)t * E, &L->ffn_norm, E);
        }
        tg_hook_f64(s, il, TG_RS_FFN_NORM, pos, n, h, E, 0, E);
        if (dump(s, want, il, TG_STAGE_FFN_NORM, h + (size_t)z * E, E, e))
            return -1;

        // swiglu: silu(Wgate h) * (Wup h), silu(x) = x / (1 + exp(-x))
        matmul(s, g, &L->gate, h, n);
        matmul(s, u, &L->up, h, n);
        tg_hook_f64(s, il, TG_RS_GATE, pos, n, g, F, 0, F);
        tg_hook_f64(s, il, TG_RS_UP, pos, n, u, F, 0, F);
        for (int t = 0; t < n; t++) {
            double *gt = g + (size_t)t * F, *ut = u + (size_t)t * F;
            for (int i = 0; i < F; i++)
                gt[i] = rnd(s, gt[i] / (1.0 + exp(-gt[i])) * ut[i]);
            tg_ops_count(&s->ops, TG_OP_SWIGLU, 0, TG_TIER_REF);
        }
        tg_hook_f64(s, il, TG_RS_SWIGLU, pos, n, g, F, 0, F);

        // down projection
        matmul(s, o, &L->down, g, n);
        for (int t = 0; t < n; t++)
        tg_hook_f64(s, il, TG_RS_FFN_OUT, pos, n, o, E, 0, E);
        if (dump(s, want, il, TG_STAGE_FFN_OUT, o + (size_t)z * E, E, e))
            return -1;

        // residual
        for (int t = 0; t < n; t++) {
            double *xt = x + (size_t)t * E, *ot = o + (size_t)t * E;
            for (int i = 0; i < E; i++)
                xt[i] = rnd(s, xt[i] + ot[i]);
            tg_ops_count(&s->ops, TG_OP_ADD, 0, TG_TIER_REF);
        }
        tg_hook_f64(s, il, TG_RS_RESIDUAL, pos, n, x, E, 0, E);
        if (dump(s, want, il, TG_STAGE_RESIDUAL, x + (size_t)z * E, E, e))
            return -1;
    }

    if (!all && !last)
        return 0;

    // output rmsnorm and projection: every token (all), else the last one
    const int t0 = all ? 0 : z, nt = n - t0;
    for (int t = t0; t < n; t++)
        rmsnorm(s, h + (size_t)t * E, x + (size_t)t * E, &m->output_norm, E);
    tg_hook_f64(s, -1, TG_RS_OUT_NORM, pos + t0, nt, h + (size_t)t0 * E, E, 0, E);
    matmul(s, r->lg, &m->output, h + (size_t)t0 * E, nt);
    tg_hook_f64(s, -1, TG_RS_LOGITS, pos + t0, nt, r->lg, V, 0, V);
    if (all)
        for (size_t i = 0; i < (size_t)n * V; i++)
            all[i] = (float)r->lg[i];
    if (last)
        for (int i = 0; i < V; i++)
            s->logits[i] = (float)r->lg[(size_t)(nt - 1) * V + i];
    if (want && s->dump_fn && tg_dump(s, -1, TG_STAGE_LOGITS, s->logits, V, e))
        return -1;
    return 0;
}

/* tokens in batches of REF_NB; logits: NULL or (n, n_vocab) for every token. */
static int ref_run(tg_session *s, const int32_t *tokens, int n, int want_dump, float *logits, tg_err *e)
{
    const size_t V = (size_t)s->m->hp.n_vocab;
    for (int i = 0; i < n; i += REF_NB) {
        int nb = n - i < REF_NB ? n - i : REF_NB;
        int last = i + nb == n;
        if (ref_batch(s, tokens + i, nb, s->pos + i, logits ? logits + (size_t)i * V : NULL, last,
                      want_dump && last, e) != 0)
            return -1;
    }
    return 0;
}

/* The table's eval: every batch computes its last token's logits. */
static int ref_eval(tg_session *s, const int32_t *tokens, int n, unsigned flags, tg_err *e)
{
    return ref_run(s, tokens, n, (flags & TG_EVAL_DUMP) != 0, NULL, e);
}

static int ref_eval_all(tg_session *s, const int32_t *tokens, int n, unsigned flags, float *logits, tg_err *e)
{
    return ref_run(s, tokens, n, (flags & TG_EVAL_DUMP) != 0, logits, e);
}

/* The ref tier's declared numerics (tier.h, numerics): the exact arbiter. */
static void ref_numerics(const tg_opts *o, char *buf, size_t n)
{
    (void)o;
    snprintf(buf, n, "{\"exact\":true,\"act\":\"f32\",\"kv\":\"f32\",\"attn_q\":\"f32\",\"attn_acc\":\"f64\","
                     "\"rope\":\"f64\",\"accum\":\"f64\",\"silu\":\"f64\"}");
}

const tg_tier_i tg_tier_ref = {
    .id = TG_TIER_REF,
    .name = "ref",
    .n_batch_default = 64,
    .describe = ref_describe,
    .init = ref_init,
    .free = ref_fini,
    .eval = ref_eval,
    .eval_all = ref_eval_all,
    .numerics = ref_numerics,
};
