-- The spans named by (run_id, span_id) pairs (registered as `_evidence_keys`), in start order:
-- what a report or the dashboard shows as a finding's evidence.
SELECT s.run_id, s.SpanId AS span_id, s.TraceId AS trace_id, s.Timestamp, s.start_ns,
       s.SpanName AS span_name, s.agent_id, s.tool_name, s.op, s.outcome, s.reject_reason,
       s.StatusCode AS status_code, s.goal_root, s.goal_text, s.tool_args, s.tool_result,
       s.input_text, s.output_text, s.StatusMessage AS status_message
FROM spans AS s
JOIN _evidence_keys AS k ON s.run_id = k.run_id AND s.SpanId = k.span_id
ORDER BY s.start_ns, s.SpanId
