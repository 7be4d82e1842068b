-- enforcement_coverage_runs (internal, analytics.summary): per run, its calls grouped by the
-- fields enforcement_coverage counts (_enforcement_cells.sql), kept by the materializer per
-- run so the whole answer is a sum over them instead of a pass over every stored span.
{enforcement_cells}
