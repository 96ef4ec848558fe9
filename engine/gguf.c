/*
 * gguf.c: the GGUF v3 reader and writer (docs/formats.md, "GGUF v3").
 *
 * The reader treats the file as hostile. It walks the header, the metadata
 * and the tensor infos once with a bounds-checked cursor, checks every count,
 * length, offset and size against the bytes that remain (with overflow-checked
 * arithmetic) before it allocates or reads anything, and keeps an index: keys
 * and tensor names are copied, values stay in the mapping and are decoded on
 * request. Any defect gives -1 and one sentence naming the file, the byte
 * offset of the offending field and what was expected.
 *
 * The writer serialises metadata as it is added, keeps tensor descriptions
 * (borrowed data or a row-filling callback), and writes header, metadata,
 * tensor infos and aligned data in one pass through a stdio stream: a file
 * (written to path.tmp, renamed on success) or a memory buffer.
 */
#include "gguf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ types */

/* Values per block and bytes per block of every ggml type id that has a
 * size (ggml.h / ggml-common.h); {0, 0} marks ids removed from ggml. */
static const struct { uint32_t blck, bytes; } type_layout[] = {
    [0] = {1, 4},      /* F32 */
    [1] = {1, 2},      /* F16 */
    [2] = {32, 18},    /* Q4_0 */
    [3] = {32, 20},    /* Q4_1 */
    [6] = {32, 22},    /* Q5_0 */
    [7] = {32, 24},    /* Q5_1 */
    [8] = {32, 34},    /* Q8_0 */
    [9] = {32, 36},    /* Q8_1 */
    [10] = {256, 84},  /* Q2_K */
    [11] = {256, 110}, /* Q3_K */
    [12] = {256, 144}, /* Q4_K */
    [13] = {256, 176}, /* Q5_K */
    [14] = {256, 210}, /* Q6_K */
    [15] = {256, 292}, /* Q8_K */
    [16] = {256, 66},  /* IQ2_XXS */
    [17] = {256, 74},  /* IQ2_XS */
    [18] = {256, 98},  /* IQ3_XXS */
    [19] = {256, 50},  /* IQ1_S */
    [20] = {32, 18},   /* IQ4_NL */
    [21] = {256, 110}, /* IQ3_S */
    [22] = {256, 82},  /* IQ2_S */
    [23] = {256, 136}, /* IQ4_XS */
    [24] = {1, 1},     /* I8 */
    [25] = {1, 2},     /* I16 */
    [26] = {1, 4},     /* I32 */
    [27] = {1, 8},     /* I64 */
    [28] = {1, 8},     /* F64 */
    [29] = {256, 56},  /* IQ1_M */
    [30] = {1, 2},     /* BF16 */
    [34] = {256, 54},  /* TQ1_0 */
    [35] = {256, 66},  /* TQ2_0 */
    [39] = {32, 17},   /* MXFP4 */
    [40] = {64, 36},   /* NVFP4 */
    [41] = {128, 18},  /* Q1_0 */
    [42] = {64, 18},   /* Q2_0 */
};
#define N_TYPE_LAYOUT (sizeof type_layout / sizeof type_layout[0])

int gguf_type_layout(uint32_t type, uint32_t *blck, uint32_t *bytes)
{
    if (type >= N_TYPE_LAYOUT || type_layout[type].blck == 0) return -1;
    if (blck) *blck = type_layout[type].blck;
    if (bytes) *bytes = type_layout[type].bytes;
    return 0;
}

uint64_t gguf_nbytes(uint32_t type, uint32_t n_dims, const uint64_t *ne)
{
    uint32_t blck, bytes;
    if (gguf_type_layout(type, &blck, &bytes) < 0) return 0;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) return 0;
    uint64_t nel = 1, total;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || __builtin_mul_overflow(nel, ne[d], &nel)) return 0;
    }
    if (nel > (uint64_t)INT64_MAX || ne[0] % blck) return 0;
    if (__builtin_mul_overflow(nel / blck, (uint64_t)bytes, &total)) return 0;
    return total;
}

/* Size in bytes of a fixed-size value type, 0 for string, array, unknown. */
static uint64_t vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    default: return 0;
    }
}

const char *gguf_vtype_name(uint32_t t)
{
    static const char *const names[] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
        "array", "u64", "i64", "f64",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : "?";
}

static int vtype_is_int(uint32_t t)
{
    return t <= GGUF_I32 || t == GGUF_U64 || t == GGUF_I64 || t == GGUF_BOOL;
}

/* Decodes an integer (or bool) of type t at p: sets *neg and the magnitude
 * as two's complement-free parts so every value of every type is exact. */
static void read_int(uint32_t t, const uint8_t *p, int *neg, uint64_t *mag)
{
    int64_t s = 0;
    uint64_t u = 0;
    int is_signed = 0;
    switch (t) {
    case GGUF_U8: case GGUF_BOOL: u = p[0]; break;
    case GGUF_I8: { int8_t v; memcpy(&v, p, 1); s = v; is_signed = 1; break; }
    case GGUF_U16: { uint16_t v; memcpy(&v, p, 2); u = v; break; }
    case GGUF_I16: { int16_t v; memcpy(&v, p, 2); s = v; is_signed = 1; break; }
    case GGUF_U32: { uint32_t v; memcpy(&v, p, 4); u = v; break; }
    case GGUF_I32: { int32_t v; memcpy(&v, p, 4); s = v; is_signed = 1; break; }
    case GGUF_U64: memcpy(&u, p, 8); break;
    case GGUF_I64: memcpy(&s, p, 8); is_signed = 1; break;
    default: assert(!"read_int: not an integer type"); break;
    }
    if (is_signed) {
        *neg = s < 0;
        *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    } else {
        *neg = 0;
        *mag = u;
    }
}

/* ----------------------------------------------------------------- reader */

typedef struct kv {
    char *key;            /* NUL-terminated copy */
    uint64_t key_off;     /* offset of the key's length field */
    uint32_t type;
    uint64_t val_off;     /* offset of the value (for arrays: of the etype) */
    /* arrays */
    uint32_t etype;
    uint64_t count;
    uint64_t data_off;    /* first element */
    uint64_t *str_off;    /* string arrays: offset of each element's length */
} kv;

struct gguf {
    char *path;
    const uint8_t *base;
    uint64_t size;
    int mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;
    int64_t n_kv;
    kv *kv;
    int64_t *kv_sorted;   /* kv indices by key */
    int64_t n_tensors;
    gguf_tensor *t;
    uint64_t *t_info_off; /* offset of each tensor info (for messages) */
    int64_t *t_sorted;    /* tensor indices by name */
};

/* A bounds-checked read position in the file. */
typedef struct cursor {
    const uint8_t *p;
    uint64_t n;
    uint64_t off;
    const char *name;
    tg_err *e;
} cursor;

static int cur_need(cursor *c, uint64_t k, const char *what)
{
    if (c->n - c->off >= k) return 0;
    return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: expected %" PRIu64
                   " bytes, the file ends after %" PRIu64 " (truncated)",
                   c->name, c->off, what, k, c->n - c->off);
}

static int cur_u32(cursor *c, uint32_t *v, const char *what)
{
    if (cur_need(c, 4, what)) return -1;
    memcpy(v, c->p + c->off, 4);
    c->off += 4;
    return 0;
}

static int cur_u64(cursor *c, uint64_t *v, const char *what)
{
    if (cur_need(c, 8, what)) return -1;
    memcpy(v, c->p + c->off, 8);
    c->off += 8;
    return 0;
}

/* Reads a string's length and checks the bytes are there; *s is set to the
 * bytes, *len to the length, the cursor moves past them. */
static int cur_str(cursor *c, const char **s, uint64_t *len, const char *what)
{
    uint64_t at = c->off;
    if (cur_u64(c, len, what)) return -1;
    if (*len > c->n - c->off)
        return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: string length %" PRIu64
                       " runs past the end of the file (%" PRIu64 " bytes left)",
                       c->name, at, what, *len, c->n - c->off);
    *s = (const char *)c->p + c->off;
    c->off += *len;
    return 0;
}

/* Validates one value of type t at the cursor and moves past it. what names
 * the field for messages; depth counts enclosing arrays. */
static int skip_value(cursor *c, uint32_t t, int depth, const char *what)
{
    uint64_t at = c->off;
    uint64_t sz = vtype_size(t);
    if (sz) {
        if (cur_need(c, sz, what)) return -1;
        if (t == GGUF_BOOL && c->p[c->off] > 1)
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: expected a bool (0 or 1), got %u",
                           c->name, at, what, c->p[c->off]);
        c->off += sz;
        return 0;
    }
    if (t == GGUF_STRING) {
        const char *s;
        uint64_t n;
        return cur_str(c, &s, &n, what);
    }
    if (t != GGUF_ARRAY)
        return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: unknown value type %u, expected 0..12",
                       c->name, at, what, t);
    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: arrays nested deeper than %d levels",
                       c->name, at, what, GGUF_MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t count;
    if (cur_u32(c, &et, what) || cur_u64(c, &count, what)) return -1;
    if (et > GGUF_F64)
        return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: unknown array element type %u, expected 0..12",
                       c->name, at, what, et);
    /* The smallest encoding of one element bounds the count before we loop. */
    uint64_t min = vtype_size(et) ? vtype_size(et) : et == GGUF_STRING ? 8 : 12, need;
    if (__builtin_mul_overflow(count, min, &need) || need > c->n - c->off)
        return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: array count %" PRIu64
                       " needs at least %" PRIu64 "-byte elements past the end of the file (%" PRIu64
                       " bytes left)", c->name, at + 4, what, count, min, c->n - c->off);
    if (vtype_size(et) && et != GGUF_BOOL) {
        c->off += need;
        return 0;
    }
    for (uint64_t i = 0; i < count; i++)
        if (skip_value(c, et, depth + 1, what)) return -1;
    return 0;
}

static int cmp_kv_idx(const void *a, const void *b, void *arg)
{
    const gguf *g = arg;
    return strcmp(g->kv[*(const int64_t *)a].key, g->kv[*(const int64_t *)b].key);
}

static int cmp_t_idx(const void *a, const void *b, void *arg)
{
    const gguf *g = arg;
    return strcmp(g->t[*(const int64_t *)a].name, g->t[*(const int64_t *)b].name);
}

static int cmp_t_off(const void *a, const void *b, void *arg)
{
    const gguf *g = arg;
    uint64_t x = g->t[*(const int64_t *)a].offset, y = g->t[*(const int64_t *)b].offset;
    return x < y ? -1 : x > y;
}

/* Metadata: n_kv entries at the cursor. */
static int parse_kv(gguf *g, cursor *c)
{
    /* key length (8) + type (4) + the smallest value (1) */
    uint64_t need;
    if (__builtin_mul_overflow((uint64_t)g->n_kv, 13u, &need) || need > c->n - c->off)
        return tg_errf(c->e, "%s: byte 16: metadata count: %" PRId64
                       " entries cannot fit in the %" PRIu64 " bytes left", c->name, g->n_kv,
                       c->n - c->off);
    g->kv = calloc((size_t)g->n_kv + 1, sizeof *g->kv);
    g->kv_sorted = malloc(((size_t)g->n_kv + 1) * sizeof *g->kv_sorted);
    if (!g->kv || !g->kv_sorted) return tg_errf(c->e, "%s: out of memory", c->name);
    for (int64_t i = 0; i < g->n_kv; i++) {
        kv *k = &g->kv[i];
        const char *s;
        uint64_t n;
        char what[96];
        snprintf(what, sizeof what, "metadata entry %" PRId64 " key", i);
        k->key_off = c->off;
        if (cur_str(c, &s, &n, what)) return -1;
        if (n == 0 || n > 65535 || memchr(s, 0, n))
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: expected 1..65535 bytes without NUL, got %" PRIu64
                           " bytes", c->name, k->key_off, what, n);
        k->key = malloc(n + 1);
        if (!k->key) return tg_errf(c->e, "%s: out of memory", c->name);
        memcpy(k->key, s, n);
        k->key[n] = 0;
        snprintf(what, sizeof what, "metadata '%.60s'", k->key);
        uint64_t tat = c->off;
        if (cur_u32(c, &k->type, what)) return -1;
        if (k->type > GGUF_F64)
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: unknown value type %u, expected 0..12",
                           c->name, tat, what, k->type);
        k->val_off = c->off;
        if (k->type == GGUF_ARRAY) {
            uint64_t a0 = c->off;
            if (skip_value(c, GGUF_ARRAY, 0, what)) return -1;
            memcpy(&k->etype, c->p + a0, 4);
            memcpy(&k->count, c->p + a0 + 4, 8);
            k->data_off = a0 + 12;
            if (k->etype == GGUF_STRING && k->count) {
                k->str_off = malloc(k->count * sizeof *k->str_off);
                if (!k->str_off) return tg_errf(c->e, "%s: out of memory", c->name);
                uint64_t o = k->data_off, len;
                for (uint64_t j = 0; j < k->count; j++) { /* validated above */
                    k->str_off[j] = o;
                    memcpy(&len, c->p + o, 8);
                    o += 8 + len;
                }
            }
        } else if (skip_value(c, k->type, 0, what)) {
            return -1;
        }
        g->kv_sorted[i] = i;
    }
    qsort_r(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, cmp_kv_idx, g);
    for (int64_t i = 1; i < g->n_kv; i++) {
        const kv *a = &g->kv[g->kv_sorted[i - 1]], *b = &g->kv[g->kv_sorted[i]];
        if (!strcmp(a->key, b->key)) {
            const kv *later = a->key_off > b->key_off ? a : b;
            return tg_errf(c->e, "%s: byte %" PRIu64 ": metadata key '%.200s': duplicate key, expected each key once",
                           c->name, later->key_off, later->key);
        }
    }
    return 0;
}

static int parse_alignment(gguf *g, cursor *c)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int i = gguf_find_key(g, "general.alignment");
    if (i < 0) return 0;
    const kv *k = &g->kv[i];
    if (k->type != GGUF_U32)
        return tg_errf(c->e, "%s: byte %" PRIu64 ": general.alignment: expected type u32, got %s",
                       c->name, k->val_off - 4, gguf_vtype_name(k->type));
    uint32_t a;
    memcpy(&a, c->p + k->val_off, 4);
    if (a == 0 || (a & (a - 1)))
        return tg_errf(c->e, "%s: byte %" PRIu64 ": general.alignment: expected a power of two, got %u",
                       c->name, k->val_off, a);
    g->alignment = a;
    return 0;
}

/* Tensor infos: n_tensors entries at the cursor. */
static int parse_tensor_infos(gguf *g, cursor *c)
{
    /* name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8) */
    uint64_t need;
    if (__builtin_mul_overflow((uint64_t)g->n_tensors, 32u, &need) || need > c->n - c->off)
        return tg_errf(c->e, "%s: byte 8: tensor count: %" PRId64
                       " tensor infos cannot fit in the %" PRIu64 " bytes left", c->name,
                       g->n_tensors, c->n - c->off);
    size_t nt = (size_t)g->n_tensors + 1;
    g->t = calloc(nt, sizeof *g->t);
    g->t_info_off = calloc(nt, sizeof *g->t_info_off);
    g->t_sorted = malloc(nt * sizeof *g->t_sorted);
    if (!g->t || !g->t_info_off || !g->t_sorted) return tg_errf(c->e, "%s: out of memory", c->name);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->t[i];
        char what[200];
        const char *s;
        uint64_t n;
        snprintf(what, sizeof what, "tensor info %" PRId64 " name", i);
        g->t_info_off[i] = c->off;
        if (cur_str(c, &s, &n, what)) return -1;
        if (n == 0 || n > GGUF_MAX_NAME || memchr(s, 0, n))
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: expected 1..%d bytes without NUL, got %" PRIu64
                           " bytes", c->name, g->t_info_off[i], what, GGUF_MAX_NAME, n);
        memcpy(t->name, s, n);
        t->name[n] = 0;
        snprintf(what, sizeof what, "tensor '%s'", t->name);
        uint64_t at = c->off;
        if (cur_u32(c, &t->n_dims, what)) return -1;
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s n_dims: expected 1..%d, got %u",
                           c->name, at, what, GGUF_MAX_DIMS, t->n_dims);
        uint64_t nel = 1;
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            at = c->off;
            if (cur_u64(c, &t->ne[d], what)) return -1;
            if (t->ne[d] == 0)
                return tg_errf(c->e, "%s: byte %" PRIu64 ": %s ne[%u]: expected a dimension >= 1, got 0",
                               c->name, at, what, d);
            if (__builtin_mul_overflow(nel, t->ne[d], &nel) || nel > (uint64_t)INT64_MAX)
                return tg_errf(c->e, "%s: byte %" PRIu64 ": %s ne[%u] = %" PRIu64
                               ": expected an element count that fits in int64, the product overflows",
                               c->name, at, what, d, t->ne[d]);
        }
        at = c->off;
        if (cur_u32(c, &t->type, what)) return -1;
        uint32_t blck, bytes;
        if (gguf_type_layout(t->type, &blck, &bytes) < 0)
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s type: unknown ggml type %u",
                           c->name, at, what, t->type);
        if (t->ne[0] % blck)
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s ne[0] = %" PRIu64
                           ": expected a multiple of the type's block size %u",
                           c->name, g->t_info_off[i] + 8 + n + 4, what, t->ne[0], blck);
        t->nbytes = gguf_nbytes(t->type, t->n_dims, t->ne);
        if (t->nbytes == 0)
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s: size in bytes overflows",
                           c->name, at, what);
        at = c->off;
        if (cur_u64(c, &t->offset, what)) return -1;
        if (t->offset % g->alignment)
            return tg_errf(c->e, "%s: byte %" PRIu64 ": %s offset %" PRIu64
                           ": expected a multiple of the alignment %u",
                           c->name, at, what, t->offset, g->alignment);
        g->t_sorted[i] = i;
    }
    qsort_r(g->t_sorted, (size_t)g->n_tensors, sizeof *g->t_sorted, cmp_t_idx, g);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        int64_t a = g->t_sorted[i - 1], b = g->t_sorted[i];
        if (!strcmp(g->t[a].name, g->t[b].name)) {
            int64_t later = a > b ? a : b;
            return tg_errf(c->e, "%s: byte %" PRIu64 ": tensor '%s': duplicate tensor name, expected each name once",
                           c->name, g->t_info_off[later], g->t[later].name);
        }
    }
    return 0;
}

/* Data section: alignment padding, every tensor inside the file, no two
 * tensors sharing bytes. */
static int check_data(gguf *g, cursor *c)
{
    uint64_t a = g->alignment, d;
    if (__builtin_add_overflow(c->off, a - 1, &d))
        return tg_errf(c->e, "%s: byte %" PRIu64 ": data section offset overflows", c->name, c->off);
    g->data_off = d / a * a;
    if (g->n_tensors == 0) return 0;
    if (g->data_off > c->n)
        return tg_errf(c->e, "%s: byte %" PRIu64 ": data section: expected it to start at byte %" PRIu64
                       " after alignment padding, the file ends (truncated)",
                       c->name, c->off, g->data_off);
    uint64_t avail = c->n - g->data_off;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->t[i];
        uint64_t end;
        if (__builtin_add_overflow(t->offset, t->nbytes, &end) || end > avail) {
            /* the offset field is the last 8 bytes of the info */
            uint64_t at = g->t_info_off[i] + 8 + strlen(t->name) + 4 + 8ull * t->n_dims + 4;
            return tg_errf(c->e, "%s: byte %" PRIu64 ": tensor '%s' offset %" PRIu64 " + %" PRIu64
                           " bytes: expected the data inside the file (data section has %" PRIu64
                           " bytes from byte %" PRIu64 ")", c->name, at, t->name, t->offset,
                           t->nbytes, avail, g->data_off);
        }
        t->data = g->base + g->data_off + t->offset;
    }
    int64_t *ord = malloc((size_t)g->n_tensors * sizeof *ord);
    if (!ord) return tg_errf(c->e, "%s: out of memory", c->name);
    for (int64_t i = 0; i < g->n_tensors; i++) ord[i] = i;
    qsort_r(ord, (size_t)g->n_tensors, sizeof *ord, cmp_t_off, g);
    int rc = 0;
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const gguf_tensor *p = &g->t[ord[i - 1]], *q = &g->t[ord[i]];
        if (p->offset + p->nbytes > q->offset) {
            int64_t j = ord[i];
            uint64_t at = g->t_info_off[j] + 8 + strlen(q->name) + 4 + 8ull * q->n_dims + 4;
            rc = tg_errf(c->e, "%s: byte %" PRIu64 ": tensor '%s' offset %" PRIu64
                         ": overlaps tensor '%s' (offset %" PRIu64 ", %" PRIu64
                         " bytes), expected disjoint tensors", c->name, at, q->name,
                         q->offset, p->name, p->offset, p->nbytes);
            break;
        }
    }
    free(ord);
    return rc;
}

static int parse(gguf *g, tg_err *e)
{
    cursor c = {g->base, g->size, 0, g->path, e};
    if (g->size < 4 || memcmp(g->base, "GGUF", 4)) {
        if (g->size < 4)
            return tg_errf(e, "%s: byte 0: magic: expected \"GGUF\", the file has only %" PRIu64 " bytes (truncated)",
                           g->path, g->size);
        return tg_errf(e, "%s: byte 0: magic: expected \"GGUF\" (47 47 55 46), got %02x %02x %02x %02x",
                       g->path, g->base[0], g->base[1], g->base[2], g->base[3]);
    }
    c.off = 4;
    if (cur_u32(&c, &g->version, "version")) return -1;
    if (g->version != 3)
        return tg_errf(e, "%s: byte 4: version: expected 3, got %u", g->path, g->version);
    uint64_t nt, nkv;
    if (cur_u64(&c, &nt, "tensor count") || cur_u64(&c, &nkv, "metadata count")) return -1;
    if (nt > (uint64_t)INT64_MAX / 64)
        return tg_errf(e, "%s: byte 8: tensor count: %" PRIu64 " is beyond any file", g->path, nt);
    if (nkv > (uint64_t)INT64_MAX / 64)
        return tg_errf(e, "%s: byte 16: metadata count: %" PRIu64 " is beyond any file", g->path, nkv);
    g->n_tensors = (int64_t)nt;
    g->n_kv = (int64_t)nkv;
    if (parse_kv(g, &c) || parse_alignment(g, &c) || parse_tensor_infos(g, &c)) return -1;
    return check_data(g, &c);
}

static gguf *gguf_new(const char *name)
{
    gguf *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->path = strdup(name ? name : "(buffer)");
    if (!g->path) {
        free(g);
        return NULL;
    }
    return g;
}

int gguf_open_buf(gguf **out, const void *buf, size_t n, const char *name, tg_err *e)
{
    *out = NULL;
    gguf *g = gguf_new(name);
    if (!g) return tg_errf(e, "%s: out of memory", name ? name : "(buffer)");
    static const uint8_t empty[1];
    g->base = buf ? buf : empty;
    g->size = buf ? n : 0;
    if (parse(g, e)) {
        gguf_close(g);
        return -1;
    }
    *out = g;
    return 0;
}

int gguf_open(gguf **out, const char *path, tg_err *e)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_errf(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int err = errno;
        close(fd);
        return tg_errf(e, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tg_errf(e, "%s: expected a regular file", path);
    }
    gguf *g = gguf_new(path);
    if (!g) {
        close(fd);
        return tg_errf(e, "%s: out of memory", path);
    }
    static const uint8_t empty[1];
    g->base = empty;
    g->size = (uint64_t)st.st_size;
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int err = errno;
            close(fd);
            gguf_close(g);
            return tg_errf(e, "%s: cannot map %" PRIu64 " bytes: %s", path, (uint64_t)st.st_size,
                           strerror(err));
        }
        g->base = m;
        g->mapped = 1;
    }
    close(fd);
    if (parse(g, e)) {
        gguf_close(g);
        return -1;
    }
    *out = g;
    return 0;
}

void gguf_close(gguf *g)
{
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, (size_t)g->size);
    if (g->kv) {
        for (int64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].str_off);
        }
    }
    free(g->kv);
    free(g->kv_sorted);
    free(g->t);
    free(g->t_info_off);
    free(g->t_sorted);
    free(g->path);
    free(g);
}

const char *gguf_path(const gguf *g) { return g->path; }
uint32_t gguf_version(const gguf *g) { return g->version; }
uint64_t gguf_file_size(const gguf *g) { return g->size; }
uint32_t gguf_alignment(const gguf *g) { return g->alignment; }
uint64_t gguf_data_offset(const gguf *g) { return g->data_off; }
int64_t gguf_n_kv(const gguf *g) { return g->n_kv; }

const char *gguf_kv_key(const gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? g->kv[i].key : NULL;
}

enum gguf_vtype gguf_kv_type(const gguf *g, int64_t i)
{
    assert(i >= 0 && i < g->n_kv);
    return (enum gguf_vtype)g->kv[i].type;
}

int gguf_find_key(const gguf *g, const char *key)
{
    int64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv[g->kv_sorted[mid]].key, key);
        if (c == 0) return (int)g->kv_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* The entry for key, or NULL with e set. */
static const kv *find(const gguf *g, const char *key, tg_err *e)
{
    int i = gguf_find_key(g, key);
    if (i < 0) {
        tg_errf(e, "%s: metadata key '%s' is absent", g->path, key);
        return NULL;
    }
    return &g->kv[i];
}

static int wrong_type(const gguf *g, const kv *k, const char *want, tg_err *e)
{
    return tg_errf(e, "%s: byte %" PRIu64 ": metadata '%s': expected %s, got %s", g->path,
                   k->val_off - 4, k->key, want, gguf_vtype_name(k->type));
}

/* Integer value of key as sign and magnitude. */
static int get_int(const gguf *g, const char *key, int *neg, uint64_t *mag, const kv **kp, tg_err *e)
{
    const kv *k = find(g, key, e);
    if (!k) return -1;
    *kp = k;
    if (!vtype_is_int(k->type) || k->type == GGUF_BOOL) return wrong_type(g, k, "an integer", e);
    read_int(k->type, g->base + k->val_off, neg, mag);
    return 0;
}

int gguf_get_u32(const gguf *g, const char *key, uint32_t *out, tg_err *e)
{
    int neg;
    uint64_t mag;
    const kv *k;
    if (get_int(g, key, &neg, &mag, &k, e)) return -1;
    if (neg || mag > UINT32_MAX)
        return tg_errf(e, "%s: byte %" PRIu64 ": metadata '%s': expected a value in u32 range, got %s%" PRIu64,
                       g->path, k->val_off, key, neg ? "-" : "", mag);
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_i64(const gguf *g, const char *key, int64_t *out, tg_err *e)
{
    int neg;
    uint64_t mag;
    const kv *k;
    if (get_int(g, key, &neg, &mag, &k, e)) return -1;
    if (!neg && mag > (uint64_t)INT64_MAX)
        return tg_errf(e, "%s: byte %" PRIu64 ": metadata '%s': expected a value in i64 range, got %" PRIu64,
                       g->path, k->val_off, key, mag);
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return 0;
}

int gguf_get_u64(const gguf *g, const char *key, uint64_t *out, tg_err *e)
{
    int neg;
    uint64_t mag;
    const kv *k;
    if (get_int(g, key, &neg, &mag, &k, e)) return -1;
    if (neg)
        return tg_errf(e, "%s: byte %" PRIu64 ": metadata '%s': expected a value in u64 range, got -%" PRIu64,
                       g->path, k->val_off, key, mag);
    *out = mag;
    return 0;
}

int gguf_get_f64(const gguf *g, const char *key, double *out, tg_err *e)
{
    const kv *k = find(g, key, e);
    if (!k) return -1;
    if (k->type == GGUF_F32) {
        float f;
        memcpy(&f, g->base + k->val_off, 4);
        *out = f;
    } else if (k->type == GGUF_F64) {
        memcpy(out, g->base + k->val_off, 8);
    } else {
        return wrong_type(g, k, "f32 or f64", e);
    }
    return 0;
}

int gguf_get_f32(const gguf *g, const char *key, float *out, tg_err *e)
{
    double d;
    if (gguf_get_f64(g, key, &d, e)) return -1;
    *out = (float)d;
    return 0;
}

int gguf_get_bool(const gguf *g, const char *key, int *out, tg_err *e)
{
    const kv *k = find(g, key, e);
    if (!k) return -1;
    if (k->type != GGUF_BOOL) return wrong_type(g, k, "bool", e);
    *out = g->base[k->val_off];
    return 0;
}

int gguf_get_str(const gguf *g, const char *key, gguf_str *out, tg_err *e)
{
    const kv *k = find(g, key, e);
    if (!k) return -1;
    if (k->type != GGUF_STRING) return wrong_type(g, k, "string", e);
    memcpy(&out->n, g->base + k->val_off, 8);
    out->p = (const char *)g->base + k->val_off + 8;
    return 0;
}

int gguf_get_arr(const gguf *g, const char *key, enum gguf_vtype *etype, uint64_t *count, tg_err *e)
{
    const kv *k = find(g, key, e);
    if (!k) return -1;
    if (k->type != GGUF_ARRAY) return wrong_type(g, k, "array", e);
    if (etype) *etype = (enum gguf_vtype)k->etype;
    if (count) *count = k->count;
    return 0;
}

/* Array entry for key with element i in range, or NULL with e set. */
static const kv *arr_at(const gguf *g, const char *key, uint64_t i, tg_err *e)
{
    const kv *k = find(g, key, e);
    if (!k) return NULL;
    if (k->type != GGUF_ARRAY) {
        wrong_type(g, k, "array", e);
        return NULL;
    }
    if (i >= k->count) {
        tg_errf(e, "%s: metadata '%s': index %" PRIu64 " out of range, array has %" PRIu64 " elements",
                g->path, key, i, k->count);
        return NULL;
    }
    return k;
}

int gguf_arr_str(const gguf *g, const char *key, uint64_t i, gguf_str *out, tg_err *e)
{
    const kv *k = arr_at(g, key, i, e);
    if (!k) return -1;
    if (k->etype != GGUF_STRING)
        return tg_errf(e, "%s: metadata '%s': expected an array of string, got an array of %s",
                       g->path, key, gguf_vtype_name(k->etype));
    memcpy(&out->n, g->base + k->str_off[i], 8);
    out->p = (const char *)g->base + k->str_off[i] + 8;
    return 0;
}

int gguf_arr_i64(const gguf *g, const char *key, uint64_t i, int64_t *out, tg_err *e)
{
    const kv *k = arr_at(g, key, i, e);
    if (!k) return -1;
    if (!vtype_is_int(k->etype))
        return tg_errf(e, "%s: metadata '%s': expected an array of integers, got an array of %s",
                       g->path, key, gguf_vtype_name(k->etype));
    int neg;
    uint64_t mag;
    read_int(k->etype, g->base + k->data_off + i * vtype_size(k->etype), &neg, &mag);
    if (!neg && mag > (uint64_t)INT64_MAX)
        return tg_errf(e, "%s: metadata '%s'[%" PRIu64 "]: expected a value in i64 range, got %" PRIu64,
                       g->path, key, i, mag);
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return 0;
}

int gguf_arr_f64(const gguf *g, const char *key, uint64_t i, double *out, tg_err *e)
{
    const kv *k = arr_at(g, key, i, e);
    if (!k) return -1;
    const uint8_t *p = g->base + k->data_off;
    if (k->etype == GGUF_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        *out = f;
    } else if (k->etype == GGUF_F64) {
        memcpy(out, p + 8 * i, 8);
    } else {
        return tg_errf(e, "%s: metadata '%s': expected an array of f32 or f64, got an array of %s",
                       g->path, key, gguf_vtype_name(k->etype));
    }
    return 0;
}

const void *gguf_arr_data(const gguf *g, const char *key)
{
    int i = gguf_find_key(g, key);
    if (i < 0 || g->kv[i].type != GGUF_ARRAY || !vtype_size(g->kv[i].etype)) return NULL;
    return g->base + g->kv[i].data_off;
}

int64_t gguf_n_tensors(const gguf *g) { return g->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->t[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf *g, const char *name)
{
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->t[g->t_sorted[mid]].name, name);
        if (c == 0) return &g->t[g->t_sorted[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ----------------------------------------------------------------- writer */

typedef struct wtensor {
    char name[GGUF_MAX_NAME + 1];
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
    const void *data;     /* borrowed, or NULL when fn fills it */
    gguf_fill_fn fn;
    void *user;
} wtensor;

struct gguf_writer {
    uint32_t alignment;
    uint8_t *kvbuf;       /* serialised metadata, in insertion order */
    size_t kvlen, kvcap;
    char **keys;          /* for duplicate detection */
    size_t n_keys, cap_keys;
    wtensor *t;
    size_t n_t, cap_t;
    char err[512];
};

static int werr(gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int werr(gguf_writer *w, const char *fmt, ...)
{
    if (!w->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err, sizeof w->err, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int kv_put(gguf_writer *w, const void *p, size_t n)
{
    if (w->kvcap - w->kvlen < n) {
        size_t cap = w->kvcap ? w->kvcap : 4096;
        while (cap - w->kvlen < n) {
            if (cap > SIZE_MAX / 2) return werr(w, "gguf writer: metadata too large");
            cap *= 2;
        }
        uint8_t *nb = realloc(w->kvbuf, cap);
        if (!nb) return werr(w, "gguf writer: out of memory");
        w->kvbuf = nb;
        w->kvcap = cap;
    }
    memcpy(w->kvbuf + w->kvlen, p, n);
    w->kvlen += n;
    return 0;
}

static int kv_put_u32(gguf_writer *w, uint32_t v) { return kv_put(w, &v, 4); }
static int kv_put_u64(gguf_writer *w, uint64_t v) { return kv_put(w, &v, 8); }

static int kv_put_str(gguf_writer *w, const char *s, size_t n)
{
    return kv_put_u64(w, n) || kv_put(w, s, n) ? -1 : 0;
}

/* Registers key (refusing duplicates) and writes it with its type. */
static int kv_begin(gguf_writer *w, const char *key, uint32_t type)
{
    if (!key || !key[0]) return werr(w, "gguf writer: empty metadata key");
    for (size_t i = 0; i < w->n_keys; i++)
        if (!strcmp(w->keys[i], key)) return werr(w, "gguf writer: duplicate metadata key '%s'", key);
    if (w->n_keys == w->cap_keys) {
        size_t cap = w->cap_keys ? 2 * w->cap_keys : 32;
        char **nk = realloc(w->keys, cap * sizeof *nk);
        if (!nk) return werr(w, "gguf writer: out of memory");
        w->keys = nk;
        w->cap_keys = cap;
    }
    char *k = strdup(key);
    if (!k) return werr(w, "gguf writer: out of memory");
    w->keys[w->n_keys++] = k;
    return kv_put_str(w, key, strlen(key)) || kv_put_u32(w, type) ? -1 : 0;
}

gguf_writer *gguf_writer_new(uint32_t alignment)
{
    if (alignment == 0) alignment = GGUF_DEFAULT_ALIGNMENT;
    if (alignment & (alignment - 1)) return NULL;
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (alignment != GGUF_DEFAULT_ALIGNMENT && gguf_writer_u32(w, "general.alignment", alignment)) {
        gguf_writer_free(w);
        return NULL;
    }
    return w;
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_keys; i++) free(w->keys[i]);
    free(w->keys);
    free(w->kvbuf);
    free(w->t);
    free(w);
}

const char *gguf_writer_errmsg(const gguf_writer *w) { return w->err; }

int gguf_writer_scalar(gguf_writer *w, const char *key, enum gguf_vtype type, const void *v)
{
    uint64_t sz = vtype_size(type);
    if (!sz) return werr(w, "gguf writer: '%s': type %s is not a fixed-size scalar", key ? key : "",
                         gguf_vtype_name(type));
    if (type == GGUF_BOOL && *(const uint8_t *)v > 1)
        return werr(w, "gguf writer: '%s': a bool must be 0 or 1", key ? key : "");
    if (key && !strcmp(key, "general.alignment")) {
        uint32_t a;
        if (type != GGUF_U32) return werr(w, "gguf writer: general.alignment must be u32");
        memcpy(&a, v, 4);
        if (a == 0 || (a & (a - 1)))
            return werr(w, "gguf writer: general.alignment %u is not a power of two", a);
        if (kv_begin(w, key, type)) return -1;
        w->alignment = a;
        return kv_put(w, v, sz);
    }
    return kv_begin(w, key, type) || kv_put(w, v, sz) ? -1 : 0;
}

int gguf_writer_u32(gguf_writer *w, const char *key, uint32_t v) { return gguf_writer_scalar(w, key, GGUF_U32, &v); }
int gguf_writer_i32(gguf_writer *w, const char *key, int32_t v) { return gguf_writer_scalar(w, key, GGUF_I32, &v); }
int gguf_writer_u64(gguf_writer *w, const char *key, uint64_t v) { return gguf_writer_scalar(w, key, GGUF_U64, &v); }
int gguf_writer_i64(gguf_writer *w, const char *key, int64_t v) { return gguf_writer_scalar(w, key, GGUF_I64, &v); }
int gguf_writer_f32(gguf_writer *w, const char *key, float v) { return gguf_writer_scalar(w, key, GGUF_F32, &v); }
int gguf_writer_f64(gguf_writer *w, const char *key, double v) { return gguf_writer_scalar(w, key, GGUF_F64, &v); }

int gguf_writer_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return gguf_writer_scalar(w, key, GGUF_BOOL, &b);
}

int gguf_writer_str(gguf_writer *w, const char *key, const char *v)
{
    if (!v) return werr(w, "gguf writer: '%s': NULL string", key ? key : "");
    return kv_begin(w, key, GGUF_STRING) || kv_put_str(w, v, strlen(v)) ? -1 : 0;
}

int gguf_writer_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    if (n && !v) return werr(w, "gguf writer: '%s': NULL array", key ? key : "");
    for (uint64_t i = 0; i < n; i++)
        if (!v[i]) return werr(w, "gguf writer: '%s': element %" PRIu64 " is NULL", key ? key : "", i);
    if (kv_begin(w, key, GGUF_ARRAY) || kv_put_u32(w, GGUF_STRING) || kv_put_u64(w, n)) return -1;
    for (uint64_t i = 0; i < n; i++)
        if (kv_put_str(w, v[i], strlen(v[i]))) return -1;
    return 0;
}

int gguf_writer_arr(gguf_writer *w, const char *key, enum gguf_vtype etype, const void *data, uint64_t n)
{
    uint64_t sz = vtype_size(etype), total;
    if (!sz) return werr(w, "gguf writer: '%s': array element type %s is not a fixed-size type",
                         key ? key : "", gguf_vtype_name(etype));
    if (__builtin_mul_overflow(sz, n, &total) || total > SIZE_MAX)
        return werr(w, "gguf writer: '%s': array too large", key ? key : "");
    if (n && !data) return werr(w, "gguf writer: '%s': NULL array", key ? key : "");
    if (etype == GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return werr(w, "gguf writer: '%s': bool element %" PRIu64 " is not 0 or 1", key ? key : "", i);
    if (kv_begin(w, key, GGUF_ARRAY) || kv_put_u32(w, etype) || kv_put_u64(w, n)) return -1;
    return n ? kv_put(w, data, (size_t)total) : 0;
}

static int add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                      const uint64_t *ne, const void *data, uint64_t nbytes, gguf_fill_fn fn, void *user)
{
    if (!name || !name[0] || strlen(name) > GGUF_MAX_NAME)
        return werr(w, "gguf writer: tensor name must have 1..%d bytes", GGUF_MAX_NAME);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
        return werr(w, "gguf writer: tensor '%s': n_dims %u, expected 1..%d", name, n_dims, GGUF_MAX_DIMS);
    uint64_t want = gguf_nbytes(type, n_dims, ne);
    if (!want)
        return werr(w, "gguf writer: tensor '%s': type %u and shape give no valid size "
                    "(unknown type, zero dim, ne[0] not a multiple of the block, or overflow)", name, type);
    if (!fn && nbytes != want)
        return werr(w, "gguf writer: tensor '%s': %" PRIu64 " bytes given, type and shape need %" PRIu64,
                    name, nbytes, want);
    if (!fn && !data) return werr(w, "gguf writer: tensor '%s': NULL data", name);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return werr(w, "gguf writer: duplicate tensor name '%s'", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt) return werr(w, "gguf writer: out of memory");
        w->t = nt;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = want;
    t->data = data;
    t->fn = fn;
    t->user = user;
    return 0;
}

int gguf_writer_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const uint64_t *ne, const void *data, uint64_t nbytes)
{
    return add_tensor(w, name, type, n_dims, ne, data, nbytes, NULL, NULL);
}

int gguf_writer_tensor_fn(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                          const uint64_t *ne, gguf_fill_fn fn, void *user)
{
    if (!fn) return werr(w, "gguf writer: tensor '%s': NULL fill function", name ? name : "");
    return add_tensor(w, name, type, n_dims, ne, NULL, 0, fn, user);
}

static uint64_t pad_to(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int put(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1; }

static int put_zeros(FILE *f, uint64_t n)
{
    static const uint8_t z[256];
    while (n) {
        size_t k = n < sizeof z ? (size_t)n : sizeof z;
        if (put(f, z, k)) return -1;
        n -= k;
    }
    return 0;
}

/* Streams the whole file to f. Returns 0, or -1 with e (name in messages). */
static int write_stream(gguf_writer *w, FILE *f, const char *name, tg_err *e)
{
    if (w->err[0]) return tg_errf(e, "%s: %s", name, w->err);
    uint64_t a = w->alignment;
    uint64_t hdr[2] = {w->n_t, w->n_keys};
    uint32_t ver = 3;
    if (put(f, "GGUF", 4) || put(f, &ver, 4) || put(f, hdr, 16) || put(f, w->kvbuf, w->kvlen))
        goto io;
    uint64_t off = 0, pos = 24 + w->kvlen;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t len = strlen(t->name);
        if (put(f, &len, 8) || put(f, t->name, len) || put(f, &t->n_dims, 4) ||
            put(f, t->ne, 8 * t->n_dims) || put(f, &t->type, 4) || put(f, &off, 8))
            goto io;
        pos += 8 + len + 4 + 8 * t->n_dims + 4 + 8;
        off += pad_to(t->nbytes, a);
    }
    if (put_zeros(f, pad_to(pos, a) - pos)) goto io;
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (!t->fn) {
            if (put(f, t->data, (size_t)t->nbytes)) goto io_buf;
        } else {
            uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
            uint64_t row_bytes = t->nbytes / rows;
            uint64_t chunk = (64u << 20) / row_bytes;
            if (chunk == 0) chunk = 1;
            if (chunk > rows) chunk = rows;
            if (cap < chunk * row_bytes) {
                free(buf);
                cap = (size_t)(chunk * row_bytes);
                buf = malloc(cap);
                if (!buf) {
                    tg_errf(e, "%s: out of memory for tensor '%s'", name, t->name);
                    return -1;
                }
            }
            for (uint64_t r = 0; r < rows; r += chunk) {
                uint64_t n = rows - r < chunk ? rows - r : chunk;
                if (t->fn(t->user, r, n, buf, e)) {
                    free(buf);
                    return tg_err_prefix(e, "%s: tensor '%s' rows %" PRIu64 "..", name, t->name, r);
                }
                if (put(f, buf, (size_t)(n * row_bytes))) goto io_buf;
            }
        }
        if (put_zeros(f, pad_to(t->nbytes, a) - t->nbytes)) goto io_buf;
    }
    free(buf);
    return 0;
io_buf:
    free(buf);
io:
    return tg_errf(e, "%s: write failed: %s", name, strerror(errno ? errno : EIO));
}

int gguf_writer_write(gguf_writer *w, const char *path, tg_err *e)
{
    if (w->err[0]) return tg_errf(e, "%s: %s", path, w->err);
    size_t n = strlen(path);
    char *tmp = malloc(n + 5);
    if (!tmp) return tg_errf(e, "%s: out of memory", path);
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        tg_errf(e, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    int rc = write_stream(w, f, path, e);
    if (fclose(f) != 0 && rc == 0) rc = tg_errf(e, "%s: write failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = tg_errf(e, "%s: cannot rename from %s: %s", path, tmp, strerror(errno));
    if (rc != 0) unlink(tmp);
    free(tmp);
    return rc;
}

int gguf_writer_write_buf(gguf_writer *w, void **out, size_t *n, tg_err *e)
{
    *out = NULL;
    *n = 0;
    char *p = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&p, &len);
    if (!f) return tg_errf(e, "(buffer): cannot open a memory stream: %s", strerror(errno));
    int rc = write_stream(w, f, "(buffer)", e);
    if (fclose(f) != 0 && rc == 0) rc = tg_errf(e, "(buffer): write failed: %s", strerror(errno));
    if (rc != 0) {
        free(p);
        return -1;
    }
    *out = p;
    *n = len;
    return 0;
}
