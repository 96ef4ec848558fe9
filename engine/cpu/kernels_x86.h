/*
 * kernels_x86.h: small helpers shared by the x86-64 kernel files
 * (kernels_avx2.c, kernels_avx512.c), compiled with each file's ISA flags
 * (at least AVX2, FMA, F16C).
 */
#ifndef TG_CPU_KERNELS_X86_H
#define TG_CPU_KERNELS_X86_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

#define TILE_INLINE static inline __attribute__((always_inline))

static inline float half_to_f32(tg_half h)
{
    return _cvtsh_ss(h);
}

static inline int hsum_epi32_128(__m128i v)
{
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

/* The int32 at byte offset off of NR (1..4) blocks bx bytes apart, in
 * lanes 0..NR-1 (built in registers: a stack round trip would stall store
 * forwarding). */
TILE_INLINE __m128i dwords(const uint8_t *x, size_t bx, size_t off, const int NR)
{
    int32_t u[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) memcpy(&u[r], x + r * bx + off, 4);
    return NR == 1 ? _mm_cvtsi32_si128(u[0]) : _mm_setr_epi32(u[0], u[1], u[2], u[3]);
}

/* The low (half 0) or high (half 1) fp16 of 4 int32 lanes, as floats. */
static inline __m128 half_f32(__m128i v, int half)
{
    const __m128i pick = half ? _mm_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)
                              : _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    return _mm_cvtph_ps(_mm_shuffle_epi8(v, pick));
}

/* Bytes past the next rows that prefetch_next_rows reaches: on short rows
 * (1024 values) the next four rows alone are not far enough ahead for
 * memory's latency (measured on the 2-core AVX-512 machine: q4_K rows of
 * 1024 from memory 25-27 GB/s with none, 34-36 with 2 KiB; hardware
 * prefetch alone gives 15-20). */
#define PREFETCH_AHEAD 2048

/* Prefetches part i of `parts` of the nr rows (bx bytes apart) that follow
 * PREFETCH_AHEAD bytes after the nr rows at x: a row range's next rows are
 * its next bytes, so the rows a kernel reads next are on their way while it
 * works through these (past a matrix's end this only costs a little
 * bandwidth). */
TILE_INLINE void prefetch_next_rows(const void *x, size_t bx, int nr, int i, int parts)
{
    const size_t span = (size_t)nr * bx, part = (span + (size_t)parts - 1) / (size_t)parts;
    const char *p = (const char *)x + span + PREFETCH_AHEAD + (size_t)i * part;
    for (size_t o = 0; o < part; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

#endif
