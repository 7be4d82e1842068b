-- goal_divergence_distribution's answer from its counts per run
-- (goal_divergence_distribution_runs.sql, as `parts`), run over those rows, not over spans
-- (analytics.sql_loader.query_tables): the chains counted over every run, then the subtasks
-- summed per (chain, hop, divergence, statement) or per (hop, divergence), as
-- goal_divergence_distribution.sql forms them (always one row, as there).
WITH counted AS (SELECT count(DISTINCT chain) AS chains FROM parts),
spread AS (
    SELECT CASE WHEN c.chains <= $max_chains THEN t.chain END AS chain, t.hop, t.divergence,
           CASE WHEN c.chains <= $max_chains THEN t.subtask END AS subtask,
           sum(t.subtasks)::BIGINT AS subtasks, any_value(c.chains) AS chains
    FROM parts t, counted c
    GROUP BY ALL
)
SELECT s.chain, s.hop, s.divergence, s.subtask, s.subtasks, s.chains, 0 AS pending
FROM (SELECT 1) n
LEFT JOIN spread s ON true
ORDER BY s.chain NULLS FIRST, s.hop NULLS FIRST, s.divergence, s.subtask
