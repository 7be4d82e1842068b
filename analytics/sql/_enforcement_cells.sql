-- Shared fragment: the calls of each run (of the spans that pass the shared filter), grouped by
-- the few fields enforcement_coverage counts by (tens of combinations a run), with their number
-- and first and last call. enforcement_coverage.sql sums them over the runs; the materializer
-- keeps them per run (analytics.summary: enforcement_coverage_runs) and sums its table.
SELECT run_id, ServiceName AS service, tool_name, op, agent_id, reject_reason, outcome,
       guard IS NOT NULL AS has_guard,
       state_expected_version IS NOT NULL AS has_expected_version,
       task_id IS NOT NULL AND origin_task_id IS NOT NULL AND constraints_carried IS NOT NULL AS structured,
       policy_version IS NOT NULL AS has_policy,
       side_effect,
       idempotency_key IS NOT NULL AS has_key,
       count(*) AS n, min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
FROM spans
WHERE {span_filter}
  AND (tool_name IS NOT NULL OR op IS NOT NULL)
  AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
GROUP BY ALL
