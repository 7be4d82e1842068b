"""The change log of a ClickHouse store: what each write of `spans` touched, in `seq` order.

ClickHouse has no transaction spanning the rows of `spans` and a log entry, so a change is
logged in two steps around its writes (``ChangeLog.begin`` / ``commit``):

1. ``begin``: its partitions (runs and origin tasks: the keys the findings tables are
   partitioned by) go into `change_partitions` under a new ``seq``, before any span is written;
2. the spans are written (inserted, or deleted and inserted again when resolved);
3. ``commit``: its `change_log` row (``seq``, when, how many spans), also when a write failed
   (some rows may have landed; recomputing a partition is idempotent).

The materializer (``analytics.materialize_clickhouse``) consumes changes up to the newest seq
below every change begun and not committed. So a kill between 1 and 3 loses nothing: the
partitions are logged, and a ``ChangeLog`` opened on the store afterwards (the next serve, resolve
or report) commits every change a kill left begun; the worst it costs is recomputing partitions
whose spans never landed. A change committed before its spans were written never happens: the
materializer could otherwise take it in early and never see those spans.

One ``ChangeLog`` per process and store (serve's writer and resolver share one): seqs are
numbered here, under a lock, from the highest the store holds.
"""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pyarrow.compute as pc

from collector import clickhouse_schema as schema

logger = logging.getLogger(__name__)

# The partitions logged: what findings tables on ClickHouse are partitioned by.
PARTITIONS = ("run_id", "origin_task_id")


def touched_rows(rows: pa.Table) -> list[tuple[str, str]]:
    """The (partition, key) pairs of span rows as they are (their run and origin task)."""
    out: list[tuple[str, str]] = []
    for partition in PARTITIONS:
        if rows.num_rows and partition in rows.column_names:
            keys = pc.unique(rows.column(partition).combine_chunks().drop_null()).to_pylist()
            out += [(partition, key) for key in keys]
    return out


class ChangeLog:
    """Numbers and writes a ClickHouse store's changes (see the module docstring)."""

    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._seq = self._highest()
        recovered = self._commit_begun()
        if recovered:
            logger.info("change log: committed %d change(s) a stopped writer left begun", recovered)

    def _table(self, name: str) -> str:
        return schema.qualified(self.store.database, name)

    def _highest(self) -> int:
        rows = self.store.execute(
            f"SELECT greatest((SELECT max(seq) FROM {self._table(schema.CHANGE_LOG)}), "
            f"(SELECT max(seq) FROM {self._table(schema.CHANGE_PARTITIONS)})) AS s"
        )
        return int(rows.column("s")[0].as_py() or 0)

    def _commit_begun(self) -> int:
        """Commit the changes begun and never committed (their writer was killed in between)."""
        rows = self.store.execute(
            f"SELECT DISTINCT seq FROM {self._table(schema.CHANGE_PARTITIONS)} "
            f"WHERE seq NOT IN (SELECT seq FROM {self._table(schema.CHANGE_LOG)})"
        )
        begun = rows.column("seq").to_pylist() if rows.num_rows else []
        for seq in begun:
            self.commit(int(seq), "recovered", 0)
        return len(begun)

    def begin(self, touched: list[tuple[str, str]]) -> int:
        """Log the partitions a change is about to write (before its spans); its seq."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        pairs = sorted(set(touched))
        if pairs:
            self.store.insert_arrow(
                schema.CHANGE_PARTITIONS,
                pa.table(
                    {
                        "seq": pa.array([seq] * len(pairs), pa.uint64()),
                        "partition": [p for p, _ in pairs],
                        "key": [k for _, k in pairs],
                    }
                ),
            )
        return seq

    def commit(self, seq: int, kind: str, spans: int) -> None:
        """Log that change ``seq`` is written (after its spans, or after its write failed)."""
        self.store.command(
            f"INSERT INTO {self._table(schema.CHANGE_LOG)} "
            "SELECT {seq:UInt64}, now64(6, 'UTC'), {kind:String}, {spans:UInt64}",
            {"seq": seq, "kind": kind, "spans": spans},
        )
