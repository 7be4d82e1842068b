-- no_progress: an agent calling one tool again and again with different arguments and getting the
-- same result every time (a search that never finds anything new): $min_calls or more calls of
-- the group, all successful and all with one non-empty result, with two or more distinct
-- argument strings. Identical arguments are repeated_calls' loops, and so are calls that fail
-- every time; a group a guard refused calls of was stopped (budget_exhaustion, a loop guard).
WITH calls AS NOT MATERIALIZED (  -- read twice: the screen, then the few groups that pass it
    SELECT run_id, agent_id, tool_name, tool_args, tool_result, outcome, StatusCode, SpanId,
           TraceId, Timestamp
    FROM spans
    WHERE {span_filter} AND agent_id IS NOT NULL AND tool_name IS NOT NULL
),
-- Groups are screened with streaming aggregates first (one result: min = max; two argument
-- strings or more: min <> max, NULLs ignored as count(DISTINCT) ignores them); the distinct
-- arguments and span lists are gathered only for the groups that pass (DISTINCT and list
-- aggregates over every call took 0.6 of the statement's 0.6 s at 1M spans).
per_tool AS (
    SELECT run_id, agent_id AS agent, tool_name,
           count(*) AS calls,
           min(tool_args) IS DISTINCT FROM max(tool_args) AND count(tool_args) > 0 AS varied,
           min(tool_result) AS result,
           max(tool_result) AS result_max,
           count(*) FILTER (WHERE coalesce(tool_result, '') = '') AS without_result,
           count(*) FILTER (
               WHERE coalesce(outcome, '') IN ('rejected', 'error') OR StatusCode = 'Error') AS unsuccessful,
           min(TraceId) AS trace_id,
           min(Timestamp) AS first_seen,
           max(Timestamp) AS last_seen
    FROM calls
    GROUP BY run_id, agent_id, tool_name
),
stuck AS (
    SELECT * FROM per_tool
    WHERE calls >= $min_calls
      AND result = result_max
      AND without_result = 0
      AND unsuccessful = 0
      AND varied
      AND ($agent::VARCHAR IS NULL OR agent = $agent::VARCHAR)
),
details AS (
    SELECT c.run_id, c.agent_id AS agent, c.tool_name,
           count(DISTINCT c.tool_args) AS distinct_arguments,
           list_sort(list(c.SpanId)) AS span_ids
    FROM calls c
    SEMI JOIN stuck k ON k.run_id IS NOT DISTINCT FROM c.run_id AND k.agent = c.agent_id
                     AND k.tool_name = c.tool_name
    GROUP BY c.run_id, c.agent_id, c.tool_name
)
SELECT k.trace_id, d.span_ids, k.run_id, k.agent, k.tool_name, k.calls, d.distinct_arguments,
       substr(k.result, 1, 200) AS result, k.first_seen, k.last_seen
FROM stuck k
JOIN details d ON d.run_id IS NOT DISTINCT FROM k.run_id AND d.agent = k.agent
              AND d.tool_name = k.tool_name
ORDER BY k.first_seen, k.run_id, k.agent, k.tool_name
