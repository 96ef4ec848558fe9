/*
 * quant.c: the scalar reference of every tensor type the engine handles:
 * IEEE half and bfloat16 conversions, dequantize (to_float), quantize
 * (from_float) and dot product (vec_dot) for F32, F16, BF16, Q8_0, Q8_1,
 * Q4_K, Q5_K, Q6_K and Q8_K, and the per-type trait table.
 *
 * These functions are the oracle for the SIMD kernels (engine/cpu/) and
 * the GPU kernels: they favour plain code over speed. Two families:
 *
 * - Activation quantizers (Q8_0, Q8_1, Q8_K) reproduce ggml's reference
 *   bytes exactly (docs/formats.md), because llama.cpp's CPU backend quantizes
 *   every activation row with them before an integer dot product.
 * - Weight quantizers (Q4_K, Q5_K, Q6_K) search per sub-block scales and
 *   mins by weighted least squares; they write test models, so they need to
 *   be good, not byte-identical to llama-quantize. Their scale search is
 *   the one place that trades plainness for speed (tg-mkmodel spends its
 *   time there): tg_traits gives the vector search of quant_fast.c, which
 *   writes the same bytes as the scalar reference here, the oracle
 *   (tg_from_float_ref, quant_ref.h; tests/test_quant.c holds them equal).
 *   The pieces both searches share are inline in quant_kq.h.
 *
 * The vec_dots compute what ggml-cpu's generic code computes: integer dot
 * products per sub-block, scaled by integer sub-block scales, accumulated
 * per super-block in int32, then scaled by d (and dmin) in float. F16, BF16
 * and F32 dots accumulate in double, as ggml's scalar fallback does.
 *
 * Row lengths passed to the row kernels must be a multiple of the type's
 * block size (an internal invariant: callers check shapes from files
 * first, tg_row_size() returns 0 for a bad length).
 */
#include "quant.h"
#include "quant_ref.h"

/* The reference rounds every product and sum separately on every target:
 * no multiply-add contraction (GCC contracts by default on aarch64, which
 * would move dequantized values and dots by an ulp from ggml's). The
 * vector scale search of quant_fast.c, which must write this file's bytes,
 * is built the same way (and the Makefile passes -ffp-contract=off to
 * both). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#else
#pragma STDC FP_CONTRACT OFF
#endif

#include <assert.h>
#include <math.h>
#include <string.h>

#include "quant_kq.h"   /* after the pragma: its inline helpers are built without contraction too */

/* ---------------------------------------------------------------- halves */

/* Returns the f32 value of half h (exact: every half is a float). */
float tg_half_to_f32(tg_half h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return tg_bits_f32(sign | 0x7f800000u | (mant << 13));
    return tg_bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Returns f rounded to the nearest half, ties to even; overflow gives inf,
 * NaN stays NaN (quiet, payload truncated to its top 9 bits), as the F16C
 * and NEON conversion instructions do. */
tg_half tg_f32_to_half(float f)
{
    uint32_t x = tg_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | ((ax >> 13) & 0x3ff);
    if (ax >= 0x477ff000u) return sign | 0x7c00;   /* >= 65520: inf */
    if (ax >= 0x38800000u) {                       /* normal half */
        uint32_t v = ax - 0x38000000u;             /* rebias 127 -> 15 */
        v += 0xfffu + ((v >> 13) & 1);             /* round to nearest even */
        return sign | (uint16_t)(v >> 13);         /* a carry bumps the exponent */
    }
    if (ax <= 0x33000000u) return sign;            /* <= 2^-25: rounds to 0 */
    /* subnormal half: the value in units of 2^-24 */
    uint32_t e = ax >> 23;                         /* 102 .. 112 */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                      /* 14 .. 24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;                     /* 0x400 is the smallest normal */
}

/* Returns the f32 value of bfloat16 h (exact). */
float tg_bf16_to_f32(tg_bf16 h)
{
    return tg_bits_f32((uint32_t)h << 16);
}

/* Returns f rounded to the nearest bfloat16, ties to even; NaN stays a
 * quiet NaN (ggml's rule: top 16 bits with the quiet bit set). */
tg_bf16 tg_f32_to_bf16(float f)
{
    uint32_t x = tg_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (tg_bf16)((x >> 16) | 0x40);
    return (tg_bf16)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* -------------------------------------------------------- F32, F16, BF16 */

static void f32_to_float(const void *x, float *y, int64_t k)
{
    memcpy(y, x, (size_t)k * sizeof(float));
}

static void f32_from_float(const float *x, void *y, int64_t k)
{
    memcpy(y, x, (size_t)k * sizeof(float));
}

static void f32_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    const float *x = vx, *y = vy;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (double)x[i] * (double)y[i];
    *s = (float)sum;
}

static void f16_to_float(const void *vx, float *y, int64_t k)
{
    const tg_half *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = tg_half_to_f32(x[i]);
}

static void f16_from_float(const float *x, void *vy, int64_t k)
{
    tg_half *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = tg_f32_to_half(x[i]);
}

static void f16_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    const tg_half *x = vx, *y = vy;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += (double)tg_half_to_f32(x[i]) * (double)tg_half_to_f32(y[i]);
    *s = (float)sum;
}

static void bf16_to_float(const void *vx, float *y, int64_t k)
{
    const tg_bf16 *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = tg_bf16_to_f32(x[i]);
}

static void bf16_from_float(const float *x, void *vy, int64_t k)
{
    tg_bf16 *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = tg_f32_to_bf16(x[i]);
}

static void bf16_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    const tg_bf16 *x = vx, *y = vy;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += (double)tg_bf16_to_f32(x[i]) * (double)tg_bf16_to_f32(y[i]);
    *s = (float)sum;
}

/* ------------------------------------------------------------ Q4_0, Q5_0 */

/* The value of largest magnitude in x[0..n), with its sign (the first of
 * them): ggml's reference quantizers scale by it. */
static float signed_amax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

/* Q4_0 as ggml's reference: d = max / -8 (max the signed value of largest
 * magnitude), q = min(15, (int8)(x / d + 8.5)), x / d computed as x * (1/d). */
static void q4_0_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK4_0 == 0);
    block_q4_0 *y = vy;
    for (int64_t i = 0; i < k / QK4_0; i++, x += QK4_0) {
        const float d = signed_amax(x, QK4_0) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tg_f32_to_half(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int8_t q0 = (int8_t)(x[j] * id + 8.5f), q1 = (int8_t)(x[QK4_0 / 2 + j] * id + 8.5f);
            const uint8_t x0 = (uint8_t)(q0 < 15 ? q0 : 15), x1 = (uint8_t)(q1 < 15 ? q1 : 15);
            y[i].qs[j] = (uint8_t)(x0 | (x1 << 4));
        }
    }
}

static void q4_0_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK4_0 == 0);
    const block_q4_0 *x = vx;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const float d = tg_half_to_f32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* Against Q8_0: per block the int32 sum of (q - 8) * qy, then sumf +=
 * sumi * dx * dy (left to right), as ggml's generic dot. */
static void q4_0_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK4_0 == 0);
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK4_0; i++) {
        int32_t s0 = 0, s1 = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            s0 += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
            s1 += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK4_0 / 2];
        }
        sumf += (float)(s0 + s1) * tg_half_to_f32(x[i].d) * tg_half_to_f32(y[i].d);
    }
    *s = sumf;
}

/* Q5_0 as ggml's reference: d = max / -16, q = min(31, (int8)(x / d +
 * 16.5)), bit 4 of each q into qh. */
static void q5_0_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK5_0 == 0);
    block_q5_0 *y = vy;
    for (int64_t i = 0; i < k / QK5_0; i++, x += QK5_0) {
        const float d = signed_amax(x, QK5_0) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tg_f32_to_half(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int8_t q0 = (int8_t)(x[j] * id + 16.5f), q1 = (int8_t)(x[QK5_0 / 2 + j] * id + 16.5f);
            const uint8_t x0 = (uint8_t)(q0 < 31 ? q0 : 31), x1 = (uint8_t)(q1 < 31 ? q1 : 31);
            y[i].qs[j] = (uint8_t)((x0 & 0x0F) | ((x1 & 0x0F) << 4));
            qh |= (uint32_t)((x0 & 0x10u) >> 4) << j;
            qh |= (uint32_t)((x1 & 0x10u) >> 4) << (j + QK5_0 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

/* Value j of a Q5_0 block as its 5-bit code minus 16. */
static inline int q5_0_code(const block_q5_0 *b, uint32_t qh, int j)
{
    const int lo = j < QK5_0 / 2 ? b->qs[j] & 0x0F : b->qs[j - QK5_0 / 2] >> 4;
    return (lo | (int)(((qh >> j) & 1u) << 4)) - 16;
}

static void q5_0_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK5_0 == 0);
    const block_q5_0 *x = vx;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const float d = tg_half_to_f32(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < QK5_0; j++) y[j] = (float)q5_0_code(&x[i], qh, j) * d;
    }
}

/* Against Q8_0: per block the int32 sum of (q - 16) * qy, then sumf +=
 * (dx * dy) * sumi, as ggml's generic dot (its order differs from Q4_0's). */
static void q5_0_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK5_0 == 0);
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK5_0; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        int32_t s0 = 0, s1 = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) << 4) & 0x10;    /* bit j, as the code's bit 4 */
            const int h1 = (int)(qh >> (j + 12)) & 0x10;    /* bit j + 16 */
            s0 += (((x[i].qs[j] & 0x0F) | h0) - 16) * y[i].qs[j];
            s1 += (((x[i].qs[j] >> 4) | h1) - 16) * y[i].qs[j + QK5_0 / 2];
        }
        sumf += (tg_half_to_f32(x[i].d) * tg_half_to_f32(y[i].d)) * (float)(s0 + s1);
    }
    *s = sumf;
}

/* ------------------------------------------------------------ Q4_1, Q5_1 */

/* The smallest and largest of x[0..n). */
static void min_max(const float *x, int n, float *mn, float *mx)
{
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo, *mx = hi;
}

/* Q4_1 as ggml's reference: m = min, d = (max - min) / 15, q = min(15,
 * (int8)((x - m) * (1/d) + 0.5)). */
static void q4_1_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK4_1 == 0);
    block_q4_1 *y = vy;
    for (int64_t i = 0; i < k / QK4_1; i++, x += QK4_1) {
        float mn, mx;
        min_max(x, QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tg_f32_to_half(d);
        y[i].m = tg_f32_to_half(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int8_t q0 = (int8_t)((x[j] - mn) * id + 0.5f), q1 = (int8_t)((x[QK4_1 / 2 + j] - mn) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | ((q1 < 15 ? q1 : 15) << 4));
        }
    }
}

static void q4_1_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK4_1 == 0);
    const block_q4_1 *x = vx;
    for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
        const float d = tg_half_to_f32(x[i].d), m = tg_half_to_f32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* Against Q8_1, as ggml's generic dot: per block sumf += (dx * dy) * sumi
 * + m * s, s the activation block's stored half(d * sum(q)). */
static void q4_1_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK4_1 == 0);
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK4_1; i++) {
        int32_t s0 = 0, s1 = 0;
        for (int j = 0; j < QK4_1 / 2; j++) {
            s0 += (x[i].qs[j] & 0x0F) * y[i].qs[j];
            s1 += (x[i].qs[j] >> 4) * y[i].qs[j + QK4_1 / 2];
        }
        sumf += (tg_half_to_f32(x[i].d) * tg_half_to_f32(y[i].d)) * (float)(s0 + s1) +
                tg_half_to_f32(x[i].m) * tg_half_to_f32(y[i].s);
    }
    *s = sumf;
}

/* Q5_1 as ggml's reference: m = min, d = (max - min) / 31, q =
 * (uint8)((x - m) * (1/d) + 0.5), bit 4 of each q into qh. */
static void q5_1_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK5_1 == 0);
    block_q5_1 *y = vy;
    for (int64_t i = 0; i < k / QK5_1; i++, x += QK5_1) {
        float mn, mx;
        min_max(x, QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tg_f32_to_half(d);
        y[i].m = tg_f32_to_half(mn);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const uint8_t x0 = (uint8_t)((x[j] - mn) * id + 0.5f), x1 = (uint8_t)((x[QK5_1 / 2 + j] - mn) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((x0 & 0x0F) | ((x1 & 0x0F) << 4));
            qh |= (uint32_t)((x0 & 0x10u) >> 4) << j;
            qh |= (uint32_t)((x1 & 0x10u) >> 4) << (j + QK5_1 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

static void q5_1_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK5_1 == 0);
    const block_q5_1 *x = vx;
    for (int64_t i = 0; i < k / QK5_1; i++, y += QK5_1) {
        const float d = tg_half_to_f32(x[i].d), m = tg_half_to_f32(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            y[j] = (float)((x[i].qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) * d + m;
            y[j + QK5_1 / 2] = (float)((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) * d + m;
        }
    }
}

/* Against Q8_1, as Q4_1's with the fifth bits. */
static void q5_1_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK5_1 == 0);
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK5_1; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        int32_t s0 = 0, s1 = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) << 4) & 0x10, h1 = (int)(qh >> (j + 12)) & 0x10;
            s0 += ((x[i].qs[j] & 0x0F) | h0) * y[i].qs[j];
            s1 += ((x[i].qs[j] >> 4) | h1) * y[i].qs[j + QK5_1 / 2];
        }
        sumf += (tg_half_to_f32(x[i].d) * tg_half_to_f32(y[i].d)) * (float)(s0 + s1) +
                tg_half_to_f32(x[i].m) * tg_half_to_f32(y[i].s);
    }
    *s = sumf;
}

/* ------------------------------------------------------------ Q8_0, Q8_1 */

/* Q8_0 as ggml's reference: d = amax/127 (stored as half), q = roundf(x/d)
 * computed as x * (1/d), halves away from zero. */
static void q8_0_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK8_0 == 0);
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        float amax = 0;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = tg_f32_to_half(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void q8_0_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK8_0 == 0);
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < k / QK8_0; i++) {
        const float d = tg_half_to_f32(x[i].d);
        for (int j = 0; j < QK8_0; j++) *y++ = d * x[i].qs[j];
    }
}

/* Per block: the int32 sum of products, times (dx * dy), summed in float. */
static void q8_0_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK8_0 == 0);
    const block_q8_0 *x = vx, *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK8_0; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sumf += (float)sumi * (tg_half_to_f32(x[i].d) * tg_half_to_f32(y[i].d));
    }
    *s = sumf;
}

/* Q8_1 as ggml's reference: Q8_0's d and q, plus s = half(sum(q) * d). */
static void q8_1_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK8_0 == 0);
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        float amax = 0;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_0; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = tg_f32_to_half(d);
        y[i].s = tg_f32_to_half((float)sum * d);
    }
}

static void q8_1_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK8_0 == 0);
    const block_q8_1 *x = vx;
    for (int64_t i = 0; i < k / QK8_0; i++) {
        const float d = tg_half_to_f32(x[i].d);
        for (int j = 0; j < QK8_0; j++) *y++ = d * x[i].qs[j];
    }
}

/* ------------------------------------------------------------------ Q8_K */

/* ggml's reference: max = the first element of largest magnitude (signed),
 * iscale = -127/max, q = min(127, nearest-even(iscale * x)), d = 1/iscale,
 * bsums = sums of each 16 quants; an all-zero block gets d = 0. */
static void q8_K_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK_K == 0);
    block_q8_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = round_even(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

static void q8_K_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK_K == 0);
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++)
        for (int j = 0; j < QK_K; j++) *y++ = x[i].d * x[i].qs[j];
}

/* ---------------------------------------------- K-quant scale search
 * The scalar reference searches; their shared pieces are in quant_kq.h,
 * the vector searches that write the same bytes in quant_fast.c. */

/* Fits x[i] ~ a * L[i] + b, L[i] in [0, nmax], b <= 0, minimizing the
 * weighted squared error sum w[i] (a L[i] + b - x[i])^2 over n (even,
 * <= 32) values. Candidate grids: L = round((x - min) * t / (max - min))
 * for t from nmax - 1 to nmax + 2 in steps of 0.1; for each grid the best
 * (a, b) is the weighted least-squares solution (b clamped to 0 when it
 * comes out positive); the best grid is then refined by re-rounding
 * against its (a, b) while the error falls. Writes the chosen L and
 * returns a; *mn receives -b (>= 0). */
static float fit_scale_min(int n, int nmax, const float *x, const float *w,
                           uint8_t *L, float *mn)
{
    assert(n <= 32 && n % 2 == 0);
    float lo, hi;
    double sw, swx, swxx;
    fit_stats(n, x, w, &lo, &hi, &sw, &swx, &swxx);
    if (hi <= lo) {                     /* constant non-positive block */
        memset(L, 0, (size_t)n);
        *mn = -lo;
        return 0;
    }
    uint8_t cand[32];
    double best_err = INFINITY;
    float best_a = (hi - lo) / nmax, best_b = lo;
    grid_asym(n, nmax, x, w, lo, 1 / best_a, L);
    for (int step = -10; step <= 20; step++) {
        /* step 0 is plain min/max; the others stretch or shrink the grid */
        const float iscale = (nmax + 0.1f * step) / (hi - lo);
        const grid_sums g = grid_asym(n, nmax, x, w, lo, iscale, cand);
        float a, b;
        double err;
        if (grid_fit(g, sw, swx, swxx, &a, &b, &err) == 0 && err < best_err) {
            best_err = err;
            best_a = a;
            best_b = b;
            memcpy(L, cand, (size_t)n);
        }
    }
    refine_asym(n, nmax, x, w, sw, swx, swxx, best_err, &best_a, &best_b, L);
    *mn = -best_b;
    return best_a;
}

/* Fits x[i] ~ a * L[i], L[i] in [-nmax, nmax - 1], minimizing
 * sum w[i] (a L[i] - x[i])^2 over n (even, <= 32) values. Candidate grids
 * map the element of largest magnitude to around -nmax (the range is
 * asymmetric, so that side gets the extra level); with the least-squares
 * a = SwLx / SwL2 of a grid, its error is Swxx - SwLx^2 / SwL2, so the best
 * grid maximizes SwLx^2 / SwL2. Writes L + nmax (0 .. 2 nmax - 1) and
 * returns a (0 for an all-zero block). */
static float fit_scale_sym(int n, int nmax, const float *x, const float *w, uint8_t *L)
{
    assert(n <= 32 && n % 2 == 0);
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax == 0) {
        memset(L, nmax, (size_t)n);
        return 0;
    }
    uint8_t cand[32];
    double best_score = -1;
    float best_a = 0;
    for (int step = -12; step <= 12; step++) {
        const float iscale = -(nmax + 0.1f * step) / max;
        float b0 = 0, b1 = 0, c0 = 0, c1 = 0;
        for (int i = 0; i < n; i += 2) {
            const int l0 = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
            const int l1 = clampi(round_even(iscale * x[i + 1]), -nmax, nmax - 1);
            cand[i] = (uint8_t)(l0 + nmax);
            cand[i + 1] = (uint8_t)(l1 + nmax);
            const float wl0 = w[i] * l0, wl1 = w[i + 1] * l1;
            b0 += wl0 * l0;
            b1 += wl1 * l1;
            c0 += wl0 * x[i];
            c1 += wl1 * x[i + 1];
        }
        const double swl2 = (double)b0 + b1, swlx = (double)c0 + c1;
        if (swl2 <= 0) continue;
        const double score = swlx * swlx / swl2;
        if (score > best_score) {
            best_score = score;
            best_a = (float)(swlx / swl2);
            memcpy(L, cand, (size_t)n);
        }
    }
    return best_a;
}

/* Importance weights of a sub-block: the sub-block's rms plus |x| (large
 * values matter more, small ones still count). */
static void kquant_weights(const float *x, int n, float rms, float *w)
{
    for (int i = 0; i < n; i++) w[i] = rms + fabsf(x[i]);
}

static float block_rms(const float *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    return (float)sqrt(s / n);
}



/* Packs eight 6-bit scales and mins into the 12-byte Q4_K/Q5_K layout. */
static void pack_scale_min_k4(const uint8_t *sc, const uint8_t *m, uint8_t *q)
{
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

/* Shared Q4_K / Q5_K super-block quantizer: 8 sub-blocks of 32 with values
 * L in [0, nmax]; writes d, dmin, the packed scales and Lout[256]. fast
 * selects the vector search and final quants (same bytes) over the scalar
 * reference. */
static void kquant_asym_block(const float *x, int nmax, tg_half *d_out, tg_half *dmin_out,
                              uint8_t *scales_out, uint8_t *Lout, int fast)
{
    float w[32], a[8], mn[8];
    float max_a = 0, max_mn = 0;
    for (int j = 0; j < 8; j++) {
        kquant_weights(x + 32 * j, 32, block_rms(x + 32 * j, 32), w);
        if (fast)
            a[j] = tg_kq_fit_min_fast(32, nmax, x + 32 * j, w, &mn[j]);
        else
            a[j] = fit_scale_min(32, nmax, x + 32 * j, w, Lout + 32 * j, &mn[j]);
        max_a = fmaxf(max_a, a[j]);
        max_mn = fmaxf(max_mn, mn[j]);
    }
    /* 6-bit scales and mins relative to the super-block's d and dmin */
    uint8_t sc[8], m[8];
    const float inv_a = max_a > 0 ? 63.0f / max_a : 0;
    const float inv_m = max_mn > 0 ? 63.0f / max_mn : 0;
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)clampi(round_even(inv_a * a[j]), 0, 63);
        m[j] = (uint8_t)clampi(round_even(inv_m * mn[j]), 0, 63);
    }
    *d_out = tg_f32_to_half(max_a / 63.0f);
    *dmin_out = tg_f32_to_half(max_mn / 63.0f);
    pack_scale_min_k4(sc, m, scales_out);
    /* final quants against the stored (rounded) scales */
    const float d = tg_half_to_f32(*d_out), dmin = tg_half_to_f32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        const float ds = d * sc[j], dm = dmin * m[j];
        if (fast) {
            if (ds > 0) tg_kq_quant_div(32, x + 32 * j, dm, ds, 0, nmax, 0, Lout + 32 * j);
            else memset(Lout + 32 * j, 0, 32);
            continue;
        }
        for (int i = 0; i < 32; i++) {
            int l = ds > 0 ? round_even((x[32 * j + i] + dm) / ds) : 0;
            Lout[32 * j + i] = (uint8_t)clampi(l, 0, nmax);
        }
    }
}

/* ------------------------------------------------------------ Q2_K, Q3_K */

/* The 2-bit fields of a Q2_K/Q3_K block's qs as L[256] (value order). */
static void k2_unpack(const uint8_t *qs, uint8_t *L)
{
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) L[128 * h + 32 * k + l] = (qs[32 * h + l] >> (2 * k)) & 3;
}

/* L[256] (each 0..3) into a Q2_K/Q3_K block's qs. */
static void k2_pack(const uint8_t *L, uint8_t *qs)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *Lh = L + 128 * h;
            qs[32 * h + l] = (uint8_t)(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
        }
}

/* Q2_K: each sub-block of 16 fit as a * L + b (L in 0..3, b <= 0) by the
 * Q4_K search, then 4-bit scales and mins relative to the super-block's d
 * = max a / 15 and dmin = max (-b) / 15, and the quants again against the
 * stored scales (ggml's rounding: nearest((x + dm) / ds)). */
static void q2_K_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK_K == 0);
    block_q2_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        float a[16], mn[16], w[16], max_a = 0, max_mn = 0;
        for (int j = 0; j < 16; j++) {
            kquant_weights(x + 16 * j, 16, block_rms(x + 16 * j, 16), w);
            a[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mn[j]);
            max_a = fmaxf(max_a, a[j]);
            max_mn = fmaxf(max_mn, mn[j]);
        }
        const float ia = max_a > 0 ? 15.0f / max_a : 0, im = max_mn > 0 ? 15.0f / max_mn : 0;
        for (int j = 0; j < 16; j++)
            y[i].scales[j] = (uint8_t)(clampi(round_even(ia * a[j]), 0, 15) | (clampi(round_even(im * mn[j]), 0, 15) << 4));
        y[i].d = tg_f32_to_half(max_a / 15.0f);
        y[i].dmin = tg_f32_to_half(max_mn / 15.0f);
        const float d = tg_half_to_f32(y[i].d), dmin = tg_half_to_f32(y[i].dmin);
        for (int j = 0; j < 16; j++) {
            const float ds = d * (y[i].scales[j] & 15), dm = dmin * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)(ds > 0 ? clampi(round_even((x[16 * j + l] + dm) / ds), 0, 3) : 0);
        }
        k2_pack(L, y[i].qs);
    }
}

static void q2_K_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK_K == 0);
    const block_q2_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = tg_half_to_f32(x[i].d), dmin = tg_half_to_f32(x[i].dmin);
        uint8_t L[QK_K];
        k2_unpack(x[i].qs, L);
        for (int v = 0; v < QK_K; v++) {
            const uint8_t sc = x[i].scales[v / 16];
            const float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
            y[v] = dl * (float)L[v] - ml;
        }
    }
}

/* Against Q8_K, as ggml's generic dot: per block isum = sum_j (sc_j & 15) *
 * sum(q q8) and summs = sum_j (sc_j >> 4) * bsums_j (integers), then sumf
 * += (d8 * d) * isum - (d8 * dmin) * summs. */
static void q2_K_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK_K == 0);
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t L[QK_K];
        k2_unpack(x[i].qs, L);
        int summs = 0, isum = 0;
        for (int j = 0; j < 16; j++) {
            summs += y[i].bsums[j] * (x[i].scales[j] >> 4);
            int isuml = 0;
            for (int l = 0; l < 16; l++) isuml += y[i].qs[16 * j + l] * L[16 * j + l];
            isum += (x[i].scales[j] & 15) * isuml;
        }
        const float dall = y[i].d * tg_half_to_f32(x[i].d), dmin = y[i].d * tg_half_to_f32(x[i].dmin);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

/* Q3_K's sixteen 6-bit scales: the low four bits of scale j are nibble
 * j / 8 of scales[j % 8], the high two bits field j / 4 of scales[8 + j %
 * 4]; returned minus 32. */
static void q3_K_scales(const uint8_t *sc, int *out)
{
    for (int j = 0; j < 16; j++)
        out[j] = (((sc[j % 8] >> (4 * (j / 8))) & 15) | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

/* Q3_K's quants as signed values q - 4 (a[256], value order). */
static void q3_K_unpack(const block_q3_K *b, int8_t *a)
{
    uint8_t L[QK_K];
    k2_unpack(b->qs, L);
    for (int v = 0; v < QK_K; v++) a[v] = (int8_t)(L[v] - ((b->hmask[v % 32] >> (v / 32)) & 1 ? 0 : 4));
}

/* Refines the symmetric fit of fit_scale_sym (L + nmax in L[], n values,
 * weights w) one value at a time: each L[i] moves to the level its x[i]
 * asks for under the fit of the others, kept when the fit's score
 * (SwLx^2 / SwL2) rises, for up to five passes (ggml's Q3_K search does
 * the same); returns the least-squares scale of the result. */
static float refine_sym(int n, int nmax, const float *x, const float *w, uint8_t *L)
{
    double slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = L[i] - nmax;
        slx += (double)w[i] * x[i] * l;
        sl2 += (double)w[i] * l * l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const int l = L[i] - nmax;
            const double ox = slx - (double)w[i] * x[i] * l, o2 = sl2 - (double)w[i] * l * l;
            if (ox <= 0 || o2 <= 0) continue;
            const int nl = clampi(round_even((float)(x[i] * o2 / ox)), -nmax, nmax - 1);
            if (nl == l) continue;
            const double nx = ox + (double)w[i] * x[i] * nl, n2 = o2 + (double)w[i] * nl * nl;
            if (n2 > 0 && nx * nx * sl2 > slx * slx * n2) {
                L[i] = (uint8_t)(nl + nmax);
                slx = nx;
                sl2 = n2;
                changed++;
            }
        }
        if (!changed) break;
    }
    return sl2 > 0 ? (float)(slx / sl2) : 0.0f;
}

/* Q3_K: each sub-block of 16 fit as a * (L - 4) (L in 0..7) by the Q6_K
 * search (squared-value weights) and refine_sym, int 6-bit scales with the
 * largest at -32, and the quants again against the stored scales. */
static void q3_K_from_float(const float *x, void *vy, int64_t k)
{
    assert(k % QK_K == 0);
    block_q3_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        float a[16], w[16], max_a = 0, amax_a = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = x[16 * j + l] * x[16 * j + l] + 1e-30f;
            a[j] = fit_scale_sym(16, 4, x + 16 * j, w, L + 16 * j);
            if (a[j] != 0) a[j] = refine_sym(16, 4, x + 16 * j, w, L + 16 * j);
            if (fabsf(a[j]) > amax_a) {
                amax_a = fabsf(a[j]);
                max_a = a[j];
            }
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        if (amax_a == 0) {
            y[i].d = 0;
            memset(L, 4, sizeof L);
        } else {
            const float iscale = -32.0f / max_a;
            for (int j = 0; j < 16; j++) {
                const int l = clampi(round_even(iscale * a[j]), -32, 31) + 32;
                y[i].scales[j % 8] |= (uint8_t)((l & 15) << (4 * (j / 8)));
                y[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = tg_f32_to_half(1 / iscale);
            int sc[16];
            q3_K_scales(y[i].scales, sc);
            const float d = tg_half_to_f32(y[i].d);
            for (int j = 0; j < 16; j++) {
                const float ds = d * (float)sc[j];
                for (int l = 0; l < 16; l++)
                    L[16 * j + l] = (uint8_t)(ds != 0 ? clampi(round_even(x[16 * j + l] / ds), -4, 3) + 4 : 4);
            }
        }
        for (int v = 0; v < QK_K; v++)
            if (L[v] > 3) {
                y[i].hmask[v % 32] |= (uint8_t)(1 << (v / 32));
                L[v] -= 4;
            }
        k2_pack(L, y[i].qs);
    }
}

static void q3_K_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK_K == 0);
    const block_q3_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = tg_half_to_f32(x[i].d);
        int sc[16];
        int8_t a[QK_K];
        q3_K_scales(x[i].scales, sc);
        q3_K_unpack(&x[i], a);
        for (int v = 0; v < QK_K; v++) y[v] = (d * (float)sc[v / 16]) * (float)a[v];
    }
}

/* Against Q8_K, as ggml's generic dot: eight int32 lanes (element index
 * mod 8) of (sc_j - 32) * q * q8 per block, each lane scaled by d * d8
 * into eight f32 sums, added up at the end. */
static void q3_K_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK_K == 0);
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    float sums[8] = {0};
    for (int i = 0; i < n / QK_K; i++) {
        int sc[16];
        int8_t a[QK_K];
        q3_K_scales(x[i].scales, sc);
        q3_K_unpack(&x[i], a);
        int32_t lane[8] = {0};
        for (int v = 0; v < QK_K; v++) lane[v % 8] += sc[v / 16] * (int16_t)(y[i].qs[v] * a[v]);
        const float d = tg_half_to_f32(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * (float)lane[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

/* ------------------------------------------------------------------ Q4_K */

static void q4_K_quantize(const float *x, void *vy, int64_t k, int fast)
{
    assert(k % QK_K == 0);
    block_q4_K *y = vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        kquant_asym_block(x, 15, &y[i].d, &y[i].dmin, y[i].scales, L, fast);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
    }
}

/* tg_traits' quantizer: the vector search. */
static void q4_K_from_float(const float *x, void *vy, int64_t k)
{
    q4_K_quantize(x, vy, k, 1);
}

/* The scalar reference: the same bytes, by the plain loops. */
static void q4_K_from_float_ref(const float *x, void *vy, int64_t k)
{
    q4_K_quantize(x, vy, k, 0);
}

/* The Q4_K and Q6_K dequantization (the weights of Q4_K_M files, and the
 * ref tier's hot loop) is written so that the compiler vectorizes it: GCC
 * only does with its dynamic cost model, asked for here, and never
 * contracts (fp-contract=off), so each value is the plain formula's float
 * operations in order (Q4_K: d1 * q - m1, a multiply then a subtract;
 * Q6_K: (d * scale) * q). tests/test_quant.c checks the bits against that
 * formula. */
#if defined(__GNUC__) && !defined(__clang__)
#define KQ_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic", "fp-contract=off")))
#else
#define KQ_VECTORIZE
#endif

KQ_CLONES KQ_VECTORIZE static void q4_K_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK_K == 0);
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = tg_half_to_f32(x[i].d), dmin = tg_half_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int g = 0; g < 4; g++, q += 32, y += 64) {
            uint8_t sc, m;
            tg_get_scale_min_k4(2 * g, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            tg_get_scale_min_k4(2 * g + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                y[l] = d1 * (q[l] & 15) - m1;
            for (int l = 0; l < 32; l++)
                y[32 + l] = d2 * (q[l] >> 4) - m2;
        }
    }
}

/* Unpacks the 8 scales and 8 mins of a Q4_K/Q5_K block. */
static void unpack_scale_min_k4(const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    for (int j = 0; j < 8; j++) tg_get_scale_min_k4(j, q, &sc[j], &m[j]);
}

/* Shared tail of the Q4_K / Q5_K dot: a[256] holds the weight quants of one
 * block (unsigned). Returns the block's int32 sum of sc[j] * a * q8 over
 * its 8 sub-blocks, into the 8 lane sums of ggml's generic code. */
static void kquant_lane_sums(const int8_t *a, const int8_t *q8, const uint8_t *sc, int32_t lanes[8])
{
    for (int j = 0; j < 8; j++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 8; l++)
                lanes[l] += sc[j] * (a[32 * j + 8 * k + l] * q8[32 * j + 8 * k + l]);
}

static void q4_K_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK_K == 0);
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sums[8] = {0};
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int8_t a[QK_K];
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                a[64 * g + l] = (int8_t)(x[i].qs[32 * g + l] & 15);
                a[64 * g + 32 + l] = (int8_t)(x[i].qs[32 * g + l] >> 4);
            }
        uint8_t sc[8], m[8];
        unpack_scale_min_k4(x[i].scales, sc, m);
        int32_t summ = 0;
        for (int j = 0; j < QK_K / 16; j++) summ += y[i].bsums[j] * m[j / 2];
        int32_t lanes[8] = {0};
        kquant_lane_sums(a, y[i].qs, sc, lanes);
        const float d = tg_half_to_f32(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * (float)lanes[l];
        const float dmin = tg_half_to_f32(x[i].dmin) * y[i].d;
        sumf -= dmin * (float)summ;
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

/* ------------------------------------------------------------------ Q5_K */

static void q5_K_quantize(const float *x, void *vy, int64_t k, int fast)
{
    assert(k % QK_K == 0);
    block_q5_K *y = vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        kquant_asym_block(x, 31, &y[i].d, &y[i].dmin, y[i].scales, L, fast);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                const uint8_t lo = L[64 * g + l], hi = L[64 * g + 32 + l];
                y[i].qs[32 * g + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
                y[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
            }
    }
}

/* tg_traits' quantizer: the vector search. */
static void q5_K_from_float(const float *x, void *vy, int64_t k)
{
    q5_K_quantize(x, vy, k, 1);
}

/* The scalar reference: the same bytes, by the plain loops. */
static void q5_K_from_float_ref(const float *x, void *vy, int64_t k)
{
    q5_K_quantize(x, vy, k, 0);
}

static void q5_K_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK_K == 0);
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = tg_half_to_f32(x[i].d), dmin = tg_half_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int g = 0; g < 4; g++, q += 32) {
            uint8_t sc, m;
            tg_get_scale_min_k4(2 * g, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            tg_get_scale_min_k4(2 * g + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * ((q[l] & 15) + (((x[i].qh[l] >> (2 * g)) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * ((q[l] >> 4) + (((x[i].qh[l] >> (2 * g + 1)) & 1) << 4)) - m2;
        }
    }
}

static void q5_K_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK_K == 0);
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    float sums[8] = {0};
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int8_t a[QK_K];
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                const uint8_t q = x[i].qs[32 * g + l], h = x[i].qh[l];
                a[64 * g + l] = (int8_t)((q & 15) | (((h >> (2 * g)) & 1) << 4));
                a[64 * g + 32 + l] = (int8_t)((q >> 4) | (((h >> (2 * g + 1)) & 1) << 4));
            }
        uint8_t sc[8], m[8];
        unpack_scale_min_k4(x[i].scales, sc, m);
        int32_t summ = 0;
        for (int j = 0; j < QK_K / 16; j++) summ += y[i].bsums[j] * m[j / 2];
        int32_t lanes[8] = {0};
        kquant_lane_sums(a, y[i].qs, sc, lanes);
        const float d = tg_half_to_f32(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * (float)lanes[l];
        const float dmin = tg_half_to_f32(x[i].dmin) * y[i].d;
        sumf -= dmin * (float)summ;
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

/* ------------------------------------------------------------------ Q6_K */

static void q6_K_quantize(const float *x, void *vy, int64_t k, int fast)
{
    assert(k % QK_K == 0);
    block_q6_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        float a[16], w[QK_K];
        float max_a = 0, amax_a = 0;
        /* squared-value weights: the error of large values dominates */
        if (fast) tg_kq_sq_weights(QK_K, x, 1e-30f, w);
        for (int j = 0; j < 16; j++) {
            const float *xs = x + 16 * j;
            float *ws = w + 16 * j;
            if (!fast)
                for (int l = 0; l < 16; l++) ws[l] = xs[l] * xs[l] + 1e-30f;
            a[j] = fast ? tg_kq_fit_sym_fast(16, 32, xs, ws) : fit_scale_sym(16, 32, xs, ws, L + 16 * j);
            if (fabsf(a[j]) > amax_a) {
                amax_a = fabsf(a[j]);
                max_a = a[j];
            }
        }
        memset(y[i].ql, 0, sizeof y[i].ql);
        memset(y[i].qh, 0, sizeof y[i].qh);
        if (amax_a == 0) {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = 0;
            for (int l = 0; l < QK_K; l++) L[l] = 32;
        } else {
            /* int8 scales; the largest maps to -128 (one more level) */
            const float iscale = -128.0f / max_a;
            y[i].d = tg_f32_to_half(1 / iscale);
            const float d = tg_half_to_f32(y[i].d);
            for (int j = 0; j < 16; j++) {
                const int sc = clampi(round_even(iscale * a[j]), -128, 127);
                y[i].scales[j] = (int8_t)sc;
                const float ds = d * sc;
                if (fast) {
                    if (ds != 0) tg_kq_quant_div(16, x + 16 * j, 0, ds, -32, 31, 32, L + 16 * j);
                    else memset(L + 16 * j, 32, 16);
                    continue;
                }
                for (int l = 0; l < 16; l++) {
                    int q = ds != 0 ? round_even(x[16 * j + l] / ds) : 0;
                    L[16 * j + l] = (uint8_t)(clampi(q, -32, 31) + 32);
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
                ql[l] = (uint8_t)((q1 & 15) | ((q3 & 15) << 4));
                ql[l + 32] = (uint8_t)((q2 & 15) | ((q4 & 15) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

/* Unpacks one Q6_K block's 256 quants as signed values (q - 32). */
static inline void q6_K_unpack(const block_q6_K *b, int8_t *a)
{
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *ah = a + 128 * h;
        for (int l = 0; l < 32; l++) {
            ah[l] = (int8_t)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
            ah[l + 32] = (int8_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
            ah[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            ah[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

/* tg_traits' quantizer: the vector search. */
static void q6_K_from_float(const float *x, void *vy, int64_t k)
{
    q6_K_quantize(x, vy, k, 1);
}

/* The scalar reference: the same bytes, by the plain loops. */
static void q6_K_from_float_ref(const float *x, void *vy, int64_t k)
{
    q6_K_quantize(x, vy, k, 0);
}

KQ_CLONES KQ_VECTORIZE static void q6_K_to_float(const void *vx, float *y, int64_t k)
{
    assert(k % QK_K == 0);
    const block_q6_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        int8_t a[QK_K];
        q6_K_unpack(&x[i], a);
        const float d = tg_half_to_f32(x[i].d);
        for (int j = 0; j < QK_K / 16; j++) {
            const float dj = d * x[i].scales[j];
            for (int l = 0; l < 16; l++)
                y[16 * j + l] = dj * a[16 * j + l];
        }
    }
}

static void q6_K_vec_dot(int n, float *s, const void *vx, const void *vy)
{
    assert(n % QK_K == 0);
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sums[8] = {0};
    for (int i = 0; i < n / QK_K; i++) {
        int8_t a[QK_K];
        q6_K_unpack(&x[i], a);
        int32_t lanes[8] = {0};
        for (int j = 0; j < 16; j++)
            for (int k = 0; k < 2; k++)
                for (int l = 0; l < 8; l++)
                    lanes[l] += x[i].scales[j] * (a[16 * j + 8 * k + l] * y[i].qs[16 * j + 8 * k + l]);
        const float d = tg_half_to_f32(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * (float)lanes[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

/* ---------------------------------------------------------------- traits */

static const tg_type_traits traits[TG_TYPE_COUNT] = {
    [TG_TYPE_F32] = {"f32", 1, sizeof(float), 0, f32_to_float, f32_from_float,
                     TG_TYPE_F32, f32_vec_dot},
    [TG_TYPE_F16] = {"f16", 1, sizeof(tg_half), 0, f16_to_float, f16_from_float,
                     TG_TYPE_F16, f16_vec_dot},
    [TG_TYPE_BF16] = {"bf16", 1, sizeof(tg_bf16), 0, bf16_to_float, bf16_from_float,
                      TG_TYPE_BF16, bf16_vec_dot},
    [TG_TYPE_Q4_0] = {"q4_0", QK4_0, sizeof(block_q4_0), 1, q4_0_to_float, q4_0_from_float,
                      TG_TYPE_Q8_0, q4_0_vec_dot},
    [TG_TYPE_Q5_0] = {"q5_0", QK5_0, sizeof(block_q5_0), 1, q5_0_to_float, q5_0_from_float,
                      TG_TYPE_Q8_0, q5_0_vec_dot},
    [TG_TYPE_Q4_1] = {"q4_1", QK4_1, sizeof(block_q4_1), 1, q4_1_to_float, q4_1_from_float,
                      TG_TYPE_Q8_1, q4_1_vec_dot},
    [TG_TYPE_Q5_1] = {"q5_1", QK5_1, sizeof(block_q5_1), 1, q5_1_to_float, q5_1_from_float,
                      TG_TYPE_Q8_1, q5_1_vec_dot},
    [TG_TYPE_Q8_0] = {"q8_0", QK8_0, sizeof(block_q8_0), 1, q8_0_to_float, q8_0_from_float,
                      TG_TYPE_Q8_0, q8_0_vec_dot},
    [TG_TYPE_Q8_1] = {"q8_1", QK8_0, sizeof(block_q8_1), 1, q8_1_to_float, q8_1_from_float,
                      TG_TYPE_Q8_1, NULL},
    [TG_TYPE_Q2_K] = {"q2_K", QK_K, sizeof(block_q2_K), 1, q2_K_to_float, q2_K_from_float,
                      TG_TYPE_Q8_K, q2_K_vec_dot},
    [TG_TYPE_Q3_K] = {"q3_K", QK_K, sizeof(block_q3_K), 1, q3_K_to_float, q3_K_from_float,
                      TG_TYPE_Q8_K, q3_K_vec_dot},
    [TG_TYPE_Q4_K] = {"q4_K", QK_K, sizeof(block_q4_K), 1, q4_K_to_float, q4_K_from_float,
                      TG_TYPE_Q8_K, q4_K_vec_dot},
    [TG_TYPE_Q5_K] = {"q5_K", QK_K, sizeof(block_q5_K), 1, q5_K_to_float, q5_K_from_float,
                      TG_TYPE_Q8_K, q5_K_vec_dot},
    [TG_TYPE_Q6_K] = {"q6_K", QK_K, sizeof(block_q6_K), 1, q6_K_to_float, q6_K_from_float,
                      TG_TYPE_Q8_K, q6_K_vec_dot},
    [TG_TYPE_Q8_K] = {"q8_K", QK_K, sizeof(block_q8_K), 1, q8_K_to_float, q8_K_from_float,
                      TG_TYPE_Q8_K, NULL},
};

/* Returns the traits of a supported type, or NULL. */
const tg_type_traits *tg_traits(uint32_t type)
{
    if (type >= TG_TYPE_COUNT || !traits[type].name) return NULL;
    return &traits[type];
}

/* Returns the scalar reference quantizer of a type (the Q4_K, Q5_K and
 * Q6_K ones behind tg_traits' faster ones write the same bytes), or NULL
 * when the type has none. */
tg_from_float_fn tg_from_float_ref(uint32_t type)
{
    switch (type) {
    case TG_TYPE_Q4_K: return q4_K_from_float_ref;
    case TG_TYPE_Q5_K: return q5_K_from_float_ref;
    case TG_TYPE_Q6_K: return q6_K_from_float_ref;
    default: return tg_traits(type) ? tg_traits(type)->from_float : NULL;
    }
}

/* Returns the bytes of a row of n values, or 0 when n is negative, not a
 * multiple of the block size, or the type is unsupported. */
size_t tg_row_size(uint32_t type, int64_t n)
{
    const tg_type_traits *t = tg_traits(type);
    if (!t || n < 0 || n % t->blck_size != 0) return 0;
    return (size_t)(n / t->blck_size) * t->type_size;
}

/* Returns ggml's name of a type id ("q4_K"), also for the ids this project
 * does not compute with; "?" when unknown. */
const char *tg_type_name(uint32_t type)
{
    static const char *const names[TG_TYPE_COUNT] = {
        [TG_TYPE_F32] = "f32", [TG_TYPE_F16] = "f16", [TG_TYPE_Q4_0] = "q4_0",
        [TG_TYPE_Q4_1] = "q4_1", [TG_TYPE_Q5_0] = "q5_0", [TG_TYPE_Q5_1] = "q5_1",
        [TG_TYPE_Q8_0] = "q8_0", [TG_TYPE_Q8_1] = "q8_1", [TG_TYPE_Q2_K] = "q2_K",
        [TG_TYPE_Q3_K] = "q3_K", [TG_TYPE_Q4_K] = "q4_K", [TG_TYPE_Q5_K] = "q5_K",
        [TG_TYPE_Q6_K] = "q6_K", [TG_TYPE_Q8_K] = "q8_K", [16] = "iq2_xxs", [17] = "iq2_xs",
        [18] = "iq3_xxs", [19] = "iq1_s", [20] = "iq4_nl", [21] = "iq3_s", [22] = "iq2_s", [23] = "iq4_xs",
        [24] = "i8", [25] = "i16", [26] = "i32", [27] = "i64", [28] = "f64", [29] = "iq1_m",
        [TG_TYPE_BF16] = "bf16",
    };
    if (type >= TG_TYPE_COUNT || !names[type]) return "?";
    return names[type];
}
