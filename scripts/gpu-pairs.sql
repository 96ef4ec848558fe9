-- per run: arm A (gpu, leg 1) against arm B (leg 1) over the same teacher-forced prefix:
-- steps, steps where B's own gap >= 0.5, and token mismatches among those
WITH s AS (
  SELECT r.id AS run, a.name AS arm, st.prompt_id AS p, st.step AS k, st.token AS tok, st.gap AS gap
  FROM v_step st JOIN leg l ON l.id = st.leg_id JOIN arm a ON a.id = l.arm_id JOIN run r ON r.id = l.run_id
  WHERE l.leg = 1)
SELECT x.run, 'gpu vs ' || y.arm AS pair, count(*) AS steps,
       sum(y.gap >= 0.5) AS steps_gap_ge_05,
       sum(y.gap >= 0.5 AND x.tok != y.tok) AS mismatches_gap_ge_05,
       sum(x.tok != y.tok) AS mismatches_all,
       printf('%.4f', max(CASE WHEN x.tok != y.tok THEN y.gap END)) AS largest_gap_at_mismatch
FROM s x JOIN s y ON y.run = x.run AND y.p = x.p AND y.k = x.k AND y.arm != x.arm
WHERE x.arm = 'gpu' GROUP BY x.run, y.arm ORDER BY x.run, y.arm;
