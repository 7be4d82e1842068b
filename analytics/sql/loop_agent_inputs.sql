-- loop_agent_inputs: the distinct inputs of agent spans that could be repeated invocations (an
-- agent invoked $min_calls+ times in a run). analytics.loops extracts their task statements in
-- Python (analytics.tasks.extract_task) and binds them to repeated_calls.sql.
SELECT DISTINCT input_text
FROM spans
WHERE {span_filter} AND span_family = 'agent' AND run_id IS NOT NULL AND input_text IS NOT NULL
  AND ($agent::VARCHAR IS NULL OR coalesce(agent_id, agent_name, SpanName) = $agent::VARCHAR)
QUALIFY count(*) OVER (PARTITION BY run_id, coalesce(agent_id, agent_name, SpanName)) >= $min_calls
