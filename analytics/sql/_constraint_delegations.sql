-- Shared fragment: the delegations of the constraint detectors (_constraint_cells.sql, and
-- constraint_ledger's evidence per hop). Delegations a guard refused did not happen and are left
-- out. A delegation without structured constraint fields (an unguarded free-text hand-off) carries
-- the constraint ids its arguments cite as "[C1]" - the convention of driftscope's free-text
-- context. $origin_tasks (internal, None for detectors) limits them to a list of origin tasks.
SELECT TraceId, SpanId, run_id, agent_id, delegate_to, Timestamp, origin_task_id, hop,
       constraints_waived, waiver_reasons,
       coalesce(constraints_carried,
                CASE WHEN constraints_waived IS NULL THEN
                    list_distinct(regexp_extract_all(coalesce(tool_args, input_text, ''),
                                                     '\[([A-Za-z][A-Za-z0-9_.-]*)\]', 1))
                END) AS constraints_carried
FROM spans
WHERE {span_filter}
  AND op = 'delegate' AND origin_task_id IS NOT NULL AND hop IS NOT NULL
  AND coalesce(outcome, 'ok') <> 'rejected'
  AND ($origin_task::VARCHAR IS NULL OR origin_task_id = $origin_task::VARCHAR)
  AND ($origin_tasks::VARCHAR[] IS NULL OR origin_task_id = ANY($origin_tasks::VARCHAR[]))
