-- driftscope schema v4: goal-divergence scores per distinct (root goal, subtask) text pair.
-- analytics.goals scores each distinct pair of raw texts once (task statements extracted, both
-- embedded, 1 - cosine) and joins the scores back to subtask rows in SQL, so a detector call
-- does no per-row Python and repeated calls score only pairs not seen before. `scorer` names the
-- model and the task-extraction version; a new one scores pairs again. Rows whose texts hold no
-- task statement are kept with NULL statements and divergence, so they are not retried.
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
