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
{rejection_buckets}
