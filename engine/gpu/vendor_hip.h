/*
 * vendor_hip.h: the single rename header that lets the CUDA-spelled GPU
 * sources of engine/gpu/ build with hipcc for AMD GPUs (as ggml's
 * vendors/hip.h does). Only spellings live here; real hardware differences
 * (warp size 32 vs 64) are named helpers in gpu_common.cuh.
 *
 * Included by gpu_common.cuh when TG_GPU_HIP is defined (gpu.mk's `hip`
 * target defines it); never include it directly.
 */
#ifndef TG_GPU_VENDOR_HIP_H
#define TG_GPU_VENDOR_HIP_H

#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bfloat16.h>

#define cudaError_t                    hipError_t
#define cudaSuccess                    hipSuccess
#define cudaGetErrorString             hipGetErrorString
#define cudaGetLastError               hipGetLastError
#define cudaGetDeviceCount             hipGetDeviceCount
#define cudaGetDeviceProperties        hipGetDeviceProperties
#define cudaDeviceProp                 hipDeviceProp_t
#define cudaSetDevice                  hipSetDevice
#define cudaGetDevice                  hipGetDevice
#define cudaDeviceSynchronize          hipDeviceSynchronize
#define cudaMalloc                     hipMalloc
#define cudaMallocHost                 hipHostMalloc
#define cudaFree                       hipFree
#define cudaFreeHost                   hipHostFree
#define cudaMemcpy                     hipMemcpy
#define cudaMemcpyAsync                hipMemcpyAsync
#define cudaMemset                     hipMemset
#define cudaMemsetAsync                hipMemsetAsync
#define cudaMemGetInfo                 hipMemGetInfo
#define cudaMemcpyHostToDevice         hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost         hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice       hipMemcpyDeviceToDevice
#define cudaStream_t                   hipStream_t
#define cudaStreamCreate               hipStreamCreate
#define cudaStreamCreateWithFlags      hipStreamCreateWithFlags
#define cudaStreamNonBlocking          hipStreamNonBlocking
#define cudaStreamDestroy              hipStreamDestroy
#define cudaStreamSynchronize          hipStreamSynchronize
#define cudaStreamBeginCapture         hipStreamBeginCapture
#define cudaStreamEndCapture           hipStreamEndCapture
#define cudaStreamCaptureModeRelaxed   hipStreamCaptureModeRelaxed
#define cudaGraph_t                    hipGraph_t
#define cudaGraphExec_t                hipGraphExec_t
#define cudaGraphInstantiate(e, g, f)  hipGraphInstantiate((e), (g), NULL, NULL, 0)
#define cudaGraphLaunch                hipGraphLaunch
#define cudaGraphDestroy               hipGraphDestroy
#define cudaGraphExecDestroy           hipGraphExecDestroy
#define cudaEvent_t                    hipEvent_t
#define cudaEventCreate                hipEventCreate
#define cudaEventDestroy               hipEventDestroy
#define cudaEventRecord                hipEventRecord
#define cudaEventSynchronize           hipEventSynchronize
#define cudaEventElapsedTime           hipEventElapsedTime
#define cudaEventCreateWithFlags       hipEventCreateWithFlags
#define cudaEventDisableTiming         hipEventDisableTiming
#define cudaStreamWaitEvent            hipStreamWaitEvent
#define cudaFuncSetAttribute           hipFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor

#define __nv_bfloat16                  hip_bfloat16

#endif
