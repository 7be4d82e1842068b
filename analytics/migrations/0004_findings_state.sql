-- analytics schema v4: live findings (analytics.materialize). Each maintained detector's findings
-- live in a table of their own, `findings__<detector>`, created from its first rows and written
-- only by the materializer through the single writer. This table says how far each is brought:
-- up to change `seq` of the collector's change log, computed by definition `version`.
CREATE TABLE IF NOT EXISTS findings_state (
    metric      VARCHAR PRIMARY KEY,              -- detector (or run_summary part) name
    version     VARCHAR NOT NULL,                 -- registration version + settings it depends on
    seq         BIGINT,                           -- change log seq it reflects; NULL: being rebuilt
    rows        BIGINT NOT NULL,                  -- rows in its table
    updated_at  TIMESTAMP NOT NULL,
    failed_keys VARCHAR,                          -- JSON list of partitions whose computation failed
    last_error  VARCHAR                           -- the newest failure, for health and logs
);
