-- lost_updates: a successful write that replaced another agent's write which nobody else read,
-- while being unversioned (no expected version) or based on an already superseded version.
-- Performance: writes are ordered (a window) only for keys of a run that two writers wrote.
WITH ok_writes AS NOT MATERIALIZED (
    SELECT TraceId, SpanId, run_id, agent_id, state_key, state_version, state_expected_version,
           Timestamp, start_ns, hash(run_id, state_key) AS h  -- writes without a run: one h per key
    FROM spans
    WHERE {span_filter}
      AND op = 'write' AND state_key IS NOT NULL AND coalesce(outcome, 'ok') = 'ok'
      AND StatusCode <> 'Error'
),
contested AS (  -- keys of a run written by more than one agent (NULL counts as an agent), by the
                -- hash of (run, key): a collision only lets a few more writes through
    SELECT h
    FROM ok_writes
    GROUP BY h
    HAVING min(agent_id) <> max(agent_id) OR (count(agent_id) > 0 AND count(agent_id) < count(*))
),
writes AS (
    SELECT w.* EXCLUDE (h),
           lag(agent_id) OVER w AS prev_agent,
           lag(state_version) OVER w AS prev_version,
           lag(SpanId) OVER w AS prev_span,
           lag(Timestamp) OVER w AS prev_ts,
           lag(start_ns) OVER w AS prev_start_ns,
           -- the previous writer again, never NULL, for the correlated read below: ClickHouse
           -- (26.9) sees an outer NULL as a value there (`o.x IS NULL` is false inside the subquery)
           lag(agent_id) OVER w IS NULL AS prev_agentless,
           coalesce(lag(agent_id) OVER w, '') AS prev_agent_key
    FROM ok_writes w
    JOIN contested c USING (h)  -- contested is distinct; writes without a run form one partition
    WINDOW w AS (PARTITION BY h, run_id, state_key ORDER BY start_ns, SpanId)
),
lost AS (
    SELECT o.*
    FROM writes o
    WHERE o.prev_span IS NOT NULL
      AND o.prev_agent IS DISTINCT FROM o.agent_id
      AND (o.state_expected_version IS NULL OR o.state_expected_version IS DISTINCT FROM o.prev_version)
      AND (o.prev_version IS NULL  -- no read matches a NULL version
           OR NOT EXISTS (  -- read by an agent other than the previous writer, in between
          SELECT 1 FROM spans r
          WHERE {span_filter}
            AND r.op = 'read' AND r.run_id = o.run_id AND r.state_key = o.state_key
            AND r.state_version = o.prev_version
            AND CASE WHEN o.prev_agentless THEN r.agent_id IS NOT NULL
                     ELSE r.agent_id IS DISTINCT FROM o.prev_agent_key END
            AND r.start_ns > o.prev_start_ns AND r.start_ns < o.start_ns))
)
SELECT TraceId AS trace_id,
       [prev_span, SpanId] AS span_ids,
       run_id,
       [prev_agent, agent_id] AS agents,
       state_key,
       agent_id AS agent,
       state_version AS written_version,
       state_expected_version AS expected_version,
       CASE WHEN state_expected_version IS NULL THEN 'unversioned' ELSE 'stale_base' END AS kind,
       prev_agent AS clobbered_agent,
       prev_version AS clobbered_version,
       prev_ts AS first_seen,
       Timestamp AS last_seen
FROM lost
WHERE $agent::VARCHAR IS NULL OR $agent::VARCHAR IN (agent_id, prev_agent)
ORDER BY first_seen, state_key, run_id, last_seen, span_ids  -- the last three only break ties
