-- goal_divergence_distribution: how the divergences of all subtasks in the window are spread,
-- for the goal-drift chart and the calibration histogram, without a row per subtask: one row
-- per (hop, divergence) with the number of subtasks; per (chain, hop, divergence, subtask
-- statement) instead when the window holds at most $max_chains delegation chains (a chain is
-- the origin task, else the run). Subtasks, roots and scores come from the shared fragment
-- _goal_subtasks.sql. Every row also carries `chains` (chains in the window) and `pending`
-- (text pairs without a stored score; always one row, hop/divergence NULL when nothing is
-- scored); analytics.goals scores pending pairs and runs the statement again.
WITH {goal_subtasks},
subtasks AS (
    SELECT coalesce(max(s.origin_task_id), s.run_id) AS chain, max(s.hop) AS hop,
           any_value(p.subtask) AS subtask, any_value(p.divergence) AS divergence
    FROM statement_rows s JOIN pairs p USING (root_raw, subtask_raw)
    WHERE p.divergence IS NOT NULL
    GROUP BY s.run_id, s.agent_id, s.delegate_to, p.pair_id, s.source,   -- pair: the two texts
             CASE WHEN s.run_id IS NULL THEN s.TraceId END
),
counted AS (SELECT count(DISTINCT chain) AS chains FROM subtasks),
spread AS (
    SELECT CASE WHEN c.chains <= $max_chains THEN t.chain END AS chain, t.hop, t.divergence,
           CASE WHEN c.chains <= $max_chains THEN t.subtask END AS subtask,
           count(*) AS subtasks, any_value(c.chains) AS chains
    FROM subtasks t, counted c
    GROUP BY ALL
)
SELECT s.chain, s.hop, s.divergence, s.subtask, s.subtasks, s.chains, n.pending
FROM (SELECT count(*) AS pending FROM pairs WHERE NOT scored) n
LEFT JOIN spread s ON true
ORDER BY s.chain NULLS FIRST, s.hop NULLS FIRST, s.divergence, s.subtask
