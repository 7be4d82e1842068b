-- stale_policy_sends: outbound sends (driftscope.op = 'send') drafted against a policy version
-- that was already superseded: refused by a guard (outcome = rejected) or, worse, allowed.
-- The policy version token names its subject: the objective or state key that has that version
-- in the run (else the run's policy_version values). The current policy at a send is the
-- newest version of that subject first seen at or before it, or the version a guard stated
-- (driftscope.policy.current_version) when it refused the send.
-- Performance: sends are carried as a few narrow columns and their row id; versions are gathered
-- only for the runs and subjects the sends name. A send whose cited version is the only
-- version first seen at or before it and not yet followed by another one (no tie on either
-- side) is current without any per-send lookup; the as-of lookup runs only for the rest, and the
-- display columns are read back only for the findings.
WITH sends AS (
    SELECT rowid AS send_row, run_id, policy_version, policy_current_version AS stated_current,
           reject_reason, start_ns
    FROM spans
    WHERE {span_filter} AND op = 'send' AND policy_version IS NOT NULL
      AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
),
obs AS NOT MATERIALIZED ({held_versions}),
named AS (  -- the subject a policy version token names in its run (first by name)
    SELECT o.run_id, o.version, min(o.subject) AS subject
    FROM obs o SEMI JOIN sends d ON o.run_id = d.run_id AND o.version = d.policy_version
    WHERE o.version IN (SELECT DISTINCT policy_version FROM sends)
    GROUP BY ALL
),
cited AS (
    SELECT d.*, coalesce(n.subject, '(policy_version)') AS subject
    FROM sends d LEFT JOIN named n ON n.run_id = d.run_id AND n.version = d.policy_version
),
versions AS (  -- first sighting of every version of the cited subjects
    SELECT run_id, subject, version, min(start_ns) AS first_ns FROM (
        SELECT o.run_id, o.subject, o.version, o.start_ns
        FROM obs o
        SEMI JOIN (SELECT DISTINCT run_id, subject FROM cited WHERE subject <> '(policy_version)') d
          ON o.run_id = d.run_id AND o.subject = d.subject
        UNION ALL
        SELECT run_id, '(policy_version)', policy_version, start_ns
        FROM spans
        WHERE {span_filter} AND policy_version IS NOT NULL AND coalesce(outcome, 'ok') <> 'rejected')
    GROUP BY ALL
),
spells AS (  -- when each version was the newest: from its first sighting to the next version's
    SELECT run_id, subject, version, first_ns,
           lag(first_ns) OVER w AS prev_ns, lead(first_ns) OVER w AS next_ns
    FROM versions
    WINDOW w AS (PARTITION BY run_id, subject ORDER BY first_ns)
),
suspect AS (  -- sends whose cited version may not be current (all others certainly are)
    SELECT d.*
    FROM cited d
    LEFT JOIN spells s ON s.run_id = d.run_id AND s.subject = d.subject AND s.version = d.policy_version
    WHERE d.stated_current IS NOT NULL OR d.reject_reason = 'superseded_policy'
       OR NOT coalesce(s.first_ns <= d.start_ns
                       AND (s.next_ns IS NULL OR d.start_ns < s.next_ns)
                       AND (s.prev_ns IS NULL OR s.prev_ns < s.first_ns)
                       AND (s.next_ns IS NULL OR s.next_ns > s.first_ns), false)
),
newest AS (  -- the newest version of the subject first seen at or before the send
    SELECT d.send_row, arg_max(v.version, (v.first_ns, v.version)) AS version
    FROM suspect d
    JOIN versions v ON v.run_id = d.run_id AND v.subject = d.subject AND v.first_ns <= d.start_ns
    WHERE d.stated_current IS NULL
    GROUP BY ALL
),
judged AS (
    SELECT d.send_row, d.subject, coalesce(d.stated_current, n.version) AS current_version
    FROM suspect d LEFT JOIN newest n USING (send_row)
    WHERE coalesce(d.stated_current, n.version) IS DISTINCT FROM d.policy_version
       OR d.reject_reason = 'superseded_policy'
)
SELECT s.TraceId AS trace_id, [s.SpanId] AS span_ids, s.run_id, s.agent_id AS agent, s.tool_name,
       j.subject AS policy_id, s.policy_version, j.current_version AS current_policy_version,
       coalesce(s.outcome, 'ok') AS outcome,
       coalesce(s.outcome, 'ok') = 'ok' AND s.StatusCode <> 'Error' AS allowed,
       s.Timestamp AS first_seen, s.Timestamp AS last_seen
FROM judged j JOIN spans s ON s.rowid = j.send_row
WHERE {span_filter} AND s.op = 'send' AND s.policy_version IS NOT NULL  -- the sends' own scan: a
  -- window or run scope prunes it (an unfiltered rowid join reads every stored span's columns)
ORDER BY first_seen
