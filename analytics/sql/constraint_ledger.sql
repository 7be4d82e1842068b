-- constraint_ledger: the constraint x hop matrix of every origin task.
-- A (constraint, hop) cell's status comes from its cells; its evidence (spans, agents, times) is
-- the hop's delegations, which every constraint of the task has a cell at: aggregated once per
-- hop from the delegations, not once per constraint from the cells.
WITH cells AS ({constraint_cells}),
flags AS (
    SELECT origin_task_id, constraint_id, hop,
           CASE WHEN bool_or(unwaived_drop) THEN 'missing'
                WHEN bool_or(status = 'waived') THEN 'waived'
                WHEN bool_or(status = 'missing') THEN 'missing_after_waiver'
                ELSE 'carried' END AS status,
           bool_or(unwaived_drop) AS unwaived_drop,
           -- the reasons in order, so every engine and run joins them alike
           CASE WHEN count(waiver_reason) > 0 THEN
               array_to_string(list_sort(list(DISTINCT waiver_reason) FILTER (WHERE waiver_reason IS NOT NULL)), '; ')
           END AS waiver_reason,
           max(last_hop_seen) AS last_hop_seen
    FROM cells
    GROUP BY origin_task_id, constraint_id, hop
),
hops AS (
    SELECT origin_task_id, hop,
           min(TraceId) AS trace_id,
           min(run_id) AS run_id,
           list_sort(list(DISTINCT SpanId)) AS span_ids,
           coalesce(list_sort(list(DISTINCT agent_id) FILTER (WHERE agent_id IS NOT NULL)), []::VARCHAR[]) AS agents,
           coalesce(list_sort(list(DISTINCT delegate_to) FILTER (WHERE delegate_to IS NOT NULL)), []::VARCHAR[]) AS delegate_to,
           min(Timestamp) AS first_seen,
           max(Timestamp) AS last_seen
    FROM ({constraint_delegations}) AS deleg
    GROUP BY origin_task_id, hop
),
agg AS (
    SELECT f.origin_task_id, f.constraint_id, f.hop, f.status, f.unwaived_drop, f.waiver_reason,
           f.last_hop_seen, h.trace_id, h.run_id, h.span_ids, h.agents, h.delegate_to,
           h.first_seen, h.last_seen
    FROM flags f JOIN hops h USING (origin_task_id, hop)
)
SELECT * FROM agg
WHERE $agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR)
   OR list_contains(delegate_to, $agent::VARCHAR)
ORDER BY origin_task_id, constraint_id, hop
