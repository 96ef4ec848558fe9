/*
 * test_cli.c: the tokgate command line (harness/main.c) through the built
 * binary: `tokgate CMD --help` prints that command's usage (naming it) on
 * stdout and exits 0 for every command, those whose options are parsed in
 * their own module (sweep, trend, plan, run, merge) included; an unknown
 * option is one line naming the option and the command, exit 2; `tokgate
 * rescore` without a RUN scores the latest run, as report and step do.
 * The runs use tests/helpers/tg-fault-arm, a TEST DOUBLE worker (not an
 * engine), in its well-behaved mode.
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

#include "arm.h"
#include "util.h"

static char g_bin[PATH_MAX], g_tokgate[PATH_MAX + 16], g_dir[PATH_MAX];

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static int setup(void **st)
{
    (void)st;
    const char *b = getenv("TG_BUILD"), *r = getenv("TG_ROOT");
    if (b) snprintf(g_bin, sizeof g_bin, "%s/bin", b);
    else snprintf(g_bin, sizeof g_bin, "%s/build/bin", r ? r : ".");
    snprintf(g_tokgate, sizeof g_tokgate, "%s/tokgate", g_bin);
    snprintf(g_dir, sizeof g_dir, "/tmp/tg-test-cli-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **st)
{
    (void)st;
    const char *names[] = {"s.yaml", "m.bin", "t.db", "t.db-wal", "t.db-shm", NULL};
    char p[2 * PATH_MAX];
    for (int i = 0; names[i]; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
    return 0;
}

/* Runs tokgate with the words (NULL-terminated) in g_dir's parent; returns
 * its exit status with stdout in *out (caller frees) and stderr in err. */
static int tokgate(const char *const *words, char **out, char *err, size_t errn)
{
    if (!exists(g_tokgate)) {
        print_message("missing %s: build tokgate first\n", g_tokgate);
        fail();
    }
    char *argv[24];
    int n = 0;
    argv[n++] = g_tokgate;
    for (int i = 0; words[i] && n < 23; i++) argv[n++] = (char *)words[i];
    argv[n] = NULL;
    size_t len;
    arm_exit x;
    tg_err e;
    *out = NULL;
    arm_run_command(argv, 60, 0, 0, NULL, out, &len, &x, &e);
    snprintf(err, errn, "%s", x.stderr_text ? x.stderr_text : "");
    int st = x.exit_status;
    arm_exit_free(&x);
    if (!*out) *out = strdup("");
    return st;
}

static void help_of_every_command(void **st)
{
    (void)st;
    static const char *const cmds[] = {"gate", "report", "step", "localize", "rescore", "bench", "sweep",
                                       "trend", "plan", "run", "merge", "version", "help", NULL};
    for (int i = 0; cmds[i]; i++) {
        char want[64], err[4096], *out;
        snprintf(want, sizeof want, "usage: tokgate %s", cmds[i]);
        const char *w1[] = {cmds[i], "--help", NULL};
        int rc = tokgate(w1, &out, err, sizeof err);
        if (rc != 0 || strncmp(out, want, strlen(want)))
            print_message("%s --help: exit %d, stdout '%.80s', stderr '%.200s'\n", cmds[i], rc, out, err);
        assert_int_equal(rc, 0);
        assert_true(strncmp(out, want, strlen(want)) == 0);
        assert_string_equal(err, "");
        char *first = strdup(out);
        free(out);
        /* -h, after other arguments, and `tokgate help CMD` print the same text */
        const char *w2[] = {cmds[i], "x", "-h", NULL};
        assert_int_equal(tokgate(w2, &out, err, sizeof err), 0);
        assert_string_equal(out, first);
        free(out);
        const char *w3[] = {"help", cmds[i], NULL};
        assert_int_equal(tokgate(w3, &out, err, sizeof err), 0);
        assert_string_equal(out, first);
        free(out);
        free(first);
    }
    /* the summary names every command */
    char err[4096], *out;
    const char *w[] = {"help", NULL};
    assert_int_equal(tokgate(w, &out, err, sizeof err), 0);
    for (int i = 0; cmds[i]; i++) {
        char k[32];
        snprintf(k, sizeof k, "\n  %s ", cmds[i]);
        assert_non_null(strstr(out, k));
    }
    free(out);
}

static void unknown_option_is_one_line(void **st)
{
    (void)st;
    static const char *const cmds[] = {"gate", "report", "step", "localize", "rescore", "bench", NULL};
    for (int i = 0; cmds[i]; i++) {
        char err[4096], *out, want[128];
        const char *w[] = {cmds[i], "--frobnicate", "1", NULL};
        assert_int_equal(tokgate(w, &out, err, sizeof err), 2);
        snprintf(want, sizeof want, "tokgate %s: unknown option '--frobnicate' (see tokgate %s --help)\n",
                 cmds[i], cmds[i]);
        assert_string_equal(err, want);
        assert_string_equal(out, "");
        free(out);
    }
    char err[4096], *out;
    const char *w[] = {"report", "--db", NULL};
    assert_int_equal(tokgate(w, &out, err, sizeof err), 2);
    assert_string_equal(err, "tokgate report: option '--db' needs a value (see tokgate report --help)\n");
    free(out);
    const char *w2[] = {"frob", NULL};
    assert_int_equal(tokgate(w2, &out, err, sizeof err), 2);
    assert_string_equal(err, "tokgate: unknown command 'frob' (see tokgate help)\n");
    free(out);
}

/* Two runs of a spec over the test double; `rescore` without RUN takes the
 * latest (run 2), as `report` does. */
static void rescore_defaults_to_latest_run(void **st)
{
    (void)st;
    char fa[PATH_MAX + 32], m[2 * PATH_MAX], sp[2 * PATH_MAX], db[2 * PATH_MAX];
    snprintf(fa, sizeof fa, "%s/tg-fault-arm", g_bin);
    if (!exists(fa)) {
        print_message("missing %s (the test double)\n", fa);
        fail();
    }
    snprintf(m, sizeof m, "%s/m.bin", g_dir);
    snprintf(sp, sizeof sp, "%s/s.yaml", g_dir);
    snprintf(db, sizeof db, "%s/t.db", g_dir);
    FILE *f = fopen(m, "w");
    assert_non_null(f);
    fputs("a stand-in artifact for the test double\n", f);
    fclose(f);
    char sha[65];
    tg_err e;
    assert_int_equal(tg_sha256_file(m, sha, &e), 0);
    f = fopen(sp, "w");
    assert_non_null(f);
    fprintf(f, "name: cli\nmodel: {path: %s, sha256: %s}\nprompts: [{id: p1, text: xy}]\n"
               "steps: 3\ntop_k: 3\nlegs: 2\nreference: ref\npolicy: {kind: exact}\n"
               "arms:\n  - {name: ref, exec: [%s, ok]}\n  - {name: good, exec: [%s, ok]}\n",
            m, sha, fa, fa);
    fclose(f);
    char err[8192], *out;
    const char *g[] = {"gate", sp, "--db", db, NULL};
    for (int i = 0; i < 2; i++) {
        int rc = tokgate(g, &out, err, sizeof err);
        if (rc) print_message("gate: %s\n", err);
        assert_int_equal(rc, 0);
        free(out);
    }
    const char *r[] = {"rescore", "--db", db, "--band", "0.5", NULL};
    assert_int_equal(tokgate(r, &out, err, sizeof err), 0);
    assert_non_null(strstr(out, "run 2 rescored as verdict set 2 (policy exact, band 0.5)"));
    assert_non_null(strstr(out, "TOKEN_GATE=PASS"));
    free(out);
    /* a RUN still picks that run */
    const char *r1[] = {"rescore", "1", "--db", db, NULL};
    assert_int_equal(tokgate(r1, &out, err, sizeof err), 0);
    assert_non_null(strstr(out, "run 1 rescored as verdict set 2"));
    free(out);
    /* report shows the latest run's latest set */
    const char *rp[] = {"report", "--db", db, NULL};
    assert_int_equal(tokgate(rp, &out, err, sizeof err), 0);
    assert_non_null(strstr(out, "tokgate run 2 "));
    assert_non_null(strstr(out, "verdict set 2: policy exact, band 0.5"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(help_of_every_command),
        cmocka_unit_test(unknown_option_is_one_line),
        cmocka_unit_test(rescore_defaults_to_latest_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
