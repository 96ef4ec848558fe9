/*
 * store.c: the SQLite evidence store. One file, WAL journal, foreign keys
 * on, the schema version in PRAGMA user_version (older stores are migrated
 * step by step, newer ones refused). Every arm leg is written in one
 * transaction by store_put_leg, so an interrupted run keeps complete legs
 * and no half ones.
 *
 * Step rows are kept small: they hold only the fields the views and
 * reports need (token, forced token, top1-top2 gap, digest). The top-k ids
 * and logits of all steps of a leg go into one lossless chunk (leg_top,
 * schema version 4), coded across the leg's steps with Huffman codes fitted
 * to that leg and with the step rows' token and gap as side information; a
 * step equal to the arm's first leg's costs 2 bits. store_tops_read
 * decodes one prompt's section. Version-3 stores had one blob per step
 * (store_decode_top); their migration re-codes them into chunks.
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

/* Version 4: the top-k of every step moves out of the step rows into one
 * chunk per leg (leg_top, coded across all its steps: docs/store.md), and
 * the step row keeps token, forced, gap and digest; gap is an INTEGER in
 * units of 2^-24 logits when that is exact (else REAL), and the view v_step
 * gives it as REAL. SCHEMA_V4A runs first, then the chunks of the old rows
 * are written (migrate_v4), then SCHEMA_V4B rebuilds the step table. */
static const char SCHEMA_V4A[] =
    "CREATE TABLE leg_top(\n"
    "  leg_id INTEGER PRIMARY KEY REFERENCES leg(id) ON DELETE CASCADE,\n"
    "  base_leg INTEGER, data BLOB NOT NULL);\n";
static const char SCHEMA_V4B[] =
    "DROP VIEW v_step_top;\n"
    "CREATE TABLE step_v4(\n"
    "  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,\n"
    "  token INTEGER NOT NULL, forced INTEGER, gap, digest INTEGER,\n"
    "  PRIMARY KEY(leg_id, prompt_id, step),\n"
    "  FOREIGN KEY(leg_id, prompt_id) REFERENCES leg_prompt(leg_id, prompt_id) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "INSERT INTO step_v4 SELECT leg_id, prompt_id, step, token, forced,\n"
    "  CASE WHEN gap IS NOT NULL AND abs(gap) < 268435456.0\n"
    "        AND gap * 16777216.0 = CAST(gap * 16777216.0 AS INTEGER)\n"
    "       THEN CAST(gap * 16777216.0 AS INTEGER) ELSE gap END, digest FROM step;\n"
    "DROP TABLE step;\n"
    "ALTER TABLE step_v4 RENAME TO step;\n"
    "CREATE VIEW v_step AS\n"
    "  SELECT leg_id, prompt_id, step, token, forced,\n"
    "         CASE typeof(gap) WHEN 'integer' THEN gap / 16777216.0 ELSE gap END AS gap, digest\n"
    "  FROM step;\n";


/* Version 5: calibration (harness/calibrate.c, docs/verdicts.md): the
 * parameters a run was started with, and per verdict set the panel, the
 * band of every step, every arm's control limits and its band and distance
 * from exact arithmetic at every step. Plain columns, for sqlite3. (IF NOT
 * EXISTS: a store rebuilt from an older fixture may carry them already.) */
static const char SCHEMA_V5[] =
    "CREATE TABLE IF NOT EXISTS run_calibration(\n"
    "  run_id INTEGER PRIMARY KEY REFERENCES run(id) ON DELETE CASCADE,\n"
    "  exact TEXT, factor REAL NOT NULL, limit_k REAL NOT NULL, budget REAL NOT NULL, cal_from TEXT);\n"
    "CREATE TABLE IF NOT EXISTS calib_set(\n"
    "  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, exact TEXT, factor REAL NOT NULL,\n"
    "  limit_k REAL NOT NULL, budget REAL NOT NULL, source_run INTEGER, panel TEXT NOT NULL,\n"
    "  PRIMARY KEY(run_id, set_no),\n"
    "  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE);\n"
    "CREATE TABLE IF NOT EXISTS calib_step(\n"
    "  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, prompt TEXT NOT NULL, step INTEGER NOT NULL,\n"
    "  n_views INTEGER NOT NULL, ref_gap REAL, spread REAL, band REAL, fragile INTEGER NOT NULL,\n"
    "  flipped_by TEXT NOT NULL, exact_token INTEGER, exact_gap REAL,\n"
    "  PRIMARY KEY(run_id, set_no, prompt, step),\n"
    "  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE IF NOT EXISTS calib_limit(\n"
    "  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, arm TEXT NOT NULL, metric TEXT NOT NULL,\n"
    "  value REAL, n INTEGER NOT NULL, mean REAL, sd REAL, upper REAL, ok INTEGER, basis TEXT NOT NULL,\n"
    "  PRIMARY KEY(run_id, set_no, arm, metric),\n"
    "  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE IF NOT EXISTS calib_arm_step(\n"
    "  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, arm TEXT NOT NULL, prompt TEXT NOT NULL,\n"
    "  step INTEGER NOT NULL, band REAL, exact_n INTEGER NOT NULL, exact_max REAL, exact_median REAL,\n"
    "  exact_kl REAL,\n"
    "  PRIMARY KEY(run_id, set_no, arm, prompt, step),\n"
    "  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n";

typedef struct ck_sec ck_sec;
static int migrate_v4(sqlite3 *db, char **msg);

/* Migrations: MIGRATIONS[v] takes a store at version v to v + 1. */
static const char *const MIGRATIONS[STORE_SCHEMA_VERSION] = {SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4A,
                                                             SCHEMA_V5};

/* ------------------------------------------------------------------ */
/* Statements                                                          */

enum {
    Q_SPEC_FIND, Q_SPEC_INS, Q_ART_FIND, Q_ART_INS, Q_BIN_FIND, Q_BIN_INS,
    Q_RUN_INS, Q_ARM_INS, Q_PROMPT_INS, Q_RUN_FINISH,
    Q_ARM_FIND, Q_PROMPT_FIND, Q_LEG_INS, Q_LP_INS, Q_STEP_INS, Q_DUMP_INS,
    Q_HAS_LEG, Q_BASE_LEG, Q_TOP_INS, Q_LATEST, Q_LATEST_ANY, Q_BEGIN, Q_COMMIT, Q_ROLLBACK,
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
    [Q_STEP_INS] = "INSERT INTO step(leg_id, prompt_id, step, token, forced, gap, digest)"
                   " VALUES(?1,?2,?3,?4,?5,?6,?7)",
    [Q_BASE_LEG] = "SELECT id FROM leg WHERE run_id=?1 AND arm_id=?2 AND id<>?3"
                   " ORDER BY id LIMIT 1",
    [Q_TOP_INS] = "INSERT INTO leg_top(leg_id, base_leg, data) VALUES(?1,?2,?3)",
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
    int64_t base_leg;           /* the arm's first leg, 0 when this is it */
    /* the decoded top-k of base legs' prompts, kept while legs of the same
     * arm follow (legs 2..N all compare with leg 1); at most BASE_CACHE_MAX
     * entries in all */
    int64_t cache_leg;
    int n_cache;
    int64_t *cache_pid;
    store_tops *cache;
    size_t cache_entries;
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

static void cache_clear(tg_store *st);

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
            (v == 3 && migrate_v4(st->db, &msg) != 0) ||
            (v == 3 && sqlite3_exec(st->db, SCHEMA_V4B, NULL, NULL, &msg) != SQLITE_OK) ||
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
    cache_clear(st);
    free(st->path);
    free(st->buf);
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

/* The v3 per-step blob (step.top), read by the migration to version 4. */
enum { TOP_RAW = 0, TOP_PACKED = 1 };

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

/* Bit reader (least significant bit first) over a v4 chunk or a v3 step
 * blob; reads past the end fail. */
typedef struct cbits {
    const unsigned char *p;
    size_t nbits, pos, end;  /* end: limit in bits of the current section */
} cbits;

static int cb_get(cbits *r, int bits, uint32_t *v)
{
    assert(bits >= 0 && bits <= 32);
    if (r->pos + (size_t)bits > r->end) return -1;
    uint64_t x = 0;
    size_t byte = r->pos >> 3, nbytes = (r->nbits + 7) / 8;
    int shift = (int)(r->pos & 7), have = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (byte + 8 <= nbytes)
        memcpy(&x, r->p + byte, 8);
    else
#endif
        for (size_t b = byte; have < bits + shift && b < nbytes; b++, have += 8) x |= (uint64_t)r->p[b] << have;
    x >>= shift;
    *v = bits == 32 ? (uint32_t)x : (uint32_t)(x & ((1ull << bits) - 1));
    r->pos += (size_t)bits;
    return 0;
}

static int br_rice(cbits *r, int b, uint32_t *v)
{
    uint32_t q = 0, bit;
    for (;;) {
        if (cb_get(r, 1, &bit) < 0) return -1;
        if (!bit) break;
        if (++q == 32) return cb_get(r, 32, v);
    }
    uint32_t low = 0;
    if (cb_get(r, b, &low) < 0) return -1;
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
    cbits r = {p + pos, (len - pos) * 8, 0, (len - pos) * 8};
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
            if (cb_get(&r, width, &idx) < 0) return tg_errf(e, "step.top blob: truncated order");
        }
        int found = nth_unused(used, (int)n, idx);
        if (found < 0) return tg_errf(e, "step.top blob: order index %u out of range", idx);
        used[found] = 1;
        top[rpos].id = sorted[found];
    }
    uint32_t u;
    if (cb_get(&r, 32, &u) < 0) return tg_errf(e, "step.top blob: truncated first logit");
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
/* Top-k chunks (schema version 4)                                     */

/* One leg's top-k ids and logits, all prompts and steps, in one blob
 * (leg_top.data; docs/store.md describes the bytes). Each id and each logit
 * difference is coded as a half-octave symbol (Huffman, one table per leg
 * and kind, so the code fits that leg's own distribution) plus raw low
 * bits. The step row's token and gap columns are side information: when the
 * token is the first id and the gap reproduces the second logit exactly, the
 * chunk leaves both out. A step identical to the arm's first leg's step is
 * one 2-bit mode. Anything the packed form cannot express (negative ids,
 * logits out of order, NaN) is coded raw. */

/* NSYM half-octave symbols; the id code has them twice: 0..NSYM-1 code a
 * new id (id + 1), NSYM..2 NSYM-1 an id seen before in the same section, by
 * its recency rank (rank + 1: how many distinct ids were seen since). */
enum { CHUNK_FORMAT = 1, NSYM = 65, HMAX = 2 * NSYM, MAXLEN = 15, NBITS_N = 13 };
enum { MODE_SAME = 0, MODE_REGULAR = 1, MODE_PACKED = 2, MODE_RAW = 3 };

/* Growable bit writer, least significant bit first; gb_put appends the
 * low `bits` (<= 32) bits of v, and a failed allocation sets oom (the
 * stream is then incomplete and the caller reports it). */
typedef struct gbits {
    unsigned char *p;
    size_t cap, n;       /* bytes written (full) */
    uint64_t acc;
    int nacc, oom;
} gbits;

static inline void gb_put(gbits *w, uint64_t v, int bits)
{
    assert(bits >= 0 && bits <= 32);
    if (bits == 0) return;
    w->acc |= (v & ((1ull << bits) - 1)) << w->nacc;
    w->nacc += bits;
    if (w->nacc < 32) return;
    if (w->n + 4 > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 4096;
        unsigned char *q = realloc(w->p, cap);
        if (!q) {
            w->oom = 1;
            w->acc >>= 32, w->nacc -= 32;
            return;
        }
        w->p = q, w->cap = cap;
    }
    for (int k = 0; k < 4; k++) w->p[w->n++] = (unsigned char)(w->acc >> (8 * k));
    w->acc >>= 32;
    w->nacc -= 32;
}

static size_t gb_bits(const gbits *w)
{
    return w->n * 8 + (size_t)w->nacc;
}

/* Writes out the pending bits, zero-padded to a byte (w->oom on failure). */
static void gb_flush(gbits *w)
{
    if (w->nacc == 0 || w->oom) return;
    if (w->n + 8 > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 4096;
        unsigned char *q = realloc(w->p, cap);
        if (!q) {
            w->oom = 1;
            return;
        }
        w->p = q, w->cap = cap;
    }
    for (int b = 0; b < w->nacc; b += 8) w->p[w->n++] = (unsigned char)(w->acc >> b);
    w->acc = 0, w->nacc = 0;
}

/* Appends the first nbits bits of src's bytes to w. */
static void gb_append(gbits *w, const unsigned char *src, size_t nbits)
{
    size_t i = 0;
    for (; i + 32 <= nbits; i += 32) {
        size_t b = i / 8;
        gb_put(w, (uint64_t)src[b] | (uint64_t)src[b + 1] << 8 | (uint64_t)src[b + 2] << 16 |
                      (uint64_t)src[b + 3] << 24, 32);
    }
    for (; i < nbits; i += 8) {
        int k = nbits - i >= 8 ? 8 : (int)(nbits - i);
        gb_put(w, src[i / 8], k);
    }
}

/* Unsigned varint in 8-bit groups (7 bits and a continuation bit). */
static void gb_varint(gbits *w, uint64_t v)
{
    while (v >= 0x80) {
        gb_put(w, (v & 0x7f) | 0x80, 8);
        v >>= 7;
    }
    gb_put(w, v, 8);
}

/* Half-octave symbol of v >= 1: 0 for 1, else 2b - 1 + h for b = floor(log2 v)
 * and h the bit below the leading one; *nraw low bits follow (b - 1). */
static inline int sym_of(uint64_t v, int *nraw, uint32_t *raw)
{
    int b = 63 - __builtin_clzll(v);
    if (b == 0) {
        *nraw = 0, *raw = 0;
        return 0;
    }
    *nraw = b - 1;
    *raw = (uint32_t)(v & ((1ull << (b - 1)) - 1));
    return 2 * b - 1 + (int)((v >> (b - 1)) & 1);
}

typedef struct huff {
    uint8_t len[HMAX];
    uint32_t rev[HMAX];          /* the code, bit-reversed for the LSB-first stream */
    uint16_t count[MAXLEN + 1];  /* codes per length (decoding) */
    uint8_t sorted[HMAX];        /* symbols in canonical order (decoding) */
} huff;

/* Canonical codes (and decoding tables) from h->len. Returns 0, or -1 when
 * the lengths over-subscribe the code space. */
static int huff_canon(huff *h)
{
    memset(h->count, 0, sizeof h->count);
    for (int s = 0; s < HMAX; s++) h->count[h->len[s]]++;
    h->count[0] = 0;
    int left = 1;
    for (int l = 1; l <= MAXLEN; l++) {
        left <<= 1;
        left -= h->count[l];
        if (left < 0) return -1;
    }
    uint32_t next[MAXLEN + 2], code = 0;
    int offs[MAXLEN + 2];
    offs[1] = 0;
    for (int l = 1; l <= MAXLEN; l++) {
        code = (code + (l > 1 ? h->count[l - 1] : 0)) << (l > 1 ? 1 : 0);
        next[l] = code;
        offs[l + 1] = offs[l] + h->count[l];
    }
    for (int s = 0; s < HMAX; s++) {
        int l = h->len[s];
        if (!l) continue;
        uint32_t c = next[l]++, r = 0;
        for (int i = 0; i < l; i++) r |= ((c >> i) & 1) << (l - 1 - i);
        h->rev[s] = r;
        h->sorted[offs[l]++] = (uint8_t)s;
    }
    return 0;
}

/* Huffman code lengths (at most MAXLEN bits) for freq[HMAX]. */
static void huff_build(huff *h, const uint32_t *freq0)
{
    uint64_t freq[HMAX];
    for (int s = 0; s < HMAX; s++) freq[s] = freq0[s];
    for (;;) {
        memset(h->len, 0, sizeof h->len);
        int n = 0, node_sym[2 * HMAX];
        uint64_t w[2 * HMAX];
        int parent[2 * HMAX], alive[2 * HMAX];
        for (int s = 0; s < HMAX; s++)
            if (freq[s]) node_sym[n] = s, w[n] = freq[s], parent[n] = -1, alive[n] = 1, n++;
        if (n == 0) break;
        if (n == 1) {
            h->len[node_sym[0]] = 1;
            break;
        }
        int leaves = n;
        for (int left = leaves; left > 1; left--) {
            int a = -1, b = -1;
            for (int i = 0; i < n; i++) {
                if (!alive[i]) continue;
                if (a < 0 || w[i] < w[a]) b = a, a = i;
                else if (b < 0 || w[i] < w[b]) b = i;
            }
            alive[a] = alive[b] = 0;
            w[n] = w[a] + w[b], parent[n] = -1, alive[n] = 1;
            parent[a] = parent[b] = n;
            n++;
        }
        int maxl = 0;
        for (int i = 0; i < leaves; i++) {
            int l = 0;
            for (int j = i; parent[j] >= 0; j = parent[j]) l++;
            h->len[node_sym[i]] = (uint8_t)l;
            if (l > maxl) maxl = l;
        }
        if (maxl <= MAXLEN) break;
        for (int s = 0; s < HMAX; s++) freq[s] = freq[s] ? (freq[s] + 1) / 2 : 0;
    }
    int rc = huff_canon(h);
    assert(rc == 0);
    (void)rc;
}

static void huff_write(gbits *w, const huff *h)
{
    int lo = 0, hi = -1;
    for (int s = 0; s < HMAX; s++)
        if (h->len[s]) {
            if (hi < 0) lo = s;
            hi = s;
        }
    gb_put(w, (uint64_t)lo, 8);
    gb_put(w, (uint64_t)(hi - lo + 1), 8);
    for (int s = lo; s <= hi; s++) gb_put(w, h->len[s], 4);
}

/* Writes v >= 1 as symbol base + sym_of(v) of h and its raw bits. */
static inline void put_sym(gbits *w, const huff *h, int base, uint64_t v)
{
    int nraw;
    uint32_t raw;
    int s = base + sym_of(v, &nraw, &raw);
    assert(h->len[s]);
    if (h->len[s] + nraw <= 32) {
        gb_put(w, h->rev[s] | (uint64_t)raw << h->len[s], h->len[s] + nraw);
        return;
    }
    gb_put(w, h->rev[s], h->len[s]);
    gb_put(w, raw, nraw);
}

/* One step handed to the chunk coder. */
typedef struct ck_step {
    int step;
    int32_t token;
    int has_gap;
    double gap;              /* the step row's gap (top1 - top2), when has_gap */
    int n;
    const tg_top *top;
    int same;                /* identical to the base leg's step */
} ck_step;

struct ck_sec {
    int64_t prompt_id;
    const char *name;        /* the prompt's name (p1..): the section's key, kept by merges */
    int n_steps;
    const ck_step *steps;    /* ascending step numbers */
};

/* The second logit as the step row's gap gives it back. */
static float gap_logit1(float l0, double gap)
{
    return (float)((double)l0 - gap);
}

static int step_mode(const ck_step *s)
{
    if (s->same) return MODE_SAME;
    if (s->n < 1 || s->n > 4096) return MODE_RAW;
    for (int i = 0; i < s->n; i++) {
        if (s->top[i].id < 0 || isnan(s->top[i].logit)) return MODE_RAW;
        if (i > 0 && f2u(s->top[i].logit) > f2u(s->top[i - 1].logit)) return MODE_RAW;
    }
    if (s->n >= 2 && s->has_gap && s->token == s->top[0].id) {
        float l1 = gap_logit1(s->top[0].logit, s->gap);
        if (!memcmp(&l1, &s->top[1].logit, 4)) return MODE_REGULAR;
    }
    return MODE_PACKED;
}


/* Recency of ids within a section: every id coded (or implied by the
 * token) is pushed at the next position; rank(id) counts the distinct ids
 * pushed after its last push. A Fenwick tree marks each id's last position;
 * a hash maps ids to it. Encoder and decoder push the same ids in the same
 * order, so ranks agree. */
typedef struct recent {
    int cap, n, marks, limit;   /* limit: most pushes allowed (grows up to it) */
    int32_t *bit;            /* Fenwick tree over positions 1..cap */
    int32_t *id_at;          /* (cap) id pushed at each position */
    uint8_t *marked;         /* (cap) 1 at each id's last position */
    uint32_t hmask;
    int32_t *hkey, *hpos;    /* open addressing (2 cap slots at least), key -1 empty */
    int top;                 /* highest power of two <= cap */
} recent;

static void rec_free(recent *R)
{
    free(R->bit), free(R->id_at), free(R->marked), free(R->hkey), free(R->hpos);
    memset(R, 0, sizeof *R);
}

static inline uint32_t rec_slot(const recent *R, int32_t id)
{
    uint32_t x = (uint32_t)id * 0x9e3779b1u, i = (x ^ (x >> 15)) & R->hmask;
    while (R->hkey[i] != -1 && R->hkey[i] != id) i = (i + 1) & R->hmask;
    return i;
}

/* Sets the capacity to cap (>= R->n), rebuilding the tree and the hash.
 * Returns 0 or -1 (out of memory; R unchanged). */
static int rec_resize(recent *R, int cap)
{
    uint32_t h = 16;
    while (h < 2u * (uint32_t)cap) h <<= 1;
    int32_t *bit = calloc((size_t)cap + 1, sizeof *bit), *id_at = malloc(sizeof *id_at * (size_t)cap);
    uint8_t *marked = calloc((size_t)cap, 1);
    int32_t *hkey = malloc(sizeof *hkey * h), *hpos = malloc(sizeof *hpos * h);
    if (!bit || !id_at || !marked || !hkey || !hpos) {
        free(bit), free(id_at), free(marked), free(hkey), free(hpos);
        return -1;
    }
    if (R->n) {
        memcpy(id_at, R->id_at, sizeof *id_at * (size_t)R->n);
        memcpy(marked, R->marked, (size_t)R->n);
    }
    memset(hkey, 0xff, sizeof *hkey * h);
    recent old = *R;
    R->bit = bit, R->id_at = id_at, R->marked = marked, R->hkey = hkey, R->hpos = hpos;
    R->cap = cap, R->hmask = h - 1;
    for (R->top = 1; R->top * 2 <= cap; R->top *= 2) {}
    /* the tree in O(cap), the hash from the marked positions */
    for (int i = 1; i <= cap; i++) {
        bit[i] += i <= R->n ? marked[i - 1] : 0;
        int j = i + (i & -i);
        if (j <= cap) bit[j] += bit[i];
    }
    for (int i = 0; i < R->n; i++)
        if (marked[i]) {
            uint32_t k = rec_slot(R, id_at[i]);
            hkey[k] = id_at[i], hpos[k] = i;
        }
    free(old.bit), free(old.id_at), free(old.marked), free(old.hkey), free(old.hpos);
    return 0;
}

/* An empty recency of up to limit pushes, room for cap now. Returns 0 or
 * -1 (out of memory). */
static int rec_init(recent *R, int cap, int limit)
{
    memset(R, 0, sizeof *R);
    R->limit = limit;
    return rec_resize(R, cap > 0 ? cap : 1);
}

/* Forgets every push (a new section). */
static void rec_clear(recent *R)
{
    memset(R->bit, 0, sizeof *R->bit * ((size_t)R->cap + 1));
    memset(R->marked, 0, (size_t)R->cap);
    memset(R->hkey, 0xff, sizeof *R->hkey * (R->hmask + 1));
    R->n = R->marks = 0;
}

static inline void bit_add(recent *R, int i, int d)
{
    for (i++; i <= R->cap; i += i & -i) R->bit[i] += d;
}

/* The recency rank of id (0: the last id pushed), or -1 when not seen. */
static int64_t rec_rank(const recent *R, int32_t id)
{
    uint32_t k = rec_slot(R, id);
    if (R->hkey[k] == -1) return -1;
    int32_t sum = 0;
    for (int i = R->hpos[k] + 1; i > 0; i -= i & -i) sum += R->bit[i];
    return R->marks - sum;
}

/* The id of recency rank rank, or -1 when there is none. */
static int64_t rec_find(const recent *R, uint32_t rank)
{
    if (rank >= (uint32_t)R->marks) return -1;
    int32_t k = R->marks - (int32_t)rank; /* the k-th marked position */
    int pos = 0;
    for (int step = R->top; step > 0; step >>= 1)
        if (pos + step <= R->cap && R->bit[pos + step] < k) pos += step, k -= R->bit[pos];
    return pos < R->n ? R->id_at[pos] : -1;
}

/* Pushes id (>= 0). Returns 0, or -1 past the limit or out of memory. */
static int rec_push(recent *R, int32_t id)
{
    if (R->n >= R->limit) return -1;
    if (R->n >= R->cap && rec_resize(R, R->cap * 2 < R->limit ? R->cap * 2 : R->limit) < 0) return -1;
    uint32_t k = rec_slot(R, id);
    if (R->hkey[k] == -1) {
        R->hkey[k] = id;
        R->marks++;
    } else {
        bit_add(R, R->hpos[k], -1);
        R->marked[R->hpos[k]] = 0;
    }
    R->hpos[k] = R->n;
    bit_add(R, R->n, 1);
    R->marked[R->n] = 1;
    R->id_at[R->n++] = id;
    return 0;
}

/* Raw bits after symbol s (0..HMAX-1). */
static inline int sym_nraw(int s)
{
    s %= NSYM;
    return s == 0 ? 0 : ((s + 1) >> 1) - 1;
}

/* 1 when symbol a (with its raw bits) is shorter than symbol b under h; an
 * unused symbol counts 64 bits, so a choice never lands on one. */
static inline int sym_cheaper(const huff *h, int a, int b)
{
    int ca = (h->len[a] ? h->len[a] : 64) + sym_nraw(a), cb = (h->len[b] ? h->len[b] : 64) + sym_nraw(b);
    return ca < cb;
}

/* Encodes one leg's sections into *out (malloc'ed, *len bytes). Returns 0
 * or -1 with e (out of memory). */
static int chunk_encode(const ck_sec *sec, int n_sec, unsigned char **out, size_t *len, tg_err *e)
{
    uint32_t fid[HMAX] = {0}, flg[HMAX] = {0};
    size_t n_all = 0, n_ids = 0;
    for (int p = 0; p < n_sec; p++) n_all += (size_t)sec[p].n_steps;
    unsigned char *modes = malloc(n_all ? n_all : 1);
    if (!modes) return tg_errf(e, "out of memory");
    size_t mi = 0;
    int max_sec = 0;   /* most ids pushed in one section */
    for (int p = 0; p < n_sec; p++) {
        int in_sec = 0;
        for (int i = 0; i < sec[p].n_steps; i++) {
            const ck_step *s = &sec[p].steps[i];
            int m = modes[mi++] = (unsigned char)step_mode(s), nraw;
            uint32_t raw;
            if (m != MODE_REGULAR && m != MODE_PACKED) continue;
            n_ids += (size_t)(s->n - (m == MODE_REGULAR));
            in_sec += s->n;
            for (int r = m == MODE_REGULAR ? 2 : 1; r < s->n; r++)
                flg[sym_of((uint64_t)(f2u(s->top[r - 1].logit) - f2u(s->top[r].logit)) + 1, &nraw, &raw)]++;
        }
        if (in_sec > max_sec) max_sec = in_sec;
    }
    /* each coded id: its recency rank + 1 in its section, 0 when new */
    uint32_t *rv = malloc(sizeof *rv * (n_ids ? n_ids : 1));
    recent R;
    if (!rv || rec_init(&R, max_sec, max_sec) < 0) {
        free(modes), free(rv);
        return tg_errf(e, "out of memory");
    }
    size_t ii = 0;
    mi = 0;
    for (int p = 0; p < n_sec; p++) {
        rec_clear(&R);
        for (int i = 0; i < sec[p].n_steps; i++) {
            const ck_step *s = &sec[p].steps[i];
            int m = modes[mi++];
            if (m != MODE_REGULAR && m != MODE_PACKED) continue;
            for (int r = 0; r < s->n; r++) {
                if (r > 0 || m == MODE_PACKED) rv[ii++] = (uint32_t)(rec_rank(&R, s->top[r].id) + 1);
                int ok = rec_push(&R, s->top[r].id);
                assert(ok == 0);
                (void)ok;
            }
        }
    }
    assert(ii == n_ids);
    rec_free(&R);
    /* the id code: first every seen id by rank, then each id the cheaper
     * way under that code */
    uint8_t *sn = malloc(n_ids ? n_ids : 1), *sr = malloc(n_ids ? n_ids : 1);
    if (!sn || !sr) {
        free(modes), free(rv), free(sn), free(sr);
        return tg_errf(e, "out of memory");
    }
    ii = 0;
    mi = 0;
    for (int p = 0; p < n_sec; p++)
        for (int i = 0; i < sec[p].n_steps; i++) {
            const ck_step *s = &sec[p].steps[i];
            int m = modes[mi++], nraw;
            uint32_t raw;
            if (m != MODE_REGULAR && m != MODE_PACKED) continue;
            for (int r = m == MODE_REGULAR; r < s->n; r++, ii++) {
                sn[ii] = (uint8_t)sym_of((uint64_t)s->top[r].id + 1, &nraw, &raw);
                sr[ii] = rv[ii] ? (uint8_t)(NSYM + sym_of(rv[ii], &nraw, &raw)) : 0xff;
            }
        }
    huff hid, hlg;
    for (int round = 0; round < 2; round++) {
        memset(fid, 0, sizeof fid);
        for (size_t k = 0; k < n_ids; k++)
            fid[sr[k] != 0xff && (round == 0 || sym_cheaper(&hid, sr[k], sn[k])) ? sr[k] : sn[k]]++;
        huff_build(&hid, fid);
    }
    huff_build(&hlg, flg);
    gbits w = {0}, body = {0};
    size_t *bits = calloc(n_sec > 0 ? (size_t)n_sec : 1, sizeof *bits);
    if (!bits) {
        free(modes), free(rv), free(sn), free(sr);
        return tg_errf(e, "out of memory");
    }
    mi = 0;
    ii = 0;
    for (int p = 0; p < n_sec; p++) {
        const unsigned char *pm = modes + mi;
        mi += (size_t)sec[p].n_steps;
        size_t start = gb_bits(&body);
        uint32_t umin = UINT32_MAX, umax = 0;
        int ncommon = -1;
        for (int i = 0; i < sec[p].n_steps; i++) {
            const ck_step *s = &sec[p].steps[i];
            int m = pm[i];
            if (m != MODE_REGULAR && m != MODE_PACKED) continue;
            uint32_t u = f2u(s->top[0].logit);
            if (u < umin) umin = u;
            if (u > umax) umax = u;
            if (ncommon < 0) ncommon = s->n;
        }
        if (ncommon < 0) umin = umax = 0, ncommon = 0;
        int wbits = umax > umin ? 32 - __builtin_clz(umax - umin) : 0;
        gb_put(&body, umin, 32);
        gb_put(&body, (uint64_t)wbits, 6);
        gb_put(&body, (uint64_t)ncommon, NBITS_N);
        for (int i = 0; i < sec[p].n_steps; i++) {
            const ck_step *s = &sec[p].steps[i];
            int m = pm[i];
            gb_put(&body, (uint64_t)m, 2);
            if (m == MODE_SAME) continue;
            if (m == MODE_RAW) {
                gb_put(&body, (uint64_t)s->n, NBITS_N);
                for (int r = 0; r < s->n; r++) {
                    uint32_t lu;
                    memcpy(&lu, &s->top[r].logit, 4);
                    gb_put(&body, (uint32_t)s->top[r].id, 32);
                    gb_put(&body, lu, 32);
                }
                continue;
            }
            if (s->n == ncommon) gb_put(&body, 1, 1);
            else gb_put(&body, 0, 1), gb_put(&body, (uint64_t)s->n, NBITS_N);
            for (int r = m == MODE_REGULAR; r < s->n; r++, ii++) {
                uint64_t nv = (uint64_t)s->top[r].id + 1;
                if (sr[ii] != 0xff && sym_cheaper(&hid, sr[ii], sn[ii]))
                    put_sym(&body, &hid, NSYM, rv[ii]);
                else
                    put_sym(&body, &hid, 0, nv);
            }
            gb_put(&body, f2u(s->top[0].logit) - umin, wbits);
            for (int r = m == MODE_REGULAR ? 2 : 1; r < s->n; r++)
                put_sym(&body, &hlg, 0, (uint64_t)(f2u(s->top[r - 1].logit) - f2u(s->top[r].logit)) + 1);
        }
        bits[p] = gb_bits(&body) - start;
    }
    gb_put(&w, CHUNK_FORMAT, 8);
    huff_write(&w, &hid);
    huff_write(&w, &hlg);
    gb_varint(&w, (uint64_t)n_sec);
    for (int p = 0; p < n_sec; p++) {
        size_t nl = strlen(sec[p].name);
        gb_varint(&w, (uint64_t)nl);
        for (size_t k = 0; k < nl; k++) gb_put(&w, (unsigned char)sec[p].name[k], 8);
        gb_varint(&w, (uint64_t)sec[p].n_steps);
        gb_varint(&w, (uint64_t)bits[p]);
    }
    size_t body_bits = gb_bits(&body);
    gb_flush(&body);
    gb_append(&w, body.p, body_bits);
    gb_flush(&w);
    free(body.p);
    free(bits);
    free(modes);
    free(rv), free(sn), free(sr);
    if (w.oom || body.oom) {
        free(w.p);
        return tg_errf(e, "out of memory");
    }
    *out = w.p;
    *len = w.n;
    return 0;
}

static int cb_varint(cbits *r, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        uint32_t c;
        if (cb_get(r, 8, &c) < 0) return -1;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

static int huff_read(cbits *r, huff *h)
{
    uint32_t lo, cnt, l;
    memset(h->len, 0, sizeof h->len);
    if (cb_get(r, 8, &lo) < 0 || cb_get(r, 8, &cnt) < 0 || lo + cnt > HMAX) return -1;
    for (uint32_t s = lo; s < lo + cnt; s++) {
        if (cb_get(r, 4, &l) < 0) return -1;
        h->len[s] = (uint8_t)l;
    }
    return huff_canon(h);
}

/* Reads one symbol of h into *sym and its value (>= 1, from the symbol
 * modulo NSYM and the raw bits) into *v. Returns 0 or -1. */
static int get_sym(cbits *r, const huff *h, int *symp, uint64_t *v)
{
    int code = 0, first = 0, index = 0, sym = -1;
    /* the next (up to) MAXLEN bits at once; the code's first bit comes first */
    size_t left = r->end - r->pos;
    int avail = left < MAXLEN ? (int)left : MAXLEN;
    uint32_t pk = 0;
    if (avail > 0 && cb_get(r, avail, &pk) < 0) return -1;
    r->pos -= (size_t)avail;
    for (int l = 1; l <= avail; l++) {
        code |= (int)((pk >> (l - 1)) & 1);
        int count = h->count[l];
        if (code - first < count) {
            sym = h->sorted[index + code - first];
            r->pos += (size_t)l;
            break;
        }
        index += count;
        first += count;
        first <<= 1;
        code <<= 1;
    }
    if (sym < 0) return -1;
    *symp = sym;
    sym %= NSYM;
    if (sym == 0) {
        *v = 1;
        return 0;
    }
    int b = (sym + 1) >> 1, hbit = (sym + 1) & 1;
    uint32_t raw = 0;
    if (cb_get(r, b - 1, &raw) < 0) return -1;
    *v = (1ull << b) | (uint64_t)hbit << (b - 1) | raw;
    return 0;
}

void store_tops_free(store_tops *t)
{
    if (!t) return;
    free(t->step);
    free(t->n_top);
    free(t->off);
    free(t->top);
    memset(t, 0, sizeof *t);
}

/* Room for n steps and m entries in t. Returns 0 or -1. */
static int tops_reserve(store_tops *t, int n, size_t m)
{
    t->step = calloc((size_t)(n ? n : 1), sizeof *t->step);
    t->n_top = calloc((size_t)(n ? n : 1), sizeof *t->n_top);
    t->off = calloc((size_t)(n ? n : 1), sizeof *t->off);
    t->top = malloc(sizeof *t->top * (m ? m : 1));
    return t->step && t->n_top && t->off && t->top ? 0 : -1;
}

/* The gap column's value: INTEGER in units of 2^-24 logits, or REAL. */
static int gap_value(sqlite3_stmt *s, int col, double *gap)
{
    int t = sqlite3_column_type(s, col);
    if (t == SQLITE_NULL) return 0;
    if (t == SQLITE_INTEGER) *gap = (double)sqlite3_column_int64(s, col) / 16777216.0;
    else *gap = sqlite3_column_double(s, col);
    return 1;
}

static int tops_read(sqlite3 *db, int64_t leg_id, int64_t prompt_id, store_tops *out, int depth, tg_err *e);

/* Parses a chunk's head (format, code tables, section directory) from the
 * bytes p[0..len-1] and finds the section named name: *found, its step
 * count, its first bit (counted from the chunk's start) and its length in
 * bits. Returns 0, or -1 with e (also when the head runs past len). */
static int chunk_head(const unsigned char *p, size_t len, const char *name, huff *hid, huff *hlg, int *found,
                      int *n_steps, uint64_t *start, uint64_t *nbits, tg_err *e)
{
    cbits r = {p, len * 8, 0, len * 8};
    uint32_t fmt = 0;
    if (cb_get(&r, 8, &fmt) < 0 || fmt != CHUNK_FORMAT)
        return tg_errf(e, "leg_top chunk: format %u, expected %d", len ? fmt : 0u, CHUNK_FORMAT);
    if (huff_read(&r, hid) < 0 || huff_read(&r, hlg) < 0)
        return tg_errf(e, "leg_top chunk: bad code tables at bit %zu", r.pos);
    uint64_t n_sec, nl, nst, nb, skip = 0;
    *found = 0;
    if (cb_varint(&r, &n_sec) < 0 || n_sec > (1u << 24)) return tg_errf(e, "leg_top chunk: bad section count");
    for (uint64_t i = 0; i < n_sec; i++) {
        char nm[256];
        if (cb_varint(&r, &nl) < 0 || nl >= sizeof nm)
            return tg_errf(e, "leg_top chunk: bad section name %llu", (unsigned long long)i);
        for (uint64_t k = 0; k < nl; k++) {
            uint32_t ch;
            if (cb_get(&r, 8, &ch) < 0) return tg_errf(e, "leg_top chunk: truncated section name");
            nm[k] = (char)ch;
        }
        nm[nl] = 0;
        if (cb_varint(&r, &nst) < 0 || cb_varint(&r, &nb) < 0 || nst > (1u << 24) || nb > ((uint64_t)1 << 40))
            return tg_errf(e, "leg_top chunk: bad section directory entry %llu", (unsigned long long)i);
        if (!*found && !strcmp(nm, name)) *found = 1, *n_steps = (int)nst, *nbits = nb;
        else if (!*found) skip += nb;
    }
    *start = r.pos + skip;   /* the bodies follow the directory */
    return 0;
}

/* Where a chunk's bytes come from: an open incremental blob (only the head
 * and the wanted section are read) or memory. */
typedef struct chunk_src {
    sqlite3_blob *blob;
    size_t len;
} chunk_src;

static int src_read(const chunk_src *c, size_t off, size_t n, unsigned char *dst)
{
    if (off + n > c->len || n > INT32_MAX) return -1;
    return n == 0 || sqlite3_blob_read(c->blob, dst, (int)n, (int)off) == SQLITE_OK ? 0 : -1;
}

/* Decodes the section of prompt prompt_name of a leg's chunk, the step
 * rows' side information in rows (n_rows, ascending step), into out. Steps
 * stored once are taken from base_leg (read at depth + 1). Returns 0 or -1
 * with e. */
static int chunk_decode(sqlite3 *db, int64_t base_leg, const chunk_src *src, int64_t prompt_id,
                        const char *prompt_name, const ck_step *rows, int n_rows, store_tops *out, int depth,
                        tg_err *e)
{
    huff hid, hlg;
    int found = 0, n_steps = 0;
    uint64_t start = 0, found_bits = 0;
    /* the head: a first slice, larger while it runs past it */
    size_t hl = src->len < 4096 ? src->len : 4096;
    for (;;) {
        unsigned char *head = malloc(hl ? hl : 1);
        if (!head) return tg_errf(e, "out of memory");
        int rc = src_read(src, 0, hl, head) < 0 ? tg_errf(e, "leg_top chunk: reading %zu bytes failed", hl)
                 : chunk_head(head, hl, prompt_name, &hid, &hlg, &found, &n_steps, &start, &found_bits, e);
        free(head);
        if (rc == 0) break;
        if (hl == src->len) return -1;
        hl = src->len / 4 > hl ? hl * 4 : src->len;
    }
    if (!found) {
        if (n_rows == 0) return 0;
        return tg_errf(e, "leg_top chunk: no section for prompt %s (%d step rows)", prompt_name, n_rows);
    }
    if (n_steps != n_rows)
        return tg_errf(e, "leg_top chunk: prompt %s holds %d steps, the step table %d", prompt_name,
                       n_steps, n_rows);
    if (start + found_bits > (uint64_t)src->len * 8) return tg_errf(e, "leg_top chunk: section past the end");
    size_t b0 = (size_t)(start >> 3), nbytes = (size_t)((start + found_bits + 7) >> 3) - b0;
    unsigned char *sec = malloc(nbytes ? nbytes : 1);
    if (!sec) return tg_errf(e, "out of memory");
    if (src_read(src, b0, nbytes, sec) < 0) {
        free(sec);
        return tg_errf(e, "leg_top chunk: reading the section of prompt %s failed", prompt_name);
    }
    cbits r = {sec, nbytes * 8, (size_t)(start & 7), (size_t)(start & 7) + (size_t)found_bits};
    uint32_t umin, wbits, ncommon;
    store_tops base = {0};
    recent R = {0};
    int have_base = 0, bi = 0, rc = -1;
    size_t used = 0, cap_top = 0;
    if (cb_get(&r, 32, &umin) < 0 || cb_get(&r, 6, &wbits) < 0 || wbits > 32 || cb_get(&r, NBITS_N, &ncommon) < 0) {
        tg_errf(e, "leg_top chunk: truncated section header");
        goto done;
    }
    /* an upper bound of the entries: the bits left (an entry takes at least one) */
    cap_top = (size_t)(r.end - r.pos) + 1;
    if (cap_top > (size_t)n_steps * 4096) cap_top = (size_t)n_steps * 4096;
    if (tops_reserve(out, n_steps, cap_top) < 0 || rec_init(&R, cap_top < 1024 ? (int)cap_top : 1024, (int)cap_top) < 0) {
        tg_errf(e, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_steps; i++) {
        const ck_step *row = &rows[i];
        uint32_t m, n = 0, bit;
        out->step[i] = row->step;
        out->off[i] = used;
        if (cb_get(&r, 2, &m) < 0) {
            tg_errf(e, "leg_top chunk: truncated at step %d", row->step);
            goto done;
        }
        if (m == MODE_SAME) {
            if (!have_base) {
                if (depth > 0 || base_leg <= 0) {
                    tg_errf(e, "leg_top chunk: step %d repeats a base leg, and there is none", row->step);
                    goto done;
                }
                if (tops_read(db, base_leg, prompt_id, &base, depth + 1, e) < 0) {
                    tg_err_prefix(e, "base leg %lld", (long long)base_leg);
                    goto done;
                }
                have_base = 1;
            }
            while (bi < base.n && base.step[bi] < row->step) bi++;
            if (base.n == 0) {
                /* the base leg's rows were deleted (rows are never deleted
                 * by tokgate): the step's top-k is gone, as a v3 same_as
                 * reference to a deleted leg resolved to NULL */
                n = 0;
            } else if (bi >= base.n || base.step[bi] != row->step) {
                tg_errf(e, "leg_top chunk: step %d repeats base leg %lld, which lacks it", row->step,
                        (long long)base_leg);
                goto done;
            } else
                n = (uint32_t)base.n_top[bi];
            if (used + n > cap_top) {
                size_t cap = used + n + cap_top;
                tg_top *q = realloc(out->top, sizeof *q * cap);
                if (!q) {
                    tg_errf(e, "out of memory");
                    goto done;
                }
                out->top = q, cap_top = cap;
            }
            if (n) memcpy(out->top + used, base.top + base.off[bi], sizeof(tg_top) * n);
        } else if (m == MODE_RAW) {
            if (cb_get(&r, NBITS_N, &n) < 0 || n > 4096 || used + n > cap_top) {
                tg_errf(e, "leg_top chunk: bad raw entry count at step %d", row->step);
                goto done;
            }
            for (uint32_t k = 0; k < n; k++) {
                uint32_t id, lu;
                if (cb_get(&r, 32, &id) < 0 || cb_get(&r, 32, &lu) < 0) {
                    tg_errf(e, "leg_top chunk: truncated raw step %d", row->step);
                    goto done;
                }
                out->top[used + k].id = (int32_t)id;
                memcpy(&out->top[used + k].logit, &lu, 4);
            }
        } else {
            if (cb_get(&r, 1, &bit) < 0 || (!bit && cb_get(&r, NBITS_N, &n) < 0)) {
                tg_errf(e, "leg_top chunk: truncated step %d", row->step);
                goto done;
            }
            if (bit) n = ncommon;
            int regular = m == MODE_REGULAR;
            if (n < 1 || n > 4096 || used + n > cap_top || (regular && (n < 2 || !row->has_gap))) {
                tg_errf(e, "leg_top chunk: step %d: %u entries%s", row->step, n,
                        regular && !row->has_gap ? " and no gap in the step row" : ", out of range");
                goto done;
            }
            tg_top *t = out->top + used;
            if (regular) {
                if (row->token < 0 || rec_push(&R, row->token) < 0) {
                    tg_errf(e, "leg_top chunk: step %d: token %d cannot be the first id", row->step, row->token);
                    goto done;
                }
                t[0].id = row->token;
            }
            for (uint32_t k = (uint32_t)regular; k < n; k++) {
                uint64_t v;
                int sym;
                int64_t id = -1;
                if (get_sym(&r, &hid, &sym, &v) == 0)
                    id = sym < NSYM ? (v - 1 <= INT32_MAX ? (int64_t)(v - 1) : -1)
                                    : (v - 1 <= UINT32_MAX ? rec_find(&R, (uint32_t)(v - 1)) : -1);
                if (id < 0 || rec_push(&R, (int32_t)id) < 0) {
                    tg_errf(e, "leg_top chunk: bad id %u at step %d", k, row->step);
                    goto done;
                }
                t[k].id = (int32_t)id;
            }
            uint32_t d0;
            if (cb_get(&r, (int)wbits, &d0) < 0 || (uint64_t)umin + d0 > UINT32_MAX) {
                tg_errf(e, "leg_top chunk: bad first logit at step %d", row->step);
                goto done;
            }
            uint32_t u = umin + d0;
            t[0].logit = u2f(u);
            uint32_t k = 1;
            if (regular) {
                t[1].logit = gap_logit1(t[0].logit, row->gap);
                u = f2u(t[1].logit);
                k = 2;
            }
            for (; k < n; k++) {
                uint64_t v;
                int sym;
                if (get_sym(&r, &hlg, &sym, &v) < 0 || sym >= NSYM || v - 1 > u) {
                    tg_errf(e, "leg_top chunk: bad logit delta %u at step %d", k, row->step);
                    goto done;
                }
                u -= (uint32_t)(v - 1);
                t[k].logit = u2f(u);
            }
        }
        out->n_top[i] = (int)n;
        used += n;
        out->n = i + 1;
    }
    rc = 0;
done:
    free(sec);
    rec_free(&R);
    store_tops_free(&base);
    if (rc < 0) store_tops_free(out);
    return rc;
}

static int tops_read(sqlite3 *db, int64_t leg_id, int64_t prompt_id, store_tops *out, int depth, tg_err *e)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *s = NULL;
    ck_step *rows = NULL;
    char *name = NULL;
    int n = 0, cap = 0, rc = -1;
    if (sqlite3_prepare_v2(db, "SELECT step, token, gap FROM step WHERE leg_id=?1 AND prompt_id=?2 ORDER BY step",
                           -1, &s, NULL) != SQLITE_OK)
        return tg_errf(e, "store: reading steps: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(s, 1, leg_id);
    sqlite3_bind_int64(s, 2, prompt_id);
    int st;
    while ((st = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            ck_step *q = realloc(rows, sizeof *q * (size_t)cap);
            if (!q) {
                tg_errf(e, "out of memory");
                goto out;
            }
            rows = q;
        }
        ck_step *c = &rows[n++];
        memset(c, 0, sizeof *c);
        c->step = sqlite3_column_int(s, 0);
        c->token = sqlite3_column_int(s, 1);
        c->has_gap = gap_value(s, 2, &c->gap);
    }
    if (st != SQLITE_DONE) {
        tg_errf(e, "store: reading steps: %s", sqlite3_errmsg(db));
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (n == 0) {
        rc = 0;
        goto out;
    }
    if (sqlite3_prepare_v2(db, "SELECT name FROM prompt WHERE id=?1", -1, &s, NULL) != SQLITE_OK) {
        tg_errf(e, "store: reading prompts: %s", sqlite3_errmsg(db));
        goto out;
    }
    sqlite3_bind_int64(s, 1, prompt_id);
    if (sqlite3_step(s) != SQLITE_ROW) {
        tg_errf(e, "store: no prompt %lld", (long long)prompt_id);
        goto out;
    }
    name = strdup((const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    s = NULL;
    if (!name) {
        tg_errf(e, "out of memory");
        goto out;
    }
    if (sqlite3_prepare_v2(db, "SELECT base_leg, length(data) FROM leg_top WHERE leg_id=?1", -1, &s, NULL) != SQLITE_OK) {
        tg_errf(e, "store: reading leg_top: %s", sqlite3_errmsg(db));
        goto out;
    }
    sqlite3_bind_int64(s, 1, leg_id);
    if (sqlite3_step(s) != SQLITE_ROW) {
        tg_errf(e, "leg %lld: %d steps of prompt %lld but no leg_top row", (long long)leg_id, n,
                (long long)prompt_id);
        goto out;
    }
    int64_t base_leg = sqlite3_column_int64(s, 0);
    chunk_src src = {NULL, (size_t)sqlite3_column_int64(s, 1)};
    sqlite3_finalize(s);
    s = NULL;
    if (sqlite3_blob_open(db, "main", "leg_top", "data", leg_id, 0, &src.blob) != SQLITE_OK) {
        tg_errf(e, "leg %lld: opening its top-k chunk: %s", (long long)leg_id, sqlite3_errmsg(db));
        sqlite3_blob_close(src.blob);
        goto out;
    }
    rc = chunk_decode(db, base_leg, &src, prompt_id, name, rows, n, out, depth, e);
    sqlite3_blob_close(src.blob);
    if (rc < 0) tg_err_prefix(e, "leg %lld prompt %s", (long long)leg_id, name);
out:
    sqlite3_finalize(s);
    free(rows);
    free(name);
    return rc;
}

int store_tops_read(struct sqlite3 *db, int64_t leg_id, int64_t prompt_id, store_tops *out, tg_err *e)
{
    return tops_read(db, leg_id, prompt_id, out, 0, e);
}

int store_tops_find(const store_tops *t, int step)
{
    int lo = 0, hi = t->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (t->step[mid] == step) return mid;
        if (t->step[mid] < step) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}


/* Migration 3 -> 4: writes a leg_top chunk for every leg from its v3 step
 * blobs (repeated blobs resolved; the chunks do not point at a base leg).
 * Returns 0, or -1 with *msg (sqlite3_malloc'ed). */
static int migrate_v4(sqlite3 *db, char **msg)
{
    sqlite3_stmt *ql = NULL, *qs = NULL, *qi = NULL;
    int rc = -1;
    ck_sec *sec = NULL;
    ck_step *steps = NULL;
    tg_top *tops = NULL;
    size_t *offs = NULL;     /* each step's first entry in tops */
    int *first = NULL;       /* each section's first step */
    int cap_steps = 0, n_names = 0;
    size_t cap_tops = 0;
    if (sqlite3_prepare_v2(db, "SELECT id FROM leg ORDER BY id", -1, &ql, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT s.prompt_id, s.step, s.token, s.gap,"
                               " coalesce(s.top, (SELECT b.top FROM step b WHERE b.leg_id = s.same_as"
                               " AND b.prompt_id = s.prompt_id AND b.step = s.step)),"
                               " (SELECT name FROM prompt WHERE prompt.id = s.prompt_id)"
                               " FROM step s WHERE s.leg_id = ?1 ORDER BY s.prompt_id, s.step",
                           -1, &qs, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO leg_top(leg_id, base_leg, data) VALUES(?1, NULL, ?2)", -1, &qi,
                           NULL) != SQLITE_OK) {
        *msg = sqlite3_mprintf("%s", sqlite3_errmsg(db));
        goto out;
    }
    while (sqlite3_step(ql) == SQLITE_ROW) {
        int64_t leg = sqlite3_column_int64(ql, 0);
        int n = 0, n_sec = 0;
        size_t used = 0;
        sqlite3_reset(qs);
        sqlite3_bind_int64(qs, 1, leg);
        while (sqlite3_step(qs) == SQLITE_ROW) {
            if (n == cap_steps) {
                cap_steps = cap_steps ? 2 * cap_steps : 256;
                ck_step *q = realloc(steps, sizeof *q * (size_t)cap_steps);
                ck_sec *q2 = realloc(sec, sizeof *q2 * (size_t)cap_steps);
                size_t *q3 = realloc(offs, sizeof *q3 * (size_t)cap_steps);
                int *q4 = realloc(first, sizeof *q4 * (size_t)cap_steps);
                if (q) steps = q;
                if (q2) sec = q2;
                if (q3) offs = q3;
                if (q4) first = q4;
                if (!q || !q2 || !q3 || !q4) {
                    *msg = sqlite3_mprintf("out of memory");
                    goto out;
                }
            }
            if (used + 4096 > cap_tops) {
                cap_tops = cap_tops ? 2 * cap_tops : 65536;
                tg_top *q = realloc(tops, sizeof *q * cap_tops);
                if (!q) {
                    *msg = sqlite3_mprintf("out of memory");
                    goto out;
                }
                tops = q;
            }
            int64_t pid = sqlite3_column_int64(qs, 0);
            ck_step *c = &steps[n];
            memset(c, 0, sizeof *c);
            c->step = sqlite3_column_int(qs, 1);
            c->token = sqlite3_column_int(qs, 2);
            c->has_gap = gap_value(qs, 3, &c->gap);
            const void *b = sqlite3_column_blob(qs, 4);
            if (b) {
                tg_err e;
                int k = store_decode_top(b, (size_t)sqlite3_column_bytes(qs, 4), tops + used, 4096, &e);
                if (k < 0) {
                    *msg = sqlite3_mprintf("leg %lld prompt %lld step %d: %s", (long long)leg, (long long)pid,
                                           c->step, e.msg);
                    goto out;
                }
                c->n = k;
            }
            /* c->top and sec[].steps are set below, once the arrays stop moving */
            offs[n] = used;
            used += (size_t)c->n;
            if (n_sec == 0 || sec[n_sec - 1].prompt_id != pid) {
                const char *nm = (const char *)sqlite3_column_text(qs, 5);
                char *dup = strdup(nm ? nm : "");
                if (!dup) {
                    *msg = sqlite3_mprintf("out of memory");
                    goto out;
                }
                sec[n_sec] = (ck_sec){.prompt_id = pid, .name = dup, .n_steps = 0};
                first[n_sec] = n;
                n_sec++;
                n_names = n_sec;
            }
            sec[n_sec - 1].n_steps++;
            n++;
        }
        for (int i = 0; i < n; i++) steps[i].top = tops + offs[i];
        for (int i = 0; i < n_sec; i++) sec[i].steps = steps + first[i];
        unsigned char *data = NULL;
        size_t len = 0;
        tg_err e;
        if (chunk_encode(sec, n_sec, &data, &len, &e) < 0) {
            *msg = sqlite3_mprintf("leg %lld: %s", (long long)leg, e.msg);
            goto out;
        }
        for (int i = 0; i < n_sec; i++) free((char *)sec[i].name);
        n_names = 0;
        sqlite3_reset(qi);
        sqlite3_bind_int64(qi, 1, leg);
        sqlite3_bind_blob(qi, 2, data, (int)len, free);
        if (sqlite3_step(qi) != SQLITE_DONE) {
            *msg = sqlite3_mprintf("leg %lld: %s", (long long)leg, sqlite3_errmsg(db));
            goto out;
        }
    }
    rc = 0;
out:
    sqlite3_finalize(ql);
    sqlite3_finalize(qs);
    sqlite3_finalize(qi);
    for (int i = 0; i < n_names; i++) free((char *)sec[i].name);
    free(sec);
    free(steps);
    free(tops);
    free(offs);
    free(first);
    return rc;
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

enum { BASE_CACHE_MAX = 1 << 23 };   /* entries (8 bytes each) */

static void cache_clear(tg_store *st)
{
    for (int i = 0; i < st->n_cache; i++) store_tops_free(&st->cache[i]);
    free(st->cache), free(st->cache_pid);
    st->cache = NULL, st->cache_pid = NULL;
    st->n_cache = 0, st->cache_entries = 0, st->cache_leg = 0;
}

/* The decoded top-k of prompt pid of st->base_leg into *out (owned by the
 * cache, valid until the next call). Returns 0 or -1 with e. */
static int base_tops(tg_store *st, int64_t pid, const store_tops **out, tg_err *e)
{
    if (st->cache_leg != st->base_leg) cache_clear(st);
    for (int i = 0; i < st->n_cache; i++)
        if (st->cache_pid[i] == pid) {
            *out = &st->cache[i];
            return 0;
        }
    store_tops t;
    if (store_tops_read(st->db, st->base_leg, pid, &t, e) < 0) return -1;
    size_t n = t.n ? t.off[t.n - 1] + (size_t)t.n_top[t.n - 1] : 0;
    if (st->cache_entries + n > BASE_CACHE_MAX) cache_clear(st);
    store_tops *c = realloc(st->cache, sizeof *c * (size_t)(st->n_cache + 1));
    if (c) st->cache = c;
    int64_t *p = realloc(st->cache_pid, sizeof *p * (size_t)(st->n_cache + 1));
    if (p) st->cache_pid = p;
    if (!c || !p) {
        store_tops_free(&t);
        return tg_errf(e, "%s: out of memory", st->path);
    }
    st->cache_leg = st->base_leg;
    st->cache[st->n_cache] = t;
    st->cache_pid[st->n_cache] = pid;
    st->cache_entries += n;
    *out = &st->cache[st->n_cache++];
    return 0;
}

/* Writes the rows of one prompt of a leg. Returns 0 or -1 with e. */
static int put_leg_prompt(tg_store *st, const store_leg *leg, int64_t leg_id,
                          const store_leg_prompt *lp, ck_sec *sec, tg_err *e)
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

    /* the steps in ascending step order (the chunk's order) */
    int *order = malloc(sizeof *order * (size_t)(lp->n_steps ? lp->n_steps : 1));
    ck_step *cs = calloc((size_t)(lp->n_steps ? lp->n_steps : 1), sizeof *cs);
    if (!order || !cs) {
        free(order), free(cs);
        return tg_errf(e, "%s: out of memory", st->path);
    }
    sec->prompt_id = pid;
    sec->name = lp->prompt_id;
    sec->n_steps = lp->n_steps;
    sec->steps = cs;
    for (int i = 0; i < lp->n_steps; i++) order[i] = i;
    for (int i = 1; i < lp->n_steps; i++) {
        int k = order[i], j = i;
        while (j > 0 && lp->steps[order[j - 1]].step > lp->steps[k].step) order[j] = order[j - 1], j--;
        order[j] = k;
    }
    store_tops none = {0};
    const store_tops *basep = &none;
    if (st->base_leg && lp->n_steps > 0 && base_tops(st, pid, &basep, e) < 0) {
        free(order);
        return tg_err_prefix(e, "reading the arm's first leg");
    }
    const store_tops base = *basep;
    int bi = 0, rc = -1;
    for (int i = 0; i < lp->n_steps; i++) {
        const store_step *sp = &lp->steps[order[i]];
        ck_step *c = &cs[i];
        if (sp->n_top < 0 || sp->n_top > 4096 || (sp->n_top > 0 && !sp->top)) {
            tg_errf(e, "prompt %s step %d: n_top %d, expected 0..4096 entries", lp->prompt_id, sp->step,
                    sp->n_top);
            goto done;
        }
        int64_t dg = 0;
        int hasd = digest_parse(sp->digest, &dg);
        if (hasd < 0) {
            tg_errf(e, "prompt %s step %d: digest \"%.20s\", expected 16 hex digits", lp->prompt_id, sp->step,
                    sp->digest);
            goto done;
        }
        *c = (ck_step){.step = sp->step, .token = sp->token, .n = sp->n_top, .top = sp->top};
        if (sp->n_top >= 2 && isfinite(sp->top[0].logit) && isfinite(sp->top[1].logit))
            c->has_gap = 1, c->gap = (double)sp->top[0].logit - (double)sp->top[1].logit;
        /* the same top-k, token and gap as the arm's first leg: stored once */
        while (bi < base.n && base.step[bi] < sp->step) bi++;
        if (bi < base.n && base.step[bi] == sp->step && base.n_top[bi] == sp->n_top &&
            (sp->n_top == 0 || !memcmp(base.top + base.off[bi], sp->top, sizeof(tg_top) * (size_t)sp->n_top)))
            c->same = 1;
        s = stmt(st, Q_STEP_INS, e);
        if (!s) goto done;
        sqlite3_bind_int64(s, 1, leg_id);
        sqlite3_bind_int64(s, 2, pid);
        sqlite3_bind_int(s, 3, sp->step);
        sqlite3_bind_int(s, 4, sp->token);
        if (sp->forced >= 0)
            sqlite3_bind_int(s, 5, sp->forced);
        else
            sqlite3_bind_null(s, 5);
        /* gap: an INTEGER of 2^-24 logits when exact (3 or 4 bytes), else REAL */
        double g = c->gap * 16777216.0;
        if (!c->has_gap)
            sqlite3_bind_null(s, 6);
        else if (fabs(c->gap) < 268435456.0 && g == trunc(g))
            sqlite3_bind_int64(s, 6, (int64_t)g);
        else
            sqlite3_bind_double(s, 6, c->gap);
        if (hasd)
            sqlite3_bind_int64(s, 7, dg);
        else
            sqlite3_bind_null(s, 7);
        if (step_done(st, s, e, "inserting a step") < 0) {
            tg_err_prefix(e, "prompt %s step %d", lp->prompt_id, sp->step);
            goto done;
        }
    }
    rc = 0;
done:
    free(order);
    if (rc < 0) return -1;

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

static void secs_free(ck_sec *secs, int n)
{
    for (int i = 0; secs && i < n; i++) free((void *)secs[i].steps);
    free(secs);
}

int store_put_leg(tg_store *st, const store_leg *leg, tg_err *e)
{
    ck_sec *secs = NULL;
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
    secs = calloc((size_t)(leg->n_prompts ? leg->n_prompts : 1), sizeof *secs);
    if (!secs) {
        tg_errf(e, "%s: out of memory", st->path);
        goto fail;
    }
    for (int i = 0; i < leg->n_prompts; i++) {
        if (put_leg_prompt(st, leg, leg_id, &leg->prompts[i], &secs[i], e) < 0) {
            tg_err_prefix(e, "%s: leg %s/%d", st->path, leg->arm, leg->leg);
            goto fail;
        }
    }
    /* the leg's top-k chunk, sections in prompt id order */
    for (int i = 1; i < leg->n_prompts; i++) {
        ck_sec k = secs[i];
        int j = i;
        while (j > 0 && secs[j - 1].prompt_id > k.prompt_id) secs[j] = secs[j - 1], j--;
        secs[j] = k;
    }
    unsigned char *chunk = NULL;
    size_t clen = 0;
    if (chunk_encode(secs, leg->n_prompts, &chunk, &clen, e) < 0) {
        tg_err_prefix(e, "%s: leg %s/%d", st->path, leg->arm, leg->leg);
        goto fail;
    }
    s = stmt(st, Q_TOP_INS, e);
    if (!s) {
        free(chunk);
        goto fail;
    }
    sqlite3_bind_int64(s, 1, leg_id);
    if (st->base_leg)
        sqlite3_bind_int64(s, 2, st->base_leg);
    else
        sqlite3_bind_null(s, 2);
    sqlite3_bind_blob(s, 3, chunk, (int)clen, free);
    if (step_done(st, s, e, "inserting the leg's top-k chunk") < 0) goto fail;
    if (exec_q(st, Q_COMMIT, e) < 0) goto fail;
    secs_free(secs, leg->n_prompts);
    return 0;
fail:
    exec_q(st, Q_ROLLBACK, NULL);
    secs_free(secs, leg->n_prompts);
    return -1;
}
