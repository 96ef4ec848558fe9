/*
 * test_common.c: the shared harness helpers (harness/common.c): the
 * out-of-memory policy (exit 70 with one line), whole-file reading that
 * refuses FIFOs and devices without blocking, the store's error sentence,
 * the dump blob codec (round trip bit for bit, corrupt and wrong-size blobs
 * refused), outputs that refuse the store and its -wal/-shm files and are
 * renamed into place, terminal-safe text, saturating adds and the
 * getopt_long loop (options in any order, --help, unknown options, missing
 * values, "--").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "testenv.h"

#ifdef __SANITIZE_ADDRESS__
/* Under ASan an impossible malloc must return NULL (as glibc's does) for
 * the out-of-memory test to see the policy, not ASan's own report. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
#endif

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* ---- allocation ---- */

static void x_functions_allocate(void **st)
{
    (void)st;
    char *s = xstrdup("abc");
    assert_string_equal(s, "abc");
    free(s);
    s = xstrdup(NULL);
    assert_string_equal(s, "");
    free(s);
    s = xstrndup("abcdef", 3);
    assert_string_equal(s, "abc");
    free(s);
    s = xasprintf("%s-%d", "run", 7);
    assert_string_equal(s, "run-7");
    free(s);
    int *v = xcalloc(0, sizeof *v);   /* 0 still gives a pointer */
    assert_non_null(v);
    v = xrealloc(v, 100 * sizeof *v);
    v[99] = 1;
    free(v);
}

/* The policy: an impossible allocation ends the process with status 70 and
 * the one-line message, never NULL and never abort(). */
static void out_of_memory_exits_70(void **st)
{
    (void)st;
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        void *p = xmalloc(SIZE_MAX - 4096);
        _exit(p ? 3 : 4);   /* not reached */
    }
    close(pfd[1]);
    char buf[1024] = "";
    size_t have = 0;
    ssize_t n;
    /* read to the end: a sanitizer may write its own line first */
    while ((n = read(pfd[0], buf + have, sizeof buf - 1 - have)) > 0) have += (size_t)n;
    close(pfd[0]);
    buf[have] = 0;
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), COMMON_EXIT_OOM);
    assert_non_null(strstr(buf, "tokgate: out of memory ("));
}

/* ---- files ---- */

static void read_file_regular(void **st)
{
    (void)st;
    char p[PATH_MAX + 32];
    path_in(p, sizeof p, "f.txt");
    write_text(p, "line one\nline two\n");
    char *b;
    size_t n;
    tg_err e;
    assert_int_equal(common_read_file(p, 1 << 20, &b, &n, &e), 0);
    assert_int_equal(n, 18);
    assert_string_equal(b, "line one\nline two\n");
    free(b);
    /* too large for the limit */
    assert_int_equal(common_read_file(p, 10, &b, &n, &e), -1);
    assert_non_null(strstr(e.msg, "larger than 10 bytes"));
    /* missing */
    char q[PATH_MAX + 32];
    path_in(q, sizeof q, "nope.txt");
    assert_int_equal(common_read_file(q, 1 << 20, &b, &n, &e), -1);
    assert_non_null(strstr(e.msg, "cannot open"));
}

/* A FIFO with no writer and /dev/zero: refused at once, not read forever
 * (an alarm turns a hang into a failure). */
static void read_file_refuses_fifo_and_devices(void **st)
{
    (void)st;
    char p[PATH_MAX + 32];
    path_in(p, sizeof p, "fifo");
    assert_int_equal(mkfifo(p, 0600), 0);
    char *b;
    size_t n;
    tg_err e;
    alarm(10);
    assert_int_equal(common_read_file(p, 1 << 20, &b, &n, &e), -1);
    assert_non_null(strstr(e.msg, "a FIFO"));
    assert_int_equal(common_read_file("/dev/zero", 1 << 20, &b, &n, &e), -1);
    assert_non_null(strstr(e.msg, "character device"));
    assert_int_equal(common_read_file(g_dir, 1 << 20, &b, &n, &e), -1);
    assert_non_null(strstr(e.msg, "a folder"));
    alarm(0);
    assert_int_equal(common_check_regular("/dev/zero", "model.path", &e), -1);
    assert_non_null(strstr(e.msg, "model.path /dev/zero: expected a regular file"));
    assert_int_equal(common_check_regular(p, "prompts", &e), -1);
    path_in(p, sizeof p, "f.txt");
    write_text(p, "x");
    assert_int_equal(common_check_regular(p, "prompts", &e), 0);
}

static void sql_error_sentence(void **st)
{
    (void)st;
    sqlite3 *db;
    assert_int_equal(sqlite3_open(":memory:", &db), SQLITE_OK);
    sqlite3_stmt *s;
    assert_int_not_equal(sqlite3_prepare_v2(db, "SELECT * FROM missing_table", -1, &s, NULL), SQLITE_OK);
    tg_err e;
    assert_int_equal(common_sql_err(db, &e, "reading the run"), -1);
    assert_string_equal(e.msg, "store: reading the run: no such table: missing_table");
    sqlite3_close(db);
}

/* Every bind letter, its NULL cases, and a statement stepped again with
 * a text that is gone by then (common_sql_step copies it). */
static void sql_binds_and_steps(void **st)
{
    (void)st;
    sqlite3 *db;
    assert_int_equal(sqlite3_open(":memory:", &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(a, b, c, d, e, f, g)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_stmt *q = common_sql_prepare(db, "INSERT INTO t VALUES(?1,?2,?3,?4,?5,?6,?7)", "INinDdt",
                                         (int64_t)1 << 40, (int64_t)5, 7, 3, 0.5, 0.25, "x");
    assert_non_null(q);
    assert_int_equal(sqlite3_step(q), SQLITE_DONE);
    char *text = strdup("copied");
    assert_int_equal(common_sql_step(q, "INinDdt", (int64_t)2, (int64_t)0, -1, -1, NAN, NAN, text), SQLITE_DONE);
    free(text);
    assert_int_equal(common_sql_step(q, "INinDdt", (int64_t)3, (int64_t)-4, 0, 0, INFINITY, 1.0, NULL), SQLITE_DONE);
    sqlite3_finalize(q);
    q = common_sql_prepare(db, "SELECT group_concat(quote(a)||' '||quote(b)||' '||quote(c)||' '||quote(d)||' '||"
                               "quote(e)||' '||quote(f)||' '||quote(g), ' | ') FROM t", "");
    assert_non_null(q);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(q, 0),
                        "1099511627776 5 7 3 0.5 0.25 'x' | 2 NULL -1 NULL NULL NULL 'copied' | "
                        "3 NULL 0 0 NULL 1.0 NULL");
    sqlite3_finalize(q);
    assert_null(common_sql_prepare(db, "INSERT INTO missing_table VALUES(?1)", "i", 1));
    sqlite3_close(db);
}

/* ---- dump blobs ---- */

static void blob_round_trip(void **st)
{
    (void)st;
    float x[1000], y[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)sin(i * 0.37) * (float)(i % 7);
    x[3] = -0.0f;
    x[4] = NAN;
    x[5] = INFINITY;
    void *blob;
    size_t len;
    tg_err e;
    assert_int_equal(common_blob_encode(x, 1000, &blob, &len, &e), 0);
    assert_true(len > 0 && len < 4000);
    assert_int_equal(common_blob_decode(blob, len, y, 1000, &e), 0);
    assert_memory_equal(x, y, sizeof x);
    /* the wrong size and a damaged frame are refused */
    assert_int_equal(common_blob_decode(blob, len, y, 999, &e), -1);
    assert_non_null(strstr(e.msg, "not a zstd frame of 3996 bytes"));
    ((unsigned char *)blob)[len / 2] ^= 0x5a;
    ((unsigned char *)blob)[len - 1] ^= 0xff;
    int rc = common_blob_decode(blob, len, y, 1000, &e);
    assert_true(rc == -1 || memcmp(x, y, sizeof x) != 0);
    free(blob);
    assert_int_equal(common_blob_encode(x, -1, &blob, &len, &e), -1);
    assert_int_equal(common_blob_decode("junk", 4, y, 1, &e), -1);
    /* an empty dump is a valid blob */
    assert_int_equal(common_blob_encode(x, 0, &blob, &len, &e), 0);
    assert_int_equal(common_blob_decode(blob, len, y, 0, &e), 0);
    free(blob);
}

/* ---- outputs ---- */

static void out_refuses_the_store(void **st)
{
    (void)st;
    char db[PATH_MAX + 32], wal[PATH_MAX + 32], hard[PATH_MAX + 32], other[PATH_MAX + 32];
    path_in(db, sizeof db, "s.db");
    path_in(wal, sizeof wal, "s.db-wal");
    path_in(hard, sizeof hard, "link.txt");
    path_in(other, sizeof other, "out.txt");
    tg_err e;
    /* a store that does not exist yet is recognised by its canonical path */
    assert_int_equal(common_out_check(db, db, "--out", &e), -1);
    assert_non_null(strstr(e.msg, "that is the store"));
    char rel[PATH_MAX + 64];
    snprintf(rel, sizeof rel, "%s/./s.db", g_dir);
    assert_int_equal(common_out_check(rel, db, "--out", &e), -1);
    write_text(db, "not really sqlite, but the bytes must survive");
    write_text(wal, "w");
    assert_int_equal(link(db, hard), 0);   /* a hard link: same inode, other name */
    assert_int_equal(common_out_check(hard, db, "--out", &e), -1);
    assert_non_null(strstr(e.msg, "refusing to overwrite it"));
    assert_int_equal(common_out_check(wal, db, "--out", &e), -1);
    assert_non_null(strstr(e.msg, "-wal"));
    char shm[PATH_MAX + 32];
    path_in(shm, sizeof shm, "s.db-shm");
    assert_int_equal(common_out_check(shm, db, "--out", &e), -1);
    char lk[PATH_MAX + 32];
    path_in(lk, sizeof lk, "s.db-runlock");   /* the run lock file beside the store */
    assert_int_equal(common_out_check(lk, db, "--out", &e), -1);
    assert_non_null(strstr(e.msg, "-runlock"));
    /* common_out_open refuses the same way and leaves the store alone */
    common_out o;
    assert_int_equal(common_out_open(&o, db, db, "--out", &e), -1);
    struct stat sb;
    assert_int_equal(stat(db, &sb), 0);
    assert_int_equal(sb.st_size, strlen("not really sqlite, but the bytes must survive"));
    /* another file is fine; a folder is not */
    assert_int_equal(common_out_check(other, db, "--out", &e), 0);
    assert_int_equal(common_out_check(g_dir, db, "--out", &e), -1);
    assert_non_null(strstr(e.msg, "got a folder"));
    unlink(hard);
}

static void out_renames_into_place(void **st)
{
    (void)st;
    char p[PATH_MAX + 32];
    path_in(p, sizeof p, "out.txt");
    write_text(p, "old contents\n");
    tg_err e;
    common_out o;
    assert_int_equal(common_out_open(&o, p, NULL, "--out", &e), 0);
    assert_non_null(o.tmp);
    fputs("new contents\n", o.f);
    /* until the close, the old file is whole */
    char *b;
    size_t n;
    assert_int_equal(common_read_file(p, 1 << 20, &b, &n, &e), 0);
    assert_string_equal(b, "old contents\n");
    free(b);
    char tmp[PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s", o.tmp);
    assert_int_equal(common_out_close(&o, 1, &e), 0);
    assert_int_equal(common_read_file(p, 1 << 20, &b, &n, &e), 0);
    assert_string_equal(b, "new contents\n");
    free(b);
    assert_int_equal(access(tmp, F_OK), -1);
    /* a failed output leaves the old file and no temporary */
    assert_int_equal(common_out_open(&o, p, NULL, "--out", &e), 0);
    snprintf(tmp, sizeof tmp, "%s", o.tmp);
    fputs("half", o.f);
    assert_int_equal(common_out_close(&o, 0, &e), 0);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(common_read_file(p, 1 << 20, &b, &n, &e), 0);
    assert_string_equal(b, "new contents\n");
    free(b);
    /* parent folders are made */
    char deep[PATH_MAX + 64];
    snprintf(deep, sizeof deep, "%s/sub/deeper/r.md", g_dir);
    assert_int_equal(common_out_open(&o, deep, NULL, "--evidence", &e), 0);
    fputs("x", o.f);
    assert_int_equal(common_out_close(&o, 1, &e), 0);
    assert_int_equal(access(deep, F_OK), 0);
    /* stdout: nothing to check, nothing renamed */
    assert_int_equal(common_out_open(&o, NULL, NULL, "--out", &e), 0);
    assert_true(o.f == stdout);
    assert_int_equal(common_out_close(&o, 1, &e), 0);
}

/* ---- text, counters ---- */

static void text_safe_escapes_controls(void **st)
{
    (void)st;
    char out[64];
    common_text_safe("red \x1b[31mX\x1b[0m\tok\nnext\x7f", out, sizeof out);
    assert_string_equal(out, "red \\x1b[31mX\\x1b[0m\tok\nnext\\x7f");
    /* truncation keeps whole escapes */
    common_text_safe("\x1b\x1b\x1b", out, 7);
    assert_string_equal(out, "\\x1b");
}

static void add_saturates(void **st)
{
    (void)st;
    assert_int_equal(common_add_sat(2, 3), 5);
    assert_true(common_add_sat(INT64_MAX - 1, 5) == INT64_MAX);
    assert_true(common_add_sat(INT64_MIN + 1, -5) == INT64_MIN);
    assert_true(common_add_sat(INT64_MAX, INT64_MIN) == -1);
}

/* ---- command lines ---- */

/* Whole decimal integers in range; nothing written on a refusal. */
static void parse_int_whole_and_in_range(void **st)
{
    (void)st;
    long l = 7;
    int i = 7;
    assert_int_equal(common_parse_long("42", 1, 100, &l), 0);
    assert_int_equal(l, 42);
    assert_int_equal(common_parse_long("9223372036854775807", 1, LONG_MAX, &l), 0);
    assert_true(l == LONG_MAX);
    static const char *const bad[] = {"", "0", "101", "4x", " ", "-3", "99999999999999999999", "1.5", NULL};
    for (int k = 0; bad[k]; k++) {
        l = 7;
        assert_int_equal(common_parse_long(bad[k], 1, 100, &l), -1);
        assert_int_equal(l, 7);
        assert_int_equal(common_parse_int(bad[k], 1, 100, &i), -1);
        assert_int_equal(i, 7);
    }
    assert_int_equal(common_parse_int("100", 1, 100, &i), 0);
    assert_int_equal(i, 100);
}

enum { T_DB = COMMON_CLI_FIRST_ID, T_JOBS, T_FLAG };

typedef struct tctx {
    const char *db;
    int jobs, flag, calls;
} tctx;

static int t_opt(void *ud, int id, const char *v, tg_err *e)
{
    tctx *c = ud;
    c->calls++;
    if (id == T_DB) c->db = v;
    else if (id == T_JOBS) {
        if (strcmp(v, "1") && strcmp(v, "2")) return tg_errf(e, "--jobs: expected 1 or 2, got '%s'", v);
        c->jobs = atoi(v);
    } else if (id == T_FLAG)
        c->flag = 1;
    return 0;
}

static const struct option T_OPTS[] = {{"db", required_argument, NULL, T_DB},
                                       {"jobs", required_argument, NULL, T_JOBS},
                                       {"flag", no_argument, NULL, T_FLAG},
                                       {0}};
static const common_cli T_CLI = {"demo", "usage: tokgate demo [X] [--db FILE]\n", T_OPTS, 2};

/* What one parse gave: the options, the positionals, stderr and stdout. */
typedef struct tparse {
    tctx c;
    const char *pos[2];
    int n;
    char err[512], out[512];
} tparse;

/* Runs common_cli_parse over a NULL-terminated word list into r (stderr
 * and stdout captured); returns its result. */
static int t_parse(const char *const *words, tparse *r)
{
    char *argv[16];
    int argc = 0;
    for (; words[argc]; argc++) argv[argc] = (char *)words[argc];
    argv[argc] = NULL;
    memset(r, 0, sizeof *r);
    fflush(stdout);
    fflush(stderr);
    FILE *fe = tmpfile(), *fo = tmpfile();
    int se = dup(2), so = dup(1);
    dup2(fileno(fe), 2);
    dup2(fileno(fo), 1);
    int rc = common_cli_parse(&T_CLI, argc, argv, t_opt, &r->c, r->pos, &r->n);
    fflush(stdout);
    fflush(stderr);
    dup2(se, 2);
    dup2(so, 1);
    close(se);
    close(so);
    rewind(fe);
    rewind(fo);
    size_t k = fread(r->err, 1, sizeof r->err - 1, fe);
    r->err[k] = 0;
    k = fread(r->out, 1, sizeof r->out - 1, fo);
    r->out[k] = 0;
    fclose(fe);
    fclose(fo);
    return rc;
}

static void cli_parses_getopt_long(void **st)
{
    (void)st;
    tparse r;
    /* options and positionals in any order, --opt=value, a lone "-" positional */
    const char *w1[] = {"demo", "A", "--db", "x.db", "--jobs=2", "-", NULL};
    int rc = t_parse(w1, &r);
    if (rc) print_message("%s", r.err);
    assert_int_equal(rc, COMMON_CLI_OK);
    assert_string_equal(r.c.db, "x.db");
    assert_int_equal(r.c.jobs, 2);
    assert_int_equal(r.n, 2);
    assert_string_equal(r.pos[0], "A");
    assert_string_equal(r.pos[1], "-");
    assert_string_equal(r.err, "");
    /* "--" ends the options: what follows is positional */
    const char *w2[] = {"demo", "--flag", "--", "--db", NULL};
    assert_int_equal(t_parse(w2, &r), COMMON_CLI_OK);
    assert_int_equal(r.c.flag, 1);
    assert_int_equal(r.n, 1);
    assert_string_equal(r.pos[0], "--db");
    /* --help and -h: the usage on stdout */
    const char *w3[] = {"demo", "A", "--help", "--bogus", NULL};
    assert_int_equal(t_parse(w3, &r), COMMON_CLI_HELP);
    assert_string_equal(r.out, "usage: tokgate demo [X] [--db FILE]\n");
    const char *w3b[] = {"demo", "-h", NULL};
    assert_int_equal(t_parse(w3b, &r), COMMON_CLI_HELP);
}

static void cli_errors_are_one_line(void **st)
{
    (void)st;
    tparse r;
    const char *w1[] = {"demo", "--bogus", "v", NULL};
    assert_int_equal(t_parse(w1, &r), 2);
    assert_string_equal(r.err, "tokgate demo: unknown option '--bogus' (see tokgate demo --help)\n");
    const char *w2[] = {"demo", "-x", NULL};
    assert_int_equal(t_parse(w2, &r), 2);
    assert_string_equal(r.err, "tokgate demo: unknown option '-x' (see tokgate demo --help)\n");
    const char *w3[] = {"demo", "--db", NULL};
    assert_int_equal(t_parse(w3, &r), 2);
    assert_string_equal(r.err, "tokgate demo: option '--db' needs a value (see tokgate demo --help)\n");
    const char *w4[] = {"demo", "--jobs", "9", NULL};
    assert_int_equal(t_parse(w4, &r), 2);
    assert_string_equal(r.err, "tokgate demo: --jobs: expected 1 or 2, got '9'\n");
    const char *w5[] = {"demo", "a", "b", "c", NULL};
    assert_int_equal(t_parse(w5, &r), 2);
    assert_string_equal(r.err, "tokgate demo: unexpected argument 'c' (see tokgate demo --help)\n");
    const char *w6[] = {"demo", "--flag=1", NULL};
    assert_int_equal(t_parse(w6, &r), 2);
    assert_non_null(strstr(r.err, "'--flag'"));
    assert_string_equal(r.out, "");
}

TG_TEST_MAIN(
    x_functions_allocate, out_of_memory_exits_70, read_file_regular, read_file_refuses_fifo_and_devices,
    sql_error_sentence, sql_binds_and_steps, blob_round_trip, out_refuses_the_store, out_renames_into_place, text_safe_escapes_controls,
    add_saturates, parse_int_whole_and_in_range, cli_parses_getopt_long, cli_errors_are_one_line)
