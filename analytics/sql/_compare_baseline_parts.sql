-- Shared fragment of the crew baseline (issue 35): its parts from three relations per baseline
-- run the statement defines: ``sequences`` (_compare_sequences_of.sql), ``run_steps``
-- (_compare_run_steps_of.sql) and ``subjects`` (_compare_subjects_of.sql). One row per ``part``:
-- * 'run': one per distinct sequence: ``steps``, ``run_count`` (how many baseline runs took it)
--   and ``run_id`` (the newest of them);
-- * 'count': per run and (agent, operation, tool): calls, errors, refusals, tokens, cost (sums),
--   first_ns (its first span, ns after the run's first);
-- * 'subject': per (agent, operation, tool) over the runs: the median over runs of each run's
--   median and p95 duration (ms), of its median argument length and of its distinct argument
--   texts; max_hop, delegates_to and arg_shapes over every run;
-- * 'step': each distinct step hash (``steps``, a list of one) with its fields (to name the steps
--   a departure expected).
SELECT 'run' AS part, list(run_id ORDER BY first_ns DESC, run_id DESC)[1] AS run_id,
       any_value(steps) AS steps, count(*) AS run_count, NULL::VARCHAR AS agent,
       NULL::VARCHAR AS operation, NULL::VARCHAR AS tool, NULL::VARCHAR AS arg_shape,
       NULL::VARCHAR AS status, NULL::BIGINT AS calls, NULL::BIGINT AS errors,
       NULL::BIGINT AS refusals, NULL::DOUBLE AS tokens, NULL::DOUBLE AS cost,
       NULL::BIGINT AS first_ns, NULL::DOUBLE AS duration_ms_median, NULL::DOUBLE AS duration_ms_p95,
       NULL::INTEGER AS max_hop, NULL::VARCHAR[] AS delegates_to, NULL::VARCHAR[] AS arg_shapes,
       NULL::DOUBLE AS arg_chars_median, NULL::DOUBLE AS distinct_args
FROM sequences
GROUP BY sequence
UNION ALL
SELECT 'count', c.run_id, NULL, NULL, agent, operation, tool, NULL, NULL, calls, errors, refusals,
       tokens::DOUBLE, cost::DOUBLE, c.first_ns - r.first_ns, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM subjects AS c JOIN sequences AS r USING (run_id)
UNION ALL
SELECT 'subject', NULL, NULL, NULL, agent, operation, tool, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, median(duration_ns_median::DOUBLE) / 1e6, median(duration_ns_p95::DOUBLE) / 1e6,
       max(max_hop::INTEGER),
       list_sort(list_distinct(flatten(list(delegates_to::VARCHAR[])))),
       list_sort(list_distinct(flatten(list(arg_shapes::VARCHAR[])))),
       median(arg_chars_median::DOUBLE), median(distinct_args::DOUBLE)
FROM subjects
GROUP BY agent, operation, tool
UNION ALL
SELECT 'step', NULL, [step], NULL, any_value(agent), any_value(operation), any_value(tool),
       any_value(arg_shape), any_value(status), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL
FROM run_steps
GROUP BY step
