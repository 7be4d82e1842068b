-- The materializer's ``constraint_spans`` table (analytics.constraints): the rows of
-- _constraint_spans.sql, so a pass folds the spans each change lists into it (their arguments'
-- regex read once, when they are committed) and the ledger and drops of the origin tasks it
-- touched are computed from those narrow rows, not from a scan of every stored span. Every
-- span of the runs $runs (every run when NULL: a first build goes a chunk of runs at a time)
-- when $after is NULL; else only the spans committed (stored or changed) after change $after up
-- to $upto (``span_changes``), read since $ingested_after (their oldest ingest: the newest row
-- groups only).
SELECT * FROM ({constraint_spans}) s
WHERE $after::BIGINT IS NULL
   OR EXISTS (SELECT 1 FROM span_changes c
              WHERE c.seq > $after::BIGINT AND c.seq <= $upto::BIGINT
                AND c.TraceId = s.TraceId AND c.SpanId = s.SpanId)
