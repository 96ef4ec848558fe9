/*
 * gpu.h: what the GPU tier offers beyond the tier interface, for the GPU
 * tests and the benchmark. Sessions of the gpu tier are made and run like
 * every other (engine/model.h: tg_session_new with opts.tier = TG_TIER_GPU;
 * engine/tier.h: the table tg_tier_gpu, in gpu.cu).
 *
 * The gpu tier holds one model's weights in device memory (uploaded once
 * at tg_session_new with plain device allocations, never managed memory), a
 * KV cache, activation buffers, and runs the forward pass of docs/formats.md entirely
 * on the device: embedding lookup, RMSNorm, matmuls over the file's weight
 * types, RoPE, attention, SwiGLU, residual adds, the output projection,
 * then top-k selection and the XXH3-64 digest of the logits
 * (tg_session_set_top / tg_session_top). Only the top-k entries and the
 * digest cross to the host per step; the logits stay on the device unless
 * tg_session_logits asks for them. A single-token step runs as a replayed
 * CUDA graph (no launch gaps) unless opts.no_graph.
 *
 * Every op is counted under TG_TIER_GPU. Nothing falls back to a host
 * tier: a weight type the device kernels do not serve makes tg_session_new
 * fail, so a run either counts only device ops or does not start. The same
 * sources build with nvcc (CUDA) and hipcc (ROCm); only programs linked
 * with these objects (engine/gpu/gpu.mk: `make gpu`, `make hip`) have the
 * tier.
 */
#ifndef TG_GPU_H
#define TG_GPU_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../tier.h"

/* Whether a usable GPU is present: returns 0 and writes "NVIDIA H200,
 * sm_90, 139 GiB" style text into desc, or -1 with e saying why not (no
 * runtime, no device). Never aborts. */
int tg_gpu_probe(int device, char *desc, size_t n, tg_err *e);

/* Bytes of weights on the device (what a decode step must read) of a
 * gpu-tier session; 0 for a session of another tier. */
size_t tg_gpu_weight_bytes(const tg_session *s);

/* With TG_GPU_PROFILE=1 in the environment at tg_session_new, single-token
 * steps of a gpu-tier session run without a graph and time each launch of
 * the fused path with CUDA events; this prints the totals per kernel
 * (microseconds per step) to f and clears them. Otherwise (or for another
 * tier's session) prints nothing. */
void tg_gpu_profile_report(tg_session *s, FILE *f);

/* Measures the device's copy bandwidth (a large device-to-device copy,
 * bytes read plus written per second) into *bytes_per_s, for roofline
 * figures. Returns 0 or -1 with e. */
int tg_gpu_bandwidth(int device, double *bytes_per_s, tg_err *e);

#ifdef __cplusplus
}
#endif
#endif
