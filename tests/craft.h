/*
 * craft.h: crafted runs for the store, compare and report tests. A run is
 * written through the real store API (store_begin_run / store_put_leg), no
 * process is started: these are rows a gate would have written, with
 * tokens and gaps chosen so that each comparison class, resolution sentence
 * and verdict rule is hit on purpose.
 *
 * A step's top-k is derived from (token, gap): ids token, token+1, ...,
 * token+CRAFT_K-1 with logits 10, 10-gap, 10-gap-0.5, ... So an arm token
 * ref+1 is the reference's rank 2, ref+j its rank j+1, and a token far away
 * is OUTSIDE the reference top-k.
 *
 * Header-only (static functions) so each test program stays one file.
 */
#ifndef TG_TESTS_CRAFT_H
#define TG_TESTS_CRAFT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store.h"
#include "util.h"

#define CRAFT_K 8
#define CRAFT_MAX_STEPS 64

typedef struct craft_arm {
    const char *name, *kind, *role, *config;
} craft_arm;

/* Starts a run of spec `spec` on artifact sha `art` with the given arms
 * (arms[0..n_arms-1]) and prompts p1..pN (texts "prompt 1"...). */
static inline int64_t craft_run(tg_store *st, const char *spec, const char *art, const char *mode,
                         const char *reference, const char *policy, double band, int legs,
                         int n_arms, const craft_arm *arms, int n_prompts)
{
    store_arm sa[16];
    store_prompt sp[16];
    static char names[16][8], texts[16][32];
    for (int i = 0; i < n_arms; i++)
        sa[i] = (store_arm){arms[i].name, arms[i].kind, arms[i].role,
                            arms[i].config ? arms[i].config : "{}"};
    for (int i = 0; i < n_prompts; i++) {
        snprintf(names[i], sizeof names[i], "p%d", i + 1);
        snprintf(texts[i], sizeof texts[i], "prompt %d", i + 1);
        sp[i] = (store_prompt){names[i], texts[i]};
    }
    store_run_info ri = {.spec_name = spec, .spec_path = "specs/test.yaml",
                         .spec_text = "name: test\n", .spec_sha256 = "5pec",
                         .artifact_path = "models/m.gguf", .artifact_sha256 = art,
                         .artifact_size = 1234, .host = "testhost", .tokgate_version = "test",
                         .mode = mode, .reference = reference, .policy_kind = policy,
                         .band = band, .steps = 0, .top_k = CRAFT_K, .legs = legs,
                         .n_arms = n_arms, .arms = sa, .n_prompts = n_prompts, .prompts = sp};
    int64_t run = 0;
    tg_err e = {{0}};
    if (store_begin_run(st, &ri, &run, &e) < 0) {
        fprintf(stderr, "craft_run: %s\n", e.msg);
        return -1;
    }
    return run;
}

/* One prompt of a crafted leg. */
typedef struct craft_lp {
    int n;                        /* steps */
    int32_t tok[CRAFT_MAX_STEPS]; /* the arm's argmax */
    double gap[CRAFT_MAX_STEPS];  /* its top1-top2 gap (0 means 1.0) */
    int32_t forced[CRAFT_MAX_STEPS]; /* appended token, or -1 (filled by craft_force) */
    int32_t ids[8];               /* own tokenization */
    int n_ids;
    int32_t dec[8];               /* decoded over */
    int n_dec;
    const char *text, *error;
} craft_lp;

/* Leg-level fields. */
typedef struct craft_legopt {
    int exit_status, term_signal;
    const char *cause, *fault_lines, *counters, *hello, *bin_sha;
    int64_t device_ops, host_ops;
} craft_legopt;

/* A prompt with n steps of tokens tok[] (gap 1.0), ids {1,2,3}, decoded
 * over {1,2,3}, nothing forced. */
static inline craft_lp craft_prompt(int n, const int32_t *tok)
{
    craft_lp p;
    memset(&p, 0, sizeof p);
    p.n = n;
    for (int i = 0; i < n; i++) p.tok[i] = tok[i], p.forced[i] = -1;
    p.n_ids = p.n_dec = 3;
    for (int i = 0; i < 3; i++) p.ids[i] = p.dec[i] = i + 1;
    return p;
}

/* Teacher forcing: the arm appends the reference's tokens. */
static inline void craft_force(craft_lp *p, const craft_lp *ref)
{
    for (int i = 0; i < p->n; i++) p->forced[i] = i < ref->n ? ref->tok[i] : -1;
}

static inline int craft_leg(tg_store *st, int64_t run, const char *arm, int leg, int n_prompts,
                     const craft_lp *lps, const craft_legopt *opt, tg_err *e)
{
    craft_legopt o = {0};
    if (opt) o = *opt;
    static tg_top tops[16][CRAFT_MAX_STEPS][CRAFT_K];
    static store_step steps[16][CRAFT_MAX_STEPS];
    store_leg_prompt slp[16];
    static char pid[16][8];
    for (int p = 0; p < n_prompts; p++) {
        const craft_lp *c = &lps[p];
        for (int s = 0; s < c->n; s++) {
            double g = c->gap[s] > 0 ? c->gap[s] : 1.0;
            for (int k = 0; k < CRAFT_K; k++) {
                tops[p][s][k].id = c->tok[s] + k;
                tops[p][s][k].logit = (float)(k == 0 ? 10.0 : 10.0 - g - 0.5 * (k - 1));
            }
            steps[p][s].step = s;
            steps[p][s].token = c->tok[s];
            steps[p][s].forced = c->forced[s];
            /* the digest stands for the full logits: a function of what
             * the crafted top-k says */
            snprintf(steps[p][s].digest, sizeof steps[p][s].digest, "%016llx",
                     (unsigned long long)(c->tok[s] * 1000003ull + (uint64_t)(g * 1e6) + 17));
            steps[p][s].n_top = CRAFT_K;
            steps[p][s].top = tops[p][s];
        }
        snprintf(pid[p], sizeof pid[p], "p%d", p + 1);
        slp[p] = (store_leg_prompt){.prompt_id = pid[p], .ids = c->n_ids ? c->ids : NULL,
                                    .n_ids = c->n_ids, .decoded_from = c->n_dec ? c->dec : NULL,
                                    .n_decoded_from = c->n_dec, .n_steps = c->n,
                                    .steps = steps[p], .text = c->text, .error = c->error};
    }
    const char *err = "log line\n";
    store_leg L = {.run_id = run, .arm = arm, .leg = leg, .binary_path = "bin/worker",
                   .binary_sha256 = o.bin_sha ? o.bin_sha : "b1n", .version = "1",
                   .device = "test device", .hello_json = o.hello ? o.hello : "{\"ok\":true}",
                   .model_json = "{}", .exit_status = o.exit_status, .term_signal = o.term_signal,
                   .cause = o.cause, .fault_lines = o.fault_lines,
                   .counters_json = o.counters ? o.counters : "{}", .device_ops = o.device_ops,
                   .host_ops = o.host_ops, .stderr_text = err, .stderr_len = strlen(err),
                   .ms_load = 1, .ms_prefill = 2, .ms_decode = 3, .wall_s = 0.5,
                   .n_prompts = n_prompts, .prompts = slp};
    return store_put_leg(st, &L, e);
}

/* Writes `legs` identical clean legs of arm. Returns 0 or -1. */
static inline int craft_legs(tg_store *st, int64_t run, const char *arm, int legs, int n_prompts,
                      const craft_lp *lps, const craft_legopt *opt)
{
    tg_err e = {{0}};
    for (int l = 1; l <= legs; l++)
        if (craft_leg(st, run, arm, l, n_prompts, lps, opt, &e) < 0) {
            fprintf(stderr, "craft_legs %s/%d: %s\n", arm, l, e.msg);
            return -1;
        }
    return 0;
}

/* A fresh store in a temporary file; path receives its name. */
static inline tg_store *craft_store(char path[256])
{
    snprintf(path, 256, "/tmp/tg-eval-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    close(fd);
    unlink(path);
    tg_store *st = NULL;
    tg_err e = {{0}};
    if (store_open(&st, path, &e) < 0) {
        fprintf(stderr, "craft_store: %s\n", e.msg);
        return NULL;
    }
    return st;
}

static inline void craft_store_drop(tg_store *st, const char *path)
{
    char p[300];
    store_close(st);
    unlink(path);
    snprintf(p, sizeof p, "%s-wal", path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", path);
    unlink(p);
    snprintf(p, sizeof p, "%s-runlock", path);
    unlink(p);
}

#endif
