/*
 * kernels_avx512.c: AVX-512 (F, BW, VL, DQ) + VNNI versions of the hot
 * dot products: q4_K and q6_K against Q8_K, q8_0 against Q8_0, and the
 * float dots. The other kernels of this tier are the AVX2 ones (kernels.c
 * builds this tier on top of avx2).
 *
 * K-quants (q4_K, q6_K), one activation row: 64 weight quants per 512-bit
 * register, vpmaddubsw for the byte products (pairs in int16, no
 * saturation for |q8| <= 127), then vpdpwssd (VNNI) multiplies by the
 * 16-bit sub-block scales and accumulates in int32: the reference's
 * integers, summed per block and converted to float once per block; four
 * weight rows at a time in a matmul (one horizontal reduction for the four).
 * Several activation rows (prefill): 16-row tiles with one weight row per
 * vector lane, vpdpbusd against broadcast activation dwords (gemm16).
 * Both give the same bits (see "K-quant numerics" below).
 * Q8_0: two blocks per register, vpdpbusd on |x| and sign(x)*y.
 * F32 / F16 / BF16: 512-bit versions of the AVX2 float dots.
 */
/* No multiply-add contraction: the quantizers must round each product as
 * the reference does (explicit fmadd intrinsics stay fused). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "kernels_isa.h"
#include "kernels_x86.h"

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

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

/* --- K-quant numerics of this tier ----------------------------------------
 * For a weight row x and an activation row y, block by block: the exact
 * integer dot of the block, isum (sub-block scales applied; Q6_K's -32
 * offset folded in), and for Q4_K the exact integer sum of its mins
 * against the activation sums, imin; then in float
 *   acc  = fmaf(y.d * x.d,    (float)isum, acc)
 *   accm = fmaf(y.d * x.dmin, (float)imin, accm)     (Q4_K only)
 * and the dot is acc - accm. The single-row vec_dot and the 16-row tiles
 * (gemm16, one row per vector lane) compute these same operations, so a
 * tile's outputs are bit-identical to vec_dot's.
 */

/* Returns the sum of 16 int32 lanes. */
static inline int32_t hsum_epi32_512(__m512i v)
{
    const __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    return hsum_epi32_128(_mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1)));
}

/* Sums of 16 int32 lanes of v[0..3] in lanes 0..3 (one row each). */
TILE_INLINE __m128i hsum4_epi32_512(const __m512i v[4])
{
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    /* per 128-bit lane: partial sums of rows 0, 1, 2, 3 */
    const __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    const __m256i d = _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
}

/* Sums of 4 int32 lanes of v[0..3] in lanes 0..3. */
TILE_INLINE __m128i hsum4_epi32_128(const __m128i v[4])
{
    return _mm_hadd_epi32(_mm_hadd_epi32(v[0], v[1]), _mm_hadd_epi32(v[2], v[3]));
}

/* The scales and mins of NR (1..4) Q4_K blocks bx bytes apart, unpacked
 * together: in 128-bit lane r, block r's sc[0..7] then m[0..7] as bytes
 * (the layout of kernels_avx2.c's unpack_scales_k4). Each lane reads the block's 12 scale bytes
 * and the 4 quant bytes after them (ignored): dwords u0, u1, u2 give
 *   sc 0..3 = u0 & 0x3f..,  sc 4..7 = (u2 & 0x0f..) | ((u0 >> 2) & 0x30..),
 *   m 0..3  = u1 & 0x3f..,  m 4..7  = ((u2 >> 4) & 0x0f..) | ((u1 >> 2) & 0x30..). */
TILE_INLINE __m512i scales_k4_rows(const uint8_t *x, size_t bx, const int NR)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(x + offsetof(block_q4_K, scales))));
    /* (the lane index must be an immediate, also where loops are not unrolled) */
    if (NR > 1) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x + bx + offsetof(block_q4_K, scales))), 1);
    if (NR > 2) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x + 2 * bx + offsetof(block_q4_K, scales))), 2);
    if (NR > 3) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x + 3 * bx + offsetof(block_q4_K, scales))), 3);
    const __m512i a = _mm512_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));   /* u0, u2, u1, u2 */
    const __m512i b = _mm512_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));   /* u0, u0, u1, u1 */
    const __m512i mlo = _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f);
    const __m512i mhi = _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0);
    return _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi32(a, _mm512_set4_epi32(4, 0, 0, 0)), mlo),
                           _mm512_and_si512(_mm512_srli_epi32(b, 2), mhi));
}

/* NR (1 or 4) Q4_K rows x, bx bytes apart, against one activation row y:
 * s[r] = the dot of row r, in the numerics above (lane r of the float
 * vectors does row r's scalar operations). The scales of the NR rows are
 * unpacked together (scales_k4_rows), widened to int16 two rows per
 * register (row r's sc at int16 lanes 16 (r & 1) + 0..7, its m at + 8..15);
 * each 32 quant bytes are broadcast to both register halves, the upper
 * half shifted to its high nibbles. */
TILE_INLINE void rows_q4_K(int n, float *s, const uint8_t *x, size_t bx,
                                                            const block_q8_K *y, const int NR)
{
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i idx[2][4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        idx[0][g] = _mm512_loadu_si512(k4_idx[g]);
        idx[1][g] = _mm512_add_epi16(idx[0][g], _mm512_set1_epi16(16));
    }
    __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const uint8_t *xi = x + (size_t)i * sizeof(block_q4_K);
        if (NR > 1) prefetch_next_rows(x, bx, NR, i, nb);
        const __m128i b0 = _mm_loadu_si128((const __m128i *)y[i].bsums);
        const __m128i b1 = _mm_loadu_si128((const __m128i *)(y[i].bsums + 8));
        const __m128i bsub = _mm_hadd_epi16(b0, b1);   /* the 8 sub-block sums */
        const __m512i scm = scales_k4_rows(xi, bx, NR);
        __m512i w16[2];
        w16[0] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(scm));
        if (NR > 2) w16[1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(scm, 1));
        /* the mins against the sub-block sums: rows 0, 2 in 128-bit lane 1,
         * rows 1, 3 in lane 3 (4 partial int32 sums each) */
        const __m512i bm = _mm512_maskz_broadcast_i32x4(0xf0f0, bsub);
        const __m512i pm0 = _mm512_madd_epi16(w16[0], bm);
        __m512i yq[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) yq[g] = _mm512_loadu_si512(y[i].qs + 64 * g);
        __m512i sumi[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const block_q4_K *xr = (const block_q4_K *)(xi + r * bx);
            sumi[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xr->qs + 32 * g)));
                const __m512i w = _mm512_and_si512(_mm512_mask_srli_epi16(bits, 0xffff0000u, bits, 4), m4);
                const __m512i sc = _mm512_permutexvar_epi16(idx[r & 1][g], w16[r >> 1]);
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(w, yq[g]), sc);
            }
        }
        __m128i isum, imin;
        if (NR == 4) {
            const __m512i pm1 = _mm512_madd_epi16(w16[1], bm);
            const __m128i mins[4] = {_mm512_extracti32x4_epi32(pm0, 1), _mm512_extracti32x4_epi32(pm0, 3),
                                     _mm512_extracti32x4_epi32(pm1, 1), _mm512_extracti32x4_epi32(pm1, 3)};
            isum = hsum4_epi32_512(sumi);
            imin = hsum4_epi32_128(mins);
        } else {
            isum = _mm_cvtsi32_si128(hsum_epi32_512(sumi[0]));
            imin = _mm_cvtsi32_si128(hsum_epi32_128(_mm512_extracti32x4_epi32(pm0, 1)));
        }
        const __m128 yd = _mm_set1_ps(y[i].d);
        const __m128i dd = dwords(xi, bx, offsetof(block_q4_K, d), NR);   /* d, dmin */
        const __m128 d = _mm_mul_ps(yd, half_f32(dd, 0));
        const __m128 dmin = _mm_mul_ps(yd, half_f32(dd, 1));
        acc = _mm_fmadd_ps(d, _mm_cvtepi32_ps(isum), acc);
        accm = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(imin), accm);
    }
    float r4[4];
    _mm_storeu_ps(r4, _mm_sub_ps(acc, accm));
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) s[r] = r4[r];
}

static void vec_dot_q4_K(int n, float *s, const void *vx, const void *vy)
{
    rows_q4_K(n, s, vx, 0, vy, 1);
}

/* NR (1 or 4) Q6_K rows against one activation row, as rows_q4_K. */
TILE_INLINE void rows_q6_K(int n, float *s, const uint8_t *x, size_t bx,
                                                            const block_q8_K *y, const int NR)
{
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i idx[4] = {_mm512_loadu_si512(k6_idx[0]), _mm512_loadu_si512(k6_idx[1]),
                            _mm512_loadu_si512(k6_idx[2]), _mm512_loadu_si512(k6_idx[3])};
    __m128 acc = _mm_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const uint8_t *xi = x + (size_t)i * sizeof(block_q6_K);
        if (NR > 1) prefetch_next_rows(x, bx, NR, i, nb);
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        __m512i sumi[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const block_q6_K *xr = (const block_q6_K *)(xi + r * bx);
            const __m256i sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)xr->scales));
            const __m512i sc16 = _mm512_castsi256_si512(sc16y);
            /* the -32 offset: -32 * sum(scale * bsum) */
            const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(sc16y, bs), 5);
            sumi[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(bias));
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i Q = _mm512_loadu_si512(xr->ql + 64 * h);
                const __m256i H = _mm256_loadu_si256((const __m256i *)(xr->qh + 32 * h));
                const __m512i H2 = _mm512_inserti64x4(_mm512_castsi256_si512(H), _mm256_srli_epi16(H, 2), 1);
                /* values 0..63: low nibbles, qh bits 0-1 (0..31) and 2-3 (32..63) */
                const __m512i v0 = _mm512_or_si512(_mm512_and_si512(Q, m4), _mm512_and_si512(_mm512_slli_epi16(H2, 4), m30));
                /* values 64..127: high nibbles, qh bits 4-5 and 6-7 */
                const __m512i v1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(Q, 4), m4), _mm512_and_si512(H2, m30));
                const __m512i sa = _mm512_permutexvar_epi16(idx[2 * h], sc16);
                const __m512i sb = _mm512_permutexvar_epi16(idx[2 * h + 1], sc16);
                const int8_t *q8 = y[i].qs + 128 * h;
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(v0, _mm512_loadu_si512(q8)), sa);
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(v1, _mm512_loadu_si512(q8 + 64)), sb);
            }
        }
        __m128i isum;
        if (NR == 4) {
            isum = hsum4_epi32_512(sumi);
        } else {
            isum = _mm_cvtsi32_si128(hsum_epi32_512(sumi[0]));
        }
        /* d is the block's last two bytes: read with the scale bytes before it */
        const __m128 d = _mm_mul_ps(_mm_set1_ps(y[i].d), half_f32(dwords(xi, bx, offsetof(block_q6_K, d) - 2, NR), 1));
        acc = _mm_fmadd_ps(d, _mm_cvtepi32_ps(isum), acc);
    }
    float r4[4];
    _mm_storeu_ps(r4, acc);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) s[r] = r4[r];
}

static void vec_dot_q6_K(int n, float *s, const void *vx, const void *vy)
{
    rows_q6_K(n, s, vx, 0, vy, 1);
}

/* --- 16-row tiles -----------------------------------------------------------
 * A block of 16 weight rows is unpacked into "lane = row" form: W[k] holds,
 * in int32 lane r, the unsigned quants of values 4k..4k+3 of row r, so one
 * vpdpbusd against activation dword k (broadcast) advances all 16 dots by
 * four products. The scales, mins and d of the 16 rows sit in lanes the
 * same way. The unpacking (a 16x16 dword transpose of the packed quants)
 * is done once per block for every activation row of the call. */

/* Transposes 16 rows of 16 int32: on return r[c] lane i is what r[i] lane c
 * was. */
TILE_INLINE void transpose16(__m512i r[16])
{
    __m512i t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* r[4g + c], 128-bit lane q: column 4q + c of rows 4g..4g+3 */
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* a 4x4 transpose of 128-bit lanes among r[c], r[4+c], r[8+c], r[12+c] */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i b0 = _mm512_shuffle_i32x4(r[c], r[4 + c], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i b1 = _mm512_shuffle_i32x4(r[c], r[4 + c], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i b2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i b3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(3, 2, 3, 2));
        t[c] = _mm512_shuffle_i32x4(b0, b2, _MM_SHUFFLE(2, 0, 2, 0));
        t[4 + c] = _mm512_shuffle_i32x4(b0, b2, _MM_SHUFFLE(3, 1, 3, 1));
        t[8 + c] = _mm512_shuffle_i32x4(b1, b3, _MM_SHUFFLE(2, 0, 2, 0));
        t[12 + c] = _mm512_shuffle_i32x4(b1, b3, _MM_SHUFFLE(3, 1, 3, 1));
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Loads 64 bytes at p + r * bx for the 16 rows r and transposes them:
 * t[k] lane r = dword k of row r's 64 bytes. */
TILE_INLINE void load_transposed(__m512i t[16], const uint8_t *p, size_t bx)
{
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) t[r] = _mm512_loadu_si512(p + r * bx);
    transpose16(t);
}

/* The int32 at byte offset off of each of 16 rows bx apart, one per lane. */
TILE_INLINE __m512i gather_rows(const uint8_t *p, size_t bx, int off)
{
    const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)bx));
    return _mm512_i32gather_epi32(vidx, p + off, 1);
}

/* Byte b (0..3) of each int32 lane, zero-extended. */
TILE_INLINE __m512i byte_u(__m512i v, int b)
{
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * b), _mm512_set1_epi32(0xff));
}

/* Byte b (0..3) of each int32 lane, sign-extended. */
TILE_INLINE __m512i byte_s(__m512i v, int b)
{
    return _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * b), 24);
}

/* int16 pair (lo, hi) per int32 lane from two int32 vectors of small values. */
TILE_INLINE __m512i pair16(__m512i lo, __m512i hi)
{
    return _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(hi, 16));
}

/* fp16 in bits 16*half.. of each int32 lane, as float. */
TILE_INLINE __m512 half_lanes(__m512i v, int half)
{
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(half ? _mm512_srli_epi32(v, 16) : v));
}

/* The scales, mins and d of 16 rows of a Q4_K block, lane = row. */
typedef struct {
    __m512i sc[8];   /* sub-block scales, int32 */
    __m512i mp[4];   /* mins as int16 pairs (m[2k], m[2k+1]) */
    __m512 d, dmin;
} head_q4_K;

TILE_INLINE void head_q4_K_load(head_q4_K *t, const uint8_t *x, size_t bx)
{
    const __m512i dd = gather_rows(x, bx, 0);
    t->d = half_lanes(dd, 0);
    t->dmin = half_lanes(dd, 1);
    const __m512i u0 = gather_rows(x, bx, 4), u1 = gather_rows(x, bx, 8), u2 = gather_rows(x, bx, 12);
    const __m512i k63 = _mm512_set1_epi32(0x3f3f3f3f), k15 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i k3 = _mm512_set1_epi32(0x03030303);
    const __m512i sa = _mm512_and_si512(u0, k63);
    const __m512i sb = _mm512_or_si512(_mm512_and_si512(u2, k15),
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4));
    const __m512i ma = _mm512_and_si512(u1, k63);
    const __m512i mb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k15),
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4));
    for (int b = 0; b < 4; b++) {
        t->sc[b] = byte_u(sa, b);
        t->sc[4 + b] = byte_u(sb, b);
    }
    t->mp[0] = pair16(byte_u(ma, 0), byte_u(ma, 1));
    t->mp[1] = pair16(byte_u(ma, 2), byte_u(ma, 3));
    t->mp[2] = pair16(byte_u(mb, 0), byte_u(mb, 1));
    t->mp[3] = pair16(byte_u(mb, 2), byte_u(mb, 3));
}

/* The Q4_K quants of 16 rows of a block, lane = row: half (0, 1) of the
 * qs bytes, transposed, split into nibbles. Sub-block j = 4 half + k has
 * its activation dwords 8j..8j+7 in w[k][0..7]. */
TILE_INLINE void quants_q4_K(__m512i w[4][8], const uint8_t *x, size_t bx, int half)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i q[16];
    /* qs dword 16 half + c: low nibbles are sub-block 4 half + 2 (c / 8),
     * high nibbles the next one; activation dword c % 8 of each */
    load_transposed(q, x + offsetof(block_q4_K, qs) + 64 * half, bx);
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) {
        w[2 * (c / 8)][c % 8] = _mm512_and_si512(q[c], m4);
        w[2 * (c / 8) + 1][c % 8] = _mm512_and_si512(_mm512_srli_epi16(q[c], 4), m4);
    }
}

/* sum_j sc[j] * (w[j] . a[8j..8j+7]) over sub-blocks j0..j0+3. */
TILE_INLINE __m512i isum_q4_K(__m512i isum, const __m512i w[4][8], const __m512i *sc, const int32_t *a)
{
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i sj = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int s8 = 0; s8 < 8; s8++) sj = _mm512_dpbusd_epi32(sj, w[k][s8], _mm512_set1_epi32(a[8 * k + s8]));
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sj, sc[k]));
    }
    return isum;
}

/* The float update of one activation block from the rows' integer dots. */
TILE_INLINE void finish_q4_K(const head_q4_K *t, const block_q8_K *y, __m512i isum, __m512 *acc, __m512 *accm)
{
    int32_t bp[4];
    const __m128i b0 = _mm_loadu_si128((const __m128i *)y->bsums);
    const __m128i b1 = _mm_loadu_si128((const __m128i *)(y->bsums + 8));
    _mm_storeu_si128((__m128i *)bp, _mm_hadd_epi16(b0, b1));   /* sub-block sums, in pairs */
    __m512i imin = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) imin = _mm512_dpwssd_epi32(imin, t->mp[k], _mm512_set1_epi32(bp[k]));
    const __m512 yd = _mm512_set1_ps(y->d);
    *acc = _mm512_fmadd_ps(_mm512_mul_ps(yd, t->d), _mm512_cvtepi32_ps(isum), *acc);
    *accm = _mm512_fmadd_ps(_mm512_mul_ps(yd, t->dmin), _mm512_cvtepi32_ps(imin), *accm);
}

/* Activation rows per pass over the weight blocks: the accumulators of a
 * pass live on the stack. */
#define TILE_NB 64

static void gemm16_q4_K(int n, float *out, size_t os, const void *vx, size_t bx, const void *vy, size_t by,
                        int nb)
{
    const int nblk = n / QK_K;
    const uint8_t *x = vx;
    head_q4_K h;
    if (nb == 1) {
        /* one activation row: rows four at a time, each weight read once */
        for (int r = 0; r < 16; r += 4) rows_q4_K(n, out + r, x + (size_t)r * bx, bx, vy, 4);
        return;
    }
    __m512i w[2][4][8];
    __m512 acc[TILE_NB], accm[TILE_NB];
    for (int b0 = 0; b0 < nb; b0 += TILE_NB) {
        const int m = nb - b0 < TILE_NB ? nb - b0 : TILE_NB;
        const char *yb = (const char *)vy + (size_t)b0 * by;
        for (int b = 0; b < m; b++) acc[b] = accm[b] = _mm512_setzero_ps();
        for (int i = 0; i < nblk; i++) {
            const uint8_t *xi = x + (size_t)i * sizeof(block_q4_K);
            if (b0 == 0) prefetch_next_rows(vx, bx, 16, i, nblk);
            head_q4_K_load(&h, xi, bx);
            quants_q4_K(w[0], xi, bx, 0);
            quants_q4_K(w[1], xi, bx, 1);
            for (int b = 0; b < m; b++) {
                const block_q8_K *y = (const block_q8_K *)(yb + (size_t)b * by) + i;
                __m512i isum = isum_q4_K(_mm512_setzero_si512(), w[0], h.sc, (const int32_t *)y->qs);
                isum = isum_q4_K(isum, w[1], h.sc + 4, (const int32_t *)y->qs + 32);
                finish_q4_K(&h, y, isum, &acc[b], &accm[b]);
            }
        }
        for (int b = 0; b < m; b++) _mm512_storeu_ps(out + (size_t)(b0 + b) * os, _mm512_sub_ps(acc[b], accm[b]));
    }
}

/* The scales and d of 16 rows of a Q6_K block, lane = row. */
typedef struct {
    __m512i sc[16];  /* sub-block scales, int32 */
    __m512i sp[8];   /* scales as int16 pairs (sc[2k], sc[2k+1]), for the offset */
    __m512 d;
} head_q6_K;

TILE_INLINE void head_q6_K_load(head_q6_K *t, const uint8_t *x, size_t bx)
{
    for (int w = 0; w < 4; w++) {
        const __m512i u = gather_rows(x, bx, (int)offsetof(block_q6_K, scales) + 4 * w);
        for (int b = 0; b < 4; b++) t->sc[4 * w + b] = byte_s(u, b);
    }
    for (int k = 0; k < 8; k++) t->sp[k] = pair16(t->sc[2 * k], t->sc[2 * k + 1]);
    /* d is the block's last two bytes: read with the two scales before it */
    t->d = half_lanes(gather_rows(x, bx, (int)offsetof(block_q6_K, d) - 2), 1);
}

/* The Q6_K quants (0..63) of 16 rows of a block, lane = row, half h (128
 * values): w[u][k] holds values 128h + 32u + 4k..+3, i.e. sub-block
 * 8h + 2u + k / 4, activation dword 32h + 8u + k. qh: the block's qh
 * bytes transposed (dword 8h + k: bytes 32h + 4k..). */
TILE_INLINE void quants_q6_K(__m512i w[4][8], const uint8_t *x, size_t bx, const __m512i qh[16], int h)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512i ql[16];
    /* ql dword k: bytes 64h + 4k: values 128h + 4k (low nibble), + 64
     * (high); dword 8 + k: 32 further on */
    load_transposed(ql, x + offsetof(block_q6_K, ql) + 64 * h, bx);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m512i a = ql[k], b = ql[8 + k], H = qh[8 * h + k];
        w[0][k] = _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_and_si512(_mm512_slli_epi16(H, 4), m30));
        w[1][k] = _mm512_or_si512(_mm512_and_si512(b, m4), _mm512_and_si512(_mm512_slli_epi16(H, 2), m30));
        w[2][k] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), _mm512_and_si512(H, m30));
        w[3][k] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), m4),
                                  _mm512_and_si512(_mm512_srli_epi16(H, 2), m30));
    }
}

/* sum_j sc[j] * (quants of sub-block j . activations) over the 8
 * sub-blocks of a half (w from quants_q6_K, a its 32 activation dwords). */
TILE_INLINE __m512i isum_q6_K(__m512i isum, const __m512i w[4][8], const __m512i *sc, const int32_t *a)
{
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const int u = j / 2, k0 = 4 * (j % 2);
        __m512i sj = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int s4 = 0; s4 < 4; s4++)
            sj = _mm512_dpbusd_epi32(sj, w[u][k0 + s4], _mm512_set1_epi32(a[8 * u + k0 + s4]));
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sj, sc[j]));
    }
    return isum;
}

/* The -32 offset and the float update of one activation block. */
TILE_INLINE void finish_q6_K(const head_q6_K *t, const block_q8_K *y, __m512i isum, __m512 *acc)
{
    const int32_t *bs = (const int32_t *)y->bsums;
    __m512i bias = _mm512_setzero_si512();
    for (int k = 0; k < 8; k++) bias = _mm512_dpwssd_epi32(bias, t->sp[k], _mm512_set1_epi32(bs[k]));
    isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(bias, 5));
    *acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(y->d), t->d), _mm512_cvtepi32_ps(isum), *acc);
}

static void gemm16_q6_K(int n, float *out, size_t os, const void *vx, size_t bx, const void *vy, size_t by,
                        int nb)
{
    const int nblk = n / QK_K;
    const uint8_t *x = vx;
    head_q6_K h;
    __m512i qh[16];
    if (nb == 1) {
        for (int r = 0; r < 16; r += 4) rows_q6_K(n, out + r, x + (size_t)r * bx, bx, vy, 4);
        return;
    }
    __m512i w[2][4][8];
    __m512 acc[TILE_NB];
    for (int b0 = 0; b0 < nb; b0 += TILE_NB) {
        const int m = nb - b0 < TILE_NB ? nb - b0 : TILE_NB;
        const char *yb = (const char *)vy + (size_t)b0 * by;
        for (int b = 0; b < m; b++) acc[b] = _mm512_setzero_ps();
        for (int i = 0; i < nblk; i++) {
            const uint8_t *xi = x + (size_t)i * sizeof(block_q6_K);
            if (b0 == 0) prefetch_next_rows(vx, bx, 16, i, nblk);
            head_q6_K_load(&h, xi, bx);
            load_transposed(qh, xi + offsetof(block_q6_K, qh), bx);
            quants_q6_K(w[0], xi, bx, qh, 0);
            quants_q6_K(w[1], xi, bx, qh, 1);
            for (int b = 0; b < m; b++) {
                const block_q8_K *y = (const block_q8_K *)(yb + (size_t)b * by) + i;
                __m512i isum = isum_q6_K(_mm512_setzero_si512(), w[0], h.sc, (const int32_t *)y->qs);
                isum = isum_q6_K(isum, w[1], h.sc + 8, (const int32_t *)y->qs + 32);
                finish_q6_K(&h, y, isum, &acc[b]);
            }
        }
        for (int b = 0; b < m; b++) _mm512_storeu_ps(out + (size_t)(b0 + b) * os, acc[b]);
    }
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
    k->gemm16[TG_TYPE_Q4_K] = gemm16_q4_K;
    k->gemm16[TG_TYPE_Q6_K] = gemm16_q6_K;
    k->vec_dot[TG_TYPE_Q8_0] = vec_dot_q8_0;
    k->vec_dot[TG_TYPE_F32] = vec_dot_f32;
    k->vec_dot[TG_TYPE_F16] = vec_dot_f16;
    k->vec_dot[TG_TYPE_BF16] = vec_dot_bf16;
}
