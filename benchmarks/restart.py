"""A restarted ``driftscope serve`` on a database whose findings tables are built: what a user's
first requests cost (issue 31: every detector's first answer <= 3x its warm one).

``python -m benchmarks.restart DB --out results.json [--names a b ...] [--workdir DIR]``

``DB`` is a span database (e.g. built by ``benchmarks.dbbuild``); it is copied into the work
directory and its findings tables are built first (``analytics.materialize.bring_up_to_date``,
timed), as a serve stopped cleanly leaves the file. Then, each time a fresh ``driftscope serve``
on 127.0.0.1 (its own process, nothing of this one's memory):

- ``at_start``: every detector requested once as soon as ``/api/v1/health`` answers, in the
  given order (a SELECT over the tables the last process left);
- ``start_pass_s``: how long after health answered the materializer's first pass had ended;
- ``after_start``: a second fresh serve, each detector requested once after that pass (the first
  request of this process for it), then three more times (``warm_s``: their median).

Requests are what the dashboard sends (``GET /api/v1/metrics/{name}``, Arrow stream), timed
from the client: the answer's encoding and transfer are in every number, cold or warm. The JSON
file is rewritten after every step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def _get(client: httpx.Client, url: str, name: str) -> tuple[float, int]:
    """Seconds one request of ``name``'s whole result took, and the answer's bytes."""
    # The answers before this one (up to 262 MB each) are freed by this process's collector (an
    # answer and its request refer to each other): collected here, not inside the timed request
    # (such a collection took 48-137 ms and landed on a later detector's first request).
    gc.collect()
    start = time.perf_counter()
    response = client.get(f"{url}/api/v1/metrics/{name}", headers={"Accept": ARROW_STREAM})
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed, len(response.content)


def _passes(client: httpx.Client, url: str) -> int:
    return client.get(f"{url}/api/v1/health").json()["findings"]["materializer_passes"]


def _prepare(db: Path, out: dict) -> None:
    """Build every findings table in ``db`` (what serve's materializer leaves in a file), timed."""
    from analytics import materialize
    from analytics.types import direct_write
    from driftscope.database import open_database

    conn = open_database(db, memory_limit=1024**3)
    try:
        start, start_cpu = time.perf_counter(), time.process_time()
        cursor = conn.cursor()
        report = materialize.bring_up_to_date(cursor, direct_write(conn))
        cursor.close()
        conn.execute("CHECKPOINT")
        out["prepare"] = {
            "s": round(time.perf_counter() - start, 2),
            "cpu_s": round(time.process_time() - start_cpu, 2),
            "failed": report.failed,
            "built": sorted(report.recomputed or {}),
        }
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.restart", description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--names", nargs="+", help="detectors, in this order (default: every registered one)")
    parser.add_argument("--workdir", type=Path, help="where the copy goes (default: a temporary directory)")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds one request or the start pass may take"
    )
    args = parser.parse_args(argv)

    from analytics import read
    from benchmarks.serve_proc import ServeProcess

    names = args.names or read.metric_names()
    workdir = Path(tempfile.mkdtemp(prefix="driftscope-restart-", dir=args.workdir))
    copy = workdir / "restart.duckdb"
    shutil.copyfile(args.db, copy)
    out: dict = {"db": str(args.db), "names": names}

    def save() -> None:
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        args.out.write_text(json.dumps(out, indent=1))

    try:
        _prepare(copy, out)
        save()
        with httpx.Client(timeout=args.timeout) as client:
            with ServeProcess(copy) as serve:
                out["at_start"] = {}
                for name in names:
                    seconds, size = _get(client, serve.http_url, name)
                    out["at_start"][name] = {"s": round(seconds, 3), "bytes": size}
                    save()
                out["at_start_peak_rss_bytes"] = serve.peak_rss_bytes()
            with ServeProcess(copy) as serve:
                healthy = time.perf_counter()
                deadline = healthy + args.timeout
                while _passes(client, serve.http_url) < 1:
                    if time.perf_counter() > deadline:
                        raise RuntimeError("the materializer's start pass did not end in time")
                    time.sleep(0.05)
                out["start_pass_s"] = round(time.perf_counter() - healthy, 3)
                out["after_start"] = {}
                for name in names:
                    first, size = _get(client, serve.http_url, name)
                    warm = [_get(client, serve.http_url, name)[0] for _ in range(3)]
                    median = statistics.median(warm)
                    out["after_start"][name] = {
                        "first_s": round(first, 3),
                        "warm_s": round(median, 3),
                        "ratio": round(first / median, 2) if median else None,
                        "bytes": size,
                    }
                    save()
                out["peak_rss_bytes"] = serve.peak_rss_bytes()
        save()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
