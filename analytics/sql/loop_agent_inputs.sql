-- loop_agent_inputs: the distinct inputs of agent spans and delegate spans that could be repeated
-- invocations (an agent invoked, or a delegator handing off to one agent, $min_calls+ times in a
-- run). analytics.loops extracts their task statements in Python
-- (analytics.tasks.extract_task) and binds them to repeated_calls.sql.
SELECT DISTINCT input_text
FROM spans
WHERE {span_filter} AND span_family = 'agent' AND run_id IS NOT NULL AND input_text IS NOT NULL
QUALIFY count(*) OVER (PARTITION BY run_id, coalesce(agent_id, agent_name, SpanName)) >= $min_calls
UNION
SELECT DISTINCT input_text
FROM spans
WHERE {span_filter} AND op = 'delegate' AND run_id IS NOT NULL AND input_text IS NOT NULL
  AND goal_text IS NULL
QUALIFY count(*) OVER (PARTITION BY run_id, agent_id, delegate_to) >= $min_calls
