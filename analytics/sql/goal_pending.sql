-- goal_pending: distinct raw (root, subtask) text pairs in the window without a stored score
-- (at most $pending_limit), for the embedding worker and for cold calls of the goal SQL.
WITH {goal_subtasks}
SELECT root_raw AS _root_raw, subtask_raw AS _subtask_raw
FROM pairs
WHERE NOT scored
LIMIT $pending_limit::BIGINT
