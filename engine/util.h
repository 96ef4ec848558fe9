/*
 * util.h: small pieces every tokgate module shares: the error-message
 * buffer that bad-input paths fill, file hashing (SHA-256 through
 * libcrypto), the per-step logit digest (XXH3-64 of the raw f32 bytes),
 * top-k selection with the protocol's ordering, and a monotonic clock.
 *
 * Error convention: a function that can fail on input returns 0 on success
 * and -1 on failure, after writing one sentence into a tg_err that names the
 * file / field / arm, where, and what was expected. Callers pass the tg_err
 * down unchanged or prefix their own context with tg_err_prefix().
 */
#ifndef TG_UTIL_H
#define TG_UTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct tg_err {
    char msg[1024];
} tg_err;

/* Formats into e (if e is not NULL); always returns -1 so callers can
 * `return tg_errf(e, "...")`. */
int tg_errf(tg_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "prefix: " to e's message; returns -1. */
int tg_err_prefix(tg_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* SHA-256 of a whole file as 64 lowercase hex chars + NUL into hex[65].
 * Returns 0, or -1 with e naming the path and the errno text. */
int tg_sha256_file(const char *path, char hex[65], tg_err *e);
/* SHA-256 of a buffer, hex as above. */
void tg_sha256_buf(const void *data, size_t n, char hex[65]);

/* XXH3-64 of n little-endian f32 logits, as 16 lowercase hex chars + NUL. */
void tg_digest_logits(const float *logits, size_t n, char hex[17]);

/* One entry of a top-k list. */
typedef struct tg_top {
    int32_t id;
    float logit;
} tg_top;

/* Writes the k largest logits into out[0..k-1], ordered by logit descending,
 * ties by lower id (so out[0] is the greedy argmax: the first maximum).
 * NaN sorts below every number. k is clamped to n; returns the count
 * written. */
int tg_topk(const float *logits, int n, int k, tg_top *out);

/* Index of the first maximum (greedy argmax as llama.cpp's sampler). */
int tg_argmax(const float *logits, int n);

/* Monotonic time in seconds. */
double tg_now(void);

/* A name table (the stages' names): names[i] for 0 <= i < n, else "?"; and
 * the index of s in names[0..n-1], or -1 (s NULL or not there). */
const char *tg_name_at(const char *const *names, int n, int i);
int tg_name_index(const char *const *names, int n, const char *s);

#endif
