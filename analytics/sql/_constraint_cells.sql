-- Shared fragment: one cell per (origin task, constraint, delegation span). The ledger of an
-- origin task is every constraint id it declares (driftscope.constraints.ledger) or that any of
-- its delegations (_constraint_delegations.sql) carried or waived. A cell is carried / waived /
-- missing; a missing cell is an unwaived drop unless the constraint was waived at the same or an
-- earlier hop. Every constraint of a task has a cell at each of its delegations.
-- $origin_tasks (internal, None for detectors) limits the cells to a list of origin tasks, so
-- run_summary can recompute only the origin tasks new spans touched.
-- Only the columns used are read from spans (the regex runs only on delegations without
-- structured constraint fields). The delegations are read four times below: MATERIALIZED, so
-- ClickHouse, which copies a CTE into each mention (this one is inside a subquery, where the
-- translation's stages do not reach), scans `spans` for them once instead of four times
-- (docs/scale-out.md section 9); DuckDB's plans and times stay the same.
SELECT * FROM (
    WITH deleg AS MATERIALIZED (
        {constraint_delegations}
    ),
    ledger AS (
        SELECT DISTINCT origin_task_id, constraint_id FROM (
            SELECT origin_task_id, unnest(constraints_ledger) AS constraint_id
            FROM spans
            WHERE {span_filter} AND origin_task_id IS NOT NULL AND constraints_ledger IS NOT NULL
              AND ($origin_tasks::VARCHAR[] IS NULL
                   OR origin_task_id = ANY($origin_tasks::VARCHAR[]))
            UNION ALL
            SELECT origin_task_id, unnest(constraints_carried) FROM deleg
            WHERE constraints_carried IS NOT NULL
            UNION ALL
            SELECT origin_task_id, unnest(constraints_waived) FROM deleg
            WHERE constraints_waived IS NOT NULL)
    ),
    cells AS (
        SELECT l.origin_task_id, l.constraint_id, d.hop, d.TraceId, d.SpanId, d.run_id,
               d.agent_id, d.delegate_to, d.Timestamp,
               CASE WHEN list_contains(coalesce(d.constraints_carried, []), l.constraint_id) THEN 'carried'
                    WHEN list_contains(coalesce(d.constraints_waived, []), l.constraint_id) THEN 'waived'
                    ELSE 'missing' END AS status,
               CASE WHEN list_contains(coalesce(d.constraints_waived, []), l.constraint_id)
                    THEN d.waiver_reasons[list_position(d.constraints_waived, l.constraint_id)] END
                   AS waiver_reason
        FROM ledger l JOIN deleg d USING (origin_task_id)
    ),
    first_waiver AS (
        SELECT origin_task_id, constraint_id, min(hop) AS waived_hop
        FROM cells WHERE status = 'waived' GROUP BY ALL
    ),
    -- the last hop that carried each constraint, from the delegations (a window over the cells
    -- took 0.35 of the ledger's 0.6 s at 1M spans: 540k cells for 127k delegations)
    last_carried AS (
        SELECT origin_task_id, constraint_id, max(hop) AS last_hop_seen FROM (
            SELECT origin_task_id, hop, unnest(constraints_carried) AS constraint_id FROM deleg
            WHERE constraints_carried IS NOT NULL)
        GROUP BY ALL
    )
    SELECT c.*,
           c.status = 'missing' AND (w.waived_hop IS NULL OR w.waived_hop > c.hop) AS unwaived_drop,
           lc.last_hop_seen
    FROM cells c LEFT JOIN first_waiver w USING (origin_task_id, constraint_id)
    LEFT JOIN last_carried lc USING (origin_task_id, constraint_id)
)
