/*
 * tg-mutate: builds a mutant tg-engine from one mutation file of
 * tests/mutants/ (docs/verdicts.md "The mutation suite").
 *
 *   tg-mutate MUTATION.mut --flags BUILD/mutant-flags --out DIR
 *
 * A mutation file names one source file of the engine and one or more
 * textual hunks: an exact anchor text that must occur exactly once in that
 * file, and its replacement. tg-mutate copies the file into DIR/src with
 * the hunks applied (a missing or repeated anchor is an error that names
 * the mutation, the file and the anchor's first line: the code moved, the
 * mutation must follow it), compiles that one file with the Makefile's
 * flags (BUILD/mutant-flags, written by make: compiler, flags, the per-ISA
 * flags, the engine library and the worker's main object), replaces its
 * object in a copy of libtg_engine.a and links DIR/tg-engine. DIR/tg-llama
 * is a link to the real one, so TOKGATE_BIN=DIR runs a gate whose engine
 * arms use the mutant. Every process is started from an argv (no shell).
 *
 * Mutation file format (lines):
 *   name: NAME            what: ONE LINE          file: engine/PATH.c
 *   expect: caught | limit | subtle   (what the gate must do, see the docs)
 *   needs: avx2 | avx512  (optional: the CPU feature the mutated code runs on)
 *   <<<<                  the anchor text, verbatim, on the following lines
 *   ====                  the replacement text on the following lines
 *   >>>>                  end of the hunk (several hunks may follow)
 *   lines starting with '#' outside a hunk are comments.
 *
 * `tg-mutate --check MUTATION.mut --root DIR` only applies the hunks to a
 * copy in memory and reports (exit 0 / 1); the tests use it for every file.
 * Exit status: 0 built, 1 a mutation or build error (stderr says which).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arm.h"
#include "util.h"

typedef struct hunk {
    char *anchor, *repl;
} hunk;

typedef struct mutation {
    char name[128], file[256], expect[32], needs[32], what[512];
    int n_hunks;
    hunk hunks[16];
} mutation;

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    size_t k;
    while (b && (k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *nb = realloc(b, 2 * cap + 1);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb, cap *= 2;
        }
    }
    fclose(f);
    if (b) b[n] = 0;
    if (len) *len = n;
    return b;
}

static void append(char **s, size_t *n, const char *line, size_t len)
{
    char *d = realloc(*s, *n + len + 2);
    if (!d) abort();
    memcpy(d + *n, line, len);
    d[*n + len] = '\n';
    *n += len + 1;
    d[*n] = 0;
    *s = d;
}

/* Parses a mutation file. Returns 0, or -1 with a message on stderr. */
static int parse_mutation(const char *path, mutation *m)
{
    memset(m, 0, sizeof *m);
    size_t len;
    char *text = read_all(path, &len);
    if (!text) {
        fprintf(stderr, "tg-mutate: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int state = 0, lineno = 0; /* 0 header, 1 anchor, 2 replacement */
    size_t na = 0, nr = 0;
    hunk *h = NULL;
    char *p = text;
    while (*p) {
        char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        if (state == 0) {
            char line[1024];
            snprintf(line, sizeof line, "%.*s", (int)ll, p);
            if (!strcmp(line, "<<<<")) {
                if (m->n_hunks == 16) {
                    fprintf(stderr, "tg-mutate: %s:%d: more than 16 hunks\n", path, lineno);
                    goto bad;
                }
                h = &m->hunks[m->n_hunks++];
                na = nr = 0;
                state = 1;
            } else if (line[0] && line[0] != '#') {
                char *colon = strchr(line, ':');
                const char *v = colon ? colon + 1 : "";
                while (*v == ' ') v++;
                if (colon) *colon = 0;
                if (!strcmp(line, "name")) snprintf(m->name, sizeof m->name, "%s", v);
                else if (!strcmp(line, "file")) snprintf(m->file, sizeof m->file, "%s", v);
                else if (!strcmp(line, "expect")) snprintf(m->expect, sizeof m->expect, "%s", v);
                else if (!strcmp(line, "needs")) snprintf(m->needs, sizeof m->needs, "%s", v);
                else if (!strcmp(line, "what")) snprintf(m->what, sizeof m->what, "%s", v);
                else {
                    fprintf(stderr, "tg-mutate: %s:%d: expected name:, what:, file:, expect:, needs: or <<<<\n",
                            path, lineno);
                    goto bad;
                }
            }
        } else if (state == 1) {
            if (ll == 4 && !strncmp(p, "====", 4)) state = 2;
            else append(&h->anchor, &na, p, ll);
        } else {
            if (ll == 4 && !strncmp(p, ">>>>", 4)) {
                if (!h->repl) h->repl = calloc(1, 1);
                state = 0;
            } else
                append(&h->repl, &nr, p, ll);
        }
        p = nl ? nl + 1 : p + ll;
    }
    if (state != 0) {
        fprintf(stderr, "tg-mutate: %s: a hunk is not closed (expected ==== and >>>>)\n", path);
        goto bad;
    }
    if (!m->name[0] || !m->file[0] || !m->expect[0] || m->n_hunks == 0) {
        fprintf(stderr, "tg-mutate: %s: expected name:, file:, expect: and at least one hunk\n", path);
        goto bad;
    }
    if (strcmp(m->expect, "caught") && strcmp(m->expect, "limit") && strcmp(m->expect, "subtle")) {
        fprintf(stderr, "tg-mutate: %s: expect: expected caught, limit or subtle, got '%s'\n", path, m->expect);
        goto bad;
    }
    for (int i = 0; i < m->n_hunks; i++)
        if (!m->hunks[i].anchor) {
            fprintf(stderr, "tg-mutate: %s: hunk %d has an empty anchor\n", path, i + 1);
            goto bad;
        }
    free(text);
    return 0;
bad:
    free(text);
    return -1;
}

/* Applies the hunks to src; returns the mutated text, or NULL after
 * naming the anchor that is missing or not unique. */
static char *apply(const mutation *m, const char *src)
{
    char *cur = strdup(src);
    for (int i = 0; cur && i < m->n_hunks; i++) {
        const hunk *h = &m->hunks[i];
        char *at = strstr(cur, h->anchor);
        char first[128];
        snprintf(first, sizeof first, "%.*s", (int)strcspn(h->anchor, "\n"), h->anchor);
        if (!at) {
            fprintf(stderr, "tg-mutate: mutation %s: anchor not found in %s (hunk %d, first line \"%s\"): the code "
                            "moved; update tests/mutants/%s.mut\n",
                    m->name, m->file, i + 1, first, m->name);
            free(cur);
            return NULL;
        }
        if (strstr(at + 1, h->anchor)) {
            fprintf(stderr, "tg-mutate: mutation %s: anchor found more than once in %s (hunk %d, first line \"%s\")\n",
                    m->name, m->file, i + 1, first);
            free(cur);
            return NULL;
        }
        size_t pre = (size_t)(at - cur), al = strlen(h->anchor), rl = strlen(h->repl), tl = strlen(cur);
        char *n = malloc(tl - al + rl + 1);
        if (!n) abort();
        memcpy(n, cur, pre);
        memcpy(n + pre, h->repl, rl);
        memcpy(n + pre + rl, at + al, tl - pre - al + 1);
        free(cur);
        cur = n;
    }
    return cur;
}

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
static const char *flag(char *text, const char *key)
{
    size_t kl = strlen(key);
    for (char *p = text; p && *p;) {
        char *nl = strchr(p, '\n');
        if (!strncmp(p, key, kl) && (p[kl] == ' ' || p[kl] == '\n' || !p[kl])) {
            char *v = p + kl + (p[kl] == ' ');
            char *e = strchr(v, '\n');
            size_t n = e ? (size_t)(e - v) : strlen(v);
            char *copy = malloc(n + 1);
            if (!copy) abort();
            memcpy(copy, v, n);
            copy[n] = 0;
            if (g_n_kept == 32) {
                free(copy);
                return NULL;
            }
            return g_kept[g_n_kept++] = copy;
        }
        p = nl ? nl + 1 : NULL;
    }
    return NULL;
}

typedef struct args {
    char *v[512];
    int n;
} args;

static void push(args *a, const char *s)
{
    if (a->n < 511) a->v[a->n++] = strdup(s), a->v[a->n] = NULL;
}

/* Splits words on spaces (the Makefile's flags hold no quoted words). */
static void push_words(args *a, const char *s)
{
    while (s && *s) {
        while (*s == ' ') s++;
        size_t n = strcspn(s, " ");
        if (n) {
            char w[1024];
            snprintf(w, sizeof w, "%.*s", (int)n, s);
            push(a, w);
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

/* mkdir -p: every missing folder of path. */
static void mkdirs(const char *path)
{
    char b[2048];
    snprintf(b, sizeof b, "%s", path);
    for (char *p = b + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(b, 0755);
            *p = '/';
        }
    mkdir(b, 0755);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tg-mutate MUTATION.mut --flags FILE --out DIR\n"
               "       tg-mutate --check MUTATION.mut --root DIR\n");
}

static int build(const char *mut, const char *flags_path, const char *out, const char *root, int check);
static int build_mutant(const mutation *mp, const char *flags_path, const char *out, const char *root, int check);

static void mutation_free(mutation *m)
{
    for (int i = 0; i < m->n_hunks; i++) free(m->hunks[i].anchor), free(m->hunks[i].repl);
    m->n_hunks = 0;
}

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

/* Applies mutation file mut (and, unless check, builds the mutant into
 * out). Returns the exit status. */
static int build(const char *mut, const char *flags_path, const char *out, const char *root, int check)
{
    mutation m;
    if (parse_mutation(mut, &m) < 0) {
        mutation_free(&m);
        return 1;
    }
    int rc = build_mutant(&m, flags_path, out, root, check);
    mutation_free(&m);
    return rc;
}

static int build_mutant(const mutation *mp, const char *flags_path, const char *out, const char *root, int check)
{
    mutation m = *mp;
    char *flags = NULL, *src = NULL, *mutated = NULL, *libtext = NULL;
    int rc = 1;
    if (!check) {
        flags = read_all(flags_path, NULL);
        if (!flags) {
            fprintf(stderr, "tg-mutate: %s: %s (run make first)\n", flags_path, strerror(errno));
            goto out;
        }
        const char *r = flag(flags, "root");
        if (r) root = r;
    }
    char src_path[2048];
    snprintf(src_path, sizeof src_path, "%s/%s", root, m.file);
    src = read_all(src_path, NULL);
    if (!src) {
        fprintf(stderr, "tg-mutate: mutation %s: %s: %s\n", m.name, src_path, strerror(errno));
        goto out;
    }
    mutated = apply(&m, src);
    if (!mutated) goto out;
    if (check) {
        printf("%s: %d hunk(s) apply to %s\n", m.name, m.n_hunks, m.file);
        rc = 0;
        goto out;
    }
    /* DIR/src/<file>, compiled with the Makefile's flags */
    char dir[2048], path[4096], obj[4096], lib[4096];
    const char *base = strrchr(m.file, '/') ? strrchr(m.file, '/') + 1 : m.file;
    snprintf(dir, sizeof dir, "%s/src", out);
    mkdirs(dir);
    snprintf(path, sizeof path, "%s/%s", dir, base);
    FILE *f = fopen(path, "w");
    if (!f || fputs(mutated, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "tg-mutate: %s: cannot write\n", path);
        goto out;
    }
    snprintf(obj, sizeof obj, "%s/%.*s.o", out, (int)(strlen(base) - 2), base);
    const char *cc = flag(flags, "cc"), *cflags = flag(flags, "cflags"), *ldflags = flag(flags, "ldflags");
    const char *ldlibs = flag(flags, "ldlibs"), *elib = flag(flags, "lib"), *main_o = flag(flags, "main");
    const char *ar = flag(flags, "ar");
    const char *isa = strstr(base, "_avx512.") ? flag(flags, "isa_avx512")
                      : strstr(base, "_avx2.") ? flag(flags, "isa_avx2")
                                              : NULL;
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
    push_words(&a, isa);
    push(&a, inc);
    push(&a, "-c");
    push(&a, path);
    push(&a, "-o");
    push(&a, obj);
    if (run(&a, "compiling the mutant") < 0) goto out;
    /* a copy of the engine library with the object replaced */
    snprintf(lib, sizeof lib, "%s/libtg_engine.a", out);
    size_t ll;
    libtext = read_all(elib, &ll);
    f = libtext ? fopen(lib, "wb") : NULL;
    if (!f || fwrite(libtext, 1, ll, f) != ll || fclose(f) != 0) {
        fprintf(stderr, "tg-mutate: copying %s to %s failed\n", elib, lib);
        goto out;
    }
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
    printf("%s: built %s/tg-engine (%s mutated, expect %s)\n", m.name, out, m.file, m.expect);
    rc = 0;
out:
    free(flags), free(src), free(mutated), free(libtext);
    return rc;
}
