/*
 * testenv.h: what the test programs share: the repository, build and cache
 * folders (TG_ROOT, TG_BUILD, TG_CACHE, which scripts/run-tests.sh sets;
 * defaults ".", ROOT/build and ROOT/.cache), one temporary folder per test
 * (or per program), files written into it (write_in), a stand-in model
 * file for test doubles, and skip_msg.
 *
 * And the main() of a test program (TG_TEST_MAIN): every test runs
 * between two fixtures, these (testenv_setup, testenv_teardown) or the
 * program's own.
 *
 * Header-only: every test program is one translation unit, so the folders
 * are that program's globals (a program that uses only some of them is
 * fine). Include after <cmocka.h> (make_model asserts).
 */
#ifndef TG_TESTENV_H
#define TG_TESTENV_H

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define TESTENV_UNUSED __attribute__((unused))
static char g_root[PATH_MAX - 64] TESTENV_UNUSED, g_build[PATH_MAX] TESTENV_UNUSED;
static char g_bin[PATH_MAX + 64] TESTENV_UNUSED, g_cache[PATH_MAX + 64] TESTENV_UNUSED;
static char g_tokgate[PATH_MAX + 80] TESTENV_UNUSED; /* BUILD/bin/tokgate */
static char g_dir[PATH_MAX] TESTENV_UNUSED; /* the temporary folder of one test */

/* Whether path p exists. */
static inline int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Reads the folders from the environment and makes g_dir as
 * /tmp/tg-test-NAME-XXXXXX (name NULL: the program's name without
 * "test_"). Returns 0, or -1 when the folder cannot be made. */
static inline int testenv_init(const char *name)
{
    if (!name) {
        name = program_invocation_short_name;
        if (!strncmp(name, "test_", 5)) name += 5;
    }
    const char *b = getenv("TG_BUILD"), *r = getenv("TG_ROOT"), *c = getenv("TG_CACHE");
    snprintf(g_root, sizeof g_root, "%s", r && *r ? r : ".");
    if (b && *b) snprintf(g_build, sizeof g_build, "%s", b);
    else snprintf(g_build, sizeof g_build, "%s/build", g_root);
    snprintf(g_bin, sizeof g_bin, "%s/bin", g_build);
    snprintf(g_tokgate, sizeof g_tokgate, "%s/tokgate", g_bin);
    if (c && *c) snprintf(g_cache, sizeof g_cache, "%s", c);
    else snprintf(g_cache, sizeof g_cache, "%s/.cache", g_root);
    snprintf(g_dir, sizeof g_dir, "/tmp/tg-test-%s-XXXXXX", name);
    return mkdtemp(g_dir) ? 0 : -1;
}

static inline int testenv_rm_one(const char *p, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    remove(p);
    return 0;
}

/* Removes folder dir with everything in it (links are removed, not
 * followed). Returns 0. */
static inline int testenv_rm_tree(const char *dir)
{
    if (dir[0]) nftw(dir, testenv_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

/* Removes g_dir with everything the test left in it. Returns 0. */
static inline int testenv_clean(void)
{
    return testenv_rm_tree(g_dir);
}

/* skip() with the reason printed first. */
#define skip_msg(...)          \
    do {                       \
        printf(__VA_ARGS__);   \
        printf(": skipped\n"); \
        skip();                \
    } while (0)

/* buf (n bytes) = g_dir/name. */
static inline void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
}

/* Writes the file g_dir/name with the text of fmt (printf); its path into
 * buf (n bytes; buf NULL: not wanted). */
__attribute__((format(printf, 4, 5))) static inline void write_in(char *buf, size_t n, const char *name,
                                                                  const char *fmt, ...)
{
    char own[2 * PATH_MAX];
    if (!buf) buf = own, n = sizeof own;
    path_in(buf, n, name);
    FILE *f = fopen(buf, "w");
    assert_non_null(f);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    assert_int_equal(fclose(f), 0);
}

/* A stand-in "model" file g_dir/m.bin for test doubles (they never read
 * it); its sha256 into hex, its path into path (n bytes; NULL: not
 * wanted). */
static inline void make_model(char hex[65], char *path, size_t n)
{
    char p[2 * PATH_MAX];
    write_in(p, sizeof p, "m.bin", "a stand-in artifact for the test double\n");
    if (path) snprintf(path, n, "%s", p);
    tg_err e;
    assert_int_equal(tg_sha256_file(p, hex, &e), 0);
}

/* The cmocka fixtures of a program that needs nothing else: a fresh
 * g_dir for each test (or group), removed after it. */
static inline int testenv_setup(void **state)
{
    (void)state;
    return testenv_init(NULL);
}

/* TG_KEEP set: the folder stays (its path is printed) for a look. */
static inline int testenv_teardown(void **state)
{
    (void)state;
    if (getenv("TG_KEEP")) {
        printf("kept %s\n", g_dir);
        return 0;
    }
    return testenv_clean();
}

/* Runs n tests fns[i], named by the comma-separated list names (the
 * stringified argument list of TG_TEST_MAIN), each between setup and
 * teardown. Returns cmocka's result (the number of failed tests). */
static inline int testenv_run(const char *names, const CMUnitTestFunction *fns, size_t n, CMFixtureFunction setup,
                              CMFixtureFunction teardown)
{
    struct CMUnitTest *t = calloc(n, sizeof *t);
    char *list = strdup(names), *save = NULL;
    if (!t || !list) return 1;
    char *name = strtok_r(list, ", \t\n", &save);
    for (size_t i = 0; i < n; i++, name = strtok_r(NULL, ", \t\n", &save))
        t[i] = (struct CMUnitTest){name ? name : "?", fns[i], setup, teardown, NULL};
    int rc = _cmocka_run_group_tests("tests", t, n, NULL, NULL);
    free(t);
    free(list);
    return rc;
}

/* main(): TG_TEST_MAIN_WITH(setup, teardown, test_a, test_b, ...) runs
 * the tests in that order, each between setup and teardown;
 * TG_TEST_MAIN(test_a, ...) with testenv_setup and testenv_teardown. */
#define TG_TEST_MAIN_WITH(setup, teardown, ...)                                                  \
    int main(void)                                                                               \
    {                                                                                            \
        static const CMUnitTestFunction fns_[] = {__VA_ARGS__};                                  \
        return testenv_run(#__VA_ARGS__, fns_, sizeof fns_ / sizeof fns_[0], setup, teardown);   \
    }
#define TG_TEST_MAIN(...) TG_TEST_MAIN_WITH(testenv_setup, testenv_teardown, __VA_ARGS__)

#endif
