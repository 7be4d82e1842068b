-- alert_run_context: for each run in $run_list, its crew (the ServiceName of its first span) and
-- the start of its newest span. The alert evaluator labels alerts with the service and dates the
-- findings of detectors whose rows carry no time of their own.
SELECT run_id, arg_min(ServiceName, Timestamp) AS service, max(Timestamp) AS last_span
FROM spans
WHERE run_id IN (SELECT unnest($run_list::VARCHAR[]))
GROUP BY run_id
