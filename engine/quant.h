/*
 * quant.h: tensor types, quantization block formats and the per-type trait
 * table. One header for the CPU code (C) and the GPU code (CUDA/HIP C++):
 * keep it free of anything either side cannot compile.
 *
 * Layouts follow ggml exactly (docs/formats.md, "Block formats"); every struct's
 * size is checked at compile time. `tg_half` is IEEE binary16 stored as its
 * bits, `tg_bf16` bfloat16 likewise.
 */
#ifndef TG_QUANT_H
#define TG_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define TG_STATIC_ASSERT(c, m) static_assert(c, m)
extern "C" {
#else
#define TG_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* ggml type ids, as stored in GGUF tensor infos. */
enum tg_type {
    TG_TYPE_F32 = 0, TG_TYPE_F16 = 1, TG_TYPE_Q4_0 = 2, TG_TYPE_Q4_1 = 3,
    TG_TYPE_Q5_0 = 6, TG_TYPE_Q5_1 = 7, TG_TYPE_Q8_0 = 8, TG_TYPE_Q8_1 = 9,
    TG_TYPE_Q2_K = 10, TG_TYPE_Q3_K = 11, TG_TYPE_Q4_K = 12, TG_TYPE_Q5_K = 13,
    TG_TYPE_Q6_K = 14, TG_TYPE_Q8_K = 15, TG_TYPE_BF16 = 30,
    TG_TYPE_COUNT = 31
};

/* general.file_type values tg-mkmodel writes. */
enum tg_ftype {
    TG_FTYPE_ALL_F32 = 0, TG_FTYPE_MOSTLY_F16 = 1, TG_FTYPE_MOSTLY_Q8_0 = 7,
    TG_FTYPE_MOSTLY_Q4_K_M = 15, TG_FTYPE_MOSTLY_Q6_K = 18, TG_FTYPE_MOSTLY_BF16 = 32
};

typedef uint16_t tg_half;
typedef uint16_t tg_bf16;

#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* Q8_0: 32 values, 8.5 bits per weight. value = d * qs[i]. */
typedef struct {
    tg_half d;
    int8_t qs[QK8_0];
} block_q8_0;
TG_STATIC_ASSERT(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 size");

/* Q4_0: 32 values, 4.5 bits per weight. value = d * (q - 8); qs[j] holds
 * value j in its low nibble and value j + 16 in its high one. */
#define QK4_0 32
typedef struct {
    tg_half d;
    uint8_t qs[QK4_0 / 2];
} block_q4_0;
TG_STATIC_ASSERT(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 size");

/* Q5_0: 32 values, 5.5 bits per weight. value = d * (q - 16); the low four
 * bits as Q4_0, bit 4 of value j in bit j of qh (little-endian u32). */
#define QK5_0 32
typedef struct {
    tg_half d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;
TG_STATIC_ASSERT(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 size");

/* Q4_1: 32 values, 5 bits per weight. value = d * q + m, q in 0..15 in
 * Q4_0's nibble order. */
#define QK4_1 32
typedef struct {
    tg_half d;
    tg_half m;
    uint8_t qs[QK4_1 / 2];
} block_q4_1;
TG_STATIC_ASSERT(sizeof(block_q4_1) == 4 + QK4_1 / 2, "block_q4_1 size");

/* Q5_1: 32 values, 6 bits per weight. value = d * q + m, q in 0..31 with
 * Q5_0's bit layout. */
#define QK5_1 32
typedef struct {
    tg_half d;
    tg_half m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;
TG_STATIC_ASSERT(sizeof(block_q5_1) == 4 + 4 + QK5_1 / 2, "block_q5_1 size");

/* Q8_1: 32 values (d, s = d * sum(qs)), the CUDA backend's activation type. */
typedef struct {
    tg_half d;
    tg_half s;
    int8_t qs[QK8_0];
} block_q8_1;
TG_STATIC_ASSERT(sizeof(block_q8_1) == 4 + QK8_0, "block_q8_1 size");

/* Q2_K: 256 values in 16 sub-blocks of 16, 2.625 bits per weight.
 * value = (d * (scales[j] & 15)) * q - dmin * (scales[j] >> 4), q in 0..3;
 * value 128h + 32k + l (l < 32) is bits 2k..2k+1 of qs[32h + l]. */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    tg_half d;
    tg_half dmin;
} block_q2_K;
TG_STATIC_ASSERT(sizeof(block_q2_K) == QK_K / 16 + QK_K / 4 + 4, "block_q2_K size");

/* Q3_K: 256 values in 16 sub-blocks of 16, 3.4375 bits per weight.
 * value = (d * (sc[j] - 32)) * (q - 4), q in 0..7: its low two bits as
 * Q2_K's, bit 2 is bit v / 32 of hmask[v % 32]; sixteen 6-bit scales
 * packed in scales[12]. */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    tg_half d;
} block_q3_K;
TG_STATIC_ASSERT(sizeof(block_q3_K) == QK_K / 8 + QK_K / 4 + 12 + 2, "block_q3_K size");

/* Q4_K: 256 values in 8 sub-blocks of 32, 4.5 bits per weight.
 * value = d * sc[j] * q - dmin * m[j], 6-bit sc/m packed in scales[12]. */
typedef struct {
    tg_half d;
    tg_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;
TG_STATIC_ASSERT(sizeof(block_q4_K) == 4 + K_SCALE_SIZE + QK_K / 2, "block_q4_K size");

/* Q5_K: as Q4_K plus the fifth bit in qh, 5.5 bits per weight. */
typedef struct {
    tg_half d;
    tg_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
TG_STATIC_ASSERT(sizeof(block_q5_K) == 4 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2, "block_q5_K size");

/* Q6_K: 256 values in 16 sub-blocks of 16, 6.5625 bits per weight.
 * value = d * scales[is] * (q - 32). */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    tg_half d;
} block_q6_K;
TG_STATIC_ASSERT(sizeof(block_q6_K) == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, "block_q6_K size");

/* Q8_K: activation type of K-quant dot products (never stored in files). */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;
TG_STATIC_ASSERT(sizeof(block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "block_q8_K size");

/* Scalar conversions (exact IEEE round-to-nearest-even). */
float tg_half_to_f32(tg_half h);
tg_half tg_f32_to_half(float f);
float tg_bf16_to_f32(tg_bf16 h);
tg_bf16 tg_f32_to_bf16(float f);   /* round to nearest even, NaN kept quiet */

/* Reference row kernels: k values (a multiple of the block size). */
typedef void (*tg_to_float_fn)(const void *x, float *y, int64_t k);
typedef void (*tg_from_float_fn)(const float *x, void *y, int64_t k);
/* *s = dot(x, y) over n values; x of this type, y of its vec_dot_type. */
typedef void (*tg_vec_dot_fn)(int n, float *s, const void *x, const void *y);

typedef struct tg_type_traits {
    const char *name;          /* "q4_K" as ggml spells it */
    int blck_size;             /* values per block */
    size_t type_size;          /* bytes per block */
    int is_quantized;
    tg_to_float_fn to_float;   /* scalar reference dequantize */
    tg_from_float_fn from_float; /* quantize (Q4_K/Q5_K/Q6_K: the vectorized scale search; the scalar reference is quant_ref.h) */
    enum tg_type vec_dot_type; /* activation type for vec_dot */
    tg_vec_dot_fn vec_dot;     /* scalar reference dot product */
} tg_type_traits;

/* The traits of a type this project supports (F32, F16, BF16, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, Q8_1 (to/from float only: the activations of Q4_1 and
 * Q5_1), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K), or NULL. */
const tg_type_traits *tg_traits(uint32_t type);
/* Bytes of a row of n values of type; 0 when n is not a multiple of the
 * block size or the type is unsupported. */
size_t tg_row_size(uint32_t type, int64_t n);
const char *tg_type_name(uint32_t type);  /* "?" when unknown */

/* Q4_K / Q5_K scale unpacking: sub-block j's 6-bit scale and min. */
static inline void tg_get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* Returns the bits of f32 f (a bit cast, no conversion). */
static inline uint32_t tg_f32_bits(float f)
{
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    return u;
}

/* Returns the f32 whose bits are u (a bit cast, no conversion). */
static inline float tg_bits_f32(uint32_t u)
{
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

#ifdef __cplusplus
}
#endif
#endif
