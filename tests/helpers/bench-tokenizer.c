/*
 * bench-tokenizer.c: tokenizer throughput, ours against llama.cpp's, on the
 * same text on one core (both are single-threaded).
 *
 *   bench-tokenizer MODEL.gguf LIBLLAMA.so CORPUS.txt [MB]
 *
 * The text (MB megabytes, default 10) is generated deterministically: corpus
 * lines (the tokenizer test corpus) interleaved with man-page-like prose made
 * from a fixed word list by a fixed LCG. It is cut into chunks of about
 * 64 KiB (prompt-sized calls) and each chunk is tokenized by both, without
 * special parsing. Prints MB/s of each, the ratio, and how many chunks gave
 * different ids (expected 0). Exit status 0 unless something failed to load.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "llama/llama_dl.h"
#include "tokenizer.h"
#include "util.h"

static const char *WORDS[] = {
    "the", "option", "file", "is", "to", "of", "and", "a", "in", "for", "directory", "command",
    "returns", "value", "if", "not", "specified", "default", "with", "print", "output", "input",
    "see", "also", "environment", "variable", "mode", "user", "system", "when", "this", "that",
    "def", "self", "return", "None", "import", "class", "raise", "ValueError", "len(x)", "0",
    "1", "42", "1024", "--verbose", "-n", "/usr/bin", "stdin", "stdout", "errno", "EINVAL",
    "SIGTERM", "is_valid()", "dict[str, int]", "café", "naïve", "Ünïcödé", "日本語", "🙂",
};

typedef struct text {
    char *p;
    size_t n, cap;
} text;

static void put(text *t, const char *s, size_t n)
{
    if (t->n + n > t->cap) {
        t->cap = (t->n + n) * 2;
        t->p = realloc(t->p, t->cap);
        if (!t->p) { perror("realloc"); exit(2); }
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf LIBLLAMA.so CORPUS.txt [MB]\n", argv[0]);
        return 2;
    }
    size_t target = (size_t)((argc > 4 ? atof(argv[4]) : 10.0) * 1e6);
    tg_err e = {{0}};

    /* corpus lines (escapes left as they are: they are text too) */
    FILE *f = fopen(argv[3], "rb");
    if (!f) { perror(argv[3]); return 2; }
    char **lines = NULL, *line = NULL;
    size_t n_lines = 0, cap = 0;
    ssize_t k;
    while ((k = getline(&line, &cap, f)) >= 0) {
        if (k && line[0] == '#') continue;
        lines = realloc(lines, (n_lines + 1) * sizeof *lines);
        lines[n_lines++] = strdup(line);
    }
    free(line);
    fclose(f);
    if (!n_lines) { fprintf(stderr, "%s: no lines\n", argv[3]); return 2; }

    text t = {0};
    uint64_t s = 0x2545F4914F6CDD1DULL;
    size_t nw = sizeof WORDS / sizeof WORDS[0], li = 0;
    while (t.n < target) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        if ((s >> 60) < 3) {
            put(&t, lines[li], strlen(lines[li]));
            li = (li + 1) % n_lines;
            continue;
        }
        int words = 8 + (int)((s >> 40) % 24);
        put(&t, "       ", 1 + (size_t)((s >> 20) % 7));
        for (int w = 0; w < words; w++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            const char *x = WORDS[(s >> 33) % nw];
            put(&t, x, strlen(x));
            put(&t, (s >> 61) == 0 ? ", " : " ", (s >> 61) == 0 ? 2 : 1);
        }
        put(&t, ".\n", 2);
        if ((s >> 58) == 0) put(&t, "\n.SH OPTIONS\n", 13);
    }

    gguf *g = NULL;
    tg_tokenizer *tok = NULL;
    if (gguf_open(&g, argv[1], &e) || tg_tokenizer_from_gguf(&tok, g, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    gguf_close(g);
    llama_dl *dl = NULL;
    if (llama_dl_open(argv[2], &dl, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
    llama_dl_set_log_echo(dl, false);
    struct llama_model_params mp = dl->model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = NULL;
    if (llama_dl_load_model(dl, argv[1], &mp, &model, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
    const struct llama_vocab *v = dl->model_get_vocab(model);

    /* chunks of ~64 KiB, cut after a newline */
    size_t n_chunks = 0, *cut = malloc((t.n / 4096 + 2) * sizeof *cut);
    cut[0] = 0;
    for (size_t at = 0; at < t.n;) {
        size_t end = at + 65536 < t.n ? at + 65536 : t.n;
        while (end < t.n && t.p[end - 1] != '\n') end++;
        cut[++n_chunks] = end;
        at = end;
    }

    double ours = 0, theirs = 0;
    size_t tokens = 0, differ = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        const char *p = t.p + cut[c];
        size_t n = cut[c + 1] - cut[c];
        int32_t *a = NULL, *b = NULL;
        size_t na = 0;
        int nb = 0;
        double t0 = tg_now();
        if (tg_tokenize(tok, p, n, 0, 0, &a, &na, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
        double t1 = tg_now();
        if (llama_dl_tokenize(dl, v, p, n, false, false, &b, &nb, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
        double t2 = tg_now();
        ours += t1 - t0;
        theirs += t2 - t1;
        tokens += na;
        if (na != (size_t)nb || memcmp(a, b, na * sizeof *a)) differ++;
        free(a);
        free(b);
    }
    double mb = (double)t.n / 1e6;
    printf("text: %.2f MB in %zu chunks, %zu tokens (%s)\n", mb, n_chunks, tokens, argv[1]);
    printf("tokgate   : %8.2f MB/s  (%.3f s)\n", mb / ours, ours);
    printf("llama.cpp : %8.2f MB/s  (%.3f s)\n", mb / theirs, theirs);
    printf("ratio tokgate/llama.cpp: %.2fx\n", theirs / ours);
    printf("chunks with different ids: %zu\n", differ);

    dl->model_free(model);
    llama_dl_free(dl);
    tg_tokenizer_free(tok);
    for (size_t i = 0; i < n_lines; i++) free(lines[i]);
    free(lines);
    free(cut);
    free(t.p);
    return 0;
}
