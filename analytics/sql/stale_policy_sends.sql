-- stale_policy_sends: outbound sends (driftscope.op = 'send') drafted against a policy version
-- that was already superseded: refused by a guard (outcome = rejected) or, worse, allowed.
-- The current policy at a send is the newest version first seen in the run at or before it
-- (from policy_version on any span or driftscope.policy.current_version on a refusal).
WITH s AS ({filtered_spans}),
policy_seen AS (
    SELECT run_id, version, min(start_ns) AS first_ns FROM (
        SELECT run_id, policy_version AS version, start_ns FROM s WHERE policy_version IS NOT NULL
        UNION ALL
        SELECT run_id, SpanAttributes['driftscope.policy.current_version'], start_ns FROM s
        WHERE SpanAttributes['driftscope.policy.current_version'] IS NOT NULL)
    GROUP BY ALL
),
sends AS (
    SELECT s.*, p.first_ns AS version_first_ns,
           SpanAttributes['driftscope.policy.current_version'] AS stated_current
    FROM s JOIN policy_seen p ON p.run_id = s.run_id AND p.version = s.policy_version
    WHERE s.op = 'send'
),
judged AS (
    SELECT d.*,
           coalesce(d.stated_current,
                    (SELECT arg_max(p.version, p.first_ns) FROM policy_seen p
                      WHERE p.run_id = d.run_id AND p.first_ns <= d.start_ns)) AS current_version
    FROM sends d
)
SELECT TraceId AS trace_id, [SpanId] AS span_ids, run_id, agent_id AS agent, tool_name,
       policy_version, current_version AS current_policy_version,
       coalesce(outcome, 'ok') AS outcome,
       coalesce(outcome, 'ok') = 'ok' AND StatusCode <> 'Error' AS allowed,
       Timestamp AS first_seen, Timestamp AS last_seen
FROM judged
WHERE (current_version IS DISTINCT FROM policy_version OR reject_reason = 'superseded_policy')
  AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
ORDER BY first_seen
