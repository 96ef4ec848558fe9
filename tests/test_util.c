/*
 * test_util.c: the shared pieces in engine/util.c: top-k ordering (the
 * protocol's "descending, ties by lower id, NaN last"), greedy argmax (first
 * maximum), the logit digest (stable, and sensitive to one ulp), SHA-256 of
 * known vectors (buffer and file) and the error helpers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

static void topk_orders_descending(void **state)
{
    const float l[] = {0.5f, 3.0f, -1.0f, 2.0f, 7.5f, 2.5f};
    tg_top t[4];
    assert_int_equal(tg_topk(l, 6, 4, t), 4);
    const int32_t want[] = {4, 1, 5, 3};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(t[i].id, want[i]);
        assert_true(t[i].logit == l[want[i]]);
    }
}

static void topk_ties_by_lower_id(void **state)
{
    const float l[] = {1.0f, 5.0f, 2.0f, 5.0f, 5.0f, 2.0f};
    tg_top t[5];
    assert_int_equal(tg_topk(l, 6, 5, t), 5);
    const int32_t want[] = {1, 3, 4, 2, 5};
    for (int i = 0; i < 5; i++) assert_int_equal(t[i].id, want[i]);
    /* a tie cut at the k-th place keeps the lower id */
    assert_int_equal(tg_topk(l, 6, 2, t), 2);
    assert_int_equal(t[0].id, 1);
    assert_int_equal(t[1].id, 3);
}

static void topk_nan_last(void **state)
{
    const float l[] = {NAN, -INFINITY, 0.0f, NAN, -3.0f};
    tg_top t[5];
    assert_int_equal(tg_topk(l, 5, 5, t), 5);
    assert_int_equal(t[0].id, 2);
    assert_int_equal(t[1].id, 4);
    assert_int_equal(t[2].id, 1);
    assert_int_equal(t[3].id, 0); /* NaNs after every number, by id */
    assert_int_equal(t[4].id, 3);
    assert_true(isnan(t[3].logit) && isnan(t[4].logit));
    /* k smaller than the numbers: no NaN sneaks in */
    assert_int_equal(tg_topk(l, 5, 2, t), 2);
    assert_false(isnan(t[0].logit) || isnan(t[1].logit));
}

static void topk_k_beyond_n(void **state)
{
    const float l[] = {1.0f, 2.0f, 3.0f};
    tg_top t[8];
    assert_int_equal(tg_topk(l, 3, 8, t), 3);
    assert_int_equal(t[0].id, 2);
    assert_int_equal(t[2].id, 0);
    assert_int_equal(tg_topk(l, 3, 0, t), 0);
    assert_int_equal(tg_topk(l, 0, 4, t), 0);
}

/* tg_topk against a full sort on random logits with many ties. */
static int ref_cmp(const void *a, const void *b)
{
    const tg_top *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void topk_matches_full_sort(void **state)
{
    enum { N = 5000, K = 40 };
    float *l = malloc(N * sizeof *l);
    tg_top *all = malloc(N * sizeof *all), t[K];
    uint64_t s = 12345;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < N; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            l[i] = (float)((s >> 33) % 200) * 0.125f; /* 200 distinct values: ties */
            all[i].id = i;
            all[i].logit = l[i];
        }
        qsort(all, N, sizeof *all, ref_cmp);
        assert_int_equal(tg_topk(l, N, K, t), K);
        for (int i = 0; i < K; i++) {
            assert_int_equal(t[i].id, all[i].id);
            assert_true(t[i].logit == all[i].logit);
        }
    }
    free(l);
    free(all);
}

static void argmax_first_maximum(void **state)
{
    const float l[] = {1.0f, 4.0f, 4.0f, -2.0f, 4.0f};
    assert_int_equal(tg_argmax(l, 5), 1);
    const float m[] = {NAN, 0.0f, -1.0f};
    assert_int_equal(tg_argmax(m, 3), 1);
    const float one[] = {-5.0f};
    assert_int_equal(tg_argmax(one, 1), 0);
    const float neg[] = {-3.0f, -1.0f, -1.0f};
    assert_int_equal(tg_argmax(neg, 3), 1);
}

static void digest_stable_and_sensitive(void **state)
{
    enum { N = 1000 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = sinf((float)i) * 10.0f;
    char a[17], b[17], c[17];
    tg_digest_logits(l, N, a);
    tg_digest_logits(l, N, b);
    assert_int_equal(strlen(a), 16);
    assert_string_equal(a, b);
    for (int i = 0; i < 16; i++) assert_true(strchr("0123456789abcdef", a[i]) != NULL);
    /* one ulp in one logit changes the digest, wherever it is */
    const int where[] = {0, 517, N - 1};
    for (int k = 0; k < 3; k++) {
        float saved = l[where[k]];
        l[where[k]] = nextafterf(saved, INFINITY);
        tg_digest_logits(l, N, c);
        if (!strcmp(a, c)) fail_msg("digest unchanged after one ulp at %d", where[k]);
        l[where[k]] = saved;
    }
    tg_digest_logits(l, N, c);
    assert_string_equal(a, c);
    /* -0 and +0 are different bytes: different digests */
    float z[2] = {0.0f, 1.0f}, nz[2] = {-0.0f, 1.0f};
    tg_digest_logits(z, 2, b);
    tg_digest_logits(nz, 2, c);
    assert_string_not_equal(b, c);
    /* the length is part of the data */
    tg_digest_logits(l, N - 1, c);
    assert_string_not_equal(a, c);
}

static void sha256_known_vectors(void **state)
{
    char hex[65];
    tg_sha256_buf("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    tg_sha256_buf("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    /* the file version agrees and reads past its 64 KiB buffer */
    char path[] = "/tmp/tg-util-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static unsigned char big[200000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 31 + 7);
    assert_int_equal(write(fd, big, sizeof big), (ssize_t)sizeof big);
    close(fd);
    char fh[65];
    tg_err e;
    assert_int_equal(tg_sha256_file(path, fh, &e), 0);
    tg_sha256_buf(big, sizeof big, hex);
    assert_string_equal(fh, hex);
    unlink(path);
    assert_int_equal(tg_sha256_file(path, fh, &e), -1);
    assert_non_null(strstr(e.msg, path));
}

static void err_helpers(void **state)
{
    tg_err e;
    assert_int_equal(tg_errf(&e, "f.gguf: byte %d: %s", 12, "bad"), -1);
    assert_string_equal(e.msg, "f.gguf: byte 12: bad");
    assert_int_equal(tg_err_prefix(&e, "load %s", "m"), -1);
    assert_string_equal(e.msg, "load m: f.gguf: byte 12: bad");
    assert_int_equal(tg_errf(NULL, "x"), -1);
    assert_int_equal(tg_err_prefix(NULL, "x"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(topk_orders_descending),
        cmocka_unit_test(topk_ties_by_lower_id),
        cmocka_unit_test(topk_nan_last),
        cmocka_unit_test(topk_k_beyond_n),
        cmocka_unit_test(topk_matches_full_sort),
        cmocka_unit_test(argmax_first_maximum),
        cmocka_unit_test(digest_stable_and_sensitive),
        cmocka_unit_test(sha256_known_vectors),
        cmocka_unit_test(err_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
