-- goal_divergence: the drifted subtasks (stored pair score, rounded to 4 decimals, above
-- $threshold; `divergence` is returned unrounded, Python rounds it) with their root-goal and subtask task statements; $threshold NULL keeps every
-- subtask (analytics.goals.goal_pairs, for calibration). Subtasks, roots and scores come from
-- the shared fragment _goal_subtasks.sql. Rows of pairs without a stored score are returned
-- too, with _root_raw and _subtask_raw filled: Python scores those pairs once, stores them and
-- applies the threshold to them. Statement rows are filtered by their pair before they are
-- grouped into subtasks, so span lists are merged and sorted only for the subtasks returned.
WITH {goal_subtasks},
kept AS (
    SELECT s.*, p.pair_id, p.root_goal, p.subtask, p.divergence, p.score, p.scored
    FROM statement_rows s JOIN pairs p USING (root_raw, subtask_raw)
    WHERE NOT p.scored                                   -- scored in Python, then filtered
       OR (p.divergence IS NOT NULL                      -- NULL: a pair without task statements
           AND ($threshold::DOUBLE IS NULL OR p.divergence > $threshold::DOUBLE))
),
subtasks AS (
    SELECT arg_min(TraceId, first_seen) AS trace_id,
           list_transform(list_sort(flatten(list(spans))), lambda e: e.s) AS span_ids, run_id,
           agent_id AS agent, delegate_to, max(origin_task_id) AS origin_task_id, max(hop) AS hop,
           any_value(root_goal) AS root_goal, any_value(subtask) AS subtask, source,
           any_value(score) AS divergence, bool_and(scored) AS scored,
           any_value(root_raw) AS root_raw, any_value(subtask_raw) AS subtask_raw,
           min(first_seen) AS first_seen, max(last_seen) AS last_seen
    FROM kept
    GROUP BY run_id, agent_id, delegate_to, pair_id, source,   -- pair_id: (root_raw, subtask_raw)
             CASE WHEN run_id IS NULL THEN TraceId END            -- without a run: per trace
)
SELECT trace_id, span_ids, run_id, agent, delegate_to, origin_task_id, hop, root_goal, subtask,
       source, divergence, first_seen, last_seen,
       CASE WHEN NOT scored THEN root_raw END AS _root_raw,
       CASE WHEN NOT scored THEN subtask_raw END AS _subtask_raw
FROM subtasks
ORDER BY first_seen, trace_id, span_ids[1]                     -- a span is in one subtask only
