/*
 * test_tokenizer.c: the tokenizer against llama.cpp's own tokenizer (the
 * prebuilt libllama, vocab_only, through oracles/llama/llama_dl).
 *
 * Vocabularies: the shipped trained model (8192 tokens, qwen2), the real
 * Qwen3 vocabulary (151,936 tokens) written into a GGUF by tg_hfvocab_write,
 * and the trained model's vocabulary relabelled with the llama3 and gpt-2
 * pre-tokenizers. Each corpus string (tests/data/tokenizer_corpus.txt) is
 * tokenized with special parsing off and on, with and without add_special;
 * the first mismatch fails the test, printing the string escaped and both id
 * lists. Detokenization is compared with llama_detokenize too, and round
 * trips for valid UTF-8.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf.h"
#include "hfvocab.h"
#include "llama/llama_dl.h"
#include "tokenizer.h"

typedef struct corpus_str {
    char *p;
    size_t n;
} corpus_str;

typedef struct ctx {
    char root[2048], build[2048], cache[2048];
    char lib[4096], tiny[4096], qwen3[4096];
    llama_dl *dl;
    corpus_str *corpus;
    size_t n_corpus;
} ctx;

static ctx C;

static const char *env_or(const char *k, const char *def)
{
    const char *v = getenv(k);
    return v && *v ? v : def;
}

/* Parses one escaped corpus line into s (malloc'ed). */
static int unescape(const char *line, size_t n, corpus_str *s)
{
    char *o = malloc(n + 1);
    size_t k = 0;
    if (!o) return -1;
    for (size_t i = 0; i < n; i++) {
        if (line[i] != '\\' || i + 1 >= n) { o[k++] = line[i]; continue; }
        char c = line[++i];
        if (c == 'n') o[k++] = '\n';
        else if (c == 'r') o[k++] = '\r';
        else if (c == 't') o[k++] = '\t';
        else if (c == '0') o[k++] = 0;
        else if (c == '\\') o[k++] = '\\';
        else if (c == 'x' && i + 2 < n) {
            char h[3] = {line[i + 1], line[i + 2], 0};
            o[k++] = (char)strtol(h, NULL, 16);
            i += 2;
        } else if (c == 'u' && i + 1 < n && line[i + 1] == '{') {
            char *end;
            unsigned long cp = strtoul(line + i + 2, &end, 16);
            i = (size_t)(end - line);
            if (cp < 0x80) o[k++] = (char)cp;
            else if (cp < 0x800) { o[k++] = (char)(0xc0 | (cp >> 6)); o[k++] = (char)(0x80 | (cp & 63)); }
            else if (cp < 0x10000) {
                o[k++] = (char)(0xe0 | (cp >> 12)); o[k++] = (char)(0x80 | ((cp >> 6) & 63));
                o[k++] = (char)(0x80 | (cp & 63));
            } else {
                o[k++] = (char)(0xf0 | (cp >> 18)); o[k++] = (char)(0x80 | ((cp >> 12) & 63));
                o[k++] = (char)(0x80 | ((cp >> 6) & 63)); o[k++] = (char)(0x80 | (cp & 63));
            }
        } else {
            o[k++] = '\\';
            o[k++] = c;
        }
    }
    s->p = o;
    s->n = k;
    return 0;
}

static int load_corpus(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) >= 0) {
        if (n > 0 && line[n - 1] == '\n') n--;
        if (n > 0 && line[0] == '#') continue;
        C.corpus = realloc(C.corpus, (C.n_corpus + 1) * sizeof *C.corpus);
        if (unescape(line, (size_t)n, &C.corpus[C.n_corpus])) break;
        C.n_corpus++;
    }
    free(line);
    fclose(f);
    return 0;
}

static void print_escaped(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\\') fputs("\\\\", stderr);
        else if (c == '\n') fputs("\\n", stderr);
        else if (c >= 0x20 && c != 0x7f) fputc(c, stderr);
        else fprintf(stderr, "\\x%02x", c);
    }
}

static void print_ids(const char *who, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", who, n);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

static int valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], k, cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c < 0xe0) k = 1, cp = c & 31;
        else if (c >= 0xe0 && c < 0xf0) k = 2, cp = c & 15;
        else if (c >= 0xf0 && c < 0xf5) k = 3, cp = c & 7;
        else return 0;
        if (i + k >= n) return 0;
        for (unsigned j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + j] & 63);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* ------------------------------------------------------------ vocab files */

/* Copies every tokenizer.ggml.* key of g into w, with tokenizer.ggml.pre
 * replaced by pre, plus the qwen3 hparams llama.cpp needs for vocab_only. */
static void add_hparams(gguf_writer *w)
{
    gguf_writer_str(w, "general.architecture", "qwen3");
    gguf_writer_u32(w, "qwen3.context_length", 4096);
    gguf_writer_u32(w, "qwen3.embedding_length", 256);
    gguf_writer_u32(w, "qwen3.block_count", 1);
    gguf_writer_u32(w, "qwen3.feed_forward_length", 768);
    gguf_writer_u32(w, "qwen3.attention.head_count", 4);
    gguf_writer_u32(w, "qwen3.attention.head_count_kv", 2);
    gguf_writer_u32(w, "qwen3.attention.key_length", 64);
    gguf_writer_u32(w, "qwen3.attention.value_length", 64);
    gguf_writer_f32(w, "qwen3.rope.freq_base", 1e6f);
    gguf_writer_f32(w, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
}

static void write_relabelled(const char *src, const char *dst, const char *pre)
{
    tg_err e = {{0}};
    gguf *g = NULL;
    assert_int_equal(gguf_open(&g, src, &e), 0);
    gguf_writer *w = gguf_writer_new(0);
    add_hparams(w);
    gguf_writer_str(w, "tokenizer.ggml.model", "gpt2");
    if (pre) gguf_writer_str(w, "tokenizer.ggml.pre", pre);
    const char *arrs[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"};
    for (int a = 0; a < 2; a++) {
        uint64_t n;
        assert_int_equal(gguf_get_arr(g, arrs[a], NULL, &n, &e), 0);
        char **v = calloc(n, sizeof *v);
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s;
            assert_int_equal(gguf_arr_str(g, arrs[a], i, &s, &e), 0);
            v[i] = strndup(s.p, s.n);
        }
        gguf_writer_arr_str(w, arrs[a], (const char *const *)v, n);
        for (uint64_t i = 0; i < n; i++) free(v[i]);
        free(v);
    }
    uint64_t n;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.token_type", NULL, &n, &e), 0);
    gguf_writer_arr(w, "tokenizer.ggml.token_type", GGUF_I32, gguf_arr_data(g, "tokenizer.ggml.token_type"), n);
    uint32_t v;
    if (!gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v, NULL)) gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", v);
    if (!gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v, NULL)) gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", v);
    int ret = gguf_writer_write(w, dst, &e);
    if (ret) fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(ret, 0);
    gguf_writer_free(w);
    gguf_close(g);
}

/* ------------------------------------------------------------ comparisons */

/* Compares ours with llama.cpp on the whole corpus for the file at path. */
static void compare_file(const char *path, int check_roundtrip)
{
    tg_err e = {{0}};
    gguf *g = NULL;
    tg_tokenizer *t = NULL;
    if (gguf_open(&g, path, &e)) fail_msg("gguf_open: %s", e.msg);
    if (tg_tokenizer_from_gguf(&t, g, &e)) fail_msg("tg_tokenizer_from_gguf: %s", e.msg);
    gguf_close(g);

    struct llama_model_params mp = C.dl->model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = NULL;
    if (llama_dl_load_model(C.dl, path, &mp, &model, &e)) fail_msg("llama.cpp load: %s", e.msg);
    const struct llama_vocab *v = C.dl->model_get_vocab(model);
    assert_int_equal(C.dl->vocab_n_tokens(v), tg_tokenizer_n_vocab(t));

    size_t compared = 0, roundtrips = 0;
    for (size_t i = 0; i < C.n_corpus; i++) {
        const corpus_str *s = &C.corpus[i];
        for (int mode = 0; mode < 4; mode++) {
            int add_special = mode & 1, parse_special = mode >> 1;
            int32_t *want = NULL, *got = NULL;
            int n_want = 0;
            size_t n_got = 0;
            if (llama_dl_tokenize(C.dl, v, s->p, s->n, add_special, parse_special, &want, &n_want, &e))
                fail_msg("llama_tokenize: %s", e.msg);
            if (tg_tokenize(t, s->p, s->n, add_special, parse_special, &got, &n_got, &e))
                fail_msg("tg_tokenize on corpus line %zu: %s", i, e.msg);
            if (n_got != (size_t)n_want || (n_got && memcmp(got, want, n_got * sizeof *got))) {
                fprintf(stderr, "%s: ids differ for corpus string %zu (add_special %d, parse_special %d): \"",
                        path, i, add_special, parse_special);
                print_escaped(s->p, s->n);
                fprintf(stderr, "\"\n");
                print_ids("llama.cpp", want, (size_t)n_want);
                print_ids("tokgate  ", got, n_got);
                fail_msg("tokenizer ids differ from llama.cpp's (see above)");
            }
            compared++;
            for (int render = 0; render < 2; render++) {
                char *a = NULL, *b = NULL;
                size_t na = 0, nb = 0;
                if (llama_dl_detokenize(C.dl, v, want, n_want, false, render, &a, &na, &e))
                    fail_msg("llama_detokenize: %s", e.msg);
                if (tg_detokenize(t, got, n_got, render, &b, &nb, &e)) fail_msg("tg_detokenize: %s", e.msg);
                if (na != nb || memcmp(a, b, na)) {
                    fprintf(stderr, "%s: detokenize (render_special %d) differs for corpus string %zu: \"",
                            path, render, i);
                    print_escaped(s->p, s->n);
                    fprintf(stderr, "\"\n  llama.cpp: \"");
                    print_escaped(a, na);
                    fprintf(stderr, "\"\n  tokgate:   \"");
                    print_escaped(b, nb);
                    fprintf(stderr, "\"\n");
                    fail_msg("detokenized bytes differ from llama.cpp's (see above)");
                }
                if (check_roundtrip && render && !add_special && valid_utf8(s->p, s->n)) {
                    if (nb != s->n || memcmp(b, s->p, nb)) {
                        fprintf(stderr, "%s: detokenize(tokenize(s)) != s for corpus string %zu: \"", path, i);
                        print_escaped(s->p, s->n);
                        fprintf(stderr, "\" came back as \"");
                        print_escaped(b, nb);
                        fprintf(stderr, "\"\n");
                        fail_msg("round trip failed (see above)");
                    }
                    roundtrips++;
                }
                free(a);
                free(b);
            }
            free(want);
            free(got);
        }
    }
    fprintf(stderr, "%s: %zu tokenizations identical to llama.cpp, %zu round trips\n", path, compared,
            roundtrips);
    C.dl->model_free(model);
    tg_tokenizer_free(t);
}

static void test_trained_vocab(void **state)
{
    (void)state;
    compare_file(C.tiny, 1);
}

static void test_qwen3_vocab(void **state)
{
    (void)state;
    compare_file(C.qwen3, 1);
}

static void test_llama3_pre(void **state)
{
    (void)state;
    char p[4200];
    snprintf(p, sizeof p, "%s/tok-llama3.gguf", C.build);
    write_relabelled(C.tiny, p, "llama3");
    compare_file(p, 0);
}

static void test_gpt2_pre(void **state)
{
    (void)state;
    char p[4200];
    snprintf(p, sizeof p, "%s/tok-gpt2.gguf", C.build);
    write_relabelled(C.tiny, p, "gpt-2");
    compare_file(p, 0);
}

/* An unknown tokenizer.ggml.pre, or none, is an error naming the key. */
static void test_unknown_pre_is_error(void **state)
{
    (void)state;
    const char *pres[] = {"no-such-pre", NULL};
    for (int k = 0; k < 2; k++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/tok-badpre.gguf", C.build);
        write_relabelled(C.tiny, p, pres[k]);
        tg_err e = {{0}};
        gguf *g = NULL;
        tg_tokenizer *t = NULL;
        assert_int_equal(gguf_open(&g, p, &e), 0);
        assert_int_equal(tg_tokenizer_from_gguf(&t, g, &e), -1);
        assert_null(t);
        assert_non_null(strstr(e.msg, "tokenizer.ggml.pre"));
        if (pres[k]) assert_non_null(strstr(e.msg, pres[k]));
        gguf_close(g);
        unlink(p);
    }
}

/* Detokenize rejects an id out of range, naming its index. */
static void test_detokenize_bad_id(void **state)
{
    (void)state;
    tg_err e = {{0}};
    gguf *g = NULL;
    tg_tokenizer *t = NULL;
    assert_int_equal(gguf_open(&g, C.tiny, &e), 0);
    assert_int_equal(tg_tokenizer_from_gguf(&t, g, &e), 0);
    gguf_close(g);
    int32_t ids[] = {5, 8192};
    char *out = NULL;
    size_t n = 0;
    assert_int_equal(tg_detokenize(t, ids, 2, 1, &out, &n, &e), -1);
    assert_non_null(strstr(e.msg, "ids[1]"));
    tg_tokenizer_free(t);
}

static int setup(void **state)
{
    (void)state;
    snprintf(C.root, sizeof C.root, "%s", env_or("TG_ROOT", "."));
    snprintf(C.build, sizeof C.build, "%s", env_or("TG_BUILD", "build"));
    snprintf(C.cache, sizeof C.cache, "%s", env_or("TG_CACHE", ".cache"));
    snprintf(C.lib, sizeof C.lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", C.cache);
    snprintf(C.tiny, sizeof C.tiny, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", C.root);
    char corpus[4200], tj[4200];
    snprintf(corpus, sizeof corpus, "%s/tests/data/tokenizer_corpus.txt", C.root);
    if (load_corpus(corpus) || C.n_corpus < 300) {
        fprintf(stderr, "corpus %s: missing or fewer than 300 strings\n", corpus);
        return -1;
    }
    if (access(C.lib, R_OK)) return 0; /* tests skip */
    tg_err e = {{0}};
    if (llama_dl_open(C.lib, &C.dl, &e)) {
        fprintf(stderr, "llama_dl_open: %s\n", e.msg);
        return -1;
    }
    llama_dl_set_log_echo(C.dl, false);
    /* the real Qwen3 vocabulary, as the converter writes it */
    snprintf(tj, sizeof tj, "%s/npm/tokenizer-qwen3/models/tokenizer.json", C.cache);
    snprintf(C.qwen3, sizeof C.qwen3, "%s/tok-qwen3-vocab.gguf", C.build);
    if (!access(tj, R_OK)) {
        gguf_writer *w = gguf_writer_new(0);
        add_hparams(w);
        if (tg_hfvocab_write(w, tj, 151936, &e) || gguf_writer_write(w, C.qwen3, &e)) {
            fprintf(stderr, "writing the Qwen3 vocab: %s\n", e.msg);
            gguf_writer_free(w);
            return -1;
        }
        gguf_writer_free(w);
    } else {
        C.qwen3[0] = 0;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    llama_dl_free(C.dl);
    for (size_t i = 0; i < C.n_corpus; i++) free(C.corpus[i].p);
    free(C.corpus);
    return 0;
}

#define NEED_LLAMA()                                                                        \
    do {                                                                                    \
        if (!C.dl) {                                                                        \
            fprintf(stderr, "skip: no llama.cpp library at %s (run make fetch)\n", C.lib); \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

static void t_trained(void **s) { NEED_LLAMA(); test_trained_vocab(s); }
static void t_qwen3(void **s)
{
    NEED_LLAMA();
    if (!C.qwen3[0]) { fprintf(stderr, "skip: no Qwen3 tokenizer.json (run make fetch)\n"); skip(); }
    test_qwen3_vocab(s);
}
static void t_llama3(void **s) { NEED_LLAMA(); test_llama3_pre(s); }
static void t_gpt2(void **s) { NEED_LLAMA(); test_gpt2_pre(s); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_pre_is_error),
        cmocka_unit_test(test_detokenize_bad_id),
        cmocka_unit_test(t_trained),
        cmocka_unit_test(t_qwen3),
        cmocka_unit_test(t_llama3),
        cmocka_unit_test(t_gpt2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
