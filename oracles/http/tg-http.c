/*
 * tg-http: an arm worker over an inference server's HTTP API, speaking arm
 * protocol v1 (docs/protocol.md) on stdin/stdout, so that a server as
 * deployed (llama.cpp's llama-server, or any OpenAI-compatible completions
 * API: vLLM, SGLang, LocalAI, ...) is gated like any other arm.
 *
 *   tg-http --url http://HOST:PORT [--api llama|openai] [--top-k-max N]
 *           [--timeout S] [--connect-timeout S] [--api-key-env NAME]
 *           [--header 'Name: value'] [--header-env Name=ENVVAR]
 *           [--model NAME] [--body JSON] [--tokens-per-request N]
 *           [--prompt ids|text]
 *           [--health PATH] [--start-wait S] [--start PROGRAM ARGS...]
 *
 * Two API flavours:
 *  - llama: llama.cpp's own endpoints: POST /tokenize, /detokenize, and
 *    /completion with a token-array prompt, n_predict, n_probs,
 *    temperature 0 and the sampler chain reduced to "temperature" (greedy:
 *    the first maximum of the raw logits), cache_prompt, return_tokens.
 *  - openai: POST /v1/completions with a prompt of token ids (or of text,
 *    --prompt text, flagged in hello and load), max_tokens, logprobs: k,
 *    temperature 0; /tokenize and /detokenize in the request shapes of
 *    llama.cpp and vLLM at once (each ignores the other's fields).
 * Both read per-token top log-probabilities with token ids: the
 * `completion_probabilities` / `logprobs.content` lists of llama-server
 * ({id, logprob, top_logprobs: [{id, logprob}]}) and the legacy OpenAI
 * `logprobs.top_logprobs` maps when their keys name ids ("token_id:N",
 * vLLM's return_tokens_as_token_ids; pass it with --body). A server whose
 * logprobs name tokens by text only is refused with that advice: text does
 * not identify a token.
 *
 * The values are log-probabilities, not logits: hello says
 * "logits":"logprob". A log-probability is the logit minus a per-step
 * constant (the log-sum-exp over the vocabulary), so ranks and the gaps
 * between entries are those of the logits (up to float rounding in the
 * server's softmax) and a softmax over any set of entries is unchanged.
 * Step lines carry no digest: the full logit vector never leaves the
 * server. The top list holds at most --top-k-max entries (default: none
 * for llama, 20 for openai, the common server limit), shorter than the
 * spec's top_k when the server limits it.
 *
 * A decode starts from an empty cache (llama flavour: cache_prompt false
 * on its first request, as the protocol says every decode is independent)
 * and asks for as many tokens as remain (or --tokens-per-request). Every
 * answered token is a step: under teacher forcing the forced token is
 * appended, and as long as it is the token the server itself went on with,
 * the same answer carries the next step; where they differ (or the server
 * stopped at an end-of-generation token) the next request extends the
 * prompt by the appended tokens and the server's prompt cache serves the
 * shared prefix. Each answer is checked for its position: the server's
 * prompt token count must be the length of the prompt sent (a mismatch,
 * a truncated prompt or more tokens than asked for end the decode).
 *
 * Optionally tg-http starts the server itself (--start, the rest of the
 * command line is its argv, never a shell) at load, with "{model}" in its
 * words replaced by the load's model path and "{port}" (there and in
 * --url) by a free port on 127.0.0.1 chosen at start-up; it waits for
 * --health (default /health) to answer 200 within --start-wait seconds,
 * and stops it (SIGTERM, then SIGKILL) at bye, at end of input, at the
 * next load and when tg-http itself is ended. The server's stdout and
 * stderr go to tg-http's stderr (the leg's log, scanned for the spec's
 * fault patterns); it dies with tg-http (PR_SET_PDEATHSIG) and shares its
 * process group, which the harness kills at a leg's end.
 *
 * A decode that asks for dumps gets none (a server does not expose its
 * hidden states): a note on stderr, the steps as usual.
 *
 * Faults are answers: connection refused, a server that died, a timeout
 * (--timeout per HTTP request, --connect-timeout), HTTP 4xx/5xx (with the
 * server's own message), malformed JSON and answers for the wrong position
 * each make the op answer ok:false with what happened, and tg-http stays
 * up. Secrets never leave the process: --api-key-env and --header-env
 * name environment variables whose values are sent as headers and never
 * printed; messages quote URLs and answers, not request headers.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "proto.h"
#include "util.h"

#define TG_HTTP_VERSION "tg-http 0.1 (protocol 1)"
#define MAX_ANSWER ((size_t)64 << 20)   /* largest HTTP answer body read, bytes */
#define OPENAI_TOP_K_MAX 20             /* --top-k-max default of the openai flavour */

typedef enum api_kind { API_LLAMA = 0, API_OPENAI } api_kind;

typedef struct worker {
    api_kind api;
    char *url;                   /* base URL, "{port}" resolved, no trailing '/' */
    char port[16];               /* the port chosen for "{port}", or "" */
    int top_k_max;               /* 0: no limit of our own */
    double timeout_s;            /* one HTTP request, seconds */
    double connect_timeout_s;
    struct curl_slist *headers;  /* request headers; values may be secrets: never printed */
    int n_secret_headers;        /* headers whose values came from the environment */
    const char *model_name;      /* openai: the "model" field, or NULL */
    json_t *body_extra;          /* object merged into every completion request, or NULL */
    int tokens_per_request;      /* 0: as many as remain */
    int prompt_text;             /* send prompts as text (detokenized by the server) */
    /* the server tg-http starts, when --start is given */
    char **start_argv;           /* (start_argc + 1) template words, NULL-terminated */
    int start_argc;
    const char *health;          /* health path, "/health" by default */
    double start_wait_s;
    pid_t pid;                   /* the running server, or -1 */
    char *server_model;          /* the model path it was started with */
    /* HTTP */
    CURL *curl;
    char errbuf[CURL_ERROR_SIZE];
    char *ans;                   /* the last answer body (ans_len bytes, NUL-terminated) */
    size_t ans_len, ans_cap;
    int ans_too_long;
    int loaded;
    int n_vocab;                 /* from the server, 0 when it does not say */
} worker;

/* The started server, for the signal handler (0: none). */
static volatile pid_t g_server_pid = 0;

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) abort();   /* out of memory is not an input error */
    return q;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s ? s : "");
    if (!d) abort();
    return d;
}

/* ---- the started server ---- */

/* A free TCP port on 127.0.0.1 into w->port (the kernel's choice for port
 * 0). Returns 0, or -1 with e. */
static int port_pick(worker *w, tg_err *e)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return tg_errf(e, "cannot pick a free port: socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
    socklen_t n = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || getsockname(fd, (struct sockaddr *)&a, &n) < 0) {
        int err = errno;
        close(fd);
        return tg_errf(e, "cannot pick a free port on 127.0.0.1: %s", strerror(err));
    }
    close(fd);
    snprintf(w->port, sizeof w->port, "%u", (unsigned)ntohs(a.sin_port));
    return 0;
}

/* s with every "{model}" and "{port}" replaced (malloc'ed). */
static char *subst(const char *s, const char *model, const char *port)
{
    size_t cap = strlen(s) + 1, len = 0;
    char *o = xrealloc(NULL, cap);
    while (*s) {
        const char *add = s;
        size_t an = 1, skip = 1;
        if (model && !strncmp(s, "{model}", 7)) add = model, an = strlen(model), skip = 7;
        else if (port && *port && !strncmp(s, "{port}", 6)) add = port, an = strlen(port), skip = 6;
        if (len + an + 1 > cap) {
            cap = (len + an + 1) * 2;
            o = xrealloc(o, cap);
        }
        memcpy(o + len, add, an);
        len += an;
        s += skip;
    }
    o[len] = 0;
    return o;
}

/* "SIGKILL" (or "signal 40"), in a static buffer. */
static const char *sig_name(int sig)
{
    const char *s = sigabbrev_np(sig);
    static char buf[32];
    if (s) snprintf(buf, sizeof buf, "SIG%s", s);
    else snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}

/* Whether the started server is still running; when it has exited, fills
 * why ("exited with status 1", "was killed by SIGKILL") and forgets it.
 * Returns 1 running (or none started: why ""), 0 exited. */
static int server_alive(worker *w, char *why, size_t n)
{
    why[0] = 0;
    if (w->pid <= 0) return 1;
    int st;
    pid_t r = waitpid(w->pid, &st, WNOHANG);
    if (r == 0) return 1;
    if (r == w->pid && WIFSIGNALED(st)) snprintf(why, n, "was killed by %s", sig_name(WTERMSIG(st)));
    else if (r == w->pid) snprintf(why, n, "exited with status %d", WEXITSTATUS(st));
    else snprintf(why, n, "is gone (waitpid: %s)", strerror(errno));
    w->pid = -1;
    g_server_pid = 0;
    return 0;
}

/* Stops the started server: SIGTERM, up to 10 s, then SIGKILL; always
 * reaps it. No-op when none runs. */
static void server_stop(worker *w)
{
    if (w->pid <= 0) return;
    kill(w->pid, SIGTERM);
    for (int i = 0; i < 1000; i++) {
        if (waitpid(w->pid, NULL, WNOHANG) == w->pid) goto reaped;
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    kill(w->pid, SIGKILL);
    waitpid(w->pid, NULL, 0);
reaped:
    w->pid = -1;
    g_server_pid = 0;
}

/* SIGTERM/SIGINT/SIGHUP: take the started server along, then exit. */
static void on_signal(int sig)
{
    pid_t p = g_server_pid;
    if (p > 0) kill(p, SIGTERM);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* ---- HTTP ---- */

static size_t on_body(char *p, size_t sz, size_t nm, void *ud)
{
    worker *w = ud;
    size_t n = sz * nm;
    if (w->ans_len + n > MAX_ANSWER) {
        w->ans_too_long = 1;
        return 0;   /* curl stops with a write error */
    }
    if (w->ans_len + n + 1 > w->ans_cap) {
        w->ans_cap = (w->ans_len + n + 1) * 2;
        w->ans = xrealloc(w->ans, w->ans_cap);
    }
    memcpy(w->ans + w->ans_len, p, n);
    w->ans_len += n;
    w->ans[w->ans_len] = 0;
    return n;
}

/* A printable excerpt of text (at most max bytes): ASCII only, control and
 * non-ASCII bytes as '?', so that a cut never splits a UTF-8 sequence (an
 * error answer must be valid UTF-8 to be written at all). */
static void excerpt(const char *text, size_t len, char *out, size_t max)
{
    size_t n = len < max - 4 ? len : max - 4, k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)text[i];
        out[k++] = ch < 0x20 || ch >= 0x7f ? '?' : (char)ch;
    }
    if (n < len) out[k++] = '.', out[k++] = '.', out[k++] = '.';
    out[k] = 0;
}

/* The server's own message in an error answer: error.message (llama.cpp,
 * OpenAI), error (a string), message, detail (FastAPI), else an excerpt of
 * the body. */
static void server_message(const char *body, size_t len, char *out, size_t max)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    const char *m = NULL;
    if (json_is_object(j)) {
        json_t *er = json_object_get(j, "error");
        if (json_is_object(er)) m = json_string_value(json_object_get(er, "message"));
        if (!m) m = json_string_value(er);
        if (!m) m = json_string_value(json_object_get(j, "message"));
        if (!m) m = json_string_value(json_object_get(j, "detail"));
    }
    if (m) excerpt(m, strlen(m), out, max);
    else if (len) excerpt(body, len, out, max);
    else snprintf(out, max, "(an empty body)");
    json_decref(j);
}

/* One HTTP request to w->url + path: GET when body is NULL, else POST of
 * body as JSON. timeout <= 0 means w->timeout_s. Returns 0 with *out (the
 * answer parsed as JSON, caller decrefs) for a 2xx answer; -1 with e for
 * anything else, naming the request and what happened: the transport
 * error (connection refused, timeout, reset), the started server's death,
 * "HTTP 500: <the server's message>", or an answer that is not JSON. With
 * status non-NULL, *status gets the HTTP status (0 without an answer). */
static int http_json(worker *w, const char *path, json_t *body, double timeout, json_t **out,
                     long *status, tg_err *e)
{
    *out = NULL;
    if (status) *status = 0;
    const char *method = body ? "POST" : "GET";
    char why[160];
    if (!server_alive(w, why, sizeof why))
        return tg_errf(e, "%s %s: the server tg-http started %s (its log is on this leg's stderr)", method,
                       path, why);
    char *url = xrealloc(NULL, strlen(w->url) + strlen(path) + 1);
    strcpy(url, w->url);
    strcat(url, path);
    char *payload = body ? json_dumps(body, JSON_COMPACT) : NULL;
    if (body && !payload) abort();
    CURL *c = w->curl;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, w->headers);
    if (payload) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(payload));
    } else {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    }
    double t = timeout > 0 ? timeout : w->timeout_s;
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(t * 1000.0));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(w->connect_timeout_s * 1000.0));
    w->ans_len = 0;
    w->ans_too_long = 0;
    if (w->ans) w->ans[0] = 0;
    w->errbuf[0] = 0;
    CURLcode rc = curl_easy_perform(c);
    free(payload);
    int ret = -1;
    if (rc != CURLE_OK) {
        const char *what = w->errbuf[0] ? w->errbuf : curl_easy_strerror(rc);
        /* a started server that died explains a reset or a refused connection */
        for (int i = 0; i < 50 && w->pid > 0 && server_alive(w, why, sizeof why); i++) {
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
        }
        if (w->ans_too_long)
            tg_errf(e, "%s %s: the answer is longer than %zu bytes", method, url, MAX_ANSWER);
        else if (why[0])
            tg_errf(e, "%s %s: %s; the server tg-http started %s (its log is on this leg's stderr)", method,
                    url, what, why);
        else if (rc == CURLE_OPERATION_TIMEDOUT)
            tg_errf(e, "%s %s: no complete answer within %g s (%s)", method, url, t, what);
        else
            tg_errf(e, "%s %s: %s", method, url, what);
        goto done;
    }
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    if (status) *status = code;
    if (code < 200 || code > 299) {
        char msg[600];
        server_message(w->ans ? w->ans : "", w->ans_len, msg, sizeof msg);
        tg_errf(e, "%s %s: HTTP %ld: %s", method, url, code, msg);
        goto done;
    }
    json_error_t je;
    json_t *j = json_loadb(w->ans ? w->ans : "", w->ans_len, 0, &je);
    if (!j) {
        char ex[200];
        excerpt(w->ans ? w->ans : "", w->ans_len, ex, sizeof ex);
        tg_errf(e, "%s %s: the answer is not JSON (%s at byte %d): '%s'", method, url, je.text,
                je.position, ex);
        goto done;
    }
    *out = j;
    ret = 0;
done:
    free(url);
    return ret;
}

/* Starts the server from the --start template with model, waits for the
 * health path to answer 200. Returns 0, or -1 with e (it could not be
 * started, it exited before it was healthy, or the wait ran out: then it
 * is stopped). */
static int server_start(worker *w, const char *model, tg_err *e)
{
    char **argv = xrealloc(NULL, (size_t)(w->start_argc + 1) * sizeof *argv);
    for (int i = 0; i < w->start_argc; i++) argv[i] = subst(w->start_argv[i], model, w->port);
    argv[w->start_argc] = NULL;
    int rc = -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        tg_errf(e, "cannot start the server %s: fork: %s", argv[0], strerror(errno));
        goto out;
    }
    if (pid == 0) {
        /* the child: dies with tg-http, stdin empty, stdout to our stderr (our
         * stdout is the protocol) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        dup2(2, 1);
        signal(SIGPIPE, SIG_DFL);
        execvp(argv[0], argv);
        dprintf(2, "tg-http: cannot run the server %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    w->pid = pid;
    g_server_pid = pid;
    fprintf(stderr, "tg-http: started the server (pid %d):", (int)pid);
    for (int i = 0; i < w->start_argc; i++) fprintf(stderr, " %s", argv[i]);
    fprintf(stderr, "\n");
    double deadline = tg_now() + w->start_wait_s;
    char last[1024] = "no answer yet";
    for (;;) {
        char why[160];
        if (!server_alive(w, why, sizeof why)) {
            tg_errf(e, "the server %s %s before %s answered 200 (its log is on this leg's stderr)", argv[0], why,
                    w->health);
            goto out;
        }
        json_t *j = NULL;
        long st = 0;
        tg_err he;
        double left = deadline - tg_now();
        if (left <= 0) break;
        if (http_json(w, w->health, NULL, left < 2 ? left : 2, &j, &st, &he) == 0) {
            json_decref(j);
            rc = 0;
            goto out;
        }
        if (st == 200) {   /* 200 with a body that is not JSON: healthy all the same */
            rc = 0;
            goto out;
        }
        memcpy(last, he.msg, sizeof last);
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
    tg_errf(e, "the server %s did not answer 200 on %s within %g s (last: %s)", argv[0], w->health,
            w->start_wait_s, last);
    server_stop(w);
out:
    for (int i = 0; i < w->start_argc; i++) free(argv[i]);
    free(argv);
    return rc;
}

/* ---- answers ---- */

/* One generated token of an answer: what the server appended and its top
 * list (ordered as the protocol orders it, at most k entries). */
typedef struct gen_tok {
    int32_t sampled;
    int n;
    tg_top *top;                 /* (n) */
} gen_tok;

static void gen_free(gen_tok *g, int m)
{
    for (int i = 0; g && i < m; i++) free(g[i].top);
    free(g);
}

static int top_cmp(const void *a, const void *b)
{
    const tg_top *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* A token id from a JSON integer, or from a "token_id:N" string (vLLM's
 * return_tokens_as_token_ids). -1 when neither. */
static long long json_token_id(json_t *v)
{
    if (json_is_integer(v)) return json_integer_value(v);
    const char *s = json_string_value(v);
    if (s && !strncmp(s, "token_id:", 9) && isdigit((unsigned char)s[9])) {
        char *end;
        long long id = strtoll(s + 9, &end, 10);
        if (!*end) return id;
    }
    return -1;
}

/* A log-probability: a number, or null / a string the server writes for
 * minus infinity. NAN when it is neither. */
static double json_logprob(json_t *v)
{
    if (json_is_number(v)) return json_number_value(v);
    if (json_is_null(v)) return -INFINITY;
    const char *s = json_string_value(v);
    if (s && (!strcmp(s, "-inf") || !strcmp(s, "-Infinity"))) return -INFINITY;
    return NAN;
}

/* Orders g->top as the protocol does, checks ids, keeps the first k.
 * Returns 0, or -1 with e. */
static int top_finish(gen_tok *g, int k, int j, tg_err *e)
{
    if (g->n < 1) return tg_errf(e, "token %d: an empty top list", j);
    qsort(g->top, (size_t)g->n, sizeof *g->top, top_cmp);
    for (int i = 0; i < g->n; i++)
        for (int q = i + 1; q < g->n; q++)
            if (g->top[i].id == g->top[q].id)
                return tg_errf(e, "token %d: id %d appears twice in its top list", j, (int)g->top[i].id);
    if (g->n > k) g->n = k;
    return 0;
}

/* Entries of llama-server's format, {id, logprob, top_logprobs: [{id,
 * logprob}]} (completion_probabilities, and logprobs.content of its
 * OpenAI answers), into *out (m of them). Returns 0, or -1 with e. */
static int parse_entries(json_t *list, int k, gen_tok **out, int *m, tg_err *e)
{
    size_t n = json_array_size(list);
    gen_tok *g = xrealloc(NULL, (n ? n : 1) * sizeof *g);
    memset(g, 0, (n ? n : 1) * sizeof *g);
    for (size_t j = 0; j < n; j++) {
        json_t *en = json_array_get(list, j);
        json_t *tl = json_object_get(en, "top_logprobs");
        long long id = json_token_id(json_object_get(en, "id"));
        if (!json_is_object(en) || id < 0 || id > INT32_MAX) {
            gen_free(g, (int)j);
            return tg_errf(e, "token %zu: expected {\"id\": a token id, \"logprob\", \"top_logprobs\"}", j);
        }
        if (!json_is_array(tl)) {
            gen_free(g, (int)j);
            if (json_object_get(en, "top_probs") || json_object_get(en, "probs"))
                return tg_errf(e, "token %zu: probabilities after sampling (top_probs), expected top_logprobs "
                                  "(the raw distribution): is post_sampling_probs set in --body?", j);
            return tg_errf(e, "token %zu: expected \"top_logprobs\": a list", j);
        }
        g[j].sampled = (int32_t)id;
        size_t nt = json_array_size(tl);
        g[j].top = xrealloc(NULL, (nt ? nt : 1) * sizeof *g[j].top);
        for (size_t i = 0; i < nt; i++) {
            json_t *t = json_array_get(tl, i);
            long long tid = json_token_id(json_object_get(t, "id"));
            double lp = json_logprob(json_object_get(t, "logprob"));
            if (tid < 0 || tid > INT32_MAX || isnan(lp)) {
                gen_free(g, (int)j + 1);
                return tg_errf(e, "token %zu: top_logprobs[%zu]: expected {\"id\": a token id, \"logprob\": a number}",
                               j, i);
            }
            g[j].top[g[j].n++] = (tg_top){(int32_t)tid, (float)lp};
        }
        if (top_finish(&g[j], k, (int)j, e) < 0) {
            gen_free(g, (int)j + 1);
            return -1;
        }
    }
    *out = g;
    *m = (int)n;
    return 0;
}

/* The legacy OpenAI completions format: logprobs {tokens: [str],
 * top_logprobs: [{str: logprob}]}, usable when the strings name ids. */
static int parse_legacy(json_t *lp, int k, gen_tok **out, int *m, tg_err *e)
{
    json_t *toks = json_object_get(lp, "tokens"), *tops = json_object_get(lp, "top_logprobs");
    if (!json_is_array(toks) || !json_is_array(tops) || json_array_size(toks) != json_array_size(tops))
        return tg_errf(e, "logprobs: expected \"content\" (llama.cpp) or \"tokens\" and \"top_logprobs\" "
                          "lists of one length (OpenAI)");
    size_t n = json_array_size(toks);
    gen_tok *g = xrealloc(NULL, (n ? n : 1) * sizeof *g);
    memset(g, 0, (n ? n : 1) * sizeof *g);
    for (size_t j = 0; j < n; j++) {
        long long id = json_token_id(json_array_get(toks, j));
        json_t *o = json_array_get(tops, j);
        if (id < 0 || id > INT32_MAX) {
            gen_free(g, (int)j);
            return tg_errf(e, "logprobs.tokens[%zu]: names a token by its text, not its id; ask the server for "
                              "ids (vLLM: --body '{\"return_tokens_as_token_ids\": true}'): text does not "
                              "identify a token", j);
        }
        if (!json_is_object(o)) {
            gen_free(g, (int)j);
            return tg_errf(e, "logprobs.top_logprobs[%zu]: expected an object {token: logprob}", j);
        }
        g[j].sampled = (int32_t)id;
        g[j].top = xrealloc(NULL, (json_object_size(o) ? json_object_size(o) : 1) * sizeof *g[j].top);
        const char *key;
        json_t *v;
        json_object_foreach(o, key, v) {
            json_t *ks = json_string(key);
            long long tid = json_token_id(ks);
            json_decref(ks);
            double l = json_logprob(v);
            if (tid < 0 || tid > INT32_MAX || isnan(l)) {
                char shown[48];
                excerpt(key, strlen(key), shown, sizeof shown);
                gen_free(g, (int)j + 1);
                return tg_errf(e, "logprobs.top_logprobs[%zu]: key '%s': expected \"token_id:N\" with a "
                                  "logprob (names by text do not identify a token)", j, shown);
            }
            g[j].top[g[j].n++] = (tg_top){(int32_t)tid, (float)l};
        }
        if (top_finish(&g[j], k, (int)j, e) < 0) {
            gen_free(g, (int)j + 1);
            return -1;
        }
    }
    *out = g;
    *m = (int)n;
    return 0;
}

/* A completion answer into m generated tokens, the prompt length the
 * server saw (-1 when it does not say) and its cached prompt tokens (-1
 * unknown). Returns 0, or -1 with e. */
static int parse_answer(worker *w, json_t *ans, int k, gen_tok **g, int *m, long long *n_prompt,
                        long long *cached, tg_err *e)
{
    *n_prompt = *cached = -1;
    if (!json_is_object(ans)) return tg_errf(e, "expected a JSON object");
    if (w->api == API_LLAMA) {
        json_t *te = json_object_get(ans, "tokens_evaluated");
        json_t *tc = json_object_get(json_object_get(ans, "timings"), "cache_n");
        if (json_is_integer(te)) *n_prompt = json_integer_value(te);
        if (json_is_integer(tc)) *cached = json_integer_value(tc);
        if (json_is_true(json_object_get(ans, "truncated")))
            return tg_errf(e, "the server truncated the prompt (\"truncated\": true): its context is too short");
        json_t *cp = json_object_get(ans, "completion_probabilities");
        if (!json_is_array(cp))
            return tg_errf(e, "expected \"completion_probabilities\": a list (does this server answer n_probs?)");
        return parse_entries(cp, k, g, m, e);
    }
    json_t *ch = json_object_get(ans, "choices"), *u = json_object_get(ans, "usage");
    json_t *pt = json_object_get(u, "prompt_tokens");
    if (json_is_integer(pt)) *n_prompt = json_integer_value(pt);
    json_t *cd = json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
    if (json_is_integer(cd)) *cached = json_integer_value(cd);
    if (!json_is_array(ch) || json_array_size(ch) != 1)
        return tg_errf(e, "expected \"choices\": a list of one completion");
    json_t *lp = json_object_get(json_array_get(ch, 0), "logprobs");
    if (json_is_null(lp) || !lp)
        return tg_errf(e, "choices[0].logprobs is null: the server gave no log-probabilities (does it take "
                          "\"logprobs\": %d?)", k);
    json_t *content = json_object_get(lp, "content");
    if (json_is_array(content)) return parse_entries(content, k, g, m, e);
    return parse_legacy(lp, k, g, m, e);
}

/* ---- protocol callbacks ---- */

static int cb_hello(void *ud, json_t *arm, tg_err *e)
{
    worker *w = ud;
    char sha[65] = "";
    tg_err ignore;
    if (tg_sha256_file("/proc/self/exe", sha, &ignore) != 0) sha[0] = 0;
    char dev[600];
    snprintf(dev, sizeof dev, "%s server at %s%s", w->api == API_LLAMA ? "llama.cpp" : "OpenAI-compatible",
             w->url, w->start_argc ? " (started by tg-http)" : "");
    json_object_set_new(arm, "kind", json_string("http"));
    json_object_set_new(arm, "version", json_string(TG_HTTP_VERSION));
    json_object_set_new(arm, "device", json_string(dev));
    json_object_set_new(arm, "binary_sha256", json_string(sha));
    json_object_set_new(arm, "api", json_string(w->api == API_LLAMA ? "llama" : "openai"));
    json_object_set_new(arm, "url", json_string(w->url));
    json_object_set_new(arm, "logits", json_string("logprob"));
    json_object_set_new(arm, "logits_note",
                        json_string("log-probabilities: the logits minus a per-step constant, so ranks and "
                                    "gaps are those of the logits up to the server's float rounding"));
    if (w->top_k_max > 0) json_object_set_new(arm, "top_k_max", json_integer(w->top_k_max));
    json_object_set_new(arm, "prompt", json_string(w->prompt_text ? "text" : "ids"));
    if (w->prompt_text)
        json_object_set_new(arm, "prompt_note",
                            json_string("prompts are sent as text and tokenized by the server: its positions "
                                        "need not match the ids the harness sends"));
    json_object_set_new(arm, "digest", json_false());
    return 0;
}

static int cb_load_do(void *ud, const char *model, const json_t *options, json_t *out, tg_err *e)
{
    worker *w = ud;
    static const char *const known[] = {NULL};
    if (proto_opt_known(options, known, e) < 0)
        return tg_err_prefix(e, "tg-http takes its settings from its command line (the spec's http: mapping)");
    w->loaded = 0;
    w->n_vocab = 0;
    if (w->start_argc) {
        server_stop(w);
        free(w->server_model);
        w->server_model = NULL;
        if (server_start(w, model, e) < 0) return -1;
        w->server_model = xstrdup(model);
    }
    json_object_set_new(out, "url", json_string(w->url));
    if (w->start_argc) json_object_set_new(out, "started_pid", json_integer(w->pid));
    json_t *j = NULL;
    if (w->api == API_LLAMA) {
        /* llama.cpp: /props names the model and the build; /v1/models its vocabulary */
        if (http_json(w, "/props", NULL, 0, &j, NULL, e) < 0) return -1;
        json_t *v;
        if ((v = json_object_get(j, "model_path")) && json_is_string(v)) json_object_set(out, "server_model", v);
        if ((v = json_object_get(j, "build_info")) && json_is_string(v)) json_object_set(out, "build_info", v);
        if ((v = json_object_get(j, "total_slots")) && json_is_integer(v)) json_object_set(out, "slots", v);
        json_t *gs = json_object_get(j, "default_generation_settings");
        if ((v = json_object_get(gs, "n_ctx")) && json_is_integer(v)) json_object_set(out, "n_ctx", v);
        json_decref(j);
        j = NULL;
    }
    if (http_json(w, "/v1/models", NULL, 0, &j, NULL, e) < 0) {
        if (w->api == API_LLAMA) return -1;
        /* not every OpenAI-compatible server lists its models: a note, not a failure */
        fprintf(stderr, "tg-http: load: %s (going on without the model list)\n", e->msg);
    } else {
        json_t *d0 = json_array_get(json_object_get(j, "data"), 0);
        json_t *id = json_object_get(d0, "id"), *meta = json_object_get(d0, "meta");
        if (json_is_string(id)) json_object_set(out, "server_model_id", id);
        json_t *nv = json_object_get(meta, "n_vocab");
        if (json_is_integer(nv) && json_integer_value(nv) > 0 && json_integer_value(nv) <= INT32_MAX) {
            w->n_vocab = (int)json_integer_value(nv);
            json_object_set_new(out, "n_vocab", json_integer(w->n_vocab));
        }
        json_t *mm = json_object_get(meta, "n_ctx_train");
        if (json_is_integer(mm)) json_object_set(out, "n_ctx_train", mm);
    }
    json_decref(j);
    if (w->start_argc) json_object_set_new(out, "model", json_string(model));
    else json_object_set_new(out, "model_note",
                             json_string("a server tg-http did not start serves its own model: the spec's "
                                         "model file is not checked against it"));
    json_object_set_new(out, "prompt", json_string(w->prompt_text ? "text" : "ids"));
    w->loaded = 1;
    return 0;
}

static int need_load(worker *w, tg_err *e)
{
    return w->loaded ? 0 : tg_errf(e, "no server session (send load first)");
}

/* ids as a JSON array. */
static json_t *ids_json(const int32_t *ids, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static int cb_tokenize_do(void *ud, const char *text, size_t len, bool special, int32_t **ids, int *n,
                       tg_err *e)
{
    worker *w = ud;
    if (need_load(w, e)) return -1;
    json_t *req = json_object();
    json_object_set_new(req, "content", json_stringn(text, len));
    json_object_set_new(req, "add_special", json_true());
    json_object_set_new(req, "parse_special", json_boolean(special));
    if (w->api == API_OPENAI) {
        /* vLLM's shape beside llama.cpp's: each server ignores the other's fields */
        json_object_set_new(req, "prompt", json_stringn(text, len));
        json_object_set_new(req, "add_special_tokens", json_true());
        if (w->model_name) json_object_set_new(req, "model", json_string(w->model_name));
    }
    json_t *ans;
    int rc = http_json(w, "/tokenize", req, 0, &ans, NULL, e);
    json_decref(req);
    if (rc < 0) return -1;
    json_t *t = json_object_get(ans, "tokens");
    if (!json_is_array(t)) {
        json_decref(ans);
        return tg_errf(e, "POST %s/tokenize: expected {\"tokens\": [ids]}", w->url);
    }
    size_t k = json_array_size(t);
    int32_t *v = xrealloc(NULL, (k ? k : 1) * sizeof *v);
    for (size_t i = 0; i < k; i++) {
        json_t *x = json_array_get(t, i);
        if (json_is_object(x)) x = json_object_get(x, "id");
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(v);
            json_decref(ans);
            return tg_errf(e, "POST %s/tokenize: tokens[%zu]: expected a token id", w->url, i);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    json_decref(ans);
    *ids = v;
    *n = (int)k;
    return 0;
}

/* The server's text for ids (llama.cpp: "content", vLLM: "prompt"),
 * malloc'ed into *text / *len. */
static int server_detokenize(worker *w, const int32_t *ids, int n, char **text, size_t *len, tg_err *e)
{
    json_t *req = json_pack("{s:o}", "tokens", ids_json(ids, n));
    if (w->api == API_OPENAI && w->model_name) json_object_set_new(req, "model", json_string(w->model_name));
    json_t *ans;
    int rc = http_json(w, "/detokenize", req, 0, &ans, NULL, e);
    json_decref(req);
    if (rc < 0) return -1;
    json_t *c = json_object_get(ans, "content");
    if (!json_is_string(c)) c = json_object_get(ans, "prompt");
    if (!json_is_string(c)) {
        json_decref(ans);
        return tg_errf(e, "POST %s/detokenize: expected {\"content\": text} or {\"prompt\": text}", w->url);
    }
    *text = proto_string_dup(c, len);
    json_decref(ans);
    if (!*text) abort();   /* out of memory is not an input error */
    return 0;
}

static int cb_detokenize_do(void *ud, const int32_t *ids, int n, bool special, char **text, size_t *len,
                         tg_err *e)
{
    worker *w = ud;
    (void)special;   /* the servers render special tokens their own way */
    if (need_load(w, e)) return -1;
    return server_detokenize(w, ids, n, text, len, e);
}

/* The completion request for a prompt of seq[0..n) asking for want tokens
 * with k log-probabilities each; cache: whether the server may reuse its
 * prompt cache. Returns the request, or NULL with e (the text prompt could
 * not be made). */
static json_t *completion_request(worker *w, const int32_t *seq, int n, int want, int k, int cache, tg_err *e)
{
    json_t *req = json_object();
    if (w->prompt_text) {
        char *text;
        size_t len;
        if (server_detokenize(w, seq, n, &text, &len, e) < 0) {
            json_decref(req);
            return NULL;
        }
        json_object_set_new(req, "prompt", json_stringn(text, len));
        free(text);
    } else {
        json_object_set_new(req, "prompt", ids_json(seq, n));
    }
    json_object_set_new(req, "temperature", json_real(0.0));
    if (w->api == API_LLAMA) {
        json_object_set_new(req, "n_predict", json_integer(want));
        json_object_set_new(req, "n_probs", json_integer(k));
        /* greedy over the raw logits: temperature 0 keeps the first maximum */
        json_object_set_new(req, "samplers", json_pack("[s]", "temperature"));
        json_object_set_new(req, "cache_prompt", json_boolean(cache));
        json_object_set_new(req, "return_tokens", json_true());
    } else {
        json_object_set_new(req, "max_tokens", json_integer(want));
        json_object_set_new(req, "logprobs", json_integer(k));
        if (w->model_name) json_object_set_new(req, "model", json_string(w->model_name));
    }
    if (w->body_extra) json_object_update(req, w->body_extra);
    return req;
}

static int cb_decode_do(void *ud, const proto_decode_req *r, proto_conn *c, proto_done *done, tg_err *e)
{
    worker *w = ud;
    if (need_load(w, e)) return -1;
    if (r->n_dump_steps > 0)
        fprintf(stderr, "tg-http: decode: no dumps: a server does not expose its hidden states\n");
    if (w->n_vocab > 0 && (proto_check_ids(r->prompt, r->n_prompt, w->n_vocab, "prompt", e) ||
                           (r->force && proto_check_ids(r->force, r->n_force, w->n_vocab, "force", e))))
        return -1;
    int k = r->top_k;
    if (w->top_k_max > 0 && k > w->top_k_max) k = w->top_k_max;
    const char *path = w->api == API_LLAMA ? "/completion" : "/v1/completions";
    int32_t *seq = xrealloc(NULL, (size_t)(r->n_prompt + r->steps) * sizeof *seq);
    memcpy(seq, r->prompt, (size_t)r->n_prompt * sizeof *seq);
    int n_seq = r->n_prompt, step = 0, requests = 0, not_top = 0, rc = -1;
    long long cached_sum = 0;
    double t0 = tg_now(), t_first = -1;
    while (step < r->steps) {
        int want = r->steps - step;
        if (w->tokens_per_request > 0 && want > w->tokens_per_request) want = w->tokens_per_request;
        /* the first request of a decode starts from an empty cache (llama flavour) */
        json_t *req = completion_request(w, seq, n_seq, want, k, requests > 0, e);
        if (!req) {
            tg_err_prefix(e, "step %d", step);
            goto out;
        }
        json_t *ans;
        int hr = http_json(w, path, req, 0, &ans, NULL, e);
        json_decref(req);
        if (hr < 0) {
            tg_err_prefix(e, "step %d", step);
            goto out;
        }
        requests++;
        if (t_first < 0) t_first = tg_now() - t0;
        gen_tok *g = NULL;
        int m = 0;
        long long seen = -1, cached = -1;
        if (parse_answer(w, ans, k, &g, &m, &seen, &cached, e) < 0) {
            json_decref(ans);
            tg_err_prefix(e, "step %d: POST %s%s", step, w->url, path);
            goto out;
        }
        json_decref(ans);
        if (cached > 0) cached_sum += cached;
        const char *bad = NULL;
        char why[300];
        if (!w->prompt_text && seen >= 0 && seen != n_seq) {
            snprintf(why, sizeof why, "the answer is for a prompt of %lld tokens, expected %d (an answer for "
                                      "another position)", seen, n_seq);
            bad = why;
        } else if (m < 1) {
            bad = "the server generated no token";
        } else if (m > want) {
            snprintf(why, sizeof why, "%d tokens in the answer, %d asked for", m, want);
            bad = why;
        }
        if (bad) {
            gen_free(g, m);
            tg_errf(e, "step %d: POST %s%s: %s", step, w->url, path, bad);
            goto out;
        }
        for (int j = 0; j < m && step < r->steps; j++) {
            if (g[j].sampled != g[j].top[0].id) not_top++;
            int32_t next = proto_step_top(c, r, step, g[j].top, g[j].n, NULL);
            step++;
            if (step < r->steps) seq[n_seq++] = next;
            /* the rest of this answer continues the server's own prefix */
            if (next != g[j].sampled) break;
        }
        gen_free(g, m);
    }
    rc = 0;
    done->ms_prefill = (t_first < 0 ? 0 : t_first) * 1e3;
    done->ms_decode = (tg_now() - t0 - (t_first < 0 ? 0 : t_first)) * 1e3;
    done->counters = json_pack("{s:i,s:i,s:i,s:I,s:i}", "prompt_tokens", r->n_prompt, "steps", r->steps,
                               "requests", requests, "tokens_cached", (json_int_t)cached_sum,
                               "sampled_not_top", not_top);
out:
    free(seq);
    return rc;
}

/* ---- the callbacks proto_serve calls ---- */

/* Error answers must be valid UTF-8 to be written at all: bytes of a
 * server's answer quoted in a message (a JSON parser's "near '...'", a cut
 * message) become '?' when they are not ASCII. Returns -1. */
static int fail_ascii(tg_err *e)
{
    for (char *p = e->msg; *p; p++)
        if ((unsigned char)*p >= 0x80) *p = '?';
    return -1;
}

static int cb_load(void *ud, const char *model, const json_t *options, json_t *out, tg_err *e)
{
    return cb_load_do(ud, model, options, out, e) < 0 ? fail_ascii(e) : 0;
}

static int cb_tokenize(void *ud, const char *text, size_t len, bool special, int32_t **ids, int *n,
                       tg_err *e)
{
    return cb_tokenize_do(ud, text, len, special, ids, n, e) < 0 ? fail_ascii(e) : 0;
}

static int cb_detokenize(void *ud, const int32_t *ids, int n, bool special, char **text, size_t *len,
                         tg_err *e)
{
    return cb_detokenize_do(ud, ids, n, special, text, len, e) < 0 ? fail_ascii(e) : 0;
}

static int cb_decode(void *ud, const proto_decode_req *r, proto_conn *c, proto_done *done, tg_err *e)
{
    return cb_decode_do(ud, r, c, done, e) < 0 ? fail_ascii(e) : 0;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tg-http --url URL [--api llama|openai] [--top-k-max N] [--timeout S]\n"
            "               [--connect-timeout S] [--api-key-env NAME] [--header 'Name: value']\n"
            "               [--header-env Name=ENVVAR] [--model NAME] [--body JSON]\n"
            "               [--tokens-per-request N] [--prompt ids|text]\n"
            "               [--health PATH] [--start-wait S] [--start PROGRAM ARGS...]\n"
            "  Serves arm protocol v1 on stdin/stdout over an inference server's HTTP API\n"
            "  (llama.cpp's llama-server, or an OpenAI-compatible /v1/completions).\n"
            "  --start (last; the rest is the server's argv, never a shell) starts the server\n"
            "  at load: {model} is the load's model path, {port} a free port on 127.0.0.1\n"
            "  (also in --url). Values of --api-key-env and --header-env come from the\n"
            "  environment and are never printed.\n");
}

/* A positive number option. */
static int arg_number(const char *opt, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno || !(x >= lo && x <= hi)) {
        fprintf(stderr, "tg-http: %s: expected a number %g..%g, got '%s'\n", opt, lo, hi, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

/* Adds a header line; secret: its value came from the environment. */
static void header_add(worker *w, const char *line, int secret)
{
    struct curl_slist *h = curl_slist_append(w->headers, line);
    if (!h) abort();
    w->headers = h;
    w->n_secret_headers += secret;
}

int main(int argc, char **argv)
{
    worker w = {.pid = -1, .timeout_s = 60, .connect_timeout_s = 10, .health = "/health",
                .start_wait_s = 120, .top_k_max = -1};
    const char *url = NULL;
    header_add(&w, "Content-Type: application/json", 0);
    header_add(&w, "Accept: application/json", 0);
    header_add(&w, "Expect:", 0);   /* no 100-continue round trip for long prompts */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(a, "--start")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tg-http: --start: expected the server's program and arguments after it\n");
                return 2;
            }
            w.start_argv = argv + i + 1;
            w.start_argc = argc - i - 1;
            break;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "tg-http: %s: unknown argument or missing value\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--url")) url = v;
        else if (!strcmp(a, "--api")) {
            if (!strcmp(v, "llama")) w.api = API_LLAMA;
            else if (!strcmp(v, "openai")) w.api = API_OPENAI;
            else {
                fprintf(stderr, "tg-http: --api: expected llama or openai, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--top-k-max")) {
            if (arg_number(a, v, 1, PROTO_MAX_TOP_K, &x) < 0 || x != floor(x)) return 2;
            w.top_k_max = (int)x;
        } else if (!strcmp(a, "--timeout")) {
            if (arg_number(a, v, 0.001, 1e6, &w.timeout_s) < 0) return 2;
        } else if (!strcmp(a, "--connect-timeout")) {
            if (arg_number(a, v, 0.001, 1e6, &w.connect_timeout_s) < 0) return 2;
        } else if (!strcmp(a, "--start-wait")) {
            if (arg_number(a, v, 0.001, 1e6, &w.start_wait_s) < 0) return 2;
        } else if (!strcmp(a, "--tokens-per-request")) {
            if (arg_number(a, v, 1, PROTO_MAX_STEPS, &x) < 0 || x != floor(x)) return 2;
            w.tokens_per_request = (int)x;
        } else if (!strcmp(a, "--prompt")) {
            if (strcmp(v, "ids") && strcmp(v, "text")) {
                fprintf(stderr, "tg-http: --prompt: expected ids or text, got '%s'\n", v);
                return 2;
            }
            w.prompt_text = !strcmp(v, "text");
        } else if (!strcmp(a, "--health")) {
            if (v[0] != '/') {
                fprintf(stderr, "tg-http: --health: expected a path starting with '/', got '%s'\n", v);
                return 2;
            }
            w.health = v;
        } else if (!strcmp(a, "--model")) w.model_name = v;
        else if (!strcmp(a, "--body")) {
            json_error_t je;
            json_decref(w.body_extra);
            w.body_extra = json_loads(v, JSON_REJECT_DUPLICATES, &je);
            if (!json_is_object(w.body_extra)) {
                fprintf(stderr, "tg-http: --body: expected a JSON object%s%s\n", w.body_extra ? "" : ": ",
                        w.body_extra ? "" : je.text);
                return 2;
            }
        } else if (!strcmp(a, "--header")) {
            const char *colon = strchr(v, ':');
            if (!colon || colon == v || strchr(v, '\n') || strchr(v, '\r')) {
                fprintf(stderr, "tg-http: --header: expected 'Name: value' on one line\n");
                return 2;
            }
            header_add(&w, v, 0);
        } else if (!strcmp(a, "--header-env") || !strcmp(a, "--api-key-env")) {
            const char *name = v, *var = v;
            char hname[128];
            if (!strcmp(a, "--header-env")) {
                const char *eq = strchr(v, '=');
                if (!eq || eq == v || !eq[1] || (size_t)(eq - v) >= sizeof hname) {
                    fprintf(stderr, "tg-http: --header-env: expected Name=ENVVAR, got '%s'\n", v);
                    return 2;
                }
                snprintf(hname, sizeof hname, "%.*s", (int)(eq - v), v);
                name = hname;
                var = eq + 1;
            } else {
                name = "Authorization";
            }
            const char *val = getenv(var);
            if (!val || !*val) {
                /* named in the spec, missing here: every request would be refused */
                fprintf(stderr, "tg-http: %s: the environment variable %s is not set or empty\n", a, var);
                return 2;
            }
            if (strchr(val, '\n') || strchr(val, '\r')) {
                fprintf(stderr, "tg-http: %s: the value of %s holds a line break\n", a, var);
                return 2;
            }
            size_t n = strlen(name) + strlen(val) + 16;
            char *line = xrealloc(NULL, n);
            if (!strcmp(a, "--api-key-env")) snprintf(line, n, "Authorization: Bearer %s", val);
            else snprintf(line, n, "%s: %s", name, val);
            header_add(&w, line, 1);
            memset(line, 0, n);
            free(line);
        } else {
            fprintf(stderr, "tg-http: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!url || !*url) {
        fprintf(stderr, "tg-http: --url: missing (expected the server's base URL, e.g. http://127.0.0.1:8080)\n");
        usage(stderr);
        return 2;
    }
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) {
        fprintf(stderr, "tg-http: --url: expected http:// or https://, got '%s'\n", url);
        return 2;
    }
    if (w.top_k_max < 0) w.top_k_max = w.api == API_OPENAI ? OPENAI_TOP_K_MAX : 0;
    int want_port = strstr(url, "{port}") != NULL;
    for (int i = 0; i < w.start_argc; i++) want_port |= strstr(w.start_argv[i], "{port}") != NULL;
    tg_err e;
    if (want_port && port_pick(&w, &e) < 0) {
        fprintf(stderr, "tg-http: %s\n", e.msg);
        return 1;
    }
    w.url = subst(url, NULL, w.port);
    size_t ul = strlen(w.url);
    while (ul > 0 && w.url[ul - 1] == '/') w.url[--ul] = 0;

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "tg-http: curl_global_init failed\n");
        return 1;
    }
    w.curl = curl_easy_init();
    if (!w.curl) {
        fprintf(stderr, "tg-http: curl_easy_init failed\n");
        return 1;
    }
    curl_easy_setopt(w.curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(w.curl, CURLOPT_ERRORBUFFER, w.errbuf);
    curl_easy_setopt(w.curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(w.curl, CURLOPT_WRITEDATA, &w);
    curl_easy_setopt(w.curl, CURLOPT_NOPROXY, "127.0.0.1,localhost,::1");
    curl_easy_setopt(w.curl, CURLOPT_FOLLOWLOCATION, 0L);

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    proto_ops ops = {.ud = &w,
                     .hello = cb_hello,
                     .load = cb_load,
                     .tokenize = cb_tokenize,
                     .detokenize = cb_detokenize,
                     .decode = cb_decode};
    int rc = proto_serve(stdin, stdout, &ops);
    server_stop(&w);
    curl_easy_cleanup(w.curl);
    curl_slist_free_all(w.headers);
    curl_global_cleanup();
    json_decref(w.body_extra);
    free(w.url);
    free(w.ans);
    free(w.server_model);
    return rc == 0 ? 0 : 1;
}
