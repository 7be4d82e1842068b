-- The materializer's ``compare_subjects`` table (analytics.compare_kept, issue 35): per run of the
-- shared span filter ($runs: the runs new spans touched; every run when None),
-- _compare_subjects_of.sql's rows.
WITH s AS ({compare_spans})
{compare_subjects_of}
