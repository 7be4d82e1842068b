-- enforcement_coverage: per service and tool, how many calls carry the guard fields
-- (versioned writes, structured delegation, policy version on sends, idempotency keys on side
-- effects) and how many match the unguarded anti-patterns.
-- Counted in two steps: calls are first grouped by the few fields the counts depend on (tens
-- of combinations a run: _enforcement_cells.sql), then each count is a sum over those groups,
-- so the per-call work is one hash and one count instead of a dozen filtered aggregates and two
-- distinct lists (_enforcement_per_tool.sql). The materializer keeps the first step per run and
-- sums it (analytics.summary).
WITH run_cells AS ({enforcement_cells}),
{enforcement_per_tool}
