/*
 * test_model.c: the engine's forward pass (engine/model.h), ref and cpu
 * tiers, against llama.cpp itself.
 *
 * llama.cpp (the prebuilt x86-64 CPU libllama, loaded in-process through
 * oracles/llama/llama_dl.h) decodes each prompt greedily; the engine's tiers
 * then decode teacher-forced along llama.cpp's tokens, so every step is
 * scored over an identical prefix. The acceptance (issue text):
 *  - cpu tier: the same argmax at every step whose llama.cpp top1-top2 gap
 *    is >= 0.5, and the logits of llama.cpp's top 16 within max(1.5 S, 0.01),
 *    where S is the largest difference llama.cpp shows against itself
 *    between flash attention on and off on the same steps (measured here);
 *  - ref tier: the same argmax wherever the gap is >= 1.0; its largest
 *    difference and its ratio to the cpu tier's are printed, and an f64 run
 *    of the ref tier says which arm sits closest to the exact value;
 *  - ref: byte-identical logits across runs and thread settings; cpu:
 *    byte-identical across runs with the same settings (and, by design,
 *    across thread counts and batch sizes, also checked).
 * Models: the shipped trained Qwen3 Q4_K_M, and tg-mkmodel files (tiny F32,
 * Q8_0, Q4_K_M and the 0.6b shape in Q4_K_M, the last cached in
 * $TG_CACHE/models under the sha256 of the tiny file tg-mkmodel writes
 * and the arguments).
 *
 * Under AddressSanitizer the 0.6b model runs one prompt, 4 steps, no ref.
 * TG_TEST_FILTER / TG_TEST_SKIP (cmocka name patterns) pick the tests.
 *
 * Every figure is printed. Also tested: load errors name the tensor and the
 * expectation, tied output, the perturbation option, dumps, op counters.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "forward_ref.h"
#include "gguf.h"
#include "llama/llama_dl.h"
#include "model.h"
#include "quant.h"
#include "tier.h"
#include "util.h"

extern char **environ;

/* Acceptance thresholds (issue text). */
#define CPU_GAP_MIN 0.5f      /* argmax must match where llama.cpp's gap >= this */
#define REF_GAP_MIN 1.0f
#define TOL_FACTOR 1.5f       /* top-16 logits within max(TOL_FACTOR * S, TOL_FLOOR) */
#define TOL_FLOOR 0.01f
#define TOP_N 16

static char g_root[4096], g_build[4096], g_cache[4400];
static llama_dl *g_dl;

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* --- runs ------------------------------------------------------------------ */

typedef struct run {
    int steps, n_vocab;
    int32_t *tokens;     /* (steps) argmax of each step */
    float *logits;       /* (steps, n_vocab) */
} run;

static void run_free(run *r)
{
    free(r->tokens);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

static void run_alloc(run *r, int steps, int n_vocab)
{
    r->steps = steps;
    r->n_vocab = n_vocab;
    r->tokens = calloc((size_t)steps, sizeof(int32_t));
    r->logits = calloc((size_t)steps * n_vocab, sizeof(float));
    assert_non_null(r->tokens);
    assert_non_null(r->logits);
}

static const float *step_logits(const run *r, int s)
{
    return r->logits + (size_t)s * r->n_vocab;
}

/* llama.cpp greedy decode (force: teacher forcing along those tokens, or
 * NULL), the prompt in one batch, one token per step after it. */
static void llama_run(struct llama_model *lm, const int32_t *prompt, int np, int steps, const int32_t *force,
                      enum llama_flash_attn_type fa, run *out)
{
    struct llama_context_params cp = g_dl->context_default_params();
    cp.n_ctx = (uint32_t)((np + steps + 255) / 256 * 256);
    cp.n_batch = cp.n_ubatch = (uint32_t)(np > 512 ? np : 512);
    cp.n_threads = cp.n_threads_batch = 2;
    cp.flash_attn_type = fa;
    cp.no_perf = true;
    struct llama_context *ctx = g_dl->init_from_model(lm, cp);
    assert_non_null(ctx);
    int n_vocab = g_dl->vocab_n_tokens(g_dl->model_get_vocab(lm));
    run_alloc(out, steps, n_vocab);
    struct llama_batch b = g_dl->batch_init(np, 0, 1);
    for (int i = 0; i < np; i++) {
        b.token[i] = prompt[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = i == np - 1;
    }
    b.n_tokens = np;
    assert_int_equal(g_dl->decode(ctx, b), 0);
    for (int s = 0; s < steps; s++) {
        const float *lg = g_dl->get_logits_ith(ctx, -1);
        assert_non_null(lg);
        memcpy(out->logits + (size_t)s * n_vocab, lg, (size_t)n_vocab * sizeof(float));
        out->tokens[s] = tg_argmax(lg, n_vocab);
        if (s == steps - 1)
            break;
        b.token[0] = force ? force[s] : out->tokens[s];
        b.pos[0] = np + s;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = 0;
        b.logits[0] = 1;
        b.n_tokens = 1;
        assert_int_equal(g_dl->decode(ctx, b), 0);
    }
    g_dl->batch_free(b);
    g_dl->free_context(ctx);
}

/* The engine, teacher-forced along force (steps-1 tokens). */
static void engine_run(const tg_model *m, const tg_opts *o, const int32_t *prompt, int np, int steps,
                       const int32_t *force, run *out)
{
    tg_err e = {{0}};
    tg_session *s;
    if (tg_session_new(&s, m, o, &e) != 0)
        fail_msg("tg_session_new: %s", e.msg);
    run_alloc(out, steps, m->hp.n_vocab);
    if (tg_session_eval(s, prompt, np, &e) != 0)
        fail_msg("prefill: %s", e.msg);
    for (int st = 0; st < steps; st++) {
        const float *lg = tg_session_logits(s);
        memcpy(out->logits + (size_t)st * out->n_vocab, lg, (size_t)out->n_vocab * sizeof(float));
        out->tokens[st] = tg_argmax(lg, out->n_vocab);
        if (st == steps - 1)
            break;
        if (tg_session_eval(s, &force[st], 1, &e) != 0)
            fail_msg("step %d: %s", st, e.msg);
    }
    tg_session_free(s);
}

/* Largest |a - b| over the top-16 ids of ref at every step. */
static double top_diff(const run *ref, const run *a, const run *b)
{
    double mx = 0;
    tg_top top[TOP_N];
    for (int s = 0; s < ref->steps; s++) {
        int n = tg_topk(step_logits(ref, s), ref->n_vocab, TOP_N, top);
        for (int i = 0; i < n; i++) {
            double d = fabs((double)step_logits(a, s)[top[i].id] - (double)step_logits(b, s)[top[i].id]);
            if (d > mx)
                mx = d;
        }
    }
    return mx;
}

static float gap_at(const run *r, int s)
{
    tg_top top[2];
    tg_topk(step_logits(r, s), r->n_vocab, 2, top);
    return top[0].logit - top[1].logit;
}

/* Steps where arm's argmax differs from llama's while llama's gap >= min. */
static int argmax_misses(const char *label, const run *llama, const run *arm, float min_gap)
{
    int bad = 0;
    for (int s = 0; s < llama->steps; s++) {
        if (arm->tokens[s] == llama->tokens[s])
            continue;
        float g = gap_at(llama, s);
        printf("    %s step %d: argmax %d, llama.cpp %d (gap %.4f)%s\n", label, s, arm->tokens[s],
               llama->tokens[s], g,
               g < min_gap ? " (near-tie, allowed)"
               : strncmp(label, "llama", 5) == 0 ? "  <-- beyond the rule (information only)" : "  <-- FAIL");
        if (g >= min_gap)
            bad++;
    }
    return bad;
}

static int runs_identical(const run *a, const run *b)
{
    return a->steps == b->steps && a->n_vocab == b->n_vocab &&
           memcmp(a->logits, b->logits, (size_t)a->steps * a->n_vocab * sizeof(float)) == 0;
}

/* --- per-model acceptance ------------------------------------------------ */

typedef struct accept_cfg {
    const char *label;
    const char *path;
    int steps;
    int n_prompts;
    int ref_steps;       /* ref tier steps (0: skip the ref tier) */
    int check_threads;   /* also cpu threads 1 vs 2 and batch sizes */
} accept_cfg;

static const char *const prompts[] = {
    "The following options are supported:",
    "def __init__(self, *args, **kwargs):",
    "This manual page documents",
};

static void accept_model(const accept_cfg *cfg)
{
    printf("== %s (%s)\n", cfg->label, cfg->path);
    tg_err e = {{0}};
    tg_model *m;
    if (tg_model_load(&m, cfg->path, &e) != 0)
        fail_msg("load: %s", e.msg);
    struct llama_model *lm;
    if (llama_dl_load_model(g_dl, cfg->path, NULL, &lm, &e) != 0)
        fail_msg("llama.cpp load: %s", e.msg);
    assert_int_equal(g_dl->vocab_n_tokens(g_dl->model_get_vocab(lm)), m->hp.n_vocab);

    double worst_cpu = 0, worst_ref = 0, worst_S = 0;
    int fails = 0;
    for (int p = 0; p < cfg->n_prompts; p++) {
        int32_t *ids;
        int np;
        if (llama_dl_tokenize(g_dl, g_dl->model_get_vocab(lm), prompts[p], strlen(prompts[p]), true, false,
                              &ids, &np, &e) != 0)
            fail_msg("tokenize: %s", e.msg);
        run ll = {0}, ll_off = {0}, cpu = {0}, cpu2 = {0};
        llama_run(lm, ids, np, cfg->steps, NULL, LLAMA_FLASH_ATTN_TYPE_ENABLED, &ll);
        llama_run(lm, ids, np, cfg->steps, ll.tokens, LLAMA_FLASH_ATTN_TYPE_DISABLED, &ll_off);
        double S = top_diff(&ll, &ll, &ll_off);
        double tol = fmax(TOL_FACTOR * S, TOL_FLOOR);
        float min_gap = INFINITY;
        for (int s = 0; s < ll.steps; s++)
            min_gap = fminf(min_gap, gap_at(&ll, s));

        tg_opts o = tg_opts_default();
        o.threads = 2;
        engine_run(m, &o, ids, np, cfg->steps, ll.tokens, &cpu);
        engine_run(m, &o, ids, np, cfg->steps, ll.tokens, &cpu2);
        double dcpu = top_diff(&ll, &cpu, &ll);
        printf("  p%d: %d prompt tokens, %d steps; llama.cpp FA on vs off S = %.5f -> tolerance %.5f; "
               "smallest llama.cpp gap %.4f\n", p + 1, np, cfg->steps, S, tol, min_gap);
        printf("    cpu tier: largest top-16 logit difference %.5f (%s)\n", dcpu,
               dcpu <= tol ? "within" : "OUTSIDE");
        int miss = argmax_misses("cpu", &ll, &cpu, CPU_GAP_MIN);
        // llama.cpp against itself under the same rule (information only)
        int self_miss = argmax_misses("llama.cpp FA off", &ll, &ll_off, CPU_GAP_MIN);
        printf("    llama.cpp FA off vs on: %d step(s) with another argmax at gap >= %.1f\n", self_miss,
               CPU_GAP_MIN);
        if (dcpu > tol || miss) {
            printf("    FAIL: cpu tier on %s p%d\n", cfg->label, p + 1);
            fails++;
        }
        if (!runs_identical(&cpu, &cpu2)) {
            printf("    FAIL: cpu tier logits differ between two runs with the same settings\n");
            fails++;
        }
        if (cfg->check_threads) {
            run c1 = {0}, cb = {0};
            tg_opts o1 = o;
            o1.threads = 1;
            o1.n_batch = 3;
            engine_run(m, &o1, ids, np, cfg->steps, ll.tokens, &c1);
            o1.threads = 3;
            o1.n_batch = 1;
            engine_run(m, &o1, ids, np, cfg->steps, ll.tokens, &cb);
            int same = runs_identical(&cpu, &c1) && runs_identical(&cpu, &cb);
            printf("    cpu tier threads 2 / 1 / 3 and batch 64 / 3 / 1: %s\n",
                   same ? "byte-identical" : "DIFFERENT");
            if (!same)
                fails++;
            run_free(&c1);
            run_free(&cb);
        }
        if (cfg->ref_steps > 0) {
            run ref = {0}, ref2 = {0}, x64 = {0};
            int rs = cfg->ref_steps;
            tg_opts r = tg_opts_default();
            r.tier = TG_TIER_REF;
            r.threads = 1;
            engine_run(m, &r, ids, np, rs, ll.tokens, &ref);
            r.threads = 4;
            engine_run(m, &r, ids, np, rs, ll.tokens, &ref2);
            r.f64 = 1;
            engine_run(m, &r, ids, np, rs, ll.tokens, &x64);
            run llc = ll, cpuc = cpu, llo = ll_off;
            llc.steps = cpuc.steps = llo.steps = rs;
            double dref = top_diff(&llc, &ref, &llc);
            double dcpu_r = top_diff(&llc, &cpuc, &llc);
            printf("    ref tier (%d steps): largest top-16 logit difference %.5f, ratio to the cpu tier's "
                   "%.3f (cpu %.5f over the same steps)\n", rs, dref, dcpu_r > 0 ? dref / dcpu_r : INFINITY,
                   dcpu_r);
            double xl = top_diff(&llc, &llc, &x64), xlo = top_diff(&llc, &llo, &x64),
                   xc = top_diff(&llc, &cpuc, &x64), xr = top_diff(&llc, &ref, &x64);
            printf("    distance to the f64 ref: llama.cpp FA on %.3g, FA off %.3g, cpu %.3g, ref %.3g: ref %s closest\n", xl,
                   xlo, xc, xr, (xr <= xl && xr <= xc && xr <= xlo) ? "sits" : "does NOT sit");
            int miss_r = argmax_misses("ref", &llc, &ref, REF_GAP_MIN);
            if (miss_r) {
                printf("    FAIL: ref tier argmax on %s p%d\n", cfg->label, p + 1);
                fails++;
            }
            if (!runs_identical(&ref, &ref2)) {
                printf("    FAIL: ref tier logits differ between runs (threads 1 vs 4)\n");
                fails++;
            }
            worst_ref = fmax(worst_ref, dref);
            run_free(&ref);
            run_free(&ref2);
            run_free(&x64);
        }
        worst_cpu = fmax(worst_cpu, dcpu);
        worst_S = fmax(worst_S, S);
        run_free(&ll);
        run_free(&ll_off);
        run_free(&cpu);
        run_free(&cpu2);
        free(ids);
    }
    printf("  %s: S %.5f, cpu worst %.5f, ref worst %.5f\n", cfg->label, worst_S, worst_cpu, worst_ref);
    g_dl->model_free(lm);
    tg_model_free(m);
    if (fails)
        fail_msg("%s: %d acceptance failure(s), see above", cfg->label, fails);
}

/* --- tg-mkmodel files ------------------------------------------------------ */

/* Runs argv; returns its exit status (or -1). */
static int spawn_wait(char *const argv[])
{
    pid_t pid;
    if (posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0)
        return -1;
    int st;
    if (waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Makes (or finds cached) a tg-mkmodel file; path into out. Skips the test
 * when tg-mkmodel is not built. */
static int mkmodel(const char *preset, const char *type, char *out, size_t n)
{
    char tool[4600];
    snprintf(tool, sizeof tool, "%s/bin/tg-mkmodel", g_build);
    if (!file_exists(tool)) {
        printf("tg-mkmodel not built (%s)\n", tool);
        return -1;
    }
    char dir[4500];
    snprintf(dir, sizeof dir, "%s/models", g_cache);
    mkdir(g_cache, 0755);
    mkdir(dir, 0755);
    /* Cache key: the sha256 of the tiny Q4_K_M file this tg-mkmodel writes
     * (made once per run). The bytes depend on the model maker, the
     * quantizers and the vocabulary writer, not on the binary, so every
     * build folder (asan, CI) shares the expensive 0.6b file while any
     * change that moves the bytes makes a new one. */
    static char key[65];
    if (!key[0]) {
        char probe[4600];
        snprintf(probe, sizeof probe, "%.4300s/probe-%d.gguf", dir, (int)getpid());
        char *pargv[] = {tool, "--preset", "tiny", "--type", "q4_k_m", "--seed", "1", "-o", probe, NULL};
        tg_err e;
        if (spawn_wait(pargv) != 0 || tg_sha256_file(probe, key, &e) != 0) {
            unlink(probe);
            key[0] = 0;
            printf("tg-mkmodel --preset tiny --type q4_k_m failed\n");
            return -2;
        }
        char keep[4600];
        snprintf(keep, sizeof keep, "%.4300s/mk-%.16s-tiny-q4_k_m-s1.gguf", dir, key);
        if (rename(probe, keep) != 0) unlink(probe);
    }
    snprintf(out, n, "%.4300s/mk-%.16s-%s-%s-s1.gguf", dir, key, preset, type);
    if (file_exists(out))
        return 0;
    char *argv[] = {tool, "--preset", (char *)preset, "--type", (char *)type, "--seed", "1", "-o", out, NULL};
    int rc = spawn_wait(argv);
    if (rc != 0) {
        printf("tg-mkmodel --preset %s --type %s failed (%d)\n", preset, type, rc);
        return -2;
    }
    return 0;
}

/* The shipped trained model's path into path; skips the test (saying so)
 * when the file is missing. */
static void shipped_model(char *path, size_t n)
{
    snprintf(path, n, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    if (!file_exists(path)) {
        printf("skipped: %s is missing\n", path);
        skip();
    }
}

/* The shipped model, loaded (the test skips when it is missing). */
static tg_model *load_shipped(void)
{
    char path[4200];
    shipped_model(path, sizeof path);
    tg_err e = {{0}};
    tg_model *m;
    if (tg_model_load(&m, path, &e) != 0) fail_msg("load %s: %s", path, e.msg);
    return m;
}

static void test_trained(void **state)
{
    (void)state;
    char path[4200];
    shipped_model(path, sizeof path);
    accept_cfg c = {"trained Q4_K_M", path, 48, 3, 24, 1};
    accept_model(&c);
}

static void accept_mk(const char *preset, const char *type, int steps, int n_prompts, int ref_steps, int thr)
{
    char path[4600];
    int rc = mkmodel(preset, type, path, sizeof path);
    if (rc == -1)
        skip();
    if (rc != 0)
        fail_msg("tg-mkmodel failed for %s %s", preset, type);
    char label[64];
    snprintf(label, sizeof label, "tg-mkmodel %s %s", preset, type);
    accept_cfg c = {label, path, steps, n_prompts, ref_steps, thr};
    accept_model(&c);
}

static void write_variant(const char *src, const char *dst, const char *arch, const char *drop,
                          const char *retype);

/* The trained model's weights as a Llama file (no q/k norms, normal rope):
 * meaningless as a language model, but llama.cpp and the engine must still
 * compute the same function of it. */
static void test_llama_arch(void **state)
{
    (void)state;
    char src[4200], dst[256];
    snprintf(src, sizeof src, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    if (!file_exists(src))
        skip();
    snprintf(dst, sizeof dst, "/tmp/tg-test-llama-%d.gguf", (int)getpid());
    write_variant(src, dst, "llama", NULL, NULL);
    tg_err e;
    tg_model *m;
    assert_int_equal(tg_model_load(&m, dst, &e), 0);
    assert_int_equal(m->hp.arch, TG_ARCH_LLAMA);
    assert_int_equal(m->hp.qk_norm, 0);
    assert_int_equal(m->hp.rope_neox, 0);
    tg_model_free(m);
    accept_cfg c = {"trained weights as llama", dst, 16, 2, 16, 0};
    accept_model(&c);
    unlink(dst);
}

static void test_mk_tiny_f32(void **state) { (void)state; accept_mk("tiny", "f32", 16, 2, 8, 0); }
static void test_mk_tiny_q8_0(void **state) { (void)state; accept_mk("tiny", "q8_0", 16, 2, 8, 0); }
static void test_mk_tiny_q4_k_m(void **state) { (void)state; accept_mk("tiny", "q4_k_m", 16, 2, 8, 1); }
/* The 0.6b shape is heavy (the ref tier most): under AddressSanitizer it
 * runs 4 steps of one prompt without the ref tier. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
static void test_mk_06b_q4_k_m(void **state)
{
    (void)state;
#ifdef SANITIZED
    printf("under AddressSanitizer: 0.6b with 1 prompt, 4 steps, no ref tier\n");
    accept_mk("0.6b", "q4_k_m", 4, 1, 0, 0);
#else
    accept_mk("0.6b", "q4_k_m", 16, 2, 1, 0);
#endif
}

/* --- loader and options ---------------------------------------------------- */

/* Copies a qwen3 model into dst, as arch `arch` ("qwen3" or "llama": the
 * keys renamed, the q/k norms dropped), without tensor `drop`, and with
 * tensor `retype` declared IQ4_NL (a type the engine does not compute
 * with; its bytes truncated to fit). The tokenizer metadata is copied so that
 * llama.cpp can load the result. */
static void write_variant(const char *src, const char *dst, const char *arch, const char *drop, const char *retype)
{
    tg_err e;
    gguf *g;
    assert_int_equal(gguf_open(&g, src, &e), 0);
    gguf_writer *w = gguf_writer_new(32);
    int llama = strcmp(arch, "llama") == 0;
    gguf_writer_str(w, "general.architecture", arch);
    const char *ukeys[] = {"context_length", "embedding_length", "block_count", "feed_forward_length",
                           "attention.head_count", "attention.head_count_kv", "attention.key_length",
                           "attention.value_length"};
    for (size_t i = 0; i < sizeof ukeys / sizeof *ukeys; i++) {
        char from[128], to[128];
        int64_t v;
        snprintf(from, sizeof from, "qwen3.%s", ukeys[i]);
        snprintf(to, sizeof to, "%s.%s", arch, ukeys[i]);
        assert_int_equal(gguf_get_i64(g, from, &v, &e), 0);
        gguf_writer_u32(w, to, (uint32_t)v);
    }
    float f;
    char key[128];
    assert_int_equal(gguf_get_f32(g, "qwen3.rope.freq_base", &f, &e), 0);
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    gguf_writer_f32(w, key, f);
    assert_int_equal(gguf_get_f32(g, "qwen3.attention.layer_norm_rms_epsilon", &f, &e), 0);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    gguf_writer_f32(w, key, f);
    // tokenizer
    const char *skeys[] = {"tokenizer.ggml.model", "tokenizer.ggml.pre"};
    for (int i = 0; i < 2; i++) {
        gguf_str s;
        assert_int_equal(gguf_get_str(g, skeys[i], &s, &e), 0);
        char buf[64];
        snprintf(buf, sizeof buf, "%.*s", (int)s.n, s.p);
        gguf_writer_str(w, skeys[i], buf);
    }
    const char *akeys[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"};
    for (int i = 0; i < 2; i++) {
        enum gguf_vtype et;
        uint64_t n;
        assert_int_equal(gguf_get_arr(g, akeys[i], &et, &n, &e), 0);
        char **v = calloc(n, sizeof *v);
        for (uint64_t k = 0; k < n; k++) {
            gguf_str s;
            assert_int_equal(gguf_arr_str(g, akeys[i], k, &s, &e), 0);
            v[k] = strndup(s.p, s.n);
        }
        gguf_writer_arr_str(w, akeys[i], (const char *const *)v, n);
        for (uint64_t k = 0; k < n; k++)
            free(v[k]);
        free(v);
    }
    {
        enum gguf_vtype et;
        uint64_t n;
        assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &e), 0);
        gguf_writer_arr(w, "tokenizer.ggml.token_type", et, gguf_arr_data(g, "tokenizer.ggml.token_type"), n);
    }
    const char *ikeys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"};
    for (int i = 0; i < 2; i++) {
        uint32_t v;
        if (gguf_get_u32(g, ikeys[i], &v, NULL) == 0)
            gguf_writer_u32(w, ikeys[i], v);
    }
    gguf_writer_bool(w, "tokenizer.ggml.add_bos_token", 0);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (drop && strcmp(t->name, drop) == 0)
            continue;
        if (llama && (strstr(t->name, "attn_q_norm") || strstr(t->name, "attn_k_norm")))
            continue;
        uint32_t type = t->type;
        uint64_t nbytes = t->nbytes;
        if (retype && strcmp(t->name, retype) == 0) {
            type = 20;   /* IQ4_NL: 32 values in 18 bytes */
            nbytes = (t->ne[0] / 32) * 18 * t->ne[1];
            assert_true(nbytes <= t->nbytes);
        }
        assert_int_equal(gguf_writer_tensor(w, t->name, type, t->n_dims, t->ne, t->data, nbytes), 0);
    }
    assert_int_equal(gguf_writer_write(w, dst, &e), 0);
    gguf_writer_free(w);
    gguf_close(g);
}

static void test_load_errors(void **state)
{
    (void)state;
    char src[4200], dst[256];
    snprintf(src, sizeof src, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    if (!file_exists(src))
        skip();
    snprintf(dst, sizeof dst, "/tmp/tg-test-model-%d.gguf", (int)getpid());
    tg_err e = {{0}};
    tg_model *m;

    // a faithful copy loads, tied output
    write_variant(src, dst, "qwen3", NULL, NULL);
    assert_int_equal(tg_model_load(&m, dst, &e), 0);
    assert_true(m->hp.tied);
    assert_ptr_equal(m->output.data, m->token_embd.data);
    assert_int_equal(m->hp.n_layer, 8);
    assert_int_equal(m->hp.n_embd, 256);
    assert_int_equal(m->hp.n_head, 4);
    assert_int_equal(m->hp.n_head_kv, 2);
    assert_int_equal(m->hp.head_dim, 64);
    assert_int_equal(m->hp.n_ff, 768);
    assert_int_equal(m->hp.n_vocab, 8192);
    assert_true(m->hp.rope_base == 1e6f);
    tg_model_free(m);

    // a missing tensor is named
    write_variant(src, dst, "qwen3", "blk.5.attn_k_norm.weight", NULL);
    assert_int_equal(tg_model_load(&m, dst, &e), -1);
    printf("missing tensor: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "blk.5.attn_k_norm.weight"));
    assert_non_null(strstr(e.msg, "missing"));

    // an unsupported type is named with the expectation
    write_variant(src, dst, "qwen3", NULL, "blk.2.ffn_up.weight");
    assert_int_equal(tg_model_load(&m, dst, &e), -1);
    printf("wrong type: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "blk.2.ffn_up.weight"));
    assert_non_null(strstr(e.msg, "iq4_nl (20)"));
    assert_non_null(strstr(e.msg, "expected"));
    unlink(dst);

    // a file that is not a model
    assert_int_equal(tg_model_load(&m, "/nonexistent/x.gguf", &e), -1);
    assert_non_null(strstr(e.msg, "/nonexistent/x.gguf"));
}

static void test_options(void **state)
{
    (void)state;
    tg_opts o = tg_opts_default();
    tg_err e;
    assert_int_equal(tg_opts_parse_perturb(&o, "bf16:ffn_out:3", &e), 0);
    assert_int_equal(o.pert_kind, 1);
    assert_int_equal(o.pert_layer, 3);
    assert_int_equal(o.pert_stage, TG_RS_FFN_OUT);
    assert_int_equal(tg_opts_parse_perturb(&o, "bf16:ffn_outx:3", &e), -1);
    assert_non_null(strstr(e.msg, "ffn_outx"));
    assert_int_equal(tg_opts_parse_perturb(&o, "fp8:ffn_out:3", &e), -1);
    assert_int_equal(tg_opts_parse_perturb(&o, "bf16:ffn_out:3x", &e), -1);
    assert_int_equal(tg_opts_parse_perturb(&o, "bf16:logits:1", &e), -1);
    /* the embedding row is a stage of layer 0 only */
    assert_int_equal(tg_opts_parse_perturb(&o, "scale=1e-3:embd:0", &e), 0);
    assert_int_equal(o.pert_stage, TG_RS_EMBD);
    assert_int_equal(tg_opts_parse_perturb(&o, "bf16:embd:2", &e), -1);
    assert_non_null(strstr(e.msg, "layer must be 0 for stage embd"));
    assert_int_equal(tg_tier_parse("cpu"), TG_TIER_CPU);
    assert_int_equal(tg_tier_parse("gpu"), TG_TIER_GPU);
    assert_int_equal(tg_tier_parse("fast"), -1);
}

/* Threads of this process (entries of /proc/self/task), or -1. */
static int task_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* task_count() once it is at most base: a joined thread of the last
 * session may still be listed for a moment after pthread_join returns (the
 * kernel wakes the joiner before it removes the task), so the count before
 * a session waits for it to leave (up to 2 s, then the count as it is). */
static int task_count_settled(int base)
{
    int n = task_count();
    for (int i = 0; i < 2000 && base > 0 && n > base; i++) {
        usleep(1000);
        n = task_count();
    }
    return n;
}

/* The tier registry and the device strings: every registered tier is
 * reached through its table (its id and name, a session of it evaluates
 * and selects), and the description a session gives is its real
 * configuration: the threads it started (counted in /proc/self/task: a
 * pool of n is the caller plus n - 1 workers; 0 resolves to the online
 * CPUs) and the KV cache type (ref: always f32), the same text before a
 * session exists (tg_tier_device) and through the table's describe. */
static void test_tier_table(void **state)
{
    (void)state;
    tg_model *m = load_shipped();
    tg_err e = {{0}};
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n_registered = 0;
    const int base = task_count();   /* this process's threads before any session */
    for (int id = 0; id < TG_TIER_COUNT; id++) {
        const tg_tier_i *t = tg_tier_find(id);
        if (!t) {
            // only the gpu tier may be missing (a program without the GPU objects)
            assert_int_equal(id, TG_TIER_GPU);
            tg_opts o = tg_opts_default();
            o.tier = id;
            tg_session *s = NULL;
            assert_int_equal(tg_session_new(&s, m, &o, &e), -1);
            assert_non_null(strstr(e.msg, "not part of this build"));
            char buf[192];
            assert_int_equal(tg_tier_device(&o, buf, sizeof buf), -1);
            printf("tier %s: not in this build (%s)\n", tg_tier_name(id), buf);
            continue;
        }
        n_registered++;
        assert_int_equal(t->id, id);
        assert_string_equal(t->name, tg_tier_name(id));
        assert_true(t->describe && t->init && t->free && t->eval && t->n_batch_default > 0);
        if (id == TG_TIER_GPU)
            continue;   // needs a device: tests/gpu/test_gpu_model.c
        const int threads[] = {3, 1, 0};
        for (int i = 0; i < 3; i++)
            for (int kv32 = 0; kv32 < 2; kv32++) {
                tg_opts o = tg_opts_default();
                o.tier = id;
                o.threads = threads[i];
                o.kv_f32 = kv32;
                char before[192], want[64];
                assert_int_equal(tg_tier_device(&o, before, sizeof before), 0);
                const int t0 = task_count_settled(base);
                tg_session *s = NULL;
                assert_int_equal(tg_session_new(&s, m, &o, &e), 0);
                const int started = task_count() - t0;
                const int nth = threads[i] ? threads[i] : (int)online;
                const char *dev = tg_session_device(s);
                printf("tier %s, threads option %d: %d thread(s) started, device \"%s\"\n", t->name, threads[i],
                       started, dev);
                assert_ptr_equal(s->t, t);
                assert_int_equal(tg_session_opts(s)->threads, nth);
                if (t0 > 0)
                    assert_int_equal(started, nth - 1);
                snprintf(want, sizeof want, ", %d thread%s, ", nth, nth == 1 ? "" : "s");
                if (!strstr(dev, want))
                    fail_msg("%s: device \"%s\" does not say \"%s\"", t->name, dev, want);
                const int f32 = id == TG_TIER_REF || kv32;
                assert_int_equal(tg_session_opts(s)->kv_f32, f32);
                assert_non_null(strstr(dev, f32 ? "f32 KV" : "f16 KV"));
                assert_string_equal(before, dev);   // the same description before the session
                char via[192];
                assert_int_equal(t->describe(s, &s->o, via, sizeof via), 0);
                assert_string_equal(via, dev);
                // an eval and a selection through the session reach the tier
                const int32_t toks[] = {10, 200, 3000};
                tg_top top[4];
                char dig[17], host[17];
                assert_int_equal(tg_session_eval(s, toks, 3, &e), 0);
                assert_int_equal(tg_session_top(s, 4, top, dig, &e), 4);
                assert_int_equal(top[0].id, tg_argmax(tg_session_logits(s), m->hp.n_vocab));
                tg_digest_logits(tg_session_logits(s), (size_t)m->hp.n_vocab, host);
                assert_string_equal(dig, host);
                assert_int_equal(tg_session_top_on_device(s), t->top != NULL);
                tg_session_free(s);
            }
    }
    assert_true(n_registered >= 2);
    tg_model_free(m);
}

/* Dumps of one eval as (layer, stage, n, first value, digest of the
 * floats); n counts every dump, the first DUMPLOG_MAX are kept. */
#define DUMPLOG_MAX 128
typedef struct dumplog {
    int n;
    int layer[DUMPLOG_MAX], stage[DUMPLOG_MAX];
    int64_t len[DUMPLOG_MAX];
    float first[DUMPLOG_MAX];
    char dig[DUMPLOG_MAX][17];
} dumplog;

static int log_dump(void *ud, int layer, int stage, const float *x, int64_t n, tg_err *e)
{
    (void)e;
    dumplog *d = ud;
    if (d->n < DUMPLOG_MAX) {
        d->layer[d->n] = layer;
        d->stage[d->n] = stage;
        d->len[d->n] = n;
        d->first[d->n] = x[0];
        tg_digest_logits(x, (size_t)n, d->dig[d->n]);
    }
    d->n++;
    return 0;
}

/* The index of (layer, stage) in d, or fails. */
static int dump_index(const dumplog *d, int layer, int stage)
{
    for (int i = 0; i < d->n && i < DUMPLOG_MAX; i++)
        if (d->layer[i] == layer && d->stage[i] == stage)
            return i;
    fail_msg("no dump of layer %d %s", layer, tg_stage_name(stage));
    return -1;
}

static void test_dumps_perturb_counters(void **state)
{
    (void)state;
    tg_model *m = load_shipped();
    tg_err e = {{0}};
    const int32_t toks[] = {10, 200, 3000, 42, 7};
    for (int tier = TG_TIER_REF; tier <= TG_TIER_CPU; tier++) {
        tg_opts o = tg_opts_default();
        o.tier = tier;
        o.threads = 2;
        tg_session *s, *sp;
        assert_int_equal(tg_session_new(&s, m, &o, &e), 0);
        dumplog d = {0};
        tg_session_set_dump(s, log_dump, &d);
        assert_int_equal(tg_session_eval(s, toks, 5, &e), 0);
        // 8 stages x 8 layers + logits, in forward order, last token only
        assert_int_equal(d.n, 8 * 8 + 1);
        assert_int_equal(d.layer[0], 0);
        assert_int_equal(d.stage[0], TG_STAGE_ATTN_NORM);
        assert_int_equal(d.stage[1], TG_STAGE_Q);
        assert_int_equal(d.len[1], 4 * 64);
        assert_int_equal(d.len[2], 2 * 64);
        assert_int_equal(d.layer[64], -1);
        assert_int_equal(d.stage[64], TG_STAGE_LOGITS);
        assert_int_equal(d.len[64], 8192);
        assert_true(d.first[64] == tg_session_logits(s)[0]);
        // counters: every op per (op, tier)
        tg_ops *ops = tg_session_ops(s);
        assert_int_equal(tg_ops_device(ops), 0);
        assert_true(tg_ops_host(ops) > 0);
        assert_int_equal(tg_ops_ref_hits(ops, tier), 0);
        uint64_t mm = 0;
        for (int t = 0; t < TG_TYPE_COUNT; t++)
            mm += ops->n[TG_OP_MATMUL][t][tier];
        // per layer q, k, v, o, gate, up, down, plus the output (once per
        // batch on cpu, once per eval's last token on ref)
        uint64_t per_tok = 7 * 8;
        assert_true(tier == TG_TIER_REF ? mm == 5 * per_tok + 1 : mm == per_tok + 1);
        assert_int_equal(ops->n[TG_OP_ATTN][0][tier], tier == TG_TIER_REF ? 5 * 8 : 8);

        // the perturbation changes layer 3's residual but not layer 2's
        tg_opts op = o;
        assert_int_equal(tg_opts_parse_perturb(&op, "bf16:ffn_out:3", &e), 0);
        assert_int_equal(tg_session_new(&sp, m, &op, &e), 0);
        dumplog dp = {0};
        tg_session_set_dump(sp, log_dump, &dp);
        assert_int_equal(tg_session_eval(sp, toks, 5, &e), 0);
        assert_int_equal(dp.n, d.n);
        for (int i = 0; i < d.n; i++) {
            if (d.layer[i] >= 0 && d.layer[i] < 3)
                assert_string_equal(d.dig[i], dp.dig[i]);
        }
        const int r3 = dump_index(&d, 3, TG_STAGE_RESIDUAL);
        assert_int_equal(dump_index(&dp, 3, TG_STAGE_RESIDUAL), r3);
        assert_int_equal(d.len[r3], 256);
        assert_string_not_equal(d.dig[r3], dp.dig[r3]);
        assert_true(tg_session_ops(sp)->n[TG_OP_PERTURB][0][tier] > 0);
        tg_session_free(s);
        tg_session_free(sp);
    }
    // bad sessions
    tg_session *s;
    tg_opts o = tg_opts_default();
    o.tier = TG_TIER_GPU;
    assert_int_equal(tg_session_new(&s, m, &o, &e), -1);
    assert_non_null(strstr(e.msg, "gpu"));
    o = tg_opts_default();
    assert_int_equal(tg_opts_parse_perturb(&o, "bf16:ffn_out:8", &e), 0);
    assert_int_equal(tg_session_new(&s, m, &o, &e), -1);
    o = tg_opts_default();
    o.n_ctx = 4;
    o.threads = 1;
    assert_int_equal(tg_session_new(&s, m, &o, &e), 0);
    assert_int_equal(tg_session_eval(s, toks, 5, &e), -1);
    assert_non_null(strstr(e.msg, "n_ctx"));
    int32_t bad = 8192;
    assert_int_equal(tg_session_eval(s, &bad, 1, &e), -1);
    assert_non_null(strstr(e.msg, "out of range"));
    assert_int_equal(tg_session_pos(s), 0);
    tg_session_free(s);
    tg_session_free(NULL);
    tg_model_free(NULL);
    tg_model_free(m);
}

/* --- the ref tier's dot product and batches -------------------------------- */

/* The ref tier's dot order written as the plain loop it replaced: eight
 * running sums, a fixed tree, the tail in order (the reference for the
 * vector code of forward_ref.c). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static double dot_scalar(const float *w, const double *x, int64_t n)
{
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
    const int64_t n8 = n & ~(int64_t)7;
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n8; j += 8)
        for (int k = 0; k < 8; k++)
            a[k] += (double)w[j + k] * x[j + k];
    double sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (int64_t j = n8; j < n; j++)
        sum += (double)w[j] * x[j];
    return sum;
}

static uint64_t g_rng;

static uint64_t rng_next(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* A random value with a random sign and an exponent in [-20, 20]: sums of
 * such terms round differently in different orders. */
static double rng_val(void)
{
    uint64_t r = rng_next();
    double m = 1.0 + (double)(r >> 11) / 9007199254740992.0;
    return ldexp(r & 1 ? -m : m, (int)((r >> 1) % 41) - 20);
}

static void rng_seed(const char *what)
{
    static uint64_t calls;
    g_rng = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid() << 32 ^ ++calls * 0x9E3779B97F4A7C15u;
    if (!g_rng)
        g_rng = 1;
    printf("%s: random seed %llu\n", what, (unsigned long long)g_rng);
}

/* Sums w x over [0, n) with the kernels of forward_ref.h, the eight sums kept
 * in acc across random blocks of multiples of 8 (one_call: tg_ref_dot). */
static double dot_blocks(const float *w, const double *wd, const double *x, int64_t n, int f64, int one_call)
{
    if (one_call)
        return tg_ref_dot(w, x, n);
    const int64_t n8 = n & ~(int64_t)7;
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n8;) {
        int64_t b = 8 * (int64_t)(1 + rng_next() % 40);
        if (b > n8 - j)
            b = n8 - j;
        if (f64)
            tg_ref_acc_f64(wd + j, x + j, b, acc);
        else
            tg_ref_acc(w + j, x + j, b, acc);
        j += b;
    }
    return tg_ref_acc_sum(acc, w + n8, x + n8, n - n8);
}

static void test_ref_dot(void **state)
{
    (void)state;
    rng_seed("ref dot");
    enum { NMAX = 1000 };
    float *w = malloc(4 * NMAX * sizeof(float));
    double *wd = malloc(NMAX * sizeof(double)), *x = malloc(4 * NMAX * sizeof(double));
    assert_non_null(w);
    assert_non_null(wd);
    assert_non_null(x);
    int order_matters = 0;
    for (int n = 0; n <= NMAX; n++) {
        for (int j = 0; j < 4 * n; j++) {
            w[j] = (float)rng_val();
            x[j] = rng_val();
        }
        for (int j = 0; j < n; j++)
            wd[j] = w[j];
        const int64_t n8 = n & ~7;
        // one row against one vector: in one call, in blocks, f32 and f64 rows
        const double want = dot_scalar(w, x, n);
        for (int k = 0; k < 3; k++) {
            double got = dot_blocks(w, wd, x, n, k == 2, k == 0);
            if (memcmp(&got, &want, sizeof got))
                fail_msg("n %d: %s gives %.17g, the scalar order %.17g", n,
                         k == 0 ? "tg_ref_dot" : k == 1 ? "tg_ref_acc in blocks" : "tg_ref_acc_f64 in blocks",
                         got, want);
        }
        // four rows (w + r*n) against x; one row wd against four vectors (x + t*n)
        double a4r[32] = {0}, a4t[32] = {0};
        tg_ref_acc4_rows(w, n, x, n8, a4r);
        tg_ref_acc4_tok(wd, x, n, n8, a4t);
        for (int k = 0; k < 4; k++) {
            double wr = dot_scalar(w + (size_t)k * n, x, n), wt = dot_scalar(w, x + (size_t)k * n, n);
            double gr = tg_ref_acc_sum(a4r + 8 * k, w + (size_t)k * n + n8, x + n8, n - n8);
            double gt = tg_ref_acc_sum(a4t + 8 * k, w + n8, x + (size_t)k * n + n8, n - n8);
            if (memcmp(&gr, &wr, sizeof wr) || memcmp(&gt, &wt, sizeof wt))
                fail_msg("n %d, %d: acc4_rows %.17g (scalar %.17g), acc4_tok %.17g (scalar %.17g)", n, k, gr, wr, gt,
                         wt);
        }
        // the inputs are such that another order gives other bytes
        double seq = 0;
        for (int j = 0; j < n; j++)
            seq += (double)w[j] * x[j];
        order_matters += seq != want;
    }
    printf("ref dot: lengths 0..%d bit-identical to the scalar order; a sequential sum differs at %d of them\n",
           NMAX, order_matters);
    assert_true(order_matters > NMAX / 2);
    free(w);
    free(wd);
    free(x);
}

/* One matmul of the ref tier against the scalar order over the type's
 * reference to_float, every output (rounded to f32 as the tier does unless
 * the session has the f64 option). */
static void check_matmul(tg_session *s, const tg_weight *w, int n, int f64, const char *what)
{
    const int64_t cols = w->cols, rows = w->rows;
    double *x = malloc(sizeof(double) * (size_t)n * cols), *out = malloc(sizeof(double) * (size_t)n * rows);
    float *row = malloc(sizeof(float) * (size_t)cols);
    assert_non_null(x);
    assert_non_null(out);
    assert_non_null(row);
    for (int64_t j = 0; j < n * cols; j++)
        x[j] = (double)(float)rng_val();
    tg_ref_matmul(s, out, w, x, n);
    for (int64_t i = 0; i < rows; i++) {
        tg_traits(w->type)->to_float((const char *)w->data + (size_t)i * w->row_size, row, cols);
        for (int t = 0; t < n; t++) {
            double want = dot_scalar(row, x + (size_t)t * cols, cols);
            if (!f64)
                want = (double)(float)want;
            if (memcmp(&want, &out[(size_t)t * rows + i], sizeof want) != 0)
                fail_msg("%s, %d vector(s): row %lld, vector %d: %.17g, the scalar order gives %.17g", what, n,
                         (long long)i, t, out[(size_t)t * rows + i], want);
        }
    }
    free(x);
    free(out);
    free(row);
}

/* The ref tier's matmul (blocks of columns, rows and tokens in groups of
 * four, threads) against the scalar order, on the shipped model's weights
 * and on F32 weights whose widths leave partial blocks and tails. */
static void test_ref_matmul(void **state)
{
    (void)state;
    tg_model *m = load_shipped();
    tg_err e = {{0}};
    rng_seed("ref matmul");
    // F32 weights of 37 rows: 1003 columns (a tail of 3), 2051 (blocks of 512, a tail of 3)
    enum { FR = 37 };
    float *fw = malloc(sizeof(float) * FR * 2051);
    assert_non_null(fw);
    for (int j = 0; j < FR * 2051; j++)
        fw[j] = (float)rng_val();
    tg_weight f1 = {fw, TG_TYPE_F32, 1003, FR, 1003 * sizeof(float), "f32 x 1003"};
    tg_weight f2 = {fw, TG_TYPE_F32, 2051, FR, 2051 * sizeof(float), "f32 x 2051"};
    // q4_K and q6_K (768 columns: a partial block of 512), the q6_K output
    const tg_weight *ws[] = {&m->layers[1].wq, &m->layers[0].wv, &m->layers[0].down, &m->output, &f1, &f2};
    const int ns[] = {1, 2, 3, 4, 5, 9, 32};
    // the f64 option leaves the sums unrounded: any other order would show
    for (int c = 0; c < 3; c++) {
        const int thr = c == 0 ? 1 : c == 1 ? 3 : 2, f64 = c < 2;
        tg_opts o = tg_opts_default();
        o.tier = TG_TIER_REF;
        o.threads = thr;
        o.f64 = f64;
        o.n_ctx = 16;
        tg_session *s;
        if (tg_session_new(&s, m, &o, &e) != 0)
            fail_msg("tg_session_new: %s", e.msg);
        for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++)
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
                if (ws[k] == &m->output && ns[j] > 4)
                    continue;   /* 8192 rows: a few vector counts suffice */
                char what[128];
                snprintf(what, sizeof what, "%s (%s, %lld x %lld), %d thread(s)%s", ws[k]->name,
                         tg_type_name(ws[k]->type), (long long)ws[k]->rows, (long long)ws[k]->cols, thr,
                         f64 ? ", f64" : "");
                check_matmul(s, ws[k], ns[j], f64, what);
            }
        tg_session_free(s);
    }
    printf("ref matmul: q4_K, q6_K and two F32 widths, 1..32 vectors, 1, 2 and 3 threads, f64 and f32: "
           "bit-identical to the scalar order\n");
    free(fw);
    tg_model_free(m);
}

/* A random finite half (zero and subnormals included), random sign. */
static tg_half rng_half(void)
{
    return (tg_half)((rng_next() & 0x8000) | rng_next() % 0x7C00);
}

/* The plain formula of one value of a Q4_K or Q6_K block (docs/formats.md), one
 * element at a time. */
static float kquant_value(uint32_t type, const void *blocks, int idx)
{
    const int b = idx / QK_K, e = idx % QK_K;
    if (type == TG_TYPE_Q4_K) {
        const block_q4_K *x = (const block_q4_K *)blocks + b;
        const int g = e / 64, hi = (e % 64) / 32, l = e % 32;
        uint8_t sc, m;
        tg_get_scale_min_k4(2 * g + hi, x->scales, &sc, &m);
        const float dl = tg_half_to_f32(x->d) * sc, ml = tg_half_to_f32(x->dmin) * m;
        const int q = hi ? x->qs[32 * g + l] >> 4 : x->qs[32 * g + l] & 15;
        return dl * q - ml;
    }
    const block_q6_K *x = (const block_q6_K *)blocks + b;
    const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const uint8_t ql = x->ql[64 * h + l + (quarter & 1) * 32], qh = x->qh[32 * h + l];
    const int lo = quarter < 2 ? ql & 15 : ql >> 4;
    const int q = (lo | (((qh >> (2 * quarter)) & 3) << 4)) - 32;
    return tg_half_to_f32(x->d) * x->scales[e / 16] * q;
}

/* The Q4_K / Q6_K to_float (vectorized by the compiler; the ref tier's hot
 * loop) against the plain formula, value by value: bit-identical on fresh
 * random blocks. */
static void test_kquant_to_float(void **state)
{
    (void)state;
    rng_seed("ref to_float");
    enum { NB = 64, N = NB * QK_K };
    float *got = malloc(N * sizeof(float));
    block_q4_K *b4 = malloc(NB * sizeof *b4);
    block_q6_K *b6 = malloc(NB * sizeof *b6);
    assert_non_null(got);
    assert_non_null(b4);
    assert_non_null(b6);
    for (int round = 0; round < 20; round++) {
        uint8_t *p = (uint8_t *)b4;
        for (size_t i = 0; i < NB * sizeof *b4; i++)
            p[i] = (uint8_t)rng_next();
        p = (uint8_t *)b6;
        for (size_t i = 0; i < NB * sizeof *b6; i++)
            p[i] = (uint8_t)rng_next();
        for (int i = 0; i < NB; i++) {
            b4[i].d = rng_half();
            b4[i].dmin = rng_half();
            b6[i].d = rng_half();
        }
        const struct { uint32_t type; const void *x; } c[] = {{TG_TYPE_Q4_K, b4}, {TG_TYPE_Q6_K, b6}};
        for (int k = 0; k < 2; k++) {
            // whole rows and a one-block row
            for (int n = QK_K; n <= N; n += N - QK_K) {
                tg_traits(c[k].type)->to_float(c[k].x, got, n);
                for (int i = 0; i < n; i++) {
                    const float want = kquant_value(c[k].type, c[k].x, i);
                    if (memcmp(&want, &got[i], sizeof(float)) != 0)
                        fail_msg("%s value %d (block %d): to_float %.9g, the formula %.9g",
                                 tg_type_name(c[k].type), i, i / QK_K, got[i], want);
                }
            }
        }
    }
    printf("to_float: q4_K and q6_K bit-identical to the plain formula on %d random blocks each\n", 20 * NB);
    free(got);
    free(b4);
    free(b6);
}


static void assert_dumps_equal(const dumplog *a, const dumplog *b, const char *what)
{
    if (a->n != b->n)
        fail_msg("%s: %d dumps against %d", what, a->n, b->n);
    for (int i = 0; i < a->n && i < DUMPLOG_MAX; i++)
        if (a->layer[i] != b->layer[i] || a->stage[i] != b->stage[i] || a->len[i] != b->len[i] ||
            strcmp(a->dig[i], b->dig[i]) != 0)
            fail_msg("%s: dump %d differs (layer %d %s: %s against layer %d %s: %s)", what, i, a->layer[i],
                     tg_stage_name(a->stage[i]), a->dig[i], b->layer[i], tg_stage_name(b->stage[i]), b->dig[i]);
}

/* Fails unless the n_vocab logits a and b are the same bytes. */
static void assert_logits_equal(const float *a, const float *b, int n_vocab, const char *what, int row)
{
    if (memcmp(a, b, (size_t)n_vocab * sizeof(float)) == 0)
        return;
    int i = 0;
    while (memcmp(&a[i], &b[i], sizeof(float)) == 0)
        i++;
    fail_msg("%s, row %d: logit %d is %.9g against %.9g one token at a time", what, row, i, a[i], b[i]);
}

#define BATCH_NP 5     /* prompt tokens */
#define BATCH_NF 70    /* forced tokens: crosses the ref tier's internal batch of 32 and n_batch 64 */

/* tg_session_eval_all against one token at a time: the logits of every row
 * and the last token's dumps, ref (threads 1 and 3, n_batch 64 and 100) and
 * cpu; a prompt in one eval against token by token; its op counts and
 * errors. */
static void test_eval_all(void **state)
{
    (void)state;
    tg_model *m = load_shipped();
    tg_err e = {{0}};
    const int V = m->hp.n_vocab;
    rng_seed("eval_all");
    int32_t toks[BATCH_NP + BATCH_NF];
    for (int i = 0; i < BATCH_NP + BATCH_NF; i++)
        toks[i] = (int32_t)(rng_next() % (uint64_t)V);
    const int32_t *prompt = toks, *force = toks + BATCH_NP;
    float *step = malloc(sizeof(float) * (size_t)(BATCH_NF + 1) * V);
    float *all = malloc(sizeof(float) * (size_t)BATCH_NF * V);
    assert_non_null(step);
    assert_non_null(all);

    const struct { enum tg_tier tier; int threads, n_batch; } cfg[] = {
        {TG_TIER_REF, 1, 0}, {TG_TIER_REF, 3, 100}, {TG_TIER_CPU, 2, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        char what[96];
        snprintf(what, sizeof what, "%s tier, %d thread(s), n_batch %d", tg_tier_name(cfg[c].tier),
                 cfg[c].threads, cfg[c].n_batch);
        tg_opts o = tg_opts_default();
        o.tier = cfg[c].tier;
        o.threads = cfg[c].threads;
        o.n_batch = cfg[c].n_batch;
        o.n_ctx = 128;
        tg_session *s1, *s2;
        if (tg_session_new(&s1, m, &o, &e) != 0 || tg_session_new(&s2, m, &o, &e) != 0)
            fail_msg("%s: tg_session_new: %s", what, e.msg);

        // one token at a time (the prompt in one eval); dumps of the last token
        dumplog d1 = {0}, d2 = {0};
        assert_int_equal(tg_session_eval(s1, prompt, BATCH_NP, &e), 0);
        memcpy(step, tg_session_logits(s1), sizeof(float) * V);
        for (int i = 0; i < BATCH_NF; i++) {
            if (i == BATCH_NF - 1)
                tg_session_set_dump(s1, log_dump, &d1);
            assert_int_equal(tg_session_eval(s1, &force[i], 1, &e), 0);
            memcpy(step + (size_t)(i + 1) * V, tg_session_logits(s1), sizeof(float) * V);
        }

        // the forced tokens in one eval_all
        assert_int_equal(tg_session_eval(s2, prompt, BATCH_NP, &e), 0);
        assert_logits_equal(tg_session_logits(s2), step, V, what, 0);
        tg_ops_clear(tg_session_ops(s2));
        tg_session_set_dump(s2, log_dump, &d2);
        if (tg_session_eval_all(s2, force, BATCH_NF, all, &e) != 0)
            fail_msg("%s: eval_all: %s", what, e.msg);
        for (int i = 0; i < BATCH_NF; i++)
            assert_logits_equal(all + (size_t)i * V, step + (size_t)(i + 1) * V, V, what, i + 1);
        assert_logits_equal(tg_session_logits(s2), step + (size_t)BATCH_NF * V, V, what, BATCH_NF);
        assert_int_equal(tg_session_pos(s2), BATCH_NP + BATCH_NF);
        assert_int_equal(d1.n, 8 * 8 + 1);
        assert_dumps_equal(&d2, &d1, what);
        if (cfg[c].tier == TG_TIER_REF) {
            // counted per token: 7 matmuls a layer, and the output of every token
            uint64_t mm = 0;
            for (int t = 0; t < TG_TYPE_COUNT; t++)
                mm += tg_session_ops(s2)->n[TG_OP_MATMUL][t][TG_TIER_REF];
            assert_int_equal(mm, (uint64_t)BATCH_NF * (7 * 8 + 1));
        }

        // errors leave the session as it was
        int32_t bad[3] = {1, V, 2};
        tg_session_set_dump(s2, NULL, NULL);
        assert_int_equal(tg_session_eval_all(s2, bad, 3, all, &e), -1);
        assert_non_null(strstr(e.msg, "out of range"));
        assert_int_equal(tg_session_eval_all(s2, force, 0, all, &e), -1);
        assert_int_equal(tg_session_eval_all(s2, force, 128 - BATCH_NP - BATCH_NF + 1, all, &e), -1);
        assert_non_null(strstr(e.msg, "n_ctx"));
        assert_int_equal(tg_session_pos(s2), BATCH_NP + BATCH_NF);

        // the whole sequence as one prompt, and the prompt token by token
        dumplog d3 = {0};
        tg_session_reset(s2);
        tg_session_set_dump(s2, log_dump, &d3);
        assert_int_equal(tg_session_eval(s2, toks, BATCH_NP + BATCH_NF, &e), 0);
        assert_logits_equal(tg_session_logits(s2), step + (size_t)BATCH_NF * V, V, what, BATCH_NF);
        assert_dumps_equal(&d3, &d1, what);
        tg_session_set_dump(s2, NULL, NULL);
        tg_session_reset(s2);
        for (int i = 0; i < BATCH_NP; i++)
            assert_int_equal(tg_session_eval(s2, &prompt[i], 1, &e), 0);
        assert_logits_equal(tg_session_logits(s2), step, V, what, 0);
        printf("%s: eval_all of %d tokens and a prompt of %d == one token at a time, logits and dumps\n",
               what, BATCH_NF, BATCH_NP + BATCH_NF);
        tg_session_free(s1);
        tg_session_free(s2);
    }
    free(step);
    free(all);
    tg_model_free(m);
}

/* Runs `tg-engine --tier ref` on the request lines `req` (through files in
 * /tmp) and returns its stdout, malloc'ed, or NULL when it cannot run. */
static char *engine_talk(const char *req)
{
    char bin[4600], in[128], out[128];
    snprintf(bin, sizeof bin, "%s/bin/tg-engine", g_build);
    if (!file_exists(bin)) {
        printf("tg-engine not built (%s)\n", bin);
        return NULL;
    }
    snprintf(in, sizeof in, "/tmp/tg-test-model-%d.in", (int)getpid());
    snprintf(out, sizeof out, "/tmp/tg-test-model-%d.out", (int)getpid());
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    fputs(req, f);
    fclose(f);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, in, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char *argv[] = {bin, "--tier", "ref", NULL};
    pid_t pid;
    int st = -1;
    if (posix_spawn(&pid, bin, &fa, NULL, argv, environ) == 0)
        waitpid(pid, &st, 0);
    posix_spawn_file_actions_destroy(&fa);
    unlink(in);
    f = fopen(out, "r");
    char *text = NULL;
    size_t len = 0;
    if (f) {
        FILE *m = open_memstream(&text, &len);
        char buf[65536];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0)
            fwrite(buf, 1, k, m);
        fclose(m);
        fclose(f);
    }
    unlink(out);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        fail_msg("tg-engine --tier ref exited with status %d; its output:\n%s", st, text ? text : "");
    return text;
}

/* The step lines of the decode number `which` (0-based) in out, as
 * malloc'ed strings into lines[0..max); their count. */
static int step_lines(const char *out, int which, char **lines, int max)
{
    int n = 0, dec = 0;
    for (const char *p = out; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (strncmp(p, "{\"step\":", 8) == 0 && dec == which && n < max)
            lines[n++] = strndup(p, len);
        else if (strstr(p, "\"done\":true") && strstr(p, "\"done\":true") < p + len)
            dec++;
        p += len + (nl ? 1 : 0);
    }
    return n;
}

#define PROTO_STEPS 40   /* more than the ref tier's internal batch of 32 */

/* tg-engine --tier ref: a forced decode along the tokens of a greedy one
 * gives the greedy decode's step lines (token, top, digest) byte for byte,
 * with steps-1 and with steps forced ids, at 1 and 3 threads (the harness's
 * LEGS_IDENTICAL rests on it). */
static void test_engine_forced_lines(void **state)
{
    (void)state;
    char path[4200];
    shipped_model(path, sizeof path);
    json_t *jp = json_pack("[iiiii]", 785, 6722, 315, 12, 4000);
    char *prompt = json_dumps(jp, JSON_COMPACT);
    json_t *jpath = json_string(path);
    char *pq = json_dumps(jpath, JSON_ENCODE_ANY);
    json_decref(jpath);
    char req[16384];
    snprintf(req, sizeof req,
             "{\"op\":\"hello\"}\n{\"op\":\"load\",\"model\":%s,\"options\":{\"n_ctx\":128,\"threads\":1}}\n"
             "{\"op\":\"decode\",\"prompt\":%s,\"steps\":%d,\"top_k\":8}\n{\"op\":\"bye\"}\n",
             pq, prompt, PROTO_STEPS);
    char *out = engine_talk(req);
    if (!out)
        skip();
    char *greedy[PROTO_STEPS], *forced[PROTO_STEPS];
    assert_int_equal(step_lines(out, 0, greedy, PROTO_STEPS), PROTO_STEPS);
    free(out);

    // the greedy tokens appended after steps 0..steps-2 (each line's
    // "token"); with steps ids, one more that is never appended
    json_t *force = json_array();
    for (int i = 0; i < PROTO_STEPS - 1; i++) {
        json_t *l = json_loads(greedy[i], 0, NULL);
        assert_non_null(l);
        json_array_append(force, json_object_get(l, "token"));
        json_decref(l);
    }
    char *f_less = json_dumps(force, JSON_COMPACT);
    json_array_append_new(force, json_integer(7));
    char *f_all = json_dumps(force, JSON_COMPACT);
    snprintf(req, sizeof req,
             "{\"op\":\"hello\"}\n{\"op\":\"load\",\"model\":%s,\"options\":{\"n_ctx\":128,\"threads\":1}}\n"
             "{\"op\":\"decode\",\"prompt\":%s,\"steps\":%d,\"top_k\":8,\"force\":%s}\n"
             "{\"op\":\"load\",\"model\":%s,\"options\":{\"n_ctx\":128,\"threads\":3}}\n"
             "{\"op\":\"decode\",\"prompt\":%s,\"steps\":%d,\"top_k\":8,\"force\":%s}\n{\"op\":\"bye\"}\n",
             pq, prompt, PROTO_STEPS, f_less, pq, prompt, PROTO_STEPS, f_all);
    out = engine_talk(req);
    assert_non_null(out);
    for (int d = 0; d < 2; d++) {
        int n = step_lines(out, d, forced, PROTO_STEPS);
        if (n != PROTO_STEPS)
            fail_msg("forced decode %d: %d step lines, expected %d; output:\n%s", d, n, PROTO_STEPS, out);
        for (int i = 0; i < PROTO_STEPS; i++) {
            if (strcmp(forced[i], greedy[i]) != 0)
                fail_msg("forced decode %d (%s ids, %d threads), step %d:\n  %s\nthe greedy decode:\n  %s", d,
                         d ? "steps" : "steps-1", d ? 3 : 1, i, forced[i], greedy[i]);
            free(forced[i]);
        }
    }
    printf("tg-engine --tier ref: %d forced steps (1 and 3 threads) == the greedy decode's lines\n", PROTO_STEPS);
    for (int i = 0; i < PROTO_STEPS; i++)
        free(greedy[i]);
    free(out);
    free(f_all);
    free(f_less);
    free(prompt);
    free(pq);
    json_decref(jp);
    json_decref(force);
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(g_root, sizeof g_root, "%s", env_or("TG_ROOT", "."));
    snprintf(g_build, sizeof g_build, "%s", env_or("TG_BUILD", "build"));
    char dflt[4200];
    snprintf(dflt, sizeof dflt, "%s/.cache", g_root);
    snprintf(g_cache, sizeof g_cache, "%s", env_or("TG_CACHE", dflt));
    char lib[4600];
    snprintf(lib, sizeof lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", g_cache);
    tg_err e = {{0}};
    if (!file_exists(lib) || llama_dl_open(lib, &g_dl, &e) != 0) {
        printf("llama.cpp oracle not available (%s): %s\n", lib, e.msg);
        g_dl = NULL;
    } else {
        llama_dl_set_log_echo(g_dl, false);
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    llama_dl_free(g_dl);
    return 0;
}

/* Acceptance tests need the oracle. */
#define NEEDS_ORACLE(fn)                                                                                \
    static void fn##_o(void **state)                                                                    \
    {                                                                                                   \
        if (!g_dl) {                                                                                    \
            printf("skipped: the llama.cpp oracle library is missing (run make fetch)\n");             \
            skip();                                                                                     \
        }                                                                                               \
        fn(state);                                                                                      \
    }
NEEDS_ORACLE(test_trained)
NEEDS_ORACLE(test_llama_arch)
NEEDS_ORACLE(test_mk_tiny_f32)
NEEDS_ORACLE(test_mk_tiny_q8_0)
NEEDS_ORACLE(test_mk_tiny_q4_k_m)
NEEDS_ORACLE(test_mk_06b_q4_k_m)

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    // TG_TEST_FILTER: run only the tests whose names match (cmocka pattern)
    const char *filter = getenv("TG_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    const char *skipf = getenv("TG_TEST_SKIP");   /* and skip those matching this */
    if (skipf && *skipf)
        cmocka_set_skip_filter(skipf);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_tier_table),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_dumps_perturb_counters),
        cmocka_unit_test(test_ref_dot),
        cmocka_unit_test(test_ref_matmul),
        cmocka_unit_test(test_kquant_to_float),
        cmocka_unit_test(test_eval_all),
        cmocka_unit_test(test_engine_forced_lines),
        cmocka_unit_test(test_trained_o),
        cmocka_unit_test(test_llama_arch_o),
        cmocka_unit_test(test_mk_tiny_f32_o),
        cmocka_unit_test(test_mk_tiny_q8_0_o),
        cmocka_unit_test(test_mk_tiny_q4_k_m_o),
        cmocka_unit_test(test_mk_06b_q4_k_m_o),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
