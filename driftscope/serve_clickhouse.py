"""`driftscope serve --store chdb:PATH|clickhouse://...`: the OTLP receivers writing into ClickHouse.

For users who do not run the OpenTelemetry Collector: serve's own receivers (same decoding,
limits, token and backpressure) feed ``collector.clickhouse_writer.ClickHouseWriter``, which
inserts into `otel_traces` in the clickhouse exporter's layout and answers each request after
the INSERT has returned. `driftscope clickhouse init` runs at start (idempotent).

The read API (``driftscope.api``) answers over the store: the same read interface
(``analytics.read``) runs on it, translated for ClickHouse, one read at a time (analytics keeps a
temporary table per session). On a server the reads use a session of their own, so inserts do not
wait behind them; chdb has one connection per process, so there a long detector statement
delays the writer's next insert. Not here yet: calibration (``/api/v1/calibrate`` is a 501) and
the embedding worker. The findings tables are kept (``analytics.materialize_clickhouse``: a thread
of its own, its computations taking the read turns) from the change log the writer and resolver
write, and the read API answers from them when they can.

Alerts (``driftscope.alerting``) run as on DuckDB: the same rules, episodes and receivers, the
detectors reading the store, one read turn per rule (requests go in between). The alert state
(``alerts``, ``alert_deliveries``: the outbox) lives in a DuckDB file beside the serve
(``alert_state_path``), written one transaction at a time, since ClickHouse has no cheap
single-row update; so one serve per store evaluates alerts. ``GET /api/v1/alerts`` reads it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from analytics.engine import fetch_rows
from analytics.materialize_clickhouse import ClickHouseMaterializer
from analytics.read_clickhouse import freshness
from collector.clickhouse_lease import Claim, WriterLease, WriterLeaseTaken
from collector.clickhouse_resolve import resolve_status
from collector.clickhouse_store import (
    ClickHouseStore,
    StoreURL,
    StoreURLError,
    init_clickhouse,
    open_store_url,
    parse_store_url,
)
from collector.clickhouse_writer import ClickHouseWriter
from collector.http_receiver import ReceiverConfig, build_ingest_routes
from collector.ingest_guard import DecodePool, PendingBytes
from collector.stats import IngestStats
from collector.writer import IngestQueue
from driftscope.alerting import AlertStateFile, load_alert_rules, start_alerting
from driftscope.api import build_api_routes
from driftscope.settings import ConfigError

logger = logging.getLogger(__name__)


def start_clickhouse_ingest(config, receiver_config: ReceiverConfig) -> tuple:
    """Open and initialise the ClickHouse store and start its writer. ``config`` is serve's
    ``ServeConfig``; returns the fields of serve's ``Service`` (app, queue, writer, receiver
    config, stats, decode pool, pending bytes, stop), in that order."""
    alert_rules = load_alert_rules(config)
    try:
        parsed = parse_store_url(config.store)
        store = open_store_url(parsed)
    except StoreURLError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(store, ClickHouseStore):
        store.close()
        raise ConfigError(
            f"--store {config.store!r} is not a ClickHouse store; give chdb:PATH or clickhouse://HOST:8123/DB, "
            "or use --db PATH for a DuckDB file"
        )
    try:
        created = init_clickhouse(store)
    except StoreURLError as exc:
        store.close()
        raise ConfigError(str(exc)) from None
    if created:
        logger.info("created in ClickHouse %s: %s", store.database, ", ".join(created))
    alert_state = None
    asked = (
        config.alert_rules or config.alertmanager_url or config.alert_webhook_url or config.alert_slack_url
    )
    try:
        alert_state = AlertStateFile(alert_state_path(parsed))
    except Exception as exc:
        if not asked:  # the default rules: another serve of this store evaluates them
            logger.warning(
                "alerts are not evaluated by this serve: the alert state file %s is taken (%s)",
                alert_state_path(parsed),
                exc,
            )
        else:
            store.close()
            raise ConfigError(
                f"could not open the alert state file {alert_state_path(parsed)} ({exc}); is another "
                "serve evaluating alerts on this store? One serve per store may (the others drop the "
                "alert settings)"
            ) from None
    # one writer per database: a second serve (or `clickhouse resolve --follow`) is refused
    lease_store = store if store.engine == "chdb" else open_store_url(config.store)
    lease = WriterLease(lease_store, "serve --store")
    try:
        lease.acquire(take_over=store.engine == "chdb")  # a chdb path is this process's alone
    except WriterLeaseTaken as exc:
        if lease_store is not store:
            lease_store.close()
        store.close()
        if alert_state is not None:
            alert_state.close()
        raise ConfigError(str(exc)) from None
    stats = IngestStats()
    queue = IngestQueue(config.queue_max_bytes)
    decode_pool = DecodePool(config.decode_workers)
    pending = PendingBytes(config.max_pending_bytes)
    # A server gives the reads a session of their own; chdb has one connection per process.
    read_store = store if store.engine == "chdb" else open_store_url(config.store)
    read_turns = threading.Lock()
    writer = ClickHouseWriter(store, queue)
    writer.start()
    # the findings tables, from the writer's change log; on a server in a session of its own
    materializer = ClickHouseMaterializer(
        store if store.engine == "chdb" else open_store_url(config.store),
        turn=read_turns,
        ingest_backlog=lambda: len(queue),
        commits=lambda: writer.commits,
        changes=writer.changes,
    )
    materializer.start()
    lease.start_renewing(_stop_on_lost_lease)
    alerting = None
    if alert_state is not None:
        # The detectors take read turns like the API's reads, one per rule (requests go in
        # between); the episodes are the state file's.
        alerting = start_alerting(
            config,
            alert_rules,
            lambda: ReadTurn(read_store, None),
            alert_state.write,
            state_cursor=alert_state.cursor,
            commits=lambda: writer.commits,  # ingest first: evaluations wait for a pause
            turn=lambda: read_turns,
        )

    def health_extra() -> dict:
        return {
            "status": "ok" if writer.healthy else "store_unavailable",
            "store": {"engine": store.engine, "database": store.database, "table": store.traces_table},
            "writer_error": writer.last_error,
            "queued_requests": len(queue),
            "queued_bytes": queue.queued_bytes,
            "committed_spans": writer.committed_spans,
            "commits": writer.commits,
            "resolve_passes": writer.resolve_passes,
            "resolved_rows_rewritten": writer.rewritten_spans,
            "writer_busy_seconds": round(writer.busy_seconds, 3),
            "insert_seconds": round(writer.insert_seconds, 3),
            "direct_insert": writer.staging is not None,
            "last_resolve_pass_seconds": round(writer.resolver.last_seconds, 3),
            "resolve_pass_seconds_total": round(writer.resolver.seconds_total, 2),
            "resolve_error": writer.resolver.last_error,
            # direct inserts are resolved as they go in: the watermark moves without a pass
            "resolve_watermark_advances": writer.resolver.advances,
            "counters": stats.snapshot(),
            "token_required": bool(config.token),
            "alerting": alerting.health() if alerting is not None else {"enabled": False},
            "findings": _findings_health(store, materializer),
            "writer_lease": "lost to " + lease.lost.describe() if lease.lost is not None else "held",
        }

    async def not_here(request: Request) -> Response:
        return JSONResponse(
            {
                "error": f"{request.url.path} is not available on a serve with --store yet (calibration "
                "runs on the DuckDB store only); the read API (/api/v1/metrics, /runs, ...) is"
            },
            status_code=501,
        )

    alert_routes = []
    if alert_state is not None:
        # The read API's own alerts route, reading the state file (ahead of the store's).
        alert_routes = [
            route
            for route in build_api_routes(alert_state.cursor, config.token, health_extra)
            if route.path == "/api/v1/alerts"
        ]
    routes = (
        build_ingest_routes(queue, receiver_config, stats, decode_pool, pending)
        + alert_routes
        + build_api_routes(lambda: ReadTurn(read_store, read_turns), config.token, health_extra, store_health)
        + [Route("/api/v1/{path:path}", not_here, methods=["GET", "POST"])]
    )

    def stop_writing() -> None:
        if alerting is not None:  # it reads the store and writes the state file: first
            alerting.stop()
        materializer.stop()
        writer.stop()
        lease.release()
        with read_turns:  # a read still running finishes first
            if lease_store is not store:
                lease_store.close()
            if read_store is not store:
                read_store.close()
            if materializer.store is not store:
                materializer.store.close()
            store.close()
        if alert_state is not None:
            alert_state.close()

    app = Starlette(routes=routes)
    app.state.alerting = alerting  # the AlertService (None when off), for in-process tests
    return app, queue, writer, receiver_config, stats, decode_pool, pending, stop_writing


def _stop_on_lost_lease(claim: Claim) -> None:
    """Another process took the writer lease (this one was stopped past it): writing on would
    interleave two change logs, so serve stops as on SIGTERM (a supervisor that starts it again
    gets the refusal naming the holder)."""
    logger.error("stopping: %s now writes this database", claim.describe())
    os.kill(os.getpid(), signal.SIGTERM)


def _findings_health(store, materializer: ClickHouseMaterializer) -> dict:
    """How far the store's findings tables are behind its newest logged change, and the
    materializer's counters (the DuckDB serve's ``findings`` health fields)."""
    try:
        fresh = freshness(store)
    except Exception as exc:  # noqa: BLE001 - health answers while the store is failing
        fresh = {"findings_as_of": None, "lag_seconds": None, "behind_changes": None, "error": str(exc)}
    as_of = fresh["findings_as_of"]
    return {
        **fresh,
        "findings_as_of": as_of.isoformat() if as_of is not None else None,
        **materializer.health(),
    }


def alert_state_path(url: StoreURL) -> Path:
    """The DuckDB file keeping the alert state of the store ``url`` names: beside a chdb
    directory (``PATH.alerts.duckdb``); for a server, in the working directory, named after the
    server and database (``driftscope-alerts-HOST-PORT-DB.duckdb``)."""
    if url.engine == "chdb":
        return Path(url.path.rstrip("/") + ".alerts.duckdb")
    return Path(f"driftscope-alerts-{url.host}-{url.port}-{url.database}.duckdb")


class ReadTurn:
    """The store for one read of the API (what ``build_api_routes`` calls a cursor): reads take
    turns, since the read interface may keep a temporary table in the store's session between
    its statements; ``close()`` ends the turn, not the store. Everything else is the store's.
    ``turns`` None: the caller takes the turns itself (the alert evaluator, one per rule)."""

    def __init__(self, store: ClickHouseStore, turns: threading.Lock | None) -> None:
        if turns is not None:
            turns.acquire()
        self._store = store
        self._turns = turns

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def close(self) -> None:
        """End this read's turn."""
        if self._turns is not None:
            self._turns.release()
            self._turns = None


def store_health(conn) -> dict[str, Any]:
    """Span count, newest span, stored embeddings and the resolve pass's lag of a ClickHouse store
    (the health answer's store part; no schema version: ``driftscope clickhouse init`` upgrades
    in place)."""
    ((spans, newest),) = fetch_rows(conn, "SELECT count(*), max(Timestamp) FROM spans")
    ((embedded,),) = fetch_rows(conn, "SELECT count(*) FROM embeddings")
    # ClickHouse's max() of no rows is the epoch, DuckDB's NULL.
    return {
        "spans": spans,
        "newest_span": newest if spans else None,
        "schema_version": None,
        "embeddings": embedded,
        # how far the resolved span tree (runs, agents, hops) is behind the inserts
        "resolve": resolve_status(conn),
    }
