-- divergent_reads (split brain): two agents read the same version of a state key and each then
-- attempted a write of that key before either saw the other's write: each read happened before
-- the other agent's write, and neither re-read the key between its read and its own write. From
-- there on their views of the key diverge (one write is lost or rejected).
-- Performance: the per-agent ordering (a window) runs only over the keys of a run where such a
-- pair is possible at all: two agents read one version of it and two agents wrote it.
WITH all_touches AS NOT MATERIALIZED (  -- a pair compares run ids, so touches without a run never pair
    SELECT run_id, TraceId, SpanId, agent_id, state_key, state_version, op, Timestamp, start_ns,
           hash(run_id, state_key) AS h
    FROM spans
    WHERE {span_filter}
      AND state_key IS NOT NULL AND agent_id IS NOT NULL AND op IN ('read', 'write')
      AND run_id IS NOT NULL
),
shared_keys AS (  -- keys of a run two agents read at the same version and two agents wrote, by
                  -- a hash of (run, key) (cheaper to group than the strings; a collision only
                  -- lets the touches of a few more keys through, the pairs compare the columns)
    SELECT h FROM (
        SELECT h
        FROM all_touches
        WHERE op = 'read' AND state_version IS NOT NULL
        GROUP BY h, hash(state_version)
        HAVING min(agent_id) <> max(agent_id))
    INTERSECT
    SELECT h
    FROM all_touches
    WHERE op = 'write'
    GROUP BY h
    HAVING min(agent_id) <> max(agent_id)
),
touches AS (
    SELECT t.* EXCLUDE (h),
           lead(op) OVER w AS next_op, lead(SpanId) OVER w AS next_span,
           lead(start_ns) OVER w AS next_ns, lead(Timestamp) OVER w AS next_ts
    -- An inner join (shared_keys is distinct): as a SEMI JOIN DuckDB built its hash table on
    -- all touches at 10M spans (RIGHT_SEMI, 13 s); this way it builds on the few shared keys.
    FROM all_touches t JOIN shared_keys k USING (h)
    WINDOW w AS (PARTITION BY run_id, agent_id, state_key ORDER BY start_ns, SpanId)
),
read_then_write AS (  -- a read followed directly (for this agent and key) by a write attempt
    SELECT run_id, TraceId, agent_id, state_key, state_version AS version,
           SpanId AS read_span, start_ns AS read_ns, Timestamp AS read_ts,
           next_span AS write_span, next_ns AS write_ns, next_ts AS write_ts
    FROM touches
    WHERE op = 'read' AND next_op = 'write' AND state_version IS NOT NULL
),
pairs AS (
    SELECT a.run_id, a.TraceId, a.state_key, a.version,
           a.agent_id AS agent_a, b.agent_id AS agent_b,
           a.read_span AS read_a, b.read_span AS read_b, a.write_span AS write_a, b.write_span AS write_b,
           least(a.read_ts, b.read_ts) AS t0, greatest(a.write_ts, b.write_ts) AS t1
    FROM read_then_write a
    JOIN read_then_write b
      ON a.run_id = b.run_id AND a.state_key = b.state_key AND a.version = b.version
     AND a.agent_id < b.agent_id
     AND a.read_ns < b.write_ns AND b.read_ns < a.write_ns
)
SELECT min(TraceId) AS trace_id,
       list_sort(list_distinct(flatten(list([read_a, read_b, write_a, write_b])))) AS span_ids,
       run_id,
       [agent_a, agent_b] AS agents,
       state_key,
       version,
       list_sort(list_distinct(flatten(list([read_a, read_b])))) AS read_span_ids,
       list_sort(list_distinct(flatten(list([write_a, write_b])))) AS write_span_ids,
       min(t0) AS first_seen,
       max(t1) AS last_seen
FROM pairs
GROUP BY run_id, state_key, version, agent_a, agent_b
HAVING $agent::VARCHAR IS NULL OR $agent::VARCHAR IN (agent_a, agent_b)
ORDER BY first_seen, state_key, agents
