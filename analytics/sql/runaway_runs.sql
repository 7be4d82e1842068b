-- runaway_runs (counts): spans and tool calls per run, and per agent in each run, with the
-- run's service (its crew). analytics.runaway compares them with the crew's limits (calibrated
-- from a healthy baseline window, else a multiple of the median run of the crew in the window)
-- and reads the evidence spans of the runs over their limit only.
-- Runs with a step budget (driftscope.budget.max_steps, or a step refused for budget) are left
-- out: a budget stops them (budget_exhaustion reports the ones that hit it).
WITH s AS (
    SELECT run_id, ServiceName, agent_id, tool_name, budget_max_steps, reject_reason, Timestamp, TraceId
    FROM spans
    WHERE {span_filter} AND run_id IS NOT NULL
),
budgeted AS (
    SELECT DISTINCT run_id FROM s WHERE budget_max_steps IS NOT NULL OR reject_reason = 'step_budget'
)
SELECT run_id, arg_min(ServiceName, Timestamp) AS service, agent_id AS agent,
       count(*) AS spans, count(tool_name) AS calls, min(TraceId) AS trace_id,
       min(Timestamp) AS first_seen, max(Timestamp) AS last_seen,
       grouping(agent_id) = 1 AS whole_run
FROM s
WHERE run_id NOT IN (SELECT run_id FROM budgeted)
GROUP BY GROUPING SETS ((run_id), (run_id, agent_id))
HAVING grouping(agent_id) = 1 OR agent_id IS NOT NULL
