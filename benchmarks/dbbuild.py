"""Build DuckDB files with many stored spans fast, for the query, report and dashboard benchmarks.

The ingest benchmark measures ingest; here a base of generated spans goes through the real
decoder and ``collector.store.insert_batches`` once (so agent/run inheritance is the collector's
own), and the database is then grown by copying that base in SQL, each copy moved to its own
namespace (trace, run, task and ticket ids, as ``benchmarks.generator.stamp`` does to payloads)
and later in time. The result is what ingesting ``generate_requests`` for consecutive namespaces
would store, apart from ``ingested_at`` (copy k: k seconds after a day before the build).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.generator import TEMPLATE_NAMESPACE, Shape, template_payloads
from collector.decode import PROTOBUF, SPAN_COLUMNS, decode_payload
from collector.store import batch_to_arrow, insert_batches
from driftscope.database import open_database

logger = logging.getLogger(__name__)

BASE_SPANS = 8 * 512
_MARK = f"{TEMPLATE_NAMESPACE:016x}"
# Columns that carry the namespace. Goal texts (which name a per-run ticket) are left as in the
# base on purpose: every copy shares the base's few hundred distinct texts, so the embedding cache
# can be filled once and goal_divergence is timed as a query, not as model inference (the
# embedding benchmark measures that).
_STAMPED = ("TraceId", "run_id", "task_id", "origin_task_id", "idempotency_key")


def _select_copy(base_minutes: int) -> str:
    """SELECT of one copy ``k`` of ``_base`` (column order of `spans`)."""
    shift_us = base_minutes * 60 * 1_000_000
    exprs = []
    for name in SPAN_COLUMNS:
        if name in _STAMPED:
            exprs.append(f"replace({name}, '{_MARK}', printf('%016x', k)) AS {name}")
        elif name == "SpanAttributes":
            exprs.append(
                "list_transform(SpanAttributes, "
                f"lambda e: {{'key': e.key, 'value': replace(e.value, '{_MARK}', printf('%016x', k))}}) "
                "AS SpanAttributes"
            )
        elif name == "Timestamp":
            exprs.append(f"Timestamp + to_microseconds(k * {shift_us}) AS Timestamp")
        elif name in ("start_ns", "end_ns"):
            exprs.append(f"{name} + k * {shift_us * 1000} AS {name}")
        elif name == "ingested_at":
            # Copy k as if ingested k seconds after a day before the build: copies are in
            # ingest order and older than anything ingested later (append_batch), as in a
            # served file; every copy at the base's instant would make all spans "just in".
            exprs.append("ingested_at - INTERVAL 1 DAY + to_microseconds(k * 1000000) AS ingested_at")
        else:
            exprs.append(name)
    return "SELECT " + ", ".join(exprs) + " FROM _base, range(?, ?) AS r(k)"


class SpanDatabase:
    """A database file grown to a number of stored spans by copies of one generated base."""

    def __init__(
        self,
        path: Path,
        seed: int = 7,
        base_spans: int | None = None,
        shape: Shape | None = None,
        reopen: bool = False,
    ) -> None:
        """A new database at ``path`` (an old file there is removed), or with ``reopen`` the one
        an earlier ``SpanDatabase`` of the same seed, base and shape built there."""
        self.path = Path(path)
        if not reopen:
            for stale in (self.path, Path(f"{self.path}.wal")):
                stale.unlink(missing_ok=True)
        self.conn = open_database(self.path)
        self.shape = shape or Shape()
        self.seed = seed
        base_spans = base_spans or BASE_SPANS
        if self.shape.spans_per_run is not None:  # whole runs only, so every copy has whole runs
            run = self.shape.spans_per_run
            base_spans = run * -(-base_spans // run)
        payloads = template_payloads(base_spans, seed, shape=self.shape)
        batches = [decode_payload(p, PROTOBUF) for p in payloads]
        base = batch_to_arrow(batches)
        first_ns, last_ns = min(base.column("start_ns").to_pylist()), max(base.column("end_ns").to_pylist())
        self.base_minutes = int((last_ns - first_ns) // 60_000_000_000) + 1
        # The base itself goes through insert_batches (inheritance as the collector does it) in
        # a scratch database, then serves as the template for every copy.
        scratch = duckdb.connect(":memory:")
        from collector.migrations_runner import apply_migrations

        apply_migrations(scratch)
        scratch.execute("BEGIN")
        insert_batches(scratch, batches)
        scratch.execute("COMMIT")
        self.base_table = scratch.sql("SELECT * FROM spans ORDER BY start_ns").to_arrow_table()
        scratch.close()
        self.conn.register("_base_arrow", self.base_table)
        self.conn.execute("CREATE TEMP TABLE _base AS SELECT * FROM _base_arrow")
        self.conn.unregister("_base_arrow")
        self.copies = 0
        if reopen:
            (stored,) = self.conn.execute("SELECT count(*) FROM spans").fetchone()
            self.copies = stored // self.base_table.num_rows
        self._copy_sql = _select_copy(self.base_minutes)

    @property
    def spans(self) -> int:
        return self.copies * self.base_table.num_rows

    def grow_to(self, spans: int, copies_per_statement: int | None = None) -> float:
        """Add copies until at least ``spans`` are stored; return the seconds it took."""
        start = time.perf_counter()
        # About 800k rows per statement, whatever the size of the base.
        copies_per_statement = copies_per_statement or max(1, 819_200 // self.base_table.num_rows)
        target = -(-spans // self.base_table.num_rows)
        while self.copies < target:
            upto = min(target, self.copies + copies_per_statement)
            self.conn.execute(f"INSERT INTO spans {self._copy_sql}", [self.copies + 1, upto + 1])
            self.copies = upto
        self.conn.execute("CHECKPOINT")
        elapsed = time.perf_counter() - start
        logger.info("database %s grown to %d spans in %.1fs", self.path, self.spans, elapsed)
        return elapsed

    def append_batch(
        self, spans: int = 512, copy: int | None = None, seed: int = 1009, at_end: bool = False
    ) -> int:
        """Ingest ``spans`` new spans into the existing runs of copy ``copy`` (default: the newest)
        through the real decoder and ``insert_batches``, as a live collector would; return the
        rows stored. Another seed gives new trace and span ids under the same run ids. As in the
        copies, ids are moved to the copy's namespace and goal texts are left as in the base (so
        the call timed after it is a query, not model inference on new texts). The new spans
        start among the runs' first spans, or with ``at_end`` after every stored span (as a live
        run's next spans do)."""
        from benchmarks.generator import generate_requests

        namespace = self.copies if copy is None else copy
        ns_hex = f"{namespace:016x}"
        # Plus a few microseconds per seed, so a batch's spans never start at the very instant of
        # a stored span (ties are broken arbitrarily by detectors, full or incremental alike).
        shift_ns = namespace * self.base_minutes * 60_000_000_000 + (1 + seed % 997) * 1000
        requests = generate_requests(spans, seed, shape=self.shape)
        batches = [decode_payload(r.SerializeToString(), PROTOBUF) for r in requests]
        if at_end:
            (newest,) = self.conn.execute("SELECT max(start_ns) FROM spans").fetchone()
            first = min(pc.min(batch.table.column("start_ns")).as_py() for batch in batches)
            shift_ns = max(shift_ns, (newest or 0) - first + 1000)
        for batch in batches:
            table = batch.table
            for name in _STAMPED:
                index = table.schema.get_field_index(name)
                table = table.set_column(index, name, pc.replace_substring(table.column(name), _MARK, ns_hex))
            for name in ("start_ns", "end_ns"):
                index = table.schema.get_field_index(name)
                table = table.set_column(index, name, pc.add(table.column(name), shift_ns))
            index = table.schema.get_field_index("Timestamp")
            shifted = pc.add(table.column("Timestamp"), pa.scalar(shift_ns // 1000, pa.duration("us")))
            batch.table = table.set_column(index, "Timestamp", shifted)
        self.conn.execute("BEGIN")
        stored = insert_batches(self.conn, batches)
        self.conn.execute("COMMIT")
        return stored

    def window(self):
        """The ``analytics.types.Window`` covering every stored span."""
        from analytics.types import Window

        first, last = self.conn.execute("SELECT min(Timestamp), max(Timestamp) FROM spans").fetchone()
        return Window(since=first, until=last)

    def close(self) -> None:
        self.conn.close()
