-- context_drift_holders: agents that kept holding a version of an objective (or of a shared
-- state key such as a policy) after another agent superseded it.
-- A holding starts at an agent's first read of a version and ends at its next observation of the
-- subject with another version (a refresh), else at its last span in the run. A version is
-- superseded when a version first seen after it appears (or a span flags it superseded). A
-- holder that itself tried to write the subject while holding (accepted or refused) is in a
-- write conflict (lost_updates / divergent_reads), not context drift, and is left out.
-- Performance: the next version of each version comes from one window over the moments a
-- subject got a new version (a self-join of the versions grew with the square of the versions
-- per subject: hot keys), and a holding's end from the holder's observations numbered by stretch
-- of one version (comparing every holding with every observation grew with the square of them
-- per agent and subject: long sessions). Holdings are aggregated only from reads of a superseded or flagged
-- version (about a quarter of the observations), the agent filter applies to them up front, and
-- the holder's own writes are looked up only for holdings already held past the moment their
-- version went stale (about 40% of them).
-- Ties are broken by the ids: a version's first span, a holding's first read and its end (by
-- start, version, span id: the islands' order) and the current version are the same whichever
-- way the spans were stored (analytics.context_fold keeps them from state and must agree).
WITH obs AS NOT MATERIALIZED ({held_versions}),
version_first AS (
    SELECT run_id, subject, version, min(start_ns) AS first_ns,
           arg_min(SpanId, {'n': start_ns, 's': SpanId}) AS first_span,
           bool_or(flagged) AS any_flagged
    FROM obs GROUP BY ALL
),
{context_versions},
candidates AS (  -- holdings of a version that was superseded or flagged
    SELECT o.run_id, o.agent_id, o.subject, o.version,
           min(o.start_ns) AS hold_start_ns,
           arg_min(o.SpanId, {'n': o.start_ns, 's': o.SpanId}) AS read_span_id,
           min(o.start_ns) FILTER (WHERE o.flagged) AS flagged_ns,
           any_value(v.newer_ns) AS newer_ns, any_value(v.superseded_by) AS superseded_by,
           any_value(v.supersede_span_id) AS supersede_span_id
    FROM obs o JOIN open_versions v USING (run_id, subject, version)
    WHERE NOT o.is_write AND ($agent::VARCHAR IS NULL OR o.agent_id = $agent::VARCHAR)
    GROUP BY o.run_id, o.agent_id, o.subject, o.version
    HAVING coalesce(any_value(v.newer_ns), min(o.start_ns) FILTER (WHERE o.flagged)) IS NOT NULL
),
crowded AS (  -- (run, agent, subject) with many holdings: their ends come from islands below;
              -- for the others comparing each holding with each observation is cheaper
    SELECT run_id, agent_id, subject FROM candidates GROUP BY ALL HAVING count(*) > 32
),
islands AS (  -- the observations of a crowded (run, agent, subject) in time order, numbered by
              -- stretch of one version (island)
    SELECT *, sum(starts::INTEGER) OVER (PARTITION BY run_id, agent_id, subject
                                         ORDER BY start_ns, version, SpanId
                                         ROWS UNBOUNDED PRECEDING) AS island
    FROM (SELECT o.run_id, o.agent_id, o.subject, o.version, o.start_ns, o.SpanId,
                 coalesce(lag(o.version) OVER (PARTITION BY o.run_id, o.agent_id, o.subject
                                               ORDER BY o.start_ns, o.version, o.SpanId) <> o.version,
                          true) AS starts
          FROM obs o
          SEMI JOIN crowded c
            ON c.run_id = o.run_id AND c.agent_id = o.agent_id AND c.subject = o.subject)
),
next_island AS (  -- the first observation of the stretch after the holding's first read
    SELECT h.run_id, h.agent_id, h.subject, h.version, h.hold_start_ns,
           s.start_ns AS next_ns, s.SpanId AS next_span
    FROM (SELECT c.run_id, c.agent_id, c.subject, c.version, c.hold_start_ns, max(i.island) AS island
          FROM candidates c
          JOIN islands i ON i.run_id = c.run_id AND i.agent_id = c.agent_id AND i.subject = c.subject
                        AND i.version = c.version AND i.start_ns = c.hold_start_ns
          GROUP BY ALL) h
    JOIN islands s ON s.run_id = h.run_id AND s.agent_id = h.agent_id AND s.subject = h.subject
                  AND s.island = h.island + 1 AND s.starts
),
ended AS (  -- the holder's next observation of the subject with another version: the next
            -- stretch's first, unless that is at the very moment of the first read (a tie: then
            -- the first observation of another version strictly later, looked up)
    SELECT run_id, agent_id, subject, version, next_span AS end_span_id, next_ns AS end_ns
    FROM next_island WHERE next_ns > hold_start_ns
    UNION ALL
    SELECT c.run_id, c.agent_id, c.subject, c.version,
           arg_min(o.SpanId, {'n': o.start_ns, 'v': o.version, 's': o.SpanId}) AS end_span_id,
           min(o.start_ns) AS end_ns
    FROM (SELECT run_id, agent_id, subject, version, hold_start_ns
          FROM next_island WHERE next_ns = hold_start_ns
          UNION ALL
          SELECT c.run_id, c.agent_id, c.subject, c.version, c.hold_start_ns
          FROM candidates c ANTI JOIN crowded USING (run_id, agent_id, subject)) c
    JOIN obs o ON o.run_id = c.run_id AND o.agent_id = c.agent_id AND o.subject = c.subject
              AND o.version <> c.version AND o.start_ns > c.hold_start_ns
    GROUP BY ALL
),
agent_last AS (  -- last span end of the holders that never refreshed
    SELECT s.run_id, s.agent_id, max(s.end_ns) AS last_ns
    FROM spans s
    SEMI JOIN (SELECT c.run_id, c.agent_id
               FROM candidates c ANTI JOIN ended e USING (run_id, agent_id, subject, version)) u
      ON s.run_id = u.run_id AND s.agent_id = u.agent_id
    WHERE {span_filter} AND s.agent_id IS NOT NULL
    GROUP BY ALL
),
superseding AS (
    SELECT c.*, e.end_span_id, e.end_ns, coalesce(e.end_ns, a.last_ns) AS hold_end_ns,
           greatest(c.hold_start_ns, coalesce(least(c.newer_ns, c.flagged_ns), c.newer_ns, c.flagged_ns))
               AS stale_from_ns
    FROM candidates c
    LEFT JOIN ended e USING (run_id, agent_id, subject, version)
    LEFT JOIN agent_last a USING (run_id, agent_id)
),
stale AS (  -- held past the moment the version went stale
    SELECT * FROM superseding
    WHERE stale_from_ns < hold_end_ns OR flagged_ns IS NOT NULL
),
held AS (
    SELECT * FROM stale
    WHERE NOT EXISTS (  -- the holder tried to write the subject itself: a write conflict
          SELECT 1 FROM spans w
          WHERE {span_filter}
            AND w.op = 'write' AND w.run_id = stale.run_id AND w.agent_id = stale.agent_id
            AND w.state_key = stale.subject
            AND w.start_ns > stale.hold_start_ns AND w.start_ns <= stale.hold_end_ns)
),
{context_found},
{context_evidence}
