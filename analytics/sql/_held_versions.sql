-- Shared fragment: every observation of a versioned subject by an agent, from the spans that
-- pass the shared filter. Subjects are objectives (driftscope.objective.id / .version on any
-- span) and shared-state keys (driftscope.state.key / .version on reads and successful writes),
-- so policies kept as objectives or as plain state both work. is_write marks a state write (it
-- supersedes; it is not a holding). Only the columns the detectors use are selected.
SELECT run_id, TraceId, SpanId, agent_id, objective_id AS subject, objective_version AS version,
       start_ns, coalesce(objective_superseded, false) AS flagged, false AS is_write
FROM spans
WHERE {span_filter} AND run_id IS NOT NULL
  AND objective_id IS NOT NULL AND objective_version IS NOT NULL AND agent_id IS NOT NULL
  AND coalesce(outcome, 'ok') <> 'rejected'
UNION ALL
SELECT run_id, TraceId, SpanId, agent_id, state_key, state_version, start_ns, false, op = 'write'
FROM spans
WHERE {span_filter} AND run_id IS NOT NULL
  AND op IN ('read', 'write') AND state_key IS NOT NULL AND state_version IS NOT NULL
  AND agent_id IS NOT NULL AND coalesce(outcome, 'ok') = 'ok'
