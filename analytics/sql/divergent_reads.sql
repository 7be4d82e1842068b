-- divergent_reads: different agents holding different versions of one state key at once.
-- A "holding" starts at an agent's read of the key and ends at that agent's next read or
-- successful write of the same key (it then holds something else), else at the agent's last
-- span in the run (it stops acting). Two reads diverge when their versions differ and their
-- holdings overlap in time: both agents acted on the key before either saw the other's version.
WITH s AS ({filtered_spans}),
touches AS (
    SELECT run_id, TraceId, SpanId, agent_id, state_key, state_version, op, Timestamp, start_ns
    FROM s
    WHERE state_key IS NOT NULL AND agent_id IS NOT NULL
      AND (op = 'read' OR (op = 'write' AND coalesce(outcome, 'ok') = 'ok'))
),
agent_last AS (
    SELECT run_id, agent_id, max(end_ns) AS last_ns FROM s WHERE agent_id IS NOT NULL GROUP BY ALL
),
holds AS (
    SELECT t.*,
           coalesce(lead(t.start_ns) OVER (PARTITION BY t.run_id, t.agent_id, t.state_key
                                           ORDER BY t.start_ns, t.SpanId),
                    a.last_ns) AS hold_end_ns
    FROM touches t JOIN agent_last a USING (run_id, agent_id)
),
reads AS (SELECT * FROM holds WHERE op = 'read' AND state_version IS NOT NULL),
pairs AS (
    SELECT a.run_id, a.state_key,
           a.agent_id AS agent_a, a.state_version AS version_a,
           b.agent_id AS agent_b, b.state_version AS version_b,
           a.TraceId AS trace_a, a.SpanId AS span_a, b.SpanId AS span_b,
           least(a.Timestamp, b.Timestamp) AS t0, greatest(a.Timestamp, b.Timestamp) AS t1,
           (least(a.hold_end_ns, b.hold_end_ns) - greatest(a.start_ns, b.start_ns)) / 1e9 AS overlap_s
    FROM reads a
    JOIN reads b
      ON a.run_id = b.run_id AND a.state_key = b.state_key
     AND a.agent_id < b.agent_id AND a.state_version <> b.state_version
     AND a.start_ns < b.hold_end_ns AND b.start_ns < a.hold_end_ns
)
SELECT min(trace_a) AS trace_id,
       list_sort(list_distinct(flatten(list([span_a, span_b])))) AS span_ids,
       run_id,
       [agent_a, agent_b] AS agents,
       state_key,
       agent_a, version_a, agent_b, version_b,
       max(overlap_s) AS overlap_s,
       min(t0) AS first_seen,
       max(t1) AS last_seen
FROM pairs
GROUP BY run_id, state_key, agent_a, version_a, agent_b, version_b
HAVING $agent::VARCHAR IS NULL OR $agent::VARCHAR IN (agent_a, agent_b)
ORDER BY first_seen, state_key, agent_a, agent_b
