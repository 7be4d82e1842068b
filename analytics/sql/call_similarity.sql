-- call_similarity: token-set Jaccard similarity of each tool call's arguments to the previous
-- call of the same tool by the same agent in the run (baseline calibration of loop detection).
WITH s AS ({filtered_spans}),
calls AS (
    SELECT run_id, coalesce(agent_id, '') AS agent, tool_name, start_ns, SpanId,
           list_distinct(list_filter(string_split_regex(lower(coalesce(tool_args, '')), '[^a-z0-9_.]+'),
                       lambda x: x <> '' AND x NOT IN ('a', 'an', 'the', 'in', 'for', 'of', 'to',
                                                       'and', 'or', 'on', 'at', 'by', 'with'))) AS tokens
    FROM s
    WHERE tool_name IS NOT NULL AND coalesce(op, '') NOT IN ('delegate', 'objective')
),
paired AS (
    SELECT tokens, lag(tokens) OVER (PARTITION BY run_id, agent, tool_name ORDER BY start_ns, SpanId)
               AS previous
    FROM calls
)
SELECT CASE WHEN len(tokens) + len(previous) = 0 THEN 1.0
            ELSE len(list_intersect(tokens, previous))
                 / (len(tokens) + len(previous) - len(list_intersect(tokens, previous))) END
           AS similarity
FROM paired
WHERE previous IS NOT NULL
