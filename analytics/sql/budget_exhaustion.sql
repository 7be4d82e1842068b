-- budget_exhaustion: agents in a run that reached their step budget (driftscope.step >=
-- driftscope.budget.max_steps) or were refused a step for budget (reject_reason = step_budget).
WITH s AS ({filtered_spans}),
steps AS (
    SELECT * FROM s
    WHERE agent_id IS NOT NULL
      AND (step IS NOT NULL OR budget_max_steps IS NOT NULL OR reject_reason = 'step_budget')
),
per_agent AS (
    SELECT run_id, agent_id AS agent,
           max(step) AS max_step,
           max(budget_max_steps) AS budget_max_steps,
           count(*) FILTER (WHERE reject_reason = 'step_budget') AS budget_rejections,
           list_sort(list(SpanId) FILTER (
               WHERE reject_reason = 'step_budget' OR (step IS NOT NULL AND step >= budget_max_steps)))
               AS span_ids,
           min(TraceId) AS trace_id,
           min(Timestamp) FILTER (
               WHERE reject_reason = 'step_budget' OR (step IS NOT NULL AND step >= budget_max_steps))
               AS first_seen,
           max(Timestamp) AS last_seen
    FROM steps
    GROUP BY run_id, agent_id
)
SELECT trace_id, span_ids, run_id, agent, max_step, budget_max_steps, budget_rejections,
       first_seen, last_seen
FROM per_agent
WHERE (budget_rejections > 0 OR max_step >= budget_max_steps)
  AND ($agent::VARCHAR IS NULL OR agent = $agent::VARCHAR)
ORDER BY first_seen
