-- call_similarity: token-set Jaccard similarity of each tool call's arguments to the previous
-- call of the same tool by the same agent in the run (baseline calibration of loop detection).
-- The previous call's argument string is found by a window over narrow columns; the words and
-- the similarity are computed once per distinct argument string and per distinct pair.
WITH calls AS (
    SELECT run_id, coalesce(agent_id, '') AS agent, tool_name, start_ns, SpanId,
           coalesce(tool_args, '') AS args
    FROM spans
    WHERE {span_filter} AND tool_name IS NOT NULL AND coalesce(op, '') NOT IN ('delegate', 'objective')
),
paired AS (
    SELECT args, lag(args) OVER (PARTITION BY run_id, agent, tool_name ORDER BY start_ns, SpanId) AS previous
    FROM calls
),
words AS (
    SELECT args,
           list_distinct(list_filter(string_split_regex(lower(args), '[^a-z0-9_.]+'),
                         lambda x: x <> '' AND x NOT IN ('a', 'an', 'the', 'in', 'for', 'of', 'to',
                                                         'and', 'or', 'on', 'at', 'by', 'with'))) AS tokens
    FROM (SELECT DISTINCT args FROM paired)
),
pair_similarity AS (
    SELECT p.args, p.previous,
           CASE WHEN len(a.tokens) + len(b.tokens) = 0 THEN 1.0
                ELSE len(list_intersect(a.tokens, b.tokens))
                     / (len(a.tokens) + len(b.tokens) - len(list_intersect(a.tokens, b.tokens))) END
               AS similarity
    FROM (SELECT DISTINCT args, previous FROM paired WHERE previous IS NOT NULL) p
    JOIN words a ON a.args = p.args
    JOIN words b ON b.args = p.previous
)
SELECT s.similarity
FROM paired p
JOIN pair_similarity s ON s.args = p.args AND s.previous = p.previous
