-- goal_rescored_runs: the runs with a subtask whose raw statement is one of $subtasks (pairs
-- that just got a stored score), logged with the scores as a 'rescore' change
-- (analytics.goal_refresh) so the goal results recompute them. A subtask's statement is a
-- span's goal_text (driftscope) or a nested agent span's input (inferred, _goal_subtasks.sql):
-- every run that has such a span, a superset of the runs whose goal rows the scores change.
SELECT DISTINCT run_id
FROM spans
WHERE run_id IS NOT NULL
  AND (goal_text IN (SELECT unnest($subtasks::VARCHAR[]))
       OR (span_family = 'agent' AND input_text IN (SELECT unnest($subtasks::VARCHAR[]))))
