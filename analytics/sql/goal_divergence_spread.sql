-- goal_divergence_spread (internal, analytics.goals): goal_divergence_distribution summed from
-- subtask counts: `_counts`, goal_divergence_runs' rows, and `_loose`, those of the subtasks of no
-- run; run in process over rows read from either engine's tables (sql_loader.query_tables).
WITH spread_counts AS (
    SELECT run_id::VARCHAR AS run_id, chain::VARCHAR AS chain, hop::INTEGER AS hop,
           divergence::DOUBLE AS divergence, subtask::VARCHAR AS subtask, subtasks::BIGINT AS subtasks
    FROM (SELECT run_id, chain, hop, divergence, subtask, subtasks FROM _counts
          UNION ALL BY NAME
          SELECT run_id, chain, hop, divergence, subtask, subtasks FROM _loose)
),
{goal_spread}
SELECT s.chain, s.hop, s.divergence, s.subtask, s.subtasks, s.chains
FROM (SELECT 1) n
LEFT JOIN spread s ON true
ORDER BY s.chain NULLS FIRST, s.hop NULLS FIRST, s.divergence, s.subtask
