-- Shared fragment of goal_divergence_distribution and goal_divergence_runs (after
-- {goal_subtasks}, no trailing comma): `subtask_counts`, the scored subtasks counted per (run,
-- chain, hop, divergence, subtask statement). A subtask is the statement rows sharing (run, agent,
-- target, text pair, source; trace when there is no run); its chain is its origin task, else its
-- run. A subtask lies in one run, so these counts are additive over runs: the distribution is a
-- sum of every run's counts (analytics.goals keeps them per run as goal_divergence_runs).
subtasks AS (
    SELECT s.run_id, coalesce(max(s.origin_task_id), s.run_id) AS chain, max(s.hop) AS hop,
           any_value(p.subtask) AS subtask, any_value(p.divergence) AS divergence
    FROM statement_rows s JOIN pairs p USING (root_raw, subtask_raw)
    WHERE p.divergence IS NOT NULL
    GROUP BY s.run_id, s.agent_id, s.delegate_to, p.pair_id, s.source,   -- pair: the two texts
             CASE WHEN s.run_id IS NULL THEN s.TraceId END
),
subtask_counts AS (
    SELECT run_id, chain, hop, divergence, subtask, count(*) AS subtasks
    FROM subtasks
    GROUP BY run_id, chain, hop, divergence, subtask
)