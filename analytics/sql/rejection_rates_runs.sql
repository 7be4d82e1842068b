-- rejection_rates per run: rejection_rates.sql's counts per run, time bucket (as an integer,
-- for $bucket_seconds), tool, key and agent, with the refused calls' span ids. After a batch
-- analytics.state sums them per bucket, tool, key and agent (_rejection_rates_buckets.sql) from
-- the rows kept with its result, with the touched runs counted again (analytics.kept.keeps_parts);
-- equal to rejection_rates.sql over every run (tests/analytics/test_kept.py, test_summary.py).
SELECT run_id,
       (epoch_us(Timestamp) - 946857600000000) // ($bucket_seconds::BIGINT * 1000000)
         - CASE WHEN (epoch_us(Timestamp) - 946857600000000) % ($bucket_seconds::BIGINT * 1000000) < 0
                THEN 1 ELSE 0 END AS bucket,
       coalesce(tool_name, SpanName) AS tool_name, state_key, agent_id AS agent,
       count(*) AS attempts,
       count(*) FILTER (WHERE outcome = 'rejected') AS rejections,
       count(*) FILTER (WHERE outcome = 'error') AS errors,
       min(Timestamp) AS first_seen,
       max(Timestamp) AS last_seen,
       list_sort(list(SpanId) FILTER (WHERE outcome = 'rejected')) AS span_ids
FROM spans
WHERE {span_filter}
  AND outcome IS NOT NULL
  AND ($agent::VARCHAR IS NULL OR agent_id = $agent::VARCHAR)
GROUP BY ALL
