/*
 * kernels.cu: the GPU arm's kernels (embedding lookup, RMSNorm, mat-vec and
 * batched matmul over every weight type, RoPE, KV-cache store, attention,
 * SwiGLU, residual add, top-k selection and the XXH3-64 logit digest),
 * written once in CUDA spelling; hipcc builds the same file through
 * vendor_hip.h. The scalar references these are tested against are
 * engine/quant.c (dequantize) and plain C math in tests/gpu/.
 *
 * Weight decoding: every block format is described by one traits struct
 * (values per block, bytes per block, how many threads share a block, and
 * `deq`, which decodes one thread's share into runs of consecutive values
 * of the form a * v + b). One templated mat-vec and one get-rows kernel
 * serve every type; there is no per-type kernel body.
 */
#include "kernels.cuh"

#include <math.h>
#include <stdio.h>

/* A switch read once from the environment into *cache (-1: not read yet):
 * "1..." on, "0..." off, unset or anything else def. */
static int env_switch(int *cache, const char *name, int def)
{
    if (*cache < 0) {
        const char *v = getenv(name);
        *cache = v && v[0] == '1' ? 1 : v && v[0] == '0' ? 0 : def;
    }
    return *cache;
}

/* ---- asynchronous copies to shared memory (cp.async; plain copies on HIP
 * and before sm_80) ---------------------------------------------------- */

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
#if defined(TG_GPU_HIP) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
    *(uint4 *)smem = *(const uint4 *)gmem;
#else
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit()
{
#if !(defined(TG_GPU_HIP) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800))
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* Waits until at most N of this thread's copy groups are pending. */
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
#if !(defined(TG_GPU_HIP) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800))
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* cp_async16 that fills the 16 bytes with zeros instead when ok is false
 * (gmem is not read then). */
__device__ __forceinline__ void cp_async16_zf(void *smem, const void *gmem, bool ok)
{
#if defined(TG_GPU_HIP) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
    *(uint4 *)smem = ok ? *(const uint4 *)gmem : make_uint4(0, 0, 0, 0);
#else
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
#endif
}

/* ---- block decoding traits --------------------------------------------- */

/* One thread's share ("part") of a block: NRUN runs of RUNLEN consecutive
 * values; run r starts at off(part, r) within the block and its values are
 * a[r] * v[r*RUNLEN + i] + b[r] (b only when HAS_MIN). */

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, float *sc, float *m)
{
    uint8_t d, mm;
    if (j < 4) {
        d = q[j] & 63;
        mm = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        mm = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
    *sc = d;
    *m = mm;
}

/* scale_min_k4 over the scale bytes held in registers (hd.y, hd.z, hd.w:
 * bytes 4..15 of the block), selected without indexing a local array. */
__device__ __forceinline__ uint32_t sbyte(const uint4 &hd, int k)
{
    const uint32_t w = k < 4 ? hd.y : k < 8 ? hd.z : hd.w;
    return (w >> (8 * (k & 3))) & 0xFF;
}

__device__ __forceinline__ void scale_min_k4_w(int j, const uint4 &hd, float *sc, float *m)
{
    if (j < 4) {
        *sc = (float)(sbyte(hd, j) & 63);
        *m = (float)(sbyte(hd, j + 4) & 63);
    } else {
        *sc = (float)((sbyte(hd, j + 4) & 0xF) | ((sbyte(hd, j - 4) >> 6) << 4));
        *m = (float)((sbyte(hd, j + 4) >> 4) | ((sbyte(hd, j) >> 6) << 4));
    }
}

struct tr_q4_K {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q4_K), PARTS = 8;
    static constexpr int NRUN = 2, RUNLEN = 16;
    static constexpr bool HAS_MIN = true;
    /* part p: group g = p/2 (qs[32g..32g+31]), half hh = p%2: bytes
     * qs[32g+16hh .. +15] hold values 64g+16hh+l (low nibbles, sub-block 2g)
     * and 64g+32+16hh+l (high nibbles, sub-block 2g+1). */
    __device__ static int off(int p, int r) { return 64 * (p >> 1) + 32 * r + 16 * (p & 1); }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        const int g = p >> 1, hh = p & 1;
        const float d = h2f(*(const uint16_t *)b), dmin = h2f(*(const uint16_t *)(b + 2));
        float sc0, m0, sc1, m1;
        scale_min_k4(2 * g, b + 4, &sc0, &m0);
        scale_min_k4(2 * g + 1, b + 4, &sc1, &m1);
        a[0] = d * sc0; m[0] = -dmin * m0;
        a[1] = d * sc1; m[1] = -dmin * m1;
        const uint4 q4 = *(const uint4 *)(b + 16 + 32 * g + 16 * hh);
        const uint32_t w[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const uint32_t byte = (w[l >> 2] >> (8 * (l & 3))) & 0xFF;
            v[l] = (float)(byte & 0xF);
            v[16 + l] = (float)(byte >> 4);
        }
    }
};

struct tr_q5_K {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q5_K), PARTS = 8;
    static constexpr int NRUN = 2, RUNLEN = 16;
    static constexpr bool HAS_MIN = true;
    /* As Q4_K; the fifth bit of byte i of group g is bit 2g (low) or 2g+1
     * (high) of qh[i]. qh at byte 16, qs at byte 48. */
    __device__ static int off(int p, int r) { return 64 * (p >> 1) + 32 * r + 16 * (p & 1); }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        const int g = p >> 1, hh = p & 1;
        const float d = h2f(*(const uint16_t *)b), dmin = h2f(*(const uint16_t *)(b + 2));
        float sc0, m0, sc1, m1;
        scale_min_k4(2 * g, b + 4, &sc0, &m0);
        scale_min_k4(2 * g + 1, b + 4, &sc1, &m1);
        a[0] = d * sc0; m[0] = -dmin * m0;
        a[1] = d * sc1; m[1] = -dmin * m1;
        const uint4 q4 = *(const uint4 *)(b + 48 + 32 * g + 16 * hh);
        const uint4 h4 = *(const uint4 *)(b + 16 + 16 * hh);
        const uint32_t w[4] = {q4.x, q4.y, q4.z, q4.w};
        const uint32_t hw[4] = {h4.x, h4.y, h4.z, h4.w};
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const uint32_t byte = (w[l >> 2] >> (8 * (l & 3))) & 0xFF;
            const uint32_t hb = (hw[l >> 2] >> (8 * (l & 3))) & 0xFF;
            v[l] = (float)((byte & 0xF) | (((hb >> (2 * g)) & 1) << 4));
            v[16 + l] = (float)((byte >> 4) | (((hb >> (2 * g + 1)) & 1) << 4));
        }
    }
};

struct tr_q6_K {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q6_K), PARTS = 16;
    static constexpr int NRUN = 4, RUNLEN = 4;
    static constexpr bool HAS_MIN = false;
    /* part p: half h = p/8, l0 = 4*(p%8); values 128h + l0 + 32r + i for
     * r < 4, i < 4, from ql[64h + l0 + i (+32)], qh[32h + l0 + i]. Blocks
     * are 210 bytes, so only 2-byte loads are aligned. */
    __device__ static int off(int p, int r) { return 128 * (p >> 3) + 4 * (p & 7) + 32 * r; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        const int h = p >> 3, l0 = 4 * (p & 7);
        const uint16_t *ql0 = (const uint16_t *)(b + 64 * h + l0);
        const uint16_t *ql1 = (const uint16_t *)(b + 64 * h + l0 + 32);
        const uint16_t *qh = (const uint16_t *)(b + 128 + 32 * h + l0);
        const uint32_t L0 = ql0[0] | ((uint32_t)ql0[1] << 16);
        const uint32_t L1 = ql1[0] | ((uint32_t)ql1[1] << 16);
        const uint32_t H = qh[0] | ((uint32_t)qh[1] << 16);
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h + l0 / 16);
        const float d = h2f(*(const uint16_t *)(b + 208));
        a[0] = d * sc[0]; a[1] = d * sc[2]; a[2] = d * sc[4]; a[3] = d * sc[6];
        (void)m;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t l0b = (L0 >> (8 * i)) & 0xFF, l1b = (L1 >> (8 * i)) & 0xFF;
            const uint32_t hb = (H >> (8 * i)) & 0xFF;
            v[0 + i] = (float)((int)((l0b & 0xF) | (((hb >> 0) & 3) << 4)) - 32);
            v[4 + i] = (float)((int)((l1b & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
            v[8 + i] = (float)((int)((l0b >> 4) | (((hb >> 4) & 3) << 4)) - 32);
            v[12 + i] = (float)((int)((l1b >> 4) | (((hb >> 6) & 3) << 4)) - 32);
        }
    }
};

struct tr_q8_0 {
    static constexpr int QK = QK8_0, BYTES = sizeof(block_q8_0), PARTS = 4;
    static constexpr int NRUN = 1, RUNLEN = 8;
    static constexpr bool HAS_MIN = false;
    __device__ static int off(int p, int r) { return 8 * p; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        a[0] = h2f(*(const uint16_t *)b);
        (void)m;
        const uint16_t *q = (const uint16_t *)(b + 2 + 8 * p);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint16_t w = q[i];
            v[2 * i] = (float)(int8_t)(w & 0xFF);
            v[2 * i + 1] = (float)(int8_t)(w >> 8);
        }
    }
};

/* Q4_0: one part, two runs of 16: the low nibbles of qs[0..15] are values
 * 0..15, the high ones 16..31; value = d * (q - 8). 18-byte blocks: byte
 * loads. */
struct tr_q4_0 {
    static constexpr int QK = QK4_0, BYTES = sizeof(block_q4_0), PARTS = 1;
    static constexpr int NRUN = 2, RUNLEN = 16;
    static constexpr bool HAS_MIN = false;
    __device__ static int off(int p, int r) { return 16 * r; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        (void)p, (void)m;
        a[0] = a[1] = h2f((uint16_t)(b[0] | (b[1] << 8)));
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const int q = b[2 + l];
            v[l] = (float)((q & 0xF) - 8);
            v[16 + l] = (float)((q >> 4) - 8);
        }
    }
};

/* Q5_0: as Q4_0 with bit 4 of value j in bit j of qh (bytes 2..5); value
 * = d * (q - 16). */
struct tr_q5_0 {
    static constexpr int QK = QK5_0, BYTES = sizeof(block_q5_0), PARTS = 1;
    static constexpr int NRUN = 2, RUNLEN = 16;
    static constexpr bool HAS_MIN = false;
    __device__ static int off(int p, int r) { return 16 * r; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        (void)p, (void)m;
        a[0] = a[1] = h2f((uint16_t)(b[0] | (b[1] << 8)));
        const uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const int q = b[6 + l];
            v[l] = (float)(((q & 0xF) | (int)(((qh >> l) & 1) << 4)) - 16);
            v[16 + l] = (float)(((q >> 4) | (int)(((qh >> (l + 16)) & 1) << 4)) - 16);
        }
    }
};

/* Q4_1: Q4_0's layout with a min: value = d * q + m (m at byte 2, qs at
 * 4). */
struct tr_q4_1 {
    static constexpr int QK = QK4_1, BYTES = sizeof(block_q4_1), PARTS = 1;
    static constexpr int NRUN = 2, RUNLEN = 16;
    static constexpr bool HAS_MIN = true;
    __device__ static int off(int p, int r) { return 16 * r; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        (void)p;
        a[0] = a[1] = h2f((uint16_t)(b[0] | (b[1] << 8)));
        m[0] = m[1] = h2f((uint16_t)(b[2] | (b[3] << 8)));
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const int q = b[4 + l];
            v[l] = (float)(q & 0xF);
            v[16 + l] = (float)(q >> 4);
        }
    }
};

/* Q5_1: Q5_0's layout with a min: value = d * q + m (qh at byte 4, qs at
 * 8). */
struct tr_q5_1 {
    static constexpr int QK = QK5_1, BYTES = sizeof(block_q5_1), PARTS = 1;
    static constexpr int NRUN = 2, RUNLEN = 16;
    static constexpr bool HAS_MIN = true;
    __device__ static int off(int p, int r) { return 16 * r; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        (void)p;
        a[0] = a[1] = h2f((uint16_t)(b[0] | (b[1] << 8)));
        m[0] = m[1] = h2f((uint16_t)(b[2] | (b[3] << 8)));
        const uint32_t qh = (uint32_t)b[4] | ((uint32_t)b[5] << 8) | ((uint32_t)b[6] << 16) | ((uint32_t)b[7] << 24);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const int q = b[8 + l];
            v[l] = (float)((q & 0xF) | (int)(((qh >> l) & 1) << 4));
            v[16 + l] = (float)((q >> 4) | (int)(((qh >> (l + 16)) & 1) << 4));
        }
    }
};

/* Q2_K: part p = (h = p/4, k = p%4) holds values 128h + 32k + 16r + i
 * (runs r < 2 of i < 16), bits 2k of qs[32h + 16r + i]; run r is sub-block
 * 8h + 2k + r, value = (d * (sc & 15)) * q - dmin * (sc >> 4). */
struct tr_q2_K {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q2_K), PARTS = 8;
    static constexpr int NRUN = 2, RUNLEN = 16;
    static constexpr bool HAS_MIN = true;
    __device__ static int off(int p, int r) { return 128 * (p >> 2) + 32 * (p & 3) + 16 * r; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        const int h = p >> 2, k = p & 3;
        const float d = h2f((uint16_t)(b[80] | (b[81] << 8))), dmin = h2f((uint16_t)(b[82] | (b[83] << 8)));
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int sc = b[8 * h + 2 * k + r];
            a[r] = d * (float)(sc & 15);
            m[r] = -(dmin * (float)(sc >> 4));
#pragma unroll
            for (int i = 0; i < 16; i++) v[16 * r + i] = (float)((b[16 + 32 * h + 16 * r + i] >> (2 * k)) & 3);
        }
    }
};

/* Q3_K: the parts and runs of Q2_K; bit 2 of value v is bit v / 32 of
 * hmask[v % 32] (a clear bit subtracts 4), sub-block j's 6-bit scale from
 * scales[j % 8] (nibble j / 8) and scales[8 + j % 4] (bits 2(j / 4));
 * value = (d * (sc - 32)) * q. 110-byte blocks: byte loads. */
struct tr_q3_K {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q3_K), PARTS = 8;
    static constexpr int NRUN = 2, RUNLEN = 16;
    static constexpr bool HAS_MIN = false;
    __device__ static int off(int p, int r) { return 128 * (p >> 2) + 32 * (p & 3) + 16 * r; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        (void)m;
        const int h = p >> 2, k = p & 3;
        const float d = h2f((uint16_t)(b[108] | (b[109] << 8)));
        const uint8_t *sc = b + 96;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int j = 8 * h + 2 * k + r;
            const int s6 = ((sc[j % 8] >> (4 * (j / 8))) & 15) | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
            a[r] = d * (float)(s6 - 32);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int lo = (b[32 + 32 * h + 16 * r + i] >> (2 * k)) & 3;
                const int hi = (b[16 * r + i] >> (4 * h + k)) & 1;
                v[16 * r + i] = (float)(lo - (hi ? 0 : 4));
            }
        }
    }
};

/* Plain 16-bit float types: a "block" of 8 values, one part; cvt turns the
 * bits into f32 (h2f, bf2f). */
template <float (*cvt)(uint16_t)>
struct tr_half16 {
    static constexpr int QK = 8, BYTES = 16, PARTS = 1, NRUN = 1, RUNLEN = 8;
    static constexpr bool HAS_MIN = false;
    __device__ static int off(int p, int r) { return 0; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        const uint4 q = *(const uint4 *)b;
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        a[0] = 1.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = cvt(w[i] & 0xFFFF);
            v[2 * i + 1] = cvt(w[i] >> 16);
        }
    }
};
typedef tr_half16<h2f> tr_f16;
typedef tr_half16<bf2f> tr_bf16;

struct tr_f32 {
    static constexpr int QK = 4, BYTES = 16, PARTS = 1, NRUN = 1, RUNLEN = 4;
    static constexpr bool HAS_MIN = false;
    __device__ static int off(int p, int r) { return 0; }
    __device__ static void deq(const uint8_t *b, int p, float *v, float *a, float *m)
    {
        const float4 q = *(const float4 *)b;
        a[0] = 1.0f;
        v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
    }
};

/* ---- mat-vec / batched matmul ------------------------------------------ */

#define MM_WARPS 4      /* rows per thread block: one logical warp per row */
#define MM_MAXCOLS 8    /* columns (tokens) sharing one weight read */

/* One warp per weight row; the warp's lanes take the row's block parts in
 * turn, decode them once, and dot them with NC activation columns. */
template <typename T, int NC>
__global__ void __launch_bounds__(MM_WARPS * TG_WARP)
k_matmul(const uint8_t *__restrict__ W, size_t row_bytes, int nb,
         const float *__restrict__ x, int K, float *__restrict__ y, int nrows)
{
    const int lane = threadIdx.x % TG_WARP;
    const int row = blockIdx.x * MM_WARPS + threadIdx.x / TG_WARP;
    if (row >= nrows) return;
    const uint8_t *wr = W + (size_t)row * row_bytes;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = 0.0f;
    const int nparts = nb * T::PARTS;
    for (int p = lane; p < nparts; p += TG_WARP) {
        const int ib = p / T::PARTS, part = p % T::PARTS;
        float v[T::NRUN * T::RUNLEN], a[T::NRUN], m[T::NRUN];
        T::deq(wr + (size_t)ib * T::BYTES, part, v, a, m);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const float *xc = x + (size_t)c * K + (size_t)ib * T::QK;
#pragma unroll
            for (int r = 0; r < T::NRUN; r++) {
                const float4 *x4 = (const float4 *)(xc + T::off(part, r));
                float sq = 0.0f, sx = 0.0f;
#pragma unroll
                for (int i = 0; i < T::RUNLEN / 4; i++) {
                    const float4 xv = x4[i];
                    const float *vv = v + r * T::RUNLEN + 4 * i;
                    sq += vv[0] * xv.x + vv[1] * xv.y + vv[2] * xv.z + vv[3] * xv.w;
                    if (T::HAS_MIN) sx += xv.x + xv.y + xv.z + xv.w;
                }
                acc[c] += a[r] * sq;
                if (T::HAS_MIN) acc[c] += m[r] * sx;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const float s = warp_sum(acc[c]);
        if (lane == 0) y[(size_t)c * nrows + row] = s;
    }
}

template <typename T>
__global__ void k_get_rows(const uint8_t *__restrict__ W, size_t row_bytes, int nb,
                           const int32_t *__restrict__ ids, float *__restrict__ y, int K)
{
    const int t = blockIdx.y;
    const uint8_t *wr = W + (size_t)ids[t] * row_bytes;
    float *yt = y + (size_t)t * K;
    const int nparts = nb * T::PARTS;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < nparts; p += gridDim.x * blockDim.x) {
        const int ib = p / T::PARTS, part = p % T::PARTS;
        float v[T::NRUN * T::RUNLEN], a[T::NRUN], m[T::NRUN];
        T::deq(wr + (size_t)ib * T::BYTES, part, v, a, m);
#pragma unroll
        for (int r = 0; r < T::NRUN; r++) {
            float *o = yt + (size_t)ib * T::QK + T::off(part, r);
#pragma unroll
            for (int i = 0; i < T::RUNLEN; i++)
                o[i] = T::HAS_MIN ? a[r] * v[r * T::RUNLEN + i] + m[r] : a[r] * v[r * T::RUNLEN + i];
        }
    }
}

template <typename T, int NC>
static void launch_mm(cudaStream_t s, const void *W, int nrows, int K, const float *x, float *y)
{
    const int nb = K / T::QK;
    const size_t row_bytes = (size_t)nb * T::BYTES;
    dim3 grid((nrows + MM_WARPS - 1) / MM_WARPS);
    k_matmul<T, NC><<<grid, MM_WARPS * TG_WARP, 0, s>>>((const uint8_t *)W, row_bytes, nb, x, K, y, nrows);
}

template <typename T>
static void launch_mm_cols(cudaStream_t s, const void *W, int nrows, int K, const float *x, int ncols, float *y)
{
    for (int c0 = 0; c0 < ncols; c0 += MM_MAXCOLS) {
        const int nc = ncols - c0 < MM_MAXCOLS ? ncols - c0 : MM_MAXCOLS;
        const float *xc = x + (size_t)c0 * K;
        float *yc = y + (size_t)c0 * nrows;
        switch (nc) {
        case 1: launch_mm<T, 1>(s, W, nrows, K, xc, yc); break;
        case 2: launch_mm<T, 2>(s, W, nrows, K, xc, yc); break;
        case 3: launch_mm<T, 3>(s, W, nrows, K, xc, yc); break;
        case 4: launch_mm<T, 4>(s, W, nrows, K, xc, yc); break;
        case 5: launch_mm<T, 5>(s, W, nrows, K, xc, yc); break;
        case 6: launch_mm<T, 6>(s, W, nrows, K, xc, yc); break;
        case 7: launch_mm<T, 7>(s, W, nrows, K, xc, yc); break;
        default: launch_mm<T, 8>(s, W, nrows, K, xc, yc); break;
        }
    }
}

template <typename T>
static void launch_get_rows(cudaStream_t s, const void *W, int K, const int32_t *ids, int n, float *y)
{
    const int nb = K / T::QK;
    const size_t row_bytes = (size_t)nb * T::BYTES;
    const int nparts = nb * T::PARTS;
    dim3 grid((nparts + 127) / 128, n);
    k_get_rows<T><<<grid, 128, 0, s>>>((const uint8_t *)W, row_bytes, nb, ids, y, K);
}

/* ---- mat-vec over 8-bit activations (single-token steps) ------------------
 *
 * The f32 mat-vec above spends about 5 instructions per weight (decode,
 * convert, multiply-add): at one token it is instruction-bound far below the
 * memory bandwidth. For Q4_K and Q6_K, a single-token step instead quantizes
 * the activation vector once per thread block into shared memory, in blocks
 * of 32 values as llama.cpp's CUDA backend does for its mat-vec (Q8_1:
 * d = max|x| / 127, q = round(x / d), plus the block's sum of q), and takes
 * the dot products on 4 bytes at a time (dp4a) over the raw 4- and 6-bit
 * weight codes; scales and mins are applied per sub-block in f32. Each warp
 * serves rpw consecutive rows. TG_GPU_MMVQ=0 in the environment keeps the
 * f32 kernel (scripts/gpu-test.sh runs test_gpu_ops both ways). */

#define MV_WARPS 8
#define MV_MAX_K 32768   /* shared memory: K bytes + K/32 * 8 */

__device__ __forceinline__ int dot4(int a, int b, int c)
{
#ifdef TG_GPU_HIP
#pragma unroll
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
#else
    return __dp4a(a, b, c);
#endif
}

/* The quantized activations one weight part multiplies, loaded once and
 * shared by every row a warp serves at the same part. */
struct fz_x4 {   /* q4_K part: 16 values of sub-block 2g, 16 of 2g+1 */
    int4 l, h;
    float2 d, s;
};
struct fz_x6 {   /* q6_K part: 4 runs of 4 values, activation blocks 4h..4h+3 */
    int q[4];
    float4 d;
};
struct fz_x8 {   /* q8_0 part: 8 values */
    int2 q;
    float d;
};

template <int TYPE> struct fz_x;
template <> struct fz_x<TG_TYPE_Q4_K> { typedef fz_x4 T; };
template <> struct fz_x<TG_TYPE_Q6_K> { typedef fz_x6 T; };
template <> struct fz_x<TG_TYPE_Q8_0> { typedef fz_x8 T; };

__device__ __forceinline__ void fz_load_x(const gk_q8 &x, int ib, int p, fz_x4 &r)
{
    const int g = p >> 1, hh = p & 1;
    const int8_t *xq = x.q + ib * QK_K + 64 * g + 16 * hh;
    r.l = *(const int4 *)xq;
    r.h = *(const int4 *)(xq + 32);
    r.d = *(const float2 *)(x.d + ib * 8 + 2 * g);
    r.s = *(const float2 *)(x.s + ib * 8 + 2 * g);
}

__device__ __forceinline__ void fz_load_x(const gk_q8 &x, int ib, int p, fz_x6 &r)
{
    const int h = p >> 3, l0 = 4 * (p & 7);
    const int8_t *xb = x.q + ib * QK_K + 128 * h + l0;
#pragma unroll
    for (int i = 0; i < 4; i++) r.q[i] = *(const int *)(xb + 32 * i);
    r.d = *(const float4 *)(x.d + ib * 8 + 4 * h);
}

__device__ __forceinline__ void fz_load_x(const gk_q8 &x, int ib, int p, fz_x8 &r)
{
    r.q = *(const int2 *)(x.q + ib * QK8_0 + 8 * p);
    r.d = x.d[ib];
}


/* Q4_K part p (as tr_q4_K: 16 bytes of qs, 16 values of sub-blocks 2g and
 * 2g+1 each) of block b against its activations: 4-byte integer dot
 * products, scales and mins in f32; the min term of a whole sub-block is
 * added by the part with hh == 0. */
__device__ __forceinline__ float fz_part(const uint8_t *b, int p, const fz_x4 &x)
{
    const int g = p >> 1, hh = p & 1;
    const uint4 hd = *(const uint4 *)b;
    const float d = h2f((uint16_t)(hd.x & 0xFFFF)), dmin = h2f((uint16_t)(hd.x >> 16));
    float sc0, m0, sc1, m1;
    scale_min_k4_w(2 * g, hd, &sc0, &m0);
    scale_min_k4_w(2 * g + 1, hd, &sc1, &m1);
    const uint4 q4 = *(const uint4 *)(b + 16 + 32 * g + 16 * hh);
    int dl = 0, dh = 0;
    dl = dot4((int)(q4.x & 0x0F0F0F0Fu), x.l.x, dl);
    dl = dot4((int)(q4.y & 0x0F0F0F0Fu), x.l.y, dl);
    dl = dot4((int)(q4.z & 0x0F0F0F0Fu), x.l.z, dl);
    dl = dot4((int)(q4.w & 0x0F0F0F0Fu), x.l.w, dl);
    dh = dot4((int)((q4.x >> 4) & 0x0F0F0F0Fu), x.h.x, dh);
    dh = dot4((int)((q4.y >> 4) & 0x0F0F0F0Fu), x.h.y, dh);
    dh = dot4((int)((q4.z >> 4) & 0x0F0F0F0Fu), x.h.z, dh);
    dh = dot4((int)((q4.w >> 4) & 0x0F0F0F0Fu), x.h.w, dh);
    float r = x.d.x * (d * sc0) * (float)dl + x.d.y * (d * sc1) * (float)dh;
    if (hh == 0) r -= x.d.x * (dmin * m0) * x.s.x + x.d.y * (dmin * m1) * x.s.y;
    return r;
}

/* Q6_K part p (as tr_q6_K: 4 runs of 4 values, run r in activation block
 * 4h + r). Blocks are 210 bytes, so only 2-byte loads are aligned. */
__device__ __forceinline__ float fz_part(const uint8_t *b, int p, const fz_x6 &x)
{
    const int h = p >> 3, l0 = 4 * (p & 7);
    const uint16_t *ql0 = (const uint16_t *)(b + 64 * h + l0);
    const uint16_t *ql1 = (const uint16_t *)(b + 64 * h + l0 + 32);
    const uint16_t *qh = (const uint16_t *)(b + 128 + 32 * h + l0);
    const uint32_t L0 = ql0[0] | ((uint32_t)ql0[1] << 16);
    const uint32_t L1 = ql1[0] | ((uint32_t)ql1[1] << 16);
    const uint32_t H = qh[0] | ((uint32_t)qh[1] << 16);
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * h + l0 / 16);
    const float d = h2f(*(const uint16_t *)(b + 208));
    /* the 6-bit codes 0..63 as they are; their offset of -32 enters as
     * -32 times the activations' sum (0xE0: -32 in each byte), the same
     * integer as the dot with the codes minus 32, in one dp4a instead of a
     * per-byte subtraction (five instructions) */
    const int v0 = (int)((L0 & 0x0F0F0F0Fu) | ((H & 0x03030303u) << 4));
    const int v1 = (int)((L1 & 0x0F0F0F0Fu) | (((H >> 2) & 0x03030303u) << 4));
    const int v2 = (int)(((L0 >> 4) & 0x0F0F0F0Fu) | (((H >> 4) & 0x03030303u) << 4));
    const int v3 = (int)(((L1 >> 4) & 0x0F0F0F0Fu) | (((H >> 6) & 0x03030303u) << 4));
    const int m32 = (int)0xE0E0E0E0u;
    const int s0 = dot4(v0, x.q[0], dot4(m32, x.q[0], 0));
    const int s1 = dot4(v1, x.q[1], dot4(m32, x.q[1], 0));
    const int s2 = dot4(v2, x.q[2], dot4(m32, x.q[2], 0));
    const int s3 = dot4(v3, x.q[3], dot4(m32, x.q[3], 0));
    return d * ((float)sc[0] * x.d.x * (float)s0 + (float)sc[2] * x.d.y * (float)s1 +
                (float)sc[4] * x.d.z * (float)s2 + (float)sc[6] * x.d.w * (float)s3);
}

/* Q8_0 part p of 4 (8 values). */
__device__ __forceinline__ float fz_part(const uint8_t *b, int p, const fz_x8 &x)
{
    const uint16_t *q = (const uint16_t *)(b + 2 + 8 * p);
    const int w0 = (int)(q[0] | ((uint32_t)q[1] << 16));
    const int w1 = (int)(q[2] | ((uint32_t)q[3] << 16));
    const int s = dot4(w1, x.q.y, dot4(w0, x.q.x, 0));
    return h2f(*(const uint16_t *)b) * x.d * (float)s;
}

/* y[row] = dot(W row, x) for the rows of this block; x: K f32 values, K a
 * multiple of 256. Shared memory: K quantized bytes, K/32 scales, K/32 sums. */
template <int TYPE>
__global__ void __launch_bounds__(MV_WARPS * TG_WARP)
k_mv_q8(const uint8_t *__restrict__ W, size_t row_bytes, int nb, const float *__restrict__ x, int K,
        float *__restrict__ y, int nrows, int rpw)
{
    extern __shared__ __align__(16) uint8_t mv_sm[];
    int8_t *xq = (int8_t *)mv_sm;
    float *xd = (float *)(mv_sm + K);
    float *xs = xd + K / 32;
    const int lane = threadIdx.x % TG_WARP, warp = threadIdx.x / TG_WARP;
    for (int qb = warp; qb < K / 32; qb += MV_WARPS) {
        const float v = x[qb * 32 + lane];
        const float amax = warp_max(fabsf(v));
        const float d = amax / 127.0f;
        const int q = d > 0.0f ? __float2int_rn(v / d) : 0;
        xq[qb * 32 + lane] = (int8_t)q;
        const float sq = warp_sum((float)q);   /* integers below 2^24: exact */
        if (lane == 0) {
            xd[qb] = d;
            xs[qb] = sq;
        }
    }
    __syncthreads();
    const gk_q8 xsm = {xq, xd, xs};   /* the same layout, in shared memory */
    constexpr int PARTS = TYPE == TG_TYPE_Q4_K ? tr_q4_K::PARTS : tr_q6_K::PARTS;
    constexpr int BYTES = TYPE == TG_TYPE_Q4_K ? tr_q4_K::BYTES : tr_q6_K::BYTES;
    const int row0 = (blockIdx.x * MV_WARPS + warp) * rpw;
    const int nparts = nb * PARTS;
    for (int j = 0; j < rpw; j++) {
        const int row = row0 + j;
        if (row >= nrows) break;
        const uint8_t *wr = W + (size_t)row * row_bytes;
        float acc = 0.0f;
#pragma unroll 4
        for (int p = lane; p < nparts; p += TG_WARP) {
            const int ib = p / PARTS, part = p % PARTS;
            const uint8_t *b = wr + (size_t)ib * BYTES;
            typename fz_x<TYPE>::T xv;
            fz_load_x(xsm, ib, part, xv);
            acc += fz_part(b, part, xv);
        }
        acc = warp_sum(acc);
        if (lane == 0) y[row] = acc;
    }
}

static int mv_q8_enabled(void)
{
    static int on = -1;
    return env_switch(&on, "TG_GPU_MMVQ", 1);
}

int gk_matmul_q8(uint32_t type, int K, int ncols)
{
    return ncols == 1 && (type == TG_TYPE_Q4_K || type == TG_TYPE_Q6_K) && K > 0 && K % QK_K == 0 &&
           K <= MV_MAX_K && mv_q8_enabled();
}

static void launch_mv_q8(cudaStream_t s, uint32_t type, const void *W, int nrows, int K, const float *x, float *y)
{
    const int nb = K / QK_K;
    int rpw = nrows / 2048;   /* a few waves of blocks over ~130 SMs, more rows per warp on big matrices */
    if (rpw < 1) rpw = 1;
    if (rpw > 4) rpw = 4;
    const int grid = (nrows + MV_WARPS * rpw - 1) / (MV_WARPS * rpw);
    const size_t smem = (size_t)K + (size_t)(K / 32) * 2 * sizeof(float);
    if (type == TG_TYPE_Q4_K)
        k_mv_q8<TG_TYPE_Q4_K><<<grid, MV_WARPS * TG_WARP, smem, s>>>(
            (const uint8_t *)W, (size_t)nb * sizeof(block_q4_K), nb, x, K, y, nrows, rpw);
    else
        k_mv_q8<TG_TYPE_Q6_K><<<grid, MV_WARPS * TG_WARP, smem, s>>>(
            (const uint8_t *)W, (size_t)nb * sizeof(block_q6_K), nb, x, K, y, nrows, rpw);
}

/* ---- batched matmul on tensor cores (CUDA) -------------------------------
 *
 * For a batch of tokens (a prompt): a thread block of 8 warps computes a tile
 * of BM weight rows x BN tokens. For each TC_BK-value slice of K it decodes
 * its rows' share of the blocks with the type's traits (as every other
 * kernel here) into f16 in shared memory, converts the tokens' f32
 * activations to f16 beside them, and multiplies the two with 16x16x16 WMMA
 * fragments that accumulate in f32. The warps form a 4 x 2 grid over the
 * tile; each owns (BM / 4) rows x (BN / 2) tokens, FM x FN fragments. A
 * 256-value block (the k-quants) spans two slices: each slice decodes the
 * parts whose values fall in it. The only error beyond f32 rounding is the
 * f16 rounding of the two operands (relative 2^-11 each; NMSE_MATMUL_TC in
 * tests/gpu). Rows past nrows read the last row again and are not stored;
 * tokens past ncols are zeros. HIP builds have no WMMA here and keep the
 * CUDA-core kernel above. */
/* Up to three weights of one type multiplied by one input in one launch
 * (gk_matmul_group). */
struct tc_seg {
    const uint8_t *W;
    float *y;
    int nrows, rb0;   /* rows; the first row block of the launch that is this weight's */
};
struct tc_segs {
    tc_seg s[3];
    int n;
    __half *y16;   /* the SwiGLU tile's output (k_matmul_tc2 with SWI) */
};

#define TC_BK 128                     /* values of K per slice */
#define TC_LD (TC_BK + 8)             /* f16 row stride in shared memory (skews the banks) */
#define TC_MIN_COLS 16                /* fewer tokens: the CUDA-core kernel */
#define TC_SMEM(BM, BN) ((size_t)((BM) + (BN)) * TC_LD * 2)

/* silu(g) * u as k_swiglu computes it (one expression for both kernels). */
__device__ __forceinline__ float swiglu1(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

#ifndef TG_GPU_HIP
#include <mma.h>

/* Stores n (4, 8 or 16) f32 values as f16 at dst (8-byte aligned; 16-byte
 * for n >= 8), a * v[i] (+ m), in 8- or 16-byte stores. */
template <int N, bool MIN>
__device__ __forceinline__ void store_f16_run(__half *dst, const float *v, float a, float m)
{
    static_assert(N % 4 == 0, "runs of 4, 8 or 16 values");
#pragma unroll
    for (int i = 0; i < N; i += 4) {
        __half2 h[2];
        h[0] = __floats2half2_rn(MIN ? a * v[i] + m : a * v[i], MIN ? a * v[i + 1] + m : a * v[i + 1]);
        h[1] = __floats2half2_rn(MIN ? a * v[i + 2] + m : a * v[i + 2], MIN ? a * v[i + 3] + m : a * v[i + 3]);
        *(uint2 *)(dst + i) = *(const uint2 *)h;
    }
}

/* The tile kernels' shared steps. tc_decode_slice: the BM weight rows'
 * share of K slice k0 decoded with the traits into f16 runs in ws (row r
 * read from rowp(r)); tc_mma_slice: the warp's FM x FN fragments over one
 * slice of ws and xs; tc_stage_tile: the accumulators into cs (BN, LDC),
 * token-major. */
template <typename T, int BM, typename RowFn>
__device__ __forceinline__ void tc_decode_slice(__half *ws, int k0, int tid, RowFn rowp)
{
    constexpr int HALVES = T::QK > TC_BK ? T::QK / TC_BK : 1;   /* slices per block */
    constexpr int BPS = T::QK > TC_BK ? 1 : TC_BK / T::QK;      /* blocks per slice */
    constexpr int PPS = T::PARTS / HALVES;                       /* parts of a block per slice */
    constexpr int TASKS = BM * BPS * PPS;
    const int half = HALVES > 1 ? (k0 / TC_BK) % HALVES : 0;
    for (int t = tid; t < TASKS; t += 256) {
        const int r = t / (BPS * PPS), rem = t % (BPS * PPS);
        const int ib = rem / PPS, part = half * PPS + rem % PPS;
        float v[T::NRUN * T::RUNLEN], a[T::NRUN], m[T::NRUN];
        T::deq(rowp(r) + (size_t)(k0 / T::QK + ib) * T::BYTES, part, v, a, m);
        __half *dst = ws + r * TC_LD + ib * T::QK - half * TC_BK;
#pragma unroll
        for (int rr = 0; rr < T::NRUN; rr++)
            store_f16_run<T::RUNLEN, T::HAS_MIN>(dst + T::off(part, rr), v + rr * T::RUNLEN, a[rr],
                                                 T::HAS_MIN ? m[rr] : 0.0f);
    }
}

template <int FM, int FN>
__device__ __forceinline__ void
tc_mma_slice(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[FM][FN],
             const __half *ws, const __half *xs, int wr, int wc)
{
    using namespace nvcuda;
#pragma unroll 2
    for (int kk = 0; kk < TC_BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[FM];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[FN];
#pragma unroll
        for (int i = 0; i < FM; i++) wmma::load_matrix_sync(fa[i], ws + (wr + i) * 16 * TC_LD + kk, TC_LD);
#pragma unroll
        for (int j = 0; j < FN; j++) wmma::load_matrix_sync(fb[j], xs + (wc + j) * 16 * TC_LD + kk, TC_LD);
#pragma unroll
        for (int i = 0; i < FM; i++)
#pragma unroll
            for (int j = 0; j < FN; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
}

template <int FM, int FN, int LDC>
__device__ __forceinline__ void
tc_stage_tile(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[FM][FN], float *cs,
              int wr, int wc)
{
    using namespace nvcuda;
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++)
            wmma::store_matrix_sync(cs + (wc + j) * 16 * LDC + (wr + i) * 16, acc[i][j], LDC, wmma::mem_col_major);
}

template <typename T, int BM, int BN>
__global__ void __launch_bounds__(256)
k_matmul_tc(const uint8_t *__restrict__ W, size_t row_bytes, const float *__restrict__ x, int K,
            float *__restrict__ y, int nrows, int ncols)
{
    using namespace nvcuda;
    constexpr int FM = BM / 64, FN = BN / 32;         /* fragments per warp: 4 x 2 warps */
    constexpr int LDC = BM + 4;                                  /* f32 stride of the output staging */
    static_assert(BM % 64 == 0 && BN % 32 == 0, "tile");
    static_assert((size_t)BN * LDC * 4 <= TC_SMEM(BM, BN), "the output staging fits the operand tiles");
    extern __shared__ __align__(128) uint8_t tc_sm[];
    __half *ws = (__half *)tc_sm;        /* (BM, TC_LD) weights of the slice */
    __half *xs = ws + BM * TC_LD;        /* (BN, TC_LD) activations of the slice */
    const int row0 = blockIdx.x * BM, col0 = blockIdx.y * BN;
    const int tid = threadIdx.x, wid = tid / 32;
    const int wr = (wid % 4) * FM, wc = (wid / 4) * FN;   /* the warp's first 16-row and 16-token tiles */
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    auto rowp = [&](int r) { return W + (size_t)(row0 + r < nrows ? row0 + r : nrows - 1) * row_bytes; };
    for (int k0 = 0; k0 < K; k0 += TC_BK) {
        tc_decode_slice<T, BM>(ws, k0, tid, rowp);
        for (int t = tid; t < BN * TC_BK / 4; t += 256) {
            const int c = t / (TC_BK / 4), i4 = t % (TC_BK / 4);
            float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (col0 + c < ncols) f = *(const float4 *)(x + (size_t)(col0 + c) * K + k0 + 4 * i4);
            __half2 h[2] = {__floats2half2_rn(f.x, f.y), __floats2half2_rn(f.z, f.w)};
            *(uint2 *)(xs + c * TC_LD + 4 * i4) = *(const uint2 *)h;
        }
        __syncthreads();
        tc_mma_slice<FM, FN>(acc, ws, xs, wr, wc);
        __syncthreads();
    }
    float *cs = (float *)tc_sm;   /* (BN, LDC): the tile, token-major */
    tc_stage_tile<FM, FN, LDC>(acc, cs, wr, wc);
    __syncthreads();
    for (int t = tid; t < BM * BN; t += 256) {
        const int c = t / BM, r = t % BM;
        if (col0 + c < ncols && row0 + r < nrows) y[(size_t)(col0 + c) * nrows + row0 + r] = cs[c * LDC + r];
    }
}

/* The pipelined tile (gk_matmul_group): the same arithmetic as k_matmul_tc
 * (each weight and activation rounded to f16 once, the same 16x16x16
 * fragments in the same order, so the same bits), with the activations
 * converted to f16 beforehand (k_to_f16) and copied into shared memory
 * asynchronously: the next slice's copy is issued before this slice's
 * weights are decoded and multiplied, into the other of two buffers. The
 * launch serves up to three weights of one type and one input (q, k and v;
 * gate and up): thread block (x, y) takes token block x and row block y of
 * the concatenated rows (blocks of one weight tile are launched together).
 * At most 104 KiB of shared memory a block, so two blocks share an SM and
 * one decodes while the other multiplies. */
#define TC2_SMEM(BM, BN) ((size_t)((BM) + 2 * (BN)) * TC_LD * 2)

/* With SWI, the launch is gate (segs.s[0]) and up (segs.s[1]) of one type
 * and row count: row block y takes BM/2 rows of each (the gate's above the
 * up's, the same rows), and the output is silu(gate) * up rounded to f16
 * into segs.y16 (ncols x nrows), k_swiglu's arithmetic on the tile's f32
 * sums; the gate and up values themselves are not stored. */
template <typename T, int BM, int BN, bool SWI>
__global__ void __launch_bounds__(256, 2)
k_matmul_tc2(tc_segs segs, size_t row_bytes, const __half *__restrict__ xh, int K, int ncols)
{
    using namespace nvcuda;
    constexpr int FM = BM / 64, FN = BN / 32;
    constexpr int LDC = BM + 4;
    static_assert(BM % 64 == 0 && BN % 32 == 0, "tile");
    static_assert((size_t)BN * LDC * 4 <= TC2_SMEM(BM, BN), "the output staging fits the operand tiles");
    extern __shared__ __align__(128) uint8_t tc_sm[];
    __half *ws = (__half *)tc_sm;   /* (BM, TC_LD) weights of the slice */
    __half *xb = ws + BM * TC_LD;   /* two (BN, TC_LD) activation slices */
    const int rb = blockIdx.y;   /* token blocks vary fastest: the blocks sharing a weight tile run together */
    const int si = SWI ? 0 : rb < segs.s[1].rb0 ? 0 : rb < segs.s[2].rb0 ? 1 : 2;   /* unused: rb0 past the grid */
    const tc_seg sg = si == 0 ? segs.s[0] : si == 1 ? segs.s[1] : segs.s[2];   /* no local-memory indexing */
    const int nrows = sg.nrows;
    const uint8_t *W = sg.W;
    constexpr int RPW = SWI ? BM / 2 : BM;   /* rows of one weight in the block */
    const int row0 = (rb - sg.rb0) * RPW, col0 = blockIdx.x * BN;
    const int tid = threadIdx.x, wid = tid / 32;
    const int wr = (wid % 4) * FM, wc = (wid / 4) * FN;
    auto rowp = [&](int r) {   /* with SWI, rows RPW.. are the up weight's */
        const int rw = SWI ? r % RPW : r;
        const uint8_t *Wr = SWI && r >= RPW ? segs.s[1].W : W;
        return Wr + (size_t)(row0 + rw < nrows ? row0 + rw : nrows - 1) * row_bytes;
    };
    auto load_x = [&](int k0, __half *dst) {
        for (int t = tid; t < BN * TC_BK / 8; t += 256) {
            const int c = t / (TC_BK / 8), i8 = t % (TC_BK / 8);
            const bool ok = col0 + c < ncols;
            cp_async16_zf(dst + c * TC_LD + 8 * i8, xh + (size_t)(ok ? col0 + c : 0) * K + k0 + 8 * i8, ok);
        }
        cp_async_commit();
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    load_x(0, xb);
    for (int k0 = 0, sl = 0; k0 < K; k0 += TC_BK, sl ^= 1) {
        if (k0 + TC_BK < K) load_x(k0 + TC_BK, xb + (sl ^ 1) * BN * TC_LD);
        else cp_async_commit();   /* an empty group: the wait below counts the same */
        tc_decode_slice<T, BM>(ws, k0, tid, rowp);
        cp_async_wait<1>();   /* this slice's activations (the next slice's may be in flight) */
        __syncthreads();
        const __half *xs = xb + sl * BN * TC_LD;
        tc_mma_slice<FM, FN>(acc, ws, xs, wr, wc);
        __syncthreads();
    }
    cp_async_wait<0>();
    float *cs = (float *)tc_sm;   /* (BN, LDC): the tile, token-major */
    tc_stage_tile<FM, FN, LDC>(acc, cs, wr, wc);
    __syncthreads();
    if (SWI) {
        for (int t = tid; t < RPW * BN; t += 256) {
            const int c = t / RPW, r = t % RPW;
            if (col0 + c < ncols && row0 + r < nrows)
                segs.y16[(size_t)(col0 + c) * nrows + row0 + r] =
                    __float2half_rn(swiglu1(cs[c * LDC + r], cs[c * LDC + RPW + r]));
        }
        return;
    }
    float *y = sg.y;
    for (int t = tid; t < BM * BN; t += 256) {
        const int c = t / BM, r = t % BM;
        if (col0 + c < ncols && row0 + r < nrows) y[(size_t)(col0 + c) * nrows + row0 + r] = cs[c * LDC + r];
    }
}

static int tc2_small = -1;   /* TG_GPU_TC2_SMALL: the tile of small launches (1 64x128, the default; 2 128x64; 0 none) */
static int tc2_thresh = 2;   /* TG_GPU_TC2_WAVES: a launch is small below this many 128x128 blocks per SM */

/* The pipelined tile's shape: 128 weight rows x 128 tokens when the launch
 * has at least tc2_thresh such blocks per SM, else the small tile. */
template <typename T>
static void launch_mm_tc2(cudaStream_t s, const tc_segs &segs, int K, const __half *xh, int ncols, int n_sm, int swi)
{
    const size_t row_bytes = (size_t)(K / T::QK) * T::BYTES;
    int rb128 = 0;
    for (int i = 0; i < segs.n; i++) rb128 += (segs.s[i].nrows + 127) / 128;
    int small = rb128 * ((ncols + 127) / 128) < tc2_thresh * n_sm ? tc2_small : 0;
    if (swi && small == 2) small = 0;   /* the SwiGLU tile comes in 128 x 128 and 64 x 128 only */
    const int bm = small == 1 ? 64 : 128, bn = small == 2 ? 64 : 128;
    tc_segs sg = segs;
    int rb = 0;
    if (swi) {   /* gate and up side by side in each row block */
        rb = (sg.s[0].nrows + bm / 2 - 1) / (bm / 2);
        sg.s[0].rb0 = 0;
        sg.s[1].rb0 = sg.s[2].rb0 = rb;
    } else {
        for (int i = 0; i < sg.n; i++) {
            sg.s[i].rb0 = rb;
            rb += (sg.s[i].nrows + bm - 1) / bm;
        }
        for (int i = sg.n; i < 3; i++) sg.s[i].rb0 = rb;
    }
    dim3 grid((ncols + bn - 1) / bn, rb);
    if (swi && small == 1)
        k_matmul_tc2<T, 64, 128, true><<<grid, 256, TC2_SMEM(64, 128), s>>>(sg, row_bytes, xh, K, ncols);
    else if (swi)
        k_matmul_tc2<T, 128, 128, true><<<grid, 256, TC2_SMEM(128, 128), s>>>(sg, row_bytes, xh, K, ncols);
    else if (small == 1)
        k_matmul_tc2<T, 64, 128, false><<<grid, 256, TC2_SMEM(64, 128), s>>>(sg, row_bytes, xh, K, ncols);
    else if (small == 2)
        k_matmul_tc2<T, 128, 64, false><<<grid, 256, TC2_SMEM(128, 64), s>>>(sg, row_bytes, xh, K, ncols);
    else
        k_matmul_tc2<T, 128, 128, false><<<grid, 256, TC2_SMEM(128, 128), s>>>(sg, row_bytes, xh, K, ncols);
}

template <typename T>
static cudaError_t tc2_optin(void)
{
    if (tc2_small < 0) {
        const char *v = getenv("TG_GPU_TC2_SMALL");
        tc2_small = v && v[0] == '0' ? 0 : v && v[0] == '2' ? 2 : 1;
        const char *w = getenv("TG_GPU_TC2_WAVES");
        if (w && w[0] >= '1' && w[0] <= '9') tc2_thresh = w[0] - '0';
    }
    const void *fn[] = {(const void *)k_matmul_tc2<T, 128, 128, false>, (const void *)k_matmul_tc2<T, 64, 128, false>,
                        (const void *)k_matmul_tc2<T, 128, 64, false>, (const void *)k_matmul_tc2<T, 128, 128, true>,
                        (const void *)k_matmul_tc2<T, 64, 128, true>};
    const size_t smem[] = {TC2_SMEM(128, 128), TC2_SMEM(64, 128), TC2_SMEM(128, 64), TC2_SMEM(128, 128),
                           TC2_SMEM(64, 128)};
    cudaError_t rc = cudaSuccess;
    for (int i = 0; i < 5 && rc == cudaSuccess; i++)
        rc = cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem[i]);
    return rc;
}

/* The tile: 128 weight rows x 128 tokens (on the H200, run 8: 6,900
 * prefill tok/s at 8b against 5,960 for 64 x 64 and 6,880 for 128 x 64). */
#define TC_BM 128
#define TC_BN 128

template <typename T>
static void launch_mm_tc(cudaStream_t s, const void *W, int nrows, int K, const float *x, int ncols, float *y)
{
    const size_t row_bytes = (size_t)(K / T::QK) * T::BYTES;
    dim3 grid((nrows + TC_BM - 1) / TC_BM, (ncols + TC_BN - 1) / TC_BN);
    k_matmul_tc<T, TC_BM, TC_BN><<<grid, 256, TC_SMEM(TC_BM, TC_BN), s>>>((const uint8_t *)W, row_bytes, x, K, y,
                                                                        nrows, ncols);
}

/* Lets the tile of type T use its shared memory (over the 48 KiB default). */
template <typename T>
static cudaError_t tc_optin(void)
{
    return cudaFuncSetAttribute((const void *)k_matmul_tc<T, TC_BM, TC_BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)TC_SMEM(TC_BM, TC_BN));
}
/* Both tiles of type T: the launchers and their shared-memory opt-ins,
 * one table entry's worth, so a type cannot get a tile without its opt-in
 * (a tile launched without it is refused: "invalid argument"). */
#define TC_LAUNCH(T) launch_mm_tc<T>, launch_mm_tc2<T>, tc_optin<T>, tc2_optin<T>
#else
#define TC_LAUNCH(T) NULL, NULL, NULL, NULL
#endif

/* x (n values, n a multiple of 4) rounded to f16. */
__global__ void k_to_f16(const float4 *__restrict__ x, uint2 *__restrict__ y, size_t n4)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 f = x[i];
        __half2 h[2] = {__floats2half2_rn(f.x, f.y), __floats2half2_rn(f.z, f.w)};
        y[i] = *(const uint2 *)h;
    }
}

static int tc_ready;   /* gk_init: the tensor-core kernels may use their TC_SMEM of shared memory */

/* The per-type table: block size and the launchers (tc: tensor cores, NULL
 * where there are none). */
typedef void (*mm_fn)(cudaStream_t, const void *, int, int, const float *, int, float *);
typedef void (*rows_fn)(cudaStream_t, const void *, int, const int32_t *, int, float *);
typedef void (*mm2_fn)(cudaStream_t, const tc_segs &, int, const __half *, int, int, int);
typedef cudaError_t (*optin_fn)(void);
struct gk_type_entry {
    uint32_t type;
    int qk;
    mm_fn mm;
    rows_fn rows;
    mm_fn tc;
    mm2_fn tc2;   /* the pipelined tile over f16 activations (gk_matmul_group) */
    optin_fn tc_optin, tc2_optin;   /* gk_init: the tiles' shared memory over the default */
};
static const gk_type_entry gk_types[] = {
    {TG_TYPE_F32, tr_f32::QK, launch_mm_cols<tr_f32>, launch_get_rows<tr_f32>, TC_LAUNCH(tr_f32)},
    {TG_TYPE_F16, tr_f16::QK, launch_mm_cols<tr_f16>, launch_get_rows<tr_f16>, TC_LAUNCH(tr_f16)},
    {TG_TYPE_BF16, tr_bf16::QK, launch_mm_cols<tr_bf16>, launch_get_rows<tr_bf16>, TC_LAUNCH(tr_bf16)},
    {TG_TYPE_Q8_0, tr_q8_0::QK, launch_mm_cols<tr_q8_0>, launch_get_rows<tr_q8_0>, TC_LAUNCH(tr_q8_0)},
    {TG_TYPE_Q4_0, tr_q4_0::QK, launch_mm_cols<tr_q4_0>, launch_get_rows<tr_q4_0>, TC_LAUNCH(tr_q4_0)},
    {TG_TYPE_Q5_0, tr_q5_0::QK, launch_mm_cols<tr_q5_0>, launch_get_rows<tr_q5_0>, TC_LAUNCH(tr_q5_0)},
    {TG_TYPE_Q4_1, tr_q4_1::QK, launch_mm_cols<tr_q4_1>, launch_get_rows<tr_q4_1>, TC_LAUNCH(tr_q4_1)},
    {TG_TYPE_Q5_1, tr_q5_1::QK, launch_mm_cols<tr_q5_1>, launch_get_rows<tr_q5_1>, TC_LAUNCH(tr_q5_1)},
    {TG_TYPE_Q2_K, tr_q2_K::QK, launch_mm_cols<tr_q2_K>, launch_get_rows<tr_q2_K>, TC_LAUNCH(tr_q2_K)},
    {TG_TYPE_Q3_K, tr_q3_K::QK, launch_mm_cols<tr_q3_K>, launch_get_rows<tr_q3_K>, TC_LAUNCH(tr_q3_K)},
    {TG_TYPE_Q4_K, tr_q4_K::QK, launch_mm_cols<tr_q4_K>, launch_get_rows<tr_q4_K>, TC_LAUNCH(tr_q4_K)},
    {TG_TYPE_Q5_K, tr_q5_K::QK, launch_mm_cols<tr_q5_K>, launch_get_rows<tr_q5_K>, TC_LAUNCH(tr_q5_K)},
    {TG_TYPE_Q6_K, tr_q6_K::QK, launch_mm_cols<tr_q6_K>, launch_get_rows<tr_q6_K>, TC_LAUNCH(tr_q6_K)},
};

static const gk_type_entry *gk_find(uint32_t type)
{
    for (size_t i = 0; i < sizeof gk_types / sizeof gk_types[0]; i++)
        if (gk_types[i].type == type) return &gk_types[i];
    return NULL;
}

int gk_type_supported(uint32_t type)
{
    return gk_find(type) != NULL;
}

static int tc_enabled(void)
{
    static int on = -1;
    return env_switch(&on, "TG_GPU_TC", 1);
}

int gk_matmul_tc(uint32_t type, int K, int ncols)
{
    const gk_type_entry *t = gk_find(type);
    return tc_enabled() && tc_ready && t && t->tc && ncols >= TC_MIN_COLS && K > 0 && K % TC_BK == 0;
}

static int matmul(cudaStream_t s, uint32_t type, const void *W, int nrows, int K, const float *x, int ncols,
                  float *y, int plain, tg_err *e)
{
    const gk_type_entry *t = gk_find(type);
    if (!t) return tg_errf(e, "gpu matmul: weight type %u is not supported on the GPU", type);
    if (K <= 0 || K % t->qk || K % 8 || nrows <= 0 || ncols <= 0)
        return tg_errf(e, "gpu matmul: shape K=%d nrows=%d ncols=%d: expected K a multiple of %d and 8",
                       K, nrows, ncols, t->qk);
    if (!plain && gk_matmul_q8(type, K, ncols)) launch_mv_q8(s, type, W, nrows, K, x, y);
    else if (!plain && gk_matmul_tc(type, K, ncols)) t->tc(s, W, nrows, K, x, ncols, y);
    else t->mm(s, W, nrows, K, x, ncols, y);
    GPU_CHECK_LAUNCH(e, "matmul");
    return 0;
}

int gk_matmul(cudaStream_t s, uint32_t type, const void *W, int nrows, int K,
              const float *x, int ncols, float *y, tg_err *e)
{
    return matmul(s, type, W, nrows, K, x, ncols, y, 0, e);
}

int gk_matmul_plain(cudaStream_t s, uint32_t type, const void *W, int nrows, int K, const float *x, int ncols,
                    float *y, tg_err *e)
{
    return matmul(s, type, W, nrows, K, x, ncols, y, 1, e);
}

static int tc2_enabled(void)
{
    static int on = -1;
    return env_switch(&on, "TG_GPU_TC2", 1);
}

static int n_sm;   /* gk_init: the device's multiprocessor count */

int gk_matmul_group_f16(uint32_t type, int K, int ncols)
{
    const gk_type_entry *t = gk_find(type);
    return tc2_enabled() && n_sm > 0 && t && t->tc2 && !gk_matmul_q8(type, K, ncols) && gk_matmul_tc(type, K, ncols);
}

static int tc2_swiglu_enabled(void)
{
    static int on = -1;
    return env_switch(&on, "TG_GPU_TC2_SWIGLU", 1);
}

int gk_matmul_swiglu_ok(uint32_t type, int K, int ncols)
{
    return tc2_swiglu_enabled() && gk_matmul_group_f16(type, K, ncols);
}

int gk_matmul_swiglu(cudaStream_t s, uint32_t type, const void *Wg, const void *Wu, int nrows, int K, const void *x16,
                     int ncols, void *y16, tg_err *e)
{
    if (!gk_matmul_swiglu_ok(type, K, ncols) || nrows <= 0 || !x16 || !y16)
        return tg_errf(e, "gpu matmul_swiglu: type %u, K=%d, %d tokens, %d rows: not served by the tensor-core tile "
                       "(check gk_matmul_swiglu_ok)", type, K, ncols, nrows);
    tc_segs ts;
    ts.n = 2;
    ts.s[0].W = (const uint8_t *)Wg;
    ts.s[1].W = (const uint8_t *)Wu;
    ts.s[0].y = ts.s[1].y = NULL;
    ts.s[0].nrows = ts.s[1].nrows = nrows;
    ts.y16 = (__half *)y16;
    gk_find(type)->tc2(s, ts, K, (const __half *)x16, ncols, n_sm, 1);
    GPU_CHECK_LAUNCH(e, "matmul_swiglu");
    return 0;
}

int gk_matmul_group(cudaStream_t s, const gk_mm_seg *segs, int nseg, int K, const float *x, int ncols, void *x16,
                    int x16_ready, tg_err *e)
{
    if (nseg < 1 || nseg > 3) return tg_errf(e, "gpu matmul_group: %d weights: expected 1..3", nseg);
    int tc2 = x16 != NULL;
    for (int i = 0; i < nseg && tc2; i++) tc2 = gk_matmul_group_f16(segs[i].type, K, ncols) && segs[i].nrows > 0;
    if (!tc2) {
        for (int i = 0; i < nseg; i++)
            if (matmul(s, segs[i].type, segs[i].W, segs[i].nrows, K, x, ncols, segs[i].y, 0, e)) return -1;
        return 0;
    }
    if (!x16_ready) {
        const size_t n4 = (size_t)ncols * K / 4;   /* K is a multiple of 128 here */
        const int cb = (int)((n4 + 255) / 256);
        k_to_f16<<<cb < 4096 ? cb : 4096, 256, 0, s>>>((const float4 *)x, (uint2 *)x16, n4);
        GPU_CHECK_LAUNCH(e, "matmul_group f16 activations");
    }
    for (int i = 0; i < nseg;) {   /* one launch per run of weights of one type */
        tc_segs ts;
        ts.n = 0;
        int j = i;
        for (; j < nseg && segs[j].type == segs[i].type; j++) {
            ts.s[ts.n].W = (const uint8_t *)segs[j].W;
            ts.s[ts.n].y = segs[j].y;
            ts.s[ts.n].nrows = segs[j].nrows;
            ts.n++;
        }
        ts.y16 = NULL;
        gk_find(segs[i].type)->tc2(s, ts, K, (const __half *)x16, ncols, n_sm, 0);
        GPU_CHECK_LAUNCH(e, "matmul_group");
        i = j;
    }
    return 0;
}

int gk_get_rows(cudaStream_t s, uint32_t type, const void *W, int K,
                const int32_t *ids, int n, float *y, tg_err *e)
{
    const gk_type_entry *t = gk_find(type);
    if (!t) return tg_errf(e, "gpu get_rows: weight type %u is not supported on the GPU", type);
    if (K <= 0 || K % t->qk || K % 8 || n <= 0)
        return tg_errf(e, "gpu get_rows: K=%d n=%d: expected K a multiple of %d and 8", K, n, t->qk);
    t->rows(s, W, K, ids, n, y);
    GPU_CHECK_LAUNCH(e, "get_rows");
    return 0;
}

/* ---- norms, rope, cache, attention, elementwise -------------------------- */

#define NORM_THREADS 256

/* Sum over the thread block (blockDim.x a multiple of TG_WARP, <= 1024). */
__device__ float block_sum(float v, float *sh)
{
    const int lane = threadIdx.x % TG_WARP, w = threadIdx.x / TG_WARP;
    const int nw = blockDim.x / TG_WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_max(float v, float *sh)
{
    const int lane = threadIdx.x % TG_WARP, w = threadIdx.x / TG_WARP;
    const int nw = blockDim.x / TG_WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

__global__ void k_rmsnorm(const float *x, const float *w, float *y, __half *y16, int n, float eps)
{
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / n + eps);
    if (y16) {
        __half *hr = y16 + (size_t)blockIdx.x * n;
#pragma unroll 4
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = xr[i] * scale * w[i];
            yr[i] = v;
            hr[i] = __float2half_rn(v);
        }
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
    }
}

int gk_rmsnorm16(cudaStream_t s, const float *x, const float *w, float *y, void *y16, int nrows, int n, float eps,
                 tg_err *e)
{
    if (nrows <= 0 || n <= 0) return tg_errf(e, "gpu rmsnorm: nrows=%d n=%d: expected both > 0", nrows, n);
    const int threads = n >= NORM_THREADS ? NORM_THREADS : ((n + TG_WARP - 1) / TG_WARP) * TG_WARP;
    k_rmsnorm<<<nrows, threads, 0, s>>>(x, w, y, (__half *)y16, n, eps);
    GPU_CHECK_LAUNCH(e, "rmsnorm");
    return 0;
}

int gk_rmsnorm(cudaStream_t s, const float *x, const float *w, float *y, int nrows, int n, float eps, tg_err *e)
{
    return gk_rmsnorm16(s, x, w, y, NULL, nrows, n, eps, e);
}

/* x += t, then k_rmsnorm over the new x, in one pass over each row: each
 * thread sums the squares of the values it added, in k_rmsnorm's order. */
__global__ void k_add_rmsnorm(float *x, const float *t, const float *w, float *y, __half *y16, int n, float eps)
{
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * n;
    const float *tr = t + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] + tr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / n + eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] * scale * w[i];
        yr[i] = v;
        if (y16) y16[(size_t)blockIdx.x * n + i] = __float2half_rn(v);
    }
}

int gk_add_rmsnorm16(cudaStream_t s, float *x, const float *t, const float *w, float *y, void *y16, int nrows, int n,
                     float eps, tg_err *e)
{
    if (nrows <= 0 || n <= 0) return tg_errf(e, "gpu add_rmsnorm: nrows=%d n=%d: expected both > 0", nrows, n);
    const int threads = n >= NORM_THREADS ? NORM_THREADS : ((n + TG_WARP - 1) / TG_WARP) * TG_WARP;
    k_add_rmsnorm<<<nrows, threads, 0, s>>>(x, t, w, y, (__half *)y16, n, eps);
    GPU_CHECK_LAUNCH(e, "add_rmsnorm");
    return 0;
}

/* The cos and sin of rope pair i at position pos, as ggml-cpu (and the
 * cpu tier) compute them: the angle in f32, starting at pos and multiplied
 * by theta_scale = powf(base, -2/head_dim) (computed on the host) once per
 * pair, so every product is an IEEE f32 product; cos and sin in f64, then
 * rounded to f32 (the correctly rounded cosf and sinf the host's libm gives,
 * not the device's few-ulp cosf). The replay budgets rest on this
 * (docs/protocol.md, "Declaring numerics": "rope": "ggml-f32"). */
__device__ __forceinline__ void rope_cs(int pos, float theta_scale, int i, float *c, float *sn)
{
    float theta = (float)pos;
    for (int k = 0; k < i; k++) theta *= theta_scale;
    *c = (float)cos((double)theta);
    *sn = (float)sin((double)theta);
}

/* One rotated pair: (a c - b sn, a sn + b c), the one expression every rope
 * kernel uses (so they contract to the same FMAs). */
__device__ __forceinline__ void rope_pair(float a, float b, float c, float sn, float *o0, float *o1)
{
    const float r0 = a * c - b * sn, r1 = a * sn + b * c;
    *o0 = r0;
    *o1 = r1;
}

__global__ void k_rope(float *x, int n_head, int head_dim, const int32_t *pos0, float theta_scale, int neox)
{
    const int t = blockIdx.y, h = blockIdx.x;
    const int half = head_dim / 2;
    float *xh = x + ((size_t)t * n_head + h) * head_dim;
    const int pos = *pos0 + t;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c, sn;
        rope_cs(pos, theta_scale, i, &c, &sn);
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        rope_pair(xh[i0], xh[i1], c, sn, &xh[i0], &xh[i1]);
    }
}

int gk_rope(cudaStream_t s, float *x, int n_tok, int n_head, int head_dim,
            const int32_t *pos0, float base, int neox, tg_err *e)
{
    if (n_tok <= 0 || n_head <= 0 || head_dim <= 0 || head_dim % 2)
        return tg_errf(e, "gpu rope: n_tok=%d n_head=%d head_dim=%d: expected positive, head_dim even",
                       n_tok, n_head, head_dim);
    const float theta_scale = powf(base, -2.0f / (float)head_dim);
    dim3 grid(n_head, n_tok);
    k_rope<<<grid, 64, 0, s>>>(x, n_head, head_dim, pos0, theta_scale, neox);
    GPU_CHECK_LAUNCH(e, "rope");
    return 0;
}

__global__ void k_kv_store(const float *k, const float *v, void *kc, void *vc, int kv_f16, int row,
                           const int32_t *pos0)
{
    const int t = blockIdx.y;
    const size_t dst = (size_t)(*pos0 + t) * row;
    const float *kt = k + (size_t)t * row, *vt = v + (size_t)t * row;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < row; i += gridDim.x * blockDim.x) {
        if (kv_f16) {
            ((uint16_t *)kc)[dst + i] = f2h(kt[i]);
            ((uint16_t *)vc)[dst + i] = f2h(vt[i]);
        } else {
            ((float *)kc)[dst + i] = kt[i];
            ((float *)vc)[dst + i] = vt[i];
        }
    }
}

int gk_kv_store(cudaStream_t s, const float *k, const float *v, void *kc,
                void *vc, int kv_f16, int n_tok, int row, const int32_t *pos0,
                tg_err *e)
{
    if (n_tok <= 0 || row <= 0) return tg_errf(e, "gpu kv_store: n_tok=%d row=%d: expected > 0", n_tok, row);
    dim3 grid((row + 255) / 256, n_tok);
    k_kv_store<<<grid, 256, 0, s>>>(k, v, kc, vc, kv_f16, row, pos0);
    GPU_CHECK_LAUNCH(e, "kv_store");
    return 0;
}

#define QKR_MAX_HD 256   /* gk_qk_norm_rope_store's one-block-per-head limit (k_rmsnorm's block) */

/* k_rmsnorm over one head (blockDim.x = head_dim rounded up to a warp, as
 * gk_rmsnorm launches it for rows of head_dim <= NORM_THREADS values), then
 * k_rope's pairs over the normed values, then k_kv_store's conversion of k
 * and v: one block per head (q heads, k heads, v heads along x) and token
 * (y). q and k are normed and rotated in place. */
__global__ void k_qk_norm_rope_store(float *q, float *k, const float *v, const float *wq, const float *wk,
                                     int n_head, int n_head_kv, int head_dim, const int32_t *pos0,
                                     float theta_scale, int neox, float eps, void *kc, void *vc, int kv_f16)
{
    __shared__ float sh[32];
    __shared__ float xs[QKR_MAX_HD];
    const int t = blockIdx.y, h = blockIdx.x, i = threadIdx.x;
    const int row = n_head_kv * head_dim;
    const size_t dst = (size_t)(*pos0 + t) * row;
    if (h >= n_head + n_head_kv) {   /* a v head: only stored */
        const int o = (h - n_head - n_head_kv) * head_dim + i;
        if (i < head_dim) {
            const float val = v[(size_t)t * row + o];
            if (kv_f16) ((uint16_t *)vc)[dst + o] = f2h(val);
            else ((float *)vc)[dst + o] = val;
        }
        return;
    }
    const int isk = h >= n_head, hh = isk ? h - n_head : h;
    float *xh = isk ? k + ((size_t)t * n_head_kv + hh) * head_dim : q + ((size_t)t * n_head + hh) * head_dim;
    const float *w = isk ? wk : wq;
    const float xv = i < head_dim ? xh[i] : 0.0f;
    float ss = 0.0f;
    if (i < head_dim) ss += xv * xv;
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / head_dim + eps);
    if (i < head_dim) xs[i] = xv * scale * w[i];
    __syncthreads();
    const int half = head_dim / 2, pos = *pos0 + t;
    for (int p = i; p < half; p += blockDim.x) {
        float c, sn, o0, o1;
        rope_cs(pos, theta_scale, p, &c, &sn);
        const int i0 = neox ? p : 2 * p, i1 = neox ? p + half : 2 * p + 1;
        rope_pair(xs[i0], xs[i1], c, sn, &o0, &o1);
        xh[i0] = o0;
        xh[i1] = o1;
        if (isk) {
            const size_t c0 = dst + (size_t)hh * head_dim + i0, c1 = dst + (size_t)hh * head_dim + i1;
            if (kv_f16) {
                ((uint16_t *)kc)[c0] = f2h(o0);
                ((uint16_t *)kc)[c1] = f2h(o1);
            } else {
                ((float *)kc)[c0] = o0;
                ((float *)kc)[c1] = o1;
            }
        }
    }
}

int gk_qk_norm_rope_store(cudaStream_t s, float *q, float *k, const float *v, const float *wq, const float *wk,
                          int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t *pos0, float base,
                          int neox, float eps, void *kc, void *vc, int kv_f16, tg_err *e)
{
    if (n_tok <= 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 || head_dim % 2)
        return tg_errf(e, "gpu qk_norm_rope_store: n_tok=%d n_head=%d n_head_kv=%d head_dim=%d: expected positive, "
                       "head_dim even", n_tok, n_head, n_head_kv, head_dim);
    if (head_dim > QKR_MAX_HD) {   /* the separate kernels, whose norm loops over wider rows */
        if (gk_rmsnorm(s, q, wq, q, n_tok * n_head, head_dim, eps, e) ||
            gk_rmsnorm(s, k, wk, k, n_tok * n_head_kv, head_dim, eps, e) ||
            gk_rope(s, q, n_tok, n_head, head_dim, pos0, base, neox, e) ||
            gk_rope(s, k, n_tok, n_head_kv, head_dim, pos0, base, neox, e))
            return -1;
        return gk_kv_store(s, k, v, kc, vc, kv_f16, n_tok, n_head_kv * head_dim, pos0, e);
    }
    const float theta_scale = powf(base, -2.0f / (float)head_dim);
    const int threads = ((head_dim + TG_WARP - 1) / TG_WARP) * TG_WARP;
    dim3 grid(n_head + 2 * n_head_kv, n_tok);
    k_qk_norm_rope_store<<<grid, threads, 0, s>>>(q, k, v, wq, wk, n_head, n_head_kv, head_dim, pos0, theta_scale,
                                                  neox, eps, kc, vc, kv_f16);
    GPU_CHECK_LAUNCH(e, "qk_norm_rope_store");
    return 0;
}

template <int F16>
__device__ __forceinline__ float kv_at(const void *c, size_t i)
{
    return F16 ? h2f(((const uint16_t *)c)[i]) : ((const float *)c)[i];
}

#define ATT_THREADS 128
#define ATT_CHUNK 1024   /* scores held in shared memory per pass */
#define ATT_SPLITS_MAX 128   /* key ranges of a single-token step, one block each: at most */
#define ATT_SPLITS_DEF 32    /* and by default (TG_GPU_ATT_SPLITS=n, 1..ATT_SPLITS_MAX, read once) */

static int att_splits(void)
{
    static int n = 0;
    if (!n) {
        const char *env = getenv("TG_GPU_ATT_SPLITS");
        const int v = env ? atoi(env) : 0;
        n = v >= 1 && v <= ATT_SPLITS_MAX ? v : ATT_SPLITS_DEF;
    }
    return n;
}

/* Attention of one query head (qs, head_dim values in shared memory) over
 * the keys [jb, je) of cache head hkv, in chunks of ATT_CHUNK: scores into
 * sc (one warp per key, lanes split head_dim), running max and sum as in
 * online softmax, and the unnormalized output accumulated per dimension (a
 * thread per dimension d = threadIdx.x + k * ATT_THREADS, at most 4). With
 * s_in the scaled scores are given (a replay's), with s_out kept; si0 is
 * the score index of key 0. blockDim.x == ATT_THREADS. */
template <int F16>
__device__ __forceinline__ void attn_range(const float *qs, const void *kc, const void *vc, int hkv, int head_dim,
                                           size_t kv_row, int jb, int je, float scale, const float *s_in,
                                           float *s_out, size_t si0, float *sc, float *red, float acc[4],
                                           float *run_max_out, float *run_sum_out)
{
    const int lane = threadIdx.x % TG_WARP, wid = threadIdx.x / TG_WARP, nw = blockDim.x / TG_WARP;
    float run_max = -INFINITY, run_sum = 0.0f;
    for (int j0 = jb; j0 < je; j0 += ATT_CHUNK) {
        const int nj = je - j0 < ATT_CHUNK ? je - j0 : ATT_CHUNK;
        for (int jj = wid; jj < nj; jj += nw) {
            const size_t si = si0 + j0 + jj;
            float d;
            if (s_in) {
                d = s_in[si];
            } else {
                const size_t base = (size_t)(j0 + jj) * kv_row + (size_t)hkv * head_dim;
                d = 0.0f;
                for (int i = lane; i < head_dim; i += TG_WARP) d += qs[i] * kv_at<F16>(kc, base + i);
                d = warp_sum(d) * scale;
            }
            if (lane == 0) {
                sc[jj] = d;
                if (s_out) s_out[si] = d;
            }
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int jj = threadIdx.x; jj < nj; jj += blockDim.x) mx = fmaxf(mx, sc[jj]);
        mx = block_max(mx, red);
        const float new_max = fmaxf(run_max, mx);
        const float corr = expf(run_max - new_max);   /* 0 on the first chunk */
        __syncthreads();
        float ls = 0.0f;
        for (int jj = threadIdx.x; jj < nj; jj += blockDim.x) {
            const float p = expf(sc[jj] - new_max);
            sc[jj] = p;
            ls += p;
        }
        ls = block_sum(ls, red);
        __syncthreads();
        run_sum = run_sum * corr + ls;
        run_max = new_max;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int d = threadIdx.x + k * ATT_THREADS;
            if (d >= head_dim) break;
            float a = acc[k] * corr;
            const size_t base = (size_t)j0 * kv_row + (size_t)hkv * head_dim + d;
#pragma unroll 8
            for (int jj = 0; jj < nj; jj++) a += sc[jj] * kv_at<F16>(vc, base + (size_t)jj * kv_row);
            acc[k] = a;
        }
        __syncthreads();
    }
    *run_max_out = run_max;
    *run_sum_out = run_sum;
}

/* The partial result of one key range at pp: max, sum, unnormalized output
 * (merged by attn_split_weights and the combine kernels). */
__device__ __forceinline__ void attn_part_store(float *pp, int head_dim, float run_max, float run_sum,
                                                const float acc[4])
{
    if (threadIdx.x == 0) {
        pp[0] = run_max;
        pp[1] = run_sum;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int d = threadIdx.x + k * ATT_THREADS;
        if (d < head_dim) pp[2 + d] = acc[k];
    }
}

/* One thread block per (query head, query token, key range z of
 * gridDim.z): attn_range over the range; with one range the normalized
 * output, else the partial result (merged by k_attn_combine). */
template <int F16>
__global__ void __launch_bounds__(ATT_THREADS)
k_attention(const float *q, const void *kc, const void *vc, float *out, int n_head, int n_head_kv,
            int head_dim, const int32_t *pos0, float scale, float *part, const float *s_in, float *s_out,
            int s_stride)
{
    __shared__ float sc[ATT_CHUNK];
    __shared__ float red[32];
    extern __shared__ float qs[]; /* head_dim */
    const int h = blockIdx.x, t = blockIdx.y;
    const int hkv = h / (n_head / n_head_kv);
    const int n_kv = *pos0 + t + 1;
    const size_t kv_row = (size_t)n_head_kv * head_dim;
    const float *qh = q + ((size_t)t * n_head + h) * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) qs[i] = qh[i];
    __syncthreads();
    float acc[4] = {0, 0, 0, 0};
    float run_max, run_sum;
    /* split z of gridDim.z takes keys [jb, je) (decode: many blocks per head) */
    const int per = (n_kv + gridDim.z - 1) / gridDim.z;
    const int jb = blockIdx.z * per, je = min(n_kv, jb + per);
    attn_range<F16>(qs, kc, vc, hkv, head_dim, kv_row, jb, je, scale, s_in, s_out,
                    ((size_t)t * n_head + h) * s_stride, sc, red, acc, &run_max, &run_sum);
    if (gridDim.z > 1) {
        attn_part_store(part + (((size_t)t * n_head + h) * gridDim.z + blockIdx.z) * (head_dim + 2), head_dim,
                        run_max, run_sum, acc);
        return;
    }
    float *o = out + ((size_t)t * n_head + h) * head_dim;
    const float inv = 1.0f / run_sum;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int d = threadIdx.x + k * ATT_THREADS;
        if (d < head_dim) o[d] = acc[k] * inv;
    }
}

/* The weights of the nsplit partial results of one (head, token) at pp:
 * f[z] = e^(m_z - M) in shared memory (0 for an empty split, m = -inf),
 * M the largest m_z; returns the denominator sum_z s_z f[z] (every thread).
 * The m and s of all splits are loaded at once (a thread per split), not
 * one after the other. blockDim.x a multiple of TG_WARP. */
__device__ float attn_split_weights(const float *pp, int head_dim, int nsplit, float *f, float *red)
{
    float mx = -INFINITY;
    for (int z = threadIdx.x; z < nsplit; z += blockDim.x)
        mx = fmaxf(mx, ld_l2(pp + (size_t)z * (head_dim + 2)));
    const float M = block_max(mx, red);
    float den = 0.0f;
    for (int z = threadIdx.x; z < nsplit; z += blockDim.x) {
        const float m = ld_l2(pp + (size_t)z * (head_dim + 2));
        const float w = m != -INFINITY ? expf(m - M) : 0.0f;
        f[z] = w;
        den += ld_l2(pp + (size_t)z * (head_dim + 2) + 1) * w;
    }
    den = block_sum(den, red);   /* its barriers also publish f */
    return den;
}

/* Dimension d of the merged splits' numerator: sum_z acc_z[d] f[z]. */
__device__ __forceinline__ float attn_merge_dim(const float *pp, int head_dim, int nsplit, const float *f, int d)
{
    float num = 0.0f;
#pragma unroll 8
    for (int z = 0; z < nsplit; z++) num += ld_l2(pp + (size_t)z * (head_dim + 2) + 2 + d) * f[z];
    return num;
}

/* Merges the splits of one (head, token): out = sum_s acc_s e^(m_s - M) /
 * sum_s sum_s e^(m_s - M). Empty splits have m = -inf and sum 0. */
__global__ void k_attn_combine(const float *part, float *out, int n_head, int head_dim, int nsplit)
{
    __shared__ float f[ATT_SPLITS_MAX];
    __shared__ float red[32];
    const int h = blockIdx.x, t = blockIdx.y;
    const float *pp = part + ((size_t)t * n_head + h) * nsplit * (head_dim + 2);
    const float den = attn_split_weights(pp, head_dim, nsplit, f, red);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
        out[((size_t)t * n_head + h) * head_dim + d] = attn_merge_dim(pp, head_dim, nsplit, f, d) / den;
}

/* The partial results of every (head, key range), then (gk_attn_decode)
 * one arrival counter per head. */
static size_t att_part_bytes(int n_head, int head_dim)
{
    return (size_t)n_head * ATT_SPLITS_MAX * (head_dim + 2) * sizeof(float);
}

size_t gk_attention_scratch(int n_head, int head_dim)
{
    return att_part_bytes(n_head, head_dim) + (size_t)n_head * sizeof(int);
}

/* ---- prompt attention on tensor cores (CUDA) ------------------------------
 *
 * For a batch of n_tok >= AT_MIN_TOK query tokens (a prompt) and head_dim 64
 * or 128: one thread block of 4 warps per (query head, tile of 64 query
 * tokens), each warp 16 of the queries. Keys and values are visited in tiles
 * of 64 positions, up to the last query's position, in shared memory as f16
 * (the F16 cache as it is; an F32 cache rounded). Per tile a warp computes
 * its 16 x 64 scores with WMMA (q rounded to f16, f32 sums), scales and
 * masks them (key position > query position), keeps the running maximum and
 * sum of each row in f32 (online softmax, as k_attention), rounds the
 * probabilities to f16 and adds P V to its f32 output rows, which live in
 * shared memory so that they can be rescaled when the maximum moves. The
 * error beyond k_attention's is the f16 rounding of q, of the probabilities
 * and (F32 cache) of k and v: NMSE_ATTN_TC in tests/gpu. */
#define AT_MIN_TOK 16   /* fewer query tokens: k_attention */
#define AT_BQ 64        /* query tokens per block */
#define AT_BKV 64       /* key positions per tile */
#define AT_LDS 68       /* f32 stride of a warp's scores */
#define AT_LDP 72       /* f16 stride of a warp's probabilities */
#define AT_SMEM(HD)                                                                                      \
    ((size_t)(AT_BQ + 2 * AT_BKV) * ((HD) + 8) * 2 + (size_t)4 * 16 * AT_LDS * 4 + (size_t)4 * 16 * AT_LDP * 2 + \
     (size_t)4 * 16 * ((HD) + 4) * 4)

#ifndef TG_GPU_HIP
template <int F16, int HD>
__global__ void __launch_bounds__(128)
k_attention_tc(const float *__restrict__ q, const void *__restrict__ kc, const void *__restrict__ vc,
               float *__restrict__ out, int n_tok, int n_head, int n_head_kv, const int32_t *pos0p, float scale)
{
    using namespace nvcuda;
    constexpr int LDH = HD + 8, LDO = HD + 4;
    extern __shared__ __align__(128) uint8_t at_sm[];
    __half *Qs = (__half *)at_sm;           /* (AT_BQ, LDH) */
    __half *Ks = Qs + AT_BQ * LDH;          /* (AT_BKV, LDH) */
    __half *Vs = Ks + AT_BKV * LDH;         /* (AT_BKV, LDH) */
    float *Ss = (float *)(Vs + AT_BKV * LDH);   /* 4 x (16, AT_LDS) */
    __half *Ps = (__half *)(Ss + 4 * 16 * AT_LDS);   /* 4 x (16, AT_LDP) */
    float *Os = (float *)(Ps + 4 * 16 * AT_LDP);     /* 4 x (16, LDO) */
    const int h = blockIdx.x, q0 = blockIdx.y * AT_BQ, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int hkv = h / (n_head / n_head_kv), pos0 = *pos0p;
    const size_t kv_row = (size_t)n_head_kv * HD;
    for (int i = tid; i < AT_BQ * HD / 4; i += 128) {
        const int r = i / (HD / 4), d4 = i % (HD / 4);
        float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (q0 + r < n_tok) f = *(const float4 *)(q + ((size_t)(q0 + r) * n_head + h) * HD + 4 * d4);
        __half2 hh[2] = {__floats2half2_rn(f.x, f.y), __floats2half2_rn(f.z, f.w)};
        *(uint2 *)(Qs + r * LDH + 4 * d4) = *(const uint2 *)hh;
    }
    float *Sw = Ss + w * 16 * AT_LDS, *Ow = Os + w * 16 * LDO;
    __half *Pw = Ps + w * 16 * AT_LDP;
    for (int i = lane; i < 16 * HD; i += 32) Ow[(i / HD) * LDO + i % HD] = 0.0f;
    /* lanes 2r and 2r+1 keep row r: the even or odd columns and dimensions */
    const int r = lane >> 1, odd = lane & 1;
    const int tq = q0 + w * 16 + r, qpos = pos0 + tq;
    float m = -INFINITY, l = 0.0f;
    const int n_keys = pos0 + min(q0 + AT_BQ, n_tok);
    for (int j0 = 0; j0 < n_keys; j0 += AT_BKV) {
        __syncthreads();   /* the last tile's keys and values are no longer read */
        for (int i = tid; i < AT_BKV * HD / 8; i += 128) {
            const int jr = i / (HD / 8), d8 = i % (HD / 8), j = j0 + jr;
            uint4 kk = make_uint4(0, 0, 0, 0), vv = kk;
            if (j < n_keys) {
                const size_t off = (size_t)j * kv_row + (size_t)hkv * HD + 8 * d8;
                if (F16) {
                    kk = *(const uint4 *)((const uint16_t *)kc + off);
                    vv = *(const uint4 *)((const uint16_t *)vc + off);
                } else {
                    const float4 *k4 = (const float4 *)((const float *)kc + off);
                    const float4 *v4 = (const float4 *)((const float *)vc + off);
                    __half2 a[4] = {__floats2half2_rn(k4[0].x, k4[0].y), __floats2half2_rn(k4[0].z, k4[0].w),
                                    __floats2half2_rn(k4[1].x, k4[1].y), __floats2half2_rn(k4[1].z, k4[1].w)};
                    __half2 b[4] = {__floats2half2_rn(v4[0].x, v4[0].y), __floats2half2_rn(v4[0].z, v4[0].w),
                                    __floats2half2_rn(v4[1].x, v4[1].y), __floats2half2_rn(v4[1].z, v4[1].w)};
                    kk = *(const uint4 *)a;
                    vv = *(const uint4 *)b;
                }
            }
            *(uint4 *)(Ks + jr * LDH + 8 * d8) = kk;
            *(uint4 *)(Vs + jr * LDH + 8 * d8) = vv;
        }
        __syncthreads();
        /* S = Q K^T, the warp's 16 rows x 64 keys */
#pragma unroll
        for (int n = 0; n < AT_BKV / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc;
            wmma::fill_fragment(sacc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, Qs + w * 16 * LDH + kk, LDH);
                wmma::load_matrix_sync(fb, Ks + n * 16 * LDH + kk, LDH);
                wmma::mma_sync(sacc, fa, fb, sacc);
            }
            wmma::store_matrix_sync(Sw + n * 16, sacc, AT_LDS, wmma::mem_row_major);
        }
        __syncwarp();
        /* online softmax of row r over this tile */
        float mx = -INFINITY;
#pragma unroll 8
        for (int i = 0; i < AT_BKV / 2; i++) {
            const int c = 2 * i + odd;
            float sv = Sw[r * AT_LDS + c] * scale;
            if (j0 + c > qpos || tq >= n_tok) sv = -INFINITY;
            Sw[r * AT_LDS + c] = sv;
            mx = fmaxf(mx, sv);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float nm = fmaxf(m, mx);
        const float corr = nm == -INFINITY ? 1.0f : expf(m - nm);
        float ls = 0.0f;
#pragma unroll 8
        for (int i = 0; i < AT_BKV / 2; i++) {
            const int c = 2 * i + odd;
            const float sv = Sw[r * AT_LDS + c];
            const float p = sv == -INFINITY ? 0.0f : expf(sv - nm);
            Pw[r * AT_LDP + c] = __float2half_rn(p);
            ls += p;
        }
        ls += __shfl_xor_sync(0xffffffffu, ls, 1);
        l = l * corr + ls;
        m = nm;
        for (int i = 0; i < HD / 2; i++) Ow[r * LDO + 2 * i + odd] *= corr;
        __syncwarp();
        /* O += P V */
#pragma unroll
        for (int n = 0; n < HD / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc;
            wmma::load_matrix_sync(oacc, Ow + n * 16, LDO, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < AT_BKV; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> vb;
                wmma::load_matrix_sync(pa, Pw + kk, AT_LDP);
                wmma::load_matrix_sync(vb, Vs + kk * LDH + n * 16, LDH);
                wmma::mma_sync(oacc, pa, vb, oacc);
            }
            wmma::store_matrix_sync(Ow + n * 16, oacc, LDO, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (tq < n_tok) {
        const float inv = 1.0f / l;
        float *o = out + ((size_t)tq * n_head + h) * HD;
        for (int i = 0; i < HD / 2; i++) o[2 * i + odd] = Ow[r * LDO + 2 * i + odd] * inv;
    }
}

template <int F16, int HD>
static void launch_attention_tc(cudaStream_t s, const float *q, const void *kc, const void *vc, float *out,
                                int n_tok, int n_head, int n_head_kv, const int32_t *pos0, float scale)
{
    dim3 grid(n_head, (n_tok + AT_BQ - 1) / AT_BQ);
    k_attention_tc<F16, HD><<<grid, 128, AT_SMEM(HD), s>>>(q, kc, vc, out, n_tok, n_head, n_head_kv, pos0, scale);
}

template <int F16, int HD>
static cudaError_t attention_tc_optin(void)
{
    return cudaFuncSetAttribute((const void *)k_attention_tc<F16, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)AT_SMEM(HD));
}
#endif

#ifdef TG_GPU_HIP
int gk_attention_tc(int n_tok, int head_dim)
{
    (void)n_tok; (void)head_dim;
    return 0;
}
#else
static int at_tc_enabled(void)
{
    static int on = -1;
    return env_switch(&on, "TG_GPU_ATT_TC", 1);
}

int gk_attention_tc(int n_tok, int head_dim)
{
    return at_tc_enabled() && tc_ready && n_tok >= AT_MIN_TOK && (head_dim == 64 || head_dim == 128);
}
#endif

static int attention(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_f16, float *out,
                     int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t *pos0, void *scratch,
                     const float *s_in, float *s_out, int s_stride, tg_err *e)
{
    if (n_tok <= 0 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 ||
        head_dim > 4 * ATT_THREADS)
        return tg_errf(e, "gpu attention: n_tok=%d n_head=%d n_head_kv=%d head_dim=%d: expected n_head a "
                       "multiple of n_head_kv and head_dim <= %d", n_tok, n_head, n_head_kv, head_dim,
                       4 * ATT_THREADS);
    const float scale = 1.0f / sqrtf((float)head_dim);
#ifndef TG_GPU_HIP
    /* a prompt: the tensor-core kernel (not when the replay hooks the scores) */
    if (!s_in && !s_out && gk_attention_tc(n_tok, head_dim)) {
        if (head_dim == 128)
            (kv_f16 ? launch_attention_tc<1, 128> : launch_attention_tc<0, 128>)(s, q, kc, vc, out, n_tok, n_head,
                                                                               n_head_kv, pos0, scale);
        else
            (kv_f16 ? launch_attention_tc<1, 64> : launch_attention_tc<0, 64>)(s, q, kc, vc, out, n_tok, n_head,
                                                                             n_head_kv, pos0, scale);
        GPU_CHECK_LAUNCH(e, "attention (tensor cores)");
        return 0;
    }
#endif
    /* a single token splits its keys over att_splits() blocks per head */
    const int nsplit = n_tok == 1 && scratch ? att_splits() : 1;
    dim3 grid(n_head, n_tok, nsplit);
    const size_t shm = (size_t)head_dim * sizeof(float);
    float *part = (float *)scratch;
    if (kv_f16)
        k_attention<1><<<grid, ATT_THREADS, shm, s>>>(q, kc, vc, out, n_head, n_head_kv, head_dim, pos0, scale, part,
                                                      s_in, s_out, s_stride);
    else
        k_attention<0><<<grid, ATT_THREADS, shm, s>>>(q, kc, vc, out, n_head, n_head_kv, head_dim, pos0, scale, part,
                                                      s_in, s_out, s_stride);
    GPU_CHECK_LAUNCH(e, "attention");
    if (nsplit > 1) {
        k_attn_combine<<<dim3(n_head, n_tok), 128, 0, s>>>(part, out, n_head, head_dim, nsplit);
        GPU_CHECK_LAUNCH(e, "attention combine");
    }
    return 0;
}

int gk_attention(cudaStream_t s, const float *q, const void *kc, const void *vc,
                 int kv_f16, float *out, int n_tok, int n_head, int n_head_kv,
                 int head_dim, int n_ctx, const int32_t *pos0, void *scratch, tg_err *e)
{
    (void)n_ctx;
    return attention(s, q, kc, vc, kv_f16, out, n_tok, n_head, n_head_kv, head_dim, pos0, scratch, NULL, NULL, 0, e);
}

int gk_attention_scores(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_f16, float *out,
                        int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t *pos0,
                        const float *s_in, float *s_out, int s_stride, tg_err *e)
{
    if (s_stride <= 0 || (!s_in && !s_out))
        return tg_errf(e, "gpu attention scores: stride %d, %s: expected a stride > 0 and a score buffer", s_stride,
                       s_in || s_out ? "buffers" : "no buffer");
    return attention(s, q, kc, vc, kv_f16, out, n_tok, n_head, n_head_kv, head_dim, pos0, NULL, s_in, s_out,
                     s_stride, e);
}

__global__ void k_swiglu(const float *g, const float *u, float *y, __half *y16, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = swiglu1(g[i], u[i]);
        y[i] = v;
        if (y16) y16[i] = __float2half_rn(v);
    }
}

int gk_swiglu16(cudaStream_t s, const float *g, const float *u, float *y, void *y16, int n, tg_err *e)
{
    if (n <= 0) return tg_errf(e, "gpu swiglu: n=%d: expected > 0", n);
    k_swiglu<<<(n + 255) / 256, 256, 0, s>>>(g, u, y, (__half *)y16, n);
    GPU_CHECK_LAUNCH(e, "swiglu");
    return 0;
}

int gk_swiglu(cudaStream_t s, const float *g, const float *u, float *y, int n, tg_err *e)
{
    return gk_swiglu16(s, g, u, y, NULL, n, e);
}

__global__ void k_add(float *x, const float *y, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += y[i];
}

int gk_add(cudaStream_t s, float *x, const float *y, int n, tg_err *e)
{
    if (n <= 0) return tg_errf(e, "gpu add: n=%d: expected > 0", n);
    k_add<<<(n + 255) / 256, 256, 0, s>>>(x, y, n);
    GPU_CHECK_LAUNCH(e, "add");
    return 0;
}

/* ---- top-k ---------------------------------------------------------------- */

#define TOPK_THREADS 256
#define TOPK_CHUNK 1024   /* logits per thread block in the first pass (~150 blocks for a 152k vocabulary) */

/* a ranks before b: larger logit first, NaN last, ties by lower id. */
__device__ __forceinline__ bool top_before(float la, int ia, float lb, int ib)
{
    const bool na = isnan(la), nb = isnan(lb);
    if (na != nb) return nb;
    if (!na && la != lb) return la > lb;
    return ia < ib;
}

/* k rounds; round r picks the best entry ranking after round r-1's pick.
 * Entries come as (vals[i], ids[i]) for i < cnt (ids NULL: id = id0 + i,
 * ids[i] < 0: empty). Writes k entries to out (id -1 when fewer exist). */
__device__ void block_select(const float *vals, const int *ids, int id0, int cnt, int k, tg_top *out,
                             int stride = 1, float thr = -INFINITY)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x % TG_WARP, w = threadIdx.x / TG_WARP, nw = blockDim.x / TG_WARP;
    float pv = 0.0f;
    int pid = -1;   /* no previous pick */
    for (int r = 0; r < k; r++) {
        float bv = NAN;
        int bi = -1;
        for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
            const int id = ids ? ids[(size_t)i * stride] : id0 + i;
            if (id < 0) continue;
            const float v = vals[(size_t)i * stride];
            if (v < thr) continue;   /* below a known lower bound of the k-th logit (NaN is never skipped) */
            if (pid >= 0 && !top_before(pv, pid, v, id)) continue;
            if (bi < 0 || top_before(v, id, bv, bi)) { bv = v; bi = id; }
        }
#pragma unroll
        for (int o = TG_WARP / 2; o > 0; o >>= 1) {
            const float ov = warp_shfl_xor(bv, o);
            const int oi = warp_shfl_xor(bi, o);
            if (oi >= 0 && (bi < 0 || top_before(ov, oi, bv, bi))) { bv = ov; bi = oi; }
        }
        __syncthreads();
        if (lane == 0) { sv[w] = bv; si[w] = bi; }
        __syncthreads();
        bv = NAN; bi = -1;
        for (int j = 0; j < nw; j++)
            if (si[j] >= 0 && (bi < 0 || top_before(sv[j], si[j], bv, bi))) { bv = sv[j]; bi = si[j]; }
        if (threadIdx.x == 0) { out[r].id = bi; out[r].logit = bv; }
        if (bi < 0) {
            for (int r2 = r + 1 + threadIdx.x; r2 < k; r2 += blockDim.x) { out[r2].id = -1; out[r2].logit = NAN; }
            return;
        }
        pv = bv; pid = bi;
    }
}

/* Entry order of the selection: top_before, with empty entries (id < 0)
 * after everything. */
__device__ __forceinline__ bool rank_before(float va, int ia, float vb, int ib)
{
    if (ia < 0) return false;
    if (ib < 0) return true;
    return top_before(va, ia, vb, ib);
}

/* Sorts n (a power of two) entries of sv/si in shared memory into rank
 * order (bitonic network; every thread of the block takes part). */
__device__ void block_bitonic(float *sv, int *si, int n)
{
    for (int k = 2; k <= n; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int l = i ^ j;
                if (l > i) {
                    const bool up = (i & k) == 0;
                    const bool sw = up ? rank_before(sv[l], si[l], sv[i], si[i]) : rank_before(sv[i], si[i], sv[l], si[l]);
                    if (sw) {
                        const float tv = sv[i]; sv[i] = sv[l]; sv[l] = tv;
                        const int ti = si[i]; si[i] = si[l]; si[l] = ti;
                    }
                }
            }
            __syncthreads();
        }
}

/* First pass: each block sorts its chunk of TOPK_CHUNK logits and keeps the
 * first k. */
__global__ void k_topk_partial(const float *logits, int n, int k, tg_top *cand)
{
    __shared__ float sv[TOPK_CHUNK];
    __shared__ int si[TOPK_CHUNK];
    const int start = blockIdx.x * TOPK_CHUNK;
    const int cnt = n - start < TOPK_CHUNK ? n - start : TOPK_CHUNK;
    for (int i = threadIdx.x; i < TOPK_CHUNK; i += blockDim.x) {
        sv[i] = i < cnt ? logits[start + i] : NAN;
        si[i] = i < cnt ? start + i : -1;
    }
    __syncthreads();
    block_bitonic(sv, si, TOPK_CHUNK);
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
        cand[(size_t)blockIdx.x * k + r].id = si[r];
        cand[(size_t)blockIdx.x * k + r].logit = si[r] >= 0 ? sv[r] : NAN;
    }
}

#define TOPK_FINAL_CAP 4096   /* survivors the final pass sorts in shared memory */

/* Second pass. Each chunk's k-th entry bounds the global k-th logit from
 * below (that chunk alone has k logits at least as large), so only
 * candidates at or above the largest such bound can be selected; they are
 * gathered and sorted in shared memory. A chunk with fewer than k numbers
 * gives no bound; NaN candidates are kept. When more than TOPK_FINAL_CAP
 * survive (massive ties), k rounds of block_select over all candidates. */
__global__ void k_topk_final(const tg_top *cand, int ncand, int k, tg_top *out, int chunk_max_bound)
{
    __shared__ float sv[TOPK_FINAL_CAP];
    __shared__ int si[TOPK_FINAL_CAP];
    __shared__ float sh[32];
    __shared__ int cnt;
    const int nch = ncand / k;
    float b = -INFINITY;
    for (int c = threadIdx.x; c < nch; c += blockDim.x) {
        const tg_top t = cand[(size_t)c * k + k - 1];
        if (t.id >= 0 && !isnan(t.logit)) b = fmaxf(b, t.logit);
    }
    b = block_max(b, sh);
    /* A tighter bound when there are at least k chunks: the k-th largest of
     * the chunks' maxima (k chunks each hold a logit at least that large).
     * The maxima are sorted in shared memory (nch <= TOPK_FINAL_CAP). */
    if (chunk_max_bound && nch >= k && nch <= TOPK_FINAL_CAP) {
        int n2 = 1;
        while (n2 < nch) n2 <<= 1;
        for (int c = threadIdx.x; c < n2; c += blockDim.x) {
            const tg_top t = c < nch ? cand[(size_t)c * k] : tg_top{-1, NAN};
            const bool ok = t.id >= 0 && !isnan(t.logit);
            sv[c] = ok ? t.logit : NAN;
            si[c] = ok ? c : -1;
        }
        __syncthreads();
        block_bitonic(sv, si, n2);
        if (si[k - 1] >= 0) b = fmaxf(b, sv[k - 1]);
        __syncthreads();
    }
    if (threadIdx.x == 0) cnt = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < ncand; i += blockDim.x) {
        const tg_top t = cand[i];
        if (t.id < 0 || t.logit < b) continue;   /* NaN compares false: kept */
        const int slot = atomicAdd(&cnt, 1);
        if (slot < TOPK_FINAL_CAP) {
            sv[slot] = t.logit;
            si[slot] = t.id;
        }
    }
    __syncthreads();
    const int m = cnt;
    if (m > TOPK_FINAL_CAP) {
        block_select(&cand[0].logit, &cand[0].id, 0, ncand, k, out, 2, b);
        return;
    }
    int n2 = 1;
    while (n2 < m || n2 < k) n2 <<= 1;
    for (int i = m + threadIdx.x; i < n2; i += blockDim.x) {
        sv[i] = NAN;
        si[i] = -1;
    }
    __syncthreads();
    block_bitonic(sv, si, n2);
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
        out[r].id = si[r];
        out[r].logit = si[r] >= 0 ? sv[r] : NAN;
    }
}

/* TG_GPU_TOPK_BOUND=0: only the chunks' k-th entries bound the search. */
static int topk_bound_on(void)
{
    static int bound = -1;
    return env_switch(&bound, "TG_GPU_TOPK_BOUND", 1);
}

size_t gk_topk_scratch(int n, int k)
{
    const size_t nblk = ((size_t)n + TOPK_CHUNK - 1) / TOPK_CHUNK;
    return nblk * (size_t)k * sizeof(tg_top);
}

int gk_topk(cudaStream_t s, const float *logits, int n, int k, void *scratch,
            tg_top *out, tg_err *e)
{
    if (n <= 0 || k <= 0 || k > n || k > TG_GPU_MAX_TOPK)
        return tg_errf(e, "gpu topk: n=%d k=%d: expected 1 <= k <= min(n, %d)", n, k, TG_GPU_MAX_TOPK);
    const int nblk = (n + TOPK_CHUNK - 1) / TOPK_CHUNK;
    const size_t ncand = (size_t)nblk * k;
    tg_top *cand = (tg_top *)scratch;
    k_topk_partial<<<nblk, TOPK_THREADS, 0, s>>>(logits, n, k, cand);
    GPU_CHECK_LAUNCH(e, "topk partial");
    k_topk_final<<<1, 1024, 0, s>>>(cand, (int)ncand, k, out, topk_bound_on());
    GPU_CHECK_LAUNCH(e, "topk final");
    return 0;
}

/* ---- XXH3-64 (long input, seed 0, default secret) ------------------------ */

/* The default secret of the XXH3 specification (192 bytes). */
__constant__ uint8_t xxh_secret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define XXH_P32_1 0x9E3779B1U
#define XXH_P32_2 0x85EBCA77U
#define XXH_P32_3 0xC2B2AE3DU
#define XXH_P64_1 0x9E3779B185EBCA87ULL
#define XXH_P64_2 0xC2B2AE3D27D4EB4FULL
#define XXH_P64_3 0x165667B19E3779F9ULL
#define XXH_P64_4 0x85EBCA77C2B2AE63ULL
#define XXH_P64_5 0x27D4EB2F165667C5ULL
#define XXH_STRIPE 64
#define XXH_STRIPES_PER_BLOCK 16           /* (192 - 64) / 8 */
#define XXH_BLOCK (XXH_STRIPE * XXH_STRIPES_PER_BLOCK)
#define XXH_PREFETCH 256                   /* block sums per shared-memory fill of k_xxh3_final */

/* Little-endian 64-bit read of the secret at any byte offset. */
__device__ __forceinline__ uint64_t sec64(int off)
{
    uint64_t v = 0;
#pragma unroll
    for (int i = 7; i >= 0; i--) v = (v << 8) | xxh_secret[off + i];
    return v;
}

/* Lane i's contribution of one stripe (accumulate_512 of the spec): lane i
 * receives data word i^1, plus lo32(key_i) * hi32(key_i). */
__device__ __forceinline__ uint64_t xxh_stripe_lane(const uint64_t *p, int sec_off, int i)
{
    const uint64_t key = p[i] ^ sec64(sec_off + 8 * i);
    return p[i ^ 1] + (uint64_t)(uint32_t)key * (key >> 32);
}

/* Sums of every full block's 16 stripes, per lane: sums[b][i]. */
__global__ void k_xxh3_blocks(const uint64_t *data, size_t nblocks, uint64_t *sums)
{
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t b = tid / 8;
    const int i = (int)(tid % 8);
    if (b >= nblocks) return;
    const uint64_t *p = data + b * (XXH_BLOCK / 8);
    uint64_t acc = 0;
#pragma unroll 4
    for (int st = 0; st < XXH_STRIPES_PER_BLOCK; st++) acc += xxh_stripe_lane(p + st * 8, st * 8, i);
    sums[b * 8 + i] = acc;
}

__device__ __forceinline__ uint64_t mul128_fold64(uint64_t a, uint64_t b)
{
    return (a * b) ^ __umul64hi(a, b);
}

/* One block (threads 0..7 hold the 8 lanes; all of them fetch): the sequential chain of block sums and scrambles,
 * the last partial block, the last stripe and the merge. */
__global__ void k_xxh3_final(const uint8_t *data, size_t len, size_t nblocks, const uint64_t *sums,
                             uint64_t *out)
{
    __shared__ uint64_t accs[8];
    const int i = threadIdx.x;
    const uint64_t init[8] = {XXH_P32_3, XXH_P64_1, XXH_P64_2, XXH_P64_3,
                              XXH_P64_4, XXH_P32_2, XXH_P64_5, XXH_P32_1};
    __shared__ uint64_t pre[XXH_PREFETCH * 8];
    uint64_t acc = init[i & 7];
    const uint64_t skey = sec64(192 - 64 + 8 * (i & 7));
    /* the chain is sequential; its inputs are fetched XXH_PREFETCH blocks at
     * a time by the whole thread block, so the chain waits on shared memory
     * rather than on a global load per link */
    for (size_t b0 = 0; b0 < nblocks; b0 += XXH_PREFETCH) {
        const size_t nb = nblocks - b0 < XXH_PREFETCH ? nblocks - b0 : XXH_PREFETCH;
        __syncthreads();
        for (size_t j = threadIdx.x; j < nb * 8; j += blockDim.x) pre[j] = sums[b0 * 8 + j];
        __syncthreads();
        if (i < 8)
            for (size_t b = 0; b < nb; b++) {
                acc += pre[b * 8 + i];
                /* scramble */
                acc ^= acc >> 47;
                acc ^= skey;
                acc *= XXH_P32_1;
            }
    }
    if (i >= 8) return;
    const size_t nstripes = ((len - 1) - XXH_BLOCK * nblocks) / XXH_STRIPE;
    const uint64_t *tail = (const uint64_t *)(data + nblocks * XXH_BLOCK);
    for (size_t st = 0; st < nstripes; st++) acc += xxh_stripe_lane(tail + st * 8, (int)st * 8, i);
    /* last stripe: the final 64 bytes (possibly unaligned to 8 bytes: read bytes) */
    {
        const uint8_t *lp = data + len - XXH_STRIPE;
        uint64_t w[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint64_t v = 0;
            for (int c = 7; c >= 0; c--) v = (v << 8) | lp[8 * j + c];
            w[j] = v;
        }
        const uint64_t key = w[i] ^ sec64(192 - 64 - 7 + 8 * i);
        acc += w[i ^ 1] + (uint64_t)(uint32_t)key * (key >> 32);
    }
    accs[i] = acc;
    warp_sync();
    if (i == 0) {
        uint64_t r = (uint64_t)len * XXH_P64_1;
        for (int j = 0; j < 4; j++)
            r += mul128_fold64(accs[2 * j] ^ sec64(11 + 16 * j), accs[2 * j + 1] ^ sec64(11 + 16 * j + 8));
        /* avalanche */
        r ^= r >> 37;
        r *= 0x165667919E3779F9ULL;
        r ^= r >> 32;
        *out = r;
    }
}

size_t gk_xxh3_scratch(size_t len)
{
    const size_t nblocks = len > 0 ? (len - 1) / XXH_BLOCK : 0;
    return (nblocks ? nblocks : 1) * 8 * sizeof(uint64_t);
}

int gk_xxh3(cudaStream_t s, const void *data, size_t len, void *scratch, uint64_t *out, tg_err *e)
{
    if (len <= 240) return tg_errf(e, "gpu xxh3: %zu bytes: expected more than 240 (long-input variant)", len);
    if ((uintptr_t)data % 8) return tg_errf(e, "gpu xxh3: input not 8-byte aligned");
    const size_t nblocks = (len - 1) / XXH_BLOCK;
    uint64_t *sums = (uint64_t *)scratch;
    if (nblocks) {
        const size_t threads = nblocks * 8;
        k_xxh3_blocks<<<(unsigned)((threads + 255) / 256), 256, 0, s>>>((const uint64_t *)data, nblocks, sums);
        GPU_CHECK_LAUNCH(e, "xxh3 blocks");
    }
    k_xxh3_final<<<1, 256, 0, s>>>((const uint8_t *)data, len, nblocks, sums, out);
    GPU_CHECK_LAUNCH(e, "xxh3 final");
    return 0;
}

/* ---- the fused single-token path -------------------------------------------
 *
 * A decode step reads every weight once, so it should run at the memory
 * bandwidth; the profile of the plain path (one kernel per op, the
 * activation re-quantized by every thread block of every mat-vec) showed
 * the mat-vecs at 0.6-1.2 TB/s and one-block norms of 14 us. This path
 * quantizes each mat-vec input once, in the kernel that produces it (the
 * norms, the attention merge, the SwiGLU epilogue), into gk_q8 buffers, and
 * fuses what reads or writes one vector: the q, k and v mat-vecs are one
 * launch; q/k-norm, RoPE, the cache store, attention and the merge of its
 * key ranges are one launch (k_attn_decode); the residual
 * adds are the epilogues of the output and down projections; gate, up and
 * SwiGLU are one launch whose thread blocks also quantize their 32 outputs
 * for the down projection. The arithmetic is the plain path's (same
 * quantization rule as gk_matmul_q8, same norm and RoPE formulas); sums may
 * be taken in another order. */

#define FZ_WARPS 4          /* rows per mat-vec thread block, one warp each */
#define FZ_NORM_THREADS 256

/* Quantizes the 32 values v (one per lane) as one block: d = max|v|/127,
 * q = round(v/d); lane 0 writes d and the sum of q. */
__device__ __forceinline__ void q8_block_store(float v, int lane, int8_t *q, float *d, float *s)
{
    const float amax = warp_max(fabsf(v));
    const float dd = amax / 127.0f;
    const int qi = dd > 0.0f ? __float2int_rn(v / dd) : 0;
    q[lane] = (int8_t)qi;
    const float sq = warp_sum((float)qi);
    if (lane == 0) {
        *d = dd;
        *s = sq;
    }
}

/* One row: y = x * (1/sqrt(mean(x^2) + eps)) * w, into y (when not NULL)
 * and quantized into out. One thread block per 32-value block of the
 * output: each block sums the squares of the whole row itself (the row is
 * a few KiB, read from L2 by every block) rather than waiting on a single
 * block, and its first warp writes its 32 values. */
template <int CH>
__global__ void __launch_bounds__(FZ_NORM_THREADS)
k_rmsnorm_q8(const float *__restrict__ x, const float *__restrict__ w, float *y, int n, float eps, gk_q8 out,
             gk_dep dep)
{
    __shared__ float sh[32];
    pdl_trigger();
    if (CH)
        dep_wait_block(dep);
    else
        pdl_wait();
    float ss = 0.0f;
    if (n % 4 == 0)
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
            const float4 v = ((const float4 *)x)[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    else
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / n + eps);
    if (threadIdx.x < TG_WARP) {
        const int qb = blockIdx.x, lane = threadIdx.x;
        const int i = qb * 32 + lane;
        const float v = x[i] * scale * w[i];
        if (y) y[i] = v;
        q8_block_store(v, lane, out.q + qb * 32, out.d + qb, out.s + qb);
    }
    if (CH) dep_post(dep);
}

template <int TYPE> struct fz_fmt {
    static constexpr int PARTS = TYPE == TG_TYPE_Q4_K ? tr_q4_K::PARTS : TYPE == TG_TYPE_Q6_K ? tr_q6_K::PARTS
                                                                                                : tr_q8_0::PARTS;
    static constexpr int BYTES = TYPE == TG_TYPE_Q4_K ? tr_q4_K::BYTES : TYPE == TG_TYPE_Q6_K ? tr_q6_K::BYTES
                                                                                                : tr_q8_0::BYTES;
    static constexpr int QK = TYPE == TG_TYPE_Q8_0 ? QK8_0 : QK_K;
};

/* Dot products of R weight rows (row pointers wr[0..R-1]) with the quantized
 * activations, each summed over the warp into acc[r] (every lane gets it).
 * The lanes take the rows' block parts in turn; each part's activations are
 * loaded once for all R rows. */
template <int TYPE, int R>
__device__ __forceinline__ void fz_rows_dot(const uint8_t *const *wr, int nb, const gk_q8 &x, int lane, float *acc)
{
    typedef fz_fmt<TYPE> F;
    const int nparts = nb * F::PARTS;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
#pragma unroll 2
    for (int p = lane; p < nparts; p += TG_WARP) {
        const int ib = p / F::PARTS, part = p % F::PARTS;
        typename fz_x<TYPE>::T xv;
        fz_load_x(x, ib, part, xv);
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] += fz_part(wr[r] + (size_t)ib * F::BYTES, part, xv);
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
}

__device__ __forceinline__ size_t fz_row_bytes(uint32_t type, int K)
{
    return type == TG_TYPE_Q4_K ? (size_t)(K / QK_K) * sizeof(block_q4_K)
         : type == TG_TYPE_Q6_K ? (size_t)(K / QK_K) * sizeof(block_q6_K)
                                : (size_t)(K / QK8_0) * sizeof(block_q8_0);
}

struct fz_segs {
    gk_mv_seg s[3];
    int n;
};

template <int TYPE, int R>
__device__ __forceinline__ void fz_seg_rows(const gk_mv_seg &sg, int row0, int K, const gk_q8 &x, int lane,
                                            int accumulate)
{
    const size_t rb = fz_row_bytes(TYPE, K);
    const uint8_t *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = row0 + r < sg.nrows ? row0 + r : sg.nrows - 1;   /* a repeated row past the end: not stored */
        wr[r] = (const uint8_t *)sg.W + (size_t)row * rb;
    }
    float acc[R];
    fz_rows_dot<TYPE, R>(wr, K / fz_fmt<TYPE>::QK, x, lane, acc);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (row0 + r >= sg.nrows) break;
            if (accumulate) sg.y[row0 + r] += acc[r];
            else sg.y[row0 + r] = acc[r];
        }
}

/* One warp per R consecutive rows of one segment (a segment's row count is
 * padded to a multiple of R in the warp numbering); the rows' results are
 * stored, or added to y when accumulate is set. */
template <int R>
__global__ void __launch_bounds__(FZ_WARPS * TG_WARP)
k_mv_fused(fz_segs segs, int K, gk_q8 x, int accumulate)
{
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x % TG_WARP;
    int w = blockIdx.x * FZ_WARPS + threadIdx.x / TG_WARP;
    int i = 0;
    while (i < segs.n && w >= (segs.s[i].nrows + R - 1) / R) w -= (segs.s[i++].nrows + R - 1) / R;
    if (i == segs.n) return;
    const gk_mv_seg &sg = segs.s[i];
    switch (sg.type) {
    case TG_TYPE_Q4_K: fz_seg_rows<TG_TYPE_Q4_K, R>(sg, w * R, K, x, lane, accumulate); break;
    case TG_TYPE_Q6_K: fz_seg_rows<TG_TYPE_Q6_K, R>(sg, w * R, K, x, lane, accumulate); break;
    default: fz_seg_rows<TG_TYPE_Q8_0, R>(sg, w * R, K, x, lane, accumulate); break;
    }
}

/* ---- streamed mat-vec: weights staged through shared memory -------------
 *
 * The direct kernel above keeps a warp's next weight loads in registers, so
 * a warp has little more than one iteration's bytes in flight, and at the
 * occupancy its registers allow the mat-vecs reached 1-1.5 TB/s (ncu: warps
 * stalled on L1TEX scoreboards, DRAM 20-30% busy). Here each warp streams
 * its row through a ring of FZ_STAGES chunks of shared memory with
 * asynchronous copies (cp.async on NVIDIA, which hold no registers; plain
 * copies on HIP), so a whole 4096-wide row is in flight at once, and the
 * arithmetic reads the staged blocks. A chunk is FZ_CB blocks: a whole
 * number of 16-byte pieces and of the warp's 32-part iterations. */

#define FZ_STAGES 4

template <int TYPE> struct fz_chunk {
    static constexpr int CB = TYPE == TG_TYPE_Q4_K ? 4 : 8;               /* blocks per chunk */
    static constexpr int BYTES = CB * fz_fmt<TYPE>::BYTES;                /* 576, 1680, 272 */
    static constexpr int PIECES = BYTES / 16;
    static constexpr int ITERS = CB * fz_fmt<TYPE>::PARTS / TG_WARP;      /* 1, 4, 1 */
    static_assert(BYTES % 16 == 0, "chunk of whole 16-byte pieces");
    static_assert(ITERS * TG_WARP == CB * fz_fmt<TYPE>::PARTS, "chunk of whole warp iterations");
};

/* Whether rows of K values of type stream in whole chunks. */
__host__ __device__ inline int fz_streams(uint32_t type, int K)
{
    if (type == TG_TYPE_Q4_K) return K % (4 * QK_K) == 0;
    if (type == TG_TYPE_Q6_K) return K % (8 * QK_K) == 0;
    return K % (8 * QK8_0) == 0;
}

/* NR rows (wr[r]) dotted with x, streamed through sm (NR * FZ_STAGES
 * chunks of this warp); acc[r] summed over the warp (every lane has them). */
template <int TYPE, int NR, int CH>
__device__ __forceinline__ void fz_stream_rows(const uint8_t *const *wr, int nb, const gk_q8 &x, int lane,
                                               uint8_t *sm, float *acc, const gk_dep &dep, bool &waited)
{
    typedef fz_fmt<TYPE> F;
    typedef fz_chunk<TYPE> C;
    const int nch = nb / C::CB;
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    auto issue = [&](int c) {
        if (c < nch)
#pragma unroll
            for (int r = 0; r < NR; r++) {
                uint8_t *dst = sm + (size_t)(r * FZ_STAGES + c % FZ_STAGES) * C::BYTES;
                const uint8_t *src = wr[r] + (size_t)c * C::BYTES;
                for (int pc = lane; pc < C::PIECES; pc += TG_WARP) cp_async16(dst + 16 * pc, src + 16 * pc);
            }
        cp_async_commit();
    };
#pragma unroll
    for (int c = 0; c < FZ_STAGES - 1; c++) issue(c);
    /* the weights are constant; the activations come from the previous kernel */
    if (!CH)
        pdl_wait();
    else if (!waited)
        dep_wait_warp(dep);
    waited = true;
    for (int c = 0; c < nch; c++) {
        issue(c + FZ_STAGES - 1);
        cp_async_wait<FZ_STAGES - 1>();
        warp_sync();
#pragma unroll
        for (int it = 0; it < C::ITERS; it++) {
            const int p = it * TG_WARP + lane;
            const int ibl = p / F::PARTS, part = p % F::PARTS;
            typename fz_x<TYPE>::T xv;
            fz_load_x(x, c * C::CB + ibl, part, xv);
#pragma unroll
            for (int r = 0; r < NR; r++)
                acc[r] += fz_part(sm + (size_t)(r * FZ_STAGES + c % FZ_STAGES) * C::BYTES + ibl * F::BYTES, part, xv);
        }
        warp_sync();   /* every lane is done with this stage before it is refilled */
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = warp_sum(acc[r]);
}

template <int TYPE, int NR, int CH>
__device__ __forceinline__ void fz_seg_stream(const gk_mv_seg &sg, int row0, int K, const gk_q8 &x, int lane,
                                              int accumulate, uint8_t *sm, const gk_dep &dep, bool &waited)
{
    const uint8_t *wr[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const int row = row0 + r < sg.nrows ? row0 + r : sg.nrows - 1;   /* past the end: read again, not stored */
        wr[r] = (const uint8_t *)sg.W + (size_t)row * fz_row_bytes(TYPE, K);
    }
    float acc[NR];
    fz_stream_rows<TYPE, NR, CH>(wr, K / fz_fmt<TYPE>::QK, x, lane, sm, acc, dep, waited);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (row0 + r >= sg.nrows) break;
            if (accumulate) sg.y[row0 + r] += acc[r];
            else sg.y[row0 + r] = acc[r];
        }
}

/* Streamed k_mv_fused: warps take NR consecutive rows of a segment at a
 * time (grid-stride over the segments' row groups); every segment's type
 * streams at this K (checked by the launcher). Dynamic shared memory:
 * FZ_WARPS * ring (a warp's: NR * FZ_STAGES * the largest chunk of its
 * segments' types). */
template <int NR, int CH>
__global__ void __launch_bounds__(FZ_WARPS * TG_WARP)
k_mv_stream(fz_segs segs, int K, gk_q8 x, int accumulate, int ring, gk_dep dep)
{
    extern __shared__ __align__(16) uint8_t fz_sm[];
    pdl_trigger();
    const int lane = threadIdx.x % TG_WARP, wid = threadIdx.x / TG_WARP;
    uint8_t *sm = fz_sm + (size_t)wid * ring;
    const int n0 = (segs.s[0].nrows + NR - 1) / NR;
    const int n1 = segs.n > 1 ? (segs.s[1].nrows + NR - 1) / NR : 0;
    const int n2 = segs.n > 2 ? (segs.s[2].nrows + NR - 1) / NR : 0;
    bool waited = false;
    for (int v = blockIdx.x * FZ_WARPS + wid; v < n0 + n1 + n2; v += gridDim.x * FZ_WARPS) {
        const int i = v < n0 ? 0 : v < n0 + n1 ? 1 : 2;
        const int grp = v - (i == 0 ? 0 : i == 1 ? n0 : n0 + n1);
        const gk_mv_seg sg = i == 0 ? segs.s[0] : i == 1 ? segs.s[1] : segs.s[2];
        switch (sg.type) {
        case TG_TYPE_Q4_K: fz_seg_stream<TG_TYPE_Q4_K, NR, CH>(sg, grp * NR, K, x, lane, accumulate, sm, dep, waited); break;
        case TG_TYPE_Q6_K: fz_seg_stream<TG_TYPE_Q6_K, NR, CH>(sg, grp * NR, K, x, lane, accumulate, sm, dep, waited); break;
        default: fz_seg_stream<TG_TYPE_Q8_0, NR, CH>(sg, grp * NR, K, x, lane, accumulate, sm, dep, waited); break;
        }
    }
    /* a warp without rows also completes after the previous kernel */
    if (!CH) {
        pdl_wait();
    } else {
        if (!waited) dep_wait_warp(dep);
        dep_post(dep);
    }
}

#define FZ_SMEM_OPTIN (96 * 1024)   /* dynamic shared memory gk_init allows the streamed kernels */
static int fz_optin;
static int pdl_on;   /* gk_init: launch the fused path's kernels with programmatic dependent launch */
static int pdl_early;   /* gk_init: and let the next kernel start at once (TG_GPU_PDL=1) */

/* Launches kernel k; with PDL on (sm_90, CUDA), with the attribute that lets
 * it start before the previous kernel of the stream has finished (the kernels
 * launched this way call pdl_trigger and pdl_wait, gpu_common.cuh). Returns
 * the launch's error. */
template <typename... P, typename... A>
static cudaError_t gk_launch(void (*k)(P...), dim3 grid, dim3 block, size_t sm, cudaStream_t s, A... a)
{
#ifndef TG_GPU_HIP
    if (pdl_on) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = sm;
        cfg.stream = s;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, k, ((P)a)...);
    }
#endif
    k<<<grid, block, sm, s>>>(((P)a)...);
    return cudaGetLastError();
}

int gk_init(tg_err *e)
{
    const void *streamed[] = {(const void *)k_mv_stream<1, 0>, (const void *)k_mv_stream<2, 0>,
                              (const void *)k_mv_stream<1, 1>, (const void *)k_mv_stream<2, 1>};
    for (size_t i = 0; i < sizeof streamed / sizeof streamed[0]; i++)
        GPU_CHECK(e, cudaFuncSetAttribute(streamed[i], cudaFuncAttributeMaxDynamicSharedMemorySize, FZ_SMEM_OPTIN));
    fz_optin = 1;
#ifndef TG_GPU_HIP
    for (size_t i = 0; i < sizeof gk_types / sizeof gk_types[0]; i++) {
        if (gk_types[i].tc_optin) GPU_CHECK(e, gk_types[i].tc_optin());
        if (gk_types[i].tc2_optin) GPU_CHECK(e, gk_types[i].tc2_optin());
    }
    GPU_CHECK(e, (attention_tc_optin<0, 64>()));
    GPU_CHECK(e, (attention_tc_optin<1, 64>()));
    GPU_CHECK(e, (attention_tc_optin<0, 128>()));
    GPU_CHECK(e, (attention_tc_optin<1, 128>()));
    int dev = 0, major = 0;
    GPU_CHECK(e, cudaGetDevice(&dev));
    GPU_CHECK(e, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    GPU_CHECK(e, cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    /* TG_GPU_PDL=1 (the default since device session 9): on, each kernel
     * lets the next start at once, whose blocks then issue their constant
     * reads (weights, the attention's cached rows) while this one finishes:
     * 322.5 -> 353.9 decode tok/s at 8b, H200, session 9 (3% slower than
     * off in run 4, before the attention prefetched); =2: on, the next
     * kernel starts as this one's blocks exit (pdl_early_c off); =0: off */
    const char *pv = getenv("TG_GPU_PDL");
    const int pdl_mode = pv && pv[0] >= '0' && pv[0] <= '2' ? pv[0] - '0' : 1;
    pdl_on = major >= 9 && pdl_mode > 0;
    const int early = pdl_mode != 2;
    pdl_early = pdl_on && early;
    GPU_CHECK(e, cudaMemcpyToSymbol(pdl_early_c, &early, sizeof early));
    tc_ready = major >= 7;
#endif
    return 0;
}

int gk_pdl_on(void)
{
    return pdl_on;
}

/* Streamed k_mv_swiglu: gate and up rows r0..r0+31, a warp per pair of
 * rows at a time (8 warps, 4 pairs each). */
template <int TYPE, int CH>
__global__ void __launch_bounds__(8 * TG_WARP)
k_mv_swiglu_stream(const uint8_t *__restrict__ Wg, const uint8_t *__restrict__ Wu, int K, gk_q8 x, float *y,
                   gk_q8 out, gk_dep dep)
{
    extern __shared__ __align__(16) uint8_t fz_sm[];
    __shared__ float act[32];
    pdl_trigger();
    const int lane = threadIdx.x % TG_WARP, wid = threadIdx.x / TG_WARP;
    uint8_t *sm = fz_sm + (size_t)wid * 2 * FZ_STAGES * fz_chunk<TYPE>::BYTES;
    const size_t rb = fz_row_bytes(TYPE, K);
    const int nb = K / fz_fmt<TYPE>::QK;
    const int r0 = blockIdx.x * 32;
    bool waited = false;
    for (int j = 0; j < 4; j++) {
        const int r = r0 + wid * 4 + j;
        const uint8_t *wr[2] = {Wg + (size_t)r * rb, Wu + (size_t)r * rb};
        float gu[2];
        fz_stream_rows<TYPE, 2, CH>(wr, nb, x, lane, sm, gu, dep, waited);
        if (lane == 0) act[wid * 4 + j] = gu[0] / (1.0f + expf(-gu[0])) * gu[1];
    }
    __syncthreads();
    if (wid == 0) {
        const float v = act[lane];
        if (y) y[r0 + lane] = v;
        q8_block_store(v, lane, out.q + r0, out.d + blockIdx.x, out.s + blockIdx.x);
    }
    if (CH) dep_post(dep);
}

static int fz_stream_on(void)
{
    static int on = -1;
    return env_switch(&on, "TG_GPU_STREAM", 1);
}

/* TG_GPU_STREAM_ROWS (read once): 2 rows per warp (the default), 1, or 3
 * for "q6" (one row only in launches with a Q6_K segment). */
static int stream_rows_env(void)
{
    static int nr_env = -1;
    if (nr_env < 0) {
        const char *env = getenv("TG_GPU_STREAM_ROWS");
        nr_env = env && env[0] == '1' ? 1 : env && env[0] == 'q' ? 3 : 2;
    }
    return nr_env;
}

static int fz_chunk_bytes(uint32_t type)
{
    return type == TG_TYPE_Q4_K ? fz_chunk<TG_TYPE_Q4_K>::BYTES
         : type == TG_TYPE_Q6_K ? fz_chunk<TG_TYPE_Q6_K>::BYTES : fz_chunk<TG_TYPE_Q8_0>::BYTES;
}

/* Gate and up rows r0..r0+31 (8 warps, 4 rows each; a gate row and its up
 * row share their activation loads), y = silu(g) * u, stored in f32 (y not
 * NULL) and quantized as one block into out. */
template <int TYPE>
__global__ void __launch_bounds__(8 * TG_WARP)
k_mv_swiglu(const uint8_t *__restrict__ Wg, const uint8_t *__restrict__ Wu, int K, gk_q8 x, float *y, gk_q8 out)
{
    __shared__ float act[32];
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x % TG_WARP, wid = threadIdx.x / TG_WARP;
    const size_t rb = fz_row_bytes(TYPE, K);
    const int nb = K / fz_fmt<TYPE>::QK;
    const int r0 = blockIdx.x * 32;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r = r0 + wid * 4 + j;
        const uint8_t *wr[2] = {Wg + (size_t)r * rb, Wu + (size_t)r * rb};
        float gu[2];
        fz_rows_dot<TYPE, 2>(wr, nb, x, lane, gu);
        if (lane == 0) act[wid * 4 + j] = gu[0] / (1.0f + expf(-gu[0])) * gu[1];
    }
    __syncthreads();
    if (wid == 0) {
        const float v = act[lane];
        if (y) y[r0 + lane] = v;
        q8_block_store(v, lane, out.q + r0, out.d + blockIdx.x, out.s + blockIdx.x);
    }
}

/* The RoPE cosines and sines of pair i = threadIdx.x + j * blockDim.x (j
 * < 2, i < half) at position pos, as rope_cs. */
__device__ __forceinline__ void rope_pre(int pos, float theta_scale, int half, float c[2], float sn[2])
{
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        c[j] = 1.0f;
        sn[j] = 0.0f;
        if (i < half) rope_cs(pos, theta_scale, i, &c[j], &sn[j]);
    }
}

/* One head of head_dim values (half <= 2 * blockDim.x pairs) at xh into hv
 * (shared): its RMS norm with weights w (none when NULL), then RoPE with
 * rope_pre's c and sn. Every thread of the block calls it; the norm's sum
 * is block_sum's over blockDim.x threads (any block of 128 or more threads,
 * or of at least head_dim threads, sums in the same order). */
__device__ __forceinline__ void head_norm_rope(const float *xh, const float *w, int head_dim, const float c[2],
                                               const float sn[2], int neox, float eps, float *hv, float *sh)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        hv[i] = xh[i];
        ss += hv[i] * hv[i];
    }
    if (w) {
        ss = block_sum(ss, sh);
        const float scale = 1.0f / sqrtf(ss / head_dim + eps);
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) hv[i] = hv[i] * scale * w[i];
    }
    __syncthreads();
    const int half = head_dim / 2;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i >= half) break;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float a = hv[i0], b = hv[i1];
        hv[i0] = a * c[j] - b * sn[j];
        hv[i1] = a * sn[j] + b * c[j];
    }
    __syncthreads();
}

/* Decode attention of one token in one launch: a thread block per (query
 * head h, key range z of gridDim.y). Each block takes the head's q through
 * its RMS norm and RoPE itself (nothing is written back); the block whose
 * range holds the new position also takes the kv head's k through norm and
 * RoPE and stores k and v at cache row *pos0 (the blocks of the other
 * query heads of the group store the same bytes). Then attn_range over the
 * range, the partial result into part, and the last block of the head to
 * arrive (count[h], left at 0 again) merges the ranges as k_attn_combine,
 * writes the head's output and quantizes it for the output projection.
 * With stage_keys > 0 (every range at most that long) the range's cached
 * K and V rows are copied into shared memory before the kernel waits on
 * the mat-vec (they were written by earlier steps), all at once, and the
 * new row joins them there. q_out (when not NULL): the normed, rotated q,
 * for tests. Dynamic shared memory: head_dim floats, then 2 * stage_keys
 * rows of K and V. */
template <int F16, int CH>
__global__ void __launch_bounds__(ATT_THREADS)
k_attn_decode(const float *q, const float *k, const float *v, const float *wq, const float *wk, int n_head,
              int n_head_kv, int head_dim, const int32_t *pos0, float theta_scale, int neox, float eps, void *kc,
              void *vc, float scale, float *part, int *count, float *out, gk_q8 oq, float *q_out, int stage_keys,
              gk_dep dep)
{
    __shared__ float sc[ATT_CHUNK];
    __shared__ float red[32];
    __shared__ float f[ATT_SPLITS_MAX];
    __shared__ int last;
    extern __shared__ __align__(16) float qs[]; /* head_dim, then the staged rows */
    pdl_trigger();
    /* the position is the step's parameter, copied before the step's first
     * kernel: its angles and the range's cached rows are read before
     * waiting on the mat-vec */
    const int pos = *pos0, n_kv = pos + 1;
    const int h = blockIdx.x, z = blockIdx.y, nsplit = gridDim.y;
    const int hkv = h / (n_head / n_head_kv);
    const size_t kv_row = (size_t)n_head_kv * head_dim;
    const int per = (n_kv + nsplit - 1) / nsplit;
    const int jb = z * per, je = min(n_kv, jb + per);
    const int el = F16 ? 2 : 4, rowb = head_dim * el, nk = je - jb;
    const bool staged = nk > 0 && nk <= stage_keys;
    uint8_t *ks = (uint8_t *)(qs + head_dim), *vs = ks + (size_t)stage_keys * rowb;
    if (staged) {
        const int pieces = rowb / 16, nold = min(je, pos) - jb;
        for (int p = threadIdx.x; p < nold * pieces; p += blockDim.x) {
            const int r = p / pieces, pc = p % pieces;
            const size_t src = ((size_t)(jb + r) * kv_row + (size_t)hkv * head_dim) * el + 16 * pc;
            cp_async16(ks + (size_t)r * rowb + 16 * pc, (const uint8_t *)kc + src);
            cp_async16(vs + (size_t)r * rowb + 16 * pc, (const uint8_t *)vc + src);
        }
        cp_async_commit();
    }
    float rc[2], rs[2];
    rope_pre(pos, theta_scale, head_dim / 2, rc, rs);
    if (CH)
        dep_wait_block(dep);
    else
        pdl_wait();
    head_norm_rope(q + (size_t)h * head_dim, wq, head_dim, rc, rs, neox, eps, qs, red);
    if (q_out && z == 0)
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) q_out[(size_t)h * head_dim + i] = qs[i];
    if (jb <= pos && pos < je) {
        float *kh = sc;   /* head_dim <= ATT_CHUNK; attn_range fills sc afterwards */
        head_norm_rope(k + (size_t)hkv * head_dim, wk, head_dim, rc, rs, neox, eps, kh, red);
        const size_t dst = (size_t)pos * kv_row + (size_t)hkv * head_dim;
        const float *vh = v + (size_t)hkv * head_dim;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
            if (F16) {
                ((uint16_t *)kc)[dst + i] = f2h(kh[i]);
                ((uint16_t *)vc)[dst + i] = f2h(vh[i]);
                if (staged) {
                    ((uint16_t *)ks)[(size_t)(pos - jb) * head_dim + i] = f2h(kh[i]);
                    ((uint16_t *)vs)[(size_t)(pos - jb) * head_dim + i] = f2h(vh[i]);
                }
            } else {
                ((float *)kc)[dst + i] = kh[i];
                ((float *)vc)[dst + i] = vh[i];
                if (staged) {
                    ((float *)ks)[(size_t)(pos - jb) * head_dim + i] = kh[i];
                    ((float *)vs)[(size_t)(pos - jb) * head_dim + i] = vh[i];
                }
            }
        }
        __syncthreads();   /* the row is visible to this block's threads */
    }
    float acc[4] = {0, 0, 0, 0};
    float run_max, run_sum;
    if (staged) {   /* the same arithmetic over the staged rows, keys renumbered from jb */
        cp_async_wait<0>();
        __syncthreads();
        attn_range<F16>(qs, ks, vs, 0, head_dim, head_dim, 0, nk, scale, NULL, NULL, 0, sc, red, acc, &run_max,
                        &run_sum);
    } else {
        attn_range<F16>(qs, kc, vc, hkv, head_dim, kv_row, jb, je, scale, NULL, NULL, 0, sc, red, acc, &run_max,
                        &run_sum);
    }
    const float *pp = part + (size_t)h * nsplit * (head_dim + 2);
    attn_part_store(part + ((size_t)h * nsplit + z) * (head_dim + 2), head_dim, run_max, run_sum, acc);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&count[h], 1) == nsplit - 1;
    __syncthreads();
    if (!last) {   /* block-uniform (shared) */
        if (CH) dep_post(dep);
        return;
    }
    __threadfence();
    const float den = attn_split_weights(pp, head_dim, nsplit, f, red);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {   /* whole warps: head_dim % 32 == 0 */
        const float val = attn_merge_dim(pp, head_dim, nsplit, f, d) / den;
        const size_t i = (size_t)h * head_dim + d;
        out[i] = val;
        q8_block_store(val, d % TG_WARP, oq.q + (i & ~(size_t)31), oq.d + i / 32, oq.s + i / 32);
    }
    if (threadIdx.x == 0) count[h] = 0;
    if (CH) dep_post(dep);
}

/* The flag chain's state (its device side: gpu_common.cuh): the counters, how many
 * launches have taken one since gk_chain_begin, and the block count of the
 * last of them (0: the next launch waits with pdl_wait). */
static struct {
    unsigned *cnt;
    int cap, n, on;
    unsigned prev_blocks;
} chain;

/* TG_GPU_CHAIN: 0 (the default) off; 1 on, the waits spinning; 2 and 3 on,
 * sleeping 32 and 128 ns between polls. */
static int chain_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("TG_GPU_CHAIN");
        on = v && v[0] >= '1' && v[0] <= '3' ? v[0] - '0' : 0;
    }
    return on;
}

int gk_chain_begin(cudaStream_t s, unsigned *cnt, int cap, tg_err *e)
{
    chain.on = 0;
    chain.n = 0;
    chain.prev_blocks = 0;
    if (!pdl_on || !chain_enabled() || !cnt || cap <= 0) return 0;
    GPU_CHECK(e, cudaMemsetAsync(cnt, 0, (size_t)cap * sizeof(unsigned), s));
    chain.cnt = cnt;
    chain.cap = cap;
    chain.on = chain_enabled();
    return 0;
}

void gk_chain_end(void)
{
    chain.on = 0;
    chain.prev_blocks = 0;
}

/* The dependency of the next launch of the stream, of blocks thread blocks:
 * in the chain while it has counters left, else none (pdl_wait, no post). */
static gk_dep chain_dep(unsigned blocks)
{
    gk_dep d = {NULL, 0, NULL, 0};
    if (!chain.on || chain.n >= chain.cap) {
        chain.prev_blocks = 0;
        return d;
    }
    if (chain.prev_blocks) {
        d.wait = chain.cnt + chain.n - 1;
        d.need = chain.prev_blocks;
    }
    d.post = chain.cnt + chain.n++;
    d.nap = chain.on == 2 ? 32 : chain.on == 3 ? 128 : 0;
    chain.prev_blocks = blocks;
    return d;
}

/* A launch outside the chain: the next one waits with pdl_wait. */
static void chain_break(void)
{
    chain.prev_blocks = 0;
}

int gk_fused_type_supported(uint32_t type)
{
    return type == TG_TYPE_Q4_K || type == TG_TYPE_Q6_K || type == TG_TYPE_Q8_0;
}

static int fz_k_ok(uint32_t type, int K)
{
    return K > 0 && K % (type == TG_TYPE_Q8_0 ? QK8_0 : QK_K) == 0;
}

int gk_rmsnorm_q8(cudaStream_t s, const float *x, const float *w, float *y, int n, float eps, gk_q8 out, tg_err *e)
{
    if (n <= 0 || n % 32) return tg_errf(e, "gpu rmsnorm_q8: n=%d: expected a positive multiple of 32", n);
    const gk_dep dep = chain_dep(n / 32);
    GPU_CHECK(e, gk_launch(dep.post ? k_rmsnorm_q8<1> : k_rmsnorm_q8<0>, n / 32, FZ_NORM_THREADS, 0, s, x, w, y, n,
                           eps, out, dep));
    return 0;
}

int gk_mv_fused(cudaStream_t s, const gk_mv_seg *segs, int nseg, int K, gk_q8 x, int accumulate, tg_err *e)
{
    if (nseg < 1 || nseg > 3) return tg_errf(e, "gpu mv_fused: %d segments: expected 1..3", nseg);
    fz_segs fs;
    fs.n = nseg;
    for (int i = 0; i < nseg; i++) {
        if (!gk_fused_type_supported(segs[i].type) || !fz_k_ok(segs[i].type, K) || segs[i].nrows <= 0)
            return tg_errf(e, "gpu mv_fused: segment %d: type %u, K=%d, %d rows: expected q4_K/q6_K with K a "
                           "multiple of 256 or q8_0 with K a multiple of 32", i, segs[i].type, K, segs[i].nrows);
        fs.s[i] = segs[i];
    }
    int stream = fz_stream_on();
    int chunk_max = 0;
    for (int i = 0; i < nseg; i++) {
        stream = stream && fz_streams(segs[i].type, K);
        if (fz_chunk_bytes(segs[i].type) > chunk_max) chunk_max = fz_chunk_bytes(segs[i].type);
    }
    if (stream) {
        /* two rows per warp where the shared memory allows (the default:
         * the two share their activation loads; 315.9 -> 322.5 decode tok/s
         * at 8b, H200, session 9, where run 5's kernels were 4.5% slower
         * with it); TG_GPU_STREAM_ROWS=1: one row per warp, =q6: one row per
         * warp only for launches with a Q6_K segment (whose 1,680-byte chunks
         * make a block's ring 54 KiB at two rows: 4 blocks an SM) */
        const int nr_env = stream_rows_env();
        const size_t lim = fz_optin ? FZ_SMEM_OPTIN : 48 * 1024;
        const int want2 = nr_env == 2 || (nr_env == 3 && chunk_max != fz_chunk_bytes(TG_TYPE_Q6_K));
        const int nr = want2 && (size_t)FZ_WARPS * 2 * FZ_STAGES * chunk_max <= lim ? 2 : 1;
        const int ring = nr * FZ_STAGES * chunk_max;
        int groups = 0;   /* of nr rows, a warp each */
        for (int i = 0; i < nseg; i++) groups += (segs[i].nrows + nr - 1) / nr;
        const int blocks_needed = (groups + FZ_WARPS - 1) / FZ_WARPS;
        const int grid = blocks_needed < 132 * 16 ? blocks_needed : 132 * 16;   /* up to 16 waves of 132 */
        const gk_dep dep = chain_dep(grid);
        void (*k)(fz_segs, int, gk_q8, int, int, gk_dep) =
            nr == 2 ? (dep.post ? k_mv_stream<2, 1> : k_mv_stream<2, 0>) : dep.post ? k_mv_stream<1, 1> : k_mv_stream<1, 0>;
        GPU_CHECK(e, gk_launch(k, grid, FZ_WARPS * TG_WARP, (size_t)FZ_WARPS * ring, s, fs, K, x, accumulate, ring, dep));
        return 0;
    }
    chain_break();
    /* the direct kernel: two rows per warp share their activation loads */
    int warps = 0;
    for (int i = 0; i < nseg; i++) warps += (segs[i].nrows + 1) / 2;
    GPU_CHECK(e, gk_launch(k_mv_fused<2>, (warps + FZ_WARPS - 1) / FZ_WARPS, FZ_WARPS * TG_WARP, 0, s, fs, K, x,
                           accumulate));
    return 0;
}

int gk_mv_swiglu(cudaStream_t s, uint32_t type, const void *Wg, const void *Wu, int n_ff, int K, gk_q8 x,
                 float *y, gk_q8 out, tg_err *e)
{
    if (!gk_fused_type_supported(type) || !fz_k_ok(type, K) || n_ff <= 0 || n_ff % 32)
        return tg_errf(e, "gpu mv_swiglu: type %u, K=%d, n_ff=%d: expected q4_K/q6_K/q8_0, K whole blocks, "
                       "n_ff a multiple of 32", type, K, n_ff);
    const int grid = n_ff / 32;
    const uint8_t *g = (const uint8_t *)Wg, *u = (const uint8_t *)Wu;
    const size_t sm = (size_t)8 * 2 * FZ_STAGES * fz_chunk_bytes(type);
    if (fz_stream_on() && fz_streams(type, K) && sm <= 48 * 1024) {
        const gk_dep dep = chain_dep(grid);
        const int ch = dep.post != NULL;
        void (*k)(const uint8_t *, const uint8_t *, int, gk_q8, float *, gk_q8, gk_dep) =
            type == TG_TYPE_Q4_K   ? (ch ? k_mv_swiglu_stream<TG_TYPE_Q4_K, 1> : k_mv_swiglu_stream<TG_TYPE_Q4_K, 0>)
            : type == TG_TYPE_Q6_K ? (ch ? k_mv_swiglu_stream<TG_TYPE_Q6_K, 1> : k_mv_swiglu_stream<TG_TYPE_Q6_K, 0>)
                                   : (ch ? k_mv_swiglu_stream<TG_TYPE_Q8_0, 1> : k_mv_swiglu_stream<TG_TYPE_Q8_0, 0>);
        GPU_CHECK(e, gk_launch(k, grid, 8 * TG_WARP, sm, s, g, u, K, x, y, out, dep));
        return 0;
    }
    chain_break();
    GPU_CHECK(e, gk_launch(type == TG_TYPE_Q4_K   ? k_mv_swiglu<TG_TYPE_Q4_K>
                           : type == TG_TYPE_Q6_K ? k_mv_swiglu<TG_TYPE_Q6_K>
                                                  : k_mv_swiglu<TG_TYPE_Q8_0>,
                           grid, 8 * TG_WARP, 0, s, g, u, K, x, y, out));
    return 0;
}

#define AD_STAGE_MAX (24 * 1024)   /* bytes of staged K and V rows a block of gk_attn_decode may take */

int gk_attn_decode(cudaStream_t s, const float *q, const float *k, const float *v, const float *wq, const float *wk,
                   int n_head, int n_head_kv, int head_dim, int n_ctx, const int32_t *pos0, float base, int neox,
                   float eps, void *kc, void *vc, int kv_f16, float *out, gk_q8 oq, float *q_out, void *scratch,
                   tg_err *e)
{
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 || head_dim % 32 ||
        head_dim > 4 * ATT_THREADS || !scratch)
        return tg_errf(e, "gpu attn_decode: n_head=%d n_head_kv=%d head_dim=%d: expected n_head a multiple of "
                       "n_head_kv, head_dim a multiple of 32 up to %d, and scratch", n_head, n_head_kv, head_dim,
                       4 * ATT_THREADS);
    const int nsplit = att_splits();
    const float scale = 1.0f / sqrtf((float)head_dim);
    const float theta_scale = powf(base, -2.0f / (float)head_dim);
    float *part = (float *)scratch;
    int *count = (int *)((uint8_t *)scratch + att_part_bytes(n_head, head_dim));
    /* the longest key range at a context of n_ctx, staged when it fits */
    const size_t rowb = (size_t)head_dim * (kv_f16 ? 2 : 4);
    const int per_max = n_ctx > 0 ? (n_ctx + nsplit - 1) / nsplit : 0;
    const int stage_keys = 2 * per_max * rowb <= AD_STAGE_MAX ? per_max : 0;
    const size_t shm = (size_t)head_dim * sizeof(float) + 2 * (size_t)stage_keys * rowb;
    const gk_dep dep = chain_dep(n_head * nsplit);
    const int ch = dep.post != NULL;
    GPU_CHECK(e, gk_launch(kv_f16 ? (ch ? k_attn_decode<1, 1> : k_attn_decode<1, 0>)
                                  : (ch ? k_attn_decode<0, 1> : k_attn_decode<0, 0>),
                           dim3(n_head, nsplit), ATT_THREADS, shm, s, q, k, v, wq, wk, n_head, n_head_kv, head_dim,
                           pos0, theta_scale, neox, eps, kc, vc, scale, part, count, out, oq, q_out, stage_keys,
                           dep));
    return 0;
}

/* ---- the settings in force --------------------------------------------------- */

void gk_describe(char *buf, size_t n)
{
    const int rows = stream_rows_env();
    const int tc = tc_enabled() && tc_ready;
#ifdef TG_GPU_HIP
    const int att_tc = 0;
    const char *tile = "";
#else
    const int att_tc = at_tc_enabled() && tc_ready;
    char tile[64] = "";
    if (tc && tc2_enabled() && n_sm > 0)
        if (tc2_small)
            snprintf(tile, sizeof tile, "pipelined f16 128x128 (%s under %d waves)",
                     tc2_small == 1 ? "64x128" : "128x64", tc2_thresh);
        else
            snprintf(tile, sizeof tile, "pipelined f16 128x128");
    else if (tc)
        snprintf(tile, sizeof tile, "128x128");
#endif
    const int ch = pdl_on ? chain_enabled() : 0;
    snprintf(buf, n, "%s mat-vec, %s%s%s prefill, %s prompt attention, %d attention splits, %s mat-vec%s, top-k %s%s%s",
             mv_q8_enabled() ? "8-bit" : "f32", tc ? "tensor-core" : "cuda-core", tc ? " " : "", tile,
             att_tc ? "tensor-core" : "cuda-core", att_splits(), fz_stream_on() ? "streamed" : "direct",
             !fz_stream_on() ? "" : rows == 2 ? " 2 rows/warp" : rows == 3 ? " 1 row/warp (q6), else 2" : " 1 row/warp",
             topk_bound_on() ? "maxima bound" : "chunk bound", pdl_early ? ", PDL early" : "",
             ch == 1 ? ", flag chain" : ch == 2 ? ", flag chain (32 ns naps)" : ch == 3 ? ", flag chain (128 ns naps)" : "");
}
