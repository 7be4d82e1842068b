"""Shapes: every detector and run_summary on databases of different crew shapes, same stored spans.

One dimension of ``benchmarks.generator.Shape`` is varied at a time around a base shape (runs of
1,000 tool calls by 8 agents, as issue 14 measured), each shape grown to the same number of
stored spans (``benchmarks.dbbuild``). Per detector: cold call, then the median of warm calls.
``run_summary`` is also timed as a live server sees it: a batch of new spans is ingested into the
newest run (the real decoder and ``insert_batches``) before each call, so every call follows a
data change (``incremental_s``), and its result is checked against a full recomputation.

The growth table gives, along each dimension, the ratio of a detector's median time at each
value to its time at the dimension's smallest value, next to the ratio of the values: a detector
whose cost follows stored spans only stays near 1 whatever the shape.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path

from benchmarks.dbbuild import SpanDatabase
from benchmarks.generator import Shape
from benchmarks.queries import time_detectors

logger = logging.getLogger(__name__)

BASE = {"calls_per_session": 1000, "agents_per_run": 8, "fanout": 8}
# Dimension -> the values tried (the base shape's value among them).
DIMENSIONS: dict[str, list] = {
    "calls_per_session": [10, 1000, 100_000],
    "agents_per_run": [2, 8, 64],
    "depth": [1, 3],  # with fanout 2 at depth 3 (14 agent spans) against 8 at depth 1
    "writes_per_key": [1, 100_000],  # 100_000: one key per run, written by every agent
    "spans_per_trace": [1, 100],  # one trace per run (1,009 spans): the base; 100k: calls_per_session
    "distinct_args": [0.0, 0.5, 1.0],
}
SMOKE_DIMENSIONS: dict[str, list] = {"calls_per_session": [10, 100]}


def shape_for(dimension: str, value) -> Shape:
    """The base shape with ``dimension`` set to ``value``."""
    fields = dict(BASE, distinct_args=0.5)
    if dimension == "depth":
        fields.update(depth=value, fanout=8 if value == 1 else 2)
    else:
        fields[dimension] = value
    return Shape(**fields)


def matrix(dimensions: dict[str, list]) -> dict[str, Shape]:
    """Every distinct shape of the matrix by label."""
    shapes = {}
    for dimension, values in dimensions.items():
        for value in values:
            shape = shape_for(dimension, value)
            shapes[shape.label] = shape
    return shapes


def time_incremental_summary(db: SpanDatabase, appends: int, batch: int) -> dict:
    """``run_summary`` right after each of ``appends`` ingested batches of ``batch`` new spans.

    After the timed calls the result is compared with a full recomputation (cache cleared).
    """
    import pandas as pd

    from analytics.registry import run_metric
    from analytics.summary import clear_cache

    run_metric(db.conn, "run_summary")  # the cached state a live dashboard would have
    times, cpu = [], []
    for i in range(appends):
        db.append_batch(batch, seed=2000 + i)
        start, start_cpu = time.perf_counter(), time.process_time()
        incremental = run_metric(db.conn, "run_summary")
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    clear_cache()
    start = time.perf_counter()
    full = run_metric(db.conn, "run_summary")
    full_s = time.perf_counter() - start
    try:
        pd.testing.assert_frame_equal(incremental, full)
        identical = True
    except AssertionError as exc:
        logger.error("incremental run_summary differs from the full one: %s", exc)
        identical = False
    return {
        "incremental_s": round(statistics.median(times), 4),
        "incremental_cpu_s": round(statistics.median(cpu), 4),
        "incremental_runs_s": [round(t, 4) for t in times],
        "full_after_appends_s": round(full_s, 4),
        "identical_to_full": identical,
        "batch_spans": batch,
        "runs": len(full),
    }


def run_shapes(
    workdir: Path,
    spans: int,
    dimensions: dict[str, list],
    repeats: int = 3,
    limit_s: float = 60.0,
    skip: set[str] | None = None,
    appends: int = 3,
    batch: int = 512,
    only: list[str] | None = None,
) -> dict:
    """Time every detector on each shape of the matrix at ``spans`` stored spans."""
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for label, shape in matrix(dimensions).items():
        if only and label not in only:
            continue
        path = workdir / "shape.duckdb"
        start = time.perf_counter()
        db = SpanDatabase(path, shape=shape)
        db.grow_to(spans)
        build_s = time.perf_counter() - start
        try:
            db.conn.execute("SET threads = 2")
            timings = time_detectors(db.conn, repeats, limit_s=limit_s, skip=skip)
            if timings.get("run_summary", {}).get("median_s") is None:
                summary = {"skipped": "the full run_summary timed out"}
            else:
                summary = time_incremental_summary(db, appends, batch)
            stored = db.conn.execute("SELECT count(*) FROM spans").fetchone()[0]
            load = os.getloadavg()
        finally:
            db.close()
            path.unlink(missing_ok=True)
            Path(f"{path}.wal").unlink(missing_ok=True)
        results[label] = {
            "shape": {k: v for k, v in shape.__dict__.items()},
            "spans": stored,
            "build_s": round(build_s, 1),
            "detectors": timings,
            "run_summary_live": summary,
            "load_average": [round(x, 2) for x in load],
        }
        logger.info("shape %s done in %.0fs", label, time.perf_counter() - start)
    return {"spans": spans, "dimensions": dimensions, "by_shape": results}


def growth_table(section: dict, metric: str = "median_s") -> str:
    """Markdown: per dimension, each detector's median at each value, and its ratio to the first.

    ``metric``: ``median_s`` (wall seconds) or ``median_cpu_s`` (CPU seconds of the process)."""
    by_shape = section.get("by_shape") or {}
    out = []
    for dimension, values in section.get("dimensions", {}).items():
        labels = [shape_for(dimension, v).label for v in values]
        present = [(v, lbl) for v, lbl in zip(values, labels, strict=True) if lbl in by_shape]
        if len(present) < 2:
            continue
        names = sorted({n for _, lbl in present for n in by_shape[lbl]["detectors"]})
        header = ["detector"] + [f"{dimension}={v}" for v, _ in present] + ["growth (time / value ratio)"]
        unit = "CPU seconds" if metric == "median_cpu_s" else "seconds"
        out.append(f"\n{section['spans']:,} stored spans, varying {dimension} (median {unit})\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        rows = [(n, [by_shape[lbl]["detectors"].get(n, {}).get(metric) for _, lbl in present]) for n in names]
        live_metric = "incremental_cpu_s" if metric == "median_cpu_s" else "incremental_s"
        live = [by_shape[lbl].get("run_summary_live", {}).get(live_metric) for _, lbl in present]
        rows.append(("run_summary (after new spans)", live))
        for name, medians in rows:
            cells = [f"{m:.3f}" if m is not None else "-" for m in medians]
            first, last = medians[0], medians[-1]
            v0, v1 = present[0][0], present[-1][0]
            value_ratio = (v1 / v0) if v0 else None
            if first and last is not None:
                ratio = last / max(first, 1e-4)
                growth = f"x{ratio:.1f}" + (f" / x{value_ratio:g}" if value_ratio else "")
            else:
                growth = "n/a"
            out.append("| " + " | ".join([name, *cells, growth]) + " |")
    return "\n".join(out)
