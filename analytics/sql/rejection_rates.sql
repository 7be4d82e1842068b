-- rejection_rates: guarded calls (spans with driftscope.outcome) per tool, state key, agent and
-- time bucket. Rejections (a guard refused) are counted apart from errors (the tool failed).
WITH calls AS NOT MATERIALIZED (
    -- the bucket as an integer (time_bucket's default origin, 2000-01-03, floor division):
    -- cheaper to compute and to group by than a timestamp; turned back into one per group
    SELECT (epoch_us(Timestamp) - 946857600000000) // ($bucket_seconds::BIGINT * 1000000)
             - CASE WHEN (epoch_us(Timestamp) - 946857600000000) % ($bucket_seconds::BIGINT * 1000000) < 0
                    THEN 1 ELSE 0 END AS bucket,
           coalesce(tool_name, SpanName) AS tool_name, state_key, agent_id,
           outcome, SpanId, run_id, Timestamp
    FROM spans
    WHERE {span_filter}
      AND outcome IS NOT NULL
      AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
),
counts AS (
    SELECT bucket, tool_name, state_key, agent_id AS agent,
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
    SELECT bucket, tool_name, state_key, agent_id AS agent,
           list_sort(list(SpanId)) AS span_ids,
           list_sort(list(DISTINCT run_id)) AS run_ids
    FROM calls
    WHERE outcome = 'rejected'
    GROUP BY ALL
),
buckets AS (
    SELECT make_timestamp(946857600000000 + c.bucket * $bucket_seconds::BIGINT * 1000000) AS bucket_start,
           c.tool_name, c.state_key, c.agent, c.attempts, c.rejections, c.errors,
           coalesce(r.span_ids, []::VARCHAR[]) AS span_ids,
           coalesce(r.run_ids, []::VARCHAR[]) AS run_ids,
           c.first_seen, c.last_seen
    FROM counts c
    LEFT JOIN refused r
      ON c.bucket = r.bucket AND c.tool_name IS NOT DISTINCT FROM r.tool_name
     AND c.state_key IS NOT DISTINCT FROM r.state_key AND c.agent IS NOT DISTINCT FROM r.agent
)
-- the rates, and the trend of each tool x key x agent over its buckets, in the detector's order
SELECT *,
       rejections / attempts AS rejection_rate,
       errors / attempts AS error_rate,
       CASE WHEN count(*) OVER g > 1
            THEN coalesce(regr_slope(rejections / attempts, epoch(bucket_start)) OVER g * 3600, 0.0)
            ELSE 0.0 END AS trend_per_hour
FROM buckets
-- (the buckets in time order, the frame all of them: the slope's floating-point sums then follow
-- one order; without it two computations of the same spans differed in the 11th digit)
WINDOW g AS (PARTITION BY tool_name, state_key, agent ORDER BY bucket_start
             ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
ORDER BY tool_name, state_key NULLS FIRST, agent NULLS FIRST, bucket_start
