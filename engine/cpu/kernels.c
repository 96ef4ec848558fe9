/*
 * kernels.c: run-time choice of the fast CPU kernels (kernels.h) and the
 * row-range matmul built on them.
 *
 * The tier tables are built once (pthread_once): "scalar" from quant.c's
 * reference functions, then each SIMD tier the CPU supports from the tier
 * below it plus its own kernels (kernels_isa.h). The best supported tier is
 * selected unless TG_CPU_ISA names a lower one.
 */
#include "kernels.h"
#include "kernels_isa.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

enum { TIER_SCALAR, TIER_AVX2, TIER_AVX512, TIER_NEON, TIER_NEON_DOT, TIER_COUNT };

static const char *const tier_names[TIER_COUNT] = {
    "scalar", "avx2", "avx512vnni", "neon", "neon-dotprod",
};

static tg_cpu_kernels tiers[TIER_COUNT];
static int tier_ok[TIER_COUNT];
static int selected = TIER_SCALAR;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char decode_note[160];   /* tg_cpu_decode_tiles */

static void scalar_f32_to_f16(const float *x, tg_half *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = tg_f32_to_half(x[i]);
}

static void scalar_axpy_f16(int64_t n, float *y, const tg_half *x, float a)
{
    for (int64_t i = 0; i < n; i++) y[i] = fmaf(a, tg_half_to_f32(x[i]), y[i]);
}

static void fill_scalar(tg_cpu_kernels *k)
{
    memset(k, 0, sizeof *k);
    for (uint32_t t = 0; t < TG_TYPE_COUNT; t++) {
        const tg_type_traits *tr = tg_traits(t);
        if (tr) k->vec_dot[t] = tr->vec_dot;
    }
    k->quantize_q8_K = tg_traits(TG_TYPE_Q8_K)->from_float;
    k->quantize_q8_0 = tg_traits(TG_TYPE_Q8_0)->from_float;
    k->f32_to_f16 = scalar_f32_to_f16;
    k->axpy_f16 = scalar_axpy_f16;
}

/* Builds a tier from `base` with `fill`, named `tier`. */
static void build_tier(int tier, int base, void (*fill)(tg_cpu_kernels *))
{
    tiers[tier] = tiers[base];
    fill(&tiers[tier]);
    /* a vec_dot4 or gemm16 must match its tier's vec_dot bit for bit: drop
     * an inherited one whose vec_dot was replaced */
    for (int t = 0; t < TG_TYPE_COUNT; t++) {
        if (tiers[tier].vec_dot[t] == tiers[base].vec_dot[t]) continue;
        if (tiers[tier].vec_dot4[t] == tiers[base].vec_dot4[t]) tiers[tier].vec_dot4[t] = NULL;
        if (tiers[tier].gemm16[t] == tiers[base].gemm16[t]) tiers[tier].gemm16[t] = NULL;
    }
    tiers[tier].isa = tier_names[tier];
    tier_ok[tier] = 1;
}

#if defined(__x86_64__)
/* The AMD family of this CPU (cpuid leaf 1: base family, plus the extended
 * family when the base is 15), or 0 for another vendor. */
static unsigned amd_family(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u || d != 0x69746e65u || c != 0x444d4163u)
        return 0;   /* not "AuthenticAMD" */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned base = (a >> 8) & 0xf, ext = (a >> 20) & 0xff;
    return base == 15 ? base + ext : base;
}

/* Q4_K and Q6_K decode tiles on the avx512vnni tier (hi): its own, or the
 * avx2 tier's (lo: the same numerics, kernels_avx2.c) on AMD family 25
 * (Zen 4, whose 512-bit operations run as two 256-bit halves). There the
 * avx2 tiles decoded the 0.6b file's 200 steps at 2 threads 10-18% faster
 * (three rounds, December 8, 2026), and a 128 MiB Q6_K matrix streamed
 * from memory at 2 threads in 4.1-4.5 ms a pass against 4.6-7.4 (Q4_K:
 * within the noise). The tier's own tiles stay elsewhere: the figures of
 * December 4 (family 26, Zen 5) were taken with them. A timed choice at
 * start-up was tried and dropped: over cache-resident rows the 512-bit
 * Q6_K tile wins (125 us against 155), the opposite of rows streamed from
 * memory, and timing those would cost each worker tens of milliseconds.
 * TG_CPU_DECODE (avx2, avx512vnni, auto) overrides it (kernels.h). */
static void choose_decode_tiles(tg_cpu_kernels *hi, const tg_cpu_kernels *lo)
{
    static const uint32_t types[] = {TG_TYPE_Q4_K, TG_TYPE_Q6_K};
    const char *force = getenv("TG_CPU_DECODE");
    const int want_lo = force && !strcmp(force, "avx2"), want_hi = force && !strcmp(force, "avx512vnni");
    if (force && *force && !want_lo && !want_hi && strcmp(force, "auto"))
        fprintf(stderr, "tokgate: TG_CPU_DECODE=%s: expected avx2, avx512vnni or auto; using auto\n", force);
    const unsigned fam = amd_family();
    const int use_lo = want_lo || (!want_hi && fam == 25);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const uint32_t type = types[t];
        if (!hi->gemm16[type] || !lo->gemm16[type] || hi->gemm16[type] == lo->gemm16[type]) continue;
        hi->gemm16_1[type] = use_lo ? lo->gemm16[type] : NULL;
        if (!use_lo) continue;
        const size_t len = strlen(decode_note);
        snprintf(decode_note + len, sizeof decode_note - len, "%s%s", len ? ", " : "", tg_traits(type)->name);
    }
    if (use_lo && *decode_note) {
        const size_t len = strlen(decode_note);
        snprintf(decode_note + len, sizeof decode_note - len, " decode tiles avx2 (%s)",
                 want_lo ? "TG_CPU_DECODE=avx2" : "AMD family 25");
    }
}
#endif

static void init_tiers(void)
{
    fill_scalar(&tiers[TIER_SCALAR]);
    tiers[TIER_SCALAR].isa = tier_names[TIER_SCALAR];
    tier_ok[TIER_SCALAR] = 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        build_tier(TIER_AVX2, TIER_SCALAR, tg_cpu_fill_avx2);
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vnni"))
            build_tier(TIER_AVX512, TIER_AVX2, tg_cpu_fill_avx512);
    }
#elif defined(__aarch64__)
    const unsigned long hw = getauxval(AT_HWCAP);
    if (hw & HWCAP_ASIMD) {
        build_tier(TIER_NEON, TIER_SCALAR, tg_cpu_fill_neon);
        if (hw & HWCAP_ASIMDDP) build_tier(TIER_NEON_DOT, TIER_NEON, tg_cpu_fill_neon_dotprod);
    }
#endif
    static const int best_first[] = {TIER_AVX512, TIER_AVX2, TIER_NEON_DOT, TIER_NEON, TIER_SCALAR};
    for (int i = (int)(sizeof best_first / sizeof best_first[0]) - 1; i >= 0; i--)
        if (tier_ok[best_first[i]]) selected = best_first[i];
    const char *want = getenv("TG_CPU_ISA");
    if (want && *want) {
        int found = -1;
        for (int t = 0; t < TIER_COUNT; t++)
            if (tier_ok[t] && strcmp(want, tier_names[t]) == 0) found = t;
        if (found >= 0)
            selected = found;
        else
            fprintf(stderr, "tokgate: TG_CPU_ISA=%s is not available here; using %s\n", want,
                    tier_names[selected]);
    }
#if defined(__x86_64__)
    if (selected == TIER_AVX512) choose_decode_tiles(&tiers[TIER_AVX512], &tiers[TIER_AVX2]);
#endif
}

const char *tg_cpu_decode_tiles(void)
{
    pthread_once(&once, init_tiers);
    return selected == TIER_AVX512 ? decode_note : "";
}

/* Returns the selected tier's name. */
const char *tg_cpu_isa(void)
{
    pthread_once(&once, init_tiers);
    return tier_names[selected];
}

/* Returns the selected tier's kernels (never NULL). */
const tg_cpu_kernels *tg_cpu_kernels_get(void)
{
    pthread_once(&once, init_tiers);
    return &tiers[selected];
}

/* Returns a named tier's kernels, or NULL when unknown or unavailable. */
const tg_cpu_kernels *tg_cpu_kernels_tier(const char *isa)
{
    pthread_once(&once, init_tiers);
    for (int t = 0; t < TIER_COUNT; t++)
        if (tier_ok[t] && isa && strcmp(isa, tier_names[t]) == 0) return &tiers[t];
    return NULL;
}

/* Returns the selected vec_dot of a weight type, or NULL. */
tg_vec_dot_fn tg_cpu_vec_dot(uint32_t type)
{
    if (type >= TG_TYPE_COUNT) return NULL;
    return tg_cpu_kernels_get()->vec_dot[type];
}

void tg_cpu_quantize_row_q8_K(const float *x, block_q8_K *y, int64_t k)
{
    tg_cpu_kernels_get()->quantize_q8_K(x, y, k);
}

void tg_cpu_quantize_row_q8_0(const float *x, block_q8_0 *y, int64_t k)
{
    tg_cpu_kernels_get()->quantize_q8_0(x, y, k);
}

void tg_cpu_f32_to_f16_row(const float *x, tg_half *y, int64_t n)
{
    tg_cpu_kernels_get()->f32_to_f16(x, y, n);
}

void tg_cpu_axpy_f16(int64_t n, float *y, const tg_half *x, float a)
{
    tg_cpu_kernels_get()->axpy_f16(n, y, x, a);
}

/* Returns 0 after quantizing x (k) into y, or -1 for a type that is not an
 * activation type or a k that is not a whole number of its blocks. */
int tg_cpu_quantize_row(uint32_t vec_dot_type, const float *x, void *y, int64_t k)
{
    const tg_cpu_kernels *kk = tg_cpu_kernels_get();
    if (k < 0) return -1;
    switch (vec_dot_type) {
    case TG_TYPE_F32:
        memcpy(y, x, (size_t)k * sizeof(float));
        return 0;
    case TG_TYPE_F16:
        kk->f32_to_f16(x, y, k);
        return 0;
    case TG_TYPE_BF16:
        tg_traits(TG_TYPE_BF16)->from_float(x, y, k);
        return 0;
    case TG_TYPE_Q8_0:
        if (k % QK8_0) return -1;
        kk->quantize_q8_0(x, y, k);
        return 0;
    case TG_TYPE_Q8_K:
        if (k % QK_K) return -1;
        kk->quantize_q8_K(x, y, k);
        return 0;
    case TG_TYPE_Q8_1:   /* Q4_1 and Q5_1 activations: ggml's reference quantizer */
        if (k % QK8_0) return -1;
        tg_traits(TG_TYPE_Q8_1)->from_float(x, y, k);
        return 0;
    default:
        return -1;
    }
}

/* Where the tier has a gemm16, whole tiles of 16 rows go through it (each
 * weight block unpacked once for every activation row). Other rows are
 * taken in tiles so that a tile of weight rows stays in L1 while the
 * activation rows pass over it four at a time (vec_dot4: weights unpacked
 * once per four activations). */
#define MATMUL_ROW_TILE 4

void tg_cpu_matmul(uint32_t type, const void *w, int64_t nrows, int64_t ncols,
                   const void *act, int64_t nb, float *out, int64_t r0, int64_t r1)
{
    const tg_type_traits *tr = tg_traits(type);
    assert(tr && "tg_cpu_matmul: unsupported weight type");
    const tg_cpu_kernels *k = tg_cpu_kernels_get();
    const tg_vec_dot_fn dot = k->vec_dot[type];
    const tg_vec_dot4_fn dot4 = k->vec_dot4[type];
    assert(dot && "tg_cpu_matmul: weight type without a vec_dot");
    const size_t wrow = tg_row_size(type, ncols);
    const size_t arow = tg_row_size(tr->vec_dot_type, ncols);
    assert(wrow && arow && "tg_cpu_matmul: ncols is not a whole number of blocks");
    assert(0 <= r0 && r0 <= r1 && r1 <= nrows);
    const char *wb = w, *ab = act;
    const tg_gemm16_fn g16 = nb == 1 && k->gemm16_1[type] ? k->gemm16_1[type] : k->gemm16[type];
    if (g16) {
        for (; r0 + 16 <= r1; r0 += 16)
            g16((int)ncols, out + r0, (size_t)nrows, wb + (size_t)r0 * wrow, wrow, act, arow, (int)nb);
    }
    for (int64_t rt = r0; rt < r1; rt += MATMUL_ROW_TILE) {
        const int64_t re = rt + MATMUL_ROW_TILE < r1 ? rt + MATMUL_ROW_TILE : r1;
        int64_t b = 0;
        if (dot4) {
            for (; b + 4 <= nb; b += 4)
                for (int64_t r = rt; r < re; r++) {
                    float s[4];
                    dot4((int)ncols, s, wb + (size_t)r * wrow, ab + (size_t)b * arow, arow);
                    for (int j = 0; j < 4; j++) out[(b + j) * nrows + r] = s[j];
                }
        }
        for (; b < nb; b++)
            for (int64_t r = rt; r < re; r++)
                dot((int)ncols, &out[b * nrows + r], wb + (size_t)r * wrow, ab + (size_t)b * arow);
    }
}

void tg_cpu_gemv(uint32_t type, const void *w, int64_t nrows, int64_t ncols,
                 const void *act, float *out, int64_t r0, int64_t r1)
{
    const tg_vec_dot_fn dot = tg_cpu_vec_dot(type);
    assert(dot && "tg_cpu_gemv: weight type without a vec_dot");
    const size_t wrow = tg_row_size(type, ncols);
    assert(wrow && "tg_cpu_gemv: ncols is not a whole number of blocks");
    assert(0 <= r0 && r0 <= r1 && r1 <= nrows);
    const char *wb = w;
    for (int64_t r = r0; r < r1; r++) dot((int)ncols, &out[r], wb + (size_t)r * wrow, act);
}
