/*
 * test_spec.c: gate specs (harness/spec.c). A good spec parses with every
 * arm kind; every malformed case gives the expected "FILE:LINE:COL: FIELD:"
 * message; relative paths resolve from the current directory first, then
 * from the spec's folder; the artifact check names both hashes; argv
 * building for engine, llama (wrap, aarch64 default) and command arms.
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
#include "testenv.h"

#define SHA_A "9159ed92d8ffb26f342a511bd3a34e021f38298c26f1a5fdbf3a373c70691657"

static char g_cwd[PATH_MAX];

static int setup(void **st)
{
    (void)st;
    if (!getcwd(g_cwd, sizeof g_cwd)) return -1;
    return testenv_init("spec");
}

static int teardown(void **st)
{
    (void)st;
    if (chdir(g_cwd) != 0) return -1;
    return testenv_clean();
}

/* The good spec; each malformed case edits one line of it. */
static const char GOOD[] =
    "name: t1\n"                                                   /* 1 */
    "model: {path: m.gguf, sha256: " SHA_A "}\n"                   /* 2 */
    "prompts:\n"                                                   /* 3 */
    "  - {id: a, text: \"hello world\"}\n"                         /* 4 */
    "  - {id: b, text: second}\n"                                  /* 5 */
    "steps: 8\n"                                                   /* 6 */
    "top_k: 4\n"                                                   /* 7 */
    "legs: 2\n"                                                    /* 8 */
    "mode: free\n"                                                 /* 9 */
    "reference: llama-cpu\n"                                       /* 10 */
    "policy: {kind: near-tie, band: 0.25}\n"                       /* 11 */
    "timeout: {request: 30, leg: 300}\n"                           /* 12 */
    "jobs: 3\n"                                                    /* 13 */
    "arms:\n"                                                      /* 14 */
    "  - {name: cpu, engine: cpu, options: {threads: 2}}\n"        /* 15 */
    "  - {name: llama-cpu, llama: {lib: lib.so, options: {threads: 2, flash_attn: off}}}\n" /* 16 */
    "  - name: llama-arm\n"                                        /* 17 */
    "    llama: {lib: lib.so, wrap: [qemu-aarch64, -L, /usr/aarch64-linux-gnu]}\n" /* 18 */
    "    variant_of: llama-cpu\n"                                  /* 19 */
    "    timeout: 5\n"                                             /* 20 */
    "  - {name: stock, command: [llama-completion, -m, \"{model}\", -p, \"{prompt}\", -n, \"{steps}\"]}\n" /* 21 */
    "  - {name: remote, exec: [ssh, board7, tg-engine, --tier, gpu], role: test}\n" /* 22 */
    "fault_patterns: [\"GPU Hang\", \"Memory access fault\"]\n";   /* 23 */

/* GOOD with line `line` (1-based) replaced by repl (NULL: deleted). */
static char *edit(int line, const char *repl)
{
    static char buf[8192];
    buf[0] = 0;
    const char *p = GOOD;
    for (int l = 1; *p; l++) {
        const char *nl = strchr(p, '\n');
        size_t n = (size_t)(nl - p) + 1;
        if (l == line) {
            if (repl) {
                strcat(buf, repl);
                strcat(buf, "\n");
            }
        } else
            strncat(buf, p, n);
        p += n;
    }
    return buf;
}

static tg_spec *load_ok(const char *text)
{
    write_in(NULL, 0, "s.yaml", "%s", text);
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/s.yaml", g_dir);
    tg_spec *s = NULL;
    tg_err e;
    if (spec_load(&s, p, &e) < 0) {
        print_message("expected the spec to parse, got: %s\n", e.msg);
        fail();
    }
    return s;
}

/* The spec must fail with a message containing "s.yaml:" + want. */
static void load_bad(const char *text, const char *want)
{
    write_in(NULL, 0, "s.yaml", "%s", text);
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/s.yaml", g_dir);
    tg_spec *s = NULL;
    tg_err e;
    e.msg[0] = 0;
    int rc = spec_load(&s, p, &e);
    if (rc == 0) {
        spec_free(s);
        print_message("expected an error containing '%s', the spec parsed\n", want);
        fail();
    }
    char full[512];
    snprintf(full, sizeof full, "s.yaml:%s", want);
    if (!strstr(e.msg, full)) {
        print_message("expected an error containing '%s', got: %s\n", full, e.msg);
        fail();
    }
    assert_null(s);
}

static void test_good_spec(void **st)
{
    (void)st;
    tg_spec *s = load_ok(GOOD);
    assert_string_equal(s->name, "t1");
    assert_int_equal(s->n_prompts, 2);
    assert_string_equal(s->prompts[0].id, "a");
    assert_string_equal(s->prompts[0].text, "hello world");
    assert_int_equal(s->steps, 8);
    assert_int_equal(s->top_k, 4);
    assert_int_equal(s->legs, 2);
    assert_int_equal(s->jobs, 3);
    assert_string_equal(s->mode, "free");
    assert_string_equal(s->policy_kind, "near-tie");
    assert_true(s->band == 0.25);
    assert_int_equal(s->n_arms, 5);
    assert_int_equal(s->ref_index, 1);
    assert_int_equal(s->arms[0].kind, SPEC_ARM_ENGINE);
    assert_string_equal(s->arms[0].tier, "cpu");
    assert_string_equal(s->arms[0].role, "test");
    assert_string_equal(s->arms[0].options_json, "{\"threads\":2}");
    assert_string_equal(s->arms[1].role, "oracle");
    assert_string_equal(s->arms[1].options_json, "{\"flash_attn\":\"off\",\"threads\":2}");
    assert_int_equal(s->arms[2].n_wrap, 3);
    assert_string_equal(s->arms[2].variant_of, "llama-cpu");
    assert_true(s->arms[2].timeout_request == 5);
    assert_true(s->arms[2].timeout_leg == 300);
    assert_true(s->arms[0].timeout_request == 30);
    assert_string_equal(s->arms[3].role, "custody");
    assert_int_equal(s->arms[4].kind, SPEC_ARM_EXEC);
    assert_int_equal(s->n_fault_patterns, 2);
    assert_string_equal(s->fault_patterns[1], "Memory access fault");
    assert_int_equal(strlen(s->sha256), 64);
    assert_non_null(strstr(s->arms[1].config_json, "\"lib\":\"lib.so\""));
    spec_free(s);
}

static void test_defaults(void **st)
{
    (void)st;
    const char *t =
        "name: d\nmodel: {path: m.gguf, sha256: " SHA_A "}\nprompts: [{id: p1, text: x}]\n"
        "steps: 1\ntop_k: 1\nlegs: 1\nreference: r\npolicy: {kind: exact}\narms: [{name: r, engine: ref}]\n";
    tg_spec *s = load_ok(t);
    assert_string_equal(s->mode, "teacher-forced");
    assert_true(s->band == 0.20);
    assert_int_equal(s->jobs, 2);
    assert_string_equal(s->arms[0].options_json, "{}");
    assert_int_equal(s->n_fault_patterns, 0);
    spec_free(s);
}

/* Each malformed case: the right file:line:col, field and expectation. */
static void test_malformed(void **st)
{
    (void)st;
    load_bad(edit(7, "top_kk: 4"), "7:1: top_kk: unknown key");
    load_bad(edit(6, "steps: many"), "6:8: steps: expected an integer 1..100000, got 'many'");
    load_bad(edit(6, "steps: 0"), "6:8: steps: expected an integer 1..100000, got 0");
    load_bad(edit(6, "steps: \"8\""), "6:9: steps: expected an integer");
    load_bad(edit(8, NULL), "1:1: legs: missing");
    load_bad(edit(9, "mode: forced"), "9:7: mode: expected teacher-forced or free, got 'forced'");
    load_bad(edit(10, "reference: llama"), "10:12: reference: expected the name of an arm");
    load_bad(edit(10, "reference: stock"), "10:12: reference: expected a protocol arm");
    load_bad(edit(11, "policy: {kind: fuzzy}"), "11:16: policy.kind: expected exact, near-tie, noise, calibrated or error-budget, got 'fuzzy'");
    load_bad(edit(11, "policy: {kind: near-tie}"), "11:10: policy.band: missing");
    load_bad(edit(11, "policy: {kind: exact, band: -1}"), "11:29: policy.band: expected a number");
    load_bad(edit(2, "model: {path: m.gguf, sha256: abc}"), "2:31: model.sha256: expected 64 hex digits, got 'abc'");
    load_bad(edit(2, "model: m.gguf"), "2:8: model: expected a mapping");
    load_bad(edit(15, "  - {name: cpu, engine: tpu}"), "15:25: arms[0].engine: expected a tier: ref, cpu or gpu, got 'tpu'");
    load_bad(edit(15, "  - {name: cpu, engine: cpu, options: {thread: 2}}"), "15:40: arms[0].options.thread: unknown option");
    load_bad(edit(15, "  - {name: cpu, engine: cpu, llama: {lib: x}}"), "15:6: arms[0]: expected exactly one of engine, llama, command, exec");
    load_bad(edit(15, "  - {name: cpu}"), "15:6: arms[0]: expected exactly one of");
    load_bad(edit(15, "  - {name: llama-cpu, engine: cpu}"), "16:12: arms[1].name: expected a unique name, 'llama-cpu' is also arms[0]");
    load_bad(edit(15, "  - {name: \"a b\", engine: cpu}"), "15:13: arms[0].name: expected 1..128 letters");
    load_bad(edit(16, "  - {name: llama-cpu, llama: {lib: [x]}}"), "16:37: arms[1].llama.lib: expected a string path");
    load_bad(edit(16, "  - {name: llama-cpu, llama: {lib: x, wrap: qemu}}"), "16:45: arms[1].llama.wrap: expected a list of argv words");
    load_bad(edit(16, "  - {name: llama-cpu, llama: {lib: x, libs: y}}"), "16:39: arms[1].llama.libs: unknown key");
    load_bad(edit(16, "  - {name: llama-cpu, llama: {lib: x, options: {threads: two}}}"), "16:58: arms[1].llama.options.threads: expected an integer");
    load_bad(edit(19, "    variant_of: nobody"), "17:");
    load_bad(edit(20, "    timeout: soon"), "20:14: arms[2].timeout: expected a number");
    load_bad(edit(21, "  - {name: stock, command: []}"), "21:19: arms[3].command: expected at least the program name");
    load_bad(edit(22, "  - {name: remote, exec: [ssh], role: boss}"), "22:39: arms[4].role: expected a role");
    load_bad(edit(22, "  - {name: remote, exec: [ssh], role: custody}"), "22:39: arms[4].role: expected test or oracle");
    load_bad(edit(23, "fault_patterns: GPU"), "23:17: fault_patterns: expected a list of stderr substrings");
    load_bad(edit(4, "  - {id: a, txt: x}"), "4:13: prompts[0].txt: unknown key");
    load_bad(edit(5, "  - {id: a, text: again}"), "5:10: prompts[1].id: expected a unique id");
    load_bad("name: d\nmodel: {path: m.gguf, sha256: " SHA_A "}\nprompts: [{id: p1, text: x}]\n"
             "steps: 1\ntop_k: 1\nlegs: 1\nreference: r\npolicy: {kind: exact}\narms: []\n",
             "9:1: arms: expected a non-empty list");
    load_bad(edit(3, "prompts: [1, 2"), "4:5: YAML syntax: missing comma");
    load_bad("- just\n- a list\n", "1:3: spec: expected a mapping at the top");
    load_bad("", "1:1: spec: expected a YAML mapping, the file is empty");
    load_bad(edit(13, "dumps: [1]"), "13:9: dumps: expected a mapping");
    load_bad(edit(13, "dumps: {step: [1]}"), "13:9: dumps.step: unknown key");
    load_bad(edit(13, "dumps: {prompts: [a]}"), "13:9: dumps.steps: missing");
    load_bad(edit(13, "dumps: {steps: []}"), "13:9: dumps.steps: expected a non-empty list of step numbers 0..7");
    load_bad(edit(13, "dumps: {steps: [8]}"), "13:17: dumps.steps[0]: expected an integer 0..7, got 8");
    load_bad(edit(13, "dumps: {steps: [1, 1]}"), "13:20: dumps.steps[1]: expected each step once");
    load_bad(edit(13, "dumps: {steps: [1], prompts: [zz]}"), "13:31: dumps.prompts[0]: expected a prompt id of this spec");
    load_bad(edit(13, "dumps: {steps: [1], stages: [ffn]}"), "13:30: dumps.stages[0]: expected one of: attn_norm");
}

/* dumps: steps sorted, the prompt and stage filters. */
static void test_dumps(void **st)
{
    (void)st;
    tg_spec *s = load_ok(GOOD);
    assert_int_equal(s->n_dump_steps, 0);
    assert_int_equal(spec_dumps_prompt(s, 0), 0);
    spec_free(s);
    s = load_ok(edit(13, "dumps: {steps: [5, 2], prompts: [b]}"));
    assert_int_equal(s->n_dump_steps, 2);
    assert_int_equal(s->dump_steps[0], 2);
    assert_int_equal(s->dump_steps[1], 5);
    assert_int_equal(spec_dumps_prompt(s, 0), 0);
    assert_int_equal(spec_dumps_prompt(s, 1), 1);
    assert_int_equal(spec_dumps_stage(s, "q"), 1);
    spec_free(s);
    s = load_ok(edit(13, "dumps: {steps: [0], stages: [logits]}"));
    assert_int_equal(spec_dumps_prompt(s, 0), 1);
    assert_int_equal(spec_dumps_prompt(s, 1), 1);
    assert_int_equal(spec_dumps_stage(s, "logits"), 1);
    assert_int_equal(spec_dumps_stage(s, "q"), 0);
    spec_free(s);
}

static void test_prompt_file(void **st)
{
    (void)st;
    write_in(NULL, 0, "prompts.txt", "%s", "first prompt\r\nsecond one\n");
    char *t = edit(3, "prompts: prompts.txt");
    char *u = strdup(t);
    /* drop the two inline prompt lines (4 and 5) */
    char *l4 = strstr(u, "  - {id: a");
    char *l6 = strstr(u, "steps:");
    memmove(l4, l6, strlen(l6) + 1);
    if (chdir("/") != 0) fail();
    tg_spec *s = load_ok(u);
    assert_int_equal(s->n_prompts, 2);
    assert_string_equal(s->prompts[0].id, "p1");
    assert_string_equal(s->prompts[0].text, "first prompt");
    assert_string_equal(s->prompts[1].id, "p2");
    assert_string_equal(s->prompts[1].text, "second one");
    spec_free(s);
    write_in(NULL, 0, "prompts.txt", "%s", "one\n\nthree\n");
    load_bad(u, "3:10: prompts: ");
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/prompts.txt", g_dir);
    unlink(p);
    load_bad(u, "3:10: prompts: expected a readable prompt file");
    free(u);
}

/* Relative paths: from the current directory when the file exists there,
 * else from the spec's folder. */
static void test_relative_paths(void **st)
{
    (void)st;
    char sub[PATH_MAX + 8];
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    mkdir(sub, 0777);
    write_in(NULL, 0, "sub/m.gguf", "%s", "spec-folder model");
    write_in(NULL, 0, "m.gguf", "%s", "cwd model");
    char *t = strdup(GOOD);
    /* from g_dir: cwd has m.gguf -> g_dir/m.gguf */
    if (chdir(g_dir) != 0) fail();
    write_in(NULL, 0, "sub/s.yaml", "%s", t);
    tg_spec *s;
    tg_err e;
    assert_int_equal(spec_load(&s, "sub/s.yaml", &e), 0);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s/m.gguf", g_dir);
    char real[PATH_MAX];
    assert_non_null(realpath(want, real));
    assert_string_equal(s->model_path, real);
    spec_free(s);
    /* from /: no m.gguf there -> the spec's folder */
    if (chdir("/") != 0) fail();
    char sp[PATH_MAX + 32];
    snprintf(sp, sizeof sp, "%s/sub/s.yaml", g_dir);
    assert_int_equal(spec_load(&s, sp, &e), 0);
    snprintf(want, sizeof want, "%s/sub/m.gguf", g_dir);
    assert_non_null(realpath(want, real));
    assert_string_equal(s->model_path, real);
    assert_true(s->arms[1].lib[0] == '/');
    spec_free(s);
    free(t);
}

static void test_artifact_hash(void **st)
{
    (void)st;
    write_in(NULL, 0, "m.gguf", "%s", "not the pinned model");
    if (chdir(g_dir) != 0) fail();
    tg_spec *s = load_ok(GOOD);
    char actual[65];
    int64_t size;
    tg_err e;
    assert_int_equal(spec_check_artifact(s, actual, &size, &e), -1);
    assert_non_null(strstr(e.msg, "sha256 mismatch"));
    assert_non_null(strstr(e.msg, SHA_A));
    assert_non_null(strstr(e.msg, actual));
    assert_non_null(strstr(e.msg, "m.gguf"));
    spec_free(s);
    /* pin the real hash: passes */
    char pinned[8192];
    snprintf(pinned, sizeof pinned, "%s", GOOD);
    char *h = strstr(pinned, SHA_A);
    memcpy(h, actual, 64);
    s = load_ok(pinned);
    assert_int_equal(spec_check_artifact(s, actual, &size, &e), 0);
    assert_int_equal(size, (int64_t)strlen("not the pinned model"));
    spec_free(s);
}

static void test_argv(void **st)
{
    (void)st;
    /* an aarch64 ELF header for the wrapped llama arm's library */
    unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    elf[18] = 183;
    char lib[PATH_MAX + 16];
    snprintf(lib, sizeof lib, "%s/lib.so", g_dir);
    FILE *f = fopen(lib, "wb");
    assert_non_null(f);
    fwrite(elf, 1, sizeof elf, f);
    fclose(f);
    if (chdir(g_dir) != 0) fail();
    tg_spec *s = load_ok(GOOD);
    tg_err e;
    char **v = spec_arm_argv(s, 0, "/b/bin", &e);
    assert_string_equal(v[0], "/b/bin/tg-engine");
    assert_string_equal(v[1], "--tier");
    assert_string_equal(v[2], "cpu");
    assert_null(v[3]);
    spec_argv_free(v);
    v = spec_arm_argv(s, 1, "/b/bin", &e);
    assert_string_equal(v[0], "/b/bin/tg-llama");
    assert_string_equal(v[1], "--lib");
    spec_argv_free(v);
    v = spec_arm_argv(s, 2, "/b/bin", &e);
    assert_string_equal(v[0], "qemu-aarch64");
    assert_string_equal(v[3], "/b/bin/../aarch64/bin/tg-llama");
    assert_string_equal(v[4], "--lib");
    spec_argv_free(v);
    assert_null(spec_arm_argv(s, 3, "/b/bin", &e));
    v = spec_command_argv(s, 3, "say \"hi\"", &e);
    assert_string_equal(v[0], "llama-completion");
    assert_string_equal(v[2], s->model_path);
    assert_string_equal(v[4], "say \"hi\"");
    assert_string_equal(v[6], "8");
    spec_argv_free(v);
    v = spec_arm_argv(s, 4, "/b/bin", &e);
    assert_string_equal(v[0], "ssh");
    assert_string_equal(v[4], "gpu");
    assert_null(v[5]);
    spec_argv_free(v);
    spec_free(s);
}

/* A command arm's strip: parsed in order on command arms, refused elsewhere. */
static void test_command_strip(void **st)
{
    (void)st;
    tg_spec *s = load_ok(edit(21, "  - {name: stock, command: [llama-completion], strip: [\"\\n\\n\", \" [end of text]\\n\"]}"));
    assert_int_equal(s->arms[3].n_strip, 2);
    assert_string_equal(s->arms[3].strip[0], "\n\n");
    assert_string_equal(s->arms[3].strip[1], " [end of text]\n");
    assert_int_equal(s->arms[0].n_strip, 0);
    spec_free(s);
    load_bad(edit(21, "  - {name: stock, command: [x], strip: tail}"), "21:40: arms[3].strip: expected a list of stdout suffixes");
    load_bad(edit(15, "  - {name: cpu, engine: cpu, strip: [x]}"), "15:30: arms[0].strip: expected strip only on a command arm, not engine");
}

/* Hostile specs refused at spec time, each with its file and line:
 * an alias bomb (it expanded to hundreds of millions of nodes and hung),
 * names that would write outside the evidence folder or break markup,
 * thread counts the workers refuse at load, prompts that are not text. */
static void test_hostile_specs(void **st)
{
    (void)st;
    /* a 341-byte alias bomb (9^9 nodes); refused at once */
    char bomb[1024] = "a: &a [x,x,x,x,x,x,x,x,x]\n";
    const char *prev = "a";
    static const char *const names[] = {"b", "c", "d", "e", "f", "g", "h", "i", "j"};
    for (int i = 0; i < 9; i++) {
        char l[128];
        snprintf(l, sizeof l, "%s: &%s [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", names[i], names[i], prev, prev,
                 prev, prev, prev, prev, prev, prev, prev);
        strcat(bomb, l);
        prev = names[i];
    }
    alarm(20);
    load_bad(bomb, "1:1: spec: expected a small YAML document");
    alarm(0);
    /* a self-referencing anchor is refused too; a plain alias still works */
    load_bad("a: &x [*x]\n", "1:1: spec: expected a small YAML document");
    char *t = strdup(edit(16, "  - {name: llama-cpu, llama: {lib: lib.so, options: &o {threads: 2}}}"));
    char *t2 = NULL;
    char *fp = strstr(t, "fault_patterns:");
    *fp = 0;
    assert_true(asprintf(&t2, "%s  - {name: other, llama: {lib: lib.so, options: *o}}\n", t) > 0);
    tg_spec *sp = load_ok(t2);
    assert_string_equal(sp->arms[5].options_json, "{\"threads\":2}");
    spec_free(sp);
    free(t), free(t2);
    /* names: no path separators, no leading dot or dash, no control bytes */
    load_bad(edit(1, "name: ../../x"), "1:7: name: expected 1..128 letters, digits");
    load_bad(edit(1, "name: .hidden"), "1:7: name: expected");
    load_bad(edit(1, "name: \"a\\x1bb\""), "1:8: name: expected 1..128");
    load_bad(edit(1, "name: \"a\\0b\""), "1:8: name: expected the spec's name, got a string with a NUL byte");
    load_bad(edit(15, "  - {name: -cpu, engine: cpu}"), "15:12: arms[0].name: expected 1..128");
    /* the message quotes the value with its control bytes escaped */
    write_in(NULL, 0, "s.yaml", "%s", edit(1, "name: \"a\\x1b[31mb\""));
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/s.yaml", g_dir);
    tg_spec *s = NULL;
    tg_err e;
    assert_int_equal(spec_load(&s, p, &e), -1);
    assert_null(strchr(e.msg, 0x1b));
    assert_non_null(strstr(e.msg, "a\\x1b[31mb"));
    /* threads: the workers' own ranges (tg-engine 1..512, tg-llama 1..1024) */
    load_bad(edit(15, "  - {name: cpu, engine: cpu, options: {threads: 513}}"),
             "15:49: arms[0].options.threads: expected an integer 1..512, got 513");
    load_bad(edit(15, "  - {name: cpu, engine: cpu, options: {threads: 16777216}}"), "15:49: arms[0].options.threads: expected an integer 1..512, got 16777216");
    load_bad(edit(16, "  - {name: llama-cpu, llama: {lib: lib.so, options: {threads: 1025}}}"),
             "16:63: arms[1].llama.options.threads: expected an integer 1..1024");
    sp = load_ok(edit(16, "  - {name: llama-cpu, llama: {lib: lib.so, options: {n_gpu_layers: -1}}}"));
    spec_free(sp);
    /* inline prompt text: a NUL, null, ~ and nothing are refused */
    load_bad(edit(5, "  - {id: b, text: \"a\\0b\"}"), "5:20: prompts[1].text: expected the prompt text, got a NUL byte");
    /* a NUL first is a NUL, not an empty text */
    load_bad(edit(5, "  - {id: b, text: \"\\0b\"}"), "5:20: prompts[1].text: expected the prompt text, got a NUL byte");
    load_bad(edit(5, "  - {id: b, text: null}"), "5:19: prompts[1].text: expected the prompt text (a non-empty string), got null");
    load_bad(edit(5, "  - {id: b, text: ~}"), "5:19: prompts[1].text: expected the prompt text (a non-empty string), got null");
    load_bad(edit(5, "  - {id: b, text: }"), "5:13: prompts[1].text: expected the prompt text (a non-empty string), got null");
    sp = load_ok(edit(5, "  - {id: b, text: \"null\"}"));   /* quoted: the word itself */
    assert_string_equal(sp->prompts[1].text, "null");
    spec_free(sp);
}

/* A prompt file: invalid UTF-8 is refused with file:line; a UTF-8 byte
 * order mark is not part of the first prompt. */
static void test_prompt_file_text(void **st)
{
    (void)st;
    char *t = NULL;
    assert_true(asprintf(&t, "%s", edit(3, "prompts: prompts.txt")) > 0);
    /* lines 4 and 5 (the inline list) go too */
    char *l4 = strstr(t, "  - {id: a");
    char *l6 = strstr(t, "steps:");
    memmove(l4, l6, strlen(l6) + 1);
    write_in(NULL, 0, "prompts.txt", "%s", "first\nsecond \xff\xfe bytes\nthird\n");
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want, "3:10: prompts: %s/prompts.txt:2: expected UTF-8 text, got byte 0xff", g_dir);
    load_bad(t, want);
    write_in(NULL, 0, "prompts.txt", "%s", "\xEF\xBB\xBF" "first\nsecond\n");
    tg_spec *s = load_ok(t);
    assert_int_equal(s->n_prompts, 2);
    assert_string_equal(s->prompts[0].text, "first");
    spec_free(s);
    free(t);
}

/* A model or prompt path that is not a regular file (a FIFO without a
 * writer, /dev/zero) is refused at once: hashing or reading it hung. */
static void test_non_regular_files(void **st)
{
    (void)st;
    char fifo[PATH_MAX + 16];
    snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    char *t = NULL;
    assert_true(asprintf(&t, "%s", edit(3, "prompts: fifo")) > 0);
    char *l4 = strstr(t, "  - {id: a");
    char *l6 = strstr(t, "steps:");
    memmove(l4, l6, strlen(l6) + 1);
    load_bad(t, "3:10: prompts: expected a readable prompt file");
    free(t);
    static const char *const models[] = {"fifo", "/dev/zero"};
    for (int i = 0; i < 2; i++) {
        char line[256];
        snprintf(line, sizeof line, "model: {path: %s, sha256: " SHA_A "}", models[i]);
        tg_spec *s = load_ok(edit(2, line));
        char hex[65];
        tg_err e;
        assert_int_equal(spec_check_artifact(s, hex, NULL, &e), -1);
        if (!strstr(e.msg, "expected a regular file")) print_message("%s\n", e.msg);
        assert_non_null(strstr(e.msg, "model.path"));
        assert_non_null(strstr(e.msg, "expected a regular file"));
        spec_free(s);
    }
    alarm(0);
}

TG_TEST_MAIN_WITH(
    setup, teardown, test_good_spec, test_defaults, test_malformed, test_dumps, test_prompt_file,
    test_relative_paths, test_artifact_hash, test_argv, test_command_strip, test_hostile_specs,
    test_prompt_file_text, test_non_regular_files)
