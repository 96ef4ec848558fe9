/*
 * tg-engine: an arm worker over the built-in engine, speaking the arm
 * protocol v1 (docs/protocol.md, engine/proto.h) on stdin/stdout.
 *
 *   tg-engine --tier ref|cpu|gpu [--threads N]
 *
 * hello answers the arm (kind "engine", tier, version, device, the sha256 of
 * this binary); load opens a GGUF (options: threads, kv_type f16|f32,
 * n_batch, n_ctx, perturb "bf16:STAGE:LAYER", see engine/model.h) and
 * answers its hyperparameters; tokenize / detokenize use the file's own
 * vocabulary (engine/tokenizer.h); decode runs the prompt and the steps on
 * the chosen tier with teacher forcing, dumps and op counters. Every tier
 * goes through the same session (engine/model.h, one table per tier in
 * engine/tier.h): the device string is the tier's description of the real
 * configuration; each step's top-k and digest come from tg_session_top
 * (on the device for the gpu tier, whose logits then never cross to the
 * host); forced steps without dumps on a tier that keeps its logits on the
 * host go through tg_session_eval_all in chunks, the same bytes as one step
 * at a time. The gpu tier is there when this binary was linked with the GPU
 * objects (`make gpu`, `make hip`); elsewhere a load with --tier gpu
 * answers that it is not part of this build. Log lines go to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model.h"
#include "proto.h"
#include "quant.h"
#include "replay_hook.h"
#include "tier.h"
#include "tokenizer.h"
#include "util.h"

#define TG_ENGINE_VERSION "tg-engine 0.1 (protocol 1)"

typedef struct worker {
    enum tg_tier tier;
    int threads;              /* --threads (0: all CPUs) */
    tg_model *model;          /* loaded model, or NULL */
    tg_tokenizer *tok;
    tg_session *sess;
    tg_top *top;              /* (top_cap) a step's top-k */
    int top_cap;
    double ms_load;
} worker;

static void unload(worker *w)
{
    tg_session_free(w->sess);
    tg_tokenizer_free(w->tok);
    tg_model_free(w->model);
    w->sess = NULL;
    w->tok = NULL;
    w->model = NULL;
}

static int need_model(worker *w, tg_err *e)
{
    return w->model ? 0 : tg_errf(e, "no model loaded (send a load request first)");
}

/* The numerics the tier of o declares (docs/protocol.md, "numerics"), or
 * NULL when the tier cannot replay (tier.h, numerics). */
static json_t *numerics_json(const tg_opts *o)
{
    const tg_tier_i *t = tg_tier_find(o->tier);
    if (!t || !t->numerics)
        return NULL;
    char buf[512];
    t->numerics(o, buf, sizeof buf);
    json_error_t je;
    return json_loads(buf, 0, &je);
}

static int on_hello(void *ud, json_t *arm, tg_err *e)
{
    worker *w = ud;
    char dev[192], sha[65];
    tg_opts o = tg_opts_default();
    o.tier = w->tier;
    o.threads = w->threads;
    tg_tier_device(&o, dev, sizeof dev);   /* says why when the tier cannot run here */
    if (tg_sha256_file("/proc/self/exe", sha, e) != 0)
        return -1;
    json_object_set_new(arm, "kind", json_string("engine"));
    json_object_set_new(arm, "tier", json_string(tg_tier_name(w->tier)));
    json_object_set_new(arm, "version", json_string(TG_ENGINE_VERSION));
    json_object_set_new(arm, "device", json_string(dev));
    json_object_set_new(arm, "binary_sha256", json_string(sha));
    json_object_set_new(arm, "logits", json_string("raw"));
    json_t *num = numerics_json(&o);
    json_object_set_new(arm, "replay", json_boolean(num != NULL));
    if (num) {
        json_object_set_new(arm, "numerics", num);
        json_object_set_new(arm, "replay_prefill", json_true());
    }
    return 0;
}

static int on_load(void *ud, const char *path, const json_t *options, json_t *out, tg_err *e)
{
    worker *w = ud;
    static const char *const known[] = {"threads", "kv_type", "n_batch", "n_ctx", "perturb", NULL};
    static const char *const kv_types[] = {"f16", "f32", NULL};
    tg_opts o = tg_opts_default();
    o.tier = w->tier;
    o.threads = w->threads;
    int kv = 0;
    if (proto_opt_known(options, known, e) || proto_opt_int(options, "threads", 1, 512, &o.threads, e) ||
        proto_opt_enum(options, "kv_type", kv_types, &kv, e) ||
        proto_opt_int(options, "n_batch", 1, 4096, &o.n_batch, e) ||
        proto_opt_int(options, "n_ctx", 1, 1 << 20, &o.n_ctx, e))
        return -1;
    o.kv_f32 = kv == 1;
    if (w->tier == TG_TIER_REF && !o.kv_f32 && json_object_get(options, "kv_type"))
        return tg_errf(e, "option 'kv_type' f16: the ref tier keeps its KV cache in f32");
    json_t *pt = json_object_get(options, "perturb");
    if (pt) {
        if (!json_is_string(pt))
            return tg_errf(e, "option 'perturb' must be a string \"KIND:STAGE:LAYER\" (engine/model.h)");
        if (tg_opts_parse_perturb(&o, json_string_value(pt), e) != 0)
            return -1;
    }

    unload(w);
    double t0 = tg_now();
    if (tg_model_load(&w->model, path, e) != 0)
        return -1;
    if (tg_tokenizer_from_gguf(&w->tok, w->model->g, e) != 0 ||
        tg_session_new(&w->sess, w->model, &o, e) != 0) {
        unload(w);
        return -1;
    }
    w->ms_load = (tg_now() - t0) * 1e3;
    const char *devname = tg_session_device(w->sess);
    const tg_opts *so = tg_session_opts(w->sess);

    const tg_hparams *hp = &w->model->hp;
    json_object_set_new(out, "arch", json_string(hp->arch_name));
    json_object_set_new(out, "n_vocab", json_integer(hp->n_vocab));
    json_object_set_new(out, "n_layer", json_integer(hp->n_layer));
    json_object_set_new(out, "n_embd", json_integer(hp->n_embd));
    json_object_set_new(out, "n_head", json_integer(hp->n_head));
    json_object_set_new(out, "n_head_kv", json_integer(hp->n_head_kv));
    json_object_set_new(out, "head_dim", json_integer(hp->head_dim));
    json_object_set_new(out, "n_ff", json_integer(hp->n_ff));
    json_object_set_new(out, "n_ctx_train", json_integer(hp->n_ctx_train));
    json_object_set_new(out, "n_ctx", json_integer(so->n_ctx));
    json_object_set_new(out, "rope_base", json_real(hp->rope_base));
    json_object_set_new(out, "file_type", json_integer(hp->file_type));
    json_object_set_new(out, "tied", json_boolean(hp->tied));
    json_object_set_new(out, "tier", json_string(tg_tier_name(w->tier)));
    json_object_set_new(out, "device", json_string(devname));
    json_object_set_new(out, "kv_type", json_string(so->kv_f32 ? "f32" : "f16"));
    json_t *num = numerics_json(so);
    if (num)
        json_object_set_new(out, "numerics", num);
    json_object_set_new(out, "ms_load", json_real(w->ms_load));
    fprintf(stderr, "tg-engine: loaded %s (%s, %d layers, %d vocab) on %s in %.0f ms\n", path, hp->arch_name,
            hp->n_layer, hp->n_vocab, devname, w->ms_load);
    return 0;
}

static int on_tokenize(void *ud, const char *text, size_t len, bool special, int32_t **ids, int *n, tg_err *e)
{
    worker *w = ud;
    if (need_model(w, e))
        return -1;
    size_t nn;
    if (tg_tokenize(w->tok, text, len, 1, special, ids, &nn, e) != 0)
        return -1;
    *n = (int)nn;
    return 0;
}

static int on_detokenize(void *ud, const int32_t *ids, int n, bool special, char **text, size_t *len, tg_err *e)
{
    worker *w = ud;
    if (need_model(w, e))
        return -1;
    return tg_detokenize(w->tok, ids, (size_t)n, special, text, len, e);
}

/* The dump hook: files and lines through proto. */
typedef struct dump_ctx {
    proto_conn *c;
    const proto_decode_req *req;
    int step;
} dump_ctx;

static int dump_hook(void *ud, int layer, int stage, const float *x, int64_t n, tg_err *e)
{
    dump_ctx *d = ud;
    return proto_dump(d->c, d->req, d->step, layer, tg_stage_name(stage), x, (size_t)n, e);
}

static void add_counter(const char *name, uint64_t count, void *ud)
{
    json_object_set_new((json_t *)ud, name, json_integer((json_int_t)count));
}

/* The op counters of a finished decode into the done line's object. */
static json_t *counters_json(tg_ops *ops, enum tg_tier tier)
{
    json_t *ctr = json_object(), *o = json_object();
    tg_ops_foreach(ops, add_counter, o);
    json_object_set_new(ctr, "device_ops", json_integer((json_int_t)tg_ops_device(ops)));
    json_object_set_new(ctr, "host_ops", json_integer((json_int_t)tg_ops_host(ops)));
    json_object_set_new(ctr, "reference_tier_hits", json_integer((json_int_t)tg_ops_ref_hits(ops, tier)));
    json_object_set_new(ctr, "ops", o);
    return ctr;
}

/* The step line of step st from the session's last logits: the top k and
 * the digest from tg_session_top (computed on the device by the gpu tier,
 * on the host over the logits by the others: the same bytes proto_step
 * writes). Returns 0 and *next (the token to append next), or -1 with e. */
static int step_line(worker *w, const proto_decode_req *req, proto_conn *c, int st, int32_t *next, tg_err *e)
{
    char dig[17];
    int k = tg_session_top(w->sess, req->top_k, w->top, dig, e);
    if (k < 0)
        return -1;
    *next = proto_step_top(c, req, st, w->top, k, dig);
    return 0;
}

#define FORCE_CHUNK 64   /* forced steps per tg_session_eval_all (bounds its logits buffer) */

/* The steps of a teacher-forced decode without dumps, after the prompt, on
 * a tier that keeps its logits on the host: step 0 from the session's
 * logits, then the forced tokens in chunks through tg_session_eval_all (the
 * ref tier evaluates them in batches; each step's logits are byte for byte
 * those of one token at a time), every step line written as the one-token
 * path writes it. Returns 0, or -1 with e prefixed by the first step of
 * the failing chunk. */
static int decode_forced(worker *w, const proto_decode_req *req, proto_conn *c, tg_err *e)
{
    tg_session *s = w->sess;
    const int n_vocab = w->model->hp.n_vocab;
    int32_t next;
    if (step_line(w, req, c, 0, &next, e) != 0)
        return tg_err_prefix(e, "step 0");
    const int chunk = req->steps - 1 < FORCE_CHUNK ? req->steps - 1 : FORCE_CHUNK;
    if (chunk < 1)
        return 0;
    float *lg = malloc(sizeof *lg * (size_t)chunk * (size_t)n_vocab);
    if (!lg)
        return tg_errf(e, "out of memory (%d x %d logits)", chunk, n_vocab);
    int rc = 0;
    for (int st = 1; st < req->steps; st += chunk) {
        // steps st .. st+nb-1 read the logits after force[st-1 .. st+nb-2]
        int nb = req->steps - st < chunk ? req->steps - st : chunk;
        if (tg_session_eval_all(s, req->force + st - 1, nb, lg, e) != 0) {
            rc = tg_err_prefix(e, "step %d", st);
            break;
        }
        for (int i = 0; i < nb; i++)
            proto_step(c, req, st + i, lg + (size_t)i * n_vocab, n_vocab);
    }
    free(lg);
    return rc;
}

static int on_decode(void *ud, const proto_decode_req *req, proto_conn *c, proto_done *done, tg_err *e)
{
    worker *w = ud;
    if (need_model(w, e))
        return -1;
    const int n_vocab = w->model->hp.n_vocab;
    if (proto_check_ids(req->prompt, req->n_prompt, n_vocab, "prompt", e) ||
        (req->force && proto_check_ids(req->force, req->n_force, n_vocab, "force", e)))
        return -1;
    int need = req->n_prompt + req->steps - 1;
    if (need > tg_session_n_ctx(w->sess))
        return tg_errf(e, "prompt (%d) + steps (%d) need %d positions, the context holds %d (option n_ctx)",
                       req->n_prompt, req->steps, need, tg_session_n_ctx(w->sess));
    const int k = req->top_k < n_vocab ? req->top_k : n_vocab;
    if (k > w->top_cap) {
        tg_top *nt = realloc(w->top, sizeof *nt * (size_t)k);
        if (!nt)
            return tg_errf(e, "out of memory (top %d)", k);
        w->top = nt;
        w->top_cap = k;
    }

    tg_session *s = w->sess;
    tg_session_reset(s);
    tg_session_set_top(s, req->top_k);
    tg_ops *ops = tg_session_ops(s);
    tg_ops_clear(ops);
    dump_ctx dc = {c, req, 0};
    int rc = -1;

    double t0 = tg_now();
    tg_session_set_dump(s, proto_wants_dump(req, 0) ? dump_hook : NULL, &dc);
    if (tg_session_eval(s, req->prompt, req->n_prompt, e) != 0)
        goto out;
    double t1 = tg_now();
    if (req->force && req->n_dump_steps == 0 && !tg_session_top_on_device(s)) {
        if (decode_forced(w, req, c, e) != 0)
            goto out;
    } else {
        for (int st = 0; st < req->steps; st++) {
            int32_t next;
            if (step_line(w, req, c, st, &next, e) != 0) {
                tg_err_prefix(e, "step %d", st);
                goto out;
            }
            if (st == req->steps - 1)
                break;
            dc.step = st + 1;
            tg_session_set_dump(s, proto_wants_dump(req, st + 1) ? dump_hook : NULL, &dc);
            if (tg_session_eval(s, &next, 1, e) != 0) {
                tg_err_prefix(e, "step %d", st + 1);
                goto out;
            }
        }
    }
    double t2 = tg_now();
    done->ms_prefill = (t1 - t0) * 1e3;
    done->ms_decode = (t2 - t1) * 1e3;
    done->counters = counters_json(ops, w->tier);
    rc = 0;
out:
    tg_session_set_dump(s, NULL, NULL);
    return rc;
}

/* Applies a replay request's numerics (the roundings another arm declares)
 * to n. Only the ref tier (the exact arbiter) applies them. Returns 0 or -1
 * with e naming the key and the values expected. */
static int parse_numerics(const worker *w, const json_t *j, tg_replay_num *n, tg_err *e)
{
    if (!j)
        return 0;
    if (w->tier != TG_TIER_REF)
        return tg_errf(e, "field 'numerics': only the ref tier applies another arm's numerics");
    static const char *const known[] = {"exact", "act", "kv", "attn_q", "attn_acc", "rope", "accum", "silu",
                                        NULL};
    if (proto_opt_known(j, known, e))
        return tg_err_prefix(e, "field 'numerics'");
    static const char *const act[] = {"f32", "vec_dot", NULL}, *const kv[] = {"f32", "f16", NULL},
                             *const aq[] = {"f32", "kv", NULL}, *const acc[] = {"f64", "f32", "f16", "kv", NULL},
                             *const rope[] = {"f64", "ggml-f32", NULL};
    int a = 0, k = 0, q = 0, c = 0, r = 0;
    if (proto_opt_enum(j, "act", act, &a, e) || proto_opt_enum(j, "kv", kv, &k, e) ||
        proto_opt_enum(j, "attn_q", aq, &q, e) || proto_opt_enum(j, "attn_acc", acc, &c, e) ||
        proto_opt_enum(j, "rope", rope, &r, e))
        return tg_err_prefix(e, "field 'numerics'");
    n->act_vec_dot = a == 1;
    n->kv_f16 = k == 1;
    n->attn_q_kv = q == 1;
    n->attn_acc = c == 1 ? 32 : c == 2 ? 16 : c == 3 ? (k == 1 ? 16 : 32) : 0;
    n->rope_ggml = r == 1;
    return 0;
}

/* replay: the tokens from an empty cache with the stage hooks (replay_hook.h). */
static int on_replay(void *ud, const proto_replay_req *req, json_t *result, tg_err *e)
{
    worker *w = ud;
    if (need_model(w, e))
        return -1;
    const tg_tier_i *t = tg_tier_find(w->tier);
    if (!t || !t->numerics)
        return tg_errf(e, "tier %s cannot replay yet (its hello says \"replay\": false)", tg_tier_name(w->tier));
    if (proto_check_ids(req->tokens, req->n_tokens, w->model->hp.n_vocab, "tokens", e))
        return -1;
    if (req->n_tokens > tg_session_n_ctx(w->sess))
        return tg_errf(e, "%d tokens exceed the context of %d (option n_ctx)", req->n_tokens,
                       tg_session_n_ctx(w->sess));
    tg_replay *r;
    if (tg_replay_new(&r, w->model, req->n_tokens, req->in, e))
        return -1;
    if (parse_numerics(w, req->numerics, tg_replay_numerics(r), e)) {
        tg_replay_free(r);
        return -1;
    }
    tg_session *s = w->sess;
    tg_session_reset(s);
    tg_session_set_replay(s, r);
    double t0 = tg_now();
    /* with prefill, the prompt in one evaluation (in batches of n_batch,
     * as a decode's prompt), then each further token alone, as a decode's
     * steps: the single-token path is replayed too */
    const int first = req->prefill > 0 ? req->prefill : req->n_tokens;
    int rc = tg_session_eval(s, req->tokens, first, e);
    for (int i = first; rc == 0 && i < req->n_tokens; i++)
        if ((rc = tg_session_eval(s, req->tokens + i, 1, e)) != 0)
            tg_err_prefix(e, "position %d", i);
    double t1 = tg_now();
    tg_session_set_replay(s, NULL);
    tg_session_reset(s);
    int n_rec = rc ? -1 : tg_replay_write(r, req->out, e);
    if (n_rec >= 0) {
        json_object_set_new(result, "records", json_integer(n_rec));
        json_object_set_new(result, "overwritten", json_integer(tg_replay_n_overwritten(r)));
        json_object_set_new(result, "n_tokens", json_integer(req->n_tokens));
        json_object_set_new(result, "ms", json_real((t1 - t0) * 1e3));
    }
    tg_replay_free(r);
    return n_rec >= 0 ? 0 : -1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tg-engine --tier ref|cpu|gpu [--threads N]\n"
               "  An arm worker over tokgate's engine: arm protocol v1 (JSON lines) on stdin/stdout.\n"
               "  --tier     ref (portable reference), cpu (SIMD + threads) or gpu (builds of make gpu/hip)\n"
               "  --threads  cpu tier threads (default: all CPUs; a load option overrides it)\n");
}

int main(int argc, char **argv)
{
    worker w = {.tier = TG_TIER_CPU, .threads = 0};
    int have_tier = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--tier") == 0 && i + 1 < argc) {
            int t = tg_tier_parse(argv[++i]);
            if (t < 0) {
                fprintf(stderr, "tg-engine: --tier '%s': expected ref, cpu or gpu\n", argv[i]);
                return 2;
            }
            w.tier = (enum tg_tier)t;
            have_tier = 1;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 512) {
                fprintf(stderr, "tg-engine: --threads '%s': expected an integer 1..512\n", argv[i]);
                return 2;
            }
            w.threads = (int)n;
        } else {
            fprintf(stderr, "tg-engine: unknown or incomplete argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!have_tier) {
        fprintf(stderr, "tg-engine: --tier is required\n");
        usage(stderr);
        return 2;
    }
    proto_ops ops = {.ud = &w, .hello = on_hello, .load = on_load, .tokenize = on_tokenize,
                     .detokenize = on_detokenize, .decode = on_decode, .replay = on_replay};
    /* answers on a private descriptor, fd 1 pointed at stderr (nothing a
     * library prints can corrupt the stream; a failed write ends us) */
    tg_err pe;
    FILE *out = proto_private_out("tg-engine", &pe);
    if (!out) {
        fprintf(stderr, "%s\n", pe.msg);
        return 1;
    }
    int rc = proto_serve(stdin, out, &ops);
    fclose(out);
    unload(&w);
    free(w.top);
    return rc == 0 ? 0 : 1;
}
