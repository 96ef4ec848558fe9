/*
 * test_security.c: the security properties of the issue, each checked on
 * the code itself:
 *  - no shell anywhere: the C/CUDA sources of engine/, harness/, oracles/
 *    and tests/ (comments stripped) call neither system() nor popen() and
 *    name no shell ("sh", "bash", "/bin/sh") for an exec call;
 *  - spec fields cannot become options or commands of the arms: paths
 *    (model, llama lib, worker) are resolved to absolute paths and passed as
 *    the value of a named option (or inside the protocol's JSON), a tier
 *    that looks like an option is refused, and the command arm's {model}
 *    placeholder becomes the absolute path;
 *  - untrusted sizes are overflow-checked: GGUF counts, string and array
 *    lengths, tensor dims and offsets (hostile files from the fuzz corpus);
 *    protocol requests with huge steps, top_k, ids; spec integers out of
 *    range or not integers; a worker's dump line whose n does not match
 *    its file (here: /dev/zero with n = 2^31) is refused before any
 *    allocation or read (a bug found and fixed in harness/arm.c).
 */
#include <dirent.h>
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

#include "arm.h"
#include "gguf.h"
#include "proto.h"
#include "spec.h"

static char g_root[PATH_MAX];

static int setup(void **st)
{
    (void)st;
    const char *r = getenv("TG_ROOT");
    snprintf(g_root, sizeof g_root, "%s", r ? r : ".");
    return 0;
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0, r;
    char *b = malloc(cap + 1);
    while (b && (r = fread(b + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) b = realloc(b, (cap *= 2) + 1);
    }
    fclose(f);
    if (b) b[len] = 0;
    *n = len;
    return b;
}

/* C source with comments blanked out (string literals kept). */
static void strip_comments(char *s)
{
    for (char *p = s; *p; p++) {
        if (*p == '"' || *p == '\'') {
            char q = *p;
            for (p++; *p && *p != q; p++)
                if (*p == '\\' && p[1]) p++;
            if (!*p) return;
        } else if (p[0] == '/' && p[1] == '*') {
            char *end = strstr(p + 2, "*/");
            char *stop = end ? end + 2 : p + strlen(p);
            for (; p < stop; p++)
                if (*p != '\n') *p = ' ';
            p--;
        } else if (p[0] == '/' && p[1] == '/') {
            for (; *p && *p != '\n'; p++) *p = ' ';
            if (!*p) return;
        }
    }
}

/* A call of name( as an identifier (not a suffix of a longer one). */
static const char *find_call(const char *s, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = strstr(s, name); p; p = strstr(p + 1, name)) {
        if (p > s && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= 'A' && p[-1] <= 'Z') ||
                      (p[-1] >= '0' && p[-1] <= '9') || p[-1] == '.' || p[-1] == '>'))
            continue;
        const char *q = p + n;
        while (*q == ' ' || *q == '\t') q++;
        if (*q == '(') return p;
    }
    return NULL;
}

static int line_of(const char *s, const char *p)
{
    int l = 1;
    for (; s < p; s++) l += *s == '\n';
    return l;
}

static int scan_file(const char *path)
{
    size_t n;
    char *s = slurp(path, &n);
    if (!s) return 0;
    strip_comments(s);
    int bad = 0;
    /* the names are assembled so this file does not match itself */
    char sys[16], pop[16];
    snprintf(sys, sizeof sys, "%s%s", "sys", "tem");
    snprintf(pop, sizeof pop, "%s%s", "po", "pen");
    const char *calls[] = {sys, pop, "execl", "execlp", "execle", NULL};
    for (int i = 0; calls[i]; i++) {
        const char *p = find_call(s, calls[i]);
        if (p) {
            print_message("%s:%d: %s() call\n", path, line_of(s, p), calls[i]);
            bad++;
        }
    }
    char sh1[16], sh2[16], sh3[16], sh4[16];
    snprintf(sh1, sizeof sh1, "\"%s%s\"", "s", "h");
    snprintf(sh2, sizeof sh2, "\"%s%s%s\"", "ba", "s", "h");
    snprintf(sh3, sizeof sh3, "\"/bin/%s%s", "s", "h");
    snprintf(sh4, sizeof sh4, "\"/bin/%s%s%s", "ba", "s", "h");
    const char *lits[] = {sh1, sh2, sh3, sh4, NULL};
    for (int i = 0; lits[i]; i++) {
        const char *p = strstr(s, lits[i]);
        if (p) {
            print_message("%s:%d: names a shell (%s)\n", path, line_of(s, p), lits[i]);
            bad++;
        }
    }
    free(s);
    return bad;
}

static int scan_dir(const char *dir, int *files)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int bad = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[PATH_MAX * 2];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st)) continue;
        if (S_ISDIR(st.st_mode)) {
            bad += scan_dir(p, files);
            continue;
        }
        const char *dot = strrchr(de->d_name, '.');
        if (!dot || (strcmp(dot, ".c") && strcmp(dot, ".h") && strcmp(dot, ".cu") && strcmp(dot, ".cuh") &&
                     strcmp(dot, ".wip")))
            continue;
        (*files)++;
        bad += scan_file(p);
    }
    closedir(d);
    return bad;
}

static void test_no_shell_in_sources(void **unused)
{
    (void)unused;
    const char *dirs[] = {"engine", "harness", "oracles", "tests", NULL};
    int bad = 0, files = 0;
    for (int i = 0; dirs[i]; i++) {
        char p[PATH_MAX * 2];
        snprintf(p, sizeof p, "%s/%s", g_root, dirs[i]);
        bad += scan_dir(p, &files);
    }
    print_message("%d source files scanned\n", files);
    if (files < 20) {
        print_message("expected the project's sources under %s (TG_ROOT)\n", g_root);
        fail();
    }
    if (bad) {
        print_message("%d use(s) of a shell found: processes must be started from an argv (posix_spawn)\n", bad);
        fail();
    }
}

/* The scanner itself: it must see a call and a shell name that are there,
 * and not see them in comments. */
static void test_scanner_finds_calls(void **unused)
{
    (void)unused;
    char sys[16];
    snprintf(sys, sizeof sys, "%s%s", "sys", "tem");
    char src[512];
    snprintf(src, sizeof src, "/* %s(\"x\") in a comment */\nint f(void) { my_%s(1); return %s (\"ls\"); }\n", sys, sys, sys);
    strip_comments(src);
    const char *p = find_call(src, sys);
    assert_non_null(p);
    assert_int_equal(line_of(src, p), 2);
    assert_true(p > strstr(src, "my_"));
    char c2[128] = "// x(\nint a = 1;";
    strip_comments(c2);
    assert_null(find_call(c2, "x"));
}

static tg_spec *spec_text(const char *text, tg_err *e)
{
    tg_spec *s = NULL;
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/specs/security-test.yaml", g_root);
    if (spec_parse(&s, path, text, strlen(text), e) < 0) return NULL;
    return s;
}

#define SPEC_HEAD "name: sec\nmodel: {path: %s, sha256: " \
    "abababababababababababababababababababababababababababababababab}\n" \
    "prompts: [{id: p1, text: \"--help\"}]\nsteps: 4\ntop_k: 4\nlegs: 2\nreference: r\npolicy: {kind: exact}\n"

/* Spec values that look like options stay values. */
static void test_spec_values_are_not_options(void **unused)
{
    (void)unused;
    char t[2048];
    tg_err e;
    snprintf(t, sizeof t, SPEC_HEAD
             "arms:\n  - {name: r, engine: ref}\n"
             "  - {name: l, llama: {lib: --help, worker: -v}}\n"
             "  - {name: c, command: [llama-completion, -m, \"{model}\", -p, \"{prompt}\"], role: custody}\n",
             "--help");
    tg_spec *s = spec_text(t, &e);
    if (!s) {
        print_message("spec: %s\n", e.msg);
        fail();
    }
    /* model, lib and worker paths are absolute */
    assert_true(s->model_path[0] == '/');
    assert_non_null(strstr(s->model_path, "--help"));
    char **v = spec_arm_argv(s, 0, "/bin-dir", &e);
    assert_non_null(v);
    assert_string_equal(v[0], "/bin-dir/tg-engine");
    assert_string_equal(v[1], "--tier");
    assert_string_equal(v[2], "ref");
    assert_null(v[3]);
    spec_argv_free(v);
    v = spec_arm_argv(s, 1, "/bin-dir", &e);
    assert_non_null(v);
    assert_true(v[0][0] == '/');            /* the worker "-v" became a path */
    assert_string_equal(v[1], "--lib");
    assert_true(v[2][0] == '/');            /* lib "--help": the value of --lib, as a path */
    assert_null(v[3]);
    spec_argv_free(v);
    /* {model} is the absolute path; {prompt} is one argv word, the value of -p */
    v = spec_command_argv(s, 2, "--help; rm -rf /", &e);
    assert_non_null(v);
    assert_string_equal(v[1], "-m");
    assert_true(v[2][0] == '/');
    assert_string_equal(v[3], "-p");
    assert_string_equal(v[4], "--help; rm -rf /");
    assert_null(v[5]);
    spec_argv_free(v);
    spec_free(s);

    /* a tier that looks like an option is refused */
    snprintf(t, sizeof t, SPEC_HEAD "arms:\n  - {name: r, engine: --help}\n", "m.gguf");
    assert_null(spec_text(t, &e));
    assert_non_null(strstr(e.msg, "engine"));
    /* an arm name cannot be an option either (names are [A-Za-z0-9_.-]+ but not led by '-') */
    snprintf(t, sizeof t, SPEC_HEAD "arms:\n  - {name: r, engine: ref}\n  - {name: \"x y\", engine: cpu}\n", "m.gguf");
    assert_null(spec_text(t, &e));
}

/* Spec integers: out of range, too large for any integer type, or not
 * integers, are refused with the field named. */
static void test_spec_sizes_checked(void **unused)
{
    (void)unused;
    const char *bad[][2] = {
        {"steps: 4", "steps: 99999999999999999999999999"},
        {"steps: 4", "steps: 4294967297"},
        {"steps: 4", "steps: -1"},
        {"steps: 4", "steps: 4.5"},
        {"top_k: 4", "top_k: 1e30"},
        {"legs: 2", "legs: 9223372036854775808"},
        {"legs: 2", "legs: 0x7fffffffffffffff"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char t[2048], u[2048];
        snprintf(t, sizeof t, SPEC_HEAD "arms:\n  - {name: r, engine: ref}\n", "m.gguf");
        char *p = strstr(t, bad[i][0]);
        assert_non_null(p);
        snprintf(u, sizeof u, "%.*s%s%s", (int)(p - t), t, bad[i][1], p + strlen(bad[i][0]));
        tg_err e;
        tg_spec *s = spec_text(u, &e);
        if (s) {
            print_message("the spec with '%s' loaded, expected an error\n", bad[i][1]);
            spec_free(s);
            fail();
        }
        char field[16];
        snprintf(field, sizeof field, "%.*s", (int)(strchr(bad[i][0], ':') - bad[i][0]), bad[i][0]);
        if (!strstr(e.msg, field)) {
            print_message("'%s': the error does not name %s: %s\n", bad[i][1], field, e.msg);
            fail();
        }
    }
}

/* A spec that is not UTF-8 is refused before libfyaml sees it (libfyaml
 * loops forever on "%" followed by an invalid byte: found by fuzz_spec). */
static void test_spec_invalid_utf8_refused(void **unused)
{
    (void)unused;
    const char *bad[] = {"%\xff\n", "%a\x80", "name: x\nsteps: \xc0\xaf\n", "a: \xed\xa0\x80\n",
                         "a: \xf4\x90\x80\x80\n", NULL};
    for (int i = 0; bad[i]; i++) {
        tg_err e;
        tg_spec *s = spec_text(bad[i], &e);
        assert_null(s);
        if (!strstr(e.msg, "expected UTF-8 text")) {
            print_message("input %d: %s\n", i, e.msg);
            fail();
        }
    }
    tg_err e;
    assert_null(spec_text("name: x\nsteps: \xc0\xaf\n", &e));
    assert_non_null(strstr(e.msg, ":2:8:"));
}

/* Hostile GGUF files (kept in the fuzz corpus): refused with a message. */
static void test_gguf_sizes_checked(void **unused)
{
    (void)unused;
    const char *files[] = {"huge-n-kv", "huge-n-tensors", "huge-string", "huge-dims", "dims-wrap",
                           "offset-past-end", "huge-array", "string-array-overrun", "nested-array-3",
                           "bad-type", "n-dims-9", "align-0", "long-name", "dup-tensor", NULL};
    int bad = 0;
    for (int i = 0; files[i]; i++) {
        char p[PATH_MAX * 2];
        snprintf(p, sizeof p, "%s/tests/fuzz/corpus/gguf/%s.gguf", g_root, files[i]);
        size_t n;
        char *b = slurp(p, &n);
        if (!b) {
            print_message("missing %s (the kept fuzz corpus)\n", p);
            fail();
        }
        gguf *g = NULL;
        tg_err e = {{0}};
        int rc = gguf_open_buf(&g, b, n, files[i], &e);
        if (rc == 0) {
            print_message("%s: opened, expected a refusal\n", files[i]);
            gguf_close(g);
            bad++;
        } else if (!e.msg[0]) {
            print_message("%s: refused without a message\n", files[i]);
            bad++;
        } else {
            print_message("  %-22s %s\n", files[i], e.msg);
        }
        free(b);
    }
    assert_int_equal(bad, 0);
}

/* Protocol requests with sizes beyond the limits get an error answer. */
static int never(void *ud, const proto_decode_req *req, proto_conn *c, proto_done *done, tg_err *e)
{
    (void)ud, (void)req, (void)c, (void)done;
    return tg_errf(e, "a decode callback ran for a request that should have been refused");
}

static void test_proto_sizes_checked(void **unused)
{
    (void)unused;
    const char *bad[] = {
        "{\"op\":\"decode\",\"prompt\":[1],\"steps\":2147483648}",
        "{\"op\":\"decode\",\"prompt\":[1],\"steps\":100001}",
        "{\"op\":\"decode\",\"prompt\":[1],\"steps\":4,\"top_k\":4294967297}",
        "{\"op\":\"decode\",\"prompt\":[1],\"steps\":-1}",
        "{\"op\":\"decode\",\"prompt\":[1],\"steps\":1e300}",
        "{\"op\":\"decode\",\"prompt\":[4294967296],\"steps\":1}",
        "{\"op\":\"decode\",\"prompt\":[-1],\"steps\":1}",
        "{\"op\":\"decode\",\"prompt\":[1.5],\"steps\":1}",
        "{\"op\":\"decode\",\"prompt\":[],\"steps\":1}",
        "{\"op\":\"decode\",\"prompt\":[1],\"steps\":3,\"force\":[1]}",
        "{\"op\":\"decode\",\"prompt\":[1],\"steps\":2,\"dump\":{\"steps\":[99999999999],\"path\":\"/tmp\"}}",
        NULL};
    proto_ops ops = {.decode = never};
    for (int i = 0; bad[i]; i++) {
        char *out = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&out, &n);
        assert_non_null(f);
        proto_conn *c = proto_conn_new(f);
        assert_non_null(c);
        assert_int_equal(proto_handle_line(c, &ops, bad[i], strlen(bad[i])), 0);
        proto_conn_free(c);
        fclose(f);
        if (!strstr(out, "\"ok\":false") || strstr(out, "should have been refused")) {
            print_message("request %s: answer %s, expected a validation error\n", bad[i], out);
            free(out);
            fail();
        }
        free(out);
    }
}

/* Writes the path of the test double tg-fault-arm ($TG_BUILD/bin, else
 * build/bin under the root) into fa; skips the test when it is missing. */
static void fault_arm_path(char *fa, size_t n)
{
    const char *b = getenv("TG_BUILD");
    if (b) snprintf(fa, n, "%s/bin/tg-fault-arm", b);
    else snprintf(fa, n, "%s/build/bin/tg-fault-arm", g_root);
    struct stat st;
    if (stat(fa, &st)) {
        print_message("skipped: needs the test double %s\n", fa);
        skip();
    }
}

/* A dump line's n is checked against the file before the harness reads:
 * the test double names /dev/zero with n = 2^31 (8 GiB). Before the fix
 * the harness allocated n floats and read /dev/zero into them. */
static void test_dump_size_checked(void **unused)
{
    (void)unused;
    char fa[PATH_MAX * 2];
    fault_arm_path(fa, sizeof fa);
    char *argv[] = {fa, "dump-lie", NULL};
    arm_config cfg = {.name = "dump-lie", .argv = argv, .timeout_request = 20, .grace = 0.5};
    tg_arm *a;
    tg_err e;
    assert_int_equal(arm_start(&a, &cfg, &e), 0);
    assert_int_equal(arm_hello(a, NULL, &e), 0);
    int32_t prompt[] = {1, 2};
    int dsteps[] = {0};
    char dir[512];
    assert_int_equal(arm_dump_dir_make(dir, sizeof dir, "sec", &e), 0);
    arm_decode_req q = {.prompt = prompt, .n_prompt = 2, .steps = 2, .top_k = 2,
                        .dump_steps = dsteps, .n_dump_steps = 1, .dump_path = dir};
    arm_decode_res r;
    double t0 = tg_now();
    assert_int_equal(arm_decode(a, &q, &r, NULL, NULL, &e), -1);
    double took = tg_now() - t0;
    arm_decode_res_free(&r);
    assert_true(arm_failed(a));
    if (!strstr(arm_cause(a), "not a regular file of exactly n=2147483648")) {
        print_message("cause: %s\nexpected the dump line refused for its size\n", arm_cause(a));
        fail();
    }
    if (took > 5) {
        print_message("refusing the dump took %.1f s: the file was read\n", took);
        fail();
    }
    arm_free(a);
    arm_dump_dir_remove(dir);
}

/* A dump line is read only when the decode asked for dumps, and only from
 * the dump folder the harness made: a worker naming /dev/zero (or any
 * absolute path) made the harness open it even without dumps. */
static void test_dump_outside_folder_refused(void **unused)
{
    (void)unused;
    char fa[PATH_MAX * 2];
    fault_arm_path(fa, sizeof fa);
    tg_err e;
    char dir[512];
    assert_int_equal(arm_dump_dir_make(dir, sizeof dir, "sec", &e), 0);
    int dsteps[] = {0};
    int32_t prompt[] = {1, 2};
    for (int asked = 0; asked < 2; asked++) {
        char *argv[] = {fa, "dump-abs", NULL};
        arm_config cfg = {.name = "dump-abs", .argv = argv, .timeout_request = 20, .grace = 0.5};
        tg_arm *a;
        assert_int_equal(arm_start(&a, &cfg, &e), 0);
        assert_int_equal(arm_hello(a, NULL, &e), 0);
        arm_decode_req q = {.prompt = prompt, .n_prompt = 2, .steps = 2, .top_k = 2};
        if (asked) q.dump_steps = dsteps, q.n_dump_steps = 1, q.dump_path = dir;
        arm_decode_res r;
        assert_int_equal(arm_decode(a, &q, &r, NULL, NULL, &e), -1);
        arm_decode_res_free(&r);
        const char *want = asked ? "is outside the dump folder" : "this decode asked for no dumps";
        if (!arm_cause(a) || !strstr(arm_cause(a), want)) {
            print_message("cause: %s\nexpected: %s\n", arm_cause(a) ? arm_cause(a) : "(none)", want);
            fail();
        }
        arm_free(a);
    }
    arm_dump_dir_remove(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scanner_finds_calls),
        cmocka_unit_test(test_no_shell_in_sources),
        cmocka_unit_test(test_spec_values_are_not_options),
        cmocka_unit_test(test_spec_sizes_checked),
        cmocka_unit_test(test_spec_invalid_utf8_refused),
        cmocka_unit_test(test_gguf_sizes_checked),
        cmocka_unit_test(test_proto_sizes_checked),
        cmocka_unit_test(test_dump_size_checked),
        cmocka_unit_test(test_dump_outside_folder_refused),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
