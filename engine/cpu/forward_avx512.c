/*
 * forward_avx512.c: the cpu tier's attention and swiglu helpers in native
 * AVX-512 (built with the avx512 flags, called only where the kernels'
 * tier is avx512vnni). Each gives the bytes of its AVX2 form in
 * forward_avx2.c with wide = 1, which emulates ggml's 16-lane order with
 * pairs of 8-lane registers; here one register is the 16 lanes:
 *  - tg_fa_scores_f16_avx512: the q.k dots of a row's positions in
 *    ggml_vec_dot_f16's AVX-512 order, q converted once for all of them;
 *  - tg_fa_vsum_f16_avx512: the V pass with the F16 accumulator in
 *    registers;
 *  - tg_swiglu_ggml_avx512: ggml_vec_swiglu_f32 with ggml's AVX-512 expf.
 * Declared in forward_avx2.h.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "forward_avx2.h"

#define F512_INLINE static inline __attribute__((always_inline))

/* Cache rows ahead of the one in use that the passes prefetch (decode
 * reads the cache from memory: the passes of a 160-position row measured
 * 8% faster at 2 threads with it; further ahead gave no more). */
#define ROWS_AHEAD 8

/* Prefetches the d f16 values at p. */
F512_INLINE void prefetch_row(const tg_half *p, int d)
{
    for (int i = 0; i < d; i += 32)
        _mm_prefetch((const char *)(p + i), _MM_HINT_T0);
}

F512_INLINE __m512 ld16(const tg_half *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* The sum of four 16-lane accumulators in tg_fa_dot_f16_avx2's order:
 * (0+2) + (1+3), then the 16 lanes by halves, quarters, then (0+2) + (1+3). */
F512_INLINE float sum4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    a0 = _mm512_add_ps(a0, a2);
    a1 = _mm512_add_ps(a1, a3);
    a0 = _mm512_add_ps(a0, a1);
    const __m256 t3 = _mm256_add_ps(_mm512_extractf32x8_ps(a0, 1), _mm512_castps512_ps256(a0));
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_movehdup_ps(t8));
}

/* Returns the dot of k (d f16) and qf (q as floats) as tg_fa_dot_f16_avx2
 * computes it with wide = 1: four 16-lane accumulators over steps of 64,
 * summed (0+2, 1+3, then 0+1), the 16 lanes reduced by halves, quarters,
 * then (0+2) + (1+3); the tail in double. */
F512_INLINE float dot16(int d, const tg_half *k, const float *qf, const tg_half *q)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 64 <= d; i += 64) {
        a0 = _mm512_fmadd_ps(ld16(k + i), _mm512_loadu_ps(qf + i), a0);
        a1 = _mm512_fmadd_ps(ld16(k + i + 16), _mm512_loadu_ps(qf + i + 16), a1);
        a2 = _mm512_fmadd_ps(ld16(k + i + 32), _mm512_loadu_ps(qf + i + 32), a2);
        a3 = _mm512_fmadd_ps(ld16(k + i + 48), _mm512_loadu_ps(qf + i + 48), a3);
    }
    double sumf = (double)sum4x16(a0, a1, a2, a3);
    for (; i < d; i++)
        sumf += (double)(_cvtsh_ss(k[i]) * _cvtsh_ss(q[i]));
    return (float)sumf;
}

void tg_fa_scores_f16_avx512(int n, int d, const tg_half *k, size_t stride, const tg_half *q, float scale, float *s)
{
    float qf[d];
    for (int i = 0; i < d; i += 16)
        _mm512_storeu_ps(qf + i, ld16(q + i));
    if (d == 128) {
        /* the common head size: q in registers */
        const __m512 q0 = _mm512_loadu_ps(qf), q1 = _mm512_loadu_ps(qf + 16), q2 = _mm512_loadu_ps(qf + 32),
                     q3 = _mm512_loadu_ps(qf + 48), q4 = _mm512_loadu_ps(qf + 64), q5 = _mm512_loadu_ps(qf + 80),
                     q6 = _mm512_loadu_ps(qf + 96), q7 = _mm512_loadu_ps(qf + 112);
        for (int j = 0; j < n; j++) {
            const tg_half *kj = k + (size_t)j * stride;
            if (j + ROWS_AHEAD < n) prefetch_row(kj + ROWS_AHEAD * stride, 128);
            __m512 a0 = _mm512_fmadd_ps(ld16(kj), q0, _mm512_setzero_ps());
            __m512 a1 = _mm512_fmadd_ps(ld16(kj + 16), q1, _mm512_setzero_ps());
            __m512 a2 = _mm512_fmadd_ps(ld16(kj + 32), q2, _mm512_setzero_ps());
            __m512 a3 = _mm512_fmadd_ps(ld16(kj + 48), q3, _mm512_setzero_ps());
            a0 = _mm512_fmadd_ps(ld16(kj + 64), q4, a0);
            a1 = _mm512_fmadd_ps(ld16(kj + 80), q5, a1);
            a2 = _mm512_fmadd_ps(ld16(kj + 96), q6, a2);
            a3 = _mm512_fmadd_ps(ld16(kj + 112), q7, a3);
            s[j] = (float)(double)sum4x16(a0, a1, a2, a3) * scale;
        }
        return;
    }
    for (int j = 0; j < n; j++) {
        if (j + ROWS_AHEAD < n) prefetch_row(k + (size_t)(j + ROWS_AHEAD) * stride, d);
        s[j] = dot16(d, k + (size_t)j * stride, qf, q) * scale;
    }
}

/* The V pass over NT x 16 values of the row (see tg_fa_vsum_f16_avx2). */
F512_INLINE void vsum_tile(int n, const tg_half *v, size_t stride, const float *w, const float *ms, float *acc,
                           const int NT)
{
    __m512 a[8];
    for (int t = 0; t < NT; t++)
        a[t] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const tg_half *vj = v + (size_t)j * stride;
        if (j + ROWS_AHEAD < n) prefetch_row(vj + ROWS_AHEAD * stride, 16 * NT);
        if (ms[j] != 1.0f) {
            const __m512 m = _mm512_set1_ps(ms[j]);
            for (int t = 0; t < NT; t++)
                a[t] = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(a[t], m), _MM_FROUND_TO_NEAREST_INT));
        }
        const __m512 wj = _mm512_set1_ps(w[j]);
        for (int t = 0; t < NT; t++)
            a[t] = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_fmadd_ps(ld16(vj + 16 * t), wj, a[t]),
                                                   _MM_FROUND_TO_NEAREST_INT));
    }
    for (int t = 0; t < NT; t++)
        _mm512_storeu_ps(acc + 16 * t, a[t]);
}

void tg_fa_vsum_f16_avx512(int n, int d, const tg_half *v, size_t stride, const float *w, const float *ms,
                           float *acc)
{
    int i = 0;
    for (; i + 128 <= d; i += 128)
        vsum_tile(n, v + i, stride, w, ms, acc + i, 8);
    for (; i < d; i += 16)
        vsum_tile(n, v + i, stride, w, ms, acc + i, 1);
}

/* ggml_v_expf, AVX-512 form (tg_ggml_expf_avx512 one lane at a time). */
F512_INLINE __m512 v_expf(__m512 x)
{
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    if (!big)
        return res;
    const __m512 zero = _mm512_setzero_ps();
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, zero, _CMP_LE_OQ), _mm512_set1_ps(INFINITY), zero);
    return _mm512_mask_blend_ps(big, res, alt);
}

/* g[0..16) = silu(g) * u, ggml's AVX-512 expf. */
static void swiglu16(float *g, const float *u)
{
    const __m512 x = _mm512_loadu_ps(g);
    const __m512 ex = v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_storeu_ps(g, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), ex)), _mm512_loadu_ps(u)));
}

void tg_swiglu_ggml_avx512(int64_t r0, int64_t r1, int64_t n, float *g, const float *u)
{
    tg_swiglu_rows(r0, r1, n, g, u, 1, swiglu16);
}
