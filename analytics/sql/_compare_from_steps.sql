-- The materializer's per-run comparison tables (compare_sequences, compare_run_steps,
-- compare_subjects; analytics.compare_kept) of the runs $runs (every run when NULL), from the
-- per-span steps it keeps (findings__compare_span_steps) instead of the spans: the same rows as
-- compare_<name>.sql (the placeholder below: the fragment of the table asked for).
WITH s AS (
    SELECT * FROM findings__compare_span_steps
    WHERE ($runs::VARCHAR[] IS NULL OR run_id = ANY($runs::VARCHAR[]))
)
{part}
