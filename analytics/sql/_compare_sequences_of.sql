-- Shared fragment (issue 35): per run of ``s`` (_compare_spans.sql's rows), its step sequence:
-- ``steps``, the step hashes in start order; ``sequence``, a hash of that list (runs with the
-- same one took the same steps in the same order); ``first_ns``, its first span's start.
SELECT run_id, steps, hash(steps) AS sequence, first_ns
FROM (
    SELECT run_id, list(step ORDER BY start_ns, SpanId) AS steps, min(start_ns) AS first_ns
    FROM s
    GROUP BY run_id
)
