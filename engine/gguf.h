/*
 * gguf.h: GGUF v3 reader (mmap, every count, length, offset and size checked
 * against the file) and writer.
 *
 * Reader: gguf_open() maps the file read-only and indexes its metadata and
 * tensor infos; tensor data pointers point into the mapping and stay valid
 * until gguf_close(). A malformed file yields -1 and an error that names the
 * file, the byte offset and what was expected; never a crash.
 *
 * Writer: gguf_writer collects metadata and tensors (the caller keeps tensor
 * data alive until gguf_writer_write()), then writes a v3 file with the
 * given alignment. Keys are written in insertion order, tensors likewise.
 */
#ifndef TG_GGUF_H
#define TG_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum gguf_vtype {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4,
    GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8,
    GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12,
};

#define GGUF_MAX_DIMS 4
/* Arrays may hold arrays (gguf-py can write nested lists) down to this depth:
 * 1 = arrays of scalars/strings only; 2 = arrays of such arrays. Deeper is
 * rejected as malformed. */
#define GGUF_MAX_ARRAY_DEPTH 2
/* Tensor names longer than this (bytes, without NUL) are rejected. */
#define GGUF_MAX_NAME 127
#define GGUF_DEFAULT_ALIGNMENT 32

/* A string inside the mapping: not NUL-terminated. */
typedef struct gguf_str {
    const char *p;
    uint64_t n;
} gguf_str;

typedef struct gguf_tensor {
    char name[128];            /* NUL-terminated copy */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];/* ne[0] innermost; unused dims are 1 */
    uint32_t type;             /* ggml type id (quant.h TG_TYPE_*) */
    uint64_t offset;           /* relative to the data section */
    uint64_t nbytes;           /* checked: fits in the file */
    const void *data;          /* into the mapping */
} gguf_tensor;

typedef struct gguf gguf;      /* opaque */

/* Opens and validates path. Returns 0 and *out, or -1 with e set. */
int gguf_open(gguf **out, const char *path, tg_err *e);
/* Same, over a caller-owned buffer (fuzzing, tests); name is used in errors.
 * The buffer must outlive the gguf. */
int gguf_open_buf(gguf **out, const void *buf, size_t n, const char *name, tg_err *e);
void gguf_close(gguf *g);           /* NULL is a no-op */

const char *gguf_path(const gguf *g);
uint32_t gguf_version(const gguf *g);
uint64_t gguf_file_size(const gguf *g);
uint32_t gguf_alignment(const gguf *g);

/* Byte offset of the data section (tensor offsets are relative to it). */
uint64_t gguf_data_offset(const gguf *g);

/* Block layout of a ggml type id: values per block and bytes per block, for
 * every id ggml gives a size (0..41 except the removed ones), whether or not
 * this project computes with it. Returns 0, or -1 for an id with no size. */
int gguf_type_layout(uint32_t type, uint32_t *blck, uint32_t *bytes);
/* Bytes of a tensor of that type and shape; 0 when the type has no size,
 * n_dims is not 1..4, a dim is 0, ne[0] is not a multiple of the block size
 * or the size overflows. */
uint64_t gguf_nbytes(uint32_t type, uint32_t n_dims, const uint64_t *ne);
const char *gguf_vtype_name(uint32_t vtype);   /* "u32"...; "?" if unknown */

/* Metadata. Lookups return -1 when the key is absent (and set e when e is not
 * NULL) or has another type; scalar getters accept any integer type whose
 * value fits the requested one. */
int64_t gguf_n_kv(const gguf *g);
const char *gguf_kv_key(const gguf *g, int64_t i);          /* NUL-terminated copy */
int gguf_find_key(const gguf *g, const char *key);          /* index, or -1 */
enum gguf_vtype gguf_kv_type(const gguf *g, int64_t i);
int gguf_get_u32(const gguf *g, const char *key, uint32_t *out, tg_err *e);
int gguf_get_i64(const gguf *g, const char *key, int64_t *out, tg_err *e);
int gguf_get_u64(const gguf *g, const char *key, uint64_t *out, tg_err *e);
/* f32 and f64 accept a value of either float type (f64 -> f32 rounds). */
int gguf_get_f32(const gguf *g, const char *key, float *out, tg_err *e);
int gguf_get_f64(const gguf *g, const char *key, double *out, tg_err *e);
int gguf_get_bool(const gguf *g, const char *key, int *out, tg_err *e);
int gguf_get_str(const gguf *g, const char *key, gguf_str *out, tg_err *e);
/* Arrays: element type and count; elements read by index (checked). */
int gguf_get_arr(const gguf *g, const char *key, enum gguf_vtype *etype,
                 uint64_t *count, tg_err *e);
int gguf_arr_str(const gguf *g, const char *key, uint64_t i, gguf_str *out, tg_err *e);
/* Element i of an array of any integer type (or bool), as int64 (a u64
 * element above INT64_MAX is an error). */
int gguf_arr_i64(const gguf *g, const char *key, uint64_t i, int64_t *out, tg_err *e);
/* Element i of an f32 or f64 array. */
int gguf_arr_f64(const gguf *g, const char *key, uint64_t i, double *out, tg_err *e);
/* Pointer to a fixed-size numeric array's raw little-endian elements, NULL
 * when absent or not such an array. The pointer is into the file and may be
 * unaligned: read elements with memcpy (or use gguf_arr_i64). */
const void *gguf_arr_data(const gguf *g, const char *key);

/* Tensors. */
int64_t gguf_n_tensors(const gguf *g);
const gguf_tensor *gguf_tensor_at(const gguf *g, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf *g, const char *name); /* NULL if absent */

/* Writer. Every add copies key and string values; tensor data is borrowed.
 * Adds return 0, or -1 on a duplicate key or name, a bad argument or out of
 * memory; the first such error sticks (gguf_writer_errmsg) and makes
 * gguf_writer_write fail with it, so callers may check once at the end.
 * Adding "general.alignment" (u32, a power of two) sets the alignment;
 * gguf_writer_new with an alignment other than 32 adds that key itself. */
typedef struct gguf_writer gguf_writer;
gguf_writer *gguf_writer_new(uint32_t alignment);  /* 0 means 32 */
void gguf_writer_free(gguf_writer *w);
int gguf_writer_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_bool(gguf_writer *w, const char *key, int v);
int gguf_writer_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_writer_f64(gguf_writer *w, const char *key, double v);
/* Any fixed-size scalar type (u8 .. f64, bool) from its little-endian bytes. */
int gguf_writer_scalar(gguf_writer *w, const char *key, enum gguf_vtype type, const void *v);
int gguf_writer_str(gguf_writer *w, const char *key, const char *v);
/* Arrays of strings (n entries, each NUL-terminated) and of numbers
 * (etype one of the fixed-size types, n elements at data). */
int gguf_writer_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int gguf_writer_arr(gguf_writer *w, const char *key, enum gguf_vtype etype,
                    const void *data, uint64_t n);
/* ne[0] innermost; nbytes must equal the size the type implies. */
int gguf_writer_tensor(gguf_writer *w, const char *name, uint32_t type,
                       uint32_t n_dims, const uint64_t *ne, const void *data,
                       uint64_t nbytes);
/* A tensor whose bytes are produced at write time, rows in order, so huge
 * models stream through a bounded buffer: fn fills dst with rows
 * [row0, row0 + n_rows) (a row is ne[0] values, rows counted over
 * ne[1]*ne[2]*ne[3]) and returns 0, or -1 with e set to abort the write. */
typedef int (*gguf_fill_fn)(void *user, uint64_t row0, uint64_t n_rows, void *dst, tg_err *e);
int gguf_writer_tensor_fn(gguf_writer *w, const char *name, uint32_t type,
                          uint32_t n_dims, const uint64_t *ne, gguf_fill_fn fn, void *user);
const char *gguf_writer_errmsg(const gguf_writer *w);  /* "" when none */
/* Writes the file (to path.tmp, then rename). Returns 0 or -1 with e. */
int gguf_writer_write(gguf_writer *w, const char *path, tg_err *e);
/* Same, into a malloc'ed buffer the caller frees (tests, fuzzing). */
int gguf_writer_write_buf(gguf_writer *w, void **out, size_t *n, tg_err *e);

#endif
