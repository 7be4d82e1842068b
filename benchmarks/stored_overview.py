"""The Overview page on a database whose kept detector results are stored (as ``serve`` leaves it).

``python -m benchmarks.stored_overview DB --out results.json``

``DB`` is a span database (e.g. built by ``benchmarks.dbbuild`` at 10M spans of the worst shape).
First the pass ``serve``'s background refresh makes (``analytics.kept_worker.refresh``: every kept
detector and ``run_summary`` of the default scope computed from nothing, timed per detector), then
its store (``kept_worker.store`` through a direct write, timed); then the Overview page renders
in a fresh process on a read-only source (``benchmarks.dashboard.overview_render``), which reads
the stored results instead of computing them. The JSON file is rewritten after every step.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _timed(fn) -> tuple[object, float, float]:
    start, start_cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - start, time.process_time() - start_cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stored_overview", description=__doc__.splitlines()[0]
    )
    parser.add_argument("db", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the Overview render may take")
    parser.add_argument("--skip-refresh", action="store_true", help="results already stored: render only")
    parser.add_argument(
        "--memory-limit",
        type=int,
        default=1024**3,
        help="DuckDB memory limit in bytes (serve's default: 1 GiB)",
    )
    args = parser.parse_args(argv)

    from analytics import kept_worker, run_metric
    from analytics.types import Filters, Window, direct_write
    from benchmarks.dashboard import in_subprocess
    from driftscope.database import open_database

    out: dict = {"db": str(args.db), "refresh": {}}

    def save() -> None:
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        args.out.write_text(json.dumps(out, indent=1))

    # serve's memory limit: DuckDB's own default (80% of RAM) let one cold repeated_calls at 10M
    # spans of 100,000-call runs grow to 18.8 GB here before the kernel killed it
    conn = open_database(args.db, memory_limit=args.memory_limit)
    conn.execute("SET threads = 2")
    (out["spans"],) = conn.execute("SELECT count(*) FROM spans").fetchone()
    if not args.skip_refresh:
        for name in kept_worker.default_names():
            frame, wall, cpu = _timed(lambda name=name: run_metric(conn, name, Window(), Filters()))
            out["refresh"][name] = {"s": round(wall, 3), "cpu_s": round(cpu, 3), "rows": len(frame)}
            save()
        stored, wall, cpu = _timed(lambda: kept_worker.store(conn, direct_write(conn)))
        (size,) = conn.execute("SELECT sum(octet_length(frame)) FROM kept_results").fetchone()
        out["store"] = {"results": stored, "s": round(wall, 3), "cpu_s": round(cpu, 3), "bytes": size}
        conn.execute("CHECKPOINT")
        save()
    conn.close()
    out["overview_page"] = in_subprocess("overview_render", args.db, Window(), args.timeout, warm_cache=False)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
