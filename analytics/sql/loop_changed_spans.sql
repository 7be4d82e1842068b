-- loop_changed_spans (internal, analytics.loops_fold): the (run, tool) groups whose calls the
-- spans the changes $after < seq <= $upto stored or changed can change otherwise than by being
-- tool calls of their own: a fold cannot append to these, they are recomputed. `tool` is '*'
-- for every group of the run.
--   * an agent span with an input (a task an invocation may be), or an LLM output holding code:
--     every name it is, or can change, a call of (the keys analytics.materialize.RUN_TOOL_KEYS_SQL
--     derives: the agent an agent span is; code calls name any tool of the run). An agent span
--     without input is no invocation: it matters only as an agent chain's link (below);
--   * a hand-off (a delegation from one agent to another) loop_new_calls.sql does not append (no
--     task of its own, or its target hands back to the delegator: then the delegator's hand-offs
--     from the target are no calls either): its target's and its delegator's groups. A delegate
--     span without both agents is no hand-off yet (its agent is resolved when its parent comes:
--     then it is changed, and appended or its groups recomputed); not when the two agents
--     handed off both ways before these changes (what the kept calls hold: a span no change
--     after $after lists, even one committed after $upto, was folded), as they do at every turn
--     of a crew whose agents delegate to each other;
--   * a span stored after children stored before it (an exporter sends a parent when it ends,
--     after its children): the chain of an agent's spans an invocation climbs may now reach
--     further, and the entry's parent names the caller: the groups of those children's agents.
WITH changed AS (
    SELECT DISTINCT TraceId, SpanId FROM span_changes WHERE seq > $after AND seq <= $upto
),
touched AS (
    SELECT s.TraceId, s.SpanId, s.run_id, s.tool_name, s.delegate_to, s.agent_id, s.agent_name, s.SpanName,
           s.span_family, s.op, s.goal_text, s.input_text,
           coalesce(s.span_family = 'llm' AND (contains(s.output_text, '<code>') OR contains(s.output_text, '```')),
                    false) AS has_code
    FROM spans s
    SEMI JOIN changed c ON c.TraceId = s.TraceId AND c.SpanId = s.SpanId
    WHERE s.ingested_at >= $since_ingested  -- the changes' bound (materialize.SpanChanges)
),
folded_handoffs AS MATERIALIZED (  -- the hand-offs of the touched runs no change after $after lists
    SELECT s.run_id, s.agent_id, s.delegate_to
    FROM spans s
    WHERE s.op = 'delegate' AND s.run_id IN (SELECT run_id FROM touched WHERE op = 'delegate')
      AND NOT EXISTS (SELECT 1 FROM span_changes c
                      WHERE c.seq > $after AND c.TraceId = s.TraceId AND c.SpanId = s.SpanId)
),
others AS (
    SELECT run_id,
           unnest([tool_name, delegate_to, agent_id,
                   CASE WHEN span_family = 'agent' THEN coalesce(agent_id, agent_name, SpanName) END,
                   CASE WHEN has_code THEN '*' END]) AS tool
    FROM touched
    WHERE run_id IS NOT NULL AND ((span_family = 'agent' AND input_text IS NOT NULL) OR has_code)
    UNION ALL
    SELECT run_id, unnest([delegate_to, agent_id]) AS tool
    FROM touched d
    WHERE run_id IS NOT NULL AND op = 'delegate'
      AND agent_id IS NOT NULL AND delegate_to IS NOT NULL AND agent_id <> delegate_to
      AND (coalesce(goal_text, '') = ''
           OR EXISTS (SELECT 1 FROM spans b
                      WHERE b.op = 'delegate' AND b.run_id = d.run_id AND b.agent_id = d.delegate_to
                        AND b.delegate_to = d.agent_id))
      -- a pair of agents whose hand-offs both ways were folded before (bounced: none of them a
      -- call, nor an invocation of one by the other) stays so whatever it hands off again
      AND NOT (EXISTS (SELECT 1 FROM folded_handoffs b
                       WHERE b.run_id = d.run_id AND b.agent_id = d.delegate_to AND b.delegate_to = d.agent_id)
               AND EXISTS (SELECT 1 FROM folded_handoffs b
                           WHERE b.run_id = d.run_id AND b.agent_id = d.agent_id AND b.delegate_to = d.delegate_to))
),
earlier_children AS (
    SELECT c.run_id,
           unnest([c.agent_id,
                   CASE WHEN c.span_family = 'agent' THEN coalesce(c.agent_id, c.agent_name, c.SpanName) END]) AS tool
    FROM spans c
    JOIN touched t ON c.TraceId = t.TraceId AND c.ParentSpanId = t.SpanId
    WHERE c.run_id IS NOT NULL
      AND c.ingested_at >= $since_ingested  -- a touched trace's spans are all within the bound
      AND NOT EXISTS (SELECT 1 FROM changed x WHERE x.TraceId = c.TraceId AND x.SpanId = c.SpanId)
)
SELECT DISTINCT run_id, tool
FROM (SELECT * FROM others UNION ALL SELECT * FROM earlier_children)
WHERE tool IS NOT NULL
