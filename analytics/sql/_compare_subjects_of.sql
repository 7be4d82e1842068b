-- Shared fragment (issue 35): per run of ``s`` (_compare_spans.sql's rows) and (agent, operation,
-- tool): calls, errors, refusals, tokens and cost (sums), its first span's start, the median and
-- p95 of its durations, its deepest hop, the agents it hands work to, its argument shapes, the
-- median length of its arguments and how many distinct argument texts it passes.
SELECT run_id, agent, operation, tool, count(*) AS calls,
       count(*) FILTER (WHERE is_error) AS errors, count(*) FILTER (WHERE is_refused) AS refusals,
       sum(tokens)::DOUBLE AS tokens, sum(cost)::DOUBLE AS cost, min(start_ns) AS first_ns,
       median(duration_ns)::DOUBLE AS duration_ns_median,
       quantile_cont(duration_ns, 0.95)::DOUBLE AS duration_ns_p95, max(hop)::INTEGER AS max_hop,
       list_sort(list(DISTINCT delegate_to) FILTER (WHERE delegate_to IS NOT NULL)) AS delegates_to,
       list_sort(list(DISTINCT arg_shape) FILTER (WHERE arg_shape <> '')) AS arg_shapes,
       median(arg_chars)::DOUBLE AS arg_chars_median,
       count(DISTINCT arg_hash) FILTER (WHERE arg_chars IS NOT NULL) AS distinct_args
FROM s
GROUP BY run_id, agent, operation, tool
