-- enforcement_coverage per run: enforcement_coverage.sql's counts per run, service and tool.
-- After a batch analytics.summary sums them per service and tool (_enforcement_coverage_tools.sql)
-- from the rows kept with its result, with the touched runs counted again
-- (analytics.kept.keeps_parts); equal to enforcement_coverage.sql over every run
-- (tests/analytics/test_kept.py, test_summary.py: after every random batch).
WITH cells AS (  -- one row per combination of the fields counted below
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
)
SELECT run_id, service,
       coalesce(tool_name, CASE WHEN op IS NOT NULL THEN 'op:' || op END) AS tool_name,
       sum(n)::BIGINT AS calls,
       coalesce(sum(n) FILTER (WHERE outcome IS NOT NULL OR has_guard), 0)::BIGINT AS guarded_calls,
       coalesce(sum(n) FILTER (WHERE outcome = 'rejected'), 0)::BIGINT AS prevented,
       coalesce(sum(n) FILTER (WHERE op = 'write'), 0)::BIGINT AS writes,
       coalesce(sum(n) FILTER (WHERE op = 'write' AND has_expected_version), 0)::BIGINT AS versioned_writes,
       coalesce(sum(n) FILTER (WHERE op = 'delegate'), 0)::BIGINT AS delegations,
       coalesce(sum(n) FILTER (WHERE op = 'delegate' AND structured), 0)::BIGINT AS structured_delegations,
       coalesce(sum(n) FILTER (WHERE op = 'send'), 0)::BIGINT AS sends,
       coalesce(sum(n) FILTER (WHERE op = 'send' AND has_policy), 0)::BIGINT AS sends_with_policy,
       coalesce(sum(n) FILTER (WHERE side_effect), 0)::BIGINT AS side_effects,
       coalesce(sum(n) FILTER (WHERE side_effect AND has_key), 0)::BIGINT AS side_effects_with_key,
       list_sort(list(DISTINCT agent_id) FILTER (WHERE agent_id IS NOT NULL)) AS agents,
       list_sort(list(DISTINCT reject_reason) FILTER (WHERE reject_reason IS NOT NULL)) AS prevented_reasons,
       min(first_seen) AS first_seen, max(last_seen) AS last_seen
FROM cells
GROUP BY 1, 2, 3
