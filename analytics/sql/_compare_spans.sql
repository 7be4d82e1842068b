-- Shared fragment of the run comparison (issue 35): the spans of the shared span filter's runs
-- (the runs new spans touched, through $runs) with their step columns
-- (_compare_step_columns.sql) and ``step``, the hash of (agent, operation, tool, arg_shape,
-- status) that the comparison aligns (compare_steps.sql's).
SELECT *, hash(agent, operation, tool, arg_shape, status) AS step
FROM (
    SELECT run_id, SpanId, {compare_step_columns}
    FROM spans
    WHERE {span_filter}
      AND run_id IS NOT NULL
)
