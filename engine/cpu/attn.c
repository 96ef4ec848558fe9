/*
 * attn.c: one query row of the cpu tier's attention over an F16 KV cache
 * (attn.h): the reference, one position at a time, and the three-pass form
 * the tier runs, with its x86-64 passes in forward_avx2.c (AVX2, F16C) and
 * forward_avx512.c.
 */
#include "attn.h"

#include <math.h>

#include "kernels.h"
#if defined(__x86_64__)
#include "forward_avx2.h"
#endif

/* Returns k . q over d values in the dot order `order`. */
static float dot_f16(int order, int d, const tg_half *k, const tg_half *q)
{
#if defined(__x86_64__)
    if (order != TG_FA_PORTABLE)
        return tg_fa_dot_f16_avx2(d, k, q, order == TG_FA_AVX512);
#endif
    float s;
    tg_cpu_vec_dot(TG_TYPE_F16)(d, &s, k, q);
    return s;
}

/* acc (d, f16) = f16(fma(x, a, acc)): ggml_vec_mad_f16. */
static void mad_f16(int order, int d, tg_half *acc, const tg_half *x, float a)
{
#if defined(__x86_64__)
    if (order != TG_FA_PORTABLE) {
        tg_fa_mad_f16_avx2(d, acc, x, a);
        return;
    }
#endif
    for (int i = 0; i < d; i++)
        acc[i] = tg_f32_to_half(fmaf(tg_half_to_f32(x[i]), a, tg_half_to_f32(acc[i])));
}

/* acc (d, f16) = f16(acc * a): ggml_vec_scale_f16. */
static void scale_f16(int order, int d, tg_half *acc, float a)
{
#if defined(__x86_64__)
    if (order != TG_FA_PORTABLE) {
        tg_fa_scale_f16_avx2(d, acc, a);
        return;
    }
#endif
    for (int i = 0; i < d; i++)
        acc[i] = tg_f32_to_half(tg_half_to_f32(acc[i]) * a);
}

void tg_fa_row_f16_ref(int order, int n, int d, const tg_half *k, const tg_half *v, size_t stride,
                       const tg_half *q, float scale, tg_fa_hook_fn hook, void *hctx, float *out)
{
    tg_half acc[d];
    for (int i = 0; i < d; i++)
        acc[i] = 0;
    float S = 0.0f, M = -INFINITY;
    for (int j = 0; j < n; j++) {
        float sj = dot_f16(order, d, k + (size_t)j * stride, q) * scale;
        if (hook)
            sj = hook(hctx, j, sj);
        float ms = 1.0f, vs = 1.0f;
        if (sj > M) {
            // a new maximum: rescale what is summed so far, this weight is 1
            const float Mold = M;
            M = sj;
            ms = expf(Mold - M);
            scale_f16(order, d, acc, ms);
        } else {
            vs = expf(sj - M);
        }
        mad_f16(order, d, acc, v + (size_t)j * stride, vs);
        S = fmaf(S, ms, vs);
    }
    const float S_inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < d; i++)
        out[i] = tg_half_to_f32(acc[i]) * S_inv;
}

/* Pass 1: s[j] = (k_j . q) * scale, then the hook, for j in order. */
static void scores(int order, int n, int d, const tg_half *k, size_t stride, const tg_half *q, float scale,
                   tg_fa_hook_fn hook, void *hctx, float *s)
{
#if defined(__x86_64__)
    if (order == TG_FA_AVX512 && d % 16 == 0)
        tg_fa_scores_f16_avx512(n, d, k, stride, q, scale, s);
    else if (order == TG_FA_AVX2 && d % 32 == 0)
        tg_fa_scores_f16_avx2(n, d, k, stride, q, scale, s);
    else
#endif
        for (int j = 0; j < n; j++)
            s[j] = dot_f16(order, d, k + (size_t)j * stride, q) * scale;
    if (hook)
        for (int j = 0; j < n; j++)
            s[j] = hook(hctx, j, s[j]);
}

/* Pass 2: the online softmax over s[0..n-1] in order: w[j] the weight of
 * position j (may be s itself), ms[j] the factor the accumulator is
 * rescaled by before it (1 when none); returns the sum S. */
static float weights(int n, const float *s, float *w, float *ms)
{
    float S = 0.0f, M = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float sj = s[j];
        float m = 1.0f, vs = 1.0f;
        if (sj > M) {
            const float Mold = M;
            M = sj;
            m = expf(Mold - M);
        } else {
            vs = expf(sj - M);
        }
        S = fmaf(S, m, vs);
        ms[j] = m;
        w[j] = vs;
    }
    return S;
}

/* Pass 3 (portable): acc (d floats, each an f16 value) over the positions:
 * rescaled by ms[j] where that is not 1 (a rescale by exactly 1 leaves an
 * f16 value as it is), then acc = f16(fma(v_j, w[j], acc)). */
static void vsum(int n, int d, const tg_half *v, size_t stride, const float *w, const float *ms, float *acc)
{
    for (int i = 0; i < d; i++)
        acc[i] = 0.0f;
    for (int j = 0; j < n; j++) {
        const tg_half *vj = v + (size_t)j * stride;
        if (ms[j] != 1.0f)
            for (int i = 0; i < d; i++)
                acc[i] = tg_half_to_f32(tg_f32_to_half(acc[i] * ms[j]));
        for (int i = 0; i < d; i++)
            acc[i] = tg_half_to_f32(tg_f32_to_half(fmaf(tg_half_to_f32(vj[i]), w[j], acc[i])));
    }
}

void tg_fa_row_f16(int order, int n, int d, const tg_half *k, const tg_half *v, size_t stride,
                   const tg_half *q, float scale, tg_fa_hook_fn hook, void *hctx, float *scratch, float *out)
{
    float *w = scratch, *ms = scratch + n;
    scores(order, n, d, k, stride, q, scale, hook, hctx, w);
    const float S = weights(n, w, w, ms);
#if defined(__x86_64__)
    if (order == TG_FA_AVX512 && d % 16 == 0)
        tg_fa_vsum_f16_avx512(n, d, v, stride, w, ms, out);
    else if (order != TG_FA_PORTABLE && d % 8 == 0)
        tg_fa_vsum_f16_avx2(n, d, v, stride, w, ms, out);
    else
#endif
        vsum(n, d, v, stride, w, ms, out);
    const float S_inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < d; i++)
        out[i] *= S_inv;
}
