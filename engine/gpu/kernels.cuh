/*
 * kernels.cuh: the GPU arm's kernels, one launcher per op. Each launcher
 * enqueues its kernel(s) on stream s and returns 0, or -1 with e naming the
 * op and what was wrong (an unsupported type or shape, a launch failure).
 * Nothing here synchronizes or allocates: every buffer is the caller's,
 * device memory unless said otherwise, and may be captured in a CUDA graph.
 *
 * Layouts: activations are f32, row-major, one row per token. Weights are
 * GGUF tensors as uploaded (row r of a [K, nrows] weight is nrows rows of K
 * values, tg_row_size(type, K) bytes each). Positions that change from step
 * to step are read from device memory (pos0) so a captured graph replays.
 */
#ifndef TG_GPU_KERNELS_CUH
#define TG_GPU_KERNELS_CUH

#include "gpu_common.cuh"

/* Largest top-k the device selection serves. */
#define TG_GPU_MAX_TOPK 256

/* Scratch bytes gk_topk needs for n logits and k entries. */
size_t gk_topk_scratch(int n, int k);
/* Scratch bytes gk_xxh3 needs for len input bytes. */
size_t gk_xxh3_scratch(size_t len);

/* Whether gk_matmul / gk_get_rows serve this weight type. */
int gk_type_supported(uint32_t type);

/* y[c][r] = dot(W row r, x[c]) for c < ncols, r < nrows.
 * W: [K, nrows] of type; x: [ncols][K] f32; y: [ncols][nrows] f32.
 * K must be a multiple of the type's block size. Any ncols (on tensor cores
 * where gk_matmul_tc says so, else in chunks of up to 8 columns that share
 * each weight read). */
int gk_matmul(cudaStream_t s, uint32_t type, const void *W, int nrows, int K,
              const float *x, int ncols, float *y, tg_err *e);

/* gk_matmul on its plain f32 kernel whatever the shape (weights
 * dequantized to f32, x as given, products summed in f32; never the 8-bit or
 * tensor-core paths below): the numerics the gpu tier declares for its
 * hooked evals (replay, perturbations; docs/protocol.md). */
int gk_matmul_plain(cudaStream_t s, uint32_t type, const void *W, int nrows, int K,
                    const float *x, int ncols, float *y, tg_err *e);

/* One weight of gk_matmul_group: y (ncols, nrows) = W x. */
typedef struct {
    uint32_t type;
    const void *W;
    int nrows;
    float *y;
} gk_mm_seg;

/* gk_matmul for up to 3 weights of one input x (q, k and v; gate and up).
 * Where every weight's call would run on tensor cores (gk_matmul_tc) and
 * x16 is not NULL (scratch of ncols * K f16 values), x is rounded to f16
 * into x16 once (x16_ready: the kernel that wrote x wrote x16 too, as
 * gk_rmsnorm16 and gk_swiglu16 do) and each run of weights of one type is one launch of the
 * pipelined tile (unless TG_GPU_TC2=0): the same numerics, and the same
 * bits, as gk_matmul. Otherwise one gk_matmul each. */
int gk_matmul_group(cudaStream_t s, const gk_mm_seg *segs, int nseg, int K, const float *x, int ncols, void *x16,
                    int x16_ready, tg_err *e);

/* Whether gk_matmul_group runs a weight of this type on the f16 tile (so
 * that, given x16 ready, it never reads the f32 x). */
int gk_matmul_group_f16(uint32_t type, int K, int ncols);

/* silu(Wg x) * (Wu x) for ncols tokens, rounded to f16 into y16 (ncols x
 * nrows), from x16 (ncols x K f16, as gk_rmsnorm16 writes it): gate and up
 * in one launch of the f16 tile, the SwiGLU in its epilogue; the same bits
 * as gk_matmul_group of gate and up then gk_swiglu16's y16. Only where
 * gk_matmul_swiglu_ok (the tile serves the type, unless
 * TG_GPU_TC2_SWIGLU=0); otherwise an error. */
int gk_matmul_swiglu_ok(uint32_t type, int K, int ncols);
int gk_matmul_swiglu(cudaStream_t s, uint32_t type, const void *Wg, const void *Wu, int nrows, int K, const void *x16,
                     int ncols, void *y16, tg_err *e);

/* Whether gk_matmul quantizes x to 8 bits for this call (single-token Q4_K
 * and Q6_K mat-vecs, unless TG_GPU_MMVQ=0): then, per 32 values of x,
 * d = max|x| / 127 (f32 division), q = round-half-even(x / d) (0 when d is
 * 0), and y is the dot product with x' = d * q, up to f32 rounding. */
int gk_matmul_q8(uint32_t type, int K, int ncols);

/* Whether gk_matmul multiplies on tensor cores for this call (CUDA, after
 * gk_init, at least 16 columns, K a multiple of 256, unless TG_GPU_TC=0):
 * then weights and x are rounded to f16 and the products summed in f32. */
int gk_matmul_tc(uint32_t type, int K, int ncols);

/* y[t] = row ids[t] of W, dequantized. W: [K, nrows]; ids: n device ints,
 * each < nrows (not checked on the device: the caller checks on the host);
 * y: [n][K] f32. */
int gk_get_rows(cudaStream_t s, uint32_t type, const void *W, int K,
                const int32_t *ids, int n, float *y, tg_err *e);

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for r < nrows; rows of n.
 * Whole vector: nrows = tokens; per head: rows of head_dim, nrows =
 * tokens * heads. y may equal x. */
int gk_rmsnorm(cudaStream_t s, const float *x, const float *w, float *y,
               int nrows, int n, float eps, tg_err *e);
/* x += t (nrows rows of n), then gk_rmsnorm16 over the new x, in one pass:
 * the same bits as gk_add then gk_rmsnorm16. y must not alias x or t. */
int gk_add_rmsnorm16(cudaStream_t s, float *x, const float *t, const float *w, float *y, void *y16, int nrows, int n,
                     float eps, tg_err *e);

/* gk_rmsnorm that also stores y rounded to f16 into y16 (when not NULL:
 * nrows * n values), for gk_matmul_group's x16. */
int gk_rmsnorm16(cudaStream_t s, const float *x, const float *w, float *y, void *y16, int nrows, int n, float eps,
                 tg_err *e);

/* A prompt's per-head q and k RMSNorm (weights wq, wk), RoPE, and k and v
 * appended to the cache, in one launch: the same bits as gk_rmsnorm over
 * the heads of q and of k, gk_rope of each, then gk_kv_store. q and k are
 * normed and rotated in place; v is read only. */
int gk_qk_norm_rope_store(cudaStream_t s, float *q, float *k, const float *v, const float *wq, const float *wk,
                          int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t *pos0, float base,
                          int neox, float eps, void *kc, void *vc, int kv_f16, tg_err *e);

/* In-place rotary embedding of x: [n_tok][n_head][head_dim]; token t is at
 * position *pos0 + t. neox: pairs (i, i + head_dim/2); else adjacent pairs
 * (2i, 2i+1). Angle pos * base^(-2i/head_dim). */
int gk_rope(cudaStream_t s, float *x, int n_tok, int n_head, int head_dim,
            const int32_t *pos0, float base, int neox, tg_err *e);

/* Appends k and v ([n_tok][row] f32) to the caches at rows *pos0 + t.
 * kc, vc: [n_ctx][row] of f16 (kv_f16) or f32. */
int gk_kv_store(cudaStream_t s, const float *k, const float *v, void *kc,
                void *vc, int kv_f16, int n_tok, int row, const int32_t *pos0,
                tg_err *e);

/* Causal attention of n_tok queries at positions *pos0 + t over the cache.
 * q, out: [n_tok][n_head][head_dim] f32; kc, vc: [n_ctx][n_head_kv][head_dim].
 * Query head h reads kv head h / (n_head / n_head_kv); scores scaled by
 * 1/sqrt(head_dim); softmax with max subtraction. *pos0 + n_tok <= n_ctx
 * is the caller's promise (checked on the host). */
int gk_attention(cudaStream_t s, const float *q, const void *kc, const void *vc,
                 int kv_f16, float *out, int n_tok, int n_head, int n_head_kv,
                 int head_dim, int n_ctx, const int32_t *pos0, void *scratch, tg_err *e);
/* Whether gk_attention takes the tensor-core kernel for n_tok query tokens
 * (a prompt of at least 16, head_dim 64 or 128, CUDA; TG_GPU_ATT_TC=0
 * turns it off): f16 operands, f32 sums. */
int gk_attention_tc(int n_tok, int head_dim);
/* gk_attention (one block per head and token, no split) with its scaled
 * scores exposed, for the replay hooks: with s_out, the score of query
 * token t, head h and key position j (j <= *pos0 + t) is written to
 * s_out[(t * n_head + h) * s_stride + j] (the output is computed as usual);
 * with s_in, the scores are read from there instead of computed from q and
 * the keys (q is then unused). s_stride >= *pos0 + n_tok. */
int gk_attention_scores(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_f16, float *out,
                        int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t *pos0,
                        const float *s_in, float *s_out, int s_stride, tg_err *e);
/* Scratch bytes for gk_attention's split single-token path (n_tok == 1
 * with scratch not NULL: the keys are split over several blocks per head
 * and merged; NULL keeps one block per head) and for gk_attn_decode. */
size_t gk_attention_scratch(int n_head, int head_dim);

/* y[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)); n values. */
int gk_swiglu(cudaStream_t s, const float *g, const float *u, float *y, int n,
              tg_err *e);
/* gk_swiglu that also stores y rounded to f16 into y16 (when not NULL). */
int gk_swiglu16(cudaStream_t s, const float *g, const float *u, float *y, void *y16, int n, tg_err *e);

/* x[i] += y[i]; n values. */
int gk_add(cudaStream_t s, float *x, const float *y, int n, tg_err *e);

/* The k largest of n logits into out[0..k-1] (device tg_top entries),
 * ordered by logit descending, ties by lower id, NaN below every number.
 * k in 1..min(n, TG_GPU_MAX_TOPK). scratch: gk_topk_scratch(n, k) bytes. */
int gk_topk(cudaStream_t s, const float *logits, int n, int k, void *scratch,
            tg_top *out, tg_err *e);

/* XXH3-64 (seed 0, default secret) of len bytes at data, into *out (device).
 * len must exceed 240 (the long-input variant); data 8-byte aligned.
 * scratch: gk_xxh3_scratch(len) bytes. */
int gk_xxh3(cudaStream_t s, const void *data, size_t len, void *scratch,
            uint64_t *out, tg_err *e);

/* ---- the fused single-token path (kernels.cu explains it) ----------------
 * Activations quantized to 8 bits in blocks of 32 values, as gk_matmul_q8
 * describes: q[i], and per block j, d[j] (scale) and s[j] (sum of q). */
typedef struct {
    int8_t *q;
    float *d, *s;
} gk_q8;

/* One mat-vec of a fused launch: y[r] = dot(W row r, x) for r < nrows. */
typedef struct {
    uint32_t type;
    const void *W;
    int nrows;
    float *y;
} gk_mv_seg;

/* Once per device before the fused kernels are captured: lets the
 * streamed mat-vecs use more than 48 KiB of shared memory, and turns on
 * programmatic dependent launch where the device has it. 0 or -1 with e. */
int gk_init(tg_err *e);

/* Whether gk_init turned on programmatic dependent launch for the fused
 * path's kernels (sm_90 and up under CUDA, unless TG_GPU_PDL=0). */
int gk_pdl_on(void);

/* A flag chain over the fused launches that follow on stream s, until
 * gk_chain_end (TG_GPU_CHAIN=1 with PDL on; otherwise nothing changes): each
 * waits on counters the previous launch's blocks bump instead of on the
 * previous grid's completion (gpu_common.cuh says how). cnt: cap counters,
 * zeroed here on the stream; launches past cap leave the chain. 0 or -1
 * with e. */
int gk_chain_begin(cudaStream_t s, unsigned *cnt, int cap, tg_err *e);
void gk_chain_end(void);

/* Whether the fused path serves this weight type (q4_K, q6_K, q8_0). */
int gk_fused_type_supported(uint32_t type);

/* y = rmsnorm(x) * w for one row of n (a multiple of 32) into y (NULL: not
 * kept) and quantized into out. */
int gk_rmsnorm_q8(cudaStream_t s, const float *x, const float *w, float *y, int n, float eps, gk_q8 out,
                  tg_err *e);

/* 1 to 3 mat-vecs over the same quantized input of K values in one launch;
 * with accumulate, y[r] += the dot (the residual add) instead of y[r] =. */
int gk_mv_fused(cudaStream_t s, const gk_mv_seg *segs, int nseg, int K, gk_q8 x, int accumulate, tg_err *e);

/* a[r] = silu(dot(Wg row r, x)) * dot(Wu row r, x) for r < n_ff (a multiple
 * of 32), into y (NULL: not kept) and quantized into out. Wg and Wu share
 * type. */
int gk_mv_swiglu(cudaStream_t s, uint32_t type, const void *Wg, const void *Wu, int n_ff, int K, gk_q8 x,
                 float *y, gk_q8 out, tg_err *e);

/* Decode attention of one token in one launch (head_dim a multiple of 32,
 * up to 512): per head, q's and k's RMS norm (wq, wk NULL: none) and RoPE
 * at *pos0 (as gk_rmsnorm and gk_rope), k and v stored at cache row *pos0
 * (as gk_kv_store), attention over rows 0..*pos0 in key ranges merged as
 * gk_attention's, the output into out and quantized into oq. q, k and v are
 * read only; n_ctx: the cache's rows (*pos0 < n_ctx). q_out (NULL: not
 * kept): the normed, rotated q. scratch: gk_attention_scratch bytes,
 * zeroed once before the first call (the kernel leaves its counters at
 * zero). */
int gk_attn_decode(cudaStream_t s, const float *q, const float *k, const float *v, const float *wq, const float *wk,
                   int n_head, int n_head_kv, int head_dim, int n_ctx, const int32_t *pos0, float base, int neox,
                   float eps, void *kc, void *vc, int kv_f16, float *out, gk_q8 oq, float *q_out, void *scratch,
                   tg_err *e);

/* The kernel settings the environment chose (TG_GPU_MMVQ, TG_GPU_TC,
 * TG_GPU_ATT_TC, TG_GPU_ATT_SPLITS, TG_GPU_STREAM,
 * TG_GPU_STREAM_ROWS, TG_GPU_PDL, TG_GPU_CHAIN, TG_GPU_TOPK_BOUND), as "8-bit mat-vec,
 * tensor-core 128x128 prefill, tensor-core prompt attention, 32 attention
 * splits, streamed mat-vec 1 row/warp, top-k maxima bound" into buf (n
 * bytes); after gk_init. */
void gk_describe(char *buf, size_t n);

#endif
