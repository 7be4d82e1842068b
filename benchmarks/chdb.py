"""chdb: every detector on a ClickHouse store (chdb, in process) beside DuckDB, on the same spans.

The ClickHouse store is filled the way a deployment at scale fills it: rows in the OpenTelemetry
Collector clickhouse exporter's `otel_traces` layout, the materialized view filling `spans`, then
the tree-resolution pass (``collector.clickhouse_resolve.resolve_spans``). The spans are those of
the query benchmark (``benchmarks.dbbuild``: the same seed, base and shape): the base's OTLP
requests are generated and decoded once (``collector.decode``) and turned into exporter rows once
(``collector.clickhouse_store.otel_traces_rows``); each copy is that Arrow table moved to its own
namespace and later in time, as ``SpanDatabase`` moves its SQL copies, and copies go in as bulk
Arrow inserts (``ChdbStore.insert_arrow``, many copies per INSERT) rather than OTLP requests.
Insert (view included) and the resolve pass are timed apart.

Per size the DuckDB file of the same spans is grown (``SpanDatabase``) and every detector is timed
on both engines: the cold call (the first in this process), then the median of warm calls. DuckDB
computes from the spans (``Filters.from_spans``) so both engines compute every call (chdb keeps
no findings tables; on DuckDB a read of a built table is a SELECT, see the live section). Goal
pairs are scored once on DuckDB and the analytics tables copied into chdb, so both read the same
scores. As a check that both engines hold the same data, a few aggregates of `spans` and the rows
each detector returns are compared.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.dbbuild import BASE_SPANS, SpanDatabase
from benchmarks.generator import TEMPLATE_NAMESPACE, Shape, template_payloads
from benchmarks.queries import warm_calls
from collector.conventions import RULES
from collector.decode import PROTOBUF, decode_payload

logger = logging.getLogger(__name__)

_MARK = f"{TEMPLATE_NAMESPACE:016x}"
# Columns SpanDatabase's copies leave as in the base although their attributes hold the
# namespace (goal texts: every copy shares the base's texts, so goal pairs are scored once).
_UNSTAMPED_COLUMNS = ("goal_text", "goal_root")
_UNSTAMPED_KEYS = sorted({s.key for r in RULES if r.column in _UNSTAMPED_COLUMNS for s in r.sources})
# Aggregates of `spans` valid in both dialects: equal on both engines when they hold the same data.
_FINGERPRINT = {
    "spans": "count(*)",
    "traces": "count(DISTINCT TraceId)",
    "runs": "count(DISTINCT run_id)",
    "agents": "count(DISTINCT agent_id)",
    "agent_sources": "count(agent_source)",
    "hop_sum": "sum(coalesce(hop, 0))",
    "tasks": "count(DISTINCT task_id)",
    "goals": "count(DISTINCT goal_text)",
    "idempotency_keys": "count(DISTINCT idempotency_key)",
}
COPIES_PER_INSERT = 25  # ~100k exporter rows per INSERT at the base's 4,096 spans
# Detectors ClickHouse planned for tens of CPU-seconds per call whatever the data before their
# statements ran in stages (docs/scale-out.md section 8); run_summary calls both. Run by default
# now; --skip-slow leaves them out (a quick pass, or analytics code from before the stages).
SLOW_TO_PLAN = {
    name: "left out (--skip-slow): slow to plan on ClickHouse before the statement stages"
    for name in ("context_drift_holders", "repeated_calls", "run_summary")
}


def _stamp_map(column: pa.Array, ns_hex: str) -> pa.Array:
    """Attribute map values with the namespace replaced, goal-text keys left as in the base."""
    keys, items = column.keys, column.items
    stamped = pc.replace_substring(items, _MARK, ns_hex)
    items = pc.if_else(pc.is_in(keys, pa.array(_UNSTAMPED_KEYS)), items, stamped)
    return pa.MapArray.from_arrays(column.offsets, keys, items, type=column.type)


def _shift_list(column: pa.Array, shift: pa.Scalar) -> pa.Array:
    return pa.ListArray.from_arrays(column.offsets, pc.add(column.values, shift), type=column.type)


def stamp_copy(base: pa.Table, copy_index: int, base_minutes: int) -> pa.Table:
    """Exporter rows of copy ``copy_index``: ids in its namespace, ``copy_index * base_minutes``
    minutes later (SpanDatabase's copy of the same index, in the exporter's columns)."""
    ns_hex = f"{copy_index:016x}"
    shift = pa.scalar(copy_index * base_minutes * 60_000_000_000, pa.duration("ns"))
    columns = {}
    for name in base.column_names:
        column = base.column(name).combine_chunks()
        if name in ("TraceId", "Links.TraceId"):
            column = (
                pc.replace_substring(column, _MARK, ns_hex)
                if name == "TraceId"
                else pa.ListArray.from_arrays(
                    column.offsets, pc.replace_substring(column.values, _MARK, ns_hex), type=column.type
                )
            )
        elif name in ("SpanAttributes", "ResourceAttributes"):
            column = _stamp_map(column, ns_hex)
        elif name == "Timestamp":
            column = pc.add(column, shift)
        elif name == "Events.Timestamp":
            column = _shift_list(column, shift)
        columns[name] = column
    return pa.table(columns)


class ChdbSpanStore:
    """A chdb store grown to a number of spans by exporter-layout copies of one generated base."""

    def __init__(
        self,
        path: Path,
        seed: int = 7,
        base_spans: int | None = None,
        shape: Shape | None = None,
        reopen: bool = False,
    ):
        """A new store at ``path`` (anything there is removed), or with ``reopen`` the one an
        earlier ``ChdbSpanStore`` of the same arguments built there; the base is SpanDatabase's of
        the same arguments."""
        from collector.clickhouse_store import ChdbStore, init_clickhouse, otel_traces_rows

        self.path = Path(path)
        if not reopen:
            shutil.rmtree(self.path, ignore_errors=True)
        self.shape = shape or Shape()
        base_spans = base_spans or BASE_SPANS
        if self.shape.spans_per_run is not None:  # whole runs only, as SpanDatabase
            run = self.shape.spans_per_run
            base_spans = run * -(-base_spans // run)
        batches = [decode_payload(p, PROTOBUF) for p in template_payloads(base_spans, seed, shape=self.shape)]
        decoded = pa.concat_tables([batch.table for batch in batches])
        self.base = otel_traces_rows(decoded)
        first_ns = min(decoded.column("start_ns").to_pylist())
        last_ns = max(decoded.column("end_ns").to_pylist())
        self.base_minutes = int((last_ns - first_ns) // 60_000_000_000) + 1
        self.store = ChdbStore(str(self.path))
        init_clickhouse(self.store)
        self.copies = 0
        if reopen:
            spans_table = f"{self.store.database}.spans"
            stored = self.store.execute(f"SELECT count() AS n FROM {spans_table}").column("n")[0].as_py()
            self.copies = stored // self.base.num_rows

    @property
    def spans(self) -> int:
        return self.copies * self.base.num_rows

    def grow_to(
        self, spans: int, copies_per_insert: int = COPIES_PER_INSERT, traces_per_chunk: int | None = None
    ) -> dict:
        """Insert copies into `otel_traces` until at least ``spans`` are stored (the view fills
        `spans`), then run one resolve pass over them; wall and CPU seconds of each step."""
        from collector.clickhouse_resolve import TRACES_PER_CHUNK, resolve_spans

        target = -(-spans // self.base.num_rows)
        rows = 0
        start, start_cpu = time.perf_counter(), time.process_time()
        stamp_s = 0.0
        while self.copies < target:
            upto = min(target, self.copies + copies_per_insert)
            stamp_start = time.perf_counter()
            rows_in = pa.concat_tables(
                [stamp_copy(self.base, k, self.base_minutes) for k in range(self.copies + 1, upto + 1)]
            )
            stamp_s += time.perf_counter() - stamp_start
            self.store.insert_arrow(self.store.traces_table, rows_in)
            rows += rows_in.num_rows
            self.copies = upto
        insert_s, insert_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        start, start_cpu = time.perf_counter(), time.process_time()
        rewritten = resolve_spans(
            self.store, settle_seconds=0, traces_per_chunk=traces_per_chunk or TRACES_PER_CHUNK
        )
        resolve_s, resolve_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        logger.info(
            "chdb store grown to %d spans: insert %.1fs, resolve %.1fs (%d rows rewritten)",
            self.spans, insert_s, resolve_s, rewritten,
        )  # fmt: skip
        return {
            "rows_inserted": rows,
            "insert_s": round(insert_s, 2),
            "insert_cpu_s": round(insert_cpu, 2),
            "stamp_s": round(stamp_s, 2),
            "insert_us_per_span": round(insert_s / max(rows, 1) * 1e6, 1),
            "resolve_s": round(resolve_s, 2),
            "resolve_cpu_s": round(resolve_cpu, 2),
            "resolve_us_per_span": round(resolve_s / max(rows, 1) * 1e6, 1),
            "rows_rewritten": rewritten,
            "traces_per_chunk": traces_per_chunk or TRACES_PER_CHUNK,
        }

    def copy_to(self, spans: int, copies_per_statement: int = 200) -> dict:
        """Grow to at least ``spans`` by copies made inside ClickHouse of copy 1's rows (already
        inserted and resolved), moved to each copy's namespace and time: `spans` gets resolved rows
        (as SpanDatabase copies its ingested base) and `otel_traces` the exporter rows, with the
        view detached meanwhile (so it does not add unresolved rows). Wall and CPU seconds."""
        from collector import clickhouse_schema as schema

        db = self.store.database
        one = f"{1:016x}"
        ns = "leftPad(lower(hex(toUInt64(n.number))), 16, '0')"
        later = f"toInt64(n.number - 1) * {self.base_minutes * 60_000_000}"  # microseconds
        unstamped = ", ".join(f"'{key}'" for key in _UNSTAMPED_KEYS)
        attributes = f"mapApply((k, v) -> (k, if(k IN ({unstamped}), v, replace(v, '{one}', {ns}))), {{c}})"
        span_columns = list(schema.spans_clickhouse_types())  # the `_null` flag columns included
        span_exprs = {
            **{
                c: f"replace({c}, '{one}', {ns})"
                for c in ("TraceId", "run_id", "task_id", "origin_task_id", "idempotency_key")
            },
            "SpanAttributes": attributes.format(c="SpanAttributes"),
            "Timestamp": f"Timestamp + toIntervalMicrosecond({later})",
            "start_ns": f"start_ns + {later} * 1000",
            "end_ns": f"end_ns + {later} * 1000",
        }
        trace_exprs = {
            "TraceId": f"replace(TraceId, '{one}', {ns})",
            "SpanAttributes": attributes.format(c="SpanAttributes"),
            "Timestamp": f"Timestamp + toIntervalMicrosecond({later})",
            "`Events.Timestamp`": f"arrayMap(t -> t + toIntervalMicrosecond({later}), `Events.Timestamp`)",
        }
        trace_columns = [f"`{c}`" if "." in c else c for c in schema.OTEL_TRACES_INSERT_COLUMNS]

        def statement(table: str, columns: list[str], exprs: dict[str, str], first: int, count: int) -> str:
            select = ", ".join(f"{exprs.get(c, c)} AS {c}" if c in exprs else c for c in columns)
            return (
                f"INSERT INTO {schema.qualified(db, table)} ({', '.join(columns)}) SELECT {select} "
                f"FROM {schema.qualified(db, table)} AS src CROSS JOIN numbers({first}, {count}) AS n "
                f"WHERE endsWith(src.TraceId, '{one}')"
            )

        target = -(-spans // self.base.num_rows)
        start, start_cpu = time.perf_counter(), time.process_time()
        self.store.command(f"DETACH TABLE {schema.qualified(db, schema.SPANS_VIEW)}")
        try:
            while self.copies < target:
                upto = min(target, self.copies + copies_per_statement)
                first, count = self.copies + 1, upto - self.copies
                self.store.command(statement(schema.SPANS_TABLE, span_columns, span_exprs, first, count))
                self.store.command(
                    statement(self.store.traces_table, trace_columns, trace_exprs, first, count)
                )
                self.copies = upto
        finally:
            self.store.command(f"ATTACH TABLE {schema.qualified(db, schema.SPANS_VIEW)}")
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        logger.info("chdb store copied to %d spans in %.1fs", self.spans, elapsed)
        return {"copied_s": round(elapsed, 2), "copied_cpu_s": round(cpu, 2), "by": "SQL copies of copy 1"}

    def disk_bytes(self) -> dict:
        """Compressed bytes and rows of `otel_traces` and `spans` on disk (active parts)."""
        table = self.store.execute(
            "SELECT table, tuple(sum(bytes_on_disk), sum(rows)) AS bytes FROM system.parts "
            "WHERE database = {db:String} AND active AND table IN ('otel_traces', 'spans') GROUP BY table",
            {"db": self.store.database},
        )
        return dict(zip(table.column("table").to_pylist(), table.column("bytes").to_pylist(), strict=True))

    def copy_analytics_tables(self, conn) -> None:
        """DuckDB's goal scores, embeddings and thresholds into the store (replacing its own)."""
        for table in ("goal_scores", "embeddings", "thresholds"):
            self.store.command(f"TRUNCATE TABLE {self.store.database}.{table}")
            self.store.insert_arrow(table, conn.sql(f"SELECT * FROM {table}").to_arrow_table())

    def close(self) -> None:
        self.store.close()


def time_store_detectors(
    store,
    repeats: int,
    names: list[str] | None = None,
    skip: dict[str, str] | None = None,
    slow_s: float = 30.0,
) -> dict[str, dict]:
    """Cold and median warm seconds (wall and CPU) of each registered metric on a ClickHouse store
    (all spans, no filters). Names in ``skip`` are reported with the reason, not run; a metric
    whose cold call takes over ``slow_s`` is called warm once."""
    import analytics  # noqa: F401 - registers every detector
    from analytics.registry import METRICS, run_metric
    from analytics.types import Filters, Window

    results: dict[str, dict] = {}
    for name in names or sorted(METRICS):
        if name in (skip or {}):
            results[name] = {"skipped": skip[name], "median_s": None}
            continue
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            run_metric(store, name, Window(), Filters())
        except Exception as exc:  # noqa: BLE001 - reported per detector
            results[name] = {"error": str(exc)[:300], "median_s": None}
            logger.warning("%s failed on chdb: %s", name, str(exc)[:300])
            continue
        cold, cold_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        results[name] = warm_calls(
            lambda: run_metric(store, name, Window(), Filters()),  # noqa: B023 - called in this turn
            repeats if cold < slow_s else 1, cold, cold_cpu,
        )  # fmt: skip
        results[name]["load_average"] = [round(x, 2) for x in os.getloadavg()]
        logger.info(
            "chdb %s: cold %.3fs, median %.3fs (%d rows)",
            name,
            cold,
            results[name]["median_s"],
            results[name]["rows"],
        )
    return results


def fingerprint(conn) -> dict:
    """``_FINGERPRINT`` of `spans` on a DuckDB connection or a ClickHouse store."""
    from analytics.engine import fetch_rows

    sql = "SELECT " + ", ".join(f"{expr} AS {name}" for name, expr in _FINGERPRINT.items()) + " FROM spans"
    (row,) = fetch_rows(conn, sql)
    return {name: int(value) for name, value in zip(_FINGERPRINT, row, strict=True)}


def run_chdb(
    workdir: Path,
    sizes: list[int],
    repeats: int = 3,
    base_spans: int | None = None,
    skip: dict[str, str] | None = None,
    names: list[str] | None = None,
    duckdb_limit_s: float = 300.0,
    keep: bool = False,
    reopen: bool = False,
    traces_per_chunk: int | None = None,
    copy_above: int | None = None,
    plan: bool = True,
) -> dict:
    """Detector timings on chdb and DuckDB at each size in ``sizes`` (ascending), same spans.

    ``keep`` leaves both stores in ``workdir``; ``reopen`` times the stores an earlier run kept
    there (grown further if a size asks for more spans). Spans beyond ``copy_above`` are copied
    inside ClickHouse from resolved rows (``ChdbSpanStore.copy_to``) instead of inserted through
    the exporter's layout and resolved. With ``plan``, each detector runs once more on chdb with
    each statement's planning measured (``benchmarks.chdb_plan``)."""
    import analytics  # noqa: F401 - registers every detector
    from analytics.goals import score_pending_pairs
    from analytics.registry import METRICS
    from analytics.types import direct_write
    from benchmarks.chdb_plan import planning_by_detector
    from benchmarks.queries import time_detectors

    workdir.mkdir(parents=True, exist_ok=True)
    duck = SpanDatabase(workdir / "chdb-twin.duckdb", base_spans=base_spans, reopen=reopen)
    chdb = ChdbSpanStore(workdir / "chdb-store", base_spans=base_spans, reopen=reopen)
    by_size: dict[str, dict] = {}
    try:
        for index, size in enumerate(sorted(sizes)):
            duck.grow_to(size)
            fresh = index == 0 and not reopen
            if fresh:  # every copy shares the base's goal texts: scored once
                score_pending_pairs(duck.conn, limit=1_000_000, write=direct_write(duck.conn))
                duck.conn.execute("CHECKPOINT")
            build = None
            real_to = size if copy_above is None else min(size, copy_above)
            if chdb.spans < real_to:  # through the exporter's layout, the view and resolve
                build = chdb.grow_to(real_to, traces_per_chunk=traces_per_chunk)
            if chdb.spans < size:
                build = {**(build or {}), "copied": chdb.copy_to(size)}
            if fresh:
                chdb.copy_analytics_tables(duck.conn)
            load_before = [round(x, 2) for x in os.getloadavg()]
            chdb_times = time_store_detectors(chdb.store, repeats, names=names, skip=skip)
            duck_times = time_detectors(
                duck.conn, repeats, names=names, limit_s=duckdb_limit_s, from_spans=True
            )
            same_rows = {
                name: t.get("rows") == duck_times.get(name, {}).get("rows")
                for name, t in chdb_times.items()
                if t.get("rows") is not None
            }
            planned = [name for name in names or sorted(METRICS) if name not in (skip or {})]
            planning = planning_by_detector(chdb.store, planned) if plan else None
            duck_print, chdb_print = fingerprint(duck.conn), fingerprint(chdb.store)
            by_size[str(size)] = {
                "spans": chdb.spans,
                "chdb_build": build,
                "chdb_disk_bytes": chdb.disk_bytes(),
                "load_average_before": load_before,
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
                "same_spans": duck_print == chdb_print,
                "fingerprint": {"duckdb": duck_print, "chdb": chdb_print},
                "same_rows": same_rows,
                "chdb": chdb_times,
                "duckdb": duck_times,
                "chdb_planning": planning,
            }
            logger.info("chdb section at %d spans done (same spans: %s)", size, duck_print == chdb_print)
    finally:
        chdb.close()
        duck.close()
        if not keep:
            duck.path.unlink(missing_ok=True)
            shutil.rmtree(chdb.path, ignore_errors=True)
    return {"by_size": by_size, "base_spans": chdb.base.num_rows}


def chdb_table(section: dict) -> str:
    """Markdown, one table per size: each detector's cold and median warm seconds (and median
    CPU-seconds of the process) on chdb beside DuckDB's, and whether both returned as many rows."""

    def cell(timing: dict | None, key: str) -> str:
        if not timing:
            return "-"
        if timing.get(key) is None:
            return "skipped" if "skipped" in timing else "error" if "error" in timing else "-"
        return f"{timing[key]:.3f}"

    out = []
    for entry in section["by_size"].values():
        out.append(
            f"\n{entry['spans']:,} spans (load average {entry['load_average_before']} before, "
            f"{entry['load_average_after']} after; same spans on both engines: {entry['same_spans']})\n"
        )
        out.append(
            "| detector | chdb cold (s) | chdb median (s) | chdb median CPU-s | DuckDB cold (s) "
            "| DuckDB median (s) | DuckDB median CPU-s | same rows |"
        )
        out.append("|---|---|---|---|---|---|---|---|")
        for name in sorted(entry["chdb"]):
            ch, duck = entry["chdb"][name], entry["duckdb"].get(name)
            same = entry["same_rows"].get(name)
            out.append(
                "| "
                + " | ".join(
                    [
                        name,
                        *(cell(ch, key) for key in ("cold_s", "median_s", "median_cpu_s")),
                        *(cell(duck, key) for key in ("cold_s", "median_s", "median_cpu_s")),
                        "-" if same is None else "yes" if same else "**no**",
                    ]
                )
                + " |"
            )
        if entry.get("chdb_planning"):
            from benchmarks.chdb_plan import planning_table

            out.append(f"\nPlanning on chdb at {entry['spans']:,} spans (each statement, stages included):\n")
            out.append(planning_table(entry["chdb_planning"]))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chdb", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--detectors", nargs="+", help="only these metrics")
    parser.add_argument(
        "--skip-slow", action="store_true", help=f"leave {', '.join(SLOW_TO_PLAN)} out on chdb"
    )
    parser.add_argument(
        "--traces-per-chunk", type=int, help="traces per round trip of the resolve pass (its default: 5,000)"
    )
    parser.add_argument(
        "--copy-above", type=int, help="spans past this many are copied in ClickHouse from resolved rows"
    )
    parser.add_argument("--keep", action="store_true", help="leave the stores in --workdir")
    parser.add_argument(
        "--reopen", action="store_true", help="time the stores a --keep run left in --workdir"
    )
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    skip = SLOW_TO_PLAN if args.skip_slow else {}
    section = run_chdb(
        args.workdir,
        args.sizes,
        args.repeats,
        skip=skip,
        names=args.detectors,
        keep=args.keep,
        reopen=args.reopen,
        traces_per_chunk=args.traces_per_chunk,
        copy_above=args.copy_above,
    )
    args.out.write_text(json.dumps(section, indent=2, default=str) + "\n")
    print(chdb_table(section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
