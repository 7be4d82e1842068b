-- rejection_rates_runs (internal, analytics.state): per run, its guarded calls per minute (an
-- integer from time_bucket's default origin, 2000-01-03, by floor division), tool, state key
-- and agent, with the ids of the refused ones. Every bucket width rejection_rates chooses is a
-- whole number of minutes from that origin, so the materializer keeps these per run and sums
-- them into the chosen buckets instead of reading every guarded span each time it is due.
WITH calls AS NOT MATERIALIZED (
    SELECT (epoch_us(Timestamp) - 946857600000000) // 60000000
             - CASE WHEN (epoch_us(Timestamp) - 946857600000000) % 60000000 < 0 THEN 1 ELSE 0 END AS minute,
           coalesce(tool_name, SpanName) AS tool_name, state_key, agent_id,
           outcome, SpanId, run_id, Timestamp
    FROM spans
    WHERE {span_filter}
      AND outcome IS NOT NULL
      AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
),
counts AS (
    SELECT run_id, minute, tool_name, state_key, agent_id AS agent,
           count(*) AS attempts,
           count(*) FILTER (WHERE outcome = 'rejected') AS rejections,
           count(*) FILTER (WHERE outcome = 'error') AS errors,
           min(Timestamp) AS first_seen,
           max(Timestamp) AS last_seen
    FROM calls
    GROUP BY ALL
),
refused AS (
    SELECT run_id, minute, tool_name, state_key, agent_id AS agent, list(SpanId) AS span_ids
    FROM calls
    WHERE outcome = 'rejected'
    GROUP BY ALL
)
SELECT c.*, coalesce(r.span_ids, []::VARCHAR[]) AS span_ids
FROM counts c
LEFT JOIN refused r
  ON c.run_id IS NOT DISTINCT FROM r.run_id AND c.minute = r.minute
 AND c.tool_name IS NOT DISTINCT FROM r.tool_name AND c.state_key IS NOT DISTINCT FROM r.state_key
 AND c.agent IS NOT DISTINCT FROM r.agent
