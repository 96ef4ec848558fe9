/*
 * forward_cpu_avx2.c: the cpu tier's attention helper for x86-64 with AVX2,
 * FMA and F16C (built with those flags, called only when the kernels'
 * runtime dispatch picked an AVX2 or AVX-512 tier). The scalar version is
 * in forward_cpu.c; both compute y[i] + a * x[i] per element in f32 with
 * the same rounding (one multiply, one add: no FMA contraction, so the
 * results are the scalar code's bytes).
 */
#include <immintrin.h>
#include <stdint.h>

#include "quant.h"

void tg_cpu_axpy_f16_avx2(int n, float *y, const tg_half *x, float a);

/* y (n) += a * x (n, f16). */
void tg_cpu_axpy_f16_avx2(int n, float *y, const tg_half *x, float a)
{
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        __m256 prod = _mm256_mul_ps(va, xv);
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), prod));
    }
    for (; i < n; i++) {
        float prod = a * tg_half_to_f32(x[i]);
        y[i] = y[i] + prod;
    }
}
