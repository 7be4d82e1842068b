-- Shared fragment (context_drift_holders.sql, analytics.context_fold): from ``version_first``
-- (per run, subject and version: first_ns, first_span, any_flagged), the CTEs ``instants``,
-- ``versions`` (each version with the first one seen after it) and ``open_versions`` (the
-- superseded or flagged ones: the only ones a holding can be stale on).
instants AS (  -- the distinct moments a subject got a new version, each with the next moment
               -- (versions first seen at the same moment: the lowest version and span stand for
               -- them, one of the tied ones either way)
    SELECT run_id, subject, first_ns,
           lead(first_ns) OVER w AS newer_ns,
           lead(version) OVER w AS superseded_by,
           lead(first_span) OVER w AS supersede_span_id
    FROM (SELECT run_id, subject, first_ns, min(version) AS version, min(first_span) AS first_span
          FROM version_first GROUP BY ALL)
    WINDOW w AS (PARTITION BY run_id, subject ORDER BY first_ns)
),
versions AS (  -- each version with the earliest version first seen strictly after it: one
               -- window over a subject's moments (a self-join grew with the square of them)
    SELECT f.run_id, f.subject, f.version, i.newer_ns, i.superseded_by, i.supersede_span_id
    FROM version_first f JOIN instants i USING (run_id, subject, first_ns)
    WHERE i.newer_ns IS NOT NULL
),
open_versions AS (  -- superseded or flagged versions: the only ones a holding can be stale on
    SELECT * FROM versions
    UNION ALL
    SELECT f.run_id, f.subject, f.version, NULL, NULL, NULL
    FROM version_first f ANTI JOIN versions v USING (run_id, subject, version)
    WHERE f.any_flagged
)
