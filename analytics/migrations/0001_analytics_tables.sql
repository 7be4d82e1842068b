-- analytics schema v1: the tables analytics writes (through the single writer) beside `spans`.
-- IF NOT EXISTS: databases created before these tables moved here (collector migrations 0001 and
-- 0004 of driftscope <= 0.1) already have them, with exactly these columns.

-- One row per distinct text embedded by the embedding worker.
CREATE TABLE IF NOT EXISTS embeddings (
    text_hash   VARCHAR PRIMARY KEY,              -- sha256 hex of the exact text embedded
    model       VARCHAR NOT NULL,
    dim         INTEGER NOT NULL,
    vector      FLOAT[] NOT NULL,                 -- L2-normalised
    created_at  TIMESTAMP NOT NULL
);

-- Versioned, calibrated thresholds with provenance; detectors use the newest per name.
CREATE TABLE IF NOT EXISTS thresholds (
    name        VARCHAR NOT NULL,                 -- e.g. goal_divergence, rejection_rate
    version     INTEGER NOT NULL,
    value       DOUBLE NOT NULL,
    method      VARCHAR NOT NULL,                 -- youden_j / target_fpr / quantile / mean_k_sigma / default
    provenance  VARCHAR NOT NULL,                 -- JSON: model, data, window, metrics
    created_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (name, version)
);

-- Goal-divergence scores per distinct (root goal, subtask) text pair. analytics.goals scores each
-- distinct pair of raw texts once (task statements extracted, both embedded, 1 - cosine) and joins
-- the scores back to subtask rows in SQL. `scorer` names the model and the task-extraction
-- version; a new one scores pairs again. Rows whose texts hold no task statement are kept with
-- NULL statements and divergence, so they are not retried.
CREATE TABLE IF NOT EXISTS goal_scores (
    root_hash     VARCHAR NOT NULL,               -- sha256 hex of the raw root-goal text
    subtask_hash  VARCHAR NOT NULL,               -- sha256 hex of the raw subtask text
    scorer        VARCHAR NOT NULL,               -- model + task-extraction version
    root_goal     VARCHAR,                        -- extracted root task statement (NULL: none)
    subtask       VARCHAR,                        -- extracted subtask statement (NULL: none)
    divergence    DOUBLE,                         -- 1 - cosine, 0..2; NULL without statements
    created_at    TIMESTAMP NOT NULL,
    PRIMARY KEY (root_hash, subtask_hash, scorer)
);
