"""`driftscope serve`: one process wiring receivers, the single writer, analytics and the read API."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import uvicorn
from starlette.applications import Starlette

from analytics.goal_refresh import read_stored_scores_only
from analytics.materialize import Materializer, freshness
from analytics.side_effects import configure_side_effect_tools
from collector import fastdecode
from collector.decode import DecodeLimits
from collector.grpc_receiver import GrpcBindError, start_grpc_server
from collector.http_receiver import ReceiverConfig, build_ingest_routes
from collector.ingest_guard import DecodePool, PendingBytes, guarded_h11_protocol
from collector.stats import IngestStats
from collector.store import StoreLockedError, delete_expired
from collector.writer import IngestQueue, SpanWriter
from driftscope.api import build_api_routes
from driftscope.calibrate import build_calibrate_routes
from driftscope.database import open_database
from driftscope.hosts import AllowedHosts, HostCheckMiddleware
from driftscope.settings import BY_NAME, ConfigError

logger = logging.getLogger(__name__)


@dataclass
class ServeConfig:
    db: str
    store: str | None = None  # chdb:PATH or clickhouse://...: spans go to ClickHouse (docs/scale-out.md)
    host: str = "127.0.0.1"
    http_port: int = 4318
    grpc_port: int = 4317
    token: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    insecure: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    queue_max_bytes: int = 256 * 1024 * 1024
    max_attribute_bytes: int = 64 * 1024
    max_spans_per_request: int = 100_000
    max_attributes_per_span: int = 1024
    max_items_per_request: int = 2_000_000
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_pending_bytes: int = 256 * 1024 * 1024
    decode_workers: int = 2
    memory_limit: int = 1024**3
    retention: float | None = None
    retention_interval: float = 60.0
    embeddings: bool = True
    side_effect_tools: str | None = None  # None: analytics.side_effects' default verb pattern
    alert_rules: str | None = None
    alertmanager_url: str | None = None
    alert_interval: float = 30.0
    alert_webhook_url: str | None = None
    alert_webhook_secret: str | None = None
    alert_slack_url: str | None = None
    alert_dashboard_url: str = "http://127.0.0.1:8501"


def check_exposure(config: ServeConfig) -> None:
    """Refuse to listen beyond loopback without a token unless --insecure says so."""
    if ipaddress.ip_address(config.host).is_loopback or config.token or config.insecure:
        return
    raise ConfigError(
        f"Refusing to bind {config.host} without a token: anyone who can reach it could read your "
        "agents' spans and write fake ones. Set --token (or DRIFTSCOPE_TOKEN), or pass --insecure "
        "if the network is trusted."
    )


class RetentionWorker(threading.Thread):
    """Deletes spans older than the retention period, in small batches, in the background.

    ``write`` runs a function on the single writer's connection (``SpanWriter.execute_write_fn``),
    so every delete is a short transaction of the one writer, between ingest commits.
    """

    BATCH = 10_000

    def __init__(self, write, retention_seconds: float, interval: float = 60.0) -> None:
        super().__init__(name="driftscope-retention", daemon=True)
        self.write = write
        self.retention_seconds = retention_seconds
        self.interval = interval
        self.deleted = 0
        self._stop_event = threading.Event()

    def run_once(self) -> int:
        cutoff_ns = int((time.time() - self.retention_seconds) * 1e9)

        def delete_batch(conn) -> int:
            return delete_expired(conn, cutoff_ns, self.BATCH)

        total = 0
        while not self._stop_event.is_set():
            # Small deletes keep each transaction short so ingest commits are never held up long.
            deleted = self.write(delete_batch)
            total += deleted
            if deleted < self.BATCH:
                break
        self.deleted += total
        if total:
            logger.info("retention deleted %d span(s) older than %ss", total, self.retention_seconds)
        return total

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - retention must never take the server down
                logger.warning("retention pass failed (will retry): %s", exc)
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


@dataclass
class Service:
    """Everything ``serve`` runs but its listening sockets: the store, the single writer, the
    background workers and the ASGI app of the OTLP/HTTP receiver and read API.

    ``run_serve`` puts it behind uvicorn and a gRPC server; tests drive ``app`` in process with
    an ASGI client (the in-process tier, docs/testing.md). ``stop()`` stops the workers, drains
    the writer and closes the store."""

    app: Starlette
    queue: IngestQueue
    writer: SpanWriter
    receiver_config: ReceiverConfig
    stats: IngestStats
    decode_pool: DecodePool
    pending: PendingBytes
    stop: Callable[[], None]


def receiver_config_for(config: ServeConfig) -> ReceiverConfig:
    """The receivers' limits and token, whichever store the spans go to."""
    return ReceiverConfig(
        max_body_bytes=config.max_body_bytes,
        token=config.token,
        limits=DecodeLimits(
            max_attribute_bytes=config.max_attribute_bytes,
            max_spans_per_request=config.max_spans_per_request,
            max_attributes_per_span=config.max_attributes_per_span,
            max_items_per_request=config.max_items_per_request,
        ),
        header_timeout=config.header_timeout,
        body_timeout=config.body_timeout,
        max_pending_bytes=config.max_pending_bytes,
        decode_workers=config.decode_workers,
    )


def build_service(config: ServeConfig) -> Service:
    """Open the store and start the writer and workers; the app answers once this returns."""
    # Read at query time by duplicate_side_effects: the read API (so the dashboard and reports
    # reading through it) uses this value, for spans stored before it was set too.
    side_effect_tools = configure_side_effect_tools(config.side_effect_tools)
    if config.store:
        from driftscope.serve_clickhouse import start_clickhouse_ingest

        return Service(*start_clickhouse_ingest(config, receiver_config_for(config)))
    from driftscope.alerting import load_alert_rules, start_alerting

    alert_rules = load_alert_rules(config)
    try:
        conn = open_database(config.db, memory_limit=config.memory_limit)
    except StoreLockedError as exc:
        raise ConfigError(str(exc)) from exc
    stats = IngestStats()
    queue = IngestQueue(config.queue_max_bytes)
    receiver_config = receiver_config_for(config)
    # One decode pool for both transports: at most decode_workers requests decode at once.
    decode_pool = DecodePool(config.decode_workers)
    # One bound on request bytes waiting for it, HTTP bodies and gRPC messages together.
    pending = PendingBytes(config.max_pending_bytes)
    worker = None
    materializer = None
    alerting = None

    def on_commit(stored: int) -> None:  # noqa: ARG001 - the background workers look for themselves
        for background in (worker, materializer, alerting):
            if background is not None:
                background.notify()

    writer = SpanWriter(conn.cursor(), queue, on_commit=on_commit)
    writer.start()
    if config.embeddings:
        worker = _start_embedding_worker(conn, writer.execute_write_fn)
    # Every maintained detector's findings table brought up to date from the change log the
    # writer keeps, through the writer; reads are SELECTs over them (analytics.materialize).
    # With the embedding worker, its pass reads stored goal scores only: the worker embeds new
    # texts once and its stored scores log the runs to recompute (analytics.goal_refresh).
    materializer_cursor = conn.cursor if worker is None else lambda: read_stored_scores_only(conn.cursor())
    materializer = Materializer(
        materializer_cursor,
        writer.execute_write_fn,
        ingest_backlog=lambda: len(queue),
        submit=queue.submit_write,
        ingest_share=writer.span_commit_share,
    )
    materializer.start()
    alerting = start_alerting(config, alert_rules, conn.cursor, writer.execute_write_fn, wait_for_tables=True)
    retention = None
    if config.retention:
        retention = RetentionWorker(writer.execute_write_fn, config.retention, config.retention_interval)
        retention.start()

    if not fastdecode.AVAILABLE:
        logger.warning(
            "the compiled OTLP decoder (collector._otlpfast) is not built: protobuf ingest runs on the "
            "~10x slower Python path. Reinstall with `make install` (needs a C compiler)."
        )

    def duckdb_memory() -> dict:
        """What DuckDB's buffer manager holds now (of the process's memory), by largest use."""
        cursor = conn.cursor()
        try:
            rows = cursor.execute(
                "SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0 "
                "ORDER BY memory_usage_bytes DESC"
            ).fetchall()
        finally:
            cursor.close()
        return {"total_bytes": sum(r[1] for r in rows), "by_tag": {r[0]: r[1] for r in rows}}

    def arrow_memory() -> dict:
        """What Arrow's allocator holds for this process's tables (pandas frames and DuckDB's
        results are not counted here), and the most it has held."""
        pool = pa.default_memory_pool()
        return {
            "allocated_bytes": pool.bytes_allocated(),
            "max_bytes": pool.max_memory(),
            "backend": pool.backend_name,
        }

    def health_extra() -> dict:
        return {
            "status": "ok" if writer.healthy else "store_unavailable",
            "writer_error": writer.last_error,
            "queued_requests": len(queue),
            "queued_bytes": queue.queued_bytes,
            "committed_spans": writer.committed_spans,
            "commits": writer.commits,
            "checkpoints": writer.checkpoints,
            "checkpoint_seconds": round(writer.checkpoint_seconds, 3),
            "longest_checkpoint_seconds": round(writer.longest_checkpoint_seconds, 3),
            "writer_longest_write": {
                "seconds": round(writer.longest_write[0], 3),
                "function": writer.longest_write[1] or None,
            },
            "writer_busy_seconds": round(writer.busy_seconds, 3),
            "writer_span_commit_seconds": round(writer.span_commit_seconds, 3),
            "writer_commit_seconds": round(writer.commit_seconds, 3),
            "writer_auto_checkpoints": writer.auto_checkpoints,
            "writer_auto_checkpoint_seconds": round(writer.auto_checkpoint_seconds, 3),
            "duckdb_memory": duckdb_memory(),
            "arrow_memory": arrow_memory(),
            "writer_writes": writer.writes,
            "writer_failed_writes": writer.failed_writes,
            "fast_decoder": fastdecode.AVAILABLE,
            "counters": stats.snapshot(),
            "retention_deleted": retention.deleted if retention else 0,
            "token_required": bool(config.token),
            "alerting": alerting.health() if alerting is not None else {"enabled": False},
            # `driftscope calibrate --db FILE` finds the collector holding FILE by this.
            "db": str(Path(config.db).resolve()),
            "side_effect_tools": side_effect_tools.pattern if side_effect_tools.configured else "default",
            "findings": _findings_health(conn, materializer),
            "embedding_worker": (
                {
                    "enabled": True,
                    "embedded": worker.embedded,
                    "last_error": worker.last_error,
                    "caught_up": worker.caught_up,
                }
                if worker is not None
                else {"enabled": False}
            ),
        }

    routes = build_ingest_routes(queue, receiver_config, stats, decode_pool, pending) + build_api_routes(
        conn.cursor, config.token, health_extra
    )
    # Calibration while serving: reads on cursors, threshold inserts through the single writer.
    routes += build_calibrate_routes(conn.cursor, writer.execute_write_fn, config.token)
    app = Starlette(routes=routes)

    def stop_writing() -> None:
        # The workers write through the writer: stop them first, then drain the writer.
        if alerting is not None:
            alerting.stop()
        if retention:
            retention.stop()
        if worker is not None:
            worker.stop()
        materializer.stop()
        writer.stop()
        if materializer.is_alive():
            # Closing the store under its running query aborts the process (C++ terminate):
            # leave the store to the WAL, which replays on the next start.
            logger.error(
                "the materializer did not stop in time; exiting without the final checkpoint "
                "(every acknowledged span is committed; the WAL replays on the next start)"
            )
            return
        try:
            conn.execute("CHECKPOINT")
        except Exception as exc:  # noqa: BLE001 - the WAL replays on next start anyway
            logger.warning("final checkpoint failed (the WAL will replay on restart): %s", exc)
        conn.close()

    return Service(app, queue, writer, receiver_config, stats, decode_pool, pending, stop_writing)


def run_serve(config: ServeConfig) -> int:
    """Run until SIGTERM/SIGINT; then stop accepting, drain, commit, and exit 0."""
    check_exposure(config)
    service = build_service(config)
    queue, receiver_config, stats = service.queue, service.receiver_config, service.stats
    decode_pool, pending, writer, stop_writing = (
        service.decode_pool,
        service.pending,
        service.writer,
        service.stop,
    )
    # Every HTTP endpoint (ingest, read API, calibrate) behind the Host check (DNS rebinding).
    app = HostCheckMiddleware(service.app, AllowedHosts.for_bind(config.host, config.allowed_hosts))

    try:
        grpc_server = start_grpc_server(
            config.host, config.grpc_port, queue, receiver_config, stats, pool=decode_pool, pending=pending
        )
    except GrpcBindError as exc:
        # The CLI checked the port moments ago; another process bound it since.
        stop_writing()
        raise ConfigError(
            port_taken_message("grpc_port", config.host, config.grpc_port, "OTLP/gRPC")
        ) from exc
    server = _QuietServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.http_port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=30,
            limit_concurrency=2048,
            # uvicorn has no header or body deadline of its own (issue 12).
            http=guarded_h11_protocol(config.header_timeout, config.body_timeout),
        )
    )
    logger.info(
        "driftscope serve: OTLP/HTTP http://%s:%d/v1/traces, OTLP/gRPC %s:%d, store %s",
        config.host,
        config.http_port,
        config.host,
        config.grpc_port,
        config.store or Path(config.db).resolve(),
    )

    def request_stop(signum, frame):  # noqa: ARG001 - signal handler signature
        logger.info("received %s: stop accepting, drain and commit", signal.Signals(signum).name)
        server.should_exit = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            server.run()  # returns after SIGTERM/SIGINT once in-flight requests are answered
        except SystemExit:
            # uvicorn exits when it cannot bind (the port was taken after the CLI checked it);
            # the message below names the setting instead.
            if server.started:
                raise
    finally:
        grpc_server.stop(grace=10).wait(15)
        stop_writing()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logger.info("driftscope serve stopped; %d span(s) committed this run", writer.committed_spans)
    if not server.started:
        raise ConfigError(port_taken_message("http_port", config.host, config.http_port, "OTLP/HTTP"))
    return 0


def port_taken_message(name: str, host: str, port: int, what: str) -> str:
    """Why serve could not listen, naming the flag and variable that move the port."""
    setting = BY_NAME[name]
    return (
        f"Could not listen for {what} on {host}:{port} ({setting.flag}): another process took the port "
        f"after it was checked. Stop that process, or choose another port with {setting.flag} PORT or "
        f"{setting.env}=PORT."
    )


class _QuietServer(uvicorn.Server):
    """uvicorn re-raises the captured signal after shutdown, which would kill the process before
    the writer drains; driftscope installs its own handlers instead."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _findings_health(conn, materializer: Materializer) -> dict:
    """How far the findings tables are behind the newest commit, and the materializer's state."""
    cursor = conn.cursor()
    try:
        fresh = freshness(cursor)
    finally:
        cursor.close()
    as_of = fresh["findings_as_of"]
    return {
        "findings_as_of": as_of.isoformat() if as_of is not None else None,
        "lag_seconds": fresh["lag_seconds"],
        "behind_changes": fresh["behind_changes"],
        "materializer_passes": materializer.passes,
        "last_pass_seconds": round(materializer.last_pass_seconds, 3),
        "deferred_to_ingest_seconds": round(materializer.deferred_seconds, 2),
        "pass_seconds_total": round(materializer.pass_seconds_total, 2),
        # of which waiting for writes (queued behind span commits in the writer)
        "write_wait_seconds": round(materializer.write_wait_seconds, 2),
        # the result the pass in progress is on, and for how long (None between passes)
        "working_on": _working_on(materializer.working_on),
        # where the passes' time went, per result since start: computing it, and the writer
        # running its writes (queued, so mostly beside the next computations)
        "seconds_by_result": {
            name: {"compute": round(spent[0], 2), "write": round(spent[1], 2)}
            for name, spent in sorted(
                materializer.seconds_by_result.items(), key=lambda kv: -(kv[1][0] + kv[1][1])
            )
        },
        # what state folds reported doing since start (the loop fold: groups appended to,
        # relinked, and computed from their runs' spans)
        "counts_by_result": {
            name: dict(counts) for name, counts in list(materializer.counts_by_result.items())
        },
        "last_error": materializer.last_error,
        "failed": materializer.last_failed,
    }


def _working_on(current: tuple[str, float] | None) -> dict | None:
    if current is None:
        return None
    return {"result": current[0], "seconds": round(time.monotonic() - current[1], 2)}


def _start_embedding_worker(conn, write):
    try:
        from analytics.worker import EmbeddingWorker
    except ImportError as exc:
        logger.warning("embedding worker unavailable, goal divergence will embed on demand: %s", exc)
        return None
    worker = EmbeddingWorker(conn.cursor, write=write)
    worker.start()
    return worker
