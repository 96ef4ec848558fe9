/*
 * edge_gpu.cu: what a dependency edge between two launches costs in a
 * graph-replayed chain shaped like a decode step, under the three ways the
 * fused path can order its launches. A diagnostic, not a test: it never
 * fails on a slow figure.
 *
 * The chain is 36 "layers" of 7 launches with the decode step's block
 * counts (a norm of 128 blocks, q/k/v 768, attention 1,024, o 512, a norm,
 * gate/up 1,152, down 512). Each block of a weight-carrying launch reads its
 * slice of that launch's weight bytes of the 8b file (14.7, 9.4, 56.6 and
 * 34.8 MB; every launch its own buffer, 4.2 GB a step, so nothing is served
 * from L2), the first 16 KiB of it copied to shared memory before the block
 * waits, as the streamed mat-vecs do; after the wait it reads 32 values (a
 * norm: all 4,096) that the previous launch wrote and writes 32 of its own.
 * The orderings:
 *   plain   launches in stream order, no PDL
 *   pdl     PDL with the early trigger, griddepcontrol.wait (the default)
 *   chain   PDL with the early trigger, the wait on a counter that the
 *           previous launch's blocks bump as they finish (TG_GPU_CHAIN)
 * each with the weights ("x1") and without them ("x0": the edges alone).
 * Printed: the step's time (the fastest of 5 rounds of 20 replays), its
 * time a launch, and the weight bandwidth.
 *
 * Usage: edge_gpu. Without a GPU, below sm_90 or under HIP it says SKIP.
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>

#include "gpu/gpu_common.cuh"

#ifdef TG_GPU_HIP
int main(void)
{
    printf("SKIP: edge_gpu times programmatic dependent launch (CUDA, sm_90)\n");
    return 0;
}
#else

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t rc_ = (call);                                                                  \
        if (rc_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "edge_gpu: %s failed: %s (line %d)\n", #call, cudaGetErrorString(rc_), \
                    __LINE__);                                                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { ORDER_PLAIN, ORDER_PDL, ORDER_CHAIN };

struct edge_launch {
    const uint8_t *w;    /* this launch's weight bytes (NULL: none) */
    size_t bytes;
    const float *in;     /* 4,096 values the previous launch wrote */
    float *out;          /* 4,096 values */
    gk_dep dep;          /* ORDER_CHAIN: the previous launch's counter and this one's */
    int order, norm;
};

__device__ __forceinline__ float block_total(float v, float *sh)
{
    v = warp_sum(v);
    if (threadIdx.x % TG_WARP == 0) sh[threadIdx.x / TG_WARP] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < (int)(blockDim.x / TG_WARP); i++) t += sh[i];
    __syncthreads();
    return t;
}

__global__ void __launch_bounds__(128) k_edge(edge_launch p)
{
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ float sh[32];
    if (p.order != ORDER_PLAIN) pdl_trigger();
    const size_t per = p.w ? p.bytes / gridDim.x / 16 * 16 : 0;
    const uint8_t *mine = p.w ? p.w + per * blockIdx.x : NULL;
    const size_t pre = per < 16384 ? per : 16384;
    for (size_t i = threadIdx.x * 16; i < pre; i += blockDim.x * 16) {
        const unsigned sa = (unsigned)__cvta_generic_to_shared(sm + i);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(mine + i) : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    dep_wait_block(p.dep);   /* pdl_wait unless chained (a no-op in a plain launch) */
    float acc = 0.0f;
    if (p.norm)
        for (int i = threadIdx.x; i < 4096; i += blockDim.x) acc += p.in[i] * p.in[i];
    else if (threadIdx.x < 32)
        acc = p.in[(blockIdx.x * 32 + threadIdx.x) % 4096];
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    unsigned s = 0;
    for (size_t i = threadIdx.x * 16; i < pre; i += blockDim.x * 16) {
        const uint4 v = *(const uint4 *)(sm + i);
        s += v.x ^ v.y ^ v.z ^ v.w;
    }
    for (size_t i = pre + threadIdx.x * 16; i < per; i += blockDim.x * 16) {
        const uint4 v = __ldcs((const uint4 *)(mine + i));
        s += v.x ^ v.y ^ v.z ^ v.w;
    }
    acc += (float)(s & 1) * 1e-30f;
    acc = block_total(acc, sh);
    if (threadIdx.x < 32) p.out[(blockIdx.x * 32 + threadIdx.x) % 4096] = acc * 1e-6f + 1.0f;
    dep_post(p.dep);
}

int main(void)
{
    int ndev = 0, dev = 0, major = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIP: no GPU\n");
        return 0;
    }
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9) {
        printf("SKIP: programmatic dependent launch needs sm_90\n");
        return 0;
    }
    enum { LAYERS = 36, PER = 7, NK = LAYERS * PER };
    static const struct { int blocks; double mb; int norm; } shape[PER] = {
        {128, 0, 1}, {768, 14.7, 0}, {1024, 0, 0}, {512, 9.4, 0}, {128, 0, 1}, {1152, 56.6, 0}, {512, 34.8, 0}};
    size_t total = 0;
    for (int i = 0; i < PER; i++) total += (size_t)(shape[i].mb * 1e6);
    total *= LAYERS;
    uint8_t *W;
    float *act;
    unsigned *cnt;
    CK(cudaMalloc(&W, total));
    CK(cudaMemset(W, 1, total));
    CK(cudaMalloc(&act, 2 * 4096 * sizeof(float)));
    CK(cudaMemset(act, 0, 2 * 4096 * sizeof(float)));
    CK(cudaMalloc(&cnt, NK * sizeof(unsigned)));
    CK(cudaFuncSetAttribute(k_edge, cudaFuncAttributeMaxDynamicSharedMemorySize, 16384));
    cudaStream_t st;
    cudaEvent_t a, b;
    CK(cudaStreamCreate(&st));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    static const char *names[3] = {"plain", "pdl", "chain"};
    for (int weights = 1; weights >= 0; weights--)
        for (int order = ORDER_PLAIN; order <= ORDER_CHAIN; order++) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            CK(cudaMemsetAsync(cnt, 0, NK * sizeof(unsigned), st));
            size_t off = 0;
            for (int i = 0; i < NK; i++) {
                edge_launch p;
                const size_t bytes = weights ? (size_t)(shape[i % PER].mb * 1e6) : 0;
                p.w = bytes ? W + off : NULL;
                p.bytes = bytes;
                off += bytes;
                p.in = act + (i % 2) * 4096;
                p.out = act + ((i + 1) % 2) * 4096;
                p.dep.wait = NULL;
                p.dep.need = 0;
                p.dep.post = NULL;
                p.dep.nap = 0;
                if (order == ORDER_CHAIN) {
                    if (i) {   /* the first launch follows the memset in stream order */
                        p.dep.wait = cnt + i - 1;
                        p.dep.need = shape[(i - 1) % PER].blocks;
                    }
                    p.dep.post = cnt + i;
                }
                p.order = order;
                p.norm = shape[i % PER].norm;
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.gridDim = shape[i % PER].blocks;
                cfg.blockDim = 128;
                cfg.dynamicSmemBytes = 16384;
                cfg.stream = st;
                cfg.attrs = at;
                cfg.numAttrs = order != ORDER_PLAIN && i ? 1 : 0;
                CK(cudaLaunchKernelEx(&cfg, k_edge, p));
            }
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(ge, st));
            CK(cudaStreamSynchronize(st));
            float best = 1e30f;
            for (int t = 0; t < 5; t++) {
                const int reps = 20;
                float ms = 0.0f;
                CK(cudaEventRecord(a, st));
                for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(ge, st));
                CK(cudaEventRecord(b, st));
                CK(cudaEventSynchronize(b));
                CK(cudaEventElapsedTime(&ms, a, b));
                if (ms / reps < best) best = ms / reps;
            }
            unsigned h[NK];
            CK(cudaMemcpy(h, cnt, sizeof h, cudaMemcpyDeviceToHost));
            int bad = 0;
            if (order == ORDER_CHAIN)
                for (int i = 0; i < NK; i++) bad += h[i] != (unsigned)shape[i % PER].blocks;
            printf("edge_gpu weights x%d %-5s step %8.1f us, %5.2f us a launch, %6.0f GB/s%s\n", weights,
                   names[order], best * 1e3f, best * 1e3f / NK, weights ? total / (best * 1e-3) / 1e9 : 0.0,
                   bad ? " (counters wrong)" : "");
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
    return 0;
}
#endif
