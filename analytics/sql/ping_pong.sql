-- ping_pong: maximal runs of consecutive hand-offs in a run that bounce between the same two
-- agents (A -> B, B -> A, A -> B, ...).
-- driftscope runs: hand-offs are driftscope.op = 'delegate' spans a guard did not refuse.
-- Other runs (OpenInference / OpenLLMetry, no delegate spans): a hand-off is a change of agent
-- between consecutive agent turns (agent spans, by start time); since a supervisor legitimately
-- returns to a worker once, these need $min_inferred hand-offs instead of $min_delegations.
WITH s AS ({filtered_spans}),
delegating_runs AS (SELECT DISTINCT run_id FROM s WHERE op = 'delegate'),
explicit AS (
    SELECT TraceId, SpanId, run_id, agent_id AS src, delegate_to AS dst, Timestamp, start_ns,
           'driftscope' AS source
    FROM s
    WHERE op = 'delegate' AND agent_id IS NOT NULL AND delegate_to IS NOT NULL
      AND agent_id <> delegate_to AND coalesce(outcome, 'ok') <> 'rejected'
),
turns AS (
    SELECT TraceId, SpanId, run_id, Timestamp, start_ns,
           coalesce(agent_id, graph_node_id, SpanName) AS agent,
           lag(coalesce(agent_id, graph_node_id, SpanName))
               OVER (PARTITION BY run_id ORDER BY start_ns, SpanId) AS previous_agent
    FROM s
    WHERE (span_family = 'agent' OR operation = 'invoke_agent')
      AND run_id NOT IN (SELECT run_id FROM delegating_runs)
),
inferred AS (
    SELECT TraceId, SpanId, run_id, previous_agent AS src, agent AS dst, Timestamp, start_ns,
           'inferred' AS source
    FROM turns
    WHERE previous_agent IS NOT NULL AND previous_agent <> agent
),
edges AS (SELECT * FROM explicit UNION ALL SELECT * FROM inferred),
marked AS (
    SELECT *,
           CASE WHEN lag(dst) OVER w = src AND lag(src) OVER w = dst THEN 0 ELSE 1 END AS starts
    FROM edges
    WINDOW w AS (PARTITION BY run_id, source ORDER BY start_ns, SpanId)
),
islands AS (
    SELECT *, sum(starts) OVER (PARTITION BY run_id, source ORDER BY start_ns, SpanId) AS island
    FROM marked
)
SELECT min(TraceId) AS trace_id,
       list(SpanId ORDER BY start_ns, SpanId) AS span_ids,
       run_id,
       list_sort(list_distinct(flatten(list([src, dst])))) AS agents,
       count(*) AS delegations,
       count(*) // 2 AS round_trips,
       source,
       min(Timestamp) AS first_seen,
       max(Timestamp) AS last_seen
FROM islands
GROUP BY run_id, source, island
HAVING count(*) >= CASE WHEN source = 'inferred' THEN $min_inferred ELSE $min_delegations END
   AND ($agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR))
ORDER BY first_seen
