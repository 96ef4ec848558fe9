/*
 * llama_dl.h: one llama.cpp build, loaded at run time with dlopen.
 *
 * tokgate never links llama.cpp. A llama_dl opens any libllama.so (the
 * prebuilt x86-64 CPU build, a CUDA or HIP build, an aarch64 build under
 * qemu-user) with RTLD_LOCAL, resolves the llama.h functions we use into the
 * function pointers below, checks that the library speaks the llama.h this
 * file was compiled against, and loads that build's ggml backends (the
 * libggml-*.so files beside the library) with
 * ggml_backend_load_all_from_path().
 *
 * The pointers carry llama.h's own types: include this header where
 * llama.h and the ggml headers are on the include path (the Makefile adds
 * them for oracles/llama/ and tests/). Fields are named after the llama.h
 * function without its "llama_" prefix (dl->tokenize is llama_tokenize),
 * except llama_free, which is dl->free_context; ggml functions keep their
 * "ggml_" prefix. A field marked "optional" may be NULL.
 *
 * llama.cpp's log goes to stderr (or nowhere, see llama_dl_set_log_echo);
 * its ERROR lines are also captured so that a failure can be reported with
 * llama.cpp's own words (llama_dl_log_errors).
 *
 * One llama_dl per process is the intended use: llama.cpp keeps global
 * state (backend registry, log callback), and loading the same path twice
 * yields the same library.
 */
#ifndef TG_LLAMA_DL_H
#define TG_LLAMA_DL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_context; /* llama.h names it in a prototype before declaring it */

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include "util.h"

typedef struct llama_dl_log llama_dl_log; /* private: captured log lines */

typedef struct llama_dl {
    void *handle;          /* dlopen handle */
    char path[4096];       /* the library as given */
    char dir[4096];        /* its folder (symlinks resolved): backends load from here */
    char sha256[65];       /* sha256 of the library file (symlinks followed) */
    llama_dl_log *log;     /* owned */

    /* llama.h: setup and information */
    struct llama_model_params (*model_default_params)(void);
    struct llama_context_params (*context_default_params)(void);
    void (*backend_init)(void);
    void (*backend_free)(void);
    void (*log_set)(ggml_log_callback cb, void *user_data);
    const char *(*print_system_info)(void);
    const char *(*version)(void);                 /* optional (newer builds) */
    size_t (*max_devices)(void);
    bool (*supports_gpu_offload)(void);

    /* model */
    struct llama_model *(*model_load_from_file)(const char *path, struct llama_model_params p);
    void (*model_free)(struct llama_model *m);
    const struct llama_vocab *(*model_get_vocab)(const struct llama_model *m);
    int32_t (*model_n_ctx_train)(const struct llama_model *m);
    int32_t (*model_n_embd)(const struct llama_model *m);
    int32_t (*model_n_layer)(const struct llama_model *m);
    int32_t (*model_n_head)(const struct llama_model *m);
    int32_t (*model_n_head_kv)(const struct llama_model *m);
    int32_t (*model_desc)(const struct llama_model *m, char *buf, size_t n);
    uint64_t (*model_size)(const struct llama_model *m);
    uint64_t (*model_n_params)(const struct llama_model *m);
    int32_t (*model_meta_val_str)(const struct llama_model *m, const char *key, char *buf, size_t n);

    /* vocabulary */
    int32_t (*vocab_n_tokens)(const struct llama_vocab *v);
    enum llama_vocab_type (*vocab_type)(const struct llama_vocab *v);
    llama_token (*vocab_bos)(const struct llama_vocab *v);
    llama_token (*vocab_eos)(const struct llama_vocab *v);
    bool (*vocab_get_add_bos)(const struct llama_vocab *v);
    bool (*vocab_get_add_eos)(const struct llama_vocab *v);
    bool (*vocab_is_eog)(const struct llama_vocab *v, llama_token t);
    const char *(*vocab_get_text)(const struct llama_vocab *v, llama_token t);
    enum llama_token_attr (*vocab_get_attr)(const struct llama_vocab *v, llama_token t);
    int32_t (*tokenize)(const struct llama_vocab *v, const char *text, int32_t text_len,
                        llama_token *tokens, int32_t n_tokens_max, bool add_special,
                        bool parse_special);
    int32_t (*detokenize)(const struct llama_vocab *v, const llama_token *tokens,
                          int32_t n_tokens, char *text, int32_t text_len_max,
                          bool remove_special, bool unparse_special);
    int32_t (*token_to_piece)(const struct llama_vocab *v, llama_token t, char *buf,
                              int32_t length, int32_t lstrip, bool special);

    /* context, memory, decoding */
    struct llama_context *(*init_from_model)(struct llama_model *m, struct llama_context_params p);
    void (*free_context)(struct llama_context *c);                 /* llama_free */
    uint32_t (*n_ctx)(const struct llama_context *c);
    uint32_t (*n_batch)(const struct llama_context *c);
    uint32_t (*n_ubatch)(const struct llama_context *c);
    llama_memory_t (*get_memory)(const struct llama_context *c);
    void (*memory_clear)(llama_memory_t mem, bool data);
    struct llama_batch (*batch_init)(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
    void (*batch_free)(struct llama_batch b);
    int32_t (*decode)(struct llama_context *c, struct llama_batch b);
    void (*synchronize)(struct llama_context *c);
    float *(*get_logits_ith)(struct llama_context *c, int32_t i);
    void (*set_n_threads)(struct llama_context *c, int32_t n_threads, int32_t n_threads_batch);

    /* ggml (resolved through the library's dependencies) */
    void (*ggml_backend_load_all_from_path)(const char *dir);
    size_t (*ggml_backend_dev_count)(void);
    ggml_backend_dev_t (*ggml_backend_dev_get)(size_t i);
    const char *(*ggml_backend_dev_name)(ggml_backend_dev_t d);
    const char *(*ggml_backend_dev_description)(ggml_backend_dev_t d);
    enum ggml_backend_dev_type (*ggml_backend_dev_type)(ggml_backend_dev_t d);
    void (*ggml_backend_tensor_get)(const struct ggml_tensor *t, void *data, size_t offset,
                                    size_t size);
    const char *(*ggml_version)(void);            /* optional */
    const char *(*ggml_commit)(void);             /* optional */
} llama_dl;

/* Opens the libllama at lib_path, resolves and checks its API, installs the
 * log capture, calls llama_backend_init() and loads the build's ggml
 * backends from the library's folder. Returns 0 and *out (owned by the
 * caller, release with llama_dl_free), or -1 with e naming the library and
 * what is wrong: the dlopen error, the first missing symbol, a defaults
 * struct that does not match llama.h, or no ggml device found. Never
 * aborts on a bad library (a library whose constructors crash is beyond
 * help: run tg-llama as a separate process, as the harness does). */
int llama_dl_open(const char *lib_path, llama_dl **out, tg_err *e);

/* Calls llama_backend_free() and closes the library. The caller must have
 * freed every model and context first. llama_dl_free(NULL) is a no-op. */
void llama_dl_free(llama_dl *dl);

/* Whether llama.cpp's log lines are written to stderr (default: yes, all
 * levels but DEBUG). Capture of ERROR lines happens either way. */
void llama_dl_set_log_echo(llama_dl *dl, bool echo);

/* Forgets the captured ERROR lines. */
void llama_dl_log_reset(llama_dl *dl);

/* The ERROR-level lines llama.cpp logged since the last reset, newlines
 * replaced by "; ", at most about 2 KB (the latest kept), or "" when none.
 * The pointer stays valid until the next call into the llama_dl. */
const char *llama_dl_log_errors(llama_dl *dl);

/* Loads a model (params NULL: the library's defaults; vocab_only as given
 * otherwise). Returns 0 and *out (free with dl->model_free), or -1 with e
 * naming the path and llama.cpp's own error lines. */
int llama_dl_load_model(llama_dl *dl, const char *path, const struct llama_model_params *params,
                        struct llama_model **out, tg_err *e);

/* Tokenizes len bytes of text (need not be NUL-terminated). add_special:
 * add BOS/EOS where the vocab says so (llama.cpp's default is true);
 * parse_special: match special/control tokens in the text. Returns 0 with
 * *ids (malloc'ed, caller frees) and *n, or -1 with e. */
int llama_dl_tokenize(llama_dl *dl, const struct llama_vocab *v, const char *text, size_t len,
                      bool add_special, bool parse_special, int32_t **ids, int *n, tg_err *e);

/* Detokenizes n ids into *text (malloc'ed, NUL-terminated for convenience,
 * *len bytes, which may include invalid UTF-8 and NULs). remove_special:
 * drop BOS/EOS the vocab adds; unparse_special: render special tokens.
 * Every id must be in [0, n_vocab): -1 with e otherwise. */
int llama_dl_detokenize(llama_dl *dl, const struct llama_vocab *v, const int32_t *ids, int n,
                        bool remove_special, bool unparse_special, char **text, size_t *len,
                        tg_err *e);

#endif
