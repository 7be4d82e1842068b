"""The change log: what a commit of the one writer changed, recorded in the same transaction.

Every function here runs on the writer's connection inside the transaction of the change it
describes (``collector.store.insert_batches``, retention deletes, analytics' rescoring and
threshold writes through ``execute_write_fn``), so a change and its log entry commit together or
not at all. Readers (the materializer) see entries in ``seq`` order.
"""

from __future__ import annotations

import duckdb

# Partition kinds the log records: the partition keys detectors register.
PARTITIONS = ("run_id", "origin_task_id")

_TOUCHED_SQL = """
INSERT INTO change_partitions
SELECT DISTINCT $seq, partition, key FROM (
    SELECT 'run_id' AS partition, run_id AS key FROM {source} WHERE run_id IS NOT NULL
    UNION ALL
    SELECT 'origin_task_id', origin_task_id FROM {source} WHERE origin_task_id IS NOT NULL
)
EXCEPT SELECT seq, partition, key FROM change_partitions WHERE seq = $seq
"""


def next_change(
    conn: duckdb.DuckDBPyConnection, kind: str, spans: int = 0, newest_ingested: object = None
) -> int:
    """Log a change of ``kind`` in the caller's transaction; return its sequence number."""
    seq = conn.execute("SELECT nextval('change_seq')").fetchall()[0][0]
    conn.execute(
        "INSERT INTO change_log VALUES ($seq, now()::TIMESTAMP, $kind, $spans, $newest)",
        {"seq": seq, "kind": kind, "spans": int(spans), "newest": newest_ingested},
    )
    return seq


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
