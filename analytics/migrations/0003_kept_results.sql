-- analytics schema v3: detector results kept by data version (analytics.kept), persisted so a
-- restarted `serve` or an offline reader starts from them instead of a full computation.
-- Written only by serve's background refresh (analytics.kept_worker) through the single writer;
-- read on a kept result's first use in a process. A row is valid for the data version it was
-- computed at (`version`, JSON: span count, newest ingested_at, recent spans per trace,
-- thresholds) and for the code that computed it (`code`: a hash of analytics' sources); a reader
-- brings it up to date like an in-memory kept result (only the runs new spans touched).
CREATE TABLE IF NOT EXISTS kept_results (
    metric      VARCHAR NOT NULL,                 -- detector name
    scope       VARCHAR NOT NULL,                 -- JSON: window, filters, side-effect tool pattern
    code        VARCHAR NOT NULL,                 -- sha256 of analytics' .py and .sql sources
    version     VARCHAR NOT NULL,                 -- JSON data version the frame was computed at
    frame       BLOB NOT NULL,                    -- Arrow IPC stream (zstd) of the result rows
    rows        BIGINT NOT NULL,
    created_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (metric, scope)
);
