-- Shared fragment of the goal-divergence SQL (goal_divergence, goal_run_stats,
-- goal_divergence_distribution, goal_pending): the CTEs that resolve every subtask statement to
-- its root goal and look up the stored score of each distinct (root, subtask) text pair.
-- analytics.goals expands it in place of {goal_subtasks} (after a WITH; no trailing comma).
-- driftscope traces: subtask = driftscope.goal.text; root = driftscope.goal.root on the span,
-- else the goal.root of its origin task, else of its trace. The spans of one agent in one run
-- that carry the same subtask statement under the same root (and the same delegation target)
-- are one subtask; `statement_rows` holds them folded per trace (one row per trace, agent,
-- target, task and statement, `spans` listing the spans), a subtask is the rows sharing
-- (run_id, agent_id, delegate_to, root_raw, subtask_raw, source; TraceId when there is no run).
-- Other traces (OpenInference / OpenLLMetry, no driftscope.goal.* in the trace): root = the
-- input of the trace's top agent/chain span, subtasks = the inputs of nested agent spans.
-- Subtasks a guard refused are left out (they did not happen), and a guard's check span is
-- folded into the delegation it checked. `pairs` has one row per distinct text pair: `pair_id`
-- (a number for grouping on instead of the two texts), its task
-- statements, `score` (1 - cosine) and `divergence` (rounded to 4 decimals exactly as numpy.round
-- does: x * 1e4 rounded half to even, / 1e4), `scored` false when goal_scores has no row for it yet (analytics.goals
-- scores those in Python and runs the statement again, or fills the rows it returned).
statements AS (  -- driftscope subtask spans folded per trace, agent, target, task, statement
    SELECT TraceId, run_id, agent_id, delegate_to, origin_task_id, goal_root, goal_text,
           coalesce(op = 'step', false) AS is_step, max(hop) AS hop,
           list({'t': Timestamp, 's': SpanId}) AS spans,
           min(Timestamp) AS first_seen, max(Timestamp) AS last_seen
    FROM spans
    WHERE {span_filter}
      AND goal_text IS NOT NULL
      AND coalesce(outcome, 'ok') <> 'rejected'                -- a refused subtask never ran
    GROUP BY TraceId, run_id, agent_id, delegate_to, origin_task_id, goal_root, goal_text, is_step
),
-- The roots only of the tasks and traces whose statements have no root of their own: after a
-- batch, those of a few runs (grouping every trace's root cost 0.08 of the statement's 0.15
-- CPU-s at 1M spans of 10-call runs).
roots_by_task AS (
    SELECT origin_task_id, arg_min(goal_root, start_ns) AS root_raw
    FROM spans WHERE goal_root IS NOT NULL AND origin_task_id IS NOT NULL
      AND origin_task_id IN (SELECT origin_task_id FROM statements WHERE goal_root IS NULL)
    GROUP BY origin_task_id
),
roots_by_trace AS (
    SELECT TraceId, arg_min(goal_root, start_ns) AS root_raw
    FROM spans WHERE goal_root IS NOT NULL
      AND TraceId IN (SELECT TraceId FROM statements WHERE goal_root IS NULL)
    GROUP BY TraceId
),
delegated AS (                                                -- (run, statement) delegated
    SELECT DISTINCT run_id, goal_text FROM spans
    WHERE {span_filter} AND op = 'delegate' AND goal_text IS NOT NULL
),
explicit AS (
    SELECT x.TraceId, x.run_id, x.agent_id, x.delegate_to, x.origin_task_id, x.hop, x.spans,
           x.first_seen, x.last_seen, coalesce(x.goal_root, bt.root_raw, btr.root_raw) AS root_raw,
           x.goal_text AS subtask_raw, 'driftscope' AS source
    FROM statements x
    LEFT JOIN roots_by_task bt ON x.goal_root IS NULL AND bt.origin_task_id = x.origin_task_id
    LEFT JOIN roots_by_trace btr ON x.goal_root IS NULL AND btr.TraceId = x.TraceId
    LEFT JOIN delegated d ON x.is_step AND d.run_id = x.run_id AND d.goal_text = x.goal_text
    WHERE d.run_id IS NULL                                    -- a guard's check of a delegation
),
nested AS (                         -- traces with nested agent inputs: candidates for inference
    SELECT DISTINCT TraceId FROM spans
    WHERE {span_filter} AND span_family = 'agent' AND input_text IS NOT NULL
),
plain_traces AS (
    SELECT TraceId FROM spans
    WHERE TraceId IN (SELECT TraceId FROM nested)
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
    SELECT x.TraceId, x.run_id, coalesce(x.agent_id, x.graph_node_id, x.SpanName) AS agent_id,
           x.delegate_to, x.origin_task_id, x.hop, [{'t': x.Timestamp, 's': x.SpanId}] AS spans,
           x.Timestamp AS first_seen, x.Timestamp AS last_seen, t.root_raw,
           x.input_text AS subtask_raw, 'inferred' AS source
    FROM (SELECT TraceId, SpanId, run_id, agent_id, graph_node_id, SpanName, delegate_to,
                 origin_task_id, hop, Timestamp, input_text
          FROM spans
          WHERE {span_filter} AND span_family = 'agent' AND input_text IS NOT NULL) x
    JOIN tops t USING (TraceId)
    WHERE x.SpanId <> t.top_span
),
statement_rows AS (
    SELECT * FROM (SELECT * FROM explicit UNION ALL BY NAME SELECT * FROM inferred)
    WHERE root_raw IS NOT NULL
      AND ($agent::VARCHAR IS NULL OR $agent::VARCHAR IN (agent_id, delegate_to))
),
pairs AS (
    SELECT row_number() OVER () AS pair_id, p.root_raw, p.subtask_raw, g.root_goal, g.subtask,
           round_even(g.divergence * 10000, 0) / 10000 + 0.0 AS divergence, g.divergence AS score,  -- + 0.0: never -0.0
           g.root_hash IS NOT NULL AS scored
    FROM (SELECT DISTINCT root_raw, subtask_raw FROM statement_rows) p
    LEFT JOIN (SELECT root_hash, subtask_hash, root_goal, subtask, divergence FROM goal_scores
               WHERE scorer = $scorer
               UNION ALL                              -- scores a read-only file could not store
               SELECT root_hash, subtask_hash, root_goal, subtask, divergence FROM goal_scores_local
               WHERE scorer = $scorer                 -- not those stored since (one row a pair)
                 AND root_hash || subtask_hash NOT IN (SELECT root_hash || subtask_hash FROM goal_scores
                                                       WHERE scorer = $scorer)) g
      ON g.root_hash = sha256(p.root_raw) AND g.subtask_hash = sha256(p.subtask_raw)
)
