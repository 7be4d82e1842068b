-- stale_policy_sends: outbound sends (driftscope.op = 'send') drafted against a policy version
-- that was already superseded: refused by a guard (outcome = rejected) or, worse, allowed.
-- The policy version token names its subject: the objective or state key that has that version
-- in the run (else the run's policy_version values). The current policy at a send is the
-- newest version of that subject first seen at or before it, or the version a guard stated
-- (driftscope.policy.current_version) when it refused the send.
-- Performance: versions are gathered only for the runs and subjects the sends name.
WITH sends AS (
    SELECT TraceId, SpanId, run_id, agent_id, tool_name, policy_version,
           policy_current_version AS stated_current, outcome, reject_reason, StatusCode,
           Timestamp, start_ns
    FROM spans
    WHERE {span_filter} AND op = 'send' AND policy_version IS NOT NULL
),
obs AS NOT MATERIALIZED ({held_versions}),
named AS (  -- the subject a policy version token names in its run (first by name)
    SELECT o.run_id, o.version, min(o.subject) AS subject
    FROM obs o SEMI JOIN sends d ON o.run_id = d.run_id AND o.version = d.policy_version
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
newest AS (  -- the newest version of the subject first seen at or before the send
    SELECT d.TraceId, d.SpanId, arg_max(v.version, v.first_ns) AS version
    FROM cited d
    JOIN versions v ON v.run_id = d.run_id AND v.subject = d.subject AND v.first_ns <= d.start_ns
    WHERE d.stated_current IS NULL
    GROUP BY ALL
),
judged AS (
    SELECT d.*, coalesce(d.stated_current, n.version) AS current_version
    FROM cited d LEFT JOIN newest n USING (TraceId, SpanId)
)
SELECT TraceId AS trace_id, [SpanId] AS span_ids, run_id, agent_id AS agent, tool_name,
       subject AS policy_id, policy_version, current_version AS current_policy_version,
       coalesce(outcome, 'ok') AS outcome,
       coalesce(outcome, 'ok') = 'ok' AND StatusCode <> 'Error' AS allowed,
       Timestamp AS first_seen, Timestamp AS last_seen
FROM judged
WHERE (current_version IS DISTINCT FROM policy_version OR reject_reason = 'superseded_policy')
  AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
ORDER BY first_seen
