/*
 * tg-mutate: builds a mutant tg-engine from one mutation file of
 * tests/mutants/ (the format and both suites: tests/mutants/README.md).
 *
 *   tg-mutate MUTATION.mut --flags BUILD/mutant-flags --out DIR
 *
 * tests/mutation.h reads the file and applies its hunks to a copy of the
 * engine source it names (a missing or repeated anchor is an error that
 * names the mutation, the file and the anchor's first line: the code
 * moved, the mutation must follow it). tg-mutate writes that copy into
 * DIR/src, compiles it with the Makefile's flags (BUILD/mutant-flags,
 * written by make: compiler, flags, the per-ISA flags, the files built
 * without multiply-add contraction, the engine library and the worker's
 * main object), replaces its object in a copy of libtg_engine.a and links
 * DIR/tg-engine. DIR/tg-llama is a link to the real one, so
 * TOKGATE_BIN=DIR runs a gate whose engine arms use the mutant. Every
 * process is started from an argv (no shell).
 *
 * `tg-mutate --check MUTATION.mut --root DIR` only applies the hunks to a
 * copy in memory and reports (exit 0 / 1).
 * Exit status: 0 built, 1 a mutation or build error (stderr says which).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../mutation.h"
#include "arm.h"
#include "common.h"
#include "util.h"

/* Strings flag() returns, freed at exit. */
static char *g_kept[32];
static int g_n_kept;

static void free_kept(void)
{
    for (int i = 0; i < g_n_kept; i++) free(g_kept[i]);
    g_n_kept = 0;
}

/* The flags file: "key value..." lines. Returns the value of key (a
 * malloc'ed copy, freed by free_kept), or NULL. */
static const char *flag(const char *text, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        if (!strncmp(p, key, kl) && (p[kl] == ' ' || p[kl] == '\n' || !p[kl])) {
            const char *v = p + kl + (p[kl] == ' ');
            if (g_n_kept == 32) return NULL;
            return g_kept[g_n_kept++] = xstrndup(v, strcspn(v, "\n"));
        }
        p = nl ? nl + 1 : NULL;
    }
    return NULL;
}

/* Whether word w is one of the space-separated words of list. */
static int has_word(const char *list, const char *w)
{
    size_t wl = strlen(w);
    for (const char *p = list; p && *p; p += strcspn(p, " ")) {
        while (*p == ' ') p++;
        if (strcspn(p, " ") == wl && !strncmp(p, w, wl)) return 1;
    }
    return 0;
}

typedef struct args {
    char *v[512];
    int n;
} args;

static void push(args *a, const char *s)
{
    if (a->n < 511) a->v[a->n++] = xstrdup(s), a->v[a->n] = NULL;
}

/* Splits words on spaces (the Makefile's flags hold no quoted words). */
static void push_words(args *a, const char *s)
{
    while (s && *s) {
        while (*s == ' ') s++;
        size_t n = strcspn(s, " ");
        if (n) {
            char *w = xstrndup(s, n);
            push(a, w);
            free(w);
        }
        s += n;
    }
}

static int run(args *a, const char *what)
{
    char *out = NULL;
    size_t ol = 0;
    arm_exit x;
    tg_err e;
    int rc = arm_run_command(a->v, 600, 0, 0, NULL, &out, &ol, &x, &e);
    if (rc < 0) {
        fprintf(stderr, "tg-mutate: %s failed: %s\n%s\n", what, e.msg, x.stderr_text ? x.stderr_text : "");
    }
    free(out);
    arm_exit_free(&x);
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    a->n = 0;
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tg-mutate MUTATION.mut --flags FILE --out DIR\n"
               "       tg-mutate --check MUTATION.mut --root DIR\n");
}

static int build(const char *mut, const char *flags_path, const char *out, const char *root, int check);

int main(int argc, char **argv)
{
    const char *mut = NULL, *flags_path = NULL, *out = NULL, *root = ".";
    int check = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--flags") && i + 1 < argc) flags_path = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--root") && i + 1 < argc) root = argv[++i];
        else if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] != '-' && !mut) mut = argv[i];
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!mut || (!check && (!flags_path || !out))) {
        usage(stderr);
        return 2;
    }
    int rc = build(mut, flags_path, out, root, check);
    free_kept();
    return rc;
}

/* Writes len bytes of data to path; 0, or -1 after saying so. */
static int write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "tg-mutate: %s: cannot write\n", path);
        return -1;
    }
    return 0;
}

/* Applies mutation file mut (and, unless check, builds the mutant into
 * out). Returns the exit status. */
static int build(const char *mut, const char *flags_path, const char *out, const char *root, int check)
{
    mutation m;
    char *flags = NULL, *mutated = NULL, *libtext = NULL, err[2048];
    size_t len;
    tg_err e;
    int rc = 1;
    if (!check) {
        if (common_read_file(flags_path, 1 << 20, &flags, &len, &e) < 0) {
            fprintf(stderr, "tg-mutate: %s (run make first)\n", e.msg);
            return 1;
        }
        const char *r = flag(flags, "root");
        if (r) root = r;
    }
    if (mutation_load(mut, root, &m, &mutated, err, sizeof err) < 0) {
        fprintf(stderr, "tg-mutate: %s\n", err);
        goto out;
    }
    if (check) {
        printf("%s: %d hunk(s) apply to %s\n", m.name, m.n_hunks, m.file);
        rc = 0;
        goto out;
    }
    /* DIR/src/<file>, compiled with the Makefile's flags */
    char dir[2048], path[4096], obj[4096], lib[4096];
    const char *base = strrchr(m.file, '/') ? strrchr(m.file, '/') + 1 : m.file;
    snprintf(dir, sizeof dir, "%s/src", out);
    if (common_mkdirs(dir, &e) < 0) {
        fprintf(stderr, "tg-mutate: %s\n", e.msg);
        goto out;
    }
    snprintf(path, sizeof path, "%s/%s", dir, base);
    if (write_file(path, mutated, strlen(mutated)) < 0) goto out;
    snprintf(obj, sizeof obj, "%s/%.*s.o", out, (int)(strlen(base) - 2), base);
    const char *cc = flag(flags, "cc"), *cflags = flag(flags, "cflags"), *ldflags = flag(flags, "ldflags");
    const char *ldlibs = flag(flags, "ldlibs"), *elib = flag(flags, "lib"), *main_o = flag(flags, "main");
    const char *ar = flag(flags, "ar");
    const char *isa = strstr(base, "_avx512.") ? flag(flags, "isa_avx512")
                      : strstr(base, "_avx2.") ? flag(flags, "isa_avx2")
                                              : NULL;
    const char *fp = has_word(flag(flags, "fp_strict"), m.file) ? flag(flags, "fp_flags") : NULL;
    if (!cc || !cflags || !elib || !main_o) {
        fprintf(stderr, "tg-mutate: %s: expected the keys cc, cflags, lib and main\n", flags_path);
        goto out;
    }
    args a = {0};
    char inc[2048];
    snprintf(inc, sizeof inc, "-iquote%s/%.*s", root, (int)(strrchr(m.file, '/') ? strrchr(m.file, '/') - m.file : 1),
             strrchr(m.file, '/') ? m.file : ".");
    push(&a, cc);
    push_words(&a, cflags);
    push_words(&a, fp);
    push_words(&a, isa);
    push(&a, inc);
    push(&a, "-c");
    push(&a, path);
    push(&a, "-o");
    push(&a, obj);
    if (run(&a, "compiling the mutant") < 0) goto out;
    /* a copy of the engine library with the object replaced */
    snprintf(lib, sizeof lib, "%s/libtg_engine.a", out);
    if (common_read_file(elib, (size_t)1 << 31, &libtext, &len, &e) < 0) {
        fprintf(stderr, "tg-mutate: %s\n", e.msg);
        goto out;
    }
    if (write_file(lib, libtext, len) < 0) goto out;
    char member[512];
    snprintf(member, sizeof member, "%.*s.o", (int)(strlen(base) - 2), base);
    push(&a, ar ? ar : "ar");
    push(&a, "d");
    push(&a, lib);
    push(&a, member);
    if (run(&a, "removing the original object") < 0) goto out;
    push(&a, ar ? ar : "ar");
    push(&a, "rs");
    push(&a, lib);
    push(&a, obj);
    if (run(&a, "adding the mutant object") < 0) goto out;
    snprintf(path, sizeof path, "%s/tg-engine", out);
    push(&a, cc);
    push_words(&a, ldflags);
    push(&a, "-o");
    push(&a, path);
    push(&a, main_o);
    push(&a, lib);
    push_words(&a, ldlibs);
    if (run(&a, "linking the mutant tg-engine") < 0) goto out;
    /* tg-llama next to it, for TOKGATE_BIN */
    const char *llama = flag(flags, "tg_llama");
    snprintf(path, sizeof path, "%s/tg-llama", out);
    unlink(path);
    if (llama && symlink(llama, path) < 0) {
        fprintf(stderr, "tg-mutate: linking %s: %s\n", path, strerror(errno));
        goto out;
    }
    printf("%s: built %s/tg-engine (%s mutated)\n", m.name, out, m.file);
    rc = 0;
out:
    mutation_free(&m);
    free(flags), free(mutated), free(libtext);
    return rc;
}
