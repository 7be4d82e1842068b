-- The crew baseline of a run comparison (issue 35) in one pass over the baseline runs' spans
-- ($runs), each span's step columns computed once (_compare_step_columns.sql). One row per
-- ``part``:
-- * 'run': run_id, ``steps``: the step hashes of the run in start order (compare_steps.sql's hash);
-- * 'count': per run and (agent, operation, tool): calls, errors, refusals, tokens, cost (sums),
--   first_ns (its first span, ns after the run's first);
-- * 'subject': per (agent, operation, tool) over every run: duration median and p95 (ms),
--   max_hop, delegates_to, arg_shapes, arg_chars_median, distinct_args (distinct argument texts);
-- * 'step': each distinct step hash (``steps``, a list of one) with its fields (to name the steps
--   a departure expected).
WITH s AS MATERIALIZED (
    SELECT *, hash(agent, operation, tool, arg_shape, status) AS step
    FROM (
        SELECT run_id, SpanId, {compare_step_columns}
        FROM spans
        WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))
    )
),
per_run AS (
    SELECT run_id, list(step ORDER BY start_ns, SpanId) AS steps, min(start_ns) AS first_ns
    FROM s GROUP BY run_id
)
SELECT 'run' AS part, run_id, steps, NULL::VARCHAR AS agent,
       NULL::VARCHAR AS operation, NULL::VARCHAR AS tool, NULL::VARCHAR AS arg_shape,
       NULL::VARCHAR AS status, NULL::BIGINT AS calls, NULL::BIGINT AS errors,
       NULL::BIGINT AS refusals, NULL::DOUBLE AS tokens, NULL::DOUBLE AS cost,
       NULL::BIGINT AS first_ns, NULL::DOUBLE AS duration_ms_median, NULL::DOUBLE AS duration_ms_p95,
       NULL::INTEGER AS max_hop, NULL::VARCHAR[] AS delegates_to, NULL::VARCHAR[] AS arg_shapes,
       NULL::DOUBLE AS arg_chars_median, NULL::BIGINT AS distinct_args
FROM per_run
UNION ALL
SELECT 'count', s.run_id, NULL, agent, operation, tool, NULL, NULL, count(*),
       count(*) FILTER (WHERE is_error), count(*) FILTER (WHERE is_refused), sum(tokens), sum(cost),
       min(start_ns) - any_value(r.first_ns), NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM s JOIN per_run AS r USING (run_id)
GROUP BY s.run_id, agent, operation, tool
UNION ALL
SELECT 'subject', NULL, NULL, agent, operation, tool, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, median(duration_ns) / 1e6, quantile_cont(duration_ns, 0.95) / 1e6, max(hop),
       list_sort(list(DISTINCT delegate_to) FILTER (WHERE delegate_to IS NOT NULL)),
       list_sort(list(DISTINCT arg_shape) FILTER (WHERE arg_shape <> '')), median(arg_chars),
       count(DISTINCT arg_hash) FILTER (WHERE arg_chars IS NOT NULL)
FROM s
GROUP BY agent, operation, tool
UNION ALL
SELECT 'step', NULL, [step], any_value(agent), any_value(operation), any_value(tool),
       any_value(arg_shape), any_value(status), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL
FROM s
GROUP BY step
