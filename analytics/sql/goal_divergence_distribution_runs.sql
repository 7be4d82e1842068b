-- goal_divergence_distribution per run: goal_divergence_distribution.sql's subtasks counted per
-- run, chain, hop, divergence and subtask statement (every row also carries `pending`, the text
-- pairs without a stored score; always one row). After a batch analytics.goals forms the spread
-- (_goal_divergence_spread.sql) from the rows kept with its result, with the touched runs (and
-- the runs sharing their origin tasks, whose roots they may give) counted again
-- (analytics.kept.keeps_parts); equal to goal_divergence_distribution.sql over every run
-- (tests/analytics/test_kept.py, test_summary.py).
WITH {goal_subtasks},
subtasks AS (
    SELECT s.run_id, coalesce(max(s.origin_task_id), s.run_id) AS chain, max(s.hop) AS hop,
           any_value(p.subtask) AS subtask, any_value(p.divergence) AS divergence
    FROM statement_rows s JOIN pairs p USING (root_raw, subtask_raw)
    WHERE p.divergence IS NOT NULL
    GROUP BY s.run_id, s.agent_id, s.delegate_to, p.pair_id, s.source,   -- pair: the two texts
             CASE WHEN s.run_id IS NULL THEN s.TraceId END
),
per_run AS (
    SELECT run_id, chain, hop, divergence, subtask, count(*) AS subtasks
    FROM subtasks
    GROUP BY ALL
)
SELECT r.run_id, r.chain, r.hop, r.divergence, r.subtask, r.subtasks, n.pending
FROM (SELECT count(*) AS pending FROM pairs WHERE NOT scored) n
LEFT JOIN per_run r ON true
