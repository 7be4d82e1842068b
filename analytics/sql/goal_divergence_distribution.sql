-- goal_divergence_distribution: how the divergences of all subtasks in the window are spread,
-- for the goal-drift chart and the calibration histogram, without a row per subtask: one row
-- per (hop, divergence) with the number of subtasks; per (chain, hop, divergence, subtask
-- statement) instead when the window holds at most $max_chains delegation chains (a chain is
-- the origin task, else the run). Subtasks, roots and scores come from the shared fragment
-- _goal_subtasks.sql, their counts per run from _goal_subtask_counts.sql, the spread from
-- _goal_spread.sql (the materializer sums the same counts kept per run: goal_divergence_runs).
-- Every row also carries `chains` (chains in the window) and `pending` (text pairs without a
-- stored score; always one row, hop/divergence NULL when nothing is scored); analytics.goals
-- scores pending pairs and runs the statement again.
WITH {goal_subtasks},
{goal_subtask_counts},
spread_counts AS (SELECT * FROM subtask_counts),
{goal_spread}
SELECT s.chain, s.hop, s.divergence, s.subtask, s.subtasks, s.chains, n.pending
FROM (SELECT count(*) AS pending FROM pairs WHERE NOT scored) n
LEFT JOIN spread s ON true
ORDER BY s.chain NULLS FIRST, s.hop NULLS FIRST, s.divergence, s.subtask
