-- run_summary (base): per run, its agents, hops, spans, traces, errors and rejections, and what
-- its framework did not record (analytics.coverage): tool calls without arguments, sub-agent
-- invocations (agent spans at hop 1+) without a task, and the instrumentation scope that left
-- them out.
-- Distinct agents and traces come from their own narrow DISTINCT scans (a DISTINCT aggregate
-- next to the others made DuckDB materialize every span of the window first).
WITH runs AS (
    SELECT run_id,
           min(TraceId) AS trace_id,
           coalesce(max(hop), 0) AS hops,
           count(*) AS spans,
           count(*) FILTER (WHERE outcome = 'error' OR StatusCode = 'Error') AS errors,
           count(*) FILTER (WHERE outcome = 'rejected') AS rejections,
           count(*) FILTER (WHERE tool_name IS NOT NULL AND coalesce(op, '') NOT IN ('delegate', 'objective'))
               AS tool_calls,
           count(*) FILTER (WHERE tool_name IS NOT NULL AND coalesce(op, '') NOT IN ('delegate', 'objective')
                              AND tool_args IS NULL) AS tool_calls_unrecorded,
           count(*) FILTER (WHERE span_family = 'agent' AND hop > 0 AND input_text IS NULL) AS tasks_unrecorded,
           min(ScopeName) FILTER (WHERE (tool_name IS NOT NULL AND tool_args IS NULL
                                               AND coalesce(op, '') NOT IN ('delegate', 'objective'))
                                           OR (span_family = 'agent' AND hop > 0 AND input_text IS NULL))
               AS unrecorded_scope,
           min(Timestamp) AS first_seen,
           max(Timestamp) AS last_seen
    FROM spans
    WHERE {span_filter} AND run_id IS NOT NULL
    GROUP BY run_id
),
run_agents AS (
    SELECT run_id, list_sort(list(agent_id)) AS agents
    FROM (SELECT DISTINCT run_id, agent_id FROM spans
          WHERE {span_filter} AND run_id IS NOT NULL AND agent_id IS NOT NULL)
    GROUP BY run_id
),
run_traces AS (
    SELECT run_id, count(*) AS traces
    FROM (SELECT DISTINCT run_id, TraceId FROM spans WHERE {span_filter} AND run_id IS NOT NULL)
    GROUP BY run_id
)
SELECT r.run_id, r.trace_id, coalesce(a.agents, []::VARCHAR[]) AS agents, r.hops, r.spans,
       t.traces, r.errors, r.rejections, r.tool_calls, r.tool_calls_unrecorded, r.tasks_unrecorded,
       r.unrecorded_scope, r.first_seen, r.last_seen
FROM runs r
JOIN run_traces t USING (run_id)
LEFT JOIN run_agents a USING (run_id)
WHERE $agent::VARCHAR IS NULL OR list_contains(coalesce(a.agents, []::VARCHAR[]), $agent::VARCHAR)
ORDER BY r.first_seen, r.run_id
