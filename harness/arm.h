/*
 * arm.h: one arm process and the client side of arm protocol v1
 * (docs/protocol.md; docs/architecture.md, "Processes").
 *
 * arm_start() spawns the worker with posix_spawnp from an argv (never a
 * shell) in its own process group, with pipes on stdin, stdout and stderr.
 * Every call then waits with poll() under two deadlines: the request's
 * (timeout_request seconds for one request; for decode the whole answer,
 * up to its done line) and the leg's (timeout_leg seconds from the spawn).
 * stderr is drained all the while, kept up to max_stderr bytes and scanned
 * line by line for the fault patterns.
 *
 * Two kinds of failure:
 *  - the worker answered {"ok":false,"error":...}: the call returns -1 with
 *    e = "arm NAME: OP: the worker's message", the worker stays up, and
 *    arm_failed() stays 0;
 *  - anything else (timeout, crash, early EOF, a line that is not JSON or
 *    lacks a field, a line longer than max_line): the call returns -1, the
 *    worker is killed (SIGTERM, SIGKILL after the grace period) and reaped,
 *    arm_failed() is 1 and arm_cause() says why in one line
 *    ("timeout: decode: no answer within 5 s", "crash: SIGSEGV during
 *    decode", "protocol: decode: step line 3: expected 'top' ...").
 *    Every later call fails at once with the same cause.
 *
 * arm_finish() ends the worker (bye, close stdin, wait grace, then signals)
 * and always reaps it. SIGPIPE from a dead worker's stdin is caught per
 * write (blocked and consumed), never delivered to the process.
 *
 * Ownership: a tg_arm owns its process, pipes and buffers until arm_free();
 * results handed out (ids, text, decode results) are owned by the caller
 * and freed with the matching _free call. Not thread-safe: one thread per
 * arm (different arms may run in different threads).
 */
#ifndef TG_ARM_H
#define TG_ARM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util.h"

typedef struct tg_arm tg_arm;

typedef struct arm_config {
    const char *name;            /* for messages */
    char *const *argv;           /* NULL-terminated; argv[0] looked up in PATH */
    double timeout_request;      /* seconds; <= 0: 120 */
    double timeout_leg;          /* seconds; <= 0: no leg deadline */
    double grace;                /* seconds between SIGTERM and SIGKILL; <= 0: 2 */
    double exit_wait;            /* seconds a worker may take to exit after bye; <= 0: 10 */
    size_t max_line;             /* longest stdout line; 0: 16 MiB */
    size_t max_stderr;           /* stderr bytes kept; 0: 16 MiB */
    int n_fault_patterns;
    char *const *fault_patterns; /* substrings searched in each stderr line */
    int n_env;
    char *const *env;            /* "NAME=VALUE" set for the worker on top of ours (or NULL) */
} arm_config;

/* Spawns the worker. Returns 0 with *out, or -1 with e (the program could
 * not be started: names it and errno). */
int arm_start(tg_arm **out, const arm_config *cfg, tg_err *e);

/* hello (protocol 1). *answer_json receives the whole answer line
 * (malloc'ed) when not NULL. Returns 0 or -1 with e. */
int arm_hello(tg_arm *a, char **answer_json, tg_err *e);
/* The answer's "arm" fields (NULL when absent); valid until arm_free. */
const char *arm_hello_field(tg_arm *a, const char *key);

/* load model with options (a JSON object text, NULL = {}). *answer_json as
 * for hello. */
int arm_load(tg_arm *a, const char *model, const char *options_json, char **answer_json, tg_err *e);

/* replay (docs/protocol.md): evaluates tokens[0..n) with the stage hooks
 * (with prefill 1..n: tokens 0..prefill-1 in one evaluation, then one at a
 * time; 0: all in one), overwriting with the records of file `in` (NULL:
 * none), applying numerics (a JSON object text, NULL: none), and writes
 * the record file `out`. *answer_json as for hello. Returns 0 or -1 with e. */
int arm_replay(tg_arm *a, const int32_t *tokens, int n, int prefill, const char *in, const char *out,
               const char *numerics_json, char **answer_json, tg_err *e);

/* tokenize: *ids malloc'ed (caller frees), *n ids. */
int arm_tokenize(tg_arm *a, const char *text, int special, int32_t **ids, int *n, tg_err *e);

/* detokenize: *text malloc'ed, NUL-terminated, *len bytes (from "hex"
 * when the worker gives it, so bytes are exact). */
int arm_detokenize(tg_arm *a, const int32_t *ids, int n, int special, char **text, size_t *len,
                   tg_err *e);

/* One step line. */
typedef struct arm_step {
    int32_t token;
    char digest[17];             /* "" when the worker sent none */
    int n_top;
    tg_top *top;                 /* (n_top), descending */
} arm_step;

/* One dump line, with the file's data read in. */
typedef struct arm_dump {
    int step, layer;
    char stage[32];
    int64_t n;
    float *data;                 /* (n) */
} arm_dump;

typedef struct arm_decode_req {
    const int32_t *prompt;       /* (n_prompt) */
    int n_prompt;
    int steps, top_k;
    const int32_t *force;        /* (n_force) or NULL */
    int n_force;
    const int *dump_steps;       /* (n_dump_steps) or NULL */
    int n_dump_steps;
    const char *dump_path;       /* folder, when dumps are asked for */
} arm_decode_req;

typedef struct arm_decode_res {
    int n_steps;                 /* step lines received (all of them on success) */
    arm_step *steps;
    int n_dumps;
    arm_dump *dumps;
    char *counters_json;         /* the done line's counters object, or NULL */
    double ms_load, ms_prefill, ms_decode;  /* NaN when absent */
} arm_decode_res;

/* Parses and validates one decode step line as arm_decode does (expected
 * step number, token, top of 1..top_k entries ordered by logit descending,
 * ties by lower id, token = top[0], digest of 16 hex digits when present).
 * Returns 0 with *st (free st->top), or -1 with e. Exposed for the
 * protocol fuzz target and tests. */
int arm_parse_step_line(const char *line, size_t len, int expect, int top_k, arm_step *st, tg_err *e);

/* Called after each step line (for progress); may be NULL. */
typedef void (*arm_progress_fn)(void *ud, int step);

/* decode. On success res holds every step and the done line's fields. On
 * failure (-1 with e) res keeps the steps that arrived before it. Free res
 * with arm_decode_res_free in both cases. */
int arm_decode(tg_arm *a, const arm_decode_req *req, arm_decode_res *res,
               arm_progress_fn progress, void *ud, tg_err *e);
void arm_decode_res_free(arm_decode_res *res);   /* NULL is a no-op */

/* A fresh private folder for one decode's dump files, $TMPDIR (else /tmp)
 * /tokgate-WHAT-XXXXXX, into buf. Returns 0 or -1 with e. */
int arm_dump_dir_make(char *buf, size_t n, const char *what, tg_err *e);
/* Removes the files of a dump folder and the folder (NULL or "" is a no-op). */
void arm_dump_dir_remove(const char *dir);

/* Whether a protocol failure ended the worker (see above), and its cause
 * (NULL when none). */
int arm_failed(const tg_arm *a);
const char *arm_cause(const tg_arm *a);

/* How the worker ended. */
typedef struct arm_exit {
    int exit_status;             /* exit code, or -1 when killed by a signal */
    int term_signal;             /* 0 when none */
    const char *cause;           /* as arm_cause(), NULL when the worker ended cleanly */
    const char *stderr_text;     /* captured stderr (first max_stderr bytes), NUL-terminated */
    size_t stderr_len;
    size_t stderr_dropped;       /* bytes beyond max_stderr, not kept */
    const char *fault_lines;     /* stderr lines matching a fault pattern, '\n'-joined, or NULL */
    double wall_s;               /* spawn to reap */
} arm_exit;

/* Ends the worker: sends bye (unless it failed), closes its stdin, waits up
 * to exit_wait seconds for it to exit, then SIGTERM, grace, SIGKILL; reaps it
 * and drains its stderr. A worker that exits non-zero or by a signal after
 * a clean protocol session gets a cause too ("exit: status 3",
 * "crash: SIGSEGV at exit"). Fills *x (pointers valid until arm_free).
 * Idempotent. Returns 0. */
int arm_finish(tg_arm *a, arm_exit *x);

/* Kills (if still running), reaps and frees. NULL is a no-op. */
void arm_free(tg_arm *a);

/* The worker's process id (for tests), or -1 once reaped. */
pid_t arm_pid(const tg_arm *a);

/* Interruption (tokgate got SIGINT or SIGTERM). arm_interrupt is
 * async-signal-safe, for a signal handler: it records sig and sends
 * SIGKILL to the process group of every worker started by arm_start (or
 * arm_run_command) that is not reaped yet, so no worker outlives tokgate.
 * From then on every wait ends at once, every failure's cause reads
 * "interrupted: SIGINT", and arm_start refuses to start a worker.
 * arm_interrupted() returns the recorded signal, 0 when none. */
void arm_interrupt(int sig);
int arm_interrupted(void);

/* Runs argv once (a command arm): stdin /dev/null, stdout captured as the
 * result (up to max_out bytes; 0 = 64 MiB), stderr captured like an arm's,
 * killed after timeout seconds. Returns 0 when it exited 0 (*out, *out_len
 * malloc'ed, x filled; x->cause NULL), or -1 with e and x->cause (timeout,
 * crash, exit status, could not start). x's pointers are malloc'ed: free
 * them with arm_exit_free. */
int arm_run_command(char *const *argv, double timeout, size_t max_out,
                    int n_fault_patterns, char *const *fault_patterns,
                    char **out, size_t *out_len, arm_exit *x, tg_err *e);
void arm_exit_free(arm_exit *x);  /* for arm_run_command's x; NULL is a no-op */

#endif
