/*
 * calreport.c: the calibration section of the reports (calibrate.h),
 * read from the store only: the calib_set, calib_step, calib_limit and
 * calib_arm_step rows of one verdict set. Text for the terminal, markdown
 * with SVG plots (svg.h) for the evidence file.
 */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "common.h"
#include "svg.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* q-quantile of sorted v[n] (nearest rank). */
static double quant(const double *v, int n, double q)
{
    if (n <= 0) return NAN;
    int i = (int)ceil(q * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* The values of column col (exact_median, exact_kl, exact_max) of arm's
 * calib_arm_step rows, sorted; count into *n (malloc'ed, may be NULL). */
static double *arm_column(sqlite3 *db, int64_t run, int set, const char *arm, const char *col, int *n)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT %s FROM calib_arm_step WHERE run_id=?1 AND set_no=?2 AND arm=?3 AND exact_n > 0", col);
    sqlite3_stmt *q = NULL;
    *n = 0;
    q = common_sql_prepare(db, sql, "Iit", run, set, arm);
    if (!q) return NULL;
    int cap = 0;
    double *v = NULL;
    while (sqlite3_step(q) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 256;
            double *nv = realloc(v, sizeof *v * (size_t)cap);
            if (!nv) break;
            v = nv;
        }
        v[(*n)++] = sqlite3_column_double(q, 0);
    }
    sqlite3_finalize(q);
    if (v) qsort(v, (size_t)*n, sizeof *v, cmp_double);
    return v;
}

/* One arm's limits as "KL 0.0015<=0.0038 DIV ... " into out. Returns 1
 * when the arm has limit rows. */
static int limits_line(sqlite3 *db, int64_t run, int set, const char *arm, char *out, size_t cap, int *fail)
{
    static const char *const SHORT[] = {"KL_MEAN", "KL", "DIVERGENCE_RATE", "DIV", "EXACT_ERR", "ERR",
                                        "EXACT_KL", "EKL", NULL};
    sqlite3_stmt *q = NULL;
    out[0] = 0;
    *fail = 0;
    q = common_sql_prepare(db,
                           "SELECT metric, value, upper, ok FROM calib_limit WHERE run_id=?1 AND set_no=?2"
                           " AND arm=?3 ORDER BY CASE metric WHEN 'KL_MEAN' THEN 0 WHEN 'DIVERGENCE_RATE' THEN 1"
                           " WHEN 'EXACT_ERR' THEN 2 ELSE 3 END",
                           "Iit", run, set, arm);
    if (!q)
        return 0;
    size_t k = 0;
    int any = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(q, 0), *s = m;
        for (int i = 0; SHORT[i]; i += 2)
            if (m && !strcmp(m, SHORT[i])) s = SHORT[i + 1];
        any = 1;
        if (sqlite3_column_type(q, 2) == SQLITE_NULL)
            k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "%s%s %.3g (no limit)", k ? "  " : "", s,
                                  sqlite3_column_double(q, 1));
        else {
            int ok = sqlite3_column_int(q, 3);
            *fail |= !ok;
            k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "%s%s %.3g%s%.3g", k ? "  " : "", s,
                                  sqlite3_column_double(q, 1), ok ? "<=" : " > ", sqlite3_column_double(q, 2));
        }
        if (k >= cap) break;
    }
    sqlite3_finalize(q);
    return any;
}

static int arm_value(sqlite3 *db, int64_t run, int set, const char *arm, const char *key, char *out, size_t cap)
{
    sqlite3_stmt *q = NULL;
    out[0] = 0;
    q = common_sql_prepare(db,
                           "SELECT value FROM verdict WHERE run_id=?1 AND set_no=?2 AND arm=?3 AND prompt IS NULL"
                           " AND key=?4 ORDER BY id DESC LIMIT 1",
                           "Iitt", run, set, arm, key);
    if (!q)
        return 0;
    int got = sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0);
    if (got) snprintf(out, cap, "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    return got;
}

/* The plots of the markdown section. */
static void md_plots(sqlite3 *db, int64_t run, int set, FILE *out)
{
    sqlite3_stmt *q = NULL;
    /* gaps on a log scale, the calibrated band and the fragile steps */
    int cap = 0, n = 0;
    double *x = NULL, *g = NULL, *b = NULL;
    int *fr = NULL;
    if ((q = common_sql_prepare(db,
                                "SELECT s.ref_gap, s.band, s.fragile FROM calib_step s JOIN prompt p ON p.run_id = s.run_id"
                                " AND p.name = s.prompt WHERE s.run_id=?1 AND s.set_no=?2 ORDER BY p.no, s.step",
                                "Ii", run, set))) {
        while (sqlite3_step(q) == SQLITE_ROW) {
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                double *nx = realloc(x, sizeof *x * (size_t)cap), *ng = nx ? realloc(g, sizeof *g * (size_t)cap) : NULL;
                if (nx) x = nx;
                if (ng) g = ng;
                double *nb = ng ? realloc(b, sizeof *b * (size_t)cap) : NULL;
                if (nb) b = nb;
                int *nf = nb ? realloc(fr, sizeof *fr * (size_t)cap) : NULL;
                if (nf) fr = nf;
                if (!nx || !ng || !nb || !nf) break;
            }
            x[n] = n;
            g[n] = sqlite3_column_type(q, 0) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 0);
            b[n] = sqlite3_column_type(q, 1) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 1);
            fr[n] = sqlite3_column_int(q, 2);
            n++;
        }
    }
    sqlite3_finalize(q);
    fprintf(out, "\n### Reference gap per step (log scale), the calibrated band, fragile steps\n\n");
    svg_gap_band(out, "reference gap and calibrated band (all prompts, in order)", n, x, g, b, fr);
    free(x), free(g), free(b), free(fr);

    /* each arm's distance from exact arithmetic per step */
    const char *names[16];
    double *ys[16];
    int ns = 0, len = 0;
    if ((q = common_sql_prepare(db,
                                "SELECT DISTINCT arm FROM calib_arm_step WHERE run_id=?1 AND set_no=?2 AND exact_n > 0"
                                " ORDER BY arm",
                                "Ii", run, set))) {
        while (sqlite3_step(q) == SQLITE_ROW && ns < 16) {
            const char *a = (const char *)sqlite3_column_text(q, 0);
            names[ns] = strdup(a ? a : "?");
            ys[ns] = NULL;
            if (names[ns]) ns++;
        }
    }
    sqlite3_finalize(q);
    for (int s = 0; s < ns; s++) {
        sqlite3_stmt *r = NULL;
        int k = 0, c2 = 0;
        if ((r = common_sql_prepare(db,
                                    "SELECT a.exact_median FROM calib_step s JOIN prompt p ON p.run_id = s.run_id AND"
                                    " p.name = s.prompt LEFT JOIN calib_arm_step a ON a.run_id = s.run_id AND"
                                    " a.set_no = s.set_no AND a.prompt = s.prompt AND a.step = s.step AND a.arm = ?3"
                                    " WHERE s.run_id=?1 AND s.set_no=?2 ORDER BY p.no, s.step",
                                    "Iit", run, set, names[s]))) {
            while (sqlite3_step(r) == SQLITE_ROW) {
                if (k == c2) {
                    c2 = c2 ? 2 * c2 : 256;
                    double *ny = realloc(ys[s], sizeof *ys[s] * (size_t)c2);
                    if (!ny) break;
                    ys[s] = ny;
                }
                ys[s][k++] = sqlite3_column_type(r, 0) == SQLITE_NULL ? NAN : sqlite3_column_double(r, 0);
            }
        }
        sqlite3_finalize(r);
        if (!ys[s]) k = 0;
        if (s == 0 || k < len) len = k;
    }
    fprintf(out, "\n### Each arm's distance from exact arithmetic per step (median |logit difference|, log scale)\n\n");
    int ok = ns > 0 && len > 0;
    for (int s = 0; s < ns; s++) ok &= ys[s] != NULL;
    if (ok) svg_lines_log(out, "distance from exact arithmetic (all prompts, in order)", ns, names, len,
                          (const double *const *)ys);
    else fprintf(out, "(no exact arm in this run)\n");
    for (int s = 0; s < ns; s++) free((char *)names[s]), free(ys[s]);
}

int calibrate_report(sqlite3 *db, int64_t run, int set, int markdown, FILE *out)
{
    sqlite3_stmt *q = NULL;
    q = common_sql_prepare(db,
                           "SELECT exact, factor, limit_k, budget, source_run, panel FROM calib_set"
                           " WHERE run_id=?1 AND set_no=?2",
                           "Ii", run, set);
    if (!q)
        return 0; /* an older store: no section */
    if (sqlite3_step(q) != SQLITE_ROW) {
        sqlite3_finalize(q);
        return 0;
    }
    char exact[128] = "", panel[512] = "";
    const unsigned char *t = sqlite3_column_text(q, 0);
    if (t) snprintf(exact, sizeof exact, "%s", (const char *)t);
    double factor = sqlite3_column_double(q, 1), k = sqlite3_column_double(q, 2), budget = sqlite3_column_double(q, 3);
    int64_t src = sqlite3_column_type(q, 4) == SQLITE_NULL ? 0 : sqlite3_column_int64(q, 4);
    t = sqlite3_column_text(q, 5);
    if (t) snprintf(panel, sizeof panel, "%s", (const char *)t);
    sqlite3_finalize(q);

    const char *pre = markdown ? "" : "  ";
    if (markdown) fprintf(out, "\n## Calibration and the exact arbiter\n\n```\n");
    else fprintf(out, "\ncalibration:\n");
    if (src)
        fprintf(out, "%sbands and limits from the calibration stored by run %lld; factor %g, limit_k %g\n", pre,
                (long long)src, factor, k);
    else if (panel[0])
        fprintf(out, "%spanel of legitimate variants (this run): %s\n"
                     "%san arm's band at a step = %g x the spread of the reference gap over the other views (a test\n"
                     "%sarm: outside its own family); its limits = mean + %g x sd x sqrt(1 + 1/n) of those n values\n",
                pre, panel, pre, factor, pre, k);
    else
        fprintf(out, "%sno panel (no arm has variant_of): the spec band decides the steps\n", pre);
    if (exact[0])
        fprintf(out, "%sexact arithmetic: %s; error budget: %g x the reference's distance from it\n", pre, exact,
                budget);
    /* fragile steps */
    int n_steps = 0, n_fragile = 0;
    if ((q = common_sql_prepare(db, "SELECT count(*), coalesce(sum(fragile), 0) FROM calib_step WHERE run_id=?1 AND set_no=?2",
                                "Ii", run, set))) {
        if (sqlite3_step(q) == SQLITE_ROW) n_steps = sqlite3_column_int(q, 0), n_fragile = sqlite3_column_int(q, 1);
    }
    sqlite3_finalize(q);
    fprintf(out, "%sfragile steps (flipped by a legitimate variant; band over every view): %d of %d\n", pre,
            n_fragile, n_steps);
    if ((q = common_sql_prepare(db,
                                "SELECT s.prompt, s.step, s.ref_gap, s.band, s.flipped_by, s.exact_token FROM calib_step s"
                                " JOIN prompt p ON p.run_id = s.run_id AND p.name = s.prompt"
                                " WHERE s.run_id=?1 AND s.set_no=?2 AND s.fragile ORDER BY p.no, s.step",
                                "Ii", run, set))) {
        while (sqlite3_step(q) == SQLITE_ROW) {
            char ex[48] = "";
            if (sqlite3_column_type(q, 5) != SQLITE_NULL)
                snprintf(ex, sizeof ex, "  exact says %d", sqlite3_column_int(q, 5));
            fprintf(out, "%s  %s/%-4d gap %.3f  band %.3f  flipped by %s%s\n", pre, sqlite3_column_text(q, 0),
                    sqlite3_column_int(q, 1), sqlite3_column_double(q, 2), sqlite3_column_double(q, 3),
                    sqlite3_column_text(q, 4), ex);
        }
    }
    sqlite3_finalize(q);
    /* per arm: limits, budget, distribution of the distance from exact */
    fprintf(out, "%s%-16s %-7s %-14s %s\n", pre, "ARM", "LIMITS", "ERROR_BUDGET", "value <= limit: KL_MEAN, "
                 "DIVERGENCE_RATE, EXACT_ERR, EXACT_KL");
    q = common_sql_prepare(db,
                           "SELECT DISTINCT c.arm FROM calib_arm_step c JOIN arm a ON a.run_id = c.run_id AND"
                           " a.name = c.arm WHERE c.run_id=?1 AND c.set_no=?2 ORDER BY a.id",
                           "Ii", run, set);
    if (!q)
        return 0;
    char names[64][128];
    int na = 0;
    while (sqlite3_step(q) == SQLITE_ROW && na < 64)
        snprintf(names[na++], sizeof names[0], "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    for (int a = 0; a < na; a++) {
        char lim[512], bud[64] = "-", word[32], ratio[64];
        int fail;
        int has = limits_line(db, run, set, names[a], lim, sizeof lim, &fail);
        if (arm_value(db, run, set, names[a], "ERROR_BUDGET", word, sizeof word)) {
            snprintf(bud, sizeof bud, "%s", word);
            if (arm_value(db, run, set, names[a], "ERROR_BUDGET_RATIO", ratio, sizeof ratio))
                snprintf(bud + strlen(bud), sizeof bud - strlen(bud), " %.2fx", atof(ratio));
        }
        if (!has && !strcmp(bud, "-")) continue;
        fprintf(out, "%s%-16s %-7s %-14s %s\n", pre, names[a], has ? (fail ? "FAIL" : "PASS") : "-", bud,
                has ? lim : "");
    }
    if (exact[0]) {
        fprintf(out, "%sdistance from exact arithmetic per step: median |dlogit| p50 / p90 / max;"
                     " KL p50 / p90 / max\n", pre);
        for (int a = 0; a < na; a++) {
            int n1, n2;
            double *med = arm_column(db, run, set, names[a], "exact_median", &n1);
            double *kl = arm_column(db, run, set, names[a], "exact_kl", &n2);
            if (n1 > 0 && n2 > 0)
                fprintf(out, "%s%-16s %.4f / %.4f / %.4f   %.2e / %.2e / %.2e  (%d steps)\n", pre, names[a],
                        quant(med, n1, 0.5), quant(med, n1, 0.9), med[n1 - 1], quant(kl, n2, 0.5), quant(kl, n2, 0.9),
                        kl[n2 - 1], n1);
            free(med), free(kl);
        }
    }
    if (markdown) {
        fprintf(out, "```\n");
        md_plots(db, run, set, out);
    }
    return ferror(out) ? -1 : 0;
}
