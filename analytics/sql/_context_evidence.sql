-- Shared fragment (context_drift_holders.sql, analytics.context_fold): from ``found`` and
-- ``obs`` (_held_versions.sql's rows), the ``evidence`` CTE and context_drift_holders' rows.
evidence AS (  -- every read of the held version by the holder, in time order
    SELECT f.run_id, f.agent_id, f.subject, f.version,
           list(o.SpanId ORDER BY o.start_ns, o.SpanId) AS span_ids, min(o.TraceId) AS trace_id
    FROM found f
    JOIN obs o USING (run_id, agent_id, subject, version)
    WHERE NOT o.is_write
    GROUP BY ALL
)
SELECT ev.trace_id, ev.span_ids, f.run_id, f.agent_id AS agent, f.subject AS objective_id,
       f.version AS held_version, f.superseded_by, f.current_version,
       f.read_span_id, f.supersede_span_id,
       f.end_span_id IS NOT NULL AS refreshed,
       f.end_span_id AS refresh_span_id,
       make_timestamp(f.stale_from_ns // 1000) AS held_from,
       make_timestamp(f.hold_end_ns // 1000) AS held_until,
       (f.hold_end_ns - f.stale_from_ns) / 1e9 AS held_s,
       make_timestamp(f.hold_start_ns // 1000) AS first_seen,
       make_timestamp(f.hold_end_ns // 1000) AS last_seen
FROM found f
JOIN evidence ev USING (run_id, agent_id, subject, version)
ORDER BY first_seen, agent
