-- loop_code_outputs: the distinct LLM outputs holding a code block (<code> or ```) in runs with
-- tool spans (a code action is only a call of a tool the run has). analytics.loops parses their
-- calls in Python (analytics.code_actions.code_calls) and binds them to repeated_calls.sql.
SELECT DISTINCT output_text
FROM spans
WHERE {span_filter} AND span_family = 'llm' AND run_id IS NOT NULL
  AND (contains(output_text, '<code>') OR contains(output_text, '```'))
  AND run_id IN (SELECT run_id FROM spans
                 WHERE {span_filter} AND tool_name IS NOT NULL AND run_id IS NOT NULL)
