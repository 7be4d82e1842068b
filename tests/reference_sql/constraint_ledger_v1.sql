-- constraint_ledger as it was before the hop's evidence came from its delegations (the
-- aggregates over every (constraint, delegation) cell), for tests/analytics/test_shapes_reference.py.
-- constraint_ledger: the constraint x hop matrix of every origin task.
WITH cells AS ({constraint_cells}),
agg AS (
    SELECT origin_task_id, constraint_id, hop,
           CASE WHEN bool_or(unwaived_drop) THEN 'missing'
                WHEN bool_or(status = 'waived') THEN 'waived'
                WHEN bool_or(status = 'missing') THEN 'missing_after_waiver'
                ELSE 'carried' END AS status,
           bool_or(unwaived_drop) AS unwaived_drop,
           string_agg(DISTINCT waiver_reason, '; ') AS waiver_reason,
           max(last_hop_seen) AS last_hop_seen,
           min(TraceId) AS trace_id,
           min(run_id) AS run_id,
           list_sort(list(DISTINCT SpanId)) AS span_ids,
           coalesce(list_sort(list(DISTINCT agent_id) FILTER (WHERE agent_id IS NOT NULL)), []::VARCHAR[]) AS agents,
           coalesce(list_sort(list(DISTINCT delegate_to) FILTER (WHERE delegate_to IS NOT NULL)), []::VARCHAR[]) AS delegate_to,
           min(Timestamp) AS first_seen,
           max(Timestamp) AS last_seen
    FROM cells
    GROUP BY origin_task_id, constraint_id, hop
)
SELECT * FROM agg
WHERE $agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR)
   OR list_contains(delegate_to, $agent::VARCHAR)
ORDER BY origin_task_id, constraint_id, hop
