-- Shared fragment: rejection_rates' rows from ``counts`` (per bucket, tool, key and agent: the
-- bucket as an integer at $bucket_seconds, attempts, rejections, errors, first and last call)
-- and ``refused`` (the same groups' refused span ids and runs, sorted): rejection_rates.sql's
-- from the spans, analytics.state's from the materializer's per-run minutes.
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
