-- The steps of some runs in detail (issue 35): every span of each run in $runs, in start order
-- (pos from 0), with its step columns (_compare_step_columns.sql) and ``step``, the hash of its
-- (agent, operation, tool, argument shape, status) that the comparison aligns (the same hash as
-- compare_baseline.sql's). Alignment is by this order, never by time. $runs is the shared span
-- filter's run list: a comparison names its runs; the materializer's ``compare_steps`` table
-- (analytics.compare_kept) computes the runs new spans touched, or every run when it is None.
SELECT *, hash(agent, operation, tool, arg_shape, status) AS step
FROM (
    SELECT
        run_id,
        (row_number() OVER (PARTITION BY run_id ORDER BY start_ns, SpanId) - 1)::INTEGER AS pos,
        SpanId AS span_id,
        TraceId AS trace_id,
        ParentSpanId AS parent_span_id,
        SpanName AS span_name,
        end_ns,
        {compare_step_columns}
    FROM spans
    WHERE {span_filter}
      AND run_id IS NOT NULL
)
ORDER BY run_id, pos
