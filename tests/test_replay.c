/*
 * test_replay.c: stage replay (engine/replay.c, harness/replay.c).
 *
 *  - replay files round-trip; replay_compare on crafted records: a stage
 *    over its budget, NaN (a value the arm never wrote) over, the first
 *    over in forward order, the final stages last; the noise model's
 *    stated values;
 *  - real tg-engine runs on the shipped trained model (80 positions):
 *    the ref tier against the arbiter is exact; the cpu tier on every
 *    legitimate variant of the panel (threads 1 and 2, every kernel ISA
 *    this machine has and scalar via TG_CPU_ISA, KV f16 and f32) has no
 *    stage over budget;
 *  - the mutation suite tests/mutants/replay/ (*.mut files, format:
 *    tests/mutants/README.md): every file applies to the current sources
 *    (a missing anchor fails the test, naming it); tg-mutate builds each
 *    into a mutant tg-engine, and the replay must name the layer and stage
 *    of its `stage:` line as the first stage over budget;
 *  - an arm that cannot replay (a worker without the op) is reported so.
 * The real runs skip when tg-engine is not built; the mutants also under
 * the sanitizer build (they test numerics, not memory).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model.h"
#include "mutation.h"
#include "replay.h"
#include "spec.h"
#include "testenv.h"
#include "tokenizer.h"

extern char **environ;

static char g_model[PATH_MAX + 64];
static int32_t *g_tok;
static int g_n_tok;

#define N_POS 80   /* positions replayed: past 64, where a RoPE table may stop */
#define N_PROMPT 64   /* of them in one batch, as a prompt; the last 16 one at a time, as decode steps */

static int setup(void **st)
{
    (void)st;
    int rc = testenv_init("replay");
    snprintf(g_model, sizeof g_model, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    return rc;
}

static int teardown(void **st)
{
    (void)st;
    free(g_tok);
    return testenv_clean();
}

/* ------------------------------------------------------------------ */
/* Crafted files                                                       */

static rp_file *craft(int T)
{
    rp_file *f = calloc(1, sizeof *f);
    f->n_layer = 2, f->n_embd = 8, f->n_head = 2, f->n_head_kv = 1, f->head_dim = 4, f->n_ff = 16;
    f->n_vocab = 32, f->n_tokens = (uint32_t)T;
    int stages[] = {0, 19};   /* attn_norm, residual */
    f->rec = calloc(8, sizeof *f->rec);
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++) {
            rp_record *r = &f->rec[f->n_rec++];
            r->layer = l, r->stage = stages[k], r->n = (int64_t)T * 8;
            r->data = malloc(sizeof(float) * (size_t)r->n);
            for (int64_t i = 0; i < r->n; i++) r->data[i] = (float)(1.0 + 0.25 * (double)((i * 7) % 5));
        }
    rp_record *r = &f->rec[f->n_rec++];
    r->layer = -1, r->stage = 21, r->n = 32;
    r->data = malloc(sizeof(float) * 32);
    for (int i = 0; i < 32; i++) r->data[i] = (float)i;
    return f;
}

static rp_file *copy_file(const rp_file *a)
{
    rp_file *f = calloc(1, sizeof *f);
    *f = *a;
    f->rec = calloc((size_t)a->n_rec, sizeof *f->rec);
    for (int i = 0; i < a->n_rec; i++) {
        f->rec[i] = a->rec[i];
        f->rec[i].data = malloc(sizeof(float) * (size_t)a->rec[i].n);
        memcpy(f->rec[i].data, a->rec[i].data, sizeof(float) * (size_t)a->rec[i].n);
    }
    return f;
}

static void test_file_roundtrip(void **st)
{
    (void)st;
    rp_file *f = craft(3), *g = NULL;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/x.rpl", g_dir);
    tg_err e;
    assert_int_equal(rp_file_write(f, path, NULL, NULL, &e), 0);
    assert_int_equal(rp_file_read(&g, path, &e), 0);
    assert_int_equal(g->n_rec, f->n_rec);
    assert_int_equal(g->n_tokens, 3);
    for (int i = 0; i < f->n_rec; i++) {
        assert_int_equal(g->rec[i].layer, f->rec[i].layer);
        assert_int_equal(g->rec[i].stage, f->rec[i].stage);
        assert_memory_equal(g->rec[i].data, f->rec[i].data, sizeof(float) * (size_t)f->rec[i].n);
    }
    rp_file_free(g);
    /* a truncated file is refused */
    FILE *fp = fopen(path, "r+");
    assert_int_equal(ftruncate(fileno(fp), 60), 0);
    fclose(fp);
    assert_int_equal(rp_file_read(&g, path, &e), -1);
    assert_non_null(strstr(e.msg, "truncated"));
    rp_file_free(f);
}

static void test_compare_crafted(void **st)
{
    (void)st;
    rp_file *a = craft(3), *b = copy_file(a);
    rp_numerics num = {.act_vec_dot = 1};
    rp_table *t;
    tg_err e;
    /* identical: nothing over */
    assert_int_equal(replay_compare(a, b, &num, &t, &e), 0);
    assert_int_equal(t->n_rows, 5);
    assert_int_equal(t->first, -1);
    assert_int_equal(t->rows[4].layer, -1);   /* the logits last */
    replay_table_free(t);
    /* one token of layer 1's attn_norm off by 1e-3 relative, and a NaN in layer 1's residual */
    for (int i = 8; i < 16; i++) b->rec[2].data[i] *= 1.001f;
    b->rec[3].data[5] = NAN;
    assert_int_equal(replay_compare(a, b, &num, &t, &e), 0);
    assert_int_equal(t->n_over, 2);
    assert_int_equal(t->rows[t->first].layer, 1);
    assert_int_equal(t->rows[t->first].stage, 0);
    assert_int_equal(t->rows[t->first].worst_pos, 1);
    assert_true(fabs(t->rows[t->first].max_rel - 1e-3) < 1e-4);
    assert_true(isinf(t->rows[t->first + 1].ratio));
    replay_table_free(t);
    /* a noise-sized change (a few f32 ulps) stays under budget */
    rp_file_free(b);
    b = copy_file(a);
    for (int i = 0; i < 24; i++) b->rec[0].data[i] = nextafterf(b->rec[0].data[i], INFINITY);
    assert_int_equal(replay_compare(a, b, &num, &t, &e), 0);
    assert_int_equal(t->first, -1);
    replay_table_free(t);
    /* other dimensions are refused */
    b->n_tokens = 4;
    assert_int_equal(replay_compare(a, b, &num, &t, &e), -1);
    rp_file_free(a);
    rp_file_free(b);
}

static void test_noise_model(void **st)
{
    (void)st;
    rp_file f = {.n_layer = 1, .n_embd = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_ff = 768,
                 .n_vocab = 8192, .n_tokens = 10};
    rp_numerics cpu, exact;
    tg_err e;
    assert_int_equal(replay_numerics_parse("{\"exact\":false,\"act\":\"vec_dot\",\"kv\":\"f16\",\"attn_acc\":\"kv\","
                                           "\"accum\":\"f32\",\"silu\":\"ggml-expf\"}", &cpu, &e), 0);
    assert_int_equal(replay_numerics_parse("{\"exact\":true,\"accum\":\"f64\",\"kv\":\"f32\"}", &exact, &e), 0);
    assert_true(cpu.acc_f16 && cpu.act_vec_dot && !cpu.accum_f64);
    assert_true(exact.exact && exact.accum_f64 && !exact.acc_f16);
    /* q_proj: u (2 + sqrt(256/16)) */
    assert_true(fabs(replay_noise(&cpu, &f, 1, 0) - 0x1p-24 * 6) < 1e-15);
    /* an exact arm's projection: the output's rounding only */
    assert_true(fabs(replay_noise(&exact, &f, 1, 0) - 0x1p-24 * 2) < 1e-15);
    /* attention with an f16 accumulator grows with the position, and dwarfs the f32 case */
    assert_true(replay_noise(&cpu, &f, 11, 63) > replay_noise(&cpu, &f, 11, 0));
    assert_true(replay_noise(&cpu, &f, 11, 63) > 50 * replay_noise(&exact, &f, 11, 63));
    /* a budget is far below the Q8 rounding (1e-2) and bf16 (4e-3) */
    for (int s = 0; s < RP_N_STAGES; s++)
        if (s != 11) assert_true(RP_MARGIN * replay_noise(&cpu, &f, s, 79) < 2e-5);
    assert_int_equal(replay_numerics_parse("[1]", &cpu, &e), -1);
}

/* The spec field replay: {steps: N, gate: B}. */
static void test_spec_field(void **st)
{
    (void)st;
    const char *base = "name: x\nmodel: {path: m.gguf, sha256: 0000000000000000000000000000000000000000000000000000000000000000}\n"
                       "prompts:\n  - {id: p1, text: a}\nsteps: 8\ntop_k: 4\nlegs: 1\nreference: cpu\n"
                       "policy: {kind: exact}\narms:\n  - {name: cpu, engine: cpu}\n";
    char text[1024];
    tg_spec *s = NULL;
    tg_err e;
    snprintf(text, sizeof text, "%s", base);
    assert_int_equal(spec_parse(&s, "x.yaml", text, strlen(text), &e), 0);
    assert_int_equal(s->replay, 0);
    spec_free(s);
    snprintf(text, sizeof text, "%sreplay: {steps: 8}\n", base);
    assert_int_equal(spec_parse(&s, "x.yaml", text, strlen(text), &e), 0);
    assert_true(s->replay && s->replay_steps == 8 && s->replay_gate == 1);
    spec_free(s);
    snprintf(text, sizeof text, "%sreplay: {steps: 0, gate: false}\n", base);
    assert_int_equal(spec_parse(&s, "x.yaml", text, strlen(text), &e), 0);
    assert_true(s->replay && s->replay_steps == 0 && s->replay_gate == 0);
    spec_free(s);
    const char *bad[] = {"replay: {steps: 100001}", "replay: {gate: true}", "replay: {steps: 2, gate: maybe}",
                         "replay: {steps: 2, when: always}", "replay: 4"};
    const char *want[] = {"replay.steps", "replay.steps", "replay.gate", "replay", "replay"};
    for (int i = 0; i < 5; i++) {
        snprintf(text, sizeof text, "%s%s\n", base, bad[i]);
        s = NULL;
        assert_int_equal(spec_parse(&s, "x.yaml", text, strlen(text), &e), -1);
        printf("%s -> %s\n", bad[i], e.msg);
        assert_non_null(strstr(e.msg, want[i]));
    }
}

/* ------------------------------------------------------------------ */
/* Real runs                                                           */

static int have_engine(void)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/bin/tg-engine", g_build);
    return access(p, X_OK) == 0 && access(g_model, R_OK) == 0;
}

/* The tokens replayed: a manual-page text, repeated to N_POS. */
static void tokens(void)
{
    if (g_tok) return;
    tg_model *m;
    tg_tokenizer *t;
    tg_err e;
    if (tg_model_load(&m, g_model, &e) < 0) fail_msg("%s", e.msg);
    if (tg_tokenizer_from_gguf(&t, m->g, &e) < 0) fail_msg("%s", e.msg);
    const char *text = "The following options are supported: --help print this message and exit. "
                       "--version print the version number of make and exit. -C dir, --directory=dir "
                       "change to directory dir before reading the makefiles or doing anything else.";
    int32_t *ids;
    size_t n;
    if (tg_tokenize(t, text, strlen(text), 1, 0, &ids, &n, &e) < 0) fail_msg("%s", e.msg);
    g_tok = malloc(sizeof *g_tok * N_POS);
    for (int i = 0; i < N_POS; i++) g_tok[i] = ids[(size_t)i % n];
    g_n_tok = N_POS;
    free(ids);
    tg_tokenizer_free(t);
    tg_model_free(m);
}

/* Replays the arm `argv_yaml` (a YAML flow list) with load options
 * `options` (YAML flow map); returns 1 with *t, 0 when it cannot replay. */
static int run(const char *argv_yaml, const char *options, rp_table **t, char *why, size_t why_n)
{
    tokens();
    char sha[65], path[PATH_MAX + 32];
    tg_err e;
    if (tg_sha256_file(g_model, sha, &e) < 0) fail_msg("%s", e.msg);
    write_in(path, sizeof path, "spec.yaml",
             "name: replay\nmodel: {path: %s, sha256: %s}\n"
             "prompts:\n  - {id: p1, text: \"x\"}\nsteps: 1\ntop_k: 4\nlegs: 1\nreference: arm\npolicy: {kind: exact}\n"
             "arms:\n  - {name: arm, exec: %s, options: %s}\n",
             g_model, sha, argv_yaml, options);
    tg_spec *s;
    if (spec_load(&s, path, &e) < 0) fail_msg("spec: %s", e.msg);
    char bin[PATH_MAX + 8];
    snprintf(bin, sizeof bin, "%s/bin", g_build);
    rp_request q = {.spec = s, .bin_dir = bin, .arm = 0, .tokens = g_tok, .n_tokens = g_n_tok, .prefill = N_PROMPT,
                    .tok2 = -1};
    int rc = replay_run(&q, t, NULL, why, why_n, &e);
    spec_free(s);
    if (rc < 0) fail_msg("replay: %s", e.msg);
    return rc;
}

static void print_over(const char *what, const rp_table *t)
{
    printf("%s: %d stage(s) over budget", what, t->n_over);
    if (t->first >= 0) printf(", first layer %d %s", t->rows[t->first].layer, replay_stage_name(t->rows[t->first].stage));
    double worst = 0;
    int wi = -1;
    for (int i = 0; i < t->n_rows; i++)
        if (t->rows[i].ratio > worst) worst = t->rows[i].ratio, wi = i;
    if (wi >= 0)
        printf("; largest ratio %.3g (layer %d %s)", worst, t->rows[wi].layer, replay_stage_name(t->rows[wi].stage));
    printf("\n");
}

static void test_ref_exact(void **st)
{
    (void)st;
    if (!have_engine()) skip_msg("tg-engine or the shipped model missing");
    char argv_yaml[PATH_MAX + 64], why[256];
    snprintf(argv_yaml, sizeof argv_yaml, "[%s/bin/tg-engine, --tier, ref]", g_build);
    rp_table *t;
    assert_int_equal(run(argv_yaml, "{}", &t, why, sizeof why), 1);
    assert_true(t->n_rows > 8 * 20);
    /* the ref tier against itself: zero, but where a stage's input is an
     * f64 value the record holds in f32 (the scores feed the softmax
     * unrounded): the attention then differs by the scores' f32 rounding */
    print_over("ref", t);
    assert_int_equal(t->n_over, 0);
    for (int i = 0; i < t->n_rows; i++) {
        if (t->rows[i].max_rel != 0.0)
            printf("  ref: layer %d %s %.3g\n", t->rows[i].layer, replay_stage_name(t->rows[i].stage), t->rows[i].max_rel);
        assert_true(t->rows[i].max_rel < 1e-6);
    }
    replay_table_free(t);
}

/* The legitimate variants: none may go over budget. */
static void test_panel(void **st)
{
    (void)st;
    if (!have_engine()) skip_msg("tg-engine or the shipped model missing");
    static const char *const isas[] = {"scalar", "avx2", "avx512vnni", "neon", "neon-dotprod"};
    char argv_yaml[PATH_MAX + 64], why[256];
    snprintf(argv_yaml, sizeof argv_yaml, "[%s/bin/tg-engine, --tier, cpu]", g_build);
    const char *kvs[] = {"f16", "f32"};
    int runs = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        /* an ISA this machine does not have falls back with a note; run only those it has */
        setenv("TG_CPU_ISA", isas[i], 1);
        char cmd[PATH_MAX + 64];
        snprintf(cmd, sizeof cmd, "%s/bin/tg-engine", g_build);
        int have = 1;
#if defined(__x86_64__)
        if (!strncmp(isas[i], "neon", 4)) have = 0;
        if (!strcmp(isas[i], "avx2")) have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        if (!strcmp(isas[i], "avx512vnni")) have = __builtin_cpu_supports("avx512vnni");
#else
        if (!strncmp(isas[i], "avx", 3)) have = 0;
#endif
        if (!have) continue;
        for (int threads = 1; threads <= 2; threads++)
            for (int k = 0; k < 2; k++) {
                char opts[128], what[128];
                snprintf(opts, sizeof opts, "{threads: %d, kv_type: %s}", threads, kvs[k]);
                snprintf(what, sizeof what, "cpu %s %d thread(s) kv %s", isas[i], threads, kvs[k]);
                rp_table *t;
                assert_int_equal(run(argv_yaml, opts, &t, why, sizeof why), 1);
                print_over(what, t);
                assert_int_equal(t->prefill, N_PROMPT);   /* the decode path replayed too */
                assert_int_equal(t->n_over, 0);
                replay_table_free(t);
                runs++;
            }
    }
    unsetenv("TG_CPU_ISA");
    assert_true(runs >= 4);
}

/* An exec worker without the replay op: reported, not an error. */
static void test_cannot_replay(void **st)
{
    (void)st;
    if (!have_engine()) skip_msg("tg-engine or the shipped model missing");
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/bin/tg-llama", g_build);
    if (access(p, X_OK) != 0) skip_msg("tg-llama not built");
    char lib[PATH_MAX + 128], argv_yaml[PATH_MAX * 3 + 128], why[256];
    snprintf(lib, sizeof lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", g_cache);
    if (access(lib, R_OK) != 0) skip_msg("no llama.cpp library at %s", lib);
    snprintf(argv_yaml, sizeof argv_yaml, "[%s/bin/tg-llama, --lib, %s]", g_build, lib);
    rp_table *t = NULL;
    assert_int_equal(run(argv_yaml, "{}", &t, why, sizeof why), 0);
    assert_null(t);
    assert_non_null(strstr(why, "cannot replay"));
}

/* ------------------------------------------------------------------ */
/* The mutation suite                                                  */

/* The whole file at path (NUL-terminated, malloc'ed), or NULL. */
static char *slurp(const char *path)
{
    char *b;
    size_t n;
    tg_err e;
    return common_read_file(path, 64 << 20, &b, &n, &e) == 0 ? b : NULL;
}

/* Every mutation of the suite still applies to the current sources (a
 * moved anchor fails here, naming the file and the anchor). */
static void test_mutants_apply(void **st)
{
    (void)st;
    mutation_assert_dir(g_root, "tests/mutants/replay", 1);
}

static void test_mutants(void **st)
{
    (void)st;
    if (!have_engine()) skip_msg("tg-engine or the shipped model missing");
    if (strstr(g_build, "asan")) skip_msg("mutants in a sanitizer build");
    char dirp[PATH_MAX + 32], names[64][64], err[8192];
    snprintf(dirp, sizeof dirp, "%s/tests/mutants/replay", g_root);
    int n = mutation_list(dirp, names, 64);
    const char *only = getenv("TG_MUTANT");   /* one mutant by name, for debugging */
    int tested = 0, named = 0;
    for (int i = 0; i < n; i++) {
        if (only && *only && !strstr(names[i], only)) continue;
        char mp[PATH_MAX * 2], wd[PATH_MAX * 2], exe[PATH_MAX * 3];
        snprintf(mp, sizeof mp, "%s/%.63s.mut", dirp, names[i]);
        snprintf(wd, sizeof wd, "%s/m%d", g_dir, i);
        mutation m;
        if (mutation_parse(mp, &m, err, sizeof err) < 0) fail_msg("%s", err);
        if (m.layer == -2) fail_msg("%s: expected stage: LAYER STAGE", mp);
        if (!mutation_cpu_ok(&m)) {
            printf("mutant %s skipped: this CPU lacks %s\n", names[i], m.needs);
            mutation_free(&m);
            continue;
        }
        if (mutation_build(g_build, mp, wd, err, sizeof err) < 0) fail_msg("%s", err);
        snprintf(exe, sizeof exe, "%s/tg-engine", wd);
        if (m.env_key[0]) setenv(m.env_key, m.env_val, 1);
        char argv_yaml[PATH_MAX * 3 + 32], why[256];
        snprintf(argv_yaml, sizeof argv_yaml, "[%s, --tier, cpu]", exe);
        rp_table *t;
        assert_int_equal(run(argv_yaml, "{threads: 2}", &t, why, sizeof why), 1);
        if (m.env_key[0]) unsetenv(m.env_key);
        int ok = t->first >= 0 && t->rows[t->first].layer == m.layer &&
                 !strcmp(replay_stage_name(t->rows[t->first].stage), m.stage);
        char what[PATH_MAX * 3];
        snprintf(what, sizeof what, "mutant %s (expect layer %d %s)%s", names[i], m.layer, m.stage,
                 ok ? "" : " WRONG");
        print_over(what, t);
        named += ok;
        tested++;
        replay_table_free(t);
        testenv_rm_tree(wd);
        mutation_free(&m);
    }
    printf("replay named %d of %d mutants\n", named, tested);
    assert_true(tested > 0);
    assert_int_equal(named, tested);
}

/* tokgate power: replay detects a stage's scale error far below what the gate needs. */
static void test_power(void **st)
{
    (void)st;
    if (!have_engine()) skip_msg("tg-engine or the shipped model missing");
    char spec[PATH_MAX + 32], outp[PATH_MAX + 32], tg[PATH_MAX + 32];

    snprintf(outp, sizeof outp, "%s/power.out", g_dir);
    snprintf(tg, sizeof tg, "%s/bin/tokgate", g_build);
    char sha[65];
    tg_err e;
    if (tg_sha256_file(g_model, sha, &e) < 0) fail_msg("%s", e.msg);
    write_in(spec, sizeof spec, "power.yaml",
             "name: power\nmodel: {path: %s, sha256: %s}\nprompts:\n"
             "  - {id: p1, text: \"The following options are supported:\"}\n"
             "  - {id: p2, text: \"def main(argv):\"}\n"
             "steps: 16\ntop_k: 4\nlegs: 1\nreference: ref\npolicy: {kind: near-tie, band: 0.2}\n"
             "arms:\n  - {name: cpu, engine: cpu, options: {threads: 2}}\n  - {name: ref, engine: ref}\n",
             g_model, sha);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char *argv[] = {tg, "power", spec, "--stages", "q_rope,ffn_out", "--layer", "3", NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, tg, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int ws;
    assert_true(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    char *out = slurp(outp);
    assert_non_null(out);
    printf("%s", out);
    const char *stages[] = {"q_rope", "ffn_out"};
    for (int i = 0; i < 2; i++) {
        char key[64];
        snprintf(key, sizeof key, "POWER.%s.REPLAY=", stages[i]);
        const char *r = strstr(out, key);
        assert_non_null(r);
        double re = strtod(r + strlen(key), NULL);
        snprintf(key, sizeof key, "POWER.%s.GATE=", stages[i]);
        const char *g = strstr(out, key);
        assert_non_null(g);
        g += strlen(key);
        double ge = *g == '>' ? INFINITY : strtod(g, NULL);
        /* the budgets sit near 1e-5: a scale of 1e-4 must be seen; the gate needs far more */
        assert_true(re > 0 && re <= 1e-4);
        assert_true(ge >= 100 * re);
    }
    free(out);
}

/* Runs `tokgate ARGS` with stdout into outp; returns its exit status. */
static int run_tokgate(char *const *args, const char *outp)
{
    char tg[PATH_MAX + 32];
    snprintf(tg, sizeof tg, "%s/bin/tokgate", g_build);
    char *argv[16] = {tg};
    int n = 1;
    for (; args[n - 1] && n < 15; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, tg, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -1;
    int ws;
    if (waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws)) return -1;
    return WEXITSTATUS(ws);
}

/* The gate's replay: a cpu arm perturbed below anything the token gate
 * sees fails REPLAY and, with gate: true, TOKEN_GATE; gate: false keeps
 * TOKEN_GATE. */
static void test_gate_replay(void **st)
{
    (void)st;
    if (!have_engine()) skip_msg("tg-engine or the shipped model missing");
    char sha[65];
    tg_err e;
    if (tg_sha256_file(g_model, sha, &e) < 0) fail_msg("%s", e.msg);
    for (int gate = 1; gate >= 0; gate--) {
        char spec[PATH_MAX + 32], outp[PATH_MAX + 32], db[PATH_MAX + 32];
        snprintf(spec, sizeof spec, "%s/g%d.yaml", g_dir, gate);
        snprintf(outp, sizeof outp, "%s/g%d.out", g_dir, gate);
        snprintf(db, sizeof db, "%s/g%d.db", g_dir, gate);
        FILE *f = fopen(spec, "w");
        assert_non_null(f);
        fprintf(f, "name: gate-replay\nmodel: {path: %s, sha256: %s}\nprompts:\n"
                   "  - {id: p1, text: \"The following options are supported:\"}\n"
                   "steps: 6\ntop_k: 4\nlegs: 2\nreference: ref\npolicy: {kind: near-tie, band: 0.2}\n"
                   "replay: {steps: 6, gate: %s}\n"
                   "arms:\n  - {name: cpu, engine: cpu, options: {threads: 2, perturb: \"scale=1e-4:k_norm:2\"}}\n"
                   "  - {name: ref, engine: ref}\n",
                g_model, sha, gate ? "true" : "false");
        fclose(f);
        char *args[] = {"gate", spec, "--db", db, NULL};
        int rc = run_tokgate(args, outp);
        char *out = slurp(outp);
        assert_non_null(out);
        printf("gate: %s, exit %d: %s", gate ? "true" : "false", rc, strstr(out, "REPLAY=") ? strstr(out, "REPLAY=") : "(no key)\n");
        assert_non_null(strstr(out, "\nREPLAY=FAIL\n"));
        assert_non_null(strstr(out, "ARM.cpu.REPLAY=FAIL"));
        assert_non_null(strstr(out, "ARM.ref.REPLAY=ARBITER"));
        assert_non_null(strstr(out, gate ? "\nTOKEN_GATE=FAIL\n" : "\nTOKEN_GATE=PASS\n"));
        assert_int_equal(rc, gate ? 1 : 0);
        free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_roundtrip), cmocka_unit_test(test_compare_crafted),
        cmocka_unit_test(test_noise_model),    cmocka_unit_test(test_spec_field),
        cmocka_unit_test(test_ref_exact),
        cmocka_unit_test(test_panel),          cmocka_unit_test(test_cannot_replay),
        cmocka_unit_test(test_mutants_apply),  cmocka_unit_test(test_mutants),
        cmocka_unit_test(test_power),
        cmocka_unit_test(test_gate_replay),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
