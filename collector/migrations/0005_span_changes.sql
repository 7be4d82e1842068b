-- The spans each commit stored, changed or deleted (collector.changes.record_spans), by the
-- change log's seq: what a materializer folds into per-span state (analytics.materialize, the
-- 'span' partition) instead of reading every span of the runs a commit touched. A span a later
-- commit changes (its run, agent, hop, hand-off or task resolved from later spans) is listed
-- again under that commit. Pruned with the change log once consumed.
CREATE TABLE IF NOT EXISTS span_changes (
    seq      BIGINT NOT NULL,
    TraceId  VARCHAR NOT NULL,
    SpanId   VARCHAR NOT NULL
);
