-- loop_code_outputs: the distinct LLM outputs holding a code block (<code> or ```) in runs where an
-- agent has tools: tool spans, or a declared tool list (_declared_tool_key.sql); a code action is
-- only a call of a tool its agent has. analytics.loops parses their calls in Python
-- (analytics.code_actions.code_calls) and binds them to repeated_calls.sql.
WITH code AS (
    SELECT run_id, output_text
    FROM spans
    WHERE {span_filter} AND span_family = 'llm' AND run_id IS NOT NULL
      AND (contains(output_text, '<code>') OR contains(output_text, '```'))
)
SELECT DISTINCT output_text
FROM code
WHERE run_id IN (SELECT run_id FROM spans
                 WHERE {span_filter} AND run_id IN (SELECT run_id FROM code)
                   AND (tool_name IS NOT NULL
                        OR len(list_filter(SpanAttributes, lambda a: {declared_tool_key})) > 0))
