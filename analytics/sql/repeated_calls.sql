-- repeated_calls (linked calls): every call of a (run, agent, tool) group that is linked to
-- another call of its group, with the calls it links to. analytics.loops forms the loops (the
-- connected components of these links) and keeps those with enough calls.
-- A call is
--   * a tool call (tool_name set; not a driftscope delegate/objective span; an execution guard's
--     check that let the call through is not a call, a refused one is a refused call),
--   * a delegation (op = 'delegate': the delegator calls the delegate_to agent with its subtask,
--     else the task extracted from its input, else its arguments); hand-offs whose target also
--     hands back to the delegator in the run are a ping-pong (the ping_pong detector's finding),
--   * an agent invocation: an entry into an agent, i.e. the topmost of a chain of spans of one
--     agent (its parent has another agent, or none), with agent spans beneath it whose input has
--     a task. The agent spans under one entry are one invocation (a LangGraph ReAct sub-graph
--     runs its 'agent' node two or three times per call): the first of them is the call, its task
--     statement (extracted in Python and bound as $agent_inputs -> $agent_tasks) the argument.
--     The caller is the agent of the entry's parent ('' at the top), the invoked agent is the
--     "tool"; an invocation a delegate span of the run already records is counted there.
--   * a code action: a call `name(...)` in a ```py / <code> block of an LLM output, for agents
--     that act through code, as Python's parser finds it (analytics.code_actions: never prose,
--     escaped text, builtins or names the code binds itself; bound as $code_outputs / $code_tools
--     / $code_args), only of a tool the agent has: one of its declared tool list where it declares
--     one (analytics/sql/loop_declared_tools.sql, bound as $declared_runs / $declared_agents /
--     $declared_tools), else a tool name of the run's tool spans; only for (run, agent, name)
--     without tool spans of their own, and never a name of an invoked agent.
-- A call whose arguments were not captured (a tool span without tool_args, a hand-off without
-- task, arguments or input) never matches another on its (empty) arguments: invisible arguments
-- are not equal arguments. A tool call without arguments is matched on what it did show instead
-- (its `basis`; every other call's basis is 'arguments'), and only on the same text
-- (normalized as arguments are: case, white space and word order free; never on similarity):
--   * 'error': a failing call (outcome error/rejected or status Error) with an error text: its
--     `error.type` attribute and status message (or reject reason), e.g. "TimeoutError: search
--     backend timed out" (Microsoft Agent Framework's default records only error.type): the same
--     failure, call after call, is a retry loop whatever the arguments were;
--   * 'output': else a call whose result (tool_result) has $min_output_words+ distinct words: a
--     trivial acknowledgement ("ok", {"status": "sent"}) is what different successful calls all
--     return, a substantial result repeated verbatim is the same call repeated (or a search that
--     makes no progress).
-- Either needs $min_calls+ such calls, like any loop; a call with neither is no call here.
-- Outcomes are not part of the group: a retry loop is error, error, ok.
-- Two calls are linked when their normalized arguments are identical (the same sorted argument
-- words: whitespace, case and key order free; every such call links to the first of them), or
-- when one is among the $neighbours (at most 4) calls before the other in the group and their
-- similarity (token-set Jaccard of stemmed argument words, stop words dropped;
-- analytics.loop_similarity is its Python twin) is >= $similarity. Delegations and agent
-- invocations are sentences, not arguments: they are linked here only when identical, and
-- analytics.loops links re-worded ones on their task similarity; so every candidate call of
-- theirs is returned, linked or not.
-- Cost is linear in the calls: groups with fewer than $min_calls calls cannot hold a loop and are
-- dropped first (on a hash of their key); each distinct argument string is tokenized once; one
-- sort of the calls by (group hash, time) gives every call its 4 predecessors (lag); a size
-- filter and a prefix filter (tokens rarest first: two sets with a Jaccard >= t share a token
-- within their first n - ceil(t * n) + 1) drop most neighbour pairs before the exact Jaccard.
-- A 64-bit hash collision of two group keys (~n^2/2^64) could only merge two groups;
-- analytics.loops splits a loop by key (a collision of two (run, tool) keys in the internal
-- $group_runs/$group_tools limit could only add a group to the ones computed).
-- Internal ($all_calls: analytics.loops_fold's state): every call of every group, linked or not,
-- and links in groups of any size (a group's links do not depend on its size: below $min_calls
-- calls it only cannot hold a loop).
-- Internal ($loop_runs set: serve's materializer recomputing the (run, tool) groups a commit
-- changed, analytics.loops_live): every call source is limited to the ($group_runs[i],
-- $group_tools[i]) groups and every group of $loop_whole_runs before any call is formed; a group
-- is wholly in or out, so its loops are the ones the full statement finds. (The pairs are lists,
-- empty when unset: ClickHouse cannot bind a NULL array.)
WITH RECURSIVE group_scope AS (
    SELECT hash(r, t) AS rt
    FROM (SELECT unnest($group_runs::VARCHAR[]) AS r, unnest($group_tools::VARCHAR[]) AS t)
),
loop_spans AS NOT MATERIALIZED (  -- the spans tool calls are read from (_loop_tool_calls.sql)
    SELECT * FROM spans
    WHERE {span_filter}
      AND ($loop_runs::VARCHAR[] IS NULL OR run_id = ANY($loop_whole_runs::VARCHAR[])
           OR hash(run_id, tool_name) IN (SELECT rt FROM group_scope))
),
tool_calls AS NOT MATERIALIZED ({loop_tool_calls}),
agent_tasks AS (
    SELECT unnest($agent_inputs::VARCHAR[]) AS input_text, unnest($agent_tasks::VARCHAR[]) AS task
),
handoffs AS NOT MATERIALIZED (
    SELECT TraceId, SpanId, run_id, agent_id, delegate_to, Timestamp, start_ns, goal_text, tool_args,
           input_text, outcome, StatusCode
    FROM spans
    WHERE {span_filter} AND op = 'delegate' AND run_id IS NOT NULL AND agent_id IS NOT NULL
      AND delegate_to IS NOT NULL AND agent_id <> delegate_to
),
delegations AS NOT MATERIALIZED (
    SELECT TraceId, SpanId, run_id, agent_id AS agent, delegate_to AS tool_name, Timestamp, start_ns,
           coalesce(d.goal_text, t.task, d.tool_args, d.input_text, '') AS args,
           coalesce(outcome IN ('error', 'rejected') OR StatusCode = 'Error', false) AS failing,
           coalesce(outcome = 'rejected', false) AS rejected, 'delegation' AS source, 'arguments' AS basis
    FROM handoffs d LEFT JOIN agent_tasks t ON t.input_text = d.input_text
    WHERE ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
      AND ($loop_runs::VARCHAR[] IS NULL OR d.run_id = ANY($loop_whole_runs::VARCHAR[])
           OR hash(d.run_id, d.delegate_to) IN (SELECT rt FROM group_scope))
      -- a hand-off whose task was not captured matches no other
      AND coalesce(d.goal_text, t.task, d.tool_args, d.input_text, '') <> ''
      AND NOT EXISTS (SELECT 1 FROM handoffs b
                      WHERE b.run_id = d.run_id AND b.agent_id = d.delegate_to AND b.delegate_to = d.agent_id)
),
agent_spans AS MATERIALIZED (  -- agent spans with a task (the candidates of loop_agent_inputs)
    SELECT s.TraceId, s.SpanId, s.ParentSpanId, s.run_id, s.Timestamp, s.start_ns, s.StatusCode,
           coalesce(s.agent_id, s.agent_name, s.SpanName) AS invoked, t.task
    FROM spans s JOIN agent_tasks t ON t.input_text = s.input_text
    WHERE {span_filter} AND s.span_family = 'agent' AND s.run_id IS NOT NULL
),
lineage AS MATERIALIZED (  -- the spans of the traces that hold them (to walk up to each entry)
    SELECT TraceId, SpanId, ParentSpanId, agent_id
    FROM spans
    WHERE TraceId IN (SELECT TraceId FROM agent_spans)
),
climb AS (  -- from each agent span up through its ancestors of the same agent
    SELECT TraceId, SpanId AS origin, SpanId AS cur, ParentSpanId AS parent, invoked, 0 AS depth
    FROM agent_spans
    UNION ALL
    SELECT c.TraceId, c.origin, p.SpanId, p.ParentSpanId, c.invoked, c.depth + 1
    FROM climb c JOIN lineage p ON p.TraceId = c.TraceId AND p.SpanId = c.parent
    WHERE p.agent_id = c.invoked AND c.depth < 64
),
entries AS (  -- each agent span's entry (topmost span of its chain) and the entry's parent
    SELECT TraceId, origin, arg_max(cur, depth) AS entry, arg_max(parent, depth) AS entry_parent
    FROM climb
    GROUP BY TraceId, origin
),
invocations AS NOT MATERIALIZED (  -- one per entry: its first agent span with a task
    SELECT a.TraceId, a.SpanId, a.run_id, coalesce(p.agent_id, '') AS agent, a.invoked AS tool_name,
           a.Timestamp, a.start_ns, a.task AS args, coalesce(a.StatusCode = 'Error', false) AS failing,
           false AS rejected, 'agent' AS source, 'arguments' AS basis
    FROM agent_spans a
    JOIN entries e ON e.TraceId = a.TraceId AND e.origin = a.SpanId
    LEFT JOIN lineage p ON p.TraceId = a.TraceId AND p.SpanId = e.entry_parent
    WHERE ($agent::VARCHAR IS NULL OR p.agent_id = $agent::VARCHAR)
      AND ($loop_runs::VARCHAR[] IS NULL OR a.run_id = ANY($loop_whole_runs::VARCHAR[])
           OR hash(a.run_id, a.invoked) IN (SELECT rt FROM group_scope))
      -- an invocation that a delegate span of the run already records is counted there
      AND hash(a.run_id, coalesce(p.agent_id, ''), a.invoked)
          NOT IN (SELECT hash(run_id, agent, tool_name) FROM delegations)
    QUALIFY row_number() OVER (PARTITION BY a.TraceId, e.entry ORDER BY a.start_ns, a.SpanId) = 1
),
code_found AS (  -- the calls in code blocks of LLM outputs, parsed in Python (analytics.code_actions)
    SELECT unnest($code_outputs::VARCHAR[]) AS output_text, unnest($code_tools::VARCHAR[]) AS tool_name,
           unnest($code_args::VARCHAR[]) AS args
),
declared AS (  -- the tools agents declare (loop_declared_tools.sql, names read in Python)
    SELECT unnest($declared_runs::VARCHAR[]) AS run_id, unnest($declared_agents::VARCHAR[]) AS agent,
           unnest($declared_tools::VARCHAR[]) AS tool_name
),
run_tools AS (  -- the tools a run's agents have: every tool name of its tool spans
    SELECT DISTINCT run_id, tool_name
    FROM spans
    WHERE {span_filter} AND tool_name IS NOT NULL AND run_id IS NOT NULL
      AND coalesce(op, '') NOT IN ('delegate', 'objective')
),
code_calls AS NOT MATERIALIZED (
    SELECT s.TraceId, s.SpanId, s.run_id, coalesce(s.agent_id, '') AS agent, f.tool_name, s.Timestamp,
           s.start_ns, f.args, false AS failing, false AS rejected, 'code' AS source, 'arguments' AS basis
    FROM spans s JOIN code_found f ON f.output_text = s.output_text
    WHERE {span_filter} AND s.span_family = 'llm' AND s.run_id IS NOT NULL
      AND ($agent::VARCHAR IS NULL OR s.agent_id = $agent::VARCHAR)
      AND ($loop_runs::VARCHAR[] IS NULL OR s.run_id = ANY($loop_whole_runs::VARCHAR[])
           OR hash(s.run_id, f.tool_name) IN (SELECT rt FROM group_scope))
      -- only a tool the agent has: its declared tools, else (it declares none) the run's tool
      -- spans' tools; where the agent's own tool spans record it, they are the calls
      AND (hash(s.run_id, coalesce(s.agent_id, ''), f.tool_name) IN (SELECT hash(run_id, agent, tool_name)
                                                                     FROM declared)
           OR (hash(s.run_id, coalesce(s.agent_id, '')) NOT IN (SELECT hash(run_id, agent) FROM declared)
               AND hash(s.run_id, f.tool_name) IN (SELECT hash(run_id, tool_name) FROM run_tools)))
      AND hash(s.run_id, coalesce(s.agent_id, ''), f.tool_name)
          NOT IN (SELECT hash(run_id, agent, tool_name) FROM tool_calls)
      AND hash(s.run_id, f.tool_name) NOT IN (SELECT hash(run_id, tool_name) FROM invocations)
),
calls AS MATERIALIZED (  -- with its group key's hash. Read twice (keys, candidates): inlined,
                        -- DuckDB scanned and joined every call of the runs twice
    SELECT *, hash(run_id, agent, tool_name) AS h
    FROM (SELECT * FROM tool_calls
          UNION ALL SELECT * FROM delegations
          UNION ALL SELECT * FROM invocations
          UNION ALL SELECT * FROM code_calls)
),
keys AS (  -- (run, agent, tool) groups with enough calls for a loop (every group: $all_calls)
    SELECT h
    FROM calls
    GROUP BY h
    HAVING count(*) >= $min_calls OR $all_calls::BOOLEAN
),
candidates AS MATERIALIZED (
    SELECT row_number() OVER () AS call_idx, c.*
    FROM calls c
    JOIN keys k ON k.h = c.h
),
words AS MATERIALIZED (  -- per distinct argument string: its signature (the argument words, lower case,
            -- sorted: whitespace/case/key order free) and its similarity tokens
    SELECT args, array_to_string(list_sort(w), ' ') AS norm_args,
           list_distinct(
               -- light stemming, in three steps: plural -ies/-s, then -ing/-ed, then a final -e
               list_transform(list_transform(list_transform(
                   list_filter(list_transform(w, lambda x: trim(x, '.')),
                               lambda x: x <> '' AND x NOT IN (
                                   'is', 'are', 'was', 'were', 'be', 'been', 'being', 'what', 'which',
                                   'who', 'whom', 'whose', 'how', 'when', 'where', 'why', 'me', 'my',
                                   'i', 'you', 'your', 'we', 'our', 'it', 'its', 'this', 'that',
                                   'these', 'those', 'there', 'please', 'can', 'could', 'would',
                                   'should', 'do', 'does', 'did', 'find', 'get', 'show', 'give', 'tell',
                                   'list', 'search', 'look', 'lookup', 'up', 'about', 'from', 'into',
                                   'as', 'any', 'all', 'some', 'current', 'latest', 'args', 'kwargs',
                                   'sanitize_inputs_outputs', 'true', 'false', 'null', 'none',
                                   'a', 'an', 'the', 'in', 'for', 'of', 'to', 'and', 'or', 'on', 'at',
                                   'by', 'with', 's', 'has', 'have', 'had')),
                   lambda x: CASE WHEN length(x) > 4 AND suffix(x, 'ies') THEN left(x, length(x) - 3) || 'y'
                                  WHEN length(x) > 3 AND suffix(x, 's') AND NOT suffix(x, 'ss')
                                       AND NOT suffix(x, 'us') AND NOT suffix(x, 'is')
                                  THEN left(x, length(x) - 1)
                                  ELSE x END),
                   lambda x: CASE WHEN length(x) > 5 AND suffix(x, 'ing') THEN left(x, length(x) - 3)
                                  WHEN length(x) > 4 AND suffix(x, 'ed') THEN left(x, length(x) - 2)
                                  ELSE x END),
                   lambda x: CASE WHEN length(x) > 3 AND suffix(x, 'e') THEN left(x, length(x) - 1)
                                  ELSE x END)) AS tokens
    FROM (
        SELECT args,
               list_filter(string_split_regex(lower(unescaped), '[^a-z0-9_.]+'),
                           lambda x: x <> '' AND x NOT IN ('a', 'an', 'the', 'in', 'for', 'of', 'to',
                                                           'and', 'or', 'on', 'at', 'by', 'with')) AS w
        -- JSON escapes (\n, \t, \r) are white space, not the letters n, t, r
        FROM (SELECT args, regexp_replace(args, '\\[ntr]', ' ', 'g') AS unescaped
              FROM (SELECT DISTINCT args FROM candidates))
    )
),
token_rows AS (  -- every token of every distinct argument string, as a number
    SELECT args, hash(unnest(tokens)) AS tok FROM words
),
token_order AS (  -- a global order of the tokens, rarest first (prefix filtering, below)
    SELECT tok, count(*) AS df FROM token_rows GROUP BY tok
),
sigs AS MATERIALIZED (  -- per distinct argument string: a number, its signature hash, distinct token hashes
           -- rarest first, and the first three tokens of its prefix: two strings with a Jaccard
           -- >= t share a token within the first n - ceil(t * n) + 1 tokens of each (n = its
           -- token count)
    SELECT args, row_number() OVER () AS aid, sig, toks, nt, plen,
           CASE WHEN plen >= 1 THEN toks[1] END AS p1,
           CASE WHEN plen >= 2 THEN toks[2] END AS p2,
           CASE WHEN plen >= 3 THEN toks[3] END AS p3
    FROM (
        SELECT w.args, hash(w.norm_args) AS sig, coalesce(t.toks, []::UBIGINT[]) AS toks,
               len(coalesce(t.toks, []::UBIGINT[])) AS nt,
               len(coalesce(t.toks, []::UBIGINT[]))
                   - ceil($similarity * len(coalesce(t.toks, []::UBIGINT[])) - 1e-9) + 1 AS plen
        FROM words w
        LEFT JOIN (SELECT r.args, list(r.tok ORDER BY o.df, r.tok) AS toks
                   FROM token_rows r JOIN token_order o USING (tok)
                   GROUP BY r.args) t USING (args)
    )
),
calls_sig AS MATERIALIZED (  -- narrow: each candidate call with its argument string's number
    SELECT c.call_idx, c.h, c.start_ns, c.SpanId, s.aid, s.sig, s.nt, s.plen, s.p1, s.p2, s.p3,
           c.source IN ('agent', 'delegation') AS handoff, c.basis
    FROM candidates c JOIN sigs s USING (args)
),
firsts AS (  -- the first call of each (group, basis, signature): identical calls link to it (an
             -- error text links only to the same error text, never to arguments that read alike)
    SELECT h, basis, sig, min(call_idx) AS first_idx FROM calls_sig GROUP BY h, basis, sig
),
neighbours AS MATERIALIZED (  -- each call with the (up to) 4 calls before it in its group, one sort
                              -- (delegations and invocations: by their task similarity, in Python;
                              -- errors and outputs: only identical ones link)
    SELECT call_idx, aid,
           lag(call_idx, 1) OVER w AS call_idx_1, lag(aid, 1) OVER w AS aid_1,
           lag(call_idx, 2) OVER w AS call_idx_2, lag(aid, 2) OVER w AS aid_2,
           lag(call_idx, 3) OVER w AS call_idx_3, lag(aid, 3) OVER w AS aid_3,
           lag(call_idx, 4) OVER w AS call_idx_4, lag(aid, 4) OVER w AS aid_4
    FROM calls_sig
    WHERE NOT handoff AND basis = 'arguments'
    WINDOW w AS (PARTITION BY h ORDER BY start_ns, SpanId)
),
neighbour_pairs AS (
    SELECT n.call_idx AS i, n.call_idx_1 AS j, n.aid AS aid_i, n.aid_1 AS aid_j
    FROM neighbours n WHERE 1 <= $neighbours AND n.call_idx_1 IS NOT NULL
    UNION ALL
    SELECT n.call_idx AS i, n.call_idx_2 AS j, n.aid AS aid_i, n.aid_2 AS aid_j
    FROM neighbours n WHERE 2 <= $neighbours AND n.call_idx_2 IS NOT NULL
    UNION ALL
    SELECT n.call_idx AS i, n.call_idx_3 AS j, n.aid AS aid_i, n.aid_3 AS aid_j
    FROM neighbours n WHERE 3 <= $neighbours AND n.call_idx_3 IS NOT NULL
    UNION ALL
    SELECT n.call_idx AS i, n.call_idx_4 AS j, n.aid AS aid_i, n.aid_4 AS aid_j
    FROM neighbours n WHERE 4 <= $neighbours AND n.call_idx_4 IS NOT NULL
),
pairs_i AS MATERIALIZED (  -- each neighbour pair with its later call's argument string. The two
                          -- sides are joined one at a time: joined at once, DuckDB may pair every
                          -- two distinct argument strings first on the filters below (a nested
                          -- loop: 103M rows for one 100,000-call run) and only then the pairs
    SELECT p.i, p.j, p.aid_i, p.aid_j, a.sig AS sig_i, a.nt AS nt_i, a.plen AS plen_i,
           a.p1 AS p1_i, a.p2 AS p2_i, a.p3 AS p3_i
    FROM neighbour_pairs p
    JOIN sigs a ON a.aid = p.aid_i
    WHERE a.nt > 0
),
candidate_pairs AS (  -- neighbours with other arguments that pass the size filter (a Jaccard is
                      -- at most min/max of the token counts) and the prefix filter (a shared
                      -- token among the first plen; not checked when plen > 3)
    SELECT p.i, p.j, p.aid_i, p.aid_j, p.nt_i, b.nt AS nt_j
    FROM pairs_i p
    JOIN sigs b ON b.aid = p.aid_j
    WHERE p.sig_i <> b.sig
      AND least(p.nt_i, b.nt) >= $similarity * greatest(p.nt_i, b.nt) - 1e-9
      AND (p.plen_i > 3 OR b.plen > 3 OR p.p1_i IN (b.p1, b.p2, b.p3) OR p.p2_i IN (b.p1, b.p2, b.p3)
           OR p.p3_i IN (b.p1, b.p2, b.p3))
),
near AS (  -- their exact token-set Jaccard
    SELECT i, j, common / (nt_i + nt_j - common) AS similarity
    FROM (
        SELECT p.i, p.j, p.nt_i, p.nt_j, len(list_intersect(a.toks, b.toks)) AS common
        FROM candidate_pairs p
        JOIN sigs a ON a.aid = p.aid_i
        JOIN sigs b ON b.aid = p.aid_j
    )
),
links AS (
    SELECT i, j, similarity FROM near WHERE similarity >= $similarity
    UNION ALL
    SELECT c.call_idx AS i, f.first_idx AS j, 1.0 AS similarity
    FROM calls_sig c JOIN firsts f ON f.h = c.h AND f.basis = c.basis AND f.sig = c.sig
    WHERE c.call_idx <> f.first_idx
),
linked AS (
    SELECT call_idx, list(other) AS linked, min(similarity) AS min_similarity
    FROM (SELECT i AS call_idx, j AS other, similarity FROM links
          UNION ALL SELECT j, i, similarity FROM links)
    GROUP BY call_idx
)
SELECT c.call_idx, c.TraceId, c.SpanId, c.run_id, c.agent, c.tool_name, c.Timestamp, c.start_ns,
       c.failing, c.rejected, c.source, c.args, w.norm_args, coalesce(l.linked, []::BIGINT[]) AS linked,
       l.min_similarity, c.basis
FROM candidates c
JOIN words w USING (args)
LEFT JOIN linked l USING (call_idx)
WHERE l.call_idx IS NOT NULL OR c.source IN ('agent', 'delegation') OR $all_calls::BOOLEAN

