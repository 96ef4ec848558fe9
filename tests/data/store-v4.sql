-- A v4 store (schema version 4) written by tokgate's v4 store code (the data of
-- tests/v3fixture.h, fixture_put): the refusal test opens it with the current code.
PRAGMA user_version=4;
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE spec(
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, path TEXT, sha256 TEXT NOT NULL,
  text TEXT, UNIQUE(name, sha256));
INSERT INTO spec VALUES(1,'v3',NULL,'00',NULL);
CREATE TABLE artifact(
  id INTEGER PRIMARY KEY, path TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER,
  UNIQUE(path, sha256));
INSERT INTO artifact VALUES(1,'m.gguf','11',0);
CREATE TABLE binary(
  id INTEGER PRIMARY KEY, path TEXT NOT NULL, sha256 TEXT NOT NULL, version TEXT NOT NULL,
  UNIQUE(path, sha256, version));
INSERT INTO binary VALUES(1,'w','22','0');
CREATE TABLE run(
  id INTEGER PRIMARY KEY, spec_id INTEGER NOT NULL REFERENCES spec(id),
  artifact_id INTEGER NOT NULL REFERENCES artifact(id),
  started TEXT NOT NULL, finished TEXT, host TEXT, tokgate_version TEXT,
  mode TEXT NOT NULL, reference TEXT NOT NULL, policy TEXT NOT NULL, band REAL NOT NULL,
  steps INTEGER, top_k INTEGER, legs INTEGER, verdict TEXT, uid TEXT);
INSERT INTO run VALUES(1,1,1,'2026-12-03T19:58:52Z',NULL,NULL,NULL,'teacher-forced','a','exact',0.0,4,5,2,NULL,'6f341701bf224ce4e2aa7b757f8a5268');
CREATE TABLE arm(
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  name TEXT NOT NULL, kind TEXT NOT NULL, role TEXT NOT NULL, config TEXT,
  UNIQUE(run_id, name));
INSERT INTO arm VALUES(1,1,'a','engine','reference','{}');
CREATE TABLE prompt(
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  no INTEGER NOT NULL, name TEXT NOT NULL, text TEXT NOT NULL,
  UNIQUE(run_id, name));
INSERT INTO prompt VALUES(1,1,1,'p1','hello');
INSERT INTO prompt VALUES(2,1,2,'p2','world');
CREATE TABLE leg(
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  arm_id INTEGER NOT NULL REFERENCES arm(id) ON DELETE CASCADE, leg INTEGER NOT NULL,
  binary_id INTEGER REFERENCES binary(id), device TEXT, hello TEXT, model TEXT,
  exit_status INTEGER, term_signal INTEGER, cause TEXT, fault_lines TEXT,
  counters TEXT, device_ops INTEGER, host_ops INTEGER,
  stderr_zstd BLOB, stderr_len INTEGER,
  ms_load REAL, ms_prefill REAL, ms_decode REAL, wall_s REAL, stored TEXT,
  UNIQUE(run_id, arm_id, leg));
INSERT INTO leg VALUES(1,1,1,1,1,NULL,NULL,NULL,0,0,NULL,NULL,NULL,0,0,NULL,0,0.0,0.0,0.0,0.0,'2026-12-03T19:58:52Z');
INSERT INTO leg VALUES(2,1,1,2,1,NULL,NULL,NULL,0,0,NULL,NULL,NULL,0,0,NULL,0,0.0,0.0,0.0,0.0,'2026-12-03T19:58:52Z');
CREATE TABLE leg_prompt(
  leg_id INTEGER NOT NULL REFERENCES leg(id) ON DELETE CASCADE,
  prompt_id INTEGER NOT NULL REFERENCES prompt(id) ON DELETE CASCADE,
  ids TEXT, decoded_from TEXT, n_steps INTEGER NOT NULL, text TEXT, error TEXT,
  PRIMARY KEY(leg_id, prompt_id)) WITHOUT ROWID;
INSERT INTO leg_prompt VALUES(1,1,'[1,2,3]','[1,2,3]',4,NULL,NULL);
INSERT INTO leg_prompt VALUES(1,2,'[1,2,3]','[1,2,3]',4,NULL,NULL);
INSERT INTO leg_prompt VALUES(2,1,'[1,2,3]','[1,2,3]',4,NULL,NULL);
INSERT INTO leg_prompt VALUES(2,2,'[1,2,3]','[1,2,3]',4,NULL,NULL);
CREATE TABLE dump(
  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,
  layer INTEGER NOT NULL, stage TEXT NOT NULL, n INTEGER NOT NULL, data BLOB,
  PRIMARY KEY(leg_id, prompt_id, step, layer, stage),
  FOREIGN KEY(leg_id, prompt_id) REFERENCES leg_prompt(leg_id, prompt_id) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE TABLE verdict_set(
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE, set_no INTEGER NOT NULL,
  created TEXT NOT NULL, policy TEXT NOT NULL, band REAL NOT NULL, overall TEXT NOT NULL,
  PRIMARY KEY(run_id, set_no));
CREATE TABLE verdict(
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, set_no INTEGER NOT NULL,
  arm TEXT, prompt TEXT, key TEXT NOT NULL, value TEXT NOT NULL,
  band REAL NOT NULL, policy TEXT NOT NULL,
  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE);
CREATE TABLE compare(
  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, arm TEXT NOT NULL, leg INTEGER NOT NULL,
  prompt TEXT NOT NULL, step INTEGER NOT NULL, ref_leg INTEGER NOT NULL,
  token INTEGER NOT NULL, ref_token INTEGER, ref_top2 INTEGER, rank INTEGER NOT NULL,
  ref_gap REAL, own_gap REAL, class TEXT NOT NULL, oracle_split INTEGER NOT NULL,
  kl REAL,
  PRIMARY KEY(run_id, set_no, arm, leg, prompt, step),
  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE TABLE contested(
  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, prompt TEXT NOT NULL, step INTEGER NOT NULL,
  oracle_split INTEGER NOT NULL, tokens TEXT NOT NULL, sentence TEXT NOT NULL,
  PRIMARY KEY(run_id, set_no, prompt, step),
  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE TABLE noise_band(
  run_id INTEGER NOT NULL, set_no INTEGER NOT NULL, prompt TEXT NOT NULL, step INTEGER NOT NULL,
  n_views INTEGER NOT NULL, ref_gap REAL, spread REAL, tokens TEXT NOT NULL,
  PRIMARY KEY(run_id, set_no, prompt, step),
  FOREIGN KEY(run_id, set_no) REFERENCES verdict_set(run_id, set_no) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE TABLE localize(
  id INTEGER PRIMARY KEY, created TEXT NOT NULL, run_id INTEGER REFERENCES run(id) ON DELETE SET NULL,
  spec_name TEXT, artifact_path TEXT, artifact_sha256 TEXT, prompt TEXT NOT NULL,
  prompt_text TEXT, step INTEGER NOT NULL, arm_a TEXT NOT NULL, arm_b TEXT NOT NULL,
  third TEXT, prefix TEXT NOT NULL, rule TEXT NOT NULL, first_layer INTEGER, first_stage TEXT);
CREATE TABLE localize_arm(
  localize_id INTEGER NOT NULL REFERENCES localize(id) ON DELETE CASCADE, arm TEXT NOT NULL,
  role TEXT NOT NULL, config TEXT, hello TEXT, token INTEGER NOT NULL, top TEXT,
  PRIMARY KEY(localize_id, arm)) WITHOUT ROWID;
CREATE TABLE localize_dump(
  localize_id INTEGER NOT NULL REFERENCES localize(id) ON DELETE CASCADE, arm TEXT NOT NULL,
  layer INTEGER NOT NULL, stage TEXT NOT NULL, n INTEGER NOT NULL, data BLOB,
  PRIMARY KEY(localize_id, arm, layer, stage)) WITHOUT ROWID;
CREATE TABLE localize_row(
  localize_id INTEGER NOT NULL REFERENCES localize(id) ON DELETE CASCADE,
  layer INTEGER NOT NULL, stage TEXT NOT NULL, n INTEGER NOT NULL, rel_l2 REAL, cosine REAL,
  max_abs REAL, growth REAL, third REAL, floor REAL, exceeds INTEGER NOT NULL,
  PRIMARY KEY(localize_id, layer, stage)) WITHOUT ROWID;
CREATE TABLE leg_top(
  leg_id INTEGER PRIMARY KEY REFERENCES leg(id) ON DELETE CASCADE,
  base_leg INTEGER, data BLOB NOT NULL);
INSERT INTO leg_top VALUES(1,NULL,X'01192a05535323020000000000000000000000000000005023012120001743004e20002743005d508d77140c15808a42c2b31dbb241d9c954386eb19ae67b8be0b5e0fcdb787c8efd062b89ee17a86eb5badb9014650f1795a871686eb19ae67b8bece31a9f141701c34220000c3f50cd7335c7fbc74140c15807a31a46f05656818762b870cd7335ccf70fd050001370060bcf428e8553100c04b3728c8aa2b0020db792768ffffff9f6abc2688542000e0f9fe25a82f492a3c792f6f7c94430bc3f50cd7335caf00909d030000');
INSERT INTO leg_top VALUES(2,1,X'01190502023112100202703104ad01027032043be3a547c1400180d29a0518a3e29e56db7986eb19ae0700000000000000');
CREATE TABLE IF NOT EXISTS "step"(
  leg_id INTEGER NOT NULL, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,
  token INTEGER NOT NULL, forced INTEGER, gap, digest INTEGER,
  PRIMARY KEY(leg_id, prompt_id, step),
  FOREIGN KEY(leg_id, prompt_id) REFERENCES leg_prompt(leg_id, prompt_id) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO step VALUES(1,1,0,0,0,6207568,7774064181650846793);
INSERT INTO step VALUES(1,1,1,104729,104729,6207568,728034927264493662);
INSERT INTO step VALUES(1,1,2,57522,57522,6207568,-6317994327121859469);
INSERT INTO step VALUES(1,1,3,10315,10315,6207568,5082720492201339016);
INSERT INTO step VALUES(1,2,0,7919,NULL,6207568,NULL);
INSERT INTO step VALUES(1,2,1,112648,NULL,6207568,4054718678239168816);
INSERT INTO step VALUES(1,2,2,65441,NULL,6207568,-2991310576147184315);
INSERT INTO step VALUES(1,2,3,18234,NULL,NULL,8409404243176014170);
INSERT INTO step VALUES(2,1,0,0,0,6207568,4147413543978495101);
INSERT INTO step VALUES(2,1,1,104729,104729,6207568,-2898615710407858030);
INSERT INTO step VALUES(2,1,2,57522,57522,6224352,8502099108915340455);
INSERT INTO step VALUES(2,1,3,10315,10315,6207568,1456069854528987324);
INSERT INTO step VALUES(2,2,0,7919,NULL,6207568,NULL);
INSERT INTO step VALUES(2,2,1,112648,NULL,6207568,428068040566817124);
INSERT INTO step VALUES(2,2,2,65441,NULL,6207568,-6617961213819536007);
INSERT INTO step VALUES(2,2,3,18234,NULL,NULL,4782753605503662478);
CREATE INDEX run_spec ON run(spec_id);
CREATE INDEX verdict_run ON verdict(run_id, set_no);
CREATE VIEW v_latest_set AS
  SELECT run_id, max(set_no) AS set_no FROM verdict_set GROUP BY run_id;
CREATE VIEW v_step_compare AS
  SELECT c.run_id, c.set_no, c.arm, c.leg, c.prompt, c.step, c.ref_leg, c.token,
         c.ref_token, c.rank, c.ref_gap, c.own_gap, c.class, c.oracle_split, c.kl
  FROM compare c JOIN v_latest_set l ON l.run_id = c.run_id AND l.set_no = c.set_no;
CREATE VIEW v_near_tie AS
  SELECT c.run_id, c.set_no, c.prompt, c.step, c.arm, c.leg, c.token, c.ref_token,
         c.ref_gap, s.band, (c.token = c.ref_token) AS won
  FROM v_step_compare c JOIN verdict_set s ON s.run_id = c.run_id AND s.set_no = c.set_no
  WHERE c.ref_gap IS NOT NULL AND c.ref_gap < s.band;
CREATE VIEW v_rank_hist AS
  SELECT run_id, set_no, arm, rank, count(*) AS n FROM v_step_compare
  WHERE class <> 'UNCOMPARABLE' GROUP BY run_id, set_no, arm, rank;
CREATE UNIQUE INDEX run_uid ON run(uid);
CREATE VIEW v_step AS
  SELECT leg_id, prompt_id, step, token, forced,
         CASE typeof(gap) WHEN 'integer' THEN gap / 16777216.0 ELSE gap END AS gap, digest
  FROM step;
COMMIT;
