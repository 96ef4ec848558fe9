/*
 * test_kernels.c: every fast CPU kernel (engine/cpu/kernels.h) against the
 * scalar reference of quant.c, on fresh random inputs:
 * - each tier this CPU has (avx2, avx512vnni; neon tiers on aarch64, see
 *   tests/helpers/kernels-check.c for the qemu run), each weight type, row
 *   lengths 256 .. 8192: |fast - ref| <= TG_CPU_DOT_TOL * sum |terms|, one
 *   line per case with the largest relative error seen;
 * - vec_dot4 and gemm16 (the multi-row kernels): bit-identical to the
 *   tier's vec_dot on every pair;
 * - activation quantizers and f32 -> f16 rows: identical bytes;
 * - tg_cpu_matmul / tg_cpu_gemv: against a loop of reference dots, rows
 *   outside [r0, r1) untouched;
 * - rows of the shipped model (made by llama-quantize) through every tier;
 * - the attention row over an F16 cache (cpu/attn.h): the three-pass form
 *   bit-identical to the one-position-at-a-time reference in every dot
 *   order this CPU has, with and without a score hook;
 * - x86-64: the AVX2 and AVX-512 swiglus bit-identical to their
 *   one-element references; the
 *   AVX2 and AVX-512 Q4_K / Q6_K dots bit-identical to each other;
 * A tier the CPU lacks is skipped with a message. Seed: /dev/urandom or
 * TG_SEED, printed first.
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

#include "cpu/attn.h"
#include "cpu/kernels.h"
#if defined(__x86_64__)
#include "cpu/forward_avx2.h"
#endif
#include "gguf.h"
#include "quant.h"

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(void)
{
    return (double)(rng_next() >> 11) * 0x1p-53;
}

static float rng_gauss(void)
{
    double u1 = rng_uniform(), u2 = rng_uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
}

static void fill(float *x, int64_t n)
{
    const float scale = (float)exp((rng_uniform() - 0.5) * 6);
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_gauss() * scale;
        if (rng_next() % 101 == 0) x[i] *= 5;
    }
}

static int setup_seed(void **state)
{
    (void)state;
    const char *env = getenv("TG_SEED");
    if (env) {
        rng_state = strtoull(env, NULL, 0);
    } else {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(&rng_state, sizeof rng_state, 1, f) != 1) rng_state = 0x4321;
        if (f) fclose(f);
    }
    printf("test_kernels: seed TG_SEED=0x%016llx, selected tier %s\n",
           (unsigned long long)rng_state, tg_cpu_isa());
    return 0;
}

static const uint32_t weight_types[] = {TG_TYPE_Q4_K, TG_TYPE_Q5_K, TG_TYPE_Q6_K, TG_TYPE_Q8_0, TG_TYPE_Q4_0,
                                        TG_TYPE_Q5_0, TG_TYPE_Q2_K, TG_TYPE_Q3_K, TG_TYPE_Q4_1, TG_TYPE_Q5_1,
                                        TG_TYPE_F16, TG_TYPE_BF16, TG_TYPE_F32};
static const int lengths[] = {256, 512, 1024, 2816, 4096, 8192};
enum { NMAX = 8192, REPS = 6 };

/* Every vec_dot of tier k against the reference; fails on the first case
 * beyond TG_CPU_DOT_TOL. */
static void check_dots(const tg_cpu_kernels *k)
{
    float *x = malloc(NMAX * sizeof(float)), *y = malloc(NMAX * sizeof(float));
    float *xd = malloc(NMAX * sizeof(float)), *yd = malloc(NMAX * sizeof(float));
    void *qx = malloc(NMAX * 4), *qy = malloc(NMAX * 4);
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
        const tg_type_traits *tx = tg_traits(weight_types[t]);
        const tg_type_traits *ty = tg_traits(tx->vec_dot_type);
        assert_non_null(k->vec_dot[weight_types[t]]);
        for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
            const int n = lengths[l];
            double worst = 0;
            for (int rep = 0; rep < REPS; rep++) {
                fill(x, n);
                fill(y, n);
                tx->from_float(x, qx, n);
                ty->from_float(y, qy, n);
                tx->to_float(qx, xd, n);
                ty->to_float(qy, yd, n);
                double mag = 0;
                for (int i = 0; i < n; i++) mag += fabs((double)xd[i] * yd[i]);
                float ref = NAN, fast = NAN;
                tx->vec_dot(n, &ref, qx, qy);
                k->vec_dot[weight_types[t]](n, &fast, qx, qy);
                const double rel = fabs((double)fast - ref) / mag;
                if (!(rel <= TG_CPU_DOT_TOL))
                    fail_msg("%s %s x %s n=%d: fast %.9g, reference %.9g, |diff|/sum|terms| %g > %g",
                             k->isa, tx->name, ty->name, n, fast, ref, rel, TG_CPU_DOT_TOL);
                if (rel > worst) worst = rel;
            }
            printf("  %-10s %-4s x %-4s n=%-5d max |fast-ref|/sum|terms| %.2e (tol %.0e)\n", k->isa,
                   tx->name, ty->name, n, worst, TG_CPU_DOT_TOL);
        }
    }
    free(x); free(y); free(xd); free(yd); free(qx); free(qy);
}

/* Rows that exercise the quantizers' corner cases: the largest magnitude
 * negative and repeated with both signs, all-zero blocks, exact ties. */
static void fill_quantizer_rows(float *x, int n, int variant)
{
    fill(x, n);
    if (variant == 1) {
        for (int b = 0; b < n / 256; b++) {
            float amax = 0;
            for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[256 * b + i]));
            x[256 * b + (b * 37) % 256] = amax * 2;
            x[256 * b + (b * 53 + 7) % 256] = -amax * 2;
        }
    } else if (variant == 2) {
        for (int i = 0; i < 256 && i < n; i++) x[i] = 0;
        for (int i = 256; i < n; i++) x[i] = (float)((int)(x[i] * 4)) * 0.5f;   /* many ties */
        if (n > 300) x[300] = -127.0f;
    }
}

static void check_quantizers(const tg_cpu_kernels *k)
{
    const tg_type_traits *q8k = tg_traits(TG_TYPE_Q8_K), *q80 = tg_traits(TG_TYPE_Q8_0);
    float *x = malloc(NMAX * sizeof(float));
    void *a = malloc(NMAX * 2), *b = malloc(NMAX * 2);
    for (int variant = 0; variant < 3; variant++) {
        for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
            const int n = lengths[l];
            fill_quantizer_rows(x, n, variant);
            q8k->from_float(x, a, n);
            k->quantize_q8_K(x, b, n);
            for (int i = 0; i < n / QK_K; i++)
                if (memcmp((block_q8_K *)a + i, (block_q8_K *)b + i, sizeof(block_q8_K)) != 0)
                    fail_msg("%s quantize_q8_K differs from the reference in block %d (n=%d, variant %d)",
                             k->isa, i, n, variant);
            q80->from_float(x, a, n);
            k->quantize_q8_0(x, b, n);
            if (memcmp(a, b, tg_row_size(TG_TYPE_Q8_0, n)) != 0)
                fail_msg("%s quantize_q8_0 differs from the reference (n=%d, variant %d)", k->isa, n, variant);
        }
    }
    /* f32 -> f16, odd length, with specials */
    const int n = 1003;
    fill(x, n);
    const float specials[] = {INFINITY, -INFINITY, NAN, 65519.0f, 65520.0f, 1e-8f, -3e-6f,
                              0x1p-25f, 0x1.8p-24f, -0.0f, 0.0f, 1.0f + 0x1p-11f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[7 * i + 1] = specials[i];
    tg_half *ha = malloc(n * sizeof(tg_half)), *hb = malloc(n * sizeof(tg_half));
    for (int i = 0; i < n; i++) ha[i] = tg_f32_to_half(x[i]);
    k->f32_to_f16(x, hb, n);
    for (int i = 0; i < n; i++)
        if (ha[i] != hb[i])
            fail_msg("%s f32_to_f16 of %a: 0x%04x, reference 0x%04x", k->isa, x[i], hb[i], ha[i]);
    /* axpy over f16: identical to the scalar tier */
    const tg_cpu_kernels *sc = tg_cpu_kernels_tier("scalar");
    float *ya = malloc(n * sizeof(float)), *yb = malloc(n * sizeof(float));
    fill(ya, n);
    memcpy(yb, ya, n * sizeof(float));
    fill(x, n);
    for (int i = 0; i < n; i++) ha[i] = tg_f32_to_half(x[i]);
    const float alpha = (float)rng_gauss();
    sc->axpy_f16(n, ya, ha, alpha);
    k->axpy_f16(n, yb, ha, alpha);
    for (int i = 0; i < n; i++)
        if (memcmp(&ya[i], &yb[i], sizeof(float)) != 0)
            fail_msg("%s axpy_f16 [%d]: %a, scalar tier %a", k->isa, i, yb[i], ya[i]);
    free(ya);
    free(yb);
    printf("  %-10s quantize_q8_K, quantize_q8_0, f32_to_f16, axpy_f16: identical bytes\n", k->isa);
    free(x); free(a); free(b); free(ha); free(hb);
}

/* vec_dot4 (where a tier has one): each of the 4 results bit-identical to
 * the tier's vec_dot on the same pair. */
static void check_dot4(const tg_cpu_kernels *k)
{
    enum { N = 2816 };
    float *x = malloc(N * sizeof(float)), *y = malloc(4 * N * sizeof(float));
    char *qx = malloc(N * 4), *qy = malloc(4 * N * 4);
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
        const uint32_t type = weight_types[t];
        if (!k->vec_dot4[type]) continue;
        const tg_type_traits *tx = tg_traits(type), *ty = tg_traits(tx->vec_dot_type);
        const size_t ar = tg_row_size(tx->vec_dot_type, N);
        for (int rep = 0; rep < 4; rep++) {
            fill(x, N);
            fill(y, 4 * N);
            tx->from_float(x, qx, N);
            for (int j = 0; j < 4; j++) ty->from_float(y + j * N, qy + j * ar, N);
            float s4[4], s1;
            k->vec_dot4[type](N, s4, qx, qy, ar);
            for (int j = 0; j < 4; j++) {
                k->vec_dot[type](N, &s1, qx, qy + j * ar);
                if (memcmp(&s1, &s4[j], sizeof s1) != 0)
                    fail_msg("%s vec_dot4 %s row %d: %.9g, vec_dot %.9g (must be bit-identical)", k->isa,
                             tx->name, j, s4[j], s1);
            }
        }
        printf("  %-10s vec_dot4 %-4s: bit-identical to vec_dot\n", k->isa, tx->name);
    }
    free(x); free(y); free(qx); free(qy);
}

/* gemm16 (where a tier has one): 16 weight rows against nb activation
 * rows, nb from 1 to past one pass of the tile's accumulators; every output
 * bit-identical to the tier's vec_dot on that pair and within
 * TG_CPU_DOT_TOL of the reference, nothing written outside the 16 x nb
 * outputs. */
static void check_gemm16(const tg_cpu_kernels *k)
{
    static const int ns[] = {256, 1024, 2816};
    static const int nbs[] = {1, 2, 3, 4, 5, 7, 64, 70};   /* every tail of the 4-row passes */
    enum { NBMAX = 70, OS = 19 };
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
        const uint32_t type = weight_types[t];
        if (!k->gemm16[type]) continue;
        const tg_type_traits *tx = tg_traits(type), *ty = tg_traits(tx->vec_dot_type);
        for (size_t l = 0; l < sizeof ns / sizeof ns[0]; l++) {
            const int n = ns[l];
            /* rows a little more than a row apart: the kernel takes any stride */
            const size_t wr = tg_row_size(type, n), bx = wr + 64, ar = tg_row_size(tx->vec_dot_type, n);
            float *x = malloc((size_t)n * sizeof(float));
            float *xd = malloc((size_t)16 * n * sizeof(float)), *yd = malloc((size_t)NBMAX * n * sizeof(float));
            char *qx = malloc(16 * bx), *qy = malloc(NBMAX * ar);
            float *out = malloc((size_t)NBMAX * OS * sizeof(float));
            for (int r = 0; r < 16; r++) {
                fill(x, n);
                tx->from_float(x, qx + r * bx, n);
                tx->to_float(qx + r * bx, xd + (size_t)r * n, n);
            }
            for (int b = 0; b < NBMAX; b++) {
                fill(x, n);
                ty->from_float(x, qy + b * ar, n);
                ty->to_float(qy + b * ar, yd + (size_t)b * n, n);
            }
            double worst = 0;
            for (size_t q = 0; q < sizeof nbs / sizeof nbs[0]; q++) {
                const int nb = nbs[q];
                for (int i = 0; i < NBMAX * OS; i++) out[i] = -12345.0f;
                k->gemm16[type](n, out, OS, qx, bx, qy, ar, nb);
                for (int b = 0; b < NBMAX; b++)
                    for (int r = 0; r < OS; r++) {
                        const float v = out[b * OS + r];
                        if (b >= nb || r >= 16) {
                            if (v != -12345.0f)
                                fail_msg("%s gemm16 %s n=%d nb=%d wrote [%d][%d]", k->isa, tx->name, n, nb, b, r);
                            continue;
                        }
                        float s1, ref;
                        k->vec_dot[type](n, &s1, qx + r * bx, qy + b * ar);
                        if (memcmp(&s1, &v, sizeof v) != 0)
                            fail_msg("%s gemm16 %s n=%d nb=%d [%d][%d]: %.9g, vec_dot %.9g (must be bit-identical)",
                                     k->isa, tx->name, n, nb, b, r, v, s1);
                        tx->vec_dot(n, &ref, qx + r * bx, qy + b * ar);
                        double mag = 0;
                        for (int i = 0; i < n; i++) mag += fabs((double)xd[(size_t)r * n + i] * yd[(size_t)b * n + i]);
                        const double rel = fabs((double)v - ref) / mag;
                        if (!(rel <= TG_CPU_DOT_TOL))
                            fail_msg("%s gemm16 %s n=%d nb=%d [%d][%d]: %.9g, reference %.9g, rel %g", k->isa,
                                     tx->name, n, nb, b, r, v, ref, rel);
                        if (rel > worst) worst = rel;
                    }
            }
            printf("  %-10s gemm16 %-4s n=%-5d nb 1..%d: bit-identical to vec_dot, max |fast-ref|/sum|terms| %.2e\n",
                   k->isa, tx->name, n, NBMAX, worst);
            if (k->gemm16_1[type]) {   /* the decode tiles another tier lends this one (kernels.h) */
                k->gemm16_1[type](n, out, OS, qx, bx, qy, ar, 1);
                for (int r = 0; r < 16; r++) {
                    float s1;
                    k->vec_dot[type](n, &s1, qx + r * bx, qy);
                    if (memcmp(&s1, &out[r], sizeof s1) != 0)
                        fail_msg("%s decode tile %s n=%d [%d]: %.9g, vec_dot %.9g (must be bit-identical)", k->isa,
                                 tx->name, n, r, out[r], s1);
                }
                printf("  %-10s decode tile %-4s n=%-5d (%s): bit-identical to vec_dot\n", k->isa, tx->name, n,
                       tg_cpu_decode_tiles());
            }
            free(x); free(xd); free(yd); free(qx); free(qy); free(out);
        }
    }
}

static void check_tier(const char *isa)
{
    const tg_cpu_kernels *k = tg_cpu_kernels_tier(isa);
    if (!k) {
        printf("  SKIP tier %s: this build or this CPU does not have it\n", isa);
        skip();
    }
    check_dots(k);
    check_dot4(k);
    check_gemm16(k);
    check_quantizers(k);
}

static void test_tier_avx2(void **state) { (void)state; check_tier("avx2"); }
static void test_tier_avx512vnni(void **state) { (void)state; check_tier("avx512vnni"); }
static void test_tier_neon(void **state) { (void)state; check_tier("neon"); }
static void test_tier_neon_dotprod(void **state) { (void)state; check_tier("neon-dotprod"); }

static void test_scalar_tier_is_reference(void **state)
{
    (void)state;
    const tg_cpu_kernels *k = tg_cpu_kernels_tier("scalar");
    assert_non_null(k);
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++)
        assert_ptr_equal(k->vec_dot[weight_types[t]], tg_traits(weight_types[t])->vec_dot);
    const char *isa = tg_cpu_isa();
    assert_true(!strcmp(isa, "scalar") || !strcmp(isa, "avx2") || !strcmp(isa, "avx512vnni") ||
                !strcmp(isa, "neon") || !strcmp(isa, "neon-dotprod"));
    assert_non_null(tg_cpu_kernels_tier(isa));
    assert_null(tg_cpu_kernels_tier("sse9"));
    assert_null(tg_cpu_vec_dot(23));   /* IQ4_XS */
    assert_null(tg_cpu_vec_dot(9999));
}

/* The AVX2 and AVX-512 VNNI Q4_K and Q6_K kernels share their numerics
 * (one exact integer sum and one f32 update per block): the same bytes on
 * every pair (docs/formats.md). */
static void test_x86_kquant_tiers_agree(void **state)
{
    (void)state;
    const tg_cpu_kernels *a = tg_cpu_kernels_tier("avx2"), *b = tg_cpu_kernels_tier("avx512vnni");
    if (!a || !b) {
        printf("  SKIP: avx2 and avx512vnni are not both here\n");
        skip();
    }
    static const uint32_t types[] = {TG_TYPE_Q4_K, TG_TYPE_Q6_K};
    enum { N = 2816 };
    float *x = malloc(N * sizeof(float));
    char *qx = malloc(N * 4), *qy = malloc(N * 4);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const tg_type_traits *tx = tg_traits(types[t]), *ty = tg_traits(tx->vec_dot_type);
        for (int rep = 0; rep < 64; rep++) {
            const int n = QK_K * (1 + rep % (N / QK_K));
            fill(x, n);
            tx->from_float(x, qx, n);
            fill(x, n);
            ty->from_float(x, qy, n);
            float sa, sb;
            a->vec_dot[types[t]](n, &sa, qx, qy);
            b->vec_dot[types[t]](n, &sb, qx, qy);
            if (memcmp(&sa, &sb, sizeof sa) != 0)
                fail_msg("%s n=%d: avx2 %.9g, avx512vnni %.9g (must be bit-identical)", tx->name, n, sa, sb);
        }
        printf("  %-4s: avx2 and avx512vnni bit-identical on 64 pairs\n", tx->name);
    }
    free(x); free(qx); free(qy);
}

static void test_matmul(void **state)
{
    (void)state;
    enum { NROWS = 37, NCOLS = 768, NB = 5, R0 = 3, R1 = 31 };
    float *w = malloc(NROWS * NCOLS * sizeof(float)), *a = malloc(NB * NCOLS * sizeof(float));
    float *out = malloc(NB * NROWS * sizeof(float)), *gv = malloc(NROWS * sizeof(float));
    float *wd = malloc(NCOLS * sizeof(float)), *ad = malloc(NCOLS * sizeof(float));
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
        const uint32_t type = weight_types[t];
        const tg_type_traits *tx = tg_traits(type), *ty = tg_traits(tx->vec_dot_type);
        const size_t wrow = tg_row_size(type, NCOLS), arow = tg_row_size(tx->vec_dot_type, NCOLS);
        char *qw = malloc(NROWS * wrow), *qa = malloc(NB * arow);
        fill(w, NROWS * NCOLS);
        fill(a, NB * NCOLS);
        for (int r = 0; r < NROWS; r++) tx->from_float(w + r * NCOLS, qw + r * wrow, NCOLS);
        for (int b = 0; b < NB; b++)
            assert_int_equal(tg_cpu_quantize_row(tx->vec_dot_type, a + b * NCOLS, qa + b * arow, NCOLS), 0);
        for (int i = 0; i < NB * NROWS; i++) out[i] = -12345.0f;
        tg_cpu_matmul(type, qw, NROWS, NCOLS, qa, NB, out, R0, R1);
        double worst = 0;
        for (int b = 0; b < NB; b++) {
            /* the activation rows are what the reference quantizer makes */
            char ref_act[NCOLS * 4];
            ty->from_float(a + b * NCOLS, ref_act, NCOLS);
            if (memcmp(ref_act, qa + b * arow, arow) != 0)
                fail_msg("%s: tg_cpu_quantize_row differs from the reference quantizer", ty->name);
            for (int r = 0; r < NROWS; r++) {
                const float v = out[b * NROWS + r];
                if (r < R0 || r >= R1) {
                    if (v != -12345.0f) fail_msg("%s matmul wrote row %d outside [%d, %d)", tx->name, r, R0, R1);
                    continue;
                }
                float ref;
                tx->vec_dot(NCOLS, &ref, qw + r * wrow, qa + b * arow);
                tx->to_float(qw + r * wrow, wd, NCOLS);
                ty->to_float(qa + b * arow, ad, NCOLS);
                double mag = 0;
                for (int i = 0; i < NCOLS; i++) mag += fabs((double)wd[i] * ad[i]);
                const double rel = fabs((double)v - ref) / mag;
                if (!(rel <= TG_CPU_DOT_TOL))
                    fail_msg("%s matmul [%d][%d]: %.9g, reference dot %.9g (rel %g)", tx->name, b, r, v, ref, rel);
                if (rel > worst) worst = rel;
                /* one vec_dot per output: identical to a direct call */
                float direct;
                tg_cpu_vec_dot(type)(NCOLS, &direct, qw + r * wrow, qa + b * arow);
                if (memcmp(&direct, &v, sizeof v) != 0)
                    fail_msg("%s matmul [%d][%d] is not the bytes of one vec_dot", tx->name, b, r);
            }
        }
        /* gemv = matmul with nb = 1 */
        for (int r = 0; r < NROWS; r++) gv[r] = -1.0f;
        tg_cpu_gemv(type, qw, NROWS, NCOLS, qa + 2 * arow, gv, R0, R1);
        for (int r = R0; r < R1; r++)
            if (memcmp(&gv[r], &out[2 * NROWS + r], sizeof(float)) != 0)
                fail_msg("%s gemv row %d differs from matmul", tx->name, r);
        assert_true(gv[0] == -1.0f && gv[NROWS - 1] == -1.0f);
        printf("  matmul %-4s (%s) %dx%d, %d act rows, rows [%d,%d): max rel %.2e\n", tx->name,
               tg_cpu_isa(), NROWS, NCOLS, NB, R0, R1, worst);
        free(qw);
        free(qa);
    }
    free(w); free(a); free(out); free(gv); free(wd); free(ad);
}

/* Real weights: rows of every matrix of the shipped Q4_K_M model (written
 * by llama.cpp's own quantizer) through every tier, against the reference. */
static void test_model_rows(void **state)
{
    (void)state;
    const char *root = getenv("TG_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", root ? root : ".");
    gguf *g = NULL;
    tg_err e;
    if (gguf_open(&g, path, &e) != 0) {
        printf("  SKIP: cannot open the shipped model: %s\n", e.msg);
        skip();
    }
    static const char *const tiers[] = {"avx2", "avx512vnni", "neon", "neon-dotprod"};
    int checked[TG_TYPE_COUNT] = {0};
    double worst[TG_TYPE_COUNT] = {0};
    for (int64_t ti = 0; ti < gguf_n_tensors(g); ti++) {
        const gguf_tensor *t = gguf_tensor_at(g, ti);
        const tg_type_traits *tx = tg_traits(t->type);
        if (t->n_dims != 2 || !tx || !tx->vec_dot) continue;
        const int64_t ncols = (int64_t)t->ne[0], nrows = (int64_t)t->ne[1];
        const tg_type_traits *ty = tg_traits(tx->vec_dot_type);
        const size_t wrow = tg_row_size(t->type, ncols);
        assert_true(wrow > 0 && wrow * (size_t)nrows <= t->nbytes);
        float *a = malloc(ncols * sizeof(float)), *wd = malloc(ncols * sizeof(float));
        float *ad = malloc(ncols * sizeof(float));
        void *qa = malloc(ncols * 4);
        fill(a, ncols);
        ty->from_float(a, qa, ncols);
        ty->to_float(qa, ad, ncols);
        for (int k = 0; k < 8; k++) {
            const int64_t r = (nrows - 1) * k / 7;
            const char *row = (const char *)t->data + (size_t)r * wrow;
            tx->to_float(row, wd, ncols);
            double mag = 0;
            for (int64_t i = 0; i < ncols; i++) mag += fabs((double)wd[i] * ad[i]);
            float ref;
            tx->vec_dot((int)ncols, &ref, row, qa);
            for (size_t ki = 0; ki < sizeof tiers / sizeof tiers[0]; ki++) {
                const tg_cpu_kernels *kk = tg_cpu_kernels_tier(tiers[ki]);
                if (!kk) continue;
                float fast;
                kk->vec_dot[t->type]((int)ncols, &fast, row, qa);
                const double rel = mag > 0 ? fabs((double)fast - ref) / mag : fabs((double)fast - ref);
                if (!(rel <= TG_CPU_DOT_TOL))
                    fail_msg("%s: %s row %lld (%s): fast %.9g, reference %.9g, rel %g", path, t->name,
                             (long long)r, kk->isa, fast, ref, rel);
                if (rel > worst[t->type]) worst[t->type] = rel;
            }
            checked[t->type]++;
        }
        free(a); free(wd); free(ad); free(qa);
    }
    gguf_close(g);
    int any = 0;
    for (int t = 0; t < TG_TYPE_COUNT; t++)
        if (checked[t]) {
            printf("  model rows %-4s: %d rows, every tier here, max |fast-ref|/sum|terms| %.2e\n",
                   tg_type_name(t), checked[t], worst[t]);
            any = 1;
        }
    if (!any) fail_msg("%s: no matrix with a vec_dot type", path);
}

static void test_quantize_row_errors(void **state)
{
    (void)state;
    float x[256] = {0};
    char y[1024];
    assert_int_equal(tg_cpu_quantize_row(TG_TYPE_Q4_K, x, y, 256), -1);   /* not an activation type */
    assert_int_equal(tg_cpu_quantize_row(TG_TYPE_Q8_K, x, y, 100), -1);   /* not whole blocks */
    assert_int_equal(tg_cpu_quantize_row(TG_TYPE_Q8_0, x, y, 33), -1);
    assert_int_equal(tg_cpu_quantize_row(TG_TYPE_F16, x, y, 33), 0);
    assert_int_equal(tg_cpu_quantize_row(TG_TYPE_BF16, x, y, 256), 0);
    assert_int_equal(tg_cpu_quantize_row(TG_TYPE_F32, x, y, 256), 0);
}

/* A score hook for the attention test: masks every fifth position (-inf)
 * and moves every third by ctx's offset. */
static float test_hook(void *ctx, int j, float s)
{
    if (j % 5 == 4) return -INFINITY;
    return j % 3 == 0 ? s + *(const float *)ctx : s;
}

/* Bytes of n floats equal? */
static int same_bits(const float *a, const float *b, int n)
{
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

static void test_attn_row(void **state)
{
    (void)state;
    static const int dims[] = {16, 64, 80, 128, 256};
    static const int lens[] = {1, 2, 7, 64, 301};
    enum { NMAX = 301, DMAX = 256 };
    static const struct { int order; const char *tier; } orders[] = {
        {TG_FA_PORTABLE, "scalar"}, {TG_FA_AVX2, "avx2"}, {TG_FA_AVX512, "avx512vnni"}};
    tg_half *k = malloc(sizeof(tg_half) * NMAX * DMAX), *v = malloc(sizeof(tg_half) * NMAX * DMAX);
    tg_half q[DMAX];
    float x[DMAX], want[DMAX], got[DMAX], scratch[2 * NMAX];
    int cases = 0;
    for (size_t o = 0; o < sizeof orders / sizeof orders[0]; o++) {
#if !defined(__x86_64__)
        if (orders[o].order != TG_FA_PORTABLE) continue;
#endif
        if (!tg_cpu_kernels_tier(orders[o].tier)) {
            printf("attention: no %s on this CPU, its order not checked\n", orders[o].tier);
            continue;
        }
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int h = 0; h < 2; h++) {
                    const int d = dims[di], n = lens[li];
                    /* scores spread widely enough for many new maxima */
                    for (int j = 0; j < n; j++) {
                        fill(x, d);
                        for (int i = 0; i < d; i++) k[(size_t)j * d + i] = tg_f32_to_half(x[i]);
                        fill(x, d);
                        for (int i = 0; i < d; i++) v[(size_t)j * d + i] = tg_f32_to_half(x[i]);
                    }
                    fill(x, d);
                    for (int i = 0; i < d; i++) q[i] = tg_f32_to_half(x[i]);
                    const float scale = 1.0f / sqrtf((float)d), off = 3.5f;
                    tg_fa_hook_fn hook = h ? test_hook : NULL;
                    tg_fa_row_f16_ref(orders[o].order, n, d, k, v, d, q, scale, hook, (void *)&off, want);
                    tg_fa_row_f16(orders[o].order, n, d, k, v, d, q, scale, hook, (void *)&off, scratch, got);
                    if (!same_bits(want, got, d))
                        fail_msg("attention row, order %s, d %d, %d positions, hook %d: the three-pass form "
                                 "differs from the reference", orders[o].tier, d, n, h);
                    cases++;
                }
    }
    printf("attention rows: %d cases bit-identical to the reference\n", cases);
    free(k);
    free(v);
}

/* The vector swiglus (forward_avx2.c, forward_avx512.c) against the one
 * element at a time reference of their ISA's expf: bit-identical (the same
 * operations per element), on random rows with the big-argument path taken
 * and rows ranges that start and end off the vector width. */
static void check_swiglu(const char *tier, int wide)
{
#if defined(__x86_64__)
    if (!tg_cpu_kernels_tier(tier)) {
        printf("  SKIP swiglu %s: this build or this CPU does not have it\n", tier);
        skip();
        return;
    }
    enum { N = 1000 };
    float g[N], u[N], want[N], got[N];
    for (int rep = 0; rep < 40; rep++) {
        fill(g, N);
        fill(u, N);
        for (int i = 0; i < N; i += 37) g[i] = (float)((rng_uniform() - 0.5) * 500);   /* the big-argument path */
        const int64_t n = rep % 2 ? N : 992, r0 = (int64_t)(rng_next() % 50), r1 = n - (int64_t)(rng_next() % 50);
        memcpy(want, g, sizeof g);
        memcpy(got, g, sizeof g);
        tg_swiglu_ggml_ref(r0, r1, n, want, u, wide);
        if (wide)
            tg_swiglu_ggml_avx512(r0, r1, n, got, u);
        else
            tg_swiglu_ggml_avx2(r0, r1, n, got, u);
        if (!same_bits(want, got, N))
            fail_msg("swiglu %s, row of %lld, rows [%lld, %lld): differs from the one-element reference", tier,
                     (long long)n, (long long)r0, (long long)r1);
    }
    printf("  swiglu %s: 40 rows bit-identical to the reference\n", tier);
#else
    (void)tier;
    (void)wide;
    skip();
#endif
}

static void test_swiglu_avx2(void **state) { (void)state; check_swiglu("avx2", 0); }
static void test_swiglu_avx512(void **state) { (void)state; check_swiglu("avx512vnni", 1); }

int main(void)
{
    /* the avx512vnni tier borrows the avx2 decode tiles on every AVX-512
     * machine here, not only where kernels.c picks them, so that check_gemm16
     * holds them to the tier's vec_dot (TG_CPU_DECODE, kernels.h) */
    setenv("TG_CPU_DECODE", "avx2", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalar_tier_is_reference),
        cmocka_unit_test(test_tier_avx2),
        cmocka_unit_test(test_tier_avx512vnni),
        cmocka_unit_test(test_tier_neon),
        cmocka_unit_test(test_tier_neon_dotprod),
        cmocka_unit_test(test_x86_kquant_tiers_agree),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_model_rows),
        cmocka_unit_test(test_quantize_row_errors),
        cmocka_unit_test(test_attn_row),
        cmocka_unit_test(test_swiglu_avx2),
        cmocka_unit_test(test_swiglu_avx512),
    };
    return cmocka_run_group_tests(tests, setup_seed, NULL);
}
