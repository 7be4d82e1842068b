-- run_services: the crew (service) of each run in $run_list: the ServiceName of its first span.
-- analytics.crew_limits reads it to apply each crew's calibrated finding counts per run.
SELECT run_id, arg_min(ServiceName, Timestamp) AS service
FROM spans
WHERE run_id IN (SELECT unnest($run_list::VARCHAR[]))
GROUP BY run_id
