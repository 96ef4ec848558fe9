/*
 * fuzz_proto.c: the arm protocol's request side (engine/proto.c) over
 * arbitrary bytes. The input is split at newlines and every line goes to
 * proto_handle_line with a small worker (the callbacks below) whose
 * answers are written to /dev/null: parsing, validation of ids, steps,
 * top_k, force, dump and option fields, the step writer and the error
 * path are all exercised. The callbacks are not an engine: they exist so
 * the request parser reaches each op, and say so.
 *
 * The harness's side of the protocol gets the same lines: each is parsed
 * as a decode step line (arm_parse_step_line, what arm_decode applies to
 * every line a worker sends), which must keep its promises when it
 * accepts one.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arm.h"
#include "fuzz.h"
#include "proto.h"

#define FZ_VOCAB 64

static int fz_hello(void *ud, json_t *arm, tg_err *e)
{
    json_object_set_new(arm, "kind", json_string("fuzz"));
    return 0;
}

static int fz_load(void *ud, const char *model, const json_t *options, json_t *model_out, tg_err *e)
{
    static const char *const known[] = {"threads", "flag", "mode", NULL};
    static const char *const modes[] = {"a", "b", NULL};
    int threads = 1, mode = 0;
    bool flag = false;
    if (proto_opt_known(options, known, e) < 0) return -1;
    if (proto_opt_int(options, "threads", 1, 512, &threads, e) < 0) return -1;
    if (proto_opt_bool(options, "flag", &flag, e) < 0) return -1;
    if (proto_opt_enum(options, "mode", modes, &mode, e) < 0) return -1;
    json_object_set_new(model_out, "n_vocab", json_integer(FZ_VOCAB));
    return 0;
}

static int fz_tokenize(void *ud, const char *text, size_t len, bool special, int32_t **ids, int *n,
                       tg_err *e)
{
    size_t m = len < 256 ? len : 256;
    *ids = malloc((m ? m : 1) * sizeof **ids);
    if (!*ids) return tg_errf(e, "out of memory");
    for (size_t i = 0; i < m; i++) (*ids)[i] = (unsigned char)text[i] % FZ_VOCAB;
    *n = (int)m;
    return 0;
}

static int fz_detokenize(void *ud, const int32_t *ids, int n, bool special, char **text, size_t *len,
                         tg_err *e)
{
    if (proto_check_ids(ids, n, FZ_VOCAB, "ids", e) < 0) return -1;
    *text = malloc((size_t)n + 1);
    if (!*text) return tg_errf(e, "out of memory");
    for (int i = 0; i < n; i++) (*text)[i] = (char)('A' + ids[i] % 26);
    *len = (size_t)n;
    return 0;
}

static int fz_decode(void *ud, const proto_decode_req *req, proto_conn *c, proto_done *done, tg_err *e)
{
    /* the validated request must keep its promises */
    assert(req->n_prompt >= 1 && req->prompt);
    assert(req->steps >= 1 && req->steps <= PROTO_MAX_STEPS);
    assert(req->top_k >= 1 && req->top_k <= PROTO_MAX_TOP_K);
    assert(!req->force || req->n_force >= req->steps - 1);
    if (proto_check_ids(req->prompt, req->n_prompt, FZ_VOCAB, "prompt", e) < 0) return -1;
    if (req->force && proto_check_ids(req->force, req->n_force, FZ_VOCAB, "force", e) < 0) return -1;
    float logits[FZ_VOCAB];
    int32_t last = req->prompt[req->n_prompt - 1];
    int n = req->steps < 8 ? req->steps : 8;
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < FZ_VOCAB; i++) logits[i] = (float)((i * 7 + last * 3 + s) % 17) * 0.25f;
        last = proto_step(c, req, s, logits, FZ_VOCAB);
        assert(last >= 0 && last < FZ_VOCAB);
    }
    if (n < req->steps) return tg_errf(e, "the fuzz worker decodes at most 8 steps");
    done->counters = json_object();
    return 0;
}

int fuzz_proto_one(const uint8_t *data, size_t size)
{
    static FILE *null;
    if (!null) null = fopen("/dev/null", "w");
    assert(null);
    proto_ops ops = {.hello = fz_hello, .load = fz_load, .tokenize = fz_tokenize,
                     .detokenize = fz_detokenize, .decode = fz_decode};
    proto_conn *c = proto_conn_new(null);
    if (!c) return 0;
    size_t at = 0;
    while (at < size) {
        const uint8_t *nl = memchr(data + at, '\n', size - at);
        size_t len = nl ? (size_t)(nl - (data + at)) : size - at;
        /* an exact-size copy with no NUL after it: proto must honour len */
        char *line = malloc(len ? len : 1);
        if (!line) break;
        memcpy(line, data + at, len);
        arm_step st;
        tg_err e = {{0}};
        int top_k = len ? 1 + (unsigned char)line[0] % 32 : 1;
        if (arm_parse_step_line(line, len, 0, top_k, &st, &e) == 0) {
            assert(st.n_top >= 1 && st.n_top <= top_k && st.top);
            assert(st.token >= 0 && st.top[0].id == st.token);
            free(st.top);
        } else {
            assert(e.msg[0]);
        }
        int r = proto_handle_line(c, &ops, line, len);
        free(line);
        if (r != 0) break;
        at += len + 1;
    }
    proto_conn_free(c);
    return 0;
}

#ifdef TG_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_proto_one(data, size); }
#endif
