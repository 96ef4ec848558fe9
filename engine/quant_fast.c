/*
 * quant_fast.c: the fast path of the K-quant weight quantizers (Q4_K, Q5_K,
 * Q6_K from_float in tg_traits, what tg-mkmodel spends its time in): the
 * scale searches of quant.c's scalar reference, vectorized.
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
 * without multiply-add contraction (the pragma below and the Makefile's
 * NO_FP_CONTRACT), and the x86-64 clones target AVX2 without FMA. The L
 * each reference search writes is never read by its callers (the final
 * quants are recomputed against the stored scales), so the fast searches
 * return the scale alone.
 *
 * quant.c (q4_K/q5_K/q6_K_quantize with fast set) is the only caller;
 * tests/test_quant.c holds the bytes equal to the reference's
 * (tg_from_float_ref) on every family.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#else
#pragma STDC FP_CONTRACT OFF
#endif

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant_kq.h"

typedef float kq_vf __attribute__((vector_size(32)));   /* 8 lanes */
typedef int32_t kq_vi __attribute__((vector_size(32)));
typedef float kq_vf4 __attribute__((vector_size(16)));  /* 4 lanes */
typedef double kq_vd __attribute__((vector_size(32)));
typedef int64_t kq_vl __attribute__((vector_size(32)));
#define KQ_LANES 8
#define KQ_MAX_CAND 32  /* candidates per search: 25 (sym), 31 (asym), padded */

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
KQ_CLONES void tg_kq_quant_div(int n, const float *x, float add, float ds, int lo, int hi, int bias,
                               uint8_t *L)
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
KQ_CLONES void tg_kq_sq_weights(int n, const float *x, float eps, float *w)
{
    for (int i = 0; i < n; i += KQ_LANES) {
        const kq_vf v = kq_load(x + i);
        const kq_vf wi = v * v + eps;
        kq_store(w + i, &wi);
    }
}

/* fit_scale_sym without its L: returns the same a. */
float tg_kq_fit_sym_fast(int n, int nmax, const float *x, const float *w)
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
float tg_kq_fit_min_fast(int n, int nmax, const float *x, const float *w, float *mn)
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
