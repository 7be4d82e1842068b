-- ping_pong: maximal runs of consecutive delegations in a run that bounce between the same two
-- agents (A -> B, B -> A, A -> B, ...). Delegations are driftscope.op = 'delegate' spans that a
-- guard did not refuse.
WITH s AS ({filtered_spans}),
edges AS (
    SELECT TraceId, SpanId, run_id, agent_id AS src, delegate_to AS dst, Timestamp, start_ns
    FROM s
    WHERE op = 'delegate' AND agent_id IS NOT NULL AND delegate_to IS NOT NULL
      AND agent_id <> delegate_to AND coalesce(outcome, 'ok') <> 'rejected'
),
marked AS (
    SELECT *,
           CASE WHEN lag(dst) OVER w = src AND lag(src) OVER w = dst THEN 0 ELSE 1 END AS starts
    FROM edges
    WINDOW w AS (PARTITION BY run_id ORDER BY start_ns, SpanId)
),
islands AS (
    SELECT *, sum(starts) OVER (PARTITION BY run_id ORDER BY start_ns, SpanId) AS island
    FROM marked
)
SELECT min(TraceId) AS trace_id,
       list(SpanId ORDER BY start_ns, SpanId) AS span_ids,
       run_id,
       list_sort(list_distinct(flatten(list([src, dst])))) AS agents,
       count(*) AS delegations,
       count(*) // 2 AS round_trips,
       min(Timestamp) AS first_seen,
       max(Timestamp) AS last_seen
FROM islands
GROUP BY run_id, island
HAVING count(*) >= $min_delegations
   AND ($agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR))
ORDER BY first_seen
