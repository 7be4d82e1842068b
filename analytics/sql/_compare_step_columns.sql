-- Shared fragment of the run comparison (issue 35): the columns of a span's step and what the
-- crew baseline summarises (compare_steps.sql, compare_baseline.sql).
-- * operation: driftscope.op, else gen_ai.operation.name, else the span family.
-- * tool: the tool name; a delegation's target agent is part of its step ("-> agent").
-- * status: 'error' (outcome error or status Error), 'refused' (a guard refused it) or '': a
--   call that failed is not the step a healthy run takes there.
-- * arg_shape: the sorted top-level keys of JSON-object tool arguments, 'text' for other
--   arguments, '' for none (values are not part of a step: every run asks other questions).
-- * tokens / cost: numeric attributes of LLM spans naming tokens (totals left out: they repeat
--   the parts) or cost, summed; NULL when the span has none.
    coalesce(agent_id, '') AS agent,
    coalesce(op, operation, span_family, 'span') AS operation,
    CASE WHEN delegate_to IS NULL THEN coalesce(tool_name, '')
         ELSE coalesce(tool_name, 'hand-off') || ' -> ' || delegate_to END AS tool,
    CASE
        WHEN tool_args IS NULL OR tool_args = '' THEN ''
        WHEN left(ltrim(tool_args), 1) = '{' AND json_valid(tool_args)
            THEN '{' || array_to_string(list_sort(json_keys(tool_args)), ',') || '}'
        ELSE 'text'
    END AS arg_shape,
    length(tool_args) AS arg_chars,
    hash(tool_args) AS arg_hash,
    delegate_to,
    coalesce(outcome = 'error', FALSE) OR StatusCode = 'Error' AS is_error,
    coalesce(outcome = 'rejected', FALSE) AS is_refused,
    CASE WHEN outcome = 'rejected' THEN 'refused'
         WHEN outcome = 'error' OR StatusCode = 'Error' THEN 'error' ELSE '' END AS status,
    Duration AS duration_ns,
    hop,
    start_ns,
    CASE WHEN span_family = 'llm' THEN list_sum(list_transform(
        list_filter(SpanAttributes, lambda e: contains(lower(e.key), 'token') AND NOT contains(lower(e.key), 'total')),
        lambda e: TRY_CAST(e.value AS DOUBLE))) END AS tokens,
    CASE WHEN span_family = 'llm' THEN list_sum(list_transform(
        list_filter(SpanAttributes, lambda e: contains(lower(e.key), 'cost')),
        lambda e: TRY_CAST(e.value AS DOUBLE))) END AS cost
