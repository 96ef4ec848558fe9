/*
 * llama_dl.c: dlopen a libllama.so, resolve the llama.h API into a table of
 * function pointers, check the library against the llama.h we were compiled
 * with, load its ggml backends, and capture llama.cpp's error log so that
 * failures can be reported in llama.cpp's words.
 *
 * API check. A missing symbol is refused by name. Structs passed by value
 * (llama_model_params, llama_context_params, llama_batch) cannot be sized
 * from outside the library, so we check instead that the library's default
 * values land where our llama.h puts them: a library whose struct layout
 * differs shows pointers that are not NULL, enum values out of range or
 * KV-cache types that are not F16 at our offsets.
 */
#include "llama/llama_dl.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LOG_CAP 2048

struct llama_dl_log {
    pthread_mutex_t mu;
    bool echo;                 /* forward to stderr */
    enum ggml_log_level last;  /* level of the last non-CONT line */
    char err[LOG_CAP];         /* captured ERROR text, NUL-terminated */
    size_t n;                  /* strlen(err) */
    char out[LOG_CAP];         /* copy handed out by llama_dl_log_errors */
};

/* Appends s to the capture, dropping the oldest bytes when full. */
static void log_append(llama_dl_log *l, const char *s, size_t k)
{
    if (k >= LOG_CAP) {
        s += k - (LOG_CAP - 1);
        k = LOG_CAP - 1;
    }
    if (l->n + k >= LOG_CAP) {
        size_t drop = l->n + k - (LOG_CAP - 1);
        memmove(l->err, l->err + drop, l->n - drop);
        l->n -= drop;
    }
    memcpy(l->err + l->n, s, k);
    l->n += k;
    l->err[l->n] = 0;
}

/* ggml_log_callback: echo to stderr, capture ERROR text (and its CONT
 * continuations) with newlines turned into "; ". */
static void log_cb(enum ggml_log_level level, const char *text, void *ud)
{
    llama_dl_log *l = ud;
    if (!text) return;
    pthread_mutex_lock(&l->mu);
    enum ggml_log_level eff = level == GGML_LOG_LEVEL_CONT ? l->last : level;
    if (level != GGML_LOG_LEVEL_CONT) l->last = level;
    if (l->echo && eff != GGML_LOG_LEVEL_DEBUG) fputs(text, stderr);
    if (eff == GGML_LOG_LEVEL_ERROR) {
        for (const char *p = text; *p;) {
            const char *nl = strchr(p, '\n');
            size_t k = nl ? (size_t)(nl - p) : strlen(p);
            log_append(l, p, k);
            if (!nl) break;
            if (l->n > 0) log_append(l, "; ", 2);
            p = nl + 1;
        }
    }
    pthread_mutex_unlock(&l->mu);
}

void llama_dl_set_log_echo(llama_dl *dl, bool echo)
{
    pthread_mutex_lock(&dl->log->mu);
    dl->log->echo = echo;
    pthread_mutex_unlock(&dl->log->mu);
}

void llama_dl_log_reset(llama_dl *dl)
{
    pthread_mutex_lock(&dl->log->mu);
    dl->log->n = 0;
    dl->log->err[0] = 0;
    pthread_mutex_unlock(&dl->log->mu);
}

const char *llama_dl_log_errors(llama_dl *dl)
{
    llama_dl_log *l = dl->log;
    pthread_mutex_lock(&l->mu);
    size_t n = l->n;
    /* trim the trailing separator */
    while (n > 0 && (l->err[n - 1] == ' ' || l->err[n - 1] == ';')) n--;
    memcpy(l->out, l->err, n);
    l->out[n] = 0;
    pthread_mutex_unlock(&l->mu);
    return l->out;
}

/* The symbols we resolve: name, where the pointer goes, required or not. */
typedef struct sym_spec {
    const char *name;
    size_t off;
    int required;
} sym_spec;

#define REQ(field, sym) {sym, offsetof(llama_dl, field), 1}
#define OPT(field, sym) {sym, offsetof(llama_dl, field), 0}

static const sym_spec SYMS[] = {
    REQ(model_default_params, "llama_model_default_params"),
    REQ(context_default_params, "llama_context_default_params"),
    REQ(backend_init, "llama_backend_init"),
    REQ(backend_free, "llama_backend_free"),
    REQ(log_set, "llama_log_set"),
    REQ(print_system_info, "llama_print_system_info"),
    OPT(version, "llama_version"),
    REQ(max_devices, "llama_max_devices"),
    REQ(supports_gpu_offload, "llama_supports_gpu_offload"),
    REQ(model_load_from_file, "llama_model_load_from_file"),
    REQ(model_free, "llama_model_free"),
    REQ(model_get_vocab, "llama_model_get_vocab"),
    REQ(model_n_ctx_train, "llama_model_n_ctx_train"),
    REQ(model_n_embd, "llama_model_n_embd"),
    REQ(model_n_layer, "llama_model_n_layer"),
    REQ(model_n_head, "llama_model_n_head"),
    REQ(model_n_head_kv, "llama_model_n_head_kv"),
    REQ(model_desc, "llama_model_desc"),
    REQ(model_size, "llama_model_size"),
    REQ(model_n_params, "llama_model_n_params"),
    REQ(model_meta_val_str, "llama_model_meta_val_str"),
    REQ(vocab_n_tokens, "llama_vocab_n_tokens"),
    REQ(vocab_type, "llama_vocab_type"),
    REQ(vocab_bos, "llama_vocab_bos"),
    REQ(vocab_eos, "llama_vocab_eos"),
    REQ(vocab_get_add_bos, "llama_vocab_get_add_bos"),
    REQ(vocab_get_add_eos, "llama_vocab_get_add_eos"),
    REQ(vocab_is_eog, "llama_vocab_is_eog"),
    REQ(vocab_get_text, "llama_vocab_get_text"),
    REQ(vocab_get_attr, "llama_vocab_get_attr"),
    REQ(tokenize, "llama_tokenize"),
    REQ(detokenize, "llama_detokenize"),
    REQ(token_to_piece, "llama_token_to_piece"),
    REQ(init_from_model, "llama_init_from_model"),
    REQ(free_context, "llama_free"),
    REQ(n_ctx, "llama_n_ctx"),
    REQ(n_batch, "llama_n_batch"),
    REQ(n_ubatch, "llama_n_ubatch"),
    REQ(get_memory, "llama_get_memory"),
    REQ(memory_clear, "llama_memory_clear"),
    REQ(batch_init, "llama_batch_init"),
    REQ(batch_free, "llama_batch_free"),
    REQ(decode, "llama_decode"),
    REQ(synchronize, "llama_synchronize"),
    REQ(get_logits_ith, "llama_get_logits_ith"),
    REQ(set_n_threads, "llama_set_n_threads"),
    REQ(ggml_backend_load_all_from_path, "ggml_backend_load_all_from_path"),
    REQ(ggml_backend_dev_count, "ggml_backend_dev_count"),
    REQ(ggml_backend_dev_get, "ggml_backend_dev_get"),
    REQ(ggml_backend_dev_name, "ggml_backend_dev_name"),
    REQ(ggml_backend_dev_description, "ggml_backend_dev_description"),
    REQ(ggml_backend_dev_type, "ggml_backend_dev_type"),
    REQ(ggml_backend_tensor_get, "ggml_backend_tensor_get"),
    OPT(ggml_version, "ggml_version"),
    OPT(ggml_commit, "ggml_commit"),
};

/* Checks the library's default structs against our llama.h layout.
 * Returns 0, or -1 with e naming the field that does not match. */
static int check_layout(llama_dl *dl, tg_err *e)
{
    struct llama_model_params mp = dl->model_default_params();
    if (mp.devices || mp.tensor_buft_overrides || mp.tensor_split || mp.progress_callback ||
        mp.progress_callback_user_data || mp.kv_overrides)
        return tg_errf(e, "llama_model_default_params(): a pointer field is not NULL at our offset");
    if ((int)mp.split_mode < 0 || (int)mp.split_mode > 3 || mp.main_gpu != 0 || mp.vocab_only ||
        mp.check_tensors || mp.no_alloc)
        return tg_errf(e, "llama_model_default_params(): split_mode %d / main_gpu %d / flags "
                          "out of range at our offsets",
                       (int)mp.split_mode, (int)mp.main_gpu);

    struct llama_context_params cp = dl->context_default_params();
    if (cp.n_seq_max != 1 || cp.n_ubatch == 0 || cp.n_batch < cp.n_ubatch)
        return tg_errf(e, "llama_context_default_params(): n_seq_max %u, n_batch %u, n_ubatch %u "
                          "(expected n_seq_max 1 and 0 < n_ubatch <= n_batch)",
                       cp.n_seq_max, cp.n_batch, cp.n_ubatch);
    if ((int)cp.flash_attn_type < -1 || (int)cp.flash_attn_type > 1)
        return tg_errf(e, "llama_context_default_params(): flash_attn_type %d out of range",
                       (int)cp.flash_attn_type);
    if (cp.type_k != GGML_TYPE_F16 || cp.type_v != GGML_TYPE_F16)
        return tg_errf(e, "llama_context_default_params(): type_k %d, type_v %d (expected F16 = %d)",
                       (int)cp.type_k, (int)cp.type_v, (int)GGML_TYPE_F16);
    if (cp.cb_eval || cp.cb_eval_user_data || cp.abort_callback || cp.abort_callback_data ||
        cp.samplers || cp.n_samplers || cp.ctx_other)
        return tg_errf(e, "llama_context_default_params(): a pointer field is not NULL at our offset");
    if (cp.embeddings || !cp.offload_kqv)
        return tg_errf(e, "llama_context_default_params(): embeddings/offload_kqv flags not at our "
                          "offsets");

    struct llama_batch b = dl->batch_init(4, 0, 1);
    int ok = b.n_tokens == 0 && b.token && !b.embd && b.pos && b.n_seq_id && b.seq_id && b.logits;
    dl->batch_free(b);
    if (!ok) return tg_errf(e, "llama_batch_init(): the batch's fields are not at our offsets");
    return 0;
}

int llama_dl_open(const char *lib_path, llama_dl **out, tg_err *e)
{
    *out = NULL;
    if (!lib_path || !*lib_path) return tg_errf(e, "libllama: no library path given");
    struct stat st;
    if (stat(lib_path, &st) != 0)
        return tg_errf(e, "libllama %s: %s", lib_path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return tg_errf(e, "libllama %s: not a regular file", lib_path);

    llama_dl *dl = calloc(1, sizeof *dl);
    llama_dl_log *log = calloc(1, sizeof *log);
    if (!dl || !log) {
        free(dl);
        free(log);
        return tg_errf(e, "libllama %s: out of memory", lib_path);
    }
    dl->log = log;
    pthread_mutex_init(&log->mu, NULL);
    log->echo = true;
    snprintf(dl->path, sizeof dl->path, "%s", lib_path);

    char real[PATH_MAX];
    if (!realpath(lib_path, real)) {
        tg_errf(e, "libllama %s: realpath: %s", lib_path, strerror(errno));
        goto fail;
    }
    char *slash = strrchr(real, '/');
    if (slash) *slash = 0;
    snprintf(dl->dir, sizeof dl->dir, "%s", slash ? real : ".");

    if (tg_sha256_file(lib_path, dl->sha256, e) != 0) goto fail;

    dlerror();
    dl->handle = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (!dl->handle) {
        const char *why = dlerror();
        tg_errf(e, "libllama %s: dlopen failed: %s", lib_path, why ? why : "unknown error");
        goto fail;
    }
    for (size_t i = 0; i < sizeof SYMS / sizeof SYMS[0]; i++) {
        dlerror();
        void *p = dlsym(dl->handle, SYMS[i].name);
        if (!p && SYMS[i].required) {
            tg_errf(e, "libllama %s: symbol %s not found (not a llama.cpp build with the llama.h "
                       "API tg-llama was compiled against)",
                    lib_path, SYMS[i].name);
            goto fail;
        }
        memcpy((char *)dl + SYMS[i].off, &p, sizeof p);
    }
    if (check_layout(dl, e) != 0) {
        tg_err_prefix(e, "libllama %s: API mismatch with our llama.h", lib_path);
        goto fail;
    }

    dl->log_set(log_cb, log);
    dl->backend_init();
    dl->ggml_backend_load_all_from_path(dl->dir);
    if (dl->ggml_backend_dev_count() == 0) {
        tg_errf(e, "libllama %s: no ggml backend device found (looked for libggml-*.so in %s)%s%s",
                lib_path, dl->dir, *llama_dl_log_errors(dl) ? ": " : "", llama_dl_log_errors(dl));
        dl->backend_free();
        goto fail;
    }
    *out = dl;
    return 0;

fail:
    if (dl->handle) {
        if (dl->log_set) dl->log_set(NULL, NULL);
        dlclose(dl->handle);
    }
    pthread_mutex_destroy(&log->mu);
    free(log);
    free(dl);
    return -1;
}

void llama_dl_free(llama_dl *dl)
{
    if (!dl) return;
    dl->backend_free();
    dl->log_set(NULL, NULL);
    dlclose(dl->handle);
    pthread_mutex_destroy(&dl->log->mu);
    free(dl->log);
    free(dl);
}

int llama_dl_load_model(llama_dl *dl, const char *path, const struct llama_model_params *params,
                        struct llama_model **out, tg_err *e)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return tg_errf(e, "model %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return tg_errf(e, "model %s: not a regular file", path);
    struct llama_model_params p = params ? *params : dl->model_default_params();
    llama_dl_log_reset(dl);
    struct llama_model *m = dl->model_load_from_file(path, p);
    if (!m) {
        const char *why = llama_dl_log_errors(dl);
        return tg_errf(e, "model %s: llama.cpp cannot load it: %s", path,
                       *why ? why : "(llama.cpp logged no error)");
    }
    *out = m;
    return 0;
}

int llama_dl_tokenize(llama_dl *dl, const struct llama_vocab *v, const char *text, size_t len,
                      bool add_special, bool parse_special, int32_t **ids, int *n, tg_err *e)
{
    *ids = NULL;
    *n = 0;
    if (len > (size_t)INT32_MAX / 2)
        return tg_errf(e, "tokenize: text of %zu bytes is too long (at most %d)", len,
                       INT32_MAX / 2);
    /* At most one token per byte, plus BOS/EOS. */
    int32_t cap = (int32_t)len + 4;
    int32_t *buf = malloc(sizeof *buf * (size_t)cap);
    if (!buf) return tg_errf(e, "tokenize: out of memory for %d ids", cap);
    int32_t k = dl->tokenize(v, text, (int32_t)len, buf, cap, add_special, parse_special);
    if (k < 0 && k != INT32_MIN) {
        cap = -k;
        int32_t *nb = realloc(buf, sizeof *buf * (size_t)cap);
        if (!nb) {
            free(buf);
            return tg_errf(e, "tokenize: out of memory for %d ids", cap);
        }
        buf = nb;
        k = dl->tokenize(v, text, (int32_t)len, buf, cap, add_special, parse_special);
    }
    if (k < 0) {
        free(buf);
        return tg_errf(e, "tokenize: llama_tokenize failed (returned %d)", k);
    }
    *ids = buf;
    *n = k;
    return 0;
}

int llama_dl_detokenize(llama_dl *dl, const struct llama_vocab *v, const int32_t *ids, int n,
                        bool remove_special, bool unparse_special, char **text, size_t *len,
                        tg_err *e)
{
    *text = NULL;
    *len = 0;
    int32_t nv = dl->vocab_n_tokens(v);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            return tg_errf(e, "detokenize: ids[%d] = %d is not a token id (expected 0..%d)", i,
                           ids[i], nv - 1);
    int32_t cap = 64 + 16 * n;
    char *buf = malloc((size_t)cap + 1);
    if (!buf) return tg_errf(e, "detokenize: out of memory");
    int32_t k = dl->detokenize(v, ids, n, buf, cap, remove_special, unparse_special);
    if (k < 0 && k != INT32_MIN) {
        cap = -k;
        char *nb = realloc(buf, (size_t)cap + 1);
        if (!nb) {
            free(buf);
            return tg_errf(e, "detokenize: out of memory for %d bytes", cap);
        }
        buf = nb;
        k = dl->detokenize(v, ids, n, buf, cap, remove_special, unparse_special);
    }
    if (k < 0) {
        free(buf);
        return tg_errf(e, "detokenize: llama_detokenize failed (returned %d)", k);
    }
    buf[k] = 0;
    *text = buf;
    *len = (size_t)k;
    return 0;
}
