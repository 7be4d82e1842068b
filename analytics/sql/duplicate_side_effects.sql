-- duplicate_side_effects: a side effect executed more than once in a run, by idempotency key, or
-- by the same side-effecting tool with the same normalized arguments. Executed = not refused by a
-- guard and not failed. A by-arguments group whose calls all share one idempotency key is the
-- same finding as that key's group and is reported once.
-- Cost: only the columns used are read, straight from `spans` per use (so each use's selective
-- condition is pushed into its scan: by key, every executed call with a key; by arguments,
-- executed side effects); arguments are normalized once per distinct string; groups that repeat
-- are found by a hash of their key first, and the evidence lists are built for those groups only.
WITH executed AS NOT MATERIALIZED (
    SELECT TraceId, SpanId, run_id, agent_id, tool_name, idempotency_key, side_effect, Timestamp,
           start_ns, coalesce(tool_args, '') AS raw_args
    FROM spans
    WHERE {span_filter}
      AND coalesce(outcome, 'ok') = 'ok' AND StatusCode <> 'Error' AND op IS DISTINCT FROM 'read'
),
keyed AS NOT MATERIALIZED (  -- side effects and other calls with an idempotency key
    SELECT *, hash(run_id, idempotency_key) AS h FROM executed WHERE idempotency_key IS NOT NULL
),
effects AS NOT MATERIALIZED (SELECT * FROM executed WHERE side_effect AND tool_name IS NOT NULL),
by_key AS (
    SELECT 'idempotency_key' AS matched_by, run_id, min(tool_name) AS tool_name,
           idempotency_key, NULL::VARCHAR AS norm_args, count(*) AS executions,
           list_transform(list_sort(list({'t': start_ns, 'id': SpanId})), lambda x: x.id) AS span_ids, min(TraceId) AS trace_id,
           list_sort(list_distinct(list(agent_id))) AS agents,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM keyed
    WHERE h IN (SELECT h FROM keyed GROUP BY h HAVING count(*) > 1)
    GROUP BY run_id, idempotency_key
    HAVING count(*) > 1
),
normalized AS MATERIALIZED (
    SELECT raw_args, norm_args, dense_rank() OVER (ORDER BY norm_args) AS args_id  -- an integer to group by
    FROM (
        SELECT raw_args,
               regexp_replace(regexp_replace(lower(trim(raw_args)), '\s+', ' ', 'g'),
                              '\s*([{}\[\]:,"])\s*', '\1', 'g') AS norm_args
        FROM (SELECT DISTINCT raw_args FROM effects)
    )
),
with_args AS (
    SELECT e.*, n.args_id, n.norm_args, hash(e.run_id, e.tool_name, n.args_id) AS h
    FROM effects e JOIN normalized n USING (raw_args)
),
by_args AS (
    SELECT 'arguments' AS matched_by, run_id, tool_name,
           NULL::VARCHAR AS idempotency_key, any_value(norm_args) AS norm_args, count(*) AS executions,
           list_transform(list_sort(list({'t': start_ns, 'id': SpanId})), lambda x: x.id) AS span_ids, min(TraceId) AS trace_id,
           list_sort(list_distinct(list(agent_id))) AS agents,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM with_args
    WHERE h IN (SELECT h FROM with_args GROUP BY h HAVING count(*) > 1)
    GROUP BY run_id, tool_name, args_id
    HAVING count(*) > 1
       AND NOT (count(idempotency_key) = count(*) AND min(idempotency_key) = max(idempotency_key))
)
SELECT trace_id, span_ids, run_id, agents, tool_name, matched_by, idempotency_key,
       norm_args AS arguments, executions, first_seen, last_seen
FROM (SELECT * FROM by_key UNION ALL SELECT * FROM by_args)
WHERE $agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR)
ORDER BY first_seen, run_id, matched_by DESC, tool_name, idempotency_key, arguments
