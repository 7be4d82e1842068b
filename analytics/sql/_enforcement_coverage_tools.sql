-- enforcement_coverage's answer from its counts per run (enforcement_coverage_runs.sql, as
-- `parts`), run over those rows, not over spans (analytics.sql_loader.query_tables): counts
-- summed, the runs' distinct agents and reject reasons merged, first and last calls taken.
WITH per_tool AS (
    SELECT service, tool_name,
           sum(calls)::BIGINT AS calls,
           sum(guarded_calls)::BIGINT AS guarded_calls,
           sum(prevented)::BIGINT AS prevented,
           sum(writes)::BIGINT AS writes,
           sum(versioned_writes)::BIGINT AS versioned_writes,
           sum(delegations)::BIGINT AS delegations,
           sum(structured_delegations)::BIGINT AS structured_delegations,
           sum(sends)::BIGINT AS sends,
           sum(sends_with_policy)::BIGINT AS sends_with_policy,
           sum(side_effects)::BIGINT AS side_effects,
           sum(side_effects_with_key)::BIGINT AS side_effects_with_key,
           coalesce(list_sort(list_distinct(flatten(list(agents)))), []::VARCHAR[]) AS agents,
           coalesce(list_sort(list_distinct(flatten(list(prevented_reasons)))), []::VARCHAR[]) AS prevented_reasons,
           min(first_seen) AS first_seen, max(last_seen) AS last_seen
    FROM parts
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
