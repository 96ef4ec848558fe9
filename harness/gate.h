/*
 * gate.h: running a spec into the store. The plan is prompts x arms x
 * legs; each (arm, leg) is one worker process (or, for a command arm, one
 * process per prompt) and one store_put_leg transaction.
 *
 * teacher-forced (default): leg 1 of the reference arm runs first, alone:
 * it tokenizes each prompt and decodes greedily. Every other (arm, leg),
 * and the reference's legs 2..N, then decode over the reference's prompt
 * ids with force = the reference's leg-1 tokens (each arm's own
 * tokenization is still asked for and stored). free: every arm tokenizes
 * and decodes alone. The remaining legs run side by side, up to `jobs` at a
 * time, in leg order.
 *
 * A crashing, hanging or garbage-printing arm ends its own leg with a cause
 * (stored with whatever steps arrived); other legs and the store are not
 * affected. Scoring and reports are the caller's (verdict.h, report.h).
 */
#ifndef TG_GATE_H
#define TG_GATE_H

#include <stdint.h>

#include "spec.h"
#include "store.h"
#include "util.h"

#define TOKGATE_VERSION "0.1.0"

typedef struct gate_options {
    const char *bin_dir;     /* folder of tg-engine / tg-llama (required) */
    int jobs;                /* legs side by side; <= 0: the spec's jobs within a CPU budget (below) */
    int64_t resume_run;      /* > 0: continue this run, skipping stored legs */
    int progress;            /* 1: progress lines on stderr */
    double grace;            /* seconds between SIGTERM and SIGKILL; <= 0: 2 */
} gate_options;

typedef struct gate_result {
    int64_t run_id;
    int legs_planned;        /* arms x legs */
    int legs_run;            /* run now (faulted ones included) */
    int legs_skipped;        /* already stored (--resume) */
    int legs_faulted;        /* run now and stored with a cause */
    int interrupted;         /* the signal that stopped the run (arm_interrupt), else 0 */
    int jobs;                /* legs run side by side at most */
    int cpu_budget;          /* threads all running legs may use together, 0: no limit (--jobs) */
    int peak_threads;        /* the most threads the running legs held at once */
} gate_result;

/* Without --jobs the legs run up to the spec's jobs at a time, and a leg
 * starts only when its arm's threads fit in what the running legs leave of
 * the CPUs this process may use (llama.cpp's and the cpu tier's threads
 * spin: two 2-thread legs on 2 cores ran 4x slower than one after the
 * other), so the threads of running legs never exceed the CPUs; an arm
 * wanting more than all of them runs alone. --jobs N runs N legs at a time
 * with no budget. */

/* CPUs this process may run on (its affinity mask), at least 1. */
int gate_cpus(void);
/* Threads arm i of spec uses: its `threads` option, else its worker's
 * default (engine cpu: every CPU; llama: every CPU up to 16; engine ref and
 * gpu, exec and command arms: 1); 1 for a llama arm under a wrap (tg-llama
 * uses one thread under qemu-user). cpus: gate_cpus(). At least 1. */
int gate_arm_threads(const tg_spec *spec, int i, int cpus);

/* Re-hashes the artifact, checks that engine and llama arms get a whole
 * GGUF file and that scoring the run fits in the machine's memory (input
 * errors: nothing is stored), opens a run (or resumes opt->resume_run, which
 * must be a run of the same spec text), runs every leg and stores it.
 * After arm_interrupt (tokgate got SIGINT/SIGTERM) no leg is started or
 * stored any more (a leg cut short by our own signal is not evidence): it
 * returns -1 with res->interrupted set and e saying how to resume.
 * Returns 0 when every leg was attempted and stored (faulted legs
 * included), or -1 with e: an input error (artifact hash mismatch or
 * missing file, a resume run of another spec; nothing is stored then) or
 * a store error. *res is filled as far as the run got. */
int gate_run(tg_store *st, const tg_spec *spec, const gate_options *opt, gate_result *res, tg_err *e);

/* The sha256 of every arm's binary (the llama library for llama arms, the
 * worker executable otherwise) into hex[i] (spec->n_arms entries of 65
 * bytes; "" when the file cannot be found). Used by gate and bench. */
void gate_arm_binaries(const tg_spec *spec, const char *bin_dir, char (*hex)[65], char **paths);

/* "hostname (machine)" into buf. */
void gate_host(char *buf, size_t n);

/* The folder of tokgate's executables: $TOKGATE_BIN, else the folder of
 * the running program (readlink /proc/self/exe), else "build/bin". */
void gate_bin_dir(char *buf, size_t n);

#endif
