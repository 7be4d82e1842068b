-- loop_touched_groups (internal, analytics.loops.update_repeated_calls): the (run, tool) groups of
-- repeated_calls that the spans of $traces (the traces new spans touched) may have changed.
--   'touched': every name a span of those traces can be a call of, or change the calls of: its
--       tool, the agent it delegates to and the delegating agent (a hand-off back removes the
--       delegations both ways), the agent an agent span invokes;
--   'code': runs with an LLM output holding code in those traces (code calls: the whole run);
--   'handoff': in the runs of those traces and $old_runs, every hand-off group (delegations,
--       agent invocations, transfer_to_<agent> tools): a new ping-pong can drop their loops.
WITH touched AS (
    SELECT run_id, tool_name, delegate_to, op, agent_id, agent_name, SpanName, span_family, output_text
    FROM spans
    WHERE TraceId = ANY($traces::VARCHAR[]) AND run_id IS NOT NULL
),
touched_runs AS (
    SELECT run_id FROM touched
    UNION
    SELECT unnest($old_runs::VARCHAR[])
)
SELECT DISTINCT run_id, tool, 'touched' AS kind
FROM (
    SELECT run_id,
           unnest([tool_name, delegate_to,
                   CASE WHEN span_family = 'agent' THEN coalesce(agent_id, agent_name, SpanName) END,
                   CASE WHEN op = 'delegate' THEN agent_id END]) AS tool
    FROM touched
)
WHERE tool IS NOT NULL
UNION ALL
SELECT DISTINCT run_id, NULL AS tool, 'code' AS kind
FROM touched
WHERE span_family = 'llm' AND (contains(output_text, '<code>') OR contains(output_text, '```'))
UNION ALL
SELECT DISTINCT run_id, tool, 'handoff' AS kind
FROM (
    SELECT run_id,
           CASE WHEN op = 'delegate' THEN delegate_to
                WHEN span_family = 'agent' THEN coalesce(agent_id, agent_name, SpanName)
                ELSE tool_name END AS tool
    FROM spans
    WHERE run_id IN (SELECT run_id FROM touched_runs)
      AND ($runs_since::TIMESTAMP IS NULL OR Timestamp >= $runs_since::TIMESTAMP)
      AND (op = 'delegate' OR span_family = 'agent' OR starts_with(tool_name, $handoff_prefix))
)
WHERE tool IS NOT NULL
