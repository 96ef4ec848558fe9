/*
 * attn.h: one query row of the cpu tier's attention over an F16 KV cache,
 * as llama.cpp's CPU flash attention computes it (forward_cpu.c, "attention
 * as llama.cpp's CPU flash attention", says what that is):
 *
 *   s_j = (k_j . q) * scale, then the score hook, for j = 0..n-1 in order;
 *   an online softmax over the s_j in order: on a new maximum M the F16
 *   accumulator is rescaled, acc = f16(acc * expf(Mold - M)), and the
 *   position's weight is 1, else its weight is w_j = expf(s_j - M);
 *   acc = f16(fma(v_j, w_j, acc)) element by element; S = fmaf(S, ms, w_j);
 *   out = acc * (1 / S) (0 when S is 0).
 *
 * The dot's order follows the kernels' ISA (`order`, below); the rest is
 * element-wise and gives the same bytes in every implementation.
 *
 * tg_fa_row_f16_ref is the reference: one position at a time, as written
 * above. tg_fa_row_f16 gives the same bytes in three passes: every score
 * (batched dots), then the softmax weights (scalar, libm expf), then the V
 * sum with the accumulator held in registers (x86-64: AVX2 or AVX-512).
 * test_kernels checks that the two agree bit for bit.
 */
#ifndef TG_CPU_ATTN_H
#define TG_CPU_ATTN_H

#include <stddef.h>

#include "quant.h"

/* The order of the q.k dot: the kernels' F16 vec_dot (portable), or
 * ggml_vec_dot_f16's order on x86-64 with 8 lanes (AVX2) or 16 lanes
 * (AVX-512). */
enum { TG_FA_PORTABLE = 0, TG_FA_AVX2 = 1, TG_FA_AVX512 = 2 };

/* The score hook: returns the score the row goes on with for position j
 * (s: the computed one). NULL: none. */
typedef float (*tg_fa_hook_fn)(void *ctx, int j, float s);

/* out (d floats) = the attention of q over positions 0..n-1:
 *   q    (d, f16): the query, already rounded to f16;
 *   k, v (n rows of d f16 values, `stride` values apart): the cache rows;
 *   hook, hctx: the score hook (hook may be NULL).
 * order TG_FA_AVX2 / TG_FA_AVX512 only where the CPU has that ISA. */
void tg_fa_row_f16_ref(int order, int n, int d, const tg_half *k, const tg_half *v, size_t stride,
                       const tg_half *q, float scale, tg_fa_hook_fn hook, void *hctx, float *out);

/* The same bytes as tg_fa_row_f16_ref; scratch: 2 * n floats. */
void tg_fa_row_f16(int order, int n, int d, const tg_half *k, const tg_half *v, size_t stride,
                   const tg_half *q, float scale, tg_fa_hook_fn hook, void *hctx, float *scratch, float *out);

#endif
