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
WHERE ($since IS NULL OR Timestamp >= $since)
  AND ($until IS NULL OR Timestamp <= $until)
  AND ($service IS NULL OR ServiceName = $service)
  AND ($run IS NULL OR run_id = $run)
  -- agent / origin task select whole runs they took part in, so the run's totals stay whole
  AND ($agent IS NULL OR run_id IN (SELECT run_id FROM spans WHERE agent_id = $agent))
  AND ($origin_task IS NULL OR run_id IN (SELECT run_id FROM spans WHERE origin_task_id = $origin_task))
GROUP BY run_id
ORDER BY last_seen DESC
LIMIT $limit
