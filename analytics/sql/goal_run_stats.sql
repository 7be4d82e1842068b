-- goal_run_stats (run_summary's goal columns): per run, how many subtasks are drifted (stored
-- pair score, rounded to 4 decimals, above $threshold) and the highest divergence of any of its
-- subtasks, from the shared fragment _goal_subtasks.sql without building span lists. The first
-- row also carries `pending`, the number of text pairs in the window without a stored score
-- (always one row: run_id NULL when no run has a scored subtask); analytics.goals scores those
-- and runs the statement again.
WITH {goal_subtasks},
per_subtask AS (                                         -- a subtask's statements share its pair
    SELECT s.run_id, max(p.divergence) AS divergence
    FROM statement_rows s JOIN pairs p USING (root_raw, subtask_raw)
    WHERE s.run_id IS NOT NULL AND p.divergence IS NOT NULL
    GROUP BY s.run_id, s.agent_id, s.delegate_to, p.pair_id, s.source   -- pair: the two texts
),
per_run AS (
    SELECT run_id, count(*) FILTER (WHERE divergence > $threshold::DOUBLE) AS drifted_subtasks,
           max(divergence) AS worst_divergence
    FROM per_subtask
    GROUP BY run_id
)
SELECT r.run_id, r.drifted_subtasks, r.worst_divergence, n.pending
FROM (SELECT count(*) AS pending FROM pairs WHERE NOT scored) n
LEFT JOIN per_run r ON true
