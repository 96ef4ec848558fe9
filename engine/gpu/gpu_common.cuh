/*
 * gpu_common.cuh: what every CUDA-spelled source of the GPU arm shares: the
 * runtime headers (CUDA, or HIP through vendor_hip.h), the check macro that
 * wraps every runtime call, and the named helpers for real hardware
 * differences: a "logical warp" of 32 lanes (a 64-wide AMD wavefront runs two
 * of them; shuffles are issued with width 32), and half/bf16 bit conversions.
 *
 * Error convention: a failed runtime call is an environment failure, not a
 * programming error; GPU_CHECK(e, call) writes one sentence naming the call,
 * the function, the file and the line into the tg_err e and makes the
 * enclosing function return -1.
 */
#ifndef TG_GPU_COMMON_CUH
#define TG_GPU_COMMON_CUH

#ifdef TG_GPU_HIP
#include "vendor_hip.h"
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#endif

#include <stdint.h>
extern "C" {
#include "../util.h"
}
#include "../quant.h"

/* Wraps a runtime call; on failure fills e and returns -1 from the caller. */
#define GPU_CHECK(e, call)                                                      \
    do {                                                                        \
        cudaError_t gpu_rc_ = (call);                                           \
        if (gpu_rc_ != cudaSuccess)                                             \
            return tg_errf((e), "GPU call %s failed: %s (in %s, %s:%d)", #call, \
                           cudaGetErrorString(gpu_rc_), __func__, __FILE__,     \
                           __LINE__);                                           \
    } while (0)

/* After a kernel launch: the launch's own error (bad configuration). */
#define GPU_CHECK_LAUNCH(e, what) GPU_CHECK(e, cudaGetLastError())

/* Lanes of the logical warp every kernel is written for. */
#define TG_WARP 32

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = TG_WARP / 2; o > 0; o >>= 1)
#ifdef TG_GPU_HIP
        v += __shfl_xor(v, o, TG_WARP);
#else
        v += __shfl_xor_sync(0xffffffffu, v, o, TG_WARP);
#endif
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = TG_WARP / 2; o > 0; o >>= 1)
#ifdef TG_GPU_HIP
        v = fmaxf(v, __shfl_xor(v, o, TG_WARP));
#else
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, TG_WARP));
#endif
    return v;
}

/* Orders the shared-memory accesses of the lanes of one logical warp
 * (a wavefront barrier with a work-group fence on AMD, where Debian's HIP
 * has no __syncwarp). */
__device__ __forceinline__ void warp_sync(void)
{
#ifdef TG_GPU_HIP
    __threadfence_block();
    __builtin_amdgcn_wave_barrier();
#else
    __syncwarp();
#endif
}

/* Programmatic dependent launch (sm_90 and up; nothing elsewhere). A kernel
 * of the fused decode path may be launched before the previous kernel of its
 * stream has finished (gk_launch with PDL on): it calls pdl_trigger() first,
 * so that the next kernel may be scheduled as this one's blocks drain
 * (unless pdl_early_c is off), does
 * only what reads constant data (the first weight copies of a mat-vec), and
 * calls pdl_wait() before it reads anything an earlier kernel wrote or writes
 * anything at all. pdl_wait() returns once the previous kernel has completed
 * and its memory is visible; since every such kernel waits, completion stays
 * ordered along the whole stream. Without the launch attribute both are
 * no-ops. */
__device__ __forceinline__ void pdl_wait(void)
{
#if !defined(TG_GPU_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* 1: pdl_trigger() lets the next kernel start at once (TG_GPU_PDL=1); 0:
 * it does nothing, and the next kernel is started as this one's blocks exit
 * (TG_GPU_PDL=2: the launch still overlaps, the waiting blocks of the next
 * kernel no longer hold SM resources while this one runs). Set by gk_init. */
static __constant__ int pdl_early_c = 1;

__device__ __forceinline__ void pdl_trigger(void)
{
#if !defined(TG_GPU_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (pdl_early_c) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* A flag chain between launches (TG_GPU_CHAIN for the fused step, kernels.cu;
 * edge_gpu times it). Under PDL a kernel's pdl_wait returns once the whole previous grid has
 * completed and its memory is flushed. In a flag chain (gk_chain_begin) each
 * thread block of a launch instead adds 1 to the launch's counter when it is
 * done (after a fence, with release semantics), and the next launch's warps
 * wait until that counter holds the previous launch's block count (an
 * acquire load, which also drops the multiprocessor's L1 lines). Every block
 * waits before it posts, so a counter that is full means every earlier
 * launch of the chain is done too. The next launch is still started by PDL
 * only once every block of this one has started (pdl_trigger at the top), so
 * the blocks being waited on are resident or done: the wait cannot starve
 * them. wait NULL: the previous launch is not in the chain (pdl_wait). */
typedef struct {
    const unsigned *wait;
    unsigned need;
    unsigned *post;
    int nap;   /* ns to sleep between polls (0: spin) */
} gk_dep;

__device__ __forceinline__ void dep_spin(const gk_dep &d)
{
#if !defined(TG_GPU_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned v;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(d.wait) : "memory");
        if (v >= d.need) break;
        if (d.nap) __nanosleep(d.nap);
    }
#endif
}

/* Every lane of the calling warp calls it. */
__device__ __forceinline__ void dep_wait_warp(const gk_dep &d)
{
    if (!d.wait) {
        pdl_wait();
        return;
    }
    if (threadIdx.x % TG_WARP == 0) dep_spin(d);
    warp_sync();
}

/* Every thread of the block calls it. */
__device__ __forceinline__ void dep_wait_block(const gk_dep &d)
{
    if (!d.wait) {
        pdl_wait();
        return;
    }
    if (threadIdx.x == 0) dep_spin(d);
    __syncthreads();
}

/* Every thread of the block calls it, after its last store. */
__device__ __forceinline__ void dep_post(const gk_dep &d)
{
#if !defined(TG_GPU_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!d.post) return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(d.post) : "memory");
    }
#endif
}

/* Loads what other thread blocks of the same kernel wrote (after their
 * __threadfence; a partial result merged by the last block to finish):
 * through L2, never a stale line of this multiprocessor's L1 (volatile
 * loads on HIP, where __ldcg is missing). */
__device__ __forceinline__ float ld_l2(const float *p)
{
#ifdef TG_GPU_HIP
    return *(const volatile float *)p;
#else
    return __ldcg(p);
#endif
}

__device__ __forceinline__ float4 ld_l2(const float4 *p)
{
#ifdef TG_GPU_HIP
    const volatile float *f = (const volatile float *)p;
    return make_float4(f[0], f[1], f[2], f[3]);
#else
    return __ldcg(p);
#endif
}

template <typename T>
__device__ __forceinline__ T warp_shfl_xor(T v, int o)
{
#ifdef TG_GPU_HIP
    return __shfl_xor(v, o, TG_WARP);
#else
    return __shfl_xor_sync(0xffffffffu, v, o, TG_WARP);
#endif
}

/* IEEE binary16 bits -> f32 (exact). */
__device__ __forceinline__ float h2f(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

/* f32 -> binary16 bits, round to nearest even (as the CPU tiers store the
 * F16 KV cache). */
__device__ __forceinline__ uint16_t f2h(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}

/* bfloat16 bits -> f32 (exact). */
__device__ __forceinline__ float bf2f(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

#endif
