/*
 * main.c: the tokgate command line. Each command is one function that
 * parses its options with getopt_long (common_cli_parse: `tokgate CMD
 * --help` prints the command's usage and exits 0; an unknown option is one
 * line naming it and the command, exit 2), calls the modules (spec, gate,
 * verdict, report) and returns the process exit code: 0 pass, 1 fail or not
 * measurable (or bench refused), 2 usage or input error. sweep, trend,
 * plan, run and merge parse their own options (sweep.c, trend.c, merge.c);
 * their --help is answered here from the same table.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>

#include "arm.h"
#include "calibrate.h"
#include "common.h"
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

/* The summary `tokgate help` prints; each command's own text follows. */
static const char USAGE[] =
    "usage: tokgate COMMAND [ARGS]   (tokgate COMMAND --help: that command's usage)\n"
    "\n"
    "  gate SPEC [--db FILE] [--jobs N] [--resume RUN] [--band X] [--policy P]\n"
    "            [--format text|md|junit|json] [--out FILE] [--evidence DIR]\n"
    "                           run a spec, store it, score it, print the verdicts\n"
    "  report [RUN] [--db FILE] [--format F] [--out FILE] [--set N]\n"
    "                           the report of a run (default: the latest)\n"
    "  step P/S [RUN] [--db FILE] [--set N]\n"
    "                           one step of one prompt across all arms and oracle variants\n"
    "  localize P/S [RUN] --arms A,B [--third C] [--spec FILE] [--db FILE] [--evidence DIR]\n"
    "                           stage replay against the exact arbiter and the per layer and\n"
    "                           stage error of B against A over the same prefix; names the\n"
    "                           stages over budget and the first over the noise floor\n"
    "  power SPEC [--arm NAME] [--layer L] [--kind scale|noise] [--stages S,...] [--steps N]\n"
    "                           the smallest perturbation per stage the token gate and stage\n"
    "                           replay detect\n"
    "  rescore [RUN] [--db FILE] [--band X] [--policy exact|near-tie|noise|calibrated|error-budget]\n"
    "                           verdicts again from the stored rows (a new verdict set;\n"
    "                           default: the latest run)\n"
    "  calibrate SPEC [--db FILE] [--jobs N]\n"
    "                           run a spec's panel of legitimate variants and store the\n"
    "                           calibration (bands, control limits) later runs may use\n"
    "  bench SPEC [--db FILE]   prefill/decode tokens/s per arm; refused unless the\n"
    "                           latest gate of SPEC passed on the same binaries and model\n"
    "  sweep SWEEP.yaml [--db FILE] [--jobs N] [--only SPEC]\n"
    "                           run every spec of a sweep file, one run each; a summary table\n"
    "  trend [SPEC...] [--db FILE] [--window N] [--plan PLAN] [--format text|md] [--out FILE] [--svg DIR]\n"
    "                           latest run of each spec against its last N good runs; exit 1 on a regression\n"
    "  baseline accept|exclude|clear RUN --reason TEXT [--db FILE] | baseline list [SPEC] [--db FILE]\n"
    "                           a team's decisions about runs for the trend, kept in the store\n"
    "  plan SWEEP.yaml --shards N [--out PLAN] [--cpus-per-task C]\n"
    "                           split a sweep into N shards (a plan file, default tokgate-plan.json)\n"
    "  run --shard I/N [PLAN] [--db FILE] [--jobs N]\n"
    "                           run shard I of N into its own store (default tokgate-shard-I-of-N.db)\n"
    "  merge A.db [B.db ...] -o ALL.db\n"
    "                           merge stores (idempotent; conflicting runs are an error)\n"
    "  version                  print the version\n"
    "  help [COMMAND]           this text, or a command's usage\n"
    "\n"
    "The store is tokgate.db in the current directory unless --db is given.\n"
    "Workers (tg-engine, tg-llama) are looked up in $TOKGATE_BIN, else beside tokgate.\n"
    "Exit status: 0 pass, 1 fail or not measurable, 2 usage or input error.\n";

#define FOOTER                                                                        \
    "\n  --db FILE    the store (default tokgate.db in the current directory)\n"      \
    "\nExit status: 0 pass, 1 fail or not measurable, 2 usage or input error.\n"

static const char USAGE_GATE[] =
    "usage: tokgate gate SPEC [--db FILE] [--jobs N] [--resume RUN] [--band X] [--policy P]\n"
    "                    [--format text|md|junit|json] [--out FILE] [--evidence DIR]\n"
    "\n"
    "Runs the spec's arms (prompts x arms x legs), stores every leg, scores the run and\n"
    "prints the report; the machine keys (TOKEN_GATE=...) always reach stdout.\n"
    "\n"
    "  --jobs N         legs run side by side (default: the spec's jobs, while the legs'\n"
    "                   threads fit in the CPUs)\n"
    "  --resume RUN     continue an interrupted run of the same spec, skipping stored legs\n"
    "  --band X         near-tie band in logits (default: the spec's)\n"
    "  --policy P       exact | near-tie | noise (default: the spec's)\n"
    "  --format F       text | md | junit | json (default text)\n"
    "  --out FILE       write the report there instead of stdout (never the store)\n"
    "  --evidence DIR   also write DIR/<spec>-run<N>.md\n" FOOTER;

static const char USAGE_REPORT[] =
    "usage: tokgate report [RUN] [--db FILE] [--format text|md|junit|json] [--out FILE] [--set N]\n"
    "\n"
    "Prints the report of a stored run (default: the latest run) from its verdict set\n"
    "(default: the latest set). Exit 0 when that set says PASS, else 1.\n"
    "\n"
    "  --format F       text | md | junit | json (default text)\n"
    "  --out FILE       write the report there instead of stdout (never the store)\n"
    "  --set N          the verdict set to show\n" FOOTER;

static const char USAGE_STEP[] =
    "usage: tokgate step P/S [RUN] [--db FILE] [--set N]\n"
    "\n"
    "One step of one prompt (e.g. p4/43) across every arm and oracle variant of a run\n"
    "(default: the latest run): tokens, top-2 logits, gaps, class, rank, token texts.\n"
    "\n"
    "  --set N          the verdict set to show (default: the latest)\n" FOOTER;

static const char USAGE_RESCORE[] =
    "usage: tokgate rescore [RUN] [--db FILE] [--band X] [--policy exact|near-tie|noise]\n"
    "\n"
    "Scores a stored run again (default: the latest run) and stores a new verdict set;\n"
    "the gate's original verdict stays. Prints the machine keys; exit 0 on PASS, else 1.\n"
    "\n"
    "  --band X         near-tie band in logits (default: the run's)\n"
    "  --policy P       exact | near-tie | noise (default: the run's)\n" FOOTER;

static const char USAGE_BENCH[] =
    "usage: tokgate bench SPEC [--db FILE]\n"
    "\n"
    "Prefill and decode tokens/s of every protocol arm of SPEC, one free-running leg each;\n"
    "refused (exit 1) unless the latest gate run of SPEC on the same binaries and model\n"
    "passed.\n" FOOTER;

static const char USAGE_SWEEP[] =
    "usage: tokgate sweep SWEEP.yaml [--db FILE] [--jobs N] [--only SPEC]\n"
    "\n"
    "Runs every spec of a sweep file, one gate run each, and prints a summary table\n"
    "(docs/sweep.md).\n"
    "\n"
    "  --jobs N         legs run side by side in each gate\n"
    "  --only SPEC      run only the spec of that name\n" FOOTER;

static const char USAGE_TREND[] =
    "usage: tokgate trend [SPEC...] [--db FILE] [--window N] [--plan PLAN] [--format text|md]\n"
    "                    [--out FILE] [--svg DIR]\n"
    "\n"
    "The latest run of each spec (or of SPEC) against its last N good runs; exit 1 on a\n"
    "regression (docs/sweep.md).\n"
    "\n"
    "  --window N       good runs a run is compared with (default 5)\n"
    "  --plan PLAN      only the specs of that plan file (tonight's sweep)\n"
    "  --format F       text | md (default text)\n"
    "  --out FILE       write the table there instead of stdout (never the store)\n"
    "  --svg DIR        also write DIR/<spec>-trend.svg\n" FOOTER;

static const char USAGE_BASELINE[] =
    "usage: tokgate baseline accept|exclude|clear RUN --reason TEXT [--db FILE]\n"
    "       tokgate baseline list [SPEC] [--db FILE]\n"
    "\n"
    "A team's decisions about runs for the trend, kept in the store with the reason,\n"
    "time and user: accept makes a run a good run (a baseline), exclude keeps a run out\n"
    "of the trend, clear removes the decision (docs/sweep.md).\n"
    "\nExit status: 0 done, 2 usage or input error.\n";

static const char USAGE_CALIBRATE[] =
    "usage: tokgate calibrate SPEC [--db FILE] [--jobs N]\n"
    "\n"
    "Runs the spec's panel of legitimate variants (arms with variant_of) and stores the\n"
    "calibration: the band each step's panel spans and every arm's control limits, which\n"
    "later runs of a spec with calibration: {from: NAME} are judged by (docs/verdicts.md).\n"
    "\nExit status: 0 stored, 1 the panel could not be measured, 2 usage or input error.\n";

static const char USAGE_PLAN[] =
    "usage: tokgate plan SWEEP.yaml --shards N [--out PLAN]\n"
    "\n"
    "Splits a sweep into N shards and writes a plan file (default tokgate-plan.json) for\n"
    "`tokgate run --shard I/N` (docs/sweep.md).\n"
    "\nExit status: 0 written, 2 usage or input error.\n";

static const char USAGE_RUN[] =
    "usage: tokgate run --shard I/N [PLAN] [--db FILE] [--jobs N]\n"
    "\n"
    "Runs shard I of N of a plan (default tokgate-plan.json) into its own store (default\n"
    "tokgate-shard-I-of-N.db); a complete shard store is reported, not run again.\n"
    "\n"
    "  --jobs N         legs run side by side in each gate\n" FOOTER;

static const char USAGE_MERGE[] =
    "usage: tokgate merge A.db [B.db ...] -o ALL.db\n"
    "\n"
    "Copies the runs of the stores A, B, ... into ALL.db (created when missing).\n"
    "Idempotent: a run already there is skipped; a conflicting run is an error.\n"
    "\nExit status: 0 merged, 2 usage or input error.\n";

static const char USAGE_VERSION[] = "usage: tokgate version\n\nPrints the version.\n";
static const char USAGE_HELP[] = "usage: tokgate help [COMMAND]\n\nThe summary of every command, or COMMAND's usage.\n";

/* Options of the commands parsed here (the ids on_opt receives). */
enum {
    OPT_DB = COMMON_CLI_FIRST_ID, OPT_FORMAT, OPT_OUT, OPT_EVIDENCE, OPT_POLICY, OPT_JOBS, OPT_SET, OPT_RESUME,
    OPT_BAND
};

/* Option values shared by the commands; each command's table says which it
 * accepts. */
typedef struct opts {
    const char *db, *format, *out, *evidence, *policy;
    const char *pos[3];
    int n_pos;
    int jobs, set;
    int64_t resume;
    double band;
} opts;

/* common_cli_fn: checks and stores one option value into an opts. */
static int on_opt(void *ud, int id, const char *v, tg_err *e)
{
    opts *o = ud;
    long x;
    switch (id) {
    case OPT_DB: o->db = v; break;
    case OPT_FORMAT: o->format = v; break;
    case OPT_OUT: o->out = v; break;
    case OPT_EVIDENCE: o->evidence = v; break;
    case OPT_POLICY:
        if (strcmp(v, "exact") && strcmp(v, "near-tie") && strcmp(v, "noise") && strcmp(v, "calibrated") &&
            strcmp(v, "error-budget"))
            return tg_errf(e, "--policy: expected exact, near-tie, noise, calibrated or error-budget, got '%s'", v);
        o->policy = v;
        break;
    case OPT_JOBS:
        if (common_parse_long(v, 1, 256, &x) < 0) return tg_errf(e, "--jobs: expected an integer 1..256, got '%s'", v);
        o->jobs = (int)x;
        break;
    case OPT_SET:
        if (common_parse_long(v, 1, INT_MAX, &x) < 0)
            return tg_errf(e, "--set: expected a verdict set number >= 1, got '%s'", v);
        o->set = (int)x;
        break;
    case OPT_RESUME:
        if (common_parse_long(v, 1, LONG_MAX, &x) < 0) return tg_errf(e, "--resume: expected a run id >= 1, got '%s'", v);
        o->resume = x;
        break;
    case OPT_BAND: {
        char *end;
        errno = 0;
        double b = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(b) || b < 0)
            return tg_errf(e, "--band: expected a number of logits >= 0, got '%s'", v);
        o->band = b;
        break;
    }
    default: return tg_errf(e, "option id %d not handled", id);
    }
    return 0;
}

#define O_DB {"db", required_argument, NULL, OPT_DB}
#define O_FORMAT {"format", required_argument, NULL, OPT_FORMAT}
#define O_OUT {"out", required_argument, NULL, OPT_OUT}
#define O_EVIDENCE {"evidence", required_argument, NULL, OPT_EVIDENCE}
#define O_POLICY {"policy", required_argument, NULL, OPT_POLICY}
#define O_JOBS {"jobs", required_argument, NULL, OPT_JOBS}
#define O_SET {"set", required_argument, NULL, OPT_SET}
#define O_RESUME {"resume", required_argument, NULL, OPT_RESUME}
#define O_BAND {"band", required_argument, NULL, OPT_BAND}

/* Parses a command's argv (argv[1] is the command word) into *o with the
 * defaults set. Returns 0 to go on, or the exit code to return (0 after
 * --help, 2 on a usage error, the message printed). */
static int parse_opts(const common_cli *cli, int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->db = "tokgate.db";
    o->format = "text";
    o->band = -1;
    int rc = common_cli_parse(cli, argc - 1, argv + 1, on_opt, o, o->pos, &o->n_pos);
    return rc == COMMON_CLI_HELP ? -1 : rc;
}

/* A usage error of cmd: one line on stderr; returns 2. */
__attribute__((format(printf, 2, 3)))
static int usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tokgate %s: %s (see tokgate %s --help)\n", cmd, msg, cmd);
    return EXIT_USAGE;
}

/* A run id from a positional argument, or the latest run. Returns 0 or an exit code. */
static int pick_run(tg_store *st, const char *cmd, const char *arg, int64_t *run)
{
    long x;
    tg_err e;
    if (arg) {
        if (common_parse_long(arg, 1, LONG_MAX, &x) < 0)
            return usage_error(cmd, "expected a run id (an integer >= 1), got '%s'", arg);
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

/* Writes the markdown evidence of run into dir/<spec>-run<N>.md (through a
 * temporary file). Returns 0 or -1 (the message printed). */
static int write_evidence(tg_store *st, int64_t run, const char *dir, const char *name, const char *db)
{
    char *path = xasprintf("%s/%s-run%lld.md", dir, name, (long long)run);
    tg_err e;
    common_out o;
    if (common_out_open(&o, path, db, "--evidence", &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        free(path);
        return -1;
    }
    report_options ro = {.format = REPORT_MD};
    int rc = report_write(st, run, &ro, o.f, &e);
    if (rc < 0) fprintf(stderr, "tokgate: evidence: %s\n", e.msg);
    if (common_out_close(&o, rc == 0, &e) < 0) {
        if (rc == 0) fprintf(stderr, "tokgate: --evidence %s\n", e.msg);
        rc = -1;
    }
    if (rc == 0) fprintf(stderr, "tokgate: evidence written to %s\n", path);
    free(path);
    return rc;
}

static int cmd_gate(int argc, char **argv)
{
    static const struct option lo[] = {O_DB, O_JOBS, O_RESUME, O_BAND, O_POLICY, O_FORMAT, O_OUT, O_EVIDENCE, {0}};
    static const common_cli cli = {"gate", USAGE_GATE, lo, 1};
    opts o;
    int rc = parse_opts(&cli, argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.n_pos != 1) return usage_error("gate", "expected one SPEC file");
    tg_err e;
    report_format fmt;
    if (report_parse_format(o.format, &fmt, &e) < 0) return usage_error("gate", "%s", e.msg);
    /* the outputs are checked before anything runs: never the store, folders made */
    if (o.out && common_out_check(o.out, o.db, "--out", &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return EXIT_USAGE;
    }
    if (o.evidence && common_mkdirs(o.evidence, &e) < 0) {
        fprintf(stderr, "tokgate: --evidence %s: %s\n", o.evidence, e.msg);
        return EXIT_USAGE;
    }
    tg_spec *spec;
    if (spec_load(&spec, o.pos[0], &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return EXIT_USAGE;
    }
    tg_store *st = NULL;
    if ((rc = store_open_cmd(&st, o.db, 0))) {
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
        if (gr.run_id > 0) store_finish_run(st, gr.run_id, gr.interrupted ? "INTERRUPTED" : "ERROR", NULL);
        store_close(st);
        spec_free(spec);
        return gr.interrupted ? 128 + gr.interrupted : EXIT_USAGE;
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
    if (gr.cpu_budget > 0)
        fprintf(stderr, "tokgate: run %lld: up to %d legs side by side while their threads fit in %d CPU%s "
                "(at most %d threads at once; --jobs N runs N legs regardless)\n", (long long)gr.run_id,
                gr.jobs, gr.cpu_budget, gr.cpu_budget == 1 ? "" : "s", gr.peak_threads);
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
    common_out out;
    if (common_out_open(&out, o.out, o.db, "--out", &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        rc = EXIT_USAGE;
    } else {
        report_options ro = {.format = fmt};
        int ok = report_write(st, gr.run_id, &ro, out.f, &e) == 0;
        if (!ok) {
            fprintf(stderr, "tokgate: report: %s\n", e.msg);
            rc = EXIT_USAGE;
        }
        if (common_out_close(&out, ok, &e) < 0) {
            fprintf(stderr, "tokgate: --out %s\n", e.msg);
            rc = EXIT_USAGE;
        }
        /* the machine keys always reach stdout in text form */
        if (fmt != REPORT_TEXT || o.out) report_write_keys(st, gr.run_id, 0, stdout, NULL);
    }
    if (o.evidence && write_evidence(st, gr.run_id, o.evidence, spec->name, o.db) < 0) rc = EXIT_USAGE;
    store_close(st);
    spec_free(spec);
    return rc;
}

static int cmd_report(int argc, char **argv)
{
    static const struct option lo[] = {O_DB, O_FORMAT, O_OUT, O_SET, {0}};
    static const common_cli cli = {"report", USAGE_REPORT, lo, 1};
    opts o;
    int rc = parse_opts(&cli, argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    tg_err e;
    report_format fmt;
    if (report_parse_format(o.format, &fmt, &e) < 0) return usage_error("report", "%s", e.msg);
    if (o.out && common_out_check(o.out, o.db, "--out", &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return EXIT_USAGE;
    }
    tg_store *st;
    if ((rc = store_open_cmd(&st, o.db, 2))) return rc;
    int64_t run;
    if ((rc = pick_run(st, "report", o.n_pos ? o.pos[0] : NULL, &run))) {
        store_close(st);
        return rc;
    }
    common_out out;
    if (common_out_open(&out, o.out, o.db, "--out", &e) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        store_close(st);
        return EXIT_USAGE;
    }
    report_options ro = {.format = fmt, .verdict_set = o.set};
    int ok = report_write(st, run, &ro, out.f, &e) == 0;
    if (!ok) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        rc = EXIT_USAGE;
    }
    if (common_out_close(&out, ok, &e) < 0) {
        fprintf(stderr, "tokgate: --out %s\n", e.msg);
        rc = EXIT_USAGE;
    }
    if (rc == 0) {
        char word[16];
        if (verdict_get_overall(st, run, o.set, word, &e) == 0) rc = strcmp(word, "PASS") ? EXIT_FAIL : 0;
    }
    store_close(st);
    return rc;
}

static int cmd_step(int argc, char **argv)
{
    static const struct option lo[] = {O_DB, O_SET, {0}};
    static const common_cli cli = {"step", USAGE_STEP, lo, 2};
    opts o;
    int rc = parse_opts(&cli, argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.n_pos < 1) return usage_error("step", "expected P/S (a prompt id and a step, e.g. p1/45)");
    tg_err e;
    char prompt[64];
    int step;
    if (report_parse_step_ref(o.pos[0], prompt, &step, &e) < 0) return usage_error("step", "%s", e.msg);
    tg_store *st;
    if ((rc = store_open_cmd(&st, o.db, 2))) return rc;
    int64_t run;
    if ((rc = pick_run(st, "step", o.n_pos > 1 ? o.pos[1] : NULL, &run))) {
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
    static const struct option lo[] = {O_DB, O_BAND, O_POLICY, {0}};
    static const common_cli cli = {"rescore", USAGE_RESCORE, lo, 1};
    opts o;
    int rc = parse_opts(&cli, argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    tg_store *st;
    if ((rc = store_open_cmd(&st, o.db, 1))) return rc;
    int64_t run;
    if ((rc = pick_run(st, "rescore", o.n_pos ? o.pos[0] : NULL, &run))) {
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
    static const struct option lo[] = {O_DB, {0}};
    static const common_cli cli = {"bench", USAGE_BENCH, lo, 1};
    opts o;
    int rc = parse_opts(&cli, argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.n_pos != 1) return usage_error("bench", "expected one SPEC file");
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
    if ((rc = store_open_cmd(&st, o.db, 1))) {
        spec_free(s);
        return rc;
    }
    char bins[PATH_MAX];
    gate_bin_dir(bins, sizeof bins);
    char (*hex)[65] = xcalloc((size_t)s->n_arms, sizeof *hex);
    const char **list = xcalloc((size_t)s->n_arms + 1, sizeof *list);
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

/* The commands: those parsed here, and those whose parser lives in their
 * module (usage given here so that `tokgate CMD --help` works alike). */
typedef struct command {
    const char *name;
    const char *usage;       /* NULL: the command's own parser prints it */
    int (*run)(int argc, char **argv);
    int graceful;            /* SIGINT/SIGTERM: end the workers and return (see on_signal) */
} command;

static const char USAGE_POWER[] =
    "usage: tokgate power SPEC [--arm NAME] [--layer L] [--kind scale|noise] [--stages S,S,...] [--steps N]\n"
    "\n"
    "Injects calibrated perturbations (the stage's output times 1+E, or relative noise E) at one\n"
    "stage and layer of an engine arm and reports, per stage, the smallest E on 1e-7..1 that the\n"
    "token gate and stage replay detect (docs/localize.md, \"Power\"). Keys POWER.STAGE.GATE=E,\n"
    "POWER.STAGE.REPLAY=E.\n"
    "\n"
    "  --arm NAME       the engine arm perturbed (default: the first engine arm but the ref tier)\n"
    "  --layer L        the layer (default: the middle one)\n"
    "  --kind K         scale (default) or noise\n"
    "  --stages LIST    replay stages (default: attn_norm,q_proj,q_rope,scores,attn,attn_out,\n"
    "                   ffn_norm,gate,swiglu,ffn_out,residual)\n"
    "  --steps N        steps per prompt (default: the spec's)\n"
    "\n"
    "Exit status: 0 measured, 2 usage, input or arm error.\n";

static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

static const command COMMANDS[] = {
    {"gate", NULL, cmd_gate, 1},
    {"report", NULL, cmd_report},
    {"step", NULL, cmd_step},
    {"localize", NULL, localize_main, 1},
    {"calibrate", USAGE_CALIBRATE, calibrate_main, 1},
    {"power", USAGE_POWER, power_main, 1},
    {"rescore", NULL, cmd_rescore},
    {"bench", NULL, cmd_bench, 1},
    {"sweep", USAGE_SWEEP, sweep_main},
    {"trend", USAGE_TREND, trend_main},
    {"baseline", USAGE_BASELINE, trend_baseline_main},
    {"plan", USAGE_PLAN, sweep_plan_main},
    {"run", USAGE_RUN, sweep_run_main},
    {"merge", USAGE_MERGE, merge_main},
    {"version", USAGE_VERSION, cmd_version},
    {"help", USAGE_HELP, cmd_help},
};
enum { N_COMMANDS = sizeof COMMANDS / sizeof *COMMANDS };

static const command *find_command(const char *name)
{
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(COMMANDS[i].name, name)) return &COMMANDS[i];
    return NULL;
}

static int cmd_version(int argc, char **argv)
{
    if (argc > 2) return usage_error("version", "unexpected argument '%s'", argv[2]);
    printf("tokgate %s\n", TOKGATE_VERSION);
    return 0;
}

/* `tokgate help [COMMAND]`: the summary, or the command's usage (the same
 * text `tokgate COMMAND --help` prints). */
static int cmd_help(int argc, char **argv)
{
    if (argc < 3) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (argc > 3) return usage_error("help", "unexpected argument '%s'", argv[3]);
    const command *c = find_command(argv[2]);
    if (!c) return usage_error("help", "unknown command '%s'", argv[2]);
    if (c->usage) {
        fputs(c->usage, stdout);
        return 0;
    }
    char *av[] = {argv[0], (char *)c->name, "--help", NULL};
    return c->run(3, av);
}

/* SIGINT / SIGTERM. Workers run in their own process groups (a terminal's
 * ^C does not reach them), so tokgate ends them itself: arm_interrupt
 * SIGKILLs every live worker's group. A graceful command (gate, bench,
 * localize) then returns through its normal path (the gate marks its run
 * INTERRUPTED and stores no leg cut short); any other command exits at
 * once (the store is crash-safe). Exit status 128 + the signal (130, 143).
 * A second signal ends tokgate by the default action. */
static void on_signal_graceful(int sig)
{
    arm_interrupt(sig);
}

static void on_signal_exit(int sig)
{
    arm_interrupt(sig);
    _exit(128 + sig);
}

static void install_signals(int graceful)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = graceful ? on_signal_graceful : on_signal_exit;
    sa.sa_flags = SA_RESETHAND;   /* no SA_RESTART: waits return EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        fputs(USAGE, stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--version")) name = "version";
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) name = "help";
    const command *c = find_command(name);
    if (!c) {
        fprintf(stderr, "tokgate: unknown command '%s' (see tokgate help)\n", argv[1]);
        return EXIT_USAGE;
    }
    /* commands with their own parser elsewhere answer --help here */
    if (c->usage && common_cli_wants_help(argc - 1, argv + 1)) {
        fputs(c->usage, stdout);
        return 0;
    }
    install_signals(c->graceful);
    int rc = c->run(argc, argv);
    int sig = arm_interrupted();
    if (sig) {
        fprintf(stderr, "tokgate: interrupted by signal %d; its workers were ended\n", sig);
        return 128 + sig;
    }
    return rc;
}
