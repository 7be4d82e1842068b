"""`driftscope serve --store chdb:PATH|clickhouse://...`: the OTLP receivers writing into ClickHouse.

For users who do not run the OpenTelemetry Collector: serve's own receivers (same decoding,
limits, token and backpressure) feed ``collector.clickhouse_writer.ClickHouseWriter``, which
inserts into `otel_traces` in the clickhouse exporter's layout and answers each request after
the INSERT has returned. `driftscope clickhouse init` runs at start (idempotent).

Not here yet: the read API, the embedding, kept-results and alerting workers (they run on the
DuckDB store); ``/api/v1/health`` answers, every other ``/api/v1`` path says where to read.
"""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collector.auth import token_matches
from collector.clickhouse_store import ClickHouseStore, StoreURLError, init_clickhouse, open_store_url
from collector.clickhouse_writer import ClickHouseWriter
from collector.http_receiver import ReceiverConfig, build_ingest_routes
from collector.ingest_guard import DecodePool, PendingBytes
from collector.stats import IngestStats
from collector.writer import IngestQueue
from driftscope.settings import ConfigError

logger = logging.getLogger(__name__)


def start_clickhouse_ingest(config, receiver_config: ReceiverConfig) -> tuple:
    """Open and initialise the ClickHouse store and start its writer. ``config`` is serve's
    ``ServeConfig``; returns the fields of serve's ``Service`` (app, queue, writer, receiver
    config, stats, decode pool, pending bytes, stop), in that order."""
    alerting = [
        flag
        for flag, value in (
            ("--alert-rules", config.alert_rules),
            ("--alertmanager-url", config.alertmanager_url),
            ("--alert-webhook-url", config.alert_webhook_url),
            ("--alert-slack-url", config.alert_slack_url),
        )
        if value
    ]
    if alerting:  # never accept a setting and then silently page nobody
        raise ConfigError(
            f"{', '.join(alerting)}: alerts are evaluated on the DuckDB store only so far, not with --store "
            f"{config.store!r}; drop the alert settings (and their DRIFTSCOPE_ALERT* variables) or serve --db PATH"
        )
    try:
        store = open_store_url(config.store)
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
    stats = IngestStats()
    queue = IngestQueue(config.queue_max_bytes)
    decode_pool = DecodePool(config.decode_workers)
    pending = PendingBytes(config.max_pending_bytes)
    writer = ClickHouseWriter(store, queue)
    writer.start()

    async def health(request: Request) -> Response:
        if not token_matches(request.headers.get("authorization"), config.token):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        return JSONResponse(
            {
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
                "counters": stats.snapshot(),
                "token_required": bool(config.token),
            }
        )

    async def not_here(request: Request) -> Response:  # noqa: ARG001 - starlette handler signature
        return JSONResponse(
            {
                "error": "this serve writes into ClickHouse and does not answer the read API; read the "
                f"store directly (e.g. driftscope report --source {config.store})"
            },
            status_code=501,
        )

    routes = build_ingest_routes(queue, receiver_config, stats, decode_pool, pending) + [
        Route("/api/v1/health", health, methods=["GET"]),
        Route("/api/v1/{path:path}", not_here, methods=["GET", "POST"]),
    ]

    def stop_writing() -> None:
        writer.stop()
        store.close()

    return Starlette(routes=routes), queue, writer, receiver_config, stats, decode_pool, pending, stop_writing
