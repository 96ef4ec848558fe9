/*
 * fuzz_tokenizer.c: the byte-level BPE tokenizer of the shipped model over
 * arbitrary bytes. Byte 0 of the input picks add_special / parse_special /
 * render_special; the rest is the text. The text is tokenized, every id
 * must lie in the vocabulary, and the ids are detokenized again. The same
 * bytes read as little-endian int32 ids go to tg_detokenize directly, so
 * out-of-range ids must be refused, not read.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "gguf.h"
#include "tokenizer.h"

const char *fuzz_model_path(void)
{
    static char buf[4096];
    const char *m = getenv("TG_FUZZ_MODEL"), *r = getenv("TG_ROOT");
    if (m && *m) return m;
    snprintf(buf, sizeof buf, "%s/models/tiny-trained-qwen3-Q4_K_M.gguf", r && *r ? r : ".");
    return buf;
}

static tg_tokenizer *tokenizer(void)
{
    static tg_tokenizer *t;
    static int tried;
    if (tried) return t;
    tried = 1;
    gguf *g;
    tg_err e;
    if (gguf_open(&g, fuzz_model_path(), &e) < 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", e.msg);
        abort();
    }
    if (tg_tokenizer_from_gguf(&t, g, &e) < 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", e.msg);
        abort();
    }
    gguf_close(g);
    return t;
}

int fuzz_tokenizer_one(const uint8_t *data, size_t size)
{
    tg_tokenizer *t = tokenizer();
    if (size < 1) return 0;
    int flags = data[0];
    /* an exact-size copy: ASan sees a read past the end */
    size_t len = size - 1;
    char *text = malloc(len ? len : 1);
    if (!text) return 0;
    memcpy(text, data + 1, len);
    int32_t *ids = NULL;
    size_t n = 0;
    tg_err e = {{0}};
    int32_t nv = tg_tokenizer_n_vocab(t);
    if (tg_tokenize(t, text, len, flags & 1, (flags >> 1) & 1, &ids, &n, &e) == 0) {
        for (size_t i = 0; i < n; i++) assert(ids[i] >= 0 && ids[i] < nv);
        char *out = NULL;
        size_t olen = 0;
        int rc = tg_detokenize(t, ids, n, (flags >> 2) & 1, &out, &olen, &e);
        assert(rc == 0);
        free(out);
    } else {
        assert(e.msg[0]);
    }
    free(ids);
    /* the bytes as ids */
    size_t nid = len / 4;
    int32_t *raw = malloc((nid ? nid : 1) * sizeof *raw);
    if (raw) {
        memcpy(raw, text, nid * 4);
        char *out = NULL;
        size_t olen = 0;
        e.msg[0] = 0;
        int bad = 0;
        for (size_t i = 0; i < nid; i++) bad |= raw[i] < 0 || raw[i] >= nv;
        int rc = tg_detokenize(t, raw, nid, flags & 4, &out, &olen, &e);
        assert(bad ? rc < 0 && e.msg[0] : rc == 0);
        free(out);
        for (size_t i = 0; i < nid && i < 64; i++) {
            size_t pl;
            const char *p = tg_token_piece(t, raw[i], flags & 8, &pl);
            assert((p != NULL) == (raw[i] >= 0 && raw[i] < nv));
        }
        free(raw);
    }
    free(text);
    return 0;
}

#ifdef TG_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_tokenizer_one(data, size); }
#endif
