/*
 * common.h: the small helpers every harness module shares, written once:
 * allocation with one out-of-memory policy, reading a whole input file,
 * the SQL error sentence, the dump blob codec, output files that never
 * clobber the store, text made safe for terminals and markup, saturating
 * counters, and the getopt_long loop of every tokgate command.
 * (engine/util.h has the error buffer, hashing, top-k and the clock; this
 * file does not repeat them.)
 *
 * Out-of-memory policy: allocation failure is not an input error, and no
 * caller can do anything useful about it, so the x*() functions never
 * return NULL: they print "tokgate: out of memory (N bytes)" on stderr and
 * exit with status 70 (EX_SOFTWARE). Every harness file allocates through
 * them; none checks for NULL or calls abort() on allocation.
 *
 * Ownership: results handed out (buffers, strings, blobs) are malloc'ed and
 * owned by the caller; every pointer argument is borrowed for the call.
 */
#ifndef TG_COMMON_H
#define TG_COMMON_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

struct sqlite3;

/* ---- allocation (never NULL; exit 70 on failure) ---- */

#define COMMON_EXIT_OOM 70

void *xmalloc(size_t n);                 /* n 0 allocates 1 byte */
void *xcalloc(size_t n, size_t size);    /* zeroed; n or size 0 allocates 1 byte */
void *xrealloc(void *p, size_t n);       /* n 0 keeps 1 byte */
char *xstrdup(const char *s);            /* NULL duplicates "" */
char *xstrndup(const char *s, size_t n); /* at most n bytes, NUL-terminated */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The policy itself, for allocations made by a library (jansson's dumps):
 * prints the message and exits 70. */
__attribute__((noreturn)) void common_out_of_memory(size_t n);

/* ---- input files ---- */

/* Reads the whole regular file at path into a NUL-terminated buffer (*out,
 * *len bytes without the NUL). A path that is not a regular file (a FIFO,
 * /dev/zero, a folder) is refused without blocking: reading one could hang
 * or never end. A file larger than max bytes is refused. Returns 0, or -1
 * with e ("PATH: cannot open: ...", "PATH: not a regular file (a FIFO)",
 * "PATH: larger than N bytes", "PATH: read error: ..."). */
int common_read_file(const char *path, size_t max, char **out, size_t *len, tg_err *e);

/* 0 when path names a regular file (after symlinks), else -1 with e
 * naming path, what it is and `what` ("model.path"). Opens nothing. */
int common_check_regular(const char *path, const char *what, tg_err *e);

/* ---- SQL ---- */

/* Writes "store: WHAT: <sqlite's message>" into e; returns -1. */
int common_sql_err(struct sqlite3 *db, tg_err *e, const char *what);

struct sqlite3_stmt;
/* Prepares sql on db and binds its parameters ?1, ?2, ... in order from
 * the arguments, one letter of binds each: 'I' an int64_t, 'N' an int64_t
 * that binds NULL when < 1 (a row id, 0 none), 'i' an int, 'n' an int that
 * binds NULL when negative (a token id, -1 unknown), 'd' a double, 'D' a
 * double that binds NULL when not finite, 't' a const char *
 * text (NULL binds NULL; bound without a copy, so it must outlive the
 * statement's use). Returns the statement, or NULL when sqlite refuses sql
 * (sqlite3_errmsg(db) says why). */
struct sqlite3_stmt *common_sql_prepare(struct sqlite3 *db, const char *sql, const char *binds, ...);

/* One row of a prepared statement used again and again (an INSERT in a
 * loop): resets q, binds all its parameters from the arguments with the
 * letters of common_sql_prepare (texts copied here, so they need not
 * outlive the call) and steps it once. Returns sqlite3_step's code
 * (SQLITE_DONE for a written row). */
int common_sql_step(struct sqlite3_stmt *q, const char *binds, ...);

/* ---- dump blobs: zstd over byte-shuffled little-endian f32 ---- */

/* The largest n a dump blob holds (2^30 values, 4 GiB of f32). */
#define COMMON_BLOB_MAX_N ((int64_t)1 << 30)

/* Encodes n f32 values: byte plane b of value k goes to b*n + k (all first
 * bytes, then all second bytes, ...), then one zstd frame (level 3) that
 * records the raw size. Returns 0 with *blob (malloc'ed) and *len, or -1
 * with e (n out of 0..COMMON_BLOB_MAX_N, a zstd error). */
int common_blob_encode(const float *x, int64_t n, void **blob, size_t *len, tg_err *e);
/* Decodes a blob of exactly n values into x[0..n-1]. Returns 0, or -1 with
 * e (not a zstd frame of 4n bytes, corrupt frame, n out of range). */
int common_blob_decode(const void *blob, size_t len, float *x, int64_t n, tg_err *e);

/* ---- output files ---- */

/* An output being written: a temporary file beside the final path, renamed
 * into place by common_out_close, or stdout. */
typedef struct common_out {
    FILE *f;                 /* write here */
    char *path;              /* the final path, NULL for stdout */
    char *tmp;               /* the temporary beside it, NULL for stdout */
} common_out;

/* Checks, before any work is done, that path may become an output of
 * `what` ("--out"): it is not the store db (the same file as db, or as its
 * -wal, -shm, -journal or -runlock file, by device and inode or, for files that do
 * not exist yet, by canonical path), not a folder, and its folder exists
 * or can be made (made now, with parents). db may be NULL. Returns 0, or
 * -1 with e. */
int common_out_check(const char *path, const char *db, const char *what, tg_err *e);

/* Checks path as common_out_check, then opens a fresh temporary file in
 * its folder (path NULL or "-": stdout, nothing to check). Returns 0 with
 * *o, or -1 with e. */
int common_out_open(common_out *o, const char *path, const char *db, const char *what, tg_err *e);

/* Ends an output: when ok, flushes, syncs and renames the temporary onto
 * the final path (an earlier file there is replaced whole, never half
 * written); when !ok, or on a write error, removes the temporary and leaves
 * the final path as it was. stdout is flushed. Returns 0, or -1 with e
 * naming the path (a write error). Safe on a zeroed or closed *o. */
int common_out_close(common_out *o, int ok, tg_err *e);

/* Makes folder path and its parents (mode 0777 before the umask). Returns
 * 0 (also when it exists as a folder), or -1 with e naming the part that
 * failed. */
int common_mkdirs(const char *path, tg_err *e);

/* ---- text ---- */

/* Copies src into dst[cap] with every C0 control byte but '\n' and '\t',
 * and DEL, written as "\xNN" (an ANSI escape from a worker's message
 * cannot reach a terminal). Truncates to fit; returns dst. */
char *common_text_safe(const char *src, char *dst, size_t cap);

/* ---- counters ---- */

/* a + b, saturated at INT64_MAX / INT64_MIN instead of overflowing. */
int64_t common_add_sat(int64_t a, int64_t b);

/* ---- command lines (getopt_long) ---- */

/* One command's options: long options with the ids on_opt receives, each
 * id >= COMMON_CLI_FIRST_ID (getopt_long's own return values lie below).
 * The options --help and -h are added by common_cli_parse. */
#define COMMON_CLI_FIRST_ID 256
typedef struct common_cli {
    const char *command;         /* "report" (messages say "tokgate report: ...") */
    const char *usage;           /* the whole usage text, printed for --help */
    const struct option *opts;   /* { "db", required_argument, NULL, ID }, ..., {0} */
    int max_pos;                 /* positional arguments accepted */
    const char *shorts;          /* extra short options for getopt ("o:"), or NULL; on_opt
                                  * receives their letter as the id */
} common_cli;

/* Called for every option in order; returns 0, or -1 after writing into e
 * what was wrong with the value ("--jobs: expected an integer 1..256,
 * got 'x'"). */
typedef int (*common_cli_fn)(void *ud, int id, const char *value, tg_err *e);

/* The result of common_cli_parse besides the callbacks. */
#define COMMON_CLI_OK 0
#define COMMON_CLI_HELP (-1)     /* --help was given: usage printed on stdout */

/* Parses argv[1..argc-1] (argv[0] is the command word) with getopt_long,
 * options and positionals in any order ("--" ends the options). Collects
 * up to cli->max_pos positionals into pos[] (*n_pos). Returns COMMON_CLI_OK;
 * COMMON_CLI_HELP after printing cli->usage on stdout; or 2 (the usage exit
 * code) after printing one line on stderr naming the command and the
 * option: an unknown option, a missing value, a value on_opt refused, one
 * positional too many. */
int common_cli_parse(const common_cli *cli, int argc, char **argv, common_cli_fn on_opt, void *ud,
                     const char **pos, int *n_pos);

/* common_cli_parse into a positional list it allocates (cli->max_pos + 1
 * entries) into *pos: the caller frees it when COMMON_CLI_OK is returned;
 * otherwise nothing is left allocated (*pos NULL). */
int common_cli_parse_list(const common_cli *cli, int argc, char **argv, common_cli_fn on_opt, void *ud,
                          const char ***pos, int *n_pos);

/* Parses s as a whole decimal integer lo..hi into *v. Returns 0, or -1
 * (nothing written) for an empty string, trailing text, an overflow or a
 * value out of range; the caller names the option in its message. */
int common_parse_long(const char *s, long lo, long hi, long *v);

/* common_parse_long into an int. */
int common_parse_int(const char *s, int lo, int hi, int *v);

/* Whether argv[1..argc-1] asks for help (--help or -h before any "--").
 * For commands whose own parser lives elsewhere. */
int common_cli_wants_help(int argc, char **argv);

#endif
