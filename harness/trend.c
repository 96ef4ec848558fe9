/*
 * trend.c: the history of specs across runs of one store (trend.h). Loads,
 * for one spec, every run with its latest verdict set as a table run x arm
 * of figures (verdict, divergences, Wilson interval, near ties lost,
 * largest lost gap, KL) and of what each arm ran (its spec entry, the
 * sha256 of its library and worker, its device), walks the runs in time
 * order deciding which are good (baselines), and prints the history, the
 * changes from the previous run and the regressions of the latest run
 * against its baseline with their likely cause. The baseline decisions of
 * a team (`tokgate baseline`) live in the table trend_mark, created here.
 */
#include "trend.h"

#include <errno.h>
#include <jansson.h>
#include <libfyaml.h>
#include <limits.h>
#include <math.h>
#include <pwd.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "svg.h"
#include "verdict.h"

#define MAX_ARMS 32

/* The baseline decisions: one row per decision, the latest per run wins
 * (created, then id); keyed by run.uid so that they survive `tokgate merge`. */
static const char MARK_SQL[] =
    "CREATE TABLE IF NOT EXISTS trend_mark(\n"
    "  id INTEGER PRIMARY KEY, run_uid TEXT NOT NULL,\n"
    "  action TEXT NOT NULL CHECK (action IN ('accept', 'exclude', 'clear')),\n"
    "  reason TEXT NOT NULL, created TEXT NOT NULL, who TEXT)";

enum { MARK_NONE, MARK_ACCEPT, MARK_EXCLUDE };

/* The figures of one arm in one run. */
typedef struct arm_pt {
    int present;             /* scored: a TOKEN_GATE and GENERATION_DIVERGENCES */
    int data;                /* steps were compared (GENERATION_DIVERGENCES k/n with n > 0) */
    int gate;                /* 0 PASS, 1 NOT_MEASURABLE, 2 FAIL */
    char gate_word[16];
    int div_k, div_n;        /* GENERATION_DIVERGENCES */
    double lo, hi;           /* Wilson 95% interval of div_k / div_n */
    int near_n, near_won;    /* NEAR_TIES_WON */
    double max_lost_gap;     /* largest reference gap among lost steps; 0 when none */
    double kl;               /* KL_MEAN */
    int scored_leg;          /* SCORED_LEG */
} arm_pt;

/* What one arm of a run ran. */
typedef struct arm_fp {
    int in_run;
    char role[16];           /* reference | test | oracle | custody */
    char *config;            /* the arm's spec entry as JSON (owned), or NULL */
    char bin[65];            /* sha256 of the leg's binary: a llama arm's library, else its worker */
    char bin_name[64];       /* its file name */
    char worker[65];         /* the worker's own sha256 from its hello, when another file, else "" */
    char *device;            /* its leg's device description (owned), whole: a description
                              * cut short would hide a change in its tail */
} arm_fp;

typedef struct run_pt {
    int64_t id;
    char uid[40], started[32], overall[16], mode[24], reference[64];
    char spec_sha[65], artifact_sha[65], host[160], version[64];
    char *spec_text;         /* owned */
    int mark;                /* MARK_NONE | MARK_ACCEPT | MARK_EXCLUDE */
    char mark_reason[512], mark_when[32], mark_who[96];
    arm_pt arm[MAX_ARMS];
    arm_fp fp[MAX_ARMS];
    /* the walk */
    int good;
    char status[200];
    int tok_base;            /* the run its steps were compared with, or -1 */
    uint32_t tok_arms[2];    /* arms with a determinism ([0]) or tokens ([1]) regression against tok_base */
} run_pt;

typedef struct history {
    int n_arms;
    char arms[MAX_ARMS][64];
    int n;
    run_pt *runs;            /* time order, excluded runs included (flagged by mark) */
} history;

/* A growing string. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *p = xrealloc(b->p, cap);
        if (!b->p) p[0] = 0;
        b->p = p;
        b->cap = cap;
    }
}

static const char *sb_str(const sbuf *b) { return b->p ? b->p : ""; }


static const char *col(sqlite3_stmt *s, int i)
{
    const char *t = (const char *)sqlite3_column_text(s, i);
    return t ? t : "";
}

static void history_free(history *h)
{
    for (int i = 0; i < h->n; i++) {
        free(h->runs[i].spec_text);
        for (int a = 0; a < MAX_ARMS; a++) {
            free(h->runs[i].fp[a].config);
            free(h->runs[i].fp[a].device);
        }
    }
    free(h->runs);
    memset(h, 0, sizeof *h);
}

static int gate_rank(const char *w)
{
    if (!strcmp(w, "PASS")) return 0;
    if (!strcmp(w, "FAIL")) return 2;
    return 1;
}

static int arm_index(history *h, const char *name)
{
    for (int i = 0; i < h->n_arms; i++)
        if (!strcmp(h->arms[i], name)) return i;
    if (h->n_arms >= MAX_ARMS) return -1;
    snprintf(h->arms[h->n_arms], sizeof h->arms[0], "%s", name);
    return h->n_arms++;
}

static int arm_find(const history *h, const char *name)
{
    for (int i = 0; i < h->n_arms; i++)
        if (!strcmp(h->arms[i], name)) return i;
    return -1;
}

/* Whether the store has a table called name. */
static int has_table(sqlite3 *db, const char *schema, const char *name)
{
    char *q = sqlite3_mprintf("SELECT 1 FROM \"%w\".sqlite_master WHERE type = 'table' AND name = %Q", schema, name);
    sqlite3_stmt *s;
    int r = 0;
    if (q && sqlite3_prepare_v2(db, q, -1, &s, NULL) == SQLITE_OK) {
        r = sqlite3_step(s) == SQLITE_ROW;
        sqlite3_finalize(s);
    }
    sqlite3_free(q);
    return r;
}

/* ------------------------------------------------------------------ */
/* Loading                                                             */

/* Reads one run's figures from verdict set set_no. Returns 0 or -1 with e. */
static int load_run(sqlite3 *db, history *h, run_pt *rp, int set_no, tg_err *e)
{
    sqlite3_stmt *s;
    s = common_sql_prepare(db, "SELECT arm, key, value FROM verdict WHERE run_id=?1 AND set_no=?2"
                               " AND prompt IS NULL", "Ii", rp->id, set_no);
    if (!s)
        return common_sql_err(db, e, "reading verdicts");
    int scored[MAX_ARMS] = {0};
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *arm = (const char *)sqlite3_column_text(s, 0);
        const char *key = (const char *)sqlite3_column_text(s, 1);
        const char *val = (const char *)sqlite3_column_text(s, 2);
        if (!key || !val) continue;
        if (!arm) {
            if (!strcmp(key, "TOKEN_GATE")) snprintf(rp->overall, sizeof rp->overall, "%s", val);
            continue;
        }
        int a = arm_index(h, arm);
        if (a < 0) continue;
        arm_pt *p = &rp->arm[a];
        if (!strcmp(key, "TOKEN_GATE")) {
            snprintf(p->gate_word, sizeof p->gate_word, "%s", val);
            p->gate = gate_rank(val);
        } else if (!strcmp(key, "GENERATION_DIVERGENCES")) {
            if (sscanf(val, "%d/%d", &p->div_k, &p->div_n) == 2) scored[a] = 1;
        } else if (!strcmp(key, "NEAR_TIES_WON"))
            sscanf(val, "%d/%d", &p->near_won, &p->near_n);
        else if (!strcmp(key, "KL_MEAN"))
            p->kl = strtod(val, NULL);
        else if (!strcmp(key, "SCORED_LEG"))
            p->scored_leg = (int)strtol(val, NULL, 10);
    }
    sqlite3_finalize(s);
    for (int a = 0; a < h->n_arms; a++) {
        arm_pt *p = &rp->arm[a];
        if (!scored[a] || !p->gate_word[0]) {
            memset(p, 0, sizeof *p);
            continue;
        }
        p->present = 1;
        p->data = p->div_n > 0;
        verdict_wilson(p->div_k, p->div_n, &p->lo, &p->hi);
        int leg = p->scored_leg;
        s = common_sql_prepare(db, "SELECT max(ref_gap) FROM compare WHERE run_id=?1 AND set_no=?2 AND arm=?3"
                                   " AND leg=?4 AND class NOT IN ('EXACT', 'UNCOMPARABLE')",
                               "Iiti", rp->id, set_no, h->arms[a], leg > 0 ? leg : 1);
        if (!s)
            return common_sql_err(db, e, "reading compare rows");
        if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL)
            p->max_lost_gap = sqlite3_column_double(s, 0);
        sqlite3_finalize(s);
    }
    return 0;
}

/* Reads what each arm of the run ran: its spec entry, the binary of its
 * first leg, the worker's own hash from its hello, its device. Returns 0 or
 * -1 with e. */
static int load_fp(sqlite3 *db, history *h, run_pt *rp, tg_err *e)
{
    sqlite3_stmt *s;
    s = common_sql_prepare(db, "SELECT a.name, a.role, a.config, b.sha256, b.path, l.hello, l.device"
                               " FROM arm a LEFT JOIN leg l ON l.id = (SELECT id FROM leg"
                               "   WHERE run_id = a.run_id AND arm_id = a.id ORDER BY leg LIMIT 1)"
                               " LEFT JOIN binary b ON b.id = l.binary_id WHERE a.run_id = ?1 ORDER BY a.id",
                           "I", rp->id);
    if (!s)
        return common_sql_err(db, e, "reading the arms of a run");
    while (sqlite3_step(s) == SQLITE_ROW) {
        int a = arm_index(h, col(s, 0));
        if (a < 0) continue;
        arm_fp *f = &rp->fp[a];
        f->in_run = 1;
        snprintf(f->role, sizeof f->role, "%s", col(s, 1));
        if (sqlite3_column_type(s, 2) != SQLITE_NULL) {
            f->config = xstrdup(col(s, 2));
        }
        snprintf(f->bin, sizeof f->bin, "%s", col(s, 3));
        const char *path = col(s, 4), *slash = strrchr(path, '/');
        snprintf(f->bin_name, sizeof f->bin_name, "%s", slash ? slash + 1 : path);
        json_error_t je;
        json_t *hello = json_loads(col(s, 5), 0, &je);
        const char *w = json_string_value(json_object_get(json_object_get(hello, "arm"), "binary_sha256"));
        if (w && strcmp(w, f->bin)) snprintf(f->worker, sizeof f->worker, "%s", w);
        json_decref(hello);
        free(f->device);
        f->device = xstrdup(col(s, 6));
    }
    sqlite3_finalize(s);
    return 0;
}

/* Applies the team's decisions (trend_mark) to the runs of h. Returns 0 or -1 with e. */
static int load_marks(sqlite3 *db, history *h, tg_err *e)
{
    if (!has_table(db, "main", "trend_mark")) return 0;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, "SELECT run_uid, action, reason, created, coalesce(who, '') FROM trend_mark"
                               " ORDER BY created, id", -1, &s, NULL) != SQLITE_OK)
        return common_sql_err(db, e, "reading trend_mark");
    while (sqlite3_step(s) == SQLITE_ROW)
        for (int i = 0; i < h->n; i++) {
            run_pt *r = &h->runs[i];
            if (strcmp(r->uid, col(s, 0))) continue;
            const char *act = col(s, 1);
            r->mark = !strcmp(act, "accept") ? MARK_ACCEPT : !strcmp(act, "exclude") ? MARK_EXCLUDE : MARK_NONE;
            snprintf(r->mark_reason, sizeof r->mark_reason, "%s", col(s, 2));
            snprintf(r->mark_when, sizeof r->mark_when, "%s", col(s, 3));
            snprintf(r->mark_who, sizeof r->mark_who, "%s", col(s, 4));
        }
    sqlite3_finalize(s);
    return 0;
}

/* Loads the history of spec_name. Returns 1 loaded, 0 no such spec, -1 with e. */
static int load_history(sqlite3 *db, const char *spec_name, history *h, tg_err *e)
{
    memset(h, 0, sizeof *h);
    sqlite3_stmt *s;
    s = common_sql_prepare(db, "SELECT r.id, r.uid, r.started, r.mode, r.reference, s.sha256, s.text, a.sha256,"
                               " r.host, r.tokgate_version, (SELECT max(set_no) FROM verdict_set v WHERE v.run_id = r.id)"
                               " FROM run r JOIN spec s ON s.id = r.spec_id JOIN artifact a ON a.id = r.artifact_id"
                               " WHERE s.name = ?1 ORDER BY r.started, r.id", "t", spec_name);
    if (!s)
        return common_sql_err(db, e, "listing runs");
    int cap = 0, rc = 1, any = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        any = 1;
        if (sqlite3_column_type(s, 10) == SQLITE_NULL) continue;   /* never scored (an ERROR run) */
        if (h->n == cap) {
            cap = cap ? 2 * cap : 8;
            run_pt *r = xrealloc(h->runs, sizeof *r * (size_t)cap);
            h->runs = r;
        }
        run_pt *rp = &h->runs[h->n++];
        memset(rp, 0, sizeof *rp);
        rp->id = sqlite3_column_int64(s, 0);
        snprintf(rp->uid, sizeof rp->uid, "%s", col(s, 1));
        snprintf(rp->started, sizeof rp->started, "%s", col(s, 2));
        snprintf(rp->mode, sizeof rp->mode, "%s", col(s, 3));
        snprintf(rp->reference, sizeof rp->reference, "%s", col(s, 4));
        snprintf(rp->spec_sha, sizeof rp->spec_sha, "%s", col(s, 5));
        rp->spec_text = xstrdup(col(s, 6));
        snprintf(rp->artifact_sha, sizeof rp->artifact_sha, "%s", col(s, 7));
        snprintf(rp->host, sizeof rp->host, "%s", col(s, 8));
        snprintf(rp->version, sizeof rp->version, "%s", col(s, 9));
        rp->tok_base = -1;
        if (load_run(db, h, rp, sqlite3_column_int(s, 10), e) < 0 || load_fp(db, h, rp, e) < 0) {
            rc = -1;
            break;
        }
    }
    sqlite3_finalize(s);
    if (rc == 1 && load_marks(db, h, e) < 0) rc = -1;
    if (rc == 1 && !any) rc = 0;
    return rc;
}

/* ------------------------------------------------------------------ */
/* What changed between two runs                                       */

/* Flattens a JSON value into "path=value" lines of *out (objects by key). */
static void flatten(const json_t *v, const char *path, sbuf *out)
{
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            char p[512];
            snprintf(p, sizeof p, "%s%s%s", path, *path ? "." : "", k);
            flatten(x, p, out);
        }
        return;
    }
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    sb_printf(out, "%s=%s\n", path, t ? t : "?");
    free(t);
}

/* The value of "path=" in flattened lines, as a pointer into them and its
 * length, or NULL. */
static const char *flat_get(const char *lines, const char *path, size_t *len)
{
    size_t pl = strlen(path);
    for (const char *l = lines; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t ll = nl ? (size_t)(nl - l) : strlen(l);
        if (ll > pl && !memcmp(l, path, pl) && l[pl] == '=') {
            *len = ll - pl - 1;
            return l + pl + 1;
        }
        l = nl ? nl + 1 : NULL;
    }
    return NULL;
}

/* Appends to out the keys whose values differ between two flattened sets,
 * "path a -> b" separated by ", " ("-" for a missing key); returns the count. */
static int flat_diff(const char *x, const char *y, sbuf *out)
{
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        const char *lines = pass ? y : x, *other = pass ? x : y;
        for (const char *l = lines; l && *l;) {
            const char *nl = strchr(l, '\n'), *eq = strchr(l, '=');
            size_t ll = nl ? (size_t)(nl - l) : strlen(l);
            if (eq && eq < l + ll) {
                char path[512];
                snprintf(path, sizeof path, "%.*s", (int)(eq - l), l);
                size_t vl = ll - (size_t)(eq - l) - 1, ol = 0;
                const char *ov = flat_get(other, path, &ol);
                int differ = !ov || ol != vl || memcmp(ov, eq + 1, vl);
                if (differ && !(pass && ov)) {   /* keys of both are reported once, from x */
                    const char *xv = pass ? ov : eq + 1, *yv = pass ? eq + 1 : ov;
                    size_t xl = pass ? ol : vl, yl = pass ? vl : ol;
                    sb_printf(out, "%s%s %.*s -> %.*s", n ? ", " : "", path, xv ? (int)xl : 1, xv ? xv : "-",
                              yv ? (int)yl : 1, yv ? yv : "-");
                    n++;
                }
            }
            l = nl ? nl + 1 : NULL;
        }
    }
    return n;
}

/* The changed keys of two arm configurations into out; returns the count. */
static int config_diff(const char *cx, const char *cy, sbuf *out)
{
    if (!cx || !cy) return 0;
    if (!strcmp(cx, cy)) return 0;
    json_error_t je;
    json_t *x = json_loads(cx, 0, &je), *y = json_loads(cy, 0, &je);
    sbuf fx = {0}, fy = {0};
    flatten(x, "", &fx);
    flatten(y, "", &fy);
    int n = flat_diff(sb_str(&fx), sb_str(&fy), out);
    json_decref(x);
    json_decref(y);
    free(fx.p);
    free(fy.p);
    return n;
}

/* The top-level keys of spec text, except name and arms, as flattened
 * "key=value" lines (each value emitted as one line of flow YAML). */
static void spec_keys(const char *text, sbuf *out)
{
    struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET};
    struct fy_document *d = fy_document_build_from_string(&cfg, text, strlen(text));
    struct fy_node *root = d ? fy_document_root(d) : NULL;
    if (root && fy_node_is_mapping(root)) {
        void *it = NULL;
        struct fy_node_pair *p;
        while ((p = fy_node_mapping_iterate(root, &it))) {
            const char *k = fy_node_get_scalar0(fy_node_pair_key(p));
            if (!k || !strcmp(k, "arms") || !strcmp(k, "name")) continue;
            char *v = fy_emit_node_to_string(fy_node_pair_value(p), FYECF_MODE_FLOW_ONELINE | FYECF_WIDTH_INF);
            if (v) {
                for (char *c = v; *c; c++)
                    if (*c == '\n') *c = ' ';
                size_t l = strlen(v);
                while (l && v[l - 1] == ' ') v[--l] = 0;
            }
            if (v && strlen(v) > 60) {
                /* a long value (a prompt list): its length and hash stand for it */
                char sha[65];
                tg_sha256_buf(v, strlen(v), sha);
                sb_printf(out, "%s=(%zu characters, sha256 %.8s)\n", k, strlen(v), sha);
            } else
                sb_printf(out, "%s=%s\n", k, v ? v : "?");
            free(v);
        }
    }
    fy_document_destroy(d);
}

/* The changed top-level keys of two spec texts into out (spec_keys,
 * flat_diff); returns the count. */
static int spec_diff(const char *tx, const char *ty, sbuf *out)
{
    sbuf kx = {0}, ky = {0};
    spec_keys(tx, &kx);
    spec_keys(ty, &ky);
    int n = flat_diff(sb_str(&kx), sb_str(&ky), out);
    free(kx.p);
    free(ky.p);
    return n;
}

/* Whether arm a ran the same binaries in runs x and y. */
static int same_bins(const arm_fp *x, const arm_fp *y)
{
    return x->in_run == y->in_run && !strcmp(x->bin, y->bin) && !strcmp(x->worker, y->worker);
}

/* Whether runs x and y ran the same binaries (every arm's library and
 * worker), the same model and the same spec text. */
static int same_fp(const history *h, const run_pt *x, const run_pt *y)
{
    if (strcmp(x->spec_sha, y->spec_sha) || strcmp(x->artifact_sha, y->artifact_sha)) return 0;
    for (int a = 0; a < h->n_arms; a++)
        if (!same_bins(&x->fp[a], &y->fp[a])) return 0;
    return 1;
}

/* What changed about arm a from run x to run y, into out ("" when nothing);
 * returns 1 when something did. */
static int arm_change(const history *h, const run_pt *x, const run_pt *y, int a, sbuf *out)
{
    const arm_fp *fx = &x->fp[a], *fy = &y->fp[a];
    if (!fx->in_run && !fy->in_run) return 0;
    if (!fx->in_run || !fy->in_run) {
        sb_printf(out, "%s", fx->in_run ? "removed" : "added");
        return 1;
    }
    size_t n0 = out->n;
    sbuf d = {0};
    if (config_diff(fx->config, fy->config, &d)) sb_printf(out, "configuration %s", sb_str(&d));
    free(d.p);
    if (strcmp(fx->bin, fy->bin))
        sb_printf(out, "%sbinary %s %.8s -> %s %.8s", out->n > n0 ? "; " : "", fx->bin_name, fx->bin[0] ? fx->bin : "-",
                  fy->bin_name, fy->bin[0] ? fy->bin : "-");
    if (strcmp(fx->worker, fy->worker))
        sb_printf(out, "%sworker %.8s -> %.8s", out->n > n0 ? "; " : "", fx->worker[0] ? fx->worker : "-",
                  fy->worker[0] ? fy->worker : "-");
    (void)h;
    return out->n > n0;
}

/* The likely cause of a difference between runs x (before) and y: what
 * changed in the model, the arms (focus first: the arm the regression is
 * about, then the reference, then the others) and the other spec keys;
 * else "binaries, model and spec unchanged". The device, host and tokgate
 * version are added as context when they changed. */
static void describe_cause(const history *h, const run_pt *x, const run_pt *y, int focus, sbuf *out)
{
    int n = 0;
    if (strcmp(x->artifact_sha, y->artifact_sha)) {
        sb_printf(out, "model sha256 %.12s... -> %.12s...", x->artifact_sha, y->artifact_sha);
        n++;
    }
    int ref = arm_find(h, y->reference);
    int order[MAX_ARMS], no = 0;
    if (focus >= 0) order[no++] = focus;
    if (ref >= 0 && ref != focus) order[no++] = ref;
    for (int a = 0; a < h->n_arms; a++)
        if (a != focus && a != ref) order[no++] = a;
    int focus_changed = 0, ref_changed = 0;
    for (int i = 0; i < no; i++) {
        int a = order[i];
        sbuf d = {0};
        if (arm_change(h, x, y, a, &d)) {
            sb_printf(out, "%sarm %s%s: %s", n ? "; " : "", h->arms[a], a == ref ? " (the reference)" : "",
                      sb_str(&d));
            n++;
            if (a == focus) focus_changed = 1;
            if (a == ref) ref_changed = 1;
        }
        free(d.p);
    }
    if (strcmp(x->spec_sha, y->spec_sha)) {
        sbuf d = {0};
        if (spec_diff(x->spec_text, y->spec_text, &d)) {
            sb_printf(out, "%sspec %s", n ? "; " : "", sb_str(&d));
            n++;
        } else if (!n) {
            sb_printf(out, "spec text (sha256 %.8s -> %.8s)", x->spec_sha, y->spec_sha);
            n++;
        }
        free(d.p);
    }
    if (!n) sb_printf(out, "binaries, model and spec unchanged");
    else if (focus >= 0 && focus != ref && ref >= 0 && ref_changed && !focus_changed)
        sb_printf(out, " (%s itself unchanged)", h->arms[focus]);
    /* context */
    for (int a = 0; a < h->n_arms; a++)
        if (x->fp[a].in_run && y->fp[a].in_run && x->fp[a].device && y->fp[a].device &&
            strcmp(x->fp[a].device, y->fp[a].device))
            sb_printf(out, "; device of %s: %s -> %s", h->arms[a], x->fp[a].device, y->fp[a].device);
    if (strcmp(x->host, y->host)) sb_printf(out, "; host %s -> %s", x->host, y->host);
    if (strcmp(x->version, y->version)) sb_printf(out, "; tokgate %s -> %s", x->version, y->version);
}

/* Steps of each arm of run y that differ from the same (leg, prompt, step)
 * of run x. */
typedef struct tokdiff {
    int n_cmp;               /* steps in both */
    int n_tok;               /* token differs */
    int n_dig;               /* logits digest differs */
    char first[128];         /* the first differing step, "p2/7 leg 1: token 201 -> 361" */
} tokdiff;

/* Compares the steps of runs x and y arm by arm into td[]. Returns 0 or -1 with e. */
static int compare_steps(sqlite3 *db, const history *h, int64_t x, int64_t y, tokdiff *td, tg_err *e)
{
    memset(td, 0, sizeof *td * MAX_ARMS);
    sqlite3_stmt *s;
    s = common_sql_prepare(db, "SELECT a.name, l.leg, p.name, s.step, s.token, s.digest, s2.token, s2.digest"
                               " FROM leg l JOIN arm a ON a.id = l.arm_id"
                               " JOIN step s ON s.leg_id = l.id JOIN prompt p ON p.id = s.prompt_id"
                               " JOIN arm a2 ON a2.run_id = ?2 AND a2.name = a.name"
                               " JOIN leg l2 ON l2.run_id = ?2 AND l2.arm_id = a2.id AND l2.leg = l.leg"
                               " JOIN prompt p2 ON p2.run_id = ?2 AND p2.name = p.name"
                               " JOIN step s2 ON s2.leg_id = l2.id AND s2.prompt_id = p2.id AND s2.step = s.step"
                               " WHERE l.run_id = ?1 ORDER BY a.name, l.leg, p.no, s.step", "II", x, y);
    if (!s)
        return common_sql_err(db, e, "comparing steps");
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int a = arm_find(h, col(s, 0));
        if (a < 0) continue;
        tokdiff *t = &td[a];
        t->n_cmp++;
        int tok = sqlite3_column_int(s, 4) != sqlite3_column_int(s, 6);
        int dig = sqlite3_column_type(s, 5) != sqlite3_column_type(s, 7) ||
                  sqlite3_column_int64(s, 5) != sqlite3_column_int64(s, 7);
        t->n_tok += tok;
        t->n_dig += dig;
        /* the first token that differs, else the first digest */
        if (tok && t->n_tok == 1)
            snprintf(t->first, sizeof t->first, "%s/%d leg %d: token %d -> %d", col(s, 2), sqlite3_column_int(s, 3),
                     sqlite3_column_int(s, 1), sqlite3_column_int(s, 4), sqlite3_column_int(s, 6));
        else if (dig && !t->n_tok && t->n_dig == 1)
            snprintf(t->first, sizeof t->first, "%s/%d leg %d: digest %016llx -> %016llx", col(s, 2),
                     sqlite3_column_int(s, 3), sqlite3_column_int(s, 1),
                     (unsigned long long)sqlite3_column_int64(s, 5), (unsigned long long)sqlite3_column_int64(s, 7));
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : common_sql_err(db, e, "comparing steps");
}

/* ------------------------------------------------------------------ */
/* The walk                                                            */

/* Kinds of regression; the first three compare figures, the last two steps. */
enum { M_VERDICT, M_DIVERGENCE, M_KL, N_METRICS, K_DETERMINISM = N_METRICS, K_TOKENS, N_KINDS };
static const char *const KIND_NAME[N_KINDS] = {"verdict", "divergence rate", "KL divergence", "determinism",
                                               "tokens"};

typedef struct finding {
    int kind, arm;
    int base, first;         /* indices into the history's runs */
    tokdiff td;              /* K_DETERMINISM, K_TOKENS */
} finding;

/* What the latest run showed: its findings, the changes of its steps that
 * are not findings, its baseline. */
typedef struct eval {
    int nf;
    finding f[MAX_ARMS * N_KINDS];
    int tok_base;            /* the latest baseline run, or -1 */
    tokdiff td[MAX_ARMS];    /* its steps against tok_base */
    int follow;              /* the reference's tokens changed (teacher-forced): other arms follow */
    int same;                /* same binaries, model and spec as tok_base */
} eval;

/* Is x worse than y on metric m? */
static int worse(int m, const arm_pt *x, const arm_pt *y)
{
    if (!x->present || !y->present) return 0;
    switch (m) {
    case M_VERDICT: return x->gate > y->gate;
    case M_DIVERGENCE: return x->data && y->data && x->lo > y->hi;
    case M_KL: return x->data && y->data && x->kl > TREND_KL_FACTOR * y->kl + TREND_KL_FLOOR;
    }
    return 0;
}

static void describe(int m, const arm_pt *p, char *buf, size_t n)
{
    switch (m) {
    case M_VERDICT: snprintf(buf, n, "%s", p->gate_word); break;
    case M_DIVERGENCE:
        snprintf(buf, n, "%d/%d = %.4f [%.4f, %.4f]", p->div_k, p->div_n,
                 p->div_n ? (double)p->div_k / p->div_n : 0.0, p->lo, p->hi);
        break;
    case M_KL: snprintf(buf, n, "%.3g", p->kl); break;
    }
}

/* Compares run i with the good runs win[0..nw) (time order) into *ev.
 * Returns 0 or -1 with e. */
static int evaluate(sqlite3 *db, history *h, int i, const int *win, int nw, eval *ev, tg_err *e)
{
    memset(ev, 0, sizeof *ev);
    ev->tok_base = -1;
    run_pt *L = &h->runs[i];
    for (int a = 0; a < h->n_arms; a++)
        for (int m = 0; m < N_METRICS; m++) {
            int B = -1;
            for (int j = nw - 1; j >= 0 && B < 0; j--)
                if (worse(m, &L->arm[a], &h->runs[win[j]].arm[a])) B = win[j];
            if (B < 0) continue;
            int first = i;
            for (int k = B + 1; k <= i; k++)
                if (h->runs[k].mark != MARK_EXCLUDE && worse(m, &h->runs[k].arm[a], &h->runs[B].arm[a])) {
                    first = k;
                    break;
                }
            ev->f[ev->nf++] = (finding){.kind = m, .arm = a, .base = B, .first = first};
        }
    if (nw == 0) return 0;
    int T = win[nw - 1];
    ev->tok_base = T;
    if (compare_steps(db, h, h->runs[T].id, L->id, ev->td, e) < 0) return -1;
    int ref = arm_find(h, L->reference);
    ev->follow = !strcmp(L->mode, "teacher-forced") && ref >= 0 && ev->td[ref].n_tok > 0;
    ev->same = same_fp(h, &h->runs[T], L);
    L->tok_base = T;
    L->tok_arms[0] = L->tok_arms[1] = 0;
    for (int a = 0; a < h->n_arms; a++) {
        const tokdiff *t = &ev->td[a];
        if (!t->n_tok && !t->n_dig) continue;
        if (ev->follow && a != ref) continue;    /* its inputs changed: the reference is blamed */
        int kind = ev->same ? K_DETERMINISM : t->n_tok ? K_TOKENS : -1;
        if (kind < 0) continue;                   /* digests alone, with a cause: a change */
        /* the first run after T with the same kind of regression of this arm against T */
        int first = i, kb = kind == K_DETERMINISM ? 0 : 1;
        for (int k = T + 1; k < i; k++)
            if (h->runs[k].mark != MARK_EXCLUDE && h->runs[k].tok_base == T && (h->runs[k].tok_arms[kb] >> a & 1)) {
                first = k;
                break;
            }
        ev->f[ev->nf++] = (finding){.kind = kind, .arm = a, .base = T, .first = first, .td = *t};
        L->tok_arms[kb] |= 1u << a;
    }
    return 0;
}

/* Walks the runs of h in time order, deciding which are good (window: how
 * many of the latest good runs each run is compared with), and evaluates
 * the latest run not excluded into *ev (its index in *latest, -1 when every
 * run is excluded; its baseline in win_out / *nw_out). Returns 0 or -1 with e. */
static int walk(sqlite3 *db, history *h, int window, eval *ev, int *latest, int *win_out, int *nw_out, tg_err *e)
{
    int *good = xcalloc((size_t)h->n + 1, sizeof *good);
    int ng = 0;
    *latest = -1;
    *nw_out = 0;
    for (int i = h->n - 1; i >= 0 && *latest < 0; i--)
        if (h->runs[i].mark != MARK_EXCLUDE) *latest = i;
    int rc = 0;
    for (int i = 0; i < h->n && rc == 0; i++) {
        run_pt *r = &h->runs[i];
        if (r->mark == MARK_EXCLUDE) {
            snprintf(r->status, sizeof r->status, "excluded: %.160s", r->mark_reason);
            continue;
        }
        int w0 = ng > window ? ng - window : 0;
        if (i == *latest) {
            memcpy(win_out, good + w0, sizeof *good * (size_t)(ng - w0));
            *nw_out = ng - w0;
        }
        if (r->mark == MARK_ACCEPT) {
            r->good = 1;
            snprintf(r->status, sizeof r->status, "accepted: %.160s", r->mark_reason);
            ng = 0;
            good[ng++] = i;
            if (i == *latest) {
                memset(ev, 0, sizeof *ev);
                ev->tok_base = -1;
            }
            continue;
        }
        eval local, *x = i == *latest ? ev : &local;
        if (evaluate(db, h, i, good + w0, ng - w0, x, e) < 0) {
            rc = -1;
            break;
        }
        char nodata[160] = "";
        size_t nn = 0;
        for (int a = 0; a < h->n_arms; a++)
            if (r->arm[a].present && !r->arm[a].data && nn < sizeof nodata)
                nn += (size_t)snprintf(nodata + nn, sizeof nodata - nn, "%s%s", nn ? ", " : "", h->arms[a]);
        if (strcmp(r->overall, "PASS"))
            snprintf(r->status, sizeof r->status, "no: %s%s%s%s", r->overall[0] ? r->overall : "no verdict",
                     nn ? " (no data: " : "", nodata, nn ? ")" : "");
        else if (x->nf) {
            char kinds[96] = "";
            size_t kn = 0;
            for (int k = 0; k < N_KINDS; k++)
                for (int f = 0; f < x->nf; f++)
                    if (x->f[f].kind == k && kn < sizeof kinds) {
                        kn += (size_t)snprintf(kinds + kn, sizeof kinds - kn, "%s%s", kn ? ", " : "", KIND_NAME[k]);
                        break;
                    }
            snprintf(r->status, sizeof r->status, "no: regression (%s)", kinds);
        } else if (nn)
            snprintf(r->status, sizeof r->status, "no: no data (%s)", nodata);
        else {
            r->good = 1;
            snprintf(r->status, sizeof r->status, "good");
            good[ng++] = i;
        }
    }
    free(good);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Printing                                                            */

static void print_runs(const history *h, const char *pre, FILE *out)
{
    fprintf(out, "%s  %6s %-20s %-15s %s\n", pre, "run", "started", "verdict", "baseline?");
    for (int i = 0; i < h->n; i++) {
        const run_pt *r = &h->runs[i];
        fprintf(out, "%s  %6lld %-20s %-15s %s\n", pre, (long long)r->id, r->started, r->overall[0] ? r->overall : "-",
                r->status);
    }
}

static void print_arm_table(const history *h, int a, const char *pre, FILE *out)
{
    fprintf(out, "%sarm %s\n", pre, h->arms[a]);
    fprintf(out, "%s  %6s %-20s %-15s %-34s %10s %12s %10s\n", pre, "run", "started", "verdict",
            "divergences [95% interval]", "near lost", "max lost gap", "KL");
    for (int i = 0; i < h->n; i++) {
        const run_pt *r = &h->runs[i];
        if (r->mark == MARK_EXCLUDE) continue;
        const arm_pt *p = &r->arm[a];
        if (!p->present) {
            fprintf(out, "%s  %6lld %-20s (not scored)\n", pre, (long long)r->id, r->started);
            continue;
        }
        if (!p->data) {
            fprintf(out, "%s  %6lld %-20s %-15s (no data)\n", pre, (long long)r->id, r->started, p->gate_word);
            continue;
        }
        char dv[64];
        describe(M_DIVERGENCE, p, dv, sizeof dv);
        char nl[24];
        snprintf(nl, sizeof nl, "%d/%d", p->near_n - p->near_won, p->near_n);
        fprintf(out, "%s  %6lld %-20s %-15s %-34s %10s %12.4f %10.3g\n", pre, (long long)r->id, r->started,
                p->gate_word, dv, nl, p->max_lost_gap, p->kl);
    }
}

/* The CHANGE lines of run L against the previous run P; returns their count. */
static int print_changes(const history *h, const run_pt *P, const run_pt *L, const char *li, FILE *out)
{
    int n = 0;
    for (int a = 0; a < h->n_arms; a++) {
        const arm_pt *x = &L->arm[a], *y = &P->arm[a];
        if (x->present != y->present || x->data != y->data) {
            fprintf(out, "%sCHANGE %s: %s in run %lld, %s in run %lld\n", li, h->arms[a],
                    !y->present ? "not scored" : y->data ? "scored" : "no data", (long long)P->id,
                    !x->present ? "not scored" : x->data ? "scored" : "no data", (long long)L->id);
            n++;
            continue;
        }
        if (!x->present || !x->data) continue;
        char bx[96], by[96];
        for (int m = 0; m < N_METRICS; m++) {
            describe(m, x, bx, sizeof bx);
            describe(m, y, by, sizeof by);
            if (strcmp(bx, by) && !worse(m, x, y)) {
                fprintf(out, "%sCHANGE %s: %s %s -> %s (run %lld -> %lld)\n", li, h->arms[a], KIND_NAME[m], by, bx,
                        (long long)P->id, (long long)L->id);
                n++;
            }
        }
        if (x->near_n - x->near_won != y->near_n - y->near_won) {
            fprintf(out, "%sCHANGE %s: near ties lost %d/%d -> %d/%d (run %lld -> %lld)\n", li, h->arms[a],
                    y->near_n - y->near_won, y->near_n, x->near_n - x->near_won, x->near_n, (long long)P->id,
                    (long long)L->id);
            n++;
        }
        if (x->max_lost_gap != y->max_lost_gap) {
            fprintf(out, "%sCHANGE %s: largest lost gap %.4f -> %.4f (run %lld -> %lld)\n", li, h->arms[a],
                    y->max_lost_gap, x->max_lost_gap, (long long)P->id, (long long)L->id);
            n++;
        }
    }
    /* what ran differently */
    if (strcmp(P->artifact_sha, L->artifact_sha)) {
        fprintf(out, "%sCHANGE model sha256 %.12s... -> %.12s... (run %lld -> %lld)\n", li, P->artifact_sha,
                L->artifact_sha, (long long)P->id, (long long)L->id);
        n++;
    }
    for (int a = 0; a < h->n_arms; a++) {
        sbuf d = {0};
        if (arm_change(h, P, L, a, &d)) {
            fprintf(out, "%sCHANGE arm %s%s: %s (run %lld -> %lld)\n", li, h->arms[a],
                    !strcmp(h->arms[a], L->reference) ? " (the reference)" : "", sb_str(&d), (long long)P->id,
                    (long long)L->id);
            n++;
        }
        free(d.p);
    }
    if (strcmp(P->spec_sha, L->spec_sha)) {
        sbuf d = {0};
        if (spec_diff(P->spec_text, L->spec_text, &d)) {
            fprintf(out, "%sCHANGE spec %s (run %lld -> %lld)\n", li, sb_str(&d), (long long)P->id, (long long)L->id);
            n++;
        }
        free(d.p);
    }
    return n;
}

/* One regression of the latest run L (md: markdown). */
static void print_finding(const history *h, const finding *f, const run_pt *L, int md, FILE *out)
{
    const run_pt *B = &h->runs[f->base], *F = &h->runs[f->first];
    const char *li = md ? "- **REGRESSION** " : "  REGRESSION ";
    int is_ref = !strcmp(h->arms[f->arm], L->reference);
    if (f->kind < N_METRICS) {
        char bx[96], bb[96];
        describe(f->kind, &L->arm[f->arm], bx, sizeof bx);
        describe(f->kind, &B->arm[f->arm], bb, sizeof bb);
        fprintf(out, "%s%s: %s %s in run %lld, was %s in run %lld; first in run %lld (%s)\n", li, h->arms[f->arm],
                KIND_NAME[f->kind], bx, (long long)L->id, bb, (long long)B->id, (long long)F->id, F->started);
    } else if (f->kind == K_DETERMINISM) {
        fprintf(out, "%s%s%s: determinism: %d token(s) and %d logits digest(s) of %d steps differ from run %lld, "
                     "with the same binaries, model and spec (first %s); first in run %lld (%s)\n",
                li, h->arms[f->arm], is_ref ? " (the reference)" : "", f->td.n_tok, f->td.n_dig, f->td.n_cmp,
                (long long)B->id, f->td.first, (long long)F->id, F->started);
    } else {
        fprintf(out, "%s%s%s: tokens: %d of %d steps emit another token than in run %lld (first %s); "
                     "first in run %lld (%s)\n",
                li, h->arms[f->arm], is_ref ? " (the reference)" : "", f->td.n_tok, f->td.n_cmp, (long long)B->id,
                f->td.first, (long long)F->id, F->started);
    }
    sbuf c = {0};
    describe_cause(h, B, F, f->arm, &c);
    fprintf(out, "%slikely cause (run %lld -> %lld): %s\n", md ? "  - " : "    ", (long long)B->id, (long long)F->id,
            sb_str(&c));
    free(c.p);
}

int trend_spec(tg_store *st, const char *spec_name, int md, int window, FILE *out, trend_result *r, tg_err *e)
{
    memset(r, 0, sizeof *r);
    if (window <= 0) window = TREND_WINDOW;
    sqlite3 *db = store_db(st);
    history h;
    int lr = load_history(db, spec_name, &h, e);
    if (lr <= 0) {
        history_free(&h);
        return lr < 0 ? -1 : tg_errf(e, "trend: the store has no run of spec '%s'", spec_name);
    }
    eval *ev = xcalloc(1, sizeof *ev);
    int *win = xcalloc((size_t)h.n + 1, sizeof *win);
    int latest, nw;
    if (walk(db, &h, window, ev, &latest, win, &nw, e) < 0) {
        free(ev);
        free(win);
        history_free(&h);
        return -1;
    }
    for (int i = 0; i < h.n; i++) {
        if (h.runs[i].mark == MARK_EXCLUDE) r->n_excluded++;
        else r->n_runs++;
    }
    const char *pre = md ? "    " : "  ", *li = md ? "- " : "  ";
    if (md) fprintf(out, "## %s\n\n", spec_name);
    else fprintf(out, "trend of %s\n", spec_name);
    fprintf(out, "%s%d scored run%s%s", md ? "" : "  ", r->n_runs, r->n_runs == 1 ? "" : "s",
            r->n_runs < 2 ? " (nothing to compare yet)" : "");
    if (r->n_excluded) fprintf(out, ", %d excluded", r->n_excluded);
    fprintf(out, "; a run is a baseline when it passed without a regression, or was accepted\n");
    if (md) fprintf(out, "\n");
    print_runs(&h, pre, out);
    for (int a = 0; a < h.n_arms; a++) {
        int scored = 0;
        for (int i = 0; i < h.n; i++) scored |= h.runs[i].arm[a].present;
        if (scored) print_arm_table(&h, a, pre, out);   /* the reference and custody arms are not scored */
    }
    if (md) fprintf(out, "\n");
    const char *word = "FIRST";
    if (latest >= 0) {
        const run_pt *L = &h.runs[latest];
        r->latest_run = L->id;
        r->n_baseline = nw;
        int prev = -1;
        for (int i = latest - 1; i >= 0 && prev < 0; i--)
            if (h.runs[i].mark != MARK_EXCLUDE) prev = i;
        if (L->mark == MARK_ACCEPT)
            fprintf(out, "%srun %lld is an accepted baseline (%s, %s): %s\n", li, (long long)L->id, L->mark_when,
                    L->mark_who, L->mark_reason);
        else if (nw) {
            fprintf(out, "%srun %lld against run%s", li, (long long)L->id, nw > 1 ? "s" : "");
            for (int j = 0; j < nw; j++) fprintf(out, "%s%lld", j ? ", " : " ", (long long)h.runs[win[j]].id);
            fprintf(out, " (the last %d good run%s, window %d)\n", nw, nw > 1 ? "s" : "", window);
        } else if (prev >= 0)
            fprintf(out, "%srun %lld: no good run before it to compare with (accept one with "
                         "`tokgate baseline accept RUN --reason TEXT`)\n", li, (long long)L->id);
        if (prev >= 0) r->n_changes += print_changes(&h, &h.runs[prev], L, li, out);
        /* step changes against the baseline that are no regression */
        if (ev->tok_base >= 0) {
            const run_pt *T = &h.runs[ev->tok_base];
            for (int a = 0; a < h.n_arms; a++) {
                const tokdiff *t = &ev->td[a];
                if (!t->n_tok && !t->n_dig) continue;
                int found = 0;
                for (int f = 0; f < ev->nf; f++) found |= ev->f[f].kind >= N_METRICS && ev->f[f].arm == a;
                if (found) continue;
                fprintf(out, "%sCHANGE %s: %d token(s) and %d logits digest(s) of %d steps differ from run %lld "
                             "(first %s)", li, h.arms[a], t->n_tok, t->n_dig, t->n_cmp, (long long)T->id, t->first);
                if (ev->follow && strcmp(h.arms[a], L->reference))
                    fprintf(out, ": it decodes over the reference %s's tokens, which changed\n", L->reference);
                else {
                    sbuf c = {0};
                    describe_cause(&h, T, L, a, &c);
                    fprintf(out, "; likely cause: %s\n", sb_str(&c));
                    free(c.p);
                }
                r->n_changes++;
            }
        }
        for (int f = 0; f < ev->nf; f++) {
            print_finding(&h, &ev->f[f], L, md, out);
            r->n_regressions++;
            int64_t fid = h.runs[ev->f[f].first].id;
            if (!r->first_run || fid < r->first_run) r->first_run = fid;
        }
        if (r->n_regressions) word = "REGRESSION";
        else if (r->n_runs < 2) word = "FIRST";
        else if (L->mark == MARK_ACCEPT || nw) word = "CLEAN";
        else word = "NO_BASELINE";
    } else
        fprintf(out, "%s%s\n", li, r->n_excluded ? "every scored run is excluded" : "no scored run yet");
    snprintf(r->word, sizeof r->word, "%s", word);
    fprintf(out, "%sTREND=%s\n", md ? "\n" : "  ", word);
    if (md) {
        fprintf(out, "\n");
        tg_err se;
        if (trend_svg(st, spec_name, out, &se) == 0) fprintf(out, "\n\n");
    }
    free(ev);
    free(win);
    history_free(&h);
    return 0;
}

int trend_svg(tg_store *st, const char *spec_name, FILE *out, tg_err *e)
{
    history h;
    int lr = load_history(store_db(st), spec_name, &h, e);
    if (lr <= 0) {
        history_free(&h);
        return lr < 0 ? -1 : tg_errf(e, "trend: the store has no run of spec '%s'", spec_name);
    }
    /* the runs drawn (excluded ones left out) and the arms scored in any of them */
    int *vis = xcalloc((size_t)h.n + 1, sizeof *vis), nv = 0;
    for (int i = 0; i < h.n; i++)
        if (h.runs[i].mark != MARK_EXCLUDE) vis[nv++] = i;
    int drawn[MAX_ARMS] = {0}, nd = 0;
    for (int a = 0; a < h.n_arms; a++) {
        for (int v = 0; v < nv; v++) drawn[a] |= h.runs[vis[v]].arm[a].present;
        nd += drawn[a];
    }
    static const char *const COLORS[] = {"#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    const int W = 640, H = 300, L = 60, R = 150, T = 30, B = 40;
    double ymax = 0.05;
    for (int v = 0; v < nv; v++)
        for (int a = 0; a < h.n_arms; a++) {
            const arm_pt *p = &h.runs[vis[v]].arm[a];
            if (p->present && p->data && p->hi > ymax) ymax = p->hi;   /* only what is drawn */
        }
    ymax = ceil(ymax * 20) / 20;
    int pw = W - L - R, ph = H - T - B;
#define XPOS(v) (L + (nv == 1 ? pw / 2.0 : pw * ((v) + 0.5) / nv))
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    fprintf(out, "<text x=\"%d\" y=\"18\" font-size=\"13\">", L);
    svg_escape(out, spec_name);
    fprintf(out, ": divergence rate per run (95%% interval; red = FAIL, x = no data)</text>\n");
    fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", L, T, pw, ph);
    for (int t = 0; t <= 4; t++) {
        double v = ymax * t / 4;
        int y = T + ph - (int)lround(ph * t / 4.0);
        fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.3f</text>\n", L - 4, y + 4, v);
    }
    for (int v = 0; v < nv; v++)
        fprintf(out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%lld</text>\n", XPOS(v), T + ph + 14,
                (long long)h.runs[vis[v]].id);
    fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">run</text>\n", L + pw / 2, H - 6);
    int slot = 0;
    for (int a = 0; a < h.n_arms; a++) {
        if (!drawn[a]) continue;   /* the reference and custody arms have no rate */
        const char *c = COLORS[slot % 6];
        double off = (slot - (nd - 1) / 2.0) * 4;
        fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" points=\"", c);
        for (int v = 0; v < nv; v++) {
            const arm_pt *p = &h.runs[vis[v]].arm[a];
            if (!p->present || !p->data) continue;
            fprintf(out, "%.1f,%.1f ", XPOS(v) + off, T + ph - ph * ((double)p->div_k / p->div_n) / ymax);
        }
        fprintf(out, "\"/>\n");
        for (int v = 0; v < nv; v++) {
            const arm_pt *p = &h.runs[vis[v]].arm[a];
            double x = XPOS(v) + off;
            if (p->present && !p->data) {
                /* not measurable: a cross on the axis, not a rate of 0 */
                double y = T + ph - 4;
                fprintf(out, "<path d=\"M%.1f,%.1f l6,6 m0,-6 l-6,6\" stroke=\"%s\" stroke-width=\"2\">"
                             "<title>%s: no data (%s)</title></path>\n", x - 3, y - 3, c, h.arms[a], p->gate_word);
                (void)y;
                continue;
            }
            if (!p->present) continue;
            double y = T + ph - ph * ((double)p->div_k / p->div_n) / ymax;
            fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", x, x,
                    T + ph - ph * p->lo / ymax, T + ph - ph * p->hi / ymax, c);
            fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", x, y,
                    p->gate == 2 ? "#d62728" : c);
        }
        fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">",
                W - R + 10, T + 16 * slot, c, W - R + 24, T + 16 * slot + 9);
        svg_escape(out, h.arms[a]);
        fprintf(out, "</text>\n");
        slot++;
    }
#undef XPOS
    fprintf(out, "</svg>");
    free(vis);
    history_free(&h);
    return ferror(out) ? tg_errf(e, "trend: write error") : 0;
}

/* ------------------------------------------------------------------ */
/* Baseline decisions                                                  */

int trend_copy_marks(sqlite3 *db, tg_err *e)
{
    if (!has_table(db, "src", "trend_mark")) return 0;
    if (sqlite3_exec(db, MARK_SQL, NULL, NULL, NULL) != SQLITE_OK) return common_sql_err(db, e, "creating trend_mark");
    if (sqlite3_exec(db, "INSERT INTO main.trend_mark(run_uid, action, reason, created, who)"
                         " SELECT s.run_uid, s.action, s.reason, s.created, s.who FROM src.trend_mark s"
                         " WHERE NOT EXISTS (SELECT 1 FROM main.trend_mark m WHERE m.run_uid = s.run_uid"
                         "   AND m.action = s.action AND m.reason = s.reason AND m.created = s.created)"
                         " ORDER BY s.created, s.id", NULL, NULL, NULL) != SQLITE_OK)
        return common_sql_err(db, e, "copying trend_mark");
    return 0;
}

static int usage(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "tokgate: %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(run `tokgate help` for usage)\n");
    return 2;
}

/* Opens an existing store (a missing file is "no such store", not a new
 * store): read-only for trend, for writing for baseline. Returns 0 or 2
 * after a message. */
static int open_existing(const char *cmd, const char *db, int ro, tg_store **st)
{
    tg_err e;
    struct stat sb;
    *st = NULL;
    if (!ro && stat(db, &sb) != 0)
        tg_errf(&e, "no such store: %s (%s; give --db FILE of an existing store)", db, strerror(errno));
    else if ((ro ? store_open_ro(st, db, &e) : store_open(st, db, &e)) == 0)
        return 0;
    fprintf(stderr, "tokgate: %s: %s\n", cmd, e.msg);
    return 2;
}

static int baseline_list(tg_store *st, const char *spec)
{
    sqlite3 *db = store_db(st);
    printf("%6s %-24s %-8s %-20s %-16s %s\n", "run", "spec", "action", "when", "who", "reason");
    if (!has_table(db, "main", "trend_mark")) return 0;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, "SELECT coalesce(r.id, 0), coalesce(sp.name, '(run not in this store)'), m.action,"
                               " m.created, coalesce(m.who, ''), m.reason, m.run_uid FROM trend_mark m"
                               " LEFT JOIN run r ON r.uid = m.run_uid LEFT JOIN spec sp ON sp.id = r.spec_id"
                               " WHERE ?1 IS NULL OR sp.name = ?1 ORDER BY m.created, m.id", -1, &s, NULL) != SQLITE_OK) {
        fprintf(stderr, "tokgate: baseline: %s\n", sqlite3_errmsg(db));
        return 2;
    }
    if (spec) sqlite3_bind_text(s, 1, spec, -1, SQLITE_STATIC);
    while (sqlite3_step(s) == SQLITE_ROW)
        printf("%6lld %-24s %-8s %-20s %-16s %s\n", (long long)sqlite3_column_int64(s, 0), col(s, 1), col(s, 2),
               col(s, 3), col(s, 4), col(s, 5));
    sqlite3_finalize(s);
    return 0;
}

/* Records action for run (accept, exclude, clear). Returns an exit code. */
static int baseline_mark(tg_store *st, const char *action, int64_t run, const char *reason)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *s;
    char uid[40] = "", spec[256] = "", verdict[24] = "";
    int set = 0;
    if (sqlite3_prepare_v2(db, "SELECT r.uid, sp.name, coalesce(r.verdict, '-'),"
                               " coalesce((SELECT max(set_no) FROM verdict_set v WHERE v.run_id = r.id), 0)"
                               " FROM run r JOIN spec sp ON sp.id = r.spec_id WHERE r.id = ?1", -1, &s, NULL) != SQLITE_OK) {
        fprintf(stderr, "tokgate: baseline: %s\n", sqlite3_errmsg(db));
        return 2;
    }
    sqlite3_bind_int64(s, 1, run);
    int found = sqlite3_step(s) == SQLITE_ROW;
    if (found) {
        snprintf(uid, sizeof uid, "%s", col(s, 0));
        snprintf(spec, sizeof spec, "%s", col(s, 1));
        snprintf(verdict, sizeof verdict, "%s", col(s, 2));
        set = sqlite3_column_int(s, 3);
    }
    sqlite3_finalize(s);
    if (!found) {
        fprintf(stderr, "tokgate: baseline %s: no run %lld in this store\n", action, (long long)run);
        return 2;
    }
    if (!strcmp(action, "accept")) {
        /* a run without data is never a baseline */
        if (!set) {
            fprintf(stderr, "tokgate: baseline accept: run %lld (%s) was never scored (%s): it has no data to "
                            "be a baseline\n", (long long)run, spec, verdict);
            return 2;
        }
        if ((s = common_sql_prepare(db, "SELECT arm, value FROM verdict WHERE run_id = ?1 AND set_no = ?2 AND prompt IS NULL"
                                        " AND arm IS NOT NULL AND key = 'GENERATION_DIVERGENCES' AND value LIKE '%/0'",
                                    "Ii", run, set))) {
            int bad = sqlite3_step(s) == SQLITE_ROW;
            if (bad)
                fprintf(stderr, "tokgate: baseline accept: run %lld (%s): arm %s has no data (GENERATION_DIVERGENCES "
                                "%s): a run without data cannot be a baseline\n",
                        (long long)run, spec, col(s, 0), col(s, 1));
            sqlite3_finalize(s);
            if (bad) return 2;
        }
    }
    char when[32], who[96], host[64] = "";
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    gethostname(host, sizeof host - 1);
    const char *user = getenv("USER");
    struct passwd *pw = user && *user ? NULL : getpwuid(getuid());
    if (pw) user = pw->pw_name;
    snprintf(who, sizeof who, "%s@%s", user && *user ? user : "?", host);
    if (sqlite3_exec(db, MARK_SQL, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO trend_mark(run_uid, action, reason, created, who) VALUES (?1, ?2, ?3, ?4, ?5)",
                           -1, &s, NULL) != SQLITE_OK) {
        fprintf(stderr, "tokgate: baseline: %s\n", sqlite3_errmsg(db));
        return 2;
    }
    sqlite3_bind_text(s, 1, uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, action, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, reason, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, when, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, who, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        fprintf(stderr, "tokgate: baseline: %s\n", sqlite3_errmsg(db));
        return 2;
    }
    printf("run %lld (spec %s, %s): %s by %s at %s: %s\n", (long long)run, spec, verdict,
           !strcmp(action, "accept") ? "accepted as a baseline" : !strcmp(action, "exclude") ? "excluded from the trend"
                                                                                               : "decision cleared",
           who, when, reason);
    FILE *sink = fopen("/dev/null", "w");
    trend_result tr;
    tg_err e;
    if (sink && trend_spec(st, spec, 0, 0, sink, &tr, &e) == 0)
        printf("trend of %s now: TREND=%s (its latest run is %lld)\n", spec, tr.word, (long long)tr.latest_run);
    if (sink) fclose(sink);
    return 0;
}

enum { O_DB = COMMON_CLI_FIRST_ID, O_FORMAT, O_OUT, O_SVG, O_WINDOW, O_PLAN, O_REASON };

/* The options of trend and baseline, as common_cli_parse hands them over. */
typedef struct topts {
    const char *db, *format, *out, *svg, *plan, *reason;
    int window;
} topts;

static int on_opt(void *ud, int id, const char *v, tg_err *e)
{
    topts *o = ud;
    switch (id) {
    case O_DB: o->db = v; break;
    case O_FORMAT: o->format = v; break;
    case O_OUT: o->out = v; break;
    case O_SVG: o->svg = v; break;
    case O_PLAN: o->plan = v; break;
    case O_REASON: o->reason = v; break;
    case O_WINDOW:
        if (common_parse_int(v, 1, 100000, &o->window) < 0)
            return tg_errf(e, "--window: expected a number of runs >= 1, got '%s'", v);
        break;
    }
    return 0;
}

int trend_baseline_main(int argc, char **argv)
{
    static const struct option lo[] = {{"db", required_argument, NULL, O_DB},
                                       {"reason", required_argument, NULL, O_REASON},
                                       {NULL, 0, NULL, 0}};
    static const common_cli cli = {"baseline", "(see tokgate help baseline)\n", lo, 3};
    topts o = {.db = "tokgate.db"};
    const char *pos[3] = {0};
    int np = 0;
    int rc = common_cli_parse(&cli, argc - 1, argv + 1, on_opt, &o, pos, &np);
    if (rc) return rc == COMMON_CLI_HELP ? 0 : rc;
    const char *db = o.db, *reason = o.reason;
    if (!np) return usage("baseline", "expected accept|exclude|clear RUN --reason TEXT, or list [SPEC]%s", "");
    const char *action = pos[0];
    int is_list = !strcmp(action, "list");
    if (!is_list && strcmp(action, "accept") && strcmp(action, "exclude") && strcmp(action, "clear"))
        return usage("baseline", "expected accept, exclude, clear or list, got '%s'", action);
    if (is_list && np > 2) return usage("baseline", "list: unexpected argument '%s'", pos[2]);
    int64_t run = 0;
    if (!is_list) {
        long x;
        if (np != 2 || common_parse_long(pos[1], 1, LONG_MAX, &x) < 0)
            return usage("baseline", "expected a RUN id (an integer >= 1) after the action%s", "");
        run = x;
        if (!reason || !*reason)
            return usage("baseline", "--reason TEXT is required (it is kept in the store with the decision)%s", "");
    }
    tg_store *st;
    rc = open_existing("baseline", db, 0, &st);
    if (rc) return rc;
    rc = is_list ? baseline_list(st, np > 1 ? pos[1] : NULL) : baseline_mark(st, action, run, reason);
    store_close(st);
    return rc;
}

/* Appends the unit names of the plan file to names. Returns 0 or -1 after a message. */
static int plan_names(const char *plan, char ***names, int *n)
{
    json_error_t je;
    json_t *p = json_load_file(plan, 0, &je);
    json_t *units = json_object_get(p, "units");
    if (!json_is_array(units)) {
        fprintf(stderr, "tokgate: trend: --plan %s: %s\n", plan, p ? "expected a plan (units)" : je.text);
        json_decref(p);
        return -1;
    }
    size_t i;
    json_t *u;
    json_array_foreach(units, i, u) {
        const char *name = json_string_value(json_object_get(u, "name"));
        if (!name) continue;
        *names = xrealloc(*names, sizeof **names * (size_t)(*n + 1));
        (*names)[(*n)++] = xstrdup(name);
    }
    json_decref(p);
    return 0;
}

int trend_main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"db", required_argument, NULL, O_DB},         {"format", required_argument, NULL, O_FORMAT},
        {"out", required_argument, NULL, O_OUT},       {"svg", required_argument, NULL, O_SVG},
        {"window", required_argument, NULL, O_WINDOW}, {"plan", required_argument, NULL, O_PLAN},
        {NULL, 0, NULL, 0}};
    const common_cli cli = {"trend", "(see tokgate help trend)\n", lo, argc};
    topts o = {.db = "tokgate.db", .format = "text", .window = TREND_WINDOW};
    const char **pos;
    int np = 0;
    int prc = common_cli_parse_list(&cli, argc - 1, argv + 1, on_opt, &o, &pos, &np);
    if (prc) return prc == COMMON_CLI_HELP ? 0 : prc;
    const char *db = o.db, *format = o.format, *outp = o.out, *svgdir = o.svg, *plan = o.plan;
    int window = o.window;
    if (strcmp(format, "text") && strcmp(format, "md")) {
        free(pos);
        return usage("trend", "--format: expected text or md, got '%s'", format);
    }
    char **names = xcalloc((size_t)np + 1, sizeof *names);
    int n = 0;
    for (int i = 0; i < np; i++) names[n++] = xstrdup(pos[i]);
    free(pos);
    int rc = 0;
    if (plan && plan_names(plan, &names, &n) < 0) rc = 2;
    tg_store *st = NULL;
    if (rc == 0) rc = open_existing("trend", db, 1, &st);
    common_out co = {0};
    FILE *out = NULL;
    tg_err e;
    if (rc == 0) {
        if (common_out_open(&co, outp, db, "--out", &e) < 0) {
            fprintf(stderr, "tokgate: trend: %s\n", e.msg);
            rc = 2;
        } else
            out = co.f;
    }
    sqlite3_stmt *s = NULL;
    if (rc == 0 && n == 0 && !plan &&
        sqlite3_prepare_v2(store_db(st), "SELECT DISTINCT s.name FROM spec s JOIN run r ON r.spec_id = s.id"
                                         " ORDER BY s.name", -1, &s, NULL) == SQLITE_OK) {
        while (sqlite3_step(s) == SQLITE_ROW) {
            names = xrealloc(names, sizeof *names * (size_t)(n + 1));
            names[n++] = xstrdup(col(s, 0));
        }
        sqlite3_finalize(s);
    }
    if (rc == 0 && n == 0) {
        fprintf(stderr, "tokgate: trend: the store %s has no runs%s\n", db, plan ? " of the plan's specs" : "");
        rc = 2;
    }
    if (rc == 0 && svgdir && common_mkdirs(svgdir, &e) < 0) {
        fprintf(stderr, "tokgate: trend: --svg %s: %s\n", svgdir, e.msg);
        rc = 2;
    }
    int md = !strcmp(format, "md"), regress = 0;
    if (rc == 0 && md) fprintf(out, "# Trend of %s\n\n", n == 1 ? names[0] : "every spec");
    for (int i = 0; i < n && rc == 0; i++) {
        trend_result tr;
        if (trend_spec(st, names[i], md, window, out, &tr, &e) < 0) {
            fprintf(stderr, "tokgate: %s\n", e.msg);
            rc = 2;
            break;
        }
        if (!md) fprintf(out, "\n");
        regress += tr.n_regressions > 0;
        if (svgdir) {
            char path[PATH_MAX + 300];
            char safe[256];
            snprintf(safe, sizeof safe, "%s", names[i]);
            for (char *q = safe; *q; q++)
                if (*q == '/') *q = '_';
            snprintf(path, sizeof path, "%s/%s-trend.svg", svgdir, safe);
            common_out so;
            if (common_out_open(&so, path, db, "--svg", &e) < 0) {
                fprintf(stderr, "tokgate: trend: %s\n", e.msg);
                rc = 2;
                break;
            }
            int ok = trend_svg(st, names[i], so.f, &e) == 0;
            if (!ok) fprintf(stderr, "tokgate: trend: %s: %s\n", path, e.msg);
            if (common_out_close(&so, ok, &e) < 0) {
                if (ok) fprintf(stderr, "tokgate: trend: --svg %s\n", e.msg);
                ok = 0;
            }
            if (!ok) rc = 2;
        }
    }
    if (rc == 0) {
        fprintf(out, "%sTREND_SPECS=%d\nTREND_REGRESSIONS=%d\n", md ? "\n" : "", n, regress);
        rc = regress ? 1 : 0;
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (common_out_close(&co, rc == 0 || rc == 1, &e) < 0) {
        fprintf(stderr, "tokgate: trend: --out %s\n", e.msg);
        rc = 2;
    }
    store_close(st);
    return rc;
}
