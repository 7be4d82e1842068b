-- The crew baseline of a run comparison (issue 35) from the materializer's per-run tables
-- (analytics.compare_kept: findings__compare_sequences, findings__compare_run_steps,
-- findings__compare_subjects) of the baseline runs ($runs), so no span's arguments are parsed
-- and no run's steps sorted per request: the same rows as compare_baseline.sql.
WITH sequences AS (
    SELECT run_id, steps, sequence, first_ns FROM findings__compare_sequences
    WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))
),
run_steps AS (
    SELECT run_id, step, agent, operation, tool, arg_shape, status FROM findings__compare_run_steps
    WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))
),
subjects AS (
    SELECT * FROM findings__compare_subjects
    WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))
)
{compare_baseline_parts}
