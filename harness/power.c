/*
 * power.c: `tokgate power SPEC`: the tool measures its own power
 * (docs/localize.md, "Power"). For each stage kind it injects calibrated
 * perturbations into one engine arm through the engine's debug option
 * (load option perturb "KIND:STAGE:LAYER", engine/model.h: scale by 1+E or
 * relative noise of E at one stage of one layer, for every token) and
 * reports the smallest E that
 *   - the token gate detects: over the spec's prompts, teacher-forced
 *     along the reference arm's greedy tokens, some step's token differs
 *     from the reference's where the reference's top1-top2 gap exceeds
 *     the spec's band (a step the near-tie policy would fail; the exact
 *     policy: any differing step), beyond what the unperturbed arm has;
 *   - stage replay detects: the perturbed (layer, stage) is over budget.
 * E runs over the ladder 1e-7, 1e-6, ..., 1e0; the smallest detected E is
 * found by bisection on the ladder (detection taken as monotone in E).
 */
#include "power.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arm.h"
#include "common.h"
#include "gate.h"
#include "replay.h"

#define N_LADDER 8
static const double LADDER[N_LADDER] = {1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};

typedef struct pw_ref {
    int32_t *ids;            /* the prompt's ids (the reference's tokenization) */
    int n_ids;
    int32_t *tok;            /* (steps) the reference's greedy tokens */
    double *gap;             /* (steps) its top1 - top2 */
} pw_ref;

typedef struct pw_ctx {
    const tg_spec *s;
    const char *bin_dir;
    int arm;
    int steps;
    double band;
    pw_ref *ref;             /* (n_prompts) */
    int base_flips;          /* gate-failing steps of the unperturbed arm */
} pw_ctx;

/* Starts arm i of s with load options (JSON text); returns 0 with *a. */
static int start(const tg_spec *s, int i, const char *bin_dir, const char *options, tg_arm **a, char **load_ans,
                 tg_err *e)
{
    const spec_arm *sa = &s->arms[i];
    char **argv = spec_arm_argv(s, i, bin_dir, e);
    if (!argv) return tg_err_prefix(e, "arm %s", sa->name);
    arm_config cfg = {.name = sa->name, .argv = argv, .timeout_request = sa->timeout_request,
                      .timeout_leg = sa->timeout_leg, .n_fault_patterns = s->n_fault_patterns,
                      .fault_patterns = s->fault_patterns};
    int rc = arm_start(a, &cfg, e);
    spec_argv_free(argv);
    if (rc < 0) return -1;
    if (arm_hello(*a, NULL, e) < 0 || arm_load(*a, s->model_path, options, load_ans, e) < 0) {
        arm_exit x;
        arm_finish(*a, &x);
        arm_free(*a);
        *a = NULL;
        return -1;
    }
    return 0;
}

static void stop(tg_arm *a)
{
    if (!a) return;
    arm_exit x;
    arm_finish(a, &x);
    arm_free(a);
}

/* The reference arm's tokens and gaps over every prompt. */
static int run_reference(pw_ctx *c, tg_err *e)
{
    const tg_spec *s = c->s;
    tg_arm *a = NULL;
    if (start(s, s->ref_index, c->bin_dir, s->arms[s->ref_index].options_json, &a, NULL, e) < 0) return -1;
    int rc = -1;
    for (int p = 0; p < s->n_prompts; p++) {
        pw_ref *r = &c->ref[p];
        if (arm_tokenize(a, s->prompts[p].text, 0, &r->ids, &r->n_ids, e) < 0) goto out;
        arm_decode_req dq = {.prompt = r->ids, .n_prompt = r->n_ids, .steps = c->steps, .top_k = 2};
        arm_decode_res res;
        memset(&res, 0, sizeof res);
        if (arm_decode(a, &dq, &res, NULL, NULL, e) < 0) {
            arm_decode_res_free(&res);
            goto out;
        }
        r->tok = calloc((size_t)c->steps, sizeof *r->tok);
        r->gap = calloc((size_t)c->steps, sizeof *r->gap);
        if (!r->tok || !r->gap) { arm_decode_res_free(&res); tg_errf(e, "out of memory"); goto out; }
        for (int i = 0; i < c->steps && i < res.n_steps; i++) {
            r->tok[i] = res.steps[i].token;
            r->gap[i] = res.steps[i].n_top > 1 ? (double)res.steps[i].top[0].logit - res.steps[i].top[1].logit
                                               : INFINITY;
        }
        arm_decode_res_free(&res);
    }
    rc = 0;
out:
    stop(a);
    return rc;
}

/* The arm's options with perturb set (NULL: none); malloc'ed JSON text. */
static char *options_with(const char *options, const char *perturb)
{
    json_error_t je;
    json_t *j = json_loads(options ? options : "{}", 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        j = json_object();
    }
    if (perturb) json_object_set_new(j, "perturb", json_string(perturb));
    char *t = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return t;
}

/* Steps the token gate would fail: the arm (with perturb) teacher-forced
 * along the reference, its token differing where the reference's gap
 * exceeds the band. Returns the count, or -1 with e. */
static int gate_flips(pw_ctx *c, const char *perturb, tg_err *e)
{
    const tg_spec *s = c->s;
    char *opts = options_with(s->arms[c->arm].options_json, perturb);
    tg_arm *a = NULL;
    int rc = start(s, c->arm, c->bin_dir, opts, &a, NULL, e);
    free(opts);
    if (rc < 0) return -1;
    int flips = 0;
    for (int p = 0; p < s->n_prompts && flips >= 0; p++) {
        pw_ref *r = &c->ref[p];
        arm_decode_req dq = {.prompt = r->ids, .n_prompt = r->n_ids, .steps = c->steps, .top_k = 2,
                             .force = r->tok, .n_force = c->steps - 1};
        arm_decode_res res;
        memset(&res, 0, sizeof res);
        if (arm_decode(a, &dq, &res, NULL, NULL, e) < 0) flips = -1;
        for (int i = 0; flips >= 0 && i < res.n_steps && i < c->steps; i++)
            if (res.steps[i].token != r->tok[i] && r->gap[i] > c->band) flips++;
        arm_decode_res_free(&res);
    }
    stop(a);
    return flips;
}

/* Whether replay names (layer, stage) over budget with perturb. 1, 0, -1 with e. */
static int replay_detects(pw_ctx *c, const char *perturb, int layer, int stage, tg_err *e)
{
    const tg_spec *s = c->s;
    tg_spec sc = *s;
    spec_arm *arms = malloc(sizeof *arms * (size_t)s->n_arms);
    if (!arms) return tg_errf(e, "out of memory");
    memcpy(arms, s->arms, sizeof *arms * (size_t)s->n_arms);
    char *opts = options_with(s->arms[c->arm].options_json, perturb);
    arms[c->arm].options_json = opts;
    sc.arms = arms;
    /* the first prompt with its reference tokens: every position */
    const pw_ref *r = &c->ref[0];
    int n = r->n_ids + c->steps;
    int32_t *tok = malloc(sizeof *tok * (size_t)n);
    if (!tok) { free(arms); free(opts); return tg_errf(e, "out of memory"); }
    memcpy(tok, r->ids, sizeof *tok * (size_t)r->n_ids);
    memcpy(tok + r->n_ids, r->tok, sizeof *tok * (size_t)c->steps);
    rp_request q = {.spec = &sc, .bin_dir = c->bin_dir, .arm = c->arm, .tokens = tok, .n_tokens = n, .tok2 = -1};
    rp_table *t = NULL;
    char why[256];
    int rc = replay_run(&q, &t, NULL, why, sizeof why, e);
    if (rc == 0) rc = tg_errf(e, "%s", why);
    else if (rc > 0) {
        rc = 0;
        for (int i = 0; i < t->n_rows; i++)
            if (t->rows[i].layer == layer && t->rows[i].stage == stage && t->rows[i].over) rc = 1;
    }
    replay_table_free(t);
    free(tok);
    free(arms);
    free(opts);
    return rc;
}

/* Smallest ladder index detected (N_LADDER: none) by bisection. */
static int smallest(pw_ctx *c, int which, const char *kind, int layer, int stage, tg_err *e)
{
    int lo = 0, hi = N_LADDER;   /* answer in [lo, hi] */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        char pert[128];
        snprintf(pert, sizeof pert, "%s=%g:%s:%d", kind, LADDER[mid], replay_stage_name(stage), layer);
        int d;
        if (which == 0) {
            int f = gate_flips(c, pert, e);
            if (f < 0) return -1;
            d = f > c->base_flips;
        } else {
            d = replay_detects(c, pert, layer, stage, e);
            if (d < 0) return -1;
        }
        if (d) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static int usage(const char *msg, const char *arg)
{
    fprintf(stderr, "tokgate power: ");
    fprintf(stderr, msg, arg);
    fprintf(stderr, "\nusage: tokgate power SPEC [--arm NAME] [--layer L] [--kind scale|noise]"
                    " [--stages S,S,...] [--steps N]\n");
    return 2;
}

int power_main(int argc, char **argv)
{
    const char *spec_path = NULL, *arm_name = NULL, *kind = "scale",
               *stages = "attn_norm,q_proj,q_rope,scores,attn,attn_out,ffn_norm,gate,swiglu,ffn_out,residual";
    int layer = -2, steps = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (spec_path) return usage("unexpected argument '%s'", a);
            spec_path = a;
            continue;
        }
        if (i + 1 >= argc) return usage("option '%s' needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--arm")) arm_name = v;
        else if (!strcmp(a, "--kind")) {
            if (strcmp(v, "scale") && strcmp(v, "noise")) return usage("--kind: expected scale or noise, got '%s'", v);
            kind = v;
        } else if (!strcmp(a, "--stages")) stages = v;
        else if (!strcmp(a, "--layer") || !strcmp(a, "--steps")) {
            if (common_parse_int(v, 0, 100000, !strcmp(a, "--layer") ? &layer : &steps) < 0)
                return usage("expected a number >= 0, got '%s'", v);
        } else
            return usage("unknown option '%s'", a);
    }
    if (!spec_path) return usage("expected a SPEC file%s", "");
    tg_err e;
    tg_spec *s = NULL;
    if (spec_load(&s, spec_path, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return 2;
    }
    char actual[65];
    if (spec_check_artifact(s, actual, NULL, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        spec_free(s);
        return 2;
    }
    int arm = -1;
    for (int i = 0; i < s->n_arms; i++) {
        const spec_arm *sa = &s->arms[i];
        if (arm_name ? !strcmp(sa->name, arm_name)
                     : sa->kind == SPEC_ARM_ENGINE && i != s->ref_index && !(sa->tier && !strcmp(sa->tier, "ref"))) {
            arm = i;
            break;
        }
    }
    if (arm < 0 || s->arms[arm].kind != SPEC_ARM_ENGINE) {
        fprintf(stderr, "tokgate: power: %s\n", arm_name ? "--arm must name an engine arm of the spec"
                                                        : "the spec has no engine arm to perturb (give --arm)");
        spec_free(s);
        return 2;
    }
    char bins[4096];
    gate_bin_dir(bins, sizeof bins);
    pw_ctx c = {.s = s, .bin_dir = bins, .arm = arm, .steps = steps ? steps : s->steps,
                .band = strcmp(s->policy_kind, "near-tie") ? 0.0 : s->band};
    if (c.steps > s->steps) c.steps = s->steps;
    c.ref = calloc((size_t)s->n_prompts, sizeof *c.ref);
    int rc = 2;
    /* the probed layer: the middle one, from the arm's model answer */
    if (layer == -2) {
        tg_arm *a = NULL;
        char *ans = NULL;
        if (start(s, arm, bins, s->arms[arm].options_json, &a, &ans, &e) < 0) goto fail;
        stop(a);
        json_error_t je;
        json_t *j = json_loads(ans, 0, &je);
        layer = (int)json_integer_value(json_object_get(json_object_get(j, "model"), "n_layer")) / 2;
        json_decref(j);
        free(ans);
    }
    if (run_reference(&c, &e) < 0) goto fail;
    if ((c.base_flips = gate_flips(&c, NULL, &e)) < 0) goto fail;
    printf("tokgate power %s: arm %s, perturbation %s=E at layer %d, %d prompts x %d steps (reference %s,"
           " band %g; the unperturbed arm fails %d step(s))\n",
           s->name, s->arms[arm].name, kind, layer, s->n_prompts, c.steps, s->reference, c.band, c.base_flips);
    printf("%-10s %14s %14s\n", "STAGE", "GATE_MIN_E", "REPLAY_MIN_E");
    char list[1024];
    snprintf(list, sizeof list, "%s", stages);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int st = replay_stage_parse(tok);
        if (st < 0) {
            tg_errf(&e, "--stages: '%s' is not a replay stage", tok);
            goto fail;
        }
        int ly = st == 20 || st == 21 ? -1 : layer;
        int g = smallest(&c, 0, kind, ly, st, &e);
        if (g < 0) goto fail;
        int r = smallest(&c, 1, kind, ly, st, &e);
        if (r < 0) goto fail;
        char gs[32], rs[32];
        if (g < N_LADDER) snprintf(gs, sizeof gs, "%g", LADDER[g]); else snprintf(gs, sizeof gs, "> %g", LADDER[N_LADDER - 1]);
        if (r < N_LADDER) snprintf(rs, sizeof rs, "%g", LADDER[r]); else snprintf(rs, sizeof rs, "> %g", LADDER[N_LADDER - 1]);
        printf("%-10s %14s %14s\n", tok, gs, rs);
        printf("POWER.%s.GATE=%s\nPOWER.%s.REPLAY=%s\n", tok, gs, tok, rs);
        fflush(stdout);
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "tokgate: power: %s\n", e.msg);
    for (int p = 0; p < s->n_prompts; p++) {
        free(c.ref[p].ids);
        free(c.ref[p].tok);
        free(c.ref[p].gap);
    }
    free(c.ref);
    spec_free(s);
    return rc;
}
