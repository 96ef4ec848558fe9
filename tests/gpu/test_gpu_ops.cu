/*
 * test_gpu_ops.cu: kernel-level differential tests of the GPU arm, in the
 * manner of llama.cpp's test-backend-ops: every kernel of engine/gpu/
 * kernels.cu against a host reference (engine/quant.c's scalar dequantize,
 * util.c's top-k and XXH3 digest, plain C math in f64) on fresh random
 * inputs of several shapes. Outputs are poisoned (NaN) before each run, so an
 * element the kernel fails to write fails the case. Each case checks for
 * NaN/Inf first, then the normalized mean squared error
 * NMSE = sum (out - ref)^2 / sum ref^2 against the op's named limit, and
 * prints one line: "OK   op(shape) nmse=..." or "FAIL op(shape) reason".
 *
 * Exit status: 0 when every case passed, 1 otherwise; 0 with "SKIP: no GPU"
 * on a machine without a usable GPU. Seed: TG_SEED (default: the time).
 */
#include "gpu/kernels.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

extern "C" {
#include "quant.h"
#include "util.h"
}

/* Named per-op NMSE limits. The matmul decodes exactly the reference's
 * weights and accumulates in f32: rounding only (where gk_matmul_q8 says
 * it quantizes the activations to 8 bits, the reference takes the same
 * quantized activations, so rounding only there too). get_rows may differ from the reference by an FMA's single rounding. */
static const double NMSE_MATMUL = 1e-9;
/* The tensor-core matmul (gk_matmul_tc) rounds weights and activations to
 * f16 (relative error up to 2^-11 each, about 1.6e-7 of NMSE on random
 * products); the limit leaves a factor of about 6. */
static const double NMSE_MATMUL_TC = 1e-6;
static const double NMSE_GET_ROWS = 1e-12;
static const double NMSE_RMSNORM = 1e-10;
static const double NMSE_ROPE = 1e-10;   /* the reference takes ggml's f32 angle */
static const double NMSE_ATTN = 1e-9;
/* The prompt attention on tensor cores (gk_attention_tc) rounds q and the
 * probabilities (and an F32 cache's k and v) to f16: relative errors up to
 * 2^-11 in the scores and weights, about 1e-7 of NMSE on these inputs; the
 * limit leaves room for scores of a few units, whose exp amplifies it. */
static const double NMSE_ATTN_TC = 1e-5;
static const double NMSE_SWIGLU = 1e-12;
static const double NMSE_ADD = 0.0;   /* f32 add is exact to the reference's f32 add */

static int n_fail, n_ok;
static uint64_t rng_state;

static uint64_t rnd64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static float rndf(void) { return (float)((rnd64() >> 40) * (1.0 / 8388608.0) - 1.0); }
static void fill(std::vector<float> &v, float scale)
{
    for (auto &x : v) x = rndf() * scale;
}

#define CK(call)                                                                                     \
    do {                                                                                             \
        cudaError_t rc_ = (call);                                                                    \
        if (rc_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "FATAL: %s failed: %s (in %s, %s:%d)\n", #call, cudaGetErrorString(rc_), \
                    __func__, __FILE__, __LINE__);                                                   \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

template <typename T>
static T *dev_upload(const T *h, size_t n)
{
    T *d;
    CK(cudaMalloc((void **)&d, n * sizeof(T) + 16));
    CK(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
static float *dev_poisoned(size_t n)
{
    float *d;
    CK(cudaMalloc((void **)&d, n * sizeof(float) + 16));
    CK(cudaMemset(d, 0xFF, n * sizeof(float)));   /* NaN */
    return d;
}
static std::vector<float> dev_download(const float *d, size_t n)
{
    std::vector<float> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

static std::vector<uint8_t> dev_bytes(const void *d, size_t n)
{
    std::vector<uint8_t> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    return h;
}

/* One case's verdict: non-finite first, then NMSE against limit. */
static void judge(const char *name, const std::vector<float> &out, const std::vector<double> &ref, double limit)
{
    for (size_t i = 0; i < out.size(); i++)
        if (!isfinite(out[i])) {
            printf("FAIL %s: non-finite output %g at %zu (unwritten or overflow)\n", name, out[i], i);
            n_fail++;
            return;
        }
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); i++) {
        const double d = out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    const double nmse = den > 0 ? num / den : num;
    if (nmse > limit) {
        printf("FAIL %s: nmse=%.3e above the limit %.1e\n", name, nmse, limit);
        n_fail++;
    } else {
        printf("OK   %s: nmse=%.3e (limit %.1e)\n", name, nmse, limit);
        n_ok++;
    }
}

static void check_gk(int rc, const tg_err *e, const char *name)
{
    if (rc) {
        printf("FAIL %s: launcher refused: %s\n", name, e->msg);
        n_fail++;
    }
}

/* Random weight rows of type t: f32 values quantized by the reference
 * quantizer (so every block is a realistic one), and their dequantized
 * values (the reference weights). */
static std::vector<uint8_t> make_weights(uint32_t t, int K, int rows, std::vector<float> &deq)
{
    const tg_type_traits *tr = tg_traits(t);
    const size_t rs = tg_row_size(t, K);
    std::vector<uint8_t> w(rs * rows);
    std::vector<float> f((size_t)K);
    deq.resize((size_t)K * rows);
    for (int r = 0; r < rows; r++) {
        /* vary the row scale so sub-block scales and mins differ */
        const float sc = 0.02f + 0.05f * (float)(rnd64() % 100) / 100.0f;
        for (int i = 0; i < K; i++) f[i] = rndf() * sc + (i % 37 == 0 ? 0.1f * rndf() : 0.0f);
        tr->from_float(f.data(), w.data() + rs * r, K);
        tr->to_float(w.data() + rs * r, deq.data() + (size_t)K * r, K);
    }
    return w;
}

static void test_matmul(uint32_t t, int K, int rows, int ncols)
{
    char name[128];
    const int q8 = gk_matmul_q8(t, K, ncols), tc = gk_matmul_tc(t, K, ncols);
    snprintf(name, sizeof name, "matmul_%s(K=%d,rows=%d,cols=%d%s)", tg_type_name(t), K, rows, ncols,
             q8 ? ",x8" : tc ? ",tc" : "");
    std::vector<float> wd;
    std::vector<uint8_t> w = make_weights(t, K, rows, wd);
    std::vector<float> x((size_t)K * ncols);
    fill(x, 1.0f);
    /* the activations the kernel multiplies: x itself, or its 8-bit form */
    std::vector<double> xr(x.begin(), x.end());
    if (q8)
        for (size_t b = 0; b < x.size(); b += 32) {
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b + i]));
            const float d = amax / 127.0f;
            for (int i = 0; i < 32; i++) xr[b + i] = d > 0.0f ? (double)d * nearbyintf(x[b + i] / d) : 0.0;
        }
    std::vector<double> ref((size_t)rows * ncols);
    for (int c = 0; c < ncols; c++)
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int i = 0; i < K; i++) s += (double)wd[(size_t)r * K + i] * xr[(size_t)c * K + i];
            ref[(size_t)c * rows + r] = s;
        }
    uint8_t *dw = dev_upload(w.data(), w.size());
    float *dx = dev_upload(x.data(), x.size());
    float *dy = dev_poisoned(ref.size());
    tg_err e = {{0}};
    int rc = gk_matmul(0, t, dw, rows, K, dx, ncols, dy, &e);
    if (!rc) judge(name, dev_download(dy, ref.size()), ref, tc ? NMSE_MATMUL_TC : NMSE_MATMUL);
    else check_gk(rc, &e, name);
    cudaFree(dw); cudaFree(dx); cudaFree(dy);
}

/* gk_matmul_group over nseg weights of types ts[] and rows[] sharing one
 * input: each output must be gk_matmul's bit for bit (the pipelined tile
 * promises the same numerics; gk_matmul is held to the f64 reference
 * above). with_ref: also judged against the f64 reference (small shapes). */
static void test_matmul_group(const uint32_t *ts, const int *rows, int nseg, int K, int ncols, int with_ref)
{
    char name[160];
    int n = snprintf(name, sizeof name, "matmul_group(K=%d,cols=%d:", K, ncols);
    for (int i = 0; i < nseg; i++)
        n += snprintf(name + n, sizeof name - n, "%s%s x %d", i ? "," : "", tg_type_name(ts[i]), rows[i]);
    snprintf(name + n, sizeof name - n, "%s)", gk_matmul_tc(ts[0], K, ncols) ? ",tc" : "");
    std::vector<float> x((size_t)K * ncols);
    fill(x, 1.0f);
    float *dx = dev_upload(x.data(), x.size());
    void *x16 = NULL;
    CK(cudaMalloc(&x16, (size_t)K * ncols * 2));
    gk_mm_seg segs[3];
    std::vector<float> wd[3];
    uint8_t *dw[3] = {NULL, NULL, NULL};
    float *dy[3] = {NULL, NULL, NULL}, *dref[3] = {NULL, NULL, NULL};
    tg_err e = {{0}};
    int rc = 0;
    for (int i = 0; i < nseg; i++) {
        std::vector<uint8_t> w = make_weights(ts[i], K, rows[i], wd[i]);
        dw[i] = dev_upload(w.data(), w.size());
        dy[i] = dev_poisoned((size_t)rows[i] * ncols);
        dref[i] = dev_poisoned((size_t)rows[i] * ncols);
        segs[i] = {ts[i], dw[i], rows[i], dy[i]};
        if (!rc) rc = gk_matmul(0, ts[i], dw[i], rows[i], K, dx, ncols, dref[i], &e);
    }
    if (!rc) rc = gk_matmul_group(0, segs, nseg, K, dx, ncols, x16, 0, &e);
    if (rc) check_gk(rc, &e, name);
    for (int i = 0; i < nseg && !rc; i++) {
        const size_t cnt = (size_t)rows[i] * ncols;
        std::vector<float> got = dev_download(dy[i], cnt), want = dev_download(dref[i], cnt);
        size_t bad = 0, first = 0;
        for (size_t j = 0; j < cnt; j++)
            if (memcmp(&got[j], &want[j], 4) && !bad++) first = j;
        char nm[200];
        snprintf(nm, sizeof nm, "%s[%d]", name, i);
        if (bad) {
            printf("FAIL %s: %zu of %zu outputs differ from gk_matmul's bits (first at %zu: %.9g, expected %.9g)\n",
                   nm, bad, cnt, first, got[first], want[first]);
            n_fail++;
        } else if (with_ref) {
            std::vector<double> ref(cnt);
            for (int c = 0; c < ncols; c++)
                for (int r = 0; r < rows[i]; r++) {
                    double sum = 0;
                    for (int k = 0; k < K; k++) sum += (double)wd[i][(size_t)r * K + k] * x[(size_t)c * K + k];
                    ref[(size_t)c * rows[i] + r] = sum;
                }
            judge(nm, got, ref, gk_matmul_tc(ts[i], K, ncols) ? NMSE_MATMUL_TC : NMSE_MATMUL);
        } else {
            printf("OK   %s (bit-identical to gk_matmul)\n", nm);
            n_ok++;
        }
    }
    for (int i = 0; i < nseg; i++) {
        cudaFree(dw[i]); cudaFree(dy[i]); cudaFree(dref[i]);
    }
    cudaFree(dx); cudaFree(x16);
}

/* gk_matmul_swiglu against gk_matmul_group of gate and up then
 * gk_swiglu16: the same f16 bits. */
static void test_matmul_swiglu(uint32_t t, int rows, int K, int ncols)
{
    char name[128];
    snprintf(name, sizeof name, "matmul_swiglu(%s,rows=%d,K=%d,cols=%d)", tg_type_name(t), rows, K, ncols);
    if (!gk_matmul_swiglu_ok(t, K, ncols)) {
        printf("SKIP %s: not served by the f16 tile here\n", name);
        return;
    }
    std::vector<float> x((size_t)K * ncols), wdg, wdu;
    fill(x, 1.0f);
    std::vector<uint8_t> wg = make_weights(t, K, rows, wdg), wu = make_weights(t, K, rows, wdu);
    uint8_t *dwg = dev_upload(wg.data(), wg.size()), *dwu = dev_upload(wu.data(), wu.size());
    float *dx = dev_upload(x.data(), x.size());
    const size_t cnt = (size_t)rows * ncols;
    float *dg = dev_poisoned(cnt), *du = dev_poisoned(cnt), *dy = dev_poisoned(cnt);
    void *x16, *ya, *yb;
    CK(cudaMalloc(&x16, (size_t)K * ncols * 2));
    CK(cudaMalloc(&ya, cnt * 2));
    CK(cudaMalloc(&yb, cnt * 2));
    CK(cudaMemset(ya, 0xFF, cnt * 2));
    tg_err e = {{0}};
    const gk_mm_seg gu[2] = {{t, dwg, rows, dg}, {t, dwu, rows, du}};
    int rc = gk_matmul_group(0, gu, 2, K, dx, ncols, x16, 0, &e);   /* also leaves x in f16 in x16 */
    if (!rc) rc = gk_swiglu16(0, dg, du, dy, yb, (int)cnt, &e);
    if (!rc) rc = gk_matmul_swiglu(0, t, dwg, dwu, rows, K, x16, ncols, ya, &e);
    if (rc) {
        check_gk(rc, &e, name);
    } else {
        std::vector<uint8_t> a = dev_bytes(ya, cnt * 2), b = dev_bytes(yb, cnt * 2);
        size_t bad = 0, first = 0;
        for (size_t j = 0; j < cnt; j++)
            if (memcmp(&a[2 * j], &b[2 * j], 2) && !bad++) first = j;
        if (bad) {
            printf("FAIL %s: %zu of %zu outputs differ from the group then swiglu16 (first at %zu)\n", name, bad, cnt,
                   first);
            n_fail++;
        } else {
            printf("OK   %s (bit-identical)\n", name);
            n_ok++;
        }
    }
    cudaFree(dwg); cudaFree(dwu); cudaFree(dx); cudaFree(dg); cudaFree(du); cudaFree(dy);
    cudaFree(x16); cudaFree(ya); cudaFree(yb);
}

static void test_get_rows(uint32_t t, int K, int rows, int n)
{
    char name[128];
    snprintf(name, sizeof name, "get_rows_%s(K=%d,rows=%d,n=%d)", tg_type_name(t), K, rows, n);
    std::vector<float> wd;
    std::vector<uint8_t> w = make_weights(t, K, rows, wd);
    std::vector<int32_t> ids(n);
    for (auto &i : ids) i = (int32_t)(rnd64() % rows);
    std::vector<double> ref((size_t)K * n);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < K; i++) ref[(size_t)j * K + i] = wd[(size_t)ids[j] * K + i];
    uint8_t *dw = dev_upload(w.data(), w.size());
    int32_t *di = dev_upload(ids.data(), ids.size());
    float *dy = dev_poisoned(ref.size());
    tg_err e = {{0}};
    int rc = gk_get_rows(0, t, dw, K, di, n, dy, &e);
    if (!rc) judge(name, dev_download(dy, ref.size()), ref, NMSE_GET_ROWS);
    else check_gk(rc, &e, name);
    cudaFree(dw); cudaFree(di); cudaFree(dy);
}

static void test_rmsnorm(int nrows, int n, const char *what)
{
    char name[128];
    snprintf(name, sizeof name, "rmsnorm_%s(rows=%d,n=%d)", what, nrows, n);
    std::vector<float> x((size_t)nrows * n), w(n);
    fill(x, 3.0f);
    fill(w, 1.0f);
    const float eps = 1e-6f;
    std::vector<double> ref(x.size());
    for (int r = 0; r < nrows; r++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[(size_t)r * n + i] * x[(size_t)r * n + i];
        const double sc = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++) ref[(size_t)r * n + i] = x[(size_t)r * n + i] * sc * w[i];
    }
    float *dx = dev_upload(x.data(), x.size()), *dw = dev_upload(w.data(), w.size());
    float *dy = dev_poisoned(x.size());
    tg_err e = {{0}};
    int rc = gk_rmsnorm(0, dx, dw, dy, nrows, n, eps, &e);
    if (!rc) judge(name, dev_download(dy, x.size()), ref, NMSE_RMSNORM);
    else check_gk(rc, &e, name);
    cudaFree(dx); cudaFree(dw); cudaFree(dy);
}

/* The angle of rope pair i at pos in f32 as ggml-cpu computes it: pos
 * times theta_scale = powf(base, -2/hd), i times, one f32 product each. */
static double rope_theta(int pos, float base, int hd, int i)
{
    const float theta_scale = powf(base, -2.0f / (float)hd);
    float th = (float)pos;
    for (int k = 0; k < i; k++) th *= theta_scale;
    return th;
}

static void test_rope(int n_tok, int n_head, int hd, int pos0, int neox)
{
    char name[128];
    snprintf(name, sizeof name, "rope_%s(tok=%d,heads=%d,hd=%d,pos0=%d)", neox ? "neox" : "norm", n_tok, n_head,
             hd, pos0);
    std::vector<float> x((size_t)n_tok * n_head * hd);
    fill(x, 2.0f);
    const double base = 1e6;
    std::vector<double> ref(x.begin(), x.end());
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++)
            for (int i = 0; i < hd / 2; i++) {
                const double th = rope_theta(pos0 + t, (float)base, hd, i);
                const size_t o = ((size_t)t * n_head + h) * hd;
                const int i0 = neox ? i : 2 * i, i1 = neox ? i + hd / 2 : 2 * i + 1;
                const double a = x[o + i0], b = x[o + i1];
                ref[o + i0] = a * cos(th) - b * sin(th);
                ref[o + i1] = a * sin(th) + b * cos(th);
            }
    float *dx = dev_upload(x.data(), x.size());
    int32_t *dp = dev_upload(&pos0, 1);
    tg_err e = {{0}};
    int rc = gk_rope(0, dx, n_tok, n_head, hd, dp, (float)base, neox, &e);
    if (!rc) judge(name, dev_download(dx, x.size()), ref, NMSE_ROPE);
    else check_gk(rc, &e, name);
    cudaFree(dx); cudaFree(dp);
}

/* kv_store then attention over a cache pre-filled with random history:
 * positions < pos0 come from a host-written cache, pos0.. from kv_store. */
/* scores (split 0): through gk_attention_scores, the replay hooks' path: a
 * first launch keeps the scores (checked against the reference's), a
 * second takes them halved (the reference's output halves them too). */
static void test_attention(int kv_f16, int n_tok, int n_head, int n_head_kv, int hd, int pos0, int split,
                           int scores = 0)
{
    char name[160];
    const int tc = !scores && gk_attention_tc(n_tok, hd);
    snprintf(name, sizeof name, "attn_%s%s%s%s(tok=%d,heads=%d/%d,hd=%d,pos0=%d)", kv_f16 ? "f16kv" : "f32kv",
             split ? ",split" : "", scores ? ",scores" : "", tc ? ",tc" : "", n_tok, n_head, n_head_kv, hd, pos0);
    const int n_ctx = pos0 + n_tok + 3, row = n_head_kv * hd;
    std::vector<float> hist((size_t)n_ctx * row), knew((size_t)n_tok * row), vnew((size_t)n_tok * row);
    std::vector<float> histv(hist.size()), q((size_t)n_tok * n_head * hd);
    fill(hist, 1.0f); fill(histv, 1.0f); fill(knew, 1.0f); fill(vnew, 1.0f); fill(q, 1.5f);
    /* the reference sees exactly what the cache holds */
    std::vector<float> K(hist), V(histv);
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < row; i++) {
            K[(size_t)(pos0 + t) * row + i] = knew[(size_t)t * row + i];
            V[(size_t)(pos0 + t) * row + i] = vnew[(size_t)t * row + i];
        }
    void *dk, *dv;
    const size_t el = kv_f16 ? 2 : 4;
    CK(cudaMalloc(&dk, K.size() * el));
    CK(cudaMalloc(&dv, V.size() * el));
    if (kv_f16) {
        std::vector<tg_half> hk(K.size()), hv(V.size());
        for (size_t i = 0; i < K.size(); i++) {
            hk[i] = tg_f32_to_half(hist[i]);
            hv[i] = tg_f32_to_half(histv[i]);
        }
        for (size_t i = 0; i < K.size(); i++) {
            K[i] = tg_half_to_f32(tg_f32_to_half(K[i]));
            V[i] = tg_half_to_f32(tg_f32_to_half(V[i]));
        }
        CK(cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMemcpy(dk, hist.data(), hist.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv, histv.data(), histv.size() * 4, cudaMemcpyHostToDevice));
    }
    std::vector<double> ref(q.size());
    const int grp = n_head / n_head_kv, stride = pos0 + n_tok;
    std::vector<double> sref((size_t)n_tok * n_head * stride, 0.0);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const int nkv = pos0 + t + 1, hk = h / grp;
            std::vector<double> s(nkv);
            double mx = -1e300;
            for (int j = 0; j < nkv; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[((size_t)t * n_head + h) * hd + i] * K[(size_t)j * row + hk * hd + i];
                s[j] = d / sqrt((double)hd);
                sref[((size_t)t * n_head + h) * stride + j] = s[j];
                if (scores) s[j] = (float)(0.5f * (float)s[j]);   /* what the second launch is given */
                mx = s[j] > mx ? s[j] : mx;
            }
            double sum = 0;
            for (int j = 0; j < nkv; j++) sum += (s[j] = exp(s[j] - mx));
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j < nkv; j++) o += s[j] * V[(size_t)j * row + hk * hd + i];
                ref[((size_t)t * n_head + h) * hd + i] = o / sum;
            }
        }
    float *dkn = dev_upload(knew.data(), knew.size()), *dvn = dev_upload(vnew.data(), vnew.size());
    float *dq = dev_upload(q.data(), q.size());
    int32_t *dp = dev_upload(&pos0, 1);
    float *dout = dev_poisoned(q.size());
    tg_err e = {{0}};
    int rc = gk_kv_store(0, dkn, dvn, dk, dv, kv_f16, n_tok, row, dp, &e);
    void *scr = NULL;
    if (split) CK(cudaMalloc(&scr, gk_attention_scratch(n_head, hd)));
    if (!scores) {
        if (!rc) rc = gk_attention(0, dq, dk, dv, kv_f16, dout, n_tok, n_head, n_head_kv, hd, n_ctx, dp, scr, &e);
    } else {
        float *dsc = dev_poisoned(sref.size());
        if (!rc)
            rc = gk_attention_scores(0, dq, dk, dv, kv_f16, dout, n_tok, n_head, n_head_kv, hd, dp, NULL, dsc,
                                     stride, &e);
        if (!rc) {
            std::vector<float> got = dev_download(dsc, sref.size());
            char nm[200];
            snprintf(nm, sizeof nm, "%s.scores", name);
            /* only the causal entries are the kernel's; the rest stay poisoned */
            std::vector<float> causal;
            std::vector<double> want;
            for (int t = 0; t < n_tok; t++)
                for (int h = 0; h < n_head; h++)
                    for (int j = 0; j <= pos0 + t; j++) {
                        const size_t i = ((size_t)t * n_head + h) * stride + j;
                        causal.push_back(got[i]);
                        want.push_back(sref[i]);
                        got[i] = 0.5f * got[i];
                    }
            judge(nm, causal, want, NMSE_ATTN);
            CK(cudaMemcpy(dsc, got.data(), got.size() * 4, cudaMemcpyHostToDevice));
            rc = gk_attention_scores(0, dq, dk, dv, kv_f16, dout, n_tok, n_head, n_head_kv, hd, dp, dsc, NULL,
                                     stride, &e);
        }
        cudaFree(dsc);
    }
    if (!rc) judge(name, dev_download(dout, q.size()), ref, tc ? NMSE_ATTN_TC : NMSE_ATTN);
    else check_gk(rc, &e, name);
    cudaFree(dk); cudaFree(dv); cudaFree(dkn); cudaFree(dvn); cudaFree(dq); cudaFree(dp); cudaFree(dout);
    if (scr) cudaFree(scr);
}

/* kv_store alone: the cache must hold exactly the host's conversion. */
static void test_kv_store(int kv_f16, int n_tok, int row, int pos0)
{
    char name[128];
    snprintf(name, sizeof name, "kv_store_%s(tok=%d,row=%d,pos0=%d)", kv_f16 ? "f16" : "f32", n_tok, row, pos0);
    const int n_ctx = pos0 + n_tok;
    std::vector<float> k((size_t)n_tok * row), v(k.size());
    fill(k, 4.0f); fill(v, 4.0f);
    const size_t el = kv_f16 ? 2 : 4;
    void *dk, *dv;
    CK(cudaMalloc(&dk, (size_t)n_ctx * row * el));
    CK(cudaMalloc(&dv, (size_t)n_ctx * row * el));
    float *dkn = dev_upload(k.data(), k.size()), *dvn = dev_upload(v.data(), v.size());
    int32_t *dp = dev_upload(&pos0, 1);
    tg_err e = {{0}};
    int rc = gk_kv_store(0, dkn, dvn, dk, dv, kv_f16, n_tok, row, dp, &e);
    if (rc) { check_gk(rc, &e, name); return; }
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> hk((size_t)n_tok * row * el), hv(hk.size());
    CK(cudaMemcpy(hk.data(), (uint8_t *)dk + (size_t)pos0 * row * el, hk.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hv.data(), (uint8_t *)dv + (size_t)pos0 * row * el, hv.size(), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < k.size(); i++) {
        if (kv_f16) {
            bad += ((tg_half *)hk.data())[i] != tg_f32_to_half(k[i]);
            bad += ((tg_half *)hv.data())[i] != tg_f32_to_half(v[i]);
        } else {
            bad += memcmp(&((float *)hk.data())[i], &k[i], 4) != 0;
            bad += memcmp(&((float *)hv.data())[i], &v[i], 4) != 0;
        }
    }
    if (bad) { printf("FAIL %s: %zu cache entries differ from the host conversion\n", name, bad); n_fail++; }
    else { printf("OK   %s: byte-identical to the host conversion\n", name); n_ok++; }
    cudaFree(dk); cudaFree(dv); cudaFree(dkn); cudaFree(dvn); cudaFree(dp);
}

static void test_swiglu_add(int n)
{
    char name[96];
    std::vector<float> g(n), u(n);
    fill(g, 6.0f); fill(u, 2.0f);
    std::vector<double> ref(n), refa(n);
    for (int i = 0; i < n; i++) {
        ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        refa[i] = (float)(g[i] + u[i]);
    }
    float *dg = dev_upload(g.data(), n), *du = dev_upload(u.data(), n), *dy = dev_poisoned(n);
    tg_err e = {{0}};
    snprintf(name, sizeof name, "swiglu(n=%d)", n);
    int rc = gk_swiglu(0, dg, du, dy, n, &e);
    if (!rc) judge(name, dev_download(dy, n), ref, NMSE_SWIGLU);
    else check_gk(rc, &e, name);
    snprintf(name, sizeof name, "add(n=%d)", n);
    rc = gk_add(0, dg, du, n, &e);
    if (!rc) judge(name, dev_download(dg, n), refa, NMSE_ADD);
    else check_gk(rc, &e, name);
    cudaFree(dg); cudaFree(du); cudaFree(dy);
}

/* gk_rmsnorm16 and gk_swiglu16: y as gk_rmsnorm's and gk_swiglu's, bit for
 * bit, and y16 the f16 rounding of y; then gk_matmul_group with x16_ready
 * over the swiglu's y16 gives gk_matmul's bits over its y. */
/* gk_qk_norm_rope_store against its parts (gk_rmsnorm over the heads of q
 * and of k, gk_rope of each, gk_kv_store): the same bits in q, k and both
 * caches. */
static void test_qk_norm_rope_store(int n_tok, int n_head, int n_head_kv, int hd, int neox, int kv_f16, int pos0)
{
    char name[128];
    snprintf(name, sizeof name, "qk_norm_rope_store(tok=%d,heads=%d/%d,hd=%d,%s,%s,pos=%d)", n_tok, n_head,
             n_head_kv, hd, neox ? "neox" : "norm", kv_f16 ? "f16" : "f32", pos0);
    const size_t nq = (size_t)n_tok * n_head * hd, nk = (size_t)n_tok * n_head_kv * hd;
    const int row = n_head_kv * hd, n_ctx = pos0 + n_tok + 3;
    const size_t el = kv_f16 ? 2 : 4, cache = (size_t)n_ctx * row * el;
    std::vector<float> q(nq), k(nk), v(nk), wq(hd), wk(hd);
    fill(q, 4.0f); fill(k, 4.0f); fill(v, 2.0f); fill(wq, 1.5f); fill(wk, 1.5f);
    float *dqa = dev_upload(q.data(), nq), *dqb = dev_upload(q.data(), nq);
    float *dka = dev_upload(k.data(), nk), *dkb = dev_upload(k.data(), nk), *dv = dev_upload(v.data(), nk);
    float *dwq = dev_upload(wq.data(), (size_t)hd), *dwk = dev_upload(wk.data(), (size_t)hd);
    int32_t *dp = dev_upload(&pos0, 1);
    void *kca, *vca, *kcb, *vcb;
    CK(cudaMalloc(&kca, cache)); CK(cudaMalloc(&vca, cache)); CK(cudaMalloc(&kcb, cache)); CK(cudaMalloc(&vcb, cache));
    CK(cudaMemset(kca, 0x5a, cache)); CK(cudaMemset(vca, 0x5a, cache));
    CK(cudaMemset(kcb, 0x5a, cache)); CK(cudaMemset(vcb, 0x5a, cache));
    tg_err e = {{0}};
    const float base = 1000000.0f, eps = 1e-6f;
    int rc = gk_qk_norm_rope_store(0, dqa, dka, dv, dwq, dwk, n_tok, n_head, n_head_kv, hd, dp, base, neox, eps, kca,
                                   vca, kv_f16, &e);
    if (!rc) rc = gk_rmsnorm(0, dqb, dwq, dqb, n_tok * n_head, hd, eps, &e);
    if (!rc) rc = gk_rmsnorm(0, dkb, dwk, dkb, n_tok * n_head_kv, hd, eps, &e);
    if (!rc) rc = gk_rope(0, dqb, n_tok, n_head, hd, dp, base, neox, &e);
    if (!rc) rc = gk_rope(0, dkb, n_tok, n_head_kv, hd, dp, base, neox, &e);
    if (!rc) rc = gk_kv_store(0, dkb, dv, kcb, vcb, kv_f16, n_tok, row, dp, &e);
    if (rc) {
        check_gk(rc, &e, name);
    } else {
        const char *what = NULL;
        if (memcmp(dev_download(dqa, nq).data(), dev_download(dqb, nq).data(), nq * 4)) what = "q";
        else if (memcmp(dev_download(dka, nk).data(), dev_download(dkb, nk).data(), nk * 4)) what = "k";
        else {
            std::vector<uint8_t> a = dev_bytes(kca, cache), b = dev_bytes(kcb, cache);
            std::vector<uint8_t> c = dev_bytes(vca, cache), d = dev_bytes(vcb, cache);
            if (a != b) what = "k cache";
            else if (c != d) what = "v cache";
        }
        if (what) {
            printf("FAIL %s: %s differs from the separate kernels'\n", name, what);
            n_fail++;
        } else {
            printf("OK   %s (bit-identical)\n", name);
            n_ok++;
        }
    }
    cudaFree(dqa); cudaFree(dqb); cudaFree(dka); cudaFree(dkb); cudaFree(dv); cudaFree(dwq); cudaFree(dwk);
    cudaFree(dp); cudaFree(kca); cudaFree(vca); cudaFree(kcb); cudaFree(vcb);
}

static void test_f16_outputs(int rows, int n)
{
    char name[96];
    snprintf(name, sizeof name, "rmsnorm16+add_rmsnorm16+swiglu16+group(rows=%d,n=%d)", rows, n);
    const size_t cnt = (size_t)rows * n;
    std::vector<float> x(cnt), w(n), u(cnt);
    fill(x, 3.0f); fill(w, 1.0f); fill(u, 2.0f);
    float *dx = dev_upload(x.data(), cnt), *dw = dev_upload(w.data(), (size_t)n), *du = dev_upload(u.data(), cnt);
    float *dy = dev_poisoned(cnt), *dy2 = dev_poisoned(cnt);
    void *d16 = NULL;
    CK(cudaMalloc(&d16, cnt * 2));
    tg_err e = {{0}};
    int bad = 0;
    auto check16 = [&](const char *what, const std::vector<float> &y, const std::vector<float> &y2) {
        std::vector<uint16_t> h(cnt);
        CK(cudaMemcpy(h.data(), d16, cnt * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < cnt; i++) {
            const __half r = __float2half_rn(y[i]);
            uint16_t rb;
            memcpy(&rb, &r, 2);
            if (memcmp(&y[i], &y2[i], 4) || h[i] != rb) {
                if (!bad++)
                    printf("FAIL %s: %s at %zu: y %.9g (plain %.9g), f16 bits %04x, expected %04x\n", name, what, i,
                           y[i], y2[i], h[i], rb);
            }
        }
    };
    int rc = gk_rmsnorm16(0, dx, dw, dy, d16, rows, n, 1e-6f, &e);
    if (!rc) rc = gk_rmsnorm(0, dx, dw, dy2, rows, n, 1e-6f, &e);
    if (!rc) check16("rmsnorm16", dev_download(dy, cnt), dev_download(dy2, cnt));
    if (!rc) rc = gk_swiglu16(0, dx, du, dy, d16, (int)cnt, &e);
    if (!rc) rc = gk_swiglu(0, dx, du, dy2, (int)cnt, &e);
    std::vector<float> sw;
    if (!rc) {
        sw = dev_download(dy, cnt);
        check16("swiglu16", sw, dev_download(dy2, cnt));
    }
    /* gk_add_rmsnorm16 against gk_add then gk_rmsnorm16 (x and y of both kept) */
    float *dxa = dev_upload(x.data(), cnt), *dxb = dev_upload(x.data(), cnt);
    void *d16b = NULL;
    CK(cudaMalloc(&d16b, cnt * 2));
    if (!rc) rc = gk_add_rmsnorm16(0, dxa, du, dw, dy, d16b, rows, n, 1e-6f, &e);
    if (!rc) rc = gk_add(0, dxb, du, (int)cnt, &e);
    if (!rc) rc = gk_rmsnorm16(0, dxb, dw, dy2, d16, rows, n, 1e-6f, &e);
    if (!rc) {
        std::vector<float> xa = dev_download(dxa, cnt), xb = dev_download(dxb, cnt);
        std::vector<float> ya = dev_download(dy, cnt), yb = dev_download(dy2, cnt);
        std::vector<uint16_t> ha(cnt), hb(cnt);
        CK(cudaMemcpy(ha.data(), d16b, cnt * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hb.data(), d16, cnt * 2, cudaMemcpyDeviceToHost));
        if ((memcmp(xa.data(), xb.data(), cnt * 4) || memcmp(ya.data(), yb.data(), cnt * 4) ||
             memcmp(ha.data(), hb.data(), cnt * 2)) && !bad++)
            printf("FAIL %s: add_rmsnorm16 differs from add then rmsnorm16\n", name);
    }
    cudaFree(dxa); cudaFree(dxb); cudaFree(d16b);
    /* the swiglu's output as a batch of rows tokens of n values into a Q4_K weight */
    if (!rc) rc = gk_swiglu16(0, dx, du, dy, d16, (int)cnt, &e);
    const int wrows = 192;
    std::vector<float> wd;
    std::vector<uint8_t> wq = make_weights(TG_TYPE_Q4_K, n, wrows, wd);
    uint8_t *dwq = dev_upload(wq.data(), wq.size());
    float *dm = dev_poisoned((size_t)wrows * rows), *dm2 = dev_poisoned((size_t)wrows * rows);
    if (!rc) {
        const gk_mm_seg sg = {TG_TYPE_Q4_K, dwq, wrows, dm};
        rc = gk_matmul_group(0, &sg, 1, n, dy, rows, d16, 1, &e);
        if (!rc) rc = gk_matmul(0, TG_TYPE_Q4_K, dwq, wrows, n, dy, rows, dm2, &e);
        if (!rc) {
            std::vector<float> a = dev_download(dm, (size_t)wrows * rows), b = dev_download(dm2, (size_t)wrows * rows);
            if (memcmp(a.data(), b.data(), a.size() * 4) && !bad++)
                printf("FAIL %s: the group over the swiglu's f16 output differs from gk_matmul\n", name);
        }
    }
    if (rc) check_gk(rc, &e, name);
    else if (bad) n_fail++;
    else {
        printf("OK   %s (bit-identical)\n", name);
        n_ok++;
    }
    cudaFree(dx); cudaFree(dw); cudaFree(du); cudaFree(dy); cudaFree(dy2); cudaFree(d16);
    cudaFree(dwq); cudaFree(dm); cudaFree(dm2);
}

/* Top-k must equal util.c's tg_topk exactly (ids and logit bits), on data
 * with ties and, optionally, NaNs. */
/* levels: the number of distinct values (ties); 1 makes every logit equal,
 * so the search bound keeps every candidate (the fallback selection). */
static void test_topk(int n, int k, int with_nan, int levels = 2000)
{
    char name[96];
    snprintf(name, sizeof name, "topk(n=%d,k=%d%s%s)", n, k, with_nan ? ",nan" : "", levels == 1 ? ",all-equal" : "");
    std::vector<float> x(n);
    for (int i = 0; i < n; i++) x[i] = levels == 1 ? 3.0f : (float)(int)(rndf() * levels) / 64.0f;   /* many ties */
    if (with_nan) {
        x[rnd64() % n] = NAN;
        x[rnd64() % n] = NAN;
    }
    std::vector<tg_top> ref(k), out(k);
    tg_topk(x.data(), n, k, ref.data());
    float *dx = dev_upload(x.data(), n);
    void *scratch;
    tg_top *dout;
    CK(cudaMalloc(&scratch, gk_topk_scratch(n, k)));
    CK(cudaMalloc((void **)&dout, sizeof(tg_top) * k));
    CK(cudaMemset(dout, 0xFF, sizeof(tg_top) * k));
    tg_err e = {{0}};
    int rc = gk_topk(0, dx, n, k, scratch, dout, &e);
    if (rc) { check_gk(rc, &e, name); return; }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(out.data(), dout, sizeof(tg_top) * k, cudaMemcpyDeviceToHost));
    int bad = -1;
    for (int i = 0; i < k && bad < 0; i++)
        if (out[i].id != ref[i].id || memcmp(&out[i].logit, &ref[i].logit, 4)) bad = i;
    if (bad >= 0) {
        printf("FAIL %s: entry %d is (%d, %g), the host says (%d, %g)\n", name, bad, out[bad].id, out[bad].logit,
               ref[bad].id, ref[bad].logit);
        n_fail++;
    } else {
        printf("OK   %s: identical to tg_topk\n", name);
        n_ok++;
    }
    cudaFree(dx); cudaFree(scratch); cudaFree(dout);
}

/* The device XXH3-64 must equal the host's over the same bytes. */
static void test_xxh3(size_t nfloats)
{
    char name[96];
    snprintf(name, sizeof name, "xxh3(bytes=%zu)", nfloats * 4);
    std::vector<float> x(nfloats);
    fill(x, 30.0f);
    char want[17], got[17];
    tg_digest_logits(x.data(), nfloats, want);
    float *dx = dev_upload(x.data(), nfloats);
    void *scratch;
    uint64_t *dout, h = 0;
    CK(cudaMalloc(&scratch, gk_xxh3_scratch(nfloats * 4)));
    CK(cudaMalloc((void **)&dout, 8));
    tg_err e = {{0}};
    int rc = gk_xxh3(0, dx, nfloats * 4, scratch, dout, &e);
    if (rc) { check_gk(rc, &e, name); return; }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(&h, dout, 8, cudaMemcpyDeviceToHost));
    snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
    if (strcmp(got, want)) { printf("FAIL %s: device %s, host %s\n", name, got, want); n_fail++; }
    else { printf("OK   %s: %s equals the host digest\n", name, got); n_ok++; }
    cudaFree(dx); cudaFree(scratch); cudaFree(dout);
}

/* ---- the fused single-token path ------------------------------------------ */

/* 8-bit activations: error up to d/2 per value, d = max|v|/127 of its block;
 * heavy-tailed vectors (SwiGLU outputs) reach 1e-4 */
static const double NMSE_Q8_ROUND = 5e-4;

/* The 8-bit rule of gk_matmul_q8 on the host, in f32 as the kernels do. */
static void host_q8(const float *x, int n, std::vector<int8_t> &q, std::vector<float> &d, std::vector<float> &s)
{
    q.resize(n);
    d.resize(n / 32);
    s.resize(n / 32);
    for (int b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        const float dd = amax / 127.0f;
        float sum = 0.0f;
        for (int i = 0; i < 32; i++) {
            const int v = dd > 0.0f ? (int)nearbyintf(x[b * 32 + i] / dd) : 0;
            q[b * 32 + i] = (int8_t)v;
            sum += (float)v;
        }
        d[b] = dd;
        s[b] = sum;
    }
}

struct dev_q8 {
    gk_q8 g;
    int n;
    dev_q8(int n_) : n(n_)
    {
        CK(cudaMalloc((void **)&g.q, n + 16));
        CK(cudaMalloc((void **)&g.d, n / 32 * sizeof(float) + 16));
        CK(cudaMalloc((void **)&g.s, n / 32 * sizeof(float) + 16));
        CK(cudaMemset(g.q, 0x55, n));
        CK(cudaMemset(g.d, 0xFF, n / 32 * sizeof(float)));
        CK(cudaMemset(g.s, 0xFF, n / 32 * sizeof(float)));
    }
    ~dev_q8() { cudaFree(g.q); cudaFree(g.d); cudaFree(g.s); }
    void upload(const std::vector<int8_t> &q, const std::vector<float> &d, const std::vector<float> &s)
    {
        CK(cudaMemcpy(g.q, q.data(), n, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(g.d, d.data(), n / 32 * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(g.s, s.data(), n / 32 * sizeof(float), cudaMemcpyHostToDevice));
    }
};

/* The quantized vector the kernel wrote equals the host rule applied to the
 * f32 values it wrote beside it (bit for bit), and dequantizes to within
 * 8-bit rounding of the reference. */
static void judge_q8(const char *name, const dev_q8 &dq, const std::vector<float> &own, const std::vector<double> &ref)
{
    const int n = dq.n;
    std::vector<int8_t> q(n), hq;
    std::vector<float> d(n / 32), s(n / 32), hd, hs;
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(q.data(), dq.g.q, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(d.data(), dq.g.d, n / 32 * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s.data(), dq.g.s, n / 32 * sizeof(float), cudaMemcpyDeviceToHost));
    host_q8(own.data(), n, hq, hd, hs);
    char nm[200];
    snprintf(nm, sizeof nm, "%s.q8", name);
    for (int i = 0; i < n; i++)
        if (q[i] != hq[i] || d[i / 32] != hd[i / 32] || s[i / 32] != hs[i / 32]) {
            printf("FAIL %s: value %d: q=%d d=%g s=%g, the host rule on the kernel's own f32 gives q=%d d=%g s=%g\n",
                   nm, i, q[i], d[i / 32], s[i / 32], hq[i], hd[i / 32], hs[i / 32]);
            n_fail++;
            return;
        }
    std::vector<float> deq(n);
    for (int i = 0; i < n; i++) deq[i] = d[i / 32] * q[i];
    judge(nm, deq, ref, NMSE_Q8_ROUND);
}

static void test_rmsnorm_q8(int n)
{
    char name[128];
    snprintf(name, sizeof name, "rmsnorm_q8(n=%d)", n);
    std::vector<float> x(n), w(n);
    fill(x, 3.0f);
    fill(w, 1.0f);
    const float eps = 1e-6f;
    std::vector<double> ref(n);
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < n; i++) ref[i] = x[i] / sqrt(ss / n + eps) * w[i];
    float *dx = dev_upload(x.data(), n), *dw = dev_upload(w.data(), n), *dy = dev_poisoned(n);
    dev_q8 dq(n);
    tg_err e = {{0}};
    int rc = gk_rmsnorm_q8(0, dx, dw, dy, n, eps, dq.g, &e);
    if (!rc) {
        std::vector<float> y = dev_download(dy, n);
        judge(name, y, ref, NMSE_RMSNORM);
        judge_q8(name, dq, y, ref);
    } else check_gk(rc, &e, name);
    cudaFree(dx); cudaFree(dw); cudaFree(dy);
}

/* Three segments of types t0..t2 over one quantized input (the q, k, v
 * launch), stored or accumulated onto random y. */
static void test_mv_fused(const uint32_t *types, int nseg, int K, const int *rows, int accumulate)
{
    char name[160];
    int o = snprintf(name, sizeof name, "mv_fused%s(K=%d", accumulate ? "_add" : "", K);
    for (int i = 0; i < nseg; i++) o += snprintf(name + o, sizeof name - o, ",%s:%d", tg_type_name(types[i]), rows[i]);
    snprintf(name + o, sizeof name - o, ")");
    std::vector<float> x(K);
    fill(x, 1.0f);
    std::vector<int8_t> q;
    std::vector<float> d, s;
    host_q8(x.data(), K, q, d, s);
    dev_q8 dq(K);
    dq.upload(q, d, s);
    gk_mv_seg segs[3];
    std::vector<std::vector<double>> refs(nseg);
    std::vector<uint8_t *> dws(nseg);
    std::vector<float *> dys(nseg);
    for (int i = 0; i < nseg; i++) {
        std::vector<float> wd;
        std::vector<uint8_t> w = make_weights(types[i], K, rows[i], wd);
        std::vector<float> y0(rows[i]);
        fill(y0, 2.0f);
        refs[i].resize(rows[i]);
        for (int r = 0; r < rows[i]; r++) {
            double acc = accumulate ? y0[r] : 0.0;
            for (int j = 0; j < K; j++) acc += (double)wd[(size_t)r * K + j] * ((double)d[j / 32] * q[j]);
            refs[i][r] = acc;
        }
        dws[i] = dev_upload(w.data(), w.size());
        dys[i] = accumulate ? dev_upload(y0.data(), y0.size()) : dev_poisoned(rows[i]);
        segs[i] = {types[i], dws[i], rows[i], dys[i]};
    }
    tg_err e = {{0}};
    int rc = gk_mv_fused(0, segs, nseg, K, dq.g, accumulate, &e);
    if (!rc) {
        std::vector<float> all;
        std::vector<double> ref;
        for (int i = 0; i < nseg; i++) {
            std::vector<float> y = dev_download(dys[i], rows[i]);
            all.insert(all.end(), y.begin(), y.end());
            ref.insert(ref.end(), refs[i].begin(), refs[i].end());
        }
        judge(name, all, ref, NMSE_MATMUL);
    } else check_gk(rc, &e, name);
    for (int i = 0; i < nseg; i++) { cudaFree(dws[i]); cudaFree(dys[i]); }
}

static void test_mv_swiglu(uint32_t t, int K, int n_ff)
{
    char name[128];
    snprintf(name, sizeof name, "mv_swiglu_%s(K=%d,n_ff=%d)", tg_type_name(t), K, n_ff);
    std::vector<float> x(K);
    fill(x, 1.0f);
    std::vector<int8_t> q;
    std::vector<float> d, s;
    host_q8(x.data(), K, q, d, s);
    dev_q8 dq(K), dout(n_ff);
    dq.upload(q, d, s);
    std::vector<float> gd, ud;
    std::vector<uint8_t> gw = make_weights(t, K, n_ff, gd), uw = make_weights(t, K, n_ff, ud);
    std::vector<double> ref(n_ff);
    for (int r = 0; r < n_ff; r++) {
        double g = 0, u = 0;
        for (int j = 0; j < K; j++) {
            const double xv = (double)d[j / 32] * q[j];
            g += gd[(size_t)r * K + j] * xv;
            u += ud[(size_t)r * K + j] * xv;
        }
        ref[r] = g / (1.0 + exp(-g)) * u;
    }
    uint8_t *dg = dev_upload(gw.data(), gw.size()), *du = dev_upload(uw.data(), uw.size());
    float *dy = dev_poisoned(n_ff);
    tg_err e = {{0}};
    int rc = gk_mv_swiglu(0, t, dg, du, n_ff, K, dq.g, dy, dout.g, &e);
    if (!rc) {
        std::vector<float> y = dev_download(dy, n_ff);
        judge(name, y, ref, NMSE_MATMUL);
        judge_q8(name, dout, y, ref);
    } else check_gk(rc, &e, name);
    cudaFree(dg); cudaFree(du); cudaFree(dy);
}

/* gk_attn_decode against what it replaces: the normed, rotated q (q_out)
 * and the cache rows at pos against the f64 composition (per-head norm,
 * RoPE with ggml's f32 angle); the output bit for bit gk_attention (split)
 * over the cache the kernel left, with q_out; its q8 copy by the host rule.
 * Run twice on the same inputs: the second run (the counters the first
 * left) gives the same bits. */
static void test_attn_decode(int kv_f16, int n_head, int n_head_kv, int hd, int pos, int norm, int neox,
                             int n_ctx)
{
    char name[160];
    snprintf(name, sizeof name, "attn_decode_%s%s%s(heads=%d/%d,hd=%d,pos=%d,n_ctx=%d)", kv_f16 ? "f16kv" : "f32kv",
             norm ? ",norm" : "", neox ? ",neox" : "", n_head, n_head_kv, hd, pos, n_ctx);
    const int QD = n_head * hd, KVD = n_head_kv * hd;
    std::vector<float> q(QD), k(KVD), v(KVD), wq(hd), wk(hd), kcf((size_t)n_ctx * KVD), vcf((size_t)n_ctx * KVD);
    fill(q, 2.0f); fill(k, 2.0f); fill(v, 2.0f); fill(wq, 1.0f); fill(wk, 1.0f);
    fill(kcf, 1.0f); fill(vcf, 1.0f);   /* rows 0..pos-1; row pos is the kernel's to write */
    const float eps = 1e-6f, base = 1e6f;
    auto ref_head = [&](const float *x, const float *w, double *out) {
        double hs = 0;
        for (int i = 0; i < hd; i++) hs += (double)x[i] * x[i];
        const double sc = norm ? 1.0 / sqrt(hs / hd + eps) : 1.0;
        std::vector<double> t(hd);
        for (int i = 0; i < hd; i++) t[i] = norm ? x[i] * sc * w[i] : x[i];
        for (int i = 0; i < hd / 2; i++) {
            const double th = rope_theta(pos, base, hd, i);
            const int i0 = neox ? i : 2 * i, i1 = neox ? i + hd / 2 : 2 * i + 1;
            out[i0] = t[i0] * cos(th) - t[i1] * sin(th);
            out[i1] = t[i0] * sin(th) + t[i1] * cos(th);
        }
    };
    std::vector<double> rq(QD), rk(KVD);
    for (int h = 0; h < n_head; h++) ref_head(&q[(size_t)h * hd], wq.data(), &rq[(size_t)h * hd]);
    for (int h = 0; h < n_head_kv; h++) ref_head(&k[(size_t)h * hd], wk.data(), &rk[(size_t)h * hd]);
    const size_t el = kv_f16 ? 2 : 4;
    std::vector<uint8_t> kb(kcf.size() * el, 0xAB), vb(vcf.size() * el, 0xAB);
    for (size_t i = 0; i < (size_t)pos * KVD; i++) {
        if (kv_f16) {
            ((uint16_t *)kb.data())[i] = tg_f32_to_half(kcf[i]);
            ((uint16_t *)vb.data())[i] = tg_f32_to_half(vcf[i]);
        } else {
            ((float *)kb.data())[i] = kcf[i];
            ((float *)vb.data())[i] = vcf[i];
        }
    }
    float *dq = dev_upload(q.data(), QD), *dk = dev_upload(k.data(), KVD), *dv = dev_upload(v.data(), KVD);
    float *dwq = dev_upload(wq.data(), hd), *dwk = dev_upload(wk.data(), hd);
    float *qo = dev_poisoned(QD), *o1 = dev_poisoned(QD), *o2 = dev_poisoned(QD), *o3 = dev_poisoned(QD);
    uint8_t *kc = dev_upload(kb.data(), kb.size()), *vc = dev_upload(vb.data(), vb.size());
    int32_t *dp = dev_upload(&pos, 1);
    void *scr;
    CK(cudaMalloc(&scr, gk_attention_scratch(n_head, hd)));
    CK(cudaMemset(scr, 0, gk_attention_scratch(n_head, hd)));
    dev_q8 oq(QD), oq2(QD);
    tg_err e = {{0}};
    int rc = gk_attn_decode(0, dq, dk, dv, norm ? dwq : NULL, norm ? dwk : NULL, n_head, n_head_kv, hd, n_ctx, dp,
                            base, neox, eps, kc, vc, kv_f16, o1, oq.g, qo, scr, &e);
    if (!rc)
        rc = gk_attn_decode(0, dq, dk, dv, norm ? dwq : NULL, norm ? dwk : NULL, n_head, n_head_kv, hd, n_ctx, dp,
                            base, neox, eps, kc, vc, kv_f16, o2, oq2.g, NULL, scr, &e);
    if (!rc) rc = gk_attention(0, qo, kc, vc, kv_f16, o3, 1, n_head, n_head_kv, hd, n_ctx, dp, scr, &e);
    if (!rc) {
        char nm[200];
        snprintf(nm, sizeof nm, "%s.q", name);
        judge(nm, dev_download(qo, QD), rq, NMSE_ROPE + NMSE_RMSNORM);
        std::vector<uint8_t> kr((size_t)KVD * el), vr((size_t)KVD * el);
        CK(cudaMemcpy(kr.data(), kc + (size_t)pos * KVD * el, kr.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(vr.data(), vc + (size_t)pos * KVD * el, vr.size(), cudaMemcpyDeviceToHost));
        std::vector<float> kf(KVD), vf(KVD);
        for (int i = 0; i < KVD; i++) {
            kf[i] = kv_f16 ? tg_half_to_f32(((uint16_t *)kr.data())[i]) : ((float *)kr.data())[i];
            vf[i] = kv_f16 ? tg_half_to_f32(((uint16_t *)vr.data())[i]) : ((float *)vr.data())[i];
        }
        std::vector<double> rv(v.begin(), v.end());
        snprintf(nm, sizeof nm, "%s.kcache", name);
        judge(nm, kf, rk, kv_f16 ? 1e-6 : NMSE_ROPE + NMSE_RMSNORM);
        snprintf(nm, sizeof nm, "%s.vcache", name);
        judge(nm, vf, rv, kv_f16 ? 1e-6 : 0.0);
        std::vector<float> a = dev_download(o1, QD), b = dev_download(o2, QD), c = dev_download(o3, QD);
        std::vector<double> ref(c.begin(), c.end());
        judge(name, a, ref, 0.0);
        judge_q8(name, oq, a, ref);
        if (memcmp(a.data(), b.data(), a.size() * sizeof(float))) {
            printf("FAIL %s: the second run's output differs from the first's (the arrival counters)\n", name);
            n_fail++;
        }
    } else check_gk(rc, &e, name);
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dwq); cudaFree(dwk); cudaFree(qo); cudaFree(o1);
    cudaFree(o2); cudaFree(o3); cudaFree(kc); cudaFree(vc); cudaFree(dp); cudaFree(scr);
}

int main(void)
{
    char desc[160];
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("SKIP: no GPU (the runtime sees no device); the GPU kernel tests did not run\n");
        return 0;
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    snprintf(desc, sizeof desc, "%.100s", p.name);
    const char *seed = getenv("TG_SEED");
    rng_state = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    printf("test_gpu_ops on %s, seed %llu\n", desc, (unsigned long long)rng_state);
    {
        tg_err e = {{0}};
        if (gk_init(&e)) {
            printf("FAIL gk_init: %s\n", e.msg);
            n_fail++;
        }
    }

    const uint32_t types[] = {TG_TYPE_F32,  TG_TYPE_F16,  TG_TYPE_BF16, TG_TYPE_Q8_0, TG_TYPE_Q4_K, TG_TYPE_Q5_K,
                              TG_TYPE_Q6_K, TG_TYPE_Q4_0, TG_TYPE_Q5_0, TG_TYPE_Q2_K, TG_TYPE_Q3_K, TG_TYPE_Q4_1,
                              TG_TYPE_Q5_1};
    /* cols >= 16 with K a multiple of 128: the tensor-core kernel (partial
     * row and token tiles included) */
    struct { int K, rows, cols; } mm[] = {{256, 64, 1}, {1024, 301, 1}, {4096, 128, 1}, {768, 96, 8},
                                          {512, 77, 13}, {2048, 40, 3}, {256, 64, 16}, {768, 130, 64},
                                          {1024, 77, 100}, {4096, 200, 33}, {1024, 300, 200}};
    for (uint32_t t : types) {
        for (auto &s : mm) test_matmul(t, s.K, s.rows, s.cols);
        test_get_rows(t, 256, 50, 3);
        test_get_rows(t, 1024, 300, 7);
    }
    /* the pipelined tile of gk_matmul_group: one to three weights, runs
     * of one type, partial row and token tiles, both tile heights (64 for
     * small launches, 128 for at least two blocks per SM), and a batch
     * below the tensor-core width (one gk_matmul each) */
    for (uint32_t t : types) {
        const uint32_t t3[3] = {t, t, t};
        const int r3[3] = {130, 64, 77};
        test_matmul_group(t3, r3, 3, 256, 100, 1);
        test_matmul_group(t3, r3, 1, 1024, 16, 1);
    }
    {
        const uint32_t mix[3] = {TG_TYPE_Q4_K, TG_TYPE_Q4_K, TG_TYPE_Q6_K};
        const int rmix[3] = {200, 64, 64};
        test_matmul_group(mix, rmix, 3, 768, 300, 1);
        test_matmul_group(mix, rmix, 3, 768, 8, 1);
        const int big[3] = {4096, 1024, 1024};   /* q, k, v of the 8b shape at a 512-token batch */
        test_matmul_group(mix, big, 3, 4096, 512, 0);
        const uint32_t gu[2] = {TG_TYPE_Q4_K, TG_TYPE_Q4_K};
        const int rgu[2] = {12288, 12288};   /* gate and up: 128-row tiles */
        test_matmul_group(gu, rgu, 2, 4096, 300, 0);
        const uint32_t dn[1] = {TG_TYPE_Q6_K};
        const int rdn[1] = {4096};
        test_matmul_group(dn, rdn, 1, 12288, 512, 0);
    }
    /* gate, up and SwiGLU in one launch: partial row blocks (of 32 and 64
     * rows a weight), both tiles (64 x 128 small, 128 x 128 at 8b's width) */
    for (uint32_t t : types) test_matmul_swiglu(t, 200, 256, 100);
    test_matmul_swiglu(TG_TYPE_Q4_K, 77, 512, 16);
    test_matmul_swiglu(TG_TYPE_Q4_K, 12288, 4096, 300);
    test_matmul_swiglu(TG_TYPE_Q6_K, 14336, 4096, 512);
    test_f16_outputs(100, 1024);
    test_f16_outputs(8, 768);   /* below the tensor-core width: the group multiplies x itself */
    test_qk_norm_rope_store(37, 32, 8, 128, 1, 1, 0);   /* Qwen3-8B's heads, a prompt at 0 */
    test_qk_norm_rope_store(5, 16, 8, 128, 1, 0, 9);    /* f32 cache, a later batch */
    test_qk_norm_rope_store(3, 4, 2, 64, 0, 1, 2);      /* adjacent pairs, head_dim 64 */
    test_qk_norm_rope_store(2, 2, 1, 80, 1, 1, 1);      /* head_dim not a multiple of the warp */
    test_qk_norm_rope_store(2, 2, 1, 512, 1, 1, 4);     /* over QKR_MAX_HD: the separate kernels */
    /* the single-token shapes of the 8-bit mat-vec: several rows per warp,
     * the widest activation vectors of the 8b shape */
    for (uint32_t t : {TG_TYPE_Q4_K, TG_TYPE_Q6_K}) {
        test_matmul(t, 4096, 9000, 1);
        test_matmul(t, 12288, 700, 1);
        test_matmul(t, 1024, 2049, 1);
    }
    test_rmsnorm(1, 256, "vec");
    test_rmsnorm(5, 1024, "vec");
    test_rmsnorm(3, 4096, "vec");
    test_rmsnorm(16 * 3, 128, "head");
    test_rmsnorm(4 * 2, 64, "head");
    for (int neox = 0; neox < 2; neox++) {
        test_rope(1, 16, 128, 4000, neox);
        test_rope(7, 8, 64, 3, neox);
        test_rope(3, 32, 128, 0, neox);
    }
    for (int f16 = 0; f16 < 2; f16++) {
        test_kv_store(f16, 1, 1024, 17);
        test_kv_store(f16, 9, 256, 0);
        for (int split = 0; split < 2; split++) {
            test_attention(f16, 1, 4, 2, 64, 0, split);      /* fewer keys than splits */
            test_attention(f16, 1, 16, 8, 128, 37, split);
            test_attention(f16, 1, 32, 8, 128, 1500, split); /* more keys than one shared-memory chunk */
            test_attention(f16, 1, 32, 8, 128, 20000, split);
        }
        test_attention(f16, 7, 4, 2, 64, 5, 0);           /* prefill, causal */
        test_attention(f16, 12, 16, 8, 128, 0, 0);        /* prefill from an empty cache */
        /* prompts of 16 tokens or more: the tensor-core kernel (partial query
         * and key tiles, a cache that already holds keys, both head sizes) */
        test_attention(f16, 16, 4, 2, 64, 0, 0);
        test_attention(f16, 100, 8, 2, 128, 30, 0);
        test_attention(f16, 300, 32, 8, 128, 0, 0);
        test_attention(f16, 77, 4, 4, 64, 200, 0);
        test_attention(f16, 7, 4, 2, 64, 5, 0, 1);        /* the replay's scores in and out */
        test_attention(f16, 3, 16, 8, 128, 1500, 0, 1);
    }
    test_swiglu_add(1000);
    test_swiglu_add(12288 * 3);
    test_topk(8192, 1, 0);
    test_topk(8192, 32, 1);
    test_topk(151936, 32, 0);
    test_topk(151936, 256, 1);
    test_topk(300, 256, 1);
    test_topk(200, 200, 1);      /* k == n */
    test_topk(151936, 32, 0, 1); /* every logit equal: more survivors than the final pass sorts */
    test_topk(151936, 32, 0, 1 << 20);   /* few ties, the common case */
    test_topk(151936, 10, 1, 1 << 20);
    test_topk(151936, 64, 0, 1 << 20);
    test_topk(1000, 5, 1);               /* one short chunk */
    test_xxh3(61);          /* 244 bytes: shortest long input */
    test_xxh3(256);         /* exactly one 1024-byte block */
    test_xxh3(8192);
    test_xxh3(151936);
    test_xxh3(151936 + 3);
    /* the fused single-token path, at the 8b, 0.6b and tiny shapes */
    test_rmsnorm_q8(4096);
    test_rmsnorm_q8(1024);
    test_rmsnorm_q8(256);
    {
        const uint32_t qkv[3] = {TG_TYPE_Q4_K, TG_TYPE_Q4_K, TG_TYPE_Q6_K};
        const int r8b[3] = {4096, 1024, 1024}, rsm[3] = {64, 33, 7};
        test_mv_fused(qkv, 3, 4096, r8b, 0);
        test_mv_fused(qkv, 3, 256, rsm, 0);
        const uint32_t one[3][1] = {{TG_TYPE_Q4_K}, {TG_TYPE_Q6_K}, {TG_TYPE_Q8_0}};
        const int r1[1] = {1000}, r2[1] = {4096};
        for (int i = 0; i < 3; i++) {
            test_mv_fused(one[i], 1, 12288, r1, 1);   /* the down projection onto the residual */
            test_mv_fused(one[i], 1, 4096, r2, 1);
            test_mv_fused(one[i], 1, 1024, r1, 0);
        }
        /* more row groups than the grid's warps: several a warp */
        const int rbig[1] = {20011};
        test_mv_fused(one[1], 1, 2048, rbig, 0);
        test_mv_fused(one[0], 1, 1024, rbig, 1);
    }
    for (uint32_t t : {TG_TYPE_Q4_K, TG_TYPE_Q6_K, TG_TYPE_Q8_0}) {
        test_mv_swiglu(t, 4096, 1024);
        test_mv_swiglu(t, 256, 96);
    }
    /* n_ctx: the cache's rows; with 32 key ranges, up to 48 (f16, hd 128) or
     * 24 (f32) rows a range are staged in shared memory, longer ranges read
     * the cache where it is */
    for (int f16 = 0; f16 < 2; f16++) {
        test_attn_decode(f16, 32, 8, 128, 77, 1, 1, 78);      /* staged */
        test_attn_decode(f16, 32, 8, 128, 77, 1, 1, 4096);    /* not staged */
        test_attn_decode(f16, 16, 8, 64, 0, 0, 0, 1);
        test_attn_decode(f16, 4, 2, 256, 3000, 1, 0, 3001);
        test_attn_decode(f16, 32, 8, 128, 1500, 1, 1, 1536);  /* staged (f16) */
        test_attn_decode(f16, 32, 8, 128, 700, 1, 1, 768);    /* staged, some ranges short */
        test_attn_decode(f16, 16, 8, 64, 40, 1, 1, 1024);
        test_attn_decode(f16, 8, 8, 512, 5, 1, 1, 6);         /* more ranges than keys */
    }
    printf("test_gpu_ops: %d OK, %d FAIL\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
