/*
 * store.c: the SQLite evidence store. One file, WAL journal, foreign keys
 * on, the schema version in PRAGMA user_version (older stores are migrated
 * step by step, newer ones refused). Every arm leg is written in one
 * transaction by store_put_leg, so an interrupted run keeps complete legs
 * and no half ones.
 *
 * Everything is a plain SQL value that the stock sqlite3 shell reads: a step
 * row holds token, forced token, top1-top2 gap (REAL) and digest, and the
 * top-k of a step is one step_top row per rank (id INTEGER, logit REAL, an
 * f32 held exactly as a double; NaN and -0.0, which a REAL column cannot
 * hold, keep their f32 bits in the bits column). A leg whose top-k equals
 * the arm's first leg's in every step has no step_top rows of its own: its
 * leg row names that leg in same_as. store_tops_read reads one prompt's
 * top-k back, bit-exact.
 *
 * Schema versions 1 to 4 kept the top-k in binary blobs that this code no
 * longer decodes: such a store is migrated when it holds no step rows, and
 * refused with a message saying what to do when it does.
 *
 * The schema text, the views and example queries are in docs/store.md.
 */
#include "store.h"

#include "common.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

/* ------------------------------------------------------------------ */
/* Schema                                                              */

/* Version 1 of the schema: specs, artifacts, binaries, runs, arms, prompts,
 * legs, steps and dumps, plus the compare table and verdict sets that the
 * scoring pass (verdict.c) writes. */
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

/* Version 4 kept the top-k of all steps of a leg in one binary chunk
 * (leg_top) and the step gap as an INTEGER of 2^-24 logits where exact.
 * Only stores without step rows are migrated through it (store_open), so
 * this takes the schema there and no chunk is ever written. */
static const char SCHEMA_V4[] =
    "CREATE TABLE leg_top(\n"
    "  leg_id INTEGER PRIMARY KEY REFERENCES leg(id) ON DELETE CASCADE,\n"
    "  base_leg INTEGER, data BLOB NOT NULL);\n"
    "DROP VIEW v_step_top;\n"
    "CREATE TABLE step_v4(\n"
    "  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,\n"
    "  token INTEGER NOT NULL, forced INTEGER, gap, digest INTEGER,\n"
    "  PRIMARY KEY(leg_id, prompt_id, step),\n"
    "  FOREIGN KEY(leg_id, prompt_id) REFERENCES leg_prompt(leg_id, prompt_id) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "INSERT INTO step_v4 SELECT leg_id, prompt_id, step, token, forced, gap, digest FROM step;\n"
    "DROP TABLE step;\n"
    "ALTER TABLE step_v4 RENAME TO step;\n"
    "CREATE VIEW v_step AS SELECT leg_id, prompt_id, step, token, forced, gap, digest FROM step;\n";

/* Version 5: the top-k in plain rows. step_top has one row per rank of a
 * step (rank 1 = the highest logit); logit is the f32 as a REAL, except that
 * a NaN is stored as logit NULL and -0.0 as logit 0.0, both with the f32's
 * bit pattern in bits (NULL for every other value). leg.same_as names the
 * leg whose step_top rows this leg shares (the arm's first leg, when every
 * step's top-k is the same); v_top resolves it. gap is REAL in every row. */
static const char SCHEMA_V5[] =
    "DROP VIEW v_step;\n"
    "DROP TABLE leg_top;\n"
    "CREATE TABLE step_v5(\n"
    "  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,\n"
    "  token INTEGER NOT NULL, forced INTEGER, gap REAL, digest INTEGER,\n"
    "  PRIMARY KEY(leg_id, prompt_id, step),\n"
    "  FOREIGN KEY(leg_id, prompt_id) REFERENCES leg_prompt(leg_id, prompt_id) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "INSERT INTO step_v5 SELECT leg_id, prompt_id, step, token, forced,\n"
    "  CASE typeof(gap) WHEN 'integer' THEN gap / 16777216.0 ELSE gap END, digest FROM step;\n"
    "DROP TABLE step;\n"
    "ALTER TABLE step_v5 RENAME TO step;\n"
    "ALTER TABLE leg ADD COLUMN same_as INTEGER REFERENCES leg(id);\n"
    "CREATE TABLE step_top(\n"
    "  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,\n"
    "  rank INTEGER NOT NULL, id INTEGER NOT NULL, logit REAL, bits INTEGER,\n"
    "  PRIMARY KEY(leg_id, prompt_id, step, rank),\n"
    "  FOREIGN KEY(leg_id, prompt_id, step) REFERENCES step(leg_id, prompt_id, step) ON DELETE CASCADE\n"
    ") WITHOUT ROWID;\n"
    "CREATE VIEW v_step AS SELECT leg_id, prompt_id, step, token, forced, gap, digest FROM step;\n"
    "CREATE VIEW v_top AS\n"
    "  SELECT s.leg_id, s.prompt_id, s.step, t.rank, t.id, t.logit, t.bits\n"
    "  FROM step s JOIN leg l ON l.id = s.leg_id\n"
    "  JOIN step_top t ON t.leg_id = coalesce(l.same_as, l.id) AND t.prompt_id = s.prompt_id\n"
    "                  AND t.step = s.step;\n";

/* Version 6: calibration (harness/calibrate.c, docs/verdicts.md): the
 * parameters a run was started with, and per verdict set the panel, the
 * band of every step, every arm's control limits and its band and distance
 * from exact arithmetic at every step. Plain columns, for sqlite3. (IF NOT
 * EXISTS: a store rebuilt from an older fixture may carry them already.) */
static const char SCHEMA_V6[] =
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

/* Migrations: MIGRATIONS[v] takes a store at version v to v + 1. */
static const char *const MIGRATIONS[STORE_SCHEMA_VERSION] = {SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4,
                                                             SCHEMA_V5, SCHEMA_V6};

/* The first version whose top-k this code reads; older stores with step
 * rows are refused (store_open). */
enum { FIRST_PLAIN_VERSION = 5 };

/* The most entries a step's top-k may have (written and read). */
enum { MAX_TOP = 4096 };

/* ------------------------------------------------------------------ */
/* Statements                                                          */

enum {
    Q_SPEC_FIND, Q_SPEC_INS, Q_ART_FIND, Q_ART_INS, Q_BIN_FIND, Q_BIN_INS,
    Q_RUN_INS, Q_ARM_INS, Q_PROMPT_INS, Q_RUN_FINISH,
    Q_ARM_FIND, Q_PROMPT_FIND, Q_LEG_INS, Q_LP_INS, Q_STEP_INS, Q_TOP_INS, Q_DUMP_INS,
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
                  " stderr_zstd, stderr_len, ms_load, ms_prefill, ms_decode, wall_s, stored, same_as)"
                  " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22)",
    [Q_LP_INS] = "INSERT INTO leg_prompt(leg_id, prompt_id, ids, decoded_from, n_steps, text, error)"
                 " VALUES(?1,?2,?3,?4,?5,?6,?7)",
    [Q_STEP_INS] = "INSERT INTO step(leg_id, prompt_id, step, token, forced, gap, digest)"
                   " VALUES(?1,?2,?3,?4,?5,?6,?7)",
    [Q_TOP_INS] = "INSERT INTO step_top(leg_id, prompt_id, step, rank, id, logit, bits)"
                  " VALUES(?1,?2,?3,?4,?5,?6,?7)",
    [Q_BASE_LEG] = "SELECT id FROM leg WHERE run_id=?1 AND arm_id=?2 AND leg=1 AND same_as IS NULL"
                   " ORDER BY id LIMIT 1",
    [Q_BASE_TOPS] = "SELECT prompt_id, step, rank, id, logit, bits FROM step_top WHERE leg_id=?1"
                    " ORDER BY prompt_id, step, rank",
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
    int lock_fd;                /* PATH-runlock, open while a run lock is held, else -1 */
    int64_t locked_run;         /* the run whose lock lock_fd holds, 0 none */
    double wait_limit_s;        /* how long the busy handler waits for the write lock */
    double wait_t0;             /* when the current wait began */
    double wait_said;           /* seconds waited when progress was last printed */
    double waited_s;            /* how long the last wait lasted (for the give-up message) */
    sqlite3_stmt *q[Q_COUNT];   /* prepared on first use, kept until close */
    unsigned char *buf;         /* scratch for blobs */
    size_t buf_cap;
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

/* Runs sql, a query of one integer (a PRAGMA, a count), into *v. Returns
 * 0, or -1 (sqlite3_errmsg(db) says why). */
static int query_int(sqlite3 *db, const char *sql, int64_t *v)
{
    sqlite3_stmt *s = NULL;
    int ok = sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW;
    if (ok) *v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return ok ? 0 : -1;
}

/* A store at version 1..4 (before the plain top-k rows) can be migrated
 * only when it holds no step rows: their top-k is in a binary format this
 * code does not read. Returns 0 (nothing to convert) or -1 with e saying
 * what to do. */
static int old_store_check(tg_store *st, int64_t version, tg_err *e)
{
    int64_t n = 0;
    if (query_int(st->db, "SELECT count(*) FROM step", &n) < 0)
        return tg_errf(e, "%s: schema version %lld: reading its step table: %s", st->path, (long long)version,
                       sqlite3_errmsg(st->db));
    if (n == 0) return 0;
    return tg_errf(e,
                   "%s: schema version %lld (tokgate before schema version %d) keeps the top-k of its %lld "
                   "steps in a binary format that this tokgate no longer reads, so it cannot be migrated; "
                   "run the gate again into a new store (--db NEW.db, or move %s away), or keep reading "
                   "this one with the older tokgate that wrote it",
                   st->path, (long long)version, FIRST_PLAIN_VERSION, (long long)n, st->path);
}

/* The busy handler: called by SQLite while another connection holds the
 * write lock (count 0 on the first call of a wait). Sleeps 50 ms per call,
 * prints "tokgate: waiting for the store's write lock (N s): ..." on stderr
 * every 10 s, and gives up (returns 0, SQLITE_BUSY) after wait_limit_s. A
 * long merge or a database browser holding a write transaction is waited
 * out instead of aborting a gate. Returns 1 to retry, 0 to give up. */
static int store_busy(void *ud, int count)
{
    tg_store *st = ud;
    double now = tg_now();
    if (count == 0) {
        st->wait_t0 = now;
        st->wait_said = 0;
    }
    double waited = now - st->wait_t0;
    st->waited_s = waited;
    if (waited >= st->wait_limit_s) return 0;
    if (waited - st->wait_said >= 10.0) {
        st->wait_said = waited;
        fprintf(stderr, "tokgate: waiting for the store's write lock (%.0f s): another process holds it "
                        "(%s; giving up after %.0f s)\n", waited, st->path, st->wait_limit_s);
        fflush(stderr);
    }
    usleep(50000);
    return 1;
}

/* The write-lock wait limit: $TOKGATE_STORE_WAIT seconds (a number > 0),
 * else STORE_WAIT_DEFAULT_S. */
static double store_wait_limit(void)
{
    const char *v = getenv("TOKGATE_STORE_WAIT");
    if (v && *v) {
        char *end;
        double x = strtod(v, &end);
        if (*end == 0 && x > 0 && x < 1e9) return x;
    }
    return STORE_WAIT_DEFAULT_S;
}

int store_open(tg_store **out, const char *path, tg_err *e)
{
    *out = NULL;
    tg_store *st = xcalloc(1, sizeof *st);
    st->path = xstrdup(path);
    st->lock_fd = -1;
    st->wait_limit_s = store_wait_limit();
    if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        tg_errf(e, "%s: cannot open the store: %s", path,
                st->db ? sqlite3_errmsg(st->db) : "out of memory");
        goto fail;
    }
    sqlite3_busy_handler(st->db, store_busy, st);
    char *msg = NULL;
    if (sqlite3_exec(st->db,
                     "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                     " PRAGMA foreign_keys=ON;",
                     NULL, NULL, &msg) != SQLITE_OK) {
        tg_errf(e, "%s: not a usable SQLite store: %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        goto fail;
    }
    int64_t version = 0;
    if (query_int(st->db, "PRAGMA user_version", &version) < 0) {
        tg_errf(e, "%s: reading PRAGMA user_version: %s", path, sqlite3_errmsg(st->db));
        goto fail;
    }
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
        int64_t n = 0;
        if (query_int(st->db, "SELECT count(*) FROM sqlite_master", &n) < 0) {
            tg_errf(e, "%s: reading the schema: %s", path, sqlite3_errmsg(st->db));
            goto fail;
        }
        if (n != 0) {
            tg_errf(e, "%s: has tables but no tokgate schema version (user_version 0): "
                       "not a tokgate store", path);
            goto fail;
        }
    }
    if (version > 0 && version < FIRST_PLAIN_VERSION && old_store_check(st, version, e) < 0) goto fail;
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

int store_open_cmd(tg_store **st, const char *db, int mode)
{
    tg_err e;
    struct stat sb;
    *st = NULL;
    if (mode && stat(db, &sb) != 0) {
        fprintf(stderr, "tokgate: no such store: %s (%s; give --db FILE of an existing store)\n", db,
                strerror(errno));
        return 2;
    }
    if (mode && !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "tokgate: --db %s: expected a store file, got something else\n", db);
        return 2;
    }
    if ((mode == 2 ? store_open_ro(st, db, &e) : store_open(st, db, &e)) < 0) {
        fprintf(stderr, "tokgate: %s\n", e.msg);
        return 2;
    }
    return 0;
}

int store_open_ro(tg_store **out, const char *path, tg_err *e)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return tg_errf(e, "no such store: %s (%s; give --db FILE of an existing store)", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return tg_errf(e, "%s: expected a store file, got something else", path);
    tg_store *st = xcalloc(1, sizeof *st);
    st->path = xstrdup(path);
    st->lock_fd = -1;
    st->wait_limit_s = store_wait_limit();
    for (int pass = 0; pass < 2; pass++) {
        if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
            tg_errf(e, "%s: cannot open the store: %s", path, st->db ? sqlite3_errmsg(st->db) : "out of memory");
            goto fail;
        }
        sqlite3_busy_handler(st->db, store_busy, st);
        int64_t version = 0;
        if (query_int(st->db, "PRAGMA user_version", &version) < 0) {
            tg_errf(e, "%s: not a usable SQLite store: %s", path, sqlite3_errmsg(st->db));
            goto fail;
        }
        if (version == STORE_SCHEMA_VERSION) {
            *out = st;
            return 0;
        }
        if (pass > 0 || version > STORE_SCHEMA_VERSION) break;
        /* an older schema (0: an empty file): migrated once through a writing open, then read */
        sqlite3_close(st->db);
        st->db = NULL;
        tg_store *rw;
        if (store_open(&rw, path, e) < 0) goto fail;
        store_close(rw);
    }
    /* a newer version (or one that changed under us): store_open's message */
    sqlite3_close(st->db);
    st->db = NULL;
    tg_store *rw;
    if (store_open(&rw, path, e) == 0) {
        store_close(rw);
        tg_errf(e, "%s: the store changed while it was opened; try again", path);
    }
fail:
    store_close(st);
    return -1;
}

void store_remove_files(const char *path)
{
    static const char *const suffix[] = {"", "-wal", "-shm", "-journal", "-runlock"};
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        char *p = xasprintf("%s%s", path, suffix[i]);
        unlink(p);
        free(p);
    }
}

void store_close(tg_store *st)
{
    if (!st) return;
    if (st->lock_fd >= 0) close(st->lock_fd);   /* releases the run lock */
    for (int i = 0; i < Q_COUNT; i++) sqlite3_finalize(st->q[i]);
    sqlite3_close(st->db);
    free(st->path);
    free(st->buf);
    free(st);
}

struct sqlite3 *store_db(tg_store *st)
{
    return st->db;
}

/* ------------------------------------------------------------------ */
/* Run locks                                                           */

/* The run lock is a POSIX record lock (fcntl F_SETLK) on byte run_id of the
 * file PATH-runlock beside the store: the kernel drops it when the process
 * ends however it ends, so a crashed gate leaves no stale lock, and
 * F_GETLK names the process holding it. The file itself stays (empty). */
int store_run_lock(tg_store *st, int64_t run_id, long *holder, tg_err *e)
{
    if (holder) *holder = 0;
    if (run_id <= 0) return tg_errf(e, "%s: run lock: run id %lld, expected >= 1", st->path, (long long)run_id);
    if (!strcmp(st->path, ":memory:") || !st->path[0]) return 0;   /* a private store: no one else */
    if (st->locked_run == run_id) return 0;
    if (st->lock_fd < 0) {
        char *lp = xasprintf("%s-runlock", st->path);
        st->lock_fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (st->lock_fd < 0) {
            tg_errf(e, "%s: cannot open the run lock file: %s", lp, strerror(errno));
            free(lp);
            return -1;
        }
        free(lp);
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)run_id, .l_len = 1};
    if (fcntl(st->lock_fd, F_SETLK, &fl) == 0) {
        if (st->locked_run > 0) {
            struct flock un = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = (off_t)st->locked_run,
                               .l_len = 1};
            fcntl(st->lock_fd, F_SETLK, &un);
        }
        st->locked_run = run_id;
        return 0;
    }
    if (errno != EACCES && errno != EAGAIN)
        return tg_errf(e, "%s-runlock: locking run %lld: %s", st->path, (long long)run_id, strerror(errno));
    struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)run_id, .l_len = 1};
    long pid = 0;
    if (fcntl(st->lock_fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK) pid = (long)q.l_pid;
    if (holder) *holder = pid;
    return 1;
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
/* The top-k rows                                                      */

/* Binds an f32 logit to the logit and bits columns (parameters i and
 * i + 1): a value a REAL holds exactly as itself with bits NULL; a NaN as
 * NULL and a -0.0 as 0.0 (what SQLite would make of them), each with its
 * f32 bit pattern in bits. */
static void bind_logit(sqlite3_stmt *s, int i, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f))
        sqlite3_bind_null(s, i);
    else
        sqlite3_bind_double(s, i, (double)f);
    if (isnan(f) || (f == 0.0f && signbit(f)))
        sqlite3_bind_int64(s, i + 1, (int64_t)u);
    else
        sqlite3_bind_null(s, i + 1);
}

/* The entry of a step_top row from columns c (id), c + 1 (logit) and
 * c + 2 (bits) of s into *t. Returns 0, or -1 with *why naming the column
 * that holds no valid value (bits, when present, wins over logit). */
static int column_top(sqlite3_stmt *s, int c, tg_top *t, const char **why)
{
    int64_t id = sqlite3_column_int64(s, c);
    if (sqlite3_column_type(s, c) != SQLITE_INTEGER || id < INT32_MIN || id > INT32_MAX) {
        *why = "id is not a 32-bit integer";
        return -1;
    }
    t->id = (int32_t)id;
    int tl = sqlite3_column_type(s, c + 1), tb = sqlite3_column_type(s, c + 2);
    if (tb != SQLITE_NULL) {
        int64_t b = sqlite3_column_int64(s, c + 2);
        if (tb != SQLITE_INTEGER || b < 0 || b > (int64_t)UINT32_MAX) {
            *why = "bits is not an f32 bit pattern (an integer 0..4294967295)";
            return -1;
        }
        uint32_t u = (uint32_t)b;
        memcpy(&t->logit, &u, 4);
        return 0;
    }
    if (tl != SQLITE_FLOAT && tl != SQLITE_INTEGER) {
        *why = tl == SQLITE_NULL ? "logit and bits are both NULL" : "logit is not a number";
        return -1;
    }
    t->logit = (float)sqlite3_column_double(s, c + 1);
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

/* Room for n steps (*cap_s) and m entries (*cap_m) in t, growing by
 * doubling (out of memory exits, common.h). Returns 0. */
static void tops_grow(store_tops *t, int n, int *cap_s, size_t m, size_t *cap_m)
{
    if (n > *cap_s) {
        int c = *cap_s ? 2 * *cap_s : 64;
        t->step = xrealloc(t->step, sizeof *t->step * (size_t)c);
        t->n_top = xrealloc(t->n_top, sizeof *t->n_top * (size_t)c);
        t->off = xrealloc(t->off, sizeof *t->off * (size_t)c);
        *cap_s = c;
    }
    if (m > *cap_m) {
        size_t c = *cap_m ? 2 * *cap_m : 1024;
        t->top = xrealloc(t->top, sizeof *t->top * c);
        *cap_m = c;
    }
}

int store_tops_read(struct sqlite3 *db, int64_t leg_id, int64_t prompt_id, store_tops *out, tg_err *e)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *s = NULL;
    int rc = -1;
    /* the leg whose step_top rows hold this leg's top-k */
    s = common_sql_prepare(db, "SELECT l.same_as, b.id, b.same_as FROM leg l LEFT JOIN leg b ON b.id = l.same_as"
                               " WHERE l.id = ?1", "I", leg_id);
    if (!s)
        return tg_errf(e, "store: reading leg %lld: %s", (long long)leg_id, sqlite3_errmsg(db));
    int64_t src = leg_id;
    int r = sqlite3_step(s);
    if (r == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL) {
        src = sqlite3_column_int64(s, 0);
        if (sqlite3_column_type(s, 1) == SQLITE_NULL) {
            tg_errf(e, "leg %lld: same_as %lld names no leg", (long long)leg_id, (long long)src);
            goto out;
        }
        if (sqlite3_column_type(s, 2) != SQLITE_NULL) {
            tg_errf(e, "leg %lld: same_as leg %lld, which has no rows of its own either (same_as %lld); "
                       "expected a leg with its own step_top rows",
                    (long long)leg_id, (long long)src, (long long)sqlite3_column_int64(s, 2));
            goto out;
        }
    } else if (r != SQLITE_ROW && r != SQLITE_DONE) {
        tg_errf(e, "store: reading leg %lld: %s", (long long)leg_id, sqlite3_errmsg(db));
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    /* every step row of (leg, prompt), with its top-k rows in rank order */
    if (sqlite3_prepare_v2(db, "SELECT s.step, t.rank, t.id, t.logit, t.bits FROM step s"
                               " LEFT JOIN step_top t ON t.leg_id = ?3 AND t.prompt_id = s.prompt_id"
                               " AND t.step = s.step WHERE s.leg_id = ?1 AND s.prompt_id = ?2"
                               " ORDER BY s.step, t.rank", -1, &s, NULL) != SQLITE_OK) {
        tg_errf(e, "store: reading steps: %s", sqlite3_errmsg(db));
        goto out;
    }
    sqlite3_bind_int64(s, 1, leg_id);
    sqlite3_bind_int64(s, 2, prompt_id);
    sqlite3_bind_int64(s, 3, src);
    int cap_s = 0;
    size_t m = 0, cap_m = 0;
    while ((r = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t step = sqlite3_column_int64(s, 0);
        if (out->n == 0 || out->step[out->n - 1] != step) {
            if (sqlite3_column_type(s, 0) != SQLITE_INTEGER || step < INT32_MIN || step > INT32_MAX) {
                const char *txt = (const char *)sqlite3_column_text(s, 0);
                tg_errf(e, "leg %lld prompt %lld: step \"%.20s\" is not a 32-bit integer", (long long)leg_id,
                        (long long)prompt_id, txt ? txt : "");
                goto out;
            }
            tops_grow(out, out->n + 1, &cap_s, m, &cap_m);
            out->step[out->n] = (int)step;
            out->n_top[out->n] = 0;
            out->off[out->n] = m;
            out->n++;
        }
        if (sqlite3_column_type(s, 1) == SQLITE_NULL) continue;   /* no top-k rows */
        int k = out->n_top[out->n - 1];
        const char *why = NULL;
        if (sqlite3_column_type(s, 1) != SQLITE_INTEGER || sqlite3_column_int64(s, 1) != k + 1)
            why = "ranks are not 1, 2, 3, ... without a gap";
        else if (k >= MAX_TOP)
            why = "more than 4096 entries";
        if (!why) tops_grow(out, out->n, &cap_s, m + 1, &cap_m);
        if (why || column_top(s, 2, &out->top[m], &why) < 0) {
            tg_errf(e, "leg %lld prompt %lld step %lld: step_top rank %s of leg %lld: %s", (long long)leg_id,
                    (long long)prompt_id, (long long)step, sqlite3_column_text(s, 1) ? (const char *)sqlite3_column_text(s, 1) : "NULL",
                    (long long)src, why ? why : "not a top-k entry");
            goto out;
        }
        out->n_top[out->n - 1] = k + 1;
        m++;
    }
    if (r != SQLITE_DONE) {
        tg_errf(e, "store: reading the top-k of leg %lld prompt %lld: %s", (long long)leg_id,
                (long long)prompt_id, sqlite3_errmsg(db));
        goto out;
    }
    /* t.top + t.off[k] is a valid pointer for every step, empty ones too */
    if (out->n > 0 && !out->top) tops_grow(out, out->n, &cap_s, 1, &cap_m);
    rc = 0;
out:
    sqlite3_finalize(s);
    if (rc < 0) store_tops_free(out);
    return rc;
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

/* ------------------------------------------------------------------ */
/* Legs                                                                */

static int ensure_buf(tg_store *st, size_t n, tg_err *e)
{
    if (st->buf_cap >= n) return 0;
    size_t cap = st->buf_cap ? st->buf_cap : 4096;
    while (cap < n) cap *= 2;
    st->buf = xrealloc(st->buf, cap);
    st->buf_cap = cap;
    return 0;
}

/* ids as a JSON array text into a malloc'ed string (NULL for n < 0 or no
 * ids pointer). */
static char *ids_json(const int32_t *ids, int n)
{
    if (!ids || n < 0) return NULL;
    size_t cap = 3 + (size_t)n * 12;
    char *s = xmalloc(cap);
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


/* order[0..n-1]: the indices of lp's steps in ascending step order
 * (insertion sort: the steps come in order, or nearly). */
static void steps_order(const store_leg_prompt *lp, int *order)
{
    for (int i = 0; i < lp->n_steps; i++) order[i] = i;
    for (int i = 1; i < lp->n_steps; i++) {
        int k = order[i], j = i;
        while (j > 0 && lp->steps[order[j - 1]].step > lp->steps[k].step) order[j] = order[j - 1], j--;
        order[j] = k;
    }
}

/* Whether leg's top-k is the same as base_leg's step_top rows: the same
 * (prompt, step, rank, id, f32 bits) in every entry and no other row.
 * pid[i] is the prompt id of leg->prompts[i], pord the prompts in
 * ascending pid order, order[i] prompt i's steps in ascending order.
 * Returns 1 same, 0 not (malformed input included: put_leg_prompt names
 * it), or -1 with e. */
static int leg_same_as(tg_store *st, int64_t base_leg, const store_leg *leg, const int64_t *pid,
                       const int *pord, int *const *order, tg_err *e)
{
    sqlite3_stmt *s = stmt(st, Q_BASE_TOPS, e);
    if (!s) return -1;
    sqlite3_bind_int64(s, 1, base_leg);
    int same = 1, r = SQLITE_ROW;
    for (int a = 0; a < leg->n_prompts && same; a++) {
        const store_leg_prompt *lp = &leg->prompts[pord[a]];
        for (int b = 0; b < lp->n_steps && same; b++) {
            const store_step *sp = &lp->steps[order[pord[a]][b]];
            if (sp->n_top < 0 || sp->n_top > MAX_TOP || (sp->n_top > 0 && !sp->top)) same = 0;
            for (int k = 0; k < sp->n_top && same; k++) {
                tg_top t;
                const char *why;
                if ((r = sqlite3_step(s)) != SQLITE_ROW || sqlite3_column_int64(s, 0) != pid[pord[a]] ||
                    sqlite3_column_int64(s, 1) != sp->step || sqlite3_column_int64(s, 2) != k + 1 ||
                    column_top(s, 3, &t, &why) < 0 || t.id != sp->top[k].id ||
                    memcmp(&t.logit, &sp->top[k].logit, 4))
                    same = 0;
            }
        }
    }
    if (same) {
        r = sqlite3_step(s);
        same = r == SQLITE_DONE;   /* the base leg has no other rows */
    }
    sqlite3_reset(s);
    if (r != SQLITE_ROW && r != SQLITE_DONE) return db_err(st, e, "reading the arm's first leg");
    return same;
}

/* Writes the rows of one prompt of a leg (prompt id pid, steps in the
 * order given): leg_prompt, its steps, their step_top rows unless the leg
 * is stored as same_as another, its dumps. Returns 0 or -1 with e. */
static int put_leg_prompt(tg_store *st, int64_t leg_id, int64_t pid, const store_leg_prompt *lp,
                          const int *order, int same_as, tg_err *e)
{
    char *ids = ids_json(lp->ids, lp->n_ids);
    char *dec = ids_json(lp->decoded_from, lp->n_decoded_from);
    sqlite3_stmt *s = stmt(st, Q_LP_INS, e);
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
    int r = step_done(st, s, e, "inserting leg_prompt");
    free(ids), free(dec);
    if (r < 0) return tg_err_prefix(e, "prompt %s", lp->prompt_id);

    for (int i = 0; i < lp->n_steps; i++) {
        const store_step *sp = &lp->steps[order[i]];
        if (sp->n_top < 0 || sp->n_top > MAX_TOP || (sp->n_top > 0 && !sp->top))
            return tg_errf(e, "prompt %s step %d: n_top %d, expected 0..%d entries", lp->prompt_id, sp->step,
                           sp->n_top, MAX_TOP);
        int64_t dg = 0;
        int hasd = digest_parse(sp->digest, &dg);
        if (hasd < 0)
            return tg_errf(e, "prompt %s step %d: digest \"%.20s\", expected 16 hex digits", lp->prompt_id,
                           sp->step, sp->digest);
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
        /* gap: top1 - top2 in double, when both are finite */
        if (sp->n_top >= 2 && isfinite(sp->top[0].logit) && isfinite(sp->top[1].logit))
            sqlite3_bind_double(s, 6, (double)sp->top[0].logit - (double)sp->top[1].logit);
        else
            sqlite3_bind_null(s, 6);
        if (hasd)
            sqlite3_bind_int64(s, 7, dg);
        else
            sqlite3_bind_null(s, 7);
        if (step_done(st, s, e, "inserting a step") < 0)
            return tg_err_prefix(e, "prompt %s step %d", lp->prompt_id, sp->step);
        for (int k = 0; k < sp->n_top && !same_as; k++) {
            s = stmt(st, Q_TOP_INS, e);
            if (!s) return -1;
            sqlite3_bind_int64(s, 1, leg_id);
            sqlite3_bind_int64(s, 2, pid);
            sqlite3_bind_int(s, 3, sp->step);
            sqlite3_bind_int(s, 4, k + 1);
            sqlite3_bind_int(s, 5, sp->top[k].id);
            bind_logit(s, 6, sp->top[k].logit);
            if (step_done(st, s, e, "inserting a top-k row") < 0)
                return tg_err_prefix(e, "prompt %s step %d rank %d", lp->prompt_id, sp->step, k + 1);
        }
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

/* The per-prompt arrays of store_put_leg. */
typedef struct leg_plan {
    int64_t *pid;   /* prompt id of prompts[i] */
    int *pord;      /* the prompts in ascending pid order */
    int **order;    /* prompt i's steps in ascending step order */
    int n;
} leg_plan;

/* Frees what plan_leg allocated and resets *p; a zeroed plan is a no-op. */
static void plan_free(leg_plan *p)
{
    for (int i = 0; p->order && i < p->n; i++) free(p->order[i]);
    free(p->order), free(p->pid), free(p->pord);
    memset(p, 0, sizeof *p);
}

/* Looks up the prompt ids of leg's prompts and orders prompts and steps.
 * Returns 0 or -1 with e (an unknown prompt, a step count without steps). */
static int plan_leg(tg_store *st, const store_leg *leg, leg_plan *p, tg_err *e)
{
    int n = leg->n_prompts;
    p->n = n;
    p->pid = xcalloc((size_t)n, sizeof *p->pid);
    p->pord = xcalloc((size_t)n, sizeof *p->pord);
    p->order = xcalloc((size_t)n, sizeof *p->order);
    for (int i = 0; i < n; i++) {
        const store_leg_prompt *lp = &leg->prompts[i];
        sqlite3_stmt *s = stmt(st, Q_PROMPT_FIND, e);
        if (!s) return -1;
        sqlite3_bind_int64(s, 1, leg->run_id);
        bind_text(s, 2, lp->prompt_id);
        int r = step_int(st, s, &p->pid[i], e, "looking up a prompt");
        if (r < 0) return -1;
        if (r == 0)
            return tg_errf(e, "prompt %s: not a prompt of run %lld", lp->prompt_id ? lp->prompt_id : "(null)",
                           (long long)leg->run_id);
        if (lp->n_steps < 0 || (lp->n_steps > 0 && !lp->steps))
            return tg_errf(e, "prompt %s: n_steps %d without steps", lp->prompt_id, lp->n_steps);
        p->order[i] = xmalloc(sizeof *p->order[i] * (size_t)lp->n_steps);
        steps_order(lp, p->order[i]);
        int j = i;
        while (j > 0 && p->pid[p->pord[j - 1]] > p->pid[i]) p->pord[j] = p->pord[j - 1], j--;
        p->pord[j] = i;
    }
    return 0;
}

int store_put_leg(tg_store *st, const store_leg *leg, tg_err *e)
{
    leg_plan plan = {0};
    if (!leg->arm) return tg_errf(e, "%s: leg: arm name missing", st->path);
    if (leg->n_prompts < 0 || (leg->n_prompts > 0 && !leg->prompts))
        return tg_errf(e, "%s: leg of %s: n_prompts %d without prompts", st->path, leg->arm,
                       leg->n_prompts);
    if (exec_q(st, Q_BEGIN, e) < 0) {
        if (sqlite3_errcode(st->db) == SQLITE_BUSY)
            return tg_errf(e, "%s: leg %s/%d of run %lld not stored: another process held the store's write "
                              "lock for %.0f s (BEGIN IMMEDIATE: database is locked; wait longer with "
                              "TOKGATE_STORE_WAIT=SECONDS)", st->path, leg->arm, leg->leg,
                           (long long)leg->run_id, st->waited_s);
        return tg_err_prefix(e, "leg %s/%d of run %lld", leg->arm, leg->leg, (long long)leg->run_id);
    }
    int64_t arm_id, bin_id = 0, leg_id, base_leg = 0;
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
    if (plan_leg(st, leg, &plan, e) < 0) {
        tg_err_prefix(e, "%s: leg %s/%d", st->path, leg->arm, leg->leg);
        goto fail;
    }
    /* the same top-k as the arm's leg 1 in every step: stored once. Only
     * leg 1 is ever a base, whatever order parallel legs are stored in, so
     * a later leg can always be deleted (and rerun) on its own. */
    s = stmt(st, Q_BASE_LEG, e);
    if (!s) goto fail;
    sqlite3_bind_int64(s, 1, leg->run_id);
    sqlite3_bind_int64(s, 2, arm_id);
    if (step_int(st, s, &base_leg, e, "looking up the arm's first leg") < 0) goto fail;
    int same = 0;
    if (base_leg && (same = leg_same_as(st, base_leg, leg, plan.pid, plan.pord, plan.order, e)) < 0) goto fail;
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
    if (same)
        sqlite3_bind_int64(s, 22, base_leg);
    else
        sqlite3_bind_null(s, 22);
    if (step_done(st, s, e, "inserting the leg") < 0) {
        tg_err_prefix(e, "leg %s/%d", leg->arm, leg->leg);
        goto fail;
    }
    leg_id = sqlite3_last_insert_rowid(st->db);
    /* prompts in id order, steps in step order: the rows go in key order */
    for (int a = 0; a < leg->n_prompts; a++) {
        int i = plan.pord[a];
        if (put_leg_prompt(st, leg_id, plan.pid[i], &leg->prompts[i], plan.order[i], same, e) < 0) {
            tg_err_prefix(e, "%s: leg %s/%d", st->path, leg->arm, leg->leg);
            goto fail;
        }
    }
    if (exec_q(st, Q_COMMIT, e) < 0) goto fail;
    plan_free(&plan);
    return 0;
fail:
    exec_q(st, Q_ROLLBACK, NULL);
    plan_free(&plan);
    return -1;
}
