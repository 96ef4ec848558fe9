/*
 * bench_gpu.c: decode and prefill speed of the gpu tier (a session of
 * engine/model.h), with the memory-bandwidth roofline. A benchmark, not a test: it never fails on a
 * slow figure (scripts/gpu-bench.sh runs it beside llama.cpp CUDA).
 *
 * Usage: bench_gpu MODEL.gguf | --synthetic 8b|0.6b  [--prefill N] [--decode N] [--no-graph]
 *
 * --synthetic builds the Qwen3 shape in memory with the Q4_K_M type mix of
 * docs/formats.md (attn_v / ffn_down Q6_K on the recipe's layers, output Q6_K,
 * the rest Q4_K) and random blocks with small finite scales: the bytes a
 * step reads are a real file's, the tokens are meaningless. Prints
 *   prefill_tok_s=  decode_tok_s=  weight_bytes=  copy_bw_GBs=
 *   roofline_tok_s= (copy bandwidth / weight bytes)  roofline_fraction=
 *   decode_digest= the decode steps' logits digests chained (FNV-1a): two
 *   runs with bit-identical kernels print the same, so a switch that should
 *   not change the numerics can be checked in the same call it is timed
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "model.h"

static uint64_t rs = 0x1234567ULL;
static uint64_t xs(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

/* A synthetic weight: rows x cols of type, random blocks, scales fixed. */
static int synth(tg_weight *w, uint32_t type, int64_t cols, int64_t rows, const char *name)
{
    w->type = type;
    w->cols = cols;
    w->rows = rows;
    w->row_size = tg_row_size(type, cols);
    w->name = name;
    const size_t n = w->row_size * rows;
    uint8_t *p = malloc(n + 8);
    if (!p) return -1;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = xs();
        memcpy(p + i, &v, 8);
    }
    const tg_half d = tg_f32_to_half(type == TG_TYPE_F32 ? 0 : 0.0005f);
    if (type == TG_TYPE_Q4_K) {
        for (size_t b = 0; b < n; b += sizeof(block_q4_K)) {
            memcpy(p + b, &d, 2);
            memcpy(p + b + 2, &d, 2);
        }
    } else if (type == TG_TYPE_Q6_K) {
        for (size_t b = 0; b < n; b += sizeof(block_q6_K)) memcpy(p + b + 208, &d, 2);
    } else if (type == TG_TYPE_F32) {
        for (size_t i = 0; i < (size_t)cols * rows; i++) ((float *)p)[i] = 1.0f;
    }
    w->data = p;
    return 0;
}

static tg_model *synthetic(const char *shape)
{
    tg_model *m = calloc(1, sizeof *m);
    tg_hparams *hp = &m->hp;
    hp->arch = TG_ARCH_QWEN3;
    strcpy(hp->arch_name, "qwen3");
    hp->n_vocab = 151936;
    hp->n_ctx_train = 40960;
    if (!strcmp(shape, "8b")) {
        hp->n_embd = 4096; hp->n_layer = 36; hp->n_head = 32; hp->n_head_kv = 8; hp->n_ff = 12288;
    } else {
        hp->n_embd = 1024; hp->n_layer = 28; hp->n_head = 16; hp->n_head_kv = 8; hp->n_ff = 3072;
    }
    hp->head_dim = 128;
    hp->rope_base = 1e6f;
    hp->eps = 1e-6f;
    hp->file_type = 15;
    hp->qk_norm = 1;
    hp->rope_neox = 1;
    const int E = hp->n_embd, QD = hp->n_head * hp->head_dim, KVD = hp->n_head_kv * hp->head_dim, n = hp->n_layer;
    synth(&m->token_embd, TG_TYPE_Q4_K, E, hp->n_vocab, "token_embd.weight");
    synth(&m->output_norm, TG_TYPE_F32, E, 1, "output_norm.weight");
    synth(&m->output, TG_TYPE_Q6_K, E, hp->n_vocab, "output.weight");
    m->layers = calloc(n, sizeof *m->layers);
    for (int i = 0; i < n; i++) {
        tg_layer *L = &m->layers[i];
        const int q6 = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        synth(&L->attn_norm, TG_TYPE_F32, E, 1, "attn_norm");
        synth(&L->ffn_norm, TG_TYPE_F32, E, 1, "ffn_norm");
        synth(&L->q_norm, TG_TYPE_F32, hp->head_dim, 1, "q_norm");
        synth(&L->k_norm, TG_TYPE_F32, hp->head_dim, 1, "k_norm");
        synth(&L->wq, TG_TYPE_Q4_K, E, QD, "attn_q");
        synth(&L->wk, TG_TYPE_Q4_K, E, KVD, "attn_k");
        synth(&L->wv, q6 ? TG_TYPE_Q6_K : TG_TYPE_Q4_K, E, KVD, "attn_v");
        synth(&L->wo, TG_TYPE_Q4_K, QD, E, "attn_output");
        synth(&L->gate, TG_TYPE_Q4_K, E, hp->n_ff, "ffn_gate");
        synth(&L->up, TG_TYPE_Q4_K, E, hp->n_ff, "ffn_up");
        synth(&L->down, q6 ? TG_TYPE_Q6_K : TG_TYPE_Q4_K, hp->n_ff, E, "ffn_down");
    }
    return m;
}

/* One eval and the device's top-32 and digest, as a protocol step takes
 * them. Returns 0 or -1 with e. */
static int step(tg_session *g, const int32_t *ids, int n, tg_top *top, char dig[17], tg_err *e)
{
    if (tg_session_eval(g, ids, n, e) != 0)
        return -1;
    return tg_session_top(g, 32, top, dig, e) < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *shape = NULL;
    int n_prefill = 512, n_decode = 128, no_graph = getenv("TG_GPU_NO_GRAPH") != NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--synthetic") && i + 1 < argc) shape = argv[++i];
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) n_prefill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) n_decode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-graph")) no_graph = 1;
        else model = argv[i];
    }
    if ((!model && !shape) || n_prefill < 1 || n_decode < 1) {
        fprintf(stderr, "usage: bench_gpu MODEL.gguf | --synthetic 8b|0.6b [--prefill N] [--decode N] [--no-graph]\n");
        return 2;
    }
    char desc[160];
    tg_err e = {{0}};
    if (tg_gpu_probe(0, desc, sizeof desc, &e)) {
        printf("SKIP: no GPU (%s)\n", e.msg);
        return 0;
    }
    tg_model *m = NULL;
    double t0 = tg_now();
    if (shape) m = synthetic(shape);
    else if (tg_model_load(&m, model, &e)) { fprintf(stderr, "bench_gpu: %s\n", e.msg); return 2; }
    const tg_hparams *hp = &m->hp;
    tg_opts o = tg_opts_default();
    o.tier = TG_TIER_GPU;
    o.n_ctx = (n_prefill > 8 ? n_prefill : 8) + (n_decode > 4 ? n_decode : 4) + 8;
    o.n_batch = 512;
    o.no_graph = no_graph;
    tg_session *g = NULL;
    if (tg_session_new(&g, m, &o, &e)) { fprintf(stderr, "bench_gpu: %s\n", e.msg); return 2; }
    tg_session_set_top(g, 32);
    printf("bench_gpu: %s, %s: %d layers, n_embd %d, load %.1f s, %s\n", shape ? "synthetic" : model,
           shape ? shape : "", hp->n_layer, hp->n_embd, tg_now() - t0, tg_session_device(g));
    const int n_toks = n_prefill > 8 ? n_prefill : 8;   /* the warm-up prefills 8 */
    int32_t *toks = malloc(sizeof(int32_t) * n_toks);
    for (int i = 0; i < n_toks; i++) toks[i] = (int32_t)(xs() % (uint64_t)hp->n_vocab);
    tg_top top[32];
    char dig[17];
    /* warm-up: a short prefill and a few decode steps (graph capture) */
    if (step(g, toks, 8, top, dig, &e)) goto fail;
    for (int i = 0; i < 4; i++)
        if (step(g, &top[0].id, 1, top, dig, &e)) goto fail;
    tg_session_reset(g);
    double tp = tg_now();
    if (step(g, toks, n_prefill, top, dig, &e)) goto fail;
    tp = tg_now() - tp;
    double td = tg_now();
    uint64_t chain = 1469598103934665603ULL;   /* FNV-1a over the decode steps' logits digests */
    for (int i = 0; i < n_decode; i++) {
        if (step(g, &top[0].id, 1, top, dig, &e)) goto fail;
        for (const char *c = dig; *c; c++) chain = (chain ^ (uint8_t)*c) * 1099511628211ULL;
    }
    td = tg_now() - td;
    tg_gpu_profile_report(g, stdout);
    double bw = 0;
    if (tg_gpu_bandwidth(0, &bw, &e)) goto fail;
    const double wb = (double)tg_gpu_weight_bytes(g);
    /* a decode step reads every weight once: roofline = memory bandwidth
     * (the copy's bytes read plus written per second) / weight bytes */
    const double roof = bw / wb;
    printf("prefill_tokens=%d prefill_s=%.4f prefill_tok_s=%.1f\n", n_prefill, tp, n_prefill / tp);
    printf("decode_tokens=%d decode_s=%.4f decode_tok_s=%.1f\n", n_decode, td, n_decode / td);
    printf("decode_digest=%016llx\n", (unsigned long long)chain);
    printf("weight_bytes=%.0f copy_bw_GBs=%.1f roofline_tok_s=%.1f roofline_fraction=%.3f\n", wb, bw / 1e9, roof,
           (n_decode / td) / roof);
    tg_session_free(g);
    return 0;
fail:
    fprintf(stderr, "bench_gpu: %s\n", e.msg);
    return 1;
}
