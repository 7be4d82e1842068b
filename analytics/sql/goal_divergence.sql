-- goal_divergence (pairs): one row per subtask span with the raw root-goal text and the raw
-- subtask text; Python extracts the task statements, embeds them and scores 1 - cosine.
-- driftscope traces: subtask = driftscope.goal.text; root = driftscope.goal.root on the span,
-- else the goal.root of its origin task, else of its trace.
-- Other traces (OpenInference / OpenLLMetry, no driftscope.goal.* in the trace): root = the
-- input of the trace's top agent/chain span, subtasks = the inputs of nested agent spans.
-- Subtasks a guard refused are left out (they did not happen), and a guard's check span is
-- folded into the delegation it checked.
WITH s AS ({filtered_spans}),
explicit AS (
    SELECT x.TraceId, x.SpanId, x.run_id, x.agent_id, x.delegate_to, x.origin_task_id, x.hop,
           x.Timestamp,
           coalesce(x.goal_root,
                    (SELECT arg_min(g.goal_root, g.start_ns) FROM spans g
                      WHERE g.goal_root IS NOT NULL AND g.origin_task_id = x.origin_task_id),
                    (SELECT arg_min(g.goal_root, g.start_ns) FROM spans g
                      WHERE g.goal_root IS NOT NULL AND g.TraceId = x.TraceId)) AS root_raw,
           x.goal_text AS subtask_raw,
           'driftscope' AS source
    FROM s x
    WHERE x.goal_text IS NOT NULL
      AND coalesce(x.outcome, 'ok') <> 'rejected'            -- a refused subtask never ran
      AND NOT (coalesce(x.op, '') = 'step'                    -- a guard's check of a delegation
               AND EXISTS (SELECT 1 FROM s d WHERE d.op = 'delegate' AND d.run_id = x.run_id
                                              AND d.goal_text = x.goal_text))
),
plain_traces AS (
    SELECT TraceId FROM spans
    WHERE TraceId IN (SELECT DISTINCT TraceId FROM s)
    GROUP BY TraceId
    HAVING count(goal_text) = 0 AND count(goal_root) = 0
),
tops AS (
    SELECT TraceId, SpanId AS top_span, input_text AS root_raw FROM (
        SELECT TraceId, SpanId, input_text,
               row_number() OVER (PARTITION BY TraceId ORDER BY start_ns, Duration DESC, SpanId) AS rank
        FROM spans
        WHERE TraceId IN (SELECT TraceId FROM plain_traces)
          AND span_family IN ('agent', 'chain') AND input_text IS NOT NULL)
    WHERE rank = 1
),
inferred AS (
    SELECT x.TraceId, x.SpanId, x.run_id, coalesce(x.agent_id, x.graph_node_id, x.SpanName) AS agent_id,
           x.delegate_to, x.origin_task_id, x.hop,
           x.Timestamp, t.root_raw, x.input_text AS subtask_raw, 'inferred' AS source
    FROM s x JOIN tops t USING (TraceId)
    WHERE x.span_family = 'agent' AND x.SpanId <> t.top_span AND x.input_text IS NOT NULL
)
SELECT TraceId AS trace_id, [SpanId] AS span_ids, run_id, agent_id AS agent, delegate_to,
       origin_task_id, hop, root_raw, subtask_raw, source,
       Timestamp AS first_seen, Timestamp AS last_seen
FROM (SELECT * FROM explicit UNION ALL SELECT * FROM inferred)
WHERE root_raw IS NOT NULL
  AND ($agent::VARCHAR IS NULL OR $agent::VARCHAR IN (agent_id, delegate_to))
ORDER BY first_seen, trace_id, span_ids
