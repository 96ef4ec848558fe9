/*
 * spec.c: reading and validating gate specs (YAML through libfyaml).
 *
 * The YAML document is walked field by field. Every node that is checked
 * carries the path of the field ("arms[2].llama.lib") and its position in
 * the file, so each message reads "FILE:LINE:COL: FIELD: expected WHAT".
 * libfyaml 0.7 gives positions only through scalar tokens, so a mapping or
 * a sequence is located by its first scalar (or, when empty, by the key
 * that names it). Keys no rule knows are errors.
 */
#include "spec.h"

#include "common.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libfyaml.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Parsing context: the file name for messages and its folder for paths. */
typedef struct pctx {
    const char *file;
    char *dir;               /* folder of the spec (absolute) */
    tg_err *e;
} pctx;

/* Position (1-based) of a node: a scalar's own token, a collection's first
 * scalar, or the fallback (the key that names it). */
typedef struct pos { int line, col; } pos;

static pos node_pos(struct fy_node *n, pos fallback)
{
    if (!n) return fallback;
    if (fy_node_is_scalar(n)) {
        struct fy_token *t = fy_node_get_scalar_token(n);
        const struct fy_mark *m = t ? fy_token_start_mark(t) : NULL;
        if (m) return (pos){m->line + 1, m->column + 1};
        return fallback;
    }
    void *it = NULL;
    if (fy_node_is_mapping(n)) {
        struct fy_node_pair *p = fy_node_mapping_iterate(n, &it);
        if (p) return node_pos(fy_node_pair_key(p), fallback);
    } else if (fy_node_is_sequence(n)) {
        struct fy_node *c = fy_node_sequence_iterate(n, &it);
        if (c) return node_pos(c, fallback);
    }
    return fallback;
}

__attribute__((format(printf, 4, 5)))
static int perr(pctx *c, pos p, const char *field, const char *fmt, ...)
{
    char what[768], safe[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* values quoted from the spec may hold control bytes: never raw to a terminal */
    return tg_errf(c->e, "%s:%d:%d: %s: %s", c->file, p.line, p.col, field, common_text_safe(what, safe, sizeof safe));
}

/* Finds the first byte of text that breaks well-formed UTF-8 (overlong
 * forms, surrogates, code points above U+10FFFF, truncated sequences).
 * Returns 0 when there is none, else -1 with its 1-based line and column
 * and its offset. */
static int utf8_bad(const char *text, size_t len, int *line_out, int *col_out, size_t *off)
{
    const unsigned char *p = (const unsigned char *)text;
    int line = 1, col = 1;
    for (size_t i = 0; i < len;) {
        unsigned c = p[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = n != 0 && i + n <= len;
        for (size_t k = 1; ok && k < n; k++) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && n > 1) {
            unsigned cp = c & (0x7F >> n);
            for (size_t k = 1; k < n; k++) cp = cp << 6 | (p[i + k] & 0x3F);
            static const unsigned min[] = {0, 0, 0x80, 0x800, 0x10000};
            ok = cp >= min[n] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (!ok) {
            *line_out = line, *col_out = col, *off = i;
            return -1;
        }
        if (c == '\n') line++, col = 1;
        else col++;
        i += n;
    }
    return 0;
}

/* The scalar text of n (NUL-terminated, owned by the document) or NULL. */
static const char *scalar(struct fy_node *n)
{
    if (!n || !fy_node_is_scalar(n)) return NULL;
    return fy_node_get_scalar0(n);
}

static int is_plain(struct fy_node *n)
{
    return n && fy_node_is_scalar(n) && fy_node_get_style(n) == FYNS_PLAIN;
}

static int get_string(pctx *c, struct fy_node *n, pos at, const char *field,
                      const char *what, char **out)
{
    const char *s = scalar(n);
    if (!s || fy_node_get_style(n) == FYNS_ALIAS)
        return perr(c, node_pos(n, at), field, "expected %s", what);
    if (!*s) return perr(c, node_pos(n, at), field, "expected %s, got an empty string", what);
    size_t len = 0;
    fy_node_get_scalar(n, &len);
    if (len != strlen(s)) return perr(c, node_pos(n, at), field, "expected %s, got a string with a NUL byte", what);
    *out = xstrdup(s);
    return 0;
}

static int get_int(pctx *c, struct fy_node *n, pos at, const char *field,
                   long lo, long hi, int *out)
{
    const char *s = scalar(n);
    char *end = NULL;
    errno = 0;
    long v = s && is_plain(n) ? strtol(s, &end, 10) : 0;
    if (!s || !is_plain(n) || !*s || *end || errno)
        return perr(c, node_pos(n, at), field, "expected an integer %ld..%ld, got %s%s%s",
                    lo, hi, s ? "'" : "a collection", s ? s : "", s ? "'" : "");
    if (v < lo || v > hi)
        return perr(c, node_pos(n, at), field, "expected an integer %ld..%ld, got %ld", lo, hi, v);
    *out = (int)v;
    return 0;
}

static int get_number(pctx *c, struct fy_node *n, pos at, const char *field,
                      double lo, double hi, double *out)
{
    const char *s = scalar(n);
    char *end = NULL;
    errno = 0;
    double v = s && is_plain(n) ? strtod(s, &end) : 0;
    if (!s || !is_plain(n) || !*s || *end || errno || !isfinite(v))
        return perr(c, node_pos(n, at), field, "expected a number %g..%g, got %s%s%s",
                    lo, hi, s ? "'" : "a collection", s ? s : "", s ? "'" : "");
    if (v < lo || v > hi)
        return perr(c, node_pos(n, at), field, "expected a number %g..%g, got %g", lo, hi, v);
    *out = v;
    return 0;
}

/* A list of non-empty strings. */
static int get_strings(pctx *c, struct fy_node *n, pos at, const char *field,
                       const char *what, char ***out, int *count)
{
    if (!n || !fy_node_is_sequence(n))
        return perr(c, node_pos(n, at), field, "expected a list of %s", what);
    int k = fy_node_sequence_item_count(n), i = 0;
    char **v = xcalloc((size_t)k + 1, sizeof *v);
    void *it = NULL;
    struct fy_node *item;
    while ((item = fy_node_sequence_iterate(n, &it))) {
        char f[256];
        snprintf(f, sizeof f, "%s[%d]", field, i);
        if (get_string(c, item, node_pos(n, at), f, what, &v[i]) < 0) {
            for (int j = 0; j < i; j++) free(v[j]);
            free(v);
            return -1;
        }
        i++;
    }
    *out = v;
    *count = k;
    return 0;
}

/* JSON value of a YAML node: plain scalars that read as integers, reals,
 * booleans or null keep that type; everything else is a string. */
static json_t *node_json(struct fy_node *n)
{
    if (!n) return json_null();
    if (fy_node_is_scalar(n)) {
        const char *s = fy_node_get_scalar0(n);
        if (!s) return json_null();
        if (is_plain(n)) {
            char *end;
            errno = 0;
            long long i = strtoll(s, &end, 10);
            if (*s && !*end && !errno) return json_integer(i);
            double d = strtod(s, &end);
            if (*s && !*end && isfinite(d)) return json_real(d);
            if (!strcmp(s, "true")) return json_true();
            if (!strcmp(s, "false")) return json_false();
            if (!strcmp(s, "null") || !strcmp(s, "~")) return json_null();
        }
        return json_string(s);
    }
    void *it = NULL;
    if (fy_node_is_sequence(n)) {
        json_t *a = json_array();
        struct fy_node *item;
        while ((item = fy_node_sequence_iterate(n, &it))) json_array_append_new(a, node_json(item));
        return a;
    }
    json_t *o = json_object();
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(n, &it))) {
        const char *k = scalar(fy_node_pair_key(p));
        json_object_set_new(o, k ? k : "?", node_json(fy_node_pair_value(p)));
    }
    return o;
}

static char *json_text(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    if (!s) common_out_of_memory(0);
    return s;
}

/* Checks that mapping n has only keys from allowed[] (NULL-terminated). */
static int check_keys(pctx *c, struct fy_node *n, pos at, const char *field,
                      const char *const *allowed)
{
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(n, &it))) {
        struct fy_node *kn = fy_node_pair_key(p);
        const char *k = scalar(kn);
        int ok = 0;
        for (int i = 0; k && allowed[i]; i++) ok |= !strcmp(k, allowed[i]);
        if (!ok) {
            char list[512] = "";
            for (int i = 0; allowed[i]; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, allowed[i], sizeof list - strlen(list) - 1);
            }
            char f[300];
            snprintf(f, sizeof f, "%s%s%s", field, *field ? "." : "", k ? k : "?");
            return perr(c, node_pos(kn, at), f, "unknown key (expected one of: %s)", list);
        }
    }
    return 0;
}

/* Whether n (a value at at) is a mapping whose keys are all in allowed: 0
 * with its position in *np (NULL: not wanted), or -1 after perr (field:
 * expect when n is no mapping, or the unknown key). */
static int check_map(pctx *c, struct fy_node *n, pos at, const char *field, const char *expect,
                     const char *const *allowed, pos *np)
{
    pos p = node_pos(n, at);
    if (np) *np = p;
    if (!n || !fy_node_is_mapping(n)) return perr(c, p, field, "%s", expect);
    return check_keys(c, n, p, field, allowed);
}

/* Value of key k in mapping n, or NULL; *kp receives the key's position. */
static struct fy_node *get(struct fy_node *n, const char *k, pos *kp)
{
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(n, &it))) {
        const char *s = scalar(fy_node_pair_key(p));
        if (s && !strcmp(s, k)) {
            if (kp) *kp = node_pos(fy_node_pair_key(p), *kp);
            struct fy_node *v = fy_node_pair_value(p);
            /* "key:" with nothing after it is a null node: treat as given-but-empty */
            return v ? v : fy_node_pair_key(p);
        }
    }
    return NULL;
}

/* The value of key k in mapping n exactly as written: NULL when the key is
 * absent or has no value ("text:" alone), unlike get(). */
static struct fy_node *get_value(struct fy_node *n, const char *k, pos *kp)
{
    struct fy_node *v = get(n, k, kp);
    if (!v) return NULL;
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(n, &it)))
        if (fy_node_pair_key(p) == v) return NULL;   /* get() gave the key of an empty value */
    return v;
}

/* A YAML null: no node, or a plain empty, null, ~, Null or NULL scalar. */
static int is_null(struct fy_node *n)
{
    if (!n) return 1;
    if (!is_plain(n)) return 0;
    const char *s = scalar(n);
    return s && (!*s || !strcmp(s, "null") || !strcmp(s, "~") || !strcmp(s, "Null") || !strcmp(s, "NULL"));
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Resolves a path from the spec: absolute stays; relative is taken from the
 * current directory when it exists there, else from the spec's folder.
 * Returns a malloc'ed absolute path (realpath when the file exists). */
static char *resolve_path(pctx *c, const char *p)
{
    char buf[PATH_MAX * 2];
    if (p[0] == '/') snprintf(buf, sizeof buf, "%s", p);
    else if (file_exists(p)) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
        snprintf(buf, sizeof buf, "%s/%s", cwd, p);
    } else snprintf(buf, sizeof buf, "%s/%s", c->dir, p);
    char real[PATH_MAX];
    if (realpath(buf, real)) return xstrdup(real);
    return xstrdup(buf);
}

/* A name that becomes part of file names and markup (spec, arm, prompt
 * id): 1..128 of [A-Za-z0-9_.-], starting with a letter or digit (no "..",
 * no hidden file, no option-looking word, no control byte). */
static int valid_name(const char *s)
{
    if (!isalnum((unsigned char)*s) || strlen(s) > 128) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.') return 0;
    return 1;
}

#define NAME_RULE "1..128 letters, digits, '_', '-' or '.', starting with a letter or digit"

/* Specs and prompt files are small text files. */
#define SPEC_MAX_FILE ((size_t)256 << 20)

/* A prompt file: one prompt a line, ids p1..pN; a final newline and a
 * trailing '\r' are dropped; empty lines are errors (ids must not shift). */
static int read_prompts(pctx *c, const char *path, pos at, tg_spec *s)
{
    char *text;
    size_t len;
    tg_err fe;
    if (common_read_file(path, SPEC_MAX_FILE, &text, &len, &fe) < 0)
        return perr(c, at, "prompts", "expected a readable prompt file (%s)", fe.msg);
    if (memchr(text, 0, len)) {
        free(text);
        return perr(c, at, "prompts", "%s: expected text, found a NUL byte", path);
    }
    /* a UTF-8 byte order mark is not part of the first prompt */
    char *start = text;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) start += 3, len -= 3;
    {
        int bl, bc;
        size_t boff;
        if (utf8_bad(start, len, &bl, &bc, &boff) < 0) {
            perr(c, at, "prompts", "%s:%d: expected UTF-8 text, got byte 0x%02x", path, bl,
                 (unsigned char)start[boff]);
            free(text);
            return -1;
        }
    }
    int cap = 16, n = 0, line = 0;
    spec_prompt *v = xcalloc((size_t)cap, sizeof *v);
    char *p = start, *end = start + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        line++;
        if (le > p && le[-1] == '\r') le[-1] = 0;
        *le = 0;
        if (!*p) {
            for (int i = 0; i < n; i++) { free(v[i].id); free(v[i].text); }
            free(v);
            free(text);
            return perr(c, at, "prompts", "%s:%d: expected one prompt a line, found an empty line", path, line);
        }
        if (n == cap) {
            cap *= 2;
            v = xrealloc(v, (size_t)cap * sizeof *v);
        }
        char id[32];
        snprintf(id, sizeof id, "p%d", n + 1);
        v[n].id = xstrdup(id);
        v[n].text = xstrdup(p);
        n++;
        p = le + 1;
    }
    free(text);
    if (n == 0) {
        free(v);
        return perr(c, at, "prompts", "%s: expected at least one prompt, the file is empty", path);
    }
    s->prompts = v;
    s->n_prompts = n;
    return 0;
}

static int parse_inline_prompts(pctx *c, struct fy_node *n, pos at, tg_spec *s)
{
    int k = fy_node_sequence_item_count(n);
    if (k == 0) return perr(c, at, "prompts", "expected at least one prompt");
    s->prompts = xcalloc((size_t)k, sizeof *s->prompts);
    void *it = NULL;
    struct fy_node *item;
    int i = 0;
    static const char *const keys[] = {"id", "text", NULL};
    while ((item = fy_node_sequence_iterate(n, &it))) {
        char f[64];
        snprintf(f, sizeof f, "prompts[%d]", i);
        pos ip;
        if (check_map(c, item, at, f, "expected a mapping {id: ..., text: ...}", keys, &ip) < 0) return -1;
        char fid[80], ftx[80];
        snprintf(fid, sizeof fid, "%s.id", f);
        snprintf(ftx, sizeof ftx, "%s.text", f);
        pos kp = ip;
        struct fy_node *idn = get(item, "id", &kp);
        if (!idn) return perr(c, ip, fid, "missing (expected a prompt id such as p1)");
        if (get_string(c, idn, kp, fid, "a prompt id", &s->prompts[i].id) < 0) return -1;
        s->n_prompts = i + 1;
        if (!valid_name(s->prompts[i].id) || strchr(s->prompts[i].id, '/'))
            return perr(c, node_pos(idn, kp), fid, "expected " NAME_RULE ", got '%s'", s->prompts[i].id);
        for (int j = 0; j < i; j++)
            if (!strcmp(s->prompts[j].id, s->prompts[i].id))
                return perr(c, node_pos(idn, kp), fid, "expected a unique id, '%s' is also prompts[%d]",
                            s->prompts[i].id, j);
        kp = ip;
        struct fy_node *tn = get_value(item, "text", &kp);
        const char *t = scalar(tn);
        size_t tl = 0;
        if (t) fy_node_get_scalar(tn, &tl);
        if (!t || tl == 0 || is_null(tn))
            return perr(c, node_pos(tn, kp), ftx, "expected the prompt text (a non-empty string), got %s",
                        !tn || is_null(tn) ? "null" : !t ? "a collection" : "an empty string");
        if (tl != strlen(t)) return perr(c, node_pos(tn, kp), ftx, "expected the prompt text, got a NUL byte in it");
        s->prompts[i].text = xstrdup(t);
        i++;
    }
    return 0;
}

/* Load options: each key from known[] with its type; exec arms pass NULL
 * (any key, scalar values). The result is a JSON object text. */
typedef struct optkey {
    const char *key;
    char type;               /* i int, s string, b bool or string */
    long lo, hi;             /* i: the range the worker accepts (checked here, not at load) */
} optkey;

static int parse_options(pctx *c, struct fy_node *n, pos at, const char *field,
                         const optkey *known, char **out)
{
    if (!fy_node_is_mapping(n)) return perr(c, node_pos(n, at), field, "expected a mapping of load options");
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(n, &it))) {
        struct fy_node *kn = fy_node_pair_key(p), *vn = fy_node_pair_value(p);
        const char *k = scalar(kn);
        char f[300];
        snprintf(f, sizeof f, "%s.%s", field, k ? k : "?");
        pos kp = node_pos(kn, at);
        if (!vn || !fy_node_is_scalar(vn))
            return perr(c, node_pos(vn, kp), f, "expected a scalar value");
        if (!known) continue;
        const optkey *o = NULL;
        for (int i = 0; known[i].key; i++)
            if (k && !strcmp(k, known[i].key)) o = &known[i];
        if (!o) {
            char list[512] = "";
            for (int i = 0; known[i].key; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, known[i].key, sizeof list - strlen(list) - 1);
            }
            return perr(c, kp, f, "unknown option (expected one of: %s)", list);
        }
        int iv;
        if (o->type == 'i' && get_int(c, vn, kp, f, o->lo, o->hi, &iv) < 0) return -1;
        if (o->type == 's' && (!scalar(vn) || !*scalar(vn)))
            return perr(c, node_pos(vn, kp), f, "expected a string");
    }
    json_t *j = node_json(n);
    *out = json_text(j);
    json_decref(j);
    return 0;
}

/* The ranges are the workers' own (engine/worker/main.c, oracles/llama/
 * tg-llama.c): a value they would refuse at load is refused here, with the
 * spec's line. */
static const optkey engine_opts[] = {
    {"threads", 'i', 1, 512}, {"kv_type", 's'}, {"n_batch", 'i', 1, 4096}, {"n_ctx", 'i', 1, 1 << 20},
    {"perturb", 's'}, {NULL, 0}};
static const optkey llama_opts[] = {
    {"threads", 'i', 1, 1024}, {"flash_attn", 'b'}, {"n_gpu_layers", 'i', -1, 100000}, {"type_k", 's'},
    {"type_v", 's'}, {"n_ubatch", 'i', 1, 1 << 20}, {"n_batch", 'i', 1, 1 << 20}, {"n_ctx", 'i', 0, 1 << 24},
    {NULL, 0}};

/* timeout: N (per request) or {request: N, leg: N}. */
static int parse_timeout(pctx *c, struct fy_node *n, pos at, const char *field,
                         double *req, double *leg)
{
    if (fy_node_is_scalar(n)) return get_number(c, n, at, field, 0.001, 1e6, req);
    static const char *const keys[] = {"request", "leg", NULL};
    if (check_map(c, n, at, field, "expected seconds or {request: seconds, leg: seconds}", keys, NULL) < 0) return -1;
    char f[300];
    pos kp = at;
    struct fy_node *v;
    if ((v = get(n, "request", &kp))) {
        snprintf(f, sizeof f, "%s.request", field);
        if (get_number(c, v, kp, f, 0.001, 1e6, req) < 0) return -1;
    }
    kp = at;
    if ((v = get(n, "leg", &kp))) {
        snprintf(f, sizeof f, "%s.leg", field);
        if (get_number(c, v, kp, f, 0.001, 1e7, leg) < 0) return -1;
    }
    return 0;
}

typedef struct strv { char **v; int n, cap; } strv;
static void strv_push(strv *a, const char *s);

/* An http arm's mapping (docs/spec.md "http") into tg-http's arguments
 * (a->argv) and worker (a->worker). Secrets stay out: api_key_env and
 * headers_env name environment variables, read by tg-http. */
static int parse_http(pctx *c, struct fy_node *kv, pos kpos, const char *g, spec_arm *a)
{
    pos hp = node_pos(kv, kpos);
    if (!fy_node_is_mapping(kv))
        return perr(c, hp, g, "expected a mapping {url: ..., api: llama|openai, ...}");
    static const char *const hk[] = {"url", "api", "top_k_max", "request_timeout", "connect_timeout",
                                     "api_key_env", "headers", "headers_env", "model", "body",
                                     "tokens_per_request", "prompt", "start", "worker", NULL};
    if (check_keys(c, kv, hp, g, hk) < 0) return -1;
    strv v = {0};
    char h[200], num[64], *str = NULL;
    int rc = -1, iv;
    double dv;
    pos p = hp;
    struct fy_node *x = get(kv, "url", &p);
    snprintf(h, sizeof h, "%s.url", g);
    if (!x) { perr(c, hp, h, "missing (expected the server's base URL, e.g. http://127.0.0.1:8080)"); goto out; }
    if (get_string(c, x, p, h, "a URL", &str) < 0) goto out;
    if (strncmp(str, "http://", 7) && strncmp(str, "https://", 8)) {
        perr(c, node_pos(x, p), h, "expected an http:// or https:// URL, got '%s'", str);
        goto out;
    }
    strv_push(&v, "--url");
    strv_push(&v, str);
    free(str), str = NULL;
    static const struct { const char *key, *flag; char type; } simple[] = {
        {"api", "--api", 'a'}, {"top_k_max", "--top-k-max", 'i'}, {"request_timeout", "--timeout", 'n'},
        {"connect_timeout", "--connect-timeout", 'n'}, {"api_key_env", "--api-key-env", 'e'},
        {"model", "--model", 's'}, {"tokens_per_request", "--tokens-per-request", 'i'},
        {"prompt", "--prompt", 'p'}};
    for (size_t k = 0; k < sizeof simple / sizeof simple[0]; k++) {
        p = hp;
        if (!(x = get(kv, simple[k].key, &p))) continue;
        snprintf(h, sizeof h, "%s.%s", g, simple[k].key);
        switch (simple[k].type) {
        case 'i':
            if (get_int(c, x, p, h, 1, 100000, &iv) < 0) goto out;
            snprintf(num, sizeof num, "%d", iv);
            break;
        case 'n':
            if (get_number(c, x, p, h, 0.001, 1e6, &dv) < 0) goto out;
            snprintf(num, sizeof num, "%.17g", dv);
            break;
        default:
            if (get_string(c, x, p, h, "a string", &str) < 0) goto out;
            if ((simple[k].type == 'a' && strcmp(str, "llama") && strcmp(str, "openai")) ||
                (simple[k].type == 'p' && strcmp(str, "ids") && strcmp(str, "text"))) {
                perr(c, node_pos(x, p), h, "expected %s, got '%s'",
                     simple[k].type == 'a' ? "llama or openai" : "ids or text", str);
                goto out;
            }
            if (simple[k].type == 'e' && !valid_name(str)) {
                perr(c, node_pos(x, p), h, "expected the name of an environment variable, got '%s'", str);
                goto out;
            }
            snprintf(num, sizeof num, "%s", "");
            break;
        }
        strv_push(&v, simple[k].flag);
        strv_push(&v, str ? str : num);
        free(str), str = NULL;
    }
    /* headers (literal values) and headers_env (values from the environment) */
    for (int env = 0; env < 2; env++) {
        p = hp;
        const char *key = env ? "headers_env" : "headers";
        if (!(x = get(kv, key, &p))) continue;
        snprintf(h, sizeof h, "%s.%s", g, key);
        if (!fy_node_is_mapping(x)) {
            perr(c, node_pos(x, p), h, "expected a mapping {Header-Name: %s}", env ? "ENV_VAR" : "value");
            goto out;
        }
        void *it = NULL;
        struct fy_node_pair *pr;
        while ((pr = fy_node_mapping_iterate(x, &it))) {
            const char *hn = scalar(fy_node_pair_key(pr)), *hv = scalar(fy_node_pair_value(pr));
            char hf[300];
            snprintf(hf, sizeof hf, "%s.%s", h, hn ? hn : "?");
            pos vp = node_pos(fy_node_pair_key(pr), p);
            if (!hn || !valid_name(hn) || !hv || !*hv || strchr(hv, '\n') || strchr(hv, '\r') ||
                (env && !valid_name(hv))) {
                perr(c, vp, hf, "expected %s", env ? "Header-Name: ENV_VAR_NAME" : "Header-Name: one-line value");
                goto out;
            }
            char *line = xasprintf(env ? "%s=%s" : "%s: %s", hn, hv);
            strv_push(&v, env ? "--header-env" : "--header");
            strv_push(&v, line);
            free(line);
        }
    }
    p = hp;
    if ((x = get(kv, "body", &p))) {
        snprintf(h, sizeof h, "%s.body", g);
        if (!fy_node_is_mapping(x)) { perr(c, node_pos(x, p), h, "expected a mapping of request fields"); goto out; }
        json_t *j = node_json(x);
        char *t = json_text(j);
        json_decref(j);
        strv_push(&v, "--body");
        strv_push(&v, t);
        free(t);
    }
    p = hp;
    if ((x = get(kv, "worker", &p))) {
        snprintf(h, sizeof h, "%s.worker", g);
        if (get_string(c, x, p, h, "a string path to a tg-http executable", &str) < 0) goto out;
        a->worker = resolve_path(c, str);
        free(str), str = NULL;
    }
    p = hp;
    if ((x = get(kv, "start", &p))) {
        /* last: everything after --start is the server's argv */
        snprintf(h, sizeof h, "%s.start", g);
        pos sp = node_pos(x, p);
        if (!fy_node_is_mapping(x)) {
            perr(c, sp, h, "expected a mapping {argv: [program, args...], health: /health, wait: seconds}");
            goto out;
        }
        static const char *const sk[] = {"argv", "health", "wait", NULL};
        if (check_keys(c, x, sp, h, sk) < 0) goto out;
        char hh[240];
        pos q = sp;
        struct fy_node *y;
        if ((y = get(x, "health", &q))) {
            snprintf(hh, sizeof hh, "%s.health", h);
            if (get_string(c, y, q, hh, "a path such as /health", &str) < 0) goto out;
            if (str[0] != '/') { perr(c, node_pos(y, q), hh, "expected a path starting with '/', got '%s'", str); goto out; }
            strv_push(&v, "--health");
            strv_push(&v, str);
            free(str), str = NULL;
        }
        q = sp;
        if ((y = get(x, "wait", &q))) {
            snprintf(hh, sizeof hh, "%s.wait", h);
            if (get_number(c, y, q, hh, 0.001, 1e6, &dv) < 0) goto out;
            snprintf(num, sizeof num, "%.17g", dv);
            strv_push(&v, "--start-wait");
            strv_push(&v, num);
        }
        q = sp;
        snprintf(hh, sizeof hh, "%s.argv", h);
        if (!(y = get(x, "argv", &q))) { perr(c, sp, hh, "missing (expected [program, args...])"); goto out; }
        char **sv = NULL;
        int sn = 0;
        if (get_strings(c, y, q, hh, "argv words", &sv, &sn) < 0) goto out;
        if (sn == 0) {
            free(sv);
            perr(c, node_pos(y, q), hh, "expected at least the program name");
            goto out;
        }
        strv_push(&v, "--start");
        for (int k = 0; k < sn; k++) {
            /* a program named with a folder is a path: resolved as the spec's paths are */
            if (k == 0 && strchr(sv[0], '/')) {
                char *r = resolve_path(c, sv[0]);
                strv_push(&v, r);
                free(r);
            } else {
                strv_push(&v, sv[k]);
            }
            free(sv[k]);
        }
        free(sv);
    }
    a->argv = v.v;
    a->n_argv = v.n;
    v.v = NULL;
    rc = 0;
out:
    free(str);
    if (v.v)
        for (int k = 0; k < v.n; k++) free(v.v[k]);
    free(v.v);
    return rc;
}

/* env: {NAME: VALUE, ...} of arm entry n into a->env as "NAME=VALUE"
 * (protocol arms). Names are [A-Za-z_][A-Za-z0-9_]*, values
 * scalars. Returns 0 (also when absent) or -1 with the message. */
static int parse_arm_env(pctx *c, struct fy_node *n, pos ap, const char *f, spec_arm *a)
{
    pos kp = ap;
    struct fy_node *v = get(n, "env", &kp);
    if (!v) return 0;
    char g[128];
    snprintf(g, sizeof g, "%s.env", f);
    if (a->kind == SPEC_ARM_COMMAND)
        return perr(c, node_pos(v, kp), g, "expected env only on a protocol arm, not a command arm");
    if (!fy_node_is_mapping(v))
        return perr(c, node_pos(v, kp), g, "expected a mapping {NAME: value} (e.g. {TG_CPU_ISA: avx2})");
    int k = fy_node_mapping_item_count(v);
    a->env = xcalloc((size_t)k + 1, sizeof *a->env);
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(v, &it))) {
        const char *name = scalar(fy_node_pair_key(p)), *val = scalar(fy_node_pair_value(p));
        char h[300];
        snprintf(h, sizeof h, "%s.%s", g, name ? name : "?");
        int ok = name && (isalpha((unsigned char)name[0]) || name[0] == '_');
        for (const char *q = name; ok && *q; q++) ok = isalnum((unsigned char)*q) || *q == '_';
        if (!ok)
            return perr(c, node_pos(fy_node_pair_key(p), kp), h,
                        "expected a variable name (letters, digits, '_', not a digit first)");
        if (!val) return perr(c, node_pos(fy_node_pair_value(p), kp), h, "expected a scalar value");
        a->env[a->n_env++] = xasprintf("%s=%s", name, val);
    }
    return 0;
}

/* prompts: [ID, ...] of arm entry n: the prompt ids (of the spec's prompt
 * set, read before the arms) the arm runs; the others it skips. */
static int parse_arm_prompts(pctx *c, struct fy_node *n, pos ap, const char *f, spec_arm *a,
                             const tg_spec *s)
{
    pos kp = ap;
    struct fy_node *v = get(n, "prompts", &kp);
    if (!v) return 0;
    char g[128];
    snprintf(g, sizeof g, "%s.prompts", f);
    if (get_strings(c, v, kp, g, "prompt ids", &a->only, &a->n_only) < 0) return -1;
    if (a->n_only == 0) return perr(c, node_pos(v, kp), g, "expected at least one prompt id");
    if (a->kind == SPEC_ARM_COMMAND)
        return perr(c, node_pos(v, kp), g, "expected prompts only on a protocol arm, not a command arm");
    for (int i = 0; i < a->n_only; i++) {
        int found = 0;
        for (int q = 0; q < s->n_prompts; q++) found |= !strcmp(s->prompts[q].id, a->only[i]);
        if (!found) {
            char h[160];
            snprintf(h, sizeof h, "%s[%d]", g, i);
            return perr(c, node_pos(fy_node_sequence_get_by_index(v, i), kp), h,
                        "expected a prompt id of this spec (p1..p%d or an inline id), got '%s'",
                        s->n_prompts, a->only[i]);
        }
    }
    return 0;
}

static int parse_arm(pctx *c, struct fy_node *n, pos at, int i, tg_spec *s)
{
    spec_arm *a = &s->arms[i];
    char f[64], g[128];
    snprintf(f, sizeof f, "arms[%d]", i);
    pos ap = node_pos(n, at);
    a->line = ap.line;
    a->timeout_request = -1;
    a->timeout_leg = -1;
    static const char *const keys[] = {"name", "engine", "llama", "command", "exec", "http", "options",
                                       "role", "variant_of", "timeout", "strip", "env", "prompts", NULL};
    if (check_map(c, n, at, f, "expected a mapping {name: ..., engine|llama|command|exec|http: ...}", keys, NULL) < 0)
        return -1;
    pos kp = ap;
    struct fy_node *v = get(n, "name", &kp);
    snprintf(g, sizeof g, "%s.name", f);
    if (!v) return perr(c, ap, g, "missing (expected the arm's name)");
    if (get_string(c, v, kp, g, "the arm's name", &a->name) < 0) return -1;
    if (!valid_name(a->name))
        return perr(c, node_pos(v, kp), g, "expected " NAME_RULE ", got '%s'", a->name);
    for (int j = 0; j < i; j++)
        if (!strcmp(s->arms[j].name, a->name))
            return perr(c, node_pos(v, kp), g, "expected a unique name, '%s' is also arms[%d]", a->name, j);

    /* exactly one kind */
    static const char *const kinds[] = {"engine", "llama", "command", "exec", "http"};
    int nk = 0, kind = -1;
    pos kpos = ap;
    struct fy_node *kv = NULL;
    for (int k = 0; k < 5; k++) {
        pos p = ap;
        struct fy_node *x = get(n, kinds[k], &p);
        if (x) { nk++; kind = k; kv = x; kpos = p; }
    }
    if (nk != 1)
        return perr(c, ap, f, "expected exactly one of engine, llama, command, exec, http (found %d)", nk);
    a->kind = (spec_arm_kind)kind;
    a->kind_name = kinds[kind];
    snprintf(g, sizeof g, "%s.%s", f, kinds[kind]);

    pos op = ap;
    struct fy_node *opts = get(n, "options", &op);
    char fo[128];
    snprintf(fo, sizeof fo, "%s.options", f);
    switch (a->kind) {
    case SPEC_ARM_ENGINE:
        if (get_string(c, kv, kpos, g, "a tier: ref, cpu or gpu", &a->tier) < 0) return -1;
        if (strcmp(a->tier, "ref") && strcmp(a->tier, "cpu") && strcmp(a->tier, "gpu"))
            return perr(c, node_pos(kv, kpos), g, "expected a tier: ref, cpu or gpu, got '%s'", a->tier);
        if (opts && parse_options(c, opts, op, fo, engine_opts, &a->options_json) < 0) return -1;
        a->role = xstrdup("test");
        break;
    case SPEC_ARM_LLAMA: {
        if (!fy_node_is_mapping(kv))
            return perr(c, node_pos(kv, kpos), g, "expected a mapping {lib: PATH, wrap: [...], worker: PATH, options: {...}}");
        if (opts) return perr(c, op, fo, "expected the options inside llama: (llama: {lib: ..., options: {...}})");
        static const char *const lk[] = {"lib", "wrap", "worker", "options", NULL};
        if (check_keys(c, kv, node_pos(kv, kpos), g, lk) < 0) return -1;
        pos lp = node_pos(kv, kpos);
        char h[160];
        snprintf(h, sizeof h, "%s.lib", g);
        struct fy_node *x = get(kv, "lib", &lp);
        if (!x) return perr(c, node_pos(kv, kpos), h, "missing (expected a string path to libllama.so)");
        char *raw;
        if (get_string(c, x, lp, h, "a string path", &raw) < 0) return -1;
        a->lib = resolve_path(c, raw);
        free(raw);
        lp = node_pos(kv, kpos);
        if ((x = get(kv, "worker", &lp))) {
            snprintf(h, sizeof h, "%s.worker", g);
            if (get_string(c, x, lp, h, "a string path to a tg-llama executable", &raw) < 0) return -1;
            a->worker = resolve_path(c, raw);
            free(raw);
        }
        lp = node_pos(kv, kpos);
        if ((x = get(kv, "wrap", &lp))) {
            snprintf(h, sizeof h, "%s.wrap", g);
            if (get_strings(c, x, lp, h, "argv words (e.g. [qemu-aarch64, -L, /usr/aarch64-linux-gnu])",
                            &a->wrap, &a->n_wrap) < 0)
                return -1;
            if (a->n_wrap == 0) return perr(c, node_pos(x, lp), h, "expected at least one argv word");
        }
        lp = node_pos(kv, kpos);
        if ((x = get(kv, "options", &lp))) {
            snprintf(h, sizeof h, "%s.options", g);
            if (parse_options(c, x, lp, h, llama_opts, &a->options_json) < 0) return -1;
        }
        a->role = xstrdup("oracle");
        break;
    }
    case SPEC_ARM_HTTP:
        if (opts) return perr(c, op, fo, "expected no options for an http arm (its settings go inside http:)");
        if (parse_http(c, kv, kpos, g, a) < 0) return -1;
        a->role = xstrdup("test");
        break;
    case SPEC_ARM_COMMAND:
    case SPEC_ARM_EXEC:
        if (get_strings(c, kv, kpos, g, "argv words", &a->argv, &a->n_argv) < 0) return -1;
        if (a->n_argv == 0) return perr(c, node_pos(kv, kpos), g, "expected at least the program name");
        if (a->kind == SPEC_ARM_COMMAND) {
            if (opts) return perr(c, op, fo, "expected no options for a command arm (it is not a protocol worker)");
            a->role = xstrdup("custody");
            pos sp = ap;
            struct fy_node *st = get(n, "strip", &sp);
            char fs[128];
            snprintf(fs, sizeof fs, "%s.strip", f);
            if (st && get_strings(c, st, sp, fs, "stdout suffixes (e.g. [\"\\n\\n\"])", &a->strip, &a->n_strip) < 0)
                return -1;
        } else {
            if (opts && parse_options(c, opts, op, fo, NULL, &a->options_json) < 0) return -1;
            a->role = xstrdup("test");
        }
        break;
    }
    if (a->kind != SPEC_ARM_COMMAND) {
        pos sp = ap;
        snprintf(g, sizeof g, "%s.strip", f);
        if (get(n, "strip", &sp)) return perr(c, sp, g, "expected strip only on a command arm, not %s", a->kind_name);
    }
    if (!a->options_json) a->options_json = xstrdup("{}");

    kp = ap;
    if ((v = get(n, "role", &kp))) {
        snprintf(g, sizeof g, "%s.role", f);
        char *r;
        if (get_string(c, v, kp, g, "a role: test, oracle or custody", &r) < 0) return -1;
        if (strcmp(r, "test") && strcmp(r, "oracle") && strcmp(r, "custody")) {
            perr(c, node_pos(v, kp), g, "expected a role: test, oracle or custody, got '%s'", r);
            free(r);
            return -1;
        }
        if (!strcmp(r, "custody") != (a->kind == SPEC_ARM_COMMAND)) {
            perr(c, node_pos(v, kp), g, "expected %s for a %s arm, got '%s'",
                 a->kind == SPEC_ARM_COMMAND ? "custody" : "test or oracle", a->kind_name, r);
            free(r);
            return -1;
        }
        free(a->role);
        a->role = r;
    }
    kp = ap;
    if ((v = get(n, "variant_of", &kp))) {
        snprintf(g, sizeof g, "%s.variant_of", f);
        if (get_string(c, v, kp, g, "the name of another arm", &a->variant_of) < 0) return -1;
    }
    kp = ap;
    if ((v = get(n, "timeout", &kp))) {
        snprintf(g, sizeof g, "%s.timeout", f);
        if (parse_timeout(c, v, kp, g, &a->timeout_request, &a->timeout_leg) < 0) return -1;
    }
    if (parse_arm_env(c, n, ap, f, a) < 0 || parse_arm_prompts(c, n, ap, f, a, s) < 0) return -1;
    json_t *j = node_json(n);
    a->config_json = json_text(j);
    json_decref(j);
    return 0;
}

static const char *const top_keys[] = {"name", "model", "prompts", "steps", "top_k", "legs", "mode",
                                       "reference", "policy", "arms", "fault_patterns", "timeout",
                                       "jobs", "dumps", "exact", "calibration", "replay", NULL};

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* dumps: {steps: [N, ...], prompts: [ID, ...], stages: [NAME, ...]}; steps
 * required, the other two optional. Needs s->steps and the prompts. */
static int parse_dumps(pctx *c, struct fy_node *n, pos at, tg_spec *s)
{
    static const char *const dk[] = {"steps", "prompts", "stages", NULL};
    pos dp;
    if (check_map(c, n, at, "dumps", "expected a mapping {steps: [N, ...], prompts: [ID, ...], stages: [NAME, ...]}",
                  dk, &dp) < 0)
        return -1;
    pos q = dp;
    struct fy_node *x = get(n, "steps", &q);
    if (!x) return perr(c, dp, "dumps.steps", "missing (expected a list of step numbers 0..steps-1)");
    if (!fy_node_is_sequence(x) || fy_node_sequence_item_count(x) == 0)
        return perr(c, node_pos(x, q), "dumps.steps", "expected a non-empty list of step numbers 0..%d",
                    s->steps - 1);
    int k = fy_node_sequence_item_count(x);
    s->dump_steps = xcalloc((size_t)k, sizeof *s->dump_steps);
    void *it = NULL;
    struct fy_node *item;
    while ((item = fy_node_sequence_iterate(x, &it))) {
        char f[64];
        snprintf(f, sizeof f, "dumps.steps[%d]", s->n_dump_steps);
        int v;
        if (get_int(c, item, node_pos(x, q), f, 0, s->steps - 1, &v) < 0) return -1;
        for (int j = 0; j < s->n_dump_steps; j++)
            if (s->dump_steps[j] == v)
                return perr(c, node_pos(item, q), f, "expected each step once, %d is listed twice", v);
        s->dump_steps[s->n_dump_steps++] = v;
    }
    qsort(s->dump_steps, (size_t)s->n_dump_steps, sizeof *s->dump_steps, cmp_int);
    q = dp;
    if ((x = get(n, "prompts", &q))) {
        if (get_strings(c, x, q, "dumps.prompts", "prompt ids", &s->dump_prompts, &s->n_dump_prompts) < 0)
            return -1;
        if (s->n_dump_prompts == 0) return perr(c, node_pos(x, q), "dumps.prompts", "expected at least one prompt id");
        for (int i = 0; i < s->n_dump_prompts; i++) {
            int found = 0;
            for (int p = 0; p < s->n_prompts; p++) found |= !strcmp(s->prompts[p].id, s->dump_prompts[i]);
            if (!found) {
                char f[64];
                snprintf(f, sizeof f, "dumps.prompts[%d]", i);
                return perr(c, node_pos(fy_node_sequence_get_by_index(x, i), q), f,
                            "expected a prompt id of this spec (p1..p%d or an inline id), got '%s'",
                            s->n_prompts, s->dump_prompts[i]);
            }
        }
    }
    q = dp;
    if ((x = get(n, "stages", &q))) {
        if (get_strings(c, x, q, "dumps.stages", "stage names", &s->dump_stages, &s->n_dump_stages) < 0)
            return -1;
        if (s->n_dump_stages == 0) return perr(c, node_pos(x, q), "dumps.stages", "expected at least one stage");
        for (int i = 0; i < s->n_dump_stages; i++) {
            static const char *const stages[] = {"attn_norm", "q", "k", "v", "attn_out", "ffn_norm",
                                                 "ffn_out", "residual", "logits", NULL};
            const char *g = s->dump_stages[i];
            int known = 0;
            for (int j = 0; stages[j]; j++) known |= !strcmp(stages[j], g);
            if (!known) {
                char f[64];
                snprintf(f, sizeof f, "dumps.stages[%d]", i);
                return perr(c, node_pos(fy_node_sequence_get_by_index(x, i), q), f,
                            "expected one of: " SPEC_DUMP_STAGES ", got '%s'", g);
            }
        }
    }
    return 0;
}

/* replay: {steps: N, gate: true|false}: the gate replays each engine arm's
 * stages against the exact arbiter over each prompt's first N steps (and
 * up to its last contested step); gate (default true) makes a replay FAIL
 * fail TOKEN_GATE; variants (default false) also replays the arms with
 * variant_of (a panel of legitimate variants). */
static int parse_replay(pctx *c, struct fy_node *n, pos at, tg_spec *s)
{
    static const char *const rk[] = {"steps", "gate", "variants", NULL};
    pos rp;
    if (check_map(c, n, at, "replay", "expected a mapping {steps: N, gate: true|false, variants: true|false}", rk,
                  &rp) < 0)
        return -1;
    pos q = rp;
    struct fy_node *x = get(n, "steps", &q);
    /* not bounded by steps: a sweep may override steps after the parse (the gate clamps) */
    if (!x) return perr(c, rp, "replay.steps", "missing (expected the steps replayed per prompt, 0..100000)");
    if (get_int(c, x, q, "replay.steps", 0, 100000, &s->replay_steps) < 0) return -1;
    s->replay = 1;
    s->replay_gate = 1;
    q = rp;
    if ((x = get(n, "gate", &q))) {
        const char *v = fy_node_is_scalar(x) ? fy_node_get_scalar0(x) : NULL;
        if (!v || (strcmp(v, "true") && strcmp(v, "false")))
            return perr(c, node_pos(x, q), "replay.gate", "expected true or false");
        s->replay_gate = !strcmp(v, "true");
    }
    q = rp;
    if ((x = get(n, "variants", &q))) {
        const char *v = fy_node_is_scalar(x) ? fy_node_get_scalar0(x) : NULL;
        if (!v || (strcmp(v, "true") && strcmp(v, "false")))
            return perr(c, node_pos(x, q), "replay.variants", "expected true or false");
        s->replay_variants = !strcmp(v, "true");
    }
    return 0;
}

int spec_dumps_prompt(const tg_spec *s, int p)
{
    if (!s || s->n_dump_steps == 0 || p < 0 || p >= s->n_prompts) return 0;
    if (s->n_dump_prompts == 0) return 1;
    for (int i = 0; i < s->n_dump_prompts; i++)
        if (!strcmp(s->dump_prompts[i], s->prompts[p].id)) return 1;
    return 0;
}

int spec_dumps_stage(const tg_spec *s, const char *stage)
{
    if (!s || !stage) return 0;
    if (s->n_dump_stages == 0) return 1;
    for (int i = 0; i < s->n_dump_stages; i++)
        if (!strcmp(s->dump_stages[i], stage)) return 1;
    return 0;
}

/* exact: ARM and calibration: {factor: F, limit_k: K, budget: M, from: NAME}
 * (docs/spec.md). Needs the arms. The exact arm is an engine arm of tier
 * ref (the tier that computes the quantized model with f64 sums); the
 * policies calibrated and error-budget need it (calibrated can do without,
 * then it has no exact-arithmetic control limit). */
static int parse_calibration(pctx *c, struct fy_node *root, pos at, tg_spec *s)
{
    s->cal_factor = 2.0;
    s->cal_limit_k = 3.0;
    s->cal_budget = 2.0;
    pos kp = at;
    struct fy_node *v = get(root, "exact", &kp);
    if (v) {
        if (get_string(c, v, kp, "exact", "the name of an engine arm of tier ref", &s->exact) < 0) return -1;
        int i = spec_find_arm(s, s->exact);
        if (i < 0 || s->arms[i].kind != SPEC_ARM_ENGINE || strcmp(s->arms[i].tier, "ref"))
            return perr(c, node_pos(v, kp), "exact", "expected the name of an engine arm of tier ref, got '%s'",
                        s->exact);
        if (i == s->ref_index)
            return perr(c, node_pos(v, kp), "exact", "expected an arm other than the reference '%s'", s->reference);
    }
    kp = at;
    v = get(root, "calibration", &kp);
    if (v) {
        static const char *const ck[] = {"factor", "limit_k", "budget", "from", NULL};
        pos cp;
        if (check_map(c, v, kp, "calibration", "expected a mapping {factor: F, limit_k: K, budget: M, from: NAME}", ck,
                      &cp) < 0)
            return -1;
        pos q = cp;
        struct fy_node *x;
        if ((x = get(v, "factor", &q)) && get_number(c, x, q, "calibration.factor", 0.1, 100, &s->cal_factor) < 0)
            return -1;
        q = cp;
        if ((x = get(v, "limit_k", &q)) && get_number(c, x, q, "calibration.limit_k", 0.1, 100, &s->cal_limit_k) < 0)
            return -1;
        q = cp;
        if ((x = get(v, "budget", &q)) && get_number(c, x, q, "calibration.budget", 1, 1000, &s->cal_budget) < 0)
            return -1;
        q = cp;
        if ((x = get(v, "from", &q)) &&
            get_string(c, x, q, "calibration.from", "the name of a spec whose stored calibration to use",
                       &s->cal_from) < 0)
            return -1;
    }
    if (!strcmp(s->policy_kind, "error-budget") && !s->exact)
        return perr(c, at, "exact", "missing (policy error-budget needs the exact-arithmetic arm, e.g. exact: ref)");
    return 0;
}

static int parse_root(pctx *c, struct fy_node *root, tg_spec *s)
{
    pos at = {1, 1};
    if (!root || !fy_node_is_mapping(root))
        return perr(c, node_pos(root, at), "spec", "expected a mapping at the top (name:, model:, prompts:, ...)");
    if (check_keys(c, root, at, "", top_keys) < 0) return -1;
    /* required fields first, in the order of the reference */
    static const char *const required[] = {"name", "model", "prompts", "steps", "top_k", "legs",
                                           "reference", "policy", "arms", NULL};
    for (int i = 0; required[i]; i++)
        if (!get(root, required[i], NULL))
            return perr(c, at, required[i], "missing (a spec must give name, model, prompts, steps, "
                        "top_k, legs, reference, policy and arms)");
    pos kp;
    struct fy_node *v;

    kp = at; v = get(root, "name", &kp);
    if (get_string(c, v, kp, "name", "the spec's name", &s->name) < 0) return -1;
    /* the name makes file names (evidence, trend plots) and markup */
    if (!valid_name(s->name)) return perr(c, node_pos(v, kp), "name", "expected " NAME_RULE ", got '%s'", s->name);

    kp = at; v = get(root, "model", &kp);
    {
        static const char *const mk[] = {"path", "sha256", NULL};
        pos mp;
        if (check_map(c, v, kp, "model", "expected a mapping {path: FILE, sha256: HEX}", mk, &mp) < 0) return -1;
        pos q = mp;
        struct fy_node *x = get(v, "path", &q);
        if (!x) return perr(c, mp, "model.path", "missing (expected the model file's path)");
        char *raw;
        if (get_string(c, x, q, "model.path", "a string path", &raw) < 0) return -1;
        s->model_path = resolve_path(c, raw);
        free(raw);
        q = mp;
        x = get(v, "sha256", &q);
        if (!x) return perr(c, mp, "model.sha256", "missing (expected 64 hex digits: run sha256sum on the model)");
        const char *h = scalar(x);
        int ok = h && strlen(h) == 64;
        for (int i = 0; ok && i < 64; i++) ok = isxdigit((unsigned char)h[i]);
        if (!ok) return perr(c, node_pos(x, q), "model.sha256", "expected 64 hex digits, got '%s'", h ? h : "a collection");
        for (int i = 0; i < 64; i++) s->model_sha256[i] = (char)tolower((unsigned char)h[i]);
        s->model_sha256[64] = 0;
    }

    kp = at; v = get(root, "prompts", &kp);
    if (fy_node_is_sequence(v)) {
        if (parse_inline_prompts(c, v, node_pos(v, kp), s) < 0) return -1;
    } else {
        char *raw;
        if (get_string(c, v, kp, "prompts", "a prompt file path or a list of {id, text}", &raw) < 0) return -1;
        s->prompts_path = resolve_path(c, raw);
        free(raw);
        if (read_prompts(c, s->prompts_path, node_pos(v, kp), s) < 0) return -1;
    }

    kp = at; v = get(root, "steps", &kp);
    if (get_int(c, v, kp, "steps", 1, 100000, &s->steps) < 0) return -1;
    kp = at; v = get(root, "top_k", &kp);
    if (get_int(c, v, kp, "top_k", 1, 1024, &s->top_k) < 0) return -1;
    kp = at; v = get(root, "legs", &kp);
    if (get_int(c, v, kp, "legs", 1, 1000, &s->legs) < 0) return -1;
    s->jobs = 2;
    kp = at;
    if ((v = get(root, "jobs", &kp)) && get_int(c, v, kp, "jobs", 1, 256, &s->jobs) < 0) return -1;

    kp = at;
    if ((v = get(root, "mode", &kp))) {
        if (get_string(c, v, kp, "mode", "teacher-forced or free", &s->mode) < 0) return -1;
        if (strcmp(s->mode, "teacher-forced") && strcmp(s->mode, "free"))
            return perr(c, node_pos(v, kp), "mode", "expected teacher-forced or free, got '%s'", s->mode);
    } else s->mode = xstrdup("teacher-forced");

    kp = at; v = get(root, "policy", &kp);
    {
        static const char *const pk[] = {"kind", "band", NULL};
        pos pp;
        if (check_map(c, v, kp, "policy", "expected a mapping {kind: exact|near-tie|noise, band: X}", pk, &pp) < 0)
            return -1;
        pos q = pp;
        struct fy_node *x = get(v, "kind", &q);
        if (!x) return perr(c, pp, "policy.kind", "missing (expected exact, near-tie, noise, calibrated or error-budget)");
        if (get_string(c, x, q, "policy.kind", "exact, near-tie, noise, calibrated or error-budget",
                       &s->policy_kind) < 0)
            return -1;
        if (strcmp(s->policy_kind, "exact") && strcmp(s->policy_kind, "near-tie") && strcmp(s->policy_kind, "noise") &&
            strcmp(s->policy_kind, "calibrated") && strcmp(s->policy_kind, "error-budget"))
            return perr(c, node_pos(x, q), "policy.kind",
                        "expected exact, near-tie, noise, calibrated or error-budget, got '%s'", s->policy_kind);
        q = pp;
        s->band = 0.20;
        x = get(v, "band", &q);
        if (x) {
            if (get_number(c, x, q, "policy.band", 0, 1e6, &s->band) < 0) return -1;
        } else if (!strcmp(s->policy_kind, "near-tie"))
            return perr(c, pp, "policy.band", "missing (near-tie needs a band in logits, e.g. band: 0.20)");
    }

    s->timeout_request = 120;
    s->timeout_leg = 3600;
    kp = at;
    if ((v = get(root, "timeout", &kp)) &&
        parse_timeout(c, v, kp, "timeout", &s->timeout_request, &s->timeout_leg) < 0)
        return -1;

    kp = at;
    if ((v = get(root, "fault_patterns", &kp)) &&
        get_strings(c, v, kp, "fault_patterns", "stderr substrings", &s->fault_patterns, &s->n_fault_patterns) < 0)
        return -1;

    kp = at;
    if ((v = get(root, "dumps", &kp)) && parse_dumps(c, v, kp, s) < 0) return -1;
    kp = at;
    if ((v = get(root, "replay", &kp)) && parse_replay(c, v, kp, s) < 0) return -1;

    kp = at; v = get(root, "arms", &kp);
    if (!fy_node_is_sequence(v) || fy_node_sequence_item_count(v) == 0)
        return perr(c, node_pos(v, kp), "arms", "expected a non-empty list of arms");
    s->n_arms = fy_node_sequence_item_count(v);
    s->arms = xcalloc((size_t)s->n_arms, sizeof *s->arms);
    {
        void *it = NULL;
        struct fy_node *item;
        int i = 0;
        pos sp = node_pos(v, kp);
        while ((item = fy_node_sequence_iterate(v, &it))) {
            if (parse_arm(c, item, sp, i, s) < 0) return -1;
            spec_arm *a = &s->arms[i];
            if (a->timeout_request < 0) a->timeout_request = s->timeout_request;
            if (a->timeout_leg < 0) a->timeout_leg = s->timeout_leg;
            i++;
        }
    }
    for (int i = 0; i < s->n_arms; i++) {
        spec_arm *a = &s->arms[i];
        if (a->variant_of) {
            int j = spec_find_arm(s, a->variant_of);
            char g[80];
            snprintf(g, sizeof g, "arms[%d].variant_of", i);
            if (j < 0 || j == i)
                return perr(c, (pos){a->line, 1}, g, "expected the name of another arm, got '%s'", a->variant_of);
            /* a variant is a legitimate build of the same thing: an oracle
             * variant of an oracle arm (the oracle's own noise), a test
             * variant of a test arm (kernels, threads, KV types: the
             * calibration panel) */
            if (a->kind == SPEC_ARM_COMMAND)
                return perr(c, (pos){a->line, 1}, g, "expected on a protocol arm, '%s' is a command arm", a->name);
            if (s->arms[j].kind == SPEC_ARM_COMMAND || !s->arms[j].role || strcmp(s->arms[j].role, a->role))
                return perr(c, (pos){a->line, 1}, g,
                            "expected the name of an arm of the same role (%s), '%s' is not one", a->role,
                            a->variant_of);
        }
    }

    kp = at; v = get(root, "reference", &kp);
    if (get_string(c, v, kp, "reference", "the name of an arm", &s->reference) < 0) return -1;
    s->ref_index = spec_find_arm(s, s->reference);
    if (s->ref_index < 0) {
        char names[512] = "";
        for (int i = 0; i < s->n_arms; i++) {
            strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
            strncat(names, s->arms[i].name, sizeof names - strlen(names) - 1);
        }
        return perr(c, node_pos(v, kp), "reference", "expected the name of an arm (%s), got '%s'", names, s->reference);
    }
    if (s->arms[s->ref_index].kind == SPEC_ARM_COMMAND)
        return perr(c, node_pos(v, kp), "reference", "expected a protocol arm, '%s' is a command (custody) arm",
                    s->reference);
    if (s->arms[s->ref_index].only)
        return perr(c, (pos){s->arms[s->ref_index].line, 1}, "reference",
                    "expected the reference '%s' to run every prompt (it has a prompts: list)", s->reference);
    return parse_calibration(c, root, at, s);
}

int spec_arm_runs_prompt(const tg_spec *s, int i, int p)
{
    if (!s || i < 0 || i >= s->n_arms || p < 0 || p >= s->n_prompts) return 0;
    const spec_arm *a = &s->arms[i];
    if (!a->only) return 1;
    for (int k = 0; k < a->n_only; k++)
        if (!strcmp(a->only[k], s->prompts[p].id)) return 1;
    return 0;
}

int spec_find_arm(const tg_spec *s, const char *name)
{
    for (int i = 0; s && name && i < s->n_arms; i++)
        if (s->arms[i].name && !strcmp(s->arms[i].name, name)) return i;
    return -1;
}

/* Checks that text is well-formed UTF-8 (utf8_bad). libfyaml loops forever
 * on some invalid bytes after a '%' directive indicator (found by
 * tests/fuzz/fuzz_spec), so they never reach it. Returns 0, or -1 with e
 * naming line and column. */
static int check_utf8(const char *path, const char *text, size_t len, tg_err *e)
{
    int line, col;
    size_t off;
    if (utf8_bad(text, len, &line, &col, &off) == 0) return 0;
    return tg_errf(e, "%s:%d:%d: spec: expected UTF-8 text, got byte 0x%02x at offset %zu", path, line, col,
                   (unsigned char)text[off], off);
}

/* A spec expands to at most this many YAML nodes, nested this deep: a
 * 1.3 KB file of nested aliases ("a: &a [x,x,...]", "b: &b [*a,*a,...]",
 * ...) expands to billions, which resolving would try to build. */
#define SPEC_MAX_NODES 100000
#define SPEC_MAX_DEPTH 1000

/* Counts the nodes n expands to, following aliases, spending *budget one
 * per node; stops as soon as it is spent, so its work is bounded whatever
 * the document. Returns 0, or -1 when the budget or the depth ran out. */
static int count_nodes(struct fy_node *n, long *budget, int depth)
{
    if (!n) return 0;
    if (--*budget < 0 || depth > SPEC_MAX_DEPTH) return -1;
    if (fy_node_is_alias(n)) {
        struct fy_node *t = fy_node_resolve_alias(n);
        return t ? count_nodes(t, budget, depth + 1) : 0;   /* unknown alias: fy_document_resolve says so */
    }
    void *it = NULL;
    if (fy_node_is_sequence(n)) {
        struct fy_node *item;
        while ((item = fy_node_sequence_iterate(n, &it)))
            if (count_nodes(item, budget, depth + 1) < 0) return -1;
    } else if (fy_node_is_mapping(n)) {
        struct fy_node_pair *p;
        while ((p = fy_node_mapping_iterate(n, &it)))
            if (count_nodes(fy_node_pair_key(p), budget, depth + 1) < 0 ||
                count_nodes(fy_node_pair_value(p), budget, depth + 1) < 0)
                return -1;
    }
    return 0;
}

int spec_parse(tg_spec **out, const char *path, const char *text, size_t len, tg_err *e)
{
    *out = NULL;
    tg_spec *s = xcalloc(1, sizeof *s);
    s->path = xstrdup(path);
    s->text = xmalloc(len + 1);
    memcpy(s->text, text, len);
    s->text[len] = 0;
    s->text_len = len;
    tg_sha256_buf(text, len, s->sha256);

    pctx c = {.file = path, .e = e};
    {
        char *tmp = xstrdup(path), *slash = strrchr(tmp, '/');
        const char *d = ".";
        if (slash == tmp) d = "/";
        else if (slash) { *slash = 0; d = tmp; }
        char real[PATH_MAX];
        c.dir = xstrdup(realpath(d, real) ? real : d);
        free(tmp);
    }

    int rc = -1;
    struct fy_diag_cfg dcfg;
    fy_diag_cfg_default(&dcfg);
    dcfg.fp = NULL;
    dcfg.output_fn = NULL;
    dcfg.colorize = false;
    struct fy_diag *diag = fy_diag_create(&dcfg);
    if (!diag) common_out_of_memory(sizeof dcfg);
    fy_diag_set_collect_errors(diag, true);
    /* aliases are resolved only after their expansion is counted (below) */
    struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET, .diag = diag};
    struct fy_document *doc = NULL;
    if (len == 0) {
        tg_errf(e, "%s:1:1: spec: expected a YAML mapping, the file is empty", path);
        goto done;
    }
    if (check_utf8(path, s->text, len, e) < 0) goto done;
    doc = fy_document_build_from_string(&cfg, s->text, len);
    if (!doc || fy_diag_got_error(diag)) {
        void *it = NULL;
        struct fy_diag_error *de = fy_diag_errors_iterate(diag, &it);
        const struct fy_mark *m = de && de->fyt ? fy_token_start_mark(de->fyt) : NULL;
        if (m)
            tg_errf(e, "%s:%d:%d: YAML syntax: %s", path, m->line + 1, m->column + 1, de->msg);
        else if (de)
            tg_errf(e, "%s:%d:%d: YAML syntax: %s", path, de->line + 1, de->column + 1, de->msg);
        else
            tg_errf(e, "%s: YAML syntax error (expected a valid YAML document)", path);
        goto done;
    }
    {
        long budget = SPEC_MAX_NODES;
        int r = count_nodes(fy_document_root(doc), &budget, 0);
        if (r < 0) {
            tg_errf(e, "%s:1:1: spec: expected a small YAML document, its aliases expand to more than %d nodes "
                       "or nest deeper than %d (an alias bomb?)", path, SPEC_MAX_NODES, SPEC_MAX_DEPTH);
            goto done;
        }
        if (fy_document_resolve(doc) != 0) {
            tg_errf(e, "%s: YAML: an alias names no anchor (expected *NAME after &NAME)", path);
            goto done;
        }
    }
    if (parse_root(&c, fy_document_root(doc), s) < 0) goto done;
    rc = 0;
done:
    fy_document_destroy(doc);
    fy_diag_destroy(diag);
    free(c.dir);
    if (rc == 0) *out = s;
    else spec_free(s);
    return rc;
}

int spec_load(tg_spec **out, const char *path, tg_err *e)
{
    *out = NULL;
    char *text;
    size_t len;
    if (common_read_file(path, SPEC_MAX_FILE, &text, &len, e) < 0) return -1;
    int rc = spec_parse(out, path, text, len, e);
    free(text);
    return rc;
}

static void strv_free(char **v, int n)
{
    if (!v) return;
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

void spec_free(tg_spec *s)
{
    if (!s) return;
    free(s->path);
    free(s->text);
    free(s->name);
    free(s->model_path);
    free(s->prompts_path);
    for (int i = 0; i < s->n_prompts; i++) {
        free(s->prompts[i].id);
        free(s->prompts[i].text);
    }
    free(s->prompts);
    free(s->mode);
    free(s->reference);
    free(s->policy_kind);
    free(s->exact);
    free(s->cal_from);
    for (int i = 0; s->arms && i < s->n_arms; i++) {
        spec_arm *a = &s->arms[i];
        free(a->name);
        free(a->role);
        free(a->variant_of);
        free(a->tier);
        free(a->lib);
        free(a->worker);
        strv_free(a->wrap, a->n_wrap);
        strv_free(a->argv, a->n_argv);
        strv_free(a->strip, a->n_strip);
        free(a->options_json);
        free(a->config_json);
        strv_free(a->env, a->n_env);
        strv_free(a->only, a->n_only);
    }
    free(s->arms);
    strv_free(s->fault_patterns, s->n_fault_patterns);
    free(s->dump_steps);
    strv_free(s->dump_prompts, s->n_dump_prompts);
    strv_free(s->dump_stages, s->n_dump_stages);
    free(s);
}

int spec_check_artifact(const tg_spec *s, char actual[65], int64_t *size, tg_err *e)
{
    struct stat st;
    if (stat(s->model_path, &st) < 0)
        return tg_errf(e, "%s: model.path %s: %s", s->path, s->model_path, strerror(errno));
    /* /dev/zero or a FIFO would be hashed forever */
    if (common_check_regular(s->model_path, "model.path", e) < 0) return tg_err_prefix(e, "%s", s->path);
    if (tg_sha256_file(s->model_path, actual, e) < 0) return tg_err_prefix(e, "%s: model.path", s->path);
    if (size) *size = (int64_t)st.st_size;
    if (strcmp(actual, s->model_sha256))
        return tg_errf(e, "%s: model %s: sha256 mismatch: the spec pins %s, the file hashes to %s",
                       s->path, s->model_path, s->model_sha256, actual);
    return 0;
}

/* 1 when path is an ELF file for aarch64 (e_machine 183). */
static int is_aarch64_elf(const char *path)
{
    unsigned char h[20];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t r = read(fd, h, sizeof h);
    close(fd);
    if (r != (ssize_t)sizeof h || memcmp(h, "\x7f" "ELF", 4)) return 0;
    int m = h[5] == 2 ? (h[18] << 8 | h[19]) : (h[18] | h[19] << 8);
    return m == 183;
}

static void strv_push(strv *a, const char *s)
{
    if (a->n + 2 > a->cap) {
        a->cap = a->cap ? a->cap * 2 : 8;
        a->v = xrealloc(a->v, (size_t)a->cap * sizeof *a->v);
    }
    a->v[a->n++] = xstrdup(s);
    a->v[a->n] = NULL;
}

char **spec_arm_argv(const tg_spec *s, int i, const char *bin_dir, tg_err *e)
{
    assert(i >= 0 && i < s->n_arms);
    const spec_arm *a = &s->arms[i];
    strv v = {0};
    char path[PATH_MAX * 2];
    switch (a->kind) {
    case SPEC_ARM_ENGINE:
        if (a->worker) snprintf(path, sizeof path, "%s", a->worker);
        else snprintf(path, sizeof path, "%s/tg-engine", bin_dir);
        strv_push(&v, path);
        strv_push(&v, "--tier");
        strv_push(&v, a->tier);
        break;
    case SPEC_ARM_LLAMA:
        for (int k = 0; k < a->n_wrap; k++) strv_push(&v, a->wrap[k]);
        if (a->worker) snprintf(path, sizeof path, "%s", a->worker);
        else if (a->n_wrap && is_aarch64_elf(a->lib)) snprintf(path, sizeof path, "%s/../aarch64/bin/tg-llama", bin_dir);
        else snprintf(path, sizeof path, "%s/tg-llama", bin_dir);
        strv_push(&v, path);
        strv_push(&v, "--lib");
        strv_push(&v, a->lib);
        break;
    case SPEC_ARM_EXEC:
        for (int k = 0; k < a->n_argv; k++) strv_push(&v, a->argv[k]);
        break;
    case SPEC_ARM_HTTP:
        if (a->worker) snprintf(path, sizeof path, "%s", a->worker);
        else snprintf(path, sizeof path, "%s/tg-http", bin_dir);
        strv_push(&v, path);
        for (int k = 0; k < a->n_argv; k++) strv_push(&v, a->argv[k]);
        break;
    case SPEC_ARM_COMMAND:
        tg_errf(e, "arm %s: a command arm has no protocol worker", a->name);
        return NULL;
    }
    return v.v;
}

/* s with every {key} replaced by its value. */
static char *substitute(const char *s, const char *const *keys, const char *const *vals, int n)
{
    size_t cap = strlen(s) + 1, len = 0;
    char *o = xmalloc(cap);
    while (*s) {
        int hit = -1;
        for (int k = 0; k < n && hit < 0; k++)
            if (!strncmp(s, keys[k], strlen(keys[k]))) hit = k;
        const char *add = hit >= 0 ? vals[hit] : s;
        size_t an = hit >= 0 ? strlen(vals[hit]) : 1;
        if (len + an + 1 > cap) {
            cap = (len + an + 1) * 2;
            o = xrealloc(o, cap);
        }
        memcpy(o + len, add, an);
        len += an;
        s += hit >= 0 ? strlen(keys[hit]) : 1;
    }
    o[len] = 0;
    return o;
}

char **spec_command_argv(const tg_spec *s, int i, const char *prompt_text, tg_err *e)
{
    assert(i >= 0 && i < s->n_arms);
    const spec_arm *a = &s->arms[i];
    if (a->kind != SPEC_ARM_COMMAND) {
        tg_errf(e, "arm %s: not a command arm", a->name);
        return NULL;
    }
    char steps[32];
    snprintf(steps, sizeof steps, "%d", s->steps);
    const char *keys[] = {"{model}", "{prompt}", "{steps}"};
    const char *vals[] = {s->model_path, prompt_text, steps};
    strv v = {0};
    for (int k = 0; k < a->n_argv; k++) {
        char *w = substitute(a->argv[k], keys, vals, 3);
        strv_push(&v, w);
        free(w);
    }
    return v.v;
}

void spec_argv_free(char **argv)
{
    if (!argv) return;
    for (char **p = argv; *p; p++) free(*p);
    free(argv);
}

char *spec_arm_binary(const tg_spec *s, int i, char *const *argv)
{
    assert(i >= 0 && i < s->n_arms);
    const spec_arm *a = &s->arms[i];
    if (a->kind == SPEC_ARM_LLAMA) return xstrdup(a->lib);
    if (!argv || !argv[0]) return NULL;
    const char *prog = argv[0];
    if (strchr(prog, '/')) {
        char real[PATH_MAX];
        return realpath(prog, real) ? xstrdup(real) : NULL;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        char cand[PATH_MAX * 2], real[PATH_MAX];
        snprintf(cand, sizeof cand, "%.*s/%s", (int)n, n ? path : ".", prog);
        if (access(cand, X_OK) == 0 && realpath(cand, real)) return xstrdup(real);
        path += n + (colon ? 1 : 0);
    }
    return NULL;
}
