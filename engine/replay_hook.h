/*
 * replay_hook.h: stage replay (docs/protocol.md, "replay"; docs/localize.md).
 *
 * A replay evaluates one token sequence (positions 0..T-1) with a hook at
 * every stage boundary of every layer. The hook records the tier's own
 * output of the stage for every token (into the replay's record), and, when
 * the replay was given reference values for that (layer, stage), overwrites
 * the tier's buffer with them, so the next stage computes from exact inputs
 * (and K/V enter the cache from exact values). One pass thus gives every
 * stage's local output free of inherited error. Which stages are
 * overwritten is simply which records the input file holds: none (a plain
 * recording, as the reference arm makes), all (stage replay), only the
 * layer outputs (each layer run on exact inputs), or one layer's output (an
 * injection for attribution).
 *
 * The hooks are called by the tiers' real code (forward_ref.c,
 * forward_cpu.c) at the place each stage is computed, so a defect anywhere
 * in a tier's stage code shows in its record. Hooks may run on pool
 * threads for disjoint (token, column) ranges.
 *
 * File format (little-endian; the same for input and record):
 *   "TGRPLAY1" (8 bytes), then u32 n_layer, n_embd, n_head, n_head_kv,
 *   head_dim, n_ff, n_vocab, n_tokens; then records until end of file:
 *   i32 layer (-1: after the last layer), i32 stage (enum tg_rstage),
 *   u64 n, then n f32 values. A stage's values are the rows of tokens
 *   0..T-1 in order, each tg_replay_width() floats, except: scores, where
 *   token t has n_head * (t+1) values (head by head, positions 0..t), and
 *   logits, which hold the last token only. out_norm is written at the
 *   last token of each evaluation only (NaN at the others), and an input's
 *   NaN rows are not written over the tier's.
 */
#ifndef TG_REPLAY_HOOK_H
#define TG_REPLAY_HOOK_H

#include <stdint.h>
#include <stdio.h>

#include "model.h"
#include "util.h"

/* Replay stages in forward order (layer -1: out_norm, logits). */
enum tg_rstage {
    TG_RS_ATTN_NORM,   /* rmsnorm(x) * attn_norm                (n_embd) */
    TG_RS_Q_PROJ,      /* Wq h                                  (n_head*head_dim) */
    TG_RS_K_PROJ,      /* Wk h                                  (n_head_kv*head_dim) */
    TG_RS_V_PROJ,      /* Wv h                                  (n_head_kv*head_dim) */
    TG_RS_Q_NORM,      /* per-head q rmsnorm (qwen3)            (n_head*head_dim) */
    TG_RS_K_NORM,      /* per-head k rmsnorm (qwen3)            (n_head_kv*head_dim) */
    TG_RS_Q_ROPE,      /* q after rope                          (n_head*head_dim) */
    TG_RS_K_ROPE,      /* k after rope                          (n_head_kv*head_dim) */
    TG_RS_K_CACHE,     /* the K cache row as stored, read back  (n_head_kv*head_dim) */
    TG_RS_V_CACHE,     /* the V cache row as stored, read back  (n_head_kv*head_dim) */
    TG_RS_SCORES,      /* q.k * scale per head and position     (n_head*(t+1)) */
    TG_RS_ATTN,        /* attention output before Wo            (n_head*head_dim) */
    TG_RS_ATTN_OUT,    /* Wo attn                               (n_embd) */
    TG_RS_ATTN_RES,    /* x + attn_out                          (n_embd) */
    TG_RS_FFN_NORM,    /* rmsnorm(x) * ffn_norm                 (n_embd) */
    TG_RS_GATE,        /* Wgate h                               (n_ff) */
    TG_RS_UP,          /* Wup h                                 (n_ff) */
    TG_RS_SWIGLU,      /* silu(gate) * up                       (n_ff) */
    TG_RS_FFN_OUT,     /* Wdown swiglu                          (n_embd) */
    TG_RS_RESIDUAL,    /* x + ffn_out, the layer's output       (n_embd) */
    TG_RS_OUT_NORM,    /* final rmsnorm, each evaluation's last token (layer -1)  (n_embd) */
    TG_RS_LOGITS,      /* logits, last token (layer -1)         (n_vocab) */
    TG_RS_EMBD,        /* the token's embedding row, layer 0 only, before
                        * attn_norm in forward order (numbered last: the
                        * file format's older numbers stand)  (n_embd) */
    TG_RS_COUNT
};
const char *tg_rstage_name(int stage);   /* "q_rope"; "?" out of range */
int tg_rstage_parse(const char *s);      /* the stage, or -1 */

/* Numerics a replay asks the ref tier to apply (the declared roundings of
 * another arm, docs/protocol.md "numerics"); all zero: the ref tier's own. */
typedef struct tg_replay_num {
    int act_vec_dot;   /* matmul inputs rounded through the weight type's vec_dot type */
    int kv_f16;        /* K/V cache rows stored as f16 */
    int attn_q_kv;     /* q rounded to the K cache type before the q.k dots */
    int attn_acc;      /* attention V accumulator rounded after each update: 0 none (f64), 32 f32, 16 f16 */
    int rope_ggml;     /* rope cos/sin as ggml-cpu computes them (f32 powf, theta *= scale, cosf/sinf) */
} tg_replay_num;

typedef struct tg_replay tg_replay;

/* A replay of n_tokens tokens over m; in_path (NULL: none) gives the
 * reference values to overwrite with. Returns 0 and *out, or -1 with e (a
 * file that cannot be read, is not a replay file, has other dimensions or
 * another token count, or a record of the wrong size). */
int tg_replay_new(tg_replay **out, const tg_model *m, int n_tokens, const char *in_path, tg_err *e);
void tg_replay_free(tg_replay *r);   /* NULL is a no-op */
tg_replay_num *tg_replay_numerics(tg_replay *r);
int tg_replay_n_tokens(const tg_replay *r);
/* Writes every recorded (layer, stage) to path. Returns the number of
 * records (>= 0), or -1 with e. */
int tg_replay_write(const tg_replay *r, const char *path, tg_err *e);
/* Records overwritten from the input (for the answer). */
int tg_replay_n_overwritten(const tg_replay *r);

/* The file format's reading and writing, shared by the replay (its input
 * and record) and the harness (harness/replay.c); what names the file in
 * messages ("replay input"). tg_rfile_open opens path and reads the magic
 * and the header into h; returns the file, or NULL with e. tg_rfile_read
 * reads f's records to its end and closes f: dest returns where a record's
 * n floats go, or NULL after writing into its e why the record is refused
 * (the message is prefixed with what and path); returns 0 or -1 with e.
 * tg_rfile_create creates path with the magic and h (NULL with e);
 * tg_rfile_put appends one record (1, or 0 when the write failed). */
typedef float *(*tg_rfile_dest_fn)(void *ud, int layer, int stage, uint64_t n, tg_err *e);
FILE *tg_rfile_open(const char *path, const char *what, uint32_t h[8], tg_err *e);
int tg_rfile_read(FILE *f, const char *path, const char *what, tg_rfile_dest_fn dest, void *ud, tg_err *e);
FILE *tg_rfile_create(const char *path, const char *what, const uint32_t h[8], tg_err *e);
int tg_rfile_put(FILE *f, int layer, int stage, const float *x, uint64_t n);

/* Runs s's evals with the replay r (NULL: none); r must outlive its use.
 * Replay evaluates the tokens 0..T-1 from an empty cache (model.c). */
void tg_session_set_replay(tg_session *s, tg_replay *r);

/* Floats per token of a stage (scores: 0, it varies). */
int64_t tg_replay_width(const tg_hparams *hp, int stage);

/* The hooks. Rows b < nb of x (row b at x + b*stride; float, or double
 * when f64: the ref tier's) are the tokens at positions pos0+b; only
 * columns [c0, c1) are touched. Positions outside 0..T-1 (and, for
 * out_norm/logits, all but T-1) are ignored. */
void tg_replay_rows(tg_replay *r, int layer, int stage, int pos0, int nb, void *x, int f64, int64_t stride,
                    int64_t c0, int64_t c1);
/* The score of (head, position j) of the token at pos: records v (as f32)
 * and returns the reference's value (or v). j > pos (a causal mask that
 * lets a later position in) marks the token's scores as wrong (NaN). */
double tg_replay_score(tg_replay *r, int layer, int pos, int head, int j, double v);

/* The calibrated perturbation of o (model.h, pert_*) of one value at
 * (pos, col), and of rows as the hooks take them. */
double tg_pert_value(const tg_opts *o, double v, int pos, int64_t col);
/* f64 rows stay f32 values after the perturbation. */
void tg_pert_rows(const tg_opts *o, int pos0, int nb, void *x, int f64, int64_t stride, int64_t c0, int64_t c1);

#endif
