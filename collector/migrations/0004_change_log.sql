-- The change log: what each commit of the one writer changed, written in the same transaction as
-- the change itself (collector.changes). The materializer (analytics.materialize) reads it in
-- `seq` order and brings the findings tables up to date for the partitions listed; nothing is
-- inferred afterwards from ingested_at, counts or fingerprints. Consumed entries are pruned.
CREATE SEQUENCE IF NOT EXISTS change_seq START 1;

CREATE TABLE IF NOT EXISTS change_log (
    seq           BIGINT NOT NULL,     -- monotonic in commit order (one writer)
    committed_at  TIMESTAMP NOT NULL,  -- UTC, when the change was written
    kind          VARCHAR NOT NULL,    -- 'spans' | 'delete' | 'rescore' | 'rebuild'
    spans         BIGINT NOT NULL,     -- spans stored (or deleted) by it
    newest_ingested TIMESTAMP          -- newest ingested_at it stored (NULL for other kinds)
);

-- The partitions one change touched: every run and origin task with a span inserted, updated
-- (run, agent or hop resolved from later spans) or deleted. A 'rebuild' change lists none: every
-- partition of every detector is stale (a threshold or pattern changed).
CREATE TABLE IF NOT EXISTS change_partitions (
    seq        BIGINT NOT NULL,
    partition  VARCHAR NOT NULL,       -- 'run_id' | 'origin_task_id'
    key        VARCHAR NOT NULL
);
