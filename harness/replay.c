/*
 * replay.c: stage replay against the exact arbiter (replay.h): the replay
 * files, the noise model and budgets, the comparison, the attribution of a
 * gap's shift to layers, and the runs of the arbiter and the arm.
 * docs/localize.md ("Stage replay") is the reference of the rule.
 */
#include "replay.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arm.h"
#include "common.h"
#include "localize.h"
#include "replay_hook.h"
#include <sqlite3.h>

/* The stages are the engine's (replay_hook.h): one name table. */
_Static_assert(RP_N_STAGES == TG_RS_COUNT, "harness and engine replay stages differ");
enum { RS_SCORES = 10, RS_ATTN = 11, RS_RESIDUAL = 19, RS_OUT_NORM = 20, RS_LOGITS = 21, RS_EMBD = 22 };

const char *replay_stage_name(int stage)
{
    return tg_rstage_name(stage);
}

int replay_stage_parse(const char *s)
{
    return tg_rstage_parse(s);
}

/* ------------------------------------------------------------------ */
/* Files                                                               */

void rp_file_free(rp_file *f)
{
    if (!f) return;
    for (int i = 0; i < f->n_rec; i++) free(f->rec[i].data);
    free(f->rec);
    free(f);
}

/* rp_file_read's file and the room of its records. */
typedef struct rp_reading {
    rp_file *f;
    int cap;
} rp_reading;

/* tg_rfile_dest_fn of rp_file_read: a new record of the file. */
static float *record_dest(void *ud, int layer, int stage, uint64_t n, tg_err *e)
{
    rp_reading *rd = ud;
    rp_file *f = rd->f;
    if (stage < 0 || stage >= RP_N_STAGES || layer < -1 || layer >= (int32_t)f->n_layer || n > ((uint64_t)1 << 34)) {
        tg_errf(e, "record %d: bad header", f->n_rec);
        return NULL;
    }
    if (f->n_rec == rd->cap) {
        int cap = rd->cap ? 2 * rd->cap : 64;
        rp_record *r = realloc(f->rec, sizeof *r * (size_t)cap);
        if (!r) {
            tg_errf(e, "out of memory");
            return NULL;
        }
        f->rec = r;
        rd->cap = cap;
    }
    rp_record *r = &f->rec[f->n_rec];
    r->layer = layer, r->stage = stage, r->n = (int64_t)n;
    r->data = malloc((size_t)n * sizeof(float) + 1);
    if (!r->data) {
        tg_errf(e, "out of memory");
        return NULL;
    }
    f->n_rec++;
    return r->data;
}

int rp_file_read(rp_file **out, const char *path, tg_err *e)
{
    *out = NULL;
    uint32_t h[8];
    FILE *fp = tg_rfile_open(path, "replay file", h, e);
    if (!fp) return -1;
    rp_file *f = calloc(1, sizeof *f);
    if (!f) {
        fclose(fp);
        return tg_errf(e, "out of memory");
    }
    f->n_layer = h[0], f->n_embd = h[1], f->n_head = h[2], f->n_head_kv = h[3], f->head_dim = h[4];
    f->n_ff = h[5], f->n_vocab = h[6], f->n_tokens = h[7];
    rp_reading rd = {f, 0};
    if (tg_rfile_read(fp, path, "replay file", record_dest, &rd, e) < 0) {
        rp_file_free(f);
        return -1;
    }
    *out = f;
    return 0;
}

int rp_file_write(const rp_file *f, const char *path, int (*keep)(const rp_record *r, void *ud), void *ud,
                  tg_err *e)
{
    const uint32_t h[8] = {f->n_layer, f->n_embd, f->n_head, f->n_head_kv, f->head_dim, f->n_ff, f->n_vocab,
                           f->n_tokens};
    FILE *fp = tg_rfile_create(path, "replay file", h, e);
    if (!fp) return -1;
    int ok = 1;
    for (int i = 0; ok && i < f->n_rec; i++) {
        const rp_record *r = &f->rec[i];
        if (!keep || keep(r, ud)) ok = tg_rfile_put(fp, r->layer, r->stage, r->data, (uint64_t)r->n);
    }
    if (fclose(fp) != 0 || !ok) return tg_errf(e, "replay file %s: write failed", path);
    return 0;
}

const rp_record *rp_file_find(const rp_file *f, int layer, int stage)
{
    for (int i = 0; f && i < f->n_rec; i++)
        if (f->rec[i].layer == layer && f->rec[i].stage == stage) return &f->rec[i];
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Numerics and the noise model                                        */

int replay_numerics_parse(const char *json, rp_numerics *n, tg_err *e)
{
    memset(n, 0, sizeof *n);
    json_error_t je;
    json_t *j = json ? json_loads(json, 0, &je) : NULL;
    if (!json_is_object(j)) {
        json_decref(j);
        return tg_errf(e, "numerics: expected a JSON object, got %.80s", json ? json : "(none)");
    }
    const char *act = json_string_value(json_object_get(j, "act"));
    const char *kv = json_string_value(json_object_get(j, "kv"));
    const char *acc = json_string_value(json_object_get(j, "attn_acc"));
    const char *accum = json_string_value(json_object_get(j, "accum"));
    const char *silu = json_string_value(json_object_get(j, "silu"));
    n->exact = json_is_true(json_object_get(j, "exact"));
    n->act_vec_dot = act && !strcmp(act, "vec_dot");
    n->acc_f16 = acc && (!strcmp(acc, "f16") || (!strcmp(acc, "kv") && kv && !strcmp(kv, "f16")));
    n->accum_f64 = accum && !strcmp(accum, "f64");
    n->silu_approx = silu && strcmp(silu, "f64") && strcmp(silu, "f32");
    json_decref(j);
    return 0;
}

/* f32 roundings on one output's path of an element-wise stage. */
static double stage_ops(int stage, const rp_numerics *n)
{
    switch (stage) {
    case 0: case 4: case 5: case 14: case RS_OUT_NORM:
        return 5;                       /* rmsnorm: mean, sqrt, 1/x, x*scale, *w */
    case 6: case 7:
        return 4;                       /* rope: two products, a sum, the angle's cos/sin */
    case 17:
        return n->silu_approx ? 8 : 6;  /* silu: exp, 1+, /, *up; an expf approximation adds 2 ulp */
    default:
        return 1;                       /* a copy or one add (the embedding row, cache rows, residuals) */
    }
}

double replay_noise(const rp_numerics *n, const rp_file *f, int stage, int pos)
{
    const double u = RP_U32, h = RP_U16;
    int64_t cols = 0;
    switch (stage) {
    case 1: case 2: case 3: case 15: case 16: case RS_LOGITS: cols = f->n_embd; break;  /* q k v gate up logits */
    case 12: cols = (int64_t)f->n_head * f->head_dim; break;                            /* attn_out */
    case 18: cols = f->n_ff; break;                                                      /* ffn_out */
    default: break;
    }
    if (cols) {
        /* a dot product: the output's rounding and the product of scales, plus a
         * random walk over the f32 additions: one per 16-value sub-block of
         * an integer dot (vec_dot activations), one per value otherwise */
        double n_acc = n->accum_f64 ? 0 : n->act_vec_dot ? (double)cols / 16 : (double)cols;
        return u * (2 + sqrt(n_acc));
    }
    if (stage == RS_SCORES) return u * (2 + (n->accum_f64 ? 0 : sqrt((double)f->head_dim)));
    if (stage == RS_ATTN) {
        double npos = pos + 1;
        double v = u * (4 + (n->accum_f64 ? 0 : sqrt(npos)));
        /* an f16 accumulator rounded after each update: where the arm's f32
         * weight and the arbiter's differ (a few u), the f16 rounding of an
         * update flips with probability ~2u/h, by one f16 ulp (2h); over npos
         * updates: 2h sqrt(npos 2u/h) */
        if (n->acc_f16) v += 2 * sqrt(2 * npos * u * h);
        return v;
    }
    return u * stage_ops(stage, n);
}

/* ------------------------------------------------------------------ */
/* Comparison                                                          */

static long fwd_key(int layer, int stage)
{
    /* the embedding row comes before layer 0's first stage */
    return (layer < 0 ? 1000000L : layer) * 64 + (stage == RS_EMBD ? -1 : stage);
}

static int cmp_rows(const void *x, const void *y)
{
    const rp_row *a = x, *b = y;
    long ka = fwd_key(a->layer, a->stage), kb = fwd_key(b->layer, b->stage);
    return ka < kb ? -1 : ka > kb;
}

void replay_table_free(rp_table *t)
{
    if (!t) return;
    free(t->rows);
    free(t);
}

int replay_compare(const rp_file *ref, const rp_file *arm, const rp_numerics *num, rp_table **out, tg_err *e)
{
    *out = NULL;
    if (ref->n_layer != arm->n_layer || ref->n_embd != arm->n_embd || ref->n_tokens != arm->n_tokens ||
        ref->n_head != arm->n_head || ref->n_vocab != arm->n_vocab)
        return tg_errf(e, "replay: the arbiter's and the arm's files differ in dimensions or token count");
    rp_table *t = calloc(1, sizeof *t);
    if (!t || !(t->rows = calloc((size_t)(ref->n_rec ? ref->n_rec : 1), sizeof *t->rows))) {
        free(t);
        return tg_errf(e, "out of memory");
    }
    t->first = -1;
    const int T = (int)ref->n_tokens, H = (int)ref->n_head;
    for (int i = 0; i < ref->n_rec; i++) {
        const rp_record *a = &ref->rec[i], *b = rp_file_find(arm, a->layer, a->stage);
        if (!b) continue;
        if (b->n != a->n) {
            replay_table_free(t);
            return tg_errf(e, "replay: layer %d %s: %lld values from the arbiter, %lld from the arm", a->layer,
                           replay_stage_name(a->stage), (long long)a->n, (long long)b->n);
        }
        rp_row *r = &t->rows[t->n_rows++];
        r->layer = a->layer, r->stage = a->stage, r->n = a->n;
        r->worst_pos = -1;
        double da = 0, dd = 0;
        /* the logits (and an older worker's final norm) are the last token's
         * row only; the final norm has a row for every token, compared where
         * both computed it (the last token of one of their evaluations) */
        int last = a->stage == RS_LOGITS || (a->stage == RS_OUT_NORM && a->n != (int64_t)T * ref->n_embd);
        int sparse = a->stage == RS_OUT_NORM && !last;
        int rows = last ? 1 : T;
        int64_t off = 0;
        for (int tk = 0; tk < rows; tk++) {
            int pos = last ? T - 1 : tk;
            int64_t w = a->stage == RS_SCORES ? (int64_t)H * (pos + 1) : last ? a->n : a->n / T;
            if (sparse && (isnan(a->data[off]) || isnan(b->data[off]))) {
                off += w;
                continue;
            }
            double ta = 0, td = 0;
            for (int64_t k = off; k < off + w; k++) {
                double x = a->data[k], d = (double)b->data[k] - x;
                ta += x * x, td += d * d;
            }
            off += w;
            da += ta, dd += td;
            double rel = ta > 0 ? sqrt(td / ta) : sqrt(td);
            if (isnan(rel)) rel = INFINITY;
            double budget = RP_MARGIN * replay_noise(num, ref, a->stage, pos);
            double ratio = rel / budget;
            if (rel > r->max_rel) r->max_rel = rel;
            if (r->worst_pos < 0 || ratio > r->ratio) r->ratio = ratio, r->worst_pos = pos, r->budget = budget;
        }
        r->rel_l2 = da > 0 ? sqrt(dd / da) : sqrt(dd);
        if (isnan(r->rel_l2)) r->rel_l2 = INFINITY;
        r->over = r->ratio > 1.0;
    }
    qsort(t->rows, (size_t)t->n_rows, sizeof *t->rows, cmp_rows);
    for (int i = 0; i < t->n_rows; i++)
        if (t->rows[i].over) {
            if (t->first < 0) t->first = i;
            t->n_over++;
        }
    *out = t;
    return 0;
}

void replay_table_print(FILE *out, const rp_table *t, int md)
{
    if (md) fprintf(out, "| layer | stage | max_rel | rel_l2 | budget | ratio | worst pos | over |\n|---|---|---|---|---|---|---|---|\n");
    else fprintf(out, "%5s %-10s %10s %10s %10s %9s %5s\n", "LAYER", "STAGE", "MAX_REL", "REL_L2", "BUDGET", "RATIO", "POS");
    for (int i = 0; i < t->n_rows; i++) {
        const rp_row *r = &t->rows[i];
        char lay[16];
        if (r->layer < 0) snprintf(lay, sizeof lay, "out");
        else snprintf(lay, sizeof lay, "%d", r->layer);
        if (md)
            fprintf(out, "| %s | %s | %.3e | %.3e | %.3e | %.3g | %d | %s |\n", lay, replay_stage_name(r->stage),
                    r->max_rel, r->rel_l2, r->budget, r->ratio, r->worst_pos, r->over ? "**OVER**" : "");
        else
            fprintf(out, "%5s %-10s %10.3e %10.3e %10.3e %9.3g %5d%s\n", lay, replay_stage_name(r->stage),
                    r->max_rel, r->rel_l2, r->budget, r->ratio, r->worst_pos, r->over ? "  OVER" : "");
    }
}

void replay_attr_free(rp_attr *a)
{
    if (!a) return;
    free(a->shift);
    free(a);
}

void replay_attr_print(FILE *out, const rp_attr *a, int md)
{
    double sum = 0;
    for (int l = 0; l < a->n_layer; l++) sum += a->shift[l];
    fprintf(out, "%sgap = logit[%d] - logit[%d]: exact %.6f, arm %.6f, shift %+.6f; sum of the layers' own shifts %+.6f\n",
            md ? "\n" : "", a->tok1, a->tok2, a->gap_exact, a->gap_arm, a->gap_arm - a->gap_exact, sum);
    if (md) fprintf(out, "\n| layer | own shift |\n|---|---|\n");
    else fprintf(out, "%5s %12s\n", "LAYER", "OWN_SHIFT");
    for (int l = 0; l < a->n_layer; l++) {
        if (md) fprintf(out, "| %d | %+.6f |\n", l, a->shift[l]);
        else fprintf(out, "%5d %+12.6f\n", l, a->shift[l]);
    }
}

/* ------------------------------------------------------------------ */
/* Runs                                                                */

typedef struct rp_proc {
    tg_arm *a;
    char *hello;
    char *load;
} rp_proc;

static int proc_start(rp_proc *p, const char *name, char **argv, const tg_spec *s, const char *options_json,
                      double timeout, tg_err *e)
{
    memset(p, 0, sizeof *p);
    arm_config cfg = {.name = name, .argv = argv, .timeout_request = timeout > 0 ? timeout : 600,
                      .n_fault_patterns = s->n_fault_patterns, .fault_patterns = s->fault_patterns};
    if (arm_start(&p->a, &cfg, e) < 0) return -1;
    if (arm_hello(p->a, &p->hello, e) < 0) return -1;
    return 0;
}

static int proc_load(rp_proc *p, const tg_spec *s, const char *options_json, tg_err *e)
{
    return arm_load(p->a, s->model_path, options_json, &p->load, e);
}

static int proc_end(rp_proc *p, int rc, const char *name, tg_err *e)
{
    if (!p->a) return rc;
    arm_exit x;
    arm_finish(p->a, &x);
    if (rc == 0 && x.cause) rc = tg_errf(e, "arm %s: %s", name, x.cause);
    else if (rc == 0 && x.fault_lines) rc = tg_errf(e, "arm %s: fault lines in stderr: %.300s", name, x.fault_lines);
    arm_free(p->a);
    free(p->hello);
    free(p->load);
    memset(p, 0, sizeof *p);
    return rc;
}

/* The value of key in an answer's object `obj` as JSON text (malloc'ed), or NULL. */
static char *answer_field(const char *answer, const char *obj, const char *key)
{
    json_error_t je;
    json_t *j = answer ? json_loads(answer, 0, &je) : NULL;
    json_t *v = json_object_get(json_object_get(j, obj), key);
    char *s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return s;
}

/* The logits record (the last token's) of a file, or NULL. */
static const float *logits_of(const rp_file *f)
{
    const rp_record *r = rp_file_find(f, -1, RS_LOGITS);
    return r && r->n == (int64_t)f->n_vocab ? r->data : NULL;
}

static int keep_residuals(const rp_record *r, void *ud)
{
    (void)ud;
    return r->stage == RS_RESIDUAL && r->layer >= 0;
}

static int keep_layer_residual(const rp_record *r, void *ud)
{
    return r->stage == RS_RESIDUAL && r->layer == *(const int *)ud;
}

static void top2(const float *x, int n, int *t1, int *t2)
{
    *t1 = *t2 = -1;
    for (int i = 0; i < n; i++) {
        if (*t1 < 0 || x[i] > x[*t1]) *t2 = *t1, *t1 = i;
        else if (*t2 < 0 || x[i] > x[*t2]) *t2 = i;
    }
}

int replay_run(const rp_request *q, rp_table **table, rp_attr **attr, char *why, size_t why_n, tg_err *e)
{
    const tg_spec *s = q->spec;
    const spec_arm *sa = &s->arms[q->arm];
    *table = NULL;
    if (attr) *attr = NULL;
    if (why && why_n) why[0] = 0;
    char dir[512], p_ref[600], p_arm[600], p_plain[600], p_res[600], p_lay[600], p_inj[600], p_out[600];
    if (arm_dump_dir_make(dir, sizeof dir, "replay", e) < 0) return -1;
    snprintf(p_ref, sizeof p_ref, "%s/arbiter.rpl", dir);
    snprintf(p_arm, sizeof p_arm, "%s/arm.rpl", dir);
    snprintf(p_plain, sizeof p_plain, "%s/exact.rpl", dir);
    snprintf(p_res, sizeof p_res, "%s/residuals.rpl", dir);
    snprintf(p_lay, sizeof p_lay, "%s/arm-layers.rpl", dir);
    snprintf(p_inj, sizeof p_inj, "%s/inject.rpl", dir);
    snprintf(p_out, sizeof p_out, "%s/out.rpl", dir);
    rp_proc arb = {0}, arm = {0};
    rp_file *fr = NULL, *fa = NULL, *fp = NULL, *fl = NULL, *fo = NULL;
    char *num_json = NULL, *can = NULL;
    rp_attr *at = NULL;
    int rc = -1;

    char **argv = spec_arm_argv(s, q->arm, q->bin_dir, e);
    if (!argv) { tg_err_prefix(e, "arm %s", sa->name); goto out; }
    int st = proc_start(&arm, sa->name, argv, s, sa->options_json, sa->timeout_request, e);
    spec_argv_free(argv);
    if (st < 0) goto out;
    can = answer_field(arm.hello, "arm", "replay");
    if (!can || strcmp(can, "true")) {
        if (why) snprintf(why, why_n, "arm %s cannot replay (its hello has no \"replay\": true): compared on dumps only", sa->name);
        rc = 0;
        goto out;
    }
    if (proc_load(&arm, s, sa->options_json, e) < 0) goto out;
    num_json = answer_field(arm.load, "model", "numerics");
    if (!num_json) num_json = answer_field(arm.hello, "arm", "numerics");
    rp_numerics num;
    if (replay_numerics_parse(num_json, &num, e) < 0) { tg_err_prefix(e, "arm %s", sa->name); goto out; }

    char exe[4200];
    snprintf(exe, sizeof exe, "%s/tg-engine", q->bin_dir);
    char *arb_argv[] = {exe, "--tier", "ref", NULL};
    if (proc_start(&arb, "arbiter", arb_argv, s, "{}", 0, e) < 0 || proc_load(&arb, s, "{}", e) < 0) goto out;
    /* the arm in a run's batches when it can (the prompt, then one token at
     * a time: its single-token path is replayed too) */
    char *pf = answer_field(arm.hello, "arm", "replay_prefill");
    const int split = pf && !strcmp(pf, "true") && q->prefill > 0 && q->prefill < q->n_tokens ? q->prefill : 0;
    free(pf);
    /* the arbiter in the same batches, so that both compute the final norm
     * at the same positions (the last token of each evaluation) */
    if (arm_replay(arb.a, q->tokens, q->n_tokens, split, NULL, p_ref, num.exact ? NULL : num_json, NULL, e) < 0 ||
        arm_replay(arm.a, q->tokens, q->n_tokens, split, p_ref, p_arm, NULL, NULL, e) < 0)
        goto out;
    if (rp_file_read(&fr, p_ref, e) < 0 || rp_file_read(&fa, p_arm, e) < 0) goto out;
    if (replay_compare(fr, fa, &num, table, e) < 0) goto out;
    (*table)->prefill = split;

    if (attr && q->attribute) {
        /* the exact run, the arm's free run, the arm's layers on exact inputs */
        if (arm_replay(arb.a, q->tokens, q->n_tokens, 0, NULL, p_plain, NULL, NULL, e) < 0 ||
            rp_file_read(&fp, p_plain, e) < 0 || rp_file_write(fp, p_res, keep_residuals, NULL, e) < 0 ||
            arm_replay(arm.a, q->tokens, q->n_tokens, split, p_res, p_lay, NULL, NULL, e) < 0 ||
            rp_file_read(&fl, p_lay, e) < 0 ||
            arm_replay(arm.a, q->tokens, q->n_tokens, split, NULL, p_out, NULL, NULL, e) < 0 ||
            rp_file_read(&fo, p_out, e) < 0)
            goto out;
        const float *lx = logits_of(fp), *la = logits_of(fo);
        if (!lx || !la) { tg_errf(e, "replay: no logits record from the arbiter or the arm"); goto out; }
        at = calloc(1, sizeof *at);
        if (!at || !(at->shift = calloc(fp->n_layer ? fp->n_layer : 1, sizeof *at->shift))) {
            tg_errf(e, "out of memory");
            goto out;
        }
        at->n_layer = (int)fp->n_layer;
        int a1, a2, b1, b2;
        top2(lx, (int)fp->n_vocab, &a1, &a2);
        top2(la, (int)fp->n_vocab, &b1, &b2);
        at->tok1 = a1;
        at->tok2 = q->tok2 >= 0 && q->tok2 != a1 ? q->tok2 : b1 != a1 ? b1 : a2;
        at->gap_exact = (double)lx[at->tok1] - lx[at->tok2];
        at->gap_arm = (double)la[at->tok1] - la[at->tok2];
        for (int l = 0; l < at->n_layer; l++) {
            rp_file *fi = NULL;
            if (rp_file_write(fl, p_inj, keep_layer_residual, &l, e) < 0 ||
                arm_replay(arb.a, q->tokens, q->n_tokens, 0, p_inj, p_out, NULL, NULL, e) < 0 ||
                rp_file_read(&fi, p_out, e) < 0)
                goto out;
            const float *li = logits_of(fi);
            at->shift[l] = li ? (double)li[at->tok1] - li[at->tok2] - at->gap_exact : NAN;
            rp_file_free(fi);
        }
        *attr = at;
        at = NULL;
    }
    rc = 1;
out:
    rc = proc_end(&arm, rc, sa->name, e);
    rc = proc_end(&arb, rc, "arbiter", e);
    if (rc < 0) {
        replay_table_free(*table);
        *table = NULL;
    }
    replay_attr_free(at);
    rp_file_free(fr), rp_file_free(fa), rp_file_free(fp), rp_file_free(fl), rp_file_free(fo);
    free(num_json);
    free(can);
    arm_dump_dir_remove(dir);
    return rc;
}

/* ------------------------------------------------------------------ */
/* In the gate                                                         */

/* Inserts a verdict key row of the set. Returns 0 or -1 with e. */
static int put_key(sqlite3 *db, int64_t run, int set, const char *arm, const char *prompt, const char *key,
                   const char *val, tg_err *e)
{
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(db,
                                "INSERT INTO verdict(run_id, set_no, arm, prompt, key, value, band, policy)"
                                " SELECT ?1, ?2, ?3, ?4, ?5, ?6, band, policy FROM verdict_set"
                                " WHERE run_id=?1 AND set_no=?2",
                                -1, &q, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(q, 1, run);
        sqlite3_bind_int(q, 2, set);
        if (arm) sqlite3_bind_text(q, 3, arm, -1, SQLITE_TRANSIENT); else sqlite3_bind_null(q, 3);
        if (prompt) sqlite3_bind_text(q, 4, prompt, -1, SQLITE_TRANSIENT); else sqlite3_bind_null(q, 4);
        sqlite3_bind_text(q, 5, key, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(q, 6, val, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(q) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    }
    sqlite3_finalize(q);
    return rc == SQLITE_OK ? 0 : tg_errf(e, "store: verdict key %s: %s", key, sqlite3_errmsg(db));
}

/* The last step at which arm's leg-1 token differs from the reference's, -1 none. */
static int last_contested(sqlite3 *db, int64_t run, int set, const char *arm, const char *prompt)
{
    sqlite3_stmt *q = NULL;
    int v = -1;
    if ((q = common_sql_prepare(db,
                                "SELECT max(step) FROM compare WHERE run_id=?1 AND set_no=?2 AND arm=?3 AND leg=1"
                                " AND prompt=?4 AND ref_token IS NOT NULL AND token != ref_token",
                                "Iitt", run, set, arm, prompt))) {
        if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_type(q, 0) != SQLITE_NULL) v = sqlite3_column_int(q, 0);
    }
    sqlite3_finalize(q);
    return v;
}

int replay_gate(tg_store *st, const tg_spec *s, int64_t run, int set, const char *bin_dir, FILE *log,
                int *fail_gate, tg_err *e)
{
    *fail_gate = 0;
    if (!s->replay) return 0;
    sqlite3 *db = store_db(st);
    int any_fail = 0, any_pass = 0;
    double t0 = tg_now();
    for (int i = 0; i < s->n_arms; i++) {
        const spec_arm *sa = &s->arms[i];
        if (sa->kind != SPEC_ARM_ENGINE && sa->kind != SPEC_ARM_EXEC) continue;
        if (sa->role && !strcmp(sa->role, "custody")) continue;
        if (sa->variant_of && !s->replay_variants) continue; /* a panel variant: replay.variants */
        if (sa->kind == SPEC_ARM_ENGINE && sa->tier && !strcmp(sa->tier, "ref")) {
            /* the arbiter's own code: replaying it against itself proves nothing */
            if (put_key(db, run, set, sa->name, NULL, "REPLAY", "ARBITER", e) < 0) return -1;
            continue;
        }
        const char *verdict = "PASS";
        for (int p = 0; p < s->n_prompts; p++) {
            if (!spec_arm_runs_prompt(s, i, p)) continue; /* the arm's prompts: list */
            int S = s->replay_steps, c = last_contested(db, run, set, sa->name, s->prompts[p].id);
            if (c > S) S = c;
            if (S > s->steps) S = s->steps;
            int32_t *ids = NULL, *force = NULL;
            int n_ids = 0;
            if (localize_prefix(st, run, s->prompts[p].id, S, &ids, &n_ids, &force, e) < 0)
                return tg_err_prefix(e, "replay of %s, prompt %s", sa->name, s->prompts[p].id);
            int n = n_ids + S;
            int32_t *tok = malloc(sizeof *tok * (size_t)(n > 0 ? n : 1));
            if (!tok) { free(ids), free(force); return tg_errf(e, "out of memory"); }
            memcpy(tok, ids, sizeof *tok * (size_t)n_ids);
            memcpy(tok + n_ids, force, sizeof *tok * (size_t)S);
            free(ids), free(force);
            rp_request q = {.spec = s, .bin_dir = bin_dir, .arm = i, .tokens = tok, .n_tokens = n, .prefill = n_ids,
                            .tok2 = -1};
            rp_table *t = NULL;
            char why[256];
            int r = replay_run(&q, &t, NULL, why, sizeof why, e);
            free(tok);
            if (r < 0) return tg_err_prefix(e, "replay of %s, prompt %s", sa->name, s->prompts[p].id);
            if (r == 0) {
                if (log) fprintf(log, "tokgate: replay: %s\n", why);
                verdict = "NONE";
                break;
            }
            double worst = 0;
            int wi = -1;
            for (int k = 0; k < t->n_rows; k++)
                if (t->rows[k].ratio > worst) worst = t->rows[k].ratio, wi = k;
            if (log) {
                fprintf(log, "tokgate: replay %s %s (%d positions%s): %s, %d stage(s) over budget", sa->name,
                        s->prompts[p].id, n, t->prefill ? ", the prompt in one batch, then one at a time" : "",
                        t->n_over ? "FAIL" : "PASS", t->n_over);
                if (wi >= 0)
                    fprintf(log, ", largest ratio %.3g (layer %d %s)", worst, t->rows[wi].layer,
                            replay_stage_name(t->rows[wi].stage));
                fputc('\n', log);
                for (int k = 0; k < t->n_rows; k++)
                    if (t->rows[k].over)
                        fprintf(log, "tokgate: replay %s %s: OVER_BUDGET=layer %d %s (%.3g of budget at position %d)\n",
                                sa->name, s->prompts[p].id, t->rows[k].layer, replay_stage_name(t->rows[k].stage),
                                t->rows[k].ratio, t->rows[k].worst_pos);
            }
            char pv[64];
            snprintf(pv, sizeof pv, "%s", t->n_over ? "FAIL" : "PASS");
            if (t->n_over) verdict = "FAIL";
            replay_table_free(t);
            if (put_key(db, run, set, sa->name, s->prompts[p].id, "REPLAY", pv, e) < 0) return -1;
        }
        if (!strcmp(verdict, "FAIL")) any_fail = 1;
        if (!strcmp(verdict, "PASS")) any_pass = 1;
        if (put_key(db, run, set, sa->name, NULL, "REPLAY", verdict, e) < 0) return -1;
    }
    const char *overall = any_fail ? "FAIL" : any_pass ? "PASS" : "NONE";
    if (log) fprintf(log, "tokgate: replay: %s in %.1f s\n", overall, tg_now() - t0);
    if (put_key(db, run, set, NULL, NULL, "REPLAY", overall, e) < 0) return -1;
    if (any_fail && s->replay_gate) {
        *fail_gate = 1;
        char *err = NULL;
        char sql[256];
        snprintf(sql, sizeof sql,
                 "UPDATE verdict SET value='FAIL' WHERE run_id=%lld AND set_no=%d AND arm IS NULL AND prompt IS NULL"
                 " AND key='TOKEN_GATE'; UPDATE verdict_set SET overall='FAIL' WHERE run_id=%lld AND set_no=%d;",
                 (long long)run, set, (long long)run, set);
        if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
            tg_errf(e, "store: replay verdict: %s", err ? err : "?");
            sqlite3_free(err);
            return -1;
        }
    }
    return 0;
}
