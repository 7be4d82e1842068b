-- runaway_evidence: for each run (agent '' = the whole run) over its limit, the spans past the
-- limit in time order, at most $evidence_spans of them (the start of the runaway), as evidence.
WITH flagged AS (
    SELECT unnest($flag_runs::VARCHAR[]) AS f_run, unnest($flag_agents::VARCHAR[]) AS f_agent,
           unnest($flag_limits::BIGINT[]) AS lim
),
s AS (
    SELECT f.f_run, f.f_agent, f.lim, x.SpanId,
           row_number() OVER (PARTITION BY f.f_run, f.f_agent ORDER BY x.start_ns, x.SpanId) AS rn
    FROM spans x
    JOIN flagged f ON f.f_run = x.run_id AND (f.f_agent = '' OR f.f_agent = x.agent_id)
    WHERE {span_filter} AND x.run_id IN (SELECT f_run FROM flagged)
)
SELECT f_run AS run_id, f_agent AS agent, list(SpanId ORDER BY rn) AS span_ids
FROM s
WHERE rn > lim AND rn <= lim + $evidence_spans
GROUP BY f_run, f_agent
