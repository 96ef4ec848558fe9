/*
 * common.c: the shared harness helpers of common.h: x*() allocation that
 * exits 70 on failure, whole-file reading that refuses non-regular files,
 * the store's error sentence, the dump blob codec, outputs written to a
 * temporary file and renamed into place (never onto the store), terminal
 * and markup-safe text, saturating adds and the getopt_long loop.
 */
#include "common.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

/* ---- allocation ---- */

/* Never returns: the one out-of-memory exit of the harness. */
void common_out_of_memory(size_t n)
{
    /* no allocation here: fprintf to an unbuffered stderr needs none */
    fprintf(stderr, "tokgate: out of memory (%zu bytes)\n", n);
    exit(COMMON_EXIT_OOM);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) common_out_of_memory(n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) common_out_of_memory(n * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) common_out_of_memory(n);
    return q;
}

char *xstrdup(const char *s)
{
    return xstrndup(s ? s : "", SIZE_MAX);
}

char *xstrndup(const char *s, size_t n)
{
    size_t k = strnlen(s ? s : "", n);
    char *d = xmalloc(k + 1);
    memcpy(d, s ? s : "", k);
    d[k] = 0;
    return d;
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    char *s = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- input files ---- */

/* What st is, for messages: "a folder", "a FIFO", ... */
static const char *file_kind(const struct stat *st)
{
    if (S_ISDIR(st->st_mode)) return "a folder";
    if (S_ISFIFO(st->st_mode)) return "a FIFO";
    if (S_ISCHR(st->st_mode)) return "a character device";
    if (S_ISBLK(st->st_mode)) return "a block device";
    if (S_ISSOCK(st->st_mode)) return "a socket";
    return "not a regular file";
}

int common_check_regular(const char *path, const char *what, tg_err *e)
{
    struct stat st;
    if (stat(path, &st) != 0) return tg_errf(e, "%s %s: %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return tg_errf(e, "%s %s: expected a regular file, got %s", what, path, file_kind(&st));
    return 0;
}

int common_read_file(const char *path, size_t max, char **out, size_t *len, tg_err *e)
{
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return tg_errf(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return tg_errf(e, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tg_errf(e, "%s: expected a regular file, got %s", path, file_kind(&st));
    }
    if ((uint64_t)st.st_size > (uint64_t)max) {
        close(fd);
        return tg_errf(e, "%s: larger than %zu bytes (%lld), expected a small text file", path, max,
                       (long long)st.st_size);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *b = xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            /* the file grew while being read: read on, up to max */
            if (cap > max) {
                close(fd);
                free(b);
                return tg_errf(e, "%s: larger than %zu bytes, expected a small text file", path, max);
            }
            cap *= 2;
            b = xrealloc(b, cap + 1);
        }
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int err = errno;
            close(fd);
            free(b);
            return tg_errf(e, "%s: read error: %s", path, strerror(err));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (n > max) {
        free(b);
        return tg_errf(e, "%s: larger than %zu bytes, expected a small text file", path, max);
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

/* ---- SQL ---- */

int common_sql_err(sqlite3 *db, tg_err *e, const char *what)
{
    return tg_errf(e, "store: %s: %s", what, db ? sqlite3_errmsg(db) : "no database");
}

/* Binds ?1, ?2, ... of q from ap, one letter of binds each (common_sql_prepare);
 * texts with the destructor `text` (SQLITE_STATIC or SQLITE_TRANSIENT). */
static void sql_bind(sqlite3_stmt *q, const char *binds, sqlite3_destructor_type text, va_list ap)
{
    for (int i = 0; binds[i]; i++) {
        switch (binds[i]) {
        case 'I': sqlite3_bind_int64(q, i + 1, va_arg(ap, int64_t)); break;
        case 'N': {
            const int64_t x = va_arg(ap, int64_t);
            if (x >= 1) sqlite3_bind_int64(q, i + 1, x); else sqlite3_bind_null(q, i + 1);
            break;
        }
        case 'i': sqlite3_bind_int(q, i + 1, va_arg(ap, int)); break;
        case 'n': {
            const int x = va_arg(ap, int);
            if (x >= 0) sqlite3_bind_int(q, i + 1, x); else sqlite3_bind_null(q, i + 1);
            break;
        }
        case 'd': sqlite3_bind_double(q, i + 1, va_arg(ap, double)); break;
        case 'D': {
            const double x = va_arg(ap, double);
            if (isfinite(x)) sqlite3_bind_double(q, i + 1, x); else sqlite3_bind_null(q, i + 1);
            break;
        }
        case 't': sqlite3_bind_text(q, i + 1, va_arg(ap, const char *), -1, text); break;
        default: assert(!"common_sql binds take I, N, i, n, d, D and t");
        }
    }
}

struct sqlite3_stmt *common_sql_prepare(struct sqlite3 *db, const char *sql, const char *binds, ...)
{
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) {
        sqlite3_finalize(q);
        return NULL;
    }
    va_list ap;
    va_start(ap, binds);
    sql_bind(q, binds, SQLITE_STATIC, ap);
    va_end(ap);
    return q;
}

int common_sql_step(struct sqlite3_stmt *q, const char *binds, ...)
{
    sqlite3_reset(q);
    va_list ap;
    va_start(ap, binds);
    sql_bind(q, binds, SQLITE_TRANSIENT, ap);
    va_end(ap);
    return sqlite3_step(q);
}

/* ---- dump blobs ---- */

int common_blob_encode(const float *x, int64_t n, void **blob, size_t *len, tg_err *e)
{
    *blob = NULL;
    *len = 0;
    if (n < 0 || n > COMMON_BLOB_MAX_N)
        return tg_errf(e, "dump of %lld values: expected 0..%lld", (long long)n,
                       (long long)COMMON_BLOB_MAX_N);
    size_t raw = (size_t)n * 4, bound = ZSTD_compressBound(raw);
    unsigned char *shuf = xmalloc(raw), *z = xmalloc(bound);
    const unsigned char *src = (const unsigned char *)x;
    for (int64_t k = 0; k < n; k++)
        for (int b = 0; b < 4; b++) shuf[(size_t)b * (size_t)n + (size_t)k] = src[4 * k + b];
    size_t zn = ZSTD_compress(z, bound, shuf, raw, 3);
    free(shuf);
    if (ZSTD_isError(zn)) {
        free(z);
        return tg_errf(e, "dump blob: zstd: %s", ZSTD_getErrorName(zn));
    }
    *blob = z;
    *len = zn;
    return 0;
}

int common_blob_decode(const void *blob, size_t len, float *x, int64_t n, tg_err *e)
{
    if (n < 0 || n > COMMON_BLOB_MAX_N)
        return tg_errf(e, "dump of %lld values: expected 0..%lld", (long long)n,
                       (long long)COMMON_BLOB_MAX_N);
    size_t raw = (size_t)n * 4;
    unsigned long long fr = blob ? ZSTD_getFrameContentSize(blob, len) : ZSTD_CONTENTSIZE_ERROR;
    if (fr == ZSTD_CONTENTSIZE_ERROR || fr == ZSTD_CONTENTSIZE_UNKNOWN || fr != raw)
        return tg_errf(e, "dump blob: not a zstd frame of %zu bytes", raw);
    unsigned char *shuf = xmalloc(raw);
    size_t got = ZSTD_decompress(shuf, raw, blob, len);
    if (ZSTD_isError(got) || got != raw) {
        free(shuf);
        return tg_errf(e, "dump blob: zstd: %s", ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
    }
    unsigned char *dst = (unsigned char *)x;
    for (int64_t k = 0; k < n; k++)
        for (int b = 0; b < 4; b++) dst[4 * k + b] = shuf[(size_t)b * (size_t)n + (size_t)k];
    free(shuf);
    return 0;
}

/* ---- output files ---- */

int common_mkdirs(const char *path, tg_err *e)
{
    if (!path || !*path) return 0;
    char *p = xstrdup(path);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        struct stat st;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            rc = tg_errf(e, "cannot make folder %s: %s", p, strerror(errno));
            break;
        }
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = tg_errf(e, "%s: expected a folder", p);
            break;
        }
        *s = c;
        if (!c) break;
        while (s[1] == '/') s++;
        if (!s[1]) break;
    }
    free(p);
    return rc;
}

/* The folder part of path ("." when none), malloc'ed. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return xstrdup(".");
    if (slash == path) return xstrdup("/");
    return xstrndup(path, (size_t)(slash - path));
}

/* realpath of path's folder + "/" + its last part: a canonical name also
 * for a file that does not exist yet. NULL when the folder does not
 * exist. */
static char *canon(const char *path)
{
    char *dir = dir_of(path), real[PATH_MAX];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    char *r = realpath(dir, real) ? xasprintf("%s/%s", real, base) : NULL;
    free(dir);
    return r;
}

/* 1 when out is the file db (or db + suffix): same device and inode when
 * both exist, else the same canonical path. */
static int same_file(const char *out, const char *db, const char *suffix)
{
    char *p = xasprintf("%s%s", db, suffix);
    struct stat a, b;
    int same = 0;
    if (stat(out, &a) == 0 && stat(p, &b) == 0) same = a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    else {
        char *co = canon(out), *cp = canon(p);
        same = co && cp && !strcmp(co, cp);
        free(co);
        free(cp);
    }
    free(p);
    return same;
}

int common_out_check(const char *path, const char *db, const char *what, tg_err *e)
{
    if (!path || !*path) return tg_errf(e, "%s: expected a file name", what);
    if (!strcmp(path, "-")) return 0;
    if (db) {
        static const char *const suffix[] = {"", "-wal", "-shm", "-journal", "-runlock"};
        for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++)
            if (same_file(path, db, suffix[i]))
                return tg_errf(e, "%s %s: that is the store %s%s; refusing to overwrite it (give another file)",
                               what, path, db, suffix[i]);
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return tg_errf(e, "%s %s: expected a file, got a folder", what, path);
    char *dir = dir_of(path);
    int rc = common_mkdirs(dir, e);
    free(dir);
    if (rc < 0) return tg_err_prefix(e, "%s %s", what, path);
    return 0;
}

int common_out_open(common_out *o, const char *path, const char *db, const char *what, tg_err *e)
{
    memset(o, 0, sizeof *o);
    if (!path || !strcmp(path, "-")) {
        o->f = stdout;
        return 0;
    }
    if (common_out_check(path, db, what, e) < 0) return -1;
    char *tmp = xasprintf("%s.tmp-XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        tg_errf(e, "%s %s: cannot create a temporary file beside it: %s", what, path, strerror(errno));
        free(tmp);
        return -1;
    }
    /* mkostemp makes 0600; an output gets the mode a plain fopen gives */
    mode_t um = umask(0);
    umask(um);
    fchmod(fd, 0666 & ~um);
    o->f = fdopen(fd, "w");
    if (!o->f) {
        tg_errf(e, "%s %s: %s", what, path, strerror(errno));
        close(fd);
        unlink(tmp);
        free(tmp);
        return -1;
    }
    o->path = xstrdup(path);
    o->tmp = tmp;
    return 0;
}

int common_out_close(common_out *o, int ok, tg_err *e)
{
    if (!o->f) return 0;
    int rc = 0;
    if (o->f == stdout) {
        if (fflush(stdout) != 0 || ferror(stdout)) rc = tg_errf(e, "stdout: write error");
        o->f = NULL;
        return rc;
    }
    int bad = fflush(o->f) != 0 || ferror(o->f);
    if (!bad && ok && fsync(fileno(o->f)) != 0 && errno != EINVAL) bad = 1;
    if (fclose(o->f) != 0) bad = 1;
    o->f = NULL;
    if (bad) rc = tg_errf(e, "%s: write error (%s left unchanged)", o->path, o->path);
    if (!bad && ok && rename(o->tmp, o->path) != 0)
        rc = tg_errf(e, "%s: cannot rename %s onto it: %s", o->path, o->tmp, strerror(errno));
    if (rc < 0 || !ok) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    o->tmp = o->path = NULL;
    return rc;
}

/* ---- text ---- */

char *common_text_safe(const char *src, char *dst, size_t cap)
{
    if (!cap) return dst;
    size_t k = 0;
    for (const unsigned char *s = (const unsigned char *)(src ? src : ""); *s; s++) {
        if ((*s < 0x20 && *s != '\n' && *s != '\t') || *s == 0x7f) {
            if (k + 4 >= cap) break;
            snprintf(dst + k, cap - k, "\\x%02x", *s);
            k += 4;
        } else {
            if (k + 1 >= cap) break;
            dst[k++] = (char)*s;
        }
    }
    dst[k] = 0;
    return dst;
}

/* ---- counters ---- */

int64_t common_add_sat(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return a > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* ---- command lines ---- */

int common_cli_parse_list(const common_cli *cli, int argc, char **argv, common_cli_fn on_opt, void *ud,
                          const char ***pos, int *n_pos)
{
    *pos = xcalloc((size_t)cli->max_pos + 1, sizeof **pos);
    int rc = common_cli_parse(cli, argc, argv, on_opt, ud, *pos, n_pos);
    if (rc != COMMON_CLI_OK) {
        free(*pos);
        *pos = NULL;
    }
    return rc;
}

int common_parse_long(const char *s, long lo, long hi, long *v)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (!*s || *end || errno || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

int common_parse_int(const char *s, int lo, int hi, int *v)
{
    long x;
    if (common_parse_long(s, lo, hi, &x) < 0) return -1;
    *v = (int)x;
    return 0;
}

int common_cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) return 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    }
    return 0;
}

enum { CLI_HELP_ID = 0x10000 };

int common_cli_parse(const common_cli *cli, int argc, char **argv, common_cli_fn on_opt, void *ud,
                     const char **pos, int *n_pos)
{
    *n_pos = 0;
    int n = 0;
    while (cli->opts && cli->opts[n].name) {
        assert(cli->opts[n].val >= COMMON_CLI_FIRST_ID && cli->opts[n].val < CLI_HELP_ID && !cli->opts[n].flag);
        n++;
    }
    struct option *lo = xcalloc((size_t)n + 2, sizeof *lo);
    memcpy(lo, cli->opts, sizeof *lo * (size_t)n);
    lo[n] = (struct option){"help", no_argument, NULL, CLI_HELP_ID};
    char optstr[64];
    snprintf(optstr, sizeof optstr, "-:h%s", cli->shorts ? cli->shorts : "");
    int rc = COMMON_CLI_OK;
    opterr = 0;
    optind = 0;   /* GNU: a fresh scan (a command may be parsed more than once in tests) */
    for (;;) {
        int li = -1;
        /* leading '-': positionals come back in order as option 1 */
        int c = getopt_long(argc, argv, optstr, lo, &li);
        if (c == -1) break;
        const char *word = argv[optind - 1];
        if (c == 1) {
            if (*n_pos >= cli->max_pos) {
                fprintf(stderr, "tokgate %s: unexpected argument '%s' (see tokgate %s --help)\n",
                        cli->command, optarg, cli->command);
                rc = 2;
                break;
            }
            pos[(*n_pos)++] = optarg;
            continue;
        }
        if (c == 'h' || c == CLI_HELP_ID) {
            fputs(cli->usage, stdout);
            rc = COMMON_CLI_HELP;
            break;
        }
        if (c == '?') {
            char shown[64];
            if (!strncmp(word, "--", 2) || optopt <= ' ' || optopt >= 127) {
                snprintf(shown, sizeof shown, "%.60s", word);
                char *eq = strchr(shown, '=');   /* "--flag=1": name the option */
                if (eq && shown[1] == '-') *eq = 0;
            } else
                snprintf(shown, sizeof shown, "-%c", optopt);
            fprintf(stderr, "tokgate %s: unknown option '%s' (see tokgate %s --help)\n", cli->command,
                    shown, cli->command);
            rc = 2;
            break;
        }
        if (c == ':') {
            fprintf(stderr, "tokgate %s: option '%s' needs a value (see tokgate %s --help)\n",
                    cli->command, word, cli->command);
            rc = 2;
            break;
        }
        tg_err e = {{0}};
        if (on_opt(ud, c, optarg, &e) < 0) {
            fprintf(stderr, "tokgate %s: %s\n", cli->command, e.msg);
            rc = 2;
            break;
        }
    }
    /* what follows "--" is positional */
    for (int i = optind; rc == COMMON_CLI_OK && i < argc; i++) {
        if (*n_pos >= cli->max_pos) {
            fprintf(stderr, "tokgate %s: unexpected argument '%s' (see tokgate %s --help)\n", cli->command,
                    argv[i], cli->command);
            rc = 2;
            break;
        }
        pos[(*n_pos)++] = argv[i];
    }
    free(lo);
    return rc;
}
