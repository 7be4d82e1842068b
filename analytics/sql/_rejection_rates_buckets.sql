-- rejection_rates' answer from its counts per run (rejection_rates_runs.sql, as `parts`), run
-- over those rows, not over spans (analytics.sql_loader.query_tables): counts summed, the refused
-- calls' span ids and the runs that had one merged; rates and trend as rejection_rates.sql forms them.
WITH buckets AS (
    SELECT make_timestamp(946857600000000 + bucket * $bucket_seconds::BIGINT * 1000000) AS bucket_start,
           tool_name, state_key, agent,
           sum(attempts)::BIGINT AS attempts,
           sum(rejections)::BIGINT AS rejections,
           sum(errors)::BIGINT AS errors,
           list_sort(flatten(list(span_ids))) AS span_ids,
           coalesce(list_sort(list(DISTINCT run_id) FILTER (WHERE rejections > 0)), []::VARCHAR[]) AS run_ids,
           min(first_seen) AS first_seen,
           max(last_seen) AS last_seen
    FROM parts
    GROUP BY bucket, tool_name, state_key, agent
)
{rejection_trend}
