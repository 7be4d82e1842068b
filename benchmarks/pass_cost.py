"""What one materializer pass costs after a stream of new spans into stored runs.

`python -m benchmarks.pass_cost DB.duckdb [--times now|template] [SECONDS ...]`

Works on a copy of DB (built by ``benchmarks.live``'s ``build``, or any span database): builds
every findings table, then for each SECONDS (default 1 and 5) commits what ``benchmarks.live``'s
senders would stream in that time at 2,000 spans/s (requests of 10 runs x 20 spans, stamped into
the stored runs; ``--times``: as ``benchmarks.live`` sends them) through ``insert_batches``, and brings each maintained result up to date on its
own, timing each. In process, one thread: what a pass costs without serve's other work.
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
from analytics.types import direct_write
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
    seconds_list = [float(x) for x in args[1:]] or [1.0, 5.0]
    with tempfile.TemporaryDirectory(prefix="driftscope-pass-") as tmp:
        db = Path(tmp) / "pass.duckdb"
        shutil.copy(args[0], db)
        conn = database.open_database(db)
        runs = conn.execute("SELECT count(DISTINCT run_id) FROM spans").fetchall()[0][0]
        copies = max(1, runs // 5)  # the live benchmark's store: 5 runs per copy of its base
        started = time.perf_counter()
        cursor = conn.cursor()
        materialize.bring_up_to_date(cursor, direct_write(conn))
        cursor.close()
        print(f"tables built from nothing: {time.perf_counter() - started:.1f} s")
        payloads = _payloads(40_000, None, 20)
        rng = random.Random(5)
        for seconds in seconds_list:
            requests = int(2000 * seconds) // 200
            for _ in range(requests):
                body = b"".join(stamp(rng.choice(payloads), rng.randint(1, copies)) for _ in range(10))
                body = shift_to(body, time.time_ns()) if now else body
                conn.execute("BEGIN TRANSACTION")
                insert_batches(conn, [decode_payload(body, PROTOBUF)])
                conn.execute("COMMIT")
            costs = {}
            for name in materialize.maintained():
                cursor = conn.cursor()
                started = time.perf_counter()
                report = materialize.bring_up_to_date(cursor, direct_write(conn), [name])
                costs[name] = (time.perf_counter() - started, report.recomputed.get(name))
                cursor.close()
            total = sum(cost for cost, _ in costs.values())
            print(f"--- {requests * 200} spans in {requests} commits: pass {total:.2f} s "
                  f"(load {os.getloadavg()[0]:.1f})")  # fmt: skip
            for name, (cost, touched) in sorted(costs.items(), key=lambda kv: -kv[1][0]):
                print(f"  {cost:6.2f} s  {name} ({touched} partitions; -1: whole)")
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
