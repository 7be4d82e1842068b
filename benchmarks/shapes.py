"""Shapes: every detector and run_summary on databases of different crew shapes, same stored spans.

One dimension of ``benchmarks.generator.Shape`` is varied at a time around a base shape (runs of
1,000 tool calls by 8 agents, as issue 14 measured), each shape grown to the same number of
stored spans (``benchmarks.dbbuild``). Per detector: cold call, then the median of warm calls,
both computed from the spans (no findings table built yet). Then as a live server sees them:
the materializer builds every findings table (``live.build``), and before each round of calls a
batch of new spans is ingested into the newest runs (the real decoder and ``insert_batches``,
change log included) and the materializer's pass brings the tables up to date (``live.passes``);
every maintained detector and ``run_summary`` are read after it (``live.after_batch``), and each
table is then checked against a full recomputation (``live.identical_to_full``).

The growth table gives, along each dimension, the ratio of a detector's median time at each
value to its time at the dimension's smallest value, next to the ratio of the values: a detector
whose cost follows stored spans only stays near 1 whatever the shape.
"""

from __future__ import annotations

import json
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


def _text(value) -> str:
    """A cell as text: lists element by element, every missing value alike, numpy scalars as
    Python ones."""
    import pandas as pd

    if hasattr(value, "__len__") and not isinstance(value, str):
        return repr([_text(item) for item in value])
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and value != value):
        return "None"
    return repr(value.item() if hasattr(value, "item") else value)


def _canonical(frame, floats: tuple[str, ...] = ()):
    """``frame`` with every cell as text and rows sorted: equal frames up to the order of ties and
    of the column types (a findings table gives nullable integers and booleans where a
    computation gives numpy ones, and every missing value alike). ``floats`` are left out."""
    import pandas as pd

    columns = [c for c in frame.columns if c not in floats]
    out = pd.DataFrame({column: [_text(v) for v in frame[column]] for column in columns})
    return out.sort_values(columns).reset_index(drop=True) if columns else out


def _ordered(frame, floats: list[str]):
    """``frame``'s rows in the order of their cells as text, floats last at 6 digits (ties)."""
    import pandas as pd

    keys = [c for c in frame.columns if c not in floats]
    text = pd.DataFrame({c: [_text(v) for v in frame[c]] for c in keys})
    for c in floats:
        text[c] = [f"{v:.6g}" if v == v and v is not None else "None" for v in frame[c].astype(float)]
    index = text.sort_values([*keys, *floats]).index
    return frame.iloc[index].reset_index(drop=True)


def _same(got, full) -> bool:
    """A table's result equal to the full one: rows tied on the detector's order may differ in
    order, and a float in its last bits (rejection_rates' trend, a regression over each group's
    buckets, differed by ~1e-10 relative between two computations of the same spans, in DuckDB's
    parallel order): floats are held to 1e-6 relative."""
    import numpy as np
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(got, full)
        return True
    except AssertionError:
        pass
    floats = [c for c in full.columns if getattr(full[c].dtype, "kind", "") == "f"]
    try:
        assert len(got) == len(full) and list(got.columns) == list(full.columns)
        a, b = _ordered(got, floats), _ordered(full, floats)
        pd.testing.assert_frame_equal(_canonical(a, tuple(floats)), _canonical(b, tuple(floats)))
        for column in floats:
            np.testing.assert_allclose(
                a[column].astype(float), b[column].astype(float), rtol=1e-6, atol=1e-12, equal_nan=True
            )
        return True
    except AssertionError as exc:
        logger.error("a findings table differs from a full recomputation: %s", exc)
        return False


def time_live(db: SpanDatabase, appends: int, batch: int) -> dict:
    """Every maintained detector and ``run_summary`` read right after each of ``appends``
    ingested batches of ``batch`` new spans (into the newest runs, the real decoder and
    ``insert_batches``) and the materializer's pass that follows it, as a live server sees them.

    After the timed calls every table is compared with a full recomputation
    (``registry.compute_metric``; run_summary from those results, ``summary.run_summary_of``);
    ``run_summary`` is then timed computed from the spans alone."""
    from analytics.registry import METRICS, compute_metric, run_metric
    from analytics.summary import run_summary_of
    from benchmarks.live_db import materializer_pass

    names = [*sorted(n for n, m in METRICS.items() if m.kept), "run_summary"]
    build = materializer_pass(db.conn)  # the tables a serve running all along would have
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    passes = []
    for i in range(appends):
        db.append_batch(batch, seed=2000 + i)
        passes.append(materializer_pass(db.conn))
        for name in names:
            start, start_cpu = time.perf_counter(), time.process_time()
            run_metric(db.conn, name)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    fulls = {name: compute_metric(db.conn, name) for name in names if name != "run_summary"}
    fulls["run_summary"] = run_summary_of(db.conn, fulls)  # from the detectors' full results
    identical = {name: _same(run_metric(db.conn, name), fulls[name]) for name in names}
    start, start_cpu = time.perf_counter(), time.process_time()
    compute_metric(db.conn, "run_summary")
    full_s, full_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return {
        "build": build,
        "passes": passes,
        "after_batch": {
            name: {
                "median_s": round(statistics.median(times[name]), 4),
                "median_cpu_s": round(statistics.median(cpu[name]), 4),
                "runs_s": [round(t, 4) for t in times[name]],
            }
            for name in names
        },
        "identical_to_full": identical,
        "run_summary_from_spans_s": round(full_s, 3),
        "run_summary_from_spans_cpu_s": round(full_cpu, 3),
        "batch_spans": batch,
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
    base_spans: int | None = None,
) -> dict:
    """Time every detector on each shape of the matrix at ``spans`` stored spans, each database
    grown from a generated base of ``base_spans`` (default ``benchmarks.dbbuild.BASE_SPANS``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for label, shape in matrix(dimensions).items():
        if only and label not in only:
            continue
        path = workdir / "shape.duckdb"
        start = time.perf_counter()
        db = SpanDatabase(path, shape=shape, base_spans=base_spans)
        db.grow_to(spans)
        build_s = time.perf_counter() - start
        try:
            db.conn.execute("SET threads = 2")
            timings = time_detectors(db.conn, repeats, limit_s=limit_s, skip=skip)
            if timings.get("run_summary", {}).get("median_s") is None:
                summary = {"skipped": "the full run_summary timed out"}
            else:
                summary = time_live(db, appends, batch)
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
            "live": summary,
            "load_average": [round(x, 2) for x in load],
        }
        logger.info("shape %s done in %.0fs", label, time.perf_counter() - start)
        logger.info("shape result %s", json.dumps({label: results[label]}, default=str))
    return {"spans": spans, "dimensions": dimensions, "by_shape": results}


def _cell(entry: dict, name: str, metric: str) -> float | None:
    """One detector's time on one shape: ``metric`` is ``median_s`` / ``median_cpu_s`` (warm
    calls), ``cold_s`` (first call) or ``after_batch_s`` / ``after_batch_cpu_s`` (right after a
    batch of new spans)."""
    if metric.startswith("after_batch"):
        live = (entry.get("live") or {}).get("after_batch") or {}
        key = "median_cpu_s" if metric.endswith("cpu_s") else "median_s"
        return (live.get(name) or {}).get(key)
    return entry["detectors"].get(name, {}).get(metric)


def growth_table(section: dict, metric: str = "median_s") -> str:
    """Markdown: per dimension, each detector's time at each value, and its ratio to the first
    (``metric`` as in ``_cell``)."""
    by_shape = section.get("by_shape") or {}
    out = []
    for dimension, values in section.get("dimensions", {}).items():
        labels = [shape_for(dimension, v).label for v in values]
        present = [(v, lbl) for v, lbl in zip(values, labels, strict=True) if lbl in by_shape]
        if len(present) < 2:
            continue
        names = sorted({n for _, lbl in present for n in by_shape[lbl]["detectors"]})
        if metric.startswith("after_batch"):
            names = [
                n for n in names if any(_cell(by_shape[lbl], n, metric) is not None for _, lbl in present)
            ]
        header = ["detector"] + [f"{dimension}={v}" for v, _ in present] + ["growth (time / value ratio)"]
        out.append(f"\n{section['spans']:,} stored spans, varying {dimension} ({metric})\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for name in names:
            medians = [_cell(by_shape[lbl], name, metric) for _, lbl in present]
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
