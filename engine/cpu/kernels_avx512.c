/*
 * kernels_avx512.c: AVX-512 (F, BW, VL, DQ) + VNNI versions of the hot
 * dot products: q4_K and q6_K against Q8_K, q8_0 against Q8_0, and the
 * float dots. The other kernels of this tier are the AVX2 ones (kernels.c
 * builds this tier on top of avx2).
 *
 * K-quants: 64 weight quants per 512-bit register, vpmaddubsw for the
 * byte products (pairs in int16, no saturation for |q8| <= 127), then
 * vpdpwssd (VNNI) multiplies by the 16-bit sub-block scales and accumulates
 * in int32: the reference's integers, converted to float once per block.
 * Q8_0: two blocks per register, vpdpbusd on |x| and sign(x)*y.
 * F32 / F16 / BF16: 512-bit versions of the AVX2 float dots.
 */
/* No multiply-add contraction: the quantizers must round each product as
 * the reference does (explicit fmadd intrinsics stay fused). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "kernels_isa.h"

#include <immintrin.h>
#include <string.h>

static inline float half_to_f32(tg_half h)
{
    return _cvtsh_ss(h);
}

static inline int hsum_epi32_128(__m128i v)
{
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

/* As kernels_avx2.c: sc[8] in bytes 0..7, m[8] in bytes 8..15. */
static inline __m128i unpack_scales_k4(const uint8_t *q)
{
    uint32_t u[3];
    memcpy(u, q, 12);
    const uint32_t k63 = 0x3f3f3f3fu, k15 = 0x0f0f0f0fu, k3 = 0x03030303u;
    /* built in registers: a store + wide reload would stall store forwarding */
    return _mm_setr_epi32((int)(u[0] & k63),   /* sc 0..3 */
                          (int)((u[2] & k15) | (((u[0] >> 6) & k3) << 4)),   /* sc 4..7 */
                          (int)(u[1] & k63),   /* m 0..3 */
                          (int)(((u[2] >> 4) & k15) | (((u[1] >> 6) & k3) << 4)));  /* m 4..7 */
}

/* vpermw indices: for q4_K group g, int16 lanes 0..15 take scale 2g and
 * lanes 16..31 scale 2g+1 (a 512-bit maddubs result of 64 values). */
static const int16_t k4_idx[4][32] = {
#define G(g) {2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g,2*g, \
              2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1,2*g+1}
    G(0), G(1), G(2), G(3)
#undef G
};

/* For q6_K register r (0..3, 64 values each): int16 lane L takes scale
 * 4r + L/8 (sub-blocks of 16 values = 8 int16 lanes). */
static const int16_t k6_idx[4][32] = {
#define R(r) {4*r,4*r,4*r,4*r,4*r,4*r,4*r,4*r, 4*r+1,4*r+1,4*r+1,4*r+1,4*r+1,4*r+1,4*r+1,4*r+1, \
              4*r+2,4*r+2,4*r+2,4*r+2,4*r+2,4*r+2,4*r+2,4*r+2, 4*r+3,4*r+3,4*r+3,4*r+3,4*r+3,4*r+3,4*r+3,4*r+3}
    R(0), R(1), R(2), R(3)
#undef R
};

/* q4_K against NA activation rows (y, y + by, ...), weights unpacked once;
 * each output goes through the same operations as with NA = 1 (bit-
 * identical to a single dot). NA is a compile-time constant at each call.
 * Only NA = 1 is used: a 4-row version measured no faster, unlike q6_K. */
static inline __attribute__((always_inline)) void dot_q4_K_n(int n, float *s, const void *vx,
                                                             const char *vy, size_t by, const int NA)
{
    const block_q4_K *x = vx;
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m512i idx[4] = {_mm512_loadu_si512(k4_idx[0]), _mm512_loadu_si512(k4_idx[1]),
                            _mm512_loadu_si512(k4_idx[2]), _mm512_loadu_si512(k4_idx[3])};
    __m512 acc[4];
    __m128 accm[4];
    for (int a = 0; a < NA; a++) {
        acc[a] = _mm512_setzero_ps();
        accm[a] = _mm_setzero_ps();
    }
    for (int i = 0; i < nb; i++) {
        const float xd = half_to_f32(x[i].d), xdmin = half_to_f32(x[i].dmin);
        const __m128i scmin = unpack_scales_k4(x[i].scales);
        const __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(scmin, 8));
        const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(scmin));
        const uint8_t *q4 = x[i].qs;
        __m512i sumi[4];
        for (int a = 0; a < NA; a++) {
            const block_q8_K *y = (const block_q8_K *)(vy + a * by) + i;
            const __m128i b0 = _mm_loadu_si128((const __m128i *)y->bsums);
            const __m128i b1 = _mm_loadu_si128((const __m128i *)(y->bsums + 8));
            const __m128i mins = _mm_madd_epi16(_mm_hadd_epi16(b0, b1), m16);   /* 4 int32 partial sums */
            accm[a] = _mm_fmadd_ps(_mm_set1_ps(y->d * xdmin), _mm_cvtepi32_ps(mins), accm[a]);
            sumi[a] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(q4 + 32 * g));
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            const __m512i sc = _mm512_permutexvar_epi16(idx[g], sc16);
            for (int a = 0; a < NA; a++) {
                const int8_t *q8 = ((const block_q8_K *)(vy + a * by) + i)->qs;
                sumi[a] = _mm512_dpwssd_epi32(sumi[a], _mm512_maddubs_epi16(w, _mm512_loadu_si512(q8 + 64 * g)), sc);
            }
        }
        for (int a = 0; a < NA; a++) {
            const float d = ((const block_q8_K *)(vy + a * by) + i)->d * xd;
            acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[a]), acc[a]);
        }
    }
    for (int a = 0; a < NA; a++) {
        __m128 m = _mm_add_ps(accm[a], _mm_movehl_ps(accm[a], accm[a]));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        s[a] = _mm512_reduce_add_ps(acc[a]) - _mm_cvtss_f32(m);
    }
}

static void vec_dot_q4_K(int n, float *s, const void *vx, const void *vy)
{
    dot_q4_K_n(n, s, vx, vy, 0, 1);
}

/* q6_K against NA activation rows, as dot_q4_K_n. */
static inline __attribute__((always_inline)) void dot_q6_K_n(int n, float *s, const void *vx,
                                                             const char *vy, size_t by, const int NA)
{
    const block_q6_K *x = vx;
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i idx[4] = {_mm512_loadu_si512(k6_idx[0]), _mm512_loadu_si512(k6_idx[1]),
                            _mm512_loadu_si512(k6_idx[2]), _mm512_loadu_si512(k6_idx[3])};
    __m512 acc[4];
    for (int a = 0; a < NA; a++) acc[a] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const float xd = half_to_f32(x[i].d);
        const __m256i sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i sc16 = _mm512_castsi256_si512(sc16y);
        __m512i sumi[4];
        for (int a = 0; a < NA; a++) {
            /* the -32 offset: -32 * sum(scale * bsum) */
            const block_q8_K *y = (const block_q8_K *)(vy + a * by) + i;
            const __m256i bias = _mm256_slli_epi32(
                _mm256_madd_epi16(sc16y, _mm256_loadu_si256((const __m256i *)y->bsums)), 5);
            sumi[a] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(bias));
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i Q = _mm512_loadu_si512(x[i].ql + 64 * h);
            const __m256i H = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            const __m512i H2 = _mm512_inserti64x4(_mm512_castsi256_si512(H), _mm256_srli_epi16(H, 2), 1);
            /* values 0..63: low nibbles, qh bits 0-1 (0..31) and 2-3 (32..63) */
            const __m512i v0 = _mm512_or_si512(_mm512_and_si512(Q, m4), _mm512_and_si512(_mm512_slli_epi16(H2, 4), m30));
            /* values 64..127: high nibbles, qh bits 4-5 and 6-7 */
            const __m512i v1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(Q, 4), m4), _mm512_and_si512(H2, m30));
            const __m512i sa = _mm512_permutexvar_epi16(idx[2 * h], sc16);
            const __m512i sb = _mm512_permutexvar_epi16(idx[2 * h + 1], sc16);
            for (int a = 0; a < NA; a++) {
                const int8_t *q8 = ((const block_q8_K *)(vy + a * by) + i)->qs + 128 * h;
                sumi[a] = _mm512_dpwssd_epi32(sumi[a], _mm512_maddubs_epi16(v0, _mm512_loadu_si512(q8)), sa);
                sumi[a] = _mm512_dpwssd_epi32(sumi[a], _mm512_maddubs_epi16(v1, _mm512_loadu_si512(q8 + 64)), sb);
            }
        }
        for (int a = 0; a < NA; a++) {
            const float d = ((const block_q8_K *)(vy + a * by) + i)->d * xd;
            acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[a]), acc[a]);
        }
    }
    for (int a = 0; a < NA; a++) s[a] = _mm512_reduce_add_ps(acc[a]);
}

static void vec_dot_q6_K(int n, float *s, const void *vx, const void *vy)
{
    dot_q6_K_n(n, s, vx, vy, 0, 1);
}

static void vec_dot4_q6_K(int n, float *s, const void *vx, const void *vy, size_t by)
{
    dot_q6_K_n(n, s, vx, vy, by, 4);
}

/* Two Q8_0 blocks' quants in one register (each block is 34 bytes). */
static inline __m512i load_q8_0_pair(const block_q8_0 *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b[0].qs)),
                              _mm256_loadu_si256((const __m256i *)b[1].qs), 1);
}

static void vec_dot_q8_0(int n, float *s, const void *vx, const void *vy)
{
    const block_q8_0 *x = vx, *y = vy;
    const int nb = n / QK8_0;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 3 < nb; i += 4) {
        for (int u = 0; u < 2; u++) {
            const block_q8_0 *xb = x + i + 2 * u, *yb = y + i + 2 * u;
            const __m512i qx = load_q8_0_pair(xb), qy = load_q8_0_pair(yb);
            const __mmask64 neg = _mm512_movepi8_mask(qx);
            const __m512i ax = _mm512_abs_epi8(qx);
            const __m512i sy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);
            const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy);
            const float d0 = half_to_f32(xb[0].d) * half_to_f32(yb[0].d);
            const float d1 = half_to_f32(xb[1].d) * half_to_f32(yb[1].d);
            const __m512 dv = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1);
            if (u == 0)
                acc0 = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(dot), acc0);
            else
                acc1 = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(dot), acc1);
        }
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < nb; i++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(qx), _mm256_sign_epi8(qy, qx));
        const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(dot), _mm256_extracti128_si256(dot, 1));
        sum += (float)hsum_epi32_128(s4) * (half_to_f32(x[i].d) * half_to_f32(y[i].d));
    }
    *s = sum;
}

/* Float dots: four 16-lane accumulators, 64 values per step; the tail in
 * 16s, then scalar. Summation order differs from the reference (f64). */
static inline __m512 load_f32(const void *p, int i)
{
    return _mm512_loadu_ps((const float *)p + i);
}

static inline __m512 load_f16(const void *p, int i)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const tg_half *)p + i)));
}

static inline __m512 load_bf16(const void *p, int i)
{
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const tg_bf16 *)p + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

#define DEFINE_FLOAT_DOT(NAME, LOAD, SCALAR)                                                   \
static void NAME(int n, float *s, const void *x, const void *y)                               \
{                                                                                              \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
    int i = 0;                                                                                 \
    for (; i + 64 <= n; i += 64) {                                                             \
        a0 = _mm512_fmadd_ps(LOAD(x, i), LOAD(y, i), a0);                                      \
        a1 = _mm512_fmadd_ps(LOAD(x, i + 16), LOAD(y, i + 16), a1);                            \
        a2 = _mm512_fmadd_ps(LOAD(x, i + 32), LOAD(y, i + 32), a2);                            \
        a3 = _mm512_fmadd_ps(LOAD(x, i + 48), LOAD(y, i + 48), a3);                            \
    }                                                                                          \
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LOAD(x, i), LOAD(y, i), a0);             \
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))); \
    for (; i < n; i++) sum += SCALAR(x, i) * SCALAR(y, i);                                     \
    *s = sum;                                                                                  \
}

#define SCALAR_F32(p, i) (((const float *)(p))[i])
#define SCALAR_F16(p, i) half_to_f32(((const tg_half *)(p))[i])
#define SCALAR_BF16(p, i) tg_bf16_to_f32(((const tg_bf16 *)(p))[i])
DEFINE_FLOAT_DOT(vec_dot_f32, load_f32, SCALAR_F32)
DEFINE_FLOAT_DOT(vec_dot_f16, load_f16, SCALAR_F16)
DEFINE_FLOAT_DOT(vec_dot_bf16, load_bf16, SCALAR_BF16)

void tg_cpu_fill_avx512(tg_cpu_kernels *k)
{
    k->vec_dot[TG_TYPE_Q4_K] = vec_dot_q4_K;
    k->vec_dot[TG_TYPE_Q6_K] = vec_dot_q6_K;
    k->vec_dot4[TG_TYPE_Q6_K] = vec_dot4_q6_K;
    k->vec_dot[TG_TYPE_Q8_0] = vec_dot_q8_0;
    k->vec_dot[TG_TYPE_F32] = vec_dot_f32;
    k->vec_dot[TG_TYPE_F16] = vec_dot_f16;
    k->vec_dot[TG_TYPE_BF16] = vec_dot_bf16;
}
