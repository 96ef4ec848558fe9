/*
 * gpu.cu: the gpu tier, tg_tier_gpu (engine/tier.h's table, at the end of
 * the file), and the extras of gpu.h. Weights are copied once into one
 * device arena; a step runs the Qwen3 forward pass (docs/formats.md) with the
 * kernels of kernels.cu, then selects the top-k and digests the logits on
 * the device (when the session asked for a selection, tg_session_set_top),
 * and brings only those back; the logits stay on the device until the
 * session asks for them. Single-token steps are captured once into a CUDA
 * graph and replayed: the token and position live in a small pinned
 * parameter block that the graph's first node copies to the device, so the
 * same graph serves every step.
 *
 * The session (engine/session.c) owns the position, the batching, the op
 * counters and the dump hook; this file owns the device state (tg_gpu,
 * s->tier). Linking this object into a program registers the tier.
 */
#include "gpu.h"
#include "kernels.cuh"

/* hipcc's device pass does not see the table at the end of the file (host
 * code only), so the table's functions are unused there. */
#if defined(__HIP_DEVICE_COMPILE__)
#pragma clang diagnostic ignored "-Wunused-function"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A weight on the device: rows of cols values of type. */
struct dweight {
    const void *d;     /* into the arena */
    uint32_t type;
    int cols, rows;
};

struct dlayer {
    dweight attn_norm, wq, wk, wv, q_norm, k_norm, wo, ffn_norm, gate, up, down;
};

#define CHAIN_CAP 1024   /* flag-chain counters: a step's fused launches, 7 a layer and 2 */

/* Pinned host block the graph copies to the device before each step. */
struct step_params {
    int32_t pos0;
    int32_t tokens[1];   /* n_batch entries follow */
};

/* The tier's state of one session (s->tier). */
struct tg_gpu {
    tg_session *s;               /* the session this state belongs to */
    tg_hparams hp;
    int kv_f32, n_ctx, n_batch;  /* the session's resolved options */
    int no_graph;                /* the option, or forced by TG_GPU_PROFILE */
    char device[512];            /* the description (describe); the kernel settings make it long */
    int drop;                    /* TG_GPU_TIMING_DROP: launch classes left out of fused steps (DROP_*) */
    int want_dump;               /* the eval in progress dumps its last token */
    int sel_k;                   /* top entries the last eval selected on the device; 0: none */

    cudaStream_t stream;
    cudaStream_t side;           /* the digest runs here beside the top-k */
    cudaEvent_t ev_fork, ev_join;
    void *arena;                 /* every weight, one allocation */
    size_t weight_bytes;         /* its size */
    dweight token_embd, output_norm, output;
    dlayer *layers;              /* n_layer, host array of device views */

    void *kc, *vc;               /* (n_layer, n_ctx, n_head_kv*head_dim) f16 or f32 */
    size_t kv_layer_elems;       /* n_ctx * n_head_kv * head_dim */
    float *x;                    /* (n_batch, n_embd) residual stream */
    float *h;                    /* (n_batch, n_embd) normed */
    float *q, *att;              /* (n_batch, n_head*head_dim) */
    float *k, *v;                /* (n_batch, n_head_kv*head_dim) */
    float *tmp;                  /* (n_batch, n_embd) projection outputs */
    float *fg, *fu;              /* (n_batch, n_ff) gate, up */
    void *x16;                   /* (n_batch, widest matmul input) f16: gk_matmul_group's activations */
    void *x16b;                  /* (n_batch, n_ff) f16: gk_matmul_swiglu's output, the down projection's input */
    float *logits;               /* (n_vocab) */
    int32_t *dparams;            /* device copy of step_params */
    step_params *hparams;        /* pinned host */
    void *topk_scratch;
    void *xxh_scratch;
    void *att_scratch;           /* split attention partials of a single-token step */
    unsigned *chain_cnt;         /* CHAIN_CAP counters of gk_chain_begin */
    tg_top *dtop;                /* (TG_GPU_MAX_TOPK) device */
    uint64_t *ddigest;           /* device */
    /* pinned host results: the top-k and the digest */
    tg_top *htop;
    uint64_t *hdigest;

    /* the single-token step graph, for graph_k top entries */
    cudaGraph_t graph;
    cudaGraphExec_t graph_exec;
    int graph_k;
    int graph_ready;
    tg_ops graph_ops;            /* ops one replay runs */
    float *dump_buf;             /* host, max(n_vocab, widest activation) */
    /* the hooked path (replay, perturbations): host rows and device scores,
     * grown on first use */
    float *hook_buf;
    size_t hook_cap;             /* bytes */
    float *dscores;
    size_t dscores_cap;          /* bytes */
    /* the fused single-token path (kernels.cu): on when every mat-vec weight
     * and shape suits it, unless TG_GPU_FUSED=0 */
    int fused;
    gk_q8 q8n, q8a, q8f;         /* quantized norm output, attention output, SwiGLU output */
    void *q8_mem;                /* their one allocation */
    /* TG_GPU_PROFILE: an event after each fused launch, totals per label */
    int prof;
    cudaEvent_t pev[512];
    const char *plab[512];
    int pn, psteps;
    const char *pname[48];
    double pus[48];
    int pcnt[48], npk;
};

/* The gpu tier's session from gpu.h's extras, which accept only it. */
static tg_gpu *gpu_of(const tg_session *s)
{
    return s && s->t && s->t->id == TG_TIER_GPU ? (tg_gpu *)s->tier : NULL;
}

extern "C" int tg_gpu_probe(int device, char *desc, size_t n, tg_err *e)
{
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess)
        return tg_errf(e, "no GPU: the runtime reports %s", cudaGetErrorString(rc));
    if (count <= device)
        return tg_errf(e, "no GPU: %d device(s), asked for device %d", count, device);
    cudaDeviceProp p;
    GPU_CHECK(e, cudaGetDeviceProperties(&p, device));
#ifdef TG_GPU_HIP
    snprintf(desc, n, "%.80s, %.40s, %.0f GiB", p.name, p.gcnArchName, p.totalGlobalMem / 1073741824.0);
#else
    snprintf(desc, n, "%.80s, sm_%d%d, %.0f GiB", p.name, p.major, p.minor, p.totalGlobalMem / 1073741824.0);
#endif
    return 0;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Bytes a weight takes in the arena (norm vectors become f32). */
static size_t weight_bytes(const tg_weight *w, int as_f32)
{
    if (as_f32) return align256((size_t)w->cols * w->rows * sizeof(float));
    return align256(w->row_size * (size_t)w->rows);
}

/* Copies w into the arena at *off (converting to f32 when as_f32); fills dw.
 * A matmul weight whose type the kernels do not serve is refused here. */
static int upload(tg_gpu *g, const tg_weight *w, int as_f32, int is_matmul, size_t *off, dweight *dw,
                  tg_err *e)
{
    dw->cols = (int)w->cols;
    dw->rows = (int)w->rows;
    uint8_t *dst = (uint8_t *)g->arena + *off;
    dw->d = dst;
    if (as_f32) {
        const tg_type_traits *t = tg_traits(w->type);
        if (!t || !t->to_float)
            return tg_errf(e, "%s: type %s cannot be converted to f32 for the GPU", w->name, tg_type_name(w->type));
        const size_t n = (size_t)w->cols * w->rows;
        float *tmp = (float *)malloc(n * sizeof(float));
        if (!tmp) return tg_errf(e, "%s: out of host memory converting to f32", w->name);
        t->to_float(w->data, tmp, (int64_t)n);
        cudaError_t rc = cudaMemcpy(dst, tmp, n * sizeof(float), cudaMemcpyHostToDevice);
        free(tmp);
        if (rc != cudaSuccess)
            return tg_errf(e, "%s: cudaMemcpy to the device failed: %s (in %s, %s:%d)", w->name,
                           cudaGetErrorString(rc), __func__, __FILE__, __LINE__);
        dw->type = TG_TYPE_F32;
    } else {
        if (is_matmul && !gk_type_supported(w->type))
            return tg_errf(e, "%s: weight type %s is not served by the GPU kernels (expected f32, f16, bf16, "
                           "q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K or q6_K)", w->name,
                           tg_type_name(w->type));
        GPU_CHECK(e, cudaMemcpy(dst, w->data, w->row_size * (size_t)w->rows, cudaMemcpyHostToDevice));
        dw->type = w->type;
    }
    *off += weight_bytes(w, as_f32);
    return 0;
}

template <typename T>
static int dalloc(T **p, size_t bytes, tg_err *e)
{
    GPU_CHECK(e, cudaMalloc((void **)p, bytes));
    return 0;
}

static int widest(const tg_hparams *hp)
{
    int w = hp->n_embd;
    if (hp->n_head * hp->head_dim > w) w = hp->n_head * hp->head_dim;
    if (hp->n_ff > w) w = hp->n_ff;
    if (hp->n_vocab > w) w = hp->n_vocab;
    return w;
}

/* The widest prompt row g->x16 holds: n_embd (the norms' outputs) or
 * n_head*head_dim (the output projection's input); the n_ff-wide input of
 * the down projection is g->x16b. */
static int mm_widest(const tg_hparams *hp)
{
    return hp->n_head * hp->head_dim > hp->n_embd ? hp->n_head * hp->head_dim : hp->n_embd;
}

/* Whether the fused single-token path serves this model: every mat-vec
 * weight of a type it serves, with whole blocks along its input, gate and up
 * of one type, and the widths multiples of 32. TG_GPU_FUSED=0 turns it off. */
static int fused_suits(const tg_gpu *g)
{
    const char *env = getenv("TG_GPU_FUSED");
    if (env && env[0] == '0') return 0;
    const tg_hparams *hp = &g->hp;
    const int E = hp->n_embd, QD = hp->n_head * hp->head_dim, FF = hp->n_ff;
    if (E % 32 || QD % 32 || FF % 32 || hp->head_dim % 32 || hp->head_dim > 512) return 0;
    struct { const dweight *w; int K; } ws[8];
    auto ok = [](const dweight *w, int K) {
        return gk_fused_type_supported(w->type) && K % (w->type == TG_TYPE_Q8_0 ? 32 : 256) == 0;
    };
    if (!ok(&g->output, E)) return 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const dlayer *L = &g->layers[l];
        ws[0] = {&L->wq, E}; ws[1] = {&L->wk, E}; ws[2] = {&L->wv, E}; ws[3] = {&L->wo, QD};
        ws[4] = {&L->gate, E}; ws[5] = {&L->up, E}; ws[6] = {&L->down, FF};
        for (int i = 0; i < 7; i++)
            if (!ok(ws[i].w, ws[i].K)) return 0;
        if (L->gate.type != L->up.type) return 0;
    }
    return 1;
}

static void gpu_state_free(tg_gpu *g);

/* TG_GPU_TIMING_DROP: a comma-separated list of the fused step's launch
 * classes to leave out, so that a benchmark run times the step without them
 * (each class's share of a graph-replayed step, which per-launch events
 * cannot give). The logits are then wrong: the session's description
 * (every report's record of the arm's device) says so. Single-token steps
 * on the plain path are not affected. */
enum { DROP_NORM = 1, DROP_QKV = 2, DROP_ATTN = 4, DROP_WO = 8, DROP_FFN = 16, DROP_DOWN = 32, DROP_OUT = 64 };
static const char *const drop_names[] = {"norm", "qkv", "attn", "wo", "ffn", "down", "out"};

static int parse_drop(const char *v, int *mask, tg_err *e)
{
    *mask = 0;
    if (!v || !*v) return 0;
    const char *p = v;
    for (;;) {
        const size_t n = strcspn(p, ",");
        int found = 0;
        for (int i = 0; i < (int)(sizeof drop_names / sizeof drop_names[0]); i++)
            if (strlen(drop_names[i]) == n && !strncmp(p, drop_names[i], n)) {
                *mask |= 1 << i;
                found = 1;
            }
        if (!found)
            return tg_errf(e, "TG_GPU_TIMING_DROP=%s: '%.*s': expected a comma-separated list of norm, qkv, attn, "
                           "wo, ffn, down, out", v, (int)n, p);
        if (!p[n]) return 0;
        p += n + 1;
    }
}

/* The table's init: uploads s->m's weights and allocates the cache and
 * buffers on device s->o.device (the device holds its own copy of the
 * weights). Returns 0 with s->tier set, or -1 with e (no device, an option
 * this tier does not serve, a weight type the GPU kernels do not serve,
 * out of device memory; each names the tensor or call). */
static int gpu_init(tg_session *ss, tg_err *e)
{
    const tg_model *m = ss->m;
    if (ss->o.f64)
        return tg_errf(e, "option f64 is for the ref tier only");
    char desc[128];
    const int dev = ss->o.device;
    if (tg_gpu_probe(dev, desc, sizeof desc, e)) return -1;
    tg_gpu *g = (tg_gpu *)calloc(1, sizeof *g);
    if (!g) return tg_errf(e, "out of host memory");
    g->s = ss;
    g->hp = m->hp;
    g->kv_f32 = ss->o.kv_f32;
    g->n_ctx = ss->o.n_ctx;
    g->n_batch = ss->o.n_batch;
    g->no_graph = ss->o.no_graph;
    const tg_hparams *hp = &g->hp;
    snprintf(g->device, sizeof g->device, "%s, %s KV, %s", desc, g->kv_f32 ? "f32" : "f16",
             g->no_graph ? "no graphs" : "graphs");
    if (parse_drop(getenv("TG_GPU_TIMING_DROP"), &g->drop, e)) {
        free(g);
        return -1;
    }
    if (g->drop) {
        const size_t len = strlen(g->device);
        snprintf(g->device + len, sizeof g->device - len, ", TIMING DROP %s (logits wrong)",
                 getenv("TG_GPU_TIMING_DROP"));
    }
    const int nb = g->n_batch, n_ctx = g->n_ctx;
    const int qdim = hp->n_head * hp->head_dim, kvdim = hp->n_head_kv * hp->head_dim;
    size_t total = 0;
    int rc = -1;
    if (hp->head_dim > 512 || hp->head_dim % 2 || hp->n_embd % 8 || qdim % 8 || hp->n_ff % 8) {
        tg_errf(e, "model shapes n_embd=%d head_dim=%d n_ff=%d: the GPU kernels need multiples of 8 and "
                "head_dim <= 512", hp->n_embd, hp->head_dim, hp->n_ff);
        goto fail;
    }
    if (cudaSetDevice(dev) != cudaSuccess) { tg_errf(e, "cudaSetDevice(%d) failed", dev); goto fail; }
    if (cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&g->side, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->ev_fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->ev_join, cudaEventDisableTiming) != cudaSuccess) {
        tg_errf(e, "cudaStreamCreateWithFlags failed (in %s, %s:%d)", __func__, __FILE__, __LINE__);
        goto fail;
    }

    /* weights: one arena */
    total += weight_bytes(&m->token_embd, 0) + weight_bytes(&m->output_norm, 1);
    if (m->output.data != m->token_embd.data) total += weight_bytes(&m->output, 0);
    for (int l = 0; l < hp->n_layer; l++) {
        const tg_layer *L = &m->layers[l];
        total += weight_bytes(&L->attn_norm, 1) + weight_bytes(&L->ffn_norm, 1);
        total += weight_bytes(&L->wq, 0) + weight_bytes(&L->wk, 0) + weight_bytes(&L->wv, 0) +
                 weight_bytes(&L->wo, 0) + weight_bytes(&L->gate, 0) + weight_bytes(&L->up, 0) +
                 weight_bytes(&L->down, 0);
        if (hp->qk_norm) total += weight_bytes(&L->q_norm, 1) + weight_bytes(&L->k_norm, 1);
    }
    g->weight_bytes = total;
    if (dalloc(&g->arena, total, e)) { tg_err_prefix(e, "weights (%zu bytes)", total); goto fail; }
    g->layers = (dlayer *)calloc(hp->n_layer, sizeof *g->layers);
    if (!g->layers) { tg_errf(e, "out of host memory"); goto fail; }
    {
        size_t off = 0;
        if (upload(g, &m->token_embd, 0, 1, &off, &g->token_embd, e)) goto fail;
        if (upload(g, &m->output_norm, 1, 0, &off, &g->output_norm, e)) goto fail;
        if (m->output.data == m->token_embd.data) g->output = g->token_embd;
        else if (upload(g, &m->output, 0, 1, &off, &g->output, e)) goto fail;
        for (int l = 0; l < hp->n_layer; l++) {
            const tg_layer *L = &m->layers[l];
            dlayer *D = &g->layers[l];
            if (upload(g, &L->attn_norm, 1, 0, &off, &D->attn_norm, e) ||
                upload(g, &L->wq, 0, 1, &off, &D->wq, e) || upload(g, &L->wk, 0, 1, &off, &D->wk, e) ||
                upload(g, &L->wv, 0, 1, &off, &D->wv, e) || upload(g, &L->wo, 0, 1, &off, &D->wo, e) ||
                upload(g, &L->ffn_norm, 1, 0, &off, &D->ffn_norm, e) ||
                upload(g, &L->gate, 0, 1, &off, &D->gate, e) || upload(g, &L->up, 0, 1, &off, &D->up, e) ||
                upload(g, &L->down, 0, 1, &off, &D->down, e))
                goto fail;
            if (hp->qk_norm && (upload(g, &L->q_norm, 1, 0, &off, &D->q_norm, e) ||
                                upload(g, &L->k_norm, 1, 0, &off, &D->k_norm, e)))
                goto fail;
        }
    }

    /* cache and activations */
    {
        g->kv_layer_elems = (size_t)n_ctx * kvdim;
        const size_t kv_bytes = g->kv_layer_elems * hp->n_layer * (g->kv_f32 ? 4 : 2);
        const size_t topk_bytes = gk_topk_scratch(hp->n_vocab, TG_GPU_MAX_TOPK);
        const size_t xxh_bytes = gk_xxh3_scratch((size_t)hp->n_vocab * 4);
        if (dalloc(&g->kc, kv_bytes, e) || dalloc(&g->vc, kv_bytes, e) ||
            dalloc(&g->x, (size_t)nb * hp->n_embd * 4, e) || dalloc(&g->h, (size_t)nb * hp->n_embd * 4, e) ||
            dalloc(&g->tmp, (size_t)nb * hp->n_embd * 4, e) || dalloc(&g->q, (size_t)nb * qdim * 4, e) ||
            dalloc(&g->att, (size_t)nb * qdim * 4, e) || dalloc(&g->k, (size_t)nb * kvdim * 4, e) ||
            dalloc(&g->v, (size_t)nb * kvdim * 4, e) || dalloc(&g->fg, (size_t)nb * hp->n_ff * 4, e) ||
            dalloc(&g->fu, (size_t)nb * hp->n_ff * 4, e) || dalloc(&g->logits, (size_t)hp->n_vocab * 4, e) ||
            dalloc(&g->x16, (size_t)nb * mm_widest(hp) * 2, e) || dalloc(&g->x16b, (size_t)nb * hp->n_ff * 2, e) ||
            dalloc(&g->dparams, sizeof(int32_t) * (nb + 1), e) ||
            dalloc(&g->topk_scratch, topk_bytes, e) ||
            dalloc(&g->att_scratch, gk_attention_scratch(hp->n_head, hp->head_dim), e) ||
            dalloc(&g->chain_cnt, CHAIN_CAP * sizeof(unsigned), e) ||
            dalloc(&g->xxh_scratch, xxh_bytes, e) ||
            dalloc(&g->dtop, sizeof(tg_top) * TG_GPU_MAX_TOPK, e) || dalloc(&g->ddigest, sizeof(uint64_t), e))
            goto fail;
        /* gk_attn_decode's arrival counters start at zero (it leaves them so) */
        if (cudaMemset(g->att_scratch, 0, gk_attention_scratch(hp->n_head, hp->head_dim)) != cudaSuccess) {
            tg_errf(e, "cudaMemset of the attention scratch failed (in %s, %s:%d)", __func__, __FILE__, __LINE__);
            goto fail;
        }
        if (cudaMallocHost((void **)&g->hparams, sizeof(int32_t) * (nb + 1)) != cudaSuccess ||
            cudaMallocHost((void **)&g->htop, sizeof(tg_top) * TG_GPU_MAX_TOPK) != cudaSuccess ||
            cudaMallocHost((void **)&g->hdigest, sizeof(uint64_t)) != cudaSuccess) {
            tg_errf(e, "cudaMallocHost of the step buffers failed (in %s, %s:%d)", __func__, __FILE__, __LINE__);
            goto fail;
        }
        g->dump_buf = (float *)malloc((size_t)widest(hp) * sizeof(float));
        if (!g->dump_buf) { tg_errf(e, "out of host memory"); goto fail; }
    }
    g->fused = fused_suits(g);
    if (gk_init(e)) goto fail;
    if (g->fused && gk_pdl_on()) {
        const size_t len = strlen(g->device);
        snprintf(g->device + len, sizeof g->device - len, ", PDL");
    }
    {
        const char *pe = getenv("TG_GPU_PROFILE");
        if (pe && pe[0] == '1') {
            g->prof = 1;
            g->no_graph = 1;
            for (int i = 0; i < 512; i++)
                if (cudaEventCreate(&g->pev[i]) != cudaSuccess) { tg_errf(e, "cudaEventCreate failed"); goto fail; }
        }
    }
    if (g->fused) {
        /* three gk_q8 buffers of the widest mat-vec input */
        const size_t w = (size_t)(hp->n_ff > qdim ? (hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd)
                                                  : (qdim > hp->n_embd ? qdim : hp->n_embd));
        const size_t one = align256(w) + 2 * align256(w / 32 * sizeof(float));
        if (dalloc(&g->q8_mem, 3 * one, e)) goto fail;
        gk_q8 *bufs[3] = {&g->q8n, &g->q8a, &g->q8f};
        for (int i = 0; i < 3; i++) {
            uint8_t *b = (uint8_t *)g->q8_mem + i * one;
            bufs[i]->q = (int8_t *)b;
            bufs[i]->d = (float *)(b + align256(w));
            bufs[i]->s = (float *)(b + align256(w) + align256(w / 32 * sizeof(float)));
        }
    }
    {
        char ks[384];
        gk_describe(ks, sizeof ks);
        const size_t len = strlen(g->device);
        snprintf(g->device + len, sizeof g->device - len, ", %s decode, %s", g->fused ? "fused" : "plain", ks);
    }
    ss->tier = g;
    return 0;
fail:
    rc = -1;
    gpu_state_free(g);
    return rc;
}

/* Frees the device state g (NULL is a no-op). */
static void gpu_state_free(tg_gpu *g)
{
    if (!g) return;
    if (g->prof)
        for (int i = 0; i < 512; i++)
            if (g->pev[i]) cudaEventDestroy(g->pev[i]);
    if (g->graph_exec) cudaGraphExecDestroy(g->graph_exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    void *dev[] = {g->arena, g->kc, g->vc, g->x, g->h, g->tmp, g->q, g->att, g->k, g->v, g->fg, g->fu,
                   g->x16, g->x16b, g->logits, g->dparams, g->topk_scratch, g->xxh_scratch, g->att_scratch,
                   g->chain_cnt, g->dtop, g->ddigest, g->q8_mem, g->dscores};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    if (g->hparams) cudaFreeHost(g->hparams);
    if (g->htop) cudaFreeHost(g->htop);
    if (g->hdigest) cudaFreeHost(g->hdigest);
    if (g->stream) cudaStreamDestroy(g->stream);
    if (g->side) cudaStreamDestroy(g->side);
    if (g->ev_fork) cudaEventDestroy(g->ev_fork);
    if (g->ev_join) cudaEventDestroy(g->ev_join);
    free(g->layers);
    free(g->dump_buf);
    free(g->hook_buf);
    free(g);
}

/* The table's free. */
static void gpu_free(tg_session *s)
{
    gpu_state_free((tg_gpu *)s->tier);
    s->tier = NULL;
}

/* Copies the last of n rows (width values each) of a device buffer to the
 * host and hands it to the session's dump hook, when the eval in progress
 * dumps. Synchronizes the stream. */
static int dump_stage(tg_gpu *g, int layer, int stage, const float *d, int n, int width, tg_err *e)
{
    if (!g->want_dump) return 0;
    GPU_CHECK(e, cudaMemcpyAsync(g->dump_buf, d + (size_t)(n - 1) * width, (size_t)width * 4,
                                 cudaMemcpyDeviceToHost, g->stream));
    GPU_CHECK(e, cudaStreamSynchronize(g->stream));
    return tg_dump(g->s, layer, stage, g->dump_buf, width, e);
}

/* Whether the evals of the session run the hooked path: a stage replay in
 * progress (replay_hook.h) or a calibrated perturbation (model.h, pert_*).
 * It is the plain path (never the fused kernels or the graph) with f32
 * matmuls on every batch (gk_matmul_plain: the numerics gpu_numerics
 * declares), and after every stage its rows go to the host, through the
 * stage hook (tier.h, tg_hook) and back. */
static int hooked(const tg_gpu *g)
{
    return g->s->replay != NULL || g->s->o.pert_kind != 0;
}

/* Grows the host hook buffer to bytes. 0 or -1 with e. */
static int hook_room(tg_gpu *g, size_t bytes, tg_err *e)
{
    if (bytes <= g->hook_cap) return 0;
    float *p = (float *)realloc(g->hook_buf, bytes);
    if (!p) return tg_errf(e, "out of host memory for the replay hook (%zu bytes)", bytes);
    g->hook_buf = p;
    g->hook_cap = bytes;
    return 0;
}

/* The stage hook over n rows of width floats of device buffer d (the tokens
 * at positions pos0..pos0+n-1): copied to the host, hooked (recorded,
 * perturbed, overwritten) and copied back. Synchronizes. 0 or -1 with e. */
static int hook_stage(tg_gpu *g, int layer, int stage, float *d, int n, int width, int pos0, tg_err *e)
{
    if (!hooked(g)) return 0;
    const size_t bytes = (size_t)n * width * sizeof(float);
    if (hook_room(g, bytes, e)) return -1;
    GPU_CHECK(e, cudaMemcpyAsync(g->hook_buf, d, bytes, cudaMemcpyDeviceToHost, g->stream));
    GPU_CHECK(e, cudaStreamSynchronize(g->stream));
    tg_hook(g->s, layer, stage, pos0, n, g->hook_buf, width, 0, width);
    GPU_CHECK(e, cudaMemcpyAsync(d, g->hook_buf, bytes, cudaMemcpyHostToDevice, g->stream));
    GPU_CHECK(e, cudaStreamSynchronize(g->stream));
    return 0;
}

/* The hook of the K and V cache rows of the batch (positions pos0..
 * pos0+n-1 of one layer's caches kc, vc): each row as stored, read back to
 * f32, hooked, and stored again from what the hook leaves (the
 * reference's values when it has them: representable in the cache type
 * when the reference applied it). Synchronizes. 0 or -1 with e. */
static int hook_cache(tg_gpu *g, int layer, void *kc, void *vc, int n, int pos0, tg_err *e)
{
    if (!hooked(g)) return 0;
    const int KVD = g->hp.n_head_kv * g->hp.head_dim;
    const size_t vals = (size_t)n * KVD, el = g->kv_f32 ? 4 : 2;
    if (hook_room(g, vals * (sizeof(float) + el), e)) return -1;
    float *f = g->hook_buf;
    void *raw = g->hook_buf + vals;
    for (int kv = 0; kv < 2; kv++) {
        uint8_t *rows = (uint8_t *)(kv ? vc : kc) + (size_t)pos0 * KVD * el;
        GPU_CHECK(e, cudaMemcpyAsync(raw, rows, vals * el, cudaMemcpyDeviceToHost, g->stream));
        GPU_CHECK(e, cudaStreamSynchronize(g->stream));
        for (size_t i = 0; i < vals; i++) f[i] = g->kv_f32 ? ((float *)raw)[i] : tg_half_to_f32(((tg_half *)raw)[i]);
        tg_hook(g->s, layer, kv ? TG_RS_V_CACHE : TG_RS_K_CACHE, pos0, n, f, KVD, 0, KVD);
        for (size_t i = 0; i < vals; i++) {
            if (g->kv_f32) ((float *)raw)[i] = f[i];
            else ((tg_half *)raw)[i] = tg_f32_to_half(f[i]);
        }
        GPU_CHECK(e, cudaMemcpyAsync(rows, raw, vals * el, cudaMemcpyHostToDevice, g->stream));
        GPU_CHECK(e, cudaStreamSynchronize(g->stream));
    }
    return 0;
}

/* The hooked attention of the batch (n tokens from pos0) of one layer: a
 * first launch computes and keeps the scaled scores, the score hook
 * (tier.h, tg_hook_score) sees each (token, head, key position) on the
 * host, and a second launch computes the output from the hooked scores
 * (gk_attention_scores). Synchronizes. 0 or -1 with e. */
static int attention_hooked(tg_gpu *g, int layer, const void *kc, const void *vc, int n, int pos0, tg_err *e)
{
    const tg_hparams *hp = &g->hp;
    const int H = hp->n_head, stride = pos0 + n;
    const size_t vals = (size_t)n * H * stride, bytes = vals * sizeof(float);
    if (bytes > g->dscores_cap) {
        if (g->dscores) cudaFree(g->dscores);
        g->dscores = NULL;
        g->dscores_cap = 0;
        if (dalloc(&g->dscores, bytes, e)) return tg_err_prefix(e, "replay scores (%zu bytes)", bytes);
        g->dscores_cap = bytes;
    }
    if (hook_room(g, bytes, e)) return -1;
    const int f16 = !g->kv_f32;
    if (gk_attention_scores(g->stream, g->q, kc, vc, f16, g->att, n, H, hp->n_head_kv, hp->head_dim, g->dparams,
                            NULL, g->dscores, stride, e))
        return -1;
    GPU_CHECK(e, cudaMemcpyAsync(g->hook_buf, g->dscores, bytes, cudaMemcpyDeviceToHost, g->stream));
    GPU_CHECK(e, cudaStreamSynchronize(g->stream));
    for (int b = 0; b < n; b++)
        for (int h = 0; h < H; h++) {
            float *row = g->hook_buf + ((size_t)b * H + h) * stride;
            for (int j = 0; j <= pos0 + b; j++) row[j] = (float)tg_hook_score(g->s, layer, pos0 + b, h, j, row[j]);
        }
    GPU_CHECK(e, cudaMemcpyAsync(g->dscores, g->hook_buf, bytes, cudaMemcpyHostToDevice, g->stream));
    return gk_attention_scores(g->stream, g->q, kc, vc, f16, g->att, n, H, hp->n_head_kv, hp->head_dim, g->dparams,
                               g->dscores, NULL, stride, e);
}

#define COUNT(ops, op, type) tg_ops_count((ops), (op), (type), TG_TIER_GPU)

/* The fused single-token step (kernels.cu, "the fused single-token path"):
 * the same forward pass as enqueue_step in 7 launches per layer. Counts the
 * same ops as the plain path, so the counters compare across the two. */
/* Records an event after the launch just enqueued, under label; a fused
 * step opens the series with PROF(NULL), so launches outside one (a
 * prefill's selection) are not timed. */
#define PROF(label)                                                      \
    do {                                                                 \
        if (g->prof && g->pn < 512 && (g->pn > 0 || !(label))) {         \
            cudaEventRecord(g->pev[g->pn], s);                           \
            g->plab[g->pn++] = (label);                                  \
        }                                                                \
    } while (0)

/* The top-k on the main stream and the digest on the side stream, both
 * over the final logits, joined before the copies to the host (a fork and
 * join that a captured graph keeps as two parallel branches). Profiling
 * keeps both on the main stream, so that the events time each. */
static int enqueue_select(tg_gpu *g, int k, tg_err *e)
{
    cudaStream_t s = g->stream, ds = g->prof ? s : g->side;
    const int nv = g->hp.n_vocab;
    if (!g->prof) {
        GPU_CHECK(e, cudaEventRecord(g->ev_fork, s));
        GPU_CHECK(e, cudaStreamWaitEvent(g->side, g->ev_fork, 0));
    }
    if (gk_topk(s, g->logits, nv, k, g->topk_scratch, g->dtop, e)) return -1;
    PROF("topk");
    if (gk_xxh3(ds, g->logits, (size_t)nv * 4, g->xxh_scratch, g->ddigest, e)) return -1;
    PROF("xxh3");
    if (!g->prof) {
        GPU_CHECK(e, cudaEventRecord(g->ev_join, g->side));
        GPU_CHECK(e, cudaStreamWaitEvent(s, g->ev_join, 0));
    }
    GPU_CHECK(e, cudaMemcpyAsync(g->htop, g->dtop, sizeof(tg_top) * k, cudaMemcpyDeviceToHost, s));
    GPU_CHECK(e, cudaMemcpyAsync(g->hdigest, g->ddigest, sizeof(uint64_t), cudaMemcpyDeviceToHost, s));
    return 0;
}

static int enqueue_fused_chain(tg_gpu *g, tg_ops *ops, tg_err *e);

/* The fused step, its launches in a flag chain when TG_GPU_CHAIN=1
 * (gk_chain_begin), which ends before the top-k. */
static int enqueue_fused(tg_gpu *g, int k, tg_ops *ops, tg_err *e)
{
    if (gk_chain_begin(g->stream, g->chain_cnt, CHAIN_CAP, e)) return -1;
    const int rc = enqueue_fused_chain(g, ops, e);
    gk_chain_end();
    if (rc == 0 && k > 0) return enqueue_select(g, k, e);
    return rc;
}

static int enqueue_fused_chain(tg_gpu *g, tg_ops *ops, tg_err *e)
{
    const int dm = g->drop;
    const tg_hparams *hp = &g->hp;
    cudaStream_t s = g->stream;
    const int E = hp->n_embd, HD = hp->head_dim, QD = hp->n_head * HD, KVD = hp->n_head_kv * HD, FF = hp->n_ff;
    const int32_t *pos0 = g->dparams, *ids = g->dparams + 1;
    const int f16 = !g->kv_f32;
    const size_t kv_el = f16 ? 2 : 4;
    g->pn = 0;
    PROF(NULL);
    if (gk_get_rows(s, g->token_embd.type, g->token_embd.d, E, ids, 1, g->x, e)) return -1;
    COUNT(ops, TG_OP_EMBED, g->token_embd.type);
    PROF("embed");
    for (int l = 0; l < hp->n_layer; l++) {
        const dlayer *L = &g->layers[l];
        void *kc = (uint8_t *)g->kc + (size_t)l * g->kv_layer_elems * kv_el;
        void *vc = (uint8_t *)g->vc + (size_t)l * g->kv_layer_elems * kv_el;
        if (!(dm & DROP_NORM) && gk_rmsnorm_q8(s, g->x, (const float *)L->attn_norm.d, NULL, E, hp->eps, g->q8n, e))
            return -1;
        PROF("rmsnorm_q8");
        COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
        const gk_mv_seg qkv[3] = {{L->wq.type, L->wq.d, QD, g->q},
                                  {L->wk.type, L->wk.d, KVD, g->k},
                                  {L->wv.type, L->wv.d, KVD, g->v}};
        if (!(dm & DROP_QKV) && gk_mv_fused(s, qkv, 3, E, g->q8n, 0, e)) return -1;
        COUNT(ops, TG_OP_MATMUL, L->wq.type);
        COUNT(ops, TG_OP_MATMUL, L->wk.type);
        COUNT(ops, TG_OP_MATMUL, L->wv.type);
        PROF(L->wv.type == TG_TYPE_Q6_K ? "mv qkv (v q6_K)" : "mv qkv");
        if (!(dm & DROP_ATTN) &&
            gk_attn_decode(s, g->q, g->k, g->v, hp->qk_norm ? (const float *)L->q_norm.d : NULL,
                           hp->qk_norm ? (const float *)L->k_norm.d : NULL, hp->n_head, hp->n_head_kv, HD, g->n_ctx,
                           pos0, hp->rope_base, hp->rope_neox, hp->eps, kc, vc, f16, g->att, g->q8a, NULL, g->att_scratch,
                           e))
            return -1;
        if (hp->qk_norm) {
            COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
            COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
        }
        COUNT(ops, TG_OP_ROPE, TG_TYPE_F32);
        COUNT(ops, TG_OP_ROPE, TG_TYPE_F32);
        COUNT(ops, TG_OP_KV_STORE, TG_TYPE_F32);
        COUNT(ops, TG_OP_ATTN, TG_TYPE_F32);
        PROF("qk norm + rope + store + attention");
        /* the output projection onto the residual, then the ffn norm */
        const gk_mv_seg wo = {L->wo.type, L->wo.d, E, g->x};
        if (!(dm & DROP_WO) && gk_mv_fused(s, &wo, 1, QD, g->q8a, 1, e)) return -1;
        PROF("mv wo+add");
        if (!(dm & DROP_NORM) && gk_rmsnorm_q8(s, g->x, (const float *)L->ffn_norm.d, NULL, E, hp->eps, g->q8n, e))
            return -1;
        PROF("rmsnorm_q8");
        COUNT(ops, TG_OP_MATMUL, L->wo.type);
        COUNT(ops, TG_OP_ADD, TG_TYPE_F32);
        COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
        if (!(dm & DROP_FFN) && gk_mv_swiglu(s, L->gate.type, L->gate.d, L->up.d, FF, E, g->q8n, NULL, g->q8f, e))
            return -1;
        COUNT(ops, TG_OP_MATMUL, L->gate.type);
        COUNT(ops, TG_OP_MATMUL, L->up.type);
        COUNT(ops, TG_OP_SWIGLU, TG_TYPE_F32);
        PROF("mv gate+up+swiglu");
        /* the down projection onto the residual */
        const gk_mv_seg down = {L->down.type, L->down.d, E, g->x};
        if (!(dm & DROP_DOWN) && gk_mv_fused(s, &down, 1, FF, g->q8f, 1, e)) return -1;
        COUNT(ops, TG_OP_MATMUL, L->down.type);
        COUNT(ops, TG_OP_ADD, TG_TYPE_F32);
        PROF(L->down.type == TG_TYPE_Q6_K ? "mv down+add q6_K" : "mv down+add");
    }
    if (gk_rmsnorm_q8(s, g->x, (const float *)g->output_norm.d, NULL, E, hp->eps, g->q8n, e)) return -1;
    PROF("rmsnorm_q8");
    COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
    const gk_mv_seg out = {g->output.type, g->output.d, hp->n_vocab, g->logits};
    if (!(dm & DROP_OUT) && gk_mv_fused(s, &out, 1, E, g->q8n, 0, e)) return -1;
    COUNT(ops, TG_OP_MATMUL, g->output.type);
    PROF("mv output");
    return 0;
}

/* y (n, rows) = W x, counted; plain (hooked): the plain f32 kernel whatever
 * the shape. 0 or -1 with e. */
static int matmul(tg_gpu *g, int plain, const dweight *w, int rows, int K, const float *x, int n, float *y,
                  tg_ops *ops, tg_err *e)
{
    if (plain) {
        if (gk_matmul_plain(g->stream, w->type, w->d, rows, K, x, n, y, e)) return -1;
    } else {
        const gk_mm_seg sg = {w->type, w->d, rows, y};
        if (gk_matmul_group(g->stream, &sg, 1, K, x, n, g->x16, 0, e)) return -1;
    }
    COUNT(ops, TG_OP_MATMUL, w->type);
    return 0;
}

/* The matmuls of weights sharing the input x (q, k, v; gate, up; down
 * alone) as one gk_matmul_group, x rounded to f16 into g->x16 by the kernel
 * that wrote x (gk_rmsnorm16, gk_swiglu16). Never for hooked evals: each
 * stage is hooked after its own matmul there, and a hook may change x.
 * 0 or -1 with e. */
static int matmul_shared(tg_gpu *g, const gk_mm_seg *segs, int nseg, int K, const float *x, void *x16, int n,
                         tg_ops *ops, tg_err *e)
{
    if (gk_matmul_group(g->stream, segs, nseg, K, x, n, x16, 1, e)) return -1;
    for (int i = 0; i < nseg; i++) COUNT(ops, TG_OP_MATMUL, segs[i].type);
    return 0;
}

/* Enqueues the forward pass of n tokens (ids and position already in
 * g->dparams) and, when k > 0, the top-k and digest with their copies to the
 * pinned host buffers. Counts every op into ops. With dumps on, synchronizes
 * after each stage; hooked (a replay or a perturbation), after each stage
 * too, with every stage through the stage hook. Returns 0 or -1 with e. */
static int enqueue_step(tg_gpu *g, int n, int k, tg_ops *ops, tg_err *e)
{
    const tg_hparams *hp = &g->hp;
    cudaStream_t s = g->stream;
    const int E = hp->n_embd, HD = hp->head_dim, QD = hp->n_head * HD, KVD = hp->n_head_kv * HD, FF = hp->n_ff;
    const int32_t *pos0 = g->dparams, *ids = g->dparams + 1;
    const int p0 = g->hparams->pos0;   /* the same position on the host, for the hooks */
    const int f16 = !g->kv_f32;
    const size_t kv_el = f16 ? 2 : 4;
    const int hk = hooked(g);
    if (n == 1 && g->fused && !g->want_dump && !hk) return enqueue_fused(g, k, ops, e);
#define MATMUL(w, rows, K, x, y) matmul(g, hk, &(w), (rows), (K), (x), n, (y), ops, e)
#define HOOK(layer, stage, d, width) hook_stage(g, (layer), (stage), (d), n, (width), p0, e)
    /* token embedding */
    if (gk_get_rows(s, g->token_embd.type, g->token_embd.d, E, ids, n, g->x, e) || HOOK(0, TG_RS_EMBD, g->x, E))
        return -1;
    COUNT(ops, TG_OP_EMBED, g->token_embd.type);
    int normed = 0;   /* g->h (and g->x16) already hold this layer's attention rmsnorm */
    for (int l = 0; l < hp->n_layer; l++) {
        const dlayer *L = &g->layers[l];
        void *kc = (uint8_t *)g->kc + (size_t)l * g->kv_layer_elems * kv_el;
        void *vc = (uint8_t *)g->vc + (size_t)l * g->kv_layer_elems * kv_el;
        /* attention rmsnorm (done with the previous layer's residual when normed) */
        if (!normed &&
            gk_rmsnorm16(s, g->x, (const float *)L->attn_norm.d, g->h, hk ? NULL : g->x16, n, E, hp->eps, e))
            return -1;
        COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
        if (HOOK(l, TG_RS_ATTN_NORM, g->h, E) || dump_stage(g, l, TG_STAGE_ATTN_NORM, g->h, n, E, e)) return -1;
        /* q, k, v projections */
        if (!hk) {
            const gk_mm_seg qkv[3] = {{L->wq.type, L->wq.d, QD, g->q}, {L->wk.type, L->wk.d, KVD, g->k},
                                      {L->wv.type, L->wv.d, KVD, g->v}};
            if (matmul_shared(g, qkv, 3, E, g->h, g->x16, n, ops, e)) return -1;
        } else if (MATMUL(L->wq, QD, E, g->h, g->q) || HOOK(l, TG_RS_Q_PROJ, g->q, QD) ||
                   MATMUL(L->wk, KVD, E, g->h, g->k) || HOOK(l, TG_RS_K_PROJ, g->k, KVD) ||
                   MATMUL(L->wv, KVD, E, g->h, g->v) || HOOK(l, TG_RS_V_PROJ, g->v, KVD))
            return -1;
        /* per-head q/k rmsnorm, rope and the cache store in one launch
         * unless hooked (a hook sees each stage) */
        if (!hk && hp->qk_norm) {
            if (gk_qk_norm_rope_store(s, g->q, g->k, g->v, (const float *)L->q_norm.d, (const float *)L->k_norm.d, n,
                                      hp->n_head, hp->n_head_kv, HD, pos0, hp->rope_base, hp->rope_neox, hp->eps, kc,
                                      vc, f16, e))
                return -1;
            COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
            COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
            COUNT(ops, TG_OP_ROPE, TG_TYPE_F32);
            COUNT(ops, TG_OP_ROPE, TG_TYPE_F32);
            if (dump_stage(g, l, TG_STAGE_Q, g->q, n, QD, e) || dump_stage(g, l, TG_STAGE_K, g->k, n, KVD, e) ||
                dump_stage(g, l, TG_STAGE_V, g->v, n, KVD, e))
                return -1;
            COUNT(ops, TG_OP_KV_STORE, TG_TYPE_F32);
        } else {
            if (hp->qk_norm) {
                if (gk_rmsnorm(s, g->q, (const float *)L->q_norm.d, g->q, n * hp->n_head, HD, hp->eps, e)) return -1;
                COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
                if (gk_rmsnorm(s, g->k, (const float *)L->k_norm.d, g->k, n * hp->n_head_kv, HD, hp->eps, e))
                    return -1;
                COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
                if (HOOK(l, TG_RS_Q_NORM, g->q, QD) || HOOK(l, TG_RS_K_NORM, g->k, KVD)) return -1;
            }
            /* rope */
            if (gk_rope(s, g->q, n, hp->n_head, HD, pos0, hp->rope_base, hp->rope_neox, e)) return -1;
            COUNT(ops, TG_OP_ROPE, TG_TYPE_F32);
            if (gk_rope(s, g->k, n, hp->n_head_kv, HD, pos0, hp->rope_base, hp->rope_neox, e)) return -1;
            COUNT(ops, TG_OP_ROPE, TG_TYPE_F32);
            if (HOOK(l, TG_RS_Q_ROPE, g->q, QD) || HOOK(l, TG_RS_K_ROPE, g->k, KVD)) return -1;
            if (dump_stage(g, l, TG_STAGE_Q, g->q, n, QD, e) || dump_stage(g, l, TG_STAGE_K, g->k, n, KVD, e) ||
                dump_stage(g, l, TG_STAGE_V, g->v, n, KVD, e))
                return -1;
            /* append k, v to the cache */
            if (gk_kv_store(s, g->k, g->v, kc, vc, f16, n, KVD, pos0, e)) return -1;
            COUNT(ops, TG_OP_KV_STORE, TG_TYPE_F32);
        }
        if (hook_cache(g, l, kc, vc, n, p0, e)) return -1;
        /* attention */
        if (hk ? attention_hooked(g, l, kc, vc, n, p0, e)
               : gk_attention(s, g->q, kc, vc, f16, g->att, n, hp->n_head, hp->n_head_kv, HD, g->n_ctx, pos0,
                              g->att_scratch, e))
            return -1;
        COUNT(ops, TG_OP_ATTN, TG_TYPE_F32);
        if (HOOK(l, TG_RS_ATTN, g->att, QD)) return -1;
        /* output projection and residual */
        if (MATMUL(L->wo, E, QD, g->att, g->tmp) || HOOK(l, TG_RS_ATTN_OUT, g->tmp, E)) return -1;
        if (dump_stage(g, l, TG_STAGE_ATTN_OUT, g->tmp, n, E, e)) return -1;
        /* residual and ffn rmsnorm (one pass unless hooked: the hook sees the sum first) */
        if (!hk) {
            if (gk_add_rmsnorm16(s, g->x, g->tmp, (const float *)L->ffn_norm.d, g->h, g->x16, n, E, hp->eps, e))
                return -1;
        } else if (gk_add(s, g->x, g->tmp, n * E, e) || HOOK(l, TG_RS_ATTN_RES, g->x, E) ||
                   gk_rmsnorm(s, g->x, (const float *)L->ffn_norm.d, g->h, n, E, hp->eps, e))
            return -1;
        COUNT(ops, TG_OP_ADD, TG_TYPE_F32);
        COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
        if (HOOK(l, TG_RS_FFN_NORM, g->h, E) || dump_stage(g, l, TG_STAGE_FFN_NORM, g->h, n, E, e)) return -1;
        /* swiglu: gate, up and the product in one launch where the f16
         * tile serves gate, up and down (the product then exists only in
         * f16, g->x16b, which is all the down projection reads) */
        const int swi = !hk && L->gate.type == L->up.type && gk_matmul_swiglu_ok(L->gate.type, E, n) &&
                        gk_matmul_group_f16(L->down.type, FF, n);
        if (swi) {
            if (gk_matmul_swiglu(s, L->gate.type, L->gate.d, L->up.d, FF, E, g->x16, n, g->x16b, e)) return -1;
            COUNT(ops, TG_OP_MATMUL, L->gate.type);
            COUNT(ops, TG_OP_MATMUL, L->up.type);
        } else if (!hk) {
            const gk_mm_seg gu[2] = {{L->gate.type, L->gate.d, FF, g->fg}, {L->up.type, L->up.d, FF, g->fu}};
            if (matmul_shared(g, gu, 2, E, g->h, g->x16, n, ops, e)) return -1;
        } else if (MATMUL(L->gate, FF, E, g->h, g->fg) || HOOK(l, TG_RS_GATE, g->fg, FF) ||
                   MATMUL(L->up, FF, E, g->h, g->fu) || HOOK(l, TG_RS_UP, g->fu, FF))
            return -1;
        if (!swi && gk_swiglu16(s, g->fg, g->fu, g->fg, hk ? NULL : g->x16b, n * FF, e)) return -1;
        COUNT(ops, TG_OP_SWIGLU, TG_TYPE_F32);
        if (HOOK(l, TG_RS_SWIGLU, g->fg, FF)) return -1;
        if (!hk) {
            const gk_mm_seg dn = {L->down.type, L->down.d, E, g->tmp};
            if (matmul_shared(g, &dn, 1, FF, g->fg, g->x16b, n, ops, e)) return -1;
        } else if (MATMUL(L->down, E, FF, g->fg, g->tmp) || HOOK(l, TG_RS_FFN_OUT, g->tmp, E))
            return -1;
        if (dump_stage(g, l, TG_STAGE_FFN_OUT, g->tmp, n, E, e)) return -1;
        /* residual, and the next layer's attention rmsnorm in the same pass
         * unless hooked */
        normed = !hk && l + 1 < hp->n_layer;
        if (normed ? gk_add_rmsnorm16(s, g->x, g->tmp, (const float *)g->layers[l + 1].attn_norm.d, g->h, g->x16, n,
                                      E, hp->eps, e)
                   : gk_add(s, g->x, g->tmp, n * E, e))
            return -1;
        COUNT(ops, TG_OP_ADD, TG_TYPE_F32);
        if (HOOK(l, TG_RS_RESIDUAL, g->x, E) || dump_stage(g, l, TG_STAGE_RESIDUAL, g->x, n, E, e)) return -1;
    }
    /* output norm and projection, last token only */
    float *xl = g->x + (size_t)(n - 1) * E;
    if (gk_rmsnorm(s, xl, (const float *)g->output_norm.d, g->h, 1, E, hp->eps, e)) return -1;
    COUNT(ops, TG_OP_RMSNORM, TG_TYPE_F32);
    if (hook_stage(g, -1, TG_RS_OUT_NORM, g->h, 1, E, p0 + n - 1, e)) return -1;
    if (matmul(g, hk, &g->output, hp->n_vocab, E, g->h, 1, g->logits, ops, e)) return -1;
    if (hook_stage(g, -1, TG_RS_LOGITS, g->logits, 1, hp->n_vocab, p0 + n - 1, e)) return -1;
    if (dump_stage(g, -1, TG_STAGE_LOGITS, g->logits, 1, hp->n_vocab, e)) return -1;
#undef MATMUL
#undef HOOK
    /* top-k and digest on the device; only they cross to the host */
    if (k > 0) {
        if (enqueue_select(g, k, e)) return -1;
    }
    return 0;
}

/* Captures the single-token step (parameter copy, forward, top-k, digest,
 * result copies) for k top entries. Returns 0 or -1 with e. */
static int capture_graph(tg_gpu *g, int k, tg_err *e)
{
    if (g->graph_exec) { cudaGraphExecDestroy(g->graph_exec); g->graph_exec = NULL; }
    if (g->graph) { cudaGraphDestroy(g->graph); g->graph = NULL; }
    g->graph_ready = 0;
    tg_ops_clear(&g->graph_ops);
    GPU_CHECK(e, cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeRelaxed));
    cudaError_t rc0 = cudaMemcpyAsync(g->dparams, g->hparams, 2 * sizeof(int32_t), cudaMemcpyHostToDevice,
                                      g->stream);
    const int frc = rc0 == cudaSuccess ? enqueue_step(g, 1, k, &g->graph_ops, e) : -1;
    cudaGraph_t graph = NULL;
    cudaError_t rc = cudaStreamEndCapture(g->stream, &graph);
    if (rc0 != cudaSuccess)
        return tg_errf(e, "cudaMemcpyAsync of the step parameters failed during capture: %s (in %s, %s:%d)",
                       cudaGetErrorString(rc0), __func__, __FILE__, __LINE__);
    if (frc) {
        if (graph) cudaGraphDestroy(graph);
        return tg_err_prefix(e, "capturing the decode graph");
    }
    GPU_CHECK(e, rc);
    g->graph = graph;
    GPU_CHECK(e, cudaGraphInstantiate(&g->graph_exec, g->graph, 0));
    g->graph_k = k;
    g->graph_ready = 1;
    return 0;
}

/* Adds the event intervals of the last fused step to the per-label totals. */
static void profile_collect(tg_gpu *g)
{
    for (int i = 1; i < g->pn; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, g->pev[i - 1], g->pev[i]) != cudaSuccess) continue;
        int j = 0;
        while (j < g->npk && strcmp(g->pname[j], g->plab[i])) j++;
        if (j == g->npk) {
            if (g->npk == 48) continue;
            g->pname[g->npk] = g->plab[i];
            g->pus[g->npk] = 0;
            g->pcnt[g->npk++] = 0;
        }
        g->pus[j] += 1000.0 * ms;
        g->pcnt[j]++;
    }
    g->psteps++;
    g->pn = 0;
}

extern "C" void tg_gpu_profile_report(tg_session *s, FILE *f)
{
    tg_gpu *g = gpu_of(s);
    if (!g || !g->prof || !g->psteps) return;
    double tot = 0;
    for (int j = 0; j < g->npk; j++) tot += g->pus[j];
    fprintf(f, "profile: %d fused steps, %.1f us per step (events between launches, no graph)\n", g->psteps,
            tot / g->psteps);
    for (int j = 0; j < g->npk; j++)
        fprintf(f, "  %-22s %8.1f us/step %5.1f%%  %4d launches/step  %6.2f us each\n", g->pname[j],
                g->pus[j] / g->psteps, 100.0 * g->pus[j] / tot, g->pcnt[j] / g->psteps, g->pus[j] / g->pcnt[j]);
    g->npk = 0;
    g->psteps = 0;
}

static void digest_hex(uint64_t h, char hex[17])
{
    snprintf(hex, 17, "%016llx", (unsigned long long)h);
}

/* The table's eval: one batch of n tokens at s->pos (the session checked
 * ids, room and n <= n_batch). The last batch of a call selects the top
 * s->top_k on the device when 1 <= top_k <= min(n_vocab, TG_GPU_MAX_TOPK);
 * the logits stay on the device. Returns 0 or -1 with e. */
static int gpu_eval(tg_session *s, const int32_t *tokens, int nb, unsigned flags, tg_err *e)
{
    tg_gpu *g = (tg_gpu *)s->tier;
    const int kmax = g->hp.n_vocab < TG_GPU_MAX_TOPK ? g->hp.n_vocab : TG_GPU_MAX_TOPK;
    const int k = (flags & TG_EVAL_LAST) && s->top_k >= 1 && s->top_k <= kmax ? s->top_k : 0;
    g->sel_k = 0;
    g->want_dump = (flags & TG_EVAL_DUMP) != 0;   /* read by dump_stage until the next eval */
    g->hparams->pos0 = s->pos;
    memcpy(g->hparams->tokens, tokens, (size_t)nb * sizeof(int32_t));
    const int use_graph = nb == 1 && !g->no_graph && !g->want_dump && !hooked(g);
    if (use_graph) {
        if ((!g->graph_ready || g->graph_k != k) && capture_graph(g, k, e)) return -1;
        GPU_CHECK(e, cudaGraphLaunch(g->graph_exec, g->stream));
        tg_ops_merge(&s->ops, &g->graph_ops);
    } else {
        GPU_CHECK(e, cudaMemcpyAsync(g->dparams, g->hparams, sizeof(int32_t) * (nb + 1), cudaMemcpyHostToDevice,
                                     g->stream));
        if (enqueue_step(g, nb, k, &s->ops, e)) return -1;
    }
    /* the pinned parameter block is reused by the next batch: wait */
    GPU_CHECK(e, cudaStreamSynchronize(g->stream));
    if (g->prof && g->pn > 1) profile_collect(g);
    g->sel_k = k;
    return 0;
}

/* The table's logits: the last eval's n_vocab logits to out. */
static int gpu_logits(tg_session *s, float *out, tg_err *e)
{
    tg_gpu *g = (tg_gpu *)s->tier;
    GPU_CHECK(e, cudaMemcpyAsync(out, g->logits, (size_t)g->hp.n_vocab * 4, cudaMemcpyDeviceToHost, g->stream));
    GPU_CHECK(e, cudaStreamSynchronize(g->stream));
    return 0;
}

/* The table's top: the device's selection of the last eval, when it made
 * one of at least k entries (returns 1), else 0. */
static int gpu_top(tg_session *s, int k, tg_top *top, char digest[17], tg_err *e)
{
    (void)e;
    const tg_gpu *g = (const tg_gpu *)s->tier;
    if (g->sel_k < k) return 0;
    memcpy(top, g->htop, sizeof(tg_top) * k);
    digest_hex(*g->hdigest, digest);
    return 1;
}

/* The table's describe: the live session's device, KV cache, graphs,
 * decode path and kernel settings (built at init); before a session, the
 * device and the options ("none usable (why)" and -1 without one). */
static int gpu_describe(const tg_session *s, const tg_opts *o, char *buf, size_t n)
{
    if (s) {
        snprintf(buf, n, "%s", ((const tg_gpu *)s->tier)->device);
        return 0;
    }
    char desc[128];
    tg_err e = {{0}};
    if (tg_gpu_probe(o->device, desc, sizeof desc, &e) != 0) {
        snprintf(buf, n, "gpu: none usable (%.96s)", e.msg);
        return -1;
    }
    snprintf(buf, n, "%s, %s KV, %s", desc, o->kv_f32 ? "f32" : "f16", o->no_graph ? "no graphs" : "graphs");
    return 0;
}

/* The table's numerics: what the hooked path (a replay, a perturbation)
 * rounds, for the exact arbiter to apply (docs/protocol.md, "Declaring
 * numerics"): f32 activations into f32 matmuls (gk_matmul_plain), the K/V
 * cache in the session's type, q in f32 against it, rope angles as
 * ggml-cpu computes them (kernels.cu, rope_cs). The attention's softmax and
 * V sums are f32 but not an online softmax in position order (a block
 * sums its keys in parallel), so attn_acc is left to the arbiter's exact
 * sums and the f32 sums count as accumulation noise ("accum": "f32"). */
static void gpu_numerics(const tg_opts *o, char *buf, size_t n)
{
    snprintf(buf, n,
             "{\"exact\":false,\"act\":\"f32\",\"kv\":\"%s\",\"attn_q\":\"f32\",\"attn_acc\":\"f64\","
             "\"rope\":\"ggml-f32\",\"accum\":\"f32\",\"silu\":\"f32\"}",
             o->kv_f32 ? "f32" : "f16");
}

extern "C" size_t tg_gpu_weight_bytes(const tg_session *s)
{
    const tg_gpu *g = gpu_of(s);
    return g ? g->weight_bytes : 0;
}

extern "C" int tg_gpu_bandwidth(int device, double *bytes_per_s, tg_err *e)
{
    const size_t n = (size_t)2 << 30;   /* 2 GiB each way: far beyond the L2 */
    void *a = NULL, *b = NULL;
    cudaEvent_t t0, t1;
    GPU_CHECK(e, cudaSetDevice(device));
    GPU_CHECK(e, cudaMalloc(&a, n));
    if (cudaMalloc(&b, n) != cudaSuccess) { cudaFree(a); return tg_errf(e, "cudaMalloc of 2 GiB failed"); }
    GPU_CHECK(e, cudaMemset(a, 1, n));
    GPU_CHECK(e, cudaEventCreate(&t0));
    GPU_CHECK(e, cudaEventCreate(&t1));
    GPU_CHECK(e, cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));   /* warm-up */
    const int reps = 10;
    GPU_CHECK(e, cudaEventRecord(t0, 0));
    for (int i = 0; i < reps; i++) GPU_CHECK(e, cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0));
    GPU_CHECK(e, cudaEventRecord(t1, 0));
    GPU_CHECK(e, cudaEventSynchronize(t1));
    float ms = 0;
    GPU_CHECK(e, cudaEventElapsedTime(&ms, t0, t1));
    *bytes_per_s = 2.0 * n * reps / (ms * 1e-3);   /* bytes read plus bytes written */
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    return 0;
}

/* The gpu tier's table (tier.h), registered by linking this object. Host
 * code only: clang's HIP would also make a const global with a constant
 * initializer a device variable, and the device pass has none of these
 * host functions. */
#if !defined(__HIP_DEVICE_COMPILE__)
extern "C" const tg_tier_i tg_tier_gpu = {
    TG_TIER_GPU,      /* id */
    "gpu",            /* name */
    512,              /* n_batch_default (llama.cpp's n_ubatch) */
    TG_GPU_MAX_TOPK,  /* top_k_max */
    gpu_describe,
    gpu_init,
    gpu_free,
    gpu_eval,
    NULL,             /* eval_all: one token at a time */
    gpu_logits,
    gpu_top,
    gpu_numerics,
};
#endif
