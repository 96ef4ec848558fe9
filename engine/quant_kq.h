/*
 * quant_kq.h: the pieces of the K-quant weight quantizers' scale search that
 * the scalar reference (quant.c) and the vector search (quant_fast.c) share,
 * and the vector search's entry points. Internal to those two files.
 *
 * The helpers are static inline so that quant_fast.c depends on nothing
 * but this header (quant.c calls quant_fast.c, never the other way). Both
 * files are built without multiply-add contraction (the Makefile's
 * NO_FP_CONTRACT, and a pragma in each), so these helpers compute the same
 * bytes in either file.
 */
#ifndef TG_QUANT_KQ_H
#define TG_QUANT_KQ_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* x86-64 GCC builds a function marked so twice, for AVX2 (without FMA) and
 * for the baseline, and picks one at load time; elsewhere a plain function. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KQ_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KQ_CLONES
#endif

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

/* v clamped to [lo, hi]. */
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
static inline grid_sums grid_asym(int n, int nmax, const float *x, const float *w, float lo, float iscale,
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
static inline int grid_fit(grid_sums g, double sw, double swx, double swxx, float *a_out, float *b_out,
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
static inline void refine_asym(int n, int nmax, const float *x, const float *w, double sw, double swx, double swxx,
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


/* --- the vector search (quant_fast.c): the reference's results, faster ---- */

/* fit_scale_sym (quant.c) without its L: returns the same a for n (even,
 * <= 32) values. */
float tg_kq_fit_sym_fast(int n, int nmax, const float *x, const float *w);
/* fit_scale_min (quant.c) without its L: returns the same a and *mn. */
float tg_kq_fit_min_fast(int n, int nmax, const float *x, const float *w, float *mn);
/* The final quants of a sub-block against its stored scale:
 * L[i] = clampi(round_even((x[i] + add) / ds), lo, hi) + bias over n (a
 * multiple of 8) values; ds != 0. */
void tg_kq_quant_div(int n, const float *x, float add, float ds, int lo, int hi, int bias, uint8_t *L);
/* w[i] = x[i] * x[i] + eps over n (a multiple of 8) values. */
void tg_kq_sq_weights(int n, const float *x, float eps, float *w);

#endif
