-- goal_divergence_runs (a part kept per run, not a detector): the scored subtasks of each run in
-- the filter counted per (chain, hop, divergence, subtask statement): _goal_subtask_counts.sql's
-- rows. goal_divergence_distribution is their sum over every run (analytics.goals) with the
-- subtasks of no run (this statement with its span filter limited to spans of no run).
-- `pending` as in goal_divergence_distribution.
WITH {goal_subtasks},
{goal_subtask_counts}
SELECT c.run_id, c.chain, c.hop, c.divergence, c.subtask, c.subtasks, n.pending
FROM (SELECT count(*) AS pending FROM pairs WHERE NOT scored) n
LEFT JOIN subtask_counts c ON true
ORDER BY c.run_id NULLS FIRST, c.chain, c.hop, c.divergence, c.subtask
