/*
 * gate.c: the gate run. Plans prompts x arms x legs, runs each (arm, leg)
 * as one worker session through arm.h, turns the answers into a store_leg
 * and writes it with store_put_leg (one transaction per leg; the store
 * connection is shared by the job threads under a mutex).
 *
 * Ownership inside a leg: leg_buf owns everything the store_leg it builds
 * points to, and frees it after the put.
 */
#include "gate.h"

#include <assert.h>
#include <sched.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "arm.h"
#include "common.h"
#include "gguf.h"

/* The reference's leg-1 answer for one prompt (teacher forcing). */
typedef struct ref_prompt {
    int ok;                  /* complete: ids and all steps */
    int32_t *ids;
    int n_ids;
    int32_t *tokens;         /* (steps) */
    char *why;               /* when !ok */
} ref_prompt;

typedef struct gate_ctx {
    tg_store *st;
    const tg_spec *spec;
    const gate_options *opt;
    int64_t run_id;
    int teacher;             /* teacher-forced mode */
    ref_prompt *ref;         /* (n_prompts), teacher mode */
    char (*bin_sha)[65];     /* per arm */
    char **bin_path;         /* per arm */
    pthread_mutex_t mu;      /* store, progress, counters, the CPU budget */
    pthread_cond_t cv;       /* a leg gave its threads back */
    int budget, in_use;      /* CPU budget (0: none) and the threads the running legs hold */
    int *threads;            /* per arm: gate_arm_threads */
    int next_task, n_tasks;
    int *task_arm, *task_leg;
    gate_result *res;
    int store_failed;
    tg_err store_err;
    double t0;
} gate_ctx;

void gate_host(char *buf, size_t n)
{
    char h[256] = "unknown";
    gethostname(h, sizeof h - 1);
    h[sizeof h - 1] = 0;
    struct utsname u;
    if (uname(&u) == 0) snprintf(buf, n, "%s (%s, %s %s)", h, u.machine, u.sysname, u.release);
    else snprintf(buf, n, "%s", h);
}

void gate_arm_binaries(const tg_spec *spec, const char *bin_dir, char (*hex)[65], char **paths)
{
    for (int i = 0; i < spec->n_arms; i++) {
        hex[i][0] = 0;
        if (paths) paths[i] = NULL;
        char **argv = NULL;
        if (spec->arms[i].kind == SPEC_ARM_COMMAND) argv = spec_command_argv(spec, i, "", NULL);
        else argv = spec_arm_argv(spec, i, bin_dir, NULL);
        /* the worker after any wrap */
        char *const *w = argv;
        if (argv && spec->arms[i].kind == SPEC_ARM_LLAMA) w = argv + spec->arms[i].n_wrap;
        char *path = spec_arm_binary(spec, i, w);
        tg_err e;
        if (path && tg_sha256_file(path, hex[i], &e) < 0) hex[i][0] = 0;
        if (paths) paths[i] = path;
        else free(path);
        spec_argv_free(argv);
    }
}

/* ---- one leg's buffers ---- */

typedef struct lp_buf {
    store_leg_prompt lp;
    int32_t *ids;
    store_step *steps;
    tg_top **tops;
    store_dump *dumps;
    float **dump_data;
    char **dump_stage;
    char *text, *error;
} lp_buf;

typedef struct leg_buf {
    store_leg leg;
    lp_buf *p;               /* (n_prompts) */
    char *hello, *model, *cause, *counters, *device, *version;
    json_t *ctr;             /* merged counters */
    double ms_load, ms_prefill, ms_decode;
} leg_buf;

static void leg_buf_free(leg_buf *b, int n_prompts)
{
    for (int i = 0; b->p && i < n_prompts; i++) {
        lp_buf *q = &b->p[i];
        free(q->ids);
        for (int s = 0; q->tops && s < q->lp.n_steps; s++) free(q->tops[s]);
        free(q->tops);
        free(q->steps);
        for (int d = 0; d < q->lp.n_dumps; d++) {
            free(q->dump_data[d]);
            free(q->dump_stage[d]);
        }
        free(q->dumps);
        free(q->dump_data);
        free(q->dump_stage);
        free(q->text);
        free(q->error);
    }
    free(b->p);
    free(b->hello);
    free(b->model);
    free(b->cause);
    free(b->counters);
    free(b->device);
    free(b->version);
    json_decref(b->ctr);
}

/* Adds src's numbers into dst, recursively (counters of several decodes). */
static void counters_add(json_t *dst, json_t *src)
{
    const char *k;
    json_t *v;
    json_object_foreach(src, k, v) {
        json_t *d = json_object_get(dst, k);
        if (json_is_integer(v)) {
            json_int_t base = json_is_integer(d) ? json_integer_value(d) : 0;
            /* a worker's counters near INT64_MAX must not wrap: saturate */
            json_object_set_new(dst, k, json_integer(common_add_sat(base, json_integer_value(v))));
        } else if (json_is_real(v)) {
            double base = json_is_number(d) ? json_number_value(d) : 0;
            json_object_set_new(dst, k, json_real(base + json_real_value(v)));
        } else if (json_is_object(v)) {
            if (!json_is_object(d)) {
                d = json_object();
                json_object_set_new(dst, k, d);
            }
            counters_add(d, v);
        } else {
            json_object_set(dst, k, v);
        }
    }
}

static void set_cause(leg_buf *b, const char *fmt, ...)
{
    if (b->cause) return;   /* the first cause wins */
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    b->cause = xstrdup(buf);
}

/* msg without its leading "arm NAME: " (an arm layer message): the leg's
 * cause is stored with the leg of that arm already ("load: arm cpu: load:
 * load: ..." became "load: ..."). */
static const char *leg_msg(const char *msg, const char *arm)
{
    size_t n = strlen(arm);
    if (!strncmp(msg, "arm ", 4) && !strncmp(msg + 4, arm, n) && !strncmp(msg + 4 + n, ": ", 2)) return msg + 6 + n;
    return msg;
}

/* Progress on stderr (terminal only), throttled. */
typedef struct prog {
    gate_ctx *c;
    const char *arm;
    int leg;
    const char *prompt;
    double last;
} prog;

static void progress_line(gate_ctx *c, const char *arm, int leg, const char *prompt, int step)
{
    if (!c->opt->progress) return;
    pthread_mutex_lock(&c->mu);
    fprintf(stderr, "\r\033[K[tokgate] %s leg %d/%d %s step %d/%d %.1fs", arm, leg, c->spec->legs,
            prompt ? prompt : "", step, c->spec->steps, tg_now() - c->t0);
    fflush(stderr);
    pthread_mutex_unlock(&c->mu);
}

static void on_step(void *ud, int step)
{
    prog *p = ud;
    double now = tg_now();
    if (now - p->last < 0.1 && step < p->c->spec->steps) return;
    p->last = now;
    progress_line(p->c, p->arm, p->leg, p->prompt, step);
}

/* Copies a decode result's steps (and the dumps of the stages spec keeps)
 * into q. */
static void take_steps(lp_buf *q, const arm_decode_res *r, const int32_t *force, const tg_spec *spec)
{
    int n = r->n_steps;
    q->steps = xcalloc((size_t)n, sizeof *q->steps);
    q->tops = xcalloc((size_t)n, sizeof *q->tops);
    for (int s = 0; s < n; s++) {
        store_step *t = &q->steps[s];
        t->step = s;
        t->token = r->steps[s].token;
        t->forced = force ? force[s] : -1;
        snprintf(t->digest, sizeof t->digest, "%s", r->steps[s].digest);
        t->n_top = r->steps[s].n_top;
        q->tops[s] = xcalloc((size_t)t->n_top, sizeof(tg_top));
        memcpy(q->tops[s], r->steps[s].top, (size_t)t->n_top * sizeof(tg_top));
        t->top = q->tops[s];
    }
    q->lp.n_steps = n;
    q->lp.steps = q->steps;
    if (r->n_dumps > 0) {
        q->dumps = xcalloc((size_t)r->n_dumps, sizeof *q->dumps);
        q->dump_data = xcalloc((size_t)r->n_dumps, sizeof *q->dump_data);
        q->dump_stage = xcalloc((size_t)r->n_dumps, sizeof *q->dump_stage);
        for (int d = 0; d < r->n_dumps; d++) {
            if (!r->dumps[d].data || !spec_dumps_stage(spec, r->dumps[d].stage)) continue;
            int k = q->lp.n_dumps++;   /* kept dumps are packed: leg_buf_free frees 0..n_dumps-1 */
            q->dump_data[k] = xcalloc((size_t)r->dumps[d].n, sizeof(float));
            memcpy(q->dump_data[k], r->dumps[d].data, (size_t)r->dumps[d].n * sizeof(float));
            q->dump_stage[k] = xstrdup(r->dumps[d].stage);
            q->dumps[k] = (store_dump){r->dumps[d].step, r->dumps[d].layer, q->dump_stage[k],
                                       r->dumps[d].n, q->dump_data[k]};
        }
        q->lp.dumps = q->dumps;
    }
}

static void fill_exit(leg_buf *b, const arm_exit *x)
{
    b->leg.exit_status = x->exit_status;
    b->leg.term_signal = x->term_signal;
    if (x->cause) {
        free(b->cause);      /* the process-level cause outranks a prompt's error */
        b->cause = xstrdup(x->cause);
    }
    b->leg.fault_lines = x->fault_lines;
    b->leg.stderr_text = x->stderr_text;
    b->leg.stderr_len = x->stderr_len;
    b->leg.wall_s = x->wall_s;
}

/* Runs one (arm, leg) of a protocol worker into b. ref_out (teacher mode,
 * reference leg 1) receives the reference's answers. The arm is returned
 * in *arm_out for the caller to free after the put (its exit info is
 * borrowed by b->leg). */
static void run_protocol_leg(gate_ctx *c, int ai, int legno, leg_buf *b, ref_prompt *ref_out, tg_arm **arm_out)
{
    const tg_spec *s = c->spec;
    const spec_arm *sa = &s->arms[ai];
    int is_ref = ai == s->ref_index;
    tg_err e;
    *arm_out = NULL;
    char **argv = spec_arm_argv(s, ai, c->opt->bin_dir, &e);
    assert(argv);
    /* our own worker behind a wrap (qemu) must exist: the wrap would only say "exit 1" */
    if (sa->kind == SPEC_ARM_LLAMA && sa->n_wrap > 0 && access(argv[sa->n_wrap], X_OK) != 0) {
        set_cause(b, "start: arm %s: worker %s is not an executable file (for an aarch64 worker: make aarch64)",
                  sa->name, argv[sa->n_wrap]);
        b->leg.exit_status = -1;
        for (int p = 0; p < s->n_prompts; p++) b->p[p].error = xstrdup(b->cause);
        spec_argv_free(argv);
        return;
    }
    arm_config cfg = {.name = sa->name, .argv = argv, .timeout_request = sa->timeout_request,
                      .timeout_leg = sa->timeout_leg, .grace = c->opt->grace,
                      .n_fault_patterns = s->n_fault_patterns, .fault_patterns = s->fault_patterns};
    tg_arm *a = NULL;
    if (arm_start(&a, &cfg, &e) < 0) {
        set_cause(b, "start: %s", leg_msg(e.msg, sa->name));
        b->leg.exit_status = -1;
        for (int p = 0; p < s->n_prompts; p++) b->p[p].error = xstrdup(b->cause);
        spec_argv_free(argv);
        return;
    }
    spec_argv_free(argv);
    *arm_out = a;
    int up = arm_hello(a, &b->hello, &e) == 0;
    if (!up) set_cause(b, "%s", leg_msg(e.msg, sa->name));
    if (up) {
        const char *d = arm_hello_field(a, "device"), *v = arm_hello_field(a, "version");
        b->device = d ? xstrdup(d) : NULL;
        b->version = v ? xstrdup(v) : NULL;
        pthread_mutex_lock(&c->mu);
        if (!c->bin_sha[ai][0]) {
            /* a worker we cannot hash ourselves (exec through ssh): its own word */
            const char *h = arm_hello_field(a, "binary_sha256");
            if (h && strlen(h) == 64) snprintf(c->bin_sha[ai], 65, "%s", h);
        }
        pthread_mutex_unlock(&c->mu);
        up = arm_load(a, s->model_path, sa->options_json, &b->model, &e) == 0;
        if (!up) set_cause(b, "%s", leg_msg(e.msg, sa->name));
    }
    double nan_ms = NAN;
    b->ms_load = b->ms_prefill = b->ms_decode = nan_ms;
    for (int p = 0; p < s->n_prompts; p++) {
        lp_buf *q = &b->p[p];
        if (!up || arm_failed(a)) {
            if (!q->error) q->error = xstrdup(b->cause ? b->cause : "not run");
            continue;
        }
        const spec_prompt *sp = &s->prompts[p];
        int32_t *own = NULL;
        int n_own = 0;
        if (arm_tokenize(a, sp->text, 0, &own, &n_own, &e) < 0) {
            q->error = xstrdup(leg_msg(e.msg, sa->name));
            set_cause(b, "%s: %s", sp->id, leg_msg(e.msg, sa->name));
            continue;
        }
        q->ids = own;
        q->lp.ids = own;
        q->lp.n_ids = n_own;
        const int32_t *prompt = own, *force = NULL;
        int n_prompt = n_own;
        if (c->teacher && !(is_ref && legno == 1)) {
            ref_prompt *r = &c->ref[p];
            if (!r->ok) {
                char buf[600];
                snprintf(buf, sizeof buf, "%s: no reference tokens to force: %s", sp->id, r->why ? r->why : "?");
                q->error = xstrdup(buf);
                set_cause(b, "%s", buf);
                continue;
            }
            prompt = r->ids;
            n_prompt = r->n_ids;
            force = r->tokens;
        }
        q->lp.decoded_from = prompt;
        q->lp.n_decoded_from = n_prompt;
        arm_decode_req req = {.prompt = prompt, .n_prompt = n_prompt, .steps = s->steps, .top_k = s->top_k,
                              .force = force, .n_force = force ? s->steps : 0};
        /* the spec's dumps: into a private folder, read back by arm_decode, stored as rows */
        char ddir[600] = "";
        if (spec_dumps_prompt(s, p)) {
            if (arm_dump_dir_make(ddir, sizeof ddir, "gate", &e) < 0) {
                q->error = xstrdup(leg_msg(e.msg, sa->name));
                set_cause(b, "%s: %s", sp->id, leg_msg(e.msg, sa->name));
                continue;
            }
            req.dump_steps = s->dump_steps;
            req.n_dump_steps = s->n_dump_steps;
            req.dump_path = ddir;
        }
        arm_decode_res r;
        prog pg = {c, sa->name, legno, sp->id, 0};
        int rc = arm_decode(a, &req, &r, on_step, &pg, &e);
        arm_dump_dir_remove(ddir);
        take_steps(q, &r, force, s);
        if (rc < 0) {
            q->error = xstrdup(leg_msg(e.msg, sa->name));
            set_cause(b, "%s: %s", sp->id, leg_msg(e.msg, sa->name));
        } else {
            if (r.counters_json) {
                json_t *j = json_loads(r.counters_json, 0, NULL);
                if (!b->ctr) b->ctr = json_object();
                if (json_is_object(j)) counters_add(b->ctr, j);
                json_decref(j);
            }
            if (isnan(b->ms_load)) b->ms_load = r.ms_load;
            if (!isnan(r.ms_prefill)) b->ms_prefill = (isnan(b->ms_prefill) ? 0 : b->ms_prefill) + r.ms_prefill;
            if (!isnan(r.ms_decode)) b->ms_decode = (isnan(b->ms_decode) ? 0 : b->ms_decode) + r.ms_decode;
            if (is_ref) {
                /* the reference's generated text, for chain of custody */
                int32_t *toks = xcalloc((size_t)r.n_steps, sizeof *toks);
                for (int k = 0; k < r.n_steps; k++) toks[k] = r.steps[k].token;
                char *text;
                size_t tl;
                if (arm_detokenize(a, toks, r.n_steps, 0, &text, &tl, &e) == 0) q->text = text;
                else set_cause(b, "%s: %s", sp->id, leg_msg(e.msg, sa->name));
                if (ref_out && !arm_failed(a)) {
                    ref_prompt *rp = &ref_out[p];
                    rp->ok = 1;
                    rp->ids = xcalloc((size_t)n_own, sizeof *rp->ids);
                    memcpy(rp->ids, own, (size_t)n_own * sizeof *own);
                    rp->n_ids = n_own;
                    rp->tokens = toks;
                    toks = NULL;
                }
                free(toks);
            }
        }
        arm_decode_res_free(&r);
    }
    if (ref_out)
        for (int p = 0; p < s->n_prompts; p++)
            if (!ref_out[p].ok && !ref_out[p].why)
                ref_out[p].why = xstrdup(b->p[p].error ? b->p[p].error : b->cause ? b->cause : "no answer");
}

/* Runs a command (custody) arm's leg: one process per prompt. */
static void run_command_leg(gate_ctx *c, int ai, int legno, leg_buf *b, arm_exit *acc)
{
    const tg_spec *s = c->spec;
    const spec_arm *sa = &s->arms[ai];
    double leg_deadline = tg_now() + sa->timeout_leg;
    size_t cap = 0, len = 0;
    char *err = NULL;
    size_t fcap = 0, flen = 0;
    char *faults = NULL;
    memset(acc, 0, sizeof *acc);
    for (int p = 0; p < s->n_prompts; p++) {
        lp_buf *q = &b->p[p];
        double left = leg_deadline - tg_now();
        if (left <= 0) {
            q->error = xstrdup("not run: the leg ran past its time limit");
            set_cause(b, "timeout: the leg ran past its %g s limit", sa->timeout_leg);
            continue;
        }
        tg_err e;
        char **argv = spec_command_argv(s, ai, s->prompts[p].text, &e);
        assert(argv);
        char *out;
        size_t n;
        arm_exit x;
        progress_line(c, sa->name, legno, s->prompts[p].id, 0);
        int rc = arm_run_command(argv, left < sa->timeout_request ? left : sa->timeout_request, 0,
                                 s->n_fault_patterns, s->fault_patterns, &out, &n, &x, &e);
        spec_argv_free(argv);
        /* the spec's strip: the tool's own trailer, not generated text */
        for (int k = 0; rc == 0 && k < sa->n_strip; k++) {
            size_t sl = strlen(sa->strip[k]);
            if (n >= sl && !memcmp(out + n - sl, sa->strip[k], sl)) out[n -= sl] = 0;
        }
        if (rc == 0) q->text = out;
        else {
            q->error = xstrdup(leg_msg(e.msg, sa->name));
            set_cause(b, "%s: %s", s->prompts[p].id, x.cause ? x.cause : e.msg);
            if (acc->exit_status == 0 && acc->term_signal == 0) {
                acc->exit_status = x.exit_status;
                acc->term_signal = x.term_signal;
            }
        }
        acc->wall_s += x.wall_s;
        /* stderr of all prompts, each under a header line */
        size_t need = len + x.stderr_len + 64;
        if (need + 1 > cap) {
            cap = need * 2;
            err = xrealloc(err, cap);
        }
        len += (size_t)snprintf(err + len, cap - len, "== %s\n", s->prompts[p].id);
        memcpy(err + len, x.stderr_text, x.stderr_len);
        len += x.stderr_len;
        err[len] = 0;
        if (x.fault_lines) {
            size_t fl = strlen(x.fault_lines);
            if (flen + fl + 1 > fcap) {
                fcap = (flen + fl + 1) * 2;
                faults = xrealloc(faults, fcap);
            }
            memcpy(faults + flen, x.fault_lines, fl + 1);
            flen += fl;
        }
        arm_exit_free(&x);
    }
    acc->cause = NULL;
    acc->stderr_text = err;
    acc->stderr_len = len;
    acc->fault_lines = faults;
    b->leg.exit_status = acc->exit_status;
    b->leg.term_signal = acc->term_signal;
    b->leg.fault_lines = faults;
    b->leg.stderr_text = err ? err : "";
    b->leg.stderr_len = len;
    b->leg.wall_s = acc->wall_s;
}

/* Runs and stores one (arm, leg). Returns 0, or -1 when the store failed. */
static int run_leg(gate_ctx *c, int ai, int legno, ref_prompt *ref_out)
{
    const tg_spec *s = c->spec;
    const spec_arm *sa = &s->arms[ai];
    leg_buf b;
    memset(&b, 0, sizeof b);
    b.p = xcalloc((size_t)s->n_prompts, sizeof *b.p);
    for (int p = 0; p < s->n_prompts; p++) b.p[p].lp.prompt_id = s->prompts[p].id;
    progress_line(c, sa->name, legno, "", 0);

    tg_arm *a = NULL;
    arm_exit x;
    memset(&x, 0, sizeof x);
    arm_exit cmd;
    memset(&cmd, 0, sizeof cmd);
    if (sa->kind == SPEC_ARM_COMMAND) {
        run_command_leg(c, ai, legno, &b, &cmd);
    } else {
        run_protocol_leg(c, ai, legno, &b, ref_out, &a);
        if (a) {
            arm_finish(a, &x);
            fill_exit(&b, &x);
        }
    }
    store_leg *L = &b.leg;
    L->run_id = c->run_id;
    L->arm = sa->name;
    L->leg = legno;
    L->binary_path = c->bin_path[ai];
    L->version = b.version;
    L->device = b.device;
    L->hello_json = b.hello;
    L->model_json = b.model;
    L->cause = b.cause;
    if (b.ctr) {
        b.counters = json_dumps(b.ctr, JSON_COMPACT | JSON_SORT_KEYS);
        json_t *d = json_object_get(b.ctr, "device_ops"), *h = json_object_get(b.ctr, "host_ops");
        L->device_ops = json_is_integer(d) ? json_integer_value(d) : 0;
        L->host_ops = json_is_integer(h) ? json_integer_value(h) : 0;
    }
    L->counters_json = b.counters;
    L->ms_load = b.ms_load;
    L->ms_prefill = b.ms_prefill;
    L->ms_decode = b.ms_decode;
    if (!L->stderr_text) L->stderr_text = "";
    lp_buf *pb = b.p;
    store_leg_prompt *lps = xcalloc((size_t)s->n_prompts, sizeof *lps);
    for (int p = 0; p < s->n_prompts; p++) {
        lps[p] = pb[p].lp;
        lps[p].text = pb[p].text;
        lps[p].error = pb[p].error;
    }
    L->n_prompts = s->n_prompts;
    L->prompts = lps;

    pthread_mutex_lock(&c->mu);
    L->binary_sha256 = c->bin_sha[ai][0] ? c->bin_sha[ai] : NULL;
    tg_err e;
    /* a leg cut short by tokgate's own interruption is not stored: --resume runs it again */
    int rc = arm_interrupted() ? 0 : store_put_leg(c->st, L, &e);
    if (rc < 0 && !c->store_failed) {
        c->store_failed = 1;
        c->store_err = e;
    }
    c->res->legs_run++;
    if (b.cause) c->res->legs_faulted++;
    if (c->opt->progress) {
        fprintf(stderr, "\r\033[K[tokgate] %s leg %d/%d: %s (%.1fs)\n", sa->name, legno, s->legs,
                b.cause ? b.cause : "clean", L->wall_s);
        fflush(stderr);
    }
    pthread_mutex_unlock(&c->mu);

    free(lps);
    leg_buf_free(&b, s->n_prompts);
    free((char *)cmd.stderr_text);
    free((char *)cmd.fault_lines);
    arm_free(a);
    return rc;
}

static void *job_thread(void *ud)
{
    gate_ctx *c = ud;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int t = c->store_failed || arm_interrupted() ? c->n_tasks : c->next_task++;
        int need = 0;
        if (t < c->n_tasks && c->budget > 0) {
            /* the CPU budget: wait until this arm's threads fit beside the running legs */
            need = c->threads[c->task_arm[t]];
            if (need > c->budget) need = c->budget;
            while (c->in_use + need > c->budget && !arm_interrupted()) pthread_cond_wait(&c->cv, &c->mu);
            c->in_use += need;
        } else if (t < c->n_tasks) {
            need = c->threads[c->task_arm[t]];
            c->in_use += need;
        }
        if (c->in_use > c->res->peak_threads) c->res->peak_threads = c->in_use;
        pthread_mutex_unlock(&c->mu);
        if (t >= c->n_tasks) return NULL;
        run_leg(c, c->task_arm[t], c->task_leg[t], NULL);
        pthread_mutex_lock(&c->mu);
        c->in_use -= need;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
}

/* Reads the reference's stored leg 1 back (teacher forcing on --resume). */
static int load_ref_from_store(gate_ctx *c, tg_err *e)
{
    sqlite3 *db = store_db(c->st);
    const tg_spec *s = c->spec;
    const char *q1 =
        "SELECT lp.ids, lp.error, l.id, p.id FROM leg l JOIN arm a ON a.id = l.arm_id "
        "JOIN leg_prompt lp ON lp.leg_id = l.id JOIN prompt p ON p.id = lp.prompt_id "
        "WHERE l.run_id = ?1 AND a.name = ?2 AND l.leg = 1 AND p.name = ?3";
    const char *q2 = "SELECT token FROM step WHERE leg_id = ?1 AND prompt_id = ?2 ORDER BY step";
    sqlite3_stmt *a = NULL, *b = NULL;
    if (sqlite3_prepare_v2(db, q1, -1, &a, NULL) != SQLITE_OK || sqlite3_prepare_v2(db, q2, -1, &b, NULL) != SQLITE_OK) {
        common_sql_err(db, e, "resume: reading the reference's leg 1");
        sqlite3_finalize(a);
        sqlite3_finalize(b);
        return -1;
    }
    for (int p = 0; p < s->n_prompts; p++) {
        ref_prompt *r = &c->ref[p];
        sqlite3_reset(a);
        sqlite3_bind_int64(a, 1, c->run_id);
        sqlite3_bind_text(a, 2, s->reference, -1, SQLITE_STATIC);
        sqlite3_bind_text(a, 3, s->prompts[p].id, -1, SQLITE_STATIC);
        if (sqlite3_step(a) != SQLITE_ROW) {
            r->why = xstrdup("the reference's stored leg 1 has no row for this prompt");
            continue;
        }
        const char *ids = (const char *)sqlite3_column_text(a, 0), *err = (const char *)sqlite3_column_text(a, 1);
        json_t *j = ids ? json_loads(ids, 0, NULL) : NULL;
        if (err || !json_is_array(j)) {
            r->why = xstrdup(err ? err : "the reference's stored ids are unreadable");
            json_decref(j);
            continue;
        }
        r->n_ids = (int)json_array_size(j);
        r->ids = xcalloc((size_t)r->n_ids, sizeof *r->ids);
        for (int i = 0; i < r->n_ids; i++) r->ids[i] = (int32_t)json_integer_value(json_array_get(j, (size_t)i));
        json_decref(j);
        sqlite3_reset(b);
        sqlite3_bind_int64(b, 1, sqlite3_column_int64(a, 2));
        sqlite3_bind_int64(b, 2, sqlite3_column_int64(a, 3));
        r->tokens = xcalloc((size_t)s->steps, sizeof *r->tokens);
        int n = 0;
        while (sqlite3_step(b) == SQLITE_ROW && n < s->steps) r->tokens[n++] = sqlite3_column_int(b, 0);
        if (n == s->steps) r->ok = 1;
        else r->why = xstrdup("the reference's stored leg 1 is incomplete for this prompt");
    }
    sqlite3_finalize(a);
    sqlite3_finalize(b);
    return 0;
}

/* The spec sha256 of a stored run into out[65]. Returns 1, 0 (no such run), -1. */
static int run_spec_sha(tg_store *st, int64_t run, char out[65], tg_err *e)
{
    sqlite3 *db = store_db(st);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, "SELECT s.sha256 FROM run r JOIN spec s ON s.id = r.spec_id WHERE r.id = ?1", -1, &q,
                           NULL) != SQLITE_OK)
        return common_sql_err(db, e, "resume: reading the run's spec");
    sqlite3_bind_int64(q, 1, run);
    int rc = 0;
    if (sqlite3_step(q) == SQLITE_ROW) {
        snprintf(out, 65, "%s", (const char *)sqlite3_column_text(q, 0));
        rc = 1;
    }
    sqlite3_finalize(q);
    return rc;
}

/* Checks, before anything runs, what would only fail later: engine and
 * llama arms need a model that is a whole GGUF file (a text file or a
 * truncated download made every leg fail, a run NOT_MEASURABLE instead of
 * an input error), and scoring holds every step's top-k of every leg in
 * memory, which steps x top_k can put far beyond the machine. Returns 0 or
 * -1 with e. */
static int gate_precheck(const tg_spec *s, tg_err *e)
{
    for (int i = 0; i < s->n_arms; i++) {
        if (s->arms[i].kind != SPEC_ARM_ENGINE && s->arms[i].kind != SPEC_ARM_LLAMA) continue;
        gguf *g = NULL;
        if (gguf_open(&g, s->model_path, e) < 0)
            return tg_err_prefix(e, "%s: model.path: expected a whole GGUF file for arm %s", s->path, s->arms[i].name);
        gguf_close(g);
        break;
    }
    /* what compare_run holds: every leg's steps with their top-k (8 bytes
     * an entry) and about 48 bytes of bookkeeping a step */
    double need = (double)s->n_arms * s->legs * s->n_prompts * s->steps * ((double)s->top_k * sizeof(tg_top) + 48);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
    if (have > 0 && need > have)
        return tg_errf(e, "%s: steps x top_k: scoring this run needs about %.1f GiB of memory (%d arms x %d legs x "
                          "%d prompts x %d steps x top-%d), more than this machine's %.1f GiB; lower steps, "
                          "top_k, legs or the prompts", s->path, need / 1073741824.0, s->n_arms, s->legs,
                       s->n_prompts, s->steps, s->top_k, have / 1073741824.0);
    return 0;
}

int gate_run(tg_store *st, const tg_spec *s, const gate_options *opt, gate_result *res, tg_err *e)
{
    memset(res, 0, sizeof *res);
    res->legs_planned = s->n_arms * s->legs;
    char art[65];
    int64_t art_size = 0;
    if (spec_check_artifact(s, art, &art_size, e) < 0 || gate_precheck(s, e) < 0) return -1;

    gate_ctx c;
    memset(&c, 0, sizeof c);
    c.st = st;
    c.spec = s;
    c.opt = opt;
    c.res = res;
    c.t0 = tg_now();
    c.teacher = !strcmp(s->mode, "teacher-forced");
    c.bin_sha = xcalloc((size_t)s->n_arms, sizeof *c.bin_sha);
    c.bin_path = xcalloc((size_t)s->n_arms, sizeof *c.bin_path);
    gate_arm_binaries(s, opt->bin_dir, c.bin_sha, c.bin_path);
    c.ref = xcalloc((size_t)s->n_prompts, sizeof *c.ref);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    int rc = -1;

    if (opt->resume_run > 0) {
        char sha[65];
        int r = run_spec_sha(st, opt->resume_run, sha, e);
        if (r < 0) goto done;
        if (r == 0) {
            tg_errf(e, "--resume %lld: no such run in the store", (long long)opt->resume_run);
            goto done;
        }
        if (strcmp(sha, s->sha256)) {
            tg_errf(e, "--resume %lld: that run is of another spec text (sha256 %s, %s has %s)",
                    (long long)opt->resume_run, sha, s->path, s->sha256);
            goto done;
        }
        c.run_id = opt->resume_run;
    } else {
        char host[512];
        gate_host(host, sizeof host);
        store_arm *arms = xcalloc((size_t)s->n_arms, sizeof *arms);
        for (int i = 0; i < s->n_arms; i++)
            arms[i] = (store_arm){s->arms[i].name, s->arms[i].kind_name,
                                  i == s->ref_index ? "reference" : s->arms[i].role, s->arms[i].config_json};
        store_prompt *pr = xcalloc((size_t)s->n_prompts, sizeof *pr);
        for (int i = 0; i < s->n_prompts; i++) pr[i] = (store_prompt){s->prompts[i].id, s->prompts[i].text};
        store_run_info info = {
            .spec_name = s->name, .spec_path = s->path, .spec_text = s->text, .spec_sha256 = s->sha256,
            .artifact_path = s->model_path, .artifact_sha256 = art, .artifact_size = art_size,
            .host = host, .tokgate_version = TOKGATE_VERSION, .mode = s->mode, .reference = s->reference,
            .policy_kind = s->policy_kind, .band = s->band, .steps = s->steps, .top_k = s->top_k,
            .legs = s->legs, .n_arms = s->n_arms, .arms = arms, .n_prompts = s->n_prompts, .prompts = pr};
        int r = store_begin_run(st, &info, &c.run_id, e);
        free(arms);
        free(pr);
        if (r < 0) goto done;
    }
    res->run_id = c.run_id;

    /* teacher forcing: the reference's leg 1 first, alone */
    if (c.teacher) {
        if (opt->resume_run > 0 && store_has_leg(st, c.run_id, s->reference, 1) == 1) {
            if (load_ref_from_store(&c, e) < 0) goto done;
            res->legs_skipped++;
        } else if (run_leg(&c, s->ref_index, 1, c.ref) < 0) {
            *e = c.store_err;
            goto done;
        }
        if (arm_interrupted()) goto interrupted;
    }
    /* then everything else, leg by leg, up to jobs at a time */
    c.task_arm = xcalloc((size_t)res->legs_planned, sizeof *c.task_arm);
    c.task_leg = xcalloc((size_t)res->legs_planned, sizeof *c.task_leg);
    for (int l = 1; l <= s->legs; l++)
        for (int i = 0; i < s->n_arms; i++) {
            if (c.teacher && l == 1 && i == s->ref_index) continue;
            if (opt->resume_run > 0 && store_has_leg(st, c.run_id, s->arms[i].name, l) == 1) {
                res->legs_skipped++;
                continue;
            }
            c.task_arm[c.n_tasks] = i;
            c.task_leg[c.n_tasks] = l;
            c.n_tasks++;
        }
    int jobs = opt->jobs > 0 ? opt->jobs : s->jobs;
    res->jobs = jobs;
    c.budget = opt->jobs > 0 ? 0 : gate_cpus();
    res->cpu_budget = c.budget;
    c.threads = xcalloc((size_t)s->n_arms, sizeof *c.threads);
    for (int i = 0; i < s->n_arms; i++) c.threads[i] = gate_arm_threads(s, i, gate_cpus());
    if (jobs > c.n_tasks) jobs = c.n_tasks;
    if (jobs <= 1) job_thread(&c);
    else {
        pthread_t *th = xcalloc((size_t)jobs, sizeof *th);
        int started = 0;
        for (int j = 0; j < jobs; j++)
            if (pthread_create(&th[j], NULL, job_thread, &c) == 0) started++;
            else break;
        if (started == 0) job_thread(&c);
        for (int j = 0; j < started; j++) pthread_join(th[j], NULL);
        free(th);
    }
    if (c.store_failed) {
        *e = c.store_err;
        goto done;
    }
    rc = 0;
interrupted:
    if (arm_interrupted()) {
        res->interrupted = arm_interrupted();
        tg_errf(e, "interrupted by signal %d: run %lld left unfinished; resume it with --resume %lld",
                res->interrupted, (long long)c.run_id, (long long)c.run_id);
        rc = -1;
    }
done:
    if (opt->progress) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
    for (int p = 0; p < s->n_prompts; p++) {
        free(c.ref[p].ids);
        free(c.ref[p].tokens);
        free(c.ref[p].why);
    }
    free(c.ref);
    for (int i = 0; i < s->n_arms; i++) free(c.bin_path[i]);
    free(c.bin_path);
    free(c.bin_sha);
    free(c.task_arm);
    free(c.task_leg);
    free(c.threads);
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
    return rc;
}

int gate_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int gate_arm_threads(const tg_spec *s, int i, int nc)
{
    const spec_arm *a = &s->arms[i];
    if (a->kind == SPEC_ARM_LLAMA && a->n_wrap > 0) return 1;   /* tg-llama under qemu uses 1 */
    int t = 1;
    json_t *o = json_loads(a->options_json ? a->options_json : "{}", 0, NULL);
    json_t *th = json_object_get(o, "threads");
    if (json_is_integer(th) && json_integer_value(th) > 0)
        t = json_integer_value(th) > 1 << 20 ? 1 << 20 : (int)json_integer_value(th);
    else if (a->kind == SPEC_ARM_ENGINE && a->tier && !strcmp(a->tier, "cpu")) t = nc;
    else if (a->kind == SPEC_ARM_LLAMA) t = nc < 16 ? nc : 16;
    json_decref(o);
    return t;
}

/* The folder of tokgate's executables (where the worker binaries live):
 * $TOKGATE_BIN, else the folder of the running program, else build/bin. */
void gate_bin_dir(char *buf, size_t n)
{
    const char *env = getenv("TOKGATE_BIN");
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return;
    }
    char self[PATH_MAX];
    ssize_t r = readlink("/proc/self/exe", self, sizeof self - 1);
    if (r <= 0) {
        snprintf(buf, n, "build/bin");
        return;
    }
    self[r] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(buf, n, "%s", self);
}
