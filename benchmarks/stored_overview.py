"""The Overview page on a database whose findings tables are built (as ``serve`` leaves it).

``python -m benchmarks.stored_overview DB --out results.json``

``DB`` is a span database (e.g. built by ``benchmarks.dbbuild`` at 10M spans of the worst shape).
First the pass ``serve``'s materializer makes on it (``analytics.materialize.bring_up_to_date``:
every findings table built from nothing, timed), then the Overview page renders in a fresh
process on a read-only source (``benchmarks.dashboard.overview_render``), which reads the tables
instead of computing the detectors. The JSON file is rewritten after every step.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stored_overview", description=__doc__.splitlines()[0]
    )
    parser.add_argument("db", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the Overview render may take")
    parser.add_argument("--skip-build", action="store_true", help="tables already built: render only")
    parser.add_argument(
        "--memory-limit",
        type=int,
        default=1024**3,
        help="DuckDB memory limit in bytes (serve's default: 1 GiB)",
    )
    args = parser.parse_args(argv)

    from analytics.types import Window
    from benchmarks.dashboard import in_subprocess
    from benchmarks.live_db import materializer_pass
    from driftscope.database import open_database

    out: dict = {"db": str(args.db)}

    def save() -> None:
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        args.out.write_text(json.dumps(out, indent=1))

    # serve's memory limit: DuckDB's own default (80% of RAM) let one cold repeated_calls at 10M
    # spans of 100,000-call runs grow to 18.8 GB here before the kernel killed it
    conn = open_database(args.db, memory_limit=args.memory_limit)
    conn.execute("SET threads = 2")
    (out["spans"],) = conn.execute("SELECT count(*) FROM spans").fetchone()
    if not args.skip_build:
        out["build"] = materializer_pass(conn)
        conn.execute("CHECKPOINT")
        save()
    conn.close()
    out["overview_page"] = in_subprocess("overview_render", args.db, Window(), args.timeout, warm_cache=False)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
