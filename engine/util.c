/*
 * util.c: error formatting, hashing, logit digests and top-k selection
 * shared by the engine, the oracle worker and the harness.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

int tg_errf(tg_err *e, const char *fmt, ...)
{
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int tg_err_prefix(tg_err *e, const char *fmt, ...)
{
    if (!e) return -1;
    char old[sizeof e->msg];
    memcpy(old, e->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof e->msg - 2) {
        size_t used = (size_t)n;
        e->msg[used++] = ':';
        e->msg[used++] = ' ';
        size_t room = sizeof e->msg - used - 1, len = strnlen(old, sizeof old);
        if (len > room) len = room;
        memcpy(e->msg + used, old, len);
        e->msg[used + len] = 0;
    }
    return -1;
}

static void to_hex(const unsigned char *d, size_t n, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[2 * n] = 0;
}

int tg_sha256_file(const char *path, char hex[65], tg_err *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_errf(e, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int rc = -1;
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        tg_errf(e, "%s: SHA-256 context failed", path);
        goto out;
    }
    static __thread unsigned char buf[1 << 16];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR) continue;
            tg_errf(e, "%s: read failed: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0) break;
        EVP_DigestUpdate(ctx, buf, (size_t)r);
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    to_hex(md, 32, hex);
    rc = 0;
out:
    EVP_MD_CTX_free(ctx);
    close(fd);
    return rc;
}

void tg_sha256_buf(const void *data, size_t n, char hex[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(data, n, md, &mdlen, EVP_sha256(), NULL);
    to_hex(md, 32, hex);
}

void tg_digest_logits(const float *logits, size_t n, char hex[17])
{
    /* The digest is over the little-endian bytes; every target we build for
     * is little-endian, which this assert makes explicit. */
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian only");
    uint64_t h = XXH3_64bits(logits, n * sizeof(float));
    snprintf(hex, 17, "%016llx", (unsigned long long)h);
}

/* a ranks before b: larger logit first, NaN last, ties by lower id. */
static int top_before(float la, int32_t ia, float lb, int32_t ib)
{
    int na = isnan(la), nb = isnan(lb);
    if (na != nb) return nb;
    if (!na && la != lb) return la > lb;
    return ia < ib;
}

int tg_topk(const float *logits, int n, int k, tg_top *out)
{
    if (k > n) k = n;
    if (k <= 0) return 0;
    int cnt = 0;
    /* Insertion into a sorted array of k: O(n k) worst case, but most
     * logits fail the first comparison against the current k-th. */
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (cnt == k && !top_before(v, i, out[k - 1].logit, out[k - 1].id)) continue;
        int j = cnt < k ? cnt++ : k - 1;
        while (j > 0 && top_before(v, i, out[j - 1].logit, out[j - 1].id)) {
            out[j] = out[j - 1];
            j--;
        }
        out[j].id = i;
        out[j].logit = v;
    }
    return cnt;
}

int tg_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (top_before(logits[i], i, logits[best], best)) best = i;
    return best;
}

double tg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *tg_name_at(const char *const *names, int n, int i)
{
    return i >= 0 && i < n ? names[i] : "?";
}

int tg_name_index(const char *const *names, int n, const char *s)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}
