/*
 * test_proto.c: the worker side of arm protocol v1 (engine/proto.c).
 *
 * The worker here is a test double ("fake"): its callbacks return fixed,
 * hand-checked data so that the protocol module itself is tested (framing,
 * validation messages, step-line format, teacher forcing, dumps, limits),
 * independently of any engine. The real workers are tested in test_llama.c
 * (tg-llama) and by the engine's own tests (tg-engine).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto.h"
#include "util.h"

#define FAKE_VOCAB 16

/* ---- the fake worker (test double) ---- */

typedef struct fake {
    int decode_fail_after; /* >= 0: fail after this many steps */
    float logits[FAKE_VOCAB];
    int dump_logits;       /* write a dump at requested steps */
    char last_text[64];    /* what tokenize received */
    size_t last_len;
} fake;

static int fake_hello(void *ud, json_t *arm, tg_err *e)
{
    json_object_set_new(arm, "kind", json_string("fake"));
    return 0;
}

static int fake_load(void *ud, const char *model, const json_t *opts, json_t *out, tg_err *e)
{
    static const char *const known[] = {"threads", "mode", NULL};
    static const char *const modes[] = {"a", "b", NULL};
    int threads = 1, mode = 0;
    if (proto_opt_known(opts, known, e) || proto_opt_int(opts, "threads", 1, 64, &threads, e) ||
        proto_opt_enum(opts, "mode", modes, &mode, e))
        return -1;
    if (strcmp(model, "missing.gguf") == 0) return tg_errf(e, "model %s: no such file", model);
    json_object_set_new(out, "threads", json_integer(threads));
    json_object_set_new(out, "mode", json_integer(mode));
    return 0;
}

static int fake_tokenize(void *ud, const char *text, size_t len, bool special, int32_t **ids,
                         int *n, tg_err *e)
{
    fake *f = ud;
    memcpy(f->last_text, text, len < sizeof f->last_text ? len : sizeof f->last_text);
    f->last_len = len;
    *ids = malloc(sizeof **ids * (len ? len : 1));
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i] + (special ? 1000 : 0);
    *n = (int)len;
    return 0;
}

/* ids are bytes: detokenize returns them as the text. */
static int fake_detokenize(void *ud, const int32_t *ids, int n, bool special, char **text,
                           size_t *len, tg_err *e)
{
    *text = malloc((size_t)n + 1);
    for (int i = 0; i < n; i++) (*text)[i] = (char)ids[i];
    *len = (size_t)n;
    return 0;
}

/* Logits: f->logits, with a bump at (last token + 1) % V, so each step's
 * argmax follows from the token appended before it. */
static int fake_decode(void *ud, const proto_decode_req *r, proto_conn *c, proto_done *done,
                       tg_err *e)
{
    fake *f = ud;
    if (proto_check_ids(r->prompt, r->n_prompt, FAKE_VOCAB, "prompt", e)) return -1;
    int32_t last = r->prompt[r->n_prompt - 1];
    for (int s = 0; s < r->steps; s++) {
        if (f->decode_fail_after >= 0 && s == f->decode_fail_after)
            return tg_errf(e, "step %d: injected failure", s);
        float l[FAKE_VOCAB];
        memcpy(l, f->logits, sizeof l);
        l[(last + 1) % FAKE_VOCAB] += 100.0f;
        if (f->dump_logits && proto_wants_dump(r, s) &&
            proto_dump(c, r, s, -1, "logits", l, FAKE_VOCAB, e))
            return -1;
        last = proto_step(c, r, s, l, FAKE_VOCAB);
    }
    done->counters = json_pack("{s:i}", "steps", r->steps);
    done->ms_prefill = 1.5;
    done->ms_decode = 2.5;
    return 0;
}

/* replay: answers what it was asked (the parsing is what is tested) */
static int fake_replay(void *ud, const proto_replay_req *r, json_t *res, tg_err *e)
{
    (void)ud, (void)e;
    json_object_set_new(res, "n_tokens", json_integer(r->n_tokens));
    json_object_set_new(res, "prefill", json_integer(r->prefill));
    return 0;
}

static fake F;
static proto_ops OPS = {&F, fake_hello, fake_load, fake_tokenize, fake_detokenize, fake_decode, fake_replay};

static int setup(void **state)
{
    memset(&F, 0, sizeof F);
    F.decode_fail_after = -1;
    for (int i = 0; i < FAKE_VOCAB; i++) F.logits[i] = (float)(i % 5) * 0.25f - 1.0f;
    return 0;
}

/* Runs proto_serve over input; returns its output (caller frees) and rc. */
static char *serve(const char *input, size_t len, int *rc)
{
    FILE *in = fmemopen((void *)input, len, "r");
    char *out = NULL;
    size_t outlen = 0;
    FILE *o = open_memstream(&out, &outlen);
    assert_non_null(in);
    assert_non_null(o);
    *rc = proto_serve(in, o, &OPS);
    fclose(in);
    fclose(o);
    return out;
}

/* The n-th (0-based) line of text, parsed; fails the test if absent. */
static json_t *line_json(const char *text, int n)
{
    const char *p = text;
    for (int i = 0; i < n; i++) {
        p = strchr(p, '\n');
        assert_non_null(p);
        p++;
    }
    const char *end = strchr(p, '\n');
    assert_non_null(end);
    json_error_t err;
    json_t *j = json_loadb(p, (size_t)(end - p), 0, &err);
    if (!j) fail_msg("line %d is not JSON: %s: %.*s", n, err.text, (int)(end - p), p);
    return j;
}

static int count_lines(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++) n += *p == '\n';
    return n;
}

/* The error of an answer that must be {"ok":false,"error":...}. */
static void expect_error_n(const char *request, const char *want, size_t n)
{
    int rc;
    char *out = serve(request, strlen(request), &rc);
    assert_int_equal(rc, 0);
    json_t *j = line_json(out, 0);
    if (!json_is_false(json_object_get(j, "ok")))
        fail_msg("request %s: expected ok:false, got %s", request, out);
    const char *got = json_string_value(json_object_get(j, "error"));
    assert_non_null(got);
    if (strncmp(got, want, n) != 0 || (n == (size_t)-1 && strcmp(got, want) != 0))
        fail_msg("request %s:\n  error: %s\n  want:  %s%s", request, got, want,
                 n == (size_t)-1 ? "" : "...");
    json_decref(j);
    free(out);
}

static void expect_error(const char *request, const char *want)
{
    expect_error_n(request, want, (size_t)-1);
}

/* For messages that end in jansson's own words (they vary by version). */
static void expect_error_prefix(const char *request, const char *want)
{
    expect_error_n(request, want, strlen(want));
}

static void test_hello_load_bye(void **state)
{
    const char *req = "{\"op\":\"hello\",\"protocol\":1}\n"
                      "{\"op\":\"load\",\"model\":\"m.gguf\",\"options\":{\"threads\":3,\"mode\":\"b\"}}\n"
                      "{\"op\":\"bye\"}\n"
                      "{\"op\":\"hello\"}\n";
    int rc;
    char *out = serve(req, strlen(req), &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(count_lines(out), 3); /* nothing after bye */
    json_t *h = line_json(out, 0), *l = line_json(out, 1), *b = line_json(out, 2);
    assert_true(json_is_true(json_object_get(h, "ok")));
    assert_int_equal(json_integer_value(json_object_get(h, "protocol")), 1);
    assert_string_equal(json_string_value(json_object_get(json_object_get(h, "arm"), "kind")), "fake");
    json_t *m = json_object_get(l, "model");
    assert_int_equal(json_integer_value(json_object_get(m, "threads")), 3);
    assert_int_equal(json_integer_value(json_object_get(m, "mode")), 1);
    assert_true(json_is_number(json_object_get(json_object_get(l, "ms"), "load")));
    assert_true(json_is_true(json_object_get(b, "bye")));
    json_decref(h);
    json_decref(l);
    json_decref(b);
    free(out);
}

static void test_eof_ends_cleanly(void **state)
{
    int rc;
    char *out = serve("{\"op\":\"hello\"}\n\n   \n{\"op\":\"hello\"}", 34, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(count_lines(out), 2); /* blank lines skipped, last line without \n served */
    free(out);
    out = serve("", 0, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(out, "");
    free(out);
}

static void test_validation_messages(void **state)
{
    expect_error_prefix("not json\n", "request is not valid JSON: ");
    expect_error("[1,2]\n", "request must be a JSON object with an \"op\" string");
    expect_error("{\"op\":7}\n", "request must be a JSON object with an \"op\" string");
    expect_error("{\"op\":\"frob\"}\n",
                 "unknown op 'frob' (expected hello, load, tokenize, detokenize, decode, replay, bye)");
    expect_error("{\"op\":\"hello\",\"protocol\":2}\n",
                 "hello: protocol 2 is not supported (this worker speaks 1)");
    expect_error("{\"op\":\"hello\",\"x\":1}\n", "hello: unknown field 'x' (expected op, protocol)");
    expect_error("{\"op\":\"load\"}\n",
                 "load: field 'model' must be a non-empty string (the model file's path)");
    expect_error("{\"op\":\"load\",\"model\":\"m\",\"options\":[]}\n",
                 "load: field 'options' must be an object");
    expect_error("{\"op\":\"load\",\"model\":\"m\",\"options\":{\"threads\":0}}\n",
                 "load: option 'threads' must be an integer 1..64");
    expect_error("{\"op\":\"load\",\"model\":\"m\",\"options\":{\"mode\":\"c\"}}\n",
                 "load: option 'mode' must be one of: a, b");
    expect_error("{\"op\":\"load\",\"model\":\"m\",\"options\":{\"thread\":2}}\n",
                 "load: unknown option 'thread' (known: threads, mode)");
    expect_error("{\"op\":\"load\",\"model\":\"missing.gguf\"}\n",
                 "load: model missing.gguf: no such file");
    expect_error("{\"op\":\"tokenize\"}\n", "tokenize: field 'text' must be a string");
    expect_error("{\"op\":\"tokenize\",\"text\":\"a\",\"special\":1}\n",
                 "tokenize: field 'special' must be true or false");
    expect_error("{\"op\":\"detokenize\",\"ids\":[1,-2]}\n",
                 "detokenize: field 'ids'[1] must be a token id (an integer 0..2147483647)");
    expect_error("{\"op\":\"decode\",\"prompt\":[1],\"steps\":0}\n",
                 "decode: field 'steps' must be an integer 1..100000");
    expect_error("{\"op\":\"decode\",\"prompt\":[1],\"steps\":\"4\"}\n",
                 "decode: field 'steps' must be an integer 1..100000");
    expect_error("{\"op\":\"decode\",\"prompt\":[1]}\n",
                 "decode: field 'steps' is missing (an integer 1..100000)");
    expect_error("{\"op\":\"decode\",\"steps\":3}\n",
                 "decode: field 'prompt' is missing (an array of token ids)");
    expect_error("{\"op\":\"decode\",\"prompt\":[],\"steps\":3}\n",
                 "decode: field 'prompt' must not be empty");
    expect_error("{\"op\":\"decode\",\"prompt\":[1.5],\"steps\":3}\n",
                 "decode: field 'prompt'[0] must be a token id (an integer 0..2147483647)");
    expect_error("{\"op\":\"decode\",\"prompt\":[1],\"steps\":3,\"top_k\":0}\n",
                 "decode: field 'top_k' must be an integer 1..100000");
    expect_error("{\"op\":\"decode\",\"prompt\":[1],\"steps\":3,\"force\":[1]}\n",
                 "decode: field 'force' has 1 ids; expected steps (3) or steps - 1");
    expect_error("{\"op\":\"decode\",\"prompt\":[1],\"steps\":3,\"dump\":{\"steps\":[3],\"path\":\"/\"}}\n",
                 "decode: field 'dump.steps'[0] must be a step number 0..2");
    expect_error("{\"op\":\"decode\",\"prompt\":[1],\"steps\":3,\"dump\":{\"steps\":[1],\"path\":\"/nonexistent-dir\"}}\n",
                 "decode: field 'dump.path': /nonexistent-dir is not an existing folder");
    expect_error("{\"op\":\"decode\",\"prompt\":[1],\"steps\":3,\"dump\":{\"steps\":[1,1],\"path\":\"/\"}}\n",
                 "decode: field 'dump.steps' lists step 1 twice");
    expect_error("{\"op\":\"decode\",\"prompt\":[1],\"steps\":3,\"seed\":1}\n",
                 "decode: unknown field 'seed' (expected op, prompt, steps, top_k, force, dump)");
    expect_error("{\"op\":\"decode\",\"prompt\":[99],\"steps\":3}\n",
                 "decode: prompt[0] = 99 is not a token id of this model (0..15)");
    expect_error("{\"op\":\"bye\",\"now\":true}\n", "bye: unknown field 'now' (expected op)");
    expect_error_prefix("{\"op\":\"hello\",\"op\":\"bye\"}\n",
                        "request is not valid JSON: duplicate object key");
}

/* replay's fields: prefill 1..n_tokens, absent 0 (one batch). */
static void test_replay_fields(void **state)
{
    const char *req = "{\"op\":\"replay\",\"tokens\":[1,2,3],\"out\":\"o\",\"prefill\":2}\n"
                      "{\"op\":\"replay\",\"tokens\":[1,2,3],\"out\":\"o\"}\n";
    int rc;
    char *out = serve(req, strlen(req), &rc);
    assert_int_equal(rc, 0);
    for (int i = 0; i < 2; i++) {
        json_t *j = line_json(out, i);
        json_t *r = json_object_get(j, "replay");
        assert_int_equal(json_integer_value(json_object_get(r, "n_tokens")), 3);
        assert_int_equal(json_integer_value(json_object_get(r, "prefill")), i == 0 ? 2 : 0);
        json_decref(j);
    }
    free(out);
    expect_error("{\"op\":\"replay\",\"tokens\":[1,2,3],\"out\":\"o\",\"prefill\":4}\n",
                 "replay: field 'prefill' must be an integer 1..3");
    expect_error("{\"op\":\"replay\",\"tokens\":[1,2,3],\"out\":\"o\",\"prefill\":\"all\"}\n",
                 "replay: field 'prefill' must be an integer 1..3");
    expect_error("{\"op\":\"replay\",\"tokens\":[1],\"out\":\"o\",\"batch\":1}\n",
                 "replay: unknown field 'batch' (expected op, tokens, in, out, numerics, prefill)");
}

static void test_unsupported_op(void **state)
{
    proto_ops saved = OPS;
    OPS.detokenize = NULL;
    expect_error("{\"op\":\"detokenize\",\"ids\":[1]}\n", "detokenize: not supported by this worker");
    OPS = saved;
}

/* Step lines: argmax, order, ties by lower id, %.9g round trip, digest. */
static void test_step_lines(void **state)
{
    /* ties: ids 4 and 9 share the max (both i%5 == 4 -> 0.0) */
    float l[FAKE_VOCAB];
    for (int i = 0; i < FAKE_VOCAB; i++) l[i] = (float)(i % 5) * 0.25f - 1.0f;
    char *out = NULL;
    size_t outlen = 0;
    FILE *o = open_memstream(&out, &outlen);
    proto_conn *c = proto_conn_new(o);
    proto_decode_req r = {.prompt = (int32_t[]){1}, .n_prompt = 1, .steps = 2, .top_k = 4};
    assert_int_equal(proto_step(c, &r, 0, l, FAKE_VOCAB), 4); /* first maximum */

    /* random logits survive the text round trip bit for bit */
    float rl[FAKE_VOCAB];
    srand(12345);
    for (int i = 0; i < FAKE_VOCAB; i++) rl[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 3e3f;
    rl[7] = 1.17549435e-38f * 3.0f; /* a tiny normal */
    r.top_k = FAKE_VOCAB;
    int32_t tok = proto_step(c, &r, 1, rl, FAKE_VOCAB);
    fflush(o);

    json_t *s0 = line_json(out, 0), *s1 = line_json(out, 1);
    assert_int_equal(json_integer_value(json_object_get(s0, "step")), 0);
    assert_int_equal(json_integer_value(json_object_get(s0, "token")), 4);
    json_t *top = json_object_get(s0, "top");
    assert_int_equal(json_array_size(top), 4);
    int want_ids[4] = {4, 9, 14, 3}; /* 0.0 x3 by id, then -0.25 (id 3) */
    for (int i = 0; i < 4; i++)
        assert_int_equal(json_integer_value(json_array_get(json_array_get(top, i), 0)), want_ids[i]);
    char dig[17];
    tg_digest_logits(l, FAKE_VOCAB, dig);
    assert_string_equal(json_string_value(json_object_get(s0, "digest")), dig);

    json_t *top1 = json_object_get(s1, "top");
    assert_int_equal(json_array_size(top1), FAKE_VOCAB);
    assert_int_equal(json_integer_value(json_object_get(s1, "token")), tok);
    for (int i = 0; i < FAKE_VOCAB; i++) {
        json_t *e = json_array_get(top1, i);
        int id = (int)json_integer_value(json_array_get(e, 0));
        float back = (float)json_number_value(json_array_get(e, 1));
        if (memcmp(&back, &rl[id], sizeof back) != 0)
            fail_msg("logit of id %d: %.9g printed, read back as %.9g", id, (double)rl[id], (double)back);
        if (i > 0) {
            float prev = (float)json_number_value(json_array_get(json_array_get(top1, i - 1), 1));
            assert_true(prev >= back);
        }
    }
    json_decref(s0);
    json_decref(s1);
    proto_conn_free(c);
    fclose(o);
    free(out);
}

/* proto_step_top (device-selected top-k) writes the same line as proto_step. */
static void test_step_top_same_line(void **state)
{
    float l[FAKE_VOCAB];
    for (int i = 0; i < FAKE_VOCAB; i++) l[i] = (float)((i * 7) % 11) * 0.5f - 2.0f;
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    FILE *fa = open_memstream(&a, &la), *fb = open_memstream(&b, &lb);
    proto_conn *ca = proto_conn_new(fa), *cb = proto_conn_new(fb);
    int32_t force[2] = {9, 9};
    proto_decode_req r = {.prompt = (int32_t[]){1}, .n_prompt = 1, .steps = 2, .top_k = 5,
                          .force = force, .n_force = 2};
    tg_top top[8];
    int k = tg_topk(l, FAKE_VOCAB, 8, top);
    char dig[17];
    tg_digest_logits(l, FAKE_VOCAB, dig);
    assert_int_equal(proto_step(ca, &r, 1, l, FAKE_VOCAB), 9);
    assert_int_equal(proto_step_top(cb, &r, 1, top, k, dig), 9); /* k clamped to top_k */
    fflush(fa);
    fflush(fb);
    assert_string_equal(a, b);
    proto_conn_free(ca);
    proto_conn_free(cb);
    fclose(fa);
    fclose(fb);
    free(a);
    free(b);
}

static void test_nonfinite_logits(void **state)
{
    float l[4] = {NAN, -INFINITY, INFINITY, 1.0f};
    char *out = NULL;
    size_t outlen = 0;
    FILE *o = open_memstream(&out, &outlen);
    proto_conn *c = proto_conn_new(o);
    proto_decode_req r = {.prompt = (int32_t[]){1}, .n_prompt = 1, .steps = 1, .top_k = 4};
    assert_int_equal(proto_step(c, &r, 0, l, 4), 2);
    fflush(o);
    json_t *s = line_json(out, 0);
    json_t *top = json_object_get(s, "top");
    assert_string_equal(json_string_value(json_array_get(json_array_get(top, 0), 1)), "inf");
    assert_string_equal(json_string_value(json_array_get(json_array_get(top, 2), 1)), "-inf");
    assert_string_equal(json_string_value(json_array_get(json_array_get(top, 3), 1)), "nan");
    json_decref(s);
    proto_conn_free(c);
    fclose(o);
    free(out);
}

/* Greedy follows the fake's bump; forcing appends force[i] instead. */
static void test_decode_and_forcing(void **state)
{
    const char *req = "{\"op\":\"decode\",\"prompt\":[3,5],\"steps\":3,\"top_k\":2}\n"
                      "{\"op\":\"decode\",\"prompt\":[3,5],\"steps\":3,\"top_k\":2,\"force\":[10,0]}\n";
    int rc;
    char *out = serve(req, strlen(req), &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(count_lines(out), 8);
    int want[8] = {6, 7, 8, -1, 6, 11, 1, -1};
    for (int i = 0; i < 8; i++) {
        json_t *j = line_json(out, i);
        if (want[i] >= 0) {
            assert_int_equal(json_integer_value(json_object_get(j, "token")), want[i]);
        } else {
            assert_true(json_is_true(json_object_get(j, "done")));
            assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "counters"), "steps")), 3);
            json_t *ms = json_object_get(j, "ms");
            assert_true(json_number_value(json_object_get(ms, "prefill")) == 1.5);
            assert_true(json_number_value(json_object_get(ms, "decode")) == 2.5);
            assert_true(json_is_number(json_object_get(ms, "load")));
        }
        json_decref(j);
    }
    free(out);
}

static void test_decode_error_after_steps(void **state)
{
    F.decode_fail_after = 2;
    const char *req = "{\"op\":\"decode\",\"prompt\":[3],\"steps\":5}\n{\"op\":\"hello\"}\n";
    int rc;
    char *out = serve(req, strlen(req), &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(count_lines(out), 4); /* 2 steps, the error, hello's answer */
    json_t *j = line_json(out, 2);
    assert_string_equal(json_string_value(json_object_get(j, "error")), "decode: step 2: injected failure");
    json_decref(j);
    j = line_json(out, 3);
    assert_true(json_is_true(json_object_get(j, "ok")));
    json_decref(j);
    free(out);
}

static void test_dump(void **state)
{
    char dir[] = "/tmp/tg-proto-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    F.dump_logits = 1;
    char req[512];
    snprintf(req, sizeof req,
             "{\"op\":\"decode\",\"prompt\":[3],\"steps\":3,\"dump\":{\"steps\":[2,0],\"path\":\"%s\"}}\n",
             dir);
    int rc;
    char *out = serve(req, strlen(req), &rc);
    assert_int_equal(rc, 0);
    /* dump s0, step 0, step 1, dump s2, step 2, done */
    assert_int_equal(count_lines(out), 6);
    json_t *d = line_json(out, 3);
    json_t *dd = json_object_get(d, "dump");
    assert_non_null(dd);
    assert_int_equal(json_integer_value(json_object_get(dd, "step")), 2);
    assert_int_equal(json_integer_value(json_object_get(dd, "layer")), -1);
    assert_string_equal(json_string_value(json_object_get(dd, "stage")), "logits");
    assert_int_equal(json_integer_value(json_object_get(dd, "n")), FAKE_VOCAB);
    char want[600];
    snprintf(want, sizeof want, "%s/s2-lout-logits.f32", dir);
    assert_string_equal(json_string_value(json_object_get(dd, "file")), want);
    FILE *f = fopen(want, "rb");
    assert_non_null(f);
    float x[FAKE_VOCAB + 1];
    assert_int_equal(fread(x, sizeof(float), FAKE_VOCAB + 1, f), FAKE_VOCAB);
    fclose(f);
    /* step 2's input token is 5 (3 -> 4 -> 5), so the bump is at 6 */
    assert_true(x[6] == F.logits[6] + 100.0f);
    assert_true(x[0] == F.logits[0]);
    unlink(want);
    snprintf(want, sizeof want, "%s/s0-lout-logits.f32", dir);
    assert_int_equal(unlink(want), 0);
    rmdir(dir);
    json_decref(d);
    free(out);
}

static void test_tokenize_detokenize_text(void **state)
{
    /* NUL inside the text reaches the worker; invalid UTF-8 comes back with hex */
    const char *req = "{\"op\":\"tokenize\",\"text\":\"a\\u0000b\\u00e9\"}\n"
                      "{\"op\":\"detokenize\",\"ids\":[104,105,195,169]}\n"
                      "{\"op\":\"detokenize\",\"ids\":[104,255,105,195]}\n";
    int rc;
    char *out = serve(req, strlen(req), &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(F.last_len, 5);
    assert_memory_equal(F.last_text, "a\0b\xc3\xa9", 5);
    json_t *t = line_json(out, 0), *d1 = line_json(out, 1), *d2 = line_json(out, 2);
    assert_int_equal(json_array_size(json_object_get(t, "ids")), 5);
    assert_string_equal(json_string_value(json_object_get(d1, "text")), "hi\xc3\xa9");
    assert_null(json_object_get(d1, "hex"));
    assert_string_equal(json_string_value(json_object_get(d2, "text")), "h\xef\xbf\xbdi\xef\xbf\xbd");
    assert_string_equal(json_string_value(json_object_get(d2, "hex")), "68ff69c3");
    json_decref(t);
    json_decref(d1);
    json_decref(d2);
    free(out);
}

/* A cookie stream yielding a 100 MB line of 'a' and then a hello. */
typedef struct bigsrc {
    size_t left;
    const char *tail;
    size_t tail_left;
} bigsrc;

static ssize_t big_read(void *cookie, char *buf, size_t n)
{
    bigsrc *b = cookie;
    size_t k = 0;
    if (b->left) {
        k = n < b->left ? n : b->left;
        memset(buf, 'a', k);
        b->left -= k;
        return (ssize_t)k;
    }
    k = n < b->tail_left ? n : b->tail_left;
    memcpy(buf, b->tail, k);
    b->tail += k;
    b->tail_left -= k;
    return (ssize_t)k;
}

static void test_long_line_refused(void **state)
{
    const char *tail = "\n{\"op\":\"hello\"}\n";
    bigsrc b = {100u << 20, tail, strlen(tail)};
    cookie_io_functions_t io = {.read = big_read};
    FILE *in = fopencookie(&b, "r", io);
    char *out = NULL;
    size_t outlen = 0;
    FILE *o = open_memstream(&out, &outlen);
    assert_int_equal(proto_serve(in, o, &OPS), 0);
    fclose(in);
    fclose(o);
    assert_int_equal(count_lines(out), 2);
    json_t *j = line_json(out, 0);
    char want[128];
    snprintf(want, sizeof want, "request line longer than %u bytes: refused", PROTO_MAX_LINE);
    assert_string_equal(json_string_value(json_object_get(j, "error")), want);
    json_decref(j);
    j = line_json(out, 1);
    assert_true(json_is_true(json_object_get(j, "ok")));
    json_decref(j);
    free(out);
}

static void test_closed_output(void **state)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    close(p[0]);
    FILE *o = fdopen(p[1], "w");
    const char *req = "{\"op\":\"hello\"}\n{\"op\":\"hello\"}\n";
    FILE *in = fmemopen((void *)req, strlen(req), "r");
    assert_int_equal(proto_serve(in, o, &OPS), -1);
    fclose(in);
    fclose(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_hello_load_bye, setup),
        cmocka_unit_test_setup(test_eof_ends_cleanly, setup),
        cmocka_unit_test_setup(test_validation_messages, setup),
        cmocka_unit_test_setup(test_unsupported_op, setup),
        cmocka_unit_test_setup(test_step_lines, setup),
        cmocka_unit_test_setup(test_step_top_same_line, setup),
        cmocka_unit_test_setup(test_nonfinite_logits, setup),
        cmocka_unit_test_setup(test_decode_and_forcing, setup),
        cmocka_unit_test_setup(test_decode_error_after_steps, setup),
        cmocka_unit_test_setup(test_dump, setup),
        cmocka_unit_test_setup(test_replay_fields, setup),
        cmocka_unit_test_setup(test_tokenize_detokenize_text, setup),
        cmocka_unit_test_setup(test_long_line_refused, setup),
        cmocka_unit_test_setup(test_closed_output, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
