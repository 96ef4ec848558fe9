/*
 * test_localize.c: `tokgate localize` (harness/localize.c).
 *
 *  - localize_table on crafted tensors: the trend rule (layer 0 seeds it),
 *    the third-pair rule, mismatched sizes;
 *  - a stored dump blob decodes to its n values (the codec itself is
 *    tested in test_common);
 *  - the schema migration to the localize tables from an older store;
 *  - real runs of tg-engine: a tg-mkmodel tiny Q4_K_M file (4 layers) and
 *    the shipped trained model, with an arm perturbed by the documented
 *    debug option (load option perturb "bf16:ffn_out:L", engine/model.h):
 *    the perturbed pair names layer L, stage ffn_out; unperturbed pairs
 *    (cpu vs cpu at another thread count, ref vs cpu) name none. One case
 *    takes its prefix from a stored gate run. Skipped when tg-engine or
 *    tg-mkmodel are not built.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "v3fixture.h"
#include "common.h"

#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <spawn.h>

#include "gate.h"
#include "localize.h"
#include "spec.h"
#include "store.h"
#include "testenv.h"

extern char **environ;

/* ------------------------------------------------------------------ */
/* The comparison                                                      */

enum { NL = 4, NSTG = 8, N = 64 };
static const char *const STG[NSTG] = {"attn_norm", "q", "k", "v", "attn_out",
                                      "ffn_norm", "ffn_out", "residual"};

/* Tensors of NL layers x 8 stages (+ logits): base values, and a copy with
 * relative noise `noise` (growing 20% per layer) plus `bump` at (bl, bs). */
typedef struct set {
    float data[NL * NSTG + 1][N];
    loc_tensor t[NL * NSTG + 1];
} set;

static void make_set(set *s, unsigned seed, double noise, int bl, int bs, double bump)
{
    srand(seed);
    for (int l = 0; l <= NL * NSTG; l++) {
        int layer = l < NL * NSTG ? l / NSTG : -1;
        const char *stage = l < NL * NSTG ? STG[l % NSTG] : "logits";
        for (int i = 0; i < N; i++) {
            srand(1000u * (unsigned)l + (unsigned)i);   /* the same base values in every set */
            double x = (rand() / (double)RAND_MAX - 0.5) * 4;
            srand(seed * 7919u + 1000u * (unsigned)l + (unsigned)i);
            double r = rand() / (double)RAND_MAX - 0.5;
            double rel = noise * pow(1.2, layer < 0 ? NL : layer);
            if (layer == bl && !strcmp(stage, STG[bs])) rel += bump;
            s->data[l][i] = (float)(x * (1 + rel * r * 3.4));
        }
        s->t[l] = (loc_tensor){layer, stage, N, s->data[l]};
    }
}

static set g_a, g_b, g_c;

static void test_table_trend(void **st)
{
    (void)st;
    tg_err e;
    loc_table *t;
    /* identical arms: nothing is over any floor */
    make_set(&g_a, 1, 0, -1, 0, 0);
    make_set(&g_b, 1, 0, -1, 0, 0);
    assert_int_equal(localize_table(&t, g_a.t, NL * NSTG + 1, g_b.t, NL * NSTG + 1, NULL, 0, &e), 0);
    assert_int_equal(t->n_rows, NL * NSTG + 1);
    assert_int_equal(t->first, -1);
    assert_string_equal(t->rule, "trend");
    /* rows in forward order, logits last */
    assert_int_equal(t->rows[0].layer, 0);
    assert_string_equal(t->rows[0].stage, "attn_norm");
    assert_string_equal(t->rows[6].stage, "ffn_out");
    assert_int_equal(t->rows[NL * NSTG].layer, -1);
    assert_true(t->rows[5].rel_l2 == 0 && t->rows[5].cosine > 0.999999);
    localize_table_free(t);
    /* a pure perturbation at layer 2 ffn_out over exact agreement */
    make_set(&g_b, 1, 0, 2, 6, 2e-3);
    assert_int_equal(localize_table(&t, g_a.t, NL * NSTG + 1, g_b.t, NL * NSTG + 1, NULL, 0, &e), 0);
    assert_true(t->first >= 0);
    assert_int_equal(t->rows[t->first].layer, 2);
    assert_string_equal(t->rows[t->first].stage, "ffn_out");
    assert_true(t->rows[t->first].max_abs > 0);
    localize_table_free(t);
    /* smooth noise growing 20% a layer: the trend absorbs it */
    make_set(&g_b, 2, 1e-2, -1, 0, 0);
    assert_int_equal(localize_table(&t, g_a.t, NL * NSTG + 1, g_b.t, NL * NSTG + 1, NULL, 0, &e), 0);
    assert_int_equal(t->first, -1);
    assert_true(isfinite(t->rows[NSTG + 6].growth));
    localize_table_free(t);
    /* the same noise with a 30x jump at layer 3 q */
    make_set(&g_b, 2, 1e-2, 3, 1, 0.3);
    assert_int_equal(localize_table(&t, g_a.t, NL * NSTG + 1, g_b.t, NL * NSTG + 1, NULL, 0, &e), 0);
    assert_true(t->first >= 0);
    assert_int_equal(t->rows[t->first].layer, 3);
    assert_string_equal(t->rows[t->first].stage, "q");
    localize_table_free(t);
}

static void test_table_third(void **st)
{
    (void)st;
    tg_err e;
    loc_table *t;
    make_set(&g_a, 1, 0, -1, 0, 0);
    /* the third pair is as noisy as the main pair: no stage stands out */
    make_set(&g_b, 3, 1e-2, -1, 0, 0);
    make_set(&g_c, 4, 1e-2, -1, 0, 0);
    assert_int_equal(localize_table(&t, g_a.t, NL * NSTG + 1, g_b.t, NL * NSTG + 1, g_c.t,
                                    NL * NSTG + 1, &e), 0);
    assert_string_equal(t->rule, "third-pair");
    assert_int_equal(t->first, -1);
    assert_true(isfinite(t->rows[0].floor));   /* layer 0 is judged under this rule */
    localize_table_free(t);
    /* a defect at layer 0 k, which the trend rule could not judge */
    make_set(&g_b, 3, 1e-2, 0, 2, 0.5);
    assert_int_equal(localize_table(&t, g_a.t, NL * NSTG + 1, g_b.t, NL * NSTG + 1, g_c.t,
                                    NL * NSTG + 1, &e), 0);
    assert_true(t->first >= 0);
    assert_int_equal(t->rows[t->first].layer, 0);
    assert_string_equal(t->rows[t->first].stage, "k");
    localize_table_free(t);
    /* a tensor with a different size is an error naming it */
    loc_tensor bad = g_b.t[5];
    bad.n = N - 1;
    loc_tensor copy[NL * NSTG + 1];
    memcpy(copy, g_b.t, sizeof copy);
    copy[5] = bad;
    assert_int_equal(localize_table(&t, g_a.t, NL * NSTG + 1, copy, NL * NSTG + 1, NULL, 0, &e), -1);
    assert_non_null(strstr(e.msg, "layer 0 stage ffn_norm"));
}

static void test_migration(void **st_)
{
    (void)st_;
    char db[PATH_MAX + 8];
    snprintf(db, sizeof db, "%s/m.db", g_dir);
    tg_store *st;
    tg_err e;
    assert_int_equal(store_open(&st, db, &e), 0);
    /* make it a version-2 store: the version-3 step table, without the version-3 tables */
    assert_int_equal(sqlite3_exec(store_db(st), STORE_TO_V3_SQL, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(store_db(st),
                                  "DROP TABLE localize_row; DROP TABLE localize_dump;"
                                  " DROP TABLE localize_arm; DROP TABLE localize; DROP TABLE noise_band;"
                                  " PRAGMA user_version=2;",
                                  NULL, NULL, NULL), SQLITE_OK);
    store_close(st);
    assert_int_equal(store_open(&st, db, &e), 0);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                        "SELECT count(*) FROM sqlite_master WHERE name IN ('localize',"
                                        " 'localize_arm', 'localize_dump', 'localize_row', 'noise_band')",
                                        -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(s, 0), 5);
    sqlite3_finalize(s);
    store_close(st);
}

/* ------------------------------------------------------------------ */
/* Real runs                                                           */

static int spawn_wait(char *const *argv)
{
    pid_t pid;
    if (posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0) return -1;
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static tg_spec *write_spec(const char *name, const char *model, int layer)
{
    char sha[65], path[PATH_MAX + 32];
    tg_err e;
    if (tg_sha256_file(model, sha, &e) < 0) fail_msg("%s", e.msg);
    write_in(path, sizeof path, name,
             "name: localize-%s\nmodel: {path: %s, sha256: %s}\n"
             "prompts:\n  - {id: p1, text: \"The following options are supported:\"}\n"
             "steps: 6\ntop_k: 16\nlegs: 1\nmode: teacher-forced\nreference: ref\npolicy: {kind: exact}\n"
             "arms:\n"
             "  - {name: cpu, engine: cpu, options: {threads: 1}}\n"
             "  - {name: cpu-t2, engine: cpu, options: {threads: 2}}\n"
             "  - {name: ref, engine: ref}\n"
             "  - {name: cpu-bf16, engine: cpu, options: {threads: 1, perturb: \"bf16:ffn_out:%d\"}}\n"
             "  - {name: ref-bf16, engine: ref, options: {perturb: \"bf16:ffn_out:%d\"}}\n",
             name, model, sha, layer, layer);
    tg_spec *s;
    if (spec_load(&s, path, &e) < 0) fail_msg("spec: %s", e.msg);
    return s;
}

/* Runs one localisation; returns the outcome. */
static loc_outcome loc(tg_store *st, const tg_spec *s, const char *a, const char *b, const char *third,
                       int64_t run, const char *evidence)
{
    char bin[PATH_MAX + 8];
    snprintf(bin, sizeof bin, "%s/bin", g_build);
    loc_request q = {.spec = s, .bin_dir = bin, .prompt_id = "p1", .step = 4, .arm_a = a,
                     .arm_b = b, .third = third, .run_id = run, .evidence_dir = evidence};
    loc_outcome r;
    tg_err e;
    FILE *out = fopen("/dev/null", "w");
    assert_non_null(out);
    if (localize_run(st, &q, out, &r, &e) < 0) fail_msg("localize %s,%s: %s", a, b, e.msg);
    fclose(out);
    printf("localize %s vs %s%s%s: %s %d %s\n", b, a, third ? " third " : "", third ? third : "",
           r.first_layer == -2 ? "none" : "layer", r.first_layer, r.first_stage);
    return r;
}

static void need_bins(void)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/bin/tg-engine", g_build);
    if (!exists(p)) skip_msg("tg-engine not built (%s)", p);
}

static void test_real_mkmodel(void **st_)
{
    (void)st_;
    need_bins();
    char tool[PATH_MAX + 32], model[PATH_MAX + 32], db[PATH_MAX + 8], ev[PATH_MAX + 8];
    snprintf(tool, sizeof tool, "%s/bin/tg-mkmodel", g_build);
    if (!exists(tool)) skip_msg("tg-mkmodel not built (%s)", tool);
    snprintf(model, sizeof model, "%s/tiny.gguf", g_dir);
    char *argv[] = {tool, "--preset", "tiny", "--type", "q4_k_m", "--seed", "7", "--n-layer", "4",
                    "-o", model, NULL};
    assert_int_equal(spawn_wait(argv), 0);
    tg_spec *s = write_spec("tiny.yaml", model, 2);
    snprintf(db, sizeof db, "%s/t.db", g_dir);
    snprintf(ev, sizeof ev, "%s/ev", g_dir);
    tg_store *st;
    tg_err e;
    assert_int_equal(store_open(&st, db, &e), 0);
    /* the perturbed arm against its unperturbed twin: layer 2, ffn_out */
    loc_outcome r = loc(st, s, "cpu", "cpu-bf16", NULL, 0, ev);
    assert_int_equal(r.first_layer, 2);
    assert_string_equal(r.first_stage, "ffn_out");
    assert_true(r.evidence_path[0]);
    FILE *f = fopen(r.evidence_path, "r");
    assert_non_null(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    assert_non_null(strstr(text, "<svg"));
    assert_non_null(strstr(text, "layer 2, ffn_out"));
    /* the record: every dump of both arms, the rows, the first stage */
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                        "SELECT (SELECT count(*) FROM localize_dump WHERE localize_id=?1),"
                                        " (SELECT count(*) FROM localize_row WHERE localize_id=?1),"
                                        " first_layer, first_stage FROM localize WHERE id=?1",
                                        -1, &q, NULL), SQLITE_OK);
    sqlite3_bind_int64(q, 1, r.localize_id);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), 2 * (4 * 8 + 1));
    assert_int_equal(sqlite3_column_int(q, 1), 4 * 8 + 1);
    assert_int_equal(sqlite3_column_int(q, 2), 2);
    assert_string_equal((const char *)sqlite3_column_text(q, 3), "ffn_out");
    sqlite3_finalize(q);
    /* a stored dump unpacks to n values */
    assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                        "SELECT n, data FROM localize_dump WHERE localize_id=?1 AND"
                                        " arm='cpu-bf16' AND layer=2 AND stage='ffn_out'", -1, &q, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(q, 1, r.localize_id);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    int64_t nn = sqlite3_column_int64(q, 0);
    float *buf = malloc(sizeof(float) * (size_t)nn);
    assert_int_equal(common_blob_decode(sqlite3_column_blob(q, 1), (size_t)sqlite3_column_bytes(q, 1), buf, nn, &e), 0);
    free(buf);
    sqlite3_finalize(q);
    /* without the option: the same tier at another thread count names none */
    r = loc(st, s, "cpu", "cpu-t2", NULL, 0, NULL);
    assert_int_equal(r.first_layer, -2);
    /* with a third pair (cpu vs cpu-t2) as the floor: still layer 2 */
    r = loc(st, s, "cpu", "cpu-bf16", "cpu-t2", 0, NULL);
    assert_int_equal(r.first_layer, 2);
    assert_string_equal(r.first_stage, "ffn_out");
    /* cpu against ref, over a stored gate run's prefix: the cpu tier's own
     * rounding follows the trend, nothing is named */
    char bin[PATH_MAX + 8];
    snprintf(bin, sizeof bin, "%s/bin", g_build);
    gate_options go = {.bin_dir = bin, .jobs = 2};
    gate_result gr;
    if (gate_run(st, s, &go, &gr, &e) < 0) fail_msg("gate: %s", e.msg);
    r = loc(st, s, "ref", "cpu", NULL, gr.run_id, NULL);
    assert_int_equal(r.first_layer, -2);
    assert_int_equal(sqlite3_prepare_v2(store_db(st), "SELECT run_id FROM localize WHERE id=?1", -1, &q, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(q, 1, r.localize_id);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(q, 0), gr.run_id);
    sqlite3_finalize(q);
    store_close(st);
    spec_free(s);
}

static void test_real_trained(void **st_)
{
    (void)st_;
    need_bins();
    char model[PATH_MAX + 64], db[PATH_MAX + 8];
    snprintf(model, sizeof model, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    if (!exists(model)) skip_msg("shipped model missing (%s)", model);
    tg_spec *s = write_spec("trained.yaml", model, 5);
    snprintf(db, sizeof db, "%s/t.db", g_dir);
    tg_store *st;
    tg_err e;
    assert_int_equal(store_open(&st, db, &e), 0);
    loc_outcome r = loc(st, s, "ref", "ref-bf16", NULL, 0, NULL);
    assert_int_equal(r.first_layer, 5);
    assert_string_equal(r.first_stage, "ffn_out");
    r = loc(st, s, "ref", "cpu", NULL, 0, NULL);
    assert_int_equal(r.first_layer, -2);
    store_close(st);
    spec_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_trend),
        cmocka_unit_test(test_table_third),
        cmocka_unit_test(test_migration),
        cmocka_unit_test(test_real_mkmodel),
        cmocka_unit_test(test_real_trained),
    };
    return cmocka_run_group_tests(tests, testenv_setup, testenv_teardown);
}
