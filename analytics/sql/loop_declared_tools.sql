-- loop_declared_tools: the tool lists agents declare (_declared_tool_key.sql names the attributes),
-- per (run, agent), in the runs whose LLM outputs hold a code block (loop_code_outputs.sql).
-- analytics.code_actions.declared_tool_names reads the names out of each value; repeated_calls.sql
-- counts a code action only as a call of a tool its agent declares (else, for an agent that
-- declares none, of a tool of the run's tool spans).
SELECT DISTINCT run_id, coalesce(agent_id, '') AS agent,
       list_transform(list_filter(SpanAttributes, lambda a: {declared_tool_key}), lambda a: a.value) AS declared
FROM spans
WHERE {span_filter} AND run_id IS NOT NULL
  AND run_id IN (SELECT run_id FROM spans
                 WHERE {span_filter} AND span_family = 'llm' AND run_id IS NOT NULL
                   AND (contains(output_text, '<code>') OR contains(output_text, '```')))
  AND len(list_filter(SpanAttributes, lambda a: {declared_tool_key})) > 0
