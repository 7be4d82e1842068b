-- duplicate_side_effects: a side effect executed more than once in a run, by idempotency key, or
-- by the same side-effecting tool with the same normalized arguments. Executed = not refused by a
-- guard and not failed. Arguments that were not recorded (a framework's default telemetry) are
-- not equal arguments: such calls are matched by idempotency key only. A by-arguments group whose calls all share one idempotency key is the
-- same finding as that key's group and is reported once.
-- Cost: groups that repeat are found first over narrow columns, by a hash of their key (a
-- collision only keeps a few more groups); only their calls are then read in full and get
-- evidence lists. Keyed calls and side effects are read straight from `spans` per use, so each
-- use's selective condition is pushed into its scan; arguments are normalized once per distinct
-- string.
WITH executed AS NOT MATERIALIZED (
    SELECT TraceId, SpanId, run_id, agent_id, tool_name, idempotency_key, side_effect, op, Timestamp,
           start_ns, coalesce(tool_args, '') AS raw_args, tool_args IS NOT NULL AS args_recorded, rowid AS row_id
    FROM spans
    WHERE {span_filter}
      AND coalesce(outcome, 'ok') = 'ok' AND StatusCode <> 'Error' AND op IS DISTINCT FROM 'read'
),
repeated_keys AS (  -- (run, idempotency key) executed twice or more: side effects and other calls
    SELECT hash(run_id, idempotency_key) AS h
    FROM executed
    WHERE idempotency_key IS NOT NULL
    GROUP BY h
    HAVING count(*) > 1
),
by_key AS (
    SELECT 'idempotency_key' AS matched_by, run_id, min(tool_name) AS tool_name,
           idempotency_key, NULL::VARCHAR AS norm_args, count(*) AS executions,
           list_transform(list_sort(list({'t': start_ns, 'id': SpanId})), lambda x: x.id) AS span_ids, min(TraceId) AS trace_id,
           list_sort(list_distinct(list(agent_id))) AS agents,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM executed
    WHERE idempotency_key IS NOT NULL
      AND hash(run_id, idempotency_key) IN (SELECT h FROM repeated_keys)
    GROUP BY run_id, idempotency_key
    HAVING count(*) > 1
),
-- Side effects: driftscope.side_effect decides when a span carries it (false included); a tool
-- call without it and without a driftscope op (a framework's tool call; a guard's state write
-- is the state detectors' business) is one when its tool's MCP annotations say so (readOnlyHint
-- false, or destructiveHint true; readOnlyHint true: not one), else when its tool name matches
-- $side_effect_tools and not $side_effect_exclude, on the name as written or on its lower-case
-- words joined by '_' (sendEmail, send-email -> send_email; analytics/side_effects.py). Names
-- are classified once per distinct name; annotations describe a tool, so they are read from one
-- call of each (its attributes only: a rowid semi-join).
named_tools AS MATERIALIZED (
    SELECT tool_name, min(row_id) AS row_id
    FROM executed
    WHERE side_effect IS NULL AND op IS NULL AND tool_name IS NOT NULL
    GROUP BY tool_name
),
tool_hints AS MATERIALIZED (
    SELECT tool_name,
           lower(list_filter(SpanAttributes, lambda a: a.key ILIKE '%readonlyhint' OR a.key ILIKE '%read\_only\_hint' ESCAPE '\')[1].value) AS read_only,
           lower(list_filter(SpanAttributes, lambda a: a.key ILIKE '%destructivehint' OR a.key ILIKE '%destructive\_hint' ESCAPE '\')[1].value) AS destructive
    FROM spans
    WHERE rowid IN (SELECT row_id FROM named_tools)
),
inferred_tools AS MATERIALIZED (
    SELECT tool_name
    FROM (SELECT n.tool_name, h.read_only, h.destructive,
                 lower(regexp_replace(regexp_replace(n.tool_name, '([a-z0-9])([A-Z])', '\1_\2', 'g'),
                                      '[^A-Za-z0-9]+', '_', 'g')) AS words
          FROM named_tools n LEFT JOIN tool_hints h USING (tool_name))
    WHERE coalesce(
        CASE WHEN read_only = 'true' THEN false WHEN read_only = 'false' OR destructive = 'true' THEN true END,
        (regexp_matches(tool_name, $side_effect_tools::VARCHAR) OR regexp_matches(words, $side_effect_tools::VARCHAR))
        AND ($side_effect_exclude::VARCHAR IS NULL
             OR NOT (regexp_matches(tool_name, $side_effect_exclude::VARCHAR)
                     OR regexp_matches(words, $side_effect_exclude::VARCHAR))))
),
effects AS NOT MATERIALIZED (  -- (by arguments: a call whose arguments were not recorded matches none)
    SELECT * FROM executed
    WHERE tool_name IS NOT NULL AND args_recorded
      AND coalesce(side_effect, op IS NULL AND tool_name IN (SELECT tool_name FROM inferred_tools))
),
normalized AS MATERIALIZED (
    SELECT raw_args, hash(raw_args) AS raw_hash, norm_args,
           dense_rank() OVER (ORDER BY norm_args) AS args_id  -- an integer to group by
    FROM (
        SELECT raw_args,
               regexp_replace(regexp_replace(lower(trim(raw_args)), '\s+', ' ', 'g'),
                              '\s*([{}\[\]:,"])\s*', '\1', 'g') AS norm_args
        FROM (SELECT DISTINCT raw_args FROM effects)
    )
),
repeated_args AS (  -- (run, tool, normalized arguments) executed twice or more
    SELECT hash(e.run_id, e.tool_name, n.args_id) AS h
    FROM effects e JOIN normalized n ON hash(e.raw_args) = n.raw_hash
    GROUP BY h
    HAVING count(*) > 1
),
with_args AS (
    SELECT e.*, n.args_id, n.norm_args
    FROM effects e JOIN normalized n USING (raw_args)
    WHERE hash(e.run_id, e.tool_name, n.args_id) IN (SELECT h FROM repeated_args)
),
by_args AS (
    SELECT 'arguments' AS matched_by, run_id, tool_name,
           NULL::VARCHAR AS idempotency_key, any_value(norm_args) AS norm_args, count(*) AS executions,
           list_transform(list_sort(list({'t': start_ns, 'id': SpanId})), lambda x: x.id) AS span_ids, min(TraceId) AS trace_id,
           list_sort(list_distinct(list(agent_id))) AS agents,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM with_args
    GROUP BY run_id, tool_name, args_id
    HAVING count(*) > 1
       AND NOT (count(idempotency_key) = count(*) AND min(idempotency_key) = max(idempotency_key))
)
SELECT trace_id, span_ids, run_id, agents, tool_name, matched_by, idempotency_key,
       norm_args AS arguments, executions, first_seen, last_seen
FROM (SELECT * FROM by_key UNION ALL SELECT * FROM by_args)
WHERE $agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR)
ORDER BY first_seen, run_id, matched_by DESC, tool_name, idempotency_key, arguments
