-- call_similarity: each tool call's arguments with those of the previous call of the same tool
-- by the same agent in the run (baseline calibration of loop detection), as distinct (arguments,
-- previous arguments) pairs with how often each occurs. analytics.calibration scores each
-- distinct pair once with the detector's similarity (analytics.loop_similarity); pairs with the
-- same normalized arguments are left to it too (they score 1).
WITH calls AS (
    SELECT run_id, coalesce(agent_id, '') AS agent, tool_name, start_ns, SpanId,
           coalesce(tool_args, '') AS args
    FROM spans
    WHERE {span_filter} AND tool_name IS NOT NULL AND coalesce(op, '') NOT IN ('delegate', 'objective')
      AND NOT (coalesce(guard, '') = 'execution_guard' AND coalesce(outcome, 'ok') <> 'rejected')
),
paired AS (
    SELECT args, lag(args) OVER (PARTITION BY run_id, agent, tool_name ORDER BY start_ns, SpanId) AS previous
    FROM calls
)
SELECT args, previous, count(*) AS n
FROM paired
WHERE previous IS NOT NULL
GROUP BY args, previous
