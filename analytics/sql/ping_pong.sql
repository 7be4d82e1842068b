-- ping_pong: a task bouncing between the same two agents in a run, without progress.
-- Hand-offs, by run, in order of precedence (a run is read from the first kind it has):
--   * 'driftscope': driftscope.op = 'delegate' spans a guard did not refuse (also the delegations
--     frameworks map there: OpenAI Agents hand-offs, LangGraph goto, CrewAI coworker tools);
--   * 'nested': an agent span inside a span of another agent (the parent's agent invoked it:
--     PydanticAI agent delegation, smolagents managed agents);
--   * 'inferred': otherwise a change of agent between consecutive agent turns (agent spans, by
--     start time); since a supervisor legitimately returns to a worker once, these need
--     $min_inferred hand-offs instead of $min_delegations.
-- Two shapes of bounce, each a maximal run of hand-offs:
--   * direct: consecutive hand-offs of the run alternate A -> B, B -> A, A -> B, ...
--     ($min_delegations, or $min_inferred when inferred); `via` is NULL;
--   * through a manager: one agent's consecutive hand-offs alternate between two agents
--     (M -> A, M -> B, M -> A, M -> B ...: each sends the task back, the manager passes it on)
--     and each of the two is handed a task it was already handed in that run of hand-offs (the
--     same task statement: a manager alternating two workers on new tasks makes progress);
--     $min_delegations hand-offs; `via` is the manager.
-- A hand-off's task: driftscope.goal.text, else its arguments, else its input (a task counts as
-- handed again when that text is the same).
-- Cost: a direct cycle's hand-offs are all between one pair of agents, and a bounce through a
-- manager is between one manager and two agents, so only runs where some pair has enough
-- hand-offs, the two directions (the manager's hand-offs to the two agents) overlapping in time
-- (counts and first/last starts over a few narrow columns, nothing ordered), are read in full and
-- ordered: depth-3 trees hand off both ways between a pair, and from one agent to two, but each
-- in a stretch of its own, and sorting their hand-offs was most of the statement. In those runs one
-- window pass per shape marks each hand-off (does it continue a bounce, is it continued), and
-- only the marked ones are grouped into bounces with their span lists: a crew whose pairs hand
-- off both ways in separate stretches (depth-3 trees) passes the count but has no bounce, and
-- grouping each of its hand-offs as a bounce of one was ~90% of the statement (2.2 of 2.3 CPU-s
-- at 1M spans of such crews). Linear in hand-offs: windows over each run's ordered hand-offs,
-- neighbours only (lag/lead), no join of a run's hand-offs with each other.
WITH delegations AS NOT MATERIALIZED (  -- scanned per use (narrow columns, conditions pushed down)
    SELECT run_id, agent_id, delegate_to, outcome, start_ns
    FROM spans
    WHERE {span_filter} AND op = 'delegate'
),
delegating_runs AS (SELECT DISTINCT run_id FROM delegations),
hand_off_spans AS MATERIALIZED (  -- per run, agent and agent handed to, with n // 2 hand-offs or
                                  -- more (n alternating hand-offs are n // 2 or more each way):
                                  -- their first and last start; by hash, so a NULL run is one
                                  -- partition as in the windows below (a collision only adds up
                                  -- two runs' counts and spans of time: a few more runs let through)
    SELECT hash(run_id) AS h, agent_id AS src, delegate_to AS dst,
           min(start_ns) AS first_ns, max(start_ns) AS last_ns
    FROM delegations
    WHERE agent_id IS NOT NULL AND delegate_to IS NOT NULL
      AND agent_id <> delegate_to AND coalesce(outcome, 'ok') <> 'rejected'
    GROUP BY hash(run_id), agent_id, delegate_to
    HAVING count(*) >= $min_delegations // 2
),
explicit_busy AS (  -- runs where a pair of agents hands off both ways enough for a cycle, or one
                    -- agent to two agents, and those hand-offs overlap in time: in A -> B, B -> A,
                    -- A -> B the B -> A lies between two A -> B, so the two directions' first-to-
                    -- last starts share a start time (M -> A, M -> B, M -> A likewise for M's two
                    -- agents). A pair handing off one way in one stretch of the run and back in
                    -- another (depth-3 trees) passes the counts but not this, and nothing is
                    -- ordered (the windows below sort every hand-off of each run let through)
    SELECT x.h
    FROM hand_off_spans x
    JOIN hand_off_spans y ON y.h = x.h AND y.src = x.dst AND y.dst = x.src
    WHERE x.src < x.dst  -- (a bounce of two, A -> B then B -> A, needs no overlap)
      AND ($min_delegations < 3 OR greatest(x.first_ns, y.first_ns) <= least(x.last_ns, y.last_ns))
    UNION
    SELECT x.h
    FROM hand_off_spans x
    JOIN hand_off_spans y ON y.h = x.h AND y.src = x.src
    WHERE x.dst < y.dst AND greatest(x.first_ns, y.first_ns) <= least(x.last_ns, y.last_ns)
),
explicit AS (
    SELECT d.TraceId, d.SpanId, d.run_id, d.agent_id AS src, d.delegate_to AS dst, d.Timestamp,
           d.start_ns, coalesce(d.goal_text, d.tool_args, d.input_text, d.SpanId) AS task,
           'driftscope' AS source
    FROM spans d
    WHERE {span_filter} AND d.op = 'delegate' AND d.agent_id IS NOT NULL AND d.delegate_to IS NOT NULL
      AND d.agent_id <> d.delegate_to AND coalesce(d.outcome, 'ok') <> 'rejected'
      AND hash(d.run_id) IN (SELECT h FROM explicit_busy)
),
agent_turns AS (  -- two scans, so each one's condition is pushed into it
    SELECT TraceId, SpanId, ParentSpanId, run_id, Timestamp, start_ns, agent_id, graph_node_id,
           SpanName, input_text
    FROM spans
    WHERE {span_filter} AND span_family = 'agent'
    UNION ALL
    SELECT TraceId, SpanId, ParentSpanId, run_id, Timestamp, start_ns, agent_id, graph_node_id,
           SpanName, input_text
    FROM spans
    WHERE {span_filter} AND operation = 'invoke_agent' AND span_family IS DISTINCT FROM 'agent'
),
nested_all AS (  -- agent spans whose parent span belongs to another agent, in runs without
                 -- delegate spans
    SELECT a.TraceId, a.SpanId, a.run_id, p.agent_id AS src, a.agent_id AS dst, a.Timestamp,
           a.start_ns, coalesce(a.input_text, a.SpanId) AS task, 'nested' AS source
    FROM agent_turns a
    JOIN (SELECT TraceId, SpanId, agent_id FROM spans
          WHERE {span_filter} AND agent_id IS NOT NULL
            AND SpanId IN (SELECT ParentSpanId FROM agent_turns)) p
      ON p.TraceId = a.TraceId AND p.SpanId = a.ParentSpanId
    WHERE a.agent_id IS NOT NULL AND p.agent_id <> a.agent_id
      AND hash(a.run_id) NOT IN (SELECT hash(run_id) FROM delegating_runs)
),
nesting_runs AS (SELECT DISTINCT run_id FROM nested_all),
turns AS (
    SELECT TraceId, SpanId, run_id, Timestamp, start_ns,
           coalesce(agent_id, graph_node_id, SpanName) AS agent,
           lag(coalesce(agent_id, graph_node_id, SpanName))
               OVER (PARTITION BY run_id ORDER BY start_ns, SpanId) AS previous_agent
    FROM agent_turns
    WHERE hash(run_id) NOT IN (SELECT hash(run_id) FROM delegating_runs)
      AND hash(run_id) NOT IN (SELECT hash(run_id) FROM nesting_runs)
),
inferred AS (
    SELECT TraceId, SpanId, run_id, previous_agent AS src, agent AS dst, Timestamp, start_ns,
           NULL::VARCHAR AS task, 'inferred' AS source
    FROM turns
    WHERE previous_agent IS NOT NULL AND previous_agent <> agent
),
inferred_busy AS (
    SELECT DISTINCT hash(run_id) AS h
    FROM inferred
    GROUP BY hash(run_id), least(src, dst), greatest(src, dst)
    HAVING count(*) FILTER (WHERE src < dst) >= $min_inferred // 2
       AND count(*) FILTER (WHERE src > dst) >= $min_inferred // 2
       AND ($min_inferred < 3  -- overlapping in time, as in explicit_busy
            OR greatest(min(start_ns) FILTER (WHERE src < dst), min(start_ns) FILTER (WHERE src > dst))
               <= least(max(start_ns) FILTER (WHERE src < dst), max(start_ns) FILTER (WHERE src > dst)))
),
edges AS (
    SELECT * FROM explicit
    UNION ALL
    SELECT * FROM nested_all
    UNION ALL
    SELECT * FROM inferred WHERE hash(run_id) IN (SELECT h FROM inferred_busy)
),
marked AS (  -- direct bounces: a hand-off continues one when it reverses the hand-off before it
               -- (starts = 0); `continued`: the next hand-off reverses this one
    SELECT *,
           CASE WHEN lag(dst) OVER w = src AND lag(src) OVER w = dst THEN 0 ELSE 1 END AS starts,
           coalesce(lead(src) OVER w = dst AND lead(dst) OVER w = src, FALSE) AS continued
    FROM edges
    WINDOW w AS (PARTITION BY run_id, source ORDER BY start_ns, SpanId)
),
islands AS (  -- the hand-offs of bounces of 2+ only: a bounce is consecutive hand-offs, so leaving
              -- out those that neither reverse one nor are reversed keeps each bounce whole and
              -- apart (its first hand-off is continued); most hand-offs are such, and grouping
              -- each into a bounce of one cost more than all the rest
    SELECT *, sum(starts) OVER (PARTITION BY run_id, source ORDER BY start_ns, SpanId) AS island
    FROM marked
    WHERE starts = 0 OR continued
),
direct AS (
    SELECT min(TraceId) AS trace_id,
           list(SpanId ORDER BY start_ns, SpanId) AS span_ids,
           run_id,
           list_sort(list_distinct(flatten(list([src, dst])))) AS agents,
           count(*) AS delegations,
           source,
           NULL::VARCHAR AS via,
           min(Timestamp) AS first_seen,
           max(Timestamp) AS last_seen
    FROM islands
    GROUP BY run_id, source, island
    HAVING count(*) >= CASE WHEN source = 'inferred' THEN $min_inferred ELSE $min_delegations END
),
fan_marked AS (  -- each agent's own hand-offs (not inferred ones): a hand-off continues a bounce
                 -- when it goes back to the agent two before it (starts = 0); `continued_1` /
                 -- `continued_2`: the next hand-off / the one after it does
    SELECT *,
           CASE WHEN dst <> lag(dst) OVER w AND dst = lag(dst, 2) OVER w THEN 0 ELSE 1 END AS starts,
           coalesce(lead(dst) OVER w <> dst AND lead(dst) OVER w = lag(dst) OVER w, FALSE) AS continued_1,
           coalesce(lead(dst, 2) OVER w <> lead(dst) OVER w AND lead(dst, 2) OVER w = dst, FALSE) AS continued_2
    FROM edges
    WHERE source <> 'inferred'
    WINDOW w AS (PARTITION BY run_id, source, src ORDER BY start_ns, SpanId)
),
fan_islands AS (  -- the hand-offs of bounces and the two before each continuing one only (as
                  -- `islands`: a continuing hand-off's two before it are kept, so its lags over
                  -- these are its lags over all), with the two before it
    SELECT *,
           lag(dst) OVER w AS dst_1, lag(dst, 2) OVER w AS dst_2,
           lag(SpanId) OVER w AS span_1, lag(task) OVER w AS task_1,
           lag(SpanId, 2) OVER w AS span_2, lag(task, 2) OVER w AS task_2,
           lag(Timestamp, 2) OVER w AS time_2, lag(TraceId, 2) OVER w AS trace_2,
           sum(starts) OVER w AS island
    FROM fan_marked
    WHERE starts = 0 OR continued_1 OR continued_2
    WINDOW w AS (PARTITION BY run_id, source, src ORDER BY start_ns, SpanId)
),
fan_bounces AS (  -- a bounce: the two hand-offs before its first continuing one, then those
    SELECT run_id, source, src,
           list_concat(
               [arg_min({'s': span_2, 'd': dst_2, 'k': task_2}, start_ns) FILTER (WHERE starts = 0),
                arg_min({'s': span_1, 'd': dst_1, 'k': task_1}, start_ns) FILTER (WHERE starts = 0)],
               list({'s': SpanId, 'd': dst, 'k': task} ORDER BY start_ns, SpanId) FILTER (WHERE starts = 0)
           ) AS hops,
           arg_min(time_2, start_ns) FILTER (WHERE starts = 0) AS first_seen,
           max(Timestamp) AS last_seen,
           arg_min(trace_2, start_ns) FILTER (WHERE starts = 0) AS trace_id
    FROM fan_islands
    GROUP BY run_id, source, src, island
    HAVING count(*) FILTER (WHERE starts = 0) >= 1
),
through_manager AS (
    SELECT trace_id,
           list_transform(hops, lambda x: x.s) AS span_ids,
           run_id,
           list_sort(list_distinct(list_transform(hops, lambda x: x.d))) AS agents,
           len(hops) AS delegations,
           source,
           src AS via,
           first_seen,
           last_seen
    FROM fan_bounces
    WHERE len(hops) >= $min_delegations
      -- each of the two agents is handed a task it was handed before in this bounce
      AND len(list_distinct(list_transform(list_filter(hops, lambda x: x.d = hops[1].d), lambda x: x.k)))
          < len(list_filter(hops, lambda x: x.d = hops[1].d))
      AND len(list_distinct(list_transform(list_filter(hops, lambda x: x.d = hops[2].d), lambda x: x.k)))
          < len(list_filter(hops, lambda x: x.d = hops[2].d))
)
SELECT trace_id, span_ids, run_id, agents, delegations, delegations // 2 AS round_trips, source, via,
       first_seen, last_seen
FROM (SELECT * FROM direct UNION ALL SELECT * FROM through_manager)
WHERE ($agent::VARCHAR IS NULL OR list_contains(agents, $agent::VARCHAR) OR via = $agent::VARCHAR)
ORDER BY first_seen
