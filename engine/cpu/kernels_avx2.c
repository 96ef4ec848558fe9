/*
 * kernels_avx2.c: AVX2 + FMA + F16C kernels (x86-64), compiled with those
 * ISA flags and only called after cpuid said yes (kernels.c).
 *
 * K-quant dots work one super-block at a time: weight quants are unpacked
 * to unsigned bytes, multiplied with the Q8_K quants by vpmaddubsw (pairs
 * summed in int16: at most 2*63*127, no saturation), scaled per sub-block
 * by vpmaddwd with the 16-bit scales, accumulated in int32, and only then
 * converted to float and scaled by d: the same integers as the reference,
 * in float only once per block. Q6_K's -32 offset is folded in as
 * 32 * sum(scale * bsum), Q4_K/Q5_K's mins as dmin * sum(min * bsum).
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
#include <string.h>

static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum_ps128(__m128 s)
{
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Unpacks the 12 scale bytes of a Q4_K/Q5_K block into sc[8] (bytes 0..7)
 * and m[8] (bytes 8..15) of one 16-byte value. */
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

/* unpack_scales_k4 of R (1..4) Q4_K blocks bx bytes apart (x at their
 * first byte), two at a time in the two 128-bit lanes: each lane reads its
 * block's 12 scale bytes and the 4 quant bytes after them (ignored);
 * dwords u0, u1, u2 give
 *   sc 0..3 = u0 & 0x3f..,  sc 4..7 = (u2 & 0x0f..) | ((u0 >> 2) & 0x30..),
 *   m 0..3  = u1 & 0x3f..,  m 4..7  = ((u2 >> 4) & 0x0f..) | ((u1 >> 2) & 0x30..). */
TILE_INLINE void scales_k4_rows(__m128i scmin[4], const uint8_t *x, size_t bx, const int R)
{
    const __m256i mlo = _mm256_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f,
                                          0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f);
    const __m256i mhi = _mm256_setr_epi32(0, 0x30303030, 0, 0x30303030, 0, 0x30303030, 0, 0x30303030);
    const __m256i shift = _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4);
#pragma GCC unroll 2
    for (int r = 0; r < R; r += 2) {
        const uint8_t *p = x + (size_t)r * bx + offsetof(block_q4_K, scales);
        const __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(r + 1 < R ? p + bx : p)),
                                           _mm_loadu_si128((const __m128i *)p));
        const __m256i a = _mm256_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));   /* u0, u2, u1, u2 */
        const __m256i b = _mm256_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));   /* u0, u0, u1, u1 */
        const __m256i sm = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(a, shift), mlo),
                                           _mm256_and_si256(_mm256_srli_epi32(b, 2), mhi));
        scmin[r] = _mm256_castsi256_si128(sm);
        if (r + 1 < R) scmin[r + 1] = _mm256_extracti128_si256(sm, 1);
    }
}

/* The 8 sub-block sums of a Q8_K block (bsums in pairs) as int16. */
static inline __m128i bsums_sub(const int16_t *bsums)
{
    const __m128i b0 = _mm_loadu_si128((const __m128i *)bsums);
    const __m128i b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    return _mm_hadd_epi16(b0, b1);
}

/* m[j] * (bsums[2j] + bsums[2j+1]) for the 8 sub-blocks, as 4 int32
 * partial sums (the reference's integer sum, split in lanes). */
static inline __m128i mins_dot(__m128i scmin, const int16_t *bsums)
{
    return _mm_madd_epi16(bsums_sub(bsums), _mm_cvtepu8_epi16(_mm_srli_si128(scmin, 8)));
}

/* vpshufb controls over 8 int16 scales held in both 128-bit halves:
 * k_bcast[j] spreads scale j over all 16 lanes, k_pair[k] puts scale 2k in
 * the low half and scale 2k+1 in the high half. */
static const uint8_t k_bcast[8][32] = {
#define B(j) {2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1, \
              2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1}
    B(0), B(1), B(2), B(3), B(4), B(5), B(6), B(7)
#undef B
};
static const uint8_t k_pair[4][32] = {
#define P(k) {4*k,4*k+1,4*k,4*k+1,4*k,4*k+1,4*k,4*k+1,4*k,4*k+1,4*k,4*k+1,4*k,4*k+1,4*k,4*k+1, \
              4*k+2,4*k+3,4*k+2,4*k+3,4*k+2,4*k+3,4*k+2,4*k+3,4*k+2,4*k+3,4*k+2,4*k+3,4*k+2,4*k+3,4*k+2,4*k+3}
    P(0), P(1), P(2), P(3)
#undef P
};

static inline __m256i scale_bcast(__m256i sc16x2, int j)
{
    return _mm256_shuffle_epi8(sc16x2, _mm256_loadu_si256((const __m256i *)k_bcast[j]));
}

static inline __m256i scale_pair(__m256i sc16x2, int k)
{
    return _mm256_shuffle_epi8(sc16x2, _mm256_loadu_si256((const __m256i *)k_pair[k]));
}

/* --- K-quant tiles (q4_K, q6_K) --------------------------------------------
 * R (1..4) weight rows bx bytes apart against T (1..4) activation rows by
 * bytes apart: each 32 weight quants are unpacked once (and their scales
 * spread once) for the T activation rows, and each activation register is
 * used for the R weight rows. Numerics are those of the AVX-512 tier
 * (kernels_avx512.c, "K-quant numerics"): for a weight row x and an
 * activation row y, block by block, the exact integer dot of the block
 * (sub-block scales applied, Q6_K's -32 offset folded in) isum and for
 * Q4_K the exact integer sum of its mins against the activation sums imin,
 * then in float
 *   acc  = fmaf(y.d * x.d,    (float)isum, acc)
 *   accm = fmaf(y.d * x.dmin, (float)imin, accm)     (Q4_K only)
 * and the dot is acc - accm; lane r of the float vectors does row r's
 * operations. vec_dot is the 1 x 1 tile, so every tile's outputs are
 * bit-identical to vec_dot's. Outputs: out[t * os + r]. */

/* Keeps v in a register at this point: without it GCC regroups a tile's
 * integer sums (reassociation), holds the products of a whole block at
 * once and spills them to the stack. */
#define IN_REG(v) __asm__("" : "+x"(v))

/* Sums of the 8 int32 lanes of v[0..R-1] in lanes 0..R-1 (exact). */
TILE_INLINE __m128i hsum_rows(const __m256i v[4], const int R)
{
    const __m256i z = _mm256_setzero_si256();
    const __m256i a = _mm256_hadd_epi32(v[0], R > 1 ? v[1] : z);
    const __m256i b = R > 2 ? _mm256_hadd_epi32(v[2], R > 3 ? v[3] : z) : z;
    const __m256i c = _mm256_hadd_epi32(a, b);
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

/* Sums of the 4 int32 lanes of v[0..R-1] in lanes 0..R-1 (exact). */
TILE_INLINE __m128i hsum_rows128(const __m128i v[4], const int R)
{
    const __m128i z = _mm_setzero_si128();
    return _mm_hadd_epi32(_mm_hadd_epi32(v[0], R > 1 ? v[1] : z),
                          R > 2 ? _mm_hadd_epi32(v[2], R > 3 ? v[3] : z) : z);
}

/* Stores lane r of acc[t] at out[t * os + r] for r < R, t < T. */
TILE_INLINE void store_tile(float *out, size_t os, const __m128 acc[4], const int R, const int T)
{
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float v[4];
        _mm_storeu_ps(v, acc[t]);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) out[(size_t)t * os + r] = v[r];
    }
}

TILE_INLINE void tile_q4_K(int n, float *out, size_t os, const uint8_t *x, size_t bx, const char *vy, size_t by,
                           const int R, const int T, const int prefetch)
{
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m128 acc[4], accm[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = accm[t] = _mm_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const uint8_t *xi = x + (size_t)i * sizeof(block_q4_K);
        if (prefetch) prefetch_next_rows(x, bx, R, i, nb);
        const block_q8_K *y[4];
        __m128i scmin[4];
        __m256i sc16[4], sumi[4][4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[t] = (const block_q8_K *)(vy + (size_t)t * by) + i;
        scales_k4_rows(scmin, xi, bx, R);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            sc16[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scmin[r]));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) sumi[r][t] = _mm256_setzero_si256();
        }
        /* sub-block c: the low (c even) or high nibbles of qs bytes 32 (c / 2).. */
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m256i bits = _mm256_loadu_si256((const __m256i *)(xi + (size_t)r * bx + offsetof(block_q4_K, qs) + 32 * (c / 2)));
                const __m256i w = _mm256_and_si256(c & 1 ? _mm256_srli_epi16(bits, 4) : bits, m4);
                const __m256i s = scale_bcast(sc16[r], c);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[t]->qs + 32 * c));
                    sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(w, q8), s));
                    IN_REG(sumi[r][t]);
                }
            }
        }
        const __m128i dd = dwords(xi, bx, offsetof(block_q4_K, d), R);   /* d, dmin */
        const __m128 xd = half_f32(dd, 0), xdmin = half_f32(dd, 1);
        __m128i m16[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) m16[r] = _mm_cvtepu8_epi16(_mm_srli_si128(scmin[r], 8));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i rs[4];
            __m128i mins[4];
            const __m128i bsub = bsums_sub(y[t]->bsums);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                rs[r] = sumi[r][t];
                mins[r] = _mm_madd_epi16(m16[r], bsub);
            }
            const __m128 yd = _mm_set1_ps(y[t]->d);
            acc[t] = _mm_fmadd_ps(_mm_mul_ps(yd, xd), _mm_cvtepi32_ps(hsum_rows(rs, R)), acc[t]);
            accm[t] = _mm_fmadd_ps(_mm_mul_ps(yd, xdmin), _mm_cvtepi32_ps(hsum_rows128(mins, R)), accm[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = _mm_sub_ps(acc[t], accm[t]);
    store_tile(out, os, acc, R, T);
}

static void vec_dot_q4_K(int n, float *s, const void *vx, const void *vy)
{
    tile_q4_K(n, s, 1, vx, 0, vy, 0, 1, 1, 0);
}

/* q6_K tile, as tile_q4_K: quants used unsigned (0..63), the offset folded
 * in as -32 * sum(scale * bsum). Chunk c (32 values, sub-blocks 2c and
 * 2c + 1) of half h = c / 4, u = c % 4: the low (u < 2) or high nibbles of
 * ql bytes 64h + 32 (u % 2).., with qh bits 2u, 2u + 1 of bytes 32h... */
TILE_INLINE void tile_q6_K(int n, float *out, size_t os, const uint8_t *x, size_t bx, const char *vy, size_t by,
                           const int R, const int T, const int prefetch)
{
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    __m128 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = _mm_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const uint8_t *xi = x + (size_t)i * sizeof(block_q6_K);
        if (prefetch) prefetch_next_rows(x, bx, R, i, nb);
        const block_q8_K *y[4];
        __m256i sumi[4][4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[t] = (const block_q8_K *)(vy + (size_t)t * by) + i;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const block_q6_K *xr = (const block_q6_K *)(xi + (size_t)r * bx);
            const __m256i sc16all = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)xr->scales));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const __m256i bs = _mm256_loadu_si256((const __m256i *)y[t]->bsums);
                sumi[r][t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16all, bs), 5));
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i sc16[4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const block_q6_K *xr = (const block_q6_K *)(xi + (size_t)r * bx);
                /* the 8 int16 scales of this half in both 128-bit lanes */
                sc16[r] = _mm256_broadcastsi128_si256(
                    _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(xr->scales + 8 * h))));
            }
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const block_q6_K *xr = (const block_q6_K *)(xi + (size_t)r * bx);
                    const __m256i Q = _mm256_loadu_si256((const __m256i *)(xr->ql + 64 * h + 32 * (u % 2)));
                    const __m256i H = _mm256_loadu_si256((const __m256i *)(xr->qh + 32 * h));
                    const __m256i lo = _mm256_and_si256(u < 2 ? Q : _mm256_srli_epi16(Q, 4), m4);
                    const __m256i hb = u == 0 ? _mm256_slli_epi16(H, 4)
                                     : u == 1 ? _mm256_slli_epi16(H, 2)
                                     : u == 2 ? H : _mm256_srli_epi16(H, 2);
                    const __m256i w = _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
                    const __m256i s = scale_pair(sc16[r], u);
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++) {
                        const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[t]->qs + 128 * h + 32 * u));
                        sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(w, q8), s));
                        IN_REG(sumi[r][t]);
                    }
                }
            }
        }
        /* d is the block's last two bytes: read with the scale bytes before it */
        const __m128 xd = half_f32(dwords(xi, bx, offsetof(block_q6_K, d) - 2, R), 1);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i rs[4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) rs[r] = sumi[r][t];
            acc[t] = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(y[t]->d), xd), _mm_cvtepi32_ps(hsum_rows(rs, R)), acc[t]);
        }
    }
    store_tile(out, os, acc, R, T);
}

static void vec_dot_q6_K(int n, float *s, const void *vx, const void *vy)
{
    tile_q6_K(n, s, 1, vx, 0, vy, 0, 1, 1, 0);
}

static void vec_dot4_q6_K(int n, float *s, const void *vx, const void *vy, size_t by)
{
    tile_q6_K(n, s, 1, vx, 0, vy, by, 1, 4, 0);
}

/* --- prefill (gemm16 with several activation rows) ------------------------ */

/* Activation rows per pass over the weight blocks: the float accumulators
 * of a pass live on the stack. */
#define TILE_NB 64

/* gemm16's one activation row (decode): the 16 rows through 4 x 1 tiles
 * that prefetch the rows after them. */
#define DECODE16(TILE)                                                                                   \
    do {                                                                                                 \
        if (nb == 1) {                                                                                   \
            for (int r = 0; r < 16; r += 4) TILE(n, out + r, os, x + (size_t)r * bx, bx, vy, by, 4, 1, 1); \
            return;                                                                                      \
        }                                                                                                \
    } while (0)

/* --- Q4_K prefill with one weight row per lane -----------------------------
 * 8 weight rows per register, int32 lane r for row r: a block's quants are
 * transposed once per pass (W[j][k] lane r: values 4k..4k+3 of sub-block j
 * of row r), and each activation dword (broadcast) advances the 8 rows by
 * four products through one vpmaddubsw. The 8 int16 pair sums of a
 * sub-block (each at most 2 * 15 * 127) add up in int16 (at most 30480),
 * one vpmaddwd applies the rows' scales: the same exact integer sums as
 * the tiles above, and the same float updates per row, so the outputs are
 * bit-identical to vec_dot's with fewer multiplies (9 against 16 per 256
 * products). Each quant register, once loaded, serves four activation rows
 * (tokens), so a pass reads the unpacked block once per four tokens. */

/* One Q4_K block of 8 rows, one row per lane. */
typedef struct {
    __m256i w[8][8];   /* [sub-block][dword] quants, unsigned */
    __m256i s[8];      /* [sub-block] scale as an int16 pair (sc, sc) */
    __m256i mp[4];     /* mins as int16 pairs (m[2k], m[2k+1]) */
    __m256 d, dmin;
} lanes8_q4_K;

/* Transposes 8 rows of 8 int32: on return r[k] lane i is what r[i] lane k
 * was. Rows 4h..4h+3 are first transposed within 128-bit lanes (u[4h + k]:
 * column k, and 4 + k in the upper lane), then the lanes are exchanged. */
TILE_INLINE void transpose8(__m256i r[8])
{
    __m256i u[8];
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) {
        const __m256i a = _mm256_unpacklo_epi32(r[h], r[h + 1]), b = _mm256_unpackhi_epi32(r[h], r[h + 1]);
        const __m256i c = _mm256_unpacklo_epi32(r[h + 2], r[h + 3]), d = _mm256_unpackhi_epi32(r[h + 2], r[h + 3]);
        u[h] = _mm256_unpacklo_epi64(a, c);
        u[h + 1] = _mm256_unpackhi_epi64(a, c);
        u[h + 2] = _mm256_unpacklo_epi64(b, d);
        u[h + 3] = _mm256_unpackhi_epi64(b, d);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* t[r]: 16 int16 scales (or scales and mins) of row r of 8. On return t[k]
 * lane r is row r's dword k (values 2k, 2k + 1), and for k < NK, s[2k] and
 * s[2k + 1] lane r the int16 pairs (v 2k, v 2k) and (v 2k+1, v 2k+1): each
 * row's scale of a sub-block in its lane, as vpmaddwd applies it. */
TILE_INLINE void scale_lanes(__m256i t[8], __m256i *s, const int NK)
{
    transpose8(t);
    const __m256i dup_lo = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                            0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i dup_hi = _mm256_add_epi8(dup_lo, _mm256_set1_epi8(2));
#pragma GCC unroll 8
    for (int k = 0; k < NK; k++) {
        s[2 * k] = _mm256_shuffle_epi8(t[k], dup_lo);
        s[2 * k + 1] = _mm256_shuffle_epi8(t[k], dup_hi);
    }
}

TILE_INLINE void lanes8_q4_K_load(lanes8_q4_K *L, const uint8_t *xi, size_t bx)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m128i dd0 = dwords(xi, bx, offsetof(block_q4_K, d), 4);
    const __m128i dd1 = dwords(xi + 4 * bx, bx, offsetof(block_q4_K, d), 4);
    L->d = _mm256_set_m128(half_f32(dd1, 0), half_f32(dd0, 0));
    L->dmin = _mm256_set_m128(half_f32(dd1, 1), half_f32(dd0, 1));
    /* row r's scales and mins as int16: dwords (sc 2k, sc 2k+1) for k < 4,
     * then (m 2k, m 2k+1); transposed, t[k] lane r is row r's dword k */
    __m128i scmin[8];
    scales_k4_rows(scmin, xi, bx, 4);
    scales_k4_rows(scmin + 4, xi + 4 * bx, bx, 4);
    __m256i t[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) t[r] = _mm256_cvtepu8_epi16(scmin[r]);
    scale_lanes(t, L->s, 4);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) L->mp[k] = t[4 + k];
#pragma GCC unroll 1
    for (int g = 0; g < 4; g++) {
        __m256i q[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            q[r] = _mm256_loadu_si256((const __m256i *)(xi + (size_t)r * bx + offsetof(block_q4_K, qs) + 32 * g));
        transpose8(q);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            L->w[2 * g][k] = _mm256_and_si256(q[k], m4);
            L->w[2 * g + 1][k] = _mm256_and_si256(_mm256_srli_epi16(q[k], 4), m4);
        }
    }
}

/* The 8 rows of L against activation rows y[0..T-1] (T 1..4): acc[t],
 * accm[t] (lane r: row r) updated as vec_dot does. */
TILE_INLINE void lanes8_q4_K_pass(const lanes8_q4_K *L, const block_q8_K *const y[4], __m256 acc[4], __m256 accm[4],
                                  const int T)
{
    const int32_t *a[4];
    __m256i is[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        a[t] = (const int32_t *)y[t]->qs;
        is[t] = _mm256_setzero_si256();
    }
#pragma GCC unroll 1
    for (int j = 0; j < 8; j++) {
        __m256i h[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) h[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i w = _mm256_load_si256(&L->w[j][k]);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                h[t] = _mm256_add_epi16(h[t], _mm256_maddubs_epi16(w, _mm256_set1_epi32(a[t][8 * j + k])));
                IN_REG(h[t]);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(h[t], L->s[j]));
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        /* the sub-block sums in pairs (b 2k, b 2k+1), pair k in every lane */
        const __m256i bp = _mm256_broadcastsi128_si256(bsums_sub(y[t]->bsums));
        __m256i imin = _mm256_madd_epi16(L->mp[0], _mm256_shuffle_epi32(bp, 0x00));
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(L->mp[1], _mm256_shuffle_epi32(bp, 0x55)));
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(L->mp[2], _mm256_shuffle_epi32(bp, 0xaa)));
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(L->mp[3], _mm256_shuffle_epi32(bp, 0xff)));
        const __m256 yd = _mm256_set1_ps(y[t]->d);
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(yd, L->d), _mm256_cvtepi32_ps(is[t]), acc[t]);
        accm[t] = _mm256_fmadd_ps(_mm256_mul_ps(yd, L->dmin), _mm256_cvtepi32_ps(imin), accm[t]);
    }
}

/* Activation rows b .. b+T-1 (T 1..4) of a pass against the 8-row groups
 * of one block: the float accumulators acc[b + t][g], accm[b + t][g]. */
TILE_INLINE void lanes8_q4_K_rows(const lanes8_q4_K L[2], const char *yb, size_t by, int i, int b,
                                  __m256 acc[][2], __m256 accm[][2], const int T)
{
    const block_q8_K *y[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) y[t] = (const block_q8_K *)(yb + (size_t)(b + t) * by) + i;
#pragma GCC unroll 1
    for (int g = 0; g < 2; g++) {
        __m256 a[4], am[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            a[t] = acc[b + t][g];
            am[t] = accm[b + t][g];
        }
        lanes8_q4_K_pass(&L[g], y, a, am, T);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            acc[b + t][g] = a[t];
            accm[b + t][g] = am[t];
        }
    }
}

/* gemm16 for Q4_K: one activation row (decode) through the 4 x 1 tiles (the
 * next rows prefetched), more through the one-row-per-lane passes, four
 * activation rows at a time (the last one to three one by one). */
static void gemm16_q4_K(int n, float *out, size_t os, const void *vx, size_t bx, const void *vy, size_t by, int nb)
{
    const uint8_t *x = vx;
    DECODE16(tile_q4_K);
    const int nblk = n / QK_K;
    lanes8_q4_K L[2];
    __m256 acc[TILE_NB][2], accm[TILE_NB][2];   /* [activation row][8-row group] */
    for (int b0 = 0; b0 < nb; b0 += TILE_NB) {
        const int m = nb - b0 < TILE_NB ? nb - b0 : TILE_NB;
        const char *yb = (const char *)vy + (size_t)b0 * by;
        for (int b = 0; b < m; b++) acc[b][0] = acc[b][1] = accm[b][0] = accm[b][1] = _mm256_setzero_ps();
        for (int i = 0; i < nblk; i++) {
            const uint8_t *xi = x + (size_t)i * sizeof(block_q4_K);
            if (b0 == 0) prefetch_next_rows(vx, bx, 16, i, nblk);
            lanes8_q4_K_load(&L[0], xi, bx);
            lanes8_q4_K_load(&L[1], xi + 8 * bx, bx);
            int b = 0;
            for (; b + 4 <= m; b += 4) lanes8_q4_K_rows(L, yb, by, i, b, acc, accm, 4);
            for (; b < m; b++) lanes8_q4_K_rows(L, yb, by, i, b, acc, accm, 1);
        }
        for (int b = 0; b < m; b++)
            for (int g = 0; g < 2; g++)
                _mm256_storeu_ps(out + (size_t)(b0 + b) * os + 8 * g, _mm256_sub_ps(acc[b][g], accm[b][g]));
    }
}

/* --- Q6_K prefill with one weight row per lane -----------------------------
 * As the Q4_K passes above: 8 weight rows per register, lane r for row r,
 * W[j][k] lane r holding values 4k..4k+3 of sub-block j (16 values) of row
 * r as unsigned 6-bit quants. A vpmaddubsw pair sum is at most 2 * 63 *
 * 127, so two of them add up in int16 (at most 32004) before one vpmaddwd
 * applies the rows' scales: the exact integer sum of each row and token
 * (the -32 offset folded in as 32 * sum(scale * bsum), as the tiles do) and
 * the tiles' float update, so the outputs are bit-identical to vec_dot's.
 * Each quant register, once loaded, serves four tokens. */

/* One Q6_K block of 8 rows, one row per lane. */
typedef struct {
    __m256i w[16][4];  /* [sub-block][dword] quants, unsigned */
    __m256i s[16];     /* [sub-block] scale as an int16 pair (sc, sc) */
    __m256i sp[8];     /* scales as int16 pairs (sc[2k], sc[2k+1]) */
    __m256 d;
} lanes8_q6_K;

TILE_INLINE void lanes8_q6_K_load(lanes8_q6_K *L, const uint8_t *xi, size_t bx)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    /* d is the block's last two bytes: read with the scale bytes before it */
    const __m128 d0 = half_f32(dwords(xi, bx, offsetof(block_q6_K, d) - 2, 4), 1);
    const __m128 d1 = half_f32(dwords(xi + 4 * bx, bx, offsetof(block_q6_K, d) - 2, 4), 1);
    L->d = _mm256_set_m128(d1, d0);
    /* row r's 16 scales as int16: dword k is (sc 2k, sc 2k+1); transposed,
     * t[k] lane r is row r's dword k */
    __m256i t[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
        t[r] = _mm256_cvtepi8_epi16(
            _mm_loadu_si128((const __m128i *)(xi + (size_t)r * bx + offsetof(block_q6_K, scales))));
    scale_lanes(t, L->s, 8);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) L->sp[k] = t[k];
    /* chunk c = 4h + u (values 32c.., sub-blocks 2c, 2c + 1): the low
     * (u < 2) or high nibbles of ql bytes 64h + 32 (u % 2).., with qh bits
     * 2u, 2u + 1 of bytes 32h.. */
#pragma GCC unroll 1
    for (int c = 0; c < 8; c++) {
        const int h = c / 4, u = c % 4;
        __m256i q[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const block_q6_K *xr = (const block_q6_K *)(xi + (size_t)r * bx);
            const __m256i Q = _mm256_loadu_si256((const __m256i *)(xr->ql + 64 * h + 32 * (u % 2)));
            const __m256i H = _mm256_loadu_si256((const __m256i *)(xr->qh + 32 * h));
            const __m256i lo = _mm256_and_si256(u < 2 ? Q : _mm256_srli_epi16(Q, 4), m4);
            const __m256i hb = u < 2 ? _mm256_sll_epi32(H, _mm_cvtsi32_si128(4 - 2 * u))
                                     : _mm256_srl_epi32(H, _mm_cvtsi32_si128(2 * u - 4));
            q[r] = _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
        }
        transpose8(q);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            L->w[2 * c][k] = q[k];
            L->w[2 * c + 1][k] = q[4 + k];
        }
    }
}

/* The 8 rows of L against activation rows y[0..T-1] (T 1..4): acc[t]
 * (lane r: row r) updated as vec_dot does. */
TILE_INLINE void lanes8_q6_K_pass(const lanes8_q6_K *L, const block_q8_K *const y[4], __m256 acc[4], const int T)
{
    const int32_t *a[4];
    __m256i is[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        a[t] = (const int32_t *)y[t]->qs;
        /* the offset: -32 * sum over sub-blocks of scale * bsum */
        const __m256i bl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)y[t]->bsums));
        const __m256i bh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(y[t]->bsums + 8)));
        __m256i o = _mm256_madd_epi16(L->sp[0], _mm256_shuffle_epi32(bl, 0x00));
        o = _mm256_add_epi32(o, _mm256_madd_epi16(L->sp[1], _mm256_shuffle_epi32(bl, 0x55)));
        o = _mm256_add_epi32(o, _mm256_madd_epi16(L->sp[2], _mm256_shuffle_epi32(bl, 0xaa)));
        o = _mm256_add_epi32(o, _mm256_madd_epi16(L->sp[3], _mm256_shuffle_epi32(bl, 0xff)));
        o = _mm256_add_epi32(o, _mm256_madd_epi16(L->sp[4], _mm256_shuffle_epi32(bh, 0x00)));
        o = _mm256_add_epi32(o, _mm256_madd_epi16(L->sp[5], _mm256_shuffle_epi32(bh, 0x55)));
        o = _mm256_add_epi32(o, _mm256_madd_epi16(L->sp[6], _mm256_shuffle_epi32(bh, 0xaa)));
        o = _mm256_add_epi32(o, _mm256_madd_epi16(L->sp[7], _mm256_shuffle_epi32(bh, 0xff)));
        is[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(o, 5));
    }
#pragma GCC unroll 1
    for (int j = 0; j < 16; j++) {
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m256i h[4];
#pragma GCC unroll 2
            for (int k = 2 * half; k < 2 * half + 2; k++) {
                const __m256i w = _mm256_load_si256(&L->w[j][k]);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m256i p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(a[t][4 * j + k]));
                    h[t] = k % 2 ? _mm256_add_epi16(h[t], p) : p;
                    IN_REG(h[t]);
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(h[t], L->s[j]));
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(y[t]->d), L->d), _mm256_cvtepi32_ps(is[t]), acc[t]);
}

/* Activation rows b .. b+T-1 (T 1..4) of a pass against the 8-row groups
 * of one block: the float accumulators acc[b + t][g]. */
TILE_INLINE void lanes8_q6_K_rows(const lanes8_q6_K L[2], const char *yb, size_t by, int i, int b,
                                  __m256 acc[][2], const int T)
{
    const block_q8_K *y[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) y[t] = (const block_q8_K *)(yb + (size_t)(b + t) * by) + i;
#pragma GCC unroll 1
    for (int g = 0; g < 2; g++) {
        __m256 a[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a[t] = acc[b + t][g];
        lanes8_q6_K_pass(&L[g], y, a, T);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[b + t][g] = a[t];
    }
}

/* gemm16 for Q6_K: one activation row (decode) through the 4 x 1 tiles,
 * more through the one-row-per-lane passes, four activation rows at a
 * time (the last one to three one by one). Both prefetch the rows that
 * follow the 16 (the first reads of each block stalled on memory
 * without). */
static void gemm16_q6_K(int n, float *out, size_t os, const void *vx, size_t bx, const void *vy, size_t by,
                        int nb)
{
    const uint8_t *x = vx;
    DECODE16(tile_q6_K);
    const int nblk = n / QK_K;
    lanes8_q6_K L[2];
    __m256 acc[TILE_NB][2];   /* [activation row][8-row group] */
    for (int b0 = 0; b0 < nb; b0 += TILE_NB) {
        const int m = nb - b0 < TILE_NB ? nb - b0 : TILE_NB;
        const char *yb = (const char *)vy + (size_t)b0 * by;
        for (int b = 0; b < m; b++) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
        for (int i = 0; i < nblk; i++) {
            const uint8_t *xi = x + (size_t)i * sizeof(block_q6_K);
            if (b0 == 0) prefetch_next_rows(vx, bx, 16, i, nblk);
            lanes8_q6_K_load(&L[0], xi, bx);
            lanes8_q6_K_load(&L[1], xi + 8 * bx, bx);
            int b = 0;
            for (; b + 4 <= m; b += 4) lanes8_q6_K_rows(L, yb, by, i, b, acc, 4);
            for (; b < m; b++) lanes8_q6_K_rows(L, yb, by, i, b, acc, 1);
        }
        for (int b = 0; b < m; b++)
            for (int g = 0; g < 2; g++) _mm256_storeu_ps(out + (size_t)(b0 + b) * os + 8 * g, acc[b][g]);
    }
}

/* q5_K x q8_K: q4_K plus the fifth bit from qh (bit 2g: low half of group
 * g, bit 2g+1: high half). */
static void vec_dot_q5_K(int n, float *s, const void *vx, const void *vy)
{
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const float d = y[i].d * half_to_f32(x[i].d);
        const float dmin = y[i].d * half_to_f32(x[i].dmin);
        const __m128i scmin = unpack_scales_k4(x[i].scales);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot(scmin, y[i].bsums)), accm);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scmin));
        const uint8_t *q5 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i hb = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(q5 + 32 * g));
            const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4);   /* bit 0 -> 4 */
            const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4);   /* bit 1 -> 4 */
            hb = _mm256_srli_epi16(hb, 2);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1);
            const __m256i y0 = _mm256_loadu_si256((const __m256i *)(q8 + 64 * g));
            const __m256i y1 = _mm256_loadu_si256((const __m256i *)(q8 + 64 * g + 32));
            const __m256i s_lo = scale_bcast(sc16, 2 * g), s_hi = scale_bcast(sc16, 2 * g + 1);
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), s_lo);
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), s_hi);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_ps(acc) - hsum_ps128(accm);
}

/* Products of one Q8_0 block pair as 8 int32 partial sums. */
static inline __m256i q8_0_block_dot(const block_q8_0 *x, const block_q8_0 *y)
{
    const __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i qy = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* q8_0 x q8_0, two blocks per step into two accumulators. */
static void vec_dot_q8_0(int n, float *s, const void *vx, const void *vy)
{
    const block_q8_0 *x = vx, *y = vy;
    const int nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 1 < nb; i += 2) {
        const float d0 = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        const float d1 = half_to_f32(x[i + 1].d) * half_to_f32(y[i + 1].d);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(q8_0_block_dot(&x[i], &y[i])), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(q8_0_block_dot(&x[i + 1], &y[i + 1])), acc1);
    }
    if (i < nb) {
        const float d0 = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(q8_0_block_dot(&x[i], &y[i])), acc0);
    }
    *s = hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* The 32 int8 products of x (values q - offset, one per byte) with a Q8_0
 * block's quants, as 8 int32 partial sums. */
static inline __m256i i8_block_dot(__m256i qx, const int8_t *yq)
{
    const __m256i qy = _mm256_loadu_si256((const __m256i *)yq);
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The 16 bytes of Q4_0/Q5_0 quants as 32 nibbles: values 0..15 (the low
 * nibbles) in the lower lane, 16..31 (the high ones) in the upper. */
static inline __m256i nibbles_32(const uint8_t *qs)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* The 32 bits of a Q5_0/Q5_1 block's qh as bytes: 0xFF where bit j is set. */
static inline __m256i bits_32(const uint8_t *qhp)
{
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    uint32_t qh;
    memcpy(&qh, qhp, sizeof qh);
    const __m256i hb = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread), bit);
    return _mm256_cmpeq_epi8(hb, bit);
}

/* q4_0 x q8_0: per block the 32 products of q - 8 into 8 int32 lanes,
 * scaled by dx * dy into one f32 accumulator (llama.cpp's AVX2 order). */
static void vec_dot_q4_0(int n, float *s, const void *vx, const void *vy)
{
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK4_0; i++) {
        const __m256i qx = _mm256_sub_epi8(nibbles_32(x[i].qs), _mm256_set1_epi8(8));
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(i8_block_dot(qx, y[i].qs)), acc);
    }
    *s = hsum_ps(acc);
}

/* q5_0 x q8_0: the fifth bits expanded to bytes; q - 16 as the nibble when
 * the bit is set, the nibble minus 16 (0xF0 or'ed in) when not. */
static void vec_dot_q5_0(int n, float *s, const void *vx, const void *vy)
{
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK5_0; i++) {
        const __m256i set = bits_32(x[i].qh);
        const __m256i qx = _mm256_or_si256(nibbles_32(x[i].qs), _mm256_andnot_si256(set, _mm256_set1_epi8((char)0xF0)));
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(i8_block_dot(qx, y[i].qs)), acc);
    }
    *s = hsum_ps(acc);
}

/* The unsigned codes (0..15 or 0..31, one a byte) times a Q8_1 block's
 * quants as 8 int32 partial sums. */
static inline __m256i u8_block_dot(__m256i qx, const int8_t *yq)
{
    const __m256i p = _mm256_maddubs_epi16(qx, _mm256_loadu_si256((const __m256i *)yq));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* q4_1 x q8_1: per block the 32 products into 8 int32 lanes, scaled by
 * dx * dy into one f32 accumulator, and m * s summed apart (llama.cpp's
 * AVX2 order). */
static void vec_dot_q4_1(int n, float *s, const void *vx, const void *vy)
{
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int i = 0; i < n / QK4_1; i++) {
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        summs += half_to_f32(x[i].m) * half_to_f32(y[i].s);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(u8_block_dot(nibbles_32(x[i].qs), y[i].qs)), acc);
    }
    *s = hsum_ps(acc) + summs;
}

/* q5_1 x q8_1: as q4_1 with the fifth bits or'ed in (0x10 where set). */
static void vec_dot_q5_1(int n, float *s, const void *vx, const void *vy)
{
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int i = 0; i < n / QK5_1; i++) {
        const __m256i set = bits_32(x[i].qh);
        const __m256i qx = _mm256_or_si256(nibbles_32(x[i].qs), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        summs += half_to_f32(x[i].m) * half_to_f32(y[i].s);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(u8_block_dot(qx, y[i].qs)), acc);
    }
    *s = hsum_ps(acc) + summs;
}

/* The 2-bit fields k (0..3) of 32 bytes of Q2_K/Q3_K quants: values 32k
 * .. 32k + 31 of their half-block, each 0..3. */
static inline __m256i bits2_32(__m256i q, int k)
{
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), _mm256_set1_epi8(3));
}

/* Two 16-value groups' scales as int16: the lower lane sc0, the upper sc1. */
static inline __m256i scale_pair16(int sc0, int sc1)
{
    return _mm256_insertf128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)sc0)), _mm_set1_epi16((short)sc1), 1);
}

/* q2_K x q8_K: per block the products of each group of 16 scaled by its
 * 4-bit scale into eight int32 lanes, times d8 * d into an f32
 * accumulator; the mins as (d8 * dmin) * sum(m_j * bsums_j), subtracted at
 * the end. */
static void vec_dot_q2_K(int n, float *s, const void *vx, const void *vy)
{
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *sc = x[i].scales;
        /* the mins against the 16 bsums */
        const __m128i scv = _mm_loadu_si128((const __m128i *)sc);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scv, 4), _mm_set1_epi8(15)));
        const __m256i pm = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y[i].bsums));
        const int summs = hsum_epi32_128(_mm_add_epi32(_mm256_castsi256_si128(pm), _mm256_extracti128_si256(pm, 1)));
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int k = 0; k < 4; k++) {
                const int j = 8 * h + 2 * k;
                const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * k));
                const __m256i p16 = _mm256_maddubs_epi16(bits2_32(q, k), q8);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, scale_pair16(sc[j] & 15, sc[j + 1] & 15)));
            }
        }
        const float dall = y[i].d * half_to_f32(x[i].d), dmin = y[i].d * half_to_f32(x[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(sumi), acc);
        accm += dmin * (float)summs;
    }
    *s = hsum_ps(acc) - accm;
}

/* q3_K x q8_K: the quants as q - 4 (a clear hmask bit subtracts 4), the
 * products of each group of 16 scaled by its 6-bit scale minus 32 into
 * eight int32 lanes, times d * d8 into an f32 accumulator. */
static void vec_dot_q3_K(int n, float *s, const void *vx, const void *vy)
{
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        int sc[16];
        const uint8_t *sb = x[i].scales;
        for (int j = 0; j < 16; j++)
            sc[j] = (((sb[j % 8] >> (4 * (j / 8))) & 15) | (((sb[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int k = 0; k < 4; k++) {
                const int j = 8 * h + 2 * k;
                const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + k)));
                const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                const __m256i v = _mm256_sub_epi8(bits2_32(q, k), _mm256_and_si256(clear, _mm256_set1_epi8(4)));
                const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * k));
                const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(q8, v));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, scale_pair16(sc[j], sc[j + 1])));
            }
        }
        const float d = half_to_f32(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_ps(acc);
}

static void vec_dot_f32(int n, float *s, const void *vx, const void *vy)
{
    const float *x = vx, *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

static inline __m256 load_f16(const tg_half *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static void vec_dot_f16(int n, float *s, const void *vx, const void *vy)
{
    const tg_half *x = vx, *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load_f16(x + i), load_f16(y + i), a0);
        a1 = _mm256_fmadd_ps(load_f16(x + i + 8), load_f16(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(load_f16(x + i + 16), load_f16(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(load_f16(x + i + 24), load_f16(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load_f16(x + i), load_f16(y + i), a0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += half_to_f32(x[i]) * half_to_f32(y[i]);
    *s = sum;
}

static inline __m256 load_bf16(const tg_bf16 *p)
{
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static void vec_dot_bf16(int n, float *s, const void *vx, const void *vy)
{
    const tg_bf16 *x = vx, *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load_bf16(x + i), load_bf16(y + i), a0);
        a1 = _mm256_fmadd_ps(load_bf16(x + i + 8), load_bf16(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(load_bf16(x + i + 16), load_bf16(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(load_bf16(x + i + 24), load_bf16(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load_bf16(x + i), load_bf16(y + i), a0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += tg_bf16_to_f32(x[i]) * tg_bf16_to_f32(y[i]);
    *s = sum;
}

/* Packs 4 x 8 int32 (each in [-128, 127]) into 32 int8 in order. */
static inline __m256i pack_i32_to_i8(__m256i a, __m256i b, __m256i c, __m256i d)
{
    const __m256i ab = _mm256_packs_epi32(a, b);   /* a0-3 b0-3 | a4-7 b4-7 */
    const __m256i cd = _mm256_packs_epi32(c, d);
    const __m256i abcd = _mm256_packs_epi16(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Q8_K: the same float operations as the reference (iscale * x, rounded
 * to nearest even by vcvtps2dq under the default MXCSR), so the same bytes. */
static void quantize_q8_K(const float *x, void *vy, int64_t k)
{
    block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8)
            amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), amax);
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float am = _mm_cvtss_f32(m);
        if (am == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* the first element of that magnitude, with its sign */
        float max = 0;
        const __m256 vam = _mm256_set1_ps(am);
        for (int j = 0; j < QK_K; j += 8) {
            const int msk = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), vam, _CMP_EQ_OQ));
            if (msk) {
                max = x[j + __builtin_ctz((unsigned)msk)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i c127 = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int l = 0; l < 4; l++)
                q[l] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * l))), c127);
            const __m256i q8 = pack_i32_to_i8(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), q8);
            /* two bsums: sums of 16 int8 each */
            const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q8);
            const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            const __m128i lo = _mm256_castsi256_si128(s32), hi = _mm256_extracti128_si256(s32, 1);
            y[i].bsums[j / 16] = (int16_t)hsum_epi32_128(lo);
            y[i].bsums[j / 16 + 1] = (int16_t)hsum_epi32_128(hi);
        }
        y[i].d = 1 / iscale;
    }
}

/* roundf (halves away from zero) of 8 floats, exact: trunc, then one more
 * step away from zero when the dropped fraction is at least one half. */
static inline __m256i round_away(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, sign));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, one)));
}

static void quantize_q8_0(const float *x, void *vy, int64_t k)
{
    block_q8_0 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = tg_f32_to_half(d);
        const __m256 vid = _mm256_set1_ps(id);
        const __m256i q8 = pack_i32_to_i8(round_away(_mm256_mul_ps(v0, vid)), round_away(_mm256_mul_ps(v1, vid)),
                                          round_away(_mm256_mul_ps(v2, vid)), round_away(_mm256_mul_ps(v3, vid)));
        _mm256_storeu_si256((__m256i *)y[i].qs, q8);
    }
}

static void f32_to_f16(const float *x, tg_half *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static void axpy_f16(int64_t n, float *y, const tg_half *x, float a)
{
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, half_to_f32(x[i]), y[i]);
}

void tg_cpu_fill_avx2(tg_cpu_kernels *k)
{
    k->vec_dot[TG_TYPE_Q4_K] = vec_dot_q4_K;
    k->vec_dot4[TG_TYPE_Q6_K] = vec_dot4_q6_K;
    k->vec_dot[TG_TYPE_Q5_K] = vec_dot_q5_K;
    k->vec_dot[TG_TYPE_Q6_K] = vec_dot_q6_K;
    k->gemm16[TG_TYPE_Q4_K] = gemm16_q4_K;
    k->gemm16[TG_TYPE_Q6_K] = gemm16_q6_K;
    k->vec_dot[TG_TYPE_Q8_0] = vec_dot_q8_0;
    k->vec_dot[TG_TYPE_Q4_0] = vec_dot_q4_0;
    k->vec_dot[TG_TYPE_Q5_0] = vec_dot_q5_0;
    k->vec_dot[TG_TYPE_Q4_1] = vec_dot_q4_1;
    k->vec_dot[TG_TYPE_Q5_1] = vec_dot_q5_1;
    k->vec_dot[TG_TYPE_Q2_K] = vec_dot_q2_K;
    k->vec_dot[TG_TYPE_Q3_K] = vec_dot_q3_K;
    k->vec_dot[TG_TYPE_F32] = vec_dot_f32;
    k->vec_dot[TG_TYPE_F16] = vec_dot_f16;
    k->vec_dot[TG_TYPE_BF16] = vec_dot_bf16;
    k->quantize_q8_K = quantize_q8_K;
    k->quantize_q8_0 = quantize_q8_0;
    k->f32_to_f16 = f32_to_f16;
    k->axpy_f16 = axpy_f16;
}
