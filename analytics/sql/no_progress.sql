-- no_progress: an agent calling one tool again and again with different arguments and getting the
-- same result every time (a search that never finds anything new): $min_calls or more calls of
-- the group, all successful and all with one non-empty result, with two or more distinct
-- argument strings. Identical arguments are repeated_calls' loops, and so are calls that fail
-- every time; a group a guard refused calls of was stopped (budget_exhaustion, a loop guard).
WITH s AS ({filtered_spans}),
calls AS (
    SELECT * FROM s
    WHERE agent_id IS NOT NULL AND tool_name IS NOT NULL
),
per_tool AS (
    SELECT run_id, agent_id AS agent, tool_name,
           count(*) AS calls,
           count(DISTINCT tool_args) AS distinct_arguments,
           count(DISTINCT tool_result) AS distinct_results,
           count(*) FILTER (WHERE coalesce(tool_result, '') = '') AS without_result,
           count(*) FILTER (
               WHERE coalesce(outcome, '') IN ('rejected', 'error') OR StatusCode = 'Error') AS unsuccessful,
           min(tool_result) AS result,
           list_sort(list(SpanId)) AS span_ids,
           min(TraceId) AS trace_id,
           min(Timestamp) AS first_seen,
           max(Timestamp) AS last_seen
    FROM calls
    GROUP BY run_id, agent_id, tool_name
)
SELECT trace_id, span_ids, run_id, agent, tool_name, calls, distinct_arguments,
       substr(result, 1, 200) AS result, first_seen, last_seen
FROM per_tool
WHERE calls >= $min_calls
  AND distinct_results = 1
  AND without_result = 0
  AND unsuccessful = 0
  AND distinct_arguments >= 2
  AND ($agent::VARCHAR IS NULL OR agent = $agent::VARCHAR)
ORDER BY first_seen, run_id, agent, tool_name
