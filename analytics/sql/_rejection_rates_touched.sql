-- rejection_rates after a batch: the time buckets (rejection_rates.sql's integers, for
-- $bucket_seconds) holding guarded calls of the traces the batch touched ($traces), with their
-- calls' first and last times. Only spans of those traces were stored or changed (the collector
-- fills inherited fields only in the traces of the commit), so every other bucket's rows stay as
-- they were (analytics.state).
SELECT (epoch_us(Timestamp) - 946857600000000) // ($bucket_seconds::BIGINT * 1000000)
         - CASE WHEN (epoch_us(Timestamp) - 946857600000000) % ($bucket_seconds::BIGINT * 1000000) < 0
                THEN 1 ELSE 0 END AS bucket,
       min(Timestamp) AS first_seen,
       max(Timestamp) AS last_seen
FROM spans
WHERE {span_filter}
  AND outcome IS NOT NULL
  AND TraceId = ANY($traces::VARCHAR[])
GROUP BY bucket
ORDER BY bucket
