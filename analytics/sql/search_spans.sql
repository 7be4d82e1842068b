-- Spans of any run matching a search: the trace id or span id (exactly, lower-case hex), the run
-- id, or a substring (case-insensitive) of the span name or of any attribute value. Id matches
-- first, then the newest. `matched` names what matched: 'trace id', 'span id', 'run id',
-- 'span name' or the first attribute key whose value contains the text. A substring search
-- reads the attribute lists of every span in scope: it runs when someone searches, never for a
-- page or a detector.
WITH hits AS (
    SELECT run_id, TraceId, SpanId, SpanName, agent_id, ServiceName, Timestamp,
           CASE WHEN TraceId = $id THEN 'trace id'
                WHEN SpanId = $id THEN 'span id'
                WHEN run_id = $text THEN 'run id'
                WHEN contains(lower(SpanName), $needle) THEN 'span name'
                ELSE list_filter(SpanAttributes, lambda a: contains(lower(a.value), $needle))[1].key
           END AS matched
    FROM spans
    WHERE (TraceId = $id OR SpanId = $id OR run_id = $text OR contains(lower(SpanName), $needle)
           OR len(list_filter(SpanAttributes, lambda a: contains(lower(a.value), $needle))) > 0)
      AND {run_scope}
)
SELECT run_id, TraceId AS trace_id, SpanId AS span_id, SpanName AS span_name, agent_id,
       ServiceName AS service, Timestamp AS start, matched
FROM hits
ORDER BY matched IN ('trace id', 'span id', 'run id') DESC, Timestamp DESC, SpanId
LIMIT $limit
