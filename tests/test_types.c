/*
 * test_types.c: the engine on files llama.cpp quantized in types the
 * project ships no model of (Q4_0, Q4_1, Q5_0, Q5_1, Q3_K_M, Q2_K).
 *
 *  - tg-llama-quantize requantizes the shipped model with llama.cpp's own
 *    quantizer (llama_model_quantize) into each type; the loader reads the
 *    file and its layer matrices are of that type (some of them, in the
 *    K mixtures);
 *  - a gate of the cpu tier against llama.cpp's CPU build on that file,
 *    the ref tier as the exact arbiter, a stage replay, judged like the
 *    default spec (the calibrated policy over a panel of legitimate
 *    variants): the cpu tier PASSes, its replay too;
 *  - a file in a type the engine refuses (IQ4_NL): the engine arms are
 *    NOT_MEASURABLE with the loader's message, llama.cpp runs it;
 *  - the same gate with a mutant tg-engine (the .mut files of
 *    tests/mutants/types/, e.g. a Q5_0 unpacking slip) fails, and the
 *    replay's first stage over budget is the one the mutation file names.
 * Skipped when the llama.cpp library, tg-engine or tg-llama-quantize is
 * missing, and in a sanitizer build (test_quant holds the kernels there;
 * these runs test numerics).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "arm.h"
#include "model.h"
#include "mutation.h"
#include "testenv.h"

static char g_lib[PATH_MAX + 128];

/* Whether everything the real runs need is here. */
static int have_tools(void)
{
    char p[2 * PATH_MAX];
    snprintf(g_lib, sizeof g_lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", g_cache);
    snprintf(p, sizeof p, "%s/tg-llama-quantize", g_bin);
    int ok = exists(g_lib) && exists(p);
    snprintf(p, sizeof p, "%s/tg-engine", g_bin);
    ok = ok && exists(p);
    snprintf(p, sizeof p, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    return ok && exists(p);
}

/* Runs argv (at most 600 s); returns its exit status, -1 when it did not
 * run to an exit; its stderr into *err when err is not NULL. */
static int run_argv(char *const *argv, char **err)
{
    char *o = NULL;
    size_t ol = 0;
    arm_exit x;
    tg_err e;
    int rc = arm_run_command(argv, 600, 0, 0, NULL, &o, &ol, &x, &e);
    int status = rc == 0 ? 0 : x.exit_status > 0 ? x.exit_status : -1;
    if (rc < 0 && status < 0) fprintf(stderr, "%s: %s\n", argv[0], e.msg);
    if (err) *err = x.stderr_text ? strdup(x.stderr_text) : strdup("");
    free(o);
    arm_exit_free(&x);
    return status;
}

/* The shipped model requantized by llama.cpp into type (tg-llama-quantize's
 * names: q4_0, q4_1, q5_0, q5_1, q3_k_m, q2_k) at g_dir/tiny-TYPE.gguf (path into out);
 * the loader reads it and its layer matrices include want (all of them
 * when all is set; llama-quantize's K mixtures give some layers more
 * bits). */
static void quantize(const char *type, uint32_t want, int all, char *out, size_t n)
{
    char tool[2 * PATH_MAX], in[2 * PATH_MAX], name[64];
    snprintf(tool, sizeof tool, "%s/tg-llama-quantize", g_bin);
    snprintf(in, sizeof in, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    snprintf(name, sizeof name, "tiny-%s.gguf", type);
    path_in(out, n, name);
    char *argv[] = {tool, "--lib", g_lib, in, out, (char *)type, NULL};
    char *err = NULL;
    const int rc = run_argv(argv, &err);
    if (rc != 0) fail_msg("tg-llama-quantize %s exited %d:\n%s", type, rc, err);
    free(err);
    tg_model *m;
    tg_err e = {{0}};
    if (tg_model_load(&m, out, &e)) fail_msg("the %s file does not load: %s", type, e.msg);
    int of_want = 0, total = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const tg_layer *L = &m->layers[l];
        const tg_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++, total++) {
            of_want += w[i]->type == want;
            if (all && w[i]->type != want)
                fail_msg("%s: layer %d %s is %s, expected %s", out, l, w[i]->name, tg_type_name(w[i]->type),
                         tg_type_name(want));
        }
    }
    if (!of_want) fail_msg("%s: no layer matrix is %s", out, tg_type_name(want));
    printf("  %s: %d of %d layer matrices %s\n", type, of_want, total, tg_type_name(want));
    tg_model_free(m);
}

/* The files the tests make: tg-llama-quantize's type, the weight type it
 * is there for, whether every layer matrix has it. */
static const struct { const char *type; uint32_t want; int all; } FILES[] = {
    {"q4_0", TG_TYPE_Q4_0, 1},
    {"q5_0", TG_TYPE_Q5_0, 1},
    {"q3_k_m", TG_TYPE_Q3_K, 0},
    {"q2_k", TG_TYPE_Q2_K, 0},
    {"q4_1", TG_TYPE_Q4_1, 1},
    {"q5_1", TG_TYPE_Q5_1, 1},
};

static int file_index(const char *type)
{
    for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++)
        if (!strcmp(FILES[i].type, type)) return (int)i;
    return -1;
}

/* A gate spec for the file at model (g_dir/NAME.yaml, its path into out):
 * the cpu tier against llama.cpp's CPU build, the ref tier as the exact
 * arbiter, a stage replay. With panel, the calibrated policy over a panel
 * of legitimate variants (the cpu tier's scalar kernels and f32 KV cache,
 * llama.cpp without flash attention and limited to its haswell backend),
 * as the default spec judges: the logits of a 2- or 3-bit file move more
 * between legitimate builds (0.1 between our own two kernel ISAs on the
 * Q3_K_M file) than a fixed band allows. Without, near-tie with the
 * default band (the mutants, which only have to fail). */
static void write_spec(const char *name, const char *model, int panel, char *out, size_t n)
{
    char sha[65], fname[80], haswell[2 * PATH_MAX], arms[8 * PATH_MAX];
    tg_err e;
    assert_int_equal(tg_sha256_file(model, sha, &e), 0);
    snprintf(fname, sizeof fname, "%s.yaml", name);
    snprintf(haswell, sizeof haswell, "%s/llama-haswell/libllama.so", g_build);
    int o = snprintf(arms, sizeof arms,
                     "  - {name: cpu, engine: cpu, options: {threads: 2}}\n"
                     "  - {name: ref, engine: ref}\n"
                     "  - {name: llama-cpu, llama: {lib: %s, options: {threads: 1}}}\n",
                     g_lib);
    if (panel) {
        o += snprintf(arms + o, sizeof arms - o,
                      "  - {name: cpu-scalar, variant_of: cpu, engine: cpu, env: {TG_CPU_ISA: scalar}, options: {threads: 2}}\n"
                      "  - {name: cpu-kvf32, variant_of: cpu, engine: cpu, options: {threads: 2, kv_type: f32}}\n"
                      "  - {name: llama-nofa, variant_of: llama-cpu, llama: {lib: %s, options: {threads: 1, flash_attn: \"off\"}}}\n",
                      g_lib);
        if (exists(haswell))
            snprintf(arms + o, sizeof arms - o,
                     "  - {name: llama-haswell, variant_of: llama-cpu, llama: {lib: %s, options: {threads: 1}}}\n", haswell);
    }
    write_in(out, n, fname,
             "name: %s\n"
             "model: {path: %s, sha256: %s}\n"
             "prompts:\n"
             "  - {id: p1, text: \"The following options are supported:\"}\n"
             "  - {id: p2, text: \"def main(argv):\\n    parser = argparse.ArgumentParser(\"}\n"
             "  - {id: p3, text: \"NAME\\n       cp - copy files and directories\\n\\nSYNOPSIS\\n\"}\n"
             "  - {id: p4, text: \"class Queue:\\n    \\\"\\\"\\\"A first-in, first-out queue.\"}\n"
             "steps: 24\ntop_k: 32\nlegs: 2\nmode: teacher-forced\n"
             "reference: llama-cpu\nexact: ref\n"
             "%s"
             "arms:\n%s"
             "replay: {steps: 24}\n",
             name, model, sha,
             panel ? "policy: {kind: calibrated, band: 0.20}\ncalibration: {factor: 2, limit_k: 3, budget: 2}\n"
                   : "policy: {kind: near-tie, band: 0.20}\n",
             arms);
}

/* `tokgate gate spec --db db` with the workers of bin_dir (NULL: this
 * build's); returns the exit status, stderr into *err. */
static int gate(const char *bin_dir, const char *spec, const char *db, char **err)
{
    if (bin_dir) setenv("TOKGATE_BIN", bin_dir, 1);
    char *argv[] = {g_tokgate, "gate", (char *)spec, "--db", (char *)db, NULL};
    const int rc = run_argv(argv, err);
    unsetenv("TOKGATE_BIN");
    return rc;
}

/* The latest run's whole-run verdict key of arm in the store at db (the
 * last verdict set), into buf; "" when there is none. */
static void arm_key(const char *db, const char *arm, const char *key, char *buf, size_t n)
{
    sqlite3 *h;
    sqlite3_stmt *q;
    buf[0] = 0;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) fail_msg("%s: %s", db, sqlite3_errmsg(h));
    if (sqlite3_prepare_v2(h,
                           "SELECT value FROM verdict WHERE run_id = (SELECT max(id) FROM run) AND arm = ?1 AND key = ?2"
                           " AND prompt IS NULL ORDER BY id DESC LIMIT 1",
                           -1, &q, NULL) != SQLITE_OK)
        fail_msg("%s: %s", db, sqlite3_errmsg(h));
    sqlite3_bind_text(q, 1, arm, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, key, -1, SQLITE_STATIC);
    if (sqlite3_step(q) == SQLITE_ROW) snprintf(buf, n, "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    sqlite3_close(h);
}

static void gate_passes(const char *type)
{
    if (!have_tools()) skip_msg("llama.cpp's library, tg-engine or tg-llama-quantize missing");
    if (strstr(g_build, "asan")) skip_msg("gates in a sanitizer build");
    char model[PATH_MAX + 64], spec[PATH_MAX + 64], db[PATH_MAX + 64], name[64];
    const int f = file_index(type);
    assert_true(f >= 0);
    quantize(type, FILES[f].want, FILES[f].all, model, sizeof model);
    snprintf(name, sizeof name, "tiny-%s", type);
    write_spec(name, model, 1, spec, sizeof spec);
    path_in(db, sizeof db, "gate.db");
    char *err = NULL, word[32], cpu[32], replay[32];
    const int rc = gate(NULL, spec, db, &err);
    /* the cpu tier is what this file is for; the whole gate's word is
     * printed (on a 2-bit file a thin panel's control limits can flag one
     * of its own legitimate variants) */
    if (rc < 0 || rc > 1) fail_msg("the gate on the %s file exited %d:\n%s", type, rc, err);
    arm_key(db, "cpu", "TOKEN_GATE", cpu, sizeof cpu);
    arm_key(db, "cpu", "REPLAY", replay, sizeof replay);
    if (strcmp(cpu, "PASS")) fail_msg("the cpu tier's TOKEN_GATE on the %s file is '%s' (PASS expected):\n%s", type, cpu, err);
    if (strcmp(replay, "PASS")) fail_msg("the cpu tier's REPLAY on the %s file is '%s' (PASS expected):\n%s", type, replay, err);
    snprintf(word, sizeof word, "%s", rc == 0 ? "PASS" : "FAIL");
    printf("  %s: the cpu tier passes, its replay too; the whole gate (%s) exits %d\n", type, word, rc);
    free(err);
}

static void test_q4_0_gate(void **state)
{
    (void)state;
    gate_passes("q4_0");
}

static void test_q5_0_gate(void **state)
{
    (void)state;
    gate_passes("q5_0");
}

static void test_q3_k_m_gate(void **state)
{
    (void)state;
    gate_passes("q3_k_m");
}

static void test_q2_k_gate(void **state)
{
    (void)state;
    gate_passes("q2_k");
}

static void test_q4_1_gate(void **state)
{
    (void)state;
    gate_passes("q4_1");
}

static void test_q5_1_gate(void **state)
{
    (void)state;
    gate_passes("q5_1");
}

/* A type the engine does not compute with (IQ4_NL): the engine arms'
 * legs fail to load with the loader's message (the tensor, its type, the
 * types taken), the arms are NOT_MEASURABLE with that reason, nothing
 * aborts, and llama.cpp still runs the file. */
static void test_refused_type(void **state)
{
    (void)state;
    if (!have_tools()) skip_msg("llama.cpp's library, tg-engine or tg-llama-quantize missing");
    if (strstr(g_build, "asan")) skip_msg("gates in a sanitizer build");
    char tool[2 * PATH_MAX], in[2 * PATH_MAX], model[PATH_MAX + 64], spec[PATH_MAX + 64], db[PATH_MAX + 64];
    snprintf(tool, sizeof tool, "%s/tg-llama-quantize", g_bin);
    snprintf(in, sizeof in, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    path_in(model, sizeof model, "tiny-iq4_nl.gguf");
    char *argv[] = {tool, "--lib", g_lib, in, model, "iq4_nl", NULL};
    char *err = NULL;
    int rc = run_argv(argv, &err);
    if (rc != 0) fail_msg("tg-llama-quantize iq4_nl exited %d:\n%s", rc, err);
    free(err);
    write_spec("tiny-iq4_nl", model, 0, spec, sizeof spec);
    path_in(db, sizeof db, "gate.db");
    rc = gate(NULL, spec, db, &err);
    char word[32], why[1024], ref[32];
    arm_key(db, "cpu", "TOKEN_GATE", word, sizeof word);
    arm_key(db, "cpu", "REASON", why, sizeof why);
    arm_key(db, "llama-cpu", "LEGS_CLEAN", ref, sizeof ref);
    printf("  iq4_nl: gate exit %d; cpu %s: %s; llama-cpu legs clean %s\n", rc, word, why, ref);
    if (rc < 0) fail_msg("the gate did not run to an exit:\n%s", err);
    assert_string_equal(word, "NOT_MEASURABLE");
    if (!strstr(why, "iq4_nl") || !strstr(why, "blk.") || !strstr(why, "expected one of"))
        fail_msg("the cpu arm's reason does not name the tensor, its type and the types taken: %s", why);
    assert_string_equal(ref, "2/2");
    free(err);
}

static void test_mutants_apply(void **state)
{
    (void)state;
    char err[4096];
    const int n = mutation_check_dir(g_root, "tests/mutants/types", 1, err, sizeof err);
    if (n < 0) fail_msg("%s", err);
    assert_true(n >= 1);
}

/* Each mutation of tests/mutants/types/ (its name starts with the type its
 * file is quantized to: q4_0-, q5_1-, q3_k_m-, ...) fails the gate, and
 * the replay of p1 names its stage first. */
static void test_mutants(void **state)
{
    (void)state;
    if (!have_tools()) skip_msg("llama.cpp's library, tg-engine or tg-llama-quantize missing");
    if (strstr(g_build, "asan")) skip_msg("mutants in a sanitizer build");
    char dirp[PATH_MAX + 32], names[64][64], err[8192];
    snprintf(dirp, sizeof dirp, "%s/tests/mutants/types", g_root);
    const int n = mutation_list(dirp, names, 64);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        char type[32];
        snprintf(type, sizeof type, "%.*s", (int)strcspn(names[i], "-"), names[i]);
        const int f = file_index(type);
        if (f < 0)
            fail_msg("%s/%s.mut: the name must start with the type of its file (q4_0-, q4_1-, q5_0-, q5_1-, "
                     "q3_k_m- or q2_k-)", dirp, names[i]);
        char mp[PATH_MAX * 2], wd[PATH_MAX * 2], model[PATH_MAX + 64], spec[PATH_MAX + 64], db[PATH_MAX + 64];
        snprintf(mp, sizeof mp, "%s/%.63s.mut", dirp, names[i]);
        snprintf(wd, sizeof wd, "%s/m%d", g_dir, i);
        mutation m;
        if (mutation_parse(mp, &m, err, sizeof err) < 0) fail_msg("%s", err);
        if (!mutation_cpu_ok(&m)) {
            printf("  mutant %s skipped: this CPU lacks %s\n", names[i], m.needs);
            mutation_free(&m);
            continue;
        }
        if (mutation_build(g_build, mp, wd, err, sizeof err) < 0) fail_msg("%s", err);
        quantize(type, FILES[f].want, FILES[f].all, model, sizeof model);
        write_spec(names[i], model, 0, spec, sizeof spec);
        snprintf(db, sizeof db, "%s/m%d.db", g_dir, i);
        char *log = NULL;
        if (m.env_key[0]) setenv(m.env_key, m.env_val, 1);   /* the kernels the mutated code is in */
        const int rc = gate(wd, spec, db, &log);
        if (m.env_key[0]) unsetenv(m.env_key);
        char want[128];
        snprintf(want, sizeof want, "tokgate: replay cpu p1: OVER_BUDGET=layer %d %s ", m.layer, m.stage);
        const char *first = strstr(log, "tokgate: replay cpu p1: OVER_BUDGET=");
        const char *shown = first ? first + 24 : "(none)";
        printf("  mutant %s: gate exit %d; first over budget on p1: %.*s\n", names[i], rc,
               (int)strcspn(shown, "\n"), shown);
        if (rc == 0) fail_msg("mutant %s (%s) passed the gate on the %s file", names[i], m.what, type);
        if (!first || strncmp(first, want, strlen(want)))
            fail_msg("mutant %s: the replay of p1 does not name layer %d %s first:\n%s", names[i], m.layer, m.stage,
                     log);
        free(log);
        testenv_rm_tree(wd);
        mutation_free(&m);
    }
}

static int setup(void **state)
{
    (void)state;
    return testenv_init("types");
}

TG_TEST_MAIN_WITH(setup, testenv_teardown, test_mutants_apply, test_q4_0_gate, test_q5_0_gate, test_q3_k_m_gate,
                  test_q2_k_gate, test_q4_1_gate, test_q5_1_gate, test_refused_type, test_mutants)
