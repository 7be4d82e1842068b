-- Shared browse fragment: the WHERE condition of `spans` rows the run lists count. Unlike the
-- detectors' {span_filter}, an agent or origin-task filter selects whole runs (every span of a
-- run the agent took part in, or that worked on the origin task), so a run's totals stay whole.
-- `until` is inclusive here, as the run list has always shown it.
($since::TIMESTAMP IS NULL OR Timestamp >= $since::TIMESTAMP)
  AND ($until::TIMESTAMP IS NULL OR Timestamp <= $until::TIMESTAMP)
  AND ($service::VARCHAR IS NULL OR ServiceName = $service::VARCHAR)
  AND ($run::VARCHAR IS NULL OR run_id = $run::VARCHAR)
  AND ($agent::VARCHAR IS NULL OR run_id IN (SELECT run_id FROM spans WHERE agent_id = $agent::VARCHAR))
  AND ($origin_task::VARCHAR IS NULL
       OR run_id IN (SELECT run_id FROM spans WHERE origin_task_id = $origin_task::VARCHAR))
