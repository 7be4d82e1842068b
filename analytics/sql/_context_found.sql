-- Shared fragment (context_drift_holders.sql, analytics.context_fold): from ``held`` (the stale
-- holdings that are no write conflict, with hold_end_ns) and ``version_first``, the CTEs
-- ``current`` and ``found`` (the holdings with the version current when they ended).
current AS (  -- newest version first seen when the holding ended
    SELECT f.run_id, f.agent_id, f.subject, f.version, arg_max(v.version, {'n': v.first_ns, 'v': v.version}) AS current_version
    FROM held f
    JOIN version_first v ON v.run_id = f.run_id AND v.subject = f.subject AND v.first_ns <= f.hold_end_ns
    GROUP BY ALL
),
found AS (
    SELECT f.*, c.current_version FROM held f LEFT JOIN current c USING (run_id, agent_id, subject, version)
)
