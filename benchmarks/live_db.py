"""Findings tables on an already built shape database (e.g. 10M spans, built once), batch by batch.

``python -m benchmarks.live_db DB --shape LABEL --out results.json [--names a b ...]``

``DB`` was built by ``benchmarks.dbbuild.SpanDatabase`` with that shape (default seed and base);
it is copied first (the batches are appended to the copy). First the materializer's pass that
builds every findings table (``analytics.materialize.bring_up_to_date``, timed), then per
detector, in the order given: the median of 3 reads (a SELECT over its table). Then per appended
512-span batch (the real decoder and ``insert_batches``: the change log is written with the
spans) the materializer's pass (timed: the work a batch costs) and each detector read again, and
with ``--check`` every table against a full recomputation (``registry.compute_metric``). The JSON
file is rewritten after every step, so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path


def _timed(fn) -> tuple[object, float, float]:
    start, start_cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - start, time.process_time() - start_cpu


def materializer_pass(conn) -> dict:
    """One pass of the materializer over ``conn`` (a file this process owns), timed: what serve's
    thread does after commits, writing through a direct write instead of serve's writer."""
    from analytics import materialize
    from analytics.types import direct_write

    cursor = conn.cursor()
    try:
        report, wall, cpu = _timed(lambda: materialize.bring_up_to_date(cursor, direct_write(conn)))
    finally:
        cursor.close()
    return {
        "s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "recomputed": dict(report.recomputed or {}),
        "failed": dict(report.failed or {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.live_db", description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--shape", required=True, help="shape label (benchmarks.shapes.matrix)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--names",
        nargs="+",
        help="detectors, in this order (default: every maintained one, then run_summary)",
    )
    parser.add_argument("--appends", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="compare each table with a full recomputation")
    parser.add_argument(
        "--at-end",
        action="store_true",
        help="batches start after every stored span (default: among the first)",
    )
    args = parser.parse_args(argv)

    from analytics import METRICS, run_metric
    from analytics.registry import compute_metric
    from benchmarks.dbbuild import SpanDatabase
    from benchmarks.generator import Shape
    from benchmarks.shapes import _same

    copy = args.db.with_name(args.db.stem + "-live.duckdb")
    shutil.copy(args.db, copy)
    db = SpanDatabase(copy, shape=Shape.parse(args.shape), reopen=True)
    db.conn.execute("SET threads = 2")
    names = args.names or [*sorted(n for n, m in METRICS.items() if m.kept), "run_summary"]
    out: dict = {
        "db": str(args.db),
        "shape": args.shape,
        "spans": db.spans,
        "at_end": args.at_end,
        "detectors": {},
    }

    def save() -> None:
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        args.out.write_text(json.dumps(out, indent=1))

    try:
        out["build"] = materializer_pass(db.conn)
        save()
        for name in names:
            frame = run_metric(db.conn, name)
            reads = [_timed(lambda name=name: run_metric(db.conn, name))[1:] for _ in range(3)]
            out["detectors"][name] = {
                "read_median_s": round(statistics.median(w for w, _ in reads), 4),
                "read_median_cpu_s": round(statistics.median(c for _, c in reads), 4),
                "source": frame.attrs.get("source", "computed"),
                "rows": len(frame),
            }
            save()
        for i in range(args.appends):
            db.append_batch(512, seed=2000 + i, at_end=args.at_end)
            out.setdefault("passes", []).append(materializer_pass(db.conn))
            for name in names:
                _, wall, cpu = _timed(lambda name=name: run_metric(db.conn, name))
                entry = out["detectors"][name]
                entry.setdefault("after_batch_s", []).append(round(wall, 4))
                entry.setdefault("after_batch_cpu_s", []).append(round(cpu, 4))
            save()
        if args.check:
            for name in names:
                full = compute_metric(db.conn, name)
                out["detectors"][name]["identical_to_full"] = _same(run_metric(db.conn, name), full)
                save()
    finally:
        db.close()
        copy.unlink(missing_ok=True)
        Path(f"{copy}.wal").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
