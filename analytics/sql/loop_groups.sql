-- loop_groups (internal, analytics.loops_live): the loops of the (run, tool) groups {keys}
-- selects (every group: true) from the loop fold's kept calls ({kept_calls}:
-- analytics.loops_fold, each call with its component `comp`), one row per loop, as
-- analytics.loops.loop_rows forms them from a full computation's linked calls (the tests hold
-- the two equal): a component of one (run, agent, tool) group (a 64-bit hash collision that
-- merged two groups is split by the group) with $min_calls+ executed, or $min_calls+ refused,
-- calls; its members in time order (start, then span id), "first" meaning the first of them.
-- Grouped here, not in pandas: the changed groups of long runs hold hundreds of thousands of
-- kept calls, and only the loops' rows leave the database.
WITH groups AS (
    SELECT TraceId, SpanId, run_id, agent, tool_name, Timestamp, start_ns, failing, rejected, source, args,
           norm_args, basis, min_similarity, comp
    FROM {kept_calls}
    WHERE {keys}
),
members AS (  -- kept calls of components big enough to hold a loop
    SELECT * FROM groups
    WHERE comp IN (SELECT comp FROM groups GROUP BY comp HAVING count(*) >= $min_calls)
),
loops AS (
    SELECT arg_min(TraceId, (start_ns, SpanId)) AS trace_id,
           list(SpanId ORDER BY start_ns, SpanId) AS span_ids,
           run_id, nullif(agent, '') AS agent, tool_name,
           arg_min(source, (start_ns, SpanId)) AS call_type,
           count(DISTINCT norm_args) AS distinct_arguments,
           arg_min(basis, (start_ns, SpanId)) AS basis,
           arg_min(norm_args, (start_ns, SpanId)) AS first_signature,
           arg_min(args, (start_ns, SpanId)) AS first_args,
           bool_and(failing) AS failing,
           count(*) AS calls,
           count(*) FILTER (WHERE failing) AS failing_calls,
           count(*) FILTER (WHERE rejected) AS refused,
           min(min_similarity) AS min_similarity,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM members
    GROUP BY comp, run_id, agent, tool_name
    HAVING count(*) - count(*) FILTER (WHERE rejected) >= $min_calls
        OR count(*) FILTER (WHERE rejected) >= $min_calls
)
SELECT trace_id, span_ids, run_id, agent, tool_name, call_type,
       CASE WHEN distinct_arguments = 1 THEN 'exact' ELSE 'near_duplicate' END AS kind,
       CASE WHEN basis <> 'arguments' THEN basis
            WHEN distinct_arguments = 1 THEN 'arguments' ELSE 'similar arguments' END AS matched_on,
       failing, calls, failing_calls - refused AS failed, refused, distinct_arguments, min_similarity,
       CASE WHEN basis = 'arguments' THEN first_signature ELSE substring(first_args, 1, 200) END AS signature,
       first_seen, last_seen
FROM loops
ORDER BY first_seen, run_id, tool_name
