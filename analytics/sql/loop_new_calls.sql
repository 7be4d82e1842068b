-- loop_new_calls (internal, analytics.loops_fold): the calls among the spans the changes
-- $after < seq <= $upto stored or changed that a fold can append to their (run, agent, tool)
-- groups: tool calls (_loop_tool_calls.sql: exactly what repeated_calls counts as one), and
-- delegations whose task is their own (goal_text: repeated_calls.sql's `delegations` reads other
-- spans' task statements only for hand-offs without one) and whose target never hands back to
-- the delegator in the run (a ping-pong's hand-offs are no calls). loop_changed_spans.sql names
-- the groups of the other delegations, which are recomputed.
WITH loop_spans AS NOT MATERIALIZED (
    SELECT s.*
    FROM spans s
    SEMI JOIN (SELECT DISTINCT TraceId, SpanId FROM span_changes WHERE seq > $after AND seq <= $upto) c
        ON c.TraceId = s.TraceId AND c.SpanId = s.SpanId
    WHERE s.ingested_at >= $since_ingested  -- the changes' bound (materialize.SpanChanges): newest row groups only
)
SELECT * FROM ({loop_tool_calls})
UNION ALL
SELECT TraceId, SpanId, run_id, agent_id AS agent, delegate_to AS tool_name, Timestamp, start_ns,
       goal_text AS args,
       coalesce(outcome IN ('error', 'rejected') OR StatusCode = 'Error', false) AS failing,
       coalesce(outcome = 'rejected', false) AS rejected, 'delegation' AS source, 'arguments' AS basis
FROM loop_spans d
WHERE op = 'delegate' AND run_id IS NOT NULL AND agent_id IS NOT NULL AND delegate_to IS NOT NULL
  AND agent_id <> delegate_to AND coalesce(goal_text, '') <> ''
  AND NOT EXISTS (SELECT 1 FROM spans b
                  WHERE b.op = 'delegate' AND b.run_id = d.run_id AND b.agent_id = d.delegate_to
                    AND b.delegate_to = d.agent_id)
