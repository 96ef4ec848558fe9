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
 *   time there): tg_traits gives a vector search that writes the same bytes
 *   as the scalar reference, which stays here as the oracle
 *   (tg_from_float_ref, quant_ref.h; tests/test_quant.c holds them equal).
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
 * would move dequantized values and dots by an ulp from ggml's). The fast
 * weight quantizers' lanes depend on it as much (same bytes as the
 * scalar search). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#else
#pragma STDC FP_CONTRACT OFF
#endif

#include <assert.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- halves */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

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
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Returns f rounded to the nearest half, ties to even; overflow gives inf,
 * NaN stays NaN (quiet, payload truncated to its top 9 bits), as the F16C
 * and NEON conversion instructions do. */
tg_half tg_f32_to_half(float f)
{
    uint32_t x = f32_bits(f);
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
    return bits_f32((uint32_t)h << 16);
}

/* Returns f rounded to the nearest bfloat16, ties to even; NaN stays a
 * quiet NaN (ggml's rule: top 16 bits with the quiet bit set). */
tg_bf16 tg_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (tg_bf16)((x >> 16) | 0x40);
    return (tg_bf16)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* Returns v rounded to the nearest integer, ties to even (what ggml's
 * nearest_int gives for the values quantizers meet), under the default
 * rounding mode. rintf keeps the product that usually feeds it a separate
 * rounding: an add-magic-number trick would let aarch64 GCC fuse the two
 * into one FMA and round differently from ggml and from the SIMD
 * quantizers. Magnitudes beyond 2^22 (never met) are clamped first; a NaN
 * gives -4194303. */
static inline int round_even(float v)
{
    v = v > 4194303.0f ? 4194303.0f : v;
    v = v >= -4194303.0f ? v : -4194303.0f;
    return (int)rintf(v);
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

/* ---------------------------------------------- K-quant scale search */

static inline int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Weighted sums of one candidate grid of fit_scale_min. */
typedef struct grid_sums {
    float wl, wl2, wlx;     /* sum w L, sum w L^2, sum w L x */
} grid_sums;

/* Quantizes x to L = clamp(round((x - lo) * iscale), 0, nmax) into L[n]
 * (n even) and returns the grid's weighted sums (two partial sums each,
 * to keep the dependency chains short). */
static grid_sums grid_asym(int n, int nmax, const float *x, const float *w, float lo, float iscale,
                           uint8_t *L)
{
    float a0 = 0, a1 = 0, b0 = 0, b1 = 0, c0 = 0, c1 = 0;
    for (int i = 0; i < n; i += 2) {
        const int l0 = clampi(round_even(iscale * (x[i] - lo)), 0, nmax);
        const int l1 = clampi(round_even(iscale * (x[i + 1] - lo)), 0, nmax);
        L[i] = (uint8_t)l0;
        L[i + 1] = (uint8_t)l1;
        const float wl0 = w[i] * l0, wl1 = w[i + 1] * l1;
        a0 += wl0;
        a1 += wl1;
        b0 += wl0 * l0;
        b1 += wl1 * l1;
        c0 += wl0 * x[i];
        c1 += wl1 * x[i + 1];
    }
    return (grid_sums){a0 + a1, b0 + b1, c0 + c1};
}

/* The weighted least-squares line x ~ a L + b of a grid (b clamped to <= 0)
 * and its weighted squared error, from the sums alone:
 * err = a^2 SwL2 + 2ab SwL - 2a SwLx + b^2 Sw - 2b Swx + Swxx.
 * Returns 0, or -1 when the grid is degenerate (a <= 0). */
static int grid_fit(grid_sums g, double sw, double swx, double swxx, float *a_out, float *b_out,
                    double *err)
{
    const double det = sw * g.wl2 - (double)g.wl * g.wl;
    if (det <= 0) return -1;
    double a = (sw * g.wlx - (double)g.wl * swx) / det;
    double b = ((double)g.wl2 * swx - (double)g.wl * g.wlx) / det;
    if (b > 0) {
        b = 0;
        a = g.wlx / (double)g.wl2;
    }
    if (!(a > 0)) return -1;
    *err = a * a * g.wl2 + 2 * a * b * g.wl - 2 * a * g.wlx + b * b * sw - 2 * b * swx + swxx;
    *a_out = (float)a;
    *b_out = (float)b;
    return 0;
}

/* The sums a scale-and-min fit starts from: lo = min(0, min x), hi = max x,
 * and the weighted sums of 1, x and x^2 (in double, in order). */
static inline void fit_stats(int n, const float *x, const float *w, float *lo, float *hi, double *sw,
                             double *swx, double *swxx)
{
    float l = x[0], h = x[0];
    double a = 0, b = 0, c = 0;
    for (int i = 0; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
        a += w[i];
        b += (double)w[i] * x[i];
        c += (double)w[i] * x[i] * x[i];
    }
    *lo = l > 0 ? 0 : l;
    *hi = h;
    *sw = a;
    *swx = b;
    *swxx = c;
}

/* The refinement of the asymmetric fit: re-rounds against the fitted line
 * (*a, *b; error err), refits, and keeps the result while the error falls
 * (at most 4 times); L (when not NULL) receives the kept grid. */
static void refine_asym(int n, int nmax, const float *x, const float *w, double sw, double swx, double swxx,
                        double err, float *a, float *b, uint8_t *L)
{
    uint8_t cand[32];
    for (int iter = 0; iter < 4 && err < INFINITY; iter++) {
        const grid_sums g = grid_asym(n, nmax, x, w, *b, 1 / *a, cand);
        float na, nb;
        double ne;
        if (grid_fit(g, sw, swx, swxx, &na, &nb, &ne) != 0 || !(ne < err)) break;
        err = ne;
        *a = na;
        *b = nb;
        if (L) memcpy(L, cand, (size_t)n);
    }
}

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


/* ------------------------------------------- fast K-quant scale search
 *
 * The same searches as fit_scale_sym and fit_scale_min, with the candidate
 * grids side by side in vector lanes: lane c computes exactly the float and
 * double operations the scalar code performs for candidate c, in the same
 * order (same iscale division, same even/odd partial sums, the same double
 * score or least-squares fit, separate products and sums), so the chosen
 * grid, hence the bytes written, is the reference's; the choice among the
 * candidates is the reference's too (the first best wins, NaNs never).
 * Lanes hold floats; rounding is the add-and-subtract of
 * 1.5 * 2^23, which equals rintf under round-to-nearest-even for the
 * |v| <= 2^22 - 1 that round_even's clamp leaves (and gives +0 where rintf
 * gives -0, which (int) made +0 in the reference anyway). The file is built
 * without multiply-add contraction (the pragma at the top), and the x86-64
 * clones target AVX2 without FMA. The L each reference search writes is
 * never read by its callers (the final quants are recomputed against the
 * stored scales), so the fast searches return the scale alone. */

typedef float kq_vf __attribute__((vector_size(32)));   /* 8 lanes */
typedef int32_t kq_vi __attribute__((vector_size(32)));
typedef float kq_vf4 __attribute__((vector_size(16)));  /* 4 lanes */
typedef double kq_vd __attribute__((vector_size(32)));
typedef int64_t kq_vl __attribute__((vector_size(32)));
#define KQ_LANES 8
#define KQ_MAX_CAND 32  /* candidates per search: 25 (sym), 31 (asym), padded */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KQ_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KQ_CLONES
#endif
/* The helpers below return 32-byte vectors (and take them by pointer);
 * they are always inlined, so the ABI the compiler warns about (no AVX in
 * the default clone) is never used. (GCC reports it where it emits the
 * clones, at the end of the file, so the warning stays off to the end.) */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define KQ_INLINE static inline __attribute__((always_inline))

/* Lane-wise m ? a : b for a comparison mask m (m is read twice). */
#define KQ_SELECT(m, a, b) ((kq_vf)(((m) & (kq_vi)(a)) | (~(m) & (kq_vi)(b))))
#define KQ_SELECT_D(m, a, b) ((kq_vd)(((m) & (kq_vl)(a)) | (~(m) & (kq_vl)(b))))

/* Lane-wise clampi(round_even(v), lo, hi) as a float, for integers
 * lo <= 0 <= hi with |lo|, |hi| < 2^22. The reference clamps v to
 * +-4194303 (a NaN to -4194303), rounds, then clamps to [lo, hi]; since
 * rounding is monotone and keeps integers, clamping to [lo, hi] first (a
 * NaN to lo) and rounding then gives the same integer, with v small
 * enough for the add-and-subtract rounding. */
KQ_INLINE kq_vf kq_round_clamp(const kq_vf *pv, float lo, float hi)
{
    const kq_vf zero = {0}, magic = zero + 12582912.0f;
    kq_vf v = *pv;
    v = KQ_SELECT(v >= lo, v, zero + lo);
    v = KQ_SELECT(v > hi, zero + hi, v);
    return (v + magic) - magic;
}

KQ_INLINE kq_vf kq_load(const float *p)
{
    kq_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

KQ_INLINE void kq_store(float *p, const kq_vf *v)
{
    memcpy(p, v, sizeof *v);
}

/* Four floats at p, widened to double. */
KQ_INLINE kq_vd kq_load_d(const float *p)
{
    kq_vf4 v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, kq_vd);
}

KQ_INLINE void kq_store_d(double *p, const kq_vd *v)
{
    memcpy(p, v, sizeof *v);
}

/* fit_scale_sym's search once max (the first x of largest magnitude, not
 * 0) is known: the candidate grids iscale = -(nmax + 0.1 step) / max for
 * step = -12 .. 12 (candidate c = step + 12; lanes past 24 are padding),
 * each grid's swl2 and swlx and score = swlx^2 / swl2 as the reference
 * computes them, and the reference's choice: the first candidate of
 * highest score among those with !(swl2 <= 0) (a NaN score never wins).
 * Returns that candidate's swlx / swl2 as a float, or 0 when none
 * qualifies. n even. */
KQ_CLONES static float kq_sym_search(int n, int nmax, const float *x, const float *w, float max)
{
    enum { NC = 25 };
    float num[KQ_MAX_CAND] = {0}, s[4][KQ_MAX_CAND];
    for (int c = 0; c < NC; c++) num[c] = -(nmax + 0.1f * (c - 12));
    const float lo = (float)-nmax, hi = (float)(nmax - 1);
    for (int k = 0; k < KQ_MAX_CAND; k += KQ_LANES) {
        const kq_vf is = kq_load(num + k) / max;
        kq_vf b0 = {0}, b1 = {0}, c0 = {0}, c1 = {0};
        for (int i = 0; i < n; i += 2) {
            const kq_vf v0 = is * x[i], v1 = is * x[i + 1];
            const kq_vf l0 = kq_round_clamp(&v0, lo, hi), l1 = kq_round_clamp(&v1, lo, hi);
            const kq_vf wl0 = w[i] * l0, wl1 = w[i + 1] * l1;
            b0 += wl0 * l0;
            b1 += wl1 * l1;
            c0 += wl0 * x[i];
            c1 += wl1 * x[i + 1];
        }
        kq_store(s[0] + k, &b0);
        kq_store(s[1] + k, &b1);
        kq_store(s[2] + k, &c0);
        kq_store(s[3] + k, &c1);
    }
    /* scores, with -1 (below any real score, which is >= 0) where the
     * candidate does not qualify; the highest of them */
    double swl2[KQ_MAX_CAND], swlx[KQ_MAX_CAND], score[KQ_MAX_CAND];
    const kq_vd zero = {0};
    kq_vd best = zero - 1;
    for (int c = 0; c < KQ_MAX_CAND; c += 4) {
        const kq_vd l2 = kq_load_d(s[0] + c) + kq_load_d(s[1] + c);
        const kq_vd lx = kq_load_d(s[2] + c) + kq_load_d(s[3] + c);
        const kq_vd sc = lx * lx / l2;
        const kq_vd idx = {c, c + 1, c + 2, c + 3};
        const kq_vl ok = ~(l2 <= 0) & (sc == sc) & (idx < NC);
        const kq_vd v = KQ_SELECT_D(ok, sc, zero - 1);
        best = KQ_SELECT_D(v > best, v, best);
        kq_store_d(swl2 + c, &l2);
        kq_store_d(swlx + c, &lx);
        kq_store_d(score + c, &v);
    }
    double top = best[0];
    for (int l = 1; l < 4; l++) top = best[l] > top ? best[l] : top;
    if (top == -1) return 0;
    int c = 0;
    while (score[c] != top) c++;
    assert(c < NC);
    return (float)(swlx[c] / swl2[c]);
}

/* fit_scale_min's candidate grids, iscale = (nmax + 0.1 step) / (hi - lo)
 * for step = -10 .. 20 (candidate c = step + 10; lane 31 is padding):
 * each grid's grid_asym sums and grid_fit, as the reference computes them.
 * err[c] receives the fit's error, or NaN where grid_fit fails; a[c] and
 * b[c] the fitted line. n even. */
KQ_CLONES static void kq_asym_search(int n, int nmax, const float *x, const float *w, float lo,
                                     float hi, double sw, double swx, double swxx,
                                     double err[KQ_MAX_CAND], float a[KQ_MAX_CAND],
                                     float b[KQ_MAX_CAND])
{
    float num[KQ_MAX_CAND] = {0}, s[6][KQ_MAX_CAND];
    for (int c = 0; c < 31; c++) num[c] = nmax + 0.1f * (c - 10);
    const float range = hi - lo, lmax = (float)nmax;
    for (int k = 0; k < KQ_MAX_CAND; k += KQ_LANES) {
        const kq_vf is = kq_load(num + k) / range;
        kq_vf a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, c0 = {0}, c1 = {0};
        for (int i = 0; i < n; i += 2) {
            const kq_vf v0 = is * (x[i] - lo), v1 = is * (x[i + 1] - lo);
            const kq_vf l0 = kq_round_clamp(&v0, 0, lmax), l1 = kq_round_clamp(&v1, 0, lmax);
            const kq_vf wl0 = w[i] * l0, wl1 = w[i + 1] * l1;
            a0 += wl0;
            a1 += wl1;
            b0 += wl0 * l0;
            b1 += wl1 * l1;
            c0 += wl0 * x[i];
            c1 += wl1 * x[i + 1];
        }
        /* the grid_sums: one float sum of the two partial sums each */
        const kq_vf swl = a0 + a1, swl2 = b0 + b1, swlx = c0 + c1;
        kq_store(s[0] + k, &swl);
        kq_store(s[1] + k, &swl2);
        kq_store(s[2] + k, &swlx);
    }
    /* grid_fit, lane by lane */
    for (int c = 0; c < KQ_MAX_CAND; c += 4) {
        const kq_vd zero = {0};
        const kq_vd wl = kq_load_d(s[0] + c), wl2 = kq_load_d(s[1] + c), wlx = kq_load_d(s[2] + c);
        const kq_vd det = sw * wl2 - wl * wl;
        kq_vd fa = (sw * wlx - wl * swx) / det;
        kq_vd fb = (wl2 * swx - wl * wlx) / det;
        const kq_vl pos = fb > 0;
        fb = KQ_SELECT_D(pos, zero, fb);
        fa = KQ_SELECT_D(pos, wlx / wl2, fa);
        const kq_vl ok = ~(det <= 0) & (fa > 0);
        const kq_vd e = fa * fa * wl2 + 2 * fa * fb * wl - 2 * fa * wlx + fb * fb * sw
                        - 2 * fb * swx + swxx;
        const kq_vd e_or_nan = KQ_SELECT_D(ok, e, zero + NAN);
        kq_store_d(err + c, &e_or_nan);
        for (int l = 0; l < 4; l++) {
            a[c + l] = (float)fa[l];
            b[c + l] = (float)fb[l];
        }
    }
}

/* The final quants of a sub-block against its stored scale:
 * L[i] = clampi(round_even((x[i] + add) / ds), lo, hi) + bias over n (a
 * multiple of KQ_LANES) values; ds != 0. With add = 0 the sum is skipped
 * (as the Q6_K reference divides x itself; adding 0 would only turn a -0
 * into +0, which rounds to the same 0). */
KQ_CLONES static void kq_quant_div(int n, const float *x, float add, float ds, int lo, int hi,
                                   int bias, uint8_t *L)
{
    for (int i = 0; i < n; i += KQ_LANES) {
        kq_vf v = kq_load(x + i);
        if (add != 0) v = v + add;
        v = v / ds;
        v = kq_round_clamp(&v, (float)lo, (float)hi);
        for (int l = 0; l < KQ_LANES; l++) L[i + l] = (uint8_t)((int)v[l] + bias);
    }
}

/* w[i] = x[i] * x[i] + eps over n (a multiple of KQ_LANES) values. */
KQ_CLONES static void kq_sq_weights(int n, const float *x, float eps, float *w)
{
    for (int i = 0; i < n; i += KQ_LANES) {
        const kq_vf v = kq_load(x + i);
        const kq_vf wi = v * v + eps;
        kq_store(w + i, &wi);
    }
}

/* fit_scale_sym without its L: returns the same a. */
static float fit_scale_sym_fast(int n, int nmax, const float *x, const float *w)
{
    assert(n <= 32 && n % 2 == 0);
    /* max: the first x of largest magnitude (NaNs never win), as the
     * reference's running "fabsf(x[i]) > amax", without its branches */
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    if (amax == 0) return 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) == amax) {
            max = x[i];
            break;
        }
    return kq_sym_search(n, nmax, x, w, max);
}

/* fit_scale_min without its L: returns the same a and *mn. */
static float fit_scale_min_fast(int n, int nmax, const float *x, const float *w, float *mn)
{
    assert(n <= 32 && n % 2 == 0);
    float lo, hi;
    double sw, swx, swxx;
    fit_stats(n, x, w, &lo, &hi, &sw, &swx, &swxx);
    if (hi <= lo) {
        *mn = -lo;
        return 0;
    }
    double err[KQ_MAX_CAND];
    float fa[KQ_MAX_CAND], fb[KQ_MAX_CAND];
    kq_asym_search(n, nmax, x, w, lo, hi, sw, swx, swxx, err, fa, fb);
    double best_err = INFINITY;
    float best_a = (hi - lo) / nmax, best_b = lo;
    for (int c = 0; c < 31; c++) {
        if (err[c] < best_err) {
            best_err = err[c];
            best_a = fa[c];
            best_b = fb[c];
        }
    }
    refine_asym(n, nmax, x, w, sw, swx, swxx, best_err, &best_a, &best_b, NULL);   /* as the reference */
    *mn = -best_b;
    return best_a;
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
            a[j] = fit_scale_min_fast(32, nmax, x + 32 * j, w, &mn[j]);
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
            if (ds > 0) kq_quant_div(32, x + 32 * j, dm, ds, 0, nmax, 0, Lout + 32 * j);
            else memset(Lout + 32 * j, 0, 32);
            continue;
        }
        for (int i = 0; i < 32; i++) {
            int l = ds > 0 ? round_even((x[32 * j + i] + dm) / ds) : 0;
            Lout[32 * j + i] = (uint8_t)clampi(l, 0, nmax);
        }
    }
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
        if (fast) kq_sq_weights(QK_K, x, 1e-30f, w);
        for (int j = 0; j < 16; j++) {
            const float *xs = x + 16 * j;
            float *ws = w + 16 * j;
            if (!fast)
                for (int l = 0; l < 16; l++) ws[l] = xs[l] * xs[l] + 1e-30f;
            a[j] = fast ? fit_scale_sym_fast(16, 32, xs, ws) : fit_scale_sym(16, 32, xs, ws, L + 16 * j);
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
                    if (ds != 0) kq_quant_div(16, x + 16 * j, 0, ds, -32, 31, 32, L + 16 * j);
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
    [TG_TYPE_Q8_0] = {"q8_0", QK8_0, sizeof(block_q8_0), 1, q8_0_to_float, q8_0_from_float,
                      TG_TYPE_Q8_0, q8_0_vec_dot},
    [TG_TYPE_Q8_1] = {"q8_1", QK8_0, sizeof(block_q8_1), 1, q8_1_to_float, q8_1_from_float,
                      TG_TYPE_Q8_1, NULL},
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
        [TG_TYPE_Q6_K] = "q6_K", [TG_TYPE_Q8_K] = "q8_K", [TG_TYPE_BF16] = "bf16",
    };
    if (type >= TG_TYPE_COUNT || !names[type]) return "?";
    return names[type];
}
