-- What a change's listed spans (span_changes) are, so a materializer reads only them and not a
-- scan of every stored span or state row: `oldest_ingested` is a lower bound on the
-- ingested_at of every span the change lists (the writer's own bound: the earliest ingest of
-- the traces it touched; NULL: none known, as for changes logged before this column), which
-- zone maps turn into a scan of the newest row groups; `only_new` says every span it lists was
-- first stored by it (no resend, no span stored before changed or deleted), so no state kept
-- per span can hold one of them yet.
ALTER TABLE change_log ADD COLUMN IF NOT EXISTS oldest_ingested TIMESTAMP;
ALTER TABLE change_log ADD COLUMN IF NOT EXISTS only_new BOOLEAN;
