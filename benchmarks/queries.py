"""Queries: every registered detector (and run_summary) at growing numbers of stored spans.

Each size is reached by growing one database (``benchmarks.dbbuild``). Per detector: the first
call is reported as ``cold_s`` (goal_divergence embeds the base's few hundred distinct texts then),
then the median of ``repeats`` further calls; the growth ratio is median(size) / median(previous).
Detectors run over all stored spans (an open ``Window``), on the database's own connection.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from pathlib import Path

import duckdb

from benchmarks.dbbuild import SpanDatabase

logger = logging.getLogger(__name__)


def warm_calls(call, repeats: int, cold: float, cold_cpu: float) -> dict:
    """Time ``call()`` ``repeats`` times after its cold call took ``cold`` / ``cold_cpu`` seconds:
    cold and median warm seconds, wall and CPU, and the rows of the last frame. CPU seconds are
    this process's (every engine thread): on a shared, loaded machine the wall time is this
    stretched by the other processes' load."""
    runs, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        frame = call()
        runs.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {
        "cold_s": round(cold, 4),
        "cold_cpu_s": round(cold_cpu, 4),
        "median_s": round(statistics.median(runs), 4),
        "median_cpu_s": round(statistics.median(cpu), 4),
        "runs_s": [round(r, 4) for r in runs],
        "rows": len(frame),
    }


def time_detectors(
    conn,
    repeats: int,
    names: list[str] | None = None,
    limit_s: float = 300.0,
    skip: set[str] | None = None,
    from_spans: bool = False,
) -> dict[str, dict]:
    """Cold and median seconds of each registered metric on ``conn`` (all spans, no filters);
    ``from_spans``: computed from the spans even where findings tables are built.

    A detector whose query runs past ``limit_s`` is interrupted and reported as timed out; names
    in ``skip`` are not run.
    """
    import analytics  # noqa: F401 - registers every detector
    from analytics.registry import METRICS, run_metric
    from analytics.types import Filters, Window

    scope = Filters(from_spans=from_spans)
    results: dict[str, dict] = {}
    for name in names or sorted(METRICS):
        if name in (skip or ()):
            results[name] = {"skipped": "timed out at a smaller size", "median_s": None}
            continue
        # A runaway query is interrupted (DuckDB checks for it between vectors), not waited for.
        timer = threading.Timer(limit_s, conn.interrupt)
        timer.start()
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            frame = run_metric(conn, name, Window(), scope)
        except duckdb.InterruptException:
            results[name] = {"timed_out_after_s": limit_s, "median_s": None}
            logger.warning("%s interrupted after %ss", name, limit_s)
            continue
        finally:
            timer.cancel()
        cold, cold_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        # Detectors slower than a tenth of the limit are timed once more, not ``repeats`` times.
        results[name] = warm_calls(
            lambda: run_metric(conn, name, Window(), scope),  # noqa: B023 - called in this turn
            repeats if cold < limit_s / 10 else 1, cold, cold_cpu,
        )  # fmt: skip
        logger.info("%s: median %.3fs (%d rows)", name, results[name]["median_s"], len(frame))
    return results


def run_queries(
    workdir: Path,
    sizes: list[int],
    repeats: int = 5,
    keep: Path | None = None,
    keep_at: int = 1_000_000,
    limit_s: float = 300.0,
    base_spans: int | None = None,
) -> dict:
    """Detector timings at each size in ``sizes`` (ascending), with growth ratios between sizes."""
    workdir.mkdir(parents=True, exist_ok=True)
    db = SpanDatabase(workdir / "queries.duckdb", base_spans=base_spans)
    by_size: dict[str, dict] = {}
    timed_out: set[str] = set()
    previous = None
    try:
        for size in sorted(sizes):
            build_s = db.grow_to(size)
            timings = time_detectors(
                db.conn,
                repeats if size < 5_000_000 else max(3, repeats // 2),
                limit_s=limit_s,
                skip=timed_out,
            )
            timed_out |= {name for name, t in timings.items() if t["median_s"] is None}
            entry = {"spans": db.spans, "build_s": round(build_s, 1), "detectors": timings}
            if previous is not None:
                factor = db.spans / by_size[str(previous)]["spans"]
                entry["span_growth"] = round(factor, 2)
                entry["time_growth"] = {
                    name: round(
                        t["median_s"] / max(by_size[str(previous)]["detectors"][name]["median_s"], 1e-4), 2
                    )
                    for name, t in timings.items()
                    if t["median_s"] is not None
                    and by_size[str(previous)]["detectors"][name]["median_s"] is not None
                }
            by_size[str(size)] = entry
            previous = size
            if keep is not None and size == keep_at:
                db.conn.execute("CHECKPOINT")
                keep.write_bytes(db.path.read_bytes())
        disk = db.path.stat().st_size
        spans = db.spans
    finally:
        db.close()
    db.path.unlink(missing_ok=True)
    return {
        "by_size": by_size,
        "db_bytes_at_largest": disk,
        "bytes_per_span_at_largest": round(disk / spans, 1),
    }
