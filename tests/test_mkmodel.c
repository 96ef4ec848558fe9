/*
 * test_mkmodel.c: tg-mkmodel (engine/tools/tg-mkmodel.c), run as a process.
 *
 * Generates tiny Qwen3 files of every type into a temporary folder, checks
 * that the same seed gives the same bytes (and another seed other bytes),
 * reopens them with our reader to check hyperparameters, vocabulary and the
 * per-tensor types (the Q4_K_M mixture against docs/formats.md's recipe and
 * against the llama.cpp-quantized model the project ships), checks that
 * every type encodes the same seeded weights at the intended scales, and
 * loads the Q4_K_M file in the prebuilt libllama: hyperparameters, vocab
 * size and a greedy decode with finite, realistically scaled logits.
 *
 * Needs: $TG_BUILD/bin/tg-mkmodel, the npm tokenizer.json under $TG_CACHE,
 * and for the llama.cpp checks the npm linux-x64 libllama; a missing piece
 * skips the tests that need it, saying which.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "llama/llama_dl.h"
#include "quant.h"
#include "util.h"

extern char **environ;

#define N_VOCAB 151936
#define RUN_TIMEOUT_S 300
/* The Q4_K_M test file: the tiny preset with 8 layers, so the recipe's
 * layer rule has the same shape as in the shipped 8-layer model. */
#define Q4_LAYERS 8

typedef struct ctx {
    char dir[64];
    char bin[4200];
    char tok[4200];
    char lib[4200];
    char root[4096];
    int have_bin, have_tok;
    char made[16][64];     /* generated file names (memo) */
    int n_made;
} ctx;

static ctx C;

static int exists(const char *p) { return access(p, R_OK) == 0; }

static int setup(void **state)
{
    const char *build = getenv("TG_BUILD"), *cache = getenv("TG_CACHE"), *root = getenv("TG_ROOT");
    snprintf(C.root, sizeof C.root, "%.4000s", root ? root : ".");
    snprintf(C.bin, sizeof C.bin, "%.4000s/bin/tg-mkmodel", build ? build : "build");
    if (cache) snprintf(C.tok, sizeof C.tok, "%.4000s/npm/tokenizer-qwen3/models/tokenizer.json", cache);
    else snprintf(C.tok, sizeof C.tok, "%.4000s/.cache/npm/tokenizer-qwen3/models/tokenizer.json", C.root);
    if (cache) snprintf(C.lib, sizeof C.lib, "%.4000s/npm/linux-x64/bins/linux-x64/libllama.so", cache);
    else snprintf(C.lib, sizeof C.lib, "%.4000s/.cache/npm/linux-x64/bins/linux-x64/libllama.so", C.root);
    C.have_bin = access(C.bin, X_OK) == 0;
    C.have_tok = exists(C.tok);
    snprintf(C.dir, sizeof C.dir, "/tmp/tg-mkmodel-test-XXXXXX");
    if (!mkdtemp(C.dir)) return -1;
    return 0;
}

static int teardown(void **state)
{
    char p[256];
    for (int i = 0; i < C.n_made; i++) {
        snprintf(p, sizeof p, "%s/%s", C.dir, C.made[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/stderr.txt", C.dir);
    unlink(p);
    rmdir(C.dir);
    return 0;
}

static void need_tool(void)
{
    if (!C.have_bin) {
        fprintf(stderr, "skip: %s not built (set TG_BUILD)\n", C.bin);
        skip();
    }
    if (!C.have_tok) {
        fprintf(stderr, "skip: %s missing (make fetch; set TG_CACHE)\n", C.tok);
        skip();
    }
}

/* Runs tg-mkmodel with args (NULL-terminated) and the default tokenizer
 * given explicitly; stderr goes to err (NUL-terminated). Returns the exit
 * status, or -1 when it died or ran past RUN_TIMEOUT_S (then killed). */
static int run_tool(const char *const *args, int with_tok, char *err, size_t errn)
{
    const char *argv[40];
    int n = 0;
    argv[n++] = C.bin;
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    if (with_tok) {
        argv[n++] = "--tokenizer";
        argv[n++] = C.tok;
    }
    argv[n] = NULL;
    char errpath[128];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", C.dir);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, C.bin, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) fail_msg("cannot start %s: %s", C.bin, strerror(rc));
    int status = 0;
    double t0 = tg_now();
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) fail_msg("waitpid: %s", strerror(errno));
        if (tg_now() - t0 > RUN_TIMEOUT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            snprintf(err, errn, "timed out after %d s", RUN_TIMEOUT_S);
            return -1;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    err[0] = 0;
    FILE *f = fopen(errpath, "r");
    if (f) {
        size_t k = fread(err, 1, errn - 1, f);
        err[k] = 0;
        fclose(f);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Path of a generated file, made on first use: file name fname from args. */
static const char *make_file(const char *fname, const char *const *args)
{
    static char path[16][256];
    int slot = -1;
    for (int i = 0; i < C.n_made; i++)
        if (!strcmp(C.made[i], fname)) slot = i;
    if (slot < 0) {
        assert_true(C.n_made < 16);
        slot = C.n_made;
        snprintf(path[slot], sizeof path[slot], "%s/%s", C.dir, fname);
        const char *a[32];
        int n = 0;
        for (int i = 0; args[i]; i++) a[n++] = args[i];
        a[n++] = "-o";
        a[n++] = path[slot];
        a[n] = NULL;
        char err[4096];
        int rc = run_tool(a, 1, err, sizeof err);
        if (rc != 0) fail_msg("tg-mkmodel for %s exited %d: %s", fname, rc, err);
        snprintf(C.made[C.n_made++], sizeof C.made[0], "%s", fname);
    }
    return path[slot];
}

static const char *file_of(const char *type)
{
    if (!strcmp(type, "q4_k_m")) {
        const char *a[] = {"--preset", "tiny", "--type", "q4_k_m", "--seed", "1", "--n-layer", "8", NULL};
        return make_file("tiny-q4_k_m.gguf", a);
    }
    char fname[64];
    snprintf(fname, sizeof fname, "tiny-%s.gguf", type);
    const char *a[] = {"--preset", "tiny", "--type", type, "--seed", "1", NULL};
    return make_file(fname, a);
}

static gguf *open_ok(const char *path)
{
    gguf *g;
    tg_err e;
    if (gguf_open(&g, path, &e)) fail_msg("our reader refused %s: %s", path, e.msg);
    return g;
}

static uint32_t u32_of(const gguf *g, const char *key)
{
    uint32_t v;
    tg_err e;
    if (gguf_get_u32(g, key, &v, &e)) fail_msg("%s", e.msg);
    return v;
}

/* ------------------------------------------------------------------ tests */

static void cli_errors_are_clear(void **state)
{
    need_tool();
    char err[4096];
    const char *a1[] = {"--preset", "huge", "--type", "f32", "-o", "/tmp/x.gguf", NULL};
    assert_int_equal(run_tool(a1, 1, err, sizeof err), 2);
    assert_non_null(strstr(err, "--preset: expected tiny, 0.6b or 8b, got 'huge'"));
    const char *a2[] = {"--preset", "tiny", "--type", "q3_k", "-o", "/tmp/x.gguf", NULL};
    assert_int_equal(run_tool(a2, 1, err, sizeof err), 2);
    assert_non_null(strstr(err, "--type: expected"));
    const char *a3[] = {"--preset", "tiny", "--type", "f32", NULL};
    assert_int_equal(run_tool(a3, 1, err, sizeof err), 2);
    assert_non_null(strstr(err, "-o are required"));
    const char *a4[] = {"--preset", "tiny", "--type", "f32", "--n-head", "5", "-o", "/tmp/x.gguf", NULL};
    assert_int_equal(run_tool(a4, 1, err, sizeof err), 2);
    assert_non_null(strstr(err, "multiple of --n-head-kv"));
    const char *a5[] = {"--preset", "tiny", "--type", "f32", "--n-embd", "-3", "-o", "/tmp/x.gguf", NULL};
    assert_int_equal(run_tool(a5, 1, err, sizeof err), 2);
    assert_non_null(strstr(err, "--n-embd: expected an integer from 1 to 2147483647"));
    const char *a6[] = {"--preset", "tiny", "--type", "f32", "--tokenizer", "/nonexistent.json",
                        "-o", "/tmp/x.gguf", NULL};
    assert_int_equal(run_tool(a6, 0, err, sizeof err), 1);
    assert_non_null(strstr(err, "/nonexistent.json"));
    const char *a7[] = {"--help", NULL};
    assert_int_equal(run_tool(a7, 0, err, sizeof err), 0);
}

/* Same seed, same bytes; another seed, other bytes. */
static void same_seed_same_bytes(void **state)
{
    need_tool();
    const char *a[] = {"--preset", "tiny", "--type", "q8_0", "--seed", "1", NULL};
    const char *b[] = {"--preset", "tiny", "--type", "q8_0", "--seed", "2", NULL};
    const char *p1 = file_of("q8_0");
    const char *p2 = make_file("tiny-q8_0-again.gguf", a);
    const char *p3 = make_file("tiny-q8_0-seed2.gguf", b);
    char h1[65], h2[65], h3[65];
    tg_err e;
    assert_int_equal(tg_sha256_file(p1, h1, &e), 0);
    assert_int_equal(tg_sha256_file(p2, h2, &e), 0);
    assert_int_equal(tg_sha256_file(p3, h3, &e), 0);
    if (strcmp(h1, h2)) fail_msg("same seed gave different bytes: %s vs %s", h1, h2);
    if (!strcmp(h1, h3)) fail_msg("seeds 1 and 2 gave the same bytes");
}

/* Hyperparameters and vocabulary as the presets and docs/formats.md say. */
static void hparams_and_vocab(void **state)
{
    need_tool();
    gguf *g = open_ok(file_of("f32"));
    gguf_str s;
    assert_int_equal(gguf_get_str(g, "general.architecture", &s, NULL), 0);
    assert_true(s.n == 5 && !memcmp(s.p, "qwen3", 5));
    assert_int_equal(u32_of(g, "qwen3.embedding_length"), 256);
    assert_int_equal(u32_of(g, "qwen3.block_count"), 2);
    assert_int_equal(u32_of(g, "qwen3.attention.head_count"), 4);
    assert_int_equal(u32_of(g, "qwen3.attention.head_count_kv"), 2);
    assert_int_equal(u32_of(g, "qwen3.attention.key_length"), 64);
    assert_int_equal(u32_of(g, "qwen3.attention.value_length"), 64);
    assert_int_equal(u32_of(g, "qwen3.feed_forward_length"), 768);
    assert_int_equal(u32_of(g, "qwen3.context_length"), 4096);
    assert_int_equal(u32_of(g, "general.alignment"), 32);
    assert_int_equal(u32_of(g, "general.file_type"), TG_FTYPE_ALL_F32);
    float f;
    assert_int_equal(gguf_get_f32(g, "qwen3.rope.freq_base", &f, NULL), 0);
    assert_true(f == 1e6f);
    assert_int_equal(gguf_get_f32(g, "qwen3.attention.layer_norm_rms_epsilon", &f, NULL), 0);
    assert_true(f == 1e-6f);
    enum gguf_vtype et;
    uint64_t n;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, NULL), 0);
    assert_int_equal(n, N_VOCAB);
    assert_int_equal(gguf_arr_str(g, "tokenizer.ggml.tokens", 151643, &s, NULL), 0);
    assert_true(s.n == 13 && !memcmp(s.p, "<|endoftext|>", 13));
    int64_t tt;
    assert_int_equal(gguf_arr_i64(g, "tokenizer.ggml.token_type", N_VOCAB - 1, &tt, NULL), 0);
    assert_int_equal(tt, 5); /* padding: unused */
    assert_int_equal(gguf_get_str(g, "tokenizer.ggml.pre", &s, NULL), 0);
    assert_true(s.n == 5 && !memcmp(s.p, "qwen2", 5));
    /* tied: no output.weight; every tensor of the model, shaped right */
    assert_int_equal(gguf_n_tensors(g), 2 + 2 * 11);
    assert_null(gguf_find_tensor(g, "output.weight"));
    const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_true(t->ne[0] == 256 && t->ne[1] == N_VOCAB);
    t = gguf_find_tensor(g, "blk.1.attn_k.weight");
    assert_non_null(t);
    assert_true(t->ne[0] == 256 && t->ne[1] == 128);
    t = gguf_find_tensor(g, "blk.1.attn_output.weight");
    assert_true(t->ne[0] == 256 && t->ne[1] == 256);
    t = gguf_find_tensor(g, "blk.0.ffn_down.weight");
    assert_true(t->ne[0] == 768 && t->ne[1] == 256);
    t = gguf_find_tensor(g, "blk.0.attn_k_norm.weight");
    assert_true(t->n_dims == 1 && t->ne[0] == 64);
    gguf_close(g);
}

/* The expected type of a tensor under docs/formats.md's recipe (Q4_K_M). */
static uint32_t recipe_type(const char *type, const char *name, int64_t n_layer, int tied)
{
    int is_norm = strstr(name, "norm") != NULL;
    if (is_norm) return TG_TYPE_F32;
    if (!strcmp(type, "f32")) return TG_TYPE_F32;
    if (!strcmp(type, "f16")) return TG_TYPE_F16;
    if (!strcmp(type, "bf16")) return TG_TYPE_BF16;
    if (!strcmp(type, "q8_0")) return TG_TYPE_Q8_0;
    if (!strcmp(name, "output.weight")) return TG_TYPE_Q6_K;
    if (!strcmp(name, "token_embd.weight")) return tied ? TG_TYPE_Q6_K : TG_TYPE_Q4_K;
    int64_t i;
    if ((strstr(name, ".attn_v.") || strstr(name, ".ffn_down.")) && sscanf(name, "blk.%" SCNd64, &i) == 1) {
        int64_t n = n_layer;
        if (i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2) return TG_TYPE_Q6_K;
    }
    return TG_TYPE_Q4_K;
}

static void check_types(const char *type, uint32_t ftype, int64_t n_layer)
{
    gguf *g = open_ok(file_of(type));
    assert_int_equal(u32_of(g, "general.file_type"), ftype);
    assert_int_equal(u32_of(g, "qwen3.block_count"), n_layer);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        uint32_t want = recipe_type(type, t->name, n_layer, 1);
        if (t->type != want)
            fail_msg("%s: tensor %s has type %s, the recipe says %s", type, t->name,
                     tg_type_name(t->type), tg_type_name(want));
    }
    gguf_close(g);
}

static void types_f32(void **state) { need_tool(); check_types("f32", TG_FTYPE_ALL_F32, 2); }
static void types_f16(void **state) { need_tool(); check_types("f16", TG_FTYPE_MOSTLY_F16, 2); }
static void types_bf16(void **state) { need_tool(); check_types("bf16", TG_FTYPE_MOSTLY_BF16, 2); }
static void types_q8_0(void **state) { need_tool(); check_types("q8_0", TG_FTYPE_MOSTLY_Q8_0, 2); }
static void types_q4_k_m(void **state) { need_tool(); check_types("q4_k_m", TG_FTYPE_MOSTLY_Q4_K_M, Q4_LAYERS); }

/* Our Q4_K_M mixture equals the one llama-quantize chose for the shipped
 * 8-layer trained model, tensor by tensor. */
static void q4_k_m_matches_llama_quantize(void **state)
{
    need_tool();
    char ref[4200];
    snprintf(ref, sizeof ref, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", C.root);
    if (!exists(ref)) {
        fprintf(stderr, "skip: %s missing (set TG_ROOT)\n", ref);
        skip();
    }
    gguf *r = open_ok(ref), *g = open_ok(file_of("q4_k_m"));
    assert_int_equal(gguf_n_tensors(r), gguf_n_tensors(g));
    for (int64_t i = 0; i < gguf_n_tensors(r); i++) {
        const gguf_tensor *a = gguf_tensor_at(r, i), *b = gguf_find_tensor(g, a->name);
        if (!b) fail_msg("tensor %s of the llama.cpp file is missing from ours", a->name);
        if (a->type != b->type)
            fail_msg("tensor %s: llama-quantize chose %s, tg-mkmodel %s", a->name,
                     tg_type_name(a->type), tg_type_name(b->type));
    }
    gguf_close(g);
    gguf_close(r);
}

static void untied_has_output(void **state)
{
    need_tool();
    const char *a[] = {"--preset", "tiny", "--type", "q8_0", "--untied", "--seed", "1", NULL};
    gguf *g = open_ok(make_file("tiny-q8_0-untied.gguf", a));
    const gguf_tensor *o = gguf_find_tensor(g, "output.weight");
    const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(o);
    assert_non_null(t);
    assert_int_equal(o->type, TG_TYPE_Q8_0);
    assert_true(o->ne[0] == 256 && o->ne[1] == N_VOCAB);
    assert_int_equal(gguf_n_tensors(g), 3 + 2 * 11);
    assert_true(memcmp(o->data, t->data, 1024) != 0);
    gguf_close(g);
}

/* Explicit dims override the preset; rows that are not whole 256-blocks
 * fall back under Q4_K_M as llama-quantize's (Q4_K to Q5_0, Q6_K to Q8_0:
 * llama.cpp 0.4.0 writes these types for the same dims). */
static void explicit_dims_and_fallback(void **state)
{
    need_tool();
    const char *a[] = {"--preset", "tiny", "--type", "q4_k_m", "--n-embd", "96", "--n-layer", "3",
                       "--n-head", "3", "--n-head-kv", "1", "--head-dim", "32", "--n-ff", "512",
                       "--ctx", "512", "--seed", "5", NULL};
    gguf *g = open_ok(make_file("dims.gguf", a));
    assert_int_equal(u32_of(g, "qwen3.embedding_length"), 96);
    assert_int_equal(u32_of(g, "qwen3.block_count"), 3);
    assert_int_equal(u32_of(g, "qwen3.attention.head_count"), 3);
    assert_int_equal(u32_of(g, "qwen3.attention.head_count_kv"), 1);
    assert_int_equal(u32_of(g, "qwen3.attention.key_length"), 32);
    assert_int_equal(u32_of(g, "qwen3.feed_forward_length"), 512);
    assert_int_equal(u32_of(g, "qwen3.context_length"), 512);
    /* 96-wide rows: no Q4_K/Q6_K; ffn_down rows are 512 wide: K types stay */
    assert_int_equal(gguf_find_tensor(g, "token_embd.weight")->type, TG_TYPE_Q8_0);
    assert_int_equal(gguf_find_tensor(g, "blk.0.attn_q.weight")->type, TG_TYPE_Q5_0);
    assert_int_equal(gguf_find_tensor(g, "blk.0.attn_v.weight")->type, TG_TYPE_Q5_0);
    assert_int_equal(gguf_find_tensor(g, "blk.1.attn_output.weight")->type, TG_TYPE_Q5_0);
    assert_int_equal(gguf_find_tensor(g, "blk.0.ffn_down.weight")->type, TG_TYPE_Q4_K);
    assert_int_equal(gguf_find_tensor(g, "blk.2.ffn_down.weight")->type, TG_TYPE_Q6_K);
    assert_int_equal(gguf_find_tensor(g, "blk.0.attn_norm.weight")->type, TG_TYPE_F32);
    gguf_close(g);
}

/* Row r of tensor name dequantized into out (ne[0] floats). */
static void row_of(const gguf *g, const char *name, uint64_t r, float *out)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    assert_non_null(t);
    const tg_type_traits *tt = tg_traits(t->type);
    assert_non_null(tt);
    size_t rb = tg_row_size(t->type, (int64_t)t->ne[0]);
    tt->to_float((const uint8_t *)t->data + r * rb, out, (int64_t)t->ne[0]);
}

/* Every type holds the same seeded weights (F32 rounded to each type), at
 * the scales the tool documents. */
static void types_encode_same_weights(void **state)
{
    need_tool();
    gguf *f = open_ok(file_of("f32"));
    const char *types[] = {"f16", "bf16", "q8_0", "q4_k_m"};
    /* relative RMS error each type may add against Gaussian weights: half
     * about 2^-12, bf16 2^-9, Q8_0 about 1/127 of the block max; the K
     * quants measure 0.018 (Q6_K) and 0.077 (Q4_K) at worst */
#define TOL(t) ((t) == TG_TYPE_F32 ? 0.0 : (t) == TG_TYPE_F16 ? 1e-3 : (t) == TG_TYPE_BF16 ? 6e-3 \
                : (t) == TG_TYPE_Q8_0 ? 1.5e-2 : (t) == TG_TYPE_Q6_K ? 0.03 : 0.10)
    const char *names[] = {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight",
                           "blk.0.attn_norm.weight"};
    float a[1024], b[1024];
    for (int k = 0; k < 4; k++) {
        gguf *g = open_ok(file_of(types[k]));
        for (int n = 0; n < 4; n++) {
            const gguf_tensor *t = gguf_find_tensor(f, names[n]);
            assert_non_null(t);
            uint64_t rows[] = {0, 7, t->ne[1] - 1};
            for (int ri = 0; ri < (t->ne[1] > 7 ? 3 : 1); ri++) {
                row_of(f, names[n], rows[ri], a);
                row_of(g, names[n], rows[ri], b);
                double se = 0, sa = 0;
                for (uint64_t i = 0; i < t->ne[0]; i++) {
                    se += (double)(a[i] - b[i]) * (a[i] - b[i]);
                    sa += (double)a[i] * a[i];
                }
                double rel = sqrt(se / sa);
                uint32_t ty = gguf_find_tensor(g, names[n])->type;
                if (rel > TOL(ty))
                    fail_msg("%s %s (%s) row %" PRIu64 ": relative RMS error %.4f against f32 exceeds %.4f",
                             types[k], names[n], tg_type_name(ty), rows[ri], rel, TOL(ty));
            }
        }
        gguf_close(g);
    }
    /* scales: embedding std 4/sqrt(256) = 0.25 (rows scaled 1 +- 0.15 z),
     * attn_q 1/sqrt(256), norms around 1 */
    double s = 0, s2 = 0;
    long cnt = 0;
    for (uint64_t r = 0; r < 2000; r++) {
        row_of(f, "token_embd.weight", r * 75, a);
        for (int i = 0; i < 256; i++) {
            s += a[i];
            s2 += (double)a[i] * a[i];
            cnt++;
        }
    }
    double sd = sqrt(s2 / cnt - (s / cnt) * (s / cnt));
    if (fabs(s / cnt) > 0.01 || sd < 0.24 || sd > 0.26)
        fail_msg("token_embd: mean %.4f sd %.4f, expected mean 0 and sd 0.25", s / cnt, sd);
    row_of(f, "blk.1.attn_norm.weight", 0, a);
    s = 0;
    for (int i = 0; i < 256; i++) s += a[i];
    if (fabs(s / 256 - 1.0) > 0.02) fail_msg("attn_norm mean %.4f, expected about 1", s / 256);
    gguf_close(f);
}

/* The Q4_K_M file loads in llama.cpp's prebuilt library, with our
 * hyperparameters and the padded vocab, and decodes to finite logits whose
 * top-1 lies in the range real models show. */
static void loads_in_llama_cpp(void **state)
{
    need_tool();
    if (!exists(C.lib)) {
        fprintf(stderr, "skip: %s missing (make fetch; set TG_CACHE)\n", C.lib);
        skip();
    }
    const char *path = file_of("q4_k_m");
    llama_dl *dl;
    tg_err e;
    if (llama_dl_open(C.lib, &dl, &e)) fail_msg("libllama: %s", e.msg);
    llama_dl_set_log_echo(dl, false);
    struct llama_model *m;
    if (llama_dl_load_model(dl, path, NULL, &m, &e)) fail_msg("llama.cpp refused our file: %s", e.msg);
    const struct llama_vocab *v = dl->model_get_vocab(m);
    assert_int_equal(dl->model_n_embd(m), 256);
    assert_int_equal(dl->model_n_layer(m), Q4_LAYERS);
    assert_int_equal(dl->model_n_head(m), 4);
    assert_int_equal(dl->model_n_head_kv(m), 2);
    assert_int_equal(dl->vocab_n_tokens(v), N_VOCAB);
    assert_string_equal(dl->vocab_get_text(v, 151644), "<|im_start|>");

    struct llama_context_params cp = dl->context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 64;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    struct llama_context *c = dl->init_from_model(m, cp);
    assert_non_null(c);
    int32_t *ids;
    int n;
    const char *prompt = "The capital of France is";
    if (llama_dl_tokenize(dl, v, prompt, strlen(prompt), false, false, &ids, &n, &e))
        fail_msg("tokenize: %s", e.msg);
    assert_true(n >= 3 && n < 32);
    struct llama_batch b = dl->batch_init(64, 0, 1);
    int pos = 0, tok = -1;
    float top_min = 1e30f, top_max = -1e30f, gap_min = 1e30f, gap_max = 0;
    const int steps = 8;
    for (int s = 0; s < steps; s++) {
        b.n_tokens = 0;
        int cnt = s == 0 ? n : 1;
        for (int i = 0; i < cnt; i++) {
            b.token[i] = s == 0 ? ids[i] : tok;
            b.pos[i] = pos++;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = i == cnt - 1;
            b.n_tokens++;
        }
        if (dl->decode(c, b) != 0) fail_msg("llama_decode failed at step %d: %s", s, llama_dl_log_errors(dl));
        const float *l = dl->get_logits_ith(c, -1);
        assert_non_null(l);
        for (int i = 0; i < N_VOCAB; i++)
            if (!isfinite(l[i])) fail_msg("step %d: logit %d is not finite", s, i);
        tg_top t[2];
        tg_topk(l, N_VOCAB, 2, t);
        tok = t[0].id;
        float gap = t[0].logit - t[1].logit;
        if (t[0].logit < top_min) top_min = t[0].logit;
        if (t[0].logit > top_max) top_max = t[0].logit;
        if (gap < gap_min) gap_min = gap;
        if (gap > gap_max) gap_max = gap;
    }
    print_message("llama.cpp on tg-mkmodel tiny q4_k_m seed 1, %d greedy steps: top-1 %.2f..%.2f, "
                  "top1-top2 gap %.3f..%.3f\n", steps, top_min, top_max, gap_min, gap_max);
    if (top_min < 10.0f || top_max > 30.0f)
        fail_msg("top-1 logits %.2f..%.2f leave the 10-30 range of a real model", top_min, top_max);
    dl->batch_free(b);
    free(ids);
    dl->free_context(c);
    dl->model_free(m);
    llama_dl_free(dl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cli_errors_are_clear),
        cmocka_unit_test(same_seed_same_bytes),
        cmocka_unit_test(hparams_and_vocab),
        cmocka_unit_test(types_f32),
        cmocka_unit_test(types_f16),
        cmocka_unit_test(types_bf16),
        cmocka_unit_test(types_q8_0),
        cmocka_unit_test(types_q4_k_m),
        cmocka_unit_test(q4_k_m_matches_llama_quantize),
        cmocka_unit_test(untied_has_output),
        cmocka_unit_test(explicit_dims_and_fallback),
        cmocka_unit_test(types_encode_same_weights),
        cmocka_unit_test(loads_in_llama_cpp),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
