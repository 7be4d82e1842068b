-- Shared fragment: the spans a constraint ledger is made of, one row each, with the columns the
-- cells (_constraint_cells.sql) read: every delegation of an origin task a guard did not refuse
-- (is_delegation) and every span declaring an origin task's ledger. A delegation without
-- structured constraint fields (an unguarded free-text hand-off) carries the constraint ids its
-- arguments cite as "[C1]" - the convention of driftscope's free-text context; the regex runs
-- only on those. $origin_tasks (internal, None for detectors) limits the rows to a list of
-- origin tasks, so the materializer recomputes only the origin tasks new spans touched.
SELECT TraceId, SpanId, run_id, agent_id, delegate_to, Timestamp, origin_task_id, hop,
       constraints_waived, waiver_reasons, constraints_ledger,
       op = 'delegate' AND hop IS NOT NULL AND coalesce(outcome, 'ok') <> 'rejected' AS is_delegation,
       coalesce(constraints_carried,
                CASE WHEN constraints_waived IS NULL AND op = 'delegate' THEN
                    list_distinct(regexp_extract_all(coalesce(tool_args, input_text, ''),
                                                     '\[([A-Za-z][A-Za-z0-9_.-]*)\]', 1))
                END) AS constraints_carried
FROM spans
WHERE {span_filter} AND origin_task_id IS NOT NULL
  AND (op = 'delegate' AND hop IS NOT NULL AND coalesce(outcome, 'ok') <> 'rejected'
       OR constraints_ledger IS NOT NULL)
  AND ($origin_tasks::VARCHAR[] IS NULL OR origin_task_id = ANY($origin_tasks::VARCHAR[]))
