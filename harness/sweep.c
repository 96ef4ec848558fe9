/*
 * sweep.c: sweep files, the sweep runner, shard plans and shard runs (see
 * sweep.h and docs/sweep.md). A sweep entry is resolved by editing the
 * spec's YAML document with libfyaml: top-level overrides replace (or add)
 * keys, `arms` keeps a subset of the spec's arms (dropping the spec's
 * `exact:` and an arm's `variant_of:` when they name an arm left out),
 * `arm_options` merges keys
 * into an arm's load options; the document is emitted back to text and
 * parsed with spec_parse(), so the spec rules are checked in one place and
 * the store keeps the text that actually ran.
 */
#include "sweep.h"

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <libfyaml.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "gate.h"
#include "spec.h"
#include "trend.h"
#include "verdict.h"

/* The largest sweep or spec file read (as spec.c reads specs). */
#define SWEEP_MAX_FILE ((size_t)256 << 20)

typedef struct sweep_entry {
    char *name;              /* spec name after overrides */
    char *path;              /* the spec file, absolute */
    char *text;              /* resolved spec text */
} sweep_entry;

struct tg_sweep {
    char *path;
    char *name;
    char sha256[65];         /* of the sweep file */
    int n;
    sweep_entry *e;
};

/* The absolute form of a spec path named in the sweep file: as given when
 * absolute, else relative to the sweep file's folder (never the current
 * directory, so a sweep resolves the same wherever it is run from).
 * Returns a malloc'ed string. */
static char *resolve_path(const char *sweep_path, const char *p)
{
    char real[PATH_MAX];
    if (p[0] == '/') return xstrdup(realpath(p, real) ? real : p);
    char *dir = xstrdup(sweep_path), *slash = strrchr(dir, '/');
    char buf[PATH_MAX];
    if (slash) {
        *slash = 0;
        snprintf(buf, sizeof buf, "%s/%s", *dir ? dir : "/", p);
    } else
        snprintf(buf, sizeof buf, "%s", p);
    free(dir);
    return xstrdup(realpath(buf, real) ? real : buf);
}

/* "FILE:LINE:COL" of a node into buf. */
static const char *where(const char *path, struct fy_node *n, char *buf, size_t cap)
{
    /* a scalar's own token, else the first key of a mapping / item of a list */
    for (int depth = 0; n && !fy_node_is_scalar(n) && depth < 8; depth++) {
        void *it = NULL;
        if (fy_node_is_mapping(n)) {
            struct fy_node_pair *p = fy_node_mapping_iterate(n, &it);
            n = p ? fy_node_pair_key(p) : NULL;
        } else
            n = fy_node_sequence_iterate(n, &it);
    }
    struct fy_token *t = n && fy_node_is_scalar(n) ? fy_node_get_scalar_token(n) : NULL;
    const struct fy_mark *m = t ? fy_token_start_mark(t) : NULL;
    if (m)
        snprintf(buf, cap, "%s:%d:%d", path, m->line + 1, m->column + 1);
    else
        snprintf(buf, cap, "%s", path);
    return buf;
}

static int is_map(struct fy_node *n) { return n && fy_node_get_type(n) == FYNT_MAPPING; }
static int is_seq(struct fy_node *n) { return n && fy_node_get_type(n) == FYNT_SEQUENCE; }
static int is_scalar(struct fy_node *n) { return n && fy_node_get_type(n) == FYNT_SCALAR; }

/* Sets key (a scalar of len bytes) in mapping map of document d to a copy
 * of value (a node of another document). Returns 0 or -1. */
static int map_set(struct fy_document *d, struct fy_node *map, const char *key, size_t len,
                   struct fy_node *value)
{
    struct fy_node *copy = fy_node_copy(d, value);
    if (!copy) return -1;
    struct fy_node_pair *p = fy_node_mapping_lookup_pair_by_string(map, key, len);
    if (p) return fy_node_pair_set_value(p, copy) == 0 ? 0 : -1;
    struct fy_node *k = fy_node_create_scalar_copy(d, key, len);
    if (!k) return -1;
    return fy_node_mapping_append(map, k, copy) == 0 ? 0 : -1;
}

/* Applies the mapping over (from the sweep document) to the spec root.
 * Returns 0 or -1 with e. */
static int apply_overrides(struct fy_document *d, struct fy_node *root, struct fy_node *over,
                           const char *swpath, tg_err *e)
{
    char at[PATH_MAX + 32];
    if (!is_map(over))
        return tg_errf(e, "%s: overrides: expected a mapping of spec keys", where(swpath, over, at, sizeof at));
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(over, &it))) {
        size_t kl;
        const char *k = fy_node_get_scalar(fy_node_pair_key(p), &kl);
        if (!k) return tg_errf(e, "%s: overrides: expected scalar keys", where(swpath, over, at, sizeof at));
        if (kl == 4 && !memcmp(k, "arms", 4))
            return tg_errf(e, "%s: overrides: arms: use the entry's `arms:` (a subset) and "
                              "`arm_options:` instead of replacing the arm list",
                           where(swpath, fy_node_pair_key(p), at, sizeof at));
        if (map_set(d, root, k, kl, fy_node_pair_value(p)) < 0)
            return tg_errf(e, "%s: overrides: cannot set %.*s", where(swpath, over, at, sizeof at), (int)kl, k);
    }
    return 0;
}

/* The arm entry named name in the spec's arms sequence, or NULL. */
static struct fy_node *find_arm(struct fy_node *arms, const char *name)
{
    void *it = NULL;
    struct fy_node *a;
    while ((a = fy_node_sequence_iterate(arms, &it))) {
        const char *n = fy_node_get_scalar0(fy_node_mapping_lookup_by_string(a, "name", 4));
        if (n && !strcmp(n, name)) return a;
    }
    return NULL;
}

/* Keeps only the arms listed in keep (a sequence of names). Returns 0 or -1 with e. */
static int apply_arm_subset(struct fy_node *arms, struct fy_node *keep, const char *swpath, tg_err *e)
{
    char at[PATH_MAX + 32];
    if (!is_seq(keep))
        return tg_errf(e, "%s: arms: expected a list of arm names", where(swpath, keep, at, sizeof at));
    void *it = NULL;
    struct fy_node *k;
    while ((k = fy_node_sequence_iterate(keep, &it))) {
        const char *n = fy_node_get_scalar0(k);
        if (!is_scalar(k) || !n)
            return tg_errf(e, "%s: arms: expected arm names", where(swpath, k, at, sizeof at));
        if (!find_arm(arms, n))
            return tg_errf(e, "%s: arms: the spec has no arm named '%s'", where(swpath, k, at, sizeof at), n);
    }
    for (;;) {
        struct fy_node *drop = NULL, *a;
        it = NULL;
        while (!drop && (a = fy_node_sequence_iterate(arms, &it))) {
            const char *n = fy_node_get_scalar0(fy_node_mapping_lookup_by_string(a, "name", 4));
            int kept = 0;
            void *it2 = NULL;
            while (n && (k = fy_node_sequence_iterate(keep, &it2)))
                if (!strcmp(fy_node_get_scalar0(k), n)) kept = 1;
            if (!kept) drop = a;
        }
        if (!drop) break;
        fy_node_sequence_remove(arms, drop);
        fy_node_free(drop);
    }
    return 0;
}

/* Removes key k (and its value) from mapping m, if present. */
static void map_remove(struct fy_node *m, const char *k)
{
    struct fy_node_pair *p = fy_node_mapping_lookup_pair_by_string(m, k, strlen(k));
    if (p) fy_node_free(fy_node_mapping_remove_by_key(m, fy_node_pair_key(p)));
}

/* After an arm subset: references to arms no longer there go (the spec's
 * exact arm, an arm's variant_of), so the cut spec still validates. */
static void prune_arm_refs(struct fy_node *root, struct fy_node *arms)
{
    struct fy_node *x = fy_node_mapping_lookup_by_string(root, "exact", 5);
    const char *n = x && is_scalar(x) ? fy_node_get_scalar0(x) : NULL;
    if (n && !find_arm(arms, n)) map_remove(root, "exact");
    void *it = NULL;
    struct fy_node *a;
    while ((a = fy_node_sequence_iterate(arms, &it))) {
        if (!fy_node_is_mapping(a)) continue;
        x = fy_node_mapping_lookup_by_string(a, "variant_of", 10);
        n = x && is_scalar(x) ? fy_node_get_scalar0(x) : NULL;
        if (n && !find_arm(arms, n)) map_remove(a, "variant_of");
    }
}

/* Merges arm_options ({ARM: {key: value}}) into the arms' load options
 * (the arm's `options`, or its `llama: {options}` for a llama arm). */
static int apply_arm_options(struct fy_document *d, struct fy_node *arms, struct fy_node *ao,
                             const char *swpath, tg_err *e)
{
    char at[PATH_MAX + 32];
    if (!is_map(ao))
        return tg_errf(e, "%s: arm_options: expected a mapping ARM: {key: value}", where(swpath, ao, at, sizeof at));
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(ao, &it))) {
        const char *name = fy_node_get_scalar0(fy_node_pair_key(p));
        struct fy_node *v = fy_node_pair_value(p);
        if (!name || !is_map(v))
            return tg_errf(e, "%s: arm_options: expected ARM: {key: value}", where(swpath, fy_node_pair_key(p), at, sizeof at));
        struct fy_node *arm = find_arm(arms, name);
        if (!arm)
            return tg_errf(e, "%s: arm_options: the spec has no arm named '%s'",
                           where(swpath, fy_node_pair_key(p), at, sizeof at), name);
        struct fy_node *target = fy_node_mapping_lookup_by_string(arm, "llama", 5);
        if (!is_map(target)) target = arm;
        struct fy_node *opts = fy_node_mapping_lookup_by_string(target, "options", 7);
        if (!opts) {
            struct fy_node *k = fy_node_create_scalar_copy(d, "options", 7);
            opts = fy_node_build_from_string(d, "{}", 2);
            if (!k || !opts || fy_node_mapping_append(target, k, opts) != 0)
                return tg_errf(e, "%s: arm_options: cannot add options to arm %s", swpath, name);
        }
        if (!is_map(opts))
            return tg_errf(e, "%s: arm_options: arm %s has options that are not a mapping", swpath, name);
        void *it2 = NULL;
        struct fy_node_pair *q;
        while ((q = fy_node_mapping_iterate(v, &it2))) {
            size_t kl;
            const char *k = fy_node_get_scalar(fy_node_pair_key(q), &kl);
            if (!k || map_set(d, opts, k, kl, fy_node_pair_value(q)) < 0)
                return tg_errf(e, "%s: arm_options: cannot set an option of arm %s", swpath, name);
        }
    }
    return 0;
}

/* A fresh libfyaml document from text (kept alive by the caller), quiet. */
static struct fy_document *build_doc(const char *text, size_t len)
{
    struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET | FYPCF_RESOLVE_DOCUMENT};
    return fy_document_build_from_string(&cfg, text, len);
}

/* Resolves one entry of the sweep (mapping ent) into se. global is the
 * sweep's top-level overrides or NULL. Returns 0 or -1 with e. */
static int resolve_entry(const char *swpath, int idx, struct fy_node *ent, struct fy_node *global,
                         sweep_entry *se, tg_err *e)
{
    char at[PATH_MAX + 32];
    if (!is_map(ent))
        return tg_errf(e, "%s: specs[%d]: expected a mapping {spec: FILE, ...}", where(swpath, ent, at, sizeof at), idx);
    static const char *const known[] = {"spec", "name", "overrides", "arms", "arm_options", NULL};
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(ent, &it))) {
        const char *k = fy_node_get_scalar0(fy_node_pair_key(p));
        int ok = 0;
        for (int i = 0; known[i] && k; i++) ok |= !strcmp(k, known[i]);
        if (!ok)
            return tg_errf(e, "%s: specs[%d]: unknown key '%s', expected spec, name, overrides, arms or arm_options",
                           where(swpath, fy_node_pair_key(p), at, sizeof at), idx, k ? k : "?");
    }
    struct fy_node *sp = fy_node_mapping_lookup_by_string(ent, "spec", 4);
    const char *spath = fy_node_get_scalar0(sp);
    if (!is_scalar(sp) || !spath || !*spath)
        return tg_errf(e, "%s: specs[%d].spec: expected the path of a spec file", where(swpath, ent, at, sizeof at), idx);
    se->path = resolve_path(swpath, spath);
    char *text;
    size_t len;
    if (common_read_file(se->path, SWEEP_MAX_FILE, &text, &len, e) < 0) return tg_err_prefix(e, "%s: specs[%d].spec", where(swpath, sp, at, sizeof at), idx);
    int rc = -1;
    struct fy_document *d = build_doc(text, len);
    struct fy_node *root = d ? fy_document_root(d) : NULL;
    if (!is_map(root)) {
        tg_errf(e, "%s: not a YAML mapping (a spec was expected)", se->path);
        goto done;
    }
    if (global && apply_overrides(d, root, global, swpath, e) < 0) goto done;
    struct fy_node *n;
    if ((n = fy_node_mapping_lookup_by_string(ent, "overrides", 9)) && apply_overrides(d, root, n, swpath, e) < 0)
        goto done;
    if ((n = fy_node_mapping_lookup_by_string(ent, "name", 4))) {
        if (!is_scalar(n)) {
            tg_errf(e, "%s: specs[%d].name: expected a spec name", where(swpath, n, at, sizeof at), idx);
            goto done;
        }
        if (map_set(d, root, "name", 4, n) < 0) goto done;
    }
    struct fy_node *arms = fy_node_mapping_lookup_by_string(root, "arms", 4);
    if ((n = fy_node_mapping_lookup_by_string(ent, "arms", 4))) {
        if (!is_seq(arms)) {
            tg_errf(e, "%s: arms: expected a list in the spec", se->path);
            goto done;
        }
        if (apply_arm_subset(arms, n, swpath, e) < 0) goto done;
        prune_arm_refs(root, arms);
    }
    if ((n = fy_node_mapping_lookup_by_string(ent, "arm_options", 11))) {
        if (!is_seq(arms)) {
            tg_errf(e, "%s: arms: expected a list in the spec", se->path);
            goto done;
        }
        if (apply_arm_options(d, arms, n, swpath, e) < 0) goto done;
    }
    char *out = fy_emit_document_to_string(d, FYECF_MODE_BLOCK | FYECF_WIDTH_INF | FYECF_INDENT_2);
    if (!out) {
        tg_errf(e, "%s: specs[%d]: cannot emit the resolved spec", swpath, idx);
        goto done;
    }
    se->text = xstrdup(out);
    free(out);
    tg_spec *s;
    if (spec_parse(&s, se->path, se->text, strlen(se->text), e) < 0) {
        tg_err_prefix(e, "%s: specs[%d] (the spec with the sweep's overrides applied)",
                      where(swpath, ent, at, sizeof at), idx);
        goto done;
    }
    se->name = xstrdup(s->name);
    spec_free(s);
    rc = 0;
done:
    fy_document_destroy(d);
    free(text);
    return rc;
}

int sweep_load(tg_sweep **out, const char *path, tg_err *e)
{
    *out = NULL;
    char *text;
    size_t len;
    if (common_read_file(path, SWEEP_MAX_FILE, &text, &len, e) < 0) return -1;
    tg_sweep *sw = xcalloc(1, sizeof *sw);
    sw->path = xstrdup(path);
    tg_sha256_buf(text, len, sw->sha256);
    int rc = -1;
    char at[PATH_MAX + 32];
    struct fy_document *d = build_doc(text, len);
    struct fy_node *root = d ? fy_document_root(d) : NULL;
    if (!is_map(root)) {
        tg_errf(e, "%s: expected a YAML mapping with name and specs", path);
        goto done;
    }
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(root, &it))) {
        const char *k = fy_node_get_scalar0(fy_node_pair_key(p));
        if (!k || (strcmp(k, "name") && strcmp(k, "overrides") && strcmp(k, "specs"))) {
            tg_errf(e, "%s: unknown key '%s', expected name, overrides or specs",
                    where(path, fy_node_pair_key(p), at, sizeof at), k ? k : "?");
            goto done;
        }
    }
    const char *name = fy_node_get_scalar0(fy_node_mapping_lookup_by_string(root, "name", 4));
    if (!name || !*name) {
        tg_errf(e, "%s: name: expected the sweep's name", path);
        goto done;
    }
    sw->name = xstrdup(name);
    struct fy_node *global = fy_node_mapping_lookup_by_string(root, "overrides", 9);
    struct fy_node *specs = fy_node_mapping_lookup_by_string(root, "specs", 5);
    if (!is_seq(specs) || fy_node_sequence_item_count(specs) < 1) {
        tg_errf(e, "%s: specs: expected a non-empty list of {spec: FILE, ...}", where(path, specs ? specs : root, at, sizeof at));
        goto done;
    }
    sw->n = fy_node_sequence_item_count(specs);
    sw->e = xcalloc((size_t)sw->n, sizeof *sw->e);
    it = NULL;
    struct fy_node *ent;
    for (int i = 0; (ent = fy_node_sequence_iterate(specs, &it)); i++)
        if (resolve_entry(path, i, ent, global, &sw->e[i], e) < 0) goto done;
    for (int i = 0; i < sw->n; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(sw->e[i].name, sw->e[j].name)) {
                tg_errf(e, "%s: specs[%d] and specs[%d] both resolve to the spec name '%s'; "
                           "give one a `name:` (history is kept per spec name)", path, j, i, sw->e[i].name);
                goto done;
            }
    rc = 0;
done:
    fy_document_destroy(d);
    free(text);
    if (rc == 0) *out = sw;
    else sweep_free(sw);
    return rc;
}

void sweep_free(tg_sweep *sw)
{
    if (!sw) return;
    for (int i = 0; i < sw->n; i++) {
        free(sw->e[i].name);
        free(sw->e[i].path);
        free(sw->e[i].text);
    }
    free(sw->e);
    free(sw->name);
    free(sw->path);
    free(sw);
}

const char *sweep_name(const tg_sweep *sw) { return sw->name; }
int sweep_n_entries(const tg_sweep *sw) { return sw->n; }
const char *sweep_entry_name(const tg_sweep *sw, int i) { assert(i >= 0 && i < sw->n); return sw->e[i].name; }
const char *sweep_entry_text(const tg_sweep *sw, int i) { assert(i >= 0 && i < sw->n); return sw->e[i].text; }
const char *sweep_entry_path(const tg_sweep *sw, int i) { assert(i >= 0 && i < sw->n); return sw->e[i].path; }

int sweep_shard_of(int i, int n_shards)
{
    assert(i >= 0 && n_shards >= 1);
    return i % n_shards + 1;
}

/* ------------------------------------------------------------------ */
/* Running                                                             */

/* A run-level verdict value of the latest set into buf ("-" if none). */
static void run_key(tg_store *st, int64_t run, const char *key, char *buf, size_t n)
{
    snprintf(buf, n, "-");
    sqlite3_stmt *s;
    s = common_sql_prepare(store_db(st),
                           "SELECT value FROM verdict WHERE run_id=?1 AND arm IS NULL AND prompt IS NULL"
                           " AND key=?2 ORDER BY set_no DESC LIMIT 1",
                           "It", run, key);
    if (!s)
        return;
    if (sqlite3_step(s) == SQLITE_ROW) snprintf(buf, n, "%s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
}

int sweep_run_spec(tg_store *st, const char *path, const char *text, const char *bin_dir,
                   int jobs, int progress, sweep_row *row)
{
    memset(row, 0, sizeof *row);
    snprintf(row->verdict, sizeof row->verdict, "ERROR");
    snprintf(row->divergences, sizeof row->divergences, "-");
    snprintf(row->trend, sizeof row->trend, "-");
    double t0 = tg_now();
    tg_err e = {{0}};
    tg_spec *spec;
    if (spec_parse(&spec, path, text, strlen(text), &e) < 0) {
        snprintf(row->name, sizeof row->name, "?");
        snprintf(row->error, sizeof row->error, "%s", e.msg);
        return -1;
    }
    snprintf(row->name, sizeof row->name, "%s", spec->name);
    gate_options go = {.bin_dir = bin_dir, .jobs = jobs, .progress = progress};
    gate_result gr;
    memset(&gr, 0, sizeof gr);
    int rc = -1;
    if (gate_run(st, spec, &go, &gr, &e) < 0) {
        row->run_id = gr.run_id;
        if (gr.run_id > 0) store_finish_run(st, gr.run_id, "ERROR", NULL);
        snprintf(row->error, sizeof row->error, "%s", e.msg);
        goto done;
    }
    row->run_id = gr.run_id;
    verdict_options vo = verdict_options_default();
    verdict_result vr;
    if (verdict_score_run(st, gr.run_id, &vo, &vr, &e) < 0) {
        store_finish_run(st, gr.run_id, "ERROR", NULL);
        snprintf(row->error, sizeof row->error, "scoring: %s", e.msg);
        goto done;
    }
    if (store_finish_run(st, gr.run_id, vr.verdict, &e) < 0) {
        snprintf(row->error, sizeof row->error, "%s", e.msg);
        goto done;
    }
    snprintf(row->verdict, sizeof row->verdict, "%s", vr.verdict);
    row->n_arms = vr.n_test_arms;
    row->n_pass = vr.n_pass;
    run_key(st, gr.run_id, "GENERATION_DIVERGENCES", row->divergences, sizeof row->divergences);
    /* what changed against the spec's earlier runs in this store */
    FILE *sink = fopen("/dev/null", "w");
    trend_result tr;
    if (sink && trend_spec(st, spec->name, 0, 0, sink, &tr, &e) == 0)
        snprintf(row->trend, sizeof row->trend, "%s", tr.word);
    if (sink) fclose(sink);
    rc = 0;
done:
    row->seconds = tg_now() - t0;
    spec_free(spec);
    return rc;
}

void sweep_print_summary(FILE *out, const sweep_row *rows, int n)
{
    fprintf(out, "\n%-36s %6s %-15s %9s %14s %-11s %8s\n", "spec", "run", "verdict", "arms ok", "divergences",
            "trend", "seconds");
    for (int i = 0; i < n; i++) {
        const sweep_row *r = &rows[i];
        char arms[24];
        snprintf(arms, sizeof arms, "%d/%d", r->n_pass, r->n_arms);
        fprintf(out, "%-36s %6lld %-15s %9s %14s %-11s %8.1f\n", r->name, (long long)r->run_id, r->verdict,
                r->error[0] ? "-" : arms, r->divergences, r->trend, r->seconds);
        if (r->error[0]) fprintf(out, "    error: %s\n", r->error);
    }
    int pass = 0, err = 0;
    for (int i = 0; i < n; i++) {
        pass += !strcmp(rows[i].verdict, "PASS");
        err += !strcmp(rows[i].verdict, "ERROR");
    }
    int regress = 0;
    for (int i = 0; i < n; i++) regress += !strcmp(rows[i].trend, "REGRESSION");
    fprintf(out, "%d specs: %d PASS, %d not PASS, %d ERROR; %d with a regression (see `tokgate trend`)\n", n,
            pass, n - pass - err, err, regress);
}

int sweep_exit_code(const sweep_row *rows, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(rows[i].verdict, "ERROR")) return 2;
        if (strcmp(rows[i].verdict, "PASS")) rc = 1;
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* CPUs                                                                */

/* The threads one process of arm i uses: its `threads` load option, else 1
 * for the ref and gpu tiers and for exec and command arms, or 0 when the
 * worker picks (the cpu tier and llama.cpp use every CPU they see). */
static int arm_threads(const tg_spec *s, int i)
{
    const spec_arm *a = &s->arms[i];
    json_error_t je;
    json_t *o = json_loads(a->options_json ? a->options_json : "{}", 0, &je);
    json_t *t = json_object_get(o, "threads");
    int n = json_is_integer(t) ? (int)json_integer_value(t) : 0;
    json_decref(o);
    if (n > 0) return n;
    if (a->kind == SPEC_ARM_LLAMA) return 0;
    if (a->kind == SPEC_ARM_ENGINE && a->tier && !strcmp(a->tier, "cpu")) return 0;
    return 1;
}

void sweep_spec_cpus(const tg_spec *s, int cap, sweep_cpus *c)
{
    memset(c, 0, sizeof *c);
    c->threads = 1;
    size_t nn = 0;
    for (int i = 0; i < s->n_arms; i++) {
        int t = arm_threads(s, i);
        if (t == 0) {
            if (nn < sizeof c->note)
                nn += (size_t)snprintf(c->note + nn, sizeof c->note - nn,
                                       "%sarm %s sets no threads (its worker takes every CPU it sees; counted as 1)",
                                       nn ? "; " : "", s->arms[i].name);
            t = 1;
        }
        if (t > c->threads) c->threads = t;
    }
    /* legs side by side: the spec's jobs, at most the legs there are */
    int tasks = s->n_arms * s->legs - (strcmp(s->mode, "teacher-forced") ? 0 : 1);
    c->jobs = s->jobs < tasks ? s->jobs : tasks;
    if (c->jobs < 1) c->jobs = 1;
    if (cap > 0) {
        int fit = cap / c->threads;
        if (fit < 1) fit = 1;
        if (c->jobs > fit && nn < sizeof c->note)
            nn += (size_t)snprintf(c->note + nn, sizeof c->note - nn, "%sjobs %d -> %d to fit %d CPUs",
                                   nn ? "; " : "", c->jobs, fit, cap);
        if (c->jobs > fit) c->jobs = fit;
        if (c->threads > cap && nn < sizeof c->note)
            nn += (size_t)snprintf(c->note + nn, sizeof c->note - nn,
                                   "%san arm runs %d threads on %d CPUs: it will be slower", nn ? "; " : "",
                                   c->threads, cap);
    }
    c->cpus = c->threads * c->jobs;
}

/* The CPUs this process may run on (its affinity mask), or 0 if unknown. */
static int cpus_available(void)
{
    cpu_set_t cs;
    CPU_ZERO(&cs);
    return sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : 0;
}

/* ------------------------------------------------------------------ */
/* Commands                                                            */

static int usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "tokgate: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(run `tokgate help` for usage)\n");
    return 2;
}

/* Options of sweep / plan / run. */
typedef struct sopts {
    const char *pos;
    const char *db, *out, *only, *shard;
    int jobs, shards, cpus;
} sopts;

enum { O_DB = COMMON_CLI_FIRST_ID, O_JOBS, O_ONLY, O_SHARDS, O_OUT, O_SHARD, O_CPUS };
static const struct option SWEEP_OPTS[] = {
    {"db", required_argument, NULL, O_DB}, {"jobs", required_argument, NULL, O_JOBS},
    {"only", required_argument, NULL, O_ONLY}, {NULL, 0, NULL, 0}};
static const struct option PLAN_OPTS[] = {
    {"shards", required_argument, NULL, O_SHARDS}, {"out", required_argument, NULL, O_OUT},
    {"cpus-per-task", required_argument, NULL, O_CPUS}, {NULL, 0, NULL, 0}};
static const struct option RUN_OPTS[] = {
    {"shard", required_argument, NULL, O_SHARD}, {"db", required_argument, NULL, O_DB},
    {"jobs", required_argument, NULL, O_JOBS}, {NULL, 0, NULL, 0}};

/* One option of sweep / plan / run into the sopts ud. Returns 0 or -1 with e. */
static int on_opt(void *ud, int id, const char *v, tg_err *e)
{
    sopts *o = ud;
    switch (id) {
    case O_DB: o->db = v; break;
    case 'o':
    case O_OUT: o->out = v; break;
    case O_ONLY: o->only = v; break;
    case O_SHARD: o->shard = v; break;
    case O_JOBS:
        if (common_parse_int(v, 1, 256, &o->jobs) < 0) return tg_errf(e, "--jobs: expected an integer 1..256, got '%s'", v);
        break;
    case O_SHARDS:
        if (common_parse_int(v, 1, 100000, &o->shards) < 0)
            return tg_errf(e, "--shards: expected an integer >= 1, got '%s'", v);
        break;
    case O_CPUS:
        if (common_parse_int(v, 1, 4096, &o->cpus) < 0)
            return tg_errf(e, "--cpus-per-task: expected an integer 1..4096, got '%s'", v);
        break;
    }
    return 0;
}

/* Parses argv[2..] with common_cli_parse (options and the one positional
 * argument in any order) against the command's long options lo and short
 * options so (NULL or "o:"). Returns 0, -1 when --help was answered, or an
 * exit code after a message. */
static int parse(int argc, char **argv, const char *so, const struct option *lo, sopts *o)
{
    memset(o, 0, sizeof *o);
    char help[96];
    snprintf(help, sizeof help, "(see tokgate help %s)\n", argv[1]);
    const common_cli cli = {argv[1], help, lo, 1, so};
    const char *pos[1] = {NULL};
    int np = 0;
    int rc = common_cli_parse(&cli, argc - 1, argv + 1, on_opt, o, pos, &np);
    if (rc) return rc == COMMON_CLI_HELP ? -1 : rc;
    o->pos = np ? pos[0] : NULL;
    return 0;
}

int sweep_main(int argc, char **argv)
{
    sopts o;
    int rc = parse(argc, argv, NULL, SWEEP_OPTS, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (!o.pos) return usage("sweep: expected a SWEEP file%s", "");
    tg_err e;
    tg_sweep *sw;
    if (sweep_load(&sw, o.pos, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return 2;
    }
    tg_store *st;
    if (store_open_cmd(&st, o.db ? o.db : "tokgate.db", 0)) {
        sweep_free(sw);
        return 2;
    }
    char bins[PATH_MAX];
    gate_bin_dir(bins, sizeof bins);
    sweep_row *rows = xcalloc((size_t)sw->n, sizeof *rows);
    int n = 0;
    for (int i = 0; i < sw->n; i++) {
        if (o.only && strcmp(o.only, sw->e[i].name)) continue;
        fprintf(stderr, "tokgate: sweep %s: [%d/%d] %s\n", sw->name, i + 1, sw->n, sw->e[i].name);
        sweep_run_spec(st, sw->e[i].path, sw->e[i].text, bins, o.jobs, isatty(2), &rows[n]);
        fprintf(stderr, "tokgate: sweep %s: %s: %s%s%s\n", sw->name, rows[n].name, rows[n].verdict,
                rows[n].error[0] ? ": " : "", rows[n].error);
        n++;
    }
    if (o.only && n == 0) {
        fprintf(stderr, "tokgate: sweep: no spec named '%s' in %s\n", o.only, o.pos);
        rc = 2;
    } else {
        printf("sweep %s (%s)\n", sw->name, o.pos);
        sweep_print_summary(stdout, rows, n);
        rc = sweep_exit_code(rows, n);
    }
    free(rows);
    store_close(st);
    sweep_free(sw);
    return rc;
}

int sweep_plan_main(int argc, char **argv)
{
    sopts o;
    int rc = parse(argc, argv, "o:", PLAN_OPTS, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (!o.pos) return usage("plan: expected a SWEEP file%s", "");
    if (!o.shards) return usage("plan: --shards N is required%s", "");
    tg_err e;
    tg_sweep *sw;
    if (sweep_load(&sw, o.pos, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return 2;
    }
    const char *out = o.out ? o.out : "tokgate-plan.json";
    char real[PATH_MAX];
    json_t *plan = json_pack("{s:i, s:s, s:s, s:s, s:i}", "plan", 1, "sweep", sw->name,
                             "sweep_path", realpath(o.pos, real) ? real : o.pos,
                             "sweep_sha256", sw->sha256, "shards", o.shards);
    json_t *units = json_array();
    if (!plan || !units) common_out_of_memory(0);
    printf("plan of sweep %s: %d specs in %d shards\n", sw->name, sw->n, o.shards);
    printf("%-6s %-6s %7s %5s %5s  %s\n", "unit", "shard", "threads", "jobs", "cpus", "spec");
    int need = 1;
    for (int i = 0; i < sw->n; i++) {
        char sha[65];
        tg_sha256_buf(sw->e[i].text, strlen(sw->e[i].text), sha);
        tg_spec *s;
        if (spec_parse(&s, sw->e[i].path, sw->e[i].text, strlen(sw->e[i].text), &e) < 0) {
            fprintf(stderr, "tokgate: plan: %s\n", e.msg);
            json_decref(units);
            json_decref(plan);
            sweep_free(sw);
            return 2;
        }
        sweep_cpus c;
        sweep_spec_cpus(s, o.cpus, &c);
        spec_free(s);
        if (c.cpus > need) need = c.cpus;
        json_array_append_new(units, json_pack("{s:i, s:i, s:s, s:s, s:s, s:s, s:i, s:i, s:i}", "unit", i + 1,
                                               "shard", sweep_shard_of(i, o.shards), "name", sw->e[i].name,
                                               "spec_path", sw->e[i].path, "spec_sha256", sha,
                                               "spec_text", sw->e[i].text, "threads", c.threads, "jobs", c.jobs,
                                               "cpus", c.cpus));
        printf("%-6d %-6d %7d %5d %5d  %s\n", i + 1, sweep_shard_of(i, o.shards), c.threads, c.jobs, c.cpus,
               sw->e[i].name);
        if (c.note[0]) printf("         %s: %s\n", sw->e[i].name, c.note);
    }
    /* one request fits every unit: a shard runs its units one after the other */
    int per_task = o.cpus > 0 ? o.cpus : need;
    json_object_set_new(plan, "cpus_per_task", json_integer(per_task));
    printf("cpus-per-task: %d (%s)\n", per_task,
           o.cpus > 0 ? "as given; jobs capped to fit" : "the most threads x jobs of any unit");
    json_object_set_new(plan, "units", units);
    common_out co = {0};
    tg_err ce;
    int wr = common_out_open(&co, out, NULL, "--out", &e);
    if (wr == 0 && json_dumpf(plan, co.f, JSON_INDENT(1)) != 0) wr = tg_errf(&e, "%s: write error", out);
    if (common_out_close(&co, wr == 0, &ce) < 0 && wr == 0) {
        e = ce;
        wr = -1;
    }
    if (wr < 0) {
        fprintf(stderr, "tokgate: plan: cannot write %s\n", e.msg);
        rc = 2;
    } else
        fprintf(stderr, "tokgate: plan written to %s (run each shard with `tokgate run --shard I/%d %s`)\n",
                out, o.shards, out);
    json_decref(plan);
    sweep_free(sw);
    return rc;
}

int sweep_run_main(int argc, char **argv)
{
    sopts o;
    int rc = parse(argc, argv, NULL, RUN_OPTS, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (!o.shard) return usage("run: --shard I/N is required%s", "");
    int si, sn;
    char a[32], b[32];
    const char *slash = strchr(o.shard, '/');
    if (!slash || slash - o.shard >= (long)sizeof a || strlen(slash + 1) >= sizeof b)
        return usage("--shard: expected I/N (e.g. 2/4), got '%s'", o.shard);
    snprintf(a, sizeof a, "%.*s", (int)(slash - o.shard), o.shard);
    snprintf(b, sizeof b, "%s", slash + 1);
    if (common_parse_int(b, 1, 100000, &sn) < 0 || common_parse_int(a, 1, sn, &si) < 0)
        return usage("--shard: expected I/N with 1 <= I <= N, got '%s'", o.shard);
    const char *plan_path = o.pos ? o.pos : "tokgate-plan.json";
    json_error_t je;
    json_t *plan = json_load_file(plan_path, 0, &je);
    if (!plan) {
        fprintf(stderr, "tokgate: run: %s:%d: %s (expected a plan from `tokgate plan`)\n", plan_path, je.line, je.text);
        return 2;
    }
    int shards = (int)json_integer_value(json_object_get(plan, "shards"));
    json_t *units = json_object_get(plan, "units");
    if (json_integer_value(json_object_get(plan, "plan")) != 1 || shards < 1 || !json_is_array(units)) {
        fprintf(stderr, "tokgate: run: %s: expected a plan (keys plan: 1, shards, units)\n", plan_path);
        json_decref(plan);
        return 2;
    }
    if (shards != sn) {
        fprintf(stderr, "tokgate: run: --shard %s, but the plan %s has %d shards\n", o.shard, plan_path, shards);
        json_decref(plan);
        return 2;
    }
    char dbdef[64];
    snprintf(dbdef, sizeof dbdef, "tokgate-shard-%d-of-%d.db", si, sn);
    const char *db = o.db ? o.db : dbdef;
    tg_store *st;
    struct stat sb;
    if (stat(db, &sb) == 0) {
        /* a finished shard (the file only appears complete): report, run nothing */
        if (store_open_cmd(&st, db, 0)) {
            json_decref(plan);
            return 2;
        }
        sqlite3_stmt *s;
        rc = 0;
        int n = 0;
        if (sqlite3_prepare_v2(store_db(st), "SELECT coalesce(verdict, 'ERROR') FROM run", -1, &s, NULL) == SQLITE_OK) {
            while (sqlite3_step(s) == SQLITE_ROW) {
                const char *v = (const char *)sqlite3_column_text(s, 0);
                n++;
                if (!strcmp(v, "ERROR")) rc = 2;
                else if (strcmp(v, "PASS") && rc == 0) rc = 1;
            }
            sqlite3_finalize(s);
        }
        printf("shard %d/%d: %s is already complete (%d runs); nothing to do\n", si, sn, db, n);
        store_close(st);
        json_decref(plan);
        return rc;
    }
    char partial[PATH_MAX + 16];
    snprintf(partial, sizeof partial, "%s.partial", db);
    store_remove_files(partial);
    if (store_open_cmd(&st, partial, 0)) {
        json_decref(plan);
        return 2;
    }
    char bins[PATH_MAX];
    gate_bin_dir(bins, sizeof bins);
    size_t nu = json_array_size(units);
    sweep_row *rows = xcalloc(nu + 1, sizeof *rows);
    int n = 0;
    for (size_t i = 0; i < nu; i++) {
        json_t *u = json_array_get(units, i);
        if ((int)json_integer_value(json_object_get(u, "shard")) != si) continue;
        const char *text = json_string_value(json_object_get(u, "spec_text"));
        const char *path = json_string_value(json_object_get(u, "spec_path"));
        if (!text || !path) {
            fprintf(stderr, "tokgate: run: %s: units[%zu]: spec_text and spec_path expected\n", plan_path, i);
            rc = 2;
            break;
        }
        const char *uname = json_string_value(json_object_get(u, "name"));
        fprintf(stderr, "tokgate: shard %d/%d: unit %lld %s\n", si, sn,
                (long long)json_integer_value(json_object_get(u, "unit")), uname ? uname : "?");
        /* the legs side by side that the plan fitted to its CPUs, unless --jobs */
        int jobs = o.jobs ? o.jobs : (int)json_integer_value(json_object_get(u, "jobs"));
        int need = (int)json_integer_value(json_object_get(u, "cpus")), have = cpus_available();
        if (!o.jobs && need > 0 && have > 0 && need > have)
            fprintf(stderr, "tokgate: shard %d/%d: %s needs %d CPUs (%lld jobs x %lld threads) but this process "
                            "may use %d (its CPU affinity): it will run slower; submit with --cpus-per-task=%d, "
                            "or plan with --cpus-per-task %d\n",
                    si, sn, uname ? uname : "?", need, (long long)json_integer_value(json_object_get(u, "jobs")),
                    (long long)json_integer_value(json_object_get(u, "threads")), have, need, have);
        sweep_run_spec(st, path, text, bins, jobs > 0 ? jobs : 0, isatty(2), &rows[n++]);
    }
    store_close(st);
    if (rc == 0) {
        printf("shard %d/%d of sweep %s -> %s\n", si, sn, json_string_value(json_object_get(plan, "sweep")), db);
        sweep_print_summary(stdout, rows, n);
        rc = sweep_exit_code(rows, n);
        /* complete: the store appears under its final name (WAL checkpointed at close) */
        if (rc != 2 && rename(partial, db) != 0) {
            fprintf(stderr, "tokgate: run: renaming %s to %s: %s\n", partial, db, strerror(errno));
            rc = 2;
        }
        if (rc == 2) fprintf(stderr, "tokgate: shard %d/%d: left as %s (errors); run it again to retry\n", si, sn, partial);
    }
    free(rows);
    json_decref(plan);
    return rc;
}
