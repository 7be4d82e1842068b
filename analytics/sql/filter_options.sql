-- Sidebar choices in one scan: services and agents seen in scope, and the newest $limit runs.
WITH scoped AS (
    SELECT ServiceName, agent_id, run_id, Timestamp FROM spans WHERE {run_scope}
),
newest AS (
    SELECT run_id FROM scoped WHERE run_id IS NOT NULL
    GROUP BY run_id ORDER BY max(Timestamp) DESC, run_id LIMIT $limit
)
SELECT
    coalesce((SELECT list_sort(list(DISTINCT ServiceName)) FROM scoped WHERE ServiceName IS NOT NULL),
             []::VARCHAR[]) AS services,
    coalesce((SELECT list_sort(list(DISTINCT agent_id)) FROM scoped WHERE agent_id IS NOT NULL),
             []::VARCHAR[]) AS agents,
    coalesce((SELECT list(run_id) FROM newest), []::VARCHAR[]) AS runs
