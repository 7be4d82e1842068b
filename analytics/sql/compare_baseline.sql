-- The crew baseline of a run comparison (issue 35) from the spans of the baseline runs ($runs),
-- each span's step columns computed once (_compare_spans.sql without the shared filter): the
-- per-run relations the materializer keeps (compare_sequences.sql, compare_run_steps.sql,
-- compare_subjects.sql) computed here, then _compare_baseline_parts.sql.
-- compare_baseline_kept.sql reads the same relations from the materializer's tables.
WITH s AS MATERIALIZED (
    SELECT *, hash(agent, operation, tool, arg_shape, status) AS step
    FROM (
        SELECT run_id, SpanId, {compare_step_columns}
        FROM spans
        WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))
    )
),
sequences AS MATERIALIZED ({compare_sequences_of}),
run_steps AS ({compare_run_steps_of}),
subjects AS ({compare_subjects_of})
{compare_baseline_parts}
