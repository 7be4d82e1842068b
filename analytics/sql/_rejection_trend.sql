-- rejection_rates' answer from its rows per time bucket, tool, key and agent (`buckets`): the
-- rates, the trend of each tool x key x agent over its buckets, in the detector's order. The end
-- of rejection_rates.sql and _rejection_rates_buckets.sql (the rejection_trend fragment), and
-- run alone over the rows a batch left and the buckets it counted again (analytics.state).
SELECT *,
       rejections / attempts AS rejection_rate,
       errors / attempts AS error_rate,
       CASE WHEN count(*) OVER g > 1
            THEN coalesce(regr_slope(rejections / attempts, epoch(bucket_start)) OVER g * 3600, 0.0)
            ELSE 0.0 END AS trend_per_hour
FROM buckets
WINDOW g AS (PARTITION BY tool_name, state_key, agent)
ORDER BY tool_name, state_key NULLS FIRST, agent NULLS FIRST, bucket_start
