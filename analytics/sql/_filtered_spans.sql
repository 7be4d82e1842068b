-- Shared filter fragment: every column of the `spans` rows that pass the shared filter
-- (_span_filter.sql: window, service, run, origin task). Detectors that need only a few columns
-- use the span_filter placeholder directly instead, so no MAP/list column is carried through their CTEs.
SELECT *
FROM spans
WHERE {span_filter}
