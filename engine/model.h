/*
 * model.h: a Qwen3 (or Llama) model over a GGUF mapping, and sessions that
 * run its forward pass on one tier.
 *
 * tg_model_load() opens the file through gguf (mmap; weights are never
 * copied: every tg_weight points into the mapping), reads the hyperparameters
 * from the metadata and checks that every tensor the forward pass needs is
 * present with the expected shape and a supported type. The model is
 * read-only afterwards and may back several sessions.
 *
 * A tg_session owns what one sequence needs: the KV cache, activation
 * buffers, the thread pool (cpu tier) and the op counters. Tokens go in with
 * tg_session_eval() (a prompt in batches of n_batch, or one token at a time);
 * the logits of the last token evaluated stay in the session until the next
 * call. The forward pass is docs/formats.md's ("The Qwen3 forward pass").
 * Every tier is reached through one table (tier.h); session.c holds this
 * half, model.c the loading.
 *
 * Tiers (opts.tier):
 *   ref  plain C: weights dequantized row by row, f32 activations with f64
 *        accumulation, F32 KV cache. Threads as the threads option says (0:
 *        all online CPUs; the mat-vec rows are shared by a pool, each row
 *        one dot product in the same order): the bytes do not depend on
 *        it. The tokens of one eval go through in batches (each weight row
 *        dequantized once per batch), with the bytes of one token at a
 *        time. The yardstick.
 *   cpu  activations quantized to each weight type's vec_dot type as
 *        llama.cpp's CPU backend does (Q8_K for K-quants, Q8_0 for Q8_0, F16
 *        for F16, ...), SIMD integer dot products (engine/cpu/kernels.h), a
 *        thread pool splitting output rows with a fixed partition (every row
 *        is one dot product, so the bytes do not depend on the thread
 *        count), F16 KV cache by default.
 *   gpu  the forward pass, top-k and logits digest on a GPU
 *        (engine/gpu/, docs/gpu.md); only in programs linked with the GPU
 *        objects (`make gpu`, `make hip`): elsewhere tg_session_new refuses
 *        it. Its logits stay on the device until asked for.
 *
 * Debug perturbation (load option "perturb", for localisation tests and
 * tokgate power): "KIND:STAGE:LAYER", e.g. "bf16:ffn_out:3", changes the
 * activations of STAGE (a replay stage, or one of the dump stages below:
 * q, k and v name q_rope, k_rope and v_proj) of layer LAYER right where they
 * are produced, for every token, before anything reads them (the stage
 * hooks apply it; opts.pert_*). The model is otherwise unchanged, so the
 * first divergence from an unperturbed run lies at that layer and stage.
 */
#ifndef TG_MODEL_H
#define TG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "ops.h"
#include "util.h"

enum tg_arch { TG_ARCH_QWEN3, TG_ARCH_LLAMA };

typedef struct tg_hparams {
    enum tg_arch arch;
    char arch_name[16];      /* "qwen3" | "llama" (general.architecture) */
    int n_vocab;             /* rows of token_embd */
    int n_ctx_train;         /* <arch>.context_length */
    int n_embd;              /* <arch>.embedding_length */
    int n_layer;             /* <arch>.block_count */
    int n_head;              /* <arch>.attention.head_count */
    int n_head_kv;           /* <arch>.attention.head_count_kv (default n_head) */
    int head_dim;            /* <arch>.attention.key_length (default n_embd / n_head) */
    int n_ff;                /* <arch>.feed_forward_length */
    float rope_base;         /* <arch>.rope.freq_base (default 10000) */
    float eps;               /* <arch>.attention.layer_norm_rms_epsilon */
    int file_type;           /* general.file_type, -1 when absent */
    int qk_norm;             /* per-head q/k rmsnorm (qwen3) */
    int rope_neox;           /* 1: pairs (i, i + d/2) (qwen3); 0: adjacent pairs (llama) */
    int tied;                /* output.weight absent: the output uses token_embd */
} tg_hparams;

/* A weight inside the mapping: rows of `cols` values of `type`. */
typedef struct tg_weight {
    const void *data;        /* into the mapping */
    uint32_t type;           /* TG_TYPE_* */
    int64_t cols;            /* ne[0]: values per row */
    int64_t rows;            /* ne[1] (1 for vectors) */
    size_t row_size;         /* bytes per row */
    const char *name;        /* the tensor name (inside the gguf index) */
} tg_weight;

typedef struct tg_layer {
    tg_weight attn_norm;     /* (n_embd) f32 */
    tg_weight wq;            /* (n_head*head_dim rows, n_embd cols) */
    tg_weight wk;            /* (n_head_kv*head_dim, n_embd) */
    tg_weight wv;            /* (n_head_kv*head_dim, n_embd) */
    tg_weight q_norm;        /* (head_dim) f32; qwen3 only */
    tg_weight k_norm;        /* (head_dim) f32; qwen3 only */
    tg_weight wo;            /* (n_embd, n_head*head_dim) */
    tg_weight ffn_norm;      /* (n_embd) f32 */
    tg_weight gate;          /* (n_ff, n_embd) */
    tg_weight up;            /* (n_ff, n_embd) */
    tg_weight down;          /* (n_embd, n_ff) */
} tg_layer;

typedef struct tg_model {
    gguf *g;                 /* owned; the mapping every weight points into */
    tg_hparams hp;
    tg_weight token_embd;    /* (n_vocab, n_embd) */
    tg_weight output_norm;   /* (n_embd) f32 */
    tg_weight output;        /* (n_vocab, n_embd); == token_embd when tied */
    tg_layer *layers;        /* n_layer, owned */
} tg_model;

/* Opens path and builds the model. Returns 0 and *out, or -1 with e naming
 * the file, the key or tensor, and what was expected. */
int tg_model_load(tg_model **out, const char *path, tg_err *e);
/* Same over an already open gguf, which the model then owns (also on
 * failure: it is closed). */
int tg_model_from_gguf(tg_model **out, gguf *g, tg_err *e);
void tg_model_free(tg_model *m);  /* NULL is a no-op */

/* Stages of a layer whose activations can be dumped (and perturbed), in
 * forward order; TG_STAGE_LOGITS is the final logits (layer -1). */
enum tg_stage {
    TG_STAGE_ATTN_NORM,      /* rmsnorm(x) * attn_norm          (n_embd) */
    TG_STAGE_Q,              /* q after q-norm and rope         (n_head*head_dim) */
    TG_STAGE_K,              /* k after k-norm and rope         (n_head_kv*head_dim) */
    TG_STAGE_V,              /* v                               (n_head_kv*head_dim) */
    TG_STAGE_ATTN_OUT,       /* Wo * attention                  (n_embd) */
    TG_STAGE_FFN_NORM,       /* rmsnorm(x) * ffn_norm           (n_embd) */
    TG_STAGE_FFN_OUT,        /* Wdown * swiglu                  (n_embd) */
    TG_STAGE_RESIDUAL,       /* x at the end of the layer       (n_embd) */
    TG_STAGE_LOGITS,         /* output logits                   (n_vocab) */
    TG_STAGE_COUNT
};
const char *tg_stage_name(int stage);      /* "ffn_out"; "?" out of range */
int tg_stage_parse(const char *s);         /* the stage, or -1 */

typedef struct tg_opts {
    enum tg_tier tier;       /* TG_TIER_REF | TG_TIER_CPU | TG_TIER_GPU */
    int threads;             /* host tiers' pool size; 0: all online CPUs */
    int kv_f32;              /* F32 instead of F16 KV cache (ref: always F32,
                              * resolved to 1) */
    int n_ctx;               /* KV cache positions; 0: min(n_ctx_train, 4096) */
    int n_batch;             /* tokens per prefill batch; 0: the tier's
                              * default (ref, cpu 64; gpu 256) */
    /* A calibrated perturbation at any replay stage (replay_hook.h):
     * "KIND:STAGE:LAYER", KIND bf16 | f16 (round), scale=E (times 1+E),
     * noise=E (times 1+E*u, u uniform with unit variance, a fixed hash of
     * the position and column), drop (the stage's output is zero: the term
     * is dropped, e.g. drop:attn_out:L leaves layer L's residual without
     * its attention); applied by the stage hooks where the tier computes
     * the stage, for every token. pert_kind 0: none. */
    int pert_kind;           /* 0 none, 1 bf16, 2 f16, 3 scale, 4 noise, 5 drop */
    int pert_stage;          /* enum tg_rstage */
    int pert_layer;          /* -1 for out_norm and logits */
    double pert_eps;
    int f64;                 /* ref tier only: keep activations in f64 (no
                              * rounding to f32 between ops); a yardstick
                              * for tests, not a protocol option */
    int device;              /* gpu tier: the device index (0) */
    int no_graph;            /* gpu tier: launch kernels one by one also for
                              * single-token steps (no CUDA graph); same bytes */
} tg_opts;

/* Defaults: cpu tier, all threads, F16 KV, no perturbation. */
tg_opts tg_opts_default(void);
/* Parses a perturbation "bf16:STAGE:LAYER" into o. Returns 0, or -1 with e
 * saying what was expected. Layer range is checked by tg_session_new. */
int tg_opts_parse_perturb(tg_opts *o, const char *spec, tg_err *e);

typedef struct tg_session tg_session;

/* Makes a session over m (which must outlive it). Returns 0 and *out, or -1
 * with e (a tier not in this build, an unsupported weight type or option,
 * out of memory, no usable GPU). */
int tg_session_new(tg_session **out, const tg_model *m, const tg_opts *o, tg_err *e);
void tg_session_free(tg_session *s);       /* NULL is a no-op */
/* Empties the KV cache (position 0); counters are kept. */
void tg_session_reset(tg_session *s);
/* Positions filled in the KV cache, and its capacity. */
int tg_session_pos(const tg_session *s);
int tg_session_n_ctx(const tg_session *s);
/* The session's options with every default resolved (threads, n_ctx,
 * n_batch, kv_f32 as the tier uses them). */
const tg_opts *tg_session_opts(const tg_session *s);

/* Evaluates n >= 1 tokens at the next positions (in batches of n_batch) and
 * keeps the logits of the last one. Returns 0, or -1 with e (a token id out
 * of range, the context full, a device failure); on failure the cache is
 * left as before. */
int tg_session_eval(tg_session *s, const int32_t *tokens, int n, tg_err *e);
/* tg_session_eval that also gives the logits of every token: row i of
 * logits (n, n_vocab floats, the caller's) is what tg_session_logits()
 * would give after tokens[0..i] went in one token at a time, byte for byte
 * (the ref tier computes the rows in batches, the others one token at a
 * time); the last row is also kept as the session's logits. Dumps, as for
 * an eval, are of the last token. Returns 0, or -1 with e as
 * tg_session_eval (the cache left as before, logits undefined). */
int tg_session_eval_all(tg_session *s, const int32_t *tokens, int n, float *logits, tg_err *e);
/* The last logits (n_vocab floats, owned by the session, valid until the
 * next eval/reset/free). A tier that keeps them on its device (gpu) copies
 * them here at the first call after an eval; NULL when that copy fails. */
const float *tg_session_logits(tg_session *s);

/* Selection. tg_session_set_top(s, k) asks the evals that follow for the
 * top k (0: none) where the tier selects on its device (the gpu tier, for
 * k up to 256: the logits then never cross to the host); other tiers
 * ignore it. tg_session_top() gives the top k (>= 1) of the last logits
 * into top[0..k) (k clamped to n_vocab; by logit descending, ties by
 * lower id, as tg_topk) and the XXH3-64 hex digest of all n_vocab logits
 * into digest[17]: from the device when the last eval selected at least k
 * there, else computed here over tg_session_logits(). Returns the number
 * of entries written, or -1 with e (a device failure). */
void tg_session_set_top(tg_session *s, int k);
int tg_session_top(tg_session *s, int k, tg_top *top, char digest[17], tg_err *e);
/* Whether the tier selects on its device (then one eval and tg_session_top
 * per step moves less than tg_session_eval_all's rows of logits). */
int tg_session_top_on_device(const tg_session *s);

/* Dumps: while fn is set, every eval calls fn for each stage of each layer
 * and for the logits, with the activations of the last token evaluated
 * (n floats, valid during the call). fn returns 0, or -1 to make the eval
 * fail with its message in the e it was given. NULL turns dumps off. */
typedef int (*tg_dump_fn)(void *ud, int layer, int stage, const float *x, int64_t n, tg_err *e);
void tg_session_set_dump(tg_session *s, tg_dump_fn fn, void *ud);

/* Op counters since the session began (or since tg_ops_clear on them). */
tg_ops *tg_session_ops(tg_session *s);
/* Where the session runs, from its real configuration: "x86-64 avx2,
 * 2 threads, f16 KV" style (the tier's describe, tier.h). */
const char *tg_session_device(const tg_session *s);
/* The same description before any session exists, for a session with
 * options o (o->tier; defaults resolved as tg_session_new would), into buf
 * (n bytes). Returns 0, or -1 with buf saying why the tier cannot run here
 * (not part of this build, no usable GPU). */
int tg_tier_device(const tg_opts *o, char *buf, size_t n);

#endif
