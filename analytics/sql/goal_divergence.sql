-- goal_divergence: the drifted subtasks (stored pair score, rounded to 4 decimals, above
-- $threshold; `divergence` is returned unrounded, Python rounds it) with their root-goal and
-- subtask task statements; $threshold NULL keeps every subtask (analytics.goals.goal_pairs, for
-- calibration). Subtasks, roots and scores come from the shared fragment _goal_subtasks.sql.
-- Only pairs with a stored score make rows; every row also carries `pending`, the number of
-- text pairs in the window without one (always one row: all columns but `pending` NULL when no
-- subtask is returned). analytics.goals scores the pending pairs and runs the statement again:
-- returning their rows with the raw texts for Python to score and filter took 4.9M rows and
-- over 11 GB at 10M spans of 10-call runs, for 925 distinct pairs. Statement rows are filtered
-- by their pair before they are grouped into subtasks, so span lists are merged and sorted only
-- for the subtasks returned.
WITH {goal_subtasks},
kept AS (
    SELECT s.*, p.pair_id, p.root_goal, p.subtask, p.divergence, p.score
    FROM statement_rows s JOIN pairs p USING (root_raw, subtask_raw)
    WHERE p.divergence IS NOT NULL                       -- NULL: unscored, or no task statements
      AND ($threshold::DOUBLE IS NULL OR p.divergence > $threshold::DOUBLE)
),
subtasks AS (
    SELECT arg_min(TraceId, first_seen) AS trace_id,
           list_transform(list_sort(flatten(list(spans))), lambda e: e.s) AS span_ids, run_id,
           agent_id AS agent, delegate_to, max(origin_task_id) AS origin_task_id, max(hop) AS hop,
           any_value(root_goal) AS root_goal, any_value(subtask) AS subtask, source,
           any_value(score) AS divergence,
           min(first_seen) AS first_seen, max(last_seen) AS last_seen
    FROM kept
    GROUP BY run_id, agent_id, delegate_to, pair_id, source,   -- pair_id: (root_raw, subtask_raw)
             CASE WHEN run_id IS NULL THEN TraceId END            -- without a run: per trace
)
SELECT s.trace_id, s.span_ids, s.run_id, s.agent, s.delegate_to, s.origin_task_id, s.hop,
       s.root_goal, s.subtask, s.source, s.divergence, s.first_seen, s.last_seen, n.pending
FROM (SELECT count(*) AS pending FROM pairs WHERE NOT scored) n
LEFT JOIN subtasks s ON true
ORDER BY s.first_seen, s.trace_id, s.span_ids[1]               -- a span is in one subtask only
