/*
 * forward_avx2.c: the cpu tier's attention and swiglu helpers for x86-64 with
 * AVX2, FMA and F16C (built with those flags, called only when the kernels'
 * runtime dispatch picked an AVX2 or AVX-512 tier). They follow the
 * arithmetic of llama.cpp's CPU flash attention with an F16 KV cache:
 *  - tg_fa_dot_f16_avx2: the q.k dot as ggml_vec_dot_f16 computes it on
 *    the same ISA: fused multiply-adds into four accumulators of 8 lanes
 *    (AVX2) or 16 lanes (AVX-512, emulated here lane for lane with pairs of
 *    AVX2 registers), the accumulators summed (0+2, 1+3, then 0+1), the
 *    lanes reduced in the order of the ISA's reduction, the tail in double;
 *  - tg_fa_mad_f16_avx2: y = f16(fma(x, a, y)) per element, the F16
 *    accumulator update of ggml_vec_mad_f16;
 *  - tg_fa_scale_f16_avx2: y = f16(y * a) per element (ggml_vec_scale_f16);
 *  - tg_fa_vsum_f16_avx2: the two above over a whole row's positions, the
 *    accumulator in registers (attn.c's V pass).
 * The element-wise two give the scalar code's bytes (forward_cpu.c); the
 * dot's order is the only thing that depends on `wide`. Declared in
 * forward_avx2.h.
 */
#include <immintrin.h>
#include <stdint.h>

#include "forward_avx2.h"

static inline __m256 ld(const tg_half *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Returns x . y over n values, in ggml_vec_dot_f16's order for 8-lane
 * (wide 0) or 16-lane (wide 1) vectors. */
float tg_fa_dot_f16_avx2(int n, const tg_half *x, const tg_half *y, int wide)
{
    double sumf;
    int i = 0;
    if (!wide) {
        __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (; i + 32 <= n; i += 32)
            for (int j = 0; j < 4; j++)
                s[j] = _mm256_fmadd_ps(ld(x + i + 8 * j), ld(y + i + 8 * j), s[j]);
        s[0] = _mm256_add_ps(s[0], s[2]);
        s[1] = _mm256_add_ps(s[1], s[3]);
        s[0] = _mm256_add_ps(s[0], s[1]);
        const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(s[0]), _mm256_extractf128_ps(s[0], 1));
        const __m128 t1 = _mm_hadd_ps(t0, t0);
        sumf = (double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    } else {
        // a 16-lane register as (lo, hi) = lanes 0-7, 8-15
        __m256 lo[4], hi[4];
        for (int j = 0; j < 4; j++)
            lo[j] = hi[j] = _mm256_setzero_ps();
        for (; i + 64 <= n; i += 64)
            for (int j = 0; j < 4; j++) {
                lo[j] = _mm256_fmadd_ps(ld(x + i + 16 * j), ld(y + i + 16 * j), lo[j]);
                hi[j] = _mm256_fmadd_ps(ld(x + i + 16 * j + 8), ld(y + i + 16 * j + 8), hi[j]);
            }
        lo[0] = _mm256_add_ps(lo[0], lo[2]);
        hi[0] = _mm256_add_ps(hi[0], hi[2]);
        lo[1] = _mm256_add_ps(lo[1], lo[3]);
        hi[1] = _mm256_add_ps(hi[1], hi[3]);
        lo[0] = _mm256_add_ps(lo[0], lo[1]);
        hi[0] = _mm256_add_ps(hi[0], hi[1]);
        // the 512-bit reduction: halves, quarters, then (0+2)+(1+3)
        const __m256 t3 = _mm256_add_ps(hi[0], lo[0]);
        const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
        const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
        float r[4];
        _mm_storeu_ps(r, t8);
        sumf = (double)(r[0] + r[1]);
    }
    for (; i < n; i++)
        sumf += (double)(tg_half_to_f32(x[i]) * tg_half_to_f32(y[i]));
    return (float)sumf;
}

/* Cache rows ahead of the one in use that tg_fa_scores_f16_avx2 prefetches
 * (as forward_avx512.c's passes). */
#define ROWS_AHEAD 8

/* s[j] = tg_fa_dot_f16_avx2(d, k_j, q, 0) * scale for j < n (k rows
 * `stride` values apart, d a multiple of 32): the same operations, q
 * converted to floats once for all the rows. */
void tg_fa_scores_f16_avx2(int n, int d, const tg_half *k, size_t stride, const tg_half *q, float scale, float *s)
{
    float qf[d];
    for (int i = 0; i < d; i += 8)
        _mm256_storeu_ps(qf + i, ld(q + i));
    for (int j = 0; j < n; j++) {
        const tg_half *kj = k + (size_t)j * stride;
        if (j + ROWS_AHEAD < n)
            for (int i = 0; i < d; i += 32)
                _mm_prefetch((const char *)(kj + ROWS_AHEAD * stride + i), _MM_HINT_T0);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < d; i += 32) {
            a0 = _mm256_fmadd_ps(ld(kj + i), _mm256_loadu_ps(qf + i), a0);
            a1 = _mm256_fmadd_ps(ld(kj + i + 8), _mm256_loadu_ps(qf + i + 8), a1);
            a2 = _mm256_fmadd_ps(ld(kj + i + 16), _mm256_loadu_ps(qf + i + 16), a2);
            a3 = _mm256_fmadd_ps(ld(kj + i + 24), _mm256_loadu_ps(qf + i + 24), a3);
        }
        a0 = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
        const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
        const __m128 t1 = _mm_hadd_ps(t0, t0);
        s[j] = (float)(double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1)) * scale;
    }
}

/* y (n, f16) = f16(fma(x, a, y)), x (n, f16). */
void tg_fa_mad_f16_avx2(int n, tg_half *y, const tg_half *x, float a)
{
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 r = _mm256_fmadd_ps(ld(x + i), va, ld(y + i));
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        y[i] = tg_f32_to_half(__builtin_fmaf(tg_half_to_f32(x[i]), a, tg_half_to_f32(y[i])));
}

/* y (n, f16) = f16(y * a). */
void tg_fa_scale_f16_avx2(int n, tg_half *y, float a)
{
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 r = _mm256_mul_ps(ld(y + i), va);
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        y[i] = tg_f32_to_half(tg_half_to_f32(y[i]) * a);
}

/* The V pass of a row's attention (attn.c): acc (d floats, f16 values) =
 * over positions j: f16(acc * ms[j]) where ms[j] != 1, then
 * f16(fma(v_j, w[j], acc)); d a multiple of 8. The accumulator stays in
 * registers, NT x 8 values at a time, rounded to f16 and back after each
 * update (the bytes of tg_fa_scale_f16_avx2 and tg_fa_mad_f16_avx2). */
static inline __attribute__((always_inline)) void vsum_tile(int n, const tg_half *v, size_t stride,
                                                            const float *w, const float *ms, float *acc,
                                                            const int NT)
{
    __m256 a[8];
    for (int t = 0; t < NT; t++)
        a[t] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        const tg_half *vj = v + (size_t)j * stride;
        if (ms[j] != 1.0f) {
            const __m256 m = _mm256_set1_ps(ms[j]);
            for (int t = 0; t < NT; t++)
                a[t] = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(a[t], m), _MM_FROUND_TO_NEAREST_INT));
        }
        const __m256 wj = _mm256_set1_ps(w[j]);
        for (int t = 0; t < NT; t++)
            a[t] = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_fmadd_ps(ld(vj + 8 * t), wj, a[t]), _MM_FROUND_TO_NEAREST_INT));
    }
    for (int t = 0; t < NT; t++)
        _mm256_storeu_ps(acc + 8 * t, a[t]);
}

void tg_fa_vsum_f16_avx2(int n, int d, const tg_half *v, size_t stride, const float *w, const float *ms, float *acc)
{
    int i = 0;
    for (; i + 64 <= d; i += 64)
        vsum_tile(n, v + i, stride, w, ms, acc + i, 8);
    for (; i < d; i += 8)
        vsum_tile(n, v + i, stride, w, ms, acc + i, 1);
}

/* --- swiglu ----------------------------------------------------------------
 * llama.cpp's CPU swiglu (ggml_vec_swiglu_f32) takes silu(x) = x / (1 +
 * e(-x)) with e a vectorized expf approximation (the Arm optimized-routines
 * algorithm: n = round(x / ln 2) through the 1.5 * 2^23 shift, a reduced
 * argument b = x - n ln 2 in two steps, a degree-5 polynomial, then the
 * scaling by 2^n), whose AVX2 and AVX-512 forms round differently; then
 * multiplies by the up projection. Elements past the last whole vector of
 * a row use libm's expf, as there. These helpers compute it one element at
 * a time with the same operations (fmaf is one FMA instruction here).
 */
/* Returns e(x) as the AVX2 form computes it. */
float tg_ggml_expf_avx2(float x)
{
    const float r = 0x1.8p23f;
    const float z = __builtin_fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = __builtin_fmaf(-n, 0x1.7f7d1cp-20f, __builtin_fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = tg_f32_bits(z) << 23;
    const float k = tg_bits_f32(e + tg_f32_bits(1.0f));
    const int c = __builtin_fabsf(n) > 126.0f;
    const float u = b * b;
    const float j = __builtin_fmaf(__builtin_fmaf(__builtin_fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                                  __builtin_fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                                   u, 0x1.ffffecp-1f * b);
    if (!c)
        return __builtin_fmaf(j, k, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = tg_bits_f32(g + 0x7f000000u);
    const float s2 = tg_bits_f32(e - g);
    if (__builtin_fabsf(n) > 192.0f)
        return s1 * s1;
    return __builtin_fmaf(s2, j, s2) * s1;
}

/* Returns e(x) as the AVX-512 form computes it. */
float tg_ggml_expf_avx512(float x)
{
    const float r = 0x1.8p23f;
    const float z = __builtin_fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = __builtin_fmaf(-n, 0x1.7f7d1cp-20f, __builtin_fmaf(-n, 0x1.62e4p-1f, x));
    if (__builtin_fabsf(n) > 192.0f)
        return n <= 0.0f ? 0.0f : __builtin_inff();
    const float u = b * b;
    const float j = __builtin_fmaf(__builtin_fmaf(__builtin_fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                                  __builtin_fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                                   u, __builtin_fmaf(0x1.ffffecp-1f, b, 1.0f));
    return __builtin_ldexpf(j, (int)n);   /* scalef: j * 2^n, rounded once */
}

/* g[r] = silu(g[r]) * u[r] for r in [r0, r1) of a row of n values, one
 * element at a time (the reference of the vector forms). */
void tg_swiglu_ggml_ref(int64_t r0, int64_t r1, int64_t n, float *g, const float *u, int wide)
{
    const int64_t w = wide ? 16 : 8, nv = n / w * w;
    for (int64_t i = r0; i < r1; i++) {
        const float x = g[i];
        const float ex = i < nv ? (wide ? tg_ggml_expf_avx512(0.0f - x) : tg_ggml_expf_avx2(0.0f - x))
                                : __builtin_expf(-x);
        g[i] = x / (1.0f + ex) * u[i];
    }
}

/* ggml_v_expf, AVX2 form: tg_ggml_expf_avx2 in 8 lanes, operation for
 * operation (the slow path only when a lane has |n| > 126, as ggml). */
static inline __m256 v_expf(__m256 x)
{
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 c = _mm256_cmp_ps(absn, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(c))
        return _mm256_fmadd_ps(j, k, k);
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 big = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 slow = _mm256_blendv_ps(_mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), _mm256_mul_ps(s1, s1), big);
    return _mm256_blendv_ps(_mm256_fmadd_ps(j, k, k), slow, c);
}

/* Rows [r0, r1) of a row of n through vec, w = 8 (wide 0) or 16 values
 * at a time where whole vectors of the row's first n / w * w values fall,
 * the others through tg_swiglu_ggml_ref: the same bytes as the reference
 * when vec computes its elements as it does. */
void tg_swiglu_rows(int64_t r0, int64_t r1, int64_t n, float *g, const float *u, int wide, tg_swiglu_vec_fn vec)
{
    const int64_t w = wide ? 16 : 8, nv = n / w * w;
    int64_t i = r0;
    for (; i < r1 && i % w; i++) tg_swiglu_ggml_ref(i, i + 1, n, g, u, wide);
    for (; i + w <= r1 && i + w <= nv; i += w) vec(g + i, u + i);
    tg_swiglu_ggml_ref(i, r1, n, g, u, wide);
}

/* g[0..8) = silu(g) * u, ggml's AVX2 expf. */
static void swiglu8(float *g, const float *u)
{
    const __m256 x = _mm256_loadu_ps(g);
    const __m256 ex = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_storeu_ps(g, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), ex)), _mm256_loadu_ps(u)));
}

void tg_swiglu_ggml_avx2(int64_t r0, int64_t r1, int64_t n, float *g, const float *u)
{
    tg_swiglu_rows(r0, r1, n, g, u, 0, swiglu8);
}
