-- Every run in scope with its span counts, newest first: one narrow row per run, so the
-- dashboard's tiles and run charts stay complete however many runs there are.
SELECT run_id,
       count(*) AS spans,
       count(*) FILTER (WHERE outcome = 'rejected') AS rejected,
       count(*) FILTER (WHERE outcome = 'error' OR StatusCode = 'Error') AS errors,
       min(Timestamp) AS first_seen,
       max(Timestamp) AS last_seen
FROM spans
WHERE run_id IS NOT NULL AND {run_scope}
GROUP BY run_id
ORDER BY last_seen DESC, run_id
