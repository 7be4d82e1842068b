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

Beside an exporter (``run_exporter_resolve``, in a child process: chdb opens one data path per
process): the same requests decoded and inserted into `otel_traces` in the exporter's layout,
5,120 spans per INSERT (its `sending_queue.batch.min_size` 5000), the view filling `spans`; then
one resolve pass over all of them (what `driftscope clickhouse resolve --follow` does after an
outage), and a pass over one more INSERT on top (its steady state), timed apart.
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
    workdir: Path,
    spans: int,
    connections: int = 4,
    batch_size: int = 512,
    seed: int = 7,
    repo: Path | None = None,
) -> dict:
    """Ingest ``spans`` spans into a fresh ``serve --store chdb:PATH`` (of the tree ``repo``, for
    an A/B run; this one by default); return the rates."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "chdb-ingest"
    shutil.rmtree(path, ignore_errors=True)
    for stale in (workdir / "chdb-ingest.duckdb", Path(f"{path}.alerts.duckdb")):
        stale.unlink(missing_ok=True)
    templates = template_payloads(TEMPLATES * batch_size, seed, batch_size)
    spans_per = [batch_size] * len(templates)
    requests = -(-spans // batch_size)
    serve = ServeProcess(
        workdir / "chdb-ingest.duckdb",
        extra_args=["--store", f"chdb:{path}", "--alert-interval", "1h"],
        repo=repo,
    ).start(180)
    sampler = RssSampler(serve.pid)
    sampler.start()
    try:
        settle_alerting(serve)
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
        findings_s = None  # the findings tables holding every change (the materializer's lag)
        while time.perf_counter() < deadline:
            if (health.get("findings") or {}).get("behind_changes") == 0:
                findings_s = time.perf_counter() - acked_at
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
        "tree": str(repo) if repo is not None else "this",
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
        "findings_after_last_ack_s": round(findings_s, 2) if findings_s is not None else None,
        "findings": health.get("findings"),
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


def run_exporter_resolve(workdir: Path, spans: int, batch_size: int = 512, seed: int = 7) -> dict:
    """Insert ``spans`` spans through the views and time the resolve pass (see the module doc)."""
    import pyarrow as pa  # noqa: PLC0415

    from benchmarks.generator import stamp  # noqa: PLC0415
    from collector.clickhouse_resolve import resolve_spans, resolve_status  # noqa: PLC0415
    from collector.clickhouse_store import ChdbStore, init_clickhouse, insert_otel_traces  # noqa: PLC0415
    from collector.decode import PROTOBUF, decode_payload  # noqa: PLC0415

    path = workdir / "chdb-exporter-resolve"
    shutil.rmtree(path, ignore_errors=True)
    templates = template_payloads(TEMPLATES * batch_size, seed, batch_size)
    requests = -(-spans // batch_size)
    per_insert = 10  # requests per INSERT: 5,120 spans

    def tables(first: int, count: int):
        for start in range(first, first + count, per_insert):
            yield pa.concat_tables(
                [
                    decode_payload(
                        stamp(templates[i % len(templates)], 1 + i // len(templates)), PROTOBUF
                    ).table
                    for i in range(start, min(start + per_insert, first + count))
                ]
            )

    store = ChdbStore(str(path))
    try:
        init_clickhouse(store)
        insert_s = insert_cpu = 0.0
        for table in tables(0, requests):
            started, cpu = time.perf_counter(), time.process_time()
            insert_otel_traces(store, table)
            insert_s += time.perf_counter() - started
            insert_cpu += time.process_time() - cpu
        stored = requests * batch_size
        started, cpu = time.perf_counter(), time.process_time()
        rewritten = resolve_spans(store, settle_seconds=0)
        resolve_s, resolve_cpu = time.perf_counter() - started, time.process_time() - cpu
        (more,) = list(tables(requests, per_insert))
        insert_otel_traces(store, more)
        started, cpu = time.perf_counter(), time.process_time()
        rewritten_more = resolve_spans(store, settle_seconds=0)
        step_s, step_cpu = time.perf_counter() - started, time.process_time() - cpu
        status = resolve_status(store)
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    return {
        "spans": stored,
        "spans_per_insert": per_insert * batch_size,
        "insert_through_views_s": round(insert_s, 2),
        "insert_through_views_cpu_s": round(insert_cpu, 2),
        "insert_spans_per_s": round(stored / insert_s, 1),
        "resolve_all_s": round(resolve_s, 2),
        "resolve_all_cpu_s": round(resolve_cpu, 2),
        "resolve_spans_per_s": round(stored / resolve_s, 1),
        "resolve_rows_rewritten": rewritten,
        "pass_after_one_insert_spans": more.num_rows,
        "pass_after_one_insert_s": round(step_s, 3),
        "pass_after_one_insert_cpu_s": round(step_cpu, 3),
        "pass_after_one_insert_rows_rewritten": rewritten_more,
        "unresolved_after": status["unresolved_spans"],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def exporter_resolve_in_child(workdir: Path, spans: int) -> dict:
    """``run_exporter_resolve`` in a child process (this one may hold another chdb path)."""
    import subprocess  # noqa: PLC0415

    out = workdir / "chdb-exporter-resolve.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.chdb_ingest", "--exporter-resolve", "--spans", str(spans),
         "--workdir", str(workdir), "--out", str(out)],
        check=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    return json.loads(out.read_text())


def settle_alerting(serve: ServeProcess, timeout: float = 120.0) -> None:
    """Wait for the alert evaluator's first evaluation, which runs at start (serve is quiet
    then); the benchmark's serve evaluates again only an hour later (``--alert-interval 1h``):
    this measures ingest and resolve, not the detectors."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alerting = serve.health().get("alerting", {})
        if not alerting.get("enabled") or alerting.get("evaluations", 0) >= 1:
            return
        time.sleep(0.5)
    logger.warning("the alert evaluator had not finished its first evaluation after %.0f s", timeout)


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
    parser.add_argument("--repo", type=Path, help="serve from this tree instead (an A/B run)")
    parser.add_argument(
        "--exporter-resolve",
        action="store_true",
        help="instead: insert through the views (as behind an exporter) and time the resolve pass",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.exporter_resolve:
        result = run_exporter_resolve(args.workdir, args.spans, args.batch)
    else:
        result = run_chdb_ingest(args.workdir, args.spans, args.connections, args.batch, repo=args.repo)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
