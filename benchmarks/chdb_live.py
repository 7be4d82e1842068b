"""chdb_live: every detector and run_summary read from ClickHouse's findings tables beside DuckDB's.

The same spans on both engines (``benchmarks.chdb``: the query benchmark's base, exporter-layout
copies into chdb up to ``copy_above`` spans then SQL copies inside ClickHouse; ``SpanDatabase``
for DuckDB). Each engine's findings tables are built by its materializer (timed), then every
registered metric is read through the read interface (``registry.run_metric``, which must answer
from the tables: ``source`` "table"): the first read (a fresh reader, nothing in process
memory), then the median of warm reads, wall and CPU. Then, on chdb only, new spans stream in
the way an exporter beside ``driftscope clickhouse resolve --follow`` brings them: a copy of the
base inserted into `otel_traces`, a resolve pass (logging the change), a materializer pass; each
round's seconds per step and the findings' lag after it (oldest change not yet reflected).
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

from benchmarks.chdb import ChdbSpanStore, stamp_copy
from benchmarks.dbbuild import SpanDatabase
from benchmarks.queries import warm_calls

logger = logging.getLogger(__name__)


def _reads(conn, repeats: int, names: list[str]) -> dict[str, dict]:
    """First and median warm read (wall, CPU) of each metric; its source ("table" or not)."""
    from analytics.registry import run_metric

    out = {}
    for name in names:
        start, start_cpu = time.perf_counter(), time.process_time()
        frame = run_metric(conn, name)
        cold, cold_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        out[name] = warm_calls(lambda n=name: run_metric(conn, n), repeats, cold, cold_cpu)
        out[name]["source"] = frame.attrs.get("source", "computed")
    return out


def _stream(chdb: ChdbSpanStore, rounds: int) -> list[dict]:
    """``rounds`` copies of the base streamed in: insert, resolve (logged), materializer pass."""
    from analytics.materialize_clickhouse import ClickHouseMaterializer
    from analytics.read_clickhouse import freshness
    from collector.clickhouse_changes import ChangeLog
    from collector.clickhouse_resolve import resolve_spans

    changes, materializer = ChangeLog(chdb.store), ClickHouseMaterializer(chdb.store)
    versions = materializer.versions()
    out = []
    for _ in range(rounds):
        chdb.copies += 1
        rows = stamp_copy(chdb.base, chdb.copies, chdb.base_minutes)
        t0 = time.perf_counter()
        chdb.store.insert_arrow(chdb.store.traces_table, rows)
        t1 = time.perf_counter()
        resolve_spans(chdb.store, settle_seconds=0, changes=changes)
        t2 = time.perf_counter()
        report = materializer.run_once(versions)
        t3 = time.perf_counter()
        fresh = freshness(chdb.store)
        out.append({
            "spans": rows.num_rows, "insert_s": round(t1 - t0, 3), "resolve_s": round(t2 - t1, 3),
            "pass_s": round(t3 - t2, 3), "round_s": round(t3 - t0, 3),
            "spans_per_s_kept_up": round(rows.num_rows / (t3 - t0), 1), "lag_after_s": fresh["lag_seconds"],
            "partitions": report.recomputed, "slowest": sorted(report.compute_seconds.items(), key=lambda kv: -kv[1])[:4],
            "load_average": [round(x, 2) for x in os.getloadavg()],
        })  # fmt: skip
        logger.info("stream round: %s", out[-1])
    return out


def _build(duck: SpanDatabase, chdb: ChdbSpanStore, size: int, copy_above: int) -> dict:
    """Both stores grown to ``size`` spans (the same spans) and their findings tables built."""
    from analytics import materialize, materialize_clickhouse
    from analytics.goals import score_pending_pairs
    from analytics.types import direct_write

    duck.grow_to(size)
    score_pending_pairs(duck.conn, limit=1_000_000, write=direct_write(duck.conn))
    chdb.grow_to(min(size, copy_above))
    if chdb.spans < size:
        chdb.copy_to(size)
    chdb.copy_analytics_tables(duck.conn)
    builds = {}
    for engine, build in (
        ("duckdb", lambda: materialize.bring_up_to_date(duck.conn, direct_write(duck.conn))),
        ("chdb", lambda: materialize_clickhouse.bring_up_to_date(chdb.store)),
    ):
        start, start_cpu = time.perf_counter(), time.process_time()
        report = build()
        builds[engine] = {
            "s": round(time.perf_counter() - start, 2), "cpu_s": round(time.process_time() - start_cpu, 2),
            "failed": report.failed, "slowest": sorted(report.compute_seconds.items(), key=lambda kv: -kv[1])[:6],
        }  # fmt: skip
        logger.info("%s findings tables built: %s", engine, builds[engine])
    return builds


def run_chdb_live(
    workdir: Path,
    size: int,
    repeats: int = 3,
    copy_above: int = 100_000,
    rounds: int = 3,
    keep: bool = False,
    reopen: bool = False,
) -> dict:
    """Build both stores at ``size`` spans and their findings tables; reads from the tables on
    both engines; ``rounds`` of streamed spans on chdb. ``reopen``: the stores (and tables) a
    ``keep`` run left in ``workdir``, read by this new process (a restarted reader), nothing built."""
    import analytics  # noqa: F401 - registers every detector
    from analytics import materialize_clickhouse
    from analytics.registry import METRICS

    workdir.mkdir(parents=True, exist_ok=True)
    duck = SpanDatabase(workdir / "live-twin.duckdb", reopen=reopen)
    chdb = ChdbSpanStore(workdir / "live-store", reopen=reopen)
    try:
        builds = {}
        if not reopen:
            builds = _build(duck, chdb, size, copy_above)
        names = [n for n in sorted(METRICS) if n in materialize_clickhouse.maintained()]
        load_before = [round(x, 2) for x in os.getloadavg()]
        reads = {"chdb": _reads(chdb.store, repeats, names), "duckdb": _reads(duck.conn, repeats, names)}
        ratio = {
            n: round(reads["chdb"][n]["median_s"] / max(reads["duckdb"][n]["median_s"], 1e-4), 2)
            for n in names
        }
        same_rows = {n: reads["chdb"][n]["rows"] == reads["duckdb"][n]["rows"] for n in names}
        spans = {"duckdb": duck.spans, "chdb": chdb.spans}  # what the reads read
        streamed = _stream(chdb, rounds) if rounds else []
        return {
            "spans": spans,
            "build": builds,
            "load_average_before_reads": load_before,
            "reads": reads,
            "warm_ratio_chdb_over_duckdb": ratio,
            "same_rows": same_rows,
            "stream": streamed,
        }
    finally:
        chdb.close()
        duck.close()
        if not keep and not reopen:
            duck.path.unlink(missing_ok=True)
            shutil.rmtree(chdb.path, ignore_errors=True)


def run_chdb_live_in_child(workdir: Path, size: int, repeats: int, copy_above: int, rounds: int) -> dict:
    """``run_chdb_live`` in a child process (this one may hold another chdb path)."""
    import subprocess  # noqa: PLC0415

    out = workdir / "chdb-live.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.chdb_live", "--size", str(size), "--repeats", str(repeats),
         "--copy-above", str(copy_above), "--rounds", str(rounds), "--workdir", str(workdir / "chdb-live"),
         "--out", str(out)],
        check=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chdb_live", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--copy-above", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3, help="streamed rounds on chdb (0: none)")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--keep", action="store_true", help="leave the stores in --workdir")
    parser.add_argument(
        "--reopen", action="store_true", help="read the stores a --keep run left (a restarted reader)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    result = run_chdb_live(
        args.workdir, args.size, args.repeats, args.copy_above, args.rounds, args.keep, args.reopen
    )
    args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
