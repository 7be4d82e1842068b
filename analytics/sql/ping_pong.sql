-- ping_pong: maximal runs of consecutive hand-offs in a run that bounce between the same two
-- agents (A -> B, B -> A, A -> B, ...).
-- driftscope runs: hand-offs are driftscope.op = 'delegate' spans a guard did not refuse.
-- Other runs (OpenInference / OpenLLMetry, no delegate spans): a hand-off is a change of agent
-- between consecutive agent turns (agent spans, by start time); since a supervisor legitimately
-- returns to a worker once, these need $min_inferred hand-offs instead of $min_delegations.
-- Cost: every hand-off of a cycle is between one pair of agents, so only runs where some pair
-- has enough hand-offs (counted over a few narrow columns) are read in full and ordered.
WITH delegations AS NOT MATERIALIZED (  -- scanned per use (narrow columns, conditions pushed down)
    SELECT run_id, agent_id, delegate_to, outcome
    FROM spans
    WHERE {span_filter} AND op = 'delegate'
),
delegating_runs AS (SELECT DISTINCT run_id FROM delegations),
explicit_busy AS (  -- runs where one pair of agents has enough hand-offs for a cycle (n alternating
                    -- hand-offs are n // 2 or more each way); by hash, so a NULL run is one
                    -- partition as in the windows below
    -- grouped by hashes of the run and the pair: a collision only adds up two pairs of a run
    -- (their counts), which can only let a few more runs through
    SELECT DISTINCT hash(run_id) AS h
    FROM delegations
    WHERE agent_id IS NOT NULL AND delegate_to IS NOT NULL
      AND agent_id <> delegate_to AND coalesce(outcome, 'ok') <> 'rejected'
    GROUP BY hash(run_id), hash(least(agent_id, delegate_to), greatest(agent_id, delegate_to))
    HAVING count(*) FILTER (WHERE agent_id < delegate_to) >= $min_delegations // 2
       AND count(*) FILTER (WHERE agent_id > delegate_to) >= $min_delegations // 2
),
explicit AS (
    SELECT TraceId, SpanId, run_id, agent_id AS src, delegate_to AS dst, Timestamp, start_ns,
           'driftscope' AS source
    FROM spans
    WHERE {span_filter} AND op = 'delegate' AND agent_id IS NOT NULL AND delegate_to IS NOT NULL
      AND agent_id <> delegate_to AND coalesce(outcome, 'ok') <> 'rejected'
      AND hash(run_id) IN (SELECT h FROM explicit_busy)
),
agent_turns AS (  -- two scans, so each one's condition is pushed into it
    SELECT TraceId, SpanId, run_id, Timestamp, start_ns, agent_id, graph_node_id, SpanName
    FROM spans
    WHERE {span_filter} AND span_family = 'agent'
    UNION ALL
    SELECT TraceId, SpanId, run_id, Timestamp, start_ns, agent_id, graph_node_id, SpanName
    FROM spans
    WHERE {span_filter} AND operation = 'invoke_agent' AND span_family IS DISTINCT FROM 'agent'
),
turns AS (
    SELECT TraceId, SpanId, run_id, Timestamp, start_ns,
           coalesce(agent_id, graph_node_id, SpanName) AS agent,
           lag(coalesce(agent_id, graph_node_id, SpanName))
               OVER (PARTITION BY run_id ORDER BY start_ns, SpanId) AS previous_agent
    FROM agent_turns
    WHERE run_id NOT IN (SELECT run_id FROM delegating_runs)
),
inferred AS (
    SELECT TraceId, SpanId, run_id, previous_agent AS src, agent AS dst, Timestamp, start_ns,
           'inferred' AS source
    FROM turns
    WHERE previous_agent IS NOT NULL AND previous_agent <> agent
),
inferred_busy AS (
    SELECT DISTINCT hash(run_id) AS h
    FROM inferred
    GROUP BY hash(run_id), least(src, dst), greatest(src, dst)
    HAVING count(*) FILTER (WHERE src < dst) >= $min_inferred // 2
       AND count(*) FILTER (WHERE src > dst) >= $min_inferred // 2
),
edges AS (
    SELECT * FROM explicit
    UNION ALL
    SELECT * FROM inferred WHERE hash(run_id) IN (SELECT h FROM inferred_busy)
),
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
