/*
 * kernels-check.c: a standalone check of the fast CPU kernels against the
 * scalar reference, for builds where cmocka is not available (the aarch64
 * cross build, run under qemu-aarch64 -L /usr/aarch64-linux-gnu).
 * tests/test_kernels.c is the cmocka version for the host.
 *
 * For every tier this build and CPU offer (scalar excluded): every vec_dot
 * on fresh random rows of 256 .. 8192 values within TG_CPU_DOT_TOL of the
 * reference (relative to the sum of |terms|), the Q8_K / Q8_0 quantizers
 * and f32 -> f16 byte-identical to the reference, and tg_cpu_matmul against
 * reference dots. One line per check; exit status 0 when all pass, 1 when
 * any fails, 2 on bad usage.
 *
 * usage: kernels-check [SEED]     (default: from /dev/urandom; printed)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "quant.h"

static uint64_t rng_state;
static int failures;

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

static void fill(float *x, int n)
{
    const double scale = exp((rng_uniform() - 0.5) * 6);
    for (int i = 0; i < n; i++) {
        double u1 = rng_uniform(), u2 = rng_uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        x[i] = (float)(sqrt(-2 * log(u1)) * cos(2 * M_PI * u2) * scale);
        if (rng_next() % 101 == 0) x[i] *= 5;
    }
}

static void check_tier(const tg_cpu_kernels *k)
{
    static const uint32_t types[] = {TG_TYPE_Q4_K, TG_TYPE_Q5_K, TG_TYPE_Q6_K, TG_TYPE_Q8_0,
                                     TG_TYPE_F16, TG_TYPE_BF16, TG_TYPE_F32};
    static const int lens[] = {256, 1024, 2816, 8192};
    enum { NMAX = 8192 };
    float *x = malloc(NMAX * sizeof(float)), *y = malloc(NMAX * sizeof(float));
    float *xd = malloc(NMAX * sizeof(float)), *yd = malloc(NMAX * sizeof(float));
    char *qx = malloc(NMAX * 4), *qy = malloc(NMAX * 4);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const tg_type_traits *tx = tg_traits(types[t]), *ty = tg_traits(tx->vec_dot_type);
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            const int n = lens[l];
            double worst = 0;
            for (int rep = 0; rep < 4; rep++) {
                fill(x, n);
                fill(y, n);
                tx->from_float(x, qx, n);
                ty->from_float(y, qy, n);
                tx->to_float(qx, xd, n);
                ty->to_float(qy, yd, n);
                double mag = 0;
                for (int i = 0; i < n; i++) mag += fabs((double)xd[i] * yd[i]);
                float ref, fast;
                tx->vec_dot(n, &ref, qx, qy);
                k->vec_dot[types[t]](n, &fast, qx, qy);
                const double rel = fabs((double)fast - ref) / mag;
                if (isnan(rel) || rel > worst) worst = rel;   /* a NaN sticks */
            }
            const int ok = worst <= TG_CPU_DOT_TOL;
            printf("%s %-12s %-4s x %-4s n=%-5d max |fast-ref|/sum|terms| %.2e (tol %.0e)\n",
                   ok ? "ok  " : "FAIL", k->isa, tx->name, ty->name, n, worst, TG_CPU_DOT_TOL);
            failures += !ok;
        }
    }
    /* vec_dot4 where the tier has one: bit-identical to vec_dot */
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        if (!k->vec_dot4[types[t]]) continue;
        const tg_type_traits *tx = tg_traits(types[t]), *ty = tg_traits(tx->vec_dot_type);
        const int n = 2048;
        const size_t ar = tg_row_size(tx->vec_dot_type, n);
        fill(x, n);
        tx->from_float(x, qx, n);
        for (int j = 0; j < 4; j++) {
            fill(y, n);
            ty->from_float(y, qy + j * ar, n);
        }
        float s4[4], s1;
        k->vec_dot4[types[t]](n, s4, qx, qy, ar);
        int ok = 1;
        for (int j = 0; j < 4; j++) {
            k->vec_dot[types[t]](n, &s1, qx, qy + j * ar);
            ok &= memcmp(&s1, &s4[j], sizeof s1) == 0;
        }
        printf("%s %-12s vec_dot4 %-4s: %s\n", ok ? "ok  " : "FAIL", k->isa, tx->name,
               ok ? "bit-identical to vec_dot" : "differs from vec_dot");
        failures += !ok;
    }
    /* quantizers: identical bytes, including a zero block and ties */
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        const int n = lens[l];
        fill(x, n);
        for (int i = 0; i < 256; i++) x[i] = 0;
        for (int i = 256; i < n; i += 3) x[i] = (float)((int)(x[i] * 4)) * 0.5f;
        tg_traits(TG_TYPE_Q8_K)->from_float(x, qx, n);
        k->quantize_q8_K(x, qy, n);
        int ok = memcmp(qx, qy, tg_row_size(TG_TYPE_Q8_K, n)) == 0;
        tg_traits(TG_TYPE_Q8_0)->from_float(x, qx, n);
        k->quantize_q8_0(x, qy, n);
        ok &= memcmp(qx, qy, tg_row_size(TG_TYPE_Q8_0, n)) == 0;
        const float specials[] = {INFINITY, -INFINITY, NAN, 65519.0f, 65520.0f, 1e-8f, 0x1p-25f,
                                  0x1.8p-24f, -0.0f, 1.0f + 0x1p-11f};
        for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[5 * i + 3] = specials[i];
        tg_half *ha = (tg_half *)qx, *hb = (tg_half *)qy;
        for (int i = 0; i < n - 1; i++) ha[i] = tg_f32_to_half(x[i]);
        k->f32_to_f16(x, hb, n - 1);
        ok &= memcmp(ha, hb, (size_t)(n - 1) * sizeof(tg_half)) == 0;
        /* axpy over f16: identical to the scalar tier */
        float *ya = malloc(n * sizeof(float)), *yb = malloc(n * sizeof(float));
        fill(ya, n);
        memcpy(yb, ya, n * sizeof(float));
        tg_cpu_kernels_tier("scalar")->axpy_f16(n - 1, ya, ha, 0.37f);
        k->axpy_f16(n - 1, yb, ha, 0.37f);
        for (int i = 0; i < n - 1; i++) ok &= isnan(ya[i]) ? isnan(yb[i]) : memcmp(&ya[i], &yb[i], 4) == 0;
        free(ya);
        free(yb);
        printf("%s %-12s quantize_q8_K, quantize_q8_0, f32_to_f16, axpy_f16 n=%d: %s\n", ok ? "ok  " : "FAIL", k->isa,
               n, ok ? "identical bytes" : "bytes differ from the reference");
        failures += !ok;
    }
    free(x); free(y); free(xd); free(yd); free(qx); free(qy);
}

/* tg_cpu_matmul (selected tier) against reference dots. */
static void check_matmul(void)
{
    enum { NR = 19, NC = 512, NB = 3 };
    static const uint32_t types[] = {TG_TYPE_Q4_K, TG_TYPE_Q6_K, TG_TYPE_Q8_0, TG_TYPE_F16};
    float *w = malloc(NR * NC * sizeof(float)), *a = malloc(NB * NC * sizeof(float));
    float out[NB * NR];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const tg_type_traits *tx = tg_traits(types[t]), *ty = tg_traits(tx->vec_dot_type);
        const size_t wr = tg_row_size(types[t], NC), ar = tg_row_size(tx->vec_dot_type, NC);
        char *qw = malloc(NR * wr), *qa = malloc(NB * ar);
        fill(w, NR * NC);
        fill(a, NB * NC);
        for (int r = 0; r < NR; r++) tx->from_float(w + r * NC, qw + r * wr, NC);
        for (int b = 0; b < NB; b++) tg_cpu_quantize_row(tx->vec_dot_type, a + b * NC, qa + b * ar, NC);
        for (int i = 0; i < NB * NR; i++) out[i] = -7.0f;
        tg_cpu_matmul(types[t], qw, NR, NC, qa, NB, out, 2, NR - 1);
        int ok = 1;
        for (int b = 0; b < NB; b++)
            for (int r = 0; r < NR; r++) {
                if (r < 2 || r >= NR - 1) {
                    ok &= out[b * NR + r] == -7.0f;
                    continue;
                }
                float ref;
                tx->vec_dot(NC, &ref, qw + r * wr, qa + b * ar);
                ok &= fabsf(out[b * NR + r] - ref) <= 1e-4f * (fabsf(ref) + 1e-3f) + 1e-6f;
            }
        (void)ty;
        printf("%s matmul %-4s (%s) %dx%d x %d rows\n", ok ? "ok  " : "FAIL", tx->name, tg_cpu_isa(), NR, NC, NB);
        failures += !ok;
        free(qw);
        free(qa);
    }
    free(w);
    free(a);
}

int main(int argc, char **argv)
{
    if (argc > 2) {
        fprintf(stderr, "usage: %s [SEED]\n", argv[0]);
        return 2;
    }
    if (argc == 2) {
        rng_state = strtoull(argv[1], NULL, 0);
    } else {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(&rng_state, sizeof rng_state, 1, f) != 1) rng_state = 0x5eed;
        if (f) fclose(f);
    }
    printf("kernels-check: seed 0x%016llx, selected tier %s\n", (unsigned long long)rng_state, tg_cpu_isa());
    static const char *const tiers[] = {"avx2", "avx512vnni", "neon", "neon-dotprod"};
    int checked = 0;
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++) {
        const tg_cpu_kernels *k = tg_cpu_kernels_tier(tiers[t]);
        if (!k) {
            printf("skip %s: not in this build or not on this CPU\n", tiers[t]);
            continue;
        }
        check_tier(k);
        checked++;
    }
    check_matmul();
    printf("kernels-check: %d tier(s) checked, %d failure(s)\n", checked, failures);
    return failures ? 1 : 0;
}
