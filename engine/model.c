/*
 * model.c: loading a Qwen3 / Llama GGUF into weight views over the mapping
 * (see model.h), and the names of the dump stages. Sessions are in
 * session.c, the forward passes in the tiers (tier.h); nothing here calls
 * either.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

static const char *const stage_names[TG_STAGE_COUNT] = {
    "attn_norm", "q", "k", "v", "attn_out", "ffn_norm", "ffn_out", "residual", "logits",
};

const char *tg_stage_name(int stage)
{
    return tg_name_at(stage_names, TG_STAGE_COUNT, stage);
}

int tg_stage_parse(const char *s)
{
    return tg_name_index(stage_names, TG_STAGE_COUNT, s);
}

/* --- hyperparameters --------------------------------------------------- */

/* Reads "<arch>.<key>" as a positive int into *out. When dflt >= 0 an absent
 * key gives dflt; otherwise it is an error. Returns 0 or -1 with e. */
static int get_int(const gguf *g, const char *arch, const char *key, int dflt, int *out, tg_err *e)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (gguf_find_key(g, full) < 0) {
        if (dflt >= 0) {
            *out = dflt;
            return 0;
        }
        return tg_errf(e, "%s: metadata key '%s' is missing (expected a positive integer)",
                       gguf_path(g), full);
    }
    int64_t v;
    if (gguf_get_i64(g, full, &v, NULL) != 0 || v <= 0 || v > (1 << 30))
        return tg_errf(e, "%s: metadata key '%s' must be an integer in 1..2^30", gguf_path(g), full);
    *out = (int)v;
    return 0;
}

static int get_float(const gguf *g, const char *arch, const char *key, float dflt, int required,
                     float *out, tg_err *e)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (gguf_find_key(g, full) < 0) {
        if (!required) {
            *out = dflt;
            return 0;
        }
        return tg_errf(e, "%s: metadata key '%s' is missing (expected an f32)", gguf_path(g), full);
    }
    if (gguf_get_f32(g, full, out, NULL) != 0 || !(*out > 0.0f))
        return tg_errf(e, "%s: metadata key '%s' must be a positive f32", gguf_path(g), full);
    return 0;
}

static int read_hparams(const gguf *g, tg_hparams *hp, tg_err *e)
{
    memset(hp, 0, sizeof *hp);
    gguf_str s;
    if (gguf_get_str(g, "general.architecture", &s, NULL) != 0)
        return tg_errf(e, "%s: metadata key 'general.architecture' is missing or not a string",
                       gguf_path(g));
    if (s.n == 5 && memcmp(s.p, "qwen3", 5) == 0) {
        hp->arch = TG_ARCH_QWEN3;
        hp->qk_norm = 1;
        hp->rope_neox = 1;
    } else if (s.n == 5 && memcmp(s.p, "llama", 5) == 0) {
        hp->arch = TG_ARCH_LLAMA;
        hp->qk_norm = 0;
        hp->rope_neox = 0;
    } else {
        return tg_errf(e, "%s: general.architecture is '%.*s', expected 'qwen3' or 'llama'",
                       gguf_path(g), (int)(s.n > 64 ? 64 : s.n), s.p);
    }
    memcpy(hp->arch_name, s.p, s.n);
    const char *a = hp->arch_name;

    if (get_int(g, a, "context_length", 4096, &hp->n_ctx_train, e) ||
        get_int(g, a, "embedding_length", -1, &hp->n_embd, e) ||
        get_int(g, a, "block_count", -1, &hp->n_layer, e) ||
        get_int(g, a, "feed_forward_length", -1, &hp->n_ff, e) ||
        get_int(g, a, "attention.head_count", -1, &hp->n_head, e) ||
        get_int(g, a, "attention.head_count_kv", hp->n_head, &hp->n_head_kv, e))
        return -1;
    if (hp->n_head_kv > hp->n_head || hp->n_head % hp->n_head_kv != 0)
        return tg_errf(e, "%s: %s.attention.head_count_kv = %d must divide head_count = %d",
                       gguf_path(g), a, hp->n_head_kv, hp->n_head);
    int dflt_hd = hp->n_embd % hp->n_head == 0 ? hp->n_embd / hp->n_head : -1;
    if (get_int(g, a, "attention.key_length", dflt_hd, &hp->head_dim, e))
        return -1;
    int vlen;
    if (get_int(g, a, "attention.value_length", hp->head_dim, &vlen, e))
        return -1;
    if (vlen != hp->head_dim)
        return tg_errf(e, "%s: %s.attention.value_length = %d, expected key_length = %d",
                       gguf_path(g), a, vlen, hp->head_dim);
    if (hp->head_dim % 2 != 0)
        return tg_errf(e, "%s: head dimension %d must be even (rope pairs)", gguf_path(g), hp->head_dim);
    int rope_dims;
    if (get_int(g, a, "rope.dimension_count", hp->head_dim, &rope_dims, e))
        return -1;
    if (rope_dims != hp->head_dim)
        return tg_errf(e, "%s: %s.rope.dimension_count = %d, expected the head dimension %d "
                       "(partial rope is not supported)", gguf_path(g), a, rope_dims, hp->head_dim);
    if (get_float(g, a, "rope.freq_base", 10000.0f, 0, &hp->rope_base, e) ||
        get_float(g, a, "attention.layer_norm_rms_epsilon", 0, 1, &hp->eps, e))
        return -1;
    char full[128];
    snprintf(full, sizeof full, "%s.rope.scaling.type", a);
    if (gguf_find_key(g, full) >= 0) {
        gguf_str st;
        if (gguf_get_str(g, full, &st, NULL) != 0 || !(st.n == 4 && memcmp(st.p, "none", 4) == 0))
            return tg_errf(e, "%s: %s is set; only unscaled rope ('none') is supported", gguf_path(g), full);
    }
    snprintf(full, sizeof full, "%s.rope.freq_scale", a);
    if (gguf_find_key(g, full) >= 0) {
        float fs;
        if (gguf_get_f32(g, full, &fs, NULL) != 0 || fs != 1.0f)
            return tg_errf(e, "%s: %s must be 1 (rope frequency scaling is not supported)", gguf_path(g), full);
    }
    uint32_t ft;
    hp->file_type = gguf_get_u32(g, "general.file_type", &ft, NULL) == 0 ? (int)ft : -1;
    return 0;
}

/* --- tensors ----------------------------------------------------------- */

/* Finds `name` and checks it is a matrix of rows x cols (cols == ne[0]) of a
 * type we can compute with, or (rows == 0) an f32 vector of cols. Returns 0
 * and *w, or -1 with e naming the tensor and the expectation. When optional
 * and absent, returns 1 and leaves *w zeroed. */
static int get_weight(const gguf *g, const char *name, int64_t cols, int64_t rows, int optional,
                      tg_weight *w, tg_err *e)
{
    memset(w, 0, sizeof *w);
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        if (optional)
            return 1;
        if (rows)
            return tg_errf(e, "%s: tensor '%s' is missing (expected [%lld, %lld])", gguf_path(g), name,
                           (long long)cols, (long long)rows);
        return tg_errf(e, "%s: tensor '%s' is missing (expected [%lld] f32)", gguf_path(g), name,
                       (long long)cols);
    }
    if (rows == 0) {
        if (t->n_dims != 1 || (int64_t)t->ne[0] != cols)
            return tg_errf(e, "%s: tensor '%s' has shape [%llu, %llu], expected [%lld]", gguf_path(g), name,
                           (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols);
        if (t->type != TG_TYPE_F32)
            return tg_errf(e, "%s: tensor '%s' has type %s, expected f32", gguf_path(g), name,
                           tg_type_name(t->type));
    } else {
        if (t->n_dims != 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
            return tg_errf(e, "%s: tensor '%s' has shape [%llu, %llu] (%u dims), expected [%lld, %lld]",
                           gguf_path(g), name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                           t->n_dims, (long long)cols, (long long)rows);
        const tg_type_traits *tr = tg_traits(t->type);
        if (!tr || !tr->to_float || !tr->vec_dot || t->type == TG_TYPE_Q8_K || t->type == TG_TYPE_Q8_1)
            return tg_errf(e, "%s: tensor '%s' has type %s (%u), expected one of f32, f16, bf16, q4_0, "
                           "q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K", gguf_path(g), name, tg_type_name(t->type), t->type);
    }
    size_t rs = tg_row_size(t->type, cols);
    if (rs == 0)
        return tg_errf(e, "%s: tensor '%s': a row of %lld values is not a whole number of %s blocks",
                       gguf_path(g), name, (long long)cols, tg_type_name(t->type));
    int64_t nrows = rows ? rows : 1;
    if (t->nbytes < rs * (uint64_t)nrows)
        return tg_errf(e, "%s: tensor '%s' holds %llu bytes, expected %llu", gguf_path(g), name,
                       (unsigned long long)t->nbytes, (unsigned long long)(rs * (uint64_t)nrows));
    w->data = t->data;
    w->type = t->type;
    w->cols = cols;
    w->rows = nrows;
    w->row_size = rs;
    w->name = t->name;
    return 0;
}

int tg_model_from_gguf(tg_model **out, gguf *g, tg_err *e)
{
    *out = NULL;
    tg_model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(g);
        return tg_errf(e, "out of memory");
    }
    m->g = g;
    tg_hparams *hp = &m->hp;
    if (read_hparams(g, hp, e) != 0)
        goto fail;

    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        tg_errf(e, "%s: tensor 'token_embd.weight' is missing", gguf_path(g));
        goto fail;
    }
    if (te->n_dims != 2 || te->ne[1] == 0 || te->ne[1] > INT32_MAX) {
        tg_errf(e, "%s: tensor 'token_embd.weight' must be 2-D [n_embd, n_vocab]", gguf_path(g));
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];
    enum gguf_vtype et;
    uint64_t ntok;
    if (gguf_find_key(g, "tokenizer.ggml.tokens") >= 0 &&
        gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &ntok, NULL) == 0 && ntok != (uint64_t)hp->n_vocab) {
        tg_errf(e, "%s: tokenizer.ggml.tokens has %llu entries but token_embd.weight has %d rows",
                gguf_path(g), (unsigned long long)ntok, hp->n_vocab);
        goto fail;
    }

    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim,
                  KV = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, V = hp->n_vocab;
    if (get_weight(g, "token_embd.weight", E, V, 0, &m->token_embd, e) ||
        get_weight(g, "output_norm.weight", E, 0, 0, &m->output_norm, e))
        goto fail;
    int r = get_weight(g, "output.weight", E, V, 1, &m->output, e);
    if (r < 0)
        goto fail;
    hp->tied = r == 1;
    if (hp->tied)
        m->output = m->token_embd;

    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        tg_errf(e, "out of memory");
        goto fail;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        tg_layer *L = &m->layers[il];
        char n[96];
#define W(field, suffix, cols, rows)                                                   \
        snprintf(n, sizeof n, "blk.%d.%s.weight", il, suffix);                         \
        if (get_weight(g, n, cols, rows, 0, &L->field, e) != 0)                         \
            goto fail;
        W(attn_norm, "attn_norm", E, 0)
        W(wq, "attn_q", E, Q)
        W(wk, "attn_k", E, KV)
        W(wv, "attn_v", E, KV)
        W(wo, "attn_output", Q, E)
        W(ffn_norm, "ffn_norm", E, 0)
        W(gate, "ffn_gate", E, F)
        W(up, "ffn_up", E, F)
        W(down, "ffn_down", F, E)
        if (hp->qk_norm) {
            W(q_norm, "attn_q_norm", hp->head_dim, 0)
            W(k_norm, "attn_k_norm", hp->head_dim, 0)
        }
#undef W
    }
    *out = m;
    return 0;
fail:
    tg_model_free(m);
    return -1;
}

int tg_model_load(tg_model **out, const char *path, tg_err *e)
{
    *out = NULL;
    gguf *g;
    if (gguf_open(&g, path, e) != 0)
        return -1;
    return tg_model_from_gguf(out, g, e);
}

void tg_model_free(tg_model *m)
{
    if (!m)
        return;
    free(m->layers);
    gguf_close(m->g);
    free(m);
}
