/*
 * bench-kernels.c: weight streaming speed of every vec_dot of every CPU
 * tier, in GB/s of weight bytes, over a matrix larger than the caches,
 * next to memcpy (and a plain read) of the same bytes.
 *
 * usage: bench-kernels [-m MB] [-c COLS] [-t THREADS] [-r REPS] [-T TIER]
 *   -m  weight matrix size in MiB per type (default 256)
 *   -c  values per row (default 3072, Qwen3-0.6B's ffn width)
 *   -t  threads splitting the rows (default 1)
 *   -r  repetitions; the best one is reported (default 5)
 *   -T  only this tier (default: every tier this CPU has; "ggml": only ggml)
 * Each line: tier, type, rows x cols, MiB, ms per pass, GB/s.
 *
 * When the llama.cpp CPU build fetched by scripts/fetch-npm.sh is found
 * (TG_CACHE, default .cache), ggml's own vec_dot of the best libggml-cpu
 * variant for this CPU (by its ggml_backend_score) runs over the same bytes
 * on a "ggml-<variant>" line, so each figure has llama.cpp's next to it
 * (note: llama.cpp may also repack Q4_K weights for its gemv; this compares
 * the plain vec_dot kernels).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "quant.h"
#include "util.h"

/* ggml's vec_dot ABI: (n, s, bs, x, bx, y, by, nrc). */
typedef void (*ggml_dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);

static struct {
    char name[64];
    ggml_dot_fn dot[TG_TYPE_COUNT];
} ggml;

static ggml_dot_fn ggml_cur;   /* the one pass_ggml runs */

static void ggml_adapter(int n, float *s, const void *x, const void *y)
{
    ggml_cur(n, s, 0, x, 0, y, 0, 1);
}

/* Loads the best-scoring libggml-cpu variant; leaves ggml.name empty when
 * none can be loaded. */
static void ggml_load(void)
{
    static const char *const variants[] = {"zen4", "sapphirerapids", "cooperlake", "icelake", "cascadelake",
                                           "cannonlake", "skylakex", "alderlake", "haswell", "x64"};
    const char *cache = getenv("TG_CACHE");
    char path[1024];
    void *best = NULL;
    int best_score = 0;
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        snprintf(path, sizeof path, "%s/npm/linux-x64/bins/linux-x64/libggml-cpu-%s.so", cache ? cache : ".cache",
                 variants[v]);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        int (*score)(void) = (int (*)(void))dlsym(h, "ggml_backend_score");
        const int sc = score ? score() : 0;
        if (sc > best_score) {
            if (best) dlclose(best);
            best = h;
            best_score = sc;
            snprintf(ggml.name, sizeof ggml.name, "ggml-%s", variants[v]);
        } else {
            dlclose(h);
        }
    }
    if (!best) return;
    void (*init)(void) = (void (*)(void))dlsym(best, "ggml_cpu_init");
    if (init) init();
    ggml.dot[TG_TYPE_Q4_K] = (ggml_dot_fn)dlsym(best, "ggml_vec_dot_q4_K_q8_K");
    ggml.dot[TG_TYPE_Q5_K] = (ggml_dot_fn)dlsym(best, "ggml_vec_dot_q5_K_q8_K");
    ggml.dot[TG_TYPE_Q6_K] = (ggml_dot_fn)dlsym(best, "ggml_vec_dot_q6_K_q8_K");
    ggml.dot[TG_TYPE_Q8_0] = (ggml_dot_fn)dlsym(best, "ggml_vec_dot_q8_0_q8_0");
    ggml.dot[TG_TYPE_F16] = (ggml_dot_fn)dlsym(best, "ggml_vec_dot_f16");
    ggml.dot[TG_TYPE_BF16] = (ggml_dot_fn)dlsym(best, "ggml_vec_dot_bf16");
    ggml.dot[TG_TYPE_F32] = (ggml_dot_fn)dlsym(best, "ggml_vec_dot_f32");
}

typedef struct job {
    tg_vec_dot_fn dot;
    const char *w;
    size_t wrow;
    const void *act;
    int ncols;
    int64_t r0, r1;
    float *out;
} job;

static void *run_job(void *p)
{
    job *j = p;
    for (int64_t r = j->r0; r < j->r1; r++) j->dot(j->ncols, &j->out[r], j->w + (size_t)r * j->wrow, j->act);
    return NULL;
}

/* One pass over all rows with nt threads; returns seconds. */
static double pass(tg_vec_dot_fn dot, const char *w, size_t wrow, int64_t nrows, int ncols,
                   const void *act, float *out, int nt)
{
    job jobs[64];
    pthread_t th[64];
    const double t0 = tg_now();
    for (int t = 0; t < nt; t++) {
        jobs[t] = (job){dot, w, wrow, act, ncols, nrows * t / nt, nrows * (t + 1) / nt, out};
        if (t > 0) pthread_create(&th[t], NULL, run_job, &jobs[t]);
    }
    run_job(&jobs[0]);
    for (int t = 1; t < nt; t++) pthread_join(th[t], NULL);
    return tg_now() - t0;
}

/* A plain read of n bytes (the floor any weight-streaming kernel sits on). */
static uint64_t read_all(const char *p, size_t n)
{
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
        a += q[i];
        b ^= q[i + 1];
        c += q[i + 2];
        d ^= q[i + 3];
    }
    return a + b + c + d;
}

static float rand_float(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) * 0x1p-53 * 2 - 1);
}

int main(int argc, char **argv)
{
    size_t mb = 256;
    int ncols = 3072, nt = 1, reps = 5;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) ncols = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) nt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-T") && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [-m MB] [-c COLS] [-t THREADS] [-r REPS] [-T TIER]\n", argv[0]);
            return 2;
        }
    }
    if (ncols <= 0 || ncols % 256 || nt < 1 || nt > 64 || reps < 1 || mb < 1) {
        fprintf(stderr, "bench-kernels: -c must be a positive multiple of 256, -t 1..64, -r >= 1, -m >= 1\n");
        return 2;
    }
    static const uint32_t types[] = {TG_TYPE_Q4_K, TG_TYPE_Q5_K, TG_TYPE_Q6_K, TG_TYPE_Q8_0,
                                     TG_TYPE_F16, TG_TYPE_BF16, TG_TYPE_F32};
    static const char *const tiers[] = {"scalar", "avx2", "avx512vnni", "neon", "neon-dotprod"};
    const size_t bytes = mb << 20;
    char *w = malloc(bytes), *w2 = malloc(bytes);
    float *x = malloc((size_t)ncols * sizeof(float));
    float *out = malloc((bytes / 64 + 1) * sizeof(float));
    void *act = malloc((size_t)ncols * 4);
    if (!w || !w2 || !x || !out || !act) {
        fprintf(stderr, "bench-kernels: out of memory for %zu MiB\n", mb);
        return 1;
    }
    uint64_t seed = 42;
    for (int i = 0; i < ncols; i++) x[i] = rand_float(&seed);
    ggml_load();
    printf("bench-kernels: %zu MiB per matrix, %d cols, %d thread(s), best of %d; selected tier %s\n", mb,
           ncols, nt, reps, tg_cpu_isa());
    /* memcpy and a plain read of the same bytes, for scale */
    memset(w, 1, bytes);
    memset(w2, 2, bytes);
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        const double t0 = tg_now();
        memcpy(w2, w, bytes);
        const double t = tg_now() - t0;
        if (t < best) best = t;
    }
    printf("%-12s %-5s %21s %6zu MiB %8.2f ms %7.2f GB/s (bytes read)\n", "-", "memcpy", "", mb, best * 1e3,
           bytes / best / 1e9);
    best = 1e9;
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        const double t0 = tg_now();
        sink += read_all(w, bytes);
        const double t = tg_now() - t0;
        if (t < best) best = t;
    }
    (void)sink;
    printf("%-12s %-5s %21s %6zu MiB %8.2f ms %7.2f GB/s (1 thread)\n", "-", "read", "", mb, best * 1e3,
           bytes / best / 1e9);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const uint32_t type = types[t];
        const tg_type_traits *tr = tg_traits(type);
        const size_t wrow = tg_row_size(type, ncols);
        const int64_t nrows = (int64_t)(bytes / wrow);
        /* 16 distinct quantized rows, repeated: the kernels do not care
         * about values, the memory system sees the whole matrix */
        float *rowf = malloc((size_t)ncols * sizeof(float));
        for (int r = 0; r < 16 && r < nrows; r++) {
            for (int i = 0; i < ncols; i++) rowf[i] = rand_float(&seed);
            tr->from_float(rowf, w + (size_t)r * wrow, ncols);
        }
        for (int64_t r = 16; r < nrows; r++) memcpy(w + (size_t)r * wrow, w + (size_t)(r % 16) * wrow, wrow);
        free(rowf);
        if (tg_cpu_quantize_row(tr->vec_dot_type, x, act, ncols) != 0) return 1;
        for (size_t k = 0; k < sizeof tiers / sizeof tiers[0]; k++) {
            const tg_cpu_kernels *kk = tg_cpu_kernels_tier(tiers[k]);
            if (!kk || (only && strcmp(only, tiers[k]))) continue;
            if (!strcmp(tiers[k], "scalar") && !only) continue;   /* minutes; ask with -T scalar */
            best = 1e9;
            for (int r = 0; r < reps; r++) {
                const double s = pass(kk->vec_dot[type], w, wrow, nrows, ncols, act, out, nt);
                if (s < best) best = s;
            }
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%d", (long long)nrows, ncols);
            printf("%-12s %-5s %21s %6zu MiB %8.2f ms %7.2f GB/s\n", kk->isa, tr->name, shape,
                   (size_t)(nrows * wrow) >> 20, best * 1e3, nrows * wrow / best / 1e9);
        }
        if (ggml.dot[type] && (!only || !strncmp(only, "ggml", 4))) {
            ggml_cur = ggml.dot[type];
            best = 1e9;
            for (int r = 0; r < reps; r++) {
                const double s = pass(ggml_adapter, w, wrow, nrows, ncols, act, out, nt);
                if (s < best) best = s;
            }
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%d", (long long)nrows, ncols);
            printf("%-12s %-5s %21s %6zu MiB %8.2f ms %7.2f GB/s\n", ggml.name, tr->name, shape,
                   (size_t)(nrows * wrow) >> 20, best * 1e3, nrows * wrow / best / 1e9);
        }
    }
    /* prefill shape: tg_cpu_matmul (selected tier, vec_dot4 where it has
     * one) against plain vec_dot loops, 1024 weight rows x ncols, 32
     * activation rows; figures in dot products per microsecond */
    enum { MROWS = 1024, MB = 32 };
    static const uint32_t mtypes[] = {TG_TYPE_Q4_K, TG_TYPE_Q6_K, TG_TYPE_Q8_0};
    float *mout = malloc((size_t)MROWS * MB * sizeof(float));
    float *xa = malloc((size_t)MB * ncols * sizeof(float));
    for (size_t i = 0; i < (size_t)MB * ncols; i++) xa[i] = rand_float(&seed);
    for (size_t t = 0; t < sizeof mtypes / sizeof mtypes[0]; t++) {
        const tg_type_traits *tr = tg_traits(mtypes[t]);
        const size_t wrow = tg_row_size(mtypes[t], ncols), arow = tg_row_size(tr->vec_dot_type, ncols);
        char *acts = malloc(MB * arow);
        for (int b = 0; b < MB; b++) tg_cpu_quantize_row(tr->vec_dot_type, xa + (size_t)b * ncols, acts + b * arow, ncols);
        const tg_vec_dot_fn dot = tg_cpu_vec_dot(mtypes[t]);
        double bm = 1e9, bd = 1e9;
        for (int r = 0; r < reps; r++) {
            double t0 = tg_now();
            tg_cpu_matmul(mtypes[t], w, MROWS, ncols, acts, MB, mout, 0, MROWS);
            const double tm = tg_now() - t0;
            t0 = tg_now();
            for (int row = 0; row < MROWS; row++)
                for (int b = 0; b < MB; b++) dot(ncols, &mout[b * MROWS + row], w + (size_t)row * wrow, acts + b * arow);
            const double td = tg_now() - t0;
            if (tm < bm) bm = tm;
            if (td < bd) bd = td;
        }
        printf("%-12s %-5s matmul %dx%d x %d act rows: tg_cpu_matmul %8.2f ms (%6.1f dots/us), vec_dot loop %8.2f ms (%6.1f dots/us)\n",
               tg_cpu_isa(), tr->name, MROWS, ncols, MB, bm * 1e3, MROWS * MB / bm / 1e6, bd * 1e3, MROWS * MB / bd / 1e6);
        free(acts);
    }
    free(mout);
    free(xa);
    free(w); free(w2); free(x); free(out); free(act);
    return 0;
}
