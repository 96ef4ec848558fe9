/*
 * test_shipped_specs.c: the specs the project ships stay valid.
 *
 * Every .yaml file in specs/ parses; the default spec's model (shipped in models/)
 * matches its pinned sha256; the synthetic spec's pinned sha256 is what
 * tg-mkmodel writes today for the same arguments (same seed, same bytes), so
 * a change to the model maker or the quantizers that moves those bytes fails
 * here instead of at `make synthetic-gate`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spec.h"
#include "util.h"

extern char **environ;

static const char *root(void)
{
    const char *r = getenv("TG_ROOT");
    return r && *r ? r : ".";
}

static void test_every_spec_parses(void **state)
{
    (void)state;
    assert_int_equal(chdir(root()), 0);
    DIR *d = opendir("specs");
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".yaml")) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "specs/%s", de->d_name);
        tg_spec *s = NULL;
        tg_err e = {{0}};
        if (spec_load(&s, path, &e)) fail_msg("%s does not parse: %s", path, e.msg);
        spec_free(s);
        n++;
    }
    closedir(d);
    print_message("%d shipped specs parse\n", n);
    assert_true(n >= 2);
}

static void test_default_model_pinned(void **state)
{
    (void)state;
    assert_int_equal(chdir(root()), 0);
    tg_spec *s = NULL;
    tg_err e = {{0}};
    if (spec_load(&s, "specs/default.yaml", &e)) fail_msg("%s", e.msg);
    char actual[65];
    int64_t size = 0;
    if (spec_check_artifact(s, actual, &size, &e)) fail_msg("%s", e.msg);
    assert_int_equal(size, 5786112);
    spec_free(s);
}

static void test_synthetic_model_reproducible(void **state)
{
    (void)state;
    assert_int_equal(chdir(root()), 0);
    const char *build = getenv("TG_BUILD");
    char mk[PATH_MAX], out[PATH_MAX];
    snprintf(mk, sizeof mk, "%s/bin/tg-mkmodel", build && *build ? build : "build");
    if (access(mk, X_OK)) skip();
    snprintf(out, sizeof out, "%s/shipped-synth-%d.gguf", build && *build ? build : "/tmp",
             (int)getpid());
    tg_spec *s = NULL;
    tg_err e = {{0}};
    if (spec_load(&s, "specs/synthetic-qwen3.yaml", &e)) fail_msg("%s", e.msg);
    /* the arguments the Makefile's $(SYNTH_MODEL) rule uses */
    char *argv[] = {mk, "--preset", "tiny", "--type", "q4_k_m", "--seed", "1", "-o", out, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, mk, NULL, NULL, argv, environ), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char hex[65];
    assert_int_equal(tg_sha256_file(out, hex, &e), 0);
    unlink(out);
    if (strcmp(hex, s->model_sha256))
        fail_msg("tg-mkmodel now writes sha256 %s, specs/synthetic-qwen3.yaml pins %s: "
                 "update the spec (and say why the bytes moved)", hex, s->model_sha256);
    spec_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_spec_parses),
        cmocka_unit_test(test_default_model_pinned),
        cmocka_unit_test(test_synthetic_model_reproducible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
