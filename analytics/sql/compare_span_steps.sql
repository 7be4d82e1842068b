-- The materializer's ``compare_span_steps`` table (analytics.compare_kept): each span's step
-- columns (_compare_step_columns.sql: its JSON arguments' keys and its attributes read once, when
-- it is committed) and ``step``, the hash the comparison aligns. Every span of the runs $runs
-- (every run when NULL: a first build goes a chunk of runs at a time) when $after is NULL;
-- else only the spans committed (stored or changed) after change $after up to $upto
-- (``span_changes``), which the materializer folds into the table.
SELECT *, hash(agent, operation, tool, arg_shape, status) AS step
FROM (
    SELECT TraceId, run_id, SpanId, {compare_step_columns}
    FROM spans s
    WHERE run_id IS NOT NULL
      AND ($runs::VARCHAR[] IS NULL OR run_id IN (SELECT unnest($runs::VARCHAR[])))
      AND ($after::BIGINT IS NULL
           OR s.ingested_at >= $since_ingested::TIMESTAMP AND EXISTS (SELECT 1 FROM span_changes c
                      WHERE c.seq > $after::BIGINT AND c.seq <= $upto::BIGINT
                        AND c.TraceId = s.TraceId AND c.SpanId = s.SpanId))
)
