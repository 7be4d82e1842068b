"""A live incident: reads while spans keep arriving (issue 31).

``python -m benchmarks.live --spans 1000000 --rate 2000 --seconds 120 --out results.json [--shape S]``

A database of ``--spans`` stored spans (``benchmarks.dbbuild``, runs of ``--shape``; default: runs
of 1,000 calls, so ~1,000 runs at 1M) is served by a real ``driftscope serve`` on 127.0.0.1. Once
its materializer has built every findings table (``build_s``), a sender thread streams OTLP/HTTP
protobuf requests at ``--rate`` spans/s into ``--active-runs`` stored runs, those of the newest copies
(default 1,000, the issue's fleet; 0: every stored run), each request carrying spans of
``--runs-per-request`` runs, so every active run is touched every few seconds, while a client asks every
detector and run_summary in turn (``GET /api/v1/metrics/{name}``, Arrow, as the dashboard asks)
for ``--seconds``. ``--times now`` (default) moves each run's spans in a request to the moment it is sent
(crews still running: every new call comes after its group's stored ones); ``--times template``
keeps the template's times (old spans arriving late, within the stored runs' time range). A
template request drawn again for a copy is sent into new runs of the crew (``Resends``), so every
request stores new spans, whatever the shape. Serve runs with its embedding worker, as by default
(``--no-embeddings``: without).
Reported: p50/p95/max per detector, the findings lag (``/api/v1/health``,
sampled every second) p50/p95/max, spans/s actually accepted, serve's peak RSS, and the load.
The JSON file is rewritten at the end of each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx

ARROW_STREAM = "application/vnd.apache.arrow.stream"
PROTOBUF = "application/x-protobuf"


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _summary(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50": _percentile(values, 0.5),
        "p95": _percentile(values, 0.95),
        "max": max(values) if values else None,
    }


def build(path: Path, spans: int, shape_text: str | None) -> dict:
    """The span database: ``spans`` stored spans of the shape (copies of one generated base)."""
    from benchmarks.dbbuild import SpanDatabase
    from benchmarks.generator import Shape

    shape = Shape.parse(shape_text) if shape_text else Shape(calls_per_session=1000)
    db = SpanDatabase(path, shape=shape)
    seconds = db.grow_to(spans)
    runs = db.conn.execute("SELECT count(DISTINCT run_id) FROM spans").fetchone()[0]
    info = {"spans": db.spans, "runs": runs, "copies": db.copies, "grow_s": round(seconds, 1)}
    db.close()
    return info


def _payloads(count: int, shape_text: str | None, per_run: int) -> list[bytes]:
    """Template requests of ``per_run`` spans each (one run's spans: the generator emits runs in
    order), new trace and span ids under the stored run ids once stamped into a copy. ``count``
    is a copy's spans, so the template's runs are a copy's runs (``run-<copy>-000000`` on): a
    longer template would add runs no copy stores, each request starting new small runs."""
    from benchmarks.generator import Shape, template_payloads

    shape = Shape.parse(shape_text) if shape_text else Shape(calls_per_session=1000)
    return template_payloads(count, seed=1009, batch_size=per_run, shape=shape)


def _template_runs(payloads: list[bytes]) -> int:
    """How many runs (``gen_ai.conversation.id``) the template requests carry."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    runs = set()
    for payload in payloads:
        for rs in ExportTraceServiceRequest.FromString(payload).resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    runs.update(
                        a.value.string_value for a in span.attributes if a.key == "gen_ai.conversation.id"
                    )
    return len(runs)


class Sender(threading.Thread):
    """Streams requests at ``rate`` spans/s; each one concatenates ``runs`` template requests
    stamped into random copies (protobuf concatenation appends their resource spans). The
    senders of a stream share one ``Resends``, so no two of them send the same spans."""

    def __init__(
        self,
        url: str,
        payloads: list[bytes],
        per_run: int,
        runs: int,
        copies: tuple[int, int],
        rate: float,
        resends: Resends,
        seed: int = 0,
        now: bool = True,
    ):
        super().__init__(daemon=True)
        self.seed, self.now, self.resends = seed, now, resends
        self.url, self.payloads, self.per_run, self.runs = url, payloads, per_run, runs
        self.copies, self.rate = copies, rate  # the first and last copy streamed into
        self.sent = self.refused = 0
        self.latencies: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        from benchmarks.generator import stamp

        rng = random.Random(11 + self.seed)
        interval = self.per_run * self.runs / self.rate
        next_at = time.perf_counter()
        with httpx.Client(timeout=30) as client:
            while not self._halt.is_set():
                # each run's spans moved to now on their own: one shift for the whole request put
                # the other runs' spans as far after now as their template slices lay after the
                # earliest (hours in a 100,000-call run), so the next request's calls came before
                # them: out of order, unlike crews still running
                now = time.time_ns() if self.now else None
                parts = []
                for _ in range(self.runs):
                    index, copy = rng.randrange(len(self.payloads)), rng.randint(*self.copies)
                    namespace = Resends.namespace(copy, self.resends.next(index, copy), self.copies[1])
                    parts.append(_at(stamp(self.payloads[index], namespace), now))
                body = b"".join(parts)
                start = time.perf_counter()
                try:
                    response = client.post(
                        f"{self.url}/v1/traces", content=body, headers={"Content-Type": PROTOBUF}
                    )
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - start)
                if ok:
                    self.sent += self.per_run * self.runs
                else:
                    self.refused += 1
                next_at += interval
                delay = next_at - time.perf_counter()
                if delay > 0:
                    self._halt.wait(delay)
                else:
                    next_at = time.perf_counter()  # behind: do not burst to catch up

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


class Resends:
    """How often each (template request, copy) was drawn, shared by the senders. Stamping one
    into a copy always gives the same trace and span ids: a second draw was an exporter's retry,
    stored once, so a stream of few distinct requests (10-call runs: ~200 template requests into
    4 copies) stopped storing anything new within its first seconds. The k-th draw of one is
    stamped into namespace ``copy + k * stride`` (``namespace``), past every stored copy: the
    same requests as new runs of the crew (a 10-call run is done within seconds and the crew
    starts another), a trace's requests drawn for the k-th time each still one trace."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drawn: dict[tuple[int, int], int] = {}

    def draws(self) -> dict[str, int]:
        with self._lock:
            total = sum(self._drawn.values())
            return {"total": total, "again": total - len(self._drawn)}

    @staticmethod
    def namespace(copy: int, epoch: int, stride: int) -> int:
        """The namespace the ``epoch``-th draw of a request for ``copy`` is stamped into."""
        return copy + epoch * stride

    def next(self, index: int, copy: int) -> int:
        with self._lock:
            epoch = self._drawn.get((index, copy), 0)
            self._drawn[(index, copy)] = epoch + 1
            return epoch


def _at(payload: bytes, now: int | None) -> bytes:
    """``payload`` moved to start at ``now`` (unchanged when None: ``--times template``)."""
    from benchmarks.generator import shift_to

    return payload if now is None else shift_to(payload, now)


def _stream_seconds(before: dict, after: dict) -> dict:
    """The materializer's passes during the stream: how many, their seconds, and per result its
    compute and write seconds (health's totals since serve started, less those before)."""
    spent = {}
    for name, seconds in after.get("seconds_by_result", {}).items():
        first = before.get("seconds_by_result", {}).get(name, {})
        spent[name] = {kind: round(value - first.get(kind, 0.0), 2) for kind, value in seconds.items()}
    return {
        "passes": after.get("materializer_passes", 0) - before.get("materializer_passes", 0),
        "pass_s": round(after.get("pass_seconds_total", 0.0) - before.get("pass_seconds_total", 0.0), 1),
        "by_result": dict(sorted(spent.items(), key=lambda kv: -sum(kv[1].values()))),
    }


def _wait_built(client: httpx.Client, url: str, timeout: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        findings = client.get(f"{url}/api/v1/health").json().get("findings", {})
        if findings.get("behind_changes") == 0 and findings.get("findings_as_of") is not None:
            return time.perf_counter() - start
        time.sleep(1.0)
    raise RuntimeError(f"the findings tables were not built within {timeout}s")


def measure(db: Path, info: dict, args, out: dict, out_path: Path) -> None:
    from analytics import read
    from benchmarks.serve_proc import ServeProcess

    names = read.metric_names()
    copy_spans = args.template_spans or max(1, info["spans"] // info["copies"])
    payloads = _payloads(copy_spans, args.shape, args.per_run)
    per_copy = _template_runs(payloads)
    # the newest copies (last in time and in the table), as a fleet's running crews are recent
    active = (
        info["copies"]
        if not args.active_runs
        else max(1, min(info["copies"], -(-args.active_runs // per_copy)))
    )
    copies = (info["copies"] - active + 1, info["copies"])
    out["stream"] = {"template_spans": copy_spans, "runs_per_copy": per_copy, "active_copies": copies,
                     "active_runs": active * per_copy}  # fmt: skip
    serve_args = shlex.split(args.serve_args)
    with (
        ServeProcess(db, embeddings=args.embeddings, extra_args=serve_args) as serve,
        httpx.Client(timeout=300) as client,
    ):
        out["build_s"] = round(_wait_built(client, serve.http_url, args.build_timeout), 1)
        out["serve_rss_after_build_bytes"] = serve.rss_bytes()
        out["serve_peak_rss_after_build_bytes"] = serve.peak_rss_bytes()
        out_path.write_text(json.dumps(out, indent=2, default=str))
        warm = {name: [] for name in names}
        for _ in range(3):
            for name in names:
                start = time.perf_counter()
                client.get(f"{serve.http_url}/api/v1/metrics/{name}", headers={"Accept": ARROW_STREAM})
                warm[name].append(time.perf_counter() - start)
        out["at_rest"] = {name: _summary(values) for name, values in warm.items()}
        # Several senders, as a fleet's exporters send at once (one waits for each answer)
        resends = Resends()
        senders = [
            Sender(serve.http_url, payloads, args.per_run, args.runs_per_request, copies,
                   args.rate / args.senders, resends, seed=number, now=args.times == "now")
            for number in range(args.senders)
        ]  # fmt: skip
        lags: list[float] = []
        # (seconds into the stream, lag, materializer passes so far) per health sample: whether
        # the lag is the start catching up or the steady state
        series: list[tuple[float, float, int]] = []
        duckdb_peak = [0]  # the most DuckDB's buffer manager held at a health sample
        rss: list[int] = []  # serve's resident memory at each health sample
        working: dict[str, float] = {}
        timings = {name: [] for name in names}
        stop = threading.Event()

        def sample_lag() -> None:
            with httpx.Client(timeout=30) as probe:
                while not stop.is_set():
                    try:
                        health = probe.get(f"{serve.http_url}/api/v1/health").json()
                        lag = health["findings"]["lag_seconds"]
                        if lag is not None:
                            lags.append(lag)
                            at = round(time.perf_counter() - started, 1)
                            series.append((at, round(lag, 2), health["findings"].get("materializer_passes")))
                        current = health["findings"].get("working_on")
                        if current:  # the longest a sample found the materializer on a result
                            name, spent = current["result"], current["seconds"]
                            working[name] = max(working.get(name, 0.0), spent)
                        rss.append(serve.rss_bytes() or 0)
                        held = health.get("duckdb_memory", {}).get("total_bytes", 0)
                        duckdb_peak[0] = max(duckdb_peak[0], held)
                    except (httpx.HTTPError, KeyError):
                        pass
                    stop.wait(1.0)

        overview: dict = {}

        def render_overview() -> None:
            # the Overview page opened during the incident, through the serve's API (the
            # dashboard's HTTP source), in a fresh process, a third of the way into the stream
            from analytics.types import Window
            from benchmarks.dashboard import in_subprocess

            if not stop.wait(args.seconds / 3):
                overview.update(
                    in_subprocess("overview_render", serve.http_url, Window(), 300, warm_cache=False)
                )

        lag_thread = threading.Thread(target=sample_lag, daemon=True)
        overview_thread = threading.Thread(target=render_overview, daemon=True)
        load_before = os.getloadavg()
        # the materializer's seconds per result so far (the first build's): subtracted at the end
        before = client.get(f"{serve.http_url}/api/v1/health").json()["findings"]
        started = time.perf_counter()
        for sender in senders:
            sender.start()
        lag_thread.start()
        if args.overview:
            overview_thread.start()
        while time.perf_counter() - started < args.seconds:
            for name in names:
                start = time.perf_counter()
                response = client.get(
                    f"{serve.http_url}/api/v1/metrics/{name}", headers={"Accept": ARROW_STREAM}
                )
                timings[name].append(time.perf_counter() - start)
                response.raise_for_status()
                if args.read_pause:
                    time.sleep(args.read_pause)
        elapsed = time.perf_counter() - started
        for sender in senders:
            sender.stop()
        if args.overview:
            overview_thread.join(300)  # the render may end after the stream: wait for it
        stop.set()
        lag_thread.join(5)
        out["live"] = {
            "seconds": round(elapsed, 1),
            "spans_sent": sum(s.sent for s in senders),
            "spans_per_s": round(sum(s.sent for s in senders) / elapsed, 1),
            "refused_requests": sum(s.refused for s in senders),
            # template requests drawn, and of them drawn before: sent into new runs
            "draws": resends.draws(),
            "ingest_request_s": _summary([t for s in senders for t in s.latencies]),
            "lag_s": _summary(lags),
            "lag_series": series,
            "detectors": {name: _summary(values) for name, values in timings.items()},
            "over_300ms_p95": sorted(n for n, v in timings.items() if (_percentile(v, 0.95) or 0) > 0.3),
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "serve_peak_rss_bytes": serve.peak_rss_bytes(),
            # resident memory sampled each second of the stream (the peak may be the start's build)
            "serve_rss_bytes": _summary([float(r) for r in rss if r]),
            "duckdb_peak_bytes": duckdb_peak[0],
            # per result, the longest one pass was seen working on it (health samples, 1 s apart)
            "materializer_longest_s": dict(sorted(working.items(), key=lambda kv: -kv[1])),
            # benchmarks.dashboard.page_render's record (cold_s: first render, warm_s: a rerun)
            "overview": {k: v for k, v in overview.items() if k != "detector_seconds"},
        }
        out["health"] = serve.health()
        out["live"]["materializer_s"] = _stream_seconds(before, out["health"]["findings"])
    out_path.write_text(json.dumps(out, indent=2, default=str))


def run_live(
    workdir: Path,
    spans: int,
    seconds: float,
    rate: float,
    shape: str | None = None,
    senders: int = 4,
    out_path: Path | None = None,
) -> dict:
    """The live incident at ``spans`` stored spans of ``shape``: build, serve, stream, ask."""
    args = argparse.Namespace(
        spans=spans, shape=shape, rate=rate, seconds=seconds, per_run=20, runs_per_request=10,
        senders=senders, template_spans=0, active_runs=1000, build_timeout=3600.0,
        overview=seconds >= 30,  # the page's render takes seconds: not in a smoke run
        read_pause=0.0, times="now", embeddings=True, serve_args="",
    )  # fmt: skip
    db = workdir / f"live-{spans}.duckdb"
    out: dict = {"args": {k: v for k, v in vars(args).items()}}
    info = build(db, spans, shape)
    out["store"] = info
    out_path = out_path or workdir / f"live-{spans}.json"
    try:
        measure(db, info, args, out, out_path)
    finally:
        for path in (db, Path(f"{db}.wal")):
            path.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.live", description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--shape", default=None, help="benchmarks.generator.Shape.parse text")
    parser.add_argument("--rate", type=float, default=2000.0, help="spans/s streamed")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--per-run", type=int, default=20, help="spans of one run in a request")
    parser.add_argument("--runs-per-request", type=int, default=10)
    parser.add_argument("--senders", type=int, default=4, help="concurrent exporters")
    parser.add_argument("--template-spans", type=int, default=0,
                        help="spans of the template runs (0: a copy's, so the stream continues stored runs)")  # fmt: skip
    parser.add_argument("--active-runs", type=int, default=1000,
                        help="runs streamed into, the newest copies' (0: every stored run)")  # fmt: skip
    parser.add_argument("--build-timeout", type=float, default=3600.0)
    parser.add_argument("--db", type=Path, help="a database built before (copied; else built)")
    parser.add_argument("--read-pause", type=float, default=0.0,
                        help="seconds the reading client waits between reads (0: reads back to back)")  # fmt: skip
    parser.add_argument("--no-overview", dest="overview", action="store_false",
                        help="do not render the Overview page during the stream")  # fmt: skip
    parser.add_argument("--no-embeddings", dest="embeddings", action="store_false",
                        help="serve without its embedding worker (the materializer then scores new task "
                             "statements itself, kept on its own connection, not stored)")  # fmt: skip
    parser.add_argument("--times", choices=["now", "template"], default="now",
                        help="spans sent now (crews running) or at the template's times (late, old spans)")  # fmt: skip
    parser.add_argument(
        "--serve-args", default="", help="more arguments for serve, one string (e.g. '--memory-limit 512MiB')"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="driftscope-live-"))
    db = workdir / "live.duckdb"
    out: dict = {"args": vars(args), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        if args.db:
            shutil.copy(args.db, db)
            import duckdb

            conn = duckdb.connect(str(db), read_only=True)
            # the copies (namespaces 1..N, the trace id's second half) as stored: the stream
            # stamps its requests into them, so every sent run continues a stored one
            spans, runs, copies = conn.execute(
                "SELECT count(*), count(DISTINCT run_id),"
                " max(TRY_CAST('0x' || substr(TraceId, 17, 16) AS UBIGINT)) FROM spans"
            ).fetchone()
            conn.close()
            info = {"spans": spans, "runs": runs, "copies": int(copies or 1)}
        else:
            info = build(db, args.spans, args.shape)
        out["store"] = info
        args.out.write_text(json.dumps(out, indent=2, default=str))
        measure(db, info, args, out, args.out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({k: out.get(k) for k in ("store", "build_s", "live")}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
