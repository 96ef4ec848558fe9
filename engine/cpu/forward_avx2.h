/*
 * forward_avx2.h: the cpu tier's x86-64 helpers that follow llama.cpp's
 * CPU flash attention and swiglu operation for operation
 * (forward_avx2.c, built with AVX2, FMA and F16C). Call them only where
 * the kernels' runtime dispatch picked an AVX2 or AVX-512 tier
 * (forward_cpu.c's fa_simd); wide selects the AVX-512 (16-lane) order.
 */
#ifndef TG_CPU_FORWARD_AVX2_H
#define TG_CPU_FORWARD_AVX2_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

/* Returns x . y over n values, in ggml_vec_dot_f16's order. */
float tg_fa_dot_f16_avx2(int n, const tg_half *x, const tg_half *y, int wide);
/* s[j] = tg_fa_dot_f16_avx2(d, k_j, q, 0) * scale for j < n: k rows
 * `stride` values apart, d a multiple of 32 (q converted once). */
void tg_fa_scores_f16_avx2(int n, int d, const tg_half *k, size_t stride, const tg_half *q, float scale, float *s);
/* y (n) = f16(fma(x, a, y)): ggml_vec_mad_f16 into an F16 accumulator. */
void tg_fa_mad_f16_avx2(int n, tg_half *y, const tg_half *x, float a);
/* y (n) = f16(y * a): ggml_vec_scale_f16. */
void tg_fa_scale_f16_avx2(int n, tg_half *y, float a);
/* acc (d) = the V sum of a row's attention over n positions (attn.c's V
 * pass: rescale by ms[j] where not 1, then acc = f16(fma(v_j, w[j], acc)));
 * v rows `stride` values apart; d a multiple of 8. */
void tg_fa_vsum_f16_avx2(int n, int d, const tg_half *v, size_t stride, const float *w, const float *ms, float *acc);
/* ggml's vectorized expf, one element, as its AVX2 / AVX-512 forms round. */
float tg_ggml_expf_avx2(float x);
float tg_ggml_expf_avx512(float x);
/* g[r] = silu(g[r]) * u[r] for rows [r0, r1) of a row of n, as
 * ggml_vec_swiglu_f32 computes it (wide: the AVX-512 form), one element at
 * a time: the reference of the vector forms. */
void tg_swiglu_ggml_ref(int64_t r0, int64_t r1, int64_t n, float *g, const float *u, int wide);
/* One vector of a swiglu: g[i] = silu(g[i]) * u[i] for the 8 (AVX2) or
 * 16 (AVX-512) values at g, u. */
typedef void (*tg_swiglu_vec_fn)(float *g, const float *u);
/* tg_swiglu_ggml_ref's rows [r0, r1) through vec where whole vectors of
 * its width (wide: 16, else 8) fall, the others through the reference. */
void tg_swiglu_rows(int64_t r0, int64_t r1, int64_t n, float *g, const float *u, int wide, tg_swiglu_vec_fn vec);
/* tg_swiglu_ggml_ref with wide = 0, 8 lanes at a time (same bytes). */
void tg_swiglu_ggml_avx2(int64_t r0, int64_t r1, int64_t n, float *g, const float *u);

/* AVX-512 forms (forward_avx512.c; call only where the kernels' tier is
 * avx512vnni). Same bytes as the functions above with wide = 1:
 * s[j] = tg_fa_dot_f16_avx2(d, k_j, q, 1) * scale for j < n (k rows
 * `stride` values apart, d a multiple of 16); the V pass (d a multiple of
 * 16); swiglu. */
void tg_fa_scores_f16_avx512(int n, int d, const tg_half *k, size_t stride, const tg_half *q, float scale, float *s);
void tg_fa_vsum_f16_avx512(int n, int d, const tg_half *v, size_t stride, const float *w, const float *ms,
                           float *acc);
void tg_swiglu_ggml_avx512(int64_t r0, int64_t r1, int64_t n, float *g, const float *u);

#endif
