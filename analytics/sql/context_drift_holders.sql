-- context_drift_holders: agents that kept holding a version of an objective (or of a shared
-- state key such as a policy) after another agent superseded it.
-- A holding starts at an agent's first read of a version and ends at its next observation of the
-- subject with another version (a refresh), else at its last span in the run. A version is
-- superseded when a version first seen after it appears (or a span flags it superseded). A
-- holder that itself tried to write the subject while holding (accepted or refused) is in a
-- write conflict (lost_updates / divergent_reads), not context drift, and is left out.
-- Performance: each lookup is one join + aggregate (no correlated subqueries, no window), and the
-- per-holding work (refresh, last span, own writes, current version, evidence list) is done only
-- for holdings of a superseded or flagged version.
WITH obs AS NOT MATERIALIZED ({held_versions}),
version_first AS (
    SELECT run_id, subject, version, min(start_ns) AS first_ns, arg_min(SpanId, start_ns) AS first_span
    FROM obs GROUP BY ALL
),
versions AS (  -- each version with the earliest version first seen strictly after it
    SELECT mine.run_id, mine.subject, mine.version,
           min(v.first_ns) AS newer_ns,
           arg_min(v.version, v.first_ns) AS superseded_by,
           arg_min(v.first_span, v.first_ns) AS supersede_span_id
    FROM version_first mine
    JOIN version_first v
      ON v.run_id = mine.run_id AND v.subject = mine.subject AND v.first_ns > mine.first_ns
    GROUP BY ALL
),
holds AS (
    SELECT run_id, agent_id, subject, version,
           min(start_ns) AS hold_start_ns,
           arg_min(SpanId, start_ns) AS read_span_id,
           min(start_ns) FILTER (WHERE flagged) AS flagged_ns
    FROM obs WHERE NOT is_write GROUP BY ALL
),
candidates AS (  -- holdings of a version that was superseded or flagged
    SELECT h.*, v.newer_ns, v.superseded_by, v.supersede_span_id
    FROM holds h LEFT JOIN versions v USING (run_id, subject, version)
    WHERE coalesce(v.newer_ns, h.flagged_ns) IS NOT NULL
),
ended AS (  -- the holder's next observation of the subject with another version
    SELECT c.run_id, c.agent_id, c.subject, c.version,
           arg_min(o.SpanId, o.start_ns) AS end_span_id, min(o.start_ns) AS end_ns
    FROM candidates c
    JOIN obs o ON o.run_id = c.run_id AND o.agent_id = c.agent_id AND o.subject = c.subject
              AND o.version <> c.version AND o.start_ns > c.hold_start_ns
    GROUP BY ALL
),
agent_last AS (  -- last span end of the holders that never refreshed
    SELECT s.run_id, s.agent_id, max(s.end_ns) AS last_ns
    FROM spans s
    SEMI JOIN (SELECT c.run_id, c.agent_id
               FROM candidates c ANTI JOIN ended e USING (run_id, agent_id, subject, version)) u
      ON s.run_id = u.run_id AND s.agent_id = u.agent_id
    WHERE {span_filter} AND s.agent_id IS NOT NULL
    GROUP BY ALL
),
superseding AS (
    SELECT c.*, e.end_span_id, e.end_ns, coalesce(e.end_ns, a.last_ns) AS hold_end_ns
    FROM candidates c
    LEFT JOIN ended e USING (run_id, agent_id, subject, version)
    LEFT JOIN agent_last a USING (run_id, agent_id)
),
stale AS (
    SELECT *, greatest(hold_start_ns, coalesce(least(newer_ns, flagged_ns), newer_ns, flagged_ns))
                  AS stale_from_ns
    FROM superseding
    WHERE NOT EXISTS (  -- the holder tried to write the subject itself: a write conflict
          SELECT 1 FROM spans w
          WHERE {span_filter}
            AND w.op = 'write' AND w.run_id = superseding.run_id AND w.agent_id = superseding.agent_id
            AND w.state_key = superseding.subject
            AND w.start_ns > superseding.hold_start_ns AND w.start_ns <= superseding.hold_end_ns)
),
held AS (
    SELECT * FROM stale st
    WHERE (st.stale_from_ns < st.hold_end_ns OR st.flagged_ns IS NOT NULL)
      AND ($agent::VARCHAR IS NULL OR st.agent_id = $agent::VARCHAR)
),
current AS (  -- newest version first seen when the holding ended
    SELECT f.run_id, f.agent_id, f.subject, f.version, arg_max(v.version, v.first_ns) AS current_version
    FROM held f
    JOIN version_first v ON v.run_id = f.run_id AND v.subject = f.subject AND v.first_ns <= f.hold_end_ns
    GROUP BY ALL
),
found AS (
    SELECT f.*, c.current_version FROM held f LEFT JOIN current c USING (run_id, agent_id, subject, version)
),
evidence AS (  -- every read of the held version by the holder, in time order
    SELECT f.run_id, f.agent_id, f.subject, f.version,
           list(o.SpanId ORDER BY o.start_ns) AS span_ids, min(o.TraceId) AS trace_id
    FROM found f
    JOIN obs o USING (run_id, agent_id, subject, version)
    WHERE NOT o.is_write
    GROUP BY ALL
)
SELECT ev.trace_id, ev.span_ids, f.run_id, f.agent_id AS agent, f.subject AS objective_id,
       f.version AS held_version, f.superseded_by, f.current_version,
       f.read_span_id, f.supersede_span_id,
       f.end_span_id IS NOT NULL AS refreshed,
       f.end_span_id AS refresh_span_id,
       make_timestamp(f.stale_from_ns // 1000) AS held_from,
       make_timestamp(f.hold_end_ns // 1000) AS held_until,
       (f.hold_end_ns - f.stale_from_ns) / 1e9 AS held_s,
       make_timestamp(f.hold_start_ns // 1000) AS first_seen,
       make_timestamp(f.hold_end_ns // 1000) AS last_seen
FROM found f
JOIN evidence ev USING (run_id, agent_id, subject, version)
ORDER BY first_seen, agent
