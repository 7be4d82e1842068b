-- Every span of one run, in start order, with the fields the run explorer shows. With
-- $containing (a list of texts), only the spans whose tool arguments, input text or goal text
-- contain one of them (a report looking for where a constraint id is stated).
SELECT
    Timestamp, TraceId AS trace_id, SpanId AS span_id, ParentSpanId AS parent_span_id,
    SpanName AS span_name, SpanKind AS span_kind, ServiceName AS service, Duration AS duration_ns,
    start_ns, end_ns, StatusCode AS status_code, StatusMessage AS status_message,
    span_family, operation, agent_id, agent_source, tool_name, tool_args, tool_result, op,
    state_key, state_version, state_expected_version, outcome, reject_reason, task_id,
    origin_task_id, hop, delegate_to, constraints_ledger, constraints_carried, constraints_waived,
    waiver_reasons, goal_root, goal_text, objective_id, objective_version, policy_version, step,
    budget_max_steps, idempotency_key, side_effect, input_text, output_text,
    SpanAttributes AS attributes, Events AS events
FROM spans
WHERE run_id = $run
  AND ($containing::VARCHAR[] IS NULL
       OR len(list_filter($containing::VARCHAR[], lambda n: contains(coalesce(tool_args, ''), n)
                          OR contains(coalesce(input_text, ''), n) OR contains(coalesce(goal_text, ''), n))) > 0)
ORDER BY start_ns, SpanId
LIMIT $limit
