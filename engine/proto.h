/*
 * proto.h: the worker side of the arm protocol v1 (docs/protocol.md),
 * shared by tg-engine and tg-llama.
 *
 * A worker fills a proto_ops table with its callbacks and calls
 * proto_serve(stdin, stdout, &ops). proto_serve reads one request line at a
 * time (bounded length), parses and validates it, calls the callback for its
 * "op", and writes the answer lines. Every failure a callback reports (-1
 * with a tg_err) becomes {"ok":false,"error":"..."} and the worker stays up;
 * "bye" or end of input ends proto_serve.
 *
 * The protocol's semantics that both workers must share live here, not in
 * the workers: top-k ordering and the logit format ("%.9g", exact as f32),
 * the digest, teacher forcing (proto_step returns the token to append
 * next), dump file naming, and request validation.
 */
#ifndef TG_PROTO_H
#define TG_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "util.h"

#define PROTO_VERSION 1
#define PROTO_MAX_LINE (64u << 20)  /* longest request line accepted, bytes */
#define PROTO_MAX_STEPS 100000
#define PROTO_MAX_TOP_K 100000
#define PROTO_MAX_PROMPT 1000000    /* ids in a prompt, a force list, detokenize */
#define PROTO_DEFAULT_TOP_K 32

/* The answer stream of one connection (opaque). */
typedef struct proto_conn proto_conn;

/* A validated decode request. Pointers are owned by proto_serve and valid
 * during the decode callback only. */
typedef struct proto_decode_req {
    const int32_t *prompt;   /* (n_prompt) token ids, each >= 0 */
    int n_prompt;            /* >= 1 */
    int steps;               /* 1..PROTO_MAX_STEPS */
    int top_k;               /* 1..PROTO_MAX_TOP_K (default 32) */
    const int32_t *force;    /* (n_force) or NULL: teacher forcing */
    int n_force;             /* steps - 1 or steps when force is given */
    const int *dump_steps;   /* (n_dump_steps) ascending, distinct, or NULL */
    int n_dump_steps;
    const char *dump_path;   /* folder for dump files, or NULL */
} proto_decode_req;

/* What a decode callback reports for the done line. */
typedef struct proto_done {
    json_t *counters;  /* object, reference stolen by proto_serve; NULL: {} */
    double ms_prefill; /* prompt processing, milliseconds */
    double ms_decode;  /* all steps after the prefill, milliseconds */
} proto_done;

/* A validated replay request (docs/protocol.md, "replay"). Pointers are
 * owned by proto_serve and valid during the callback only. */
typedef struct proto_replay_req {
    const int32_t *tokens;   /* (n_tokens) the sequence, positions 0..n-1 */
    int n_tokens;            /* >= 1 */
    const char *in;          /* reference values to overwrite with, or NULL */
    const char *out;         /* the record file to write */
    const json_t *numerics;  /* an object of declared roundings to apply, or NULL */
    int prefill;             /* 1..n_tokens: tokens 0..prefill-1 in one evaluation, then one
                              * token an evaluation, as a decode; 0: all in one */
} proto_replay_req;

/* The worker's callbacks. Each returns 0 after filling its outputs, or -1
 * with e set (the message becomes the error answer, prefixed with the op
 * name). A NULL callback makes its op answer "not supported". ud is passed
 * through unchanged. */
typedef struct proto_ops {
    void *ud;
    /* hello: fill arm (an empty object) with kind, version, device, ... */
    int (*hello)(void *ud, json_t *arm, tg_err *e);
    /* load: model path, options (an object, possibly empty; validate it with
     * the proto_opt_* helpers); fill model (an empty object). */
    int (*load)(void *ud, const char *model, const json_t *options, json_t *model_out, tg_err *e);
    /* tokenize len bytes of text (may contain NULs); special = parse special
     * tokens in the text. *ids is malloc'ed by the callback, freed by proto. */
    int (*tokenize)(void *ud, const char *text, size_t len, bool special, int32_t **ids, int *n,
                    tg_err *e);
    /* detokenize n ids; special = render special tokens. *text is malloc'ed
     * by the callback (len bytes, need not be valid UTF-8), freed by proto. */
    int (*detokenize)(void *ud, const int32_t *ids, int n, bool special, char **text, size_t *len,
                      tg_err *e);
    /* decode: call proto_step once per step (and proto_dump per dump file),
     * then fill done. On -1 after some steps, the error line follows them. */
    int (*decode)(void *ud, const proto_decode_req *req, proto_conn *c, proto_done *done,
                  tg_err *e);
    /* replay: evaluate req->tokens with the stage hooks, write req->out;
     * fill result (an empty object: records, overwritten, ms). NULL: the
     * worker cannot replay (its hello says "replay": false). */
    int (*replay)(void *ud, const proto_replay_req *req, json_t *result, tg_err *e);
} proto_ops;

/* Serves requests from in until "bye" or end of input, answering on out.
 * Returns 0 on bye/EOF, -1 when reading in or writing out fails (a closed
 * pipe). Ignores SIGPIPE so that a vanished reader is a write error. */
int proto_serve(FILE *in, FILE *out, const proto_ops *ops);

/* The protocol's own descriptor, for a worker's main() before
 * proto_serve(stdin, out, ...): duplicates fd 1 to a private descriptor
 * (close-on-exec) and points fd 1 at stderr, so that what a library prints
 * to stdout (ggml's crash handler runs gdb, which prints a backtrace on fd
 * 1) lands in stderr instead of corrupting the answer stream. The FILE
 * returned writes to the private descriptor and ends the process (exit
 * status 1, a line on stderr naming prog) at the first failed write: with
 * the harness gone nobody reads the answers, and a long decode must not
 * run on. Returns NULL with e when a descriptor call fails. */
FILE *proto_private_out(const char *prog, tg_err *e);

/* Records step `step` of a decode: writes the step line (the argmax of
 * logits as "token", the top req->top_k as [[id,logit],...] by logit
 * descending, ties by lower id, and the XXH3-64 digest of all n logits).
 * Returns the token the worker must append next: req->force[step] under
 * teacher forcing, else the argmax. logits: (n) raw f32 logits. */
int32_t proto_step(proto_conn *c, const proto_decode_req *req, int step, const float *logits,
                   int n);

/* proto_step for a worker that selects the top-k itself (the GPU arm, on
 * the device): top[0..k-1] ordered as tg_topk orders them (k at most
 * req->top_k, top[0] the argmax), digest the 16-hex-digit XXH3-64 of all
 * logits, or NULL for a worker that never sees them all (tg-http: the step
 * line then has no "digest"). Writes the same step line (k is clamped to req->top_k; k >= 1);
 * returns the token to append next (force[step] under teacher forcing,
 * else top[0].id). */
int32_t proto_step_top(proto_conn *c, const proto_decode_req *req, int step, const tg_top *top, int k,
                       const char *digest);

/* Whether req asks for a dump at this step. */
bool proto_wants_dump(const proto_decode_req *req, int step);

/* Writes x (n f32, little-endian) to req->dump_path as
 * "s<step>-l<layer>-<stage>.f32" (layer -1 prints as "lout") and writes
 * the dump line. Returns 0, or -1 with e naming the file. */
int proto_dump(proto_conn *c, const proto_decode_req *req, int step, int layer, const char *stage,
               const float *x, size_t n, tg_err *e);

/* Option helpers for load callbacks. Each leaves *out unchanged and
 * returns 0 when the option is absent; returns 0 after storing a valid
 * value; returns -1 with e ("option 'threads' must be an integer
 * 1..512") otherwise. */
int proto_opt_int(const json_t *options, const char *name, long long lo, long long hi, int *out,
                  tg_err *e);
int proto_opt_bool(const json_t *options, const char *name, bool *out, tg_err *e);
/* String option that must be one of choices (NULL-terminated); stores its
 * index. */
int proto_opt_enum(const json_t *options, const char *name, const char *const *choices, int *out,
                   tg_err *e);
/* Returns 0 when every key of options is in known (NULL-terminated), else
 * -1 with e naming the first unknown one and listing the known. */
int proto_opt_known(const json_t *options, const char *const *known, tg_err *e);

/* A copy of the JSON string s's bytes (embedded NULs kept), NUL-terminated,
 * its length into *len; NULL when out of memory. */
char *proto_string_dup(const json_t *s, size_t *len);

/* Checks that every id is in [0, n_vocab); -1 with e naming what[i]. */
int proto_check_ids(const int32_t *ids, int n, int n_vocab, const char *what, tg_err *e);

/* Reads one line of at most max bytes (without its newline; a trailing CR
 * is dropped) into *buf (grown as needed, NUL-terminated, caller frees).
 * Returns 1 with *len for a line, 0 at end of input, 2 when the line was
 * longer than max (it is consumed and discarded), -1 on a read error. */
int proto_read_line(FILE *in, char **buf, size_t *cap, size_t max, size_t *len);

/* Handles one request line (exposed for tests): parses, validates,
 * dispatches, answers. Returns 1 after "bye", 0 otherwise, -1 when the
 * answer could not be written. */
int proto_handle_line(proto_conn *c, const proto_ops *ops, const char *line, size_t len);

/* A connection writing to out (for tests and proto_serve); free with
 * proto_conn_free (NULL is a no-op). Returns NULL when out of memory. */
proto_conn *proto_conn_new(FILE *out);
void proto_conn_free(proto_conn *c);

#endif
