/*
 * test_sweep.c: sweep files (harness/sweep.c), the CPUs a plan asks for,
 * and history trends (harness/trend.c).
 *
 * The sweep-file tests resolve entries without running anything: overrides
 * replace spec keys, `arms` keeps a subset, `arm_options` lands in the right
 * options mapping, `spec:` paths resolve from the sweep file's folder only,
 * shards are assigned round robin, the CPUs of a unit are threads x jobs
 * (jobs capped to a given allocation), and every bad input is an error
 * naming the file and what was expected.
 *
 * The history test runs real nights of the shipped tiny trained model (cpu
 * tier against llama.cpp's CPU build, one prompt x 8 steps x 2 legs) into
 * one store through sweep files: a good night; a broken night (the cpu arm
 * cannot load: NOT_MEASURABLE, no data), which is flagged and never becomes
 * a baseline, so the next good night is CLEAN; a night with the engine's
 * `perturb` option (a near tie flips, the verdict stays PASS), flagged as a
 * tokens regression whose likely cause is that option; a night on the same
 * binaries, model and spec whose kernels differ (TG_CPU_ISA=scalar), flagged
 * as a determinism regression; a night whose reference runs with a 4-bit KV
 * cache, blamed on the reference's configuration and not on the engine arm.
 * Then `tokgate baseline accept` makes the latest night the baseline,
 * `exclude` drops a night, both survive `tokgate merge`, and `tokgate
 * trend` exits 1 on a regression with closed markdown emphasis and an SVG
 * plot (no reference in its legend, a marker for the night without data,
 * its axis set by what it draws) into a folder it creates. Skipped when the
 * workers or the model are missing.
 */
#include <limits.h>
#include <sqlite3.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "merge.h"
#include "spec.h"
#include "store.h"
#include "sweep.h"
#include "testenv.h"
#include "trend.h"

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
    write_in(NULL, 0, "spec.yaml", "%s", text);
}

/* The fixture of every test: a fresh g_dir with spec.yaml (write_spec: the
 * spec named tiny) in it. */
static int setup(void **state)
{
    if (testenv_setup(state) < 0) return -1;
    write_spec();
    return 0;
}

static tg_sweep *load_sweep(const char *text, tg_err *e)
{
    char p[2 * PATH_MAX];
    write_in(p, sizeof p, "sweep.yaml", "%s", text);
    tg_sweep *sw = NULL;
    if (sweep_load(&sw, p, e) < 0) return NULL;
    return sw;
}

/* load_sweep of a sweep that must load (the test fails otherwise). */
static tg_sweep *good_sweep(const char *text)
{
    tg_err e;
    tg_sweep *sw = load_sweep(text, &e);
    if (!sw) fail_msg("sweep_load: %s", e.msg);
    return sw;
}

/* Overrides, arm subsets and arm options end up in the resolved spec. */
static void test_sweep_resolves_overrides(void **state)
{
    (void)state;
    tg_err e;
    tg_sweep *sw = good_sweep("name: n1\n"
                              "overrides: {steps: 8, legs: 3}\n"
                              "specs:\n"
                              "  - {spec: spec.yaml, name: a, arms: [cpu, llama-cpu]}\n"
                              "  - spec: spec.yaml\n"
                              "    name: b\n"
                              "    overrides: {steps: 5, top_k: 16}\n"
                              "    arm_options: {llama-cpu: {type_k: q8_0}, ref: {n_ctx: 256}}\n");
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

/* spec: paths resolve from the sweep file's folder, never the current directory. */
static void test_sweep_paths_from_sweep_folder(void **state)
{
    (void)state;
    char sub[2 * PATH_MAX], cwd[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    assert_int_equal(mkdir(sub, 0777), 0);
    /* sub/spec.yaml: the same spec under another name */
    char p[2 * PATH_MAX];
    snprintf(p, sizeof p, "%s/spec.yaml", g_dir);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    assert_non_null(strstr(text, "name: tiny\n"));
    char moved[16500];
    snprintf(moved, sizeof moved, "name: tiny-sub\n%s", strstr(text, "name: tiny\n") + strlen("name: tiny\n"));
    write_in(NULL, 0, "sub/spec.yaml", "%s", moved);
    write_in(NULL, 0, "sub/sweep.yaml", "%s", "name: paths\nspecs: [{spec: spec.yaml}]\n");
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(g_dir), 0);              /* ./spec.yaml exists here too */
    tg_err e;
    tg_sweep *sw = NULL;
    int rc = sweep_load(&sw, "sub/sweep.yaml", &e);
    assert_int_equal(chdir(cwd), 0);
    if (rc < 0) fail_msg("sweep_load: %s", e.msg);
    if (strcmp(sweep_entry_name(sw, 0), "tiny-sub"))
        fail_msg("spec: spec.yaml resolved to %s (%s), expected the sweep folder's (tiny-sub)",
                 sweep_entry_path(sw, 0), sweep_entry_name(sw, 0));
    sweep_free(sw);
    /* a spec only in the current directory is not found */
    snprintf(p, sizeof p, "%s/sub/spec.yaml", g_dir);
    unlink(p);
    assert_int_equal(chdir(g_dir), 0);
    rc = sweep_load(&sw, "sub/sweep.yaml", &e);
    assert_int_equal(chdir(cwd), 0);
    if (rc == 0) {
        sweep_free(sw);
        fail_msg("spec: spec.yaml was found in the current directory, not beside the sweep file");
    }
    if (!strstr(e.msg, "sub/spec.yaml")) fail_msg("the error should name sub/spec.yaml: %s", e.msg);
}

/* A unit needs threads x jobs CPUs; a cap lowers jobs, never threads. */
static void test_sweep_cpus(void **state)
{
    (void)state;
    tg_err e;
    tg_sweep *sw = good_sweep("name: c\n"
                              "specs:\n"
                              "  - {spec: spec.yaml, name: two, arms: [cpu, llama-cpu]}\n"
                              "  - {spec: spec.yaml, name: four, arm_options: {cpu: {threads: 4}}}\n"
                              "  - {spec: spec.yaml, name: unset, arms: [ref, llama-cpu],\n"
                              "     arm_options: {llama-cpu: {threads: 1}}, overrides: {jobs: 3}}\n");
    tg_spec *s[3];
    for (int i = 0; i < 3; i++) {
        const char *t = sweep_entry_text(sw, i);
        if (spec_parse(&s[i], sweep_entry_path(sw, i), t, strlen(t), &e) < 0) fail_msg("entry %d: %s", i, e.msg);
    }
    sweep_cpus c;
    sweep_spec_cpus(s[0], 0, &c);                    /* threads 2 (cpu and llama), jobs 2 */
    assert_int_equal(c.threads, 2);
    assert_int_equal(c.jobs, 2);
    assert_int_equal(c.cpus, 4);
    assert_string_equal(c.note, "");
    sweep_spec_cpus(s[0], 2, &c);                    /* two CPUs: one leg at a time */
    assert_int_equal(c.jobs, 1);
    assert_int_equal(c.cpus, 2);
    if (!strstr(c.note, "jobs 2 -> 1")) fail_msg("note: %s", c.note);
    sweep_spec_cpus(s[0], 1, &c);                    /* fewer CPUs than threads: said */
    assert_int_equal(c.cpus, 2);
    if (!strstr(c.note, "2 threads on 1 CPUs")) fail_msg("note: %s", c.note);
    sweep_spec_cpus(s[1], 0, &c);
    assert_int_equal(c.threads, 4);
    assert_int_equal(c.cpus, 8);
    sweep_spec_cpus(s[2], 0, &c);                    /* ref: 1 thread; jobs 3 of 3 legs (4 minus the first reference leg) */
    assert_int_equal(c.threads, 1);
    assert_int_equal(c.jobs, 3);
    assert_int_equal(c.cpus, 3);
    for (int i = 0; i < 3; i++) spec_free(s[i]);
    sweep_free(sw);
    /* a cpu arm without threads takes every CPU: noted */
    sw = good_sweep("name: c\nspecs:\n  - spec: spec.yaml\n    arms: [cpu, llama-cpu]\n");
    const char *t = sweep_entry_text(sw, 0);
    char *nt = strdup(t), *at = strstr(nt, "threads: 2");
    assert_non_null(at);
    memcpy(at, "n_ctx: 512", 10);                    /* the cpu arm's only option */
    tg_spec *x;
    if (spec_parse(&x, sweep_entry_path(sw, 0), nt, strlen(nt), &e) < 0) fail_msg("%s", e.msg);
    sweep_spec_cpus(x, 0, &c);
    if (!strstr(c.note, "arm cpu sets no threads")) fail_msg("note: %s", c.note);
    spec_free(x);
    free(nt);
    sweep_free(sw);
}

/* Runs the only spec of the sweep text into st; returns its row. */
static sweep_row run_night(tg_store *st, const char *sweep_text)
{
    tg_sweep *sw = good_sweep(sweep_text);
    sweep_row row;
    sweep_run_spec(st, sweep_entry_path(sw, 0), sweep_entry_text(sw, 0), g_bin, 2, 0, &row);
    sweep_free(sw);
    if (row.error[0]) fail_msg("night of %s: %s", row.name, row.error);
    return row;
}

/* trend_spec of "night" into buf; returns the result. */
static trend_result trend_of(tg_store *st, char *buf, size_t n)
{
    FILE *f = fmemopen(buf, n, "w");
    assert_non_null(f);
    trend_result r;
    tg_err e;
    if (trend_spec(st, "night", 0, 0, f, &r, &e) < 0) fail_msg("trend_spec: %s", e.msg);
    fclose(f);
    return r;
}

/* Runs `tokgate ARGS...` in process (NULL-terminated); returns its exit code. */
static int tokgate(int (*fn)(int, char **), ...)
{
    char *argv[24];
    int argc = 0;
    va_list ap;
    va_start(ap, fn);
    char *a;
    while (argc < 23 && (a = va_arg(ap, char *))) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    fflush(stdout);
    return fn(argc, argv);
}

/* How many times prefix occurs in out. */
static int count_lines(const char *out, const char *prefix)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, prefix)); p++) n++;
    return n;
}

/* Fails with the message of fmt after printing out whole (fail_msg cuts
 * long messages). */
#define fail_with(out, fmt, ...)                                  \
    do {                                                          \
        fprintf(stderr, "%s\n", (out));                           \
        fail_msg(fmt " (output above)", ##__VA_ARGS__);           \
    } while (0)

static void test_trend_history(void **state)
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
    char db[2 * PATH_MAX];
    snprintf(db, sizeof db, "%s/t.db", g_dir);
    tg_err e;
    tg_store *st;
    if (store_open(&st, db, &e) < 0) fail_msg("%s", e.msg);
    /* one prompt x 8 steps; the perturbation below flips a near tie of it
     * (which step depends on the kernels: p2/5 on AVX-512 VNNI, p2/0 on AVX2) */
#define NIGHT(extra)                                                                                        \
    "name: nightly\n"                                                                                       \
    "specs:\n"                                                                                              \
    "  - {spec: spec.yaml, name: night, arms: [cpu, llama-cpu], overrides: {steps: 8, prompts: [\n"          \
    "      {id: p2, text: \"def __init__(self, *args, **kwargs):\"}]}" extra "}\n"
    static const char GOOD[] = NIGHT("");
    static const char BROKEN[] = NIGHT(", arm_options: {cpu: {kv_type: q4_0}}");
    static const char PERTURBED[] = NIGHT(", arm_options: {cpu: {perturb: \"noise=0.04:out_norm:-1\"}}");
    static const char REF_KV4[] = NIGHT(", arm_options: {llama-cpu: {type_k: q4_0, type_v: q4_0, flash_attn: \"on\"}}");
    char out[65536];

    /* 1. a good night, 2. a broken one (cpu cannot load), 3. a good one */
    sweep_row n1 = run_night(st, GOOD);
    if (strcmp(n1.verdict, "PASS") || strcmp(n1.trend, "FIRST")) fail_msg("night 1: %s %s", n1.verdict, n1.trend);
    sweep_row n2 = run_night(st, BROKEN);
    if (strcmp(n2.verdict, "NOT_MEASURABLE") || strcmp(n2.trend, "REGRESSION"))
        fail_msg("the broken night: %s, trend %s (expected NOT_MEASURABLE, REGRESSION)", n2.verdict, n2.trend);
    trend_result r = trend_of(st, out, sizeof out);
    if (!strstr(out, "REGRESSION cpu: verdict NOT_MEASURABLE") || !strstr(out, "options.kv_type"))
        fail_with(out, "the broken night should be a verdict regression caused by kv_type");
    sweep_row n3 = run_night(st, GOOD);
    r = trend_of(st, out, sizeof out);
    if (strcmp(n3.trend, "CLEAN") || strcmp(r.word, "CLEAN") || r.n_regressions)
        fail_with(out, "the good night after a broken one: trend %s / %s, %d regressions (the broken night must "
                       "not be a baseline)", n3.trend, r.word, r.n_regressions);
    char want[256];
    snprintf(want, sizeof want, "run %lld against run %lld (the last 1 good run", (long long)n3.run_id,
             (long long)n1.run_id);
    if (!strstr(out, want)) fail_with(out, "expected '%s'", want);
    if (!strstr(out, "no: NOT_MEASURABLE (no data: cpu)")) fail_with(out, "night 2's status should say no data");

    /* 4. the engine's perturb option: a near tie flips, the verdict stays PASS */
    sweep_row n4 = run_night(st, PERTURBED);
    r = trend_of(st, out, sizeof out);
    if (strcmp(n4.verdict, "PASS")) fail_with(out, "the perturbed night should still pass: %s", n4.verdict);
    if (strcmp(r.word, "REGRESSION") || !strstr(out, "REGRESSION cpu: tokens: ") ||
        !strstr(out, "(first p2/") || !strstr(out, " leg 1: token") || !strstr(out, "arm cpu: configuration options.perturb - -> \"noise=0.04:out_norm:-1\""))
        fail_with(out, "the perturbed night should be a tokens regression of cpu caused by its perturb option");
    if (r.first_run != n4.run_id) fail_msg("first run %lld, expected %lld", (long long)r.first_run, (long long)n4.run_id);

    /* 5. the same binaries, model and spec as night 3, other kernels: a determinism regression */
    setenv("TG_CPU_ISA", "scalar", 1);
    sweep_row n5 = run_night(st, GOOD);
    unsetenv("TG_CPU_ISA");
    r = trend_of(st, out, sizeof out);
    snprintf(want, sizeof want, "differ from run %lld, with the same binaries, model and spec", (long long)n3.run_id);
    if (strcmp(n5.trend, "REGRESSION") || !strstr(out, "REGRESSION cpu: determinism:") || !strstr(out, want) ||
        !strstr(out, "binaries, model and spec unchanged; device of cpu:"))
        fail_with(out, "the scalar-kernel night should be a determinism regression against run %lld (night 4 is "
                       "no baseline)", (long long)n3.run_id);
    if (r.first_run != n5.run_id) fail_msg("first run %lld, expected %lld", (long long)r.first_run, (long long)n5.run_id);

    /* 6. the reference's KV cache in 4 bits: the reference changed, not cpu */
    sweep_row n6 = run_night(st, REF_KV4);
    r = trend_of(st, out, sizeof out);
    if (strcmp(n6.trend, "REGRESSION") || r.n_regressions == 0) fail_with(out, "the KV-q4 reference night was not flagged");
    if (strstr(out, "REGRESSION cpu: tokens") || strstr(out, "REGRESSION cpu: determinism"))
        fail_with(out, "cpu is blamed for tokens it decoded over the changed reference");
    int n_causes = count_lines(out, "likely cause (run"),
        n_ref = count_lines(out, "): arm llama-cpu (the reference): configuration ");
    if (n_causes == 0 || n_ref != n_causes || !strstr(out, "llama.options.type_k - -> \"q4_0\""))
        fail_with(out, "every regression should name the reference's configuration (type_k) first");
    if (strstr(out, "REGRESSION cpu:") && !strstr(out, "(cpu itself unchanged)"))
        fail_with(out, "a regression of cpu should say cpu itself is unchanged");
    store_close(st);

    /* the team accepts night 6 as the new baseline: CLEAN, the reason kept */
    char r6[32], r2[32];
    snprintf(r6, sizeof r6, "%lld", (long long)n6.run_id);
    snprintf(r2, sizeof r2, "%lld", (long long)n2.run_id);
    assert_int_equal(tokgate(trend_baseline_main, "tokgate", "baseline", "accept", r2, "--db", db, "--reason", "x", NULL), 2);
    assert_int_equal(tokgate(trend_baseline_main, "tokgate", "baseline", "accept", r6, "--db", db, NULL), 2);
    assert_int_equal(tokgate(trend_baseline_main, "tokgate", "baseline", "accept", r6, "--db", db, "--reason",
                             "llama.cpp KV cache in q4_0 from now on", NULL), 0);
    if (store_open(&st, db, &e) < 0) fail_msg("%s", e.msg);
    r = trend_of(st, out, sizeof out);
    if (strcmp(r.word, "CLEAN") || !strstr(out, "is an accepted baseline") || !strstr(out, "KV cache in q4_0 from now on"))
        fail_with(out, "after accepting run %s the trend should be CLEAN with the reason", r6);
    store_close(st);
    /* excluding night 6 makes night 5 the latest again */
    assert_int_equal(tokgate(trend_baseline_main, "tokgate", "baseline", "exclude", r6, "--db", db, "--reason",
                             "wrong cluster", NULL), 0);
    if (store_open(&st, db, &e) < 0) fail_msg("%s", e.msg);
    r = trend_of(st, out, sizeof out);
    store_close(st);
    if (r.latest_run != n5.run_id || strcmp(r.word, "REGRESSION") || r.n_excluded != 1 || !strstr(out, "excluded: wrong cluster"))
        fail_with(out, "with run %s excluded the latest should be run %lld again", r6, (long long)n5.run_id);
    /* the decisions travel with merge */
    char mdb[2 * PATH_MAX];
    snprintf(mdb, sizeof mdb, "%s/m.db", g_dir);
    assert_int_equal(tokgate(merge_main, "tokgate", "merge", db, "-o", mdb, NULL), 0);
    assert_int_equal(tokgate(merge_main, "tokgate", "merge", db, "-o", mdb, NULL), 0);   /* idempotent */
    if (store_open(&st, mdb, &e) < 0) fail_msg("%s", e.msg);
    char out2[65536];
    trend_result r2m;
    FILE *f = fmemopen(out2, sizeof out2, "w");
    if (trend_spec(st, "night", 0, 0, f, &r2m, &e) < 0) fail_msg("%s", e.msg);
    fclose(f);
    sqlite3_stmt *q;
    int marks = -1;
    if (sqlite3_prepare_v2(store_db(st), "SELECT count(*) FROM trend_mark", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        marks = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    store_close(st);
    if (marks != 2 || r2m.n_excluded != 1 || strcmp(r2m.word, r.word))
        fail_msg("merged store: %d marks (expected 2), %d excluded, trend %s (expected %s)", marks, r2m.n_excluded,
                 r2m.word, r.word);

    /* the command: exit 1 on a regression; markdown emphasis closed; the SVG */
    char outp[2 * PATH_MAX], svgd[2 * PATH_MAX];
    snprintf(outp, sizeof outp, "%s/trend.txt", g_dir);
    snprintf(svgd, sizeof svgd, "%s/svg/a/b", g_dir);
    assert_int_equal(tokgate(trend_main, "tokgate", "trend", "night", "--db", db, "--format", "md", "--out", outp,
                             "--svg", svgd, NULL), 1);
    f = fopen(outp, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    if (!strstr(out, "<svg") || !strstr(out, "</svg>")) fail_with(out, "no SVG plot in the md trend");
    for (char *line = out; line && *line;) {
        char *nl = strchr(line, '\n');
        int stars = 0;
        for (char *c = line; *c && c != nl; c++)
            if (c[0] == '*' && c[1] == '*') stars++, c++;
        if (stars % 2) fail_msg("unclosed ** in the md trend: %.*s", nl ? (int)(nl - line) : 200, line);
        line = nl ? nl + 1 : NULL;
    }
    if (!strstr(out, "- **REGRESSION** cpu: determinism")) fail_with(out, "md regression line");
    char svgp[2 * PATH_MAX + 32];
    snprintf(svgp, sizeof svgp, "%s/night-trend.svg", svgd);
    f = fopen(svgp, "r");
    if (!f) fail_msg("--svg %s: no %s", svgd, svgp);
    n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    if (strstr(out, ">llama-cpu</text>")) fail_with(out, "the reference is in the SVG legend");
    if (!strstr(out, ">cpu</text>")) fail_with(out, "cpu is not in the SVG legend");
    if (!strstr(out, "<title>cpu: no data (NOT_MEASURABLE)</title>")) fail_with(out, "no marker for the night without data");
    if (strstr(out, ">1.000</text>")) fail_with(out, "the axis is stretched to 1 by the night it does not draw");

    /* trend reads the store read-only: a --db typo is "no such store", nothing created;
     * a trend that fails leaves no --out file (written through a temporary) */
    char nodb[2 * PATH_MAX], bad_out[2 * PATH_MAX];
    snprintf(nodb, sizeof nodb, "%s/m.db-typo", g_dir);
    snprintf(bad_out, sizeof bad_out, "%s/trend-bad.txt", g_dir);
    assert_int_equal(tokgate(trend_main, "tokgate", "trend", "--db", nodb, NULL), 2);
    assert_int_not_equal(access(nodb, F_OK), 0);
    assert_int_equal(tokgate(trend_main, "tokgate", "trend", "--db", db, "--plan", nodb, "--out", bad_out, NULL), 2);
    assert_int_equal(tokgate(trend_main, "tokgate", "trend", "no-such-spec", "--db", db, "--out", bad_out, NULL), 2);
    assert_int_not_equal(access(bad_out, F_OK), 0);
    assert_int_equal(tokgate(trend_main, "tokgate", "trend", "--db", db, "--window", "0", NULL), 2);
    assert_int_equal(tokgate(trend_main, "tokgate", "trend", "--db", db, "--frob", NULL), 2);
    assert_int_equal(tokgate(trend_baseline_main, "tokgate", "baseline", "list", "--db", nodb, NULL), 2);
    assert_int_not_equal(access(nodb, F_OK), 0);
}

TG_TEST_MAIN_WITH(
    setup, testenv_teardown, test_sweep_resolves_overrides, test_sweep_shards, test_sweep_bad_input, test_sweep_paths_from_sweep_folder,
    test_sweep_cpus, test_trend_history)
