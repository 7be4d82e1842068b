"""chdb ingest: OTLP protobuf into a real `driftscope serve --store chdb:PATH`, then the resolve.

The real path end to end: the benchmark generator's requests (``benchmarks.ingest``'s templates,
each send stamped into a fresh namespace, so every request brings new traces) are posted over
loopback HTTP from several connections to a fresh serve on a chdb data path. A request counts
only when serve answered 200 with no rejected spans, and serve answers only after the INSERT into
`otel_traces` (the materialized view filling `spans` in it) returned: acknowledged spans/s is the
durable insert rate. The resolve pass runs beside the inserts (``driftscope serve --store``
resolves continuously); the run then waits until the health answer says `spans` is resolved up to
the last acknowledged insert, and reports how long after the last acknowledgement that was and the
resolve's own rate (rows resolved per second of resolve work).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks.generator import template_payloads
from benchmarks.ingest import TEMPLATES, LoadClient, RssSampler
from benchmarks.serve_proc import ServeProcess

logger = logging.getLogger(__name__)


def run_chdb_ingest(
    workdir: Path, spans: int, connections: int = 4, batch_size: int = 512, seed: int = 7
) -> dict:
    """Ingest ``spans`` spans into a fresh ``serve --store chdb:PATH``; return the rates."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "chdb-ingest"
    shutil.rmtree(path, ignore_errors=True)
    for stale in (workdir / "chdb-ingest.duckdb", Path(f"{path}.alerts.duckdb")):
        stale.unlink(missing_ok=True)
    templates = template_payloads(TEMPLATES * batch_size, seed, batch_size)
    spans_per = [batch_size] * len(templates)
    requests = -(-spans // batch_size)
    serve = ServeProcess(
        workdir / "chdb-ingest.duckdb", extra_args=["--store", f"chdb:{path}", "--alert-interval", "1h"]
    ).start(180)
    sampler = RssSampler(serve.pid)
    sampler.start()
    try:
        cpu_before = _cpu_seconds(serve.pid)
        client = LoadClient(serve, "http", templates, requests)
        elapsed = client.run(connections, spans_per)
        acked_at = time.perf_counter()
        health = serve.health()
        caught_up_s = None
        deadline = acked_at + 300
        passes = health["resolve_passes"]
        while time.perf_counter() < deadline:
            resolve = health.get("resolve")
            if (resolve is None and health["resolve_passes"] > passes) or (
                resolve is not None
                and resolve["unresolved_spans"] == 0
                and resolve["resolved_to"] is not None
            ):
                caught_up_s = time.perf_counter() - acked_at
                break
            time.sleep(0.2)
            health = serve.health()
        cpu_s = _cpu_seconds(serve.pid) - cpu_before
    finally:
        sampler.stop()
        code = serve.stop()
    if code != 0:
        raise RuntimeError(f"serve exited with {code}: {serve.log()[-2000:]}")
    resolve = health.get("resolve")
    result = {
        "transport": "http",
        "connections": connections,
        "batch_spans": batch_size,
        "spans_acknowledged": client.acked_spans,
        "committed_spans": health["committed_spans"],
        "stored_spans": health["spans"],
        "errors": client.errors[:5],
        "error_count": len(client.errors),
        "throttled_retries": client.retries,
        "elapsed_s": round(elapsed, 3),
        "acked_spans_per_s": round(client.acked_spans / elapsed, 1),
        "commits": health["commits"],
        "spans_per_commit": round(health["commits"] and health["committed_spans"] / health["commits"], 1),
        "insert_seconds": health.get("insert_seconds"),
        "direct_insert": health.get("direct_insert"),
        "resolve_pass_seconds_total": health.get("resolve_pass_seconds_total"),
        "resolved_after_last_ack_s": round(caught_up_s, 2) if caught_up_s is not None else None,
        "resolve": resolve,
        "resolve_passes": health["resolve_passes"],
        "writer_busy_s": health["writer_busy_seconds"],
        "serve_cpu_s": round(cpu_s, 2) if cpu_s is not None else None,
        "serve_peak_rss_bytes": sampler.peak_kib * 1024,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    logger.info(
        "chdb ingest %d spans: %.0f acked spans/s (%d commits), resolved %s s after the last ack",
        client.acked_spans,
        result["acked_spans_per_s"],
        health["commits"],
        result["resolved_after_last_ack_s"],
    )
    shutil.rmtree(path, ignore_errors=True)
    return result


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (its threads included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--batch", type=int, default=512, help="spans per OTLP request")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/driftscope-bench"))
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    result = run_chdb_ingest(args.workdir, args.spans, args.connections, args.batch)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
