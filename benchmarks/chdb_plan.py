"""chdb planning: how long ClickHouse takes to plan each statement a detector runs, apart from running it.

Every registered metric runs on a ClickHouse store (chdb in process, or a server) through the
read interface, as ``driftscope report`` runs it; ``PlanningRecorder`` sits between analytics and
the store and records, per statement (a stage's ``CREATE TEMPORARY TABLE ... AS SELECT`` or a
final ``SELECT``):

- ``tree_rows``: the rows of ``EXPLAIN QUERY TREE`` of its SELECT, the query tree the analyzer
  builds (CTEs inlined at every mention, passes run): the work of planning as a count, the same
  on any machine and under any load;
- ``plan_us``: microseconds ClickHouse spent parsing, analyzing, building and optimizing the query
  plan (the ``Query{Parse,Analysis,PlanBuild,PlanOptimize}Microseconds`` counters of
  ``system.events``, read before and after the statement, less the cost of that read itself);
  ``pipeline_us`` building the pipeline from the plan (``QueryPipelineBuildMicroseconds``: one
  reader per part of each table read, so it grows with the parts), and ``total_us`` the
  statement's wall time from Python: the rest is execution. These counters are stopwatches: on a
  loaded machine they count the time the thread waited too;
- ``plan_cpu_us`` (chdb only, where ClickHouse runs in this process): CPU microseconds of the
  process for ``EXPLAIN PLAN`` of the SELECT, which parses, analyzes, builds and optimizes the
  plan (index analysis included) without running it: planning as CPU, less stretched by load.

On a server, ``system.events`` counts every session's queries: run it on a server of its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PLANNING_EVENTS = (
    "QueryParseMicroseconds",
    "QueryAnalysisMicroseconds",
    "QueryPlanBuildMicroseconds",
    "QueryPlanOptimizeMicroseconds",
    "QueryPipelineBuildMicroseconds",
)
_EVENTS_SQL = "SELECT name, value FROM system.events WHERE name IN ({})".format(
    ", ".join(f"'{name}'" for name in PLANNING_EVENTS)
)
_STAGE = re.compile(r"^CREATE TEMPORARY TABLE (\S+) ENGINE = Memory AS (.*)$", re.DOTALL)
_SETTINGS = re.compile(r"\nSETTINGS [^\n]*$")


def select_of(sql: str) -> str | None:
    """The SELECT a statement plans: the statement itself, or a stage's ``AS SELECT``."""
    stage = _STAGE.match(sql)
    if stage:
        return stage.group(2)
    head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
    return sql if head in ("SELECT", "WITH") else None


class PlanningRecorder:
    """A ClickHouse store that records each statement's planning cost (see the module docstring)
    and otherwise is the store it wraps: analytics runs on it as on the store."""

    def __init__(self, store: Any, explain: bool = True, events: bool = True, plan_cpu: bool = True) -> None:
        """``explain``: each SELECT's query tree counted; ``events``: the planning stopwatches
        read around each statement; ``plan_cpu``: each SELECT's ``EXPLAIN PLAN`` timed (chdb)."""
        self._store = store
        self.engine = store.engine
        self.database = getattr(store, "database", None)
        self.explain = explain
        self.events = events
        self.plan_cpu = plan_cpu
        self.statements: list[dict] = []
        self._read_cost = self._events_read_cost() if events else {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _counters(self) -> dict[str, int]:
        table = self._store.execute(_EVENTS_SQL)
        found = dict(zip(table.column("name").to_pylist(), table.column("value").to_pylist(), strict=True))
        return {name: int(found.get(name, 0)) for name in PLANNING_EVENTS}

    def _events_read_cost(self) -> dict[str, int]:
        """What one read of the counters adds to them (the least of a few reads)."""
        costs = []
        before = self._counters()
        for _ in range(5):
            after = self._counters()
            costs.append({name: after[name] - before[name] for name in PLANNING_EVENTS})
            before = after
        return {name: min(cost[name] for cost in costs) for name in PLANNING_EVENTS}

    def tree_rows(self, sql: str, params: dict[str, Any] | None) -> int | None:
        """Rows of ``EXPLAIN QUERY TREE`` of the SELECT ``sql`` plans (None for other statements)."""
        select = select_of(sql)
        if select is None:
            return None
        table = self._store.execute(f"EXPLAIN QUERY TREE {select}", params)
        return table.num_rows

    def plan_cpu_us(self, sql: str, params: dict[str, Any] | None) -> int | None:
        """CPU microseconds of this process for ``EXPLAIN PLAN`` of the SELECT ``sql`` plans
        (None for other statements, and on a server, whose CPU is not this process's)."""
        select = select_of(sql)
        if select is None or self.engine != "chdb":
            return None
        start = time.process_time()
        self._store.execute(f"EXPLAIN PLAN {select}", params)
        return int((time.process_time() - start) * 1e6)

    def _run(self, kind: str, sql: str, params: dict[str, Any] | None) -> Any:
        entry: dict[str, Any] = {"kind": kind, "sql": sql}
        if self.explain:
            entry["tree_rows"] = self.tree_rows(sql, params)
        if self.plan_cpu:
            entry["plan_cpu_us"] = self.plan_cpu_us(sql, params)
        before = self._counters() if self.events else None
        start = time.perf_counter()
        try:
            if kind == "execute":
                result = self._store.execute(sql, params)
            else:
                result = self._store.command(sql, params)
        finally:
            entry["total_us"] = int((time.perf_counter() - start) * 1e6)
            if before is not None:
                after = self._counters()
                spent = {n: max(0, after[n] - before[n] - self._read_cost[n]) for n in PLANNING_EVENTS}
                entry["events_us"] = spent
                entry.update(split_events(spent))
            self.statements.append(entry)
        return result

    def execute(self, sql: str, params: dict[str, Any] | None = None):
        return self._run("execute", sql, params)

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self._run("command", sql, params)


def split_events(spent: dict[str, int]) -> dict[str, int]:
    """``plan_us`` (parse, analysis, plan build and optimization) and ``pipeline_us`` of a
    statement's ``events_us``."""
    pipeline = spent.get("QueryPipelineBuildMicroseconds", 0)
    return {"plan_us": sum(spent.values()) - pipeline, "pipeline_us": pipeline}


def summarize(statements: list[dict]) -> dict:
    """The most planning, planning CPU, pipeline building and query tree of any one statement,
    and planning's share of all statements' wall time."""
    return {
        **{
            f"max_{key}": _most(statements, key)
            for key in ("plan_us", "plan_cpu_us", "pipeline_us", "tree_rows")
        },
        "sum_plan_us": sum(s.get("plan_us", 0) for s in statements),
        "sum_total_us": sum(s["total_us"] for s in statements),
    }


def _label(entry: dict) -> str:
    stage = _STAGE.match(entry["sql"])
    if stage:
        return "stage " + stage.group(1).split("_", 3)[-1].lstrip("_")
    if entry["sql"].startswith("DROP"):
        return "drop"
    return "select"


def planning_by_detector(store: Any, names: list[str] | None = None, explain: bool = True) -> dict:
    """Each registered metric (all spans, no filters) on ``store``: its statements, in order,
    each with its planning cost (``PlanningRecorder``); the DROPs of stage tables are left out."""
    import analytics  # noqa: F401 - registers every detector
    from analytics.registry import METRICS, run_metric
    from analytics.types import Filters, Window

    out: dict[str, dict] = {}
    for name in names or sorted(METRICS):
        recorder = PlanningRecorder(store, explain=explain)
        start, start_cpu = time.perf_counter(), time.process_time()
        run_metric(recorder, name, Window(), Filters())
        statements = [
            {"statement": _label(s), **{k: v for k, v in s.items() if k != "sql"}}
            for s in recorder.statements
            if not s["sql"].startswith("DROP")
        ]
        out[name] = {
            "wall_s": round(time.perf_counter() - start, 3),
            "cpu_s": round(time.process_time() - start_cpu, 3),
            "statements": statements,
            **summarize(statements),
        }
        logger.info(
            "%s: %d statements, planning at most %.3f s (%.3f CPU-s), query tree at most %d rows",
            name, len(statements), out[name]["max_plan_us"] / 1e6, out[name]["max_plan_cpu_us"] / 1e6,
            out[name]["max_tree_rows"],
        )  # fmt: skip
    return out


def _most(statements: list[dict], key: str) -> int:
    return max((s.get(key) or 0 for s in statements), default=0)


def planning_table(by_detector: dict) -> str:
    """Markdown: per detector, its statements and the most planning any of them took."""
    out = [
        "| detector | statements | most planning (s) | most planning CPU-s | most pipeline building (s) "
        "| largest query tree | planning / wall, all statements |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in sorted(by_detector.items()):
        share = entry["sum_plan_us"] / max(entry["sum_total_us"], 1)
        out.append(
            f"| {name} | {len(entry['statements'])} | {entry['max_plan_us'] / 1e6:.3f} | "
            f"{entry['max_plan_cpu_us'] / 1e6:.3f} | {entry['max_pipeline_us'] / 1e6:.3f} | "
            f"{entry['max_tree_rows']:,} | {share:.0%} |"
        )
    return "\n".join(out)


def sample_store(path: Path):
    """A chdb store at ``path`` holding the sample traces (``load_samples``)."""
    from collector.clickhouse_store import ChdbStore

    return load_samples(ChdbStore(str(path)))


def load_samples(store: Any) -> Any:
    """``store`` (chdb or a server) given the sample traces as a deployment fills one: driftscope's
    objects created, the exporter's ``otel_traces`` rows inserted (the view fills ``spans``), then
    a resolve pass. Returns ``store``."""
    import pyarrow as pa

    from collector.clickhouse_resolve import resolve_spans
    from collector.clickhouse_store import init_clickhouse, insert_otel_traces
    from collector.decode import JSON, decode_payload
    from collector.files import iter_file_requests

    samples = Path(__file__).resolve().parents[1] / "sample_traces"
    files = sorted(p for p in samples.glob("*.json") if not p.name.endswith(".truth.json"))
    init_clickhouse(store)
    tables = [
        decode_payload(payload, JSON).table for file in files for _, payload in iter_file_requests(file)
    ]
    insert_otel_traces(store, pa.concat_tables(tables, promote_options="default"))
    resolve_spans(store, settle_seconds=0)
    return store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chdb_plan", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--detectors", nargs="+", help="only these metrics")
    parser.add_argument("--spans", type=int, help="a generated store of this many spans (else the samples)")
    parser.add_argument("--reopen", action="store_true", help="grow the generated store an earlier run left")
    parser.add_argument(
        "--copy-above",
        type=int,
        help="generated spans past this many are copied in ClickHouse from resolved rows",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.spans:
        from benchmarks.chdb import ChdbSpanStore

        grown = ChdbSpanStore(args.workdir / "chdb-generated", reopen=args.reopen)
        real_to = args.spans if args.copy_above is None else min(args.spans, args.copy_above)
        if grown.spans < real_to:  # through the exporter's layout, the view and resolve
            grown.grow_to(real_to)
        if grown.spans < args.spans:
            grown.copy_to(args.spans)
        store = grown.store
    else:
        store = sample_store(args.workdir / "chdb-samples")
    try:
        result = planning_by_detector(store, args.detectors)
    finally:
        store.close()
    document = {
        "spans": grown.spans if args.spans else "sample traces",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "by_detector": result,
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(planning_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
