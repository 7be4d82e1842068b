-- rejection_rates: guarded calls (spans with driftscope.outcome) per tool, state key, agent and
-- time bucket. Rejections (a guard refused) are counted apart from errors (the tool failed).
WITH calls AS NOT MATERIALIZED (
    SELECT time_bucket(to_seconds($bucket_seconds::BIGINT), Timestamp) AS bucket_start,
           coalesce(tool_name, SpanName) AS tool_name, state_key, agent_id,
           outcome, SpanId, run_id, Timestamp
    FROM spans
    WHERE {span_filter}
      AND outcome IS NOT NULL
      AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
),
counts AS (
    SELECT bucket_start, tool_name, state_key, agent_id AS agent,
           count(*) AS attempts,
           count(*) FILTER (WHERE outcome = 'rejected') AS rejections,
           count(*) FILTER (WHERE outcome = 'error') AS errors,
           min(Timestamp) AS first_seen,
           max(Timestamp) AS last_seen
    FROM calls
    GROUP BY ALL
),
-- Evidence lists from the refused calls only: list aggregates over every call cost 3x the counts.
refused AS (
    SELECT bucket_start, tool_name, state_key, agent_id AS agent,
           list_sort(list(SpanId)) AS span_ids,
           list_sort(list(DISTINCT run_id)) AS run_ids
    FROM calls
    WHERE outcome = 'rejected'
    GROUP BY ALL
),
buckets AS (
    SELECT c.bucket_start, c.tool_name, c.state_key, c.agent, c.attempts, c.rejections, c.errors,
           coalesce(r.span_ids, []::VARCHAR[]) AS span_ids,
           coalesce(r.run_ids, []::VARCHAR[]) AS run_ids,
           c.first_seen, c.last_seen
    FROM counts c
    LEFT JOIN refused r
      ON c.bucket_start = r.bucket_start AND c.tool_name IS NOT DISTINCT FROM r.tool_name
     AND c.state_key IS NOT DISTINCT FROM r.state_key AND c.agent IS NOT DISTINCT FROM r.agent
)
SELECT *,
       rejections / attempts AS rejection_rate,
       errors / attempts AS error_rate,
       CASE WHEN count(*) OVER g > 1
            THEN coalesce(regr_slope(rejections / attempts, epoch(bucket_start)) OVER g * 3600, 0.0)
            ELSE 0.0 END AS trend_per_hour
FROM buckets
WINDOW g AS (PARTITION BY tool_name, state_key, agent)
ORDER BY tool_name, state_key NULLS FIRST, agent NULLS FIRST, bucket_start
