-- stale_policy_sends: outbound sends (driftscope.op = 'send') drafted against a policy version
-- that was already superseded: refused by a guard (outcome = rejected) or, worse, allowed.
-- The policy version token names its subject: the objective or state key that has that version
-- in the run (else the run's policy_version values). The current policy at a send is the
-- newest version of that subject first seen at or before it, or the version a guard stated
-- (driftscope.policy.current_version) when it refused the send.
WITH s AS ({filtered_spans}),
obs AS ({held_versions}),
versions AS (
    SELECT run_id, subject, version, min(start_ns) AS first_ns FROM (
        SELECT run_id, subject, version, start_ns FROM obs
        UNION ALL
        SELECT run_id, '(policy_version)', policy_version, start_ns FROM s
        WHERE policy_version IS NOT NULL AND coalesce(outcome, 'ok') <> 'rejected')
    GROUP BY ALL
),
sends AS (
    SELECT s.*, SpanAttributes['driftscope.policy.current_version'] AS stated_current,
           coalesce((SELECT min(v.subject) FROM versions v
                      WHERE v.run_id = s.run_id AND v.version = s.policy_version
                        AND v.subject <> '(policy_version)'), '(policy_version)') AS subject
    FROM s
    WHERE s.op = 'send' AND s.policy_version IS NOT NULL
),
judged AS (
    SELECT d.*,
           coalesce(d.stated_current,
                    (SELECT arg_max(v.version, v.first_ns) FROM versions v
                      WHERE v.run_id = d.run_id AND v.subject = d.subject
                        AND v.first_ns <= d.start_ns)) AS current_version
    FROM sends d
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
