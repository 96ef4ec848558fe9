/*
 * report.c: the reports of a scored run (report.h). Everything printed here
 * is read from the store: the run and its arms, prompts and legs, and the
 * verdict, compare and contested rows of one verdict set; the only decoding
 * is of step blobs for the top-2 of `tokgate step`. The queries are simple
 * enough to be re-run by hand with sqlite3 (docs/store.md).
 */
#include "report.h"

#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "calibrate.h"
#include "common.h"
#include "compare.h"
#include "gguf.h"
#include "tokenizer.h"
#include "svg.h"
#include "verdict.h"

/* ------------------------------------------------------------------ */
/* Context                                                             */

typedef struct rarm {
    char name[128], role[32], kind[32];
    int scored_leg;
    int is_ref, is_custody;
} rarm;

typedef struct rprompt {
    char name[64];
    char *text;
} rprompt;

typedef struct rctx {
    sqlite3 *db;
    int64_t run;
    int set;
    char policy[16], overall[16], created[32];
    double band;
    char spec[256], spec_sha[80], spec_path[512], art_path[1024], art_sha[80];
    int64_t art_size;
    char started[32], finished[32], host[256], version[64], mode[32], reference[128];
    char run_verdict[32];
    int steps, top_k, legs;
    int n_arms, n_prompts;
    rarm *arms;
    rprompt *prompts;
    sqlite3_stmt *kv;        /* key lookup */
} rctx;

int report_parse_format(const char *word, report_format *out, tg_err *e)
{
    static const char *const names[] = {"text", "md", "junit", "json"};
    for (int i = 0; i < 4; i++)
        if (word && !strcmp(word, names[i])) {
            *out = (report_format)i;
            return 0;
        }
    return tg_errf(e, "--format %s: expected text, md, junit or json", word ? word : "(none)");
}

static void cpy(char *dst, size_t cap, const unsigned char *src)
{
    snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

static void ctx_free(rctx *c)
{
    sqlite3_finalize(c->kv);
    for (int p = 0; p < c->n_prompts; p++) free(c->prompts[p].text);
    free(c->prompts);
    free(c->arms);
}

/* A key of the verdict set: arm / prompt NULL for the run level. Writes ""
 * when absent; returns 1 found, 0 absent. */
static int kv(rctx *c, const char *arm, const char *prompt, const char *key, char *out, size_t cap)
{
    sqlite3_stmt *s = c->kv;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, c->run);
    sqlite3_bind_int(s, 2, c->set);
    if (arm) sqlite3_bind_text(s, 3, arm, -1, SQLITE_STATIC); else sqlite3_bind_null(s, 3);
    if (prompt) sqlite3_bind_text(s, 4, prompt, -1, SQLITE_STATIC); else sqlite3_bind_null(s, 4);
    sqlite3_bind_text(s, 5, key, -1, SQLITE_STATIC);
    int found = sqlite3_step(s) == SQLITE_ROW;
    /* stored text may hold a worker's control bytes (older stores): never raw */
    common_text_safe(found ? (const char *)sqlite3_column_text(s, 0) : "", out, cap);
    sqlite3_reset(s);
    return found;
}

static int ctx_load(rctx *c, tg_store *st, int64_t run, int set, tg_err *e)
{
    memset(c, 0, sizeof *c);
    c->db = store_db(st);
    c->run = run;
    sqlite3_stmt *s = NULL;
    s = common_sql_prepare(c->db,
                           "SELECT spec.name, spec.sha256, spec.path, artifact.path, artifact.sha256,"
                           " artifact.size, run.started, run.finished, run.host, run.tokgate_version,"
                           " run.mode, run.reference, run.verdict, run.steps, run.top_k, run.legs"
                           " FROM run JOIN spec ON spec.id = run.spec_id"
                           " JOIN artifact ON artifact.id = run.artifact_id WHERE run.id=?1",
                           "I", run);
    if (!s)
        return common_sql_err(c->db, e, "reading the run");
    if (sqlite3_step(s) != SQLITE_ROW) {
        sqlite3_finalize(s);
        return tg_errf(e, "store: no run %lld", (long long)run);
    }
    cpy(c->spec, sizeof c->spec, sqlite3_column_text(s, 0));
    cpy(c->spec_sha, sizeof c->spec_sha, sqlite3_column_text(s, 1));
    cpy(c->spec_path, sizeof c->spec_path, sqlite3_column_text(s, 2));
    cpy(c->art_path, sizeof c->art_path, sqlite3_column_text(s, 3));
    cpy(c->art_sha, sizeof c->art_sha, sqlite3_column_text(s, 4));
    c->art_size = sqlite3_column_int64(s, 5);
    cpy(c->started, sizeof c->started, sqlite3_column_text(s, 6));
    cpy(c->finished, sizeof c->finished, sqlite3_column_text(s, 7));
    cpy(c->host, sizeof c->host, sqlite3_column_text(s, 8));
    cpy(c->version, sizeof c->version, sqlite3_column_text(s, 9));
    cpy(c->mode, sizeof c->mode, sqlite3_column_text(s, 10));
    cpy(c->reference, sizeof c->reference, sqlite3_column_text(s, 11));
    cpy(c->run_verdict, sizeof c->run_verdict, sqlite3_column_text(s, 12));
    c->steps = sqlite3_column_int(s, 13);
    c->top_k = sqlite3_column_int(s, 14);
    c->legs = sqlite3_column_int(s, 15);
    sqlite3_finalize(s);

    if (set == 0 && verdict_latest_set(st, run, &set, e) < 0) return -1;
    if (set == 0)
        return tg_errf(e, "run %lld has no verdicts: run `tokgate rescore %lld`", (long long)run,
                       (long long)run);
    c->set = set;
    s = common_sql_prepare(c->db,
                           "SELECT policy, band, overall, created FROM verdict_set"
                           " WHERE run_id=?1 AND set_no=?2",
                           "Ii", run, set);
    if (!s)
        return common_sql_err(c->db, e, "reading the verdict set");
    if (sqlite3_step(s) != SQLITE_ROW) {
        sqlite3_finalize(s);
        return tg_errf(e, "run %lld has no verdict set %d", (long long)run, set);
    }
    cpy(c->policy, sizeof c->policy, sqlite3_column_text(s, 0));
    c->band = sqlite3_column_double(s, 1);
    cpy(c->overall, sizeof c->overall, sqlite3_column_text(s, 2));
    cpy(c->created, sizeof c->created, sqlite3_column_text(s, 3));
    sqlite3_finalize(s);

    if (sqlite3_prepare_v2(c->db,
                           "SELECT value FROM verdict WHERE run_id=?1 AND set_no=?2 AND arm IS ?3"
                           " AND prompt IS ?4 AND key=?5 ORDER BY id DESC LIMIT 1",
                           -1, &c->kv, NULL) != SQLITE_OK)
        return common_sql_err(c->db, e, "reading the verdict keys");

    if (sqlite3_prepare_v2(c->db, "SELECT name, role, kind FROM arm WHERE run_id=?1 ORDER BY id", -1,
                           &s, NULL) != SQLITE_OK)
        return common_sql_err(c->db, e, "reading the arms");
    sqlite3_bind_int64(s, 1, run);
    while (sqlite3_step(s) == SQLITE_ROW) {
        c->arms = xrealloc(c->arms, sizeof *c->arms * (size_t)(c->n_arms + 1));
        rarm *a = &c->arms[c->n_arms++];
        memset(a, 0, sizeof *a);
        cpy(a->name, sizeof a->name, sqlite3_column_text(s, 0));
        cpy(a->role, sizeof a->role, sqlite3_column_text(s, 1));
        cpy(a->kind, sizeof a->kind, sqlite3_column_text(s, 2));
        a->is_ref = !strcmp(a->name, c->reference);
        a->is_custody = !strcmp(a->role, "custody");
    }
    sqlite3_finalize(s);
    for (int i = 0; i < c->n_arms; i++) {
        char v[32];
        kv(c, c->arms[i].name, NULL, "SCORED_LEG", v, sizeof v);
        c->arms[i].scored_leg = v[0] ? atoi(v) : 1;
    }
    if (sqlite3_prepare_v2(c->db, "SELECT name, text FROM prompt WHERE run_id=?1 ORDER BY no", -1, &s,
                           NULL) != SQLITE_OK)
        return common_sql_err(c->db, e, "reading the prompts");
    sqlite3_bind_int64(s, 1, run);
    while (sqlite3_step(s) == SQLITE_ROW) {
        c->prompts = xrealloc(c->prompts, sizeof *c->prompts * (size_t)(c->n_prompts + 1));
        rprompt *p = &c->prompts[c->n_prompts++];
        cpy(p->name, sizeof p->name, sqlite3_column_text(s, 0));
        const unsigned char *t = sqlite3_column_text(s, 1);
        p->text = xstrdup((const char *)t);
    }
    sqlite3_finalize(s);
    return 0;
}

/* An arm that gets a TOKEN_GATE (not the reference, not custody). */
static int scored(const rarm *a)
{
    return !a->is_ref && !a->is_custody;
}

/* ------------------------------------------------------------------ */
/* Keys                                                                */

static const char *const GLOBAL_KEYS[] = {
    "TOKEN_GATE", "TOKENIZER_DIVERGENCES", "GENERATION_DIVERGENCES", "LEGS_CLEAN",
    "LEGS_IDENTICAL", "ORACLE_REPRO", "CHAIN_OF_CUSTODY", "REFERENCE_TIER_HITS", "DEVICE_OPS",
    "ERROR_BUDGET", "REPLAY"};
enum { N_GLOBAL_KEYS = sizeof GLOBAL_KEYS / sizeof *GLOBAL_KEYS };

static void keys_block(rctx *c, FILE *out)
{
    char v[1024];
    for (int i = 0; i < N_GLOBAL_KEYS; i++) {
        if (kv(c, NULL, NULL, GLOBAL_KEYS[i], v, sizeof v)) fprintf(out, "%s=%s\n", GLOBAL_KEYS[i], v);
        /* why the run as a whole is not measurable (unfinished, reference not clean) */
        if (i == 0 && kv(c, NULL, NULL, "REASON", v, sizeof v)) fprintf(out, "REASON=%s\n", v);
    }
    for (int a = 0; a < c->n_arms; a++)
        for (int i = 0; i < N_GLOBAL_KEYS; i++)
            if (kv(c, c->arms[a].name, NULL, GLOBAL_KEYS[i], v, sizeof v))
                fprintf(out, "ARM.%s.%s=%s\n", c->arms[a].name, GLOBAL_KEYS[i], v);
}

int report_write_keys(tg_store *st, int64_t run_id, int verdict_set, FILE *out, tg_err *e)
{
    rctx c;
    int rc = -1;
    if (ctx_load(&c, st, run_id, verdict_set, e) < 0) goto out;
    keys_block(&c, out);
    rc = ferror(out) ? tg_errf(e, "report: write error") : 0;
out:
    ctx_free(&c);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Shared queries                                                      */

typedef struct apsum {
    int count[CMP_N_CLASSES];
    int compared;
    char verdict[32], reason[256], tokenizer[16];
    int first_diff;
    /* the compare row at first_diff */
    int token, ref_token, rank;
    double ref_gap, own_gap;
    char cls[16];
} apsum;

static void ap_summary(rctx *c, const rarm *a, const char *prompt, apsum *s)
{
    memset(s, 0, sizeof *s);
    char v[256];
    kv(c, a->name, prompt, "TOKEN_GATE", s->verdict, sizeof s->verdict);
    kv(c, a->name, prompt, "REASON", s->reason, sizeof s->reason);
    kv(c, a->name, prompt, "TOKENIZER", s->tokenizer, sizeof s->tokenizer);
    s->first_diff = kv(c, a->name, prompt, "FIRST_DIFF", v, sizeof v) ? atoi(v) : -1;
    s->ref_gap = s->own_gap = NAN;
    sqlite3_stmt *q = NULL;
    if ((q = common_sql_prepare(c->db,
                                "SELECT class, count(*) FROM compare WHERE run_id=?1 AND set_no=?2"
                                " AND arm=?3 AND leg=?4 AND prompt=?5 GROUP BY class",
                                "Iitit", c->run, c->set, a->name, a->scored_leg, prompt))) {
        while (sqlite3_step(q) == SQLITE_ROW) {
            const char *cls = (const char *)sqlite3_column_text(q, 0);
            for (int k = 0; k < CMP_N_CLASSES; k++)
                if (cls && !strcmp(cls, compare_class_name((cmp_class)k))) {
                    s->count[k] = sqlite3_column_int(q, 1);
                    if (k != CMP_UNCOMPARABLE) s->compared += s->count[k];
                }
        }
    }
    sqlite3_finalize(q);
    if (s->first_diff < 0) return;
    if ((q = common_sql_prepare(c->db,
                                "SELECT token, ref_token, rank, ref_gap, own_gap, class FROM compare"
                                " WHERE run_id=?1 AND set_no=?2 AND arm=?3 AND leg=?4 AND prompt=?5"
                                " AND step=?6",
                                "Iititi", c->run, c->set, a->name, a->scored_leg, prompt, s->first_diff))) {
        if (sqlite3_step(q) == SQLITE_ROW) {
            s->token = sqlite3_column_int(q, 0);
            s->ref_token = sqlite3_column_int(q, 1);
            s->rank = sqlite3_column_int(q, 2);
            s->ref_gap = sqlite3_column_type(q, 3) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 3);
            s->own_gap = sqlite3_column_type(q, 4) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 4);
            cpy(s->cls, sizeof s->cls, sqlite3_column_text(q, 5));
        }
    }
    sqlite3_finalize(q);
}

/* Iterates the contested steps in prompt order. */
static sqlite3_stmt *contested_q(rctx *c)
{
    sqlite3_stmt *q = NULL;
    q = common_sql_prepare(c->db,
                           "SELECT k.prompt, k.step, k.oracle_split, k.tokens, k.sentence"
                           " FROM contested k JOIN prompt p ON p.run_id = k.run_id AND p.name = k.prompt"
                           " WHERE k.run_id=?1 AND k.set_no=?2 ORDER BY p.no, k.step",
                           "Ii", c->run, c->set);
    if (!q)
        return NULL;
    return q;
}

/* Near-tie steps: (prompt, step, reference gap) of the reference's leg 1
 * whose gap is below the band, with each scored arm's token on its scored
 * leg. */
static sqlite3_stmt *near_tie_q(rctx *c)
{
    sqlite3_stmt *q = NULL;
    q = common_sql_prepare(c->db,
                           "SELECT c.prompt, c.step, c.ref_gap, c.arm, c.token, c.ref_token, c.class"
                           " FROM compare c JOIN prompt p ON p.run_id = c.run_id AND p.name = c.prompt"
                           " WHERE c.run_id=?1 AND c.set_no=?2 AND c.ref_gap < ?3"
                           " AND c.class <> 'UNCOMPARABLE'"
                           " AND c.leg = coalesce((SELECT CAST(v.value AS INTEGER) FROM verdict v"
                           "   WHERE v.run_id = c.run_id AND v.set_no = c.set_no AND v.arm = c.arm"
                           "   AND v.prompt IS NULL AND v.key = 'SCORED_LEG'), 1)"
                           " ORDER BY p.no, c.step, c.arm",
                           "Iid", c->run, c->set, c->band);
    if (!q)
        return NULL;
    return q;
}

/* Rank histogram of arm a's scored leg into h[0..65] ([0] outside). */
static void rank_hist(rctx *c, const rarm *a, int h[66])
{
    memset(h, 0, sizeof(int) * 66);
    sqlite3_stmt *q = NULL;
    q = common_sql_prepare(c->db,
                           "SELECT rank, count(*) FROM compare WHERE run_id=?1 AND set_no=?2 AND arm=?3"
                           " AND leg=?4 AND class <> 'UNCOMPARABLE' GROUP BY rank",
                           "Iiti", c->run, c->set, a->name, a->scored_leg);
    if (!q)
        return;
    while (sqlite3_step(q) == SQLITE_ROW) {
        int r = sqlite3_column_int(q, 0);
        h[r < 0 ? 0 : r > 64 ? 65 : r] += sqlite3_column_int(q, 1);
    }
    sqlite3_finalize(q);
}

static void fmt_gap(char *out, size_t cap, double g)
{
    if (isfinite(g))
        snprintf(out, cap, "%.4f", g);
    else
        snprintf(out, cap, "-");
}

/* ------------------------------------------------------------------ */
/* Text                                                                */

/* The arm's policy rule counts, noise-band counts and paired rate tests
 * (verdict keys POLICY_DECIDED, NOISE_WITHIN, VARIANT_SEARCH, RATE_VS.*),
 * one line each, prefixed by indent. */
static void policy_lines(rctx *c, const rarm *arm, FILE *out, const char *indent)
{
    char v[1024], w[64];
    if (kv(c, arm->name, NULL, "POLICY_DECIDED", v, sizeof v))
        fprintf(out, "%s%-16s steps decided (policy %s): %s\n", indent, "", c->policy, v);
    if (kv(c, arm->name, NULL, "NOISE_WITHIN", v, sizeof v) &&
        kv(c, arm->name, NULL, "VARIANT_SEARCH", w, sizeof w))
        fprintf(out, "%s%-16s within the oracle's noise band: %s steps; another configuration"
                     " emitted its token outside the band (a search over configurations, not"
                     " counted as right): %s steps\n", indent, "", v, w);
    sqlite3_stmt *s = NULL;
    s = common_sql_prepare(c->db, "SELECT key, value FROM verdict WHERE run_id=?1 AND set_no=?2"
                                  " AND arm=?3 AND prompt IS NULL AND key LIKE 'RATE_VS.%' ORDER BY id",
                           "Iit", c->run, c->set, arm->name);
    if (!s)
        return;
    while (sqlite3_step(s) == SQLITE_ROW)
        fprintf(out, "%s%-16s rate vs %s: %s\n", indent, "", (const char *)sqlite3_column_text(s, 0) + 8,
                sqlite3_column_text(s, 1));
    sqlite3_finalize(s);
}

/* The arm table's EXACT cell: the arm's distance from exact arithmetic as
 * a multiple of the reference's (ERROR_BUDGET_RATIO), "1.00x" for the
 * reference, "(exact)" for the arbiter; padded to 9 columns. */
static void exact_cell(rctx *c, const rarm *arm, const char *arbiter, char *out, size_t cap)
{
    char r[128] = "", b[32] = "";
    if (!strcmp(arm->name, arbiter)) snprintf(r, sizeof r, "(exact)");
    else if (arm->is_ref) snprintf(r, sizeof r, "1.00x");
    else if (kv(c, arm->name, NULL, "ERROR_BUDGET_RATIO", r, sizeof r)) {
        kv(c, arm->name, NULL, "ERROR_BUDGET", b, sizeof b);
        snprintf(r, sizeof r, "%.2fx%s", atof(r), strcmp(b, "FAIL") ? "" : "!");
    } else snprintf(r, sizeof r, "-");
    snprintf(out, cap, "%-8s ", r);
}

static void text_report(rctx *c, FILE *out)
{
    char v[1024];
    fprintf(out, "tokgate run %lld  spec %s  (%s, reference %s, %d steps, top-%d, %d legs)\n",
            (long long)c->run, c->spec, c->mode, c->reference, c->steps, c->top_k, c->legs);
    fprintf(out, "verdict set %d: policy %s, band %g  ->  %s\n\n", c->set, c->policy, c->band,
            c->overall);
    char arbiter[128] = "";
    int exact_col = kv(c, NULL, NULL, "EXACT_ARBITER", arbiter, sizeof arbiter);
    fprintf(out, "%-16s %-10s %-15s %-11s %-9s %s%s\n", "ARM", "ROLE", "VERDICT", "LEGS_CLEAN",
            "IDENTICAL", exact_col ? "EXACT    " : "", "REASON");
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        char verdict[32], lc[32], li[8], ex[32] = "";
        if (!kv(c, arm->name, NULL, "TOKEN_GATE", verdict, sizeof verdict))
            snprintf(verdict, sizeof verdict, "%s", arm->is_ref ? "(reference)" : "(custody)");
        kv(c, arm->name, NULL, "LEGS_CLEAN", lc, sizeof lc);
        kv(c, arm->name, NULL, "LEGS_IDENTICAL", li, sizeof li);
        if (!kv(c, arm->name, NULL, "REASON", v, sizeof v) && arm->is_custody)
            kv(c, arm->name, NULL, "CHAIN_OF_CUSTODY", v, sizeof v);
        if (exact_col) exact_cell(c, arm, arbiter, ex, sizeof ex);
        fprintf(out, "%-16s %-10s %-15s %-11s %-9s %s%s\n", arm->name,
                arm->is_ref ? "reference" : arm->role, verdict, lc, li, ex, v);
    }
    fprintf(out, "\n%-16s %-8s %-15s %5s %5s %4s %5s %4s %4s %4s  %-6s %7s %7s %8s %8s %s\n", "ARM",
            "PROMPT", "VERDICT", "STEPS", "EXACT", "NEAR", "RANK2", "TOPK", "OUT", "UNC", "FIRST",
            "REF", "ARM", "REF_GAP", "OWN_GAP", "CLASS");
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        if (!scored(arm)) continue;
        for (int p = 0; p < c->n_prompts; p++) {
            apsum s;
            ap_summary(c, arm, c->prompts[p].name, &s);
            char fd[16] = "-", rt[16] = "-", at[16] = "-", rg[16] = "-", og[16] = "-";
            if (s.first_diff >= 0) {
                snprintf(fd, sizeof fd, "%d", s.first_diff);
                snprintf(rt, sizeof rt, "%d", s.ref_token);
                snprintf(at, sizeof at, "%d", s.token);
                fmt_gap(rg, sizeof rg, s.ref_gap);
                fmt_gap(og, sizeof og, s.own_gap);
            }
            fprintf(out, "%-16s %-8s %-15s %5d %5d %4d %5d %4d %4d %4d  %-6s %7s %7s %8s %8s %s\n",
                    arm->name, c->prompts[p].name, s.verdict, s.compared, s.count[CMP_EXACT],
                    s.count[CMP_NEAR_TIE], s.count[CMP_RANK2], s.count[CMP_TOPK],
                    s.count[CMP_OUTSIDE], s.count[CMP_UNCOMPARABLE], fd, rt, at, rg, og,
                    s.first_diff >= 0 ? s.cls : "");
        }
    }
    for (int a = 0; a < c->n_arms; a++)
        for (int p = 0; p < c->n_prompts; p++) {
            const rarm *arm = &c->arms[a];
            if (!scored(arm)) continue;
            char verdict[32], reason[512];
            kv(c, arm->name, c->prompts[p].name, "TOKEN_GATE", verdict, sizeof verdict);
            if (strcmp(verdict, "PASS") && kv(c, arm->name, c->prompts[p].name, "REASON", reason, sizeof reason))
                fprintf(out, "  %s %s: %s\n", arm->name, c->prompts[p].name, reason);
        }

    fprintf(out, "\ncontested steps (four-way resolution):\n");
    sqlite3_stmt *q = contested_q(c);
    int n = 0;
    while (q && sqlite3_step(q) == SQLITE_ROW) {
        fprintf(out, "  %s/%d%s  %s\n      %s\n", sqlite3_column_text(q, 0), sqlite3_column_int(q, 1),
                sqlite3_column_int(q, 2) ? "  ORACLE_SPLIT" : "", sqlite3_column_text(q, 4),
                sqlite3_column_text(q, 3));
        n++;
    }
    sqlite3_finalize(q);
    if (!n) fprintf(out, "  none: every arm emits the reference's token at every step\n");

    fprintf(out, "\nnear-tie set (reference gap < %g):\n", c->band);
    q = near_tie_q(c);
    n = 0;
    char last[96] = "";
    while (q && sqlite3_step(q) == SQLITE_ROW) {
        char here[96];
        snprintf(here, sizeof here, "%s/%d", sqlite3_column_text(q, 0), sqlite3_column_int(q, 1));
        if (strcmp(here, last)) {
            fprintf(out, "%s  %-10s gap %.4f ", n ? "\n" : "", here, sqlite3_column_double(q, 2));
            snprintf(last, sizeof last, "%s", here);
            n++;
        }
        fprintf(out, " %s=%s", sqlite3_column_text(q, 3),
                sqlite3_column_int(q, 4) == sqlite3_column_int(q, 5) ? "won" : "lost");
    }
    sqlite3_finalize(q);
    fprintf(out, n ? "\n" : "  none\n");
    for (int a = 0; a < c->n_arms; a++)
        if (scored(&c->arms[a]) && kv(c, c->arms[a].name, NULL, "NEAR_TIES_WON", v, sizeof v))
            fprintf(out, "  %s won %s near-tie steps\n", c->arms[a].name, v);

    fprintf(out, "\nstatistics (scored leg of each arm):\n");
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        if (!scored(arm)) continue;
        char rate[128], kl[64], same[64];
        kv(c, arm->name, NULL, "DIVERGENCE_RATE", rate, sizeof rate);
        kv(c, arm->name, NULL, "KL_MEAN", kl, sizeof kl);
        kv(c, arm->name, NULL, "SAME_TOP1", same, sizeof same);
        fprintf(out, "  %-16s divergence rate %s (95%% Wilson)  KL mean %s  same top-1 %s\n",
                arm->name, rate, kl, same);
        int h[66];
        rank_hist(c, arm, h);
        fprintf(out, "  %-16s ranks:", "");
        for (int r = 1; r <= 65; r++)
            if (h[r]) fprintf(out, r == 65 ? " >64:%d" : " %d:%d", r == 65 ? h[r] : r, h[r]);
        fprintf(out, " outside:%d\n", h[0]);
        policy_lines(c, arm, out, "  ");
    }
    calibrate_report(c->db, c->run, c->set, 0, out);
    fprintf(out, "\n");
    keys_block(c, out);
}

/* ------------------------------------------------------------------ */
/* Markdown                                                            */

static void md_cell(FILE *out, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", out);
        else if (*s == '\n') fputc(' ', out);
        else if (*s == '<') fputs("&lt;", out);
        else if ((unsigned char)*s < 0x20 || *s == 0x7f) fprintf(out, "\\x%02x", (unsigned char)*s);
        else fputc(*s, out);
    }
}

static void md_report(rctx *c, FILE *out)
{
    char v[1024];
    fprintf(out, "# tokgate evidence: %s, run %lld\n\n", c->spec, (long long)c->run);
    fprintf(out, "**TOKEN_GATE=%s** (verdict set %d, policy %s, band %g)\n\n", c->overall, c->set,
            c->policy, c->band);
    fprintf(out, "## Identity\n\n| item | value |\n|---|---|\n");
    fprintf(out, "| spec | `");
    md_cell(out, c->spec);
    fprintf(out, "` (`");
    md_cell(out, c->spec_path);
    fprintf(out, "`) |\n| spec sha256 | `%s` |\n| artifact | `", c->spec_sha);
    md_cell(out, c->art_path);
    fprintf(out, "` (%lld bytes) |\n| artifact sha256 | `%s` |\n", (long long)c->art_size, c->art_sha);
    fprintf(out, "| tokgate | `");
    md_cell(out, c->version);
    fprintf(out, "` |\n| host | `");
    md_cell(out, c->host);
    fprintf(out, "` |\n| started / finished | %s / %s |\n", c->started, c->finished);
    fprintf(out, "| mode / reference | %s / %s |\n| steps / top-k / legs | %d / %d / %d |\n\n", c->mode,
            c->reference, c->steps, c->top_k, c->legs);
    fprintf(out, "| arm | role | kind | binary | sha256 | version | device |\n|---|---|---|---|---|---|---|\n");
    sqlite3_stmt *q = NULL;
    if ((q = common_sql_prepare(c->db,
                                "SELECT DISTINCT arm.name, arm.role, arm.kind, binary.path, binary.sha256,"
                                " binary.version, leg.device FROM leg JOIN arm ON arm.id = leg.arm_id"
                                " LEFT JOIN binary ON binary.id = leg.binary_id WHERE leg.run_id=?1"
                                " ORDER BY arm.id",
                                "I", c->run))) {
        while (sqlite3_step(q) == SQLITE_ROW) {
            fputs("|", out);
            for (int i = 0; i < 7; i++) {
                fputs(i == 3 || i == 4 ? " `" : " ", out);
                md_cell(out, (const char *)sqlite3_column_text(q, i));
                fputs(i == 3 || i == 4 ? "` |" : " |", out);
            }
            fputs("\n", out);
        }
    }
    sqlite3_finalize(q);

    fprintf(out, "\n## Verdicts\n\n| arm | role | verdict | legs clean | identical | reason |\n"
                 "|---|---|---|---|---|---|\n");
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        char verdict[32], lc[32], li[8];
        if (!kv(c, arm->name, NULL, "TOKEN_GATE", verdict, sizeof verdict))
            snprintf(verdict, sizeof verdict, "%s", arm->is_ref ? "(reference)" : "(custody)");
        kv(c, arm->name, NULL, "LEGS_CLEAN", lc, sizeof lc);
        kv(c, arm->name, NULL, "LEGS_IDENTICAL", li, sizeof li);
        if (!kv(c, arm->name, NULL, "REASON", v, sizeof v) && arm->is_custody)
            kv(c, arm->name, NULL, "CHAIN_OF_CUSTODY", v, sizeof v);
        fprintf(out, "| %s | %s | %s | %s | %s | ", arm->name, arm->is_ref ? "reference" : arm->role,
                verdict, lc, li);
        md_cell(out, v);
        fputs(" |\n", out);
    }
    fprintf(out, "\n## Arm x prompt\n\n| arm | prompt | verdict | steps | EXACT | NEAR_TIE | RANK2 | "
                 "TOPK | OUTSIDE | first diff | ref token | arm token | ref gap | own gap | class |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        if (!scored(arm)) continue;
        for (int p = 0; p < c->n_prompts; p++) {
            apsum s;
            ap_summary(c, arm, c->prompts[p].name, &s);
            char rg[16] = "", og[16] = "";
            fmt_gap(rg, sizeof rg, s.ref_gap);
            fmt_gap(og, sizeof og, s.own_gap);
            fprintf(out, "| %s | %s | %s | %d | %d | %d | %d | %d | %d | ", arm->name,
                    c->prompts[p].name, s.verdict, s.compared, s.count[CMP_EXACT],
                    s.count[CMP_NEAR_TIE], s.count[CMP_RANK2], s.count[CMP_TOPK],
                    s.count[CMP_OUTSIDE]);
            if (s.first_diff >= 0)
                fprintf(out, "%d | %d | %d | %s | %s | %s |\n", s.first_diff, s.ref_token, s.token, rg,
                        og, s.cls);
            else
                fprintf(out, "- | | | | | |\n");
        }
    }
    fprintf(out, "\n## Contested steps\n\n| step | oracle split | tokens | resolution |\n|---|---|---|---|\n");
    q = contested_q(c);
    int n = 0;
    while (q && sqlite3_step(q) == SQLITE_ROW) {
        fprintf(out, "| %s/%d | %s | ", sqlite3_column_text(q, 0), sqlite3_column_int(q, 1),
                sqlite3_column_int(q, 2) ? "ORACLE_SPLIT" : "");
        md_cell(out, (const char *)sqlite3_column_text(q, 3));
        fputs(" | ", out);
        md_cell(out, (const char *)sqlite3_column_text(q, 4));
        fputs(" |\n", out);
        n++;
    }
    sqlite3_finalize(q);
    if (!n) fprintf(out, "| - | | | none |\n");

    fprintf(out, "\n## Near-tie set (reference gap < %g)\n\n", c->band);
    for (int a = 0; a < c->n_arms; a++)
        if (scored(&c->arms[a]) && kv(c, c->arms[a].name, NULL, "NEAR_TIES_WON", v, sizeof v))
            fprintf(out, "- %s won %s\n", c->arms[a].name, v);

    fprintf(out, "\n## Statistics\n\n| arm | divergence rate [95%% Wilson] | KL mean | same top-1 |\n"
                 "|---|---|---|---|\n");
    int n_sc = 0;
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        if (!scored(arm)) continue;
        n_sc++;
        char rate[128], kl[64], same[64];
        kv(c, arm->name, NULL, "DIVERGENCE_RATE", rate, sizeof rate);
        kv(c, arm->name, NULL, "KL_MEAN", kl, sizeof kl);
        kv(c, arm->name, NULL, "SAME_TOP1", same, sizeof same);
        fprintf(out, "| %s | %s | %s | %s |\n", arm->name, rate, kl, same);
    }
    fprintf(out, "\nPolicy rules, the oracle's noise band and paired rate tests:\n\n```\n");
    for (int a = 0; a < c->n_arms; a++)
        if (scored(&c->arms[a])) {
            fprintf(out, "%s\n", c->arms[a].name);
            policy_lines(c, &c->arms[a], out, "");
        }
    fprintf(out, "```\n");

    /* rank histogram: groups 1, 2, 3-5, 6-k, outside */
    static const char *const groups[] = {"1", "2", "3-5", "6-64", ">64", "outside"};
    const char **series = xcalloc((size_t)n_sc, sizeof *series);
    double *vals = xcalloc((size_t)n_sc * 6, sizeof *vals);
    int s = 0;
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        if (!scored(arm)) continue;
        int h[66];
        rank_hist(c, arm, h);
        series[s] = arm->name;
        vals[s * 6 + 0] = h[1];
        vals[s * 6 + 1] = h[2];
        for (int r = 3; r <= 5; r++) vals[s * 6 + 2] += h[r];
        for (int r = 6; r <= 64; r++) vals[s * 6 + 3] += h[r];
        vals[s * 6 + 4] = h[65];
        vals[s * 6 + 5] = h[0];
        s++;
    }
    fprintf(out, "\n### Rank of each arm's token in the reference top-k (counts on a log axis)\n\n");
    if (series && vals) svg_bars_log(out, "rank histogram", 6, groups, n_sc, series, vals);
    free(series);
    free(vals);

    /* gap vs step: reference leg 1, divergences of any scored arm marked */
    fprintf(out, "\n### Reference gap (top1 - top2) per step, divergences marked\n\n");
    int cap = 0, m = 0;
    double *xs = NULL, *ys = NULL;
    int *mk = NULL;
    if ((q = common_sql_prepare(c->db,
                                "SELECT p.no, c.step, max(c.ref_gap), max(c.class NOT IN ('EXACT','UNCOMPARABLE'))"
                                " FROM compare c JOIN prompt p ON p.run_id = c.run_id AND p.name = c.prompt"
                                " WHERE c.run_id=?1 AND c.set_no=?2 AND c.class <> 'UNCOMPARABLE'"
                                " GROUP BY p.no, c.step ORDER BY p.no, c.step",
                                "Ii", c->run, c->set))) {
        while (sqlite3_step(q) == SQLITE_ROW) {
            if (m == cap) {
                cap = cap ? 2 * cap : 256;
                xs = xrealloc(xs, sizeof *xs * (size_t)cap);
                ys = xrealloc(ys, sizeof *ys * (size_t)cap);
                mk = xrealloc(mk, sizeof *mk * (size_t)cap);
            }
            xs[m] = sqlite3_column_int(q, 1);
            ys[m] = sqlite3_column_type(q, 2) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 2);
            mk[m] = sqlite3_column_int(q, 3);
            m++;
        }
    }
    sqlite3_finalize(q);
    svg_scatter(out, "reference gap per step (all prompts)", "step", "gap (logits)", m, xs, ys, mk,
                c->band);
    free(xs), free(ys), free(mk);

    calibrate_report(c->db, c->run, c->set, 1, out);
    fprintf(out, "\n## Keys\n\n```\n");
    keys_block(c, out);
    fprintf(out, "```\n\nEvery figure here is recomputable from the store with sqlite3: "
                 "see docs/store.md.\n");
}

/* ------------------------------------------------------------------ */
/* JUnit                                                               */

static void junit_report(rctx *c, FILE *out)
{
    int tests = 0, failures = 0, errors = 0;
    for (int a = 0; a < c->n_arms; a++) {
        if (!scored(&c->arms[a])) continue;
        for (int p = 0; p < c->n_prompts; p++) {
            char v[32];
            kv(c, c->arms[a].name, c->prompts[p].name, "TOKEN_GATE", v, sizeof v);
            tests++;
            failures += !strcmp(v, "FAIL");
            errors += strcmp(v, "FAIL") && strcmp(v, "PASS");
        }
    }
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(out, "<testsuites name=\"tokgate\" tests=\"%d\" failures=\"%d\" errors=\"%d\">\n", tests,
            failures, errors);
    fprintf(out, "  <testsuite name=\"");
    svg_escape(out, c->spec);
    fprintf(out, "\" tests=\"%d\" failures=\"%d\" errors=\"%d\" timestamp=\"%s\" hostname=\"", tests,
            failures, errors, c->started);
    svg_escape(out, c->host);
    fprintf(out, "\">\n");
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        if (!scored(arm)) continue;
        for (int p = 0; p < c->n_prompts; p++) {
            apsum s;
            ap_summary(c, arm, c->prompts[p].name, &s);
            fprintf(out, "    <testcase classname=\"tokgate.");
            svg_escape(out, arm->name);
            fprintf(out, "\" name=\"");
            svg_escape(out, c->prompts[p].name);
            fprintf(out, "\">");
            if (strcmp(s.verdict, "PASS")) {
                int fail = !strcmp(s.verdict, "FAIL");
                char msg[768];
                if (s.first_diff >= 0)
                    snprintf(msg, sizeof msg, "%s: first differing step %d: token %d, reference %d "
                                              "(%s, rank %d, reference gap %.4f); %s",
                             s.verdict, s.first_diff, s.token, s.ref_token, s.cls, s.rank, s.ref_gap,
                             s.reason);
                else
                    snprintf(msg, sizeof msg, "%s: %s", s.verdict, s.reason);
                fprintf(out, "\n      <%s type=\"%s\" message=\"", fail ? "failure" : "error",
                        s.verdict);
                svg_escape(out, msg);
                fprintf(out, "\">");
                svg_escape(out, msg);
                fprintf(out, "</%s>\n    ", fail ? "failure" : "error");
            }
            fprintf(out, "</testcase>\n");
        }
    }
    fprintf(out, "    <system-out>");
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (m) {
        keys_block(c, m);
        fclose(m);
        svg_escape(out, buf);
    }
    free(buf);
    fprintf(out, "</system-out>\n  </testsuite>\n</testsuites>\n");
}

/* ------------------------------------------------------------------ */
/* JSON                                                                */

static json_t *json_keys(rctx *c, const char *arm, const char *prompt)
{
    json_t *o = json_object();
    sqlite3_stmt *q = NULL;
    q = common_sql_prepare(c->db,
                           "SELECT key, value FROM verdict WHERE run_id=?1 AND set_no=?2 AND arm IS ?3"
                           " AND prompt IS ?4 ORDER BY id",
                           "Ii", c->run, c->set);
    if (!q)
        return o;
    if (arm) sqlite3_bind_text(q, 3, arm, -1, SQLITE_STATIC); else sqlite3_bind_null(q, 3);
    if (prompt) sqlite3_bind_text(q, 4, prompt, -1, SQLITE_STATIC); else sqlite3_bind_null(q, 4);
    while (sqlite3_step(q) == SQLITE_ROW)
        json_object_set_new(o, (const char *)sqlite3_column_text(q, 0),
                            json_string((const char *)sqlite3_column_text(q, 1)));
    sqlite3_finalize(q);
    return o;
}

static json_t *jreal(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static int json_report(rctx *c, FILE *out)
{
    json_t *root = json_object();
    json_t *run = json_pack("{s:I, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i}",
                            "id", (json_int_t)c->run, "spec", c->spec, "spec_sha256", c->spec_sha,
                            "artifact", c->art_path, "artifact_sha256", c->art_sha, "artifact_size",
                            (json_int_t)c->art_size, "started", c->started, "finished", c->finished,
                            "host", c->host, "tokgate_version", c->version, "mode", c->mode,
                            "reference", c->reference, "steps", c->steps, "top_k", c->top_k, "legs",
                            c->legs);
    json_object_set_new(root, "run", run ? run : json_null());
    json_object_set_new(root, "verdict_set",
                        json_pack("{s:i, s:s, s:f, s:s, s:s}", "set", c->set, "policy", c->policy,
                                  "band", c->band, "overall", c->overall, "created", c->created));
    json_object_set_new(root, "keys", json_keys(c, NULL, NULL));
    json_t *arms = json_array();
    for (int a = 0; a < c->n_arms; a++) {
        const rarm *arm = &c->arms[a];
        json_t *ja = json_pack("{s:s, s:s, s:s, s:i}", "name", arm->name, "role",
                               arm->is_ref ? "reference" : arm->role, "kind", arm->kind,
                               "scored_leg", arm->scored_leg);
        json_object_set_new(ja, "keys", json_keys(c, arm->name, NULL));
        json_t *prompts = json_array();
        for (int p = 0; p < c->n_prompts; p++) {
            json_t *jp = json_pack("{s:s}", "id", c->prompts[p].name);
            json_object_set_new(jp, "keys", json_keys(c, arm->name, c->prompts[p].name));
            if (scored(arm)) {
                apsum s;
                ap_summary(c, arm, c->prompts[p].name, &s);
                json_t *counts = json_object();
                for (int k = 0; k < CMP_N_CLASSES; k++)
                    json_object_set_new(counts, compare_class_name((cmp_class)k),
                                        json_integer(s.count[k]));
                json_object_set_new(jp, "classes", counts);
                json_object_set_new(jp, "compared", json_integer(s.compared));
                if (s.first_diff >= 0) {
                    json_t *fd = json_pack("{s:i, s:i, s:i, s:i, s:s}", "step", s.first_diff, "token",
                                           s.token, "ref_token", s.ref_token, "rank", s.rank, "class",
                                           s.cls);
                    json_object_set_new(fd, "ref_gap", jreal(s.ref_gap));
                    json_object_set_new(fd, "own_gap", jreal(s.own_gap));
                    json_object_set_new(jp, "first_diff", fd);
                } else {
                    json_object_set_new(jp, "first_diff", json_null());
                }
            }
            json_array_append_new(prompts, jp);
        }
        json_object_set_new(ja, "prompts", prompts);
        if (scored(arm)) {
            int h[66];
            rank_hist(c, arm, h);
            json_t *jh = json_object();
            for (int r = 0; r <= 65; r++) {
                if (!h[r]) continue;
                char k[16];
                snprintf(k, sizeof k, "%s", r == 0 ? "outside" : r == 65 ? ">64" : "");
                if (r > 0 && r < 65) snprintf(k, sizeof k, "%d", r);
                json_object_set_new(jh, k, json_integer(h[r]));
            }
            json_object_set_new(ja, "rank_histogram", jh);
        }
        json_array_append_new(arms, ja);
    }
    json_object_set_new(root, "arms", arms);
    json_t *cont = json_array();
    sqlite3_stmt *q = contested_q(c);
    while (q && sqlite3_step(q) == SQLITE_ROW)
        json_array_append_new(cont, json_pack("{s:s, s:i, s:b, s:s, s:s}", "prompt",
                                              (const char *)sqlite3_column_text(q, 0), "step",
                                              sqlite3_column_int(q, 1), "oracle_split",
                                              sqlite3_column_int(q, 2), "tokens",
                                              (const char *)sqlite3_column_text(q, 3), "sentence",
                                              (const char *)sqlite3_column_text(q, 4)));
    sqlite3_finalize(q);
    json_object_set_new(root, "contested", cont);
    json_t *near = json_array();
    q = near_tie_q(c);
    while (q && sqlite3_step(q) == SQLITE_ROW)
        json_array_append_new(near, json_pack("{s:s, s:i, s:f, s:s, s:i, s:i, s:b}", "prompt",
                                              (const char *)sqlite3_column_text(q, 0), "step",
                                              sqlite3_column_int(q, 1), "ref_gap",
                                              sqlite3_column_double(q, 2), "arm",
                                              (const char *)sqlite3_column_text(q, 3), "token",
                                              sqlite3_column_int(q, 4), "ref_token",
                                              sqlite3_column_int(q, 5), "won",
                                              sqlite3_column_int(q, 4) == sqlite3_column_int(q, 5)));
    sqlite3_finalize(q);
    json_object_set_new(root, "near_ties", near);
    int rc = json_dumpf(root, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    fputc('\n', out);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------ */

int report_write(tg_store *st, int64_t run_id, const report_options *opt, FILE *out, tg_err *e)
{
    rctx c;
    int rc = -1;
    report_options o = opt ? *opt : (report_options){REPORT_TEXT, 0};
    if (ctx_load(&c, st, run_id, o.verdict_set, e) < 0) goto out;
    switch (o.format) {
    case REPORT_TEXT: text_report(&c, out); break;
    case REPORT_MD: md_report(&c, out); break;
    case REPORT_JUNIT: junit_report(&c, out); break;
    case REPORT_JSON:
        if (json_report(&c, out) < 0) {
            tg_errf(e, "report: writing JSON failed");
            goto out;
        }
        break;
    default: tg_errf(e, "report: unknown format %d", (int)o.format); goto out;
    }
    if (fflush(out) != 0 || ferror(out)) {
        tg_errf(e, "report: write error");
        goto out;
    }
    rc = 0;
out:
    ctx_free(&c);
    return rc;
}

int report_parse_step_ref(const char *ref, char prompt[64], int *step, tg_err *e)
{
    const char *slash = ref ? strrchr(ref, '/') : NULL;
    if (!slash || slash == ref || (size_t)(slash - ref) >= 64)
        return tg_errf(e, "step \"%s\": expected PROMPT/STEP, e.g. p1/45", ref ? ref : "");
    if (common_parse_int(slash + 1, 0, 1000000000, step) < 0)
        return tg_errf(e, "step \"%s\": expected a step number >= 0 after '/'", ref);
    memcpy(prompt, ref, (size_t)(slash - ref));
    prompt[slash - ref] = 0;
    return 0;
}

/* The step view's ROLE column: reference, test, oracle, or "variant of X". */
static void step_role(rctx *c, const rarm *arm, char *out, size_t cap)
{
    snprintf(out, cap, "%s", arm->is_ref ? "reference" : arm->role);
    sqlite3_stmt *s = NULL;
    s = common_sql_prepare(c->db, "SELECT json_extract(config, '$.variant_of') FROM arm"
                                  " WHERE run_id=?1 AND name=?2", "It", c->run, arm->name);
    if (!s)
        return;
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) == SQLITE_TEXT)
        snprintf(out, cap, "variant of %.40s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
}

/* The step view's NOISE column for a differing arm: which oracle variants
 * emit the same token (a search over configurations unless the class is
 * WITHIN_NOISE). */
static void step_noise(rctx *c, const char *arm, const char *prompt, int step, int rank, char *out,
                       size_t cap)
{
    (void)rank;
    sqlite3_stmt *s = NULL;
    out[0] = 0;
    s = common_sql_prepare(c->db,
                           "SELECT o.arm FROM compare o JOIN compare m ON m.run_id = o.run_id"
                           " AND m.set_no = o.set_no AND m.prompt = o.prompt AND m.step = o.step"
                           " JOIN arm ON arm.run_id = o.run_id AND arm.name = o.arm"
                           " WHERE o.run_id=?1 AND o.set_no=?2 AND m.arm=?3 AND o.prompt=?4"
                           " AND o.step=?5 AND o.arm <> m.arm AND o.token = m.token"
                           " AND json_extract(arm.config, '$.variant_of') IS NOT NULL"
                           " AND o.leg = (SELECT min(leg) FROM compare x WHERE x.run_id = o.run_id"
                           " AND x.set_no = o.set_no AND x.arm = o.arm) AND m.leg = (SELECT min(leg)"
                           " FROM compare y WHERE y.run_id = m.run_id AND y.set_no = m.set_no AND y.arm = m.arm)",
                           "Iitti", c->run, c->set, arm, prompt, step);
    if (!s)
        return;
    size_t k = 0;
    while (sqlite3_step(s) == SQLITE_ROW && k < cap)
        k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? "," : "also ", sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
}

/* The step's noise band line (noise_band rows), when the run has variants. */
static void step_band(rctx *c, const char *prompt, int step, FILE *out)
{
    sqlite3_stmt *s = NULL;
    s = common_sql_prepare(c->db,
                           "SELECT n_views, ref_gap, spread, tokens FROM noise_band WHERE run_id=?1"
                           " AND set_no=?2 AND prompt=?3 AND step=?4",
                           "Iiti", c->run, c->set, prompt, step);
    if (!s)
        return;
    if (sqlite3_step(s) == SQLITE_ROW) {
        char g[16], sp[16];
        fmt_gap(g, sizeof g, sqlite3_column_type(s, 1) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 1));
        fmt_gap(sp, sizeof sp, sqlite3_column_type(s, 2) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 2));
        fprintf(out, "noise band: %d oracle views (the reference and its variants), reference gap %s,"
                     " spread of that gap %s, top-1 tokens {%s}\n",
                sqlite3_column_int(s, 0), g, sp, sqlite3_column_text(s, 3));
    }
    sqlite3_finalize(s);
}

/* The text of the ids a step view shows, decoded with the vocabulary of the
 * run's artifact when that file is still where the run found it with the
 * same size. Display only: no verdict depends on it, and a missing or
 * unreadable artifact just leaves the line out. */
static void step_token_texts(const rctx *c, const int32_t *ids, int n, FILE *out)
{
    struct stat sb;
    if (!c->art_path[0] || stat(c->art_path, &sb) || sb.st_size != c->art_size || n <= 0) return;
    gguf *g = NULL;
    tg_tokenizer *t = NULL;
    tg_err e;
    if (gguf_open(&g, c->art_path, &e) || tg_tokenizer_from_gguf(&t, g, &e)) {
        gguf_close(g);
        return;
    }
    fprintf(out, "tokens:");
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= ids[j] == ids[i];
        if (seen || ids[i] < 0) continue;
        char *txt = NULL;
        size_t len = 0;
        if (tg_detokenize(t, &ids[i], 1, 1, &txt, &len, &e)) continue;
        fprintf(out, " %d=\"", ids[i]);
        for (size_t k = 0; k < len; k++) {
            unsigned char ch = (unsigned char)txt[k];
            if (ch == '"' || ch == '\\') fprintf(out, "\\%c", ch);
            else if (ch == '\n') fputs("\\n", out);
            else if (ch == '\t') fputs("\\t", out);
            else if (ch < 0x20 || ch == 0x7f) fprintf(out, "\\x%02x", ch);
            else fputc(ch, out);
        }
        fputc('"', out);
        free(txt);
    }
    fputc('\n', out);
    tg_tokenizer_free(t);
    gguf_close(g);
}

int report_step(tg_store *st, int64_t run_id, const char *prompt_id, int step, int verdict_set,
                FILE *out, tg_err *e)
{
    rctx c;
    int rc = -1;
    sqlite3_stmt *q = NULL;
    if (ctx_load(&c, st, run_id, verdict_set, e) < 0) goto out;
    int pi = -1;
    for (int p = 0; p < c.n_prompts; p++)
        if (!strcmp(c.prompts[p].name, prompt_id)) pi = p;
    if (pi < 0) {
        tg_errf(e, "step %s/%d: run %lld has no prompt %s", prompt_id, step, (long long)run_id,
                prompt_id);
        goto out;
    }
    if (sqlite3_prepare_v2(c.db,
                           "SELECT s.token, s.forced, s.gap, s.leg_id, s.prompt_id FROM v_step s"
                           " JOIN leg ON leg.id = s.leg_id JOIN arm ON arm.id = leg.arm_id"
                           " JOIN prompt p ON p.id = s.prompt_id"
                           " WHERE leg.run_id=?1 AND arm.name=?2 AND leg.leg=?3 AND p.name=?4"
                           " AND s.step=?5",
                           -1, &q, NULL) != SQLITE_OK) {
        common_sql_err(c.db, e, "reading the step");
        goto out;
    }
    fprintf(out, "run %lld %s/%d  (verdict set %d, policy %s, band %g)\n", (long long)run_id,
            prompt_id, step, c.set, c.policy, c.band);
    fprintf(out, "%-16s %-22s %-4s %8s %8s %12s %8s %12s %9s %9s %-13s %4s %s\n", "ARM", "ROLE", "LEG",
            "TOKEN", "TOP1", "LOGIT1", "TOP2", "LOGIT2", "OWN_GAP", "REF_GAP", "CLASS", "RANK", "NOISE");
    int shown = 0;
    int32_t shown_ids[3 * 64];
    int n_shown_ids = 0;
    for (int a = 0; a < c.n_arms; a++) {
        const rarm *arm = &c.arms[a];
        if (arm->is_custody) continue;
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, run_id);
        sqlite3_bind_text(q, 2, arm->name, -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 3, arm->scored_leg);
        sqlite3_bind_text(q, 4, prompt_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 5, step);
        if (sqlite3_step(q) != SQLITE_ROW) continue;
        shown++;
        tg_top top[4096];
        int n = 0;
        {
            store_tops tt;
            if (store_tops_read(c.db, sqlite3_column_int64(q, 3), sqlite3_column_int64(q, 4), &tt, e) < 0) {
                tg_err_prefix(e, "arm %s %s/%d", arm->name, prompt_id, step);
                goto out;
            }
            int k = store_tops_find(&tt, step);
            if (k >= 0) {
                n = tt.n_top[k] < 4096 ? tt.n_top[k] : 4096;
                memcpy(top, tt.top + tt.off[k], sizeof(tg_top) * (size_t)n);
            }
            store_tops_free(&tt);
        }
        char cls[16] = "reference", rank[8] = "1", rgap[16] = "-", noise[96] = "", role[64];
        step_role(&c, arm, role, sizeof role);
        if (!arm->is_ref) {
            sqlite3_stmt *cq = NULL;
            snprintf(cls, sizeof cls, "-");
            if ((cq = common_sql_prepare(c.db,
                                         "SELECT class, rank, ref_gap, token <> ref_token FROM compare"
                                         " WHERE run_id=?1 AND set_no=?2"
                                         " AND arm=?3 AND leg=?4 AND prompt=?5 AND step=?6",
                                         "Iititi", run_id, c.set, arm->name, arm->scored_leg, prompt_id, step))) {
                if (sqlite3_step(cq) == SQLITE_ROW) {
                    cpy(cls, sizeof cls, sqlite3_column_text(cq, 0));
                    snprintf(rank, sizeof rank, "%d", sqlite3_column_int(cq, 1));
                    fmt_gap(rgap, sizeof rgap, sqlite3_column_type(cq, 2) == SQLITE_NULL
                                                   ? NAN : sqlite3_column_double(cq, 2));
                    if (sqlite3_column_int(cq, 3)) step_noise(&c, arm->name, prompt_id, step,
                                                              sqlite3_column_int(cq, 1), noise, sizeof noise);
                }
            }
            sqlite3_finalize(cq);
        }
        char g[16];
        fmt_gap(g, sizeof g, sqlite3_column_type(q, 2) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 2));
        fprintf(out, "%-16s %-22s %-4d %8d ", arm->name, role, arm->scored_leg, sqlite3_column_int(q, 0));
        if (n_shown_ids + 3 <= (int)(sizeof shown_ids / sizeof *shown_ids)) {
            shown_ids[n_shown_ids++] = sqlite3_column_int(q, 0);
            for (int k = 0; k < 2 && k < n; k++) shown_ids[n_shown_ids++] = top[k].id;
        }
        if (n >= 1) fprintf(out, "%8d %12.6f ", top[0].id, top[0].logit);
        else fprintf(out, "%8s %12s ", "-", "-");
        if (n >= 2) fprintf(out, "%8d %12.6f ", top[1].id, top[1].logit);
        else fprintf(out, "%8s %12s ", "-", "-");
        if (arm->is_ref) snprintf(rgap, sizeof rgap, "%s", g);
        if (noise[0]) {
            char t[64];
            snprintf(t, sizeof t, "%s: %.48s", strcmp(cls, "WITHIN_NOISE") ? "search hit" : "in band", noise);
            snprintf(noise, sizeof noise, "%s", t);
        }
        fprintf(out, "%9s %9s %-13s %4s %s\n", g, rgap, cls, rank, noise);
    }
    sqlite3_finalize(q);
    q = NULL;
    if (!shown) {
        tg_errf(e, "step %s/%d: no arm of run %lld has that step", prompt_id, step, (long long)run_id);
        goto out;
    }
    if ((q = common_sql_prepare(c.db,
                                "SELECT oracle_split, tokens, sentence FROM contested WHERE run_id=?1"
                                " AND set_no=?2 AND prompt=?3 AND step=?4",
                                "Iiti", run_id, c.set, prompt_id, step))) {
        if (sqlite3_step(q) == SQLITE_ROW)
            fprintf(out, "contested%s: %s\n  %s\n", sqlite3_column_int(q, 0) ? " (ORACLE_SPLIT)" : "",
                    sqlite3_column_text(q, 2), sqlite3_column_text(q, 1));
        else
            fprintf(out, "not contested: every arm emits the reference's token\n");
    }
    step_band(&c, prompt_id, step, out);
    step_token_texts(&c, shown_ids, n_shown_ids, out);
    rc = ferror(out) ? tg_errf(e, "report: write error") : 0;
out:
    sqlite3_finalize(q);
    ctx_free(&c);
    return rc;
}
