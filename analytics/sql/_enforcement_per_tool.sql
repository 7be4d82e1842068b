-- Shared fragment: enforcement_coverage's rows from ``run_cells`` (_enforcement_cells.sql's
-- rows, of every run): the combinations summed over the runs, then each count a sum over them.
cells AS (
    SELECT * EXCLUDE (run_id, n, first_seen, last_seen),
           sum(n) AS n, min(first_seen) AS first_seen, max(last_seen) AS last_seen
    FROM run_cells
    GROUP BY ALL
),
per_tool AS (
    SELECT service,
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
           coalesce(list_sort(list(DISTINCT agent_id) FILTER (WHERE agent_id IS NOT NULL)), []::VARCHAR[]) AS agents,
           coalesce(list_sort(list(DISTINCT reject_reason) FILTER (WHERE reject_reason IS NOT NULL)), []::VARCHAR[])
               AS prevented_reasons,
           min(first_seen) AS first_seen, max(last_seen) AS last_seen
    FROM cells
    GROUP BY 1, 2
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
