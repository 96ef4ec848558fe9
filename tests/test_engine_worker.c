/*
 * test_engine_worker.c: tg-engine over the arm protocol v1.
 *
 * Spawns $TG_BUILD/bin/tg-engine (argv, pipes, no shell), feeds it request
 * lines and checks the answers: hello, load (hyperparameters, option
 * errors), tokenize / detokenize, decode (step lines, digests equal to the
 * engine library's own logits, teacher forcing, counters), dumps (files and
 * lines; the logits dump matches the step's digest), malformed requests
 * (answered with ok:false while the worker keeps serving), the gpu tier's
 * refusal, and end of input (the worker exits 0). A watchdog alarm turns a
 * hung worker into a failed test instead of a hung suite.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "model.h"
#include "util.h"

extern char **environ;

#define WATCHDOG_S 240

static char g_engine[4400], g_model[4400];

typedef struct child {
    pid_t pid;
    FILE *in;    /* the worker's stdin */
    FILE *out;   /* the worker's stdout */
} child;

/* Starts tg-engine with args (NULL-terminated, after argv[0]). */
static void child_start(child *c, const char *const *args)
{
    int to[2], from[2];
    assert_int_equal(pipe(to), 0);
    assert_int_equal(pipe(from), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    posix_spawn_file_actions_addclose(&fa, to[1]);
    posix_spawn_file_actions_addclose(&fa, from[0]);
    char *argv[16];
    int n = 0;
    argv[n++] = g_engine;
    for (int i = 0; args[i] && n < 15; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    int rc = posix_spawn(&c->pid, g_engine, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    close(to[0]);
    close(from[1]);
    c->in = fdopen(to[1], "w");
    c->out = fdopen(from[0], "r");
    assert_non_null(c->in);
    assert_non_null(c->out);
}

/* Closes the worker's stdin and returns its exit status. */
static int child_finish(child *c)
{
    fclose(c->in);
    int st = 0;
    waitpid(c->pid, &st, 0);
    fclose(c->out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void send_line(child *c, const char *line)
{
    fprintf(c->in, "%s\n", line);
    fflush(c->in);
}

/* Reads one answer line as JSON (fails the test at EOF or on bad JSON). */
static json_t *recv_json(child *c)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, c->out);
    if (n <= 0)
        fail_msg("tg-engine closed its output");
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    if (!j)
        fail_msg("tg-engine answered a line that is not JSON: %s", line);
    free(line);
    return j;
}

/* Sends a request and reads a one-line answer. */
static json_t *request(child *c, const char *line)
{
    send_line(c, line);
    return recv_json(c);
}

static int is_ok(const json_t *j)
{
    return json_is_true(json_object_get(j, "ok"));
}

static const char *error_of(const json_t *j)
{
    const char *s = json_string_value(json_object_get(j, "error"));
    return s ? s : "";
}

static void load_model(child *c, const char *options)
{
    char req[5000];
    snprintf(req, sizeof req, "{\"op\":\"load\",\"model\":\"%s\",\"options\":%s}", g_model, options);
    json_t *j = request(c, req);
    if (!is_ok(j))
        fail_msg("load failed: %s", error_of(j));
    json_decref(j);
}

/* A decode's answer: step lines (tokens, digests) and the done line. */
typedef struct decoded {
    int n;
    int32_t token[64];
    char digest[64][17];
    int n_top[64];
    int32_t top_id[64][16];
    float top_logit[64][16];
    json_t *done;
    int n_dumps;
    json_t *dumps[256];
} decoded;

static void decoded_free(decoded *d)
{
    json_decref(d->done);
    for (int i = 0; i < d->n_dumps; i++)
        json_decref(d->dumps[i]);
    memset(d, 0, sizeof *d);
}

/* Sends a decode request and collects its lines; checks the shape of each
 * step line. Returns the final line's ok. */
static int decode(child *c, const char *req, decoded *d)
{
    memset(d, 0, sizeof *d);
    send_line(c, req);
    for (;;) {
        json_t *j = recv_json(c);
        json_t *st = json_object_get(j, "step"), *dump = json_object_get(j, "dump");
        if (json_is_integer(st)) {
            assert_int_equal(json_integer_value(st), d->n);
            json_t *top = json_object_get(j, "top");
            assert_true(json_is_array(top) && json_array_size(top) > 0);
            int32_t tok = (int32_t)json_integer_value(json_object_get(j, "token"));
            // top is descending and starts with the argmax
            assert_int_equal(json_integer_value(json_array_get(json_array_get(top, 0), 0)), tok);
            for (size_t i = 1; i < json_array_size(top); i++)
                assert_true(json_number_value(json_array_get(json_array_get(top, i - 1), 1)) >=
                            json_number_value(json_array_get(json_array_get(top, i), 1)));
            const char *dg = json_string_value(json_object_get(j, "digest"));
            assert_non_null(dg);
            assert_int_equal(strlen(dg), 16);
            assert_true(d->n < 64);
            d->token[d->n] = tok;
            d->n_top[d->n] = json_array_size(top) < 16 ? (int)json_array_size(top) : 16;
            for (int i = 0; i < d->n_top[d->n]; i++) {
                d->top_id[d->n][i] = (int32_t)json_integer_value(json_array_get(json_array_get(top, (size_t)i), 0));
                d->top_logit[d->n][i] = (float)json_number_value(json_array_get(json_array_get(top, (size_t)i), 1));
            }
            snprintf(d->digest[d->n], 17, "%s", dg);
            d->n++;
            json_decref(j);
        } else if (json_is_object(dump)) {
            assert_true(d->n_dumps < 256);
            d->dumps[d->n_dumps++] = j;
        } else {
            d->done = j;
            return is_ok(j);
        }
    }
}

static void test_hello_load_tokenize(void **state)
{
    (void)state;
    child c;
    const char *args[] = {"--tier", "cpu", "--threads", "2", NULL};
    child_start(&c, args);
    json_t *j = request(&c, "{\"op\":\"hello\",\"protocol\":1}");
    assert_true(is_ok(j));
    json_t *arm = json_object_get(j, "arm");
    assert_string_equal(json_string_value(json_object_get(arm, "kind")), "engine");
    assert_string_equal(json_string_value(json_object_get(arm, "tier")), "cpu");
    assert_int_equal(strlen(json_string_value(json_object_get(arm, "binary_sha256"))), 64);
    const char *dev = json_string_value(json_object_get(arm, "device"));
    printf("hello device: %s\n", dev);
    assert_non_null(strstr(dev, "2 threads"));
    json_decref(j);

    char req[5000];
    snprintf(req, sizeof req, "{\"op\":\"load\",\"model\":\"%s\",\"options\":{\"threads\":2,\"kv_type\":\"f16\"}}",
             g_model);
    j = request(&c, req);
    if (!is_ok(j))
        fail_msg("load: %s", error_of(j));
    json_t *m = json_object_get(j, "model");
    assert_string_equal(json_string_value(json_object_get(m, "arch")), "qwen3");
    assert_int_equal(json_integer_value(json_object_get(m, "n_vocab")), 8192);
    assert_int_equal(json_integer_value(json_object_get(m, "n_layer")), 8);
    assert_int_equal(json_integer_value(json_object_get(m, "n_embd")), 256);
    assert_int_equal(json_integer_value(json_object_get(m, "n_head")), 4);
    assert_int_equal(json_integer_value(json_object_get(m, "n_head_kv")), 2);
    assert_int_equal(json_integer_value(json_object_get(m, "head_dim")), 64);
    assert_int_equal(json_integer_value(json_object_get(m, "n_ff")), 768);
    assert_true(json_number_value(json_object_get(m, "rope_base")) == 1e6);
    assert_int_equal(json_integer_value(json_object_get(m, "file_type")), 15);
    json_decref(j);

    j = request(&c, "{\"op\":\"tokenize\",\"text\":\"The following options are supported:\",\"special\":false}");
    assert_true(is_ok(j));
    json_t *ids = json_object_get(j, "ids");
    assert_true(json_array_size(ids) >= 3);
    char *ids_s = json_dumps(ids, JSON_COMPACT);
    json_decref(j);
    snprintf(req, sizeof req, "{\"op\":\"detokenize\",\"ids\":%s,\"special\":false}", ids_s);
    free(ids_s);
    j = request(&c, req);
    assert_true(is_ok(j));
    assert_string_equal(json_string_value(json_object_get(j, "text")), "The following options are supported:");
    json_decref(j);

    j = request(&c, "{\"op\":\"bye\"}");
    assert_true(is_ok(j));
    json_decref(j);
    assert_int_equal(child_finish(&c), 0);
}

/* Logits digests of the same decode run in-process through the library. */
static void library_digests(const tg_opts *o, const int32_t *prompt, int np, int steps, const int32_t *force,
                            char dg[][17])
{
    tg_err e;
    tg_model *m;
    tg_session *s;
    assert_int_equal(tg_model_load(&m, g_model, &e), 0);
    assert_int_equal(tg_session_new(&s, m, o, &e), 0);
    assert_int_equal(tg_session_eval(s, prompt, np, &e), 0);
    for (int i = 0; i < steps; i++) {
        const float *lg = tg_session_logits(s);
        tg_digest_logits(lg, (size_t)m->hp.n_vocab, dg[i]);
        if (i == steps - 1)
            break;
        int32_t next = force ? force[i] : tg_argmax(lg, m->hp.n_vocab);
        assert_int_equal(tg_session_eval(s, &next, 1, &e), 0);
    }
    tg_session_free(s);
    tg_model_free(m);
}

static void test_decode_force_counters(void **state)
{
    (void)state;
    const char *tiers[] = {"cpu", "ref"};
    for (int t = 0; t < 2; t++) {
        child c;
        const char *args[] = {"--tier", tiers[t], NULL};
        child_start(&c, args);
        load_model(&c, "{\"threads\":2}");
        const int32_t prompt[] = {785, 1100, 2000, 33, 7};
        decoded a, b, f;
        assert_true(decode(&c, "{\"op\":\"decode\",\"prompt\":[785,1100,2000,33,7],\"steps\":6,\"top_k\":5}", &a));
        assert_int_equal(a.n, 6);
        // a second decode resets the cache: byte-identical
        assert_true(decode(&c, "{\"op\":\"decode\",\"prompt\":[785,1100,2000,33,7],\"steps\":6,\"top_k\":5}", &b));
        for (int i = 0; i < 6; i++)
            assert_string_equal(a.digest[i], b.digest[i]);
        // the same as the library in-process
        tg_opts o = tg_opts_default();
        o.tier = t == 0 ? TG_TIER_CPU : TG_TIER_REF;
        o.threads = 2;
        char dg[6][17];
        library_digests(&o, prompt, 5, 6, NULL, dg);
        for (int i = 0; i < 6; i++)
            assert_string_equal(a.digest[i], dg[i]);
        // counters: host ops only, per (op, tier)
        json_t *ctr = json_object_get(a.done, "counters");
        assert_int_equal(json_integer_value(json_object_get(ctr, "device_ops")), 0);
        assert_true(json_integer_value(json_object_get(ctr, "host_ops")) > 0);
        assert_int_equal(json_integer_value(json_object_get(ctr, "reference_tier_hits")), 0);
        json_t *ops = json_object_get(ctr, "ops");
        char key[64];
        snprintf(key, sizeof key, "matmul_q4_K/%s", tiers[t]);
        assert_true(json_integer_value(json_object_get(ops, key)) > 0);
        snprintf(key, sizeof key, "attn/%s", tiers[t]);
        assert_true(json_integer_value(json_object_get(ops, key)) > 0);
        assert_non_null(json_object_get(json_object_get(a.done, "ms"), "decode"));

        // teacher forcing: force tokens other than its own from step 0 on
        int32_t force[5];
        for (int i = 0; i < 5; i++)
            force[i] = (a.token[i] + 17) % 8192;
        char req[512];
        snprintf(req, sizeof req,
                 "{\"op\":\"decode\",\"prompt\":[785,1100,2000,33,7],\"steps\":6,\"top_k\":5,"
                 "\"force\":[%d,%d,%d,%d,%d]}", force[0], force[1], force[2], force[3], force[4]);
        assert_true(decode(&c, req, &f));
        assert_string_equal(f.digest[0], a.digest[0]);         // same prefix
        assert_string_not_equal(f.digest[1], a.digest[1]);     // another token appended
        library_digests(&o, prompt, 5, 6, force, dg);
        for (int i = 0; i < 6; i++)
            assert_string_equal(f.digest[i], dg[i]);
        decoded_free(&a);
        decoded_free(&b);
        decoded_free(&f);
        assert_int_equal(child_finish(&c), 0);   // EOF ends it
    }
}

static void test_dump(void **state)
{
    (void)state;
    char dir[] = "/tmp/tg-test-dump-XXXXXX";
    assert_non_null(mkdtemp(dir));
    child c;
    const char *args[] = {"--tier", "cpu", NULL};
    child_start(&c, args);
    load_model(&c, "{\"threads\":2,\"n_batch\":2}");
    char req[512];
    snprintf(req, sizeof req,
             "{\"op\":\"decode\",\"prompt\":[1,2,3],\"steps\":4,\"top_k\":3,\"dump\":{\"steps\":[0,2],\"path\":\"%s\"}}",
             dir);
    decoded d;
    assert_true(decode(&c, req, &d));
    // 8 layers x 8 stages + logits, at two steps
    assert_int_equal(d.n_dumps, 2 * 65);
    int logits_seen = 0;
    for (int i = 0; i < d.n_dumps; i++) {
        json_t *o = json_object_get(d.dumps[i], "dump");
        int step = (int)json_integer_value(json_object_get(o, "step"));
        int layer = (int)json_integer_value(json_object_get(o, "layer"));
        const char *stage = json_string_value(json_object_get(o, "stage"));
        int64_t n = json_integer_value(json_object_get(o, "n"));
        const char *file = json_string_value(json_object_get(o, "file"));
        assert_true(step == 0 || step == 2);
        assert_non_null(stage);
        assert_non_null(file);
        char path[1024];
        snprintf(path, sizeof path, "%s%s%s", file[0] == '/' ? "" : dir, file[0] == '/' ? "" : "/", file);
        struct stat st;
        if (stat(path, &st) != 0)
            fail_msg("dump file %s is missing", path);
        assert_int_equal(st.st_size, n * 4);
        if (strcmp(stage, "logits") == 0) {
            // the logits file is the step's logits: same digest
            assert_int_equal(layer, -1);
            assert_int_equal(n, 8192);
            float *x = malloc((size_t)n * 4);
            FILE *f = fopen(path, "rb");
            assert_int_equal(fread(x, 4, (size_t)n, f), (size_t)n);
            fclose(f);
            char dg[17];
            tg_digest_logits(x, (size_t)n, dg);
            assert_string_equal(dg, d.digest[step]);
            free(x);
            logits_seen++;
        } else {
            assert_true(layer >= 0 && layer < 8);
            assert_int_equal(n, strcmp(stage, "q") == 0 ? 256 : (strcmp(stage, "k") == 0 || strcmp(stage, "v") == 0) ? 128 : 256);
        }
        unlink(path);
    }
    assert_int_equal(logits_seen, 2);
    decoded_free(&d);
    assert_int_equal(child_finish(&c), 0);
    rmdir(dir);
}

static void test_malformed_and_errors(void **state)
{
    (void)state;
    child c;
    const char *args[] = {"--tier", "cpu", NULL};
    child_start(&c, args);
    // decode before load
    json_t *j = request(&c, "{\"op\":\"decode\",\"prompt\":[1],\"steps\":1}");
    assert_false(is_ok(j));
    printf("before load: %s\n", error_of(j));
    assert_non_null(strstr(error_of(j), "load"));
    json_decref(j);
    // not JSON
    j = request(&c, "{this is not json");
    assert_false(is_ok(j));
    json_decref(j);
    // an unknown op
    j = request(&c, "{\"op\":\"fly\"}");
    assert_false(is_ok(j));
    json_decref(j);
    // a missing model file: the path is named
    j = request(&c, "{\"op\":\"load\",\"model\":\"/nonexistent/m.gguf\"}");
    assert_false(is_ok(j));
    assert_non_null(strstr(error_of(j), "/nonexistent/m.gguf"));
    json_decref(j);
    // an unknown option and a bad one are named
    char req[5000];
    snprintf(req, sizeof req, "{\"op\":\"load\",\"model\":\"%s\",\"options\":{\"thread\":2}}", g_model);
    j = request(&c, req);
    assert_false(is_ok(j));
    assert_non_null(strstr(error_of(j), "thread"));
    json_decref(j);
    snprintf(req, sizeof req, "{\"op\":\"load\",\"model\":\"%s\",\"options\":{\"perturb\":\"bf16:ffn_out:99\"}}",
             g_model);
    j = request(&c, req);
    assert_false(is_ok(j));
    printf("bad perturb: %s\n", error_of(j));
    assert_non_null(strstr(error_of(j), "99"));
    json_decref(j);
    snprintf(req, sizeof req, "{\"op\":\"load\",\"model\":\"%s\",\"options\":{\"kv_type\":\"q8\"}}", g_model);
    j = request(&c, req);
    assert_false(is_ok(j));
    json_decref(j);
    // still serving: a good load, then a token id out of range
    load_model(&c, "{\"threads\":1,\"n_ctx\":16,\"perturb\":\"bf16:ffn_out:3\"}");
    j = request(&c, "{\"op\":\"decode\",\"prompt\":[1,8192],\"steps\":1}");
    assert_false(is_ok(j));
    assert_non_null(strstr(error_of(j), "8192"));
    json_decref(j);
    // more positions than n_ctx
    j = request(&c, "{\"op\":\"decode\",\"prompt\":[1,2,3,4,5,6,7,8,9,10],\"steps\":10}");
    assert_false(is_ok(j));
    printf("context: %s\n", error_of(j));
    assert_non_null(strstr(error_of(j), "n_ctx"));
    json_decref(j);
    decoded d;
    assert_true(decode(&c, "{\"op\":\"decode\",\"prompt\":[1,2,3],\"steps\":2}", &d));
    assert_int_equal(d.n, 2);
    assert_true(json_integer_value(json_object_get(json_object_get(json_object_get(d.done, "counters"), "ops"),
                                                   "perturb/cpu")) > 0);
    decoded_free(&d);
    assert_int_equal(child_finish(&c), 0);

    // the gpu tier refuses to load; hello still answers
    const char *gargs[] = {"--tier", "gpu", NULL};
    child_start(&c, gargs);
    j = request(&c, "{\"op\":\"hello\",\"protocol\":1}");
    assert_true(is_ok(j));
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "arm"), "tier")), "gpu");
    json_decref(j);
    snprintf(req, sizeof req, "{\"op\":\"load\",\"model\":\"%s\"}", g_model);
    j = request(&c, req);
    assert_false(is_ok(j));
    printf("gpu: %s\n", error_of(j));
    assert_non_null(strstr(error_of(j), "GPU"));
    json_decref(j);
    assert_int_equal(child_finish(&c), 0);

    // bad command lines exit 2
    const char *bad[] = {"--tier", "fast", NULL};
    child_start(&c, bad);
    assert_int_equal(child_finish(&c), 2);
}

/* The ref tier's logits of a teacher-forced decode, in-process. */
static float *library_logits(const tg_opts *o, const int32_t *prompt, int np, int steps, const int32_t *force,
                             int32_t *tokens, int *n_vocab)
{
    tg_err e;
    tg_model *m;
    tg_session *s;
    assert_int_equal(tg_model_load(&m, g_model, &e), 0);
    assert_int_equal(tg_session_new(&s, m, o, &e), 0);
    *n_vocab = m->hp.n_vocab;
    float *all = malloc((size_t)steps * *n_vocab * sizeof(float));
    assert_int_equal(tg_session_eval(s, prompt, np, &e), 0);
    for (int i = 0; i < steps; i++) {
        const float *lg = tg_session_logits(s);
        memcpy(all + (size_t)i * *n_vocab, lg, (size_t)*n_vocab * sizeof(float));
        tokens[i] = tg_argmax(lg, *n_vocab);
        if (i == steps - 1)
            break;
        int32_t next = force ? force[i] : tokens[i];
        assert_int_equal(tg_session_eval(s, &next, 1, &e), 0);
    }
    tg_session_free(s);
    tg_model_free(m);
    return all;
}

/* Largest |worker top-16 logit - lib logit| over the steps. */
static double worker_diff(const decoded *d, const float *lib, int n_vocab)
{
    double mx = 0;
    for (int s = 0; s < d->n; s++)
        for (int i = 0; i < d->n_top[s]; i++) {
            double x = fabs((double)d->top_logit[s][i] - lib[(size_t)s * n_vocab + d->top_id[s][i]]);
            mx = x > mx ? x : mx;
        }
    return mx;
}

/* The aarch64 cross build (make aarch64) under qemu-aarch64: its NEON cpu
 * tier, teacher-forced along the ref tier's tokens, must pick the ref
 * tier's argmax wherever the ref gap is >= 0.5 and stay as close to ref as
 * the x86-64 cpu tier does (within max(1.5 x that, 0.01)). */
static void test_aarch64_qemu(void **state)
{
    (void)state;
    char a64[4600], qemu[] = "/usr/bin/qemu-aarch64";
    const char *root = getenv("TG_ROOT"), *ab = getenv("TG_AARCH64_BUILD");
    if (ab && *ab)
        snprintf(a64, sizeof a64, "%s/bin/tg-engine", ab);
    else
        snprintf(a64, sizeof a64, "%s/build/aarch64/bin/tg-engine", root && *root ? root : ".");
    if (access(a64, X_OK) != 0 || access(qemu, X_OK) != 0) {
        printf("skipped: needs %s (make aarch64) and %s\n", a64, qemu);
        skip();
    }
    enum { STEPS = 16 };
    const int32_t prompt[] = {345, 926, 1361, 1200, 2000, 3000};
    int32_t ref_tok[STEPS], cpu_tok[STEPS];
    int n_vocab;
    tg_opts o = tg_opts_default();
    o.tier = TG_TIER_REF;
    float *ref = library_logits(&o, prompt, 6, STEPS, NULL, ref_tok, &n_vocab);
    o.tier = TG_TIER_CPU;
    o.threads = 1;
    float *cpu = library_logits(&o, prompt, 6, STEPS, ref_tok, cpu_tok, &n_vocab);

    char req[1024];
    int off = snprintf(req, sizeof req, "{\"op\":\"decode\",\"prompt\":[345,926,1361,1200,2000,3000],"
                       "\"steps\":%d,\"top_k\":16,\"force\":[", STEPS);
    for (int i = 0; i < STEPS - 1; i++)
        off += snprintf(req + off, sizeof req - (size_t)off, "%s%d", i ? "," : "", ref_tok[i]);
    snprintf(req + off, sizeof req - (size_t)off, "]}");

    char saved[4400];
    snprintf(saved, sizeof saved, "%s", g_engine);
    snprintf(g_engine, sizeof g_engine, "%s", qemu);
    child c;
    const char *args[] = {"-L", "/usr/aarch64-linux-gnu", a64, "--tier", "cpu", "--threads", "1", NULL};
    child_start(&c, args);
    snprintf(g_engine, sizeof g_engine, "%s", saved);
    json_t *j = request(&c, "{\"op\":\"hello\",\"protocol\":1}");
    printf("aarch64 device: %s\n", json_string_value(json_object_get(json_object_get(j, "arm"), "device")));
    json_decref(j);
    load_model(&c, "{\"threads\":1}");
    decoded d, dc;
    assert_true(decode(&c, req, &d));
    assert_int_equal(child_finish(&c), 0);

    // the x86-64 cpu tier's distance to ref, as the yardstick
    memset(&dc, 0, sizeof dc);
    dc.n = STEPS;
    for (int s = 0; s < STEPS; s++) {
        tg_top top[16];
        dc.n_top[s] = tg_topk(cpu + (size_t)s * n_vocab, n_vocab, 16, top);
        for (int i = 0; i < dc.n_top[s]; i++) {
            dc.top_id[s][i] = top[i].id;
            dc.top_logit[s][i] = top[i].logit;
        }
    }
    double dn = worker_diff(&d, ref, n_vocab), dx = worker_diff(&dc, ref, n_vocab);
    double tol = fmax(1.5 * dx, 0.01);
    printf("aarch64 NEON vs ref: largest top-16 difference %.5f; x86-64 cpu tier vs ref %.5f; tolerance %.5f\n",
           dn, dx, tol);
    int bad = 0;
    for (int s = 0; s < STEPS; s++) {
        tg_top top[2];
        tg_topk(ref + (size_t)s * n_vocab, n_vocab, 2, top);
        if (d.token[s] != ref_tok[s]) {
            printf("  step %d: aarch64 %d, ref %d (ref gap %.4f)\n", s, d.token[s], ref_tok[s],
                   top[0].logit - top[1].logit);
            if (top[0].logit - top[1].logit >= 0.5f)
                bad++;
        }
    }
    assert_int_equal(bad, 0);
    assert_true(dn <= tol);
    decoded_free(&d);
    free(ref);
    free(cpu);
}

static int group_setup(void **state)
{
    (void)state;
    const char *root = getenv("TG_ROOT"), *build = getenv("TG_BUILD");
    snprintf(g_engine, sizeof g_engine, "%s/bin/tg-engine", build && *build ? build : "build");
    snprintf(g_model, sizeof g_model, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", root && *root ? root : ".");
    signal(SIGPIPE, SIG_IGN);
    alarm(WATCHDOG_S);
    return 0;
}

#define NEEDS(fn)                                                                                       \
    static void fn##_n(void **state)                                                                    \
    {                                                                                                   \
        if (access(g_engine, X_OK) != 0 || access(g_model, R_OK) != 0) {                                \
            printf("skipped: needs %s and %s\n", g_engine, g_model);                                   \
            skip();                                                                                     \
        }                                                                                               \
        fn(state);                                                                                      \
    }
NEEDS(test_hello_load_tokenize)
NEEDS(test_decode_force_counters)
NEEDS(test_dump)
NEEDS(test_malformed_and_errors)
NEEDS(test_aarch64_qemu)

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_load_tokenize_n),
        cmocka_unit_test(test_decode_force_counters_n),
        cmocka_unit_test(test_dump_n),
        cmocka_unit_test(test_malformed_and_errors_n),
        cmocka_unit_test(test_aarch64_qemu_n),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
