"""What one materializer pass costs after a stream of new spans into stored runs.

`python -m benchmarks.pass_cost DB.duckdb [--times now|template] [--stored-scores-only]
    [--shape LABEL] [SECONDS ...]`

Works on a copy of DB (built by ``benchmarks.live``'s ``build``, or any span database): builds
every findings table, then for each SECONDS (default 1 and 5) commits what ``benchmarks.live``'s
senders would stream in that time at 2,000 spans/s (requests of 10 runs x 20 spans, stamped into
the stored runs; ``--times``: as ``benchmarks.live`` sends them) through ``insert_batches``, and brings each maintained result up to date on its
own, timing each. In process, one thread: what a pass costs without serve's other work.

``--stored-scores-only``: the passes read stored goal scores only, as serve's materializer does
while its embedding worker runs; before each pass the worker's work (``embed_pending`` until no
pair is pending, timed apart: serve runs it in another thread) stores the new texts' scores.
Without it the passes score pending goal pairs themselves, as without the worker.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from analytics import materialize
from analytics.goal_refresh import read_stored_scores_only
from analytics.types import direct_write
from analytics.worker import embed_pending
from benchmarks.generator import shift_to, stamp
from benchmarks.live import _payloads
from collector.decode import PROTOBUF, decode_payload
from collector.store import insert_batches
from driftscope import database


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    now = True
    if "--times" in args:
        at = args.index("--times")
        now = args[at + 1] == "now"
        args = args[:at] + args[at + 2 :]
    shape = None  # the streamed requests' runs (benchmarks.generator.Shape.parse text)
    if "--shape" in args:
        at = args.index("--shape")
        shape = args[at + 1]
        args = args[:at] + args[at + 2 :]
    stored_only = "--stored-scores-only" in args
    args = [arg for arg in args if arg != "--stored-scores-only"]

    def cursor_of(conn):
        return read_stored_scores_only(conn.cursor()) if stored_only else conn.cursor()

    def worker(conn) -> None:
        """What serve's embedding worker does meanwhile (in its own thread): score every
        pending pair, through the writer."""
        if not stored_only:
            return
        started, pairs, texts = time.perf_counter(), 0, 0
        while True:
            scored, embedded = embed_pending(conn.cursor(), limit=2048, write=direct_write(conn))
            pairs, texts = pairs + scored, texts + embedded
            if not scored:
                break
        print(f"worker (apart from the pass): {pairs} pairs, {texts} texts embedded, "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip

    seconds_list = [float(x) for x in args[1:]] or [1.0, 5.0]
    with tempfile.TemporaryDirectory(prefix="driftscope-pass-") as tmp:
        db = Path(tmp) / "pass.duckdb"
        shutil.copy(args[0], db)
        conn = database.open_database(db)
        runs = conn.execute("SELECT count(DISTINCT run_id) FROM spans").fetchall()[0][0]
        copies = max(1, runs // 5)  # the live benchmark's store: 5 runs per copy of its base
        started = time.perf_counter()
        cursor = cursor_of(conn)  # the passes' one cursor, as serve's materializer has
        materialize.bring_up_to_date(cursor, direct_write(conn))
        print(f"tables built from nothing: {time.perf_counter() - started:.1f} s")
        worker(conn)
        payloads = _payloads(40_000, shape, 20)
        rng = random.Random(5)
        for seconds in seconds_list:
            requests = int(2000 * seconds) // 200
            for _ in range(requests):
                body = b"".join(stamp(rng.choice(payloads), rng.randint(1, copies)) for _ in range(10))
                body = shift_to(body, time.time_ns()) if now else body
                conn.execute("BEGIN TRANSACTION")
                insert_batches(conn, [decode_payload(body, PROTOBUF)])
                conn.execute("COMMIT")
            worker(conn)
            costs = {}
            for name in materialize.maintained():
                started = time.perf_counter()
                report = materialize.bring_up_to_date(cursor, direct_write(conn), [name])
                costs[name] = (time.perf_counter() - started, report.recomputed.get(name))
            total = sum(cost for cost, _ in costs.values())
            print(f"--- {requests * 200} spans in {requests} commits: pass {total:.2f} s "
                  f"(load {os.getloadavg()[0]:.1f})")  # fmt: skip
            for name, (cost, touched) in sorted(costs.items(), key=lambda kv: -kv[1][0]):
                print(f"  {cost:6.2f} s  {name} ({touched} partitions; -1: whole)")
        cursor.close()
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
