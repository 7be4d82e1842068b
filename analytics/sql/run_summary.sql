-- run_summary (base): per run, its agents, hops, spans, traces, errors and rejections.
WITH s AS ({filtered_spans})
SELECT run_id,
       min(TraceId) AS trace_id,
       coalesce(list_sort(list(DISTINCT agent_id) FILTER (WHERE agent_id IS NOT NULL)), []::VARCHAR[]) AS agents,
       coalesce(max(hop), 0) AS hops,
       count(*) AS spans,
       count(DISTINCT TraceId) AS traces,
       count(*) FILTER (WHERE outcome = 'error' OR StatusCode = 'Error') AS errors,
       count(*) FILTER (WHERE outcome = 'rejected') AS rejections,
       min(Timestamp) AS first_seen,
       max(Timestamp) AS last_seen
FROM s
WHERE run_id IS NOT NULL
GROUP BY run_id
HAVING $agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR)
ORDER BY first_seen, run_id
