-- run_actors: per run, every service that sent one of its spans and every agent that acted in it
-- or was handed a task in it. A maintained part (analytics.materialize): a service or agent
-- filter is answered from the findings tables of the runs it names.
SELECT DISTINCT run_id, kind, name FROM (
    SELECT run_id, 'service' AS kind, ServiceName AS name
    FROM spans WHERE {span_filter} AND run_id IS NOT NULL
  UNION ALL
    SELECT run_id, 'agent', agent_id
    FROM spans WHERE {span_filter} AND run_id IS NOT NULL AND agent_id IS NOT NULL
  UNION ALL
    SELECT run_id, 'agent', delegate_to
    FROM spans WHERE {span_filter} AND run_id IS NOT NULL AND delegate_to IS NOT NULL
)
ORDER BY run_id, kind, name
