/*
 * merge.c: copies the runs of one tokgate store into another (merge.h).
 * The source is ATTACHed as schema "src"; each run is copied table by table
 * with INSERT ... SELECT, foreign keys re-mapped through temporary tables
 * (old id -> new id) for arms, prompts, legs and binaries. Column lists are
 * taken from both schemas (the target's columns that the source also has),
 * so a column another module adds later travels without an edit here.
 */
#include "merge.h"

#include <errno.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common.h"
#include "trend.h"

/* Tables this file copies, in dependency order; any other non-empty table
 * of the source is reported as skipped. */
static const char *const KNOWN[] = {"spec", "artifact", "binary", "run", "arm", "prompt", "leg",
                                    "leg_prompt", "step", "step_top", "dump", "verdict_set", "verdict",
                                    "compare", "contested", "noise_band", "trend_mark", "run_calibration",
                                    "calib_set", "calib_step", "calib_limit", "calib_arm_step", NULL};


/* Runs sql with up to two int64 bindings (?1, ?2). Returns 0 or -1 with e. */
static int exec2(sqlite3 *db, const char *sql, int64_t a, int64_t b, tg_err *e)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) return common_sql_err(db, e, sql);
    int np = sqlite3_bind_parameter_count(s);
    if (np >= 1) sqlite3_bind_int64(s, 1, a);
    if (np >= 2) sqlite3_bind_int64(s, 2, b);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return common_sql_err(db, e, sql);
    return 0;
}

/* One integer from sql bound to (a, b): 1 found (*v), 0 none, -1 error. */
static int int2(sqlite3 *db, const char *sql, int64_t a, int64_t b, int64_t *v, tg_err *e)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) return common_sql_err(db, e, sql);
    int np = sqlite3_bind_parameter_count(s);
    if (np >= 1) sqlite3_bind_int64(s, 1, a);
    if (np >= 2) sqlite3_bind_int64(s, 2, b);
    int rc = sqlite3_step(s), r = 0;
    if (rc == SQLITE_ROW) {
        *v = sqlite3_column_int64(s, 0);
        r = 1;
    } else if (rc != SQLITE_DONE)
        r = common_sql_err(db, e, sql);
    sqlite3_finalize(s);
    return r;
}

/* Whether schema sch's table t has column c. */
static int has_column(sqlite3 *db, const char *sch, const char *t, const char *c)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT 1 FROM %s.pragma_table_info('%s') WHERE name='%s'", sch, t, c);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) return 0;
    int r = sqlite3_step(s) == SQLITE_ROW;
    sqlite3_finalize(s);
    return r;
}

/* A column substitution: target column col gets the SQL expression expr
 * (over the source row "s"); expr NULL leaves the column out (ids). */
typedef struct subst { const char *col, *expr; } subst;

/* INSERT INTO main.t(columns) SELECT ... FROM src.t AS s WHERE where
 * ORDER BY s.rowid-ish order: every column of main.t that src.t also has,
 * or that subst names. ?1 and ?2 in where / exprs are bound to a and b.
 * Returns 0 or -1 with e. */
static int copy_rows(sqlite3 *db, const char *t, const char *where, const char *order,
                     const subst *sub, int n_sub, int64_t a, int64_t b, tg_err *e)
{
    char cols[4096] = "", exprs[8192] = "";
    size_t nc = 0, ne = 0;
    char q[256];
    /* a table of a later schema that one side lacks: nothing to copy */
    snprintf(q, sizeof q, "SELECT 1 FROM src.sqlite_master WHERE type = 'table' AND name = '%s'", t);
    int64_t one;
    if (int2(db, q, 0, 0, &one, e) != 1) return 0;
    snprintf(q, sizeof q, "SELECT name FROM main.pragma_table_info('%s') ORDER BY cid", t);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, q, -1, &s, NULL) != SQLITE_OK) return common_sql_err(db, e, q);
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *c = (const char *)sqlite3_column_text(s, 0);
        const char *expr = NULL;
        int found = 0;
        for (int i = 0; i < n_sub; i++)
            if (!strcmp(sub[i].col, c)) {
                found = 1;
                expr = sub[i].expr;
            }
        char buf[300];
        if (!found) {
            if (!has_column(db, "src", t, c)) continue;
            snprintf(buf, sizeof buf, "s.\"%s\"", c);
            expr = buf;
        }
        if (!expr) continue;
        nc += (size_t)snprintf(cols + nc, sizeof cols - nc, "%s\"%s\"", nc ? "," : "", c);
        ne += (size_t)snprintf(exprs + ne, sizeof exprs - ne, "%s%s", ne ? "," : "", expr);
        if (nc >= sizeof cols || ne >= sizeof exprs) {
            sqlite3_finalize(s);
            return tg_errf(e, "merge: table %s: too many columns", t);
        }
    }
    sqlite3_finalize(s);
    char *sql = sqlite3_mprintf("INSERT INTO main.\"%s\"(%s) SELECT %s FROM src.\"%s\" AS s WHERE %s%s%s",
                                t, cols, exprs, t, where, order ? " ORDER BY " : "", order ? order : "");
    if (!sql) common_out_of_memory(strlen(cols) + strlen(exprs));
    int rc = exec2(db, sql, a, b, e);
    sqlite3_free(sql);
    if (rc < 0) return tg_err_prefix(e, "copying %s rows", t);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Fingerprints: what "the same run" means                             */

/* The parts of a run compared on a uid match, each one query over schema
 * %s with ?1 = the run id; rows hashed in order. */
static const struct { const char *part, *sql; } PARTS[] = {
    {"run fields",
     "SELECT s.name, s.sha256, a.path, a.sha256, r.started, r.finished, r.host, r.tokgate_version,"
     " r.mode, r.reference, r.policy, r.band, r.steps, r.top_k, r.legs, r.verdict"
     " FROM @.run r JOIN @.spec s ON s.id = r.spec_id JOIN @.artifact a ON a.id = r.artifact_id"
     " WHERE r.id = ?1"},
    {"arms", "SELECT name, kind, role, config FROM @.arm WHERE run_id = ?1 ORDER BY name"},
    {"prompts", "SELECT no, name, text FROM @.prompt WHERE run_id = ?1 ORDER BY no"},
    {"legs",
     "SELECT a.name, l.leg, l.exit_status, l.term_signal, l.cause, l.fault_lines, l.device,"
     " l.counters, b.sha256, (SELECT sa.leg FROM @.leg sa WHERE sa.id = l.same_as)"
     " FROM @.leg l JOIN @.arm a ON a.id = l.arm_id"
     " LEFT JOIN @.binary b ON b.id = l.binary_id WHERE l.run_id = ?1 ORDER BY a.name, l.leg"},
    {"steps",
     "SELECT a.name, l.leg, p.name, st.step, st.token, st.forced, st.gap, st.digest"
     " FROM @.step st JOIN @.leg l ON l.id = st.leg_id JOIN @.arm a ON a.id = l.arm_id"
     " JOIN @.prompt p ON p.id = st.prompt_id WHERE l.run_id = ?1 ORDER BY 1, 2, 3, 4"},
    {"top-k",
     "SELECT a.name, l.leg, p.name, t.step, t.rank, t.id, t.logit, t.bits"
     " FROM @.step_top t JOIN @.leg l ON l.id = t.leg_id JOIN @.arm a ON a.id = l.arm_id"
     " JOIN @.prompt p ON p.id = t.prompt_id WHERE l.run_id = ?1 ORDER BY 1, 2, 3, 4, 5"},
    {"verdict sets",
     "SELECT set_no, created, policy, band, overall FROM @.verdict_set WHERE run_id = ?1 ORDER BY set_no"},
    {"verdict rows",
     "SELECT set_no, arm, prompt, key, value FROM @.verdict WHERE run_id = ?1"
     " ORDER BY set_no, arm, prompt, key, value"},
};
#define N_PARTS (int)(sizeof PARTS / sizeof PARTS[0])

/* SHA-256 (raw, 32 bytes) of the rows of part p of run in schema sch.
 * Returns 0 or -1 with e. */
static int part_hash(sqlite3 *db, const char *sch, int p, int64_t run, unsigned char out[32], tg_err *e)
{
    /* the part's SQL with every @ replaced by the schema name */
    size_t cap = strlen(PARTS[p].sql) * 2 + 64, k = 0;
    char *sql = xmalloc(cap);
    for (const char *c = PARTS[p].sql; *c; c++) {
        if (*c == '@') k += (size_t)snprintf(sql + k, cap - k, "%s", sch);
        else sql[k++] = *c;
    }
    sql[k] = 0;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
    free(sql);
    if (rc != SQLITE_OK) return common_sql_err(db, e, PARTS[p].part);
    sqlite3_bind_int64(s, 1, run);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx) common_out_of_memory(sizeof(void *));
    if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        sqlite3_finalize(s);
        return tg_errf(e, "merge: %s: SHA-256 is not available (OpenSSL)", PARTS[p].part);
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int nc = sqlite3_column_count(s);
        for (int c = 0; c < nc; c++) {
            int type = sqlite3_column_type(s, c);
            unsigned char tag = (unsigned char)type;
            const void *v = NULL;
            int n = 0;
            if (type == SQLITE_BLOB) v = sqlite3_column_blob(s, c);
            else if (type != SQLITE_NULL) v = sqlite3_column_text(s, c);
            n = sqlite3_column_bytes(s, c);
            uint32_t len = (uint32_t)n;
            EVP_DigestUpdate(ctx, &tag, 1);
            EVP_DigestUpdate(ctx, &len, 4);
            if (n) EVP_DigestUpdate(ctx, v, (size_t)n);
        }
        unsigned char eor = 0xff;
        EVP_DigestUpdate(ctx, &eor, 1);
    }
    sqlite3_finalize(s);
    unsigned int ol = 32;
    EVP_DigestFinal_ex(ctx, out, &ol);
    EVP_MD_CTX_free(ctx);
    if (rc != SQLITE_DONE) return common_sql_err(db, e, PARTS[p].part);
    return 0;
}

/* The first part in which run a of "src" and run b of "main" differ, or
 * NULL when they are the same; *err set on a store error. */
static const char *first_difference(sqlite3 *db, int64_t a, int64_t b, int *err, tg_err *e)
{
    *err = 0;
    for (int p = 0; p < N_PARTS; p++) {
        unsigned char ha[32], hb[32];
        if (part_hash(db, "src", p, a, ha, e) < 0 || part_hash(db, "main", p, b, hb, e) < 0) {
            *err = 1;
            return NULL;
        }
        if (memcmp(ha, hb, 32)) return PARTS[p].part;
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Copying one run                                                     */

static int copy_run(sqlite3 *db, int64_t r, int64_t *new_run, tg_err *e)
{
    int64_t spec_id, art_id;
    if (exec2(db, "INSERT INTO main.spec(name, path, sha256, text) SELECT s.name, s.path, s.sha256, s.text"
                  " FROM src.spec s JOIN src.run r ON r.spec_id = s.id WHERE r.id = ?1 AND NOT EXISTS"
                  " (SELECT 1 FROM main.spec m WHERE m.name = s.name AND m.sha256 = s.sha256)", r, 0, e) < 0 ||
        int2(db, "SELECT m.id FROM main.spec m JOIN src.spec s ON s.name = m.name AND s.sha256 = m.sha256"
                 " JOIN src.run r ON r.spec_id = s.id WHERE r.id = ?1", r, 0, &spec_id, e) != 1)
        return tg_err_prefix(e, "the run's spec");
    if (exec2(db, "INSERT INTO main.artifact(path, sha256, size) SELECT a.path, a.sha256, a.size"
                  " FROM src.artifact a JOIN src.run r ON r.artifact_id = a.id WHERE r.id = ?1 AND NOT EXISTS"
                  " (SELECT 1 FROM main.artifact m WHERE m.path = a.path AND m.sha256 = a.sha256)", r, 0, e) < 0 ||
        int2(db, "SELECT m.id FROM main.artifact m JOIN src.artifact a ON a.path = m.path AND a.sha256 = m.sha256"
                 " JOIN src.run r ON r.artifact_id = a.id WHERE r.id = ?1", r, 0, &art_id, e) != 1)
        return tg_err_prefix(e, "the run's artifact");
    if (exec2(db, "INSERT INTO main.binary(path, sha256, version) SELECT DISTINCT b.path, b.sha256, b.version"
                  " FROM src.binary b JOIN src.leg l ON l.binary_id = b.id WHERE l.run_id = ?1 AND NOT EXISTS"
                  " (SELECT 1 FROM main.binary m WHERE m.path = b.path AND m.sha256 = b.sha256"
                  " AND m.version = b.version)", r, 0, e) < 0)
        return -1;
    if (exec2(db, "DELETE FROM temp.m_arm", 0, 0, e) < 0 || exec2(db, "DELETE FROM temp.m_prompt", 0, 0, e) < 0 ||
        exec2(db, "DELETE FROM temp.m_leg", 0, 0, e) < 0 || exec2(db, "DELETE FROM temp.m_bin", 0, 0, e) < 0 ||
        exec2(db, "INSERT INTO temp.m_bin SELECT b.id, m.id FROM src.binary b JOIN main.binary m"
                  " ON m.path = b.path AND m.sha256 = b.sha256 AND m.version = b.version", 0, 0, e) < 0)
        return -1;
    char sid[32], aid[32];
    snprintf(sid, sizeof sid, "%lld", (long long)spec_id);
    snprintf(aid, sizeof aid, "%lld", (long long)art_id);
    subst run_sub[] = {{"id", NULL}, {"spec_id", sid}, {"artifact_id", aid}};
    if (copy_rows(db, "run", "s.id = ?1", NULL, run_sub, 3, r, 0, e) < 0) return -1;
    int64_t nr = sqlite3_last_insert_rowid(db);
    *new_run = nr;
    /* ?1 = the source run, ?2 = the new run */
    subst arm_sub[] = {{"id", NULL}, {"run_id", "?2"}};
    if (copy_rows(db, "arm", "s.run_id = ?1", "s.id", arm_sub, 2, r, nr, e) < 0 ||
        exec2(db, "INSERT INTO temp.m_arm SELECT s.id, m.id FROM src.arm s JOIN main.arm m"
                  " ON m.run_id = ?2 AND m.name = s.name WHERE s.run_id = ?1", r, nr, e) < 0)
        return -1;
    if (copy_rows(db, "prompt", "s.run_id = ?1", "s.id", arm_sub, 2, r, nr, e) < 0 ||
        exec2(db, "INSERT INTO temp.m_prompt SELECT s.id, m.id FROM src.prompt s JOIN main.prompt m"
                  " ON m.run_id = ?2 AND m.name = s.name WHERE s.run_id = ?1", r, nr, e) < 0)
        return -1;
    /* same_as names a leg of the same run: set once all legs have new ids */
    subst leg_sub[] = {{"id", NULL}, {"run_id", "?2"},
                       {"arm_id", "(SELECT new FROM temp.m_arm WHERE old = s.arm_id)"},
                       {"binary_id", "(SELECT new FROM temp.m_bin WHERE old = s.binary_id)"},
                       {"same_as", "NULL"}};
    if (copy_rows(db, "leg", "s.run_id = ?1", "s.id", leg_sub, 5, r, nr, e) < 0 ||
        exec2(db, "INSERT INTO temp.m_leg SELECT s.id, m.id FROM src.leg s"
                  " JOIN temp.m_arm ma ON ma.old = s.arm_id"
                  " JOIN main.leg m ON m.run_id = ?2 AND m.arm_id = ma.new AND m.leg = s.leg"
                  " WHERE s.run_id = ?1", r, nr, e) < 0 ||
        exec2(db, "UPDATE main.leg SET same_as = (SELECT mb.new FROM temp.m_leg ml"
                  " JOIN src.leg s ON s.id = ml.old JOIN temp.m_leg mb ON mb.old = s.same_as"
                  " WHERE ml.new = main.leg.id) WHERE run_id = ?2", r, nr, e) < 0)
        return -1;
    const char *in_run = "s.leg_id IN (SELECT old FROM temp.m_leg)";
    subst lp_sub[] = {{"leg_id", "(SELECT new FROM temp.m_leg WHERE old = s.leg_id)"},
                      {"prompt_id", "(SELECT new FROM temp.m_prompt WHERE old = s.prompt_id)"}};
    if (copy_rows(db, "leg_prompt", in_run, NULL, lp_sub, 2, r, nr, e) < 0 ||
        copy_rows(db, "step", in_run, "s.leg_id, s.prompt_id, s.step", lp_sub, 2, r, nr, e) < 0 ||
        copy_rows(db, "step_top", in_run, "s.leg_id, s.prompt_id, s.step, s.rank", lp_sub, 2, r, nr, e) < 0 ||
        copy_rows(db, "dump", in_run, NULL, lp_sub, 2, r, nr, e) < 0)
        return -1;
    subst v_sub[] = {{"id", NULL}, {"run_id", "?2"}};
    if (copy_rows(db, "verdict_set", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0 ||
        copy_rows(db, "verdict", "s.run_id = ?1", "s.id", v_sub, 2, r, nr, e) < 0 ||
        copy_rows(db, "compare", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0 ||
        copy_rows(db, "contested", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0 ||
        copy_rows(db, "noise_band", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0)
        return -1;
    /* calibration (schema 5); calib_set.source_run keeps the source store's run id */
    if (copy_rows(db, "run_calibration", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0 ||
        copy_rows(db, "calib_set", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0 ||
        copy_rows(db, "calib_step", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0 ||
        copy_rows(db, "calib_limit", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0 ||
        copy_rows(db, "calib_arm_step", "s.run_id = ?1", NULL, v_sub + 1, 1, r, nr, e) < 0)
        return -1;
    return 0;
}

/* Warns about non-empty source tables merge does not know. Returns the count. */
static int warn_unknown_tables(sqlite3 *db, const char *src_path)
{
    sqlite3_stmt *s;
    int n = 0;
    if (sqlite3_prepare_v2(db, "SELECT name FROM src.sqlite_master WHERE type = 'table'"
                               " AND name NOT LIKE 'sqlite_%'", -1, &s, NULL) != SQLITE_OK)
        return 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(s, 0);
        int known = 0;
        for (int i = 0; KNOWN[i]; i++) known |= !strcmp(KNOWN[i], t);
        if (known) continue;
        char *q = sqlite3_mprintf("SELECT count(*) FROM src.\"%w\"", t);
        int64_t rows = 0;
        tg_err e;
        if (q && int2(db, q, 0, 0, &rows, &e) == 1 && rows > 0) {
            fprintf(stderr, "tokgate: merge: %s: table %s (%lld rows) is not merged by this tokgate\n",
                    src_path, t, (long long)rows);
            n++;
        }
        sqlite3_free(q);
    }
    sqlite3_finalize(s);
    return n;
}

int merge_store(tg_store *dst, const char *src_path, merge_stats *ms, tg_err *e)
{
    sqlite3 *db = store_db(dst);
    struct stat sb;
    if (stat(src_path, &sb) != 0) return tg_errf(e, "merge: %s: %s", src_path, strerror(errno));
    const char *dst_file = sqlite3_db_filename(db, "main");
    char r1[PATH_MAX], r2[PATH_MAX];
    if (dst_file && realpath(src_path, r1) && realpath(dst_file, r2) && !strcmp(r1, r2))
        return tg_errf(e, "merge: %s is the output store itself", src_path);
    /* open it as a store once: checks it is one, migrates an older schema */
    tg_store *src;
    if (store_open(&src, src_path, e) < 0) return -1;
    store_close(src);

    char *att = sqlite3_mprintf("ATTACH DATABASE %Q AS src", src_path);
    int rc = sqlite3_exec(db, att, NULL, NULL, NULL);
    sqlite3_free(att);
    if (rc != SQLITE_OK) return tg_errf(e, "merge: attaching %s: %s", src_path, sqlite3_errmsg(db));
    rc = -1;
    int began = 0;
    sqlite3_stmt *runs = NULL;
    if (exec2(db, "CREATE TEMP TABLE IF NOT EXISTS m_arm(old INTEGER PRIMARY KEY, new INTEGER)", 0, 0, e) < 0 ||
        exec2(db, "CREATE TEMP TABLE IF NOT EXISTS m_prompt(old INTEGER PRIMARY KEY, new INTEGER)", 0, 0, e) < 0 ||
        exec2(db, "CREATE TEMP TABLE IF NOT EXISTS m_leg(old INTEGER PRIMARY KEY, new INTEGER)", 0, 0, e) < 0 ||
        exec2(db, "CREATE TEMP TABLE IF NOT EXISTS m_bin(old INTEGER PRIMARY KEY, new INTEGER)", 0, 0, e) < 0)
        goto done;
    if (exec2(db, "BEGIN IMMEDIATE", 0, 0, e) < 0) goto done;
    began = 1;
    ms->tables_skipped += warn_unknown_tables(db, src_path);
    if (sqlite3_prepare_v2(db, "SELECT r.id, r.uid, s.name, r.started FROM src.run r"
                               " JOIN src.spec s ON s.id = r.spec_id ORDER BY r.started, r.id",
                           -1, &runs, NULL) != SQLITE_OK) {
        common_sql_err(db, e, "listing the source's runs");
        goto done;
    }
    int st;
    while ((st = sqlite3_step(runs)) == SQLITE_ROW) {
        int64_t r = sqlite3_column_int64(runs, 0);
        const char *uid = (const char *)sqlite3_column_text(runs, 1);
        const char *spec = (const char *)sqlite3_column_text(runs, 2);
        const char *started = (const char *)sqlite3_column_text(runs, 3);
        if (!uid) {
            tg_errf(e, "merge: %s: run %lld has no uid", src_path, (long long)r);
            goto done;
        }
        sqlite3_stmt *q;
        int64_t have = 0;
        if (sqlite3_prepare_v2(db, "SELECT id FROM main.run WHERE uid = ?1", -1, &q, NULL) != SQLITE_OK) {
            common_sql_err(db, e, "looking up a run uid");
            goto done;
        }
        sqlite3_bind_text(q, 1, uid, -1, SQLITE_TRANSIENT);
        int found = sqlite3_step(q) == SQLITE_ROW;
        if (found) have = sqlite3_column_int64(q, 0);
        sqlite3_finalize(q);
        if (found) {
            int err;
            const char *diff = first_difference(db, r, have, &err, e);
            if (err) goto done;
            if (diff) {
                tg_errf(e, "merge: conflict: run uid %s (spec %s, started %s) is run %lld in %s and run %lld "
                           "in %s, and their %s differ; nothing of %s was merged",
                        uid, spec, started, (long long)r, src_path, (long long)have, dst_file ? dst_file : "the output",
                        diff, src_path);
                goto done;
            }
            ms->runs_same++;
            continue;
        }
        int64_t nr;
        if (copy_run(db, r, &nr, e) < 0) {
            tg_err_prefix(e, "merge: %s: run %lld (spec %s)", src_path, (long long)r, spec);
            goto done;
        }
        ms->runs_added++;
    }
    if (st != SQLITE_DONE) {
        common_sql_err(db, e, "listing the source's runs");
        goto done;
    }
    sqlite3_finalize(runs);
    runs = NULL;
    /* the team's baseline decisions, keyed by run uid (trend.c owns the table) */
    if (trend_copy_marks(db, e) < 0) goto done;
    if (exec2(db, "COMMIT", 0, 0, e) < 0) goto done;
    began = 0;
    rc = 0;
done:
    sqlite3_finalize(runs);
    if (began) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_exec(db, "DETACH DATABASE src", NULL, NULL, NULL);
    return rc;
}

enum { O_OUT = COMMON_CLI_FIRST_ID };

static int on_opt(void *ud, int id, const char *v, tg_err *e)
{
    (void)e;
    if (id == O_OUT || id == 'o') *(const char **)ud = v;
    return 0;
}

int merge_main(int argc, char **argv)
{
    static const struct option lo[] = {{"out", required_argument, NULL, O_OUT}, {NULL, 0, NULL, 0}};
    const common_cli cli = {"merge", "(see tokgate help merge)\n", lo, argc, "o:"};
    const char *out = NULL;
    const char **in;
    int n = 0;
    int rc = common_cli_parse_list(&cli, argc - 1, argv + 1, on_opt, &out, &in, &n);
    if (rc) return rc == COMMON_CLI_HELP ? 0 : rc;
    if (!out || n == 0) {
        fprintf(stderr, "tokgate: merge: expected A.db [B.db ...] -o OUT.db\n(run `tokgate help` for usage)\n");
        free(in);
        return 2;
    }
    tg_err e;
    tg_store *dst;
    struct stat sb;
    int created = lstat(out, &sb) != 0 && errno == ENOENT;   /* removed again if the merge fails */
    if (store_open_cmd(&dst, out, 0)) {
        if (created) store_remove_files(out);
        free(in);
        return 2;
    }
    merge_stats total = {0};
    for (int i = 0; i < n; i++) {
        merge_stats ms = {0};
        if (merge_store(dst, in[i], &ms, &e) < 0) {
            fprintf(stderr, "tokgate: %s\n", e.msg);
            rc = 2;
            break;
        }
        printf("%s: %d runs added, %d already present%s\n", in[i], ms.runs_added, ms.runs_same,
               ms.tables_skipped ? " (some tables not merged, see above)" : "");
        total.runs_added += ms.runs_added;
        total.runs_same += ms.runs_same;
    }
    if (rc == 0) printf("merged into %s: %d runs added, %d already present\n", out, total.runs_added, total.runs_same);
    store_close(dst);
    if (rc != 0 && created) {
        store_remove_files(out);
        fprintf(stderr, "tokgate: merge: %s removed (it did not exist before this merge)\n", out);
    }
    free(in);
    return rc;
}
