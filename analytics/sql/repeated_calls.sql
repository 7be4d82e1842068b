-- repeated_calls (candidate pairs): tool calls of one agent in one run, with each pair of calls
-- of the same tool and the same failing/succeeding class whose normalized arguments are
-- identical (same sorted argument words, stop words dropped) or nearly so (token-set Jaccard of
-- those words >= $similarity). Loops are the connected components
-- of these pairs, formed in numpy (analytics.loops.group_loops).
WITH s AS ({filtered_spans}),
calls AS (
    SELECT row_number() OVER (ORDER BY run_id, start_ns, SpanId) - 1 AS call_idx,
           TraceId, SpanId, run_id, coalesce(agent_id, '') AS agent, tool_name, Timestamp, start_ns,
           tool_args,
           list_filter(string_split_regex(lower(coalesce(tool_args, '')), '[^a-z0-9_.]+'),
                       lambda x: x <> '' AND x NOT IN ('a', 'an', 'the', 'in', 'for', 'of', 'to',
                                                       'and', 'or', 'on', 'at', 'by', 'with'))
               AS words,
           coalesce(outcome IN ('error', 'rejected') OR StatusCode = 'Error', false) AS failing,
           coalesce(outcome = 'rejected', false) AS rejected
    FROM s
    WHERE tool_name IS NOT NULL
      AND coalesce(op, '') NOT IN ('delegate', 'objective')
      AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
),
signed AS (  -- signature: the argument words, lower case, sorted (whitespace/case/key order free)
    SELECT * EXCLUDE (words), array_to_string(list_sort(words), ' ') AS norm_args,
           list_distinct(words) AS tokens
    FROM calls
),
pairs AS (
    SELECT a.call_idx AS i, b.call_idx AS j,
           CASE WHEN a.norm_args = b.norm_args THEN 1.0
                WHEN len(a.tokens) + len(b.tokens) = 0 THEN 0.0
                ELSE len(list_intersect(a.tokens, b.tokens))
                     / (len(a.tokens) + len(b.tokens) - len(list_intersect(a.tokens, b.tokens)))
           END AS similarity
    FROM signed a JOIN signed b
      ON a.run_id = b.run_id AND a.agent = b.agent AND a.tool_name = b.tool_name
     AND a.failing = b.failing AND a.call_idx < b.call_idx
)
SELECT c.*,
       coalesce((SELECT list(p.j) FROM pairs p WHERE p.i = c.call_idx AND p.similarity >= $similarity),
                []::BIGINT[]) AS similar_later,
       -- Two equality lookups, not one `p.i = idx OR p.j = idx`: the OR made DuckDB compare every
       -- call with every pair (a nested-loop join, quadratic in calls). least() skips NULLs.
       least((SELECT min(p.similarity) FROM pairs p WHERE p.i = c.call_idx AND p.similarity >= $similarity),
             (SELECT min(p.similarity) FROM pairs p WHERE p.j = c.call_idx AND p.similarity >= $similarity))
           AS min_similarity
FROM signed c
ORDER BY call_idx
