-- repeated_calls (candidate pairs): tool calls of one agent in one run, with each pair of calls
-- of the same tool and the same failing/succeeding class whose normalized arguments are
-- identical (same sorted argument words, stop words dropped) or nearly so (token-set Jaccard of
-- those words >= $similarity). Loops are the connected components
-- of these pairs, formed in numpy (analytics.loops.group_loops).
-- A loop has 3+ members and every pair lies inside one (run, agent, tool, failing) group, so only
-- calls of groups with 3+ calls are candidates: the rest can never be part of a loop. Calls
-- without a run never pair (the pair join compares run ids), so they are no candidates either.
-- Cost: the groups are counted on one integer hash of their key (a collision only keeps a few
-- more candidates; pairs compare the key columns themselves); a call is identified by its rowid
-- (no numbering window); arguments are split into words once per distinct argument string.
WITH calls AS NOT MATERIALIZED (
    SELECT rowid AS call_idx, TraceId, SpanId, run_id, coalesce(agent_id, '') AS agent, tool_name,
           Timestamp, start_ns, tool_args, outcome,
           coalesce(outcome IN ('error', 'rejected') OR StatusCode = 'Error', false) AS failing
    FROM spans
    WHERE {span_filter} AND tool_name IS NOT NULL AND run_id IS NOT NULL
      AND coalesce(op, '') NOT IN ('delegate', 'objective')
      AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
),
keys AS (  -- (run, agent, tool, failing) groups with 3+ calls
    SELECT hash(run_id, agent, tool_name, failing) AS h
    FROM calls
    GROUP BY h
    HAVING count(*) >= 3
),
candidates AS MATERIALIZED (
    SELECT call_idx, TraceId, SpanId, run_id, agent, tool_name, Timestamp, start_ns,
           coalesce(tool_args, '') AS args, failing, coalesce(outcome = 'rejected', false) AS rejected, h
    FROM (SELECT *, hash(run_id, agent, tool_name, failing) AS h FROM calls)
    WHERE h IN (SELECT h FROM keys)
),
words AS (  -- signature: the argument words, lower case, sorted (whitespace/case/key order free)
    SELECT args, array_to_string(list_sort(w), ' ') AS norm_args, list_distinct(w) AS tokens
    FROM (
        SELECT args,
               list_filter(string_split_regex(lower(args), '[^a-z0-9_.]+'),
                           lambda x: x <> '' AND x NOT IN ('a', 'an', 'the', 'in', 'for', 'of', 'to',
                                                           'and', 'or', 'on', 'at', 'by', 'with')) AS w
        FROM (SELECT DISTINCT args FROM candidates)
    )
),
pairs AS MATERIALIZED (  -- each pair of calls of one group (in call_idx order)
    SELECT a.call_idx AS i, b.call_idx AS j, a.args AS args_i, b.args AS args_j
    FROM candidates a JOIN candidates b ON a.h = b.h AND a.call_idx < b.call_idx
    -- the key columns are compared after the join on the hash (a CASE, so that they are not
    -- hashed as further join keys: they only catch a hash collision)
    WHERE CASE WHEN a.run_id = b.run_id AND a.agent = b.agent AND a.tool_name = b.tool_name
                    AND a.failing = b.failing THEN true ELSE false END
),
arg_similarity AS (  -- token-set Jaccard, once per distinct pair of argument strings
    SELECT p.args_i, p.args_j,
           CASE WHEN a.norm_args = b.norm_args THEN 1.0
                WHEN len(a.tokens) + len(b.tokens) = 0 THEN 0.0
                ELSE len(list_intersect(a.tokens, b.tokens))
                     / (len(a.tokens) + len(b.tokens) - len(list_intersect(a.tokens, b.tokens)))
           END AS similarity
    FROM (SELECT DISTINCT args_i, args_j FROM pairs) p
    JOIN words a ON a.args = p.args_i
    JOIN words b ON b.args = p.args_j
),
close_pairs AS MATERIALIZED (
    SELECT p.i, p.j, s.similarity
    FROM pairs p JOIN arg_similarity s USING (args_i, args_j)
    WHERE s.similarity >= $similarity
),
later AS (SELECT i AS call_idx, list(j) AS similar_later FROM close_pairs GROUP BY i),
linked AS (  -- lowest similarity of a pair the call belongs to, as the earlier or the later call
    SELECT call_idx, min(similarity) AS min_similarity
    FROM (SELECT i AS call_idx, similarity FROM close_pairs UNION ALL SELECT j, similarity FROM close_pairs)
    GROUP BY call_idx
),
members AS (  -- a loop has 3+ calls with a close pair each, all in one group: only such calls
                -- can belong to one (group_loops forms the loops)
    SELECT c.*, k.min_similarity
    FROM candidates c JOIN linked k USING (call_idx)
    QUALIFY count(*) OVER (PARTITION BY c.h) >= 3
)
SELECT c.call_idx, c.TraceId, c.SpanId, c.run_id, c.agent, c.tool_name, c.Timestamp, c.start_ns,
       c.failing, c.rejected, w.norm_args,
       coalesce(l.similar_later, []::BIGINT[]) AS similar_later,
       c.min_similarity
FROM members c
JOIN words w USING (args)
LEFT JOIN later l USING (call_idx)
ORDER BY c.run_id, c.start_ns, c.SpanId
