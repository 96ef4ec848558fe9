/*
 * fuzz_gguf.c: the GGUF reader over arbitrary bytes. The input is opened
 * with gguf_open_buf (a copy of exactly size bytes, so reading one byte past
 * the end is caught by ASan), and when it opens, every key, value, array
 * element and tensor is read back through the public accessors the model
 * loader uses.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "gguf.h"

/* Reads every element of array key i (bounded) through the typed getters. */
static void walk_array(const gguf *g, const char *key)
{
    enum gguf_vtype et;
    uint64_t n;
    tg_err e = {{0}};
    if (gguf_get_arr(g, key, &et, &n, &e) < 0) {
        assert(e.msg[0]);
        return;
    }
    uint64_t lim = n < 4096 ? n : 4096;
    for (uint64_t j = 0; j < lim; j++) {
        gguf_str s;
        int64_t v;
        double d;
        if (gguf_arr_str(g, key, j, &s, NULL) == 0) assert(s.n == 0 || s.p);
        (void)gguf_arr_i64(g, key, j, &v, NULL);
        (void)gguf_arr_f64(g, key, j, &d, NULL);
    }
    /* one past the end must be refused */
    gguf_str s;
    int64_t v;
    assert(gguf_arr_str(g, key, n, &s, NULL) < 0);
    assert(gguf_arr_i64(g, key, n, &v, NULL) < 0);
    (void)gguf_arr_data(g, key);
}

int fuzz_gguf_one(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    gguf *g = NULL;
    tg_err e = {{0}};
    if (gguf_open_buf(&g, copy, size, "fuzz.gguf", &e) < 0) {
        assert(e.msg[0] && "gguf_open_buf failed without a message");
        free(copy);
        return 0;
    }
    (void)gguf_version(g);
    (void)gguf_alignment(g);
    /* a file without tensors may end before its (aligned) data section */
    assert(gguf_n_tensors(g) == 0 || gguf_data_offset(g) <= gguf_file_size(g));
    int64_t nkv = gguf_n_kv(g);
    for (int64_t i = 0; i < nkv; i++) {
        const char *k = gguf_kv_key(g, i);
        assert(k);
        (void)gguf_kv_type(g, i);
        uint32_t u32;
        int64_t i64;
        uint64_t u64;
        float f;
        double d;
        int b;
        gguf_str s;
        (void)gguf_get_u32(g, k, &u32, NULL);
        (void)gguf_get_i64(g, k, &i64, NULL);
        (void)gguf_get_u64(g, k, &u64, NULL);
        (void)gguf_get_f32(g, k, &f, NULL);
        (void)gguf_get_f64(g, k, &d, NULL);
        (void)gguf_get_bool(g, k, &b, NULL);
        if (gguf_get_str(g, k, &s, NULL) == 0 && s.n) {
            /* touch the first and last byte: they must lie in the buffer */
            volatile char c = s.p[0];
            c = s.p[s.n - 1];
            (void)c;
        }
        if (gguf_kv_type(g, i) == GGUF_ARRAY) walk_array(g, k);
    }
    int64_t nt = gguf_n_tensors(g);
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        assert(t);
        assert(gguf_find_tensor(g, t->name));
        if (t->nbytes) {
            const uint8_t *p = t->data;
            volatile uint8_t c = p[0];
            c = p[t->nbytes - 1];
            (void)c;
        }
    }
    gguf_close(g);
    free(copy);
    return 0;
}

#ifdef TG_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_gguf_one(data, size); }
#endif
