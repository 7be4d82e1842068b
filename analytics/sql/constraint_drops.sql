-- constraint_drops: the first hop where a constraint disappeared without a waiver.
WITH cells AS ({constraint_cells}),
first_drop AS (
    SELECT origin_task_id, constraint_id, min(hop) AS hop
    FROM cells WHERE unwaived_drop GROUP BY ALL
)
SELECT c.origin_task_id, c.constraint_id, c.hop,
       min(c.TraceId) AS trace_id,
       list_sort(list(DISTINCT c.SpanId)) AS span_ids,
       min(c.run_id) AS run_id,
       coalesce(list_sort(list(DISTINCT c.agent_id) FILTER (WHERE c.agent_id IS NOT NULL)), []::VARCHAR[]) AS agents,
       min(c.agent_id) AS agent,
       coalesce(list_sort(list(DISTINCT c.delegate_to) FILTER (WHERE c.delegate_to IS NOT NULL)), []::VARCHAR[]) AS delegate_to,
       max(c.last_hop_seen) AS last_hop_seen,
       min(c.Timestamp) AS first_seen,
       max(c.Timestamp) AS last_seen
FROM cells c JOIN first_drop f USING (origin_task_id, constraint_id, hop)
WHERE c.unwaived_drop
GROUP BY c.origin_task_id, c.constraint_id, c.hop
HAVING $agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR)
ORDER BY c.origin_task_id, c.constraint_id
