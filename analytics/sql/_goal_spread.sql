-- Shared fragment of goal_divergence_distribution and its sum of per-run counts (after a
-- `spread_counts` CTE of _goal_subtask_counts.sql's columns; no trailing comma): `spread`, the subtasks per
-- (hop, divergence), per (chain, hop, divergence, subtask statement) instead when they lie in at
-- most $max_chains delegation chains, each row with `chains`, the chains they lie in.
counted AS (SELECT count(DISTINCT chain) AS chains FROM spread_counts),
spread AS (
    SELECT CASE WHEN c.chains <= $max_chains THEN t.chain END AS chain, t.hop, t.divergence,
           CASE WHEN c.chains <= $max_chains THEN t.subtask END AS subtask,
           sum(t.subtasks)::BIGINT AS subtasks, any_value(c.chains) AS chains
    FROM spread_counts t, counted c
    GROUP BY ALL
)