/*
 * proto.c: the worker side of arm protocol v1 (docs/protocol.md). Reads
 * bounded request lines, validates them field by field, dispatches to the
 * worker's callbacks and writes the answer lines: JSON objects built with
 * jansson for ordinary answers, and step lines formatted by hand so that
 * every logit prints as "%.9g" (which reads back as the same f32).
 */
#include "proto.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct proto_conn {
    FILE *out;
    char *buf;       /* the line being built */
    size_t len, cap;
    int werr;        /* a write failed: stop serving */
    tg_top *top;     /* (top_cap) scratch for proto_step */
    int top_cap;
    double ms_load;  /* duration of the last load, for the done line */
};

proto_conn *proto_conn_new(FILE *out)
{
    proto_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->out = out;
    return c;
}

void proto_conn_free(proto_conn *c)
{
    if (!c) return;
    free(c->buf);
    free(c->top);
    free(c);
}

/* Appends formatted text to the line being built; on allocation failure
 * marks the connection broken (the line is then never written). */
static void cbuf_printf(proto_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cbuf_printf(proto_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = c->cap - c->len;
    int k = vsnprintf(c->buf ? c->buf + c->len : NULL, room, fmt, ap);
    va_end(ap);
    if (k < 0) {
        c->werr = 1;
        return;
    }
    if ((size_t)k >= room) {
        size_t ncap = c->cap ? c->cap : 4096;
        while (ncap - c->len <= (size_t)k) ncap *= 2;
        char *nb = realloc(c->buf, ncap);
        if (!nb) {
            c->werr = 1;
            return;
        }
        c->buf = nb;
        c->cap = ncap;
        va_start(ap, fmt);
        vsnprintf(c->buf + c->len, c->cap - c->len, fmt, ap);
        va_end(ap);
    }
    c->len += (size_t)k;
}

/* Writes the built line and a newline, flushes. Returns 0 or -1. */
static int cbuf_flush(proto_conn *c)
{
    if (!c->werr) {
        if (fwrite(c->buf, 1, c->len, c->out) != c->len || fputc('\n', c->out) == EOF ||
            fflush(c->out) != 0)
            c->werr = 1;
    }
    c->len = 0;
    return c->werr ? -1 : 0;
}

/* Writes a JSON value as one line. Returns 0 or -1. */
static int write_json(proto_conn *c, const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(9));
    if (!s) {
        c->werr = 1;
        return -1;
    }
    c->len = 0;
    cbuf_printf(c, "%s", s);
    free(s);
    return cbuf_flush(c);
}

static int write_error(proto_conn *c, const char *msg)
{
    json_t *j = json_pack("{s:b,s:s}", "ok", 0, "error", msg);
    int rc = j ? write_json(c, j) : -1;
    json_decref(j);
    return rc;
}

/* ---- line reading ---- */

int proto_read_line(FILE *in, char **buf, size_t *cap, size_t max, size_t *len)
{
    size_t n = 0;
    int too_long = 0, ch = EOF;
    flockfile(in);
    while ((ch = getc_unlocked(in)) != EOF && ch != '\n') {
        if (too_long) continue;
        if (n >= max) {
            too_long = 1;
            continue;
        }
        if (n + 2 > *cap) {
            size_t nc = *cap ? *cap * 2 : 4096;
            if (nc > max + 2) nc = max + 2;
            char *nb = realloc(*buf, nc);
            if (!nb) {
                funlockfile(in);
                return -1;
            }
            *buf = nb;
            *cap = nc;
        }
        (*buf)[n++] = (char)ch;
    }
    int err = ferror(in);
    funlockfile(in);
    if (err) return -1;
    if (ch == EOF && n == 0 && !too_long) return 0;
    if (too_long) return 2;
    if (n > 0 && (*buf)[n - 1] == '\r') n--;
    if (!*buf) {
        *buf = malloc(1);
        if (!*buf) return -1;
        *cap = 1;
    }
    (*buf)[n] = 0;
    *len = n;
    return 1;
}

/* ---- field validation ---- */

/* Every key of req must be in known (NULL-terminated). */
static int check_fields(const json_t *req, const char *const *known, tg_err *e)
{
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)req, key, val) {
        int ok = 0;
        for (int i = 0; known[i]; i++)
            if (strcmp(key, known[i]) == 0) ok = 1;
        if (!ok) {
            char list[512] = "";
            size_t n = 0;
            for (int i = 0; known[i] && n < sizeof list; i++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", known[i]);
            return tg_errf(e, "unknown field '%s' (expected %s)", key, list);
        }
    }
    return 0;
}

/* An integer field in lo..hi; required or (absent -> 0, *out unchanged). */
static int field_int(const json_t *req, const char *name, long long lo, long long hi, int required,
                     int *out, tg_err *e)
{
    json_t *v = json_object_get(req, name);
    if (!v) return required ? tg_errf(e, "field '%s' is missing (an integer %lld..%lld)", name, lo, hi) : 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return tg_errf(e, "field '%s' must be an integer %lld..%lld", name, lo, hi);
    *out = (int)json_integer_value(v);
    return 0;
}

static int field_bool(const json_t *req, const char *name, bool *out, tg_err *e)
{
    json_t *v = json_object_get(req, name);
    if (!v) return 0;
    if (!json_is_boolean(v)) return tg_errf(e, "field '%s' must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

/* An array of token ids (integers 0..INT32_MAX), 1..max entries unless
 * allow_empty. *ids malloc'ed (caller frees; NULL for an empty array). */
static int field_ids(const json_t *v, const char *name, int allow_empty, int32_t **ids, int *n,
                     tg_err *e)
{
    *ids = NULL;
    *n = 0;
    if (!json_is_array(v))
        return tg_errf(e, "field '%s' must be an array of token ids (integers >= 0)", name);
    size_t k = json_array_size(v);
    if (k == 0 && !allow_empty) return tg_errf(e, "field '%s' must not be empty", name);
    if (k > PROTO_MAX_PROMPT)
        return tg_errf(e, "field '%s' has %zu ids (at most %d)", name, k, PROTO_MAX_PROMPT);
    if (k == 0) return 0;
    int32_t *a = malloc(sizeof *a * k);
    if (!a) return tg_errf(e, "field '%s': out of memory", name);
    for (size_t i = 0; i < k; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(a);
            return tg_errf(e, "field '%s'[%zu] must be a token id (an integer 0..%d)", name, i,
                           INT32_MAX);
        }
        a[i] = (int32_t)json_integer_value(x);
    }
    *ids = a;
    *n = (int)k;
    return 0;
}

/* ---- options ---- */

int proto_opt_int(const json_t *options, const char *name, long long lo, long long hi, int *out,
                  tg_err *e)
{
    json_t *v = options ? json_object_get(options, name) : NULL;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return tg_errf(e, "option '%s' must be an integer %lld..%lld", name, lo, hi);
    *out = (int)json_integer_value(v);
    return 0;
}

int proto_opt_bool(const json_t *options, const char *name, bool *out, tg_err *e)
{
    json_t *v = options ? json_object_get(options, name) : NULL;
    if (!v) return 0;
    if (!json_is_boolean(v)) return tg_errf(e, "option '%s' must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

static void join(char *dst, size_t cap, const char *const *words)
{
    size_t n = 0;
    dst[0] = 0;
    for (int i = 0; words[i] && n < cap; i++)
        n += (size_t)snprintf(dst + n, cap - n, "%s%s", i ? ", " : "", words[i]);
}

int proto_opt_enum(const json_t *options, const char *name, const char *const *choices, int *out,
                   tg_err *e)
{
    json_t *v = options ? json_object_get(options, name) : NULL;
    if (!v) return 0;
    if (json_is_string(v))
        for (int i = 0; choices[i]; i++)
            if (strcmp(json_string_value(v), choices[i]) == 0) {
                *out = i;
                return 0;
            }
    char list[512];
    join(list, sizeof list, choices);
    return tg_errf(e, "option '%s' must be one of: %s", name, list);
}

char *proto_string_dup(const json_t *s, size_t *len)
{
    size_t n = json_string_length(s);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, json_string_value(s), n);
        d[n] = 0;
        *len = n;
    }
    return d;
}

int proto_opt_known(const json_t *options, const char *const *known, tg_err *e)
{
    const char *key;
    json_t *val;
    if (!options) return 0;
    json_object_foreach((json_t *)options, key, val) {
        int ok = 0;
        for (int i = 0; known[i]; i++)
            if (strcmp(key, known[i]) == 0) ok = 1;
        if (!ok) {
            char list[512];
            join(list, sizeof list, known);
            return tg_errf(e, "unknown option '%s' (known: %s)", key, list);
        }
    }
    return 0;
}

int proto_check_ids(const int32_t *ids, int n, int n_vocab, const char *what, tg_err *e)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return tg_errf(e, "%s[%d] = %d is not a token id of this model (0..%d)", what, i,
                           ids[i], n_vocab - 1);
    return 0;
}

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0. Rejects
 * overlong forms, surrogates and code points above U+10FFFF. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    unsigned cp, min;
    if ((c & 0xe0) == 0xc0) k = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) k = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) k = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (k > n) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return k;
}

/* ---- answers ---- */

/* Writes one step line from an ordered top list and a digest (NULL or "":
 * no "digest" member, for a worker that never sees the whole logit vector). */
static void write_step(proto_conn *c, int step, const tg_top *top, int k, const char *dig)
{
    c->len = 0;
    cbuf_printf(c, "{\"step\":%d,\"token\":%d,\"top\":[", step, top[0].id);
    for (int i = 0; i < k; i++) {
        float v = top[i].logit;
        const char *sep = i ? "," : "";
        if (isnan(v)) cbuf_printf(c, "%s[%d,\"nan\"]", sep, top[i].id);
        else if (isinf(v)) cbuf_printf(c, "%s[%d,\"%sinf\"]", sep, top[i].id, v < 0 ? "-" : "");
        else cbuf_printf(c, "%s[%d,%.9g]", sep, top[i].id, (double)v);
    }
    if (dig && *dig) cbuf_printf(c, "],\"digest\":\"%s\"}", dig);
    else cbuf_printf(c, "]}");
    cbuf_flush(c);
}

/* The token to append after step: forced, or the worker's argmax. */
static int32_t next_token(const proto_decode_req *req, int step, int32_t argmax)
{
    if (req->force && step < req->n_force) return req->force[step];
    return argmax;
}

int32_t proto_step(proto_conn *c, const proto_decode_req *req, int step, const float *logits, int n)
{
    assert(n > 0 && "proto_step: a logit vector is never empty");
    int k = req->top_k < n ? req->top_k : n;
    if (k > c->top_cap) {
        tg_top *nt = realloc(c->top, sizeof *nt * (size_t)k);
        if (!nt) {
            c->werr = 1;
            return next_token(req, step, tg_argmax(logits, n));
        }
        c->top = nt;
        c->top_cap = k;
    }
    k = tg_topk(logits, n, k, c->top);
    char dig[17];
    tg_digest_logits(logits, (size_t)n, dig);
    write_step(c, step, c->top, k, dig);
    return next_token(req, step, c->top[0].id);
}

int32_t proto_step_top(proto_conn *c, const proto_decode_req *req, int step, const tg_top *top,
                       int k, const char *dig)
{
    assert(k >= 1 && "proto_step_top: at least the argmax");
    if (k > req->top_k) k = req->top_k;
    write_step(c, step, top, k, dig);
    return next_token(req, step, top[0].id);
}

bool proto_wants_dump(const proto_decode_req *req, int step)
{
    for (int i = 0; i < req->n_dump_steps; i++)
        if (req->dump_steps[i] == step) return true;
    return false;
}

int proto_dump(proto_conn *c, const proto_decode_req *req, int step, int layer, const char *stage,
               const float *x, size_t n, tg_err *e)
{
    if (!req->dump_path) return tg_errf(e, "dump: no dump path in the request");
    char name[256], path[4096];
    if (layer < 0) snprintf(name, sizeof name, "s%d-lout-%s.f32", step, stage);
    else snprintf(name, sizeof name, "s%d-l%d-%s.f32", step, layer, stage);
    snprintf(path, sizeof path, "%s/%s", req->dump_path, name);
    FILE *f = fopen(path, "wb");
    if (!f) return tg_errf(e, "dump file %s: cannot create: %s", path, strerror(errno));
    size_t w = fwrite(x, sizeof *x, n, f);
    int cerr = fclose(f);
    if (w != n || cerr != 0) return tg_errf(e, "dump file %s: write failed", path);
    json_t *j = json_pack("{s:{s:i,s:i,s:s,s:I,s:s}}", "dump", "step", step, "layer", layer,
                          "stage", stage, "n", (json_int_t)n, "file", path);
    if (!j) return tg_errf(e, "dump: out of memory");
    write_json(c, j);
    json_decref(j);
    return 0;
}

/* ---- ops ---- */

static int op_hello(proto_conn *c, const proto_ops *ops, const json_t *req, tg_err *e)
{
    static const char *const known[] = {"op", "protocol", NULL};
    if (check_fields(req, known, e)) return -1;
    int version = PROTO_VERSION;
    if (field_int(req, "protocol", 0, 1000000, 0, &version, e)) return -1;
    if (version != PROTO_VERSION)
        return tg_errf(e, "protocol %d is not supported (this worker speaks %d)", version,
                       PROTO_VERSION);
    json_t *arm = json_object();
    if (ops->hello(ops->ud, arm, e)) {
        json_decref(arm);
        return -1;
    }
    json_t *j = json_pack("{s:b,s:i,s:o}", "ok", 1, "protocol", PROTO_VERSION, "arm", arm);
    write_json(c, j);
    json_decref(j);
    return 0;
}

static int op_load(proto_conn *c, const proto_ops *ops, const json_t *req, tg_err *e)
{
    static const char *const known[] = {"op", "model", "options", NULL};
    if (check_fields(req, known, e)) return -1;
    json_t *m = json_object_get(req, "model");
    if (!json_is_string(m) || json_string_length(m) == 0)
        return tg_errf(e, "field 'model' must be a non-empty string (the model file's path)");
    if (strlen(json_string_value(m)) != json_string_length(m))
        return tg_errf(e, "field 'model' must not contain NUL characters");
    json_t *opts = json_object_get(req, "options");
    if (opts && !json_is_object(opts))
        return tg_errf(e, "field 'options' must be an object");
    json_t *empty = json_object();
    json_t *model = json_object();
    double t0 = tg_now();
    int rc = ops->load(ops->ud, json_string_value(m), opts ? opts : empty, model, e);
    c->ms_load = (tg_now() - t0) * 1e3;
    json_decref(empty);
    if (rc) {
        json_decref(model);
        return -1;
    }
    json_t *j = json_pack("{s:b,s:o,s:{s:f}}", "ok", 1, "model", model, "ms", "load", c->ms_load);
    write_json(c, j);
    json_decref(j);
    return 0;
}

static int op_tokenize(proto_conn *c, const proto_ops *ops, const json_t *req, tg_err *e)
{
    static const char *const known[] = {"op", "text", "special", NULL};
    if (check_fields(req, known, e)) return -1;
    json_t *t = json_object_get(req, "text");
    if (!json_is_string(t)) return tg_errf(e, "field 'text' must be a string");
    bool special = false;
    if (field_bool(req, "special", &special, e)) return -1;
    int32_t *ids = NULL;
    int n = 0;
    if (ops->tokenize(ops->ud, json_string_value(t), json_string_length(t), special, &ids, &n, e))
        return -1;
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    json_t *j = json_pack("{s:b,s:o}", "ok", 1, "ids", arr);
    write_json(c, j);
    json_decref(j);
    return 0;
}

static int op_detokenize(proto_conn *c, const proto_ops *ops, const json_t *req, tg_err *e)
{
    static const char *const known[] = {"op", "ids", "special", NULL};
    if (check_fields(req, known, e)) return -1;
    json_t *v = json_object_get(req, "ids");
    if (!v) return tg_errf(e, "field 'ids' is missing (an array of token ids)");
    int32_t *ids;
    int n;
    if (field_ids(v, "ids", 1, &ids, &n, e)) return -1;
    bool special = false;
    if (field_bool(req, "special", &special, e)) {
        free(ids);
        return -1;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = ops->detokenize(ops->ud, ids, n, special, &text, &len, e);
    free(ids);
    if (rc) return -1;
    /* Valid UTF-8 goes out as is; otherwise each invalid byte becomes
     * U+FFFD in "text" and the exact bytes go in "hex". */
    const unsigned char *s = (const unsigned char *)text;
    int valid = 1;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(s + i, len - i);
        if (!k) {
            valid = 0;
            break;
        }
        i += k;
    }
    json_t *j;
    if (valid) {
        j = json_pack("{s:b,s:s%}", "ok", 1, "text", text, len);
    } else {
        char *fixed = malloc(len * 3 + 1), *hex = malloc(len * 2 + 1);
        if (!fixed || !hex) {
            free(fixed);
            free(hex);
            free(text);
            return tg_errf(e, "out of memory");
        }
        size_t m = 0;
        for (size_t i = 0; i < len;) {
            size_t k = utf8_seq(s + i, len - i);
            if (k) {
                memcpy(fixed + m, s + i, k);
                m += k;
                i += k;
            } else {
                memcpy(fixed + m, "\xef\xbf\xbd", 3);
                m += 3;
                i++;
            }
        }
        static const char digits[] = "0123456789abcdef";
        for (size_t i = 0; i < len; i++) {
            hex[2 * i] = digits[s[i] >> 4];
            hex[2 * i + 1] = digits[s[i] & 15];
        }
        hex[2 * len] = 0;
        j = json_pack("{s:b,s:s%,s:s}", "ok", 1, "text", fixed, m, "hex", hex);
        free(fixed);
        free(hex);
    }
    free(text);
    if (!j) return tg_errf(e, "out of memory");
    write_json(c, j);
    json_decref(j);
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int op_decode(proto_conn *c, const proto_ops *ops, const json_t *req, tg_err *e)
{
    static const char *const known[] = {"op", "prompt", "steps", "top_k", "force", "dump", NULL};
    if (check_fields(req, known, e)) return -1;
    proto_decode_req r = {0};
    int32_t *prompt = NULL, *force = NULL;
    int *dsteps = NULL;
    int rc = -1;
    json_t *v = json_object_get(req, "prompt");
    if (!v) {
        tg_errf(e, "field 'prompt' is missing (an array of token ids)");
        goto out;
    }
    if (field_ids(v, "prompt", 0, &prompt, &r.n_prompt, e)) goto out;
    r.prompt = prompt;
    if (field_int(req, "steps", 1, PROTO_MAX_STEPS, 1, &r.steps, e)) goto out;
    r.top_k = PROTO_DEFAULT_TOP_K;
    if (field_int(req, "top_k", 1, PROTO_MAX_TOP_K, 0, &r.top_k, e)) goto out;
    if ((v = json_object_get(req, "force"))) {
        if (field_ids(v, "force", 1, &force, &r.n_force, e)) goto out;
        if (r.n_force != r.steps && r.n_force != r.steps - 1) {
            tg_errf(e, "field 'force' has %d ids; expected steps (%d) or steps - 1", r.n_force,
                    r.steps);
            goto out;
        }
        /* force of an empty array with steps 1: teacher forcing of nothing */
        r.force = force ? force : prompt;
    }
    if ((v = json_object_get(req, "dump"))) {
        static const char *const dknown[] = {"steps", "path", NULL};
        if (!json_is_object(v)) {
            tg_errf(e, "field 'dump' must be an object {\"steps\":[...],\"path\":\"dir\"}");
            goto out;
        }
        if (check_fields(v, dknown, e)) {
            tg_err_prefix(e, "field 'dump'");
            goto out;
        }
        json_t *ds = json_object_get(v, "steps"), *dp = json_object_get(v, "path");
        if (!json_is_array(ds) || json_array_size(ds) == 0) {
            tg_errf(e, "field 'dump.steps' must be a non-empty array of step numbers");
            goto out;
        }
        size_t k = json_array_size(ds);
        if (k > (size_t)r.steps) {
            tg_errf(e, "field 'dump.steps' has %zu entries, more than steps (%d)", k, r.steps);
            goto out;
        }
        dsteps = malloc(sizeof *dsteps * k);
        if (!dsteps) {
            tg_errf(e, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < k; i++) {
            json_t *x = json_array_get(ds, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= r.steps) {
                tg_errf(e, "field 'dump.steps'[%zu] must be a step number 0..%d", i, r.steps - 1);
                goto out;
            }
            dsteps[i] = (int)json_integer_value(x);
        }
        qsort(dsteps, k, sizeof *dsteps, cmp_int);
        for (size_t i = 1; i < k; i++)
            if (dsteps[i] == dsteps[i - 1]) {
                tg_errf(e, "field 'dump.steps' lists step %d twice", dsteps[i]);
                goto out;
            }
        struct stat st;
        if (!json_is_string(dp) || json_string_length(dp) == 0) {
            tg_errf(e, "field 'dump.path' must be a non-empty string (an existing folder)");
            goto out;
        }
        if (stat(json_string_value(dp), &st) != 0 || !S_ISDIR(st.st_mode)) {
            tg_errf(e, "field 'dump.path': %s is not an existing folder", json_string_value(dp));
            goto out;
        }
        r.dump_steps = dsteps;
        r.n_dump_steps = (int)k;
        r.dump_path = json_string_value(dp);
    }
    proto_done done = {0};
    if (ops->decode(ops->ud, &r, c, &done, e)) {
        json_decref(done.counters);
        goto out;
    }
    json_t *counters = done.counters ? done.counters : json_object();
    json_t *j = json_pack("{s:b,s:b,s:o,s:{s:f,s:f,s:f}}", "ok", 1, "done", 1, "counters", counters,
                          "ms", "load", c->ms_load, "prefill", done.ms_prefill, "decode",
                          done.ms_decode);
    if (!j) {
        tg_errf(e, "out of memory");
        goto out;
    }
    write_json(c, j);
    json_decref(j);
    rc = 0;
out:
    free(prompt);
    free(force);
    free(dsteps);
    return rc;
}

static int op_replay(proto_conn *c, const proto_ops *ops, const json_t *req, tg_err *e)
{
    static const char *const known[] = {"op", "tokens", "in", "out", "numerics", "prefill", NULL};
    if (check_fields(req, known, e)) return -1;
    proto_replay_req r = {0};
    int32_t *tokens = NULL;
    json_t *v = json_object_get(req, "tokens");
    if (!v) return tg_errf(e, "field 'tokens' is missing (an array of token ids)");
    if (field_ids(v, "tokens", 0, &tokens, &r.n_tokens, e)) return -1;
    r.tokens = tokens;
    if (field_int(req, "prefill", 1, r.n_tokens, 0, &r.prefill, e)) {
        free(tokens);
        return -1;
    }
    const char *const paths[2] = {"in", "out"};
    for (int i = 0; i < 2; i++) {
        json_t *p = json_object_get(req, paths[i]);
        if (!p && i == 0) continue;
        if (!json_is_string(p) || json_string_length(p) == 0) {
            free(tokens);
            return tg_errf(e, "field '%s' must be a non-empty string (a file path)", paths[i]);
        }
        if (i == 0) r.in = json_string_value(p);
        else r.out = json_string_value(p);
    }
    if ((v = json_object_get(req, "numerics"))) {
        if (!json_is_object(v)) {
            free(tokens);
            return tg_errf(e, "field 'numerics' must be an object (docs/protocol.md, \"numerics\")");
        }
        r.numerics = v;
    }
    json_t *res = json_object();
    int rc = ops->replay(ops->ud, &r, res, e);
    free(tokens);
    if (rc) {
        json_decref(res);
        return -1;
    }
    json_t *j = json_pack("{s:b,s:o}", "ok", 1, "replay", res);
    write_json(c, j);
    json_decref(j);
    return 0;
}

int proto_handle_line(proto_conn *c, const proto_ops *ops, const char *line, size_t len)
{
    tg_err e = {{0}};
    json_error_t jerr;
    json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    int rc = 0;
    if (!req) {
        tg_errf(&e, "request is not valid JSON: %s (line 1, column %d)", jerr.text, jerr.column);
        rc = write_error(c, e.msg);
        return rc < 0 ? -1 : 0;
    }
    json_t *opv = json_object_get(req, "op");
    const char *op = json_is_string(opv) ? json_string_value(opv) : NULL;
    int failed = 0;
    if (!json_is_object(req) || !op) {
        tg_errf(&e, "request must be a JSON object with an \"op\" string");
        failed = 1;
    } else if (strcmp(op, "bye") == 0) {
        static const char *const known[] = {"op", NULL};
        if (check_fields(req, known, &e)) {
            tg_err_prefix(&e, "bye");
            failed = 1;
        } else {
            json_t *j = json_pack("{s:b,s:b}", "ok", 1, "bye", 1);
            write_json(c, j);
            json_decref(j);
            rc = 1;
        }
    } else {
        static const char *const names[] = {"hello", "load", "tokenize", "detokenize", "decode", "replay"};
        int (*const fns[])(proto_conn *, const proto_ops *, const json_t *, tg_err *) = {
            op_hello, op_load, op_tokenize, op_detokenize, op_decode, op_replay};
        const void *cbs[] = {(const void *)ops->hello, (const void *)ops->load,
                             (const void *)ops->tokenize, (const void *)ops->detokenize,
                             (const void *)ops->decode, (const void *)ops->replay};
        int which = -1;
        for (int i = 0; i < 6; i++)
            if (strcmp(op, names[i]) == 0) which = i;
        if (which < 0) {
            tg_errf(&e, "unknown op '%.64s' (expected hello, load, tokenize, detokenize, decode, replay, bye)",
                    op);
            failed = 1;
        } else if (!cbs[which]) {
            tg_errf(&e, "%s: not supported by this worker", op);
            failed = 1;
        } else if (fns[which](c, ops, req, &e)) {
            tg_err_prefix(&e, "%s", op);
            failed = 1;
        }
    }
    json_decref(req);
    if (failed) write_error(c, e.msg);
    if (c->werr) return -1;
    return rc;
}

/* The private answer stream of proto_private_out: fopencookie callbacks. */
typedef struct priv_out {
    int fd;
    const char *prog;
} priv_out;

static ssize_t priv_write(void *cookie, const char *buf, size_t n)
{
    priv_out *p = cookie;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(p->fd, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            /* nobody reads the answers any more: stop at once */
            fprintf(stderr, "%s: writing the protocol stream failed (%s): exiting\n", p->prog,
                    w < 0 ? strerror(errno) : "no progress");
            _exit(1);
        }
        done += (size_t)w;
    }
    return (ssize_t)n;
}

static int priv_close(void *cookie)
{
    priv_out *p = cookie;
    int rc = close(p->fd);
    free(p);
    return rc;
}

FILE *proto_private_out(const char *prog, tg_err *e)
{
    fflush(stdout);
    int fd = fcntl(1, F_DUPFD_CLOEXEC, 3);
    if (fd < 0) {
        tg_errf(e, "%s: cannot duplicate stdout: %s", prog, strerror(errno));
        return NULL;
    }
    if (dup2(2, 1) < 0) {
        tg_errf(e, "%s: cannot point stdout at stderr: %s", prog, strerror(errno));
        close(fd);
        return NULL;
    }
    priv_out *p = malloc(sizeof *p);
    cookie_io_functions_t io = {.write = priv_write, .close = priv_close};
    FILE *f = p ? fopencookie(p, "w", io) : NULL;
    if (!f) {
        tg_errf(e, "%s: out of memory", prog);
        free(p);
        close(fd);
        return NULL;
    }
    p->fd = fd;
    p->prog = prog;
    return f;
}

int proto_serve(FILE *in, FILE *out, const proto_ops *ops)
{
    signal(SIGPIPE, SIG_IGN);
    proto_conn *c = proto_conn_new(out);
    if (!c) return -1;
    char *buf = NULL;
    size_t cap = 0, len = 0;
    int rc = 0;
    for (;;) {
        int r = proto_read_line(in, &buf, &cap, PROTO_MAX_LINE, &len);
        if (r == 0) break;
        if (r < 0) {
            rc = -1;
            break;
        }
        if (r == 2) {
            char msg[128];
            snprintf(msg, sizeof msg, "request line longer than %u bytes: refused", PROTO_MAX_LINE);
            if (write_error(c, msg) < 0) {
                rc = -1;
                break;
            }
            continue;
        }
        size_t i = 0;
        while (i < len && (buf[i] == ' ' || buf[i] == '\t')) i++;
        if (i == len) continue;  /* blank line */
        int h = proto_handle_line(c, ops, buf, len);
        if (h < 0) {
            rc = -1;
            break;
        }
        if (h == 1) break;
    }
    free(buf);
    proto_conn_free(c);
    return rc;
}
