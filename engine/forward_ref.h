/*
 * forward_ref.h: the ref tier's dot products and matmul (forward_ref.c),
 * exported for the tests that hold them to the scalar order. Not a public
 * interface: callers evaluate through model.h's sessions.
 *
 * One fixed order on every machine and ISA for the f64 sum of w[j] * x[j]
 * (j < n): eight running sums (element j goes to sum j % 8, each a multiply
 * then an add, never fused), added as ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)),
 * then the elements from n8 = n & ~7 on in order. The sums live in acc (8
 * doubles, lane k = sum k) between calls, so a row may be taken in blocks
 * of columns whose lengths are multiples of 8:
 *   tg_ref_acc        acc += w x over [0, n8) (n8 a multiple of 8), w f32
 *                     (converted to f64 exactly)
 *   tg_ref_acc_f64    the same with w already in f64
 *   tg_ref_acc4_rows  acc + 8r for the rows r < 4 of w (f32, row r at
 *                     w + r*ldw) against one x
 *   tg_ref_acc4_tok   acc + 8t for one row w (f64) against the vectors
 *                     t < 4 at x + t*ldx
 *   tg_ref_acc_sum    returns the tree of acc plus w[j] * x[j] for j < nt
 *                     in order (the tail; w f32)
 *   tg_ref_dot        the whole dot of n in one call.
 */
#ifndef TG_FORWARD_REF_H
#define TG_FORWARD_REF_H

#include <stdint.h>

#include "model.h"

void tg_ref_acc(const float *w, const double *x, int64_t n8, double acc[8]);
void tg_ref_acc_f64(const double *w, const double *x, int64_t n8, double acc[8]);
void tg_ref_acc4_rows(const float *w, int64_t ldw, const double *x, int64_t n8, double acc[32]);
void tg_ref_acc4_tok(const double *w, const double *x, int64_t ldx, int64_t n8, double acc[32]);
double tg_ref_acc_sum(const double acc[8], const float *w, const double *x, int64_t nt);
double tg_ref_dot(const float *w, const double *x, int64_t n);

/* The ref tier's matmul: out (n, w->rows) = W x for the n (1..32) vectors
 * x (n, w->cols) of a ref-tier session s (its threads), each output rounded
 * to f32 unless the f64 option is set. */
void tg_ref_matmul(tg_session *s, double *out, const tg_weight *w, const double *x, int n);

#endif
