-- Shared fragment: the tool calls of repeated_calls (its header says what a call is) among the
-- rows of `loop_spans`, a relation of spans the including statement defines (repeated_calls.sql:
-- the spans its filter and group limit select; loop_new_calls.sql: the spans a commit stored or
-- changed). One definition, so the calls a fold adds are exactly the calls a recomputation finds.
SELECT TraceId, SpanId, run_id, agent, tool_name, Timestamp, start_ns,
       CASE WHEN tool_args IS NOT NULL THEN tool_args WHEN error_text <> '' THEN error_text
            ELSE tool_result END AS args,
       failing, rejected, 'tool' AS source,
       CASE WHEN tool_args IS NOT NULL THEN 'arguments' WHEN error_text <> '' THEN 'error'
            ELSE 'output' END AS basis
FROM (
    SELECT *, CASE WHEN error_type <> '' AND error_message <> '' THEN error_type || ': ' || error_message
                   ELSE error_type || error_message END AS error_text
    FROM (
        SELECT TraceId, SpanId, run_id, coalesce(agent_id, '') AS agent, tool_name, Timestamp, start_ns,
               tool_args, tool_result,
               coalesce(outcome IN ('error', 'rejected') OR StatusCode = 'Error', false) AS failing,
               coalesce(outcome = 'rejected', false) AS rejected,
               -- the error text only of failing calls without arguments (the attribute list is
               -- read for those alone)
               CASE WHEN tool_args IS NULL AND (outcome IN ('error', 'rejected') OR StatusCode = 'Error')
                    THEN coalesce(list_filter(SpanAttributes, lambda a: a.key = 'error.type')[1].value, '')
                    ELSE '' END AS error_type,
               CASE WHEN tool_args IS NULL AND (outcome IN ('error', 'rejected') OR StatusCode = 'Error')
                    THEN coalesce(nullif(StatusMessage, ''), reject_reason, '')
                    ELSE '' END AS error_message
        FROM loop_spans
        WHERE tool_name IS NOT NULL AND run_id IS NOT NULL
          AND coalesce(op, '') NOT IN ('delegate', 'objective')
          -- an execution guard's check that let the call through is not the call (the call is
          -- its own span); a refused check is a refused call
          AND NOT (coalesce(guard, '') = 'execution_guard' AND coalesce(outcome, 'ok') <> 'rejected')
          AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
    )
)
-- arguments not captured: a call only with an error text or a non-trivial output
WHERE tool_args IS NOT NULL OR error_text <> ''
   OR len(list_distinct(list_filter(string_split_regex(lower(coalesce(tool_result, '')), '[^a-z0-9]+'),
                                    lambda x: x <> ''))) >= $min_output_words
