/*
 * timeline_gpu.cu: where the time of a graph-replayed decode step of the
 * gpu tier goes, launch by launch, from the kernels' own start and end
 * times as the device recorded them (CUPTI's concurrent-kernel activity
 * records, libcupti loaded at run time). A diagnostic, not a test: it
 * never fails on a slow figure.
 *
 * Per-launch events (TG_GPU_PROFILE) time launches one by one without the
 * graph and without programmatic dependent launch, and leaving a launch
 * class out (TG_GPU_TIMING_DROP) changes what overlaps; this reads the
 * step as it runs. For each launch of the fused step, in stream order:
 *   end delta   its end minus the previous main-stream launch's end: the
 *               time it adds to the step's critical path
 *   lead        its start minus the previous launch's end (negative: its
 *               blocks started while the previous kernel ran, under PDL)
 *   span        end minus start (with PDL, includes its blocks' wait)
 * summed per launch class over a step and averaged over the traced steps
 * (the copies, CUPTI's copy records, and the digest's side stream are
 * off that chain), and the step's period (one token: start of one
 * embedding to the next), its device time (embedding start to the last
 * kernel's end) and the gap between steps, split at the copies: the
 * results' copy to the host, the host's turn, the next parameters' copy
 * and the graph's first kernel.
 *
 * Usage: timeline_gpu MODEL.gguf [--prefill N] [--decode N] [--raw FILE]
 *   --prefill N the prompt before the steps (512 random tokens)
 *   --decode N  the traced steps (32), after two that capture the graph
 *   --raw FILE  every kernel record of the traced steps as tab-separated
 *               lines (step, class, name, start and end in ns from the
 *               step's start, grid, block, registers, shared memory)
 * libcupti.so.13 (or TG_CUPTI=PATH) must be loadable; without a GPU, or
 * under HIP, it says SKIP.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TG_GPU_HIP
#include <cupti.h>
#include <dlfcn.h>
#endif

#include "gpu/gpu.h"
#include "model.h"
#include "util.h"

#ifdef TG_GPU_HIP
int main(void)
{
    printf("SKIP: timeline_gpu reads CUPTI's kernel records (CUDA only)\n");
    return 0;
}
#else

/* ---- the CUPTI calls, resolved from libcupti at run time --------------- */

static struct {
    CUptiResult (*reg)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*flush)(uint32_t);
    CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*version)(uint32_t *);
    CUptiResult (*dropped)(CUcontext, uint32_t, size_t *);
} cu;

/* One kernel record, or a copy's (name "copy to device" or "copy to
 * host", the rest zero). */
struct krec {
    uint64_t start, end;
    char *name;
    int gx, gy, bx, regs, smem;
    uint32_t stream;
};

static krec *recs;
static size_t nrec, caprec;
static size_t ndropped;
static int oom;

#define TL_BUF (8u << 20)

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = (uint8_t *)aligned_alloc(8, TL_BUF);
    *size = *buf ? TL_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    CUpti_Activity *r = NULL;
    while (cu.next(buf, valid, &r) == CUPTI_SUCCESS) {
        const int copy = r->kind == CUPTI_ACTIVITY_KIND_MEMCPY;
        if (!copy && r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        if (nrec == caprec) {
            const size_t nc = caprec ? 2 * caprec : 65536;
            krec *n = (krec *)realloc(recs, nc * sizeof *n);
            if (!n) { oom = 1; break; }
            recs = n;
            caprec = nc;
        }
        krec *o = &recs[nrec++];
        if (copy) {
            const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)r;
            memset(o, 0, sizeof *o);
            o->start = c->start;
            o->end = c->end;
            o->name = strdup(c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "copy to device"
                             : c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "copy to host"
                                                                               : "copy");
            o->stream = c->streamId;
            continue;
        }
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        o->start = k->start;
        o->end = k->end;
        o->name = strdup(k->name ? k->name : "?");
        o->gx = k->gridX;
        o->gy = k->gridY;
        o->bx = k->blockX;
        o->regs = k->registersPerThread;
        o->smem = k->dynamicSharedMemory + k->staticSharedMemory;
        o->stream = k->streamId;
    }
    size_t d = 0;
    if (cu.dropped && cu.dropped(ctx, stream, &d) == CUPTI_SUCCESS) ndropped += d;
    free(buf);
}

/* Loads libcupti and starts the kernel records; 0, or -1 with why in msg. */
static int trace_start(char *msg, size_t n)
{
    const char *env = getenv("TG_CUPTI");
    const char *tries[] = {env, "libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                           "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13", "/usr/local/cuda/lib/libcupti.so.13"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof tries / sizeof tries[0] && !h; i++)
        if (tries[i] && *tries[i]) h = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(msg, n, "libcupti not found (tried TG_CUPTI, libcupti.so.13 and the CUDA folders): %s", dlerror());
        return -1;
    }
    *(void **)&cu.reg = dlsym(h, "cuptiActivityRegisterCallbacks");
    *(void **)&cu.enable = dlsym(h, "cuptiActivityEnable");
    *(void **)&cu.flush = dlsym(h, "cuptiActivityFlushAll");
    *(void **)&cu.next = dlsym(h, "cuptiActivityGetNextRecord");
    *(void **)&cu.version = dlsym(h, "cuptiGetVersion");
    *(void **)&cu.dropped = dlsym(h, "cuptiActivityGetNumDroppedRecords");
    if (!cu.reg || !cu.enable || !cu.flush || !cu.next || !cu.version) {
        snprintf(msg, n, "libcupti lacks the activity API (cuptiActivityRegisterCallbacks ...)");
        return -1;
    }
    uint32_t v = 0;
    cu.version(&v);
    if (v / 10000 != CUPTI_API_VERSION / 10000) {
        snprintf(msg, n, "libcupti API version %u: this program reads the records of version %d (CUDA %d)", v,
                 CUPTI_API_VERSION, CUPTI_API_VERSION / 10000);
        return -1;
    }
    if (cu.reg(buf_request, buf_complete) != CUPTI_SUCCESS ||
        cu.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cu.enable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) {
        snprintf(msg, n, "CUPTI would not start the concurrent-kernel and copy records");
        return -1;
    }
    return 0;
}

/* ---- the step's launches ------------------------------------------------ */

enum { C_EMBED, C_NORM, C_QKV, C_ATTN, C_O, C_FFN, C_DOWN, C_OUT, C_TOPK1, C_TOPK2, C_XXH3, C_H2D, C_D2H,
       C_OTHER, C_N };
static const char *const cname[C_N] = {"embed",         "norm",         "q/k/v",         "attention",
                                       "o + add",       "gate/up",      "down + add",    "vocabulary",
                                       "top-k chunks",  "top-k final",  "digest (side)", "copy to device",
                                       "copy to host",  "other"};
/* not on the main stream's kernel chain */
static int off_chain(int c) { return c == C_XXH3 || c == C_H2D || c == C_D2H; }

static int has(const char *name, const char *s) { return strstr(name, s) != NULL; }

static int by_start(const void *a, const void *b)
{
    const krec *x = (const krec *)a, *y = (const krec *)b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : 0;
}

/* Classes of recs[0..n-1] (sorted by start): a mat-vec is named by the
 * launch before it (norm: q/k/v, or the vocabulary projection when no
 * attention follows; attention: o; gate/up: down). */
static void classify(const krec *r, size_t n, int *cls)
{
    for (size_t i = 0; i < n; i++) {
        const char *nm = r[i].name;
        cls[i] = has(nm, "k_get_rows")      ? C_EMBED
               : has(nm, "k_rmsnorm_q8")    ? C_NORM
               : has(nm, "k_attn_decode")   ? C_ATTN
               : has(nm, "k_mv_swiglu")     ? C_FFN
               : has(nm, "k_topk_partial")  ? C_TOPK1
               : has(nm, "k_topk")          ? C_TOPK2
               : has(nm, "k_xxh3")          ? C_XXH3
               : !strcmp(nm, "copy to device") ? C_H2D
               : !strcmp(nm, "copy to host") ? C_D2H
               : has(nm, "k_mv_stream") || has(nm, "k_mv_fused") ? C_QKV
                                            : C_OTHER;
    }
    int prev = C_OTHER;
    for (size_t i = 0; i < n; i++) {
        if (off_chain(cls[i])) continue;
        if (cls[i] == C_QKV) {
            size_t j = i + 1;
            while (j < n && off_chain(cls[j])) j++;
            cls[i] = prev == C_ATTN ? C_O : prev == C_FFN ? C_DOWN : j < n && cls[j] == C_ATTN ? C_QKV : C_OUT;
        }
        prev = cls[i];
    }
}

/* Reads the records once the traced steps are done (the last n_decode
 * steps, wall seconds by the host's clock) and prints the step's table;
 * --raw's lines into raw (NULL: none). 0, or 1 when the records do not
 * hold the steps. */
static int report(int n_decode, double wall, const char *raw)
{
    cu.flush(1);
    if (oom) { fprintf(stderr, "timeline_gpu: out of memory for the records\n"); return 1; }
    qsort(recs, nrec, sizeof *recs, by_start);
    int *cls = (int *)malloc(sizeof(int) * (nrec ? nrec : 1));
    classify(recs, nrec, cls);
    /* the steps: each embedding starts one; the last n_decode are timed */
    size_t *st = (size_t *)malloc(sizeof(size_t) * (nrec + 1));
    int ns = 0;
    for (size_t i = 0; i < nrec; i++)
        if (cls[i] == C_EMBED) st[ns++] = i;
    if (ns < n_decode + 1) {
        fprintf(stderr, "timeline_gpu: %zu kernel records, %d embeddings: expected a record of every "
                        "launch of %d decode steps (%zu dropped)\n", nrec, ns, n_decode, ndropped);
        free(cls);
        free(st);
        return 1;
    }
    const int s0 = ns - n_decode;   /* the first traced step; its predecessor gives the first gap */
    double sum_delta[C_N] = {0}, sum_lead[C_N] = {0}, sum_span[C_N] = {0}, cnt[C_N] = {0};
    double period = 0, busy = 0, gap = 0, g_copy = 0, g_host = 0, g_launch = 0;
    int np = 0, ngap = 0;
    FILE *rf = raw ? fopen(raw, "w") : NULL;
    if (raw && !rf) fprintf(stderr, "timeline_gpu: --raw %s: cannot write\n", raw);
    if (rf) fprintf(rf, "step\tclass\tname\tstart_ns\tend_ns\tgrid\tblock\tregs\tsmem\n");
    for (int s = s0; s < ns; s++) {
        const size_t b = st[s], en = s + 1 < ns ? st[s + 1] : nrec;
        const uint64_t t = recs[b].start;
        uint64_t last_end = recs[b].start, step_end = 0, d2h_end = 0, h2d_start = 0;
        for (size_t i = b; i < en; i++) {
            const krec *r = &recs[i];
            const int c = cls[i];
            if (c == C_D2H && r->end > d2h_end) d2h_end = r->end;
            if (c == C_H2D) h2d_start = r->start;   /* the last one: the next step's parameters */
            if (c != C_H2D && c != C_D2H && r->end > step_end) step_end = r->end;   /* kernels, both streams */
            if (rf)
                fprintf(rf, "%d\t%s\t%s\t%llu\t%llu\t%dx%d\t%d\t%d\t%d\n", s - s0, cname[c], r->name,
                        (unsigned long long)(r->start - t), (unsigned long long)(r->end - t), r->gx, r->gy,
                        r->bx, r->regs, r->smem);
            sum_span[c] += (double)(r->end - r->start);
            cnt[c] += 1;
            if (off_chain(c)) continue;   /* the side stream, the copies: not on the kernel chain */
            sum_lead[c] += (double)r->start - (double)last_end;
            sum_delta[c] += (double)r->end - (double)last_end;
            last_end = r->end;
        }
        busy += (double)(step_end - t);
        if (s + 1 < ns) {
            period += (double)(recs[st[s + 1]].start - t);
            gap += (double)(recs[st[s + 1]].start - step_end);
            np++;
            if (d2h_end >= step_end && h2d_start >= d2h_end && recs[st[s + 1]].start >= h2d_start) {
                g_copy += (double)(d2h_end - step_end);
                g_host += (double)(h2d_start - d2h_end);
                g_launch += (double)(recs[st[s + 1]].start - h2d_start);
                ngap++;
            }
        }
    }
    if (rf) fclose(rf);
    const int nt = ns - s0;
    const double per = np ? period / np / 1e3 : 0;
    printf("traced: %d steps, %.1f tok/s by the host's clock while traced (%zu kernel records, %zu dropped)\n",
           n_decode, n_decode / wall, nrec, ndropped);
    printf("step: period %.1f us (%.1f tok/s), device %.1f us from the embedding to the last kernel's end, "
           "gap to the next step %.1f us\n", per, per > 0 ? 1e6 / per : 0, busy / nt / 1e3,
           np ? gap / np / 1e3 : 0);
    if (ngap)
        printf("the gap: the results' copy to the host ends %.1f us after the last kernel, the host's turn "
               "%.1f us, then the next parameters' copy to the embedding's start %.1f us (%d of %d gaps)\n",
               g_copy / ngap / 1e3, g_host / ngap / 1e3, g_launch / ngap / 1e3, ngap, np);
    printf("%-14s %9s %13s %9s %12s %12s\n", "class", "launches", "end delta us", "share", "lead us/each",
           "span us/each");
    for (int c = 0; c < C_N; c++) {
        if (!cnt[c]) continue;
        const double d = sum_delta[c] / nt / 1e3;
        const int off = off_chain(c);
        printf("%-14s %9.1f %13.1f %8.1f%% %12.2f %12.2f\n", cname[c], cnt[c] / nt, off ? 0.0 : d,
               off || per <= 0 ? 0.0 : 100 * d / per, off ? 0.0 : sum_lead[c] / cnt[c] / 1e3,
               sum_span[c] / cnt[c] / 1e3);
    }
    free(cls);
    free(st);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *raw = NULL;
    int n_prefill = 512, n_decode = 32, bad = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prefill") && i + 1 < argc) n_prefill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) n_decode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--raw") && i + 1 < argc) raw = argv[++i];
        else if (argv[i][0] == '-' || model) bad = 1;
        else model = argv[i];
    }
    if (bad || !model || n_prefill < 8 || n_prefill > 4096 || n_decode < 2 || n_decode > 4096) {
        fprintf(stderr, "usage: timeline_gpu MODEL.gguf [--prefill N, 8..4096] [--decode N, 2..4096] [--raw FILE]\n");
        return 2;
    }
    char desc[160], msg[300];
    tg_err e = {{0}};
    if (tg_gpu_probe(0, desc, sizeof desc, &e)) {
        printf("SKIP: no GPU (%s)\n", e.msg);
        return 0;
    }
    if (trace_start(msg, sizeof msg)) {
        printf("SKIP: %s\n", msg);
        return 0;
    }
    tg_model *m = NULL;
    if (tg_model_load(&m, model, &e)) {
        fprintf(stderr, "timeline_gpu: %s\n", e.msg);
        return 2;
    }
    tg_opts o = tg_opts_default();
    o.tier = TG_TIER_GPU;
    o.n_ctx = n_prefill + n_decode + 16;
    o.n_batch = 512;
    tg_session *g = NULL;
    if (tg_session_new(&g, m, &o, &e)) {
        fprintf(stderr, "timeline_gpu: %s\n", e.msg);
        return 2;
    }
    tg_session_set_top(g, 32);
    printf("timeline_gpu: %s, %d layers, %s\n", model, m->hp.n_layer, tg_session_device(g));
    int32_t *toks = (int32_t *)malloc(sizeof(int32_t) * n_prefill);
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < n_prefill; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)m->hp.n_vocab);
    }
    tg_top top[32];
    char dig[17];
    double t0 = 0;
    if (tg_session_eval(g, toks, n_prefill, &e) || tg_session_top(g, 32, top, dig, &e) < 0) goto fail;
    /* two untimed steps (the graph's capture), then the traced ones */
    for (int i = 0; i < n_decode + 2; i++) {
        if (i == 2) t0 = tg_now();
        if (tg_session_eval(g, &top[0].id, 1, &e) || tg_session_top(g, 32, top, dig, &e) < 0) goto fail;
    }
    {
        const int rc = report(n_decode, tg_now() - t0, raw);
        tg_session_free(g);
        return rc;
    }
fail:
    fprintf(stderr, "timeline_gpu: %s\n", e.msg);
    return 1;
}
#endif
