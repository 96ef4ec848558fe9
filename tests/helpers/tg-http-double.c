/*
 * tg-http-double.c: a TEST DOUBLE inference server, for testing the error
 * handling of tg-http (the http arm) only. It is not an engine and serves
 * no model: its token ids and log-probabilities are made-up numbers. It
 * speaks just enough of llama.cpp's server API (and of the legacy OpenAI
 * completions format) over HTTP/1.1 to reach the point where it misbehaves
 * in the way its mode names, so tests/test_server.c can check that each
 * fault ends its leg with the server's own message while other arms are
 * untouched.
 *
 *   tg-http-double MODE --port N        (127.0.0.1:N; one connection at a time)
 *
 * Endpoints: GET /health, /props, /v1/models; POST /tokenize (one id per
 * byte of "content", 1..255), /detokenize (one byte per id), /completion
 * (llama.cpp's answer: completion_probabilities with ids, tokens_evaluated)
 * and /v1/completions (the legacy OpenAI answer: logprobs.tokens and
 * logprobs.top_logprobs maps, usage.prompt_tokens). Each answer is one
 * response with Content-Length; the connection is closed after it.
 *
 * Modes:
 *   ok           every request answered well
 *   die          SIGKILLs itself on the 3rd completion request, after
 *                reading it and before answering (a server that dies mid-leg)
 *   slow         completion answers come after 5 s (the client's timeout)
 *   http500      completion answers HTTP 500 with a JSON error message
 *   http404      /tokenize answers HTTP 404 with a plain-text body
 *   badjson      completion answers 200 with a JSON body cut inside a UTF-8
 *                sequence
 *   position     completion answers for a prompt one token longer than sent
 *   auth         like ok, but every request needs "Authorization: Bearer
 *                $TG_DOUBLE_KEY" (else HTTP 401 with a JSON error)
 *   legacy-text  /v1/completions names tokens by text only (no ids)
 *   short        completion answers at most 2 tokens however many are asked
 *                for (as a server that stopped at an end-of-generation token)
 * Legacy answers with "token_id:N" keys are given in every other mode.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

static const char *g_mode = "ok";
static int g_completions;   /* completion requests seen */

/* Writes all of buf; returns 0 or -1. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void respond(int fd, int status, const char *ctype, const char *body)
{
    const char *reason = status == 200 ? "OK" : status == 401 ? "Unauthorized" : status == 404 ? "Not Found"
                                                                              : "Internal Server Error";
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, reason, ctype, strlen(body));
    if (write_all(fd, head, (size_t)n) == 0) write_all(fd, body, strlen(body));
}

static void respond_json(int fd, int status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    respond(fd, status, "application/json", s ? s : "{}");
    free(s);
    json_decref(j);
}

/* One read of fd onto *buf (*len bytes so far, room for *cap; when full,
 * grown to grow bytes), NUL-terminated. Returns 0, or -1 at the end of the
 * input or an error (*buf freed). */
static int read_more(int fd, char **buf, size_t *len, size_t *cap, size_t grow)
{
    if (*len == *cap) {
        *cap = grow;
        *buf = realloc(*buf, *cap + 1);
    }
    ssize_t r = read(fd, *buf + *len, *cap - *len);
    if (r <= 0) {
        free(*buf);
        return -1;
    }
    *len += (size_t)r;
    (*buf)[*len] = 0;
    return 0;
}

/* Reads one request: the head, then Content-Length bytes. *body is
 * malloc'ed. Returns 0 or -1. */
static int read_request(int fd, char *method, char *path, char **auth, char **body)
{
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    char *end = NULL;
    while (!end) {
        if (read_more(fd, &buf, &len, &cap, 2 * cap) < 0) return -1;
        end = strstr(buf, "\r\n\r\n");
    }
    size_t head = (size_t)(end - buf) + 4;
    if (sscanf(buf, "%15s %255s", method, path) != 2) {
        free(buf);
        return -1;
    }
    size_t clen = 0;
    *auth = NULL;
    for (char *l = strstr(buf, "\r\n"); l && l < end; l = strstr(l + 2, "\r\n")) {
        char *h = l + 2;
        if (!strncasecmp(h, "Content-Length:", 15)) clen = strtoul(h + 15, NULL, 10);
        if (!strncasecmp(h, "Authorization:", 14)) {
            char *v = h + 14, *e = strstr(v, "\r\n");
            while (*v == ' ') v++;
            *auth = strndup(v, (size_t)(e - v));
        }
    }
    while (len < head + clen)
        if (read_more(fd, &buf, &len, &cap, head + clen) < 0) return -1;
    *body = strndup(buf + head, clen);
    free(buf);
    return 0;
}

/* The made-up top list of generated token j after a prompt of n ids: k
 * entries, distinct ids, log-probabilities descending. */
static int fake_id(int n, int j, int i) { return (int)((n * 31 + j * 17 + i * 7) % 997) + 1; }
static double fake_lp(int i) { return -0.5 - 0.25 * i; }

static json_t *completion_llama(int n, int want, int k)
{
    json_t *cp = json_array();
    for (int j = 0; j < want; j++) {
        json_t *top = json_array();
        for (int i = 0; i < k; i++)
            json_array_append_new(top, json_pack("{s:i,s:s,s:f}", "id", fake_id(n, j, i), "token", "x", "logprob",
                                                 fake_lp(i)));
        json_array_append_new(cp, json_pack("{s:i,s:f,s:o}", "id", fake_id(n, j, 0), "logprob", fake_lp(0),
                                            "top_logprobs", top));
    }
    int seen = !strcmp(g_mode, "position") ? n + 1 : n;
    return json_pack("{s:o,s:i,s:b,s:i}", "completion_probabilities", cp, "tokens_evaluated", seen, "truncated", 0,
                     "tokens_cached", 0);
}

static json_t *completion_legacy(int n, int want, int k)
{
    json_t *toks = json_array(), *tops = json_array();
    int text = !strcmp(g_mode, "legacy-text");
    for (int j = 0; j < want; j++) {
        char key[32];
        json_t *m = json_object();
        for (int i = 0; i < k; i++) {
            if (text) snprintf(key, sizeof key, "w%d", fake_id(n, j, i));
            else snprintf(key, sizeof key, "token_id:%d", fake_id(n, j, i));
            json_object_set_new(m, key, json_real(fake_lp(i)));
        }
        if (text) snprintf(key, sizeof key, "w%d", fake_id(n, j, 0));
        else snprintf(key, sizeof key, "token_id:%d", fake_id(n, j, 0));
        json_array_append_new(toks, json_string(key));
        json_array_append_new(tops, m);
    }
    json_t *lp = json_pack("{s:o,s:o}", "tokens", toks, "top_logprobs", tops);
    json_t *ch = json_pack("[{s:s,s:i,s:o,s:s}]", "text", "x", "index", 0, "logprobs", lp, "finish_reason", "length");
    return json_pack("{s:o,s:{s:i,s:i}}", "choices", ch, "usage", "prompt_tokens", n, "completion_tokens", want);
}

static void serve(int fd)
{
    char method[16], path[256], *auth = NULL, *body = NULL;
    if (read_request(fd, method, path, &auth, &body) < 0) return;
    json_t *req = body && *body ? json_loads(body, 0, NULL) : NULL;
    if (!strcmp(g_mode, "auth")) {
        const char *key = getenv("TG_DOUBLE_KEY");
        char want[256];
        snprintf(want, sizeof want, "Bearer %s", key ? key : "");
        if (!auth || !key || strcmp(auth, want)) {
            respond_json(fd, 401, json_pack("{s:{s:s}}", "error", "message", "test double: missing or wrong API key"));
            goto out;
        }
    }
    if (!strcmp(path, "/health")) {
        respond_json(fd, 200, json_pack("{s:s}", "status", "ok"));
    } else if (!strcmp(path, "/props")) {
        respond_json(fd, 200, json_pack("{s:s,s:s}", "model_path", "(no model: a test double)", "build_info",
                                        "tg-http-double"));
    } else if (!strcmp(path, "/v1/models")) {
        respond_json(fd, 200, json_pack("{s:[{s:s,s:{s:i}}]}", "data", "id", "test-double", "meta", "n_vocab", 1000));
    } else if (!strcmp(path, "/tokenize")) {
        if (!strcmp(g_mode, "http404")) {
            respond(fd, 404, "text/plain", "File Not Found: the test double has no tokenizer");
            goto out;
        }
        const char *t = json_string_value(json_object_get(req, "content"));
        json_t *ids = json_array();
        for (const unsigned char *p = (const unsigned char *)(t ? t : ""); *p; p++)
            json_array_append_new(ids, json_integer(*p));
        respond_json(fd, 200, json_pack("{s:o}", "tokens", ids));
    } else if (!strcmp(path, "/detokenize")) {
        json_t *ids = json_object_get(req, "tokens");
        size_t n = json_array_size(ids);
        char *s = calloc(n + 1, 1);
        for (size_t i = 0; i < n; i++) s[i] = (char)(json_integer_value(json_array_get(ids, i)) % 95 + 32);
        respond_json(fd, 200, json_pack("{s:s}", "content", s));
        free(s);
    } else if (!strcmp(path, "/completion") || !strcmp(path, "/v1/completions")) {
        g_completions++;
        int llama = !strcmp(path, "/completion");
        int n = (int)json_array_size(json_object_get(req, "prompt"));
        json_t *w = json_object_get(req, llama ? "n_predict" : "max_tokens");
        json_t *kk = json_object_get(req, llama ? "n_probs" : "logprobs");
        int want = json_is_integer(w) ? (int)json_integer_value(w) : 1, k = json_is_integer(kk) ? (int)json_integer_value(kk) : 1;
        if (want < 1 || want > 4096 || k < 1 || k > 64) {
            respond_json(fd, 400, json_pack("{s:{s:s}}", "error", "message", "test double: bad n_predict or n_probs"));
            goto out;
        }
        if (!strcmp(g_mode, "short") && want > 2) want = 2;
        if (!strcmp(g_mode, "die") && g_completions == 3) raise(SIGKILL);
        if (!strcmp(g_mode, "slow")) sleep(5);
        if (!strcmp(g_mode, "http500")) {
            respond_json(fd, 500, json_pack("{s:{s:i,s:s,s:s}}", "error", "code", 500, "message",
                                            "test double: the model fell over", "type", "server_error"));
        } else if (!strcmp(g_mode, "badjson")) {
            /* cut inside a UTF-8 sequence: the parser's message quotes a broken byte */
            respond(fd, 200, "application/json", "{\"completion_probabilities\": [{\"id\": 5, \"token\": \"caf\xc3");
        } else {
            respond_json(fd, 200, llama ? completion_llama(n, want, k) : completion_legacy(n, want, k));
        }
    } else {
        respond(fd, 404, "text/plain", "File Not Found");
    }
out:
    json_decref(req);
    free(body);
    free(auth);
}

int main(int argc, char **argv)
{
    if (argc != 4 || strcmp(argv[2], "--port")) {
        fprintf(stderr, "usage: tg-http-double MODE --port N   (a test double for error handling)\n");
        return 2;
    }
    g_mode = argv[1];
    signal(SIGPIPE, SIG_IGN);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 16) < 0) {
        fprintf(stderr, "tg-http-double: cannot listen on 127.0.0.1:%s: %s\n", argv[3], strerror(errno));
        return 1;
    }
    fprintf(stderr, "tg-http-double: a test double (mode %s) on 127.0.0.1:%s\n", g_mode, argv[3]);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        serve(c);
        close(c);
    }
}
