/*
 * gpu.h: the GPU arm, the C API tg-engine calls for `--tier gpu`.
 *
 * A tg_gpu holds one model's weights in device memory (uploaded once at
 * tg_gpu_new with plain device allocations, never managed memory), a KV
 * cache, activation buffers and the op counters of one sequence. The forward
 * pass is docs/formats.md's, entirely on the device: embedding lookup, RMSNorm,
 * matmuls over the file's weight types, RoPE, attention, SwiGLU, residual
 * adds, the output projection, then top-k selection and the XXH3-64 digest
 * of the logits. Only the top-k entries and the digest cross to the host per
 * step; the logits stay on the device unless tg_gpu_logits() asks for them.
 * A single-token step runs as a replayed CUDA graph (no launch gaps).
 *
 * Every op is counted in a tg_ops under TG_TIER_GPU. Nothing falls back to a
 * host tier: a weight type the device kernels do not serve makes
 * tg_gpu_new() fail, so a run either counts only device ops or does not
 * start. The same sources build with nvcc (CUDA) and hipcc (ROCm).
 *
 * Built only by engine/gpu/gpu.mk (`make gpu`, `make hip`); a tg-engine
 * without the GPU objects answers --tier gpu with an error.
 */
#ifndef TG_GPU_H
#define TG_GPU_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../model.h"
#include "../ops.h"
#include "../util.h"

typedef struct tg_gpu tg_gpu;

typedef struct tg_gpu_opts {
    int device;      /* device index; 0 default */
    int kv_f32;      /* F32 instead of F16 KV cache */
    int n_ctx;       /* KV cache positions; 0: min(n_ctx_train, 4096) */
    int n_batch;     /* tokens per prefill batch; 0: 256 */
    int no_graph;    /* 1: launch kernels one by one also for single-token steps */
} tg_gpu_opts;

/* Defaults: device 0, F16 KV cache, graphs on. */
tg_gpu_opts tg_gpu_opts_default(void);

/* Whether a usable GPU is present: returns 0 and writes "NVIDIA H200,
 * sm_90, 139 GiB" style text into desc, or -1 with e saying why not (no
 * runtime, no device). Never aborts. */
int tg_gpu_probe(int device, char *desc, size_t n, tg_err *e);

/* Uploads m's weights and allocates the cache and buffers. m must outlive
 * the tg_gpu only until this call returns (the device holds its own copy).
 * Returns 0 and *out, or -1 with e (no device, a weight type the GPU
 * kernels do not serve, out of device memory; each names the tensor or
 * call). */
int tg_gpu_new(tg_gpu **out, const tg_model *m, const tg_gpu_opts *o, tg_err *e);
void tg_gpu_free(tg_gpu *g);   /* NULL is a no-op */

/* Empties the KV cache (position 0); counters are kept. */
void tg_gpu_reset(tg_gpu *g);
int tg_gpu_pos(const tg_gpu *g);
int tg_gpu_n_ctx(const tg_gpu *g);
int tg_gpu_n_vocab(const tg_gpu *g);

/* Evaluates n >= 1 tokens at the next positions (prefill in batches of
 * n_batch) and keeps the last token's logits on the device. When top_k > 0,
 * writes the top_k largest logits into top[0..top_k-1] (descending, ties by
 * lower id, top[0] the greedy argmax) and, when digest is not NULL, the
 * XXH3-64 hex of the f32 logits into digest[17]; both computed on the
 * device. top_k at most min(n_vocab, 256). Returns 0, or -1 with e (a token
 * id out of range, the context full, a runtime failure); on failure the
 * position is unchanged. */
int tg_gpu_eval(tg_gpu *g, const int32_t *tokens, int n, int top_k, tg_top *top,
                char digest[17], tg_err *e);

/* Copies the last logits (n_vocab floats) to out, for dumps. Returns 0 or
 * -1 with e. */
int tg_gpu_logits(tg_gpu *g, float *out, tg_err *e);

/* Dumps: while fn is set, evals copy the last token's activations after
 * every stage of every layer and the logits to the host and call fn (see
 * model.h tg_dump_fn); steps then run without the graph. NULL turns dumps
 * off. */
void tg_gpu_set_dump(tg_gpu *g, tg_dump_fn fn, void *ud);

/* Bytes of weights on the device (what a decode step must read). */
size_t tg_gpu_weight_bytes(const tg_gpu *g);

/* With TG_GPU_PROFILE=1 in the environment at tg_gpu_new, single-token
 * steps run without a graph and time each launch of the fused path with
 * CUDA events; this prints the totals per kernel (microseconds per step) to
 * f and clears them. Without it, prints nothing. */
void tg_gpu_profile_report(tg_gpu *g, FILE *f);
/* Measures the device's copy bandwidth (a large device-to-device copy,
 * bytes read plus written per second) into *bytes_per_s, for roofline
 * figures. Returns 0 or -1 with e. */
int tg_gpu_bandwidth(int device, double *bytes_per_s, tg_err *e);

/* Op counters (all under TG_TIER_GPU) since tg_gpu_new. */
tg_ops *tg_gpu_ops(tg_gpu *g);
/* "NVIDIA H200, sm_90, 139 GiB, graphs" style text. */
const char *tg_gpu_device(const tg_gpu *g);

#ifdef __cplusplus
}
#endif
#endif
