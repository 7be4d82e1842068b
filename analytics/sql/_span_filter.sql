-- Shared filter fragment: the WHERE condition of `spans` rows in the window, of the service and
-- run asked for, and (for an origin-task filter) of the runs that worked on that origin task. The
-- agent filter is applied by each detector to its findings, because most findings involve
-- several agents. $ingested_after (internal, None for detectors) lets the embedding worker look
-- at new spans only; $runs (internal, Filters.runs) limits the spans to a list of runs, so the
-- materializer recomputes only the runs new spans touched and a read only the runs its window
-- cuts. Detectors select only the columns they need from
-- `spans` with this condition and their own pre-filter, so no MAP/list column is carried.
-- $scope_from (internal, with $runs or an origin-task scope: materialize.run_scope) is the least
-- ingested_at of those partitions' spans: a statement that sets it reads through this filter
-- only spans of its runs (origin tasks), so DuckDB skips older row groups by their zone maps.
($since::TIMESTAMP IS NULL OR Timestamp >= $since::TIMESTAMP)
  AND ($until::TIMESTAMP IS NULL OR Timestamp < $until::TIMESTAMP)
  AND ($service::VARCHAR IS NULL OR ServiceName = $service::VARCHAR)
  AND ($run::VARCHAR IS NULL OR run_id = $run::VARCHAR)
  AND ($runs::VARCHAR[] IS NULL OR run_id = ANY($runs::VARCHAR[]))
  AND ($origin_task::VARCHAR IS NULL
       OR run_id IN (SELECT run_id FROM spans WHERE origin_task_id = $origin_task::VARCHAR))
  AND ($ingested_after::TIMESTAMP IS NULL OR ingested_at >= $ingested_after::TIMESTAMP)
  AND ($scope_from::TIMESTAMP IS NULL OR ingested_at >= $scope_from::TIMESTAMP)
