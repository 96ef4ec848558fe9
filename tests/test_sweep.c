/*
 * test_sweep.c: sweep files (harness/sweep.c) and history trends
 * (harness/trend.c).
 *
 * The sweep-file tests resolve entries without running anything: overrides
 * replace spec keys, `arms` keeps a subset, `arm_options` lands in the right
 * options mapping, shards are assigned round robin, and every bad input is
 * an error naming the file and what was expected.
 *
 * The trend test runs real nights of the shipped tiny trained model (cpu
 * tier against llama.cpp's CPU build, 2 prompts x 8 steps x 2 legs) into one
 * store: two clean nights must give no regression, a night whose llama arm
 * runs with a 4-bit KV cache (a deliberately perturbed arm option) must be
 * flagged and named as the first bad run, and `tokgate trend` must exit 1
 * with an SVG plot in its markdown report. Skipped when the workers or the model are missing.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "spec.h"
#include "store.h"
#include "sweep.h"
#include "trend.h"

static char g_root[PATH_MAX], g_bin[PATH_MAX + 64], g_cache[PATH_MAX + 64];
static char g_dir[PATH_MAX];

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void rm_rf(const char *dir)
{
    /* only the files this program writes (no shell) */
    const char *names[] = {"spec.yaml", "sweep.yaml", "bad.yaml", "t.db", "t.db-wal", "t.db-shm", "trend.txt", NULL};
    char p[2 * PATH_MAX];
    for (int i = 0; names[i]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static int setup(void **st)
{
    (void)st;
    const char *b = getenv("TG_BUILD"), *r = getenv("TG_ROOT"), *c = getenv("TG_CACHE");
    snprintf(g_root, sizeof g_root, "%s", r ? r : ".");
    if (b) snprintf(g_bin, sizeof g_bin, "%s/bin", b);
    else snprintf(g_bin, sizeof g_bin, "%s/build/bin", g_root);
    if (c) snprintf(g_cache, sizeof g_cache, "%s", c);
    else snprintf(g_cache, sizeof g_cache, "%s/.cache", g_root);
    snprintf(g_dir, sizeof g_dir, "/tmp/tg-test-sweep-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **st)
{
    (void)st;
    rm_rf(g_dir);
    return 0;
}

static void write_file(const char *name, const char *text)
{
    char p[2 * PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char MODEL_SHA[] = "9159ed92d8ffb26f342a511bd3a34e021f38298c26f1a5fdbf3a373c70691657";

/* A spec of the shipped model with cpu, ref and llama-cpu arms (absolute paths). */
static void write_spec(void)
{
    char text[16384];
    snprintf(text, sizeof text,
             "name: tiny\n"
             "model: {path: %s/models/tiny-trained-qwen3-Q4_K_M.gguf, sha256: %s}\n"
             "prompts:\n"
             "  - {id: p1, text: \"The following options are supported:\"}\n"
             "  - {id: p2, text: \"def __init__(self, *args, **kwargs):\"}\n"
             "  - {id: p3, text: \"NAME\"}\n"
             "steps: 48\ntop_k: 32\nlegs: 2\nreference: llama-cpu\n"
             "policy: {kind: near-tie, band: 0.20}\n"
             "arms:\n"
             "  - {name: cpu, engine: cpu, options: {threads: 2}}\n"
             "  - {name: ref, engine: ref}\n"
             "  - {name: llama-cpu, llama: {lib: %s/npm/linux-x64/bins/linux-x64/libllama.so, options: {threads: 2}}}\n",
             g_root, MODEL_SHA, g_cache);
    write_file("spec.yaml", text);
}

static tg_sweep *load_sweep(const char *text, tg_err *e)
{
    write_file("sweep.yaml", text);
    char p[2 * PATH_MAX];
    snprintf(p, sizeof p, "%s/sweep.yaml", g_dir);
    tg_sweep *sw = NULL;
    if (sweep_load(&sw, p, e) < 0) return NULL;
    return sw;
}

/* Overrides, arm subsets and arm options end up in the resolved spec. */
static void test_sweep_resolves_overrides(void **state)
{
    (void)state;
    write_spec();
    tg_err e;
    tg_sweep *sw = load_sweep("name: n1\n"
                              "overrides: {steps: 8, legs: 3}\n"
                              "specs:\n"
                              "  - {spec: spec.yaml, name: a, arms: [cpu, llama-cpu]}\n"
                              "  - spec: spec.yaml\n"
                              "    name: b\n"
                              "    overrides: {steps: 5, top_k: 16}\n"
                              "    arm_options: {llama-cpu: {type_k: q8_0}, ref: {n_ctx: 256}}\n",
                              &e);
    if (!sw) fail_msg("sweep_load: %s", e.msg);
    assert_string_equal(sweep_name(sw), "n1");
    assert_int_equal(sweep_n_entries(sw), 2);
    assert_string_equal(sweep_entry_name(sw, 0), "a");
    assert_string_equal(sweep_entry_name(sw, 1), "b");
    tg_spec *s;
    const char *t0 = sweep_entry_text(sw, 0);
    if (spec_parse(&s, sweep_entry_path(sw, 0), t0, strlen(t0), &e) < 0) fail_msg("entry a: %s", e.msg);
    assert_int_equal(s->steps, 8);            /* the sweep's override */
    assert_int_equal(s->legs, 3);
    assert_int_equal(s->top_k, 32);           /* untouched */
    assert_int_equal(s->n_arms, 2);           /* ref dropped */
    assert_int_equal(spec_find_arm(s, "ref"), -1);
    assert_int_equal(s->n_prompts, 3);
    spec_free(s);
    const char *t1 = sweep_entry_text(sw, 1);
    if (spec_parse(&s, sweep_entry_path(sw, 1), t1, strlen(t1), &e) < 0) fail_msg("entry b: %s", e.msg);
    assert_int_equal(s->steps, 5);            /* the entry's override beats the sweep's */
    assert_int_equal(s->legs, 3);
    assert_int_equal(s->top_k, 16);
    assert_int_equal(s->n_arms, 3);
    int l = spec_find_arm(s, "llama-cpu"), r = spec_find_arm(s, "ref");
    assert_true(l >= 0 && r >= 0);
    if (!strstr(s->arms[l].options_json, "\"type_k\"") || !strstr(s->arms[l].options_json, "q8_0") ||
        !strstr(s->arms[l].options_json, "\"threads\""))
        fail_msg("llama-cpu options lost or not merged: %s", s->arms[l].options_json);
    if (!strstr(s->arms[r].options_json, "\"n_ctx\""))
        fail_msg("ref options not created: %s", s->arms[r].options_json);
    spec_free(s);
    sweep_free(sw);
}

/* Round-robin shards, 1-based. */
static void test_sweep_shards(void **state)
{
    (void)state;
    int count[5] = {0};
    for (int i = 0; i < 10; i++) {
        int s = sweep_shard_of(i, 4);
        assert_true(s >= 1 && s <= 4);
        count[s]++;
    }
    assert_int_equal(count[1], 3);
    assert_int_equal(count[2], 3);
    assert_int_equal(count[3], 2);
    assert_int_equal(count[4], 2);
    assert_int_equal(sweep_shard_of(0, 1), 1);
    assert_int_equal(sweep_shard_of(7, 1), 1);
}

/* Each bad sweep file is refused with a message naming what was expected. */
static void test_sweep_bad_input(void **state)
{
    (void)state;
    write_spec();
    static const struct { const char *text, *expect; } cases[] = {
        {"name: x\nspecs: []\n", "non-empty list"},
        {"name: x\nspecz: [{spec: spec.yaml}]\n", "unknown key 'specz'"},
        {"specs: [{spec: spec.yaml}]\n", "name: expected"},
        {"name: x\nspecs: [{spec: nope.yaml}]\n", "nope.yaml"},
        {"name: x\nspecs: [{spec: spec.yaml, arms: [cpu, gpu]}]\n", "no arm named 'gpu'"},
        {"name: x\nspecs: [{spec: spec.yaml, arm_options: {gpu: {threads: 1}}}]\n", "no arm named 'gpu'"},
        {"name: x\nspecs: [{spec: spec.yaml, colour: red}]\n", "unknown key 'colour'"},
        {"name: x\nspecs: [{spec: spec.yaml}, {spec: spec.yaml}]\n", "both resolve to the spec name 'tiny'"},
        {"name: x\nspecs: [{spec: spec.yaml, overrides: {steps: -3}}]\n", "steps"},
        {"name: x\nspecs: [{spec: spec.yaml, overrides: {arms: []}}]\n", "arm_options"},
        {"name: x\nspecs: [{spec: spec.yaml, arms: [cpu]}]\n", "reference"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tg_err e = {{0}};
        tg_sweep *sw = load_sweep(cases[i].text, &e);
        if (sw) {
            sweep_free(sw);
            fail_msg("case %zu was accepted: %s", i, cases[i].text);
        }
        if (!strstr(e.msg, cases[i].expect) || !strstr(e.msg, "sweep.yaml"))
            fail_msg("case %zu: message \"%s\" should name sweep.yaml and say \"%s\"", i, e.msg, cases[i].expect);
    }
}

/* Runs the spec `night` of the sweep file into db; returns the row. */
static sweep_row run_night(tg_store *st, const char *sweep_text)
{
    tg_err e;
    tg_sweep *sw = load_sweep(sweep_text, &e);
    if (!sw) fail_msg("sweep_load: %s", e.msg);
    sweep_row row;
    sweep_run_spec(st, sweep_entry_path(sw, 0), sweep_entry_text(sw, 0), g_bin, 2, 0, &row);
    sweep_free(sw);
    if (row.error[0]) fail_msg("night of %s: %s", row.name, row.error);
    return row;
}

/* trend_spec into a string; returns the result. */
static trend_result trend_of(tg_store *st, char *buf, size_t n)
{
    FILE *f = fmemopen(buf, n, "w");
    assert_non_null(f);
    trend_result r;
    tg_err e;
    if (trend_spec(st, "night", 0, f, &r, &e) < 0) fail_msg("trend_spec: %s", e.msg);
    fclose(f);
    return r;
}

static void test_trend_flags_perturbed_night(void **state)
{
    (void)state;
    char p[2 * PATH_MAX], lib[2 * PATH_MAX];
    snprintf(p, sizeof p, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    snprintf(lib, sizeof lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", g_cache);
    char eng[2 * PATH_MAX], lla[2 * PATH_MAX];
    snprintf(eng, sizeof eng, "%s/tg-engine", g_bin);
    snprintf(lla, sizeof lla, "%s/tg-llama", g_bin);
    if (!exists(p) || !exists(lib) || !exists(eng) || !exists(lla)) {
        skip();   /* needs the shipped model, llama.cpp's CPU build, tg-engine and tg-llama */
        return;
    }
    write_spec();
    char db[2 * PATH_MAX];
    snprintf(db, sizeof db, "%s/t.db", g_dir);
    tg_err e;
    tg_store *st;
    if (store_open(&st, db, &e) < 0) fail_msg("%s", e.msg);
    static const char CLEAN[] =
        "name: nightly\n"
        "specs:\n"
        "  - {spec: spec.yaml, name: night, arms: [cpu, llama-cpu], overrides: {steps: 8, prompts: [\n"
        "      {id: p1, text: \"The following options are supported:\"},\n"
        "      {id: p2, text: \"def __init__(self, *args, **kwargs):\"}]}}\n";
    /* the same spec name, with llama.cpp's KV cache in 4 bits: its logits move */
    static const char PERTURBED[] =
        "name: nightly\n"
        "specs:\n"
        "  - {spec: spec.yaml, name: night, arms: [cpu, llama-cpu], overrides: {steps: 8, prompts: [\n"
        "      {id: p1, text: \"The following options are supported:\"},\n"
        "      {id: p2, text: \"def __init__(self, *args, **kwargs):\"}]},\n"
        "     arm_options: {llama-cpu: {type_k: q4_0, type_v: q4_0, flash_attn: \"on\"}}}\n";
    char out[32768];
    sweep_row n1 = run_night(st, CLEAN);
    sweep_row n2 = run_night(st, CLEAN);
    if (strcmp(n1.verdict, "PASS") || strcmp(n2.verdict, "PASS"))
        fail_msg("clean nights should pass: %s, %s", n1.verdict, n2.verdict);
    trend_result r = trend_of(st, out, sizeof out);
    assert_int_equal(r.n_runs, 2);
    if (r.n_regressions || r.n_changes) fail_msg("two clean nights gave %d regressions, %d changes:\n%s",
                                                 r.n_regressions, r.n_changes, out);
    if (!strstr(out, "TREND=CLEAN")) fail_msg("expected TREND=CLEAN:\n%s", out);

    /* the sweep's summary column says the same */
    if (strcmp(n1.trend, "FIRST") || strcmp(n2.trend, "CLEAN"))
        fail_msg("summary trend of nights 1, 2: %s, %s (expected FIRST, CLEAN)", n1.trend, n2.trend);
    sweep_row n3 = run_night(st, PERTURBED);
    if (strcmp(n3.trend, "REGRESSION")) fail_msg("summary trend of night 3: %s, expected REGRESSION", n3.trend);
    r = trend_of(st, out, sizeof out);
    if (r.n_regressions == 0) fail_msg("the perturbed night (%s) was not flagged:\n%s", n3.verdict, out);
    if (r.first_run != n3.run_id) fail_msg("first bad run %lld, expected %lld:\n%s", (long long)r.first_run,
                                           (long long)n3.run_id, out);
    char want[64];
    snprintf(want, sizeof want, "first in run %lld", (long long)n3.run_id);
    if (!strstr(out, want) || !strstr(out, "TREND=REGRESSION")) fail_msg("expected '%s':\n%s", want, out);

    /* the command: exit 1 on a regression, an SVG plot in the markdown report */
    store_close(st);
    char outp[2 * PATH_MAX];
    snprintf(outp, sizeof outp, "%s/trend.txt", g_dir);
    char *argv[] = {"tokgate", "trend", "night", "--db", db, "--format", "md", "--out", outp, NULL};
    assert_int_equal(trend_main(9, argv), 1);
    FILE *f = fopen(outp, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    if (!strstr(out, "<svg") || !strstr(out, "</svg>")) fail_msg("no SVG plot in the md trend:\n%.2000s", out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sweep_resolves_overrides, setup, teardown),
        cmocka_unit_test(test_sweep_shards),
        cmocka_unit_test_setup_teardown(test_sweep_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trend_flags_perturbed_night, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
