-- One row per run (conversation id) with spans in the window, newest first.
SELECT
    run_id,
    min(Timestamp)                                   AS first_seen,
    max(Timestamp)                                   AS last_seen,
    count(*)                                         AS spans,
    count(DISTINCT TraceId)                          AS traces,
    list_sort(list_distinct(list(agent_id) FILTER (WHERE agent_id IS NOT NULL))) AS agents,
    list_sort(list_distinct(list(ServiceName)))      AS services,
    count(*) FILTER (WHERE outcome = 'rejected')     AS rejected,
    count(*) FILTER (WHERE outcome = 'error' OR StatusCode = 'Error') AS errors,
    max(hop)                                         AS max_hop,
    any_value(scenario) AS scenario
FROM spans
WHERE {run_scope}
  AND ($runs::VARCHAR[] IS NULL OR run_id IN (SELECT unnest($runs::VARCHAR[])))
GROUP BY run_id
ORDER BY last_seen DESC, run_id
LIMIT $limit
