-- context_drift_holders: agents that kept holding a version of an objective (or of a shared
-- state key such as a policy) after another agent superseded it.
-- A holding starts at an agent's first read of a version and ends at its next observation of the
-- subject with another version (a refresh), else at its last span in the run. A version is
-- superseded when a version first seen after it appears (or a span flags it superseded). A
-- holder that itself tried to write the subject while holding (accepted or refused) is in a
-- write conflict (lost_updates / divergent_reads), not context drift, and is left out.
WITH s AS ({filtered_spans}),
obs AS ({held_versions}),
version_first AS (
    SELECT run_id, subject, version, min(start_ns) AS first_ns, arg_min(SpanId, start_ns) AS first_span
    FROM obs GROUP BY ALL
),
agent_last AS (
    SELECT run_id, agent_id, max(end_ns) AS last_ns FROM s WHERE agent_id IS NOT NULL GROUP BY ALL
),
holds AS (
    SELECT run_id, agent_id, subject, version,
           min(start_ns) AS hold_start_ns,
           arg_min(SpanId, start_ns) AS read_span_id,
           min(start_ns) FILTER (WHERE flagged) AS flagged_ns,
           list(SpanId ORDER BY start_ns) AS span_ids,
           min(TraceId) AS trace_id
    FROM obs WHERE NOT is_write GROUP BY ALL
),
ended AS (
    SELECT h.*,
           (SELECT arg_min(o.SpanId, o.start_ns) FROM obs o
             WHERE o.run_id = h.run_id AND o.agent_id = h.agent_id AND o.subject = h.subject
               AND o.version <> h.version AND o.start_ns > h.hold_start_ns) AS end_span_id,
           (SELECT min(o.start_ns) FROM obs o
             WHERE o.run_id = h.run_id AND o.agent_id = h.agent_id AND o.subject = h.subject
               AND o.version <> h.version AND o.start_ns > h.hold_start_ns) AS end_ns
    FROM holds h
),
superseding AS (
    SELECT e.*, coalesce(e.end_ns, a.last_ns) AS hold_end_ns,
           (SELECT arg_min(v.version, v.first_ns) FROM version_first v JOIN version_first mine
                ON mine.run_id = v.run_id AND mine.subject = v.subject
             WHERE v.run_id = e.run_id AND v.subject = e.subject AND mine.version = e.version
               AND v.first_ns > mine.first_ns) AS superseded_by,
           (SELECT arg_min(v.first_span, v.first_ns) FROM version_first v JOIN version_first mine
                ON mine.run_id = v.run_id AND mine.subject = v.subject
             WHERE v.run_id = e.run_id AND v.subject = e.subject AND mine.version = e.version
               AND v.first_ns > mine.first_ns) AS supersede_span_id,
           (SELECT min(v.first_ns) FROM version_first v JOIN version_first mine
                ON mine.run_id = v.run_id AND mine.subject = v.subject
             WHERE v.run_id = e.run_id AND v.subject = e.subject AND mine.version = e.version
               AND v.first_ns > mine.first_ns) AS newer_ns
    FROM ended e JOIN agent_last a USING (run_id, agent_id)
),
stale AS (
    SELECT *, greatest(hold_start_ns, coalesce(least(newer_ns, flagged_ns), newer_ns, flagged_ns))
                  AS stale_from_ns
    FROM superseding
    WHERE coalesce(newer_ns, flagged_ns) IS NOT NULL
      AND NOT EXISTS (  -- the holder tried to write the subject itself: a write conflict
          SELECT 1 FROM s w
          WHERE w.op = 'write' AND w.run_id = superseding.run_id AND w.agent_id = superseding.agent_id
            AND w.state_key = superseding.subject
            AND w.start_ns > superseding.hold_start_ns AND w.start_ns <= superseding.hold_end_ns)
)
SELECT trace_id, span_ids, run_id, agent_id AS agent, subject AS objective_id,
       version AS held_version, superseded_by,
       (SELECT arg_max(v.version, v.first_ns) FROM version_first v
         WHERE v.run_id = stale.run_id AND v.subject = stale.subject AND v.first_ns <= hold_end_ns)
           AS current_version,
       read_span_id, supersede_span_id,
       end_span_id IS NOT NULL AS refreshed,
       end_span_id AS refresh_span_id,
       make_timestamp(stale_from_ns // 1000) AS held_from,
       make_timestamp(hold_end_ns // 1000) AS held_until,
       (hold_end_ns - stale_from_ns) / 1e9 AS held_s,
       make_timestamp(hold_start_ns // 1000) AS first_seen,
       make_timestamp(hold_end_ns // 1000) AS last_seen
FROM stale
WHERE (stale_from_ns < hold_end_ns OR flagged_ns IS NOT NULL)
  AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
ORDER BY first_seen, agent
