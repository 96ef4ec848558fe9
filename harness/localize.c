/*
 * localize.c: `tokgate localize` (localize.h). Runs two or three arms over
 * one identical prefix with dumps at the chosen step, compares the dumps
 * stage by stage against the first arm, names the first stage whose error
 * exceeds the noise floor, stores the whole record (dumps included, zstd
 * over byte-shuffled f32) and prints the table; --evidence adds a markdown
 * file with an SVG plot of the error against the layer. docs/localize.md is
 * the reference of the rule and the tables.
 */
#include "localize.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "arm.h"
#include "common.h"
#include "gate.h"
#include "replay.h"
#include "svg.h"

/* ------------------------------------------------------------------ */
/* Comparison                                                          */

static const char *const STAGES[] = {"attn_norm", "q", "k", "v", "attn_out",
                                     "ffn_norm", "ffn_out", "residual", "logits"};
enum { N_STAGES = 9 };

int localize_stage_order(const char *stage)
{
    for (int i = 0; i < N_STAGES; i++)
        if (stage && !strcmp(stage, STAGES[i])) return i;
    return 99;
}

/* Sort key: layers in order (the final logits, layer -1, last), then stages. */
static long row_key(int layer, const char *stage)
{
    long l = layer < 0 ? 1000000 : layer;
    return l * 128 + localize_stage_order(stage);
}

static const loc_tensor *find_tensor(const loc_tensor *t, int n, int layer, const char *stage)
{
    for (int i = 0; t && i < n; i++)
        if (t[i].layer == layer && t[i].stage && !strcmp(t[i].stage, stage)) return &t[i];
    return NULL;
}

/* rel_l2, cosine, max_abs of b against a (n values each). */
static void metrics(const float *a, const float *b, int64_t n, double *rel, double *cosv, double *mx)
{
    double da = 0, db = 0, dd = 0, ab = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i], d = y - x;
        da += x * x, db += y * y, dd += d * d, ab += x * y;
        if (fabs(d) > m || isnan(d)) m = isnan(d) ? INFINITY : fabs(d);
    }
    *rel = da > 0 ? sqrt(dd / da) : sqrt(dd);
    *cosv = da > 0 && db > 0 ? ab / sqrt(da * db) : NAN;
    *mx = m;
}

static int cmp_rows(const void *x, const void *y)
{
    const loc_row *a = x, *b = y;
    long ka = row_key(a->layer, a->stage), kb = row_key(b->layer, b->stage);
    return ka < kb ? -1 : ka > kb;
}

int localize_table(loc_table **out, const loc_tensor *a, int na, const loc_tensor *b, int nb,
                   const loc_tensor *c, int nc, tg_err *e)
{
    *out = NULL;
    loc_table *t = xcalloc(1, sizeof *t);
    t->rows = xcalloc((size_t)(na > 0 ? na : 1), sizeof *t->rows);
    t->first = -1;
    snprintf(t->rule, sizeof t->rule, "%s", c ? "third-pair" : "trend");
    for (int i = 0; i < na; i++) {
        const loc_tensor *x = &a[i], *y = find_tensor(b, nb, x->layer, x->stage);
        if (!y || !x->stage) continue;
        if (y->n != x->n) {
            localize_table_free(t);
            return tg_errf(e, "layer %d stage %s: the arms dumped %lld and %lld values", x->layer,
                           x->stage, (long long)x->n, (long long)y->n);
        }
        loc_row *r = &t->rows[t->n_rows++];
        r->layer = x->layer;
        snprintf(r->stage, sizeof r->stage, "%s", x->stage);
        r->n = x->n;
        metrics(x->data, y->data, x->n, &r->rel_l2, &r->cosine, &r->max_abs);
        r->third = r->growth = r->floor = NAN;
        const loc_tensor *z = find_tensor(c, nc, x->layer, x->stage);
        if (z && z->n == x->n) {
            double cs, mx;
            metrics(x->data, z->data, x->n, &r->third, &cs, &mx);
        }
    }
    qsort(t->rows, (size_t)t->n_rows, sizeof *t->rows, cmp_rows);
    for (int i = 0; i < t->n_rows; i++) {
        loc_row *r = &t->rows[i];
        /* the same stage in earlier layers: growth and the trend */
        double prev_same = NAN, max_same = -1;
        for (int j = 0; j < i; j++) {
            const loc_row *p = &t->rows[j];
            if (strcmp(p->stage, r->stage) || p->layer < 0 || r->layer < 0) continue;
            if (p->layer == r->layer - 1) prev_same = p->rel_l2;
            if (p->rel_l2 > max_same) max_same = p->rel_l2;
        }
        if (isfinite(prev_same) && prev_same > 0) r->growth = r->rel_l2 / prev_same;
        if (isfinite(r->third)) {
            r->floor = fmax(LOC_ABS_FLOOR, LOC_THIRD_FACTOR * r->third);
        } else if (r->layer != 0 && i > 0) {
            /* trend: layer 0 only seeds it; later rows are judged against
             * the same stage in earlier layers and the row just before */
            double base = fmax(max_same, t->rows[i - 1].rel_l2);
            if (r->layer < 0 || max_same >= 0) r->floor = fmax(LOC_ABS_FLOOR, LOC_TREND_FACTOR * base);
        }
        r->exceeds = isfinite(r->floor) && !(r->rel_l2 <= r->floor);
        if (r->exceeds && t->first < 0) t->first = i;
    }
    *out = t;
    return 0;
}

void localize_table_free(loc_table *t)
{
    if (!t) return;
    free(t->rows);
    free(t);
}

/* ------------------------------------------------------------------ */
/* Running the arms                                                    */

typedef struct loc_arm {
    const char *name;
    int index;               /* in the spec */
    char *hello;
    arm_decode_res res;
    int have_res;
    char dir[512];
} loc_arm;

/* Starts arm la, loads the model; tokenizes the prompt into *ids when ids
 * is not NULL; decodes steps with force (n_force ids) and dumps at step
 * dump_step. Returns 0 or -1 with e. */
static int run_arm(const loc_request *q, loc_arm *la, const char *text, int32_t **ids, int *n_ids,
                   const int32_t *prompt, int n_prompt, const int32_t *force, int n_force, tg_err *e)
{
    const tg_spec *s = q->spec;
    const spec_arm *sa = &s->arms[la->index];
    char **argv = spec_arm_argv(s, la->index, q->bin_dir, e);
    if (!argv) return tg_err_prefix(e, "arm %s", la->name);
    arm_config cfg = {.name = sa->name, .argv = argv, .timeout_request = sa->timeout_request,
                      .timeout_leg = sa->timeout_leg,
                      .n_fault_patterns = s->n_fault_patterns, .fault_patterns = s->fault_patterns};
    tg_arm *a = NULL;
    int rc = arm_start(&a, &cfg, e);
    spec_argv_free(argv);
    if (rc < 0) return -1;
    rc = -1;
    if (arm_hello(a, &la->hello, e) < 0 || arm_load(a, s->model_path, sa->options_json, NULL, e) < 0)
        goto out;
    if (ids) {
        if (arm_tokenize(a, text, 0, ids, n_ids, e) < 0) goto out;
        prompt = *ids, n_prompt = *n_ids;
    }
    if (mkdir(la->dir, 0700) < 0 && errno != EEXIST) {
        tg_errf(e, "arm %s: dump folder %s: %s", la->name, la->dir, strerror(errno));
        goto out;
    }
    int dump_step = q->step;
    arm_decode_req dq = {.prompt = prompt, .n_prompt = n_prompt, .steps = q->step + 1,
                         .top_k = s->top_k, .force = n_force ? force : NULL, .n_force = n_force,
                         .dump_steps = &dump_step, .n_dump_steps = 1, .dump_path = la->dir};
    la->have_res = 1;
    if (arm_decode(a, &dq, &la->res, NULL, NULL, e) < 0) goto out;
    if (la->res.n_steps != q->step + 1) {
        tg_errf(e, "arm %s: decode gave %d steps, expected %d", la->name, la->res.n_steps, q->step + 1);
        goto out;
    }
    rc = 0;
out:;
    arm_exit x;
    arm_finish(a, &x);
    if (rc == 0 && x.cause) rc = tg_errf(e, "arm %s: %s", la->name, x.cause);
    else if (rc == 0 && x.fault_lines) rc = tg_errf(e, "arm %s: fault lines in stderr: %.300s", la->name, x.fault_lines);
    arm_free(a);
    arm_dump_dir_remove(la->dir);
    return rc;
}

/* The prefix of a stored run: the reference's leg-1 prompt ids and the
 * tokens it appended before step `step`. Returns 0 or -1 with e. */
static int run_prefix(tg_store *st, int64_t run, const char *prompt, int step, int32_t **ids,
                      int *n_ids, int32_t **force, tg_err *e)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *s = NULL;
    int rc = -1;
    int64_t leg_id = 0, prompt_id = 0;
    *ids = *force = NULL;
    *n_ids = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT lp.decoded_from, lp.leg_id, lp.prompt_id FROM leg_prompt lp"
                           " JOIN leg ON leg.id = lp.leg_id JOIN arm ON arm.id = leg.arm_id"
                           " JOIN run ON run.id = leg.run_id AND arm.name = run.reference"
                           " JOIN prompt p ON p.id = lp.prompt_id"
                           " WHERE leg.run_id = ?1 AND leg.leg = 1 AND p.name = ?2",
                           -1, &s, NULL) != SQLITE_OK) {
        common_sql_err(db, e, "reading the reference's prompt");
        goto out;
    }
    sqlite3_bind_int64(s, 1, run);
    sqlite3_bind_text(s, 2, prompt, -1, SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_ROW) {
        tg_errf(e, "run %lld: the reference's leg 1 has no prompt %s", (long long)run, prompt);
        goto out;
    }
    const char *df = (const char *)sqlite3_column_text(s, 0);
    leg_id = sqlite3_column_int64(s, 1);
    prompt_id = sqlite3_column_int64(s, 2);
    json_error_t je;
    json_t *arr = df ? json_loads(df, 0, &je) : NULL;
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        json_decref(arr);
        tg_errf(e, "run %lld prompt %s: the reference's decoded_from is not a JSON array of ids",
                (long long)run, prompt);
        goto out;
    }
    *n_ids = (int)json_array_size(arr);
    *ids = xcalloc((size_t)*n_ids, sizeof **ids);
    *force = xcalloc((size_t)step + 1, sizeof **force);
    for (int i = 0; i < *n_ids; i++) (*ids)[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    json_decref(arr);
    sqlite3_finalize(s);
    if (sqlite3_prepare_v2(db,
                           "SELECT step, token, forced FROM step WHERE leg_id=?1 AND prompt_id=?2"
                           " AND step < ?3 ORDER BY step",
                           -1, &s, NULL) != SQLITE_OK) {
        s = NULL;
        common_sql_err(db, e, "reading the reference's steps");
        goto out;
    }
    sqlite3_bind_int64(s, 1, leg_id);
    sqlite3_bind_int64(s, 2, prompt_id);
    sqlite3_bind_int(s, 3, step);
    int n = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        if (sqlite3_column_int(s, 0) != n) break;
        (*force)[n++] = sqlite3_column_type(s, 2) == SQLITE_NULL ? sqlite3_column_int(s, 1)
                                                                 : sqlite3_column_int(s, 2);
    }
    if (n != step) {
        tg_errf(e, "run %lld prompt %s: the reference has %d consecutive steps before step %d",
                (long long)run, prompt, n, step);
        goto out;
    }
    rc = 0;
out:
    sqlite3_finalize(s);
    if (rc < 0) {
        free(*ids), free(*force);
        *ids = *force = NULL;
    }
    return rc;
}

int localize_prefix(tg_store *st, int64_t run, const char *prompt, int step, int32_t **ids, int *n_ids,
                    int32_t **force, tg_err *e)
{
    return run_prefix(st, run, prompt, step, ids, n_ids, force, e);
}

/* The dumps of step `step` as tensors (pointing into res). *n set. */
static loc_tensor *tensors_of(const arm_decode_res *res, int step, int *n)
{
    loc_tensor *t = xcalloc((size_t)res->n_dumps, sizeof *t);
    *n = 0;
    for (int i = 0; i < res->n_dumps; i++) {
        const arm_dump *d = &res->dumps[i];
        if (d->step != step) continue;
        t[*n] = (loc_tensor){d->layer, d->stage, d->n, d->data};
        (*n)++;
    }
    return t;
}

/* ------------------------------------------------------------------ */
/* Storing                                                             */


static char *top_json(const arm_step *sp)
{
    json_t *a = json_array();
    for (int i = 0; i < sp->n_top; i++)
        json_array_append_new(a, json_pack("[i,f]", sp->top[i].id, (double)sp->top[i].logit));
    char *s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return s;
}

static int store_record(tg_store *st, const loc_request *q, loc_arm *arms, int n_arms,
                        const int32_t *ids, int n_ids, const int32_t *force, const loc_table *t,
                        int64_t *id, tg_err *e)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *s = NULL;
    int rc = -1;
    char *prefix = NULL;
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return common_sql_err(db, e, "starting the localize record");
    {
        json_t *o = json_object(), *pi = json_array(), *fo = json_array();
        for (int i = 0; i < n_ids; i++) json_array_append_new(pi, json_integer(ids[i]));
        for (int i = 0; i < q->step; i++) json_array_append_new(fo, json_integer(force[i]));
        json_object_set_new(o, "prompt_ids", pi);
        json_object_set_new(o, "force", fo);
        prefix = json_dumps(o, JSON_COMPACT);
        json_decref(o);
    }
    char now[32];
    time_t tt = time(NULL);
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tt));
    const char *ptext = "";
    for (int p = 0; p < q->spec->n_prompts; p++)
        if (!strcmp(q->spec->prompts[p].id, q->prompt_id)) ptext = q->spec->prompts[p].text;
    const loc_row *first = t->first >= 0 ? &t->rows[t->first] : NULL;
    s = common_sql_prepare(db,
                           "INSERT INTO localize(created, run_id, spec_name, artifact_path,"
                           " artifact_sha256, prompt, prompt_text, step, arm_a, arm_b, third,"
                           " prefix, rule, first_layer, first_stage)"
                           " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15)",
                           "tNtttttittttt", now, q->run_id, q->spec->name, q->spec->model_path, q->spec->model_sha256,
                           q->prompt_id, ptext, q->step, q->arm_a, q->arm_b, q->third, prefix, t->rule);
    if (!s)
        goto fail;
    if (first) { /* else both stay NULL */
        sqlite3_bind_int(s, 14, first->layer);
        sqlite3_bind_text(s, 15, first->stage, -1, SQLITE_STATIC);
    }
    if (sqlite3_step(s) != SQLITE_DONE) goto fail;
    sqlite3_finalize(s);
    s = NULL;
    *id = sqlite3_last_insert_rowid(db);
    for (int a = 0; a < n_arms; a++) {
        loc_arm *la = &arms[a];
        const arm_step *sp = &la->res.steps[q->step];
        char *tj = top_json(sp);
        s = common_sql_prepare(db,
                               "INSERT INTO localize_arm(localize_id, arm, role, config, hello, token, top)"
                               " VALUES(?1,?2,?3,?4,?5,?6,?7)",
                               "Ittttit", *id, la->name, a == 0 ? "a" : a == 1 ? "b" : "third",
                               q->spec->arms[la->index].config_json, la->hello, (int)sp->token, tj);
        const int ok = s && sqlite3_step(s) == SQLITE_DONE;
        sqlite3_finalize(s);
        s = NULL;
        free(tj);
        if (!ok) goto fail;
        if (sqlite3_prepare_v2(db,
                               "INSERT INTO localize_dump(localize_id, arm, layer, stage, n, data)"
                               " VALUES(?1,?2,?3,?4,?5,?6)",
                               -1, &s, NULL) != SQLITE_OK)
            goto fail;
        for (int i = 0; i < la->res.n_dumps; i++) {
            const arm_dump *d = &la->res.dumps[i];
            void *blob;
            size_t len;
            if (common_blob_encode(d->data, d->n, &blob, &len, e) < 0) {
                tg_err_prefix(e, "arm %s layer %d %s", la->name, d->layer, d->stage);
                sqlite3_finalize(s);
                sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
                free(prefix);
                return -1;
            }
            sqlite3_reset(s);
            sqlite3_bind_int64(s, 1, *id);
            sqlite3_bind_text(s, 2, la->name, -1, SQLITE_STATIC);
            sqlite3_bind_int(s, 3, d->layer);
            sqlite3_bind_text(s, 4, d->stage, -1, SQLITE_STATIC);
            sqlite3_bind_int64(s, 5, d->n);
            sqlite3_bind_blob(s, 6, blob, (int)len, free);
            if (sqlite3_step(s) != SQLITE_DONE) goto fail;
        }
        sqlite3_finalize(s);
        s = NULL;
    }
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO localize_row(localize_id, layer, stage, n, rel_l2, cosine,"
                           " max_abs, growth, third, floor, exceeds) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)",
                           -1, &s, NULL) != SQLITE_OK)
        goto fail;
    for (int i = 0; i < t->n_rows; i++) {
        const loc_row *r = &t->rows[i];
        if (common_sql_step(s, "IitIDDDDDDi", *id, r->layer, r->stage, r->n, r->rel_l2, r->cosine, r->max_abs,
                            r->growth, r->third, r->floor, r->exceeds) != SQLITE_DONE)
            goto fail;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) goto fail;
    rc = 0;
    free(prefix);
    return rc;
fail:
    common_sql_err(db, e, "writing the localize record");
    sqlite3_finalize(s);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    free(prefix);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Printing                                                            */

static void fmt_num(char *out, size_t cap, double x)
{
    if (isfinite(x)) snprintf(out, cap, "%.3e", x);
    else snprintf(out, cap, "-");
}

static void print_logits(FILE *out, const loc_request *q, loc_arm *arms, int n_arms, int md)
{
    int k = q->show_top > 0 ? q->show_top : 8;
    const arm_step *ra = &arms[0].res.steps[q->step];
    int32_t r1 = ra->n_top > 0 ? ra->top[0].id : -1, r2 = ra->n_top > 1 ? ra->top[1].id : -1;
    fprintf(out, "%spre-sampler logits at step %d (top %d; own gap = top1 - top2; "
                 "%s gap = logit(%d) - logit(%d), %s's top-1 and top-2, in this arm)\n%s",
            md ? "\n" : "", q->step, k, arms[0].name, r1, r2, arms[0].name, md ? "\n" : "");
    for (int a = 0; a < n_arms; a++) {
        const arm_step *sp = &arms[a].res.steps[q->step];
        double own = sp->n_top > 1 ? (double)sp->top[0].logit - sp->top[1].logit : NAN;
        double l1 = NAN, l2 = NAN;
        for (int i = 0; i < sp->n_top; i++) {
            if (sp->top[i].id == r1) l1 = sp->top[i].logit;
            if (sp->top[i].id == r2) l2 = sp->top[i].logit;
        }
        fprintf(out, "%s%-16s token %-7d own gap %-10.6f %s gap %-10.6f |", md ? "    " : "  ",
                arms[a].name, sp->token, own, arms[0].name, l1 - l2);
        for (int i = 0; i < sp->n_top && i < k; i++)
            fprintf(out, " %d:%.4f", sp->top[i].id, sp->top[i].logit);
        fputc('\n', out);
    }
}

static void print_table(FILE *out, const loc_request *q, const loc_table *t, int md)
{
    const char *pre = md ? "    " : "";
    fprintf(out, "%s%-6s %-10s %8s %11s %11s %11s %9s %11s %11s %s\n", pre, "LAYER", "STAGE", "N",
            "REL_L2", "COSINE", "MAX_ABS", "GROWTH", q->third ? "THIRD" : "-", "FLOOR", "");
    for (int i = 0; i < t->n_rows; i++) {
        const loc_row *r = &t->rows[i];
        char rel[16], mx[16], th[16], fl[16], gr[16], cs[24];
        fmt_num(rel, sizeof rel, r->rel_l2);
        fmt_num(mx, sizeof mx, r->max_abs);
        fmt_num(th, sizeof th, r->third);
        fmt_num(fl, sizeof fl, r->floor);
        if (isfinite(r->growth)) snprintf(gr, sizeof gr, "%.3g", r->growth); else snprintf(gr, sizeof gr, "-");
        if (isfinite(r->cosine)) snprintf(cs, sizeof cs, "%.8f", r->cosine); else snprintf(cs, sizeof cs, "-");
        char lay[16];
        if (r->layer < 0) snprintf(lay, sizeof lay, "out"); else snprintf(lay, sizeof lay, "%d", r->layer);
        fprintf(out, "%s%-6s %-10s %8lld %11s %11s %11s %9s %11s %11s %s\n", pre, lay, r->stage,
                (long long)r->n, rel, cs, mx, gr, th, fl,
                i == t->first ? "<- FIRST OVER THE FLOOR" : r->exceeds ? "over" : "");
    }
}

/* Error against the layer, one polyline per stage, log10 y axis. */
static void svg_plot(FILE *out, const loc_table *t, const char *title)
{
    int max_layer = 0;
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < t->n_rows; i++) {
        const loc_row *r = &t->rows[i];
        if (r->layer > max_layer) max_layer = r->layer;
        double v = r->rel_l2 > 1e-12 ? log10(r->rel_l2) : -12;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    if (!isfinite(lo)) lo = -12, hi = 0;
    lo = floor(lo), hi = ceil(hi);
    if (hi <= lo) hi = lo + 1;
    const double W = 640, H = 360, L = 60, R = 130, T = 30, B = 40;
    double pw = W - L - R, ph = H - T - B;
#define XL(l) (L + (max_layer ? (double)(l) / max_layer : 0.5) * pw)
#define YV(v) (T + (1 - ((v) - lo) / (hi - lo)) * ph)
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                 "font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"18\">", L);
    svg_escape(out, title);
    fprintf(out, "</text>\n<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n",
            L, T, pw, ph);
    for (double v = lo; v <= hi + 1e-9; v += 1)
        fprintf(out, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">1e%.0f</text>\n", L - 4, YV(v) + 4, v);
    for (int l = 0; l <= max_layer; l++)
        fprintf(out, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%d</text>\n", XL(l), T + ph + 14, l);
    fprintf(out, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">layer</text>\n", L + pw / 2, H - 6);
    static const char *const COLORS[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f"};
    for (int s = 0; s < 8; s++) {
        fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" points=\"", COLORS[s]);
        for (int i = 0; i < t->n_rows; i++) {
            const loc_row *r = &t->rows[i];
            if (r->layer < 0 || strcmp(r->stage, STAGES[s])) continue;
            double v = r->rel_l2 > 1e-12 ? log10(r->rel_l2) : -12;
            fprintf(out, "%.1f,%.1f ", XL(r->layer), YV(v));
        }
        fprintf(out, "\"/>\n<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%s</text>\n", L + pw + 8,
                T + 14 + 14 * s, COLORS[s], STAGES[s]);
    }
    if (t->first >= 0 && t->rows[t->first].layer >= 0) {
        const loc_row *r = &t->rows[t->first];
        double v = r->rel_l2 > 1e-12 ? log10(r->rel_l2) : -12;
        fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"none\" stroke=\"red\" stroke-width=\"2\"/>\n",
                XL(r->layer), YV(v));
    }
    fprintf(out, "</svg>\n");
#undef XL
#undef YV
}

static int write_evidence(const loc_request *q, loc_arm *arms, int n_arms, const loc_table *t,
                          int64_t id, char *path, size_t cap, tg_err *e)
{
    snprintf(path, cap, "%s/localize-%lld-%s-%d.md", q->evidence_dir, (long long)id, q->prompt_id, q->step);
    common_out o;
    if (common_out_open(&o, path, q->db_path, "--evidence", e) < 0) return -1;
    FILE *f = o.f;
    fprintf(f, "# Localisation %lld: %s/%d, %s vs %s", (long long)id, q->prompt_id, q->step, q->arm_b, q->arm_a);
    if (q->third) fprintf(f, " (noise floor: %s vs %s)", q->third, q->arm_a);
    fprintf(f, "\n\n- spec: %s\n- model: `%s` (sha256 `%s`)\n", q->spec->name, q->spec->model_path,
            q->spec->model_sha256);
    fprintf(f, "- prefix: %s\n", q->run_id > 0 ? "the reference's tokens of a stored run" : "the first arm's own greedy tokens");
    if (q->run_id > 0) fprintf(f, "- run: %lld\n", (long long)q->run_id);
    fprintf(f, "- rule: %s (docs/localize.md)\n", t->rule);
    if (t->first >= 0)
        fprintf(f, "- **first stage over the noise floor: layer %d, %s** (relative L2 %.3e, floor %.3e)\n",
                t->rows[t->first].layer, t->rows[t->first].stage, t->rows[t->first].rel_l2,
                t->rows[t->first].floor);
    else
        fprintf(f, "- **no stage exceeds the noise floor**\n");
    print_logits(f, q, arms, n_arms, 1);
    fprintf(f, "\n## Error per layer and stage\n\n");
    print_table(f, q, t, 1);
    fprintf(f, "\n## Relative L2 error against the layer\n\n");
    char title[256];
    snprintf(title, sizeof title, "%s vs %s at %s/%d: relative L2 error per stage", q->arm_b, q->arm_a,
             q->prompt_id, q->step);
    svg_plot(f, t, title);
    if (common_out_close(&o, 1, e) < 0) return tg_err_prefix(e, "--evidence");
    return 0;
}

/* ------------------------------------------------------------------ */
/* Stage replay (replay.h)                                             */

/* Replays arm B (and arm A unless its numerics are exact) against the exact
 * arbiter over the prefix, prints each table, the OVER_BUDGET lines and
 * the attribution of B's gap shift; sets *replayed when some arm replayed
 * and then res->first_* from the replay (first stage over budget in
 * forward order, B's before A's). Returns 0, or -1 with e. */
static int replay_localize(const loc_request *q, loc_arm *arms, const int32_t *ids, int n_ids,
                           const int32_t *force, FILE *out, FILE *md, loc_outcome *res, int *replayed, tg_err *e)
{
    const tg_spec *s = q->spec;
    int n = n_ids + q->step;
    int32_t *tok = malloc(sizeof *tok * (size_t)(n > 0 ? n : 1));
    if (!tok) return tg_errf(e, "out of memory");
    memcpy(tok, ids, sizeof *tok * (size_t)n_ids);
    memcpy(tok + n_ids, force, sizeof *tok * (size_t)q->step);
    int first_set = 0, first_layer = -2;
    char first_stage[16] = "";
    for (int k = 1; k >= 0; k--) {
        loc_arm *la = &arms[k];
        if (s->arms[la->index].kind != SPEC_ARM_ENGINE && s->arms[la->index].kind != SPEC_ARM_EXEC) continue;
        if (k == 0 && s->arms[la->index].tier && !strcmp(s->arms[la->index].tier, "ref")) continue;
        /* the other arm's token, for the gap: A's top-1 for B */
        int tok2 = -1;
        const loc_arm *other = &arms[1 - k];
        if (other->have_res && other->res.n_steps > q->step) tok2 = other->res.steps[q->step].token;
        rp_request rq = {.spec = s, .bin_dir = q->bin_dir, .arm = la->index, .tokens = tok, .n_tokens = n,
                         .prefill = n_ids, .attribute = k == 1, .tok2 = tok2};
        rp_table *t = NULL;
        rp_attr *at = NULL;
        char why[256];
        int r = replay_run(&rq, &t, k == 1 ? &at : NULL, why, sizeof why, e);
        if (r < 0) {
            free(tok);
            return tg_err_prefix(e, "replay of %s", la->name);
        }
        if (r == 0) {
            fprintf(out, "\nstage replay: %s\n", why);
            if (md) fprintf(md, "\n%s\n", why);
            continue;
        }
        *replayed = 1;
        char batches[96] = "";
        if (t->prefill)
            snprintf(batches, sizeof batches, " (%s took the prompt's %d in one batch, then one at a time)", la->name,
                     t->prefill);
        fprintf(out, "\nstage replay: %s against the exact arbiter (ref tier with %s's declared roundings), %d positions%s;"
                     " budget = %g x noise model\n", la->name, la->name, n, batches, RP_MARGIN);
        replay_table_print(out, t, 0);
        if (md) {
            fprintf(md, "\n### %s against the exact arbiter (%d positions%s, budget = %g x noise model)\n\n", la->name, n,
                    batches, RP_MARGIN);
            replay_table_print(md, t, 1);
        }
        for (int i = 0; i < t->n_rows; i++) {
            const rp_row *rw = &t->rows[i];
            if (!rw->over) continue;
            fprintf(out, "OVER_BUDGET=%s layer %d %s\n", la->name, rw->layer, replay_stage_name(rw->stage));
            if (!first_set) {
                first_set = 1;
                first_layer = rw->layer;
                snprintf(first_stage, sizeof first_stage, "%s", replay_stage_name(rw->stage));
            }
        }
        if (at) {
            fprintf(out, "\nattribution of %s's gap shift to layers (each layer of %s on exact inputs, every other layer exact):\n",
                    la->name, la->name);
            replay_attr_print(out, at, 0);
            if (md) {
                fprintf(md, "\n### Attribution of %s's gap shift to layers\n", la->name);
                replay_attr_print(md, at, 1);
            }
        }
        replay_table_free(t);
        replay_attr_free(at);
    }
    free(tok);
    if (*replayed) {
        res->first_layer = first_layer;
        snprintf(res->first_stage, sizeof res->first_stage, "%s", first_stage);
    }
    return 0;
}

/* ------------------------------------------------------------------ */

int localize_run(tg_store *st, const loc_request *q, FILE *out, loc_outcome *res, tg_err *e)
{
    const tg_spec *s = q->spec;
    memset(res, 0, sizeof *res);
    res->first_layer = -2;
    const char *names[3] = {q->arm_a, q->arm_b, q->third};
    int n_arms = q->third ? 3 : 2;
    loc_arm arms[3];
    memset(arms, 0, sizeof arms);
    for (int i = 0; i < n_arms; i++) {
        int j = spec_find_arm(s, names[i]);
        if (j < 0) return tg_errf(e, "spec %s has no arm '%s'", s->name, names[i]);
        if (s->arms[j].kind == SPEC_ARM_COMMAND)
            return tg_errf(e, "arm '%s' is a command (custody) arm, not a protocol worker", names[i]);
        for (int k = 0; k < i; k++)
            if (!strcmp(names[k], names[i])) return tg_errf(e, "arm '%s' named twice", names[i]);
        arms[i].name = names[i];
        arms[i].index = j;
    }
    const char *text = NULL;
    for (int p = 0; p < s->n_prompts; p++)
        if (!strcmp(s->prompts[p].id, q->prompt_id)) text = s->prompts[p].text;
    if (!text) return tg_errf(e, "spec %s has no prompt '%s'", s->name, q->prompt_id);
    if (q->step < 0 || q->step > 100000) return tg_errf(e, "step %d out of range", q->step);

    char root[400];
    if (arm_dump_dir_make(root, sizeof root, "localize", e) < 0) return -1;
    for (int i = 0; i < n_arms; i++) snprintf(arms[i].dir, sizeof arms[i].dir, "%s/%d", root, i);

    int rc = -1;
    int32_t *ids = NULL, *force = NULL;
    int n_ids = 0;
    loc_tensor *ta = NULL, *tb = NULL, *tc = NULL;
    loc_table *t = NULL;
    if (q->run_id > 0) {
        if (run_prefix(st, q->run_id, q->prompt_id, q->step, &ids, &n_ids, &force, e) < 0) goto out;
        if (run_arm(q, &arms[0], text, NULL, NULL, ids, n_ids, force, q->step, e) < 0) goto out;
    } else {
        if (run_arm(q, &arms[0], text, &ids, &n_ids, NULL, 0, NULL, 0, e) < 0) goto out;
        force = xcalloc((size_t)q->step + 1, sizeof *force);
        for (int i = 0; i < q->step; i++) force[i] = arms[0].res.steps[i].token;
    }
    for (int i = 1; i < n_arms; i++)
        if (run_arm(q, &arms[i], text, NULL, NULL, ids, n_ids, force, q->step, e) < 0) goto out;
    int na, nb, nc = 0;
    ta = tensors_of(&arms[0].res, q->step, &na);
    tb = tensors_of(&arms[1].res, q->step, &nb);
    if (q->third) tc = tensors_of(&arms[2].res, q->step, &nc);
    if (na == 0 || nb == 0) {
        tg_errf(e, "arm %s dumped nothing at step %d", na == 0 ? q->arm_a : q->arm_b, q->step);
        goto out;
    }
    if (localize_table(&t, ta, na, tb, nb, tc, nc, e) < 0) goto out;
    if (store_record(st, q, arms, n_arms, ids, n_ids, force, t, &res->localize_id, e) < 0) goto out;
    if (t->first >= 0) {
        res->first_layer = t->rows[t->first].layer;
        snprintf(res->first_stage, sizeof res->first_stage, "%s", t->rows[t->first].stage);
    }
    fprintf(out, "localize %lld: %s/%d, %s vs %s", (long long)res->localize_id, q->prompt_id, q->step,
            q->arm_b, q->arm_a);
    if (q->third) fprintf(out, ", noise floor from %s vs %s x%g", q->third, q->arm_a, LOC_THIRD_FACTOR);
    else fprintf(out, ", noise floor from the earlier layers' trend x%g", LOC_TREND_FACTOR);
    fprintf(out, " (prefix: %s)\n", q->run_id > 0 ? "stored run's reference" : "first arm's greedy tokens");
    print_logits(out, q, arms, n_arms, 0);
    int replayed = 0;
    char *mdbuf = NULL;
    size_t mdlen = 0;
    FILE *md = q->evidence_dir ? open_memstream(&mdbuf, &mdlen) : NULL;
    int rrc = q->no_replay ? 0 : replay_localize(q, arms, ids, n_ids, force, out, md, res, &replayed, e);
    if (md) fclose(md);
    if (rrc < 0) {
        free(mdbuf);
        goto out;
    }
    fprintf(out, "\naccumulated activations at step %d (dumps), %s vs %s:\n", q->step, q->arm_b, q->arm_a);
    print_table(out, q, t, 0);
    if (replayed) {
        if (res->first_layer != -2)
            fprintf(out, "FIRST_OVER_FLOOR=layer %d %s\n", res->first_layer, res->first_stage);
        else
            fprintf(out, "FIRST_OVER_FLOOR=NONE\n");
    } else if (t->first >= 0)
        fprintf(out, "FIRST_OVER_FLOOR=layer %d %s\n", res->first_layer, res->first_stage);
    else
        fprintf(out, "FIRST_OVER_FLOOR=NONE\n");
    if (q->evidence_dir &&
        write_evidence(q, arms, n_arms, t, res->localize_id, res->evidence_path,
                       sizeof res->evidence_path, e) < 0) {
        free(mdbuf);
        goto out;
    }
    if (q->evidence_dir && replayed && mdbuf) {
        FILE *f = fopen(res->evidence_path, "a");
        if (!f || fprintf(f, "\n## Stage replay (docs/localize.md)\n%s", mdbuf) < 0 || fclose(f) != 0) {
            free(mdbuf);
            tg_errf(e, "--evidence %s: write error", res->evidence_path);
            goto out;
        }
    }
    free(mdbuf);
    rc = 0;
out:
    for (int i = 0; i < n_arms; i++) {
        free(arms[i].hello);
        if (arms[i].have_res) arm_decode_res_free(&arms[i].res);
    }
    free(ta), free(tb), free(tc);
    localize_table_free(t);
    free(ids), free(force);
    rmdir(root);
    return rc;
}

/* ------------------------------------------------------------------ */
/* The command                                                         */

/* The spec of a stored run, parsed from its stored text. */
static int run_spec(tg_store *st, int64_t run, tg_spec **out, tg_err *e)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *s = NULL;
    int rc = -1;
    s = common_sql_prepare(db,
                           "SELECT spec.path, spec.text FROM run JOIN spec ON spec.id = run.spec_id"
                           " WHERE run.id = ?1",
                           "I", run);
    if (!s)
        return common_sql_err(db, e, "reading the run's spec");
    if (sqlite3_step(s) != SQLITE_ROW) {
        tg_errf(e, "store: no run %lld", (long long)run);
    } else {
        const char *path = (const char *)sqlite3_column_text(s, 0);
        const char *text = (const char *)sqlite3_column_text(s, 1);
        if (!text) tg_errf(e, "run %lld: the store keeps no spec text", (long long)run);
        else if (spec_parse(out, path ? path : "(stored spec)", text, strlen(text), e) == 0) rc = 0;
        else tg_err_prefix(e, "run %lld: stored spec", (long long)run);
    }
    sqlite3_finalize(s);
    return rc;
}

static const char USAGE[] =
    "usage: tokgate localize P/S [RUN] --arms A,B [--third C] [--spec FILE] [--db FILE]\n"
    "                        [--evidence DIR] [--top N] [--no-replay]\n"
    "\n"
    "Runs arms A and B (and C) over one identical prefix of prompt P up to step S. When the\n"
    "arms can, replays every stage of B (and of A unless it is the ref tier) against the\n"
    "exact arbiter: the local error per layer and stage against its budget, every stage over\n"
    "budget (OVER_BUDGET=) and each layer's share of the gap shift; then compares B's dumps at\n"
    "step S against A's per layer and stage (docs/localize.md). Without --spec the spec and\n"
    "the prefix are those of a stored run (RUN, default the latest); with --spec, A decodes\n"
    "greedily.\n"
    "\n"
    "  --arms A,B       the two arms compared (B against A)\n"
    "  --third C        a third arm: the C-vs-A error is the noise floor\n"
    "  --spec FILE      run the spec's arms instead of a stored run's\n"
    "  --evidence DIR   also write DIR/localize-<id>-<P>-<S>.md with an SVG plot\n"
    "  --top N          logits shown per arm (default 8)\n"
    "  --db FILE        the store (default tokgate.db in the current directory)\n"
    "  --no-replay      skip the stage replay\n"
    "\n"
    "Exit status: 0 no stage over the floor (over budget, when replayed), 1 one is, 2 usage,\n"
    "input or arm error.\n";

enum { LO_DB = COMMON_CLI_FIRST_ID, LO_ARMS, LO_THIRD, LO_SPEC, LO_EVIDENCE, LO_TOP, LO_NO_REPLAY };

typedef struct loc_opts {
    const char *db, *arms, *third, *spec, *evidence;
    int top;
    int no_replay;
} loc_opts;

/* common_cli_fn of localize. */
static int loc_opt(void *ud, int id, const char *v, tg_err *e)
{
    loc_opts *o = ud;
    switch (id) {
    case LO_DB: o->db = v; break;
    case LO_ARMS: o->arms = v; break;
    case LO_THIRD: o->third = v; break;
    case LO_SPEC: o->spec = v; break;
    case LO_EVIDENCE: o->evidence = v; break;
    case LO_NO_REPLAY: o->no_replay = 1; break;
    case LO_TOP:
        if (common_parse_int(v, 1, 1000, &o->top) < 0) return tg_errf(e, "--top: expected 1..1000, got '%s'", v);
        break;
    }
    return 0;
}

/* A usage error: one line naming the command; returns 2. */
static int usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "tokgate localize: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see tokgate localize --help)\n");
    return 2;
}

int localize_main(int argc, char **argv)
{
    static const struct option lo[] = {{"db", required_argument, NULL, LO_DB},
                                       {"arms", required_argument, NULL, LO_ARMS},
                                       {"third", required_argument, NULL, LO_THIRD},
                                       {"spec", required_argument, NULL, LO_SPEC},
                                       {"evidence", required_argument, NULL, LO_EVIDENCE},
                                       {"top", required_argument, NULL, LO_TOP},
                                       {"no-replay", no_argument, NULL, LO_NO_REPLAY},
                                       {0}};
    static const common_cli cli = {"localize", USAGE, lo, 2};
    loc_opts o = {.db = "tokgate.db", .top = 8};
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0;
    int prc = common_cli_parse(&cli, argc - 1, argv + 1, loc_opt, &o, pos, &n_pos);
    if (prc == COMMON_CLI_HELP) return 0;
    if (prc) return prc;
    const char *db = o.db, *arms = o.arms, *third = o.third, *spec_path = o.spec, *evidence = o.evidence;
    int top = o.top;
    if (!pos[0]) return usage("expected P/S (a prompt id and a step, e.g. p1/45)%s", "");
    char prompt[64];
    int step;
    const char *slash = strrchr(pos[0], '/');
    if (!slash || slash == pos[0] || slash - pos[0] >= 64 || common_parse_int(slash + 1, 0, 100000, &step) < 0)
        return usage("expected P/S (a prompt id and a step 0..100000), got '%s'", pos[0]);
    memcpy(prompt, pos[0], (size_t)(slash - pos[0]));
    prompt[slash - pos[0]] = 0;
    if (!arms) return usage("--arms A,B is required%s", "");
    char a_name[128], b_name[128];
    const char *comma = strchr(arms, ',');
    if (!comma || comma == arms || !comma[1] || strchr(comma + 1, ',') || comma - arms >= 128 ||
        strlen(comma + 1) >= 128)
        return usage("--arms: expected two arm names A,B, got '%s'", arms);
    memcpy(a_name, arms, (size_t)(comma - arms));
    a_name[comma - arms] = 0;
    snprintf(b_name, sizeof b_name, "%s", comma + 1);
    if (spec_path && pos[1]) return usage("give either a RUN or --spec, not both (%s)", pos[1]);
    int64_t run = 0;
    if (pos[1]) {
        long x;
        if (common_parse_long(pos[1], 1, LONG_MAX, &x) < 0)
            return usage("expected a run id (an integer >= 1), got '%s'", pos[1]);
        run = x;
    }
    tg_err e;
    tg_store *st = NULL;
    tg_spec *spec = NULL;
    int rc = 2;
    struct stat sb;
    if (!spec_path && stat(db, &sb) != 0) {
        /* the prefix comes from a stored run: a missing store is a typo, not a new one */
        fprintf(stderr, "tokgate localize: no such store: %s (%s; give --db FILE or --spec FILE)\n", db,
                strerror(errno));
        return 2;
    }
    if (evidence && common_mkdirs(evidence, &e) < 0) {
        fprintf(stderr, "tokgate localize: --evidence %s: %s\n", evidence, e.msg);
        return 2;
    }
    if (store_open_cmd(&st, db, 0)) {
        return 2;
    }
    if (spec_path) {
        if (spec_load(&spec, spec_path, &e) < 0) goto fail;
    } else {
        if (run == 0) {
            int r = store_latest_run(st, NULL, &run, &e);
            if (r < 0) goto fail;
            if (r == 0) {
                tg_errf(&e, "%s has no runs: give --spec FILE or run `tokgate gate SPEC` first", db);
                goto fail;
            }
        }
        if (run_spec(st, run, &spec, &e) < 0) goto fail;
    }
    char actual[65];
    if (spec_check_artifact(spec, actual, NULL, &e) < 0) goto fail;
    char bins[4096];
    gate_bin_dir(bins, sizeof bins);
    loc_request q = {.spec = spec, .bin_dir = bins, .prompt_id = prompt, .step = step,
                     .arm_a = a_name, .arm_b = b_name, .third = third, .run_id = run,
                     .evidence_dir = evidence, .db_path = db, .show_top = top, .no_replay = o.no_replay};
    loc_outcome res;
    if (localize_run(st, &q, stdout, &res, &e) < 0) goto fail;
    if (res.evidence_path[0]) fprintf(stderr, "tokgate: evidence written to %s\n", res.evidence_path);
    rc = res.first_layer == -2 ? 0 : 1;
    spec_free(spec);
    store_close(st);
    return rc;
fail:
    fprintf(stderr, "tokgate: localize: %s\n", e.msg);
    spec_free(spec);
    store_close(st);
    return 2;
}
