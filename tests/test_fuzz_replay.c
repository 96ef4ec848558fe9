/*
 * test_fuzz_replay.c: the plain (gcc) replay driver of the fuzz targets in
 * tests/fuzz/. Every kept input, the seed corpora (tests/fuzz/corpus/T/) and
 * the inputs that once crashed a target (tests/fuzz/regressions/T/), is fed
 * to its target once; under make asan the same replay runs with ASan and
 * UBSan. A target aborts (assert or sanitizer) on a bug, so a test here
 * fails by the program dying, naming the file it was replaying first.
 *
 *   test_fuzz_replay                    replay every kept input (make test)
 *   test_fuzz_replay TARGET FILE...     replay these files (a libFuzzer crash
 *                                       file, say) through TARGET under gcc
 */
#include <dirent.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fuzz/fuzz.h"
#include "fuzz/fuzz_gguf.c"
#include "fuzz/fuzz_proto.c"
#include "fuzz/fuzz_spec.c"
#include "fuzz/fuzz_store.c"
#include "fuzz/fuzz_tokenizer.c"

typedef int (*fuzz_fn)(const uint8_t *, size_t);

static const struct {
    const char *name;
    fuzz_fn fn;
} TARGETS[] = {
    {"gguf", fuzz_gguf_one},
    {"tokenizer", fuzz_tokenizer_one},
    {"spec", fuzz_spec_one},
    {"proto", fuzz_proto_one},
    {"store", fuzz_store_one},
};

static fuzz_fn target(const char *name)
{
    for (size_t i = 0; i < sizeof TARGETS / sizeof *TARGETS; i++)
        if (!strcmp(TARGETS[i].name, name)) return TARGETS[i].fn;
    return NULL;
}

/* Reads the whole file into *buf (malloc'ed). Returns 0 or -1. */
static int slurp(const char *path, uint8_t **buf, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 16, len = 0;
    uint8_t *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    if (!b) return -1;
    *buf = b;
    *n = len;
    return 0;
}

static char g_current[PATH_MAX + 256];   /* the input being replayed */
static int g_verbose;                    /* print every name (TG_FUZZ_VERBOSE, or FILE arguments) */

/* On a crash (assert, SIGSEGV, a sanitizer's abort), name the input first. */
static void on_crash(int sig)
{
    static const char msg[] = "\ntest_fuzz_replay: crashed (or hung 30 s) while replaying ";
    (void)!write(2, msg, sizeof msg - 1);
    (void)!write(2, g_current, strlen(g_current));
    (void)!write(2, "\n", 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Replays path through fn. */
static void replay_file(fuzz_fn fn, const char *path)
{
    uint8_t *b = NULL;
    size_t n = 0;
    if (slurp(path, &b, &n) < 0) {
        print_message("cannot read %s\n", path);
        fail();
        return;
    }
    snprintf(g_current, sizeof g_current, "%s", path);
    if (g_verbose) fprintf(stderr, "replay %s\n", path);
    alarm(30);   /* a hang is a bug too: SIGALRM names the input and ends the program */
    fn(b, n);
    alarm(0);
    free(b);
}

/* Replays every file of dir through fn; returns how many. */
static int replay_dir(fuzz_fn fn, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int count = 0;
    struct dirent *de;
    char p[PATH_MAX + 256];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(p, &st) || !S_ISREG(st.st_mode)) continue;
        replay_file(fn, p);
        count++;
    }
    closedir(d);
    return count;
}

static void replay_target(const char *name, int min_corpus)
{
    const char *r = getenv("TG_ROOT");
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", r && *r ? r : ".", name);
    int n = replay_dir(target(name), dir);
    if (n < min_corpus) {
        print_message("%s: %d inputs, expected at least %d (the kept seed corpus)\n", dir, n, min_corpus);
        fail();
    }
    snprintf(dir, sizeof dir, "%s/tests/fuzz/regressions/%s", r && *r ? r : ".", name);
    int m = replay_dir(target(name), dir);
    print_message("%s: %d corpus inputs and %d regression inputs replayed\n", name, n, m);
}

static void test_replay_gguf(void **u) { (void)u; replay_target("gguf", 10); }
static void test_replay_tokenizer(void **u)
{
    (void)u;
    struct stat st;
    if (stat(fuzz_model_path(), &st)) {
        print_message("skipped: the tokenizer target needs the shipped model %s\n", fuzz_model_path());
        skip();
    }
    replay_target("tokenizer", 10);
}
static void test_replay_spec(void **u) { (void)u; replay_target("spec", 10); }
static void test_replay_proto(void **u) { (void)u; replay_target("proto", 10); }
static void test_replay_store(void **u) { (void)u; replay_target("store", 10); }

int main(int argc, char **argv)
{
    signal(SIGABRT, on_crash);
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    signal(SIGALRM, on_crash);
    g_verbose = getenv("TG_FUZZ_VERBOSE") != NULL || argc >= 2;
    if (argc >= 2) {
        fuzz_fn fn = target(argv[1]);
        if (!fn) {
            fprintf(stderr, "usage: %s [gguf|tokenizer|spec|proto|store FILE...]\n", argv[0]);
            return 2;
        }
        for (int i = 2; i < argc; i++) {
            struct stat st;
            if (!stat(argv[i], &st) && S_ISDIR(st.st_mode)) replay_dir(fn, argv[i]);
            else replay_file(fn, argv[i]);
        }
        fprintf(stderr, "replayed %d argument(s) through %s without a crash\n", argc - 2, argv[1]);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_gguf),
        cmocka_unit_test(test_replay_tokenizer),
        cmocka_unit_test(test_replay_spec),
        cmocka_unit_test(test_replay_proto),
        cmocka_unit_test(test_replay_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
