/*
 * calibrate_cmd.c: `tokgate calibrate SPEC [--db FILE] [--jobs N]`.
 *
 * Runs the spec's arms like `tokgate gate` (its panel: the arms with
 * variant_of and the arms they name, the reference and the exact arm),
 * scores the run under policy calibrated and stores the calibration
 * (calib_* rows), which later runs of specs saying `calibration: {from:
 * SPEC_NAME}` use. Prints the report, with the calibration section, and
 * exits 0 when every panel arm passes (each judged by the panel outside its
 * own family), 1 when a legitimate variant fails (the factors are too
 * tight for this panel, or a variant is not legitimate), 2 on a usage or
 * input error (a spec without a panel is one).
 */
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calibrate.h"
#include "common.h"
#include "gate.h"
#include "report.h"
#include "spec.h"
#include "store.h"
#include "verdict.h"

static int usage(const char *what)
{
    fprintf(stderr, "tokgate calibrate: %s\nusage: tokgate calibrate SPEC [--db FILE] [--jobs N]\n", what);
    return 2;
}

/* 1 when arm i of s is a panel member (has variant_of or is named by one). */
static int in_panel(const tg_spec *s, int i)
{
    if (s->arms[i].variant_of) return 1;
    for (int j = 0; j < s->n_arms; j++)
        if (s->arms[j].variant_of && !strcmp(s->arms[j].variant_of, s->arms[i].name)) return 1;
    return 0;
}

int calibrate_main(int argc, char **argv)
{
    const char *db = "tokgate.db", *path = NULL;
    int jobs = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--db") && i + 1 < argc) db = argv[++i];
        else if (!strcmp(argv[i], "--jobs") && i + 1 < argc) {
            if (common_parse_int(argv[++i], 1, 256, &jobs) < 0) return usage("--jobs: expected an integer 1..256");
        } else if (argv[i][0] == '-') return usage("unknown option");
        else if (!path) path = argv[i];
        else return usage("expected one SPEC file");
    }
    if (!path) return usage("expected one SPEC file");
    tg_err e;
    tg_spec *spec = NULL;
    if (spec_load(&spec, path, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return 2;
    }
    int n_panel = 0;
    for (int i = 0; i < spec->n_arms; i++) n_panel += in_panel(spec, i);
    if (n_panel == 0) {
        fprintf(stderr, "tokgate: %s: no panel to calibrate with: no arm says variant_of (docs/spec.md)\n", path);
        spec_free(spec);
        return 2;
    }
    tg_store *st = NULL;
    if (store_open_cmd(&st, db, 0)) {
        spec_free(spec);
        return 2;
    }
    char bins[PATH_MAX];
    gate_bin_dir(bins, sizeof bins);
    gate_options go = {.bin_dir = bins, .jobs = jobs, .progress = isatty(2)};
    gate_result gr;
    int rc = 2;
    if (gate_run(st, spec, &go, &gr, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        if (gr.run_id > 0) store_finish_run(st, gr.run_id, "ERROR", NULL);
        goto out;
    }
    verdict_options vo = verdict_options_default();
    vo.policy_kind = "calibrated";
    verdict_result vr;
    if (verdict_score_run(st, gr.run_id, &vo, &vr, &e) < 0) {
        fprintf(stderr, "tokgate: scoring run %lld: %s\n", (long long)gr.run_id, e.msg);
        store_finish_run(st, gr.run_id, "ERROR", NULL);
        goto out;
    }
    store_finish_run(st, gr.run_id, vr.verdict, NULL);
    report_options ro = {.format = REPORT_TEXT};
    if (report_write(st, gr.run_id, &ro, stdout, &e) < 0) {
        fprintf(stderr, "tokgate: report: %s\n", e.msg);
        goto out;
    }
    /* every panel arm but the reference must pass */
    sqlite3_stmt *q = NULL;
    int failed = 0;
    if (sqlite3_prepare_v2(store_db(st),
                           "SELECT value FROM verdict WHERE run_id=?1 AND set_no=?2 AND arm=?3 AND prompt IS NULL"
                           " AND key='TOKEN_GATE'",
                           -1, &q, NULL) != SQLITE_OK) {
        fprintf(stderr, "tokgate: %s\n", sqlite3_errmsg(store_db(st)));
        goto out;
    }
    for (int i = 0; i < spec->n_arms; i++) {
        if (!in_panel(spec, i) || i == spec->ref_index) continue;
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, gr.run_id);
        sqlite3_bind_int(q, 2, vr.set);
        sqlite3_bind_text(q, 3, spec->arms[i].name, -1, SQLITE_STATIC);
        const char *v = sqlite3_step(q) == SQLITE_ROW ? (const char *)sqlite3_column_text(q, 0) : NULL;
        if (!v || strcmp(v, "PASS")) {
            fprintf(stderr, "tokgate: calibrate: panel arm %s: TOKEN_GATE=%s\n", spec->arms[i].name, v ? v : "?");
            failed++;
        }
    }
    sqlite3_finalize(q);
    fprintf(stderr, "tokgate: run %lld calibrated spec %s (%d panel arms%s); specs with calibration: {from: %s} "
            "use it\n", (long long)gr.run_id, spec->name, n_panel, failed ? ", some fail" : ", all pass", spec->name);
    rc = failed ? 1 : 0;
out:
    store_close(st);
    spec_free(spec);
    return rc;
}
