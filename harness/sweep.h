/*
 * sweep.h: the nightly regression sweep. A sweep file (YAML, docs/sweep.md)
 * lists gate specs, each with optional overrides (any top-level spec key),
 * an arm subset and per-arm load options; sweep_load() resolves every entry
 * into the text of a complete spec (the overrides applied), which is what
 * runs and what the store keeps. `tokgate sweep` runs them all into one
 * store, one run each, continuing past failures; `tokgate plan` splits the
 * entries into N shards and writes a self-contained plan file (the resolved
 * spec texts are inside); `tokgate run --shard I/N` runs one shard into its
 * own store file, written under a temporary name and renamed when complete,
 * so a scheduler can retry a shard without leaving half stores behind.
 *
 * Ownership: a tg_sweep owns its strings until sweep_free(); the const char *
 * it returns live as long as it does.
 */
#ifndef TG_SWEEP_H
#define TG_SWEEP_H

#include <stdint.h>
#include <stdio.h>

#include "store.h"
#include "util.h"

typedef struct tg_sweep tg_sweep;

/* Reads the sweep file at path and resolves every entry into a spec text
 * (each is also parsed once, so a bad override is reported now). Returns 0
 * with *out (free with sweep_free), or -1 with e naming the file, the entry
 * and what was expected. */
int sweep_load(tg_sweep **out, const char *path, tg_err *e);
void sweep_free(tg_sweep *sw);               /* NULL is a no-op */

const char *sweep_name(const tg_sweep *sw);  /* the sweep's name */
int sweep_n_entries(const tg_sweep *sw);
/* Entry i (0-based): its spec name (after overrides), the resolved spec
 * text and the spec file it came from (relative paths inside the text are
 * resolved against it, see spec.h). */
const char *sweep_entry_name(const tg_sweep *sw, int i);
const char *sweep_entry_text(const tg_sweep *sw, int i);
const char *sweep_entry_path(const tg_sweep *sw, int i);

/* The 1-based shard of unit i (0-based) when n_units units are split into
 * n_shards shards: round robin. */
int sweep_shard_of(int i, int n_shards);

/* The CPUs one run of a spec needs (tokgate plan, docs/sweep.md). */
typedef struct sweep_cpus {
    int threads;             /* the most threads one arm process uses (its `threads` option; 1 for the
                              * ref tier, exec and command arms; 1 when unset on a cpu or llama arm,
                              * said in note) */
    int jobs;                /* legs side by side: the spec's jobs, at most its legs, capped to fit */
    int cpus;                /* threads x jobs */
    char note[512];          /* what was assumed or capped, or "" */
} sweep_cpus;

/* The CPUs spec s needs to run at full speed; cap > 0 is the CPUs there
 * are: jobs is lowered (never below 1) so that threads x jobs fits it, and
 * an arm with more threads than cap is noted. Never fails. */
struct tg_spec;
void sweep_spec_cpus(const struct tg_spec *s, int cap, sweep_cpus *c);

/* What one spec of a sweep gave. */
typedef struct sweep_row {
    char name[128];          /* spec name */
    int64_t run_id;          /* 0 when no run was opened */
    char verdict[16];        /* PASS | FAIL | NOT_MEASURABLE | ERROR */
    int n_arms, n_pass;      /* gate arms scored / passed */
    char divergences[32];    /* GENERATION_DIVERGENCES k/n, "-" if none */
    double seconds;
    char trend[16];          /* TREND of the spec after this run (trend.h): CLEAN | REGRESSION | FIRST |
                              * NO_BASELINE, or "-" */
    char error[1100];        /* why ERROR, else "" */
} sweep_row;

/* Runs one resolved spec (text, anchored at path) into st: gate, score,
 * finish the run. bin_dir is the folder of tg-engine / tg-llama; jobs <= 0
 * takes the spec's. Always fills *row; returns 0 when the run was stored
 * and scored (whatever its verdict), -1 when it could not be (row->error
 * says why, row->verdict is ERROR). */
int sweep_run_spec(tg_store *st, const char *path, const char *text, const char *bin_dir,
                   int jobs, int progress, sweep_row *row);

/* Prints the summary table of n rows to out. */
void sweep_print_summary(FILE *out, const sweep_row *rows, int n);

/* The exit code of a set of rows: 2 if any ERROR, else 1 if any verdict is
 * not PASS, else 0. */
int sweep_exit_code(const sweep_row *rows, int n);

/* The commands: `tokgate sweep`, `tokgate plan`, `tokgate run`. Each takes
 * the whole argv (argv[1] is the command) and returns the exit code. */
int sweep_main(int argc, char **argv);
int sweep_plan_main(int argc, char **argv);
int sweep_run_main(int argc, char **argv);

#endif
