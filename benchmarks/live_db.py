"""Kept detector results on an already built shape database (e.g. 10M spans, built once).

``python -m benchmarks.live_db DB --shape LABEL --out results.json [--names a b ...]``

``DB`` was built by ``benchmarks.dbbuild.SpanDatabase`` with that shape (default seed and base);
it is copied first (the batches are appended to the copy). Per detector, in the order given: the
cold call (a full computation), the median of 3 warm calls (nothing new: the kept result), then
per appended 512-span batch each detector again (brought up to date: only the touched runs), and
with ``--check`` every result against a full recomputation. With ``--restart`` the kept results
are then stored as serve's background refresh stores them (``analytics.kept_worker.store``,
timed), this process forgets them (as a restarted serve or a fresh report process would) and
each detector is called again (``restart``: read from the store, nothing new), then once more
after one more batch (``restart_after_batch``: read from the store and brought up to date). The
JSON file is rewritten after every step, so a run stopped early keeps what it measured.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.live_db", description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--shape", required=True, help="shape label (benchmarks.shapes.matrix)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--names", nargs="+", help="detectors, in this order (default: every kept one, then run_summary)"
    )
    parser.add_argument("--appends", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="compare each result with a full recomputation")
    parser.add_argument("--restart", action="store_true", help="store, forget, and call each detector again")
    parser.add_argument(
        "--at-end",
        action="store_true",
        help="batches start after every stored span (default: among the first)",
    )
    args = parser.parse_args(argv)

    from analytics import Filters, Window, kept, kept_worker, run_metric, summary
    from analytics.types import direct_write
    from benchmarks.dbbuild import SpanDatabase
    from benchmarks.generator import Shape
    from benchmarks.shapes import _same

    copy = args.db.with_name(args.db.stem + "-live.duckdb")
    shutil.copy(args.db, copy)
    db = SpanDatabase(copy, shape=Shape.parse(args.shape), reopen=True)
    db.conn.execute("SET threads = 2")
    names = args.names or [*sorted(kept.KEPT), "run_summary"]
    out: dict = {
        "db": str(args.db),
        "shape": args.shape,
        "spans": db.spans,
        "at_end": args.at_end,
        "detectors": {},
    }

    def save() -> None:
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        out["kept_stats"] = dict(kept.stats)
        args.out.write_text(json.dumps(out, indent=1))

    try:
        for name in names:
            frame, wall, cpu = _timed(lambda name=name: run_metric(db.conn, name))
            warm = [_timed(lambda name=name: run_metric(db.conn, name))[1:] for _ in range(3)]
            out["detectors"][name] = {
                "cold_s": round(wall, 3),
                "cold_cpu_s": round(cpu, 3),
                "warm_median_s": round(statistics.median(w for w, _ in warm), 4),
                "warm_median_cpu_s": round(statistics.median(c for _, c in warm), 4),
                "rows": len(frame),
                "load_average": [round(x, 2) for x in os.getloadavg()],
            }
            save()
        for i in range(args.appends):
            db.append_batch(512, seed=2000 + i, at_end=args.at_end)
            for name in names:
                _, wall, cpu = _timed(lambda name=name: run_metric(db.conn, name))
                entry = out["detectors"][name]
                entry.setdefault("after_batch_s", []).append(round(wall, 4))
                entry.setdefault("after_batch_cpu_s", []).append(round(cpu, 4))
                save()
        if args.restart:
            for step in ("restart", "restart_after_batch"):
                if step == "restart_after_batch":
                    kept_worker.refresh(db.conn, names)  # the worker's pass after the last batch
                _, wall, cpu = _timed(lambda: kept_worker.store(db.conn, direct_write(db.conn)))
                (stored_bytes,) = db.conn.execute(
                    "SELECT sum(octet_length(frame)) FROM kept_results"
                ).fetchone()
                out.setdefault("store", []).append(
                    {"step": step, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "bytes": stored_bytes}
                )
                kept.clear_cache()
                summary.clear_cache()
                if step == "restart_after_batch":
                    db.append_batch(512, seed=2000 + args.appends, at_end=args.at_end)
                for name in names:
                    _, wall, cpu = _timed(lambda name=name: run_metric(db.conn, name))
                    warm = [_timed(lambda name=name: run_metric(db.conn, name))[1:] for _ in range(3)]
                    out["detectors"][name][step] = {
                        "s": round(wall, 4),
                        "cpu_s": round(cpu, 4),
                        "then_warm_median_s": round(statistics.median(w for w, _ in warm), 4),
                        "then_warm_median_cpu_s": round(statistics.median(c for _, c in warm), 4),
                    }
                    save()
        if args.check:
            for name in names:
                with kept.computed_in_full():  # repeated_calls in chunks of runs, as from nothing
                    full = run_metric(db.conn, name, Window(), Filters())
                out["detectors"][name]["identical_to_full"] = _same(run_metric(db.conn, name), full)
                save()
    finally:
        db.close()
        copy.unlink(missing_ok=True)
        Path(f"{copy}.wal").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
