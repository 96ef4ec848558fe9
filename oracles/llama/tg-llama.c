/*
 * tg-llama: an arm worker over any llama.cpp build's libllama.so, speaking
 * arm protocol v1 (docs/protocol.md) on stdin/stdout.
 *
 *   tg-llama --lib PATH/libllama.so      (or TG_LLAMA_LIB=PATH)
 *
 * The library is opened with llama_dl (dlopen, API check, the build's ggml
 * backends from the library's folder). Decoding is greedy over llama.cpp's
 * raw logits: the prompt is prefilled in batches of at most n_batch tokens,
 * then one token per step; under teacher forcing the forced token is
 * appended instead of the argmax. The KV cache is cleared before every
 * decode, so decodes are independent of each other. A decode with dumps
 * runs on a second context that carries an eval callback and writes the
 * engine's per-layer stages from llama.cpp's named graph tensors.
 *
 * Faults are answers, not crashes: a library that cannot be opened makes
 * hello and load answer ok:false with the reason (the worker stays up), a
 * model llama.cpp refuses is reported with llama.cpp's own log lines, a
 * failing llama_decode ends that decode with an error line. llama.cpp's log
 * goes to stderr.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llama/llama_dl.h"
#include "proto.h"
#include "util.h"

typedef struct worker {
    const char *lib_path;            /* NULL when none was given */
    llama_dl *dl;                    /* NULL when the library failed to open */
    tg_err lib_err;                  /* why dl is NULL */
    struct llama_model *model;       /* NULL until a load succeeds */
    const struct llama_vocab *vocab; /* of model */
    struct llama_context *ctx;       /* NULL for vocab_only loads */
    int n_vocab;
    int n_ctx;
    int n_batch;
    struct llama_batch batch;        /* (n_batch) tokens, allocated with ctx */
    int have_batch;
    struct llama_context_params cparams; /* of ctx, for the dump context */
    struct llama_context *dctx;      /* a context with the eval callback, made at
                                        the first dump request (NULL before) */
    struct dump_state *dump;         /* owned; what the eval callback fills */
} worker;

/* Layer dumps. llama.cpp names its intermediate tensors "<name>-<layer>";
 * the eval callback copies the last token's row of those that match an
 * engine stage (engine/model.h) into per-(layer, stage) buffers, and after
 * the decode call the buffers are written with proto_dump. The names are
 * those of llama.cpp's Qwen3/Llama graphs; "attn_out" has no name there and
 * is recognised as the matmul with blk.N.attn_output.weight. A tensor seen
 * twice under one name (Qcur before and after rope) keeps its last value,
 * which is the one the stage means. */
enum { ST_ATTN_NORM, ST_Q, ST_K, ST_V, ST_ATTN_OUT, ST_FFN_NORM, ST_FFN_OUT, ST_RESIDUAL, ST_COUNT };
static const char *const STAGE_NAME[ST_COUNT] = {"attn_norm", "q", "k", "v", "attn_out",
                                                 "ffn_norm", "ffn_out", "residual"};
static const char *const STAGE_LLAMA[ST_COUNT] = {"attn_norm", "Qcur", "Kcur", "Vcur", NULL,
                                                  "ffn_norm", "ffn_out", "l_out"};

typedef struct dump_state {
    llama_dl *dl;
    int active;         /* capture during this decode call */
    int n_layer;
    float **x;          /* (n_layer * ST_COUNT) captured rows, or NULL */
    size_t *n;          /* (n_layer * ST_COUNT) their lengths */
    size_t *cap;
    int skipped;        /* tensors not captured (not f32 / not contiguous) */
} dump_state;

static void dump_state_free(dump_state *d)
{
    if (!d) return;
    for (int i = 0; i < d->n_layer * ST_COUNT; i++) free(d->x[i]);
    free(d->x);
    free(d->n);
    free(d->cap);
    free(d);
}

/* The (layer, stage) of a graph tensor, or -1. */
static int classify(const struct ggml_tensor *t, int n_layer, int *layer)
{
    const char *name = t->name;
    const char *dash = strrchr(name, '-');
    if (t->op == GGML_OP_MUL_MAT && t->src[0]) {
        int l;
        char tail[64];
        if (sscanf(t->src[0]->name, "blk.%d.%63s", &l, tail) == 2 &&
            strcmp(tail, "attn_output.weight") == 0 && l >= 0 && l < n_layer) {
            *layer = l;
            return ST_ATTN_OUT;
        }
    }
    if (!dash || dash == name) return -1;
    char *end;
    long l = strtol(dash + 1, &end, 10);
    if (*end || end == dash + 1 || l < 0 || l >= n_layer) return -1;
    size_t k = (size_t)(dash - name);
    for (int st = 0; st < ST_COUNT; st++)
        if (STAGE_LLAMA[st] && strlen(STAGE_LLAMA[st]) == k && strncmp(name, STAGE_LLAMA[st], k) == 0) {
            *layer = (int)l;
            return st;
        }
    return -1;
}

/* ggml_backend_sched_eval_callback: ask -> whether we want t; otherwise
 * copy its last token's row. Always lets the computation go on. */
static bool dump_eval_cb(struct ggml_tensor *t, bool ask, void *ud)
{
    dump_state *d = ud;
    if (!d->active) return ask ? false : true;
    int layer, st = classify(t, d->n_layer, &layer);
    if (ask) return st >= 0;
    if (st < 0) return true;
    size_t ne = (size_t)t->ne[0] * (size_t)t->ne[1] * (size_t)t->ne[2] * (size_t)t->ne[3];
    int contiguous = t->nb[0] == sizeof(float) && t->nb[1] == t->nb[0] * (size_t)t->ne[0] &&
                     t->nb[2] == t->nb[1] * (size_t)t->ne[1] && t->nb[3] == t->nb[2] * (size_t)t->ne[2];
    if (t->type != GGML_TYPE_F32 || !contiguous || ne == 0) {
        d->skipped++;
        return true;
    }
    /* one token's values: q, k, v are (head_dim, heads, tokens), the rest (n, tokens) */
    size_t per = (st == ST_Q || st == ST_K || st == ST_V) && t->ne[2] >= 1
                     ? (size_t)t->ne[0] * (size_t)t->ne[1] : (size_t)t->ne[0];
    if (ne % per != 0) {
        d->skipped++;
        return true;
    }
    int i = layer * ST_COUNT + st;
    if (d->cap[i] < per) {
        float *nx = realloc(d->x[i], per * sizeof(float));
        if (!nx) {
            d->skipped++;
            return true;
        }
        d->x[i] = nx;
        d->cap[i] = per;
    }
    d->dl->ggml_backend_tensor_get(t, d->x[i], (ne - per) * sizeof(float), per * sizeof(float));
    d->n[i] = per;
    return true;
}

static void worker_unload(worker *w)
{
    if (w->have_batch) w->dl->batch_free(w->batch);
    w->have_batch = 0;
    if (w->ctx) w->dl->free_context(w->ctx);
    w->ctx = NULL;
    if (w->dctx) w->dl->free_context(w->dctx);
    w->dctx = NULL;
    dump_state_free(w->dump);
    w->dump = NULL;
    if (w->model) w->dl->model_free(w->model);
    w->model = NULL;
    w->vocab = NULL;
}

/* The library, or -1 with e saying why there is none. */
static int need_lib(worker *w, tg_err *e)
{
    if (w->dl) return 0;
    return tg_errf(e, "%s", w->lib_err.msg);
}

static int need_model(worker *w, tg_err *e)
{
    if (need_lib(w, e)) return -1;
    if (!w->model) return tg_errf(e, "no model loaded (send load first)");
    return 0;
}

static const char *dev_type_name(enum ggml_backend_dev_type t)
{
    switch (t) {
    case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
    case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
    case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
    case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
    default: return "other";
    }
}

static int cb_hello(void *ud, json_t *arm, tg_err *e)
{
    worker *w = ud;
    if (need_lib(w, e)) return -1;
    llama_dl *dl = w->dl;
    char exe_sha[65] = "";
    tg_err ignore;
    if (tg_sha256_file("/proc/self/exe", exe_sha, &ignore) != 0) exe_sha[0] = 0;
    json_t *devs = json_array();
    char device[1024] = "";
    size_t dn = 0;
    for (size_t i = 0; i < dl->ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t d = dl->ggml_backend_dev_get(i);
        const char *name = dl->ggml_backend_dev_name(d), *desc = dl->ggml_backend_dev_description(d);
        json_array_append_new(devs, json_pack("{s:s,s:s,s:s}", "name", name ? name : "",
                                              "description", desc ? desc : "", "type",
                                              dev_type_name(dl->ggml_backend_dev_type(d))));
        if (dn < sizeof device)
            dn += (size_t)snprintf(device + dn, sizeof device - dn, "%s%s (%s)", i ? ", " : "",
                                   name ? name : "?", desc ? desc : "?");
    }
    const char *sys = dl->print_system_info();
    json_object_set_new(arm, "kind", json_string("llama"));
    json_object_set_new(arm, "version", json_string(dl->version ? dl->version() : "unknown"));
    json_object_set_new(arm, "ggml_version",
                        json_string(dl->ggml_version ? dl->ggml_version() : "unknown"));
    json_object_set_new(arm, "ggml_commit",
                        json_string(dl->ggml_commit ? dl->ggml_commit() : "unknown"));
    json_object_set_new(arm, "system_info", json_string(sys ? sys : ""));
    json_object_set_new(arm, "device", json_string(device));
    json_object_set_new(arm, "devices", devs);
    json_object_set_new(arm, "gpu_offload", json_boolean(dl->supports_gpu_offload()));
    json_object_set_new(arm, "lib", json_string(dl->path));
    json_object_set_new(arm, "lib_sha256", json_string(dl->sha256));
    json_object_set_new(arm, "binary_sha256", json_string(exe_sha));
    json_object_set_new(arm, "logits", json_string("raw"));
    return 0;
}

static const char *const CACHE_TYPES[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1",
                                          "q5_0", "q5_1", "iq4_nl", NULL};
static const enum ggml_type CACHE_GGML[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                            GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                                            GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_IQ4_NL};
static const char *const FLASH[] = {"auto", "off", "on", NULL};
static const enum llama_flash_attn_type FLASH_LLAMA[] = {
    LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED};

/* Whether this aarch64 build runs under qemu-user on another architecture:
 * the kernel's /proc/cpuinfo then describes the host CPU, without the
 * "CPU implementer" lines every aarch64 kernel prints. Under qemu-user
 * (7.2) ggml's CPU threadpool livelocks with more than one thread, so the
 * worker then decodes with one thread and says so in the load answer. */
static int running_emulated(void)
{
#if defined(__aarch64__)
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[512];
    int native = 0, any = 0;
    while (fgets(line, sizeof line, f)) {
        any = 1;
        if (strncmp(line, "CPU implementer", 15) == 0) native = 1;
    }
    fclose(f);
    return any && !native;
#else
    return 0;
#endif
}

static int default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 16) n = 16;
    return (int)n;
}

static int cb_load(void *ud, const char *path, const json_t *opts, json_t *out, tg_err *e)
{
    static const char *const known[] = {"threads", "n_gpu_layers", "flash_attn", "type_k",
                                        "type_v", "n_ubatch", "n_batch", "n_ctx", "vocab_only",
                                        NULL};
    worker *w = ud;
    if (need_lib(w, e)) return -1;
    llama_dl *dl = w->dl;
    struct llama_model_params mp = dl->model_default_params();
    struct llama_context_params cp = dl->context_default_params();
    int threads = default_threads(), ngl = mp.n_gpu_layers, fa = 0, tk = 1, tv = 1;
    int n_ubatch = (int)cp.n_ubatch, n_batch = (int)cp.n_batch, n_ctx = 0;
    bool vocab_only = false;
    if (proto_opt_known(opts, known, e) || proto_opt_int(opts, "threads", 1, 1024, &threads, e) ||
        proto_opt_int(opts, "n_gpu_layers", -1, 100000, &ngl, e) ||
        proto_opt_enum(opts, "flash_attn", FLASH, &fa, e) ||
        proto_opt_enum(opts, "type_k", CACHE_TYPES, &tk, e) ||
        proto_opt_enum(opts, "type_v", CACHE_TYPES, &tv, e) ||
        proto_opt_int(opts, "n_ubatch", 1, 1 << 20, &n_ubatch, e) ||
        proto_opt_int(opts, "n_batch", 1, 1 << 20, &n_batch, e) ||
        proto_opt_int(opts, "n_ctx", 0, 1 << 24, &n_ctx, e) ||
        proto_opt_bool(opts, "vocab_only", &vocab_only, e))
        return -1;
    if (n_ubatch > n_batch) n_ubatch = n_batch;
    int emulated = running_emulated();
    if (emulated && threads > 1) {
        fprintf(stderr, "tg-llama: running under emulation (qemu-user): %d threads requested, "
                        "using 1 (ggml's threadpool livelocks under qemu-user)\n", threads);
        threads = 1;
    }

    worker_unload(w);
    mp.n_gpu_layers = ngl;
    mp.vocab_only = vocab_only;
    if (llama_dl_load_model(dl, path, &mp, &w->model, e)) return -1;
    w->vocab = dl->model_get_vocab(w->model);
    w->n_vocab = dl->vocab_n_tokens(w->vocab);
    if (w->n_vocab <= 0) {
        worker_unload(w);
        return tg_errf(e, "model %s: the vocabulary is empty", path);
    }
    char arch[128] = "", desc[256] = "";
    if (dl->model_meta_val_str(w->model, "general.architecture", arch, sizeof arch) < 0) arch[0] = 0;
    if (!vocab_only && dl->model_desc(w->model, desc, sizeof desc) < 0) desc[0] = 0;

    if (!vocab_only) {
        cp.n_ctx = (uint32_t)n_ctx;
        cp.n_batch = (uint32_t)n_batch;
        cp.n_ubatch = (uint32_t)n_ubatch;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        cp.flash_attn_type = FLASH_LLAMA[fa];
        cp.type_k = CACHE_GGML[tk];
        cp.type_v = CACHE_GGML[tv];
        cp.no_perf = true;
        llama_dl_log_reset(dl);
        w->ctx = dl->init_from_model(w->model, cp);
        if (!w->ctx) {
            const char *why = llama_dl_log_errors(dl);
            tg_errf(e, "model %s: llama.cpp cannot create a context (n_ctx %d, n_batch %d, "
                       "n_ubatch %d, type_k %s, type_v %s, flash_attn %s): %s",
                    path, n_ctx, n_batch, n_ubatch, CACHE_TYPES[tk], CACHE_TYPES[tv], FLASH[fa],
                    *why ? why : "(llama.cpp logged no error)");
            worker_unload(w);
            return -1;
        }
        w->cparams = cp;
        w->n_ctx = (int)dl->n_ctx(w->ctx);
        w->n_batch = (int)dl->n_batch(w->ctx);
        w->batch = dl->batch_init(w->n_batch, 0, 1);
        w->have_batch = 1;
    }
    json_object_set_new(out, "arch", json_string(arch));
    json_object_set_new(out, "n_vocab", json_integer(w->n_vocab));
    if (!vocab_only) {
        /* a vocab_only model has no hyperparameters: llama.cpp aborts on
         * llama_model_n_head() of one */
        json_object_set_new(out, "n_layer", json_integer(dl->model_n_layer(w->model)));
        json_object_set_new(out, "n_embd", json_integer(dl->model_n_embd(w->model)));
        json_object_set_new(out, "n_head", json_integer(dl->model_n_head(w->model)));
        json_object_set_new(out, "n_head_kv", json_integer(dl->model_n_head_kv(w->model)));
        json_object_set_new(out, "n_ctx_train", json_integer(dl->model_n_ctx_train(w->model)));
        json_object_set_new(out, "desc", json_string(desc));
        json_object_set_new(out, "size", json_integer((json_int_t)dl->model_size(w->model)));
        json_object_set_new(out, "n_params",
                            json_integer((json_int_t)dl->model_n_params(w->model)));
    }
    json_object_set_new(out, "bos", json_integer(dl->vocab_bos(w->vocab)));
    json_object_set_new(out, "eos", json_integer(dl->vocab_eos(w->vocab)));
    json_object_set_new(out, "add_bos", json_boolean(dl->vocab_get_add_bos(w->vocab)));
    json_t *eog = json_array();
    for (int32_t t = 0; t < w->n_vocab; t++)
        if (dl->vocab_is_eog(w->vocab, t)) json_array_append_new(eog, json_integer(t));
    json_object_set_new(out, "eog", eog);
    json_object_set_new(out, "vocab_only", json_boolean(vocab_only));
    if (w->ctx) {
        json_object_set_new(out, "n_ctx", json_integer(w->n_ctx));
        json_object_set_new(out, "n_batch", json_integer(w->n_batch));
        json_object_set_new(out, "n_ubatch", json_integer(dl->n_ubatch(w->ctx)));
        json_object_set_new(out, "threads", json_integer(threads));
        json_object_set_new(out, "emulated", json_boolean(emulated));
        json_object_set_new(out, "flash_attn", json_string(FLASH[fa]));
        json_object_set_new(out, "type_k", json_string(CACHE_TYPES[tk]));
        json_object_set_new(out, "type_v", json_string(CACHE_TYPES[tv]));
        json_object_set_new(out, "n_gpu_layers", json_integer(ngl));
    }
    return 0;
}

static int cb_tokenize(void *ud, const char *text, size_t len, bool special, int32_t **ids, int *n,
                       tg_err *e)
{
    worker *w = ud;
    if (need_model(w, e)) return -1;
    return llama_dl_tokenize(w->dl, w->vocab, text, len, true, special, ids, n, e);
}

static int cb_detokenize(void *ud, const int32_t *ids, int n, bool special, char **text,
                         size_t *len, tg_err *e)
{
    worker *w = ud;
    if (need_model(w, e)) return -1;
    return llama_dl_detokenize(w->dl, w->vocab, ids, n, false, special, text, len, e);
}

/* Decodes n tokens starting at position pos, logits for the last one only.
 * Returns 0, or -1 with e (llama_decode's status and llama.cpp's log). */
static int decode_tokens(worker *w, struct llama_context *ctx, const int32_t *tok, int n, int pos,
                         tg_err *e)
{
    assert(n >= 1 && n <= w->n_batch);
    struct llama_batch *b = &w->batch;
    for (int i = 0; i < n; i++) {
        b->token[i] = tok[i];
        b->pos[i] = pos + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = i == n - 1;
    }
    b->n_tokens = n;
    llama_dl_log_reset(w->dl);
    int32_t rc = w->dl->decode(ctx, *b);
    if (rc != 0) {
        const char *why = llama_dl_log_errors(w->dl);
        return tg_errf(e, "llama_decode returned %d for %d tokens at position %d%s%s", rc, n, pos,
                       *why ? ": " : "", why);
    }
    return 0;
}

/* The context for a decode with dumps: made once, with the eval callback
 * (a separate context, so that decodes without dumps run exactly the
 * graph they run without tg-llama's callback). Returns 0 or -1 with e. */
static int need_dump_ctx(worker *w, tg_err *e)
{
    if (w->dctx) return 0;
    llama_dl *dl = w->dl;
    int n_layer = dl->model_n_layer(w->model);
    dump_state *d = calloc(1, sizeof *d);
    if (!d) return tg_errf(e, "dump: out of memory");
    d->dl = dl;
    d->n_layer = n_layer;
    d->x = calloc((size_t)n_layer * ST_COUNT, sizeof *d->x);
    d->n = calloc((size_t)n_layer * ST_COUNT, sizeof *d->n);
    d->cap = calloc((size_t)n_layer * ST_COUNT, sizeof *d->cap);
    if (!d->x || !d->n || !d->cap) {
        dump_state_free(d);
        return tg_errf(e, "dump: out of memory");
    }
    struct llama_context_params cp = w->cparams;
    cp.cb_eval = dump_eval_cb;
    cp.cb_eval_user_data = d;
    llama_dl_log_reset(dl);
    w->dctx = dl->init_from_model(w->model, cp);
    if (!w->dctx) {
        dump_state_free(d);
        const char *why = llama_dl_log_errors(dl);
        return tg_errf(e, "dump: llama.cpp cannot create the dump context: %s",
                       *why ? why : "(llama.cpp logged no error)");
    }
    w->dump = d;
    return 0;
}

/* Writes the captured stages of one step (layer order, stage order). */
static int write_dumps(worker *w, proto_conn *c, const proto_decode_req *r, int step, tg_err *e)
{
    dump_state *d = w->dump;
    for (int l = 0; l < d->n_layer; l++)
        for (int st = 0; st < ST_COUNT; st++) {
            int i = l * ST_COUNT + st;
            if (d->n[i] && proto_dump(c, r, step, l, STAGE_NAME[st], d->x[i], d->n[i], e)) return -1;
            d->n[i] = 0;
        }
    if (d->skipped)
        fprintf(stderr, "tg-llama: step %d: %d tensors not dumped (not contiguous f32)\n", step,
                d->skipped);
    d->skipped = 0;
    return 0;
}

static int cb_decode(void *ud, const proto_decode_req *r, proto_conn *c, proto_done *done,
                     tg_err *e)
{
    worker *w = ud;
    if (need_model(w, e)) return -1;
    if (!w->ctx) return tg_errf(e, "the model was loaded vocab_only: load it again without it");
    if (proto_check_ids(r->prompt, r->n_prompt, w->n_vocab, "prompt", e)) return -1;
    if (r->force && proto_check_ids(r->force, r->n_force, w->n_vocab, "force", e)) return -1;
    long long need = (long long)r->n_prompt + r->steps - 1;
    if (need > w->n_ctx)
        return tg_errf(e, "prompt (%d ids) + steps (%d) - 1 = %lld positions exceed the context "
                          "(n_ctx %d); load with a larger n_ctx",
                       r->n_prompt, r->steps, need, w->n_ctx);
    llama_dl *dl = w->dl;
    struct llama_context *ctx = w->ctx;
    if (r->n_dump_steps) {
        if (need_dump_ctx(w, e)) return -1;
        ctx = w->dctx;
    }
    dl->memory_clear(dl->get_memory(ctx), true);
    int decode_calls = 0;

    /* prefill, in batches of at most n_batch; step 0's dumps come from the
     * last batch (the one whose last token yields step 0's logits) */
    double t0 = tg_now();
    for (int at = 0; at < r->n_prompt; at += w->n_batch) {
        int n = r->n_prompt - at < w->n_batch ? r->n_prompt - at : w->n_batch;
        if (w->dump) w->dump->active = at + n == r->n_prompt && proto_wants_dump(r, 0);
        if (decode_tokens(w, ctx, r->prompt + at, n, at, e)) return tg_err_prefix(e, "prefill");
        decode_calls++;
    }
    dl->synchronize(ctx);
    done->ms_prefill = (tg_now() - t0) * 1e3;

    /* one token per step */
    double t_dec = 0;
    int pos = r->n_prompt;
    for (int step = 0; step < r->steps; step++) {
        const float *logits = dl->get_logits_ith(ctx, -1);
        if (!logits) return tg_errf(e, "step %d: llama_get_logits_ith returned NULL", step);
        if (proto_wants_dump(r, step) &&
            (write_dumps(w, c, r, step, e) ||
             proto_dump(c, r, step, -1, "logits", logits, (size_t)w->n_vocab, e)))
            return -1;
        int32_t next = proto_step(c, r, step, logits, w->n_vocab);
        if (step == r->steps - 1) break;
        if (w->dump) w->dump->active = proto_wants_dump(r, step + 1);
        double t1 = tg_now();
        if (decode_tokens(w, ctx, &next, 1, pos, e)) return tg_err_prefix(e, "step %d", step + 1);
        dl->synchronize(ctx);
        t_dec += tg_now() - t1;
        decode_calls++;
        pos++;
    }
    if (w->dump) w->dump->active = 0;
    done->ms_decode = t_dec * 1e3;
    done->counters = json_pack("{s:i,s:i,s:i}", "prompt_tokens", r->n_prompt, "steps", r->steps,
                               "decode_calls", decode_calls);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tg-llama [--lib PATH/libllama.so]\n"
               "  Serves arm protocol v1 on stdin/stdout over a llama.cpp build's libllama,\n"
               "  opened with dlopen; TG_LLAMA_LIB gives the library when --lib is absent.\n");
}

int main(int argc, char **argv)
{
    worker w = {0};
    w.lib_path = getenv("TG_LLAMA_LIB");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--lib") == 0 && i + 1 < argc) {
            w.lib_path = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "tg-llama: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    /* the answers go to a private descriptor: llama.cpp and ggml print to
     * stdout (ggml's abort handler runs gdb, whose backtrace lands on fd 1)
     * and must not corrupt the protocol stream */
    tg_err pe;
    FILE *out = proto_private_out("tg-llama", &pe);
    if (!out) {
        fprintf(stderr, "%s\n", pe.msg);
        return 1;
    }
    if (!w.lib_path || !*w.lib_path)
        tg_errf(&w.lib_err, "no libllama given: start tg-llama with --lib PATH/libllama.so or "
                            "set TG_LLAMA_LIB");
    else if (llama_dl_open(w.lib_path, &w.dl, &w.lib_err) != 0)
        fprintf(stderr, "tg-llama: %s\n", w.lib_err.msg);

    proto_ops ops = {.ud = &w,
                     .hello = cb_hello,
                     .load = cb_load,
                     .tokenize = cb_tokenize,
                     .detokenize = cb_detokenize,
                     .decode = cb_decode};
    int rc = proto_serve(stdin, out, &ops);
    if (w.dl) {
        worker_unload(&w);
        llama_dl_free(w.dl);
    }
    fclose(out);
    return rc == 0 ? 0 : 1;
}
