/*
 * store.h: the SQLite evidence store (one file, WAL, schema version in
 * PRAGMA user_version). The runner hands over whole arm legs; each leg is
 * written in one transaction, so an interrupted run keeps complete legs and
 * no half ones. Comparison, verdicts and reports read only these rows.
 *
 * Ownership: every pointer in the structs below is borrowed for the call.
 * Threads: a tg_store is used by one thread at a time (the caller locks).
 */
#ifndef TG_STORE_H
#define TG_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct tg_store tg_store;

/* Opens (creating or migrating) the store at path. Returns 0 or -1 with e. */
int store_open(tg_store **out, const char *path, tg_err *e);
/* Opens the existing store at path read-only (report, step, trend): a
 * missing path is "no such store: PATH (...)", nothing is created, and
 * nothing is written, except that a store of an older schema version is
 * migrated first as store_open does. Returns 0 or -1 with e. */
int store_open_ro(tg_store **out, const char *path, tg_err *e);
/* Opens the store db for a command, printing "tokgate: MSG" on stderr when
 * it cannot. mode 0: store_open (creating it); 1: an existing store only
 * (the command scores or rewrites one, so a missing file is a typo, "no
 * such store", and nothing is created); 2: an existing store, read-only
 * (store_open_ro). Returns 0 with *st, or 2 (the usage exit code). */
int store_open_cmd(tg_store **st, const char *db, int mode);
void store_close(tg_store *st);
/* Removes the files of the store at path: the db, its -wal, -shm and
 * -journal files and PATH-runlock (a store a failed command created, a
 * previous attempt). Missing files are no error. */
void store_remove_files(const char *path);              /* NULL is a no-op */
/* The sqlite3 handle, for the modules that query it (compare, reports). */
struct sqlite3 *store_db(tg_store *st);

/* One arm of a run as the spec declared it. */
typedef struct store_arm {
    const char *name;        /* spec name, unique in the run */
    const char *kind;        /* engine | llama | command | exec */
    const char *role;        /* reference | test | oracle | custody */
    const char *config_json; /* the arm's spec entry as JSON */
} store_arm;

typedef struct store_prompt {
    const char *id;          /* p1.. or the spec's id */
    const char *text;
} store_prompt;

typedef struct store_run_info {
    const char *spec_name;
    const char *spec_path;
    const char *spec_text;   /* the spec file's bytes */
    const char *spec_sha256;
    const char *artifact_path;
    const char *artifact_sha256;
    int64_t artifact_size;
    const char *host;
    const char *tokgate_version;
    const char *mode;        /* teacher-forced | free */
    const char *reference;   /* arm name */
    const char *policy_kind; /* exact | near-tie | noise */
    double band;             /* near-tie band (logits) */
    int steps, top_k, legs;
    int n_arms;
    const store_arm *arms;
    int n_prompts;
    const store_prompt *prompts;
} store_run_info;

/* Creates the run row and its arms and prompts; *run_id receives its id. */
int store_begin_run(tg_store *st, const store_run_info *info, int64_t *run_id, tg_err *e);
/* Sets the run's final verdict word (PASS | FAIL | NOT_MEASURABLE | ERROR)
 * and finish time. */
int store_finish_run(tg_store *st, int64_t run_id, const char *verdict, tg_err *e);

typedef struct store_step {
    int step;
    int32_t token;           /* the arm's argmax at this step */
    int32_t forced;          /* the token appended instead (teacher forcing), or -1 */
    char digest[17];         /* XXH3-64 hex of the full logits, "" if none */
    int n_top;
    const tg_top *top;       /* n_top (0..4096) entries, descending */
} store_step;

typedef struct store_dump {
    int step, layer;         /* layer -1 for final logits */
    const char *stage;       /* attn_norm | q | k | v | attn_out | ffn_norm | ffn_out | residual | logits */
    int64_t n;
    const float *data;
} store_dump;

typedef struct store_leg_prompt {
    const char *prompt_id;
    const int32_t *ids;      /* the arm's own tokenization of the prompt */
    int n_ids;
    const int32_t *decoded_from; /* prompt ids actually decoded over (teacher-forced: the reference's) */
    int n_decoded_from;
    int n_steps;
    const store_step *steps;
    const char *text;        /* custody arms: their generated text; the
                              * reference arm: the detokenized text of its
                              * own generated tokens (what chain of custody
                              * compares against); else NULL */
    const char *error;       /* this prompt's arm error, or NULL */
    int n_dumps;
    const store_dump *dumps;
} store_leg_prompt;

typedef struct store_leg {
    int64_t run_id;
    const char *arm;
    int leg;                 /* 1-based */
    const char *binary_path, *binary_sha256, *version, *device;
    const char *hello_json;  /* the arm's hello answer */
    const char *model_json;  /* the arm's load answer */
    int exit_status;         /* -1 if killed by a signal */
    int term_signal;         /* 0 if none */
    const char *cause;       /* NULL for a clean leg, else "timeout: ...", "crash: SIGSEGV", ... */
    const char *fault_lines; /* stderr lines that matched fault patterns, or NULL */
    const char *counters_json; /* merged counters of the leg's decodes */
    int64_t device_ops, host_ops;
    const char *stderr_text; size_t stderr_len; /* stored zstd-compressed */
    double ms_load, ms_prefill, ms_decode, wall_s;
    int n_prompts;
    const store_leg_prompt *prompts;
} store_leg;

/* Writes the leg and all its rows in one transaction (all or nothing). */
int store_put_leg(tg_store *st, const store_leg *leg, tg_err *e);
/* Legs already stored for (run, arm, leg): 1 if present (for --resume). */
int store_has_leg(tg_store *st, int64_t run_id, const char *arm, int leg);

/* Takes the run lock of run_id for this process: a process that runs or
 * resumes a run holds it until store_close (or its end, however it ends),
 * so a second `tokgate gate --resume N` cannot write the same legs. Taking
 * another run's lock releases the one held. Returns 0 (held now, or a
 * ":memory:" store), 1 when another process holds it (*holder its pid, 0
 * when the system does not say), -1 with e (the lock file PATH-runlock
 * cannot be opened). */
int store_run_lock(tg_store *st, int64_t run_id, long *holder, tg_err *e);

/* How long a write waits for another connection's write lock before it
 * fails with "database is locked", printing progress on stderr every 10 s:
 * $TOKGATE_STORE_WAIT seconds when set, else this. */
#define STORE_WAIT_DEFAULT_S 3600.0

/* The latest run (highest id) of spec_name, or of any spec when spec_name is
 * NULL, into *run_id. Returns 1 found, 0 none, -1 with e on a store error. */
int store_latest_run(tg_store *st, const char *spec_name, int64_t *run_id, tg_err *e);

/* The schema version this build writes (PRAGMA user_version). store_open
 * migrates older stores up to it and refuses newer ones. */
/* Version 2 added run.uid (a random 32-hex-digit id, unique across stores). */
/* Version 3 added noise_band and the localize tables (docs/localize.md). */
/* Version 4 kept the top-k in one binary chunk per leg (leg_top). */
/* Version 5 keeps the top-k in plain rows (step_top: one row per rank, the
 * f32 logit as a REAL, NaN and -0.0 with their bits), leg.same_as for legs
 * stored once, gap REAL in every step row, and the view v_top. Stores of
 * versions 1..4 with step rows are refused: their top-k blobs are no longer
 * decoded (docs/store.md). */
/* Version 6 added run_calibration, calib_set, calib_step, calib_limit and
 * calib_arm_step (harness/calibrate.h). */
#define STORE_SCHEMA_VERSION 6

/* The top-k of the steps of one (leg, prompt): step i has number step[i]
 * (ascending) and n_top[i] (0..4096) entries at top + off[i]. */
typedef struct store_tops {
    int n;
    int *step, *n_top;
    size_t *off;
    tg_top *top;
} store_tops;

/* Reads the top-k of every step of (leg_id, prompt_id) from its step_top
 * rows (those of the leg its same_as names, when set), every id and f32
 * logit bit-exact as stored. Returns 0 with *out (free with
 * store_tops_free; n 0 when the leg has no steps of that prompt), or -1
 * with e naming the leg, prompt, step and rank of a row that holds no
 * valid entry. */
int store_tops_read(struct sqlite3 *db, int64_t leg_id, int64_t prompt_id, store_tops *out, tg_err *e);
void store_tops_free(store_tops *t);          /* NULL is a no-op; resets *t */
/* Index of step number step in t, or -1. */
int store_tops_find(const store_tops *t, int step);

#endif
