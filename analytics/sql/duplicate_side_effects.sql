-- duplicate_side_effects: a side effect executed more than once in a run, by idempotency key, or
-- by the same side-effecting tool with the same normalized arguments. Executed = not refused by a
-- guard and not failed. A by-arguments group whose calls all share one idempotency key is the
-- same finding as that key's group and is reported once.
WITH s AS ({filtered_spans}),
effects AS (
    SELECT *,
           regexp_replace(regexp_replace(lower(trim(coalesce(tool_args, ''))), '\s+', ' ', 'g'),
                          '\s*([{}\[\]:,"])\s*', '\1', 'g') AS norm_args
    FROM s
    WHERE (side_effect OR idempotency_key IS NOT NULL)
      AND coalesce(outcome, 'ok') = 'ok' AND StatusCode <> 'Error'
      AND op IS DISTINCT FROM 'read'
),
by_key AS (
    SELECT 'idempotency_key' AS matched_by, run_id, min(tool_name) AS tool_name,
           idempotency_key, NULL::VARCHAR AS norm_args, count(*) AS executions,
           list(SpanId ORDER BY start_ns) AS span_ids, min(TraceId) AS trace_id,
           coalesce(list_sort(list(DISTINCT agent_id) FILTER (WHERE agent_id IS NOT NULL)), []::VARCHAR[]) AS agents,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM effects WHERE idempotency_key IS NOT NULL
    GROUP BY run_id, idempotency_key HAVING count(*) > 1
),
by_args AS (
    SELECT 'arguments' AS matched_by, run_id, tool_name,
           NULL::VARCHAR AS idempotency_key, norm_args, count(*) AS executions,
           list(SpanId ORDER BY start_ns) AS span_ids, min(TraceId) AS trace_id,
           coalesce(list_sort(list(DISTINCT agent_id) FILTER (WHERE agent_id IS NOT NULL)), []::VARCHAR[]) AS agents,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM effects WHERE side_effect AND tool_name IS NOT NULL
    GROUP BY run_id, tool_name, norm_args
    HAVING count(*) > 1
       AND NOT (count(DISTINCT idempotency_key) = 1 AND count(idempotency_key) = count(*))
)
SELECT trace_id, span_ids, run_id, agents, tool_name, matched_by, idempotency_key,
       norm_args AS arguments, executions, first_seen, last_seen
FROM (SELECT * FROM by_key UNION ALL SELECT * FROM by_args)
WHERE $agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR)
ORDER BY first_seen
