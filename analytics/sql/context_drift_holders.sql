-- context_drift_holders: agents that kept holding an objective version after it was superseded.
-- An agent holds the objective version carried by its spans (driftscope.objective.*) from its
-- first such span until its first later span with another version, else its last span in the
-- run. A version is superseded once a version first seen after it appears in the run, or when a
-- span flags it (driftscope.objective.superseded = true).
WITH s AS ({filtered_spans}),
obj AS (
    SELECT * FROM s
    WHERE objective_id IS NOT NULL AND objective_version IS NOT NULL AND agent_id IS NOT NULL
),
version_first AS (
    SELECT run_id, objective_id, objective_version, min(start_ns) AS first_ns
    FROM s WHERE objective_id IS NOT NULL AND objective_version IS NOT NULL
    GROUP BY ALL
),
agent_last AS (
    SELECT run_id, agent_id, max(end_ns) AS last_ns FROM s WHERE agent_id IS NOT NULL GROUP BY ALL
),
holds AS (
    SELECT run_id, agent_id, objective_id, objective_version,
           min(start_ns) AS hold_start_ns,
           min(start_ns) FILTER (WHERE objective_superseded) AS flagged_ns,
           list(SpanId ORDER BY start_ns) AS span_ids,
           min(TraceId) AS trace_id
    FROM obj GROUP BY ALL
),
bounded AS (
    SELECT h.*,
           coalesce((SELECT min(o.start_ns) FROM obj o
                      WHERE o.run_id = h.run_id AND o.agent_id = h.agent_id
                        AND o.objective_id = h.objective_id
                        AND o.objective_version <> h.objective_version
                        AND o.start_ns > h.hold_start_ns),
                    a.last_ns) AS hold_end_ns,
           (SELECT min(v.first_ns) FROM version_first v JOIN version_first mine
                ON mine.run_id = v.run_id AND mine.objective_id = v.objective_id
             WHERE v.run_id = h.run_id AND v.objective_id = h.objective_id
               AND mine.objective_version = h.objective_version
               AND v.first_ns > mine.first_ns) AS newer_ns,
           (SELECT arg_min(v.objective_version, v.first_ns) FROM version_first v JOIN version_first mine
                ON mine.run_id = v.run_id AND mine.objective_id = v.objective_id
             WHERE v.run_id = h.run_id AND v.objective_id = h.objective_id
               AND mine.objective_version = h.objective_version
               AND v.first_ns > mine.first_ns) AS superseded_by
    FROM holds h JOIN agent_last a USING (run_id, agent_id)
),
stale AS (
    SELECT *, greatest(hold_start_ns, least(coalesce(newer_ns, flagged_ns), coalesce(flagged_ns, newer_ns)))
                  AS stale_from_ns
    FROM bounded
    WHERE coalesce(newer_ns, flagged_ns) IS NOT NULL
)
SELECT trace_id, span_ids, run_id, agent_id AS agent, objective_id,
       objective_version AS held_version, superseded_by,
       make_timestamp(stale_from_ns // 1000) AS held_from,
       make_timestamp(hold_end_ns // 1000) AS held_until,
       (hold_end_ns - stale_from_ns) / 1e9 AS held_s,
       make_timestamp(hold_start_ns // 1000) AS first_seen,
       make_timestamp(hold_end_ns // 1000) AS last_seen
FROM stale
WHERE (stale_from_ns < hold_end_ns OR flagged_ns IS NOT NULL)
  AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
ORDER BY first_seen, agent
