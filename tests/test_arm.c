/*
 * test_arm.c: the arm process runner and protocol client (harness/arm.c).
 *
 * Most tests drive tests/helpers/tg-fault-arm, a TEST DOUBLE worker that
 * misbehaves on purpose (crash, hang, garbage, wrong fields, early EOF,
 * a 100 MB line, slow drip, silent exit, SIGTERM ignored): each fault must
 * end with the right cause, within its timeout, with the worker reaped.
 * One test talks to a real worker (build/bin/tg-engine, else tg-llama) on
 * the shipped model, and is skipped when neither is built.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "arm.h"

static char g_bin[8192];     /* folder of tokgate's executables */
static char g_root[4096];    /* the repository */

static void paths(void)
{
    const char *b = getenv("TG_BUILD"), *r = getenv("TG_ROOT");
    snprintf(g_root, sizeof g_root, "%s", r ? r : ".");
    if (b) snprintf(g_bin, sizeof g_bin, "%s/bin", b);
    else snprintf(g_bin, sizeof g_bin, "%s/build/bin", g_root);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Starts the fault arm in mode with short timeouts. */
static tg_arm *start_fault(const char *mode, double req_timeout, double leg_timeout)
{
    char prog[8400];
    snprintf(prog, sizeof prog, "%s/tg-fault-arm", g_bin);
    if (!exists(prog)) {
        print_message("missing %s: build tests/helpers first (make BUILD=... all)\n", prog);
        fail();
    }
    char *argv[] = {prog, (char *)mode, NULL};
    char *pats[] = {"Memory access fault", "GPU Hang"};
    arm_config cfg = {.name = mode, .argv = argv, .timeout_request = req_timeout,
                      .timeout_leg = leg_timeout, .grace = 0.3, .max_line = 1 << 20,
                      .n_fault_patterns = 2, .fault_patterns = pats};
    tg_arm *a = NULL;
    tg_err e;
    if (arm_start(&a, &cfg, &e) < 0) {
        print_message("arm_start(%s): %s\n", mode, e.msg);
        fail();
    }
    return a;
}

/* The worker must be reaped: waitpid says there is no such child. */
static void assert_reaped(pid_t pid)
{
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (!(r == -1 && errno == ECHILD)) {
        print_message("pid %d is still our child (waitpid %d): a zombie or a live worker\n", (int)pid, (int)r);
        fail();
    }
}

static void assert_cause(const char *cause, const char *prefix, const char *has)
{
    if (!cause || strncmp(cause, prefix, strlen(prefix)) || (has && !strstr(cause, has))) {
        print_message("cause '%s', expected it to start with '%s'%s%s\n", cause ? cause : "(none)", prefix,
                      has ? " and mention " : "", has ? has : "");
        fail();
    }
}

/* hello must fail with a cause starting with prefix, within max_s seconds. */
static void fault_at_hello(const char *mode, const char *prefix, const char *has, double req_timeout,
                           double max_s)
{
    tg_arm *a = start_fault(mode, req_timeout, 30);
    pid_t pid = arm_pid(a);
    double t0 = tg_now();
    tg_err e;
    assert_int_equal(arm_hello(a, NULL, &e), -1);
    assert_true(arm_failed(a));
    arm_exit x;
    arm_finish(a, &x);
    double took = tg_now() - t0;
    assert_cause(x.cause, prefix, has);
    if (!strstr(e.msg, mode)) {
        print_message("error '%s' does not name the arm '%s'\n", e.msg, mode);
        fail();
    }
    if (took > max_s) {
        print_message("%s took %.2f s, expected at most %.2f s\n", mode, took, max_s);
        fail();
    }
    assert_reaped(pid);
    arm_free(a);
}

static void test_segv_before_answer(void **st)
{
    (void)st;
    fault_at_hello("segv-hello", "crash: SIGSEGV during hello", NULL, 5, 3);
}

static void test_hang_times_out(void **st)
{
    (void)st;
    fault_at_hello("hang", "timeout: hello", "0.5 s", 0.5, 3);
}

static void test_garbage_is_protocol_error(void **st)
{
    (void)st;
    fault_at_hello("garbage", "protocol: hello: expected a JSON object", NULL, 5, 3);
}

static void test_wrong_fields_is_protocol_error(void **st)
{
    (void)st;
    fault_at_hello("wrong-fields", "protocol: hello", "\"arm\"", 5, 3);
}

static void test_100mb_line_is_protocol_error(void **st)
{
    (void)st;
    fault_at_hello("bigline", "protocol: hello: a line longer than", NULL, 20, 10);
}

static void test_slow_drip_times_out(void **st)
{
    (void)st;
    fault_at_hello("drip", "timeout: hello", NULL, 0.5, 3);
}

static void test_exit0_without_answer(void **st)
{
    (void)st;
    fault_at_hello("exit0", "eof: hello", "exit status 0", 5, 3);
}

static void test_ignores_sigterm_gets_killed(void **st)
{
    (void)st;
    fault_at_hello("ignore-term", "timeout: hello", NULL, 0.4, 4);
}

static void test_leg_timeout(void **st)
{
    (void)st;
    tg_arm *a = start_fault("hang", 60, 0.4);
    pid_t pid = arm_pid(a);
    tg_err e;
    double t0 = tg_now();
    assert_int_equal(arm_hello(a, NULL, &e), -1);
    arm_exit x;
    arm_finish(a, &x);
    assert_cause(x.cause, "timeout: hello: the leg ran past its 0.4 s limit", NULL);
    assert_true(tg_now() - t0 < 3);
    assert_reaped(pid);
    arm_free(a);
}

/* Runs hello/load/tokenize and then a 5-step decode that must fail. */
static void fault_at_decode(const char *mode, const char *prefix, int want_steps)
{
    tg_arm *a = start_fault(mode, 3, 30);
    pid_t pid = arm_pid(a);
    tg_err e;
    assert_int_equal(arm_hello(a, NULL, &e), 0);
    assert_int_equal(arm_load(a, "/nonexistent.gguf", "{}", NULL, &e), 0);
    int32_t prompt[] = {1, 2, 3};
    arm_decode_req q = {.prompt = prompt, .n_prompt = 3, .steps = 5, .top_k = 4};
    arm_decode_res r;
    double t0 = tg_now();
    assert_int_equal(arm_decode(a, &q, &r, NULL, NULL, &e), -1);
    assert_true(tg_now() - t0 < 4);
    assert_int_equal(r.n_steps, want_steps);
    arm_decode_res_free(&r);
    arm_exit x;
    arm_finish(a, &x);
    assert_cause(x.cause, prefix, NULL);
    assert_reaped(pid);
    arm_free(a);
}

static void test_segv_mid_stream(void **st)
{
    (void)st;
    fault_at_decode("segv-decode", "crash: SIGSEGV during decode (after 2 of 5 step lines)", 2);
}

static void test_early_eof_mid_stream(void **st)
{
    (void)st;
    fault_at_decode("eof-decode", "eof: decode", 1);
}

static void test_wrong_step_fields(void **st)
{
    (void)st;
    fault_at_decode("wrong-step", "protocol: decode: step line 0: expected \"token\"", 0);
}

/* The well-behaved double: the whole exchange parses, forcing is sent, the
 * session ends clean (exit 0, no cause). */
static void test_good_exchange_with_double(void **st)
{
    (void)st;
    tg_arm *a = start_fault("ok", 3, 30);
    pid_t pid = arm_pid(a);
    tg_err e;
    char *hello = NULL;
    assert_int_equal(arm_hello(a, &hello, &e), 0);
    assert_non_null(strstr(hello, "test-double"));
    assert_string_equal(arm_hello_field(a, "version"), "fault-arm 1");
    free(hello);
    assert_int_equal(arm_load(a, "/m.gguf", "{\"threads\":2}", NULL, &e), 0);
    int32_t *ids;
    int n;
    assert_int_equal(arm_tokenize(a, "ab", 0, &ids, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 'a' % 50);
    char *text;
    size_t len;
    assert_int_equal(arm_detokenize(a, ids, n, 0, &text, &len, &e), 0);
    assert_int_equal(len, 2);
    assert_string_equal(text, "AB");
    free(text);
    int32_t force[] = {5, 6, 7, 8};
    arm_decode_req q = {.prompt = ids, .n_prompt = n, .steps = 4, .top_k = 3, .force = force, .n_force = 4};
    arm_decode_res r;
    assert_int_equal(arm_decode(a, &q, &r, NULL, NULL, &e), 0);
    assert_int_equal(r.n_steps, 4);
    /* the double's token at step i+1 follows the forced token of step i */
    assert_int_equal(r.steps[1].token, (5 * 7 + 3) % 50);
    assert_int_equal(r.steps[0].n_top, 3);
    assert_true(r.steps[0].top[0].logit == 10.0f);
    assert_string_equal(r.steps[0].digest, "0123456789abcdef");
    assert_true(r.ms_prefill == 2.0 && r.ms_decode == 3.0);
    assert_non_null(strstr(r.counters_json, "host_ops"));
    arm_decode_res_free(&r);
    free(ids);
    arm_exit x;
    arm_finish(a, &x);
    assert_null(x.cause);
    assert_int_equal(x.exit_status, 0);
    assert_null(x.fault_lines);
    assert_reaped(pid);
    arm_free(a);
}

/* An {"ok":false} answer is the worker's error: it stays up and serves on. */
static void test_error_answer_keeps_worker(void **st)
{
    (void)st;
    tg_arm *a = start_fault("error-decode", 3, 30);
    tg_err e;
    assert_int_equal(arm_hello(a, NULL, &e), 0);
    int32_t p[] = {1};
    arm_decode_req q = {.prompt = p, .n_prompt = 1, .steps = 2, .top_k = 2};
    arm_decode_res r;
    assert_int_equal(arm_decode(a, &q, &r, NULL, NULL, &e), -1);
    assert_non_null(strstr(e.msg, "refuses to decode"));
    assert_false(arm_failed(a));
    arm_decode_res_free(&r);
    int32_t *ids;
    int n;
    assert_int_equal(arm_tokenize(a, "x", 0, &ids, &n, &e), 0);
    free(ids);
    arm_exit x;
    arm_finish(a, &x);
    assert_null(x.cause);
    arm_free(a);
}

static void test_fault_pattern_in_stderr(void **st)
{
    (void)st;
    tg_arm *a = start_fault("fault-stderr", 3, 30);
    tg_err e;
    assert_int_equal(arm_hello(a, NULL, &e), 0);
    arm_exit x;
    arm_finish(a, &x);
    assert_non_null(x.fault_lines);
    assert_string_equal(x.fault_lines, "Memory access fault by GPU node-1 on address 0x0\n");
    assert_non_null(strstr(x.stderr_text, "starting up\n"));
    arm_free(a);
}

static void test_nonzero_exit_after_bye(void **st)
{
    (void)st;
    tg_arm *a = start_fault("exit3", 3, 30);
    tg_err e;
    assert_int_equal(arm_hello(a, NULL, &e), 0);
    arm_exit x;
    arm_finish(a, &x);
    assert_int_equal(x.exit_status, 3);
    assert_cause(x.cause, "exit: status 3", NULL);
    arm_free(a);
}

static void test_missing_program(void **st)
{
    (void)st;
    char *argv[] = {"/nonexistent/tg-nothing", NULL};
    arm_config cfg = {.name = "ghost", .argv = argv};
    tg_arm *a = NULL;
    tg_err e;
    assert_int_equal(arm_start(&a, &cfg, &e), -1);
    assert_null(a);
    assert_non_null(strstr(e.msg, "cannot start /nonexistent/tg-nothing"));
}

static void test_command_runner(void **st)
{
    (void)st;
    char *out;
    size_t len;
    arm_exit x;
    tg_err e;
    char *echo[] = {"printf", "%s", "hello world", NULL};
    assert_int_equal(arm_run_command(echo, 5, 0, 0, NULL, &out, &len, &x, &e), 0);
    assert_string_equal(out, "hello world");
    assert_null(x.cause);
    free(out);
    arm_exit_free(&x);

    char *slow[] = {"sleep", "30", NULL};
    double t0 = tg_now();
    assert_int_equal(arm_run_command(slow, 0.3, 0, 0, NULL, &out, &len, &x, &e), -1);
    assert_true(tg_now() - t0 < 3);
    assert_cause(x.cause, "timeout", NULL);
    arm_exit_free(&x);

    char *bad[] = {"false", NULL};
    assert_int_equal(arm_run_command(bad, 5, 0, 0, NULL, &out, &len, &x, &e), -1);
    assert_cause(x.cause, "exit: status 1", NULL);
    arm_exit_free(&x);
}

/* A real worker over the shipped model: hello, load, tokenize, decode. */
static void test_real_worker(void **st)
{
    (void)st;
    char engine[8400], llama[8400], lib[8400], model[8400];
    snprintf(engine, sizeof engine, "%s/tg-engine", g_bin);
    snprintf(llama, sizeof llama, "%s/tg-llama", g_bin);
    const char *cache = getenv("TG_CACHE");
    snprintf(lib, sizeof lib, "%s/npm/linux-x64/bins/linux-x64/libllama.so", cache ? cache : ".cache");
    if (!cache) snprintf(lib, sizeof lib, "%s/.cache/npm/linux-x64/bins/linux-x64/libllama.so", g_root);
    snprintf(model, sizeof model, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", g_root);
    char *argv_e[] = {engine, "--tier", "ref", NULL};
    char *argv_l[] = {llama, "--lib", lib, NULL};
    char **argv = exists(engine) ? argv_e : exists(llama) && exists(lib) ? argv_l : NULL;
    if (!argv || !exists(model)) {
        print_message("skipped: neither %s nor %s (with %s) is built, or the model is missing\n", engine, llama, lib);
        skip();
    }
    arm_config cfg = {.name = "real", .argv = argv, .timeout_request = 60, .timeout_leg = 120};
    tg_arm *a;
    tg_err e;
    assert_int_equal(arm_start(&a, &cfg, &e), 0);
    if (arm_hello(a, NULL, &e) < 0 || arm_load(a, model, "{}", NULL, &e) < 0) {
        print_message("real worker %s: %s\n", argv[0], e.msg);
        fail();
    }
    int32_t *ids;
    int n;
    assert_int_equal(arm_tokenize(a, "The following options are supported:", 0, &ids, &n, &e), 0);
    assert_true(n > 0);
    arm_decode_req q = {.prompt = ids, .n_prompt = n, .steps = 4, .top_k = 8};
    arm_decode_res r;
    if (arm_decode(a, &q, &r, NULL, NULL, &e) < 0) {
        print_message("real worker decode: %s\n", e.msg);
        fail();
    }
    assert_int_equal(r.n_steps, 4);
    assert_int_equal(r.steps[0].n_top, 8);
    assert_int_equal(strlen(r.steps[0].digest), 16);
    arm_decode_res_free(&r);
    free(ids);
    arm_exit x;
    arm_finish(a, &x);
    if (x.cause) print_message("real worker cause: %s\nstderr: %s\n", x.cause, x.stderr_text);
    assert_null(x.cause);
    assert_int_equal(x.exit_status, 0);
    arm_free(a);
}

int main(void)
{
    paths();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segv_before_answer),
        cmocka_unit_test(test_hang_times_out),
        cmocka_unit_test(test_garbage_is_protocol_error),
        cmocka_unit_test(test_wrong_fields_is_protocol_error),
        cmocka_unit_test(test_100mb_line_is_protocol_error),
        cmocka_unit_test(test_slow_drip_times_out),
        cmocka_unit_test(test_exit0_without_answer),
        cmocka_unit_test(test_ignores_sigterm_gets_killed),
        cmocka_unit_test(test_leg_timeout),
        cmocka_unit_test(test_segv_mid_stream),
        cmocka_unit_test(test_early_eof_mid_stream),
        cmocka_unit_test(test_wrong_step_fields),
        cmocka_unit_test(test_good_exchange_with_double),
        cmocka_unit_test(test_error_answer_keeps_worker),
        cmocka_unit_test(test_fault_pattern_in_stderr),
        cmocka_unit_test(test_nonzero_exit_after_bye),
        cmocka_unit_test(test_missing_program),
        cmocka_unit_test(test_command_runner),
        cmocka_unit_test(test_real_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
