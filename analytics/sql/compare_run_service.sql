-- The crew (service) of one run: the service most of its spans name (issue 35), with its span
-- count and first and last span.
SELECT ServiceName AS service, count(*) AS spans, min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
FROM spans
WHERE run_id = $run
GROUP BY ServiceName
ORDER BY count(*) DESC, ServiceName
LIMIT 1
