"""The change log: what a commit of the one writer changed, recorded in the same transaction.

Every function here runs on the writer's connection inside the transaction of the change it
describes (``collector.store.insert_batches``, retention deletes, analytics' rescoring and
threshold writes through ``execute_write_fn``), so a change and its log entry commit together or
not at all. Readers (the materializer) see entries in ``seq`` order.
"""

from __future__ import annotations

import duckdb

# Partition kinds the log records: the partition keys detectors register. 'run_tool' is finer
# than a run: "<run>\x1f<name>" for every name a span is, or can change, a call of (its tool, the
# agent it delegates to, its own agent, the agent an agent span is), and "<run>\x1f*" for an LLM
# output holding code (its calls are of any tool of the run) or a run a delete changed. The
# writer logs only what the spans no longer say (the keys a span had before a walk changed it,
# deleted runs); the materializer derives the rest from the spans ``span_changes`` lists
# (``analytics.materialize.RUN_TOOL_KEYS_SQL``, the same key expression). It lets a loop
# detector recompute the few (run, tool) groups a commit changed, not the whole run.
PARTITIONS = ("run_id", "origin_task_id", "run_tool")
RUN_TOOL_SEP = "\x1f"

_TOUCHED_SQL = """
INSERT INTO change_partitions
SELECT DISTINCT $seq, partition, key FROM (
    SELECT 'run_id' AS partition, run_id AS key FROM {source} WHERE run_id IS NOT NULL
    UNION ALL
    SELECT 'origin_task_id', origin_task_id FROM {source} WHERE origin_task_id IS NOT NULL
)
EXCEPT SELECT seq, partition, key FROM change_partitions WHERE seq = $seq
"""


# The (run, tool) keys of span rows: every name a span is, or can change, a call of. {rows} is a
# UNION ALL of the sources' rows (record_run_tools).
_KEYS_SQL = """
SELECT DISTINCT run_id || chr(31) || tool AS key FROM (
    SELECT run_id,
           unnest([tool_name, delegate_to, agent_id,
                   CASE WHEN span_family = 'agent' THEN coalesce(agent_id, agent_name, SpanName) END,
                   CASE WHEN span_family = 'llm' AND has_code THEN '*' END]) AS tool
    FROM ({rows})
    WHERE run_id IS NOT NULL
)
WHERE tool IS NOT NULL
"""
_RUN_TOOL_SQL = "INSERT INTO change_partitions SELECT $seq, 'run_tool', key FROM (" + _KEYS_SQL + ")"


def record_run_tools(conn: duckdb.DuckDBPyConnection, seq: int, sources: list[str]) -> None:
    """Log the (run, tool) keys of the rows of ``sources`` (relations with run_id, tool_name,
    delegate_to, agent_id, agent_name, SpanName, span_family and has_code: an LLM output holding
    code) as touched by ``seq``, in one statement."""
    rows = " UNION ALL ".join(
        f"SELECT run_id, tool_name, delegate_to, agent_id, agent_name, SpanName, span_family, has_code FROM {source}"
        for source in sources
    )
    conn.execute(_RUN_TOOL_SQL.replace("{rows}", rows), {"seq": seq})


def next_change(
    conn: duckdb.DuckDBPyConnection,
    kind: str,
    spans: int = 0,
    newest_ingested: object = None,
    oldest_ingested: object = None,
    only_new: bool | None = None,
) -> int:
    """Log a change of ``kind`` in the caller's transaction; return its sequence number.
    ``oldest_ingested``: a lower bound on the ``ingested_at`` of every span it lists in
    ``span_changes`` (None: unknown); ``only_new``: every span it lists was first stored by it."""
    # one statement, not two: the writer pays a fixed cost per statement, whatever its size
    return conn.execute(
        "INSERT INTO change_log (seq, committed_at, kind, spans, newest_ingested, oldest_ingested, only_new) "
        "SELECT nextval('change_seq'), now()::TIMESTAMP, $kind, $spans, $newest, $oldest, $only_new RETURNING seq",
        {
            "kind": kind,
            "spans": int(spans),
            "newest": newest_ingested,
            "oldest": oldest_ingested,
            "only_new": only_new,
        },
    ).fetchall()[0][0]


def record_touched(
    conn: duckdb.DuckDBPyConnection, seq: int, source: str, params: dict | None = None
) -> None:
    """Log the runs and origin tasks of the rows of ``source`` (a table or a parenthesised query
    with ``run_id`` and ``origin_task_id`` columns, bound with ``params``) as touched by ``seq``."""
    conn.execute(_TOUCHED_SQL.replace("{source}", source), {"seq": seq, **(params or {})})


def record_keys(conn: duckdb.DuckDBPyConnection, seq: int, partition: str, keys: list[str]) -> None:
    """Log ``keys`` of ``partition`` as touched by change ``seq``."""
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    if keys:
        conn.execute(
            "INSERT INTO change_partitions SELECT $seq, $partition, unnest($keys::VARCHAR[])",
            {"seq": seq, "partition": partition, "keys": sorted(set(keys))},
        )
