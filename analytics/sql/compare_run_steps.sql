-- The materializer's ``compare_run_steps`` table (analytics.compare_kept, issue 35): per run of the
-- shared span filter ($runs: the runs new spans touched; every run when None),
-- _compare_run_steps_of.sql's rows.
WITH s AS ({compare_spans})
{compare_run_steps_of}
