/*
 * mutation.h: the mutation files of tests/mutants/ (format:
 * tests/mutants/README.md), read and applied in one place for
 * tests/helpers/tg-mutate (which builds a mutant tg-engine from one file)
 * and for the tests that run the two suites: test_calibrate (the token
 * gate's: the files of tests/mutants/, `expect:`) and test_replay (the
 * stage replay's: tests/mutants/replay/, `stage:`).
 *
 * Header-only (static functions) so each program stays one file. Errors
 * are written into a caller's buffer as one sentence naming the file, and
 * for a hunk its number and the anchor's first line.
 */
#ifndef TG_TESTS_MUTATION_H
#define TG_TESTS_MUTATION_H

#include <dirent.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arm.h"
#include "common.h"
#include "replay.h"

#define MUTATION_MAX_HUNKS 16

typedef struct mutation_hunk {
    char *anchor, *repl;      /* verbatim lines, each ending in '\n' */
} mutation_hunk;

typedef struct mutation {
    char path[2 * PATH_MAX];  /* the .mut file */
    char name[128], file[256], what[512];
    char expect[32];          /* token gate suite: caught | limit | subtle; "" when absent */
    char needs[32];           /* avx2 | avx512; "" */
    int layer;                /* replay suite (stage: LAYER STAGE): -1 for the final stages; -2 absent */
    char stage[32];
    char env_key[64], env_val[256]; /* env: KEY=VALUE; "" */
    int n_hunks;
    mutation_hunk hunks[MUTATION_MAX_HUNKS];
} mutation;

static inline int mutation_err(char *err, size_t errn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int mutation_err(char *err, size_t errn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    return -1;
}

static inline void mutation_free(mutation *m)
{
    for (int i = 0; i < m->n_hunks; i++) free(m->hunks[i].anchor), free(m->hunks[i].repl);
    m->n_hunks = 0;
}

/* Appends len bytes of line and '\n' to the NUL-terminated *s. */
static inline void mutation_append(char **s, size_t *n, const char *line, size_t len)
{
    char *d = xrealloc(*s, *n + len + 2);
    memcpy(d + *n, line, len);
    d[*n + len] = '\n';
    *n += len + 1;
    d[*n] = 0;
    *s = d;
}

/* One header line "key: value" (the line is modified). Returns 0, or -1
 * with err. */
static inline int mutation_header(mutation *m, char *line, int lineno, char *err, size_t errn)
{
    char *colon = strchr(line, ':');
    const char *v = colon ? colon + 1 : "";
    while (*v == ' ') v++;
    if (colon) *colon = 0;
    if (!strcmp(line, "name")) snprintf(m->name, sizeof m->name, "%s", v);
    else if (!strcmp(line, "file")) snprintf(m->file, sizeof m->file, "%s", v);
    else if (!strcmp(line, "what")) snprintf(m->what, sizeof m->what, "%s", v);
    else if (!strcmp(line, "needs")) snprintf(m->needs, sizeof m->needs, "%s", v);
    else if (!strcmp(line, "expect")) {
        if (strcmp(v, "caught") && strcmp(v, "limit") && strcmp(v, "subtle"))
            return mutation_err(err, errn, "%s:%d: expect: expected caught, limit or subtle, got '%s'", m->path,
                                lineno, v);
        snprintf(m->expect, sizeof m->expect, "%s", v);
    } else if (!strcmp(line, "stage")) {
        char extra[2];
        if (sscanf(v, "%d %31s %1s", &m->layer, m->stage, extra) != 2 || m->layer < -1 ||
            replay_stage_parse(m->stage) < 0)
            return mutation_err(err, errn, "%s:%d: stage: expected LAYER STAGE (a layer, -1 for the final stages, "
                                "and a replay stage), got '%s'", m->path, lineno, v);
    } else if (!strcmp(line, "env")) {
        const char *eq = strchr(v, '=');
        if (!eq || eq == v || (size_t)(eq - v) >= sizeof m->env_key)
            return mutation_err(err, errn, "%s:%d: env: expected KEY=VALUE, got '%s'", m->path, lineno, v);
        snprintf(m->env_key, sizeof m->env_key, "%.*s", (int)(eq - v), v);
        snprintf(m->env_val, sizeof m->env_val, "%s", eq + 1);
    } else
        return mutation_err(err, errn, "%s:%d: expected name:, what:, file:, expect:, stage:, needs:, env: or <<<<",
                            m->path, lineno);
    return 0;
}

/* Reads the mutation file at path into *m (mutation_free it, also after
 * an error). Returns 0, or -1 with err. */
static inline int mutation_parse(const char *path, mutation *m, char *err, size_t errn)
{
    memset(m, 0, sizeof *m);
    m->layer = -2;
    snprintf(m->path, sizeof m->path, "%s", path);
    char *text;
    size_t len;
    tg_err e;
    if (common_read_file(path, 1 << 20, &text, &len, &e) < 0) return mutation_err(err, errn, "%s", e.msg);
    int state = 0, lineno = 0, rc = 0; /* 0 header, 1 anchor, 2 replacement */
    size_t na = 0, nr = 0;
    mutation_hunk *h = NULL;
    for (char *p = text; *p && rc == 0;) {
        char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        if (state == 0) {
            char line[1024];
            snprintf(line, sizeof line, "%.*s", (int)ll, p);
            if (!strcmp(line, "<<<<")) {
                if (m->n_hunks == MUTATION_MAX_HUNKS)
                    rc = mutation_err(err, errn, "%s:%d: more than %d hunks", path, lineno, MUTATION_MAX_HUNKS);
                else {
                    h = &m->hunks[m->n_hunks++];
                    na = nr = 0;
                    state = 1;
                }
            } else if (line[0] && line[0] != '#')
                rc = mutation_header(m, line, lineno, err, errn);
        } else if (state == 1) {
            if (ll == 4 && !strncmp(p, "====", 4)) state = 2;
            else mutation_append(&h->anchor, &na, p, ll);
        } else if (ll == 4 && !strncmp(p, ">>>>", 4)) {
            if (!h->repl) h->repl = xstrdup("");
            state = 0;
        } else
            mutation_append(&h->repl, &nr, p, ll);
        p = nl ? nl + 1 : p + ll;
    }
    free(text);
    if (rc < 0) return -1;
    if (state != 0) return mutation_err(err, errn, "%s: a hunk is not closed (expected ==== and >>>>)", path);
    if (!m->name[0] || !m->file[0] || m->n_hunks == 0)
        return mutation_err(err, errn, "%s: expected name:, file: and at least one hunk", path);
    if (!m->expect[0] && m->layer == -2)
        return mutation_err(err, errn, "%s: expected expect: (the token gate suite) or stage: (the replay suite)",
                            path);
    for (int i = 0; i < m->n_hunks; i++)
        if (!m->hunks[i].anchor)
            return mutation_err(err, errn, "%s: hunk %d has an empty anchor", path, i + 1);
    return 0;
}

/* Applies m's hunks in order to src. Returns the mutated text (malloc'ed),
 * or NULL with err naming the hunk whose anchor does not occur exactly
 * once (the code moved: the mutation must follow it). */
static inline char *mutation_apply(const mutation *m, const char *src, char *err, size_t errn)
{
    char *cur = xstrdup(src);
    for (int i = 0; i < m->n_hunks; i++) {
        const mutation_hunk *h = &m->hunks[i];
        char *at = strstr(cur, h->anchor);
        if (!at || strstr(at + 1, h->anchor)) {
            mutation_err(err, errn, "mutation %s: the anchor of hunk %d (first line \"%.*s\") occurs %s in %s, "
                         "expected exactly once: the code moved; update %s", m->name, i + 1,
                         (int)strcspn(h->anchor, "\n"), h->anchor, at ? "more than once" : "nowhere", m->file,
                         m->path);
            free(cur);
            return NULL;
        }
        size_t pre = (size_t)(at - cur), al = strlen(h->anchor), rl = strlen(h->repl), tl = strlen(cur);
        char *n = xmalloc(tl - al + rl + 1);
        memcpy(n, cur, pre);
        memcpy(n + pre, h->repl, rl);
        memcpy(n + pre + rl, at + al, tl - pre - al + 1);
        free(cur);
        cur = n;
    }
    return cur;
}

/* Reads the mutation file at path (into *m: mutation_free it, also after
 * an error) and applies it to its source file under root. Returns 0 with
 * *mutated (malloc'ed), or -1 with err. */
static inline int mutation_load(const char *path, const char *root, mutation *m, char **mutated, char *err,
                                size_t errn)
{
    *mutated = NULL;
    if (mutation_parse(path, m, err, errn) < 0) return -1;
    char src_path[3 * PATH_MAX], *src;
    size_t len;
    tg_err e;
    snprintf(src_path, sizeof src_path, "%s/%s", root, m->file);
    if (common_read_file(src_path, 16 << 20, &src, &len, &e) < 0)
        return mutation_err(err, errn, "mutation %s: %s", m->name, e.msg);
    *mutated = mutation_apply(m, src, err, errn);
    free(src);
    return *mutated ? 0 : -1;
}

/* The names (file names without ".mut") of the mutation files in dir,
 * sorted; returns how many (at most cap), 0 when dir cannot be read. */
static inline int mutation_list(const char *dir, char names[][64], int cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) && n < cap) {
        size_t l = strlen(de->d_name);
        if (l > 4 && l < 68 && !strcmp(de->d_name + l - 4, ".mut"))
            snprintf(names[n++], 64, "%.*s", (int)(l - 4), de->d_name);
    }
    if (d) closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[64];
            memcpy(t, names[j], 64), memcpy(names[j], names[j - 1], 64), memcpy(names[j - 1], t, 64);
        }
    return n;
}

/* Checks every mutation file of root/subdir: it parses, has the key its
 * suite reads (stage: when want_stage, else expect:), and its hunks apply
 * to the current source. Returns how many files, or -1 with err naming
 * the first that fails. */
static inline int mutation_check_dir(const char *root, const char *subdir, int want_stage, char *err, size_t errn)
{
    char dir[2 * PATH_MAX], names[64][64];
    snprintf(dir, sizeof dir, "%s/%s", root, subdir);
    int n = mutation_list(dir, names, 64);
    for (int i = 0; i < n; i++) {
        char path[2 * PATH_MAX + 80], *mutated;
        mutation m;
        snprintf(path, sizeof path, "%s/%.63s.mut", dir, names[i]);
        int rc = mutation_load(path, root, &m, &mutated, err, errn);
        if (rc == 0 && (want_stage ? m.layer == -2 : !m.expect[0]))
            rc = mutation_err(err, errn, "%s: expected %s (the %s suite)", path, want_stage ? "stage:" : "expect:",
                              want_stage ? "replay" : "token gate");
        mutation_free(&m);
        free(mutated);
        if (rc < 0) return -1;
    }
    return n;
}

#ifdef fail_msg
/* For the test programs (cmocka included first): every mutation file of
 * root/subdir checks (mutation_check_dir), and the suite has at least 10. */
static inline void mutation_assert_dir(const char *root, const char *subdir, int want_stage)
{
    char err[4096];
    int n = mutation_check_dir(root, subdir, want_stage, err, sizeof err);
    if (n < 0) fail_msg("%s", err);
    assert_true(n >= 10);
}
#endif

/* Whether this CPU runs the code m->needs names (avx2 | avx512; none:
 * always): a mutation in a kernel this CPU never selects changes nothing
 * and is skipped, not counted. */
static inline int mutation_cpu_ok(const mutation *m)
{
    if (!m->needs[0]) return 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!strcmp(m->needs, "avx2")) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!strcmp(m->needs, "avx512"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
    return 0;
}

/* Builds the mutant of mutation file mut with BUILD/bin/tg-mutate (the one
 * builder) into folder out (out/tg-engine). Returns 0, or -1 with err
 * (tg-mutate's own message: the anchor that moved, the compiler's). */
static inline int mutation_build(const char *build, const char *mut, const char *out, char *err, size_t errn)
{
    char tool[PATH_MAX + 32], flags[PATH_MAX + 32];
    snprintf(tool, sizeof tool, "%s/bin/tg-mutate", build);
    snprintf(flags, sizeof flags, "%s/mutant-flags", build);
    char *argv[] = {tool, (char *)mut, "--flags", flags, "--out", (char *)out, NULL};
    char *o = NULL;
    size_t ol = 0;
    arm_exit x;
    tg_err e;
    int rc = arm_run_command(argv, 1800, 0, 0, NULL, &o, &ol, &x, &e);
    if (rc < 0) mutation_err(err, errn, "building %s: %s\n%s", mut, e.msg, x.stderr_text ? x.stderr_text : "");
    free(o);
    arm_exit_free(&x);
    return rc < 0 ? -1 : 0;
}

#endif
