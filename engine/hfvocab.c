/*
 * hfvocab.c: HF tokenizer.json -> GGUF tokenizer metadata, the way
 * llama.cpp's converter writes it for Qwen3 (see hfvocab.h for the keys).
 *
 * The converter's facts this follows (convert_hf_to_gguf.py get_vocab_base,
 * gguf-py SpecialVocab): ids missing from the vocabulary become "[PAD{i}]"
 * of type UNUSED; an added token is CONTROL when it is marked special or
 * looks special ("<|...|>", "<｜...｜>", "<pad>", "<mask>", "<2mass>",
 * "[@BOS@]", "<unused...>"), USER_DEFINED otherwise (with U+2581 replaced by
 * a space); merges given as [a, b] pairs are joined as "a b" with spaces
 * inside a part written as U+0120; special ids come from
 * tokenizer_config.json (first added token with that content).
 */
#include "hfvocab.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Qwen2/Qwen3 split regex: the only pre-tokenizer this writer accepts,
 * since it writes tokenizer.ggml.pre "qwen2". */
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

static int has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static int has_suffix(const char *s, const char *p)
{
    size_t n = strlen(s), m = strlen(p);
    return n >= m && memcmp(s + n - m, p, m) == 0;
}

/* The converter's does_token_look_special(). */
static int looks_special(const char *t)
{
    if (!strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") ||
        !strcmp(t, "[@BOS@]"))
        return 1;
    if (has_prefix(t, "<|") && has_suffix(t, "|>")) return 1;
    if (has_prefix(t, "<\xef\xbd\x9c") && has_suffix(t, "\xef\xbd\x9c>")) return 1;
    if (has_prefix(t, "<unused") && has_suffix(t, ">")) return 1;
    return 0;
}

/* Copy of s with every U+2581 replaced by a space. Returns NULL on OOM. */
static char *replace_lower_one_eighth(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(n + 1), *q = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        if (i + 2 < n && (unsigned char)s[i] == 0xe2 && (unsigned char)s[i + 1] == 0x96 &&
            (unsigned char)s[i + 2] == 0x81) {
            *q++ = ' ';
            i += 3;
        } else {
            *q++ = s[i++];
        }
    }
    *q = 0;
    return o;
}

/* "a b" from a [a, b] pair, spaces inside a part as U+0120 (0xc4 0xa0).
 * Returns a malloc'ed string or NULL on OOM. */
static char *join_pair(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b);
    char *o = malloc(2 * n + 2), *q = o;
    if (!o) return NULL;
    for (int part = 0; part < 2; part++) {
        const char *s = part ? b : a;
        if (part) *q++ = ' ';
        for (; *s; s++) {
            if (*s == ' ') { *q++ = (char)0xc4; *q++ = (char)0xa0; }
            else *q++ = *s;
        }
    }
    *q = 0;
    return o;
}

/* Id of the first added token whose content is s, or -1. */
static int64_t added_id(json_t *added, const char *s)
{
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        json_t *id = json_object_get(a, "id");
        if (c && json_is_integer(id) && !strcmp(c, s)) return json_integer_value(id);
    }
    return -1;
}

/* Content string of tokenizer_config.json's "<typ>_token" entry (a string or
 * {"content": ...}), or NULL. */
static const char *config_token(json_t *cfg, const char *typ)
{
    char key[32];
    snprintf(key, sizeof key, "%s_token", typ);
    json_t *v = json_object_get(cfg, key);
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* Loads "tokenizer_config.json" from the folder of path, or NULL when absent.
 * Returns 0, or -1 with e when the file exists but is not valid JSON. */
static int load_config(const char *path, json_t **out, tg_err *e)
{
    *out = NULL;
    const char *slash = strrchr(path, '/');
    size_t dn = slash ? (size_t)(slash - path + 1) : 0;
    char *cp = malloc(dn + sizeof "tokenizer_config.json");
    if (!cp) return tg_errf(e, "%s: out of memory", path);
    memcpy(cp, path, dn);
    strcpy(cp + dn, "tokenizer_config.json");
    FILE *f = fopen(cp, "rb");
    if (!f) { free(cp); return 0; }
    fclose(f);
    json_error_t je;
    *out = json_load_file(cp, 0, &je);
    if (!*out) {
        tg_errf(e, "%s: line %d: %s (expected JSON)", cp, je.line, je.text);
        free(cp);
        return -1;
    }
    free(cp);
    return 0;
}

int tg_hfvocab_write(gguf_writer *w, const char *path, int64_t pad_to, tg_err *e)
{
    int rc = -1;
    json_error_t je;
    json_t *root = NULL, *cfg = NULL;
    char **tokens = NULL;
    int32_t *types = NULL;
    char **merges = NULL;
    int64_t n = 0;
    size_t n_merges = 0;

    root = json_load_file(path, 0, &je);
    if (!root) {
        tg_errf(e, "%s: line %d: %s (expected a tokenizer.json)", path, je.line, je.text);
        goto out;
    }
    if (load_config(path, &cfg, e)) goto out;

    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "BPE")) {
        tg_errf(e, "%s: model.type is %s, expected \"BPE\"", path, mtype ? mtype : "missing");
        goto out;
    }
    json_t *vocab = json_object_get(model, "vocab");
    json_t *jmerges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) { tg_errf(e, "%s: model.vocab: expected an object", path); goto out; }
    if (!json_is_array(jmerges)) { tg_errf(e, "%s: model.merges: expected an array", path); goto out; }
    if (added && !json_is_array(added)) { tg_errf(e, "%s: added_tokens: expected an array", path); goto out; }
    if (!added) {
        added = json_array();
        json_object_set_new(root, "added_tokens", added);
    }

    /* the pre-tokenizer must be the qwen2 split */
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (pre) {
        json_t *list = json_object_get(pre, "pretokenizers");
        json_t *split = NULL;
        if (json_is_array(list)) {
            size_t i;
            json_t *p;
            json_array_foreach(list, i, p) {
                const char *t = json_string_value(json_object_get(p, "type"));
                if (t && !strcmp(t, "Split")) { split = p; break; }
            }
        } else {
            split = pre;
        }
        const char *rx = json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
        if (!rx || strcmp(rx, QWEN2_REGEX)) {
            tg_errf(e, "%s: pre_tokenizer: expected a Split on the qwen2 regex %s, found %s", path,
                    QWEN2_REGEX, rx ? rx : "none");
            goto out;
        }
    }

    /* vocabulary size: highest id + 1, or pad_to */
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= (1 << 30)) {
            tg_errf(e, "%s: model.vocab[\"%s\"]: expected an id in [0, 2^30)", path, key);
            goto out;
        }
        if (json_integer_value(val) + 1 > n) n = json_integer_value(val) + 1;
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 30) ||
            !json_is_string(json_object_get(val, "content"))) {
            tg_errf(e, "%s: added_tokens[%zu]: expected an id in [0, 2^30) and a content string", path, i);
            goto out;
        }
        if (json_integer_value(id) + 1 > n) n = json_integer_value(id) + 1;
    }
    if (pad_to > 0) {
        if (pad_to < n) {
            tg_errf(e, "%s: pad_to %lld is below the vocabulary's %lld ids", path, (long long)pad_to,
                    (long long)n);
            goto out;
        }
        n = pad_to;
    }

    tokens = calloc((size_t)n, sizeof *tokens);
    types = calloc((size_t)n, sizeof *types);
    if (!tokens || !types) { tg_errf(e, "%s: out of memory for %lld tokens", path, (long long)n); goto out; }
    json_object_foreach(vocab, key, val) {
        int64_t id = json_integer_value(val);
        if (tokens[id]) { tg_errf(e, "%s: model.vocab: id %lld used twice", path, (long long)id); goto out; }
        if (!(tokens[id] = strdup(key))) { tg_errf(e, "%s: out of memory", path); goto out; }
        types[id] = TT_NORMAL;
    }
    json_array_foreach(added, i, val) {
        int64_t id = json_integer_value(json_object_get(val, "id"));
        const char *content = json_string_value(json_object_get(val, "content"));
        int special = json_is_true(json_object_get(val, "special"));
        free(tokens[id]);
        if (special || looks_special(content)) {
            tokens[id] = strdup(content);
            types[id] = TT_CONTROL;
        } else {
            tokens[id] = replace_lower_one_eighth(content);
            types[id] = TT_USER_DEFINED;
        }
        if (!tokens[id]) { tg_errf(e, "%s: out of memory", path); goto out; }
    }
    for (int64_t id = 0; id < n; id++) {
        if (tokens[id]) continue;
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%lld]", (long long)id);
        if (!(tokens[id] = strdup(buf))) { tg_errf(e, "%s: out of memory", path); goto out; }
        types[id] = TT_UNUSED;
    }

    n_merges = json_array_size(jmerges);
    merges = calloc(n_merges ? n_merges : 1, sizeof *merges);
    if (!merges) { tg_errf(e, "%s: out of memory", path); goto out; }
    json_array_foreach(jmerges, i, val) {
        if (json_is_string(val)) {
            merges[i] = strdup(json_string_value(val));
        } else if (json_is_array(val) && json_array_size(val) == 2 &&
                   json_is_string(json_array_get(val, 0)) && json_is_string(json_array_get(val, 1))) {
            merges[i] = join_pair(json_string_value(json_array_get(val, 0)),
                                  json_string_value(json_array_get(val, 1)));
        } else {
            tg_errf(e, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", path, i);
            goto out;
        }
        if (!merges[i]) { tg_errf(e, "%s: out of memory", path); goto out; }
    }

    /* special ids, as SpecialVocab finds them: tokenizer_config first */
    int64_t eos = -1, pad = -1, bos = -1;
    int add_bos = 0, has_add_eos = 0, add_eos = 0;
    const char *chat = NULL;
    if (cfg) {
        const char *s;
        if ((s = config_token(cfg, "eos"))) eos = added_id(added, s);
        if ((s = config_token(cfg, "pad"))) pad = added_id(added, s);
        if ((s = config_token(cfg, "bos"))) bos = added_id(added, s);
        json_t *ab = json_object_get(cfg, "add_bos_token");
        if (json_is_boolean(ab)) add_bos = json_is_true(ab);
        json_t *ae = json_object_get(cfg, "add_eos_token");
        if (json_is_boolean(ae)) has_add_eos = 1, add_eos = json_is_true(ae);
        chat = json_string_value(json_object_get(cfg, "chat_template"));
    } else {
        eos = added_id(added, "<|im_end|>");
        pad = added_id(added, "<|endoftext|>");
    }
    if (bos < 0) bos = added_id(added, "<|endoftext|>"); /* config.json's bos_token_id */

    int bad = 0;
    bad |= gguf_writer_str(w, "tokenizer.ggml.model", "gpt2");
    bad |= gguf_writer_str(w, "tokenizer.ggml.pre", "qwen2");
    bad |= gguf_writer_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens, (uint64_t)n);
    bad |= gguf_writer_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types, (uint64_t)n);
    bad |= gguf_writer_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges);
    if (eos >= 0 && eos < n) bad |= gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (pad >= 0 && pad < n) bad |= gguf_writer_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    if (bos >= 0 && bos < n) bad |= gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    bad |= gguf_writer_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (has_add_eos) bad |= gguf_writer_bool(w, "tokenizer.ggml.add_eos_token", add_eos);
    if (chat) bad |= gguf_writer_str(w, "tokenizer.chat_template", chat);
    if (bad) { tg_errf(e, "%s: adding the tokenizer keys to the GGUF writer failed", path); goto out; }
    rc = 0;

out:
    if (tokens)
        for (int64_t k = 0; k < n; k++) free(tokens[k]);
    free(tokens);
    free(types);
    if (merges)
        for (size_t k = 0; k < n_merges; k++) free(merges[k]);
    free(merges);
    json_decref(cfg);
    json_decref(root);
    return rc;
}
