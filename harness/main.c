/*
 * main.c: the tokgate command line. Each command is one function that
 * parses its own options, calls the modules (spec, gate, verdict, report)
 * and returns the process exit code: 0 pass, 1 fail or not measurable (or
 * bench refused), 2 usage or input error.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>

#include "arm.h"
#include "gate.h"
#include "power.h"
#include "replay.h"
#include "report.h"
#include "spec.h"
#include "store.h"
#include "verdict.h"
#include "sweep.h"
#include "trend.h"
#include "merge.h"
#include "localize.h"

#define EXIT_FAIL 1
#define EXIT_USAGE 2

static const char USAGE[] =
    "usage: tokgate COMMAND [ARGS]\n"
    "\n"
    "  gate SPEC [--db FILE] [--jobs N] [--resume RUN] [--band X] [--policy P]\n"
    "            [--format text|md|junit|json] [--out FILE] [--evidence DIR]\n"
    "                           run a spec, store it, score it, print the verdicts\n"
    "  report [RUN] [--db FILE] [--format F] [--out FILE] [--set N]\n"
    "                           the report of a run (default: the latest)\n"
    "  step P/S [RUN] [--db FILE] [--set N]\n"
    "                           one step of one prompt across all arms and oracle variants\n"
    "  power SPEC [--arm NAME] [--layer L] [--kind scale|noise] [--stages S,...] [--steps N]\n"
    "  localize P/S [RUN] --arms A,B [--third C] [--spec FILE] [--db FILE] [--evidence DIR]\n"
    "                           per layer and stage error of B against A over the same\n"
    "                           prefix; names the first stage over the noise floor\n"
    "  rescore RUN [--db FILE] [--band X] [--policy exact|near-tie|noise]\n"
    "                           verdicts again from the stored rows (a new verdict set)\n"
    "  bench SPEC [--db FILE]   prefill/decode tokens/s per arm; refused unless the\n"
    "                           latest gate of SPEC passed on the same binaries and model\n"
    "  sweep SWEEP.yaml [--db FILE] [--jobs N] [--only SPEC]\n"
    "                           run every spec of a sweep file, one run each; a summary table\n"
    "  trend [SPEC] [--db FILE] [--format text|md] [--out FILE] [--svg DIR]\n"
    "                           latest run of each spec against its history; exit 1 on a regression\n"
    "  plan SWEEP.yaml --shards N [--out PLAN]\n"
    "                           split a sweep into N shards (a plan file, default tokgate-plan.json)\n"
    "  run --shard I/N [PLAN] [--db FILE] [--jobs N]\n"
    "                           run shard I of N into its own store (default tokgate-shard-I-of-N.db)\n"
    "  merge A.db [B.db ...] -o ALL.db\n"
    "                           merge stores (idempotent; conflicting runs are an error)\n"
    "  version                  print the version\n"
    "  help                     this text\n"
    "\n"
    "The store is tokgate.db in the current directory unless --db is given.\n"
    "Workers (tg-engine, tg-llama) are looked up in $TOKGATE_BIN, else beside tokgate.\n"
    "Exit status: 0 pass, 1 fail or not measurable, 2 usage or input error.\n";

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "tokgate: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(run `tokgate help` for usage)\n");
    return EXIT_USAGE;
}

/* Options shared by the commands; each command says which it accepts. */
typedef struct opts {
    const char *db, *format, *out, *evidence, *policy;
    const char *pos[3];
    int n_pos;
    int jobs, set;
    int64_t resume;
    double band;
} opts;

static int parse_long(const char *s, long lo, long hi, long *v)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (!*s || *end || errno || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* Parses argv[from..] against the allowed option names (a space-separated
 * list). Returns 0 or the exit code of a usage error. */
static int parse_opts(int argc, char **argv, int from, const char *allowed, int max_pos, opts *o)
{
    memset(o, 0, sizeof *o);
    o->db = "tokgate.db";
    o->format = "text";
    o->band = -1;
    for (int i = from; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == 0) {
            if (o->n_pos >= max_pos) return usage_error("unexpected argument '%s'", a);
            o->pos[o->n_pos++] = a;
            continue;
        }
        char key[64];
        snprintf(key, sizeof key, " %s ", a);
        char list[256];
        snprintf(list, sizeof list, " %s ", allowed);
        if (!strstr(list, key)) return usage_error("unknown option '%s' for this command", a);
        if (i + 1 >= argc) return usage_error("option '%s' needs a value", a);
        const char *v = argv[++i];
        long x;
        if (!strcmp(a, "--db")) o->db = v;
        else if (!strcmp(a, "--format")) o->format = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--evidence")) o->evidence = v;
        else if (!strcmp(a, "--policy")) {
            if (strcmp(v, "exact") && strcmp(v, "near-tie") && strcmp(v, "noise"))
                return usage_error("--policy: expected exact, near-tie or noise, got '%s'", v);
            o->policy = v;
        } else if (!strcmp(a, "--jobs")) {
            if (parse_long(v, 1, 256, &x) < 0) return usage_error("--jobs: expected an integer 1..256, got '%s'", v);
            o->jobs = (int)x;
        } else if (!strcmp(a, "--set")) {
            if (parse_long(v, 1, INT_MAX, &x) < 0) return usage_error("--set: expected a verdict set number >= 1, got '%s'", v);
            o->set = (int)x;
        } else if (!strcmp(a, "--resume")) {
            if (parse_long(v, 1, LONG_MAX, &x) < 0) return usage_error("--resume: expected a run id >= 1, got '%s'", v);
            o->resume = x;
        } else if (!strcmp(a, "--band")) {
            char *end;
            errno = 0;
            double b = strtod(v, &end);
            if (!*v || *end || errno || !isfinite(b) || b < 0)
                return usage_error("--band: expected a number of logits >= 0, got '%s'", v);
            o->band = b;
        }
    }
    return 0;
}

static int open_store(const char *db, tg_store **st)
{
    tg_err e;
    if (store_open(st, db, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return EXIT_USAGE;
    }
    return 0;
}

/* Opens --out (or stdout). */
static FILE *open_out(const char *path)
{
    if (!path) return stdout;
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "tokgate: --out %s: %s\n", path, strerror(errno));
    return f;
}

static int close_out(FILE *f, const char *path)
{
    if (f == stdout) return fflush(stdout) == 0 ? 0 : -1;
    int rc = fclose(f);
    if (rc != 0) fprintf(stderr, "tokgate: --out %s: write error\n", path);
    return rc;
}

/* A run id from a positional argument, or the latest run. Returns 0 or an exit code. */
static int pick_run(tg_store *st, const char *arg, int64_t *run)
{
    long x;
    tg_err e;
    if (arg) {
        if (parse_long(arg, 1, LONG_MAX, &x) < 0) return usage_error("expected a run id (an integer >= 1), got '%s'", arg);
        *run = x;
        return 0;
    }
    int r = store_latest_run(st, NULL, run, &e);
    if (r < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return EXIT_USAGE;
    }
    if (r == 0) {
        fprintf(stderr, "tokgate: the store has no runs yet (run `tokgate gate SPEC` first)\n");
        return EXIT_USAGE;
    }
    return 0;
}

/* Writes the markdown evidence of run into dir/<spec>-run<N>.md. */
static int write_evidence(tg_store *st, int64_t run, const char *dir, const char *name)
{
    mkdir(dir, 0777);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s-run%lld.md", dir, name, (long long)run);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "tokgate: --evidence %s: %s\n", path, strerror(errno));
        return -1;
    }
    report_options ro = {.format = REPORT_MD};
    tg_err e;
    int rc = report_write(st, run, &ro, f, &e);
    if (fclose(f) != 0 && rc == 0) {
        fprintf(stderr, "tokgate: %s: write error\n", path);
        return -1;
    }
    if (rc < 0) {
        fprintf(stderr, "tokgate: evidence: %s\n", e.msg);
        return -1;
    }
    fprintf(stderr, "tokgate: evidence written to %s\n", path);
    return 0;
}

static int cmd_gate(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, 2,
                        "--db --jobs --resume --band --policy --format --out --evidence", 1, &o);
    if (rc) return rc;
    if (o.n_pos != 1) return usage_error("gate: expected one SPEC file%s", "");
    tg_err e;
    report_format fmt;
    if (report_parse_format(o.format, &fmt, &e) < 0) return usage_error("%s", e.msg);
    tg_spec *spec;
    if (spec_load(&spec, o.pos[0], &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return EXIT_USAGE;
    }
    tg_store *st = NULL;
    if ((rc = open_store(o.db, &st))) {
        spec_free(spec);
        return rc;
    }
    char bins[PATH_MAX];
    gate_bin_dir(bins, sizeof bins);
    gate_options go = {.bin_dir = bins, .jobs = o.jobs, .resume_run = o.resume, .progress = isatty(2)};
    gate_result gr;
    double t0 = tg_now();
    if (gate_run(st, spec, &go, &gr, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        if (gr.run_id > 0) store_finish_run(st, gr.run_id, "ERROR", NULL);
        store_close(st);
        spec_free(spec);
        return EXIT_USAGE;
    }
    /* The harness's own share of the wall time: tokgate's CPU time (all its
     * threads: spawning, protocol parsing, the store) against the wall time
     * the legs took. The arms' time is theirs, not the harness's. */
    double wall = tg_now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
                 ru.ru_stime.tv_usec * 1e-6;
    fprintf(stderr, "tokgate: run %lld: %d legs run (%d with a fault), %d already stored; "
            "wall %.1f s, harness cpu %.2f s (%.1f%% of wall)\n",
            (long long)gr.run_id, gr.legs_run, gr.legs_faulted, gr.legs_skipped, wall, cpu,
            wall > 0 ? 100.0 * cpu / wall : 0.0);
    verdict_options vo = verdict_options_default();
    vo.band = o.band;
    vo.policy_kind = o.policy;
    verdict_result vr;
    if (verdict_score_run(st, gr.run_id, &vo, &vr, &e) < 0) {
        fprintf(stderr, "tokgate: scoring run %lld: %s\n", (long long)gr.run_id, e.msg);
        store_finish_run(st, gr.run_id, "ERROR", NULL);
        store_close(st);
        spec_free(spec);
        return EXIT_USAGE;
    }
    int replay_failed = 0;
    if (replay_gate(st, spec, gr.run_id, vr.set, bins, stderr, &replay_failed, &e) < 0) {
        fprintf(stderr, "tokgate: replay: %s\n", e.msg);
        store_finish_run(st, gr.run_id, "ERROR", NULL);
        store_close(st);
        spec_free(spec);
        return EXIT_USAGE;
    }
    if (replay_failed) {
        snprintf(vr.verdict, sizeof vr.verdict, "FAIL");
        vr.exit_code = EXIT_FAIL;
    }
    if (store_finish_run(st, gr.run_id, vr.verdict, &e) < 0) fprintf(stderr, "tokgate: %s\n", e.msg);
    rc = vr.exit_code;
    FILE *out = open_out(o.out);
    if (!out) rc = EXIT_USAGE;
    else {
        report_options ro = {.format = fmt};
        if (report_write(st, gr.run_id, &ro, out, &e) < 0) {
            fprintf(stderr, "tokgate: report: %s\n", e.msg);
            rc = EXIT_USAGE;
        }
        /* the machine keys always reach stdout in text form */
        if (fmt != REPORT_TEXT || out != stdout) report_write_keys(st, gr.run_id, 0, stdout, NULL);
        if (close_out(out, o.out) < 0) rc = EXIT_USAGE;
    }
    if (o.evidence && write_evidence(st, gr.run_id, o.evidence, spec->name) < 0) rc = EXIT_USAGE;
    store_close(st);
    spec_free(spec);
    return rc;
}

static int cmd_report(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, 2, "--db --format --out --set", 1, &o);
    if (rc) return rc;
    tg_err e;
    report_format fmt;
    if (report_parse_format(o.format, &fmt, &e) < 0) return usage_error("%s", e.msg);
    tg_store *st;
    if ((rc = open_store(o.db, &st))) return rc;
    int64_t run;
    if ((rc = pick_run(st, o.n_pos ? o.pos[0] : NULL, &run))) {
        store_close(st);
        return rc;
    }
    FILE *out = open_out(o.out);
    if (!out) {
        store_close(st);
        return EXIT_USAGE;
    }
    report_options ro = {.format = fmt, .verdict_set = o.set};
    if (report_write(st, run, &ro, out, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        rc = EXIT_USAGE;
    }
    if (close_out(out, o.out) < 0) rc = EXIT_USAGE;
    if (rc == 0) {
        char word[16];
        if (verdict_get_overall(st, run, o.set, word, &e) == 0) rc = strcmp(word, "PASS") ? EXIT_FAIL : 0;
    }
    store_close(st);
    return rc;
}

static int cmd_step(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, 2, "--db --set", 2, &o);
    if (rc) return rc;
    if (o.n_pos < 1) return usage_error("step: expected P/S (a prompt id and a step, e.g. p1/45)%s", "");
    tg_err e;
    char prompt[64];
    int step;
    if (report_parse_step_ref(o.pos[0], prompt, &step, &e) < 0) return usage_error("%s", e.msg);
    tg_store *st;
    if ((rc = open_store(o.db, &st))) return rc;
    int64_t run;
    if ((rc = pick_run(st, o.n_pos > 1 ? o.pos[1] : NULL, &run))) {
        store_close(st);
        return rc;
    }
    if (report_step(st, run, prompt, step, o.set, stdout, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        rc = EXIT_USAGE;
    }
    store_close(st);
    return rc;
}

static int cmd_rescore(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, 2, "--db --band --policy", 1, &o);
    if (rc) return rc;
    if (o.n_pos != 1) return usage_error("rescore: expected a RUN id%s", "");
    tg_store *st;
    if ((rc = open_store(o.db, &st))) return rc;
    int64_t run;
    if ((rc = pick_run(st, o.pos[0], &run))) {
        store_close(st);
        return rc;
    }
    verdict_options vo = verdict_options_default();
    vo.band = o.band;
    vo.policy_kind = o.policy;
    verdict_result vr;
    tg_err e;
    if (verdict_score_run(st, run, &vo, &vr, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        store_close(st);
        return EXIT_USAGE;
    }
    printf("run %lld rescored as verdict set %d (policy %s, band %g)\n", (long long)run, vr.set,
           vr.policy_kind, vr.band);
    if (report_write_keys(st, run, vr.set, stdout, &e) < 0) fprintf(stderr, "tokgate: %s\n", e.msg);
    store_close(st);
    return vr.exit_code;
}

/* One arm's speed over the spec's prompts: a single free-running leg. */
static int bench_arm(const tg_spec *s, int ai, const char *bins, double *pre_tps, double *dec_tps, tg_err *e)
{
    const spec_arm *sa = &s->arms[ai];
    char **argv = spec_arm_argv(s, ai, bins, e);
    if (!argv) return -1;
    arm_config cfg = {.name = sa->name, .argv = argv, .timeout_request = sa->timeout_request,
                      .timeout_leg = sa->timeout_leg};
    tg_arm *a;
    int rc = arm_start(&a, &cfg, e);
    spec_argv_free(argv);
    if (rc < 0) return -1;
    double pre_ms = 0, dec_ms = 0;
    long pre_tok = 0, dec_tok = 0;
    rc = arm_hello(a, NULL, e) == 0 && arm_load(a, s->model_path, sa->options_json, NULL, e) == 0 ? 0 : -1;
    for (int p = 0; rc == 0 && p < s->n_prompts; p++) {
        int32_t *ids;
        int n;
        if (arm_tokenize(a, s->prompts[p].text, 0, &ids, &n, e) < 0) { rc = -1; break; }
        arm_decode_req q = {.prompt = ids, .n_prompt = n, .steps = s->steps, .top_k = s->top_k};
        arm_decode_res r;
        if (arm_decode(a, &q, &r, NULL, NULL, e) < 0) rc = -1;
        else if (isnan(r.ms_prefill) || isnan(r.ms_decode)) {
            tg_errf(e, "arm %s: decode: the answer has no \"ms\" prefill/decode figures", sa->name);
            rc = -1;
        } else {
            pre_ms += r.ms_prefill;
            dec_ms += r.ms_decode;
            pre_tok += n;
            dec_tok += s->steps - 1;   /* step 0 comes from the prefill */
        }
        arm_decode_res_free(&r);
        free(ids);
    }
    arm_exit x;
    arm_finish(a, &x);
    if (rc == 0 && x.cause) rc = tg_errf(e, "arm %s: %s", sa->name, x.cause);
    arm_free(a);
    if (rc < 0) return -1;
    *pre_tps = pre_ms > 0 ? pre_tok / (pre_ms / 1000.0) : NAN;
    *dec_tps = dec_ms > 0 ? dec_tok / (dec_ms / 1000.0) : NAN;
    return 0;
}

static int cmd_bench(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, 2, "--db", 1, &o);
    if (rc) return rc;
    if (o.n_pos != 1) return usage_error("bench: expected one SPEC file%s", "");
    tg_err e;
    tg_spec *s;
    if (spec_load(&s, o.pos[0], &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return EXIT_USAGE;
    }
    char art[65];
    if (spec_check_artifact(s, art, NULL, &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        spec_free(s);
        return EXIT_USAGE;
    }
    tg_store *st;
    if ((rc = open_store(o.db, &st))) {
        spec_free(s);
        return rc;
    }
    char bins[PATH_MAX];
    gate_bin_dir(bins, sizeof bins);
    char (*hex)[65] = calloc((size_t)s->n_arms, sizeof *hex);
    const char **list = calloc((size_t)s->n_arms + 1, sizeof *list);
    if (!hex || !list) abort();
    gate_arm_binaries(s, bins, hex, NULL);
    int n = 0;
    for (int i = 0; i < s->n_arms; i++)
        if (hex[i][0]) list[n++] = hex[i];
    int64_t run;
    int ok = verdict_gate_passed(st, s->name, art, n, list, &run, &e);
    if (ok <= 0) {
        fprintf(stderr, "tokgate: bench refused: %s\n", e.msg);
        rc = ok < 0 ? EXIT_USAGE : EXIT_FAIL;
    } else {
        printf("bench of %s (gate run %lld passed on these binaries and this model)\n", s->name, (long long)run);
        printf("%-20s %16s %16s\n", "arm", "prefill tok/s", "decode tok/s");
        for (int i = 0; i < s->n_arms; i++) {
            if (s->arms[i].kind == SPEC_ARM_COMMAND) continue;
            double pre, dec;
            if (bench_arm(s, i, bins, &pre, &dec, &e) < 0) {
                printf("%-20s %s\n", s->arms[i].name, e.msg);
                rc = EXIT_FAIL;
            } else
                printf("%-20s %16.1f %16.1f\n", s->arms[i].name, pre, dec);
        }
    }
    free(hex);
    free(list);
    store_close(st);
    spec_free(s);
    return rc;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        fputs(USAGE, stderr);
        return EXIT_USAGE;
    }
    const char *c = argv[1];
    if (!strcmp(c, "gate")) return cmd_gate(argc, argv);
    if (!strcmp(c, "report")) return cmd_report(argc, argv);
    if (!strcmp(c, "step")) return cmd_step(argc, argv);
    if (!strcmp(c, "rescore")) return cmd_rescore(argc, argv);
    if (!strcmp(c, "bench")) return cmd_bench(argc, argv);
    if (!strcmp(c, "sweep")) return sweep_main(argc, argv);
    if (!strcmp(c, "trend")) return trend_main(argc, argv);
    if (!strcmp(c, "plan")) return sweep_plan_main(argc, argv);
    if (!strcmp(c, "run")) return sweep_run_main(argc, argv);
    if (!strcmp(c, "merge")) return merge_main(argc, argv);
    if (!strcmp(c, "localize")) return localize_main(argc, argv);
    if (!strcmp(c, "power")) return power_main(argc, argv);
    if (!strcmp(c, "version") || !strcmp(c, "--version")) {
        printf("tokgate %s\n", TOKGATE_VERSION);
        return 0;
    }
    if (!strcmp(c, "help") || !strcmp(c, "--help") || !strcmp(c, "-h")) {
        fputs(USAGE, stdout);
        return 0;
    }
    return usage_error("unknown command '%s'", c);
}
