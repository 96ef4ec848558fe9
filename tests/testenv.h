/*
 * testenv.h: what the test programs that run real processes share: the
 * repository, build and cache folders (TG_ROOT, TG_BUILD, TG_CACHE, which
 * scripts/run-tests.sh sets; defaults ".", ROOT/build and ROOT/.cache), one
 * temporary folder per test, and a stand-in model file for test doubles.
 *
 * Header-only: every test program is one translation unit, so the folders
 * are that program's globals. Include after <cmocka.h> (make_model asserts)
 * and "util.h" (tg_sha256_file).
 */
#ifndef TG_TESTENV_H
#define TG_TESTENV_H

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[PATH_MAX], g_bin[PATH_MAX + 64], g_cache[PATH_MAX + 64];
static char g_dir[PATH_MAX];     /* the temporary folder of one test */

/* Whether path p exists. */
static inline int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Reads the folders from the environment and makes g_dir as
 * /tmp/tg-test-NAME-XXXXXX. Returns 0, or -1 when the folder cannot be
 * made. */
static inline int testenv_init(const char *name)
{
    const char *b = getenv("TG_BUILD"), *r = getenv("TG_ROOT"), *c = getenv("TG_CACHE");
    snprintf(g_root, sizeof g_root, "%s", r && *r ? r : ".");
    if (b && *b) snprintf(g_bin, sizeof g_bin, "%s/bin", b);
    else snprintf(g_bin, sizeof g_bin, "%s/build/bin", g_root);
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

/* Removes g_dir with everything the test left in it. Returns 0. */
static inline int testenv_clean(void)
{
    if (g_dir[0]) nftw(g_dir, testenv_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

/* buf (n bytes) = g_dir/name. */
static inline void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
}

/* A stand-in "model" file g_dir/m.bin for test doubles (they never read
 * it); its sha256 into hex. */
static inline void make_model(char hex[65])
{
    char p[2 * PATH_MAX];
    path_in(p, sizeof p, "m.bin");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("a stand-in artifact for the test double\n", f);
    fclose(f);
    tg_err e;
    assert_int_equal(tg_sha256_file(p, hex, &e), 0);
}

#endif
