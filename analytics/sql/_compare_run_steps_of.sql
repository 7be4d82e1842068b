-- Shared fragment (issue 35): per run of ``s`` (_compare_spans.sql's rows), each distinct step it
-- takes with its fields (to name the steps a departure expected).
SELECT run_id, step, any_value(agent) AS agent, any_value(operation) AS operation,
       any_value(tool) AS tool, any_value(arg_shape) AS arg_shape, any_value(status) AS status
FROM s
GROUP BY run_id, step
