/*
 * arm.c: arm processes and the client side of arm protocol v1.
 *
 * One tg_arm is one worker process. All I/O is nonblocking and goes
 * through pump(), a poll() loop over the worker's stdin (while a request is
 * being written), stdout (into a line buffer) and stderr (kept up to a cap,
 * scanned line by line for fault patterns), bounded by a deadline. Every
 * wait in this file has a deadline; every process started here is reaped
 * (reap() polls waitpid while draining stderr; kill_and_reap() escalates
 * SIGTERM to SIGKILL on the worker's process group).
 *
 * Protocol failures call fail(), which records the cause, kills the worker
 * and makes every later call fail with the same cause.
 */
#include "arm.h"

#include "common.h"
#include "proto.h"

#include <assert.h>
#include <limits.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define DEFAULT_MAX_LINE   ((size_t)16 << 20)
#define DEFAULT_MAX_STDERR ((size_t)16 << 20)
#define SCAN_LINE_MAX      ((size_t)64 << 10)   /* stderr line prefix scanned for patterns */
#define FAULT_LINES_MAX    ((size_t)1 << 20)

struct tg_arm {
    char *name;
    pid_t pid;               /* -1 once reaped */
    int status;              /* waitpid status once reaped */
    int fd_in, fd_out, fd_err;
    double t_start, t_end;
    double leg_deadline;     /* absolute tg_now() time, or INFINITY */
    double timeout_request, timeout_leg, grace, exit_wait;
    size_t max_line, max_stderr;
    int n_patterns;
    char **patterns;

    char *obuf;              /* stdout bytes [ostart, olen) not yet consumed */
    size_t ostart, olen, ocap, oscan;
    int out_eof;

    char *ebuf;              /* stderr kept */
    size_t elen, ecap, edropped;
    char *eline;             /* current stderr line (first SCAN_LINE_MAX bytes) */
    size_t eline_len;
    int err_eof;
    char *faults;
    size_t flen, fcap;

    int failed;
    char *cause;             /* protocol failure, or exit trouble after finish */
    int finished;
    json_t *hello_arm;
    pid_t pgid;              /* the worker's process group until it is killed, else -1 */
};

/* ---- interruption ---- */

/* The process groups of the workers alive now (0: a free slot), for
 * arm_interrupt to kill from a signal handler. */
#define MAX_LIVE 1024
static volatile pid_t live_groups[MAX_LIVE];
static volatile sig_atomic_t interrupted_by;

void arm_interrupt(int sig)
{
    if (!interrupted_by) interrupted_by = sig ? sig : SIGTERM;
    for (int i = 0; i < MAX_LIVE; i++) {
        pid_t g = __atomic_load_n(&live_groups[i], __ATOMIC_SEQ_CST);
        if (g > 0) kill(-g, SIGKILL);
    }
}

int arm_interrupted(void)
{
    return interrupted_by;
}

/* Records a worker's process group as alive; kills it at once when an
 * interruption came first (the handler may have run before the record). */
static void group_register(pid_t g)
{
    for (int i = 0; i < MAX_LIVE; i++) {
        pid_t zero = 0;
        if (__atomic_compare_exchange_n(&live_groups[i], &zero, g, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            break;
    }
    if (interrupted_by) kill(-g, SIGKILL);
}

static void group_unregister(pid_t g)
{
    for (int i = 0; i < MAX_LIVE; i++) {
        pid_t want = g;
        if (__atomic_compare_exchange_n(&live_groups[i], &want, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            break;
    }
}

static const char *signame(int sig)
{
    const char *s = sigabbrev_np(sig);
    static __thread char buf[32];
    if (s) snprintf(buf, sizeof buf, "SIG%s", s);
    else snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}

/* ---- stderr capture ---- */

static void fault_line_end(tg_arm *a)
{
    if (a->eline_len == 0) return;
    a->eline[a->eline_len] = 0;
    for (int i = 0; i < a->n_patterns; i++) {
        if (!strstr(a->eline, a->patterns[i])) continue;
        size_t n = a->eline_len;
        if (a->flen + n + 2 <= FAULT_LINES_MAX) {
            if (a->flen + n + 2 > a->fcap) {
                a->fcap = (a->flen + n + 2) * 2;
                a->faults = xrealloc(a->faults, a->fcap);
            }
            memcpy(a->faults + a->flen, a->eline, n);
            a->flen += n;
            a->faults[a->flen++] = '\n';
            a->faults[a->flen] = 0;
        }
        break;
    }
    a->eline_len = 0;
}

static void stderr_take(tg_arm *a, const char *p, size_t n)
{
    size_t keep = a->elen < a->max_stderr ? a->max_stderr - a->elen : 0;
    if (keep > n) keep = n;
    if (keep) {
        if (a->elen + keep + 1 > a->ecap) {
            a->ecap = (a->elen + keep + 1) * 2;
            if (a->ecap > a->max_stderr + 1) a->ecap = a->max_stderr + 1;
            a->ebuf = xrealloc(a->ebuf, a->ecap);
        }
        memcpy(a->ebuf + a->elen, p, keep);
        a->elen += keep;
        a->ebuf[a->elen] = 0;
    }
    a->edropped += n - keep;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') fault_line_end(a);
        else if (a->eline_len < SCAN_LINE_MAX) a->eline[a->eline_len++] = p[i];
    }
}

/* Reads what stderr has now; returns 0, or 1 at EOF. */
static int stderr_read(tg_arm *a)
{
    char buf[65536];
    for (;;) {
        ssize_t r = read(a->fd_err, buf, sizeof buf);
        if (r > 0) { stderr_take(a, buf, (size_t)r); continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        fault_line_end(a);
        a->err_eof = 1;
        close(a->fd_err);
        a->fd_err = -1;
        return 1;
    }
}

/* Reads what stdout has now into obuf (at most max_line + 1 pending bytes
 * plus a chunk). Returns 0, or 1 at EOF. */
static int stdout_read(tg_arm *a)
{
    for (;;) {
        if (a->ostart > 0 && a->ostart == a->olen) a->ostart = a->olen = a->oscan = 0;
        if (a->olen - a->ostart > a->max_line) return 0;   /* caller reports the long line */
        if (a->olen + 65536 > a->ocap) {
            if (a->ostart > 0) {
                memmove(a->obuf, a->obuf + a->ostart, a->olen - a->ostart);
                a->olen -= a->ostart;
                a->oscan -= a->ostart;
                a->ostart = 0;
            }
            if (a->olen + 65536 > a->ocap) {
                a->ocap = (a->olen + 65536) * 2;
                a->obuf = xrealloc(a->obuf, a->ocap + 1);
            }
        }
        ssize_t r = read(a->fd_out, a->obuf + a->olen, 65536);
        if (r > 0) { a->olen += (size_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        a->out_eof = 1;
        close(a->fd_out);
        a->fd_out = -1;
        return 1;
    }
}

/* Waits until deadline for any of: stdout/stderr data (always drained),
 * stdin writable (when want_in). Returns 1 when something happened, 0 at
 * the deadline. */
static int pump(tg_arm *a, double deadline, int want_in)
{
    struct pollfd p[3];
    int n = 0, io = -1, oo = -1, eo = -1;
    if (want_in && a->fd_in >= 0) { io = n; p[n++] = (struct pollfd){a->fd_in, POLLOUT, 0}; }
    if (a->fd_out >= 0 && a->olen - a->ostart <= a->max_line) { oo = n; p[n++] = (struct pollfd){a->fd_out, POLLIN, 0}; }
    if (a->fd_err >= 0) { eo = n; p[n++] = (struct pollfd){a->fd_err, POLLIN, 0}; }
    double left = deadline - tg_now();
    if (left <= 0) return 0;
    if (n == 0) {
        /* nothing to wait on: sleep a little so callers polling waitpid do not spin */
        struct timespec ts = {0, left < 0.01 ? (long)(left * 1e9) : 10000000L};
        nanosleep(&ts, NULL);
        return 1;
    }
    int ms = left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
    int r = poll(p, (nfds_t)n, ms);
    if (r < 0) return errno == EINTR && !interrupted_by ? 1 : 0;
    if (r == 0) return !interrupted_by && tg_now() < deadline;
    if (oo >= 0 && p[oo].revents) stdout_read(a);
    if (eo >= 0 && p[eo].revents) stderr_read(a);
    (void)io;
    return !interrupted_by;   /* tokgate is stopping: no more waiting */
}

/* ---- process control ---- */

/* Polls waitpid until the worker exits or deadline passes, draining its
 * output. Returns 1 when reaped, 0 at the deadline. */
static int reap(tg_arm *a, double deadline)
{
    if (a->pid < 0) return 1;
    for (;;) {
        int st;
        pid_t r = waitpid(a->pid, &st, WNOHANG);
        if (r == a->pid || (r < 0 && errno == ECHILD)) {
            a->status = r == a->pid ? st : 0;
            a->pid = -1;
            a->t_end = tg_now();
            /* the pipes may still have bytes (or be held by grandchildren) */
            double d = tg_now() + 0.2;
            while ((a->fd_err >= 0 || a->fd_out >= 0) && tg_now() < d) {
                struct pollfd p[2];
                int n = 0, eo = -1, oo = -1;
                if (a->fd_err >= 0) { eo = n; p[n++] = (struct pollfd){a->fd_err, POLLIN, 0}; }
                if (a->fd_out >= 0 && a->olen - a->ostart <= a->max_line) { oo = n; p[n++] = (struct pollfd){a->fd_out, POLLIN, 0}; }
                if (n == 0 || poll(p, (nfds_t)n, 50) <= 0) break;
                if (eo >= 0 && p[eo].revents) stderr_read(a);
                if (oo >= 0 && p[oo].revents) stdout_read(a);
            }
            return 1;
        }
        if (tg_now() >= deadline) return 0;
        double d = tg_now() + 0.01;
        if (d > deadline) d = deadline;
        if (a->fd_out < 0 && a->fd_err < 0) {
            struct timespec ts = {0, 5000000L};
            nanosleep(&ts, NULL);
        } else {
            /* stdout beyond max_line is no longer polled; discard it so the worker can go on */
            if (a->olen - a->ostart > a->max_line) a->ostart = a->olen = a->oscan = 0;
            pump(a, d, 0);
        }
    }
}

static void close_in(tg_arm *a)
{
    if (a->fd_in >= 0) close(a->fd_in);
    a->fd_in = -1;
}

/* SIGKILL to whatever is left of the worker's process group once the
 * worker itself has exited: children it forked must not outlive the leg
 * (one that ignores SIGTERM and holds the pipes would otherwise run on).
 * Called right after the reap, while the group id cannot have been reused
 * by another group (a pid is not reused while its group has members). */
static void kill_group(tg_arm *a)
{
    if (a->pgid > 0) {
        kill(-a->pgid, SIGKILL);
        group_unregister(a->pgid);
    }
    a->pgid = -1;
}

/* SIGTERM to the worker's process group, grace, SIGKILL; always reaps, and
 * kills what is left of the group. */
static void kill_and_reap(tg_arm *a)
{
    close_in(a);
    if (a->pid < 0 || reap(a, tg_now())) {
        kill_group(a);
        return;
    }
    kill(-a->pid, SIGTERM);
    kill(a->pid, SIGTERM);
    if (reap(a, tg_now() + a->grace)) {
        kill_group(a);
        return;
    }
    kill(-a->pid, SIGKILL);
    kill(a->pid, SIGKILL);
    while (!reap(a, tg_now() + 5.0)) {
        /* SIGKILL cannot be ignored: only an uninterruptible sleep delays it */
    }
    kill_group(a);
}

__attribute__((format(printf, 2, 3)))
static void fail(tg_arm *a, const char *fmt, ...)
{
    if (a->failed) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (interrupted_by)   /* the worker was killed by us, not by its own fault */
        snprintf(buf, sizeof buf, "interrupted: tokgate got %s", signame(interrupted_by));
    a->failed = 1;
    free(a->cause);
    a->cause = xstrdup(buf);
    kill_and_reap(a);
}

static int fail_err(tg_arm *a, tg_err *e)
{
    return tg_errf(e, "arm %s: %s", a->name, a->cause ? a->cause : "failed");
}

/* After stdout closed during op: wait a grace period for the exit, name it. */
static void fail_eof(tg_arm *a, const char *op, const char *after)
{
    if (a->pid >= 0) reap(a, tg_now() + a->grace);
    if (a->pid < 0 && WIFSIGNALED(a->status))
        fail(a, "crash: %s during %s%s", signame(WTERMSIG(a->status)), op, after);
    else if (a->pid < 0)
        fail(a, "eof: %s: the worker closed its stdout without answering%s (exit status %d)", op,
             after, WEXITSTATUS(a->status));
    else
        fail(a, "eof: %s: the worker closed its stdout without answering%s (still running: killed)",
             op, after);
}

static double request_deadline(tg_arm *a)
{
    double d = tg_now() + a->timeout_request;
    return d < a->leg_deadline ? d : a->leg_deadline;
}

static void fail_timeout(tg_arm *a, const char *op, const char *after)
{
    if (tg_now() >= a->leg_deadline)
        fail(a, "timeout: %s: the leg ran past its %g s limit%s", op, a->timeout_leg, after);
    else
        fail(a, "timeout: %s: no complete answer within %g s%s", op, a->timeout_request, after);
}

/* Writes n bytes to the worker's stdin by deadline. Returns 0 or -1 (failed). */
/* One write() with SIGPIPE blocked for this thread (and consumed when the
 * write raised it), so a dead reader is EPIPE, never a signal. Returns
 * write()'s result with errno. */
static ssize_t write_nosig(int fd, const char *p, size_t n)
{
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    sigpending(&pending);
    int was_pending = sigismember(&pending, SIGPIPE);
    ssize_t w = write(fd, p, n);
    int err = errno;
    if (w < 0 && err == EPIPE && !was_pending) {
        struct timespec zero = {0, 0};
        sigtimedwait(&pipe_set, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = err;
    return w;
}

/* Writes n bytes to the worker's stdin by deadline. Returns 0 or -1 (failed). */
static int send_bytes(tg_arm *a, const char *op, const char *p, size_t n, double deadline)
{
    while (n > 0) {
        if (a->fd_in < 0) { fail_eof(a, op, " (its stdin is closed)"); return -1; }
        ssize_t w = write_nosig(a->fd_in, p, n);
        if (w > 0) { p += w; n -= (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!pump(a, deadline, 1)) { fail_timeout(a, op, " (writing the request)"); return -1; }
            continue;
        }
        close_in(a);
        fail_eof(a, op, " (its stdin is closed)");
        return -1;
    }
    return 0;
}

static int send_json(tg_arm *a, const char *op, json_t *req, double deadline)
{
    char *s = json_dumps(req, JSON_COMPACT);
    if (!s) common_out_of_memory(0);   /* a packed request fails to dump only without memory */
    size_t n = strlen(s);
    s = xrealloc(s, n + 2);
    s[n] = '\n';
    int rc = send_bytes(a, op, s, n + 1, deadline);
    free(s);
    return rc;
}

/* Next stdout line by deadline, NUL-terminated, valid until the next read.
 * Returns 0 with *line and *len, or -1 (failed: timeout, EOF, too long). */
static int read_line(tg_arm *a, const char *op, const char *after, double deadline, char **line, size_t *len)
{
    for (;;) {
        char *nl = a->oscan < a->olen ? memchr(a->obuf + a->oscan, '\n', a->olen - a->oscan) : NULL;
        if (nl) {
            size_t n = (size_t)(nl - (a->obuf + a->ostart));
            if (n > a->max_line) break;
            *line = a->obuf + a->ostart;
            *nl = 0;
            a->ostart = (size_t)(nl - a->obuf) + 1;
            a->oscan = a->ostart;
            if (n > 0 && (*line)[n - 1] == '\r') (*line)[--n] = 0;
            *len = n;
            return 0;
        }
        a->oscan = a->olen;
        if (a->olen - a->ostart > a->max_line) break;
        if (a->out_eof) {
            char why[160];
            snprintf(why, sizeof why, "%s%s", after,
                     a->olen > a->ostart ? " (a partial line without newline)" : "");
            fail_eof(a, op, why);
            return -1;
        }
        if (!pump(a, deadline, 0)) { fail_timeout(a, op, after); return -1; }
    }
    fail(a, "protocol: %s: a line longer than %zu bytes (no newline within the limit)%s", op,
         a->max_line, after);
    return -1;
}

/* Reads and parses one answer line as a JSON object. Returns 0 with *out
 * (caller decrefs), or -1 (failed). */
static int read_json(tg_arm *a, const char *op, const char *after, double deadline, json_t **out)
{
    char *line;
    size_t len;
    if (read_line(a, op, after, deadline, &line, &len) < 0) return -1;
    json_error_t je;
    json_t *j = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    if (!j || !json_is_object(j)) {
        char shown[80];
        snprintf(shown, sizeof shown, "%.60s%s", line, len > 60 ? "..." : "");
        for (char *p = shown; *p; p++)
            if (!isprint((unsigned char)*p)) *p = '?';
        fail(a, "protocol: %s: expected a JSON object line%s, got '%s'%s%s", op, after, shown,
             j ? "" : ": ", j ? "" : je.text);
        json_decref(j);
        return -1;
    }
    *out = j;
    return 0;
}

/* Checks the "ok" member of an answer: 1 ok, 0 the worker's error (e set,
 * worker up), -1 protocol failure. */
static int answer_ok(tg_arm *a, const char *op, json_t *j, tg_err *e)
{
    json_t *ok = json_object_get(j, "ok");
    if (!json_is_boolean(ok)) {
        fail(a, "protocol: %s: expected an answer with \"ok\": true|false", op);
        return -1;
    }
    if (json_is_true(ok)) return 1;
    const char *msg = json_string_value(json_object_get(j, "error"));
    if (!msg) {
        fail(a, "protocol: %s: an error answer without an \"error\" string", op);
        return -1;
    }
    /* the worker names the op itself ("load: ..."): said once; and its
     * text never reaches a terminal with escapes in it */
    size_t k = strlen(op);
    while (!strncmp(msg, op, k) && !strncmp(msg + k, ": ", 2)) msg += k + 2;
    char safe[900];
    tg_errf(e, "arm %s: %s: %s", a->name, op, common_text_safe(msg, safe, sizeof safe));
    return 0;
}

/* Sends req and reads its one-line answer. Returns 1 with *ans (ok:true),
 * 0 for the worker's error (e), -1 failed (e). */
static int request(tg_arm *a, const char *op, json_t *req, json_t **ans, tg_err *e)
{
    *ans = NULL;
    if (a->failed || a->finished) {
        json_decref(req);
        if (a->finished && !a->failed) return tg_errf(e, "arm %s: %s: the worker was already ended", a->name, op);
        fail_err(a, e);
        return -1;
    }
    double deadline = request_deadline(a);
    int rc = send_json(a, op, req, deadline);
    json_decref(req);
    json_t *j = NULL;
    if (rc < 0 || read_json(a, op, "", deadline, &j) < 0) { fail_err(a, e); return -1; }
    rc = answer_ok(a, op, j, e);
    if (rc < 0) { json_decref(j); fail_err(a, e); return -1; }
    if (rc == 0) { json_decref(j); return 0; }
    *ans = j;
    return 1;
}

/* ---- public calls ---- */

/* Our environment with the "NAME=VALUE" entries of env set on top (an
 * entry of ours with the same name left out). Returns a NULL-terminated
 * array of borrowed strings the caller frees (the array only). */
static char **env_with(char *const *env, int n_env)
{
    size_t n = 0;
    while (environ && environ[n]) n++;
    char **v = calloc(n + (size_t)n_env + 1, sizeof *v);
    if (!v) abort();
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t len = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        int over = 0;
        for (int j = 0; j < n_env && !over; j++)
            over = !strncmp(env[j], environ[i], len) && env[j][len] == '=';
        if (!over) v[k++] = environ[i];
    }
    for (int j = 0; j < n_env; j++) v[k++] = env[j];
    return v;
}

int arm_start(tg_arm **out, const arm_config *cfg, tg_err *e)
{
    *out = NULL;
    assert(cfg && cfg->argv && cfg->argv[0]);
    if (interrupted_by)
        return tg_errf(e, "arm %s: not started: tokgate got %s", cfg->name ? cfg->name : cfg->argv[0],
                       signame(interrupted_by));
    tg_arm *a = xcalloc(1, sizeof *a);
    a->name = xstrdup(cfg->name ? cfg->name : cfg->argv[0]);
    a->pid = -1;
    a->fd_in = a->fd_out = a->fd_err = -1;
    a->timeout_request = cfg->timeout_request > 0 ? cfg->timeout_request : 120;
    a->timeout_leg = cfg->timeout_leg;
    a->grace = cfg->grace > 0 ? cfg->grace : 2.0;
    a->exit_wait = cfg->exit_wait > 0 ? cfg->exit_wait : 10.0;
    a->max_line = cfg->max_line ? cfg->max_line : DEFAULT_MAX_LINE;
    a->max_stderr = cfg->max_stderr ? cfg->max_stderr : DEFAULT_MAX_STDERR;
    a->eline = xrealloc(NULL, SCAN_LINE_MAX + 1);
    a->n_patterns = cfg->n_fault_patterns;
    a->patterns = xcalloc((size_t)a->n_patterns + 1, sizeof *a->patterns);
    for (int i = 0; i < a->n_patterns; i++) a->patterns[i] = xstrdup(cfg->fault_patterns[i]);
    a->ebuf = xrealloc(NULL, 1);
    a->ebuf[0] = 0;

    int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr_[2] = {-1, -1};
    if (pipe2(pin, O_CLOEXEC) < 0 || pipe2(pout, O_CLOEXEC) < 0 || pipe2(perr_, O_CLOEXEC) < 0) {
        int err = errno;
        for (int i = 0; i < 2; i++) {
            if (pin[i] >= 0) close(pin[i]);
            if (pout[i] >= 0) close(pout[i]);
            if (perr_[i] >= 0) close(perr_[i]);
        }
        tg_errf(e, "arm %s: cannot create pipes: %s", a->name, strerror(err));
        arm_free(a);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    posix_spawn_file_actions_adddup2(&fa, perr_[1], 2);
    posix_spawnattr_init(&at);
    sigset_t none, defs;
    sigemptyset(&none);
    sigemptyset(&defs);
    int defsigs[] = {SIGPIPE, SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM};
    for (size_t i = 0; i < sizeof defsigs / sizeof defsigs[0]; i++) sigaddset(&defs, defsigs[i]);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &defs);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    pid_t pid;
    a->t_start = tg_now();
    char **envp = cfg->n_env > 0 ? env_with(cfg->env, cfg->n_env) : NULL;
    int rc = posix_spawnp(&pid, cfg->argv[0], &fa, &at, cfg->argv, envp ? envp : environ);
    free(envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(pin[0]);
    close(pout[1]);
    close(perr_[1]);
    a->fd_in = pin[1];
    a->fd_out = pout[0];
    a->fd_err = perr_[0];
    fcntl(a->fd_in, F_SETFL, fcntl(a->fd_in, F_GETFL) | O_NONBLOCK);
    fcntl(a->fd_out, F_SETFL, fcntl(a->fd_out, F_GETFL) | O_NONBLOCK);
    fcntl(a->fd_err, F_SETFL, fcntl(a->fd_err, F_GETFL) | O_NONBLOCK);
    if (rc != 0) {
        tg_errf(e, "arm %s: cannot start %s: %s", a->name, cfg->argv[0], strerror(rc));
        arm_free(a);
        return -1;
    }
    a->pid = pid;
    a->pgid = pid;
    group_register(pid);
    a->leg_deadline = cfg->timeout_leg > 0 ? a->t_start + cfg->timeout_leg : INFINITY;
    *out = a;
    return 0;
}

/* request, then the answer's object key: returns it (*ans holds it; the
 * caller frees *ans) with the answer as compact JSON into answer_json
 * (NULL: not wanted), or NULL when the request failed or the answer has no
 * such object (the arm failed, e written). */
static json_t *request_object(tg_arm *a, const char *op, json_t *req, const char *key, json_t **ans,
                              char **answer_json, tg_err *e)
{
    if (answer_json) *answer_json = NULL;
    if (request(a, op, req, ans, e) <= 0) return NULL;
    json_t *obj = json_object_get(*ans, key);
    if (!json_is_object(obj)) {
        json_decref(*ans);
        *ans = NULL;
        fail(a, "protocol: %s: expected %s \"%s\" object in the answer", op, strchr("aeiou", key[0]) ? "an" : "a",
             key);
        fail_err(a, e);
        return NULL;
    }
    if (answer_json) *answer_json = json_dumps(*ans, JSON_COMPACT | JSON_SORT_KEYS);
    return obj;
}

int arm_hello(tg_arm *a, char **answer_json, tg_err *e)
{
    json_t *req = json_pack("{s:s,s:i}", "op", "hello", "protocol", 1), *ans;
    json_t *arm = request_object(a, "hello", req, "arm", &ans, answer_json, e);
    if (!arm) return -1;
    json_decref(a->hello_arm);
    a->hello_arm = json_incref(arm);
    json_decref(ans);
    return 0;
}

const char *arm_hello_field(tg_arm *a, const char *key)
{
    return a && a->hello_arm ? json_string_value(json_object_get(a->hello_arm, key)) : NULL;
}

int arm_load(tg_arm *a, const char *model, const char *options_json, char **answer_json, tg_err *e)
{
    if (answer_json) *answer_json = NULL;
    json_error_t je;
    json_t *opts = json_loads(options_json ? options_json : "{}", 0, &je);
    if (!json_is_object(opts)) {
        json_decref(opts);
        return tg_errf(e, "arm %s: load: options are not a JSON object: %s", a->name, options_json);
    }
    json_t *req = json_pack("{s:s,s:s,s:o}", "op", "load", "model", model, "options", opts), *ans;
    if (!request_object(a, "load", req, "model", &ans, answer_json, e)) return -1;
    json_decref(ans);
    return 0;
}

int arm_replay(tg_arm *a, const int32_t *tokens, int n, int prefill, const char *in, const char *out,
               const char *numerics_json, char **answer_json, tg_err *e)
{
    if (answer_json) *answer_json = NULL;
    json_t *num = NULL;
    if (numerics_json) {
        json_error_t je;
        num = json_loads(numerics_json, 0, &je);
        if (!json_is_object(num)) {
            json_decref(num);
            return tg_errf(e, "arm %s: replay: numerics are not a JSON object: %s", a->name, numerics_json);
        }
    }
    json_t *ids = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(ids, json_integer(tokens[i]));
    json_t *req = json_pack("{s:s,s:o,s:s}", "op", "replay", "tokens", ids, "out", out), *ans;
    if (in) json_object_set_new(req, "in", json_string(in));
    if (num) json_object_set_new(req, "numerics", num);
    if (prefill > 0 && prefill < n) json_object_set_new(req, "prefill", json_integer(prefill));
    if (!request_object(a, "replay", req, "replay", &ans, answer_json, e)) return -1;
    json_decref(ans);
    return 0;
}

/* An array of ids (each 0..INT32_MAX) into a malloc'ed vector. Returns 0 or -1. */
static int ids_from_json(json_t *arr, int32_t **ids, int *n)
{
    if (!json_is_array(arr)) return -1;
    size_t k = json_array_size(arr);
    int32_t *v = xrealloc(NULL, (k ? k : 1) * sizeof *v);
    for (size_t i = 0; i < k; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(v);
            return -1;
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    *ids = v;
    *n = (int)k;
    return 0;
}

static json_t *ids_to_json(const int32_t *ids, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

int arm_tokenize(tg_arm *a, const char *text, int special, int32_t **ids, int *n, tg_err *e)
{
    *ids = NULL;
    *n = 0;
    json_t *req = json_pack("{s:s,s:s,s:b}", "op", "tokenize", "text", text, "special", special), *ans;
    if (!req) return tg_errf(e, "arm %s: tokenize: the prompt is not valid UTF-8", a->name);
    int rc = request(a, "tokenize", req, &ans, e);
    if (rc <= 0) return -1;
    rc = ids_from_json(json_object_get(ans, "ids"), ids, n);
    json_decref(ans);
    if (rc < 0) {
        fail(a, "protocol: tokenize: expected \"ids\": an array of token ids (integers >= 0)");
        return fail_err(a, e);
    }
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int arm_detokenize(tg_arm *a, const int32_t *ids, int n, int special, char **text, size_t *len,
                   tg_err *e)
{
    *text = NULL;
    *len = 0;
    json_t *req = json_pack("{s:s,s:o,s:b}", "op", "detokenize", "ids", ids_to_json(ids, n),
                            "special", special), *ans;
    int rc = request(a, "detokenize", req, &ans, e);
    if (rc <= 0) return -1;
    json_t *t = json_object_get(ans, "text"), *h = json_object_get(ans, "hex");
    if (!json_is_string(t) || (h && !json_is_string(h))) {
        json_decref(ans);
        fail(a, "protocol: detokenize: expected \"text\": a string (and \"hex\": a string when given)");
        return fail_err(a, e);
    }
    if (h) {
        const char *s = json_string_value(h);
        size_t k = strlen(s);
        char *b = xrealloc(NULL, k / 2 + 1);
        for (size_t i = 0; i < k; i += 2) {
            int hi = hexval((unsigned char)s[i]), lo = i + 1 < k ? hexval((unsigned char)s[i + 1]) : -1;
            if (hi < 0 || lo < 0) {
                free(b);
                json_decref(ans);
                fail(a, "protocol: detokenize: \"hex\" is not an even run of hex digits");
                return fail_err(a, e);
            }
            b[i / 2] = (char)(hi << 4 | lo);
        }
        b[k / 2] = 0;
        *text = b;
        *len = k / 2;
    } else if (!(*text = proto_string_dup(t, len)))
        common_out_of_memory(json_string_length(t) + 1);
    json_decref(ans);
    return 0;
}

void arm_decode_res_free(arm_decode_res *r)
{
    if (!r) return;
    for (int i = 0; i < r->n_steps; i++) free(r->steps[i].top);
    free(r->steps);
    for (int i = 0; i < r->n_dumps; i++) free(r->dumps[i].data);
    free(r->dumps);
    free(r->counters_json);
    memset(r, 0, sizeof *r);
}

/* A logit of a "top" pair: a JSON number, or the strings "nan", "inf",
 * "-inf" the protocol uses for non-finite values. Returns 0 or -1. */
static int logit_of(json_t *v, float *out)
{
    if (json_is_number(v)) {
        *out = (float)json_number_value(v);
        return 0;
    }
    const char *s = json_string_value(v);
    if (!s) return -1;
    if (!strcmp(s, "nan")) *out = NAN;
    else if (!strcmp(s, "inf")) *out = INFINITY;
    else if (!strcmp(s, "-inf")) *out = -INFINITY;
    else return -1;
    return 0;
}

/* The protocol's order of a top list: a before b when a's logit is larger,
 * or equal with the lower id; NaN after every number. */
static int top_before(tg_top a, tg_top b)
{
    if (isnan(a.logit) || isnan(b.logit)) return isnan(a.logit) && isnan(b.logit) ? a.id < b.id : isnan(b.logit);
    if (a.logit != b.logit) return a.logit > b.logit;
    return a.id < b.id;
}

/* Validates a step line into st. Returns NULL, or what was wrong. */
static const char *parse_step(json_t *j, int expect, int top_k, arm_step *st, char *why, size_t wn)
{
    json_t *s = json_object_get(j, "step"), *t = json_object_get(j, "token"),
           *top = json_object_get(j, "top"), *d = json_object_get(j, "digest");
    if (!json_is_integer(s) || json_integer_value(s) != expect) {
        snprintf(why, wn, "expected \"step\": %d", expect);
        return why;
    }
    if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
        return "expected \"token\": a token id (integer >= 0)";
    if (!json_is_array(top) || json_array_size(top) < 1 || json_array_size(top) > (size_t)top_k) {
        snprintf(why, wn, "expected \"top\": an array of 1..%d [id, logit] pairs", top_k);
        return why;
    }
    if (d && !json_is_string(d)) return "expected \"digest\": a string of 16 hex digits";
    if (d) {
        const char *h = json_string_value(d);
        int ok = strlen(h) == 16;
        for (int i = 0; ok && i < 16; i++) ok = isxdigit((unsigned char)h[i]);
        if (!ok) return "expected \"digest\": 16 hex digits (XXH3-64 of the logits)";
        snprintf(st->digest, sizeof st->digest, "%s", h);
    }
    st->token = (int32_t)json_integer_value(t);
    st->n_top = (int)json_array_size(top);
    st->top = xrealloc(NULL, (size_t)st->n_top * sizeof *st->top);
    for (int i = 0; i < st->n_top; i++) {
        json_t *p = json_array_get(top, (size_t)i);
        json_t *id = json_array_get(p, 0), *lg = json_array_get(p, 1);
        float logit;
        if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(id) || logit_of(lg, &logit) < 0 ||
            json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX) {
            snprintf(why, wn, "expected \"top\"[%d]: [id, logit] (a number, or \"nan\", \"inf\", \"-inf\")", i);
            return why;
        }
        st->top[i].id = (int32_t)json_integer_value(id);
        st->top[i].logit = logit;
        if (i > 0 && !top_before(st->top[i - 1], st->top[i])) {
            snprintf(why, wn, "expected \"top\" ordered by logit descending, ties by lower id, NaN last (entry %d)", i);
            return why;
        }
    }
    if (st->top[0].id != st->token) {
        snprintf(why, wn, "\"token\" %d is not the first entry of \"top\" (%d)", (int)st->token,
                 (int)st->top[0].id);
        return why;
    }
    return NULL;
}

int arm_parse_step_line(const char *line, size_t len, int expect, int top_k, arm_step *st, tg_err *e)
{
    memset(st, 0, sizeof *st);
    json_error_t je;
    json_t *j = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return tg_errf(e, "step line: expected a JSON object%s%s", j ? "" : ": ", j ? "" : je.text);
    }
    char why[256];
    const char *bad = parse_step(j, expect, top_k, st, why, sizeof why);
    json_decref(j);
    if (bad) {
        tg_errf(e, "step line %d: %s", expect, bad);
        free(st->top);
        memset(st, 0, sizeof *st);
        return -1;
    }
    return 0;
}

/* Reads a dump line's file into du. Only a decode that asked for dumps
 * may send dump lines, and a dump file must lie directly in the folder the
 * harness gave it (its real path's folder is the folder's real path): a
 * worker cannot make the harness read any other file. Returns NULL or what
 * was wrong. */
static const char *parse_dump(json_t *j, const char *dir, arm_dump *du, char *why, size_t wn)
{
    if (!dir) return "a dump line, but this decode asked for no dumps";
    json_t *o = json_object_get(j, "dump");
    json_t *s = json_object_get(o, "step"), *l = json_object_get(o, "layer"), *g = json_object_get(o, "stage"),
           *n = json_object_get(o, "n"), *f = json_object_get(o, "file");
    if (!json_is_object(o) || !json_is_integer(s) || !json_is_integer(l) || !json_is_string(g) ||
        !json_is_integer(n) || !json_is_string(f) || json_integer_value(n) < 0 ||
        json_integer_value(n) > ((int64_t)1 << 31))
        return "expected \"dump\": {step, layer, stage, n, file}";
    du->step = (int)json_integer_value(s);
    du->layer = (int)json_integer_value(l);
    snprintf(du->stage, sizeof du->stage, "%s", json_string_value(g));
    du->n = json_integer_value(n);
    char path[4096], real[PATH_MAX], real_dir[PATH_MAX];
    const char *fn = json_string_value(f);
    if (fn[0] == '/') snprintf(path, sizeof path, "%s", fn);
    else snprintf(path, sizeof path, "%s/%s", dir, fn);
    if (!realpath(dir, real_dir)) {
        snprintf(why, wn, "the dump folder %.160s is gone: %s", dir, strerror(errno));
        return why;
    }
    if (!realpath(path, real)) {
        snprintf(why, wn, "dump file %.160s cannot be opened: %s", path, strerror(errno));
        return why;
    }
    char *slash = strrchr(real, '/');
    if (!slash || (size_t)(slash - real) != strlen(real_dir) || strncmp(real, real_dir, strlen(real_dir))) {
        snprintf(why, wn, "dump file %.100s is outside the dump folder %.100s", path, dir);
        return why;
    }
    FILE *fp = fopen(real, "rb");
    if (!fp) {
        snprintf(why, wn, "dump file %.160s cannot be opened: %s", path, strerror(errno));
        return why;
    }
    /* n is the worker's word: check it against the file before allocating */
    struct stat fst;
    if (fstat(fileno(fp), &fst) != 0 || !S_ISREG(fst.st_mode) ||
        (uint64_t)fst.st_size != (uint64_t)du->n * sizeof(float)) {
        fclose(fp);
        snprintf(why, wn, "dump file %.160s is not a regular file of exactly n=%lld f32 values", path,
                 (long long)du->n);
        return why;
    }
    du->data = xrealloc(NULL, (size_t)(du->n ? du->n : 1) * sizeof(float));
    size_t r = fread(du->data, sizeof(float), (size_t)du->n, fp);
    int extra = fgetc(fp) != EOF;
    fclose(fp);
    if (r != (size_t)du->n || extra) {
        snprintf(why, wn, "dump file %.160s does not hold exactly n=%lld f32 values", path, (long long)du->n);
        return why;
    }
    return NULL;
}

static double ms_field(json_t *ms, const char *k)
{
    json_t *v = json_object_get(ms, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

int arm_decode(tg_arm *a, const arm_decode_req *q, arm_decode_res *res,
               arm_progress_fn progress, void *ud, tg_err *e)
{
    memset(res, 0, sizeof *res);
    res->ms_load = res->ms_prefill = res->ms_decode = NAN;
    if (a->failed || a->finished) {
        if (a->finished && !a->failed) return tg_errf(e, "arm %s: decode: the worker was already ended", a->name);
        return fail_err(a, e);
    }
    json_t *req = json_pack("{s:s,s:o,s:i,s:i}", "op", "decode", "prompt", ids_to_json(q->prompt, q->n_prompt),
                            "steps", q->steps, "top_k", q->top_k);
    if (q->force) json_object_set_new(req, "force", ids_to_json(q->force, q->n_force));
    if (q->n_dump_steps > 0) {
        json_t *ds = json_array();
        for (int i = 0; i < q->n_dump_steps; i++) json_array_append_new(ds, json_integer(q->dump_steps[i]));
        json_object_set_new(req, "dump", json_pack("{s:o,s:s}", "steps", ds, "path", q->dump_path ? q->dump_path : "."));
    }
    double deadline = request_deadline(a);
    int rc = send_json(a, "decode", req, deadline);
    json_decref(req);
    if (rc < 0) return fail_err(a, e);
    res->steps = xrealloc(NULL, (size_t)q->steps * sizeof *res->steps);
    for (;;) {
        char after[96], why[256];
        snprintf(after, sizeof after, " (after %d of %d step lines)", res->n_steps, q->steps);
        json_t *j;
        if (read_json(a, "decode", after, deadline, &j) < 0) return fail_err(a, e);
        if (json_object_get(j, "step")) {
            if (res->n_steps >= q->steps) {
                json_decref(j);
                fail(a, "protocol: decode: more than the %d step lines asked for", q->steps);
                return fail_err(a, e);
            }
            arm_step *st = &res->steps[res->n_steps];
            memset(st, 0, sizeof *st);
            const char *bad = parse_step(j, res->n_steps, q->top_k, st, why, sizeof why);
            json_decref(j);
            if (bad) {
                free(st->top);
                fail(a, "protocol: decode: step line %d: %s", res->n_steps, bad);
                return fail_err(a, e);
            }
            res->n_steps++;
            if (progress) progress(ud, res->n_steps);
            continue;
        }
        if (json_object_get(j, "dump")) {
            res->dumps = xrealloc(res->dumps, (size_t)(res->n_dumps + 1) * sizeof *res->dumps);
            arm_dump *du = &res->dumps[res->n_dumps];
            memset(du, 0, sizeof *du);
            const char *bad = parse_dump(j, q->n_dump_steps > 0 ? q->dump_path : NULL, du, why, sizeof why);
            json_decref(j);
            res->n_dumps++;
            if (bad) {
                fail(a, "protocol: decode: dump line: %s", bad);
                return fail_err(a, e);
            }
            continue;
        }
        rc = answer_ok(a, "decode", j, e);
        if (rc < 0) { json_decref(j); return fail_err(a, e); }
        if (rc == 0) { json_decref(j); return -1; }
        json_t *done = json_object_get(j, "done"), *ctr = json_object_get(j, "counters"),
               *ms = json_object_get(j, "ms");
        const char *bad = NULL;
        if (!json_is_true(done)) bad = "expected \"done\": true in the final answer";
        else if (res->n_steps != q->steps) {
            snprintf(why, sizeof why, "done after %d step lines, expected %d", res->n_steps, q->steps);
            bad = why;
        } else if (ctr && !json_is_object(ctr)) bad = "expected \"counters\": an object";
        else if (ms && !json_is_object(ms)) bad = "expected \"ms\": an object of milliseconds";
        if (bad) {
            json_decref(j);
            fail(a, "protocol: decode: %s", bad);
            return fail_err(a, e);
        }
        if (ctr) res->counters_json = json_dumps(ctr, JSON_COMPACT | JSON_SORT_KEYS);
        res->ms_load = ms_field(ms, "load");
        res->ms_prefill = ms_field(ms, "prefill");
        res->ms_decode = ms_field(ms, "decode");
        json_decref(j);
        return 0;
    }
}

int arm_failed(const tg_arm *a) { return a && a->failed; }
const char *arm_cause(const tg_arm *a) { return a ? a->cause : NULL; }
pid_t arm_pid(const tg_arm *a) { return a ? a->pid : -1; }

static void fill_exit(tg_arm *a, arm_exit *x)
{
    memset(x, 0, sizeof *x);
    x->exit_status = WIFEXITED(a->status) ? WEXITSTATUS(a->status) : -1;
    x->term_signal = WIFSIGNALED(a->status) ? WTERMSIG(a->status) : 0;
    x->cause = a->cause;
    x->stderr_text = a->ebuf;
    x->stderr_len = a->elen;
    x->stderr_dropped = a->edropped;
    x->fault_lines = a->flen ? a->faults : NULL;
    x->wall_s = (a->t_end > 0 ? a->t_end : tg_now()) - a->t_start;
}

int arm_finish(tg_arm *a, arm_exit *x)
{
    if (!a->finished) {
        a->finished = 1;
        if (!a->failed && a->pid >= 0) {
            double d = tg_now() + a->exit_wait;
            if (d > a->leg_deadline) d = a->leg_deadline;
            static const char bye[] = "{\"op\":\"bye\"}\n";
            /* best effort: a worker that is gone already is judged by its exit */
            if (a->fd_in >= 0) (void)write_nosig(a->fd_in, bye, sizeof bye - 1);
            close_in(a);
            /* discard whatever the worker still prints; wait for its exit */
            if (!reap(a, d)) {
                kill_and_reap(a);
                char buf[160];
                snprintf(buf, sizeof buf, "exit: the worker did not exit within %g s after bye (killed)", a->exit_wait);
                a->cause = xstrdup(buf);
            }
            if (!a->cause && WIFSIGNALED(a->status)) {
                char buf[96];
                snprintf(buf, sizeof buf, "crash: %s at exit", signame(WTERMSIG(a->status)));
                a->cause = xstrdup(buf);
            } else if (!a->cause && WIFEXITED(a->status) && WEXITSTATUS(a->status) != 0) {
                char buf[96];
                snprintf(buf, sizeof buf, "exit: status %d after a clean session", WEXITSTATUS(a->status));
                a->cause = xstrdup(buf);
            }
        } else {
            kill_and_reap(a);
        }
        kill_group(a);
        /* drain stderr to its end (grandchildren may hold it: bounded wait) */
        double d = tg_now() + 0.5;
        while (a->fd_err >= 0 && tg_now() < d) {
            struct pollfd p = {a->fd_err, POLLIN, 0};
            if (poll(&p, 1, 50) > 0) stderr_read(a);
        }
        fault_line_end(a);
        if (a->fd_err >= 0) { close(a->fd_err); a->fd_err = -1; }
        if (a->fd_out >= 0) { close(a->fd_out); a->fd_out = -1; }
    }
    if (x) fill_exit(a, x);
    return 0;
}

void arm_free(tg_arm *a)
{
    if (!a) return;
    if (a->pid >= 0) {
        a->failed = 1;
        kill_and_reap(a);
    }
    kill_group(a);
    if (a->fd_in >= 0) close(a->fd_in);
    if (a->fd_out >= 0) close(a->fd_out);
    if (a->fd_err >= 0) close(a->fd_err);
    for (int i = 0; i < a->n_patterns; i++) free(a->patterns[i]);
    free(a->patterns);
    free(a->name);
    free(a->obuf);
    free(a->ebuf);
    free(a->eline);
    free(a->faults);
    free(a->cause);
    json_decref(a->hello_arm);
    free(a);
}

void arm_exit_free(arm_exit *x)
{
    if (!x) return;
    free((char *)x->cause);
    free((char *)x->stderr_text);
    free((char *)x->fault_lines);
    memset(x, 0, sizeof *x);
}

int arm_run_command(char *const *argv, double timeout, size_t max_out,
                    int n_fault_patterns, char *const *fault_patterns,
                    char **out, size_t *out_len, arm_exit *x, tg_err *e)
{
    *out = NULL;
    *out_len = 0;
    memset(x, 0, sizeof *x);
    arm_config cfg = {.name = argv[0], .argv = argv, .timeout_request = timeout, .timeout_leg = timeout,
                      .grace = 1.0, .max_line = max_out ? max_out : ((size_t)64 << 20),
                      .n_fault_patterns = n_fault_patterns, .fault_patterns = fault_patterns};
    tg_arm *a;
    if (arm_start(&a, &cfg, e) < 0) {
        x->cause = xstrdup(e ? e->msg : "cannot start");
        x->exit_status = -1;
        return -1;
    }
    close_in(a);  /* the command reads nothing: EOF on stdin */
    double deadline = a->leg_deadline;
    while (!a->out_eof && a->olen - a->ostart <= a->max_line && pump(a, deadline, 0)) {}
    int rc = 0;
    if (!a->out_eof && a->olen - a->ostart > a->max_line) {
        fail(a, "output: more than %zu bytes on stdout", a->max_line);
        rc = -1;
    } else if (!a->out_eof) {
        fail(a, "timeout: no end of output within %g s", timeout);
        rc = -1;
    } else if (!reap(a, deadline)) {
        fail(a, "timeout: did not exit within %g s", timeout);
        rc = -1;
    } else if (WIFSIGNALED(a->status)) {
        fail(a, "crash: %s", signame(WTERMSIG(a->status)));
        rc = -1;
    } else if (WEXITSTATUS(a->status) != 0) {
        fail(a, "exit: status %d", WEXITSTATUS(a->status));
        rc = -1;
    }
    a->finished = 1;
    kill_and_reap(a);
    double d = tg_now() + 0.5;
    while (a->fd_err >= 0 && tg_now() < d) {
        struct pollfd p = {a->fd_err, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) stderr_read(a);
    }
    fault_line_end(a);
    arm_exit tmp;
    fill_exit(a, &tmp);
    x->exit_status = tmp.exit_status;
    x->term_signal = tmp.term_signal;
    x->cause = a->cause ? xstrdup(a->cause) : NULL;
    x->stderr_text = xstrdup(a->ebuf);
    x->stderr_len = a->elen;
    x->stderr_dropped = a->edropped;
    x->fault_lines = a->flen ? xstrdup(a->faults) : NULL;
    x->wall_s = tmp.wall_s;
    if (rc == 0) {
        size_t n = a->olen - a->ostart;
        char *b = xrealloc(NULL, n + 1);
        memcpy(b, a->obuf + a->ostart, n);
        b[n] = 0;
        *out = b;
        *out_len = n;
    } else {
        tg_errf(e, "command %s: %s", argv[0], a->cause);
    }
    arm_free(a);
    return rc;
}

int arm_dump_dir_make(char *buf, size_t n, const char *what, tg_err *e)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, n, "%s/tokgate-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", what);
    if (mkdtemp(buf)) return 0;
    snprintf(buf, n, "/tmp/tokgate-%s-XXXXXX", what);
    if (mkdtemp(buf)) return 0;
    int err = errno;
    buf[0] = 0;
    return tg_errf(e, "cannot make a temporary dump folder: %s", strerror(err));
}

void arm_dump_dir_remove(const char *dir)
{
    if (!dir || !dir[0]) return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}
