/*
 * kernels_neon.c: aarch64 Advanced SIMD kernels, compiled only for aarch64
 * (the Makefile's *_neon.c rule). Two tiers:
 *   neon          baseline ASIMD: byte products by smull/smlal2 into int16
 *                 (pairs, no overflow for |q| <= 127 times |w| <= 127),
 *                 widened and accumulated by sadalp;
 *   neon-dotprod  the same with sdot (ARMv8.2 dot product, HWCAP_ASIMDDP),
 *                 in functions compiled for +dotprod and only called after
 *                 getauxval said yes.
 * Both keep the reference's integer sums per sub-block and scale them once
 * per super-block (K-quants) or block (Q8_0). Weight quants are unpacked to
 * signed bytes: Q4_K/Q5_K as 0..15 / 0..31 (mins through the bsums), Q6_K
 * as q - 32.
 */
/* No multiply-add contraction: the quantizers must round each product as
 * the reference does (explicit fmadd intrinsics stay fused). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "kernels_isa.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>

static inline float half_to_f32(tg_half h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* Dot of 16 signed bytes a and b, 4 int32 partial sums added to acc. */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_high_s8(p, a, b);
    return vpadalq_s16(acc, p);
}

__attribute__((target("arch=armv8.2-a+dotprod")))
static inline int32x4_t dot16_dp(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    return vdotq_s32(acc, a, b);
}

static inline void unpack_scales_k4(const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    uint32_t u[3], o[4];
    memcpy(u, q, 12);
    const uint32_t k63 = 0x3f3f3f3fu, k15 = 0x0f0f0f0fu, k3 = 0x03030303u;
    o[0] = u[0] & k63;
    o[1] = (u[2] & k15) | (((u[0] >> 6) & k3) << 4);
    o[2] = u[1] & k63;
    o[3] = ((u[2] >> 4) & k15) | (((u[1] >> 6) & k3) << 4);
    memcpy(sc, o, 8);
    memcpy(m, o + 2, 8);
}

/* sum over sub-blocks j of m[j] * (bsums[2j] + bsums[2j+1]) */
static inline int32_t mins_dot(const uint8_t *m, const int16_t *bsums)
{
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    const int16x8_t pairs = vpaddq_s16(b0, b1);
    const int16x8_t m16 = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(m)));
    int32x4_t s = vmull_s16(vget_low_s16(pairs), vget_low_s16(m16));
    s = vmlal_high_s16(s, pairs, m16);
    return vaddvq_s32(s);
}

/* The K-quant and Q8_0 dot bodies, written once over a DOT16 macro and
 * instantiated for both tiers. */
#define DEFINE_Q4_K(NAME, DOT16, ATTR)                                                         \
ATTR static void NAME(int n, float *s, const void *vx, const void *vy)                        \
{                                                                                              \
    const block_q4_K *x = vx;                                                                  \
    const block_q8_K *y = vy;                                                                  \
    const int nb = n / QK_K;                                                                   \
    const uint8x16_t m4 = vdupq_n_u8(0x0f);                                                    \
    float sumf = 0;                                                                            \
    for (int i = 0; i < nb; i++) {                                                             \
        uint8_t sc[8], m[8];                                                                   \
        unpack_scales_k4(x[i].scales, sc, m);                                                  \
        const int32_t summ = mins_dot(m, y[i].bsums);                                          \
        const uint8_t *q4 = x[i].qs;                                                           \
        const int8_t *q8 = y[i].qs;                                                            \
        int32x4_t sumi = vdupq_n_s32(0);                                                       \
        for (int g = 0; g < 4; g++) {                                                          \
            const uint8x16_t b0 = vld1q_u8(q4 + 32 * g), b1 = vld1q_u8(q4 + 32 * g + 16);      \
            int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);                                \
            lo = DOT16(lo, vreinterpretq_s8_u8(vandq_u8(b0, m4)), vld1q_s8(q8 + 64 * g));      \
            lo = DOT16(lo, vreinterpretq_s8_u8(vandq_u8(b1, m4)), vld1q_s8(q8 + 64 * g + 16)); \
            hi = DOT16(hi, vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), vld1q_s8(q8 + 64 * g + 32)); \
            hi = DOT16(hi, vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), vld1q_s8(q8 + 64 * g + 48)); \
            sumi = vmlaq_n_s32(sumi, lo, sc[2 * g]);                                           \
            sumi = vmlaq_n_s32(sumi, hi, sc[2 * g + 1]);                                       \
        }                                                                                      \
        const float d = y[i].d * half_to_f32(x[i].d);                                          \
        const float dmin = y[i].d * half_to_f32(x[i].dmin);                                    \
        sumf += d * (float)vaddvq_s32(sumi) - dmin * (float)summ;                              \
    }                                                                                          \
    *s = sumf;                                                                                 \
}

#define DEFINE_Q5_K(NAME, DOT16, ATTR)                                                         \
ATTR static void NAME(int n, float *s, const void *vx, const void *vy)                        \
{                                                                                              \
    const block_q5_K *x = vx;                                                                  \
    const block_q8_K *y = vy;                                                                  \
    const int nb = n / QK_K;                                                                   \
    const uint8x16_t m4 = vdupq_n_u8(0x0f), b4 = vdupq_n_u8(0x10);                             \
    float sumf = 0;                                                                            \
    for (int i = 0; i < nb; i++) {                                                             \
        uint8_t sc[8], m[8];                                                                   \
        unpack_scales_k4(x[i].scales, sc, m);                                                  \
        const int32_t summ = mins_dot(m, y[i].bsums);                                          \
        const uint8_t *q5 = x[i].qs;                                                           \
        const int8_t *q8 = y[i].qs;                                                            \
        uint8x16_t h0 = vld1q_u8(x[i].qh), h1 = vld1q_u8(x[i].qh + 16);                        \
        int32x4_t sumi = vdupq_n_s32(0);                                                       \
        for (int g = 0; g < 4; g++) {                                                          \
            const uint8x16_t b0 = vld1q_u8(q5 + 32 * g), b1 = vld1q_u8(q5 + 32 * g + 16);      \
            const uint8x16_t l0 = vorrq_u8(vandq_u8(b0, m4), vandq_u8(vshlq_n_u8(h0, 4), b4)); \
            const uint8x16_t l1 = vorrq_u8(vandq_u8(b1, m4), vandq_u8(vshlq_n_u8(h1, 4), b4)); \
            const uint8x16_t u0 = vorrq_u8(vshrq_n_u8(b0, 4), vandq_u8(vshlq_n_u8(h0, 3), b4)); \
            const uint8x16_t u1 = vorrq_u8(vshrq_n_u8(b1, 4), vandq_u8(vshlq_n_u8(h1, 3), b4)); \
            h0 = vshrq_n_u8(h0, 2);                                                            \
            h1 = vshrq_n_u8(h1, 2);                                                            \
            int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);                                \
            lo = DOT16(lo, vreinterpretq_s8_u8(l0), vld1q_s8(q8 + 64 * g));                    \
            lo = DOT16(lo, vreinterpretq_s8_u8(l1), vld1q_s8(q8 + 64 * g + 16));               \
            hi = DOT16(hi, vreinterpretq_s8_u8(u0), vld1q_s8(q8 + 64 * g + 32));               \
            hi = DOT16(hi, vreinterpretq_s8_u8(u1), vld1q_s8(q8 + 64 * g + 48));               \
            sumi = vmlaq_n_s32(sumi, lo, sc[2 * g]);                                           \
            sumi = vmlaq_n_s32(sumi, hi, sc[2 * g + 1]);                                       \
        }                                                                                      \
        const float d = y[i].d * half_to_f32(x[i].d);                                          \
        const float dmin = y[i].d * half_to_f32(x[i].dmin);                                    \
        sumf += d * (float)vaddvq_s32(sumi) - dmin * (float)summ;                              \
    }                                                                                          \
    *s = sumf;                                                                                 \
}

/* Q6_K: quants as q - 32 in signed bytes; 16 sub-blocks of 16. */
#define DEFINE_Q6_K(NAME, DOT16, ATTR)                                                         \
ATTR static void NAME(int n, float *s, const void *vx, const void *vy)                        \
{                                                                                              \
    const block_q6_K *x = vx;                                                                  \
    const block_q8_K *y = vy;                                                                  \
    const int nb = n / QK_K;                                                                   \
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x03);                             \
    const int8x16_t off = vdupq_n_s8(32);                                                      \
    float sumf = 0;                                                                            \
    for (int i = 0; i < nb; i++) {                                                             \
        int32x4_t sumi = vdupq_n_s32(0);                                                       \
        for (int h = 0; h < 2; h++) {                                                          \
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;                      \
            const int8_t *q8 = y[i].qs + 128 * h, *sc = x[i].scales + 8 * h;                   \
            for (int c = 0; c < 2; c++) {       /* l in [16c, 16c + 16) */                     \
                const uint8x16_t L0 = vld1q_u8(ql + 16 * c), L1 = vld1q_u8(ql + 32 + 16 * c);  \
                const uint8x16_t H = vld1q_u8(qh + 16 * c);                                    \
                const int8x16_t v0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(L0, m4),   \
                                     vshlq_n_u8(vandq_u8(H, m3), 4))), off);                   \
                const int8x16_t v1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(L1, m4),   \
                                     vshlq_n_u8(vandq_u8(vshrq_n_u8(H, 2), m3), 4))), off);    \
                const int8x16_t v2 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(L0, 4),  \
                                     vshlq_n_u8(vandq_u8(vshrq_n_u8(H, 4), m3), 4))), off);    \
                const int8x16_t v3 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(L1, 4),  \
                                     vshlq_n_u8(vshrq_n_u8(H, 6), 4))), off);                  \
                const int32x4_t z = vdupq_n_s32(0);                                            \
                sumi = vmlaq_n_s32(sumi, DOT16(z, v0, vld1q_s8(q8 + 16 * c)), sc[c]);          \
                sumi = vmlaq_n_s32(sumi, DOT16(z, v1, vld1q_s8(q8 + 32 + 16 * c)), sc[2 + c]); \
                sumi = vmlaq_n_s32(sumi, DOT16(z, v2, vld1q_s8(q8 + 64 + 16 * c)), sc[4 + c]); \
                sumi = vmlaq_n_s32(sumi, DOT16(z, v3, vld1q_s8(q8 + 96 + 16 * c)), sc[6 + c]); \
            }                                                                                  \
        }                                                                                      \
        sumf += y[i].d * half_to_f32(x[i].d) * (float)vaddvq_s32(sumi);                        \
    }                                                                                          \
    *s = sumf;                                                                                 \
}

#define DEFINE_Q8_0(NAME, DOT16, ATTR)                                                         \
ATTR static void NAME(int n, float *s, const void *vx, const void *vy)                        \
{                                                                                              \
    const block_q8_0 *x = vx, *y = vy;                                                         \
    const int nb = n / QK8_0;                                                                  \
    float32x4_t acc = vdupq_n_f32(0);                                                          \
    for (int i = 0; i < nb; i++) {                                                             \
        int32x4_t p = vdupq_n_s32(0);                                                          \
        p = DOT16(p, vld1q_s8(x[i].qs), vld1q_s8(y[i].qs));                                    \
        p = DOT16(p, vld1q_s8(x[i].qs + 16), vld1q_s8(y[i].qs + 16));                          \
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);                             \
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), d);                                           \
    }                                                                                          \
    *s = vaddvq_f32(acc);                                                                      \
}

#define NO_ATTR
#define DP_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
DEFINE_Q4_K(vec_dot_q4_K, dot16, NO_ATTR)
DEFINE_Q5_K(vec_dot_q5_K, dot16, NO_ATTR)
DEFINE_Q6_K(vec_dot_q6_K, dot16, NO_ATTR)
DEFINE_Q8_0(vec_dot_q8_0, dot16, NO_ATTR)
DEFINE_Q4_K(vec_dot_q4_K_dp, dot16_dp, DP_ATTR)
DEFINE_Q5_K(vec_dot_q5_K_dp, dot16_dp, DP_ATTR)
DEFINE_Q6_K(vec_dot_q6_K_dp, dot16_dp, DP_ATTR)
DEFINE_Q8_0(vec_dot_q8_0_dp, dot16_dp, DP_ATTR)

static void vec_dot_f32(int n, float *s, const void *vx, const void *vy)
{
    const float *x = vx, *y = vy;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, vld1q_f32(x + i), vld1q_f32(y + i));
        a1 = vfmaq_f32(a1, vld1q_f32(x + i + 4), vld1q_f32(y + i + 4));
        a2 = vfmaq_f32(a2, vld1q_f32(x + i + 8), vld1q_f32(y + i + 8));
        a3 = vfmaq_f32(a3, vld1q_f32(x + i + 12), vld1q_f32(y + i + 12));
    }
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

static inline float32x4_t load_f16(const tg_half *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static void vec_dot_f16(int n, float *s, const void *vx, const void *vy)
{
    const tg_half *x = vx, *y = vy;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, load_f16(x + i), load_f16(y + i));
        a1 = vfmaq_f32(a1, load_f16(x + i + 4), load_f16(y + i + 4));
        a2 = vfmaq_f32(a2, load_f16(x + i + 8), load_f16(y + i + 8));
        a3 = vfmaq_f32(a3, load_f16(x + i + 12), load_f16(y + i + 12));
    }
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) sum += half_to_f32(x[i]) * half_to_f32(y[i]);
    *s = sum;
}

static inline float32x4_t load_bf16(const tg_bf16 *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

static void vec_dot_bf16(int n, float *s, const void *vx, const void *vy)
{
    const tg_bf16 *x = vx, *y = vy;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, load_bf16(x + i), load_bf16(y + i));
        a1 = vfmaq_f32(a1, load_bf16(x + i + 4), load_bf16(y + i + 4));
        a2 = vfmaq_f32(a2, load_bf16(x + i + 8), load_bf16(y + i + 8));
        a3 = vfmaq_f32(a3, load_bf16(x + i + 12), load_bf16(y + i + 12));
    }
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) sum += tg_bf16_to_f32(x[i]) * tg_bf16_to_f32(y[i]);
    *s = sum;
}

/* Q8_K with the reference's float operations: iscale * x, rounded to
 * nearest even (fcvtns), min 127. */
static void quantize_q8_K(const float *x, void *vy, int64_t k)
{
    block_q8_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float32x4_t am = vdupq_n_f32(0);
        for (int j = 0; j < QK_K; j += 4) am = vmaxnmq_f32(am, vabsq_f32(vld1q_f32(x + j)));
        const float amax = vmaxnmvq_f32(am);
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        const float iscale = -127.0f / max;
        const int32x4_t c127 = vdupq_n_s32(127);
        for (int j = 0; j < QK_K; j += 16) {
            int32x4_t q[4];
            for (int l = 0; l < 4; l++)
                q[l] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4 * l), iscale)), c127);
            const int16x8_t a = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
            const int16x8_t b = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
            const int8x16_t q8 = vcombine_s8(vqmovn_s16(a), vqmovn_s16(b));
            vst1q_s8(y[i].qs + j, q8);
            y[i].bsums[j / 16] = (int16_t)vaddlvq_s8(q8);
        }
        y[i].d = 1 / iscale;
    }
}

/* Q8_0: fcvtas rounds to nearest with ties away from zero, as roundf. */
static void quantize_q8_0(const float *x, void *vy, int64_t k)
{
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        float32x4_t v[8];
        float32x4_t am = vdupq_n_f32(0);
        for (int l = 0; l < 8; l++) {
            v[l] = vld1q_f32(x + 4 * l);
            am = vmaxnmq_f32(am, vabsq_f32(v[l]));
        }
        const float d = vmaxnmvq_f32(am) / 127.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = tg_f32_to_half(d);
        for (int h = 0; h < 2; h++) {
            int32x4_t q[4];
            for (int l = 0; l < 4; l++) q[l] = vcvtaq_s32_f32(vmulq_n_f32(v[4 * h + l], id));
            const int16x8_t a = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
            const int16x8_t b = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
            vst1q_s8(y[i].qs + 16 * h, vcombine_s8(vqmovn_s16(a), vqmovn_s16(b)));
        }
    }
}

static void f32_to_f16(const float *x, tg_half *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = tg_f32_to_half(x[i]);
}

static void axpy_f16(int64_t n, float *y, const tg_half *x, float a)
{
    const float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, load_f16(x + i)));
    for (; i < n; i++) y[i] = fmaf(a, half_to_f32(x[i]), y[i]);
}

void tg_cpu_fill_neon(tg_cpu_kernels *k)
{
    k->vec_dot[TG_TYPE_Q4_K] = vec_dot_q4_K;
    k->vec_dot[TG_TYPE_Q5_K] = vec_dot_q5_K;
    k->vec_dot[TG_TYPE_Q6_K] = vec_dot_q6_K;
    k->vec_dot[TG_TYPE_Q8_0] = vec_dot_q8_0;
    k->vec_dot[TG_TYPE_F32] = vec_dot_f32;
    k->vec_dot[TG_TYPE_F16] = vec_dot_f16;
    k->vec_dot[TG_TYPE_BF16] = vec_dot_bf16;
    k->quantize_q8_K = quantize_q8_K;
    k->quantize_q8_0 = quantize_q8_0;
    k->f32_to_f16 = f32_to_f16;
    k->axpy_f16 = axpy_f16;
}

void tg_cpu_fill_neon_dotprod(tg_cpu_kernels *k)
{
    k->vec_dot[TG_TYPE_Q4_K] = vec_dot_q4_K_dp;
    k->vec_dot[TG_TYPE_Q5_K] = vec_dot_q5_K_dp;
    k->vec_dot[TG_TYPE_Q6_K] = vec_dot_q6_K_dp;
    k->vec_dot[TG_TYPE_Q8_0] = vec_dot_q8_0_dp;
}
