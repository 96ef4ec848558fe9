/*
 * kernels.h: the fast CPU kernels of the cpu tier, picked at run time from
 * what the CPU reports (cpuid on x86-64, getauxval on aarch64).
 *
 * Tiers, best first: "avx512vnni" (AVX-512 F/BW/VL/DQ + VNNI), "avx2"
 * (AVX2 + FMA + F16C), "neon-dotprod" and "neon" (aarch64), "scalar" (the
 * reference code of quant.c). A tier a build or a CPU lacks is not offered.
 * The environment variable TG_CPU_ISA=<tier name> selects a lower tier
 * (benchmarks, bisecting a kernel); an unknown or unavailable name is
 * ignored with a line on stderr.
 *
 * Every kernel computes what its scalar reference in quant.c computes:
 * - the activation quantizers (Q8_K, Q8_0) and f32 -> f16 give identical
 *   bytes;
 * - integer dot products give the same integer sums per block; only the
 *   float summation order differs (TG_CPU_DOT_TOL below);
 * - f32/f16/bf16 dots accumulate in float (the reference in double).
 * Integer kernels assume activations made by the quantizers (|q| <= 127;
 * a -128 in a Q8_0 activation may give a wrong sum, never a crash).
 *
 * All functions are thread-safe; the tier is chosen once, on first use.
 */
#ifndef TG_CPU_KERNELS_H
#define TG_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

/* How far a fast dot may be from its scalar reference: relative to the sum
 * of |terms| of the dot product (float summation order only). */
#define TG_CPU_DOT_TOL 1e-5

/* f32 -> f16 over n values (any n). */
typedef void (*tg_f32_to_f16_fn)(const float *x, tg_half *y, int64_t n);

/* y[i] = fmaf(a, x[i], y[i]) over n values (any n), x in f16: one fused
 * multiply-add per value (rounded once) in every tier, as llama.cpp's
 * ggml_vec_mad_f16; explicit, so compiler contraction cannot change it. */
typedef void (*tg_axpy_f16_fn)(int64_t n, float *y, const tg_half *x, float a);

/* s[j] = dot(x, y + j * by) for j = 0..3: one weight row against four
 * activation rows `by` bytes apart, the weights unpacked once. Each s[j]
 * is bit-identical to what the tier's vec_dot gives for that pair. */
typedef void (*tg_vec_dot4_fn)(int n, float *s, const void *x, const void *y, size_t by);

/* out[b * os + r] = dot(x + r * bx, y + b * by) for r in [0, 16) and b in
 * [0, nb): sixteen weight rows `bx` bytes apart against nb activation rows
 * `by` bytes apart, each weight block unpacked once for all nb activation
 * rows (a prefill tile; also decode's, nb = 1). Each output is
 * bit-identical to what the tier's vec_dot gives for that pair. */
typedef void (*tg_gemm16_fn)(int n, float *out, size_t os, const void *x, size_t bx, const void *y,
                             size_t by, int nb);

/* The kernels of one tier. */
typedef struct tg_cpu_kernels {
    const char *isa;                       /* tier name, as listed above */
    tg_vec_dot_fn vec_dot[TG_TYPE_COUNT];  /* by weight type (against its vec_dot_type); NULL: none */
    tg_vec_dot4_fn vec_dot4[TG_TYPE_COUNT]; /* optional (NULL: four vec_dot calls); tg_cpu_matmul uses it */
    tg_gemm16_fn gemm16[TG_TYPE_COUNT];     /* optional; tg_cpu_matmul uses it for whole tiles of 16 rows */
    /* optional: the gemm16 tg_cpu_matmul uses for one activation row (decode)
     * instead, another tier's tile of the same numerics (bit-identical to
     * this tier's vec_dot) that was timed faster on this CPU; NULL: gemm16 */
    tg_gemm16_fn gemm16_1[TG_TYPE_COUNT];
    tg_from_float_fn quantize_q8_K;        /* k a multiple of 256 */
    tg_from_float_fn quantize_q8_0;        /* k a multiple of 32 */
    tg_f32_to_f16_fn f32_to_f16;
    tg_axpy_f16_fn axpy_f16;
} tg_cpu_kernels;

/* The selected tier's name: "avx512vnni", "avx2", "neon-dotprod", "neon"
 * or "scalar". */
const char *tg_cpu_isa(void);
/* Which decode tiles the selected tier uses where it has a choice, and
 * why: "" when it has its own, else e.g. "q4_K, q6_K decode tiles avx2
 * (AMD family 25)". On the avx512vnni tier the Q4_K and Q6_K tiles of
 * the avx2 tier give the same bits (kernels_avx2.c), and on AMD Zen 4
 * they decode faster (kernels.c, choose_decode_tiles); TG_CPU_DECODE=avx2
 * or =avx512vnni forces one (benchmarks, tests), =auto is the default. */
const char *tg_cpu_decode_tiles(void);
/* The selected tier's kernels (never NULL; every weight type quant.h's
 * tg_traits() supports with a vec_dot has one). */
const tg_cpu_kernels *tg_cpu_kernels_get(void);
/* The kernels of a named tier, or NULL when this build or this CPU lacks
 * it (tests compare every available tier with "scalar"). */
const tg_cpu_kernels *tg_cpu_kernels_tier(const char *isa);

/* The selected tier's vec_dot for weight type `type` (activations of
 * tg_traits(type)->vec_dot_type), or NULL for an unsupported type. */
tg_vec_dot_fn tg_cpu_vec_dot(uint32_t type);

/* Activation row helpers with the selected tier: identical bytes to the
 * reference quantizers. k: a multiple of 256 (q8_K), of 32 (q8_0). */
void tg_cpu_quantize_row_q8_K(const float *x, block_q8_K *y, int64_t k);   /* x (k) -> y (k/256) */
void tg_cpu_quantize_row_q8_0(const float *x, block_q8_0 *y, int64_t k);   /* x (k) -> y (k/32) */
void tg_cpu_f32_to_f16_row(const float *x, tg_half *y, int64_t n);         /* x (n) -> y (n) */
/* y (n) += a * x (n), x in f16 (attention over an F16 V cache). */
void tg_cpu_axpy_f16(int64_t n, float *y, const tg_half *x, float a);

/* Quantizes one activation row of k values to `vec_dot_type` (F32: copy,
 * F16, BF16, Q8_0, Q8_K), the form tg_cpu_matmul's act rows take. Returns
 * 0, or -1 when the type is not an activation type or k is not a multiple
 * of its block size. */
int tg_cpu_quantize_row(uint32_t vec_dot_type, const float *x, void *y, int64_t k);

/* Batched matmul over a row range, for prefill and for thread pools that
 * split output rows:
 *   w    (nrows rows of ncols values of `type`, tg_row_size(type, ncols) bytes each)
 *   act  (nb rows of ncols values of tg_traits(type)->vec_dot_type,
 *         tg_row_size(vec_dot_type, ncols) bytes each)
 *   out  (nb rows of nrows floats): out[b * nrows + r] = dot(w[r], act[b])
 *        for r in [r0, r1); nothing else is written.
 * Each out value is one vec_dot call's result, so the bytes do not depend
 * on how rows are split between threads. type must have a vec_dot and ncols
 * a multiple of its block size (asserted: the model checks shapes at load). */
void tg_cpu_matmul(uint32_t type, const void *w, int64_t nrows, int64_t ncols,
                   const void *act, int64_t nb, float *out, int64_t r0, int64_t r1);
/* tg_cpu_matmul with nb = 1: out[r] = dot(w[r], act) for r in [r0, r1). */
void tg_cpu_gemv(uint32_t type, const void *w, int64_t nrows, int64_t ncols,
                 const void *act, float *out, int64_t r0, int64_t r1);

#endif
