/*
 * test_server.c: http arms (tg-http) gating inference servers through
 * their HTTP API, run by the gate (harness/gate.c) into a real store.
 *
 * - the spec's http: arm kind: the argv it turns into, and its errors;
 * - specs/server.yaml as shipped: llama.cpp's own llama-server (built by
 *   scripts/build-llama-server.sh against the same prebuilt libllama as
 *   tg-llama), started by the arm on a free port of 127.0.0.1, must be
 *   EXACT on every step of the default prompts and PASS;
 * - free mode over the same server (a prompt in one request) and over the
 *   double answering 2 tokens at a time (asked again where it stopped);
 * - the same server through its OpenAI-compatible /v1/completions (top
 *   log-probabilities limited to 20, shorter than the spec's top_k, several
 *   requests a prompt): PASS, and the KL over the shorter lists stays at
 *   rounding level;
 * - faults, with tests/helpers/tg-http-double (a TEST DOUBLE server for
 *   error handling, not an engine): connection refused, a server that
 *   dies mid-leg, a slow server, HTTP 500 and 404 with their bodies,
 *   malformed JSON, an answer for the wrong position, logprobs named by
 *   text: each leg ends not clean with the server's own message, every
 *   other arm's legs stay clean, and the store stays intact;
 * - an API key named by an environment variable is sent, and its value is
 *   stored nowhere (config, hello, answers, causes, stderr).
 * The llama-server tests skip, saying why, when build/bin/llama-server of
 * the repository has not been built (scripts/build-llama-server.sh; .ci/run
 * builds it).
 */
#include <limits.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <zstd.h>

#include "gate.h"
#include "spec.h"
#include "store.h"
#include "verdict.h"

#include "testenv.h"


static int setup(void **st)
{
    (void)st;
    if (testenv_init("server") < 0) return -1;
    /* the shipped spec names its files relative to the repository */
    char rel[PATH_MAX];
    snprintf(rel, sizeof rel, "%s", g_root);
    if (!realpath(rel, g_root) || chdir(g_root) != 0) return -1;
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    return testenv_clean();
}



/* Writes text as s.yaml and parses it: 0 with *out, or -1 with e. */
static int parse_text(const char *text, tg_spec **out, tg_err *e)
{
    char p[2 * PATH_MAX];
    write_in(p, sizeof p, "s.yaml", "%s", text);
    return spec_load(out, p, e);
}

static tg_spec *write_spec(const char *text)
{
    tg_spec *s;
    tg_err e;
    if (parse_text(text, &s, &e) < 0) fail_msg("spec: %s", e.msg);
    return s;
}

static tg_store *open_db(void)
{
    char p[2 * PATH_MAX];
    path_in(p, sizeof p, "t.db");
    tg_store *st;
    tg_err e;
    if (store_open(&st, p, &e) < 0) fail_msg("store: %s", e.msg);
    return st;
}

/* One text column of the first row of sql (?1 run, ?2 arm) into out. */
static void q_text(tg_store *st, const char *sql, int64_t run, const char *arm, char *out, size_t n)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) fail_msg("sql %s: %s", sql, sqlite3_errmsg(db));
    if (sqlite3_bind_parameter_count(q) >= 1) sqlite3_bind_int64(q, 1, run);
    if (sqlite3_bind_parameter_count(q) >= 2) sqlite3_bind_text(q, 2, arm, -1, SQLITE_STATIC);
    const unsigned char *t = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_text(q, 0) : NULL;
    snprintf(out, n, "%s", t ? (const char *)t : "(none)");
    sqlite3_finalize(q);
}

/* expr over the legs l of arm a in run (with steps: over their step rows
 * s) that meet cond (SQL over l, a, s; "1": all), as text into out. */
static void arm_rows(tg_store *st, int64_t run, const char *arm, int steps, const char *expr, const char *cond,
                     char *out, size_t n)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT %s FROM %s JOIN arm a ON a.id = l.arm_id WHERE l.run_id = ?1 AND a.name = ?2 AND (%s)", expr,
             steps ? "step s JOIN leg l ON l.id = s.leg_id" : "leg l", cond);
    q_text(st, sql, run, arm, out, n);
}

/* A per-arm verdict key of the latest set, into out. */
static void arm_key(tg_store *st, int64_t run, const char *arm, const char *key, char *out, size_t n)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT value FROM verdict WHERE run_id = ?1 AND arm = ?2 AND prompt IS NULL "
                              "AND key = '%s' ORDER BY set_no DESC LIMIT 1", key);
    q_text(st, sql, run, arm, out, n);
}

static void assert_integrity(tg_store *st)
{
    char r[64];
    q_text(st, "PRAGMA integrity_check", 0, NULL, r, sizeof r);
    if (strcmp(r, "ok")) fail_msg("integrity_check: %s", r);
}

/* Prints every faulted leg of run (for a failing test's log). */
static void print_causes(tg_store *st, int64_t run)
{
    sqlite3_stmt *q;
    sqlite3_prepare_v2(store_db(st), "SELECT a.name, l.leg, l.cause FROM leg l JOIN arm a ON a.id = l.arm_id "
                                     "WHERE l.run_id = ?1 AND l.cause IS NOT NULL", -1, &q, NULL);
    sqlite3_bind_int64(q, 1, run);
    while (sqlite3_step(q) == SQLITE_ROW)
        print_message("faulted leg %s/%d: %s\n", sqlite3_column_text(q, 0), sqlite3_column_int(q, 1),
                      sqlite3_column_text(q, 2));
    sqlite3_finalize(q);
}

/* Runs s into st and scores it. Returns the run id; *faulted the legs with a cause. */
static int64_t run_gate(tg_store *st, const tg_spec *s, int *faulted, verdict_result *vr)
{
    gate_options o = {.bin_dir = g_bin, .jobs = 2, .grace = 0.3};
    gate_result r;
    tg_err e;
    if (gate_run(st, s, &o, &r, &e) < 0) fail_msg("gate_run: %s", e.msg);
    if (faulted) *faulted = r.legs_faulted;
    verdict_options vo = verdict_options_default();
    if (verdict_score_run(st, r.run_id, &vo, vr, &e) < 0) fail_msg("verdict_score_run: %s", e.msg);
    return r.run_id;
}

/* A gated run: its spec, its (fresh) store, whether a leg faulted, the
 * verdict and the run id. */
typedef struct gated {
    tg_spec *s;
    tg_store *st;
    int faulted;
    verdict_result vr;
    int64_t run;
} gated;

/* Runs the gate over spec s (owned by g from here) into a fresh store and
 * scores it (run_gate). */
static void gate_spec(tg_spec *s, gated *g)
{
    g->s = s;
    g->st = open_db();
    g->run = run_gate(g->st, s, &g->faulted, &g->vr);
}

/* gate_spec over the spec text t (freed), written as s.yaml. */
static void gate_text(char *t, gated *g)
{
    tg_spec *s = write_spec(t);
    free(t);
    gate_spec(s, g);
}

/* gate_text that no leg faulted in (the faulted legs' causes printed). */
static void gate_clean(char *t, gated *g)
{
    gate_text(t, g);
    if (g->faulted) print_causes(g->st, g->run);
    assert_int_equal(g->faulted, 0);
}

static void gated_free(gated *g)
{
    store_close(g->st);
    spec_free(g->s);
}

/* A spec (the caller frees it) over the shipped model and prompts: head's
 * lines (name, steps, top_k, mode), llama.cpp CPU as the reference, and an
 * http arm named arm over a llama-server (the binary srv) that it starts on
 * a free port, with the http keys of extra. */
static char *server_spec(const char *srv, const char *head, const char *arm, const char *extra)
{
    char *t;
    assert_true(asprintf(&t,
                         "%s"
                         "model: {path: %s/models/tiny-trained-qwen3-Q4_K_M.gguf, "
                         "sha256: 9159ed92d8ffb26f342a511bd3a34e021f38298c26f1a5fdbf3a373c70691657}\n"
                         "prompts: %s/specs/prompts/manpy6.txt\n"
                         "legs: 2\nreference: llama-cpu\npolicy: {kind: exact}\n"
                         "arms:\n"
                         "  - {name: llama-cpu, llama: {lib: %s/npm/linux-x64/bins/linux-x64/libllama.so, "
                         "options: {threads: 1}}}\n"
                         "  - name: %s\n"
                         "    http:\n"
                         "      url: \"http://127.0.0.1:{port}\"\n"
                         "%s"
                         "      start: {argv: [%s, -m, \"{model}\", --host, 127.0.0.1, --port, \"{port}\", "
                         "-t, \"1\", -np, \"1\", --no-warmup, --no-ui], wait: 60}\n",
                         head, g_root, g_root, g_cache, arm, extra, srv) > 0);
    return t;
}

static void need_file(const char *p, const char *why)
{
    if (!exists(p)) {
        print_message("skipped: %s is missing (%s)\n", p, why);
        skip();
    }
}

/* ---- the spec's http arm ---- */

static void test_spec_http_arm(void **unused)
{
    (void)unused;
    char sha[65];
    char m[2 * PATH_MAX], *t;
    make_model(sha, m, sizeof m);
    assert_true(asprintf(&t,
                         "name: h\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: ab}]\n"
                         "steps: 2\ntop_k: 4\nlegs: 1\nreference: srv\npolicy: {kind: exact}\n"
                         "arms:\n"
                         "  - name: srv\n"
                         "    http:\n"
                         "      url: \"http://127.0.0.1:{port}\"\n"
                         "      api: openai\n"
                         "      top_k_max: 5\n"
                         "      request_timeout: 2.5\n"
                         "      api_key_env: MY_KEY\n"
                         "      headers: {X-Org: acme}\n"
                         "      headers_env: {api-key: OTHER_KEY}\n"
                         "      body: {return_tokens_as_token_ids: true}\n"
                         "      start: {argv: [my-server, -m, \"{model}\", --port, \"{port}\"], wait: 9}\n",
                         m, sha) > 0);
    tg_spec *s = write_spec(t);
    free(t);
    assert_string_equal(s->arms[0].kind_name, "http");
    assert_string_equal(s->arms[0].role, "test");
    tg_err e;
    char **argv = spec_arm_argv(s, 0, "/B", &e);
    assert_non_null(argv);
    char line[2048] = "";
    for (char **p = argv; *p; p++) {
        strcat(line, *p);
        strcat(line, "|");
    }
    const char *want = "/B/tg-http|--url|http://127.0.0.1:{port}|--api|openai|--top-k-max|5|--timeout|2.5|"
                       "--api-key-env|MY_KEY|--header|X-Org: acme|--header-env|api-key=OTHER_KEY|"
                       "--body|{\"return_tokens_as_token_ids\":true}|--start-wait|9|--start|my-server|-m|"
                       "{model}|--port|{port}|";
    if (strcmp(line, want)) fail_msg("argv\n  %s\nexpected\n  %s", line, want);
    spec_argv_free(argv);
    spec_free(s);

    /* errors name the field and what was expected */
    static const struct { const char *arm, *msg; } bad[] = {
        {"{name: x, http: {api: llama}}", "arms[0].http.url: missing"},
        {"{name: x, http: {url: \"ftp://a\"}}", "arms[0].http.url: expected an http:// or https:// URL"},
        {"{name: x, http: {url: \"http://a\", api: grpc}}", "arms[0].http.api: expected llama or openai, got 'grpc'"},
        {"{name: x, http: {url: \"http://a\", topk: 3}}", "arms[0].http.topk: unknown key"},
        {"{name: x, http: {url: \"http://a\", start: {health: /h}}}", "arms[0].http.start.argv: missing"},
        {"{name: x, http: {url: \"http://a\", api_key_env: \"not a name\"}}",
         "arms[0].http.api_key_env: expected the name of an environment variable"},
        {"{name: x, http: {url: \"http://a\"}, options: {threads: 1}}", "arms[0].options: expected no options"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_true(asprintf(&t,
                             "name: h\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: ab}]\n"
                             "steps: 2\ntop_k: 4\nlegs: 1\nreference: x\npolicy: {kind: exact}\n"
                             "arms:\n  - %s\n", m, sha, bad[i].arm) > 0);
        tg_spec *b = NULL;
        int rc = parse_text(t, &b, &e);
        free(t);
        spec_free(b);
        if (rc == 0) fail_msg("accepted %s", bad[i].arm);
        if (!strstr(e.msg, bad[i].msg)) fail_msg("for %s: got '%s', expected '%s'", bad[i].arm, e.msg, bad[i].msg);
    }
}

/* ---- llama-server ---- */

/* build/bin/llama-server of the repository (specs/server.yaml names it
 * there, also for the sanitizer build's tests), tg-http and libllama. */
static void need_server(char *srv, size_t n)
{
    snprintf(srv, n, "%s/build/bin/llama-server", g_root);
    need_file(srv, "build it with scripts/build-llama-server.sh");
    char p[PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/tg-http", g_bin);
    need_file(p, "make all builds it");
    snprintf(p, sizeof p, "%s/npm/linux-x64/bins/linux-x64/libllama.so", g_cache);
    need_file(p, "scripts/fetch-npm.sh");
}

/* specs/server.yaml, as shipped: PASS, and the server EXACT on every step. */
static void test_llama_server_gate(void **unused)
{
    (void)unused;
    char srv[PATH_MAX * 2];
    need_server(srv, sizeof srv);
    tg_spec *s;
    tg_err e;
    if (spec_load(&s, "specs/server.yaml", &e) < 0) fail_msg("%s", e.msg);
    gated g;
    double t0 = tg_now();
    gate_spec(s, &g);
    print_message("specs/server.yaml: %s in %.1f s\n", g.vr.verdict, tg_now() - t0);
    if (g.faulted) print_causes(g.st, g.run);
    assert_int_equal(g.faulted, 0);
    assert_string_equal(g.vr.verdict, "PASS");
    char v[128];
    arm_key(g.st, g.run, "llama-server", "TOKEN_GATE", v, sizeof v);
    assert_string_equal(v, "PASS");
    arm_key(g.st, g.run, "llama-server", "GENERATION_DIVERGENCES", v, sizeof v);
    assert_string_equal(v, "0/288");
    arm_key(g.st, g.run, "llama-server", "LEGS_CLEAN", v, sizeof v);
    assert_string_equal(v, "2/2");
    /* every compared step of both legs EXACT, over the reference's 32 ids */
    arm_rows(g.st, g.run, "llama-server", 1, "count(*)", "s.token = s.forced", v, sizeof v);
    assert_string_equal(v, "576");
    arm_rows(g.st, g.run, "llama-server", 0, "json_extract(hello, '$.arm.logits')", "1", v, sizeof v);
    assert_string_equal(v, "logprob");
    assert_integrity(g.st);
    gated_free(&g);
}

/* server_spec's gate over build/bin/llama-server (need_server): no leg
 * faulted, PASS, and the arm's GENERATION_DIVERGENCES are divergences. */
static void server_pass(const char *head, const char *arm, const char *extra, const char *divergences, gated *g)
{
    char srv[PATH_MAX * 2];
    need_server(srv, sizeof srv);
    gate_clean(server_spec(srv, head, arm, extra), g);
    assert_string_equal(g->vr.verdict, "PASS");
    char v[128];
    arm_key(g->st, g->run, arm, "GENERATION_DIVERGENCES", v, sizeof v);
    assert_string_equal(v, divergences);
}

/* Free mode over llama-server: each arm decodes alone, the server a whole
 * prompt in one request; the same tokens as tg-llama. */
static void test_llama_server_free(void **unused)
{
    (void)unused;
    gated g;
    server_pass("name: server-free\nsteps: 24\ntop_k: 8\nmode: free\n", "srv", "", "0/144", &g);
    char v[128];
    arm_rows(g.st, g.run, "srv", 0, "json_extract(counters, '$.requests')", "l.leg = 1", v, sizeof v);
    assert_string_equal(v, "6");
    gated_free(&g);
}

/* The same server's OpenAI-compatible endpoint: 20 log-probabilities a
 * step (the spec asks for 32), 4 tokens a request. */
static void test_openai_gate(void **unused)
{
    (void)unused;
    gated g;
    server_pass("name: server-openai\nsteps: 16\ntop_k: 32\n", "openai",
                "      api: openai\n      tokens_per_request: 4\n", "0/96", &g);
    char v[128];
    /* the shorter lists are compared over the reference's first 20 ids:
     * log-probabilities of the same logits give a KL of rounding size */
    arm_key(g.st, g.run, "openai", "KL_MEAN", v, sizeof v);
    double kl = strtod(v, NULL);
    print_message("openai arm: KL_MEAN %s over 20 of the reference's 32 ids\n", v);
    if (!(kl >= 0 && kl < 1e-9)) fail_msg("KL_MEAN %s, expected below 1e-9 for the same logits", v);
    /* 16 steps in at most 4 tokens a request: 4 requests a prompt */
    arm_rows(g.st, g.run, "openai", 0, "json_extract(counters, '$.requests')", "l.leg = 1", v, sizeof v);
    assert_string_equal(v, "24");
    assert_integrity(g.st);
    gated_free(&g);
}

/* ---- faults, with the test double ---- */

/* A TCP port on 127.0.0.1 bound but not listening: connections to it are
 * refused for as long as fd stays open. */
static int refused_port(int *fd)
{
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(*fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    assert_int_equal(bind(*fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(*fd, (struct sockaddr *)&a, &n), 0);
    return ntohs(a.sin_port);
}

static char *double_path(void)
{
    static char p[2 * PATH_MAX];
    snprintf(p, sizeof p, "%s/tg-http-double", g_bin);
    if (!exists(p)) fail_msg("missing %s (the test double): build tests/helpers", p);
    return p;
}

/* An http arm over the double in mode (started per leg), with extra http keys. */
static void double_arm(char *buf, size_t n, const char *name, const char *mode, const char *extra)
{
    snprintf(buf, n,
             "  - name: %s\n"
             "    http:\n"
             "      url: \"http://127.0.0.1:{port}\"\n"
             "      request_timeout: 1\n"
             "      start: {argv: [%s, %s, --port, \"{port}\"], wait: 10}\n"
             "%s",
             name, double_path(), mode, extra ? extra : "");
}

static void test_faults(void **unused)
{
    (void)unused;
    char sha[65], m[2 * PATH_MAX], fa[2 * PATH_MAX];
    make_model(sha, m, sizeof m);
    snprintf(fa, sizeof fa, "%s/tg-fault-arm", g_bin);
    need_file(fa, "the test double arm: build tests/helpers");
    int rfd, rport = refused_port(&rfd);
    static const struct { const char *name, *mode, *extra, *cause; } arms[] = {
        {"good", "ok", NULL, NULL},
        {"legacy", "ok", "      api: openai\n", NULL},
        {"die", "die", "      tokens_per_request: 1\n", "was killed by SIGKILL"},
        {"slow", "slow", NULL, "no complete answer within 1 s"},
        {"http500", "http500", NULL, "HTTP 500: test double: the model fell over"},
        {"http404", "http404", NULL, "HTTP 404: File Not Found: the test double has no tokenizer"},
        {"badjson", "badjson", NULL, "the answer is not JSON"},
        {"position", "position", NULL, "the answer is for a prompt of 3 tokens, expected 2 (an answer for another position)"},
        {"textonly", "legacy-text", "      api: openai\n", "names a token by its text, not its id"},
    };
    size_t cap = 1 << 16, len = 0;
    char *t = malloc(cap);
    len += (size_t)snprintf(t + len, cap - len,
                            "name: http-faults\nmodel: {path: %s, sha256: %s}\n"
                            "prompts: [{id: p1, text: ab}, {id: p2, text: cd}]\n"
                            "steps: 4\ntop_k: 4\nlegs: 2\nreference: ref\npolicy: {kind: exact}\n"
                            "timeout: {request: 20, leg: 60}\n"
                            "arms:\n"
                            "  - {name: ref, exec: [%s, ok], role: oracle}\n"
                            "  - {name: twin, exec: [%s, ok]}\n"
                            "  - {name: refused, http: {url: \"http://127.0.0.1:%d\", connect_timeout: 2}}\n",
                            m, sha, fa, fa, rport);
    for (size_t i = 0; i < sizeof arms / sizeof arms[0]; i++) {
        char a[3 * PATH_MAX];
        double_arm(a, sizeof a, arms[i].name, arms[i].mode, arms[i].extra);
        len += (size_t)snprintf(t + len, cap - len, "%s", a);
    }
    tg_spec *s = write_spec(t);
    free(t);
    tg_store *st = open_db();
    int faulted;
    verdict_result vr;
    double t0 = tg_now();
    int64_t run = run_gate(st, s, &faulted, &vr);
    double took = tg_now() - t0;
    close(rfd);
    print_message("the faulted http gate took %.1f s\n", took);
    assert_true(took < 60);
    assert_integrity(st);
    char v[2048];
    /* the other arms: every leg clean */
    const char *clean[] = {"ref", "twin", "good", "legacy"};
    for (int i = 0; i < 4; i++) {
        arm_rows(st, run, clean[i], 0, "count(*)", "l.cause IS NULL AND l.exit_status = 0", v, sizeof v);
        if (strcmp(v, "2")) {
            print_causes(st, run);
            fail_msg("arm %s: %s clean legs, expected 2", clean[i], v);
        }
    }
    /* the double's steps arrived through both flavours, ordered, 4 ids a step */
    arm_rows(st, run, "legacy", 1, "count(*)", "1", v, sizeof v);
    assert_string_equal(v, "16");
    /* each faulted leg: not clean, with the server's own message */
    arm_rows(st, run, "refused", 0, "group_concat(l.cause, ' | ')", "1", v, sizeof v);
    if (!strstr(v, "onnect")) fail_msg("refused: cause '%s', expected the connection failure", v);
    for (size_t i = 0; i < sizeof arms / sizeof arms[0]; i++) {
        if (!arms[i].cause) continue;
        arm_rows(st, run, arms[i].name, 0, "count(*)", "l.cause IS NOT NULL", v, sizeof v);
        if (strcmp(v, "2")) fail_msg("arm %s: %s legs with a cause, expected 2", arms[i].name, v);
        arm_rows(st, run, arms[i].name, 0, "l.cause", "l.leg = 1", v, sizeof v);
        if (!strstr(v, arms[i].cause)) fail_msg("arm %s: cause '%s', expected '%s'", arms[i].name, v, arms[i].cause);
        char w[32];
        arm_key(st, run, arms[i].name, "TOKEN_GATE", w, sizeof w);
        if (!strcmp(w, "PASS")) fail_msg("faulted arm %s got TOKEN_GATE=PASS", arms[i].name);
    }
    /* a server that died after two answers: the steps it gave are kept */
    arm_rows(st, run, "die", 1, "count(*)", "l.leg = 1", v, sizeof v);
    assert_string_equal(v, "2");
    assert_string_not_equal(vr.verdict, "PASS");
    store_close(st);
    spec_free(s);
}

/* Free mode: a server that answers fewer tokens than asked for (stopped at
 * an end-of-generation token) is asked again from where it stopped, with
 * its own tokens appended: 5 steps in 2 tokens an answer are 3 requests. */
static void test_free_continuation(void **unused)
{
    (void)unused;
    char sha[65], m[2 * PATH_MAX], fa[2 * PATH_MAX], a[3 * PATH_MAX];
    make_model(sha, m, sizeof m);
    snprintf(fa, sizeof fa, "%s/tg-fault-arm", g_bin);
    need_file(fa, "the test double arm: build tests/helpers");
    double_arm(a, sizeof a, "short", "short", NULL);
    char *t;
    assert_true(asprintf(&t,
                         "name: http-free\nmodel: {path: %s, sha256: %s}\n"
                         "prompts: [{id: p1, text: ab}, {id: p2, text: cde}]\n"
                         "steps: 5\ntop_k: 4\nlegs: 2\nmode: free\nreference: ref\npolicy: {kind: exact}\n"
                         "arms:\n  - {name: ref, exec: [%s, ok], role: oracle}\n%s",
                         m, sha, fa, a) > 0);
    gated g;
    gate_clean(t, &g);
    char v[256];
    arm_rows(g.st, g.run, "short", 0, "json_extract(counters, '$.requests')", "l.leg = 1", v, sizeof v);
    assert_string_equal(v, "6");
    arm_rows(g.st, g.run, "short", 1, "count(*)", "s.forced IS NULL", v, sizeof v);
    assert_string_equal(v, "20");
    gated_free(&g);
}

/* ---- secrets ---- */

/* The leg's stderr, decompressed, into a malloc'ed string. */
static char *leg_stderr(tg_store *st, int64_t run, const char *arm)
{
    sqlite3_stmt *q;
    sqlite3_prepare_v2(store_db(st), "SELECT l.stderr_zstd, l.stderr_len FROM leg l JOIN arm a ON a.id = l.arm_id "
                                     "WHERE l.run_id = ?1 AND a.name = ?2 AND l.leg = 1", -1, &q, NULL);
    sqlite3_bind_int64(q, 1, run);
    sqlite3_bind_text(q, 2, arm, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    size_t n = (size_t)sqlite3_column_int64(q, 1);
    char *out = calloc(n + 1, 1);
    if (sqlite3_column_bytes(q, 0) > 0) {
        size_t r = ZSTD_decompress(out, n, sqlite3_column_blob(q, 0), (size_t)sqlite3_column_bytes(q, 0));
        assert_false(ZSTD_isError(r));
    }
    sqlite3_finalize(q);
    return out;
}

static void test_api_key_not_stored(void **unused)
{
    (void)unused;
    char sha[65], m[2 * PATH_MAX], fa[2 * PATH_MAX], a[3 * PATH_MAX], b[3 * PATH_MAX];
    make_model(sha, m, sizeof m);
    snprintf(fa, sizeof fa, "%s/tg-fault-arm", g_bin);
    need_file(fa, "the test double arm: build tests/helpers");
    static const char secret[] = "s3cr3t-tokgate-test-key-5b1e";
    setenv("TG_DOUBLE_KEY", secret, 1);           /* what the double expects */
    setenv("TG_TEST_API_KEY", secret, 1);         /* what the spec names */
    double_arm(a, sizeof a, "keyed", "auth", "      api_key_env: TG_TEST_API_KEY\n");
    double_arm(b, sizeof b, "keyless", "auth", NULL);
    char *t;
    assert_true(asprintf(&t,
                         "name: http-key\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: ab}]\n"
                         "steps: 3\ntop_k: 4\nlegs: 2\nreference: ref\npolicy: {kind: exact}\n"
                         "arms:\n  - {name: ref, exec: [%s, ok], role: oracle}\n%s%s",
                         m, sha, fa, a, b) > 0);
    gated g;
    gate_text(t, &g);
    unsetenv("TG_DOUBLE_KEY");
    unsetenv("TG_TEST_API_KEY");
    char v[2048];
    arm_rows(g.st, g.run, "keyed", 0, "count(*)", "l.cause IS NULL", v, sizeof v);
    if (strcmp(v, "2")) {
        print_causes(g.st, g.run);
        fail_msg("the arm with the key: %s clean legs, expected 2", v);
    }
    arm_rows(g.st, g.run, "keyless", 0, "l.cause", "l.leg = 1", v, sizeof v);
    if (!strstr(v, "HTTP 401: test double: missing or wrong API key")) fail_msg("keyless: cause '%s'", v);
    /* the value appears in no stored text */
    q_text(g.st, "SELECT count(*) FROM arm WHERE run_id = ?1 AND instr(config, ?2) > 0", g.run, secret, v, sizeof v);
    assert_string_equal(v, "0");
    q_text(g.st, "SELECT count(*) FROM leg WHERE run_id = ?1 AND (instr(hello, ?2) > 0 OR instr(model, ?2) > 0 "
                 "OR instr(coalesce(cause, ''), ?2) > 0 OR instr(coalesce(counters, ''), ?2) > 0)", g.run, secret, v, sizeof v);
    assert_string_equal(v, "0");
    q_text(g.st, "SELECT count(*) FROM run r JOIN spec s ON s.id = r.spec_id WHERE r.id = ?1 AND instr(s.text, ?2) > 0",
           g.run, secret, v, sizeof v);
    assert_string_equal(v, "0");
    const char *names[] = {"keyed", "keyless"};
    for (int i = 0; i < 2; i++) {
        char *err = leg_stderr(g.st, g.run, names[i]);
        if (strstr(err, secret)) fail_msg("arm %s: the key is in the stored stderr", names[i]);
        free(err);
    }
    gated_free(&g);
}

TG_TEST_MAIN_WITH(
    setup, teardown, test_spec_http_arm, test_faults, test_free_continuation, test_api_key_not_stored,
    test_llama_server_gate, test_llama_server_free, test_openai_gate)
