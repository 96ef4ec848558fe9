/*
 * spec.h: gate specs. A spec is a YAML file (parsed with libfyaml) that pins
 * everything a verdict depends on: the artifact and its sha256, the prompt
 * set, steps, top_k, legs, the mode, the reference arm, the policy and the
 * arms themselves. spec_load() reads, validates and resolves one spec; every
 * problem is reported as "FILE:LINE:COL: FIELD: expected WHAT" and unknown
 * keys are errors, so a typo never passes silently. docs/spec.md is the
 * reference of the format.
 *
 * Relative paths (model.path, prompts, llama.lib, llama.worker) are taken
 * relative to the current directory when that file exists there, else
 * relative to the spec file's folder; the resolved path is absolute.
 *
 * Ownership: a tg_spec owns every string and array it points to; they live
 * until spec_free().
 */
#ifndef TG_SPEC_H
#define TG_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef enum spec_arm_kind {
    SPEC_ARM_ENGINE = 0,     /* built-in engine: tg-engine --tier T */
    SPEC_ARM_LLAMA,          /* llama.cpp oracle: [wrap...] tg-llama --lib L */
    SPEC_ARM_COMMAND,        /* chain of custody: argv per prompt, stdout = text */
    SPEC_ARM_EXEC,           /* any protocol v1 worker, by argv */
    SPEC_ARM_HTTP            /* an inference server's HTTP API: tg-http ARGS */
} spec_arm_kind;

typedef struct spec_arm {
    char *name;              /* unique, [A-Za-z0-9_.-]+ */
    spec_arm_kind kind;
    const char *kind_name;   /* "engine" | "llama" | "command" | "exec" | "http" (static) */
    char *role;              /* test | oracle | custody (declared or default) */
    char *variant_of;        /* an arm name, or NULL */
    char *tier;              /* engine: ref | cpu | gpu; else NULL */
    char *lib;               /* llama: resolved libllama.so path; else NULL */
    char *worker;            /* engine/llama/http: resolved worker path, or NULL = default */
    int n_wrap;
    char **wrap;             /* llama: argv prefix (e.g. qemu-aarch64 -L ...) */
    int n_argv;
    char **argv;             /* command / exec: the argv as written; http: tg-http's arguments */
    int n_strip;
    char **strip;            /* command: stdout suffixes removed, in order, each once */
    char *options_json;      /* load options as a JSON object ("{}" when none) */
    char *config_json;       /* the arm's whole entry as JSON (for the store) */
    double timeout_request;  /* seconds for one request (decode: the whole answer) */
    double timeout_leg;      /* seconds for a whole leg (spawn to exit) */
    int line;                /* 1-based line of the arm's entry in the spec */
    int n_env;
    char **env;              /* "NAME=VALUE" set in the worker's environment (env:), or NULL */
    int n_only;
    char **only;             /* prompts: the prompt ids this arm runs (NULL: every prompt) */
} spec_arm;

typedef struct spec_prompt {
    char *id;                /* p1..pN for a prompt file, else the spec's id */
    char *text;
} spec_prompt;

typedef struct tg_spec {
    char *path;              /* the spec file as given */
    char *text;              /* its bytes (NUL-terminated), for the store */
    size_t text_len;
    char sha256[65];         /* of text */
    char *name;
    char *model_path;        /* resolved, absolute */
    char model_sha256[65];   /* as the spec pins it (lowercase hex) */
    char *prompts_path;      /* resolved prompt file, or NULL when inline */
    int n_prompts;
    spec_prompt *prompts;
    int steps, top_k, legs;
    int jobs;                /* arms run side by side (default 2) */
    char *mode;              /* "teacher-forced" | "free" */
    char *reference;         /* arm name */
    int ref_index;           /* index of the reference in arms[] */
    char *policy_kind;       /* "exact" | "near-tie" | "noise" | "calibrated" | "error-budget" */
    double band;             /* near-tie band in logits (default 0.20) */
    /* calibration (docs/verdicts.md "Calibration"): the exact-arithmetic arm
     * (an engine arm of tier ref, or NULL), the band factor, the control
     * limit factor and the error budget's multiple */
    char *exact;             /* arm name, or NULL */
    double cal_factor;       /* calibration.factor (default 2) */
    double cal_limit_k;      /* calibration.limit_k (default 3) */
    double cal_budget;       /* calibration.budget (default 2) */
    char *cal_from;          /* calibration.from: a spec name whose stored calibration to use, or NULL */
    int n_arms;
    spec_arm *arms;
    int n_fault_patterns;
    char **fault_patterns;
    double timeout_request;  /* defaults for arms that set none */
    double timeout_leg;
    /* dumps: (optional) the steps at which every protocol arm dumps its
     * hidden states into the store's dump table; none when n_dump_steps 0 */
    int n_dump_steps;
    int *dump_steps;         /* ascending, distinct, each < steps */
    int n_dump_prompts;      /* 0: every prompt */
    char **dump_prompts;     /* prompt ids */
    int n_dump_stages;       /* 0: every stage the arm dumps */
    char **dump_stages;      /* stage names (SPEC_DUMP_STAGES) */
    /* replay: (optional) stage replay of the engine arms in the gate */
    int replay;              /* the spec has a replay field */
    int replay_steps;        /* steps replayed per prompt (and every contested step) */
    int replay_gate;         /* a replay FAIL fails TOKEN_GATE (default 1) */
    int replay_variants;     /* also replay arms with variant_of (default 0) */
} tg_spec;

/* The stage names a dump line may carry (docs/protocol.md, "decode"), space-separated. */
#define SPEC_DUMP_STAGES "attn_norm q k v attn_out ffn_norm ffn_out residual logits"

/* 1 when spec s asks for dumps of prompt index p (dumps given, and the prompt
 * listed or no prompt list), else 0. */
int spec_dumps_prompt(const tg_spec *s, int p);
/* 1 when a dump of stage should be stored (no stage list, or listed). */
int spec_dumps_stage(const tg_spec *s, const char *stage);

/* Reads and validates the spec at path. Returns 0 with *out (free with
 * spec_free), or -1 with e ("path:line:col: field: expected ..."). Files the
 * spec names (the prompt file) are read now; the model is only located:
 * spec_check_artifact() hashes it. */
int spec_load(tg_spec **out, const char *path, tg_err *e);

/* The same from text already in memory; path names it in messages and its
 * folder anchors relative paths. */
int spec_parse(tg_spec **out, const char *path, const char *text, size_t len, tg_err *e);

void spec_free(tg_spec *s);  /* NULL is a no-op */

/* Re-hashes the model file. Returns 0 when its sha256 equals the pinned one
 * (actual[] and *size filled), or -1 with e naming the file and both hashes
 * (or the read error). */
int spec_check_artifact(const tg_spec *s, char actual[65], int64_t *size, tg_err *e);

/* Index of the arm called name, or -1. */
int spec_find_arm(const tg_spec *s, const char *name);

/* 1 when arm i runs prompt index p (its prompts: list names it, or it has
 * none), else 0. */
int spec_arm_runs_prompt(const tg_spec *s, int i, int p);

/* The argv that starts arm i's protocol worker (engine, llama, exec arms):
 * bin_dir is the folder of tokgate's own executables (tg-engine, tg-llama
 * live there). A llama arm with a wrap and no worker, whose library is an
 * aarch64 ELF, gets bin_dir/../aarch64/bin/tg-llama. Returns a
 * NULL-terminated array the caller frees with spec_argv_free(), or NULL with
 * e (a command arm, or out of memory). */
char **spec_arm_argv(const tg_spec *s, int i, const char *bin_dir, tg_err *e);

/* A command arm's argv for one prompt: "{model}", "{prompt}" and "{steps}"
 * replaced inside every argument. NULL-terminated; free with spec_argv_free. */
char **spec_command_argv(const tg_spec *s, int i, const char *prompt_text, tg_err *e);

void spec_argv_free(char **argv);  /* NULL is a no-op */

/* The path of the file a worker argv runs for hashing and the store: for a
 * llama arm its library, else the worker (argv[0] after any wrap) as found
 * through PATH. Returns a malloc'ed string, or NULL when it cannot be found. */
char *spec_arm_binary(const tg_spec *s, int i, char *const *argv);

#endif
