-- The runs of one crew (service) with spans in the window (issue 35): the runs a comparison's
-- baseline is chosen from, by their run_summary verdict.
SELECT DISTINCT run_id
FROM spans
WHERE {run_scope}
  AND run_id IS NOT NULL
