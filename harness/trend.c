/*
 * trend.c: the history of specs across runs of one store (trend.h). Loads,
 * for one spec, every run on the latest run's artifact with its latest
 * verdict set, as a table run x arm of figures (verdict, divergences,
 * Wilson interval, near ties lost, largest lost gap, KL), then looks for
 * regressions of the latest run against each earlier one and prints the
 * history, the changes and the regressions.
 */
#include "trend.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "svg.h"
#include "verdict.h"

#define MAX_ARMS 32

/* The figures of one arm in one run. */
typedef struct arm_pt {
    int present;
    int gate;                /* 0 PASS, 1 NOT_MEASURABLE, 2 FAIL */
    char gate_word[16];
    int div_k, div_n;        /* GENERATION_DIVERGENCES */
    double lo, hi;           /* Wilson 95% interval of div_k / div_n */
    int near_n, near_won;    /* NEAR_TIES_WON */
    double max_lost_gap;     /* largest reference gap among lost steps; 0 when none */
    double kl;               /* KL_MEAN */
    int scored_leg;          /* SCORED_LEG */
} arm_pt;

typedef struct run_pt {
    int64_t id;
    char started[32];
    char overall[16];
    arm_pt arm[MAX_ARMS];
} run_pt;

typedef struct history {
    char artifact[65];
    int n_arms;
    char arms[MAX_ARMS][64];
    int n;
    run_pt *runs;            /* time order; runs[n - 1] is the latest */
} history;

static int sql_err(sqlite3 *db, tg_err *e, const char *what)
{
    return tg_errf(e, "trend: %s: %s", what, sqlite3_errmsg(db));
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

/* Reads one run's figures from verdict set set_no. Returns 0 or -1 with e. */
static int load_run(sqlite3 *db, history *h, run_pt *rp, int set_no, tg_err *e)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, "SELECT arm, key, value FROM verdict WHERE run_id=?1 AND set_no=?2"
                               " AND prompt IS NULL", -1, &s, NULL) != SQLITE_OK)
        return sql_err(db, e, "reading verdicts");
    sqlite3_bind_int64(s, 1, rp->id);
    sqlite3_bind_int(s, 2, set_no);
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
        verdict_wilson(p->div_k, p->div_n, &p->lo, &p->hi);
        int leg = p->scored_leg;
        if (sqlite3_prepare_v2(db, "SELECT max(ref_gap) FROM compare WHERE run_id=?1 AND set_no=?2 AND arm=?3"
                                   " AND leg=?4 AND class NOT IN ('EXACT', 'UNCOMPARABLE')",
                               -1, &s, NULL) != SQLITE_OK)
            return sql_err(db, e, "reading compare rows");
        sqlite3_bind_int64(s, 1, rp->id);
        sqlite3_bind_int(s, 2, set_no);
        sqlite3_bind_text(s, 3, h->arms[a], -1, SQLITE_STATIC);
        sqlite3_bind_int(s, 4, leg > 0 ? leg : 1);
        if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL)
            p->max_lost_gap = sqlite3_column_double(s, 0);
        sqlite3_finalize(s);
    }
    return 0;
}

/* Loads the history of spec_name. Returns 1 loaded, 0 no such spec, -1 with e. */
static int load_history(sqlite3 *db, const char *spec_name, history *h, tg_err *e)
{
    memset(h, 0, sizeof *h);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, "SELECT a.sha256 FROM run r JOIN spec s ON s.id = r.spec_id"
                               " JOIN artifact a ON a.id = r.artifact_id WHERE s.name = ?1"
                               " ORDER BY r.started DESC, r.id DESC LIMIT 1", -1, &s, NULL) != SQLITE_OK)
        return sql_err(db, e, "finding the latest run");
    sqlite3_bind_text(s, 1, spec_name, -1, SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_ROW) {
        sqlite3_finalize(s);
        return 0;
    }
    snprintf(h->artifact, sizeof h->artifact, "%s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    if (sqlite3_prepare_v2(db, "SELECT r.id, r.started, (SELECT max(set_no) FROM verdict_set v WHERE v.run_id = r.id)"
                               " FROM run r JOIN spec s ON s.id = r.spec_id JOIN artifact a ON a.id = r.artifact_id"
                               " WHERE s.name = ?1 AND a.sha256 = ?2 ORDER BY r.started, r.id", -1, &s, NULL) != SQLITE_OK)
        return sql_err(db, e, "listing runs");
    sqlite3_bind_text(s, 1, spec_name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, h->artifact, -1, SQLITE_STATIC);
    int cap = 0, rc = 1;
    while (sqlite3_step(s) == SQLITE_ROW) {
        if (sqlite3_column_type(s, 2) == SQLITE_NULL) continue;   /* never scored (an ERROR run) */
        if (h->n == cap) {
            cap = cap ? 2 * cap : 8;
            run_pt *r = realloc(h->runs, sizeof *r * (size_t)cap);
            if (!r) abort();
            h->runs = r;
        }
        run_pt *rp = &h->runs[h->n++];
        memset(rp, 0, sizeof *rp);
        rp->id = sqlite3_column_int64(s, 0);
        snprintf(rp->started, sizeof rp->started, "%s", (const char *)sqlite3_column_text(s, 1));
        if (load_run(db, h, rp, sqlite3_column_int(s, 2), e) < 0) {
            rc = -1;
            break;
        }
    }
    sqlite3_finalize(s);
    return rc;
}

/* Metrics and their regression rule: is x worse than y? */
enum { M_VERDICT, M_DIVERGENCE, M_KL, N_METRICS };
static const char *const METRIC_NAME[N_METRICS] = {"verdict", "divergence rate", "KL divergence"};

static int worse(int m, const arm_pt *x, const arm_pt *y)
{
    if (!x->present || !y->present) return 0;
    switch (m) {
    case M_VERDICT: return x->gate > y->gate;
    case M_DIVERGENCE: return x->div_n > 0 && y->div_n > 0 && x->lo > y->hi;
    case M_KL: return x->kl > TREND_KL_FACTOR * y->kl + TREND_KL_FLOOR;
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

int trend_spec(tg_store *st, const char *spec_name, int md, FILE *out, trend_result *r, tg_err *e)
{
    memset(r, 0, sizeof *r);
    sqlite3 *db = store_db(st);
    history h;
    int lr = load_history(db, spec_name, &h, e);
    if (lr <= 0) {
        free(h.runs);
        return lr < 0 ? -1 : tg_errf(e, "trend: the store has no run of spec '%s'", spec_name);
    }
    r->n_runs = h.n;
    const char *pre = md ? "    " : "  ";
    if (md) fprintf(out, "## %s\n\n", spec_name);
    else fprintf(out, "trend of %s\n", spec_name);
    fprintf(out, "%sartifact %.16s..., %d scored runs%s\n", md ? "" : "  ", h.artifact, h.n,
            h.n < 2 ? " (nothing to compare yet)" : "");
    if (md) fprintf(out, "\n");
    for (int a = 0; a < h.n_arms; a++) {
        int scored = 0;
        for (int i = 0; i < h.n; i++) scored |= h.runs[i].arm[a].present;
        if (!scored) continue;   /* the reference, custody arms */
        fprintf(out, "%sarm %s\n", pre, h.arms[a]);
        fprintf(out, "%s  %6s %-20s %-15s %-34s %10s %12s %10s\n", pre, "run", "started", "verdict",
                "divergences [95% interval]", "near lost", "max lost gap", "KL");
        for (int i = 0; i < h.n; i++) {
            const arm_pt *p = &h.runs[i].arm[a];
            if (!p->present) {
                fprintf(out, "%s  %6lld %-20s (not scored)\n", pre, (long long)h.runs[i].id, h.runs[i].started);
                continue;
            }
            char dv[64];
            describe(M_DIVERGENCE, p, dv, sizeof dv);
            char nl[24];
            snprintf(nl, sizeof nl, "%d/%d", p->near_n - p->near_won, p->near_n);
            fprintf(out, "%s  %6lld %-20s %-15s %-34s %10s %12.4f %10.3g\n", pre, (long long)h.runs[i].id,
                    h.runs[i].started, p->gate_word, dv, nl, p->max_lost_gap, p->kl);
        }
    }
    if (md) fprintf(out, "\n");
    if (h.n >= 2) {
        const run_pt *L = &h.runs[h.n - 1], *P = &h.runs[h.n - 2];
        for (int a = 0; a < h.n_arms; a++) {
            const arm_pt *x = &L->arm[a], *y = &P->arm[a];
            if (x->present != y->present) {
                fprintf(out, "%sCHANGE %s: %s in run %lld, %s in run %lld\n", md ? "- " : "  ", h.arms[a],
                        y->present ? "scored" : "absent", (long long)P->id, x->present ? "scored" : "absent",
                        (long long)L->id);
                r->n_changes++;
                continue;
            }
            if (!x->present) continue;
            char bx[96], by[96];
            for (int m = 0; m < N_METRICS; m++) {
                describe(m, x, bx, sizeof bx);
                describe(m, y, by, sizeof by);
                if (strcmp(bx, by) && !worse(m, x, y)) {
                    fprintf(out, "%sCHANGE %s: %s %s -> %s (run %lld -> %lld)\n", md ? "- " : "  ", h.arms[a],
                            METRIC_NAME[m], by, bx, (long long)P->id, (long long)L->id);
                    r->n_changes++;
                }
            }
            if (x->near_n - x->near_won != y->near_n - y->near_won) {
                fprintf(out, "%sCHANGE %s: near ties lost %d/%d -> %d/%d (run %lld -> %lld)\n", md ? "- " : "  ",
                        h.arms[a], y->near_n - y->near_won, y->near_n, x->near_n - x->near_won, x->near_n,
                        (long long)P->id, (long long)L->id);
                r->n_changes++;
            }
            if (x->max_lost_gap != y->max_lost_gap) {
                fprintf(out, "%sCHANGE %s: largest lost gap %.4f -> %.4f (run %lld -> %lld)\n", md ? "- " : "  ",
                        h.arms[a], y->max_lost_gap, x->max_lost_gap, (long long)P->id, (long long)L->id);
                r->n_changes++;
            }
        }
        /* regressions: the latest against every earlier run */
        for (int a = 0; a < h.n_arms; a++)
            for (int m = 0; m < N_METRICS; m++) {
                int B = -1;
                for (int j = h.n - 2; j >= 0 && B < 0; j--)
                    if (worse(m, &L->arm[a], &h.runs[j].arm[a])) B = j;
                if (B < 0) continue;
                int first = h.n - 1;
                for (int k = B + 1; k < h.n; k++)
                    if (worse(m, &h.runs[k].arm[a], &h.runs[B].arm[a])) {
                        first = k;
                        break;
                    }
                char bx[96], bb[96];
                describe(m, &L->arm[a], bx, sizeof bx);
                describe(m, &h.runs[B].arm[a], bb, sizeof bb);
                fprintf(out, "%sREGRESSION %s: %s %s in run %lld, was %s in run %lld; first in run %lld (%s)\n",
                        md ? "- **" : "  ", h.arms[a], METRIC_NAME[m], bx, (long long)L->id, bb,
                        (long long)h.runs[B].id, (long long)h.runs[first].id, h.runs[first].started);
                r->n_regressions++;
                if (!r->first_run || h.runs[first].id < r->first_run) r->first_run = h.runs[first].id;
            }
    }
    fprintf(out, "%sTREND=%s\n", md ? "\n" : "  ",
            r->n_regressions ? "REGRESSION" : h.n < 2 ? "FIRST" : "CLEAN");
    if (md) {
        fprintf(out, "\n");
        tg_err se;
        if (trend_svg(st, spec_name, out, &se) == 0) fprintf(out, "\n\n");
    }
    free(h.runs);
    return 0;
}

int trend_svg(tg_store *st, const char *spec_name, FILE *out, tg_err *e)
{
    history h;
    int lr = load_history(store_db(st), spec_name, &h, e);
    if (lr <= 0) {
        free(h.runs);
        return lr < 0 ? -1 : tg_errf(e, "trend: the store has no run of spec '%s'", spec_name);
    }
    static const char *const COLORS[] = {"#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    const int W = 640, H = 300, L = 60, R = 150, T = 30, B = 40;
    double ymax = 0.05;
    for (int i = 0; i < h.n; i++)
        for (int a = 0; a < h.n_arms; a++)
            if (h.runs[i].arm[a].present && h.runs[i].arm[a].hi > ymax) ymax = h.runs[i].arm[a].hi;
    ymax = ceil(ymax * 20) / 20;
    int pw = W - L - R, ph = H - T - B;
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    fprintf(out, "<text x=\"%d\" y=\"18\" font-size=\"13\">", L);
    svg_escape(out, spec_name);
    fprintf(out, ": divergence rate per run (95%% interval; red = FAIL)</text>\n");
    fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", L, T, pw, ph);
    for (int t = 0; t <= 4; t++) {
        double v = ymax * t / 4;
        int y = T + ph - (int)lround(ph * t / 4.0);
        fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.3f</text>\n", L - 4, y + 4, v);
    }
    for (int i = 0; i < h.n; i++) {
        double x = L + (h.n == 1 ? pw / 2.0 : pw * (i + 0.5) / h.n);
        fprintf(out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%lld</text>\n", x, T + ph + 14,
                (long long)h.runs[i].id);
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">run</text>\n", L + pw / 2, H - 6);
    for (int a = 0; a < h.n_arms; a++) {
        const char *c = COLORS[a % 6];
        double off = (a - (h.n_arms - 1) / 2.0) * 4;
        fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" points=\"", c);
        for (int i = 0; i < h.n; i++) {
            const arm_pt *p = &h.runs[i].arm[a];
            if (!p->present || !p->div_n) continue;
            double x = L + (h.n == 1 ? pw / 2.0 : pw * (i + 0.5) / h.n) + off;
            fprintf(out, "%.1f,%.1f ", x, T + ph - ph * ((double)p->div_k / p->div_n) / ymax);
        }
        fprintf(out, "\"/>\n");
        for (int i = 0; i < h.n; i++) {
            const arm_pt *p = &h.runs[i].arm[a];
            if (!p->present || !p->div_n) continue;
            double x = L + (h.n == 1 ? pw / 2.0 : pw * (i + 0.5) / h.n) + off;
            double y = T + ph - ph * ((double)p->div_k / p->div_n) / ymax;
            fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", x, x,
                    T + ph - ph * p->lo / ymax, T + ph - ph * p->hi / ymax, c);
            fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", x, y,
                    p->gate == 2 ? "#d62728" : c);
        }
        fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">",
                W - R + 10, T + 16 * a, c, W - R + 24, T + 16 * a + 9);
        svg_escape(out, h.arms[a]);
        fprintf(out, "</text>\n");
    }
    fprintf(out, "</svg>");
    free(h.runs);
    return ferror(out) ? tg_errf(e, "trend: write error") : 0;
}

int trend_main(int argc, char **argv)
{
    const char *db = "tokgate.db", *spec = NULL, *format = "text", *outp = NULL, *svgdir = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (spec) {
                fprintf(stderr, "tokgate: trend: unexpected argument '%s'\n(run `tokgate help` for usage)\n", a);
                return 2;
            }
            spec = a;
            continue;
        }
        if (i + 1 >= argc || (strcmp(a, "--db") && strcmp(a, "--format") && strcmp(a, "--out") && strcmp(a, "--svg"))) {
            fprintf(stderr, "tokgate: trend: unknown option or missing value '%s'\n(run `tokgate help` for usage)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--db")) db = v;
        else if (!strcmp(a, "--format")) format = v;
        else if (!strcmp(a, "--out")) outp = v;
        else svgdir = v;
    }
    if (strcmp(format, "text") && strcmp(format, "md")) {
        fprintf(stderr, "tokgate: trend: --format: expected text or md, got '%s'\n", format);
        return 2;
    }
    struct stat sb;
    if (stat(db, &sb) != 0) {
        fprintf(stderr, "tokgate: trend: %s: %s\n", db, strerror(errno));
        return 2;
    }
    tg_err e;
    tg_store *st;
    if (store_open(&st, db, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return 2;
    }
    FILE *out = outp ? fopen(outp, "w") : stdout;
    if (!out) {
        fprintf(stderr, "tokgate: trend: --out %s: %s\n", outp, strerror(errno));
        store_close(st);
        return 2;
    }
    int md = !strcmp(format, "md");
    if (md) fprintf(out, "# Trend of %s\n\n", spec ? spec : "every spec");
    int rc = 0, regress = 0;
    sqlite3_stmt *s = NULL;
    char **names = NULL;
    int n = 0;
    if (spec) {
        names = malloc(sizeof *names);
        if (!names) abort();
        names[n++] = strdup(spec);
    } else if (sqlite3_prepare_v2(store_db(st), "SELECT DISTINCT s.name FROM spec s JOIN run r ON r.spec_id = s.id"
                                                " ORDER BY s.name", -1, &s, NULL) == SQLITE_OK) {
        while (sqlite3_step(s) == SQLITE_ROW) {
            names = realloc(names, sizeof *names * (size_t)(n + 1));
            if (!names) abort();
            names[n++] = strdup((const char *)sqlite3_column_text(s, 0));
        }
        sqlite3_finalize(s);
    }
    if (n == 0) {
        fprintf(stderr, "tokgate: trend: the store %s has no runs\n", db);
        rc = 2;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        trend_result tr;
        if (trend_spec(st, names[i], md, out, &tr, &e) < 0) {
            fprintf(stderr, "tokgate: %s\n", e.msg);
            rc = 2;
            break;
        }
        if (!md) fprintf(out, "\n");
        regress += tr.n_regressions > 0;
        if (svgdir) {
            mkdir(svgdir, 0777);
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s-trend.svg", svgdir, names[i]);
            FILE *f = fopen(path, "w");
            if (!f || trend_svg(st, names[i], f, &e) < 0) {
                fprintf(stderr, "tokgate: trend: %s: %s\n", path, f ? e.msg : strerror(errno));
                rc = 2;
            }
            if (f && fclose(f) != 0) rc = 2;
        }
    }
    if (rc == 0) {
        fprintf(out, "%sTREND_SPECS=%d\nTREND_REGRESSIONS=%d\n", md ? "\n" : "", n, regress);
        rc = regress ? 1 : 0;
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (out != stdout && fclose(out) != 0) rc = 2;
    store_close(st);
    return rc;
}
