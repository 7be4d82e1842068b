-- enforcement_coverage: per service and tool, how many calls carry the guard fields
-- (versioned writes, structured delegation, policy version on sends, idempotency keys on side
-- effects) and how many match the unguarded anti-patterns.
WITH s AS ({filtered_spans}),
calls AS (
    SELECT *, coalesce(tool_name, CASE WHEN op IS NOT NULL THEN 'op:' || op END) AS tool
    FROM s
    WHERE (tool_name IS NOT NULL OR op IS NOT NULL)
      AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
),
per_tool AS (
    SELECT ServiceName AS service, tool AS tool_name,
           count(*) AS calls,
           count(*) FILTER (WHERE outcome IS NOT NULL OR guard IS NOT NULL)
               AS guarded_calls,
           count(*) FILTER (WHERE outcome = 'rejected') AS prevented,
           count(*) FILTER (WHERE op = 'write') AS writes,
           count(*) FILTER (WHERE op = 'write' AND state_expected_version IS NOT NULL) AS versioned_writes,
           count(*) FILTER (WHERE op = 'delegate') AS delegations,
           count(*) FILTER (WHERE op = 'delegate' AND task_id IS NOT NULL AND origin_task_id IS NOT NULL
                                AND constraints_carried IS NOT NULL) AS structured_delegations,
           count(*) FILTER (WHERE op = 'send') AS sends,
           count(*) FILTER (WHERE op = 'send' AND policy_version IS NOT NULL) AS sends_with_policy,
           count(*) FILTER (WHERE side_effect) AS side_effects,
           count(*) FILTER (WHERE side_effect AND idempotency_key IS NOT NULL) AS side_effects_with_key,
           coalesce(list_sort(list(DISTINCT agent_id) FILTER (WHERE agent_id IS NOT NULL)), []::VARCHAR[]) AS agents,
           coalesce(list_sort(list(DISTINCT reject_reason) FILTER (WHERE reject_reason IS NOT NULL)), []::VARCHAR[])
               AS prevented_reasons,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM calls
    GROUP BY ALL
)
SELECT *,
       (writes - versioned_writes) + (delegations - structured_delegations)
           + (sends - sends_with_policy) + (side_effects - side_effects_with_key) AS anti_patterns,
       CASE WHEN guarded_calls = 0 THEN 'watch_only'
            WHEN guarded_calls = calls
                 AND (writes - versioned_writes) + (delegations - structured_delegations)
                     + (sends - sends_with_policy) + (side_effects - side_effects_with_key) = 0
                THEN 'enforced'
            ELSE 'partial' END AS coverage
FROM per_tool
ORDER BY service, tool_name
