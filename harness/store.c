/*
 * store.c: the SQLite evidence store. One file, WAL journal, foreign keys
 * on, the schema version in PRAGMA user_version (older stores are migrated
 * step by step, newer ones refused). Every arm leg is written in one
 * transaction by store_put_leg, so an interrupted run keeps complete legs
 * and no half ones.
 *
 * Step rows are kept small: the fields the views and reports need (token,
 * forced token, top1-top2 gap, digest) are plain columns, and the top-k ids
 * and logits go into one compact lossless blob per step (format "packed":
 * sorted ids as Rice-coded gaps, the logit order as a Lehmer code, logits as
 * Rice-coded deltas of order-preserving f32 bit patterns; docs/store.md
 * describes the bytes). Anything the packed form cannot express exactly
 * (negative or repeated ids, logits out of order, NaN) is stored raw.
 *
 * The schema text, the views and example queries are in docs/store.md.
 */
#include "store.h"

#include <assert.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

/* ------------------------------------------------------------------ */
/* Schema                                                              */

/* Version 1 of the schema: the tables of DESIGN.md plus the compare table
 * and verdict sets that the scoring pass (verdict.c) writes. */
static const char SCHEMA_V1[] =
    "CREATE TABLE spec(\n"
    "  id INTEGER PRIMARY KEY, name TEXT NOT NULL, path TEXT, sha256 TEXT NOT NULL,\n"
    "  text TEXT, UNIQUE(name, sha256));\n"
    "CREATE TABLE artifact(\n"
    "  id INTEGER PRIMARY KEY, path TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER,\n"
    "  UNIQUE(path, sha256));\n"
    "CREATE TABLE binary(\n"
    "  id INTEGER PRIMARY KEY, path TEXT NOT NULL, sha256 TEXT NOT NULL, version TEXT NOT NULL,\n"
    "  UNIQUE(path, sha256, version));\n"
    "CREATE TABLE run(\n"
    "  id INTEGER PRIMARY KEY, spec_id INTEGER NOT NULL REFERENCES spec(id),\n"
    "  artifact_id INTEGER NOT NULL REFERENCES artifact(id),\n"
    "  started TEXT NOT NULL, finished TEXT, host TEXT, tokgate_version TEXT,\n"
    "  mode TEXT NOT NULL, reference TEXT NOT NULL, policy TEXT NOT NULL, band REAL NOT NULL,\n"
    "  steps INTEGER, top_k INTEGER, legs INTEGER, verdict TEXT);\n"
    "CREATE INDEX run_spec ON run(spec_id);\n"
    "CREATE TABLE arm(\n"
    "  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,\n"
    "  name TEXT NOT NULL, kind TEXT NOT NULL, role TEXT NOT NULL, config TEXT,\n"
    "  UNIQUE(run_id, name));\n"
    "CREATE TABLE prompt(\n"
    "  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,\n"
    "  no INTEGER NOT NULL, name TEXT NOT NULL, text TEXT NOT NULL,\n"
    "  UNIQUE(run_id, name));\n"
    "CREATE TABLE leg(\n"
    "  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,\n"
    "  arm_id INTEGER NOT NULL REFERENCES arm(id) ON DELETE CASCADE, leg INTEGER NOT NULL,\n"
    "  binary_id INTEGER REFERENCES binary(id), device TEXT, hello TEXT, model TEXT,\n"
    "  exit_status INTEGER, term_signal INTEGER, cause TEXT, fault_lines TEXT,\n"
    "  counters TEXT, device_ops INTEGER, host_ops INTEGER,\n"
    "  stderr_zstd BLOB, stderr_len INTEGER,\n"
    "  ms_load REAL, ms_prefill REAL, ms_decode REAL, wall_s REAL, stored TEXT,\n"
    "  UNIQUE(run_id, arm_id, leg));\n"
    "CREATE TABLE leg_prompt(\n"
    "  leg_id INTEGER NOT NULL REFERENCES leg(id) ON DELETE CASCADE,\n"
    "  prompt_id INTEGER NOT NULL REFERENCES prompt(id) ON DELETE CASCADE,\n"
    "  ids TEXT, decoded_from TEXT, n_steps INTEGER NOT NULL, text TEXT, error TEXT,\n"
    "  PRIMARY KEY(leg_id, prompt_id)) WITHOUT ROWID;\n"
    "CREATE TABLE step(\n"
    "  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,\n"
    "  token INTEGER NOT NULL, forced INTEGER, gap REAL, digest INTEGER, top BLOB,\n"
    "  same_as INTEGER,\n"
    "  PRIMARY KEY(leg_id, prompt_id, step),\n"
    "  FOREIGN KEY(leg_id, prompt_id) REFERENCES leg_prompt(leg_id, prompt_id) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE dump(\n"
    "  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,\n"
    "  layer INTEGER NOT NULL, stage TEXT NOT NULL, n INTEGER NOT NULL, data BLOB,\n"
    "  PRIMARY KEY(leg_id, prompt_id, step, layer, stage),\n"
    "  FOREIGN KEY(leg_id, prompt_id) REFERENCES leg_prompt(leg_id, prompt_id) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE verdict_set(\n"
    "  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE, set_no INTEGER NOT NULL,\n"
    "  created TEXT NOT NULL, policy TEXT NOT NULL, band REAL NOT NULL, overall TEXT NOT NULL,\n"
    "  PRIMARY KEY(run_id, set_no));\n"
    "CREATE TABLE verdict(\n"
    "  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, set_no INTEGER NOT NULL,\n"
    "  arm TEXT, prompt TEXT, key TEXT NOT NULL, value TEXT NOT NULL,\n"
    "  band REAL NOT NULL, policy TEXT NOT NULL,\n"
    "  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE);\n"
    "CREATE INDEX verdict_run ON verdict(run_id, set_no);\n"
    "CREATE TABLE compare(\n"
    "  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, arm TEXT NOT NULL, leg INTEGER NOT NULL,\n"
    "  prompt TEXT NOT NULL, step INTEGER NOT NULL, ref_leg INTEGER NOT NULL,\n"
    "  token INTEGER NOT NULL, ref_token INTEGER, ref_top2 INTEGER, rank INTEGER NOT NULL,\n"
    "  ref_gap REAL, own_gap REAL, class TEXT NOT NULL, oracle_split INTEGER NOT NULL,\n"
    "  kl REAL,\n"
    "  PRIMARY KEY(run_id, set_no, arm, leg, prompt, step),\n"
    "  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE contested(\n"
    "  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, prompt TEXT NOT NULL, step INTEGER NOT NULL,\n"
    "  oracle_split INTEGER NOT NULL, tokens TEXT NOT NULL, sentence TEXT NOT NULL,\n"
    "  PRIMARY KEY(run_id, set_no, prompt, step),\n"
    "  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    /* Views over the latest verdict set of each run. */
    "CREATE VIEW v_latest_set AS\n"
    "  SELECT run_id, max(set_no) AS set_no FROM verdict_set GROUP BY run_id;\n"
    /* step rows with their top blob resolved (a repeated leg points at the
     * arm's first leg when the blob is byte-identical). */
    "CREATE VIEW v_step_top AS\n"
    "  SELECT s.leg_id, s.prompt_id, s.step, s.token, s.forced, s.gap, s.digest,\n"
    "         coalesce(s.top, (SELECT b.top FROM step b WHERE b.leg_id = s.same_as\n"
    "                          AND b.prompt_id = s.prompt_id AND b.step = s.step)) AS top\n"
    "  FROM step s;\n"
    "CREATE VIEW v_step_compare AS\n"
    "  SELECT c.run_id, c.set_no, c.arm, c.leg, c.prompt, c.step, c.ref_leg, c.token,\n"
    "         c.ref_token, c.rank, c.ref_gap, c.own_gap, c.class, c.oracle_split, c.kl\n"
    "  FROM compare c JOIN v_latest_set l ON l.run_id = c.run_id AND l.set_no = c.set_no;\n"
    "CREATE VIEW v_near_tie AS\n"
    "  SELECT c.run_id, c.set_no, c.prompt, c.step, c.arm, c.leg, c.token, c.ref_token,\n"
    "         c.ref_gap, s.band, (c.token = c.ref_token) AS won\n"
    "  FROM v_step_compare c JOIN verdict_set s ON s.run_id = c.run_id AND s.set_no = c.set_no\n"
    "  WHERE c.ref_gap IS NOT NULL AND c.ref_gap < s.band;\n"
    "CREATE VIEW v_rank_hist AS\n"
    "  SELECT run_id, set_no, arm, rank, count(*) AS n FROM v_step_compare\n"
    "  WHERE class <> 'UNCOMPARABLE' GROUP BY run_id, set_no, arm, rank;\n";

/* Version 2: a globally unique id per run (32 hex digits, random), set by
 * store_begin_run, so `tokgate merge` can re-key the rows of stores written
 * on several machines without colliding on autoincrement ids. Runs of an
 * older store get a fresh uid when it is migrated. */
static const char SCHEMA_V2[] =
    "ALTER TABLE run ADD COLUMN uid TEXT;\n"
    "UPDATE run SET uid = lower(hex(randomblob(16))) WHERE uid IS NULL;\n"
    "CREATE UNIQUE INDEX run_uid ON run(uid);\n";

/* Version 3: the oracle's noise band per step of a verdict set (written by
 * verdict.c from compare.c's facts, docs/verdicts.md) and the records of
 * `tokgate localize` (harness/localize.c, docs/localize.md): one localize
 * row, its arms with their step top-k, their dumps (zstd over byte-shuffled
 * f32, as the dump table) and the per layer/stage comparison. */
static const char SCHEMA_V3[] =
    "CREATE TABLE noise_band(\n"
    "  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, prompt TEXT NOT NULL, step INTEGER NOT NULL,\n"
    "  n_views INTEGER NOT NULL, ref_gap REAL, spread REAL, tokens TEXT NOT NULL,\n"
    "  PRIMARY KEY(run_id, set_no, prompt, step),\n"
    "  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE localize(\n"
    "  id INTEGER PRIMARY KEY, created TEXT NOT NULL, run_id INTEGER REFERENCES run(id) ON DELETE SET NULL,\n"
    "  spec_name TEXT, artifact_path TEXT, artifact_sha256 TEXT, prompt TEXT NOT NULL,\n"
    "  prompt_text TEXT, step INTEGER NOT NULL, arm_a TEXT NOT NULL, arm_b TEXT NOT NULL,\n"
    "  third TEXT, prefix TEXT NOT NULL, rule TEXT NOT NULL, first_layer INTEGER, first_stage TEXT);\n"
    "CREATE TABLE localize_arm(\n"
    "  localize_id INTEGER NOT NULL REFERENCES localize(id) ON DELETE CASCADE, arm TEXT NOT NULL,\n"
    "  role TEXT NOT NULL, config TEXT, hello TEXT, token INTEGER NOT NULL, top TEXT,\n"
    "  PRIMARY KEY(localize_id, arm)) WITHOUT ROWID;\n"
    "CREATE TABLE localize_dump(\n"
    "  localize_id INTEGER NOT NULL REFERENCES localize(id) ON DELETE CASCADE, arm TEXT NOT NULL,\n"
    "  layer INTEGER NOT NULL, stage TEXT NOT NULL, n INTEGER NOT NULL, data BLOB,\n"
    "  PRIMARY KEY(localize_id, arm, layer, stage)) WITHOUT ROWID;\n"
    "CREATE TABLE localize_row(\n"
    "  localize_id INTEGER NOT NULL REFERENCES localize(id) ON DELETE CASCADE,\n"
    "  layer INTEGER NOT NULL, stage TEXT NOT NULL, n INTEGER NOT NULL, rel_l2 REAL, cosine REAL,\n"
    "  max_abs REAL, growth REAL, third REAL, floor REAL, exceeds INTEGER NOT NULL,\n"
    "  PRIMARY KEY(localize_id, layer, stage)) WITHOUT ROWID;\n";

/* Migrations: MIGRATIONS[v] takes a store at version v to v + 1. */
static const char *const MIGRATIONS[STORE_SCHEMA_VERSION] = {SCHEMA_V1, SCHEMA_V2, SCHEMA_V3};

/* ------------------------------------------------------------------ */
/* Statements                                                          */

enum {
    Q_SPEC_FIND, Q_SPEC_INS, Q_ART_FIND, Q_ART_INS, Q_BIN_FIND, Q_BIN_INS,
    Q_RUN_INS, Q_ARM_INS, Q_PROMPT_INS, Q_RUN_FINISH,
    Q_ARM_FIND, Q_PROMPT_FIND, Q_LEG_INS, Q_LP_INS, Q_STEP_INS, Q_DUMP_INS,
    Q_HAS_LEG, Q_BASE_LEG, Q_BASE_TOPS, Q_LATEST, Q_LATEST_ANY, Q_BEGIN, Q_COMMIT, Q_ROLLBACK,
    Q_COUNT
};

static const char *const SQL[Q_COUNT] = {
    [Q_SPEC_FIND] = "SELECT id FROM spec WHERE name=?1 AND sha256=?2",
    [Q_SPEC_INS] = "INSERT INTO spec(name, path, sha256, text) VALUES(?1,?2,?3,?4)",
    [Q_ART_FIND] = "SELECT id FROM artifact WHERE path=?1 AND sha256=?2",
    [Q_ART_INS] = "INSERT INTO artifact(path, sha256, size) VALUES(?1,?2,?3)",
    [Q_BIN_FIND] = "SELECT id FROM binary WHERE path=?1 AND sha256=?2 AND version=?3",
    [Q_BIN_INS] = "INSERT INTO binary(path, sha256, version) VALUES(?1,?2,?3)",
    [Q_RUN_INS] = "INSERT INTO run(spec_id, artifact_id, started, host, tokgate_version, mode,"
                  " reference, policy, band, steps, top_k, legs, uid)"
                  " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12, lower(hex(randomblob(16))))",
    [Q_ARM_INS] = "INSERT INTO arm(run_id, name, kind, role, config) VALUES(?1,?2,?3,?4,?5)",
    [Q_PROMPT_INS] = "INSERT INTO prompt(run_id, no, name, text) VALUES(?1,?2,?3,?4)",
    [Q_RUN_FINISH] = "UPDATE run SET verdict=?2, finished=?3 WHERE id=?1",
    [Q_ARM_FIND] = "SELECT id FROM arm WHERE run_id=?1 AND name=?2",
    [Q_PROMPT_FIND] = "SELECT id FROM prompt WHERE run_id=?1 AND name=?2",
    [Q_LEG_INS] = "INSERT INTO leg(run_id, arm_id, leg, binary_id, device, hello, model,"
                  " exit_status, term_signal, cause, fault_lines, counters, device_ops, host_ops,"
                  " stderr_zstd, stderr_len, ms_load, ms_prefill, ms_decode, wall_s, stored)"
                  " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21)",
    [Q_LP_INS] = "INSERT INTO leg_prompt(leg_id, prompt_id, ids, decoded_from, n_steps, text, error)"
                 " VALUES(?1,?2,?3,?4,?5,?6,?7)",
    [Q_STEP_INS] = "INSERT INTO step(leg_id, prompt_id, step, token, forced, gap, digest, top,"
                   " same_as) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)",
    [Q_BASE_LEG] = "SELECT id FROM leg WHERE run_id=?1 AND arm_id=?2 AND id<>?3"
                   " ORDER BY id LIMIT 1",
    [Q_BASE_TOPS] = "SELECT step, top FROM step WHERE leg_id=?1 AND prompt_id=?2"
                    " AND top IS NOT NULL ORDER BY step",
    [Q_DUMP_INS] = "INSERT INTO dump(leg_id, prompt_id, step, layer, stage, n, data)"
                   " VALUES(?1,?2,?3,?4,?5,?6,?7)",
    [Q_HAS_LEG] = "SELECT 1 FROM leg JOIN arm ON arm.id = leg.arm_id"
                  " WHERE leg.run_id=?1 AND arm.name=?2 AND leg.leg=?3",
    [Q_LATEST] = "SELECT run.id FROM run JOIN spec ON spec.id = run.spec_id"
                 " WHERE spec.name=?1 ORDER BY run.id DESC LIMIT 1",
    [Q_LATEST_ANY] = "SELECT id FROM run ORDER BY id DESC LIMIT 1",
    [Q_BEGIN] = "BEGIN IMMEDIATE",
    [Q_COMMIT] = "COMMIT",
    [Q_ROLLBACK] = "ROLLBACK",
};

struct tg_store {
    sqlite3 *db;
    char *path;
    sqlite3_stmt *q[Q_COUNT];   /* prepared on first use, kept until close */
    unsigned char *buf;         /* scratch for blobs */
    size_t buf_cap;
    /* top blobs of the arm's first leg for the prompt being written:
     * base_len[step] bytes at base_data + base_off[step], -1 if none */
    int64_t base_leg;           /* 0 when this is the arm's first leg */
    int base_cap;               /* entries in base_off / base_len */
    size_t *base_off;
    int *base_len;
    unsigned char *base_data;
    size_t base_dlen, base_dcap;
};

/* Statement i, prepared on first use and reset for reuse. Returns NULL with
 * e on a prepare error. */
static sqlite3_stmt *stmt(tg_store *st, int i, tg_err *e)
{
    assert(i >= 0 && i < Q_COUNT);
    if (!st->q[i]) {
        if (sqlite3_prepare_v3(st->db, SQL[i], -1, SQLITE_PREPARE_PERSISTENT, &st->q[i], NULL) !=
            SQLITE_OK) {
            tg_errf(e, "%s: preparing \"%.60s\": %s", st->path, SQL[i], sqlite3_errmsg(st->db));
            return NULL;
        }
    } else {
        sqlite3_reset(st->q[i]);
        sqlite3_clear_bindings(st->q[i]);
    }
    return st->q[i];
}

/* Error from the last sqlite call on st, with context. Returns -1. */
static int db_err(tg_store *st, tg_err *e, const char *what)
{
    return tg_errf(e, "%s: %s: %s", st->path, what, sqlite3_errmsg(st->db));
}

/* Binds text or NULL. */
static void bind_text(sqlite3_stmt *s, int i, const char *t)
{
    if (t)
        sqlite3_bind_text(s, i, t, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, i);
}

/* Runs a statement that returns no rows. Returns 0 or -1 with e. */
static int step_done(tg_store *st, sqlite3_stmt *s, tg_err *e, const char *what)
{
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return db_err(st, e, what);
    return 0;
}

/* Runs a statement that returns one integer or nothing: 1 with *v, 0 when no
 * row, -1 with e. */
static int step_int(tg_store *st, sqlite3_stmt *s, int64_t *v, tg_err *e, const char *what)
{
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *v = sqlite3_column_int64(s, 0);
        sqlite3_reset(s);
        return 1;
    }
    sqlite3_reset(s);
    if (rc == SQLITE_DONE) return 0;
    return db_err(st, e, what);
}

static void now_iso(char out[32])
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* ------------------------------------------------------------------ */
/* Open / close                                                        */

int store_open(tg_store **out, const char *path, tg_err *e)
{
    *out = NULL;
    tg_store *st = calloc(1, sizeof *st);
    if (!st) return tg_errf(e, "%s: out of memory", path);
    st->path = strdup(path);
    if (!st->path) {
        free(st);
        return tg_errf(e, "%s: out of memory", path);
    }
    if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        tg_errf(e, "%s: cannot open the store: %s", path,
                st->db ? sqlite3_errmsg(st->db) : "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(st->db, 10000);
    char *msg = NULL;
    if (sqlite3_exec(st->db,
                     "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                     " PRAGMA foreign_keys=ON;",
                     NULL, NULL, &msg) != SQLITE_OK) {
        tg_errf(e, "%s: not a usable SQLite store: %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        goto fail;
    }
    sqlite3_stmt *s = NULL;
    int64_t version = 0;
    if (sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_step(s) != SQLITE_ROW) {
        tg_errf(e, "%s: reading PRAGMA user_version: %s", path, sqlite3_errmsg(st->db));
        sqlite3_finalize(s);
        goto fail;
    }
    version = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (version > STORE_SCHEMA_VERSION) {
        tg_errf(e,
                "%s: schema version %lld is newer than this tokgate understands (%d); "
                "use a newer tokgate or another --db",
                path, (long long)version, STORE_SCHEMA_VERSION);
        goto fail;
    }
    if (version < 0) {
        tg_errf(e, "%s: PRAGMA user_version is %lld, expected 0..%d", path, (long long)version,
                STORE_SCHEMA_VERSION);
        goto fail;
    }
    if (version == 0) {
        /* A store at version 0 must be empty: refuse someone else's database. */
        if (sqlite3_prepare_v2(st->db, "SELECT count(*) FROM sqlite_master", -1, &s, NULL) !=
                SQLITE_OK ||
            sqlite3_step(s) != SQLITE_ROW) {
            tg_errf(e, "%s: reading the schema: %s", path, sqlite3_errmsg(st->db));
            sqlite3_finalize(s);
            goto fail;
        }
        int64_t n = sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
        if (n != 0) {
            tg_errf(e, "%s: has tables but no tokgate schema version (user_version 0): "
                       "not a tokgate store", path);
            goto fail;
        }
    }
    for (int64_t v = version; v < STORE_SCHEMA_VERSION; v++) {
        char pragma[64];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version=%lld;", (long long)(v + 1));
        if (sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(st->db, MIGRATIONS[v], NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(st->db, pragma, NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(st->db, "COMMIT", NULL, NULL, &msg) != SQLITE_OK) {
            tg_errf(e, "%s: migrating the schema from version %lld: %s", path, (long long)v,
                    msg ? msg : sqlite3_errmsg(st->db));
            sqlite3_free(msg);
            sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
            goto fail;
        }
    }
    *out = st;
    return 0;
fail:
    store_close(st);
    return -1;
}

void store_close(tg_store *st)
{
    if (!st) return;
    for (int i = 0; i < Q_COUNT; i++) sqlite3_finalize(st->q[i]);
    sqlite3_close(st->db);
    free(st->path);
    free(st->buf);
    free(st->base_off);
    free(st->base_len);
    free(st->base_data);
    free(st);
}

struct sqlite3 *store_db(tg_store *st)
{
    return st->db;
}

/* ------------------------------------------------------------------ */
/* Runs                                                                */

/* Finds the row with find statement qf bound to (k1, k2[, k3]) or inserts
 * it with qi bound to (v1..v4 as the statement needs). Returns 0 with *id,
 * or -1 with e. */
static int find_or_insert(tg_store *st, int qf, const char *const *fk, int nfk, int qi,
                          const char *const *iv, int niv, int64_t size, int64_t *id, tg_err *e)
{
    sqlite3_stmt *s = stmt(st, qf, e);
    if (!s) return -1;
    for (int i = 0; i < nfk; i++) bind_text(s, i + 1, fk[i]);
    int r = step_int(st, s, id, e, "looking up a row");
    if (r != 0) return r < 0 ? -1 : 0;
    s = stmt(st, qi, e);
    if (!s) return -1;
    for (int i = 0; i < niv; i++) bind_text(s, i + 1, iv[i]);
    if (qi == Q_ART_INS) sqlite3_bind_int64(s, 3, size);
    if (step_done(st, s, e, "inserting a row") < 0) return -1;
    *id = sqlite3_last_insert_rowid(st->db);
    return 0;
}

static int exec_q(tg_store *st, int q, tg_err *e)
{
    sqlite3_stmt *s = stmt(st, q, e);
    if (!s) return -1;
    return step_done(st, s, e, SQL[q]);
}

int store_begin_run(tg_store *st, const store_run_info *info, int64_t *run_id, tg_err *e)
{
    if (!info->spec_name || !info->spec_sha256)
        return tg_errf(e, "%s: run: spec name and sha256 are required", st->path);
    if (!info->artifact_path || !info->artifact_sha256)
        return tg_errf(e, "%s: run: artifact path and sha256 are required", st->path);
    if (!info->mode || !info->reference || !info->policy_kind)
        return tg_errf(e, "%s: run of %s: mode, reference and policy are required", st->path,
                       info->spec_name);
    if (exec_q(st, Q_BEGIN, e) < 0) return -1;
    int64_t spec_id, art_id;
    char now[32];
    now_iso(now);
    const char *spec_key[2] = {info->spec_name, info->spec_sha256};
    const char *spec_val[4] = {info->spec_name, info->spec_path, info->spec_sha256,
                               info->spec_text};
    if (find_or_insert(st, Q_SPEC_FIND, spec_key, 2, Q_SPEC_INS, spec_val, 4, 0, &spec_id, e) < 0)
        goto fail;
    const char *art[2] = {info->artifact_path, info->artifact_sha256};
    if (find_or_insert(st, Q_ART_FIND, art, 2, Q_ART_INS, art, 2, info->artifact_size, &art_id,
                       e) < 0)
        goto fail;
    sqlite3_stmt *s = stmt(st, Q_RUN_INS, e);
    if (!s) goto fail;
    sqlite3_bind_int64(s, 1, spec_id);
    sqlite3_bind_int64(s, 2, art_id);
    bind_text(s, 3, now);
    bind_text(s, 4, info->host);
    bind_text(s, 5, info->tokgate_version);
    bind_text(s, 6, info->mode);
    bind_text(s, 7, info->reference);
    bind_text(s, 8, info->policy_kind);
    sqlite3_bind_double(s, 9, info->band);
    sqlite3_bind_int(s, 10, info->steps);
    sqlite3_bind_int(s, 11, info->top_k);
    sqlite3_bind_int(s, 12, info->legs);
    if (step_done(st, s, e, "inserting the run") < 0) goto fail;
    int64_t rid = sqlite3_last_insert_rowid(st->db);
    for (int i = 0; i < info->n_arms; i++) {
        const store_arm *a = &info->arms[i];
        if (!a->name || !a->kind || !a->role) {
            tg_errf(e, "%s: run of %s: arms[%d]: name, kind and role are required", st->path,
                    info->spec_name, i);
            goto fail;
        }
        s = stmt(st, Q_ARM_INS, e);
        if (!s) goto fail;
        sqlite3_bind_int64(s, 1, rid);
        bind_text(s, 2, a->name);
        bind_text(s, 3, a->kind);
        bind_text(s, 4, a->role);
        bind_text(s, 5, a->config_json);
        if (step_done(st, s, e, "inserting an arm") < 0) {
            tg_err_prefix(e, "arms[%d] %s", i, a->name);
            goto fail;
        }
    }
    for (int i = 0; i < info->n_prompts; i++) {
        const store_prompt *p = &info->prompts[i];
        if (!p->id || !p->text) {
            tg_errf(e, "%s: run of %s: prompts[%d]: id and text are required", st->path,
                    info->spec_name, i);
            goto fail;
        }
        s = stmt(st, Q_PROMPT_INS, e);
        if (!s) goto fail;
        sqlite3_bind_int64(s, 1, rid);
        sqlite3_bind_int(s, 2, i + 1);
        bind_text(s, 3, p->id);
        bind_text(s, 4, p->text);
        if (step_done(st, s, e, "inserting a prompt") < 0) {
            tg_err_prefix(e, "prompts[%d] %s", i, p->id);
            goto fail;
        }
    }
    if (exec_q(st, Q_COMMIT, e) < 0) goto fail;
    *run_id = rid;
    return 0;
fail:
    exec_q(st, Q_ROLLBACK, NULL);
    return -1;
}

int store_finish_run(tg_store *st, int64_t run_id, const char *verdict, tg_err *e)
{
    char now[32];
    now_iso(now);
    sqlite3_stmt *s = stmt(st, Q_RUN_FINISH, e);
    if (!s) return -1;
    sqlite3_bind_int64(s, 1, run_id);
    bind_text(s, 2, verdict);
    bind_text(s, 3, now);
    if (step_done(st, s, e, "finishing the run") < 0) return -1;
    if (sqlite3_changes(st->db) != 1)
        return tg_errf(e, "%s: finishing run %lld: no such run", st->path, (long long)run_id);
    return 0;
}

int store_latest_run(tg_store *st, const char *spec_name, int64_t *run_id, tg_err *e)
{
    sqlite3_stmt *s = stmt(st, spec_name ? Q_LATEST : Q_LATEST_ANY, e);
    if (!s) return -1;
    if (spec_name) bind_text(s, 1, spec_name);
    return step_int(st, s, run_id, e, "looking up the latest run");
}

int store_has_leg(tg_store *st, int64_t run_id, const char *arm, int leg)
{
    sqlite3_stmt *s = stmt(st, Q_HAS_LEG, NULL);
    if (!s) return 0;
    sqlite3_bind_int64(s, 1, run_id);
    bind_text(s, 2, arm);
    sqlite3_bind_int(s, 3, leg);
    int64_t v;
    return step_int(st, s, &v, NULL, "has leg") == 1;
}

/* ------------------------------------------------------------------ */
/* The compact top-k blob                                              */

enum { TOP_RAW = 0, TOP_PACKED = 1 };

typedef struct bitw {
    unsigned char *p;
    size_t cap, n;      /* bytes written (full) */
    uint64_t acc;
    int nacc;
    int overflow;
} bitw;

static inline void bw_put(bitw *w, uint64_t v, int bits)
{
    assert(bits >= 0 && bits <= 32);
    if (bits == 0) return;
    w->acc |= (v & ((1ull << bits) - 1)) << w->nacc;
    w->nacc += bits;
    while (w->nacc >= 8) {
        if (w->n < w->cap)
            w->p[w->n++] = (unsigned char)w->acc;
        else
            w->overflow = 1;
        w->acc >>= 8;
        w->nacc -= 8;
    }
}

static void bw_flush(bitw *w)
{
    if (w->nacc > 0) bw_put(w, 0, 8 - w->nacc);
}

/* Rice code with parameter b; quotients of 32 or more are escaped as 32 one
 * bits followed by the 32-bit value. */
static void bw_rice(bitw *w, uint32_t v, int b)
{
    uint32_t q = v >> b;
    if (q >= 32) {
        bw_put(w, 0xffffffffu, 32);
        bw_put(w, v, 32);
        return;
    }
    bw_put(w, (1ull << q) - 1, (int)q + 1); /* q ones, then a zero */
    bw_put(w, v, b);
}

static size_t rice_bits(const uint32_t *v, int n, int b)
{
    size_t bits = 0;
    for (int i = 0; i < n; i++) {
        uint32_t q = v[i] >> b;
        bits += q >= 32 ? 64 : q + 1 + (size_t)b;
    }
    return bits;
}

/* The Rice parameter that minimises the coded size of v[0..n-1]. */
static int rice_best(const uint32_t *v, int n)
{
    if (n == 0) return 0;
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    uint64_t mean = sum / (uint64_t)n;
    int b0 = 0;
    while (b0 < 31 && (1ull << (b0 + 1)) <= mean) b0++;
    int best = b0;
    size_t best_bits = rice_bits(v, n, b0);
    for (int b = b0 - 1; b <= b0 + 1; b++) {
        if (b < 0 || b > 31 || b == b0) continue;
        size_t bits = rice_bits(v, n, b);
        if (bits < best_bits) best_bits = bits, best = b;
    }
    return best;
}

/* Order-preserving map of f32 bits to u32 (larger float, larger u32). */
static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static float u2f(uint32_t u)
{
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static size_t put_varint(unsigned char *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (unsigned char)v;
    return n;
}

/* Position of the first unused slot counted idx slots from the start of
 * used[0..n-1], i.e. the idx-th zero. Returns -1 when there is none. */
static int nth_unused(const unsigned char *used, int n, uint32_t idx)
{
    for (int i = 0; i < n; i++) {
        if (used[i]) continue;
        if (idx-- == 0) return i;
    }
    return -1;
}

/* Encodes top[0..n-1] into out (capacity cap >= 16 + 8 n). Returns the
 * length. */
static size_t top_encode(const tg_top *top, int n, unsigned char *out, size_t cap)
{
    assert(n >= 0 && cap >= 16 + 8 * (size_t)n);
    enum { MAXN = 4096 };
    int packed = n > 0 && n <= MAXN;
    int32_t sorted[MAXN];
    int16_t where[MAXN];    /* where[r]: index in sorted of the id at rank r */
    uint32_t vals[MAXN], d[MAXN];
    if (packed) {
        for (int i = 0; i < n && packed; i++) {
            if (top[i].id < 0 || isnan(top[i].logit)) packed = 0;
            if (i > 0 && f2u(top[i].logit) > f2u(top[i - 1].logit)) packed = 0;
        }
    }
    if (packed) {
        /* insertion sort of (id, rank) pairs; n is small (top-k) */
        int16_t rank_of[MAXN];
        for (int i = 0; i < n; i++) {
            int32_t id = top[i].id;
            int j = i;
            while (j > 0 && sorted[j - 1] > id) {
                sorted[j] = sorted[j - 1];
                rank_of[j] = rank_of[j - 1];
                j--;
            }
            if (j > 0 && sorted[j - 1] == id) { packed = 0; break; }
            sorted[j] = id;
            rank_of[j] = (int16_t)i;
        }
        if (packed)
            for (int i = 0; i < n; i++) where[rank_of[i]] = (int16_t)i;
    }
    if (packed) {
        size_t h = 0;
        out[h++] = TOP_PACKED;
        h += put_varint(out + h, (uint64_t)n);
        for (int i = 0; i < n; i++)
            vals[i] = (uint32_t)(i == 0 ? sorted[0] : sorted[i] - sorted[i - 1] - 1);
        int rb = rice_best(vals, n);
        for (int i = 1; i < n; i++) d[i - 1] = f2u(top[i - 1].logit) - f2u(top[i].logit);
        int rl = rice_best(d, n - 1);
        out[h++] = (unsigned char)rb;
        out[h++] = (unsigned char)rl;
        bitw w = {out + h, cap - h, 0, 0, 0, 0};
        for (int i = 0; i < n; i++) bw_rice(&w, vals[i], rb);
        /* Lehmer code: rank position r names its id's index among the sorted
         * ids not used yet, in ceil(log2(n - r)) bits. */
        if (n <= 64) {
            uint64_t used = 0;
            for (int r = 0; r + 1 < n; r++) {
                int pos = where[r];
                uint32_t idx = (uint32_t)(pos - __builtin_popcountll(used & ((1ull << pos) - 1)));
                used |= 1ull << pos;
                int width = 32 - __builtin_clz((uint32_t)(n - r - 1)); /* n - r >= 2 */
                bw_put(&w, idx, width);
            }
        } else {
            unsigned char used[MAXN];
            memset(used, 0, (size_t)n);
            for (int r = 0; r + 1 < n; r++) {
                int pos = where[r];
                uint32_t idx = 0;
                for (int i = 0; i < pos; i++) idx += !used[i];
                used[pos] = 1;
                int width = 0;
                while ((1 << width) < n - r) width++;
                bw_put(&w, idx, width);
            }
        }
        bw_put(&w, f2u(top[0].logit), 32);
        for (int i = 0; i + 1 < n; i++) bw_rice(&w, d[i], rl);
        bw_flush(&w);
        if (!w.overflow && h + w.n <= 4 + 8 * (size_t)n) return h + w.n;
        /* larger than raw: fall through to raw */
    }
    size_t h = 0;
    out[h++] = TOP_RAW;
    h += put_varint(out + h, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        uint32_t id = (uint32_t)top[i].id, lu;
        memcpy(&lu, &top[i].logit, 4);
        for (int k = 0; k < 4; k++) out[h++] = (unsigned char)(id >> (8 * k));
        for (int k = 0; k < 4; k++) out[h++] = (unsigned char)(lu >> (8 * k));
    }
    return h;
}

typedef struct bitr {
    const unsigned char *p;
    size_t n, pos;      /* pos in bits */
} bitr;

/* Reads bits; returns -1 past the end. */
static int br_get(bitr *r, int bits, uint32_t *v)
{
    if (r->pos + (size_t)bits > r->n * 8) return -1;
    uint64_t x = 0;
    for (int i = 0; i < bits; i++, r->pos++)
        x |= (uint64_t)((r->p[r->pos >> 3] >> (r->pos & 7)) & 1) << i;
    *v = (uint32_t)x;
    return 0;
}

static int br_rice(bitr *r, int b, uint32_t *v)
{
    uint32_t q = 0, bit;
    for (;;) {
        if (br_get(r, 1, &bit) < 0) return -1;
        if (!bit) break;
        if (++q == 32) return br_get(r, 32, v);
    }
    uint32_t low = 0;
    if (br_get(r, b, &low) < 0) return -1;
    uint64_t x = ((uint64_t)q << b) | low;
    if (x > 0xffffffffu) return -1;
    *v = (uint32_t)x;
    return 0;
}

static int get_varint(const unsigned char *p, size_t len, size_t *pos, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= len) return -1;
        unsigned char c = p[(*pos)++];
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

int store_decode_top(const void *blob, size_t len, tg_top *top, int cap, tg_err *e)
{
    const unsigned char *p = blob;
    size_t pos = 0;
    uint64_t n;
    if (len < 2) return tg_errf(e, "step.top blob: %zu bytes, expected at least 2", len);
    int fmt = p[pos++];
    if (get_varint(p, len, &pos, &n) < 0 || n > 4096)
        return tg_errf(e, "step.top blob: bad entry count at byte 1");
    if ((int)n > cap)
        return tg_errf(e, "step.top blob: %llu entries, room for %d", (unsigned long long)n, cap);
    if (fmt == TOP_RAW) {
        if (len != pos + 8 * n)
            return tg_errf(e, "step.top blob (raw): %zu bytes, expected %zu", len,
                           (size_t)(pos + 8 * n));
        for (uint64_t i = 0; i < n; i++) {
            uint32_t id = 0, lu = 0;
            for (int k = 0; k < 4; k++) id |= (uint32_t)p[pos++] << (8 * k);
            for (int k = 0; k < 4; k++) lu |= (uint32_t)p[pos++] << (8 * k);
            top[i].id = (int32_t)id;
            memcpy(&top[i].logit, &lu, 4);
        }
        return (int)n;
    }
    if (fmt != TOP_PACKED) return tg_errf(e, "step.top blob: unknown format byte %d", fmt);
    if (pos + 2 > len) return tg_errf(e, "step.top blob: truncated header");
    int rb = p[pos++], rl = p[pos++];
    if (rb > 31 || rl > 31) return tg_errf(e, "step.top blob: Rice parameters %d/%d > 31", rb, rl);
    bitr r = {p + pos, len - pos, 0};
    int32_t sorted[4096];
    int64_t prev = -1;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t g;
        if (br_rice(&r, rb, &g) < 0) return tg_errf(e, "step.top blob: truncated id %llu",
                                                     (unsigned long long)i);
        int64_t id = prev + 1 + (int64_t)g;
        if (id > INT32_MAX) return tg_errf(e, "step.top blob: id %llu out of range",
                                           (unsigned long long)i);
        sorted[i] = (int32_t)id;
        prev = id;
    }
    unsigned char used[4096];
    memset(used, 0, (size_t)n);
    for (uint64_t rpos = 0; rpos < n; rpos++) {
        uint32_t idx = 0;
        if (rpos + 1 < n) {
            int width = 0;
            while ((1ull << width) < n - rpos) width++;
            if (br_get(&r, width, &idx) < 0) return tg_errf(e, "step.top blob: truncated order");
        }
        int found = nth_unused(used, (int)n, idx);
        if (found < 0) return tg_errf(e, "step.top blob: order index %u out of range", idx);
        used[found] = 1;
        top[rpos].id = sorted[found];
    }
    uint32_t u;
    if (br_get(&r, 32, &u) < 0) return tg_errf(e, "step.top blob: truncated first logit");
    top[0].logit = u2f(u);
    for (uint64_t i = 1; i < n; i++) {
        uint32_t d;
        if (br_rice(&r, rl, &d) < 0 || d > u)
            return tg_errf(e, "step.top blob: bad logit delta %llu", (unsigned long long)i);
        u -= d;
        top[i].logit = u2f(u);
    }
    return (int)n;
}

/* ------------------------------------------------------------------ */
/* Legs                                                                */

static int ensure_buf(tg_store *st, size_t n, tg_err *e)
{
    if (st->buf_cap >= n) return 0;
    size_t cap = st->buf_cap ? st->buf_cap : 4096;
    while (cap < n) cap *= 2;
    unsigned char *b = realloc(st->buf, cap);
    if (!b) return tg_errf(e, "%s: out of memory (%zu bytes)", st->path, cap);
    st->buf = b;
    st->buf_cap = cap;
    return 0;
}

/* ids as a JSON array text into a malloc'ed string (NULL for n < 0 or no
 * ids pointer). */
static char *ids_json(const int32_t *ids, int n)
{
    if (!ids || n < 0) return NULL;
    size_t cap = 3 + (size_t)n * 12;
    char *s = malloc(cap);
    if (!s) return NULL;
    size_t k = 0;
    s[k++] = '[';
    for (int i = 0; i < n; i++) k += (size_t)snprintf(s + k, cap - k, i ? ",%d" : "%d", ids[i]);
    s[k++] = ']';
    s[k] = 0;
    return s;
}

static int digest_parse(const char *hex, int64_t *v)
{
    if (!hex || !hex[0]) return 0;
    uint64_t x = 0;
    int n = 0;
    for (; hex[n]; n++) {
        char c = hex[n];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0 || n >= 16) return -1;
        x = x << 4 | (uint64_t)d;
    }
    if (n != 16) return -1;
    *v = (int64_t)x;
    return 1;
}

/* Loads the top blobs that the arm's first leg stored for prompt pid into
 * st->base_*. Returns 0 or -1 with e. */
static int load_base_tops(tg_store *st, int64_t pid, tg_err *e)
{
    for (int i = 0; i < st->base_cap; i++) st->base_len[i] = -1;
    st->base_dlen = 0;
    if (!st->base_leg) return 0;
    sqlite3_stmt *s = stmt(st, Q_BASE_TOPS, e);
    if (!s) return -1;
    sqlite3_bind_int64(s, 1, st->base_leg);
    sqlite3_bind_int64(s, 2, pid);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int step = sqlite3_column_int(s, 0);
        const void *b = sqlite3_column_blob(s, 1);
        int n = sqlite3_column_bytes(s, 1);
        if (step < 0 || step >= (1 << 20)) continue;
        if (step >= st->base_cap) {
            int cap = st->base_cap ? st->base_cap : 64;
            while (cap <= step) cap *= 2;
            size_t *off = realloc(st->base_off, sizeof *off * (size_t)cap);
            if (off) st->base_off = off;
            int *len = realloc(st->base_len, sizeof *len * (size_t)cap);
            if (len) st->base_len = len;
            if (!off || !len) {
                sqlite3_reset(s);
                return tg_errf(e, "%s: out of memory", st->path);
            }
            for (int i = st->base_cap; i < cap; i++) st->base_len[i] = -1;
            st->base_cap = cap;
        }
        if (st->base_dlen + (size_t)n > st->base_dcap) {
            size_t cap = st->base_dcap ? st->base_dcap : 16384;
            while (cap < st->base_dlen + (size_t)n) cap *= 2;
            unsigned char *d = realloc(st->base_data, cap);
            if (!d) {
                sqlite3_reset(s);
                return tg_errf(e, "%s: out of memory", st->path);
            }
            st->base_data = d;
            st->base_dcap = cap;
        }
        if (n > 0) memcpy(st->base_data + st->base_dlen, b, (size_t)n);
        st->base_off[step] = st->base_dlen;
        st->base_len[step] = n;
        st->base_dlen += (size_t)n;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return db_err(st, e, "reading the first leg's steps");
    return 0;
}

/* Writes the rows of one prompt of a leg. Returns 0 or -1 with e. */
static int put_leg_prompt(tg_store *st, const store_leg *leg, int64_t leg_id,
                          const store_leg_prompt *lp, tg_err *e)
{
    int64_t pid;
    sqlite3_stmt *s = stmt(st, Q_PROMPT_FIND, e);
    if (!s) return -1;
    sqlite3_bind_int64(s, 1, leg->run_id);
    bind_text(s, 2, lp->prompt_id);
    int r = step_int(st, s, &pid, e, "looking up a prompt");
    if (r < 0) return -1;
    if (r == 0)
        return tg_errf(e, "prompt %s: not a prompt of run %lld", lp->prompt_id ? lp->prompt_id : "(null)",
                       (long long)leg->run_id);
    if (lp->n_steps < 0 || (lp->n_steps > 0 && !lp->steps))
        return tg_errf(e, "prompt %s: n_steps %d without steps", lp->prompt_id, lp->n_steps);
    char *ids = ids_json(lp->ids, lp->n_ids);
    char *dec = ids_json(lp->decoded_from, lp->n_decoded_from);
    s = stmt(st, Q_LP_INS, e);
    if (!s) {
        free(ids), free(dec);
        return -1;
    }
    sqlite3_bind_int64(s, 1, leg_id);
    sqlite3_bind_int64(s, 2, pid);
    bind_text(s, 3, ids);
    bind_text(s, 4, dec);
    sqlite3_bind_int(s, 5, lp->n_steps);
    bind_text(s, 6, lp->text);
    bind_text(s, 7, lp->error);
    r = step_done(st, s, e, "inserting leg_prompt");
    free(ids), free(dec);
    if (r < 0) return tg_err_prefix(e, "prompt %s", lp->prompt_id);

    if (load_base_tops(st, pid, e) < 0) return -1;
    for (int i = 0; i < lp->n_steps; i++) {
        const store_step *sp = &lp->steps[i];
        if (sp->n_top < 0 || sp->n_top > 4096 || (sp->n_top > 0 && !sp->top))
            return tg_errf(e, "prompt %s step %d: n_top %d, expected 0..4096 entries",
                           lp->prompt_id, sp->step, sp->n_top);
        int64_t dg = 0;
        int hasd = digest_parse(sp->digest, &dg);
        if (hasd < 0)
            return tg_errf(e, "prompt %s step %d: digest \"%.20s\", expected 16 hex digits",
                           lp->prompt_id, sp->step, sp->digest);
        if (ensure_buf(st, 16 + 8 * (size_t)sp->n_top, e) < 0) return -1;
        size_t blen = top_encode(sp->top, sp->n_top, st->buf, st->buf_cap);
        s = stmt(st, Q_STEP_INS, e);
        if (!s) return -1;
        sqlite3_bind_int64(s, 1, leg_id);
        sqlite3_bind_int64(s, 2, pid);
        sqlite3_bind_int(s, 3, sp->step);
        sqlite3_bind_int(s, 4, sp->token);
        if (sp->forced >= 0)
            sqlite3_bind_int(s, 5, sp->forced);
        else
            sqlite3_bind_null(s, 5);
        if (sp->n_top >= 2 && isfinite(sp->top[0].logit) && isfinite(sp->top[1].logit))
            sqlite3_bind_double(s, 6, (double)sp->top[0].logit - (double)sp->top[1].logit);
        else
            sqlite3_bind_null(s, 6);
        if (hasd)
            sqlite3_bind_int64(s, 7, dg);
        else
            sqlite3_bind_null(s, 7);
        /* a blob byte-identical to the arm's first leg is stored once */
        if (sp->step >= 0 && sp->step < st->base_cap && st->base_len[sp->step] == (int)blen &&
            !memcmp(st->base_data + st->base_off[sp->step], st->buf, blen)) {
            sqlite3_bind_null(s, 8);
            sqlite3_bind_int64(s, 9, st->base_leg);
        } else {
            sqlite3_bind_blob(s, 8, st->buf, (int)blen, SQLITE_STATIC);
            sqlite3_bind_null(s, 9);
        }
        if (step_done(st, s, e, "inserting a step") < 0)
            return tg_err_prefix(e, "prompt %s step %d", lp->prompt_id, sp->step);
    }

    for (int i = 0; i < lp->n_dumps; i++) {
        const store_dump *d = &lp->dumps[i];
        if (d->n < 0 || d->n > (1ll << 30) || (d->n > 0 && !d->data) || !d->stage)
            return tg_errf(e, "prompt %s dump %d: n %lld / stage missing", lp->prompt_id, i,
                           (long long)d->n);
        size_t raw = (size_t)d->n * 4;
        size_t bound = ZSTD_compressBound(raw);
        if (ensure_buf(st, raw + bound, e) < 0) return -1;
        unsigned char *shuf = st->buf, *z = st->buf + raw;
        const unsigned char *src = (const unsigned char *)d->data;
        for (int64_t k = 0; k < d->n; k++)
            for (int b = 0; b < 4; b++) shuf[(size_t)b * (size_t)d->n + (size_t)k] = src[4 * k + b];
        size_t zn = ZSTD_compress(z, bound, shuf, raw, 3);
        if (ZSTD_isError(zn))
            return tg_errf(e, "prompt %s dump %d: zstd: %s", lp->prompt_id, i,
                           ZSTD_getErrorName(zn));
        s = stmt(st, Q_DUMP_INS, e);
        if (!s) return -1;
        sqlite3_bind_int64(s, 1, leg_id);
        sqlite3_bind_int64(s, 2, pid);
        sqlite3_bind_int(s, 3, d->step);
        sqlite3_bind_int(s, 4, d->layer);
        bind_text(s, 5, d->stage);
        sqlite3_bind_int64(s, 6, d->n);
        sqlite3_bind_blob(s, 7, z, (int)zn, SQLITE_STATIC);
        if (step_done(st, s, e, "inserting a dump") < 0)
            return tg_err_prefix(e, "prompt %s dump step %d layer %d %s", lp->prompt_id, d->step,
                                 d->layer, d->stage);
    }
    return 0;
}

int store_put_leg(tg_store *st, const store_leg *leg, tg_err *e)
{
    if (!leg->arm) return tg_errf(e, "%s: leg: arm name missing", st->path);
    if (leg->n_prompts < 0 || (leg->n_prompts > 0 && !leg->prompts))
        return tg_errf(e, "%s: leg of %s: n_prompts %d without prompts", st->path, leg->arm,
                       leg->n_prompts);
    if (exec_q(st, Q_BEGIN, e) < 0) return -1;
    int64_t arm_id, bin_id = 0, leg_id;
    sqlite3_stmt *s = stmt(st, Q_ARM_FIND, e);
    if (!s) goto fail;
    sqlite3_bind_int64(s, 1, leg->run_id);
    bind_text(s, 2, leg->arm);
    int r = step_int(st, s, &arm_id, e, "looking up the arm");
    if (r < 0) goto fail;
    if (r == 0) {
        tg_errf(e, "%s: leg: arm %s is not an arm of run %lld", st->path, leg->arm,
                (long long)leg->run_id);
        goto fail;
    }
    if (leg->binary_path || leg->binary_sha256) {
        const char *bin[3] = {leg->binary_path ? leg->binary_path : "",
                              leg->binary_sha256 ? leg->binary_sha256 : "",
                              leg->version ? leg->version : ""};
        if (find_or_insert(st, Q_BIN_FIND, bin, 3, Q_BIN_INS, bin, 3, 0, &bin_id, e) < 0)
            goto fail;
    }
    size_t zcap = ZSTD_compressBound(leg->stderr_len);
    if (ensure_buf(st, zcap, e) < 0) goto fail;
    size_t zn = 0;
    if (leg->stderr_text && leg->stderr_len > 0) {
        zn = ZSTD_compress(st->buf, zcap, leg->stderr_text, leg->stderr_len, 3);
        if (ZSTD_isError(zn)) {
            tg_errf(e, "%s: leg %s/%d: zstd stderr: %s", st->path, leg->arm, leg->leg,
                    ZSTD_getErrorName(zn));
            goto fail;
        }
    }
    char now[32];
    now_iso(now);
    s = stmt(st, Q_LEG_INS, e);
    if (!s) goto fail;
    sqlite3_bind_int64(s, 1, leg->run_id);
    sqlite3_bind_int64(s, 2, arm_id);
    sqlite3_bind_int(s, 3, leg->leg);
    if (bin_id)
        sqlite3_bind_int64(s, 4, bin_id);
    else
        sqlite3_bind_null(s, 4);
    bind_text(s, 5, leg->device);
    bind_text(s, 6, leg->hello_json);
    bind_text(s, 7, leg->model_json);
    sqlite3_bind_int(s, 8, leg->exit_status);
    sqlite3_bind_int(s, 9, leg->term_signal);
    bind_text(s, 10, leg->cause);
    bind_text(s, 11, leg->fault_lines);
    bind_text(s, 12, leg->counters_json);
    sqlite3_bind_int64(s, 13, leg->device_ops);
    sqlite3_bind_int64(s, 14, leg->host_ops);
    if (zn)
        sqlite3_bind_blob(s, 15, st->buf, (int)zn, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 15);
    sqlite3_bind_int64(s, 16, (int64_t)leg->stderr_len);
    sqlite3_bind_double(s, 17, leg->ms_load);
    sqlite3_bind_double(s, 18, leg->ms_prefill);
    sqlite3_bind_double(s, 19, leg->ms_decode);
    sqlite3_bind_double(s, 20, leg->wall_s);
    bind_text(s, 21, now);
    if (step_done(st, s, e, "inserting the leg") < 0) {
        tg_err_prefix(e, "leg %s/%d", leg->arm, leg->leg);
        goto fail;
    }
    leg_id = sqlite3_last_insert_rowid(st->db);
    s = stmt(st, Q_BASE_LEG, e);
    if (!s) goto fail;
    sqlite3_bind_int64(s, 1, leg->run_id);
    sqlite3_bind_int64(s, 2, arm_id);
    sqlite3_bind_int64(s, 3, leg_id);
    st->base_leg = 0;
    if (step_int(st, s, &st->base_leg, e, "looking up the arm's first leg") < 0) goto fail;
    for (int i = 0; i < leg->n_prompts; i++) {
        if (put_leg_prompt(st, leg, leg_id, &leg->prompts[i], e) < 0) {
            tg_err_prefix(e, "%s: leg %s/%d", st->path, leg->arm, leg->leg);
            goto fail;
        }
    }
    if (exec_q(st, Q_COMMIT, e) < 0) goto fail;
    return 0;
fail:
    exec_q(st, Q_ROLLBACK, NULL);
    return -1;
}
