"""`driftscope clickhouse init|resolve`: driftscope's objects beside the OpenTelemetry Collector's
ClickHouse tables (docs/scale-out.md)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from driftscope.settings import ConfigError

logger = logging.getLogger(__name__)

STORE_ENV = "DRIFTSCOPE_STORE"  # the `store` setting's variable (driftscope.settings)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("init", "resolve"),
        help="init: create driftscope's tables and view beside otel_traces (otel_traces too when missing); "
        "resolve: resolve agents, runs and hops of the spans stored since the last pass.",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="resolve: keep resolving beside the exporter, a pass every --interval seconds, until "
        "SIGTERM or Ctrl-C; each pass logs how far behind `spans` is (one resolver per database).",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="resolve --follow: seconds from the start of one pass to the next (default 2).",
    )
    parser.add_argument(
        "--ttl-days",
        type=int,
        default=0,
        metavar="DAYS",
        help="init: days kept in spans (and in otel_traces when init creates it); match the exporter's ttl "
        "(0: no TTL).",
    )


def cmd_clickhouse(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from collector.clickhouse_lease import WriterLease, WriterLeaseTaken
    from collector.clickhouse_resolve import resolve_spans, resolve_status
    from collector.clickhouse_store import ClickHouseStore, StoreURLError, open_store_url

    url = values.get("store")
    if not url:
        raise ConfigError(
            f"Give the ClickHouse store with --store chdb:PATH or --store clickhouse://HOST:8123/DB (or set {STORE_ENV})"
        )
    if args.interval <= 0:
        raise ConfigError(f"Expected --interval to be a positive number of seconds, got {args.interval}")
    if args.follow and args.action != "resolve":
        raise ConfigError("--follow goes with `driftscope clickhouse resolve`")
    if args.ttl_days < 0:
        raise ConfigError(
            f"Expected --ttl-days to be 0 (no TTL) or a positive number of days, got {args.ttl_days}"
        )
    try:
        store = open_store_url(url)
    except StoreURLError as exc:
        raise ConfigError(str(exc)) from None
    try:
        if not isinstance(store, ClickHouseStore):
            raise ConfigError(
                f"--store {url!r} is a DuckDB file; `driftscope clickhouse` works on chdb:PATH or "
                "clickhouse://HOST:8123/DB (a DuckDB store needs no init: serve and ingest create it)"
            )
        try:
            if args.action == "init":
                created = store.migrate(ttl_days=args.ttl_days)
                where = f"{store.database} (beside {store.traces_table})"
                print(
                    f"created in {where}: {', '.join(created)}" if created else f"{where}: nothing to create"
                )
            else:
                if not store.table_exists("driftscope_resolve_state"):
                    raise ConfigError(
                        f"{store.database} has no driftscope tables yet: run `driftscope clickhouse init "
                        f"--store {url}` first"
                    )
                # one writer per database: refused while a serve or a follower writes it
                lease_store = store if store.engine == "chdb" else open_store_url(url)
                lease = WriterLease(lease_store, "clickhouse resolve" + (" --follow" if args.follow else ""))
                try:
                    try:
                        lease.acquire(take_over=store.engine == "chdb")  # a chdb path is ours alone
                    except WriterLeaseTaken as exc:
                        raise ConfigError(str(exc)) from None
                    if args.follow:
                        return follow(store, args.interval, lease)
                    lease.start_renewing(lambda claim: None)  # a long pass keeps it; the loss is logged
                    rewritten = resolve_spans(store)
                    status = resolve_status(store)
                    print(
                        f"resolved: {rewritten} span rows rewritten; resolved to {status['resolved_to']}, "
                        f"{status['unresolved_spans']} span(s) ingested since (younger than 2 s)"
                    )
                finally:
                    lease.release()
                    if lease_store is not store:
                        lease_store.close()
        except StoreURLError as exc:
            raise ConfigError(str(exc)) from None
    finally:
        store.close()
    return 0


def open_for_reading(url: str):
    """The store a reading command names (``report``, ``dashboard`` ``--source``), ready to read
    (``collector.clickhouse_resolve.open_for_reading``); on a ``chdb:`` path (this process's
    alone) the findings tables are then brought up to its last change by one materializer pass,
    so the reads are SELECTs over them. A server's tables are kept by its serve or
    ``clickhouse resolve --follow``."""
    from analytics.materialize_clickhouse import bring_up_to_date  # noqa: PLC0415
    from collector import clickhouse_resolve  # noqa: PLC0415

    store = clickhouse_resolve.open_for_reading(url)
    if store.engine == "chdb":
        try:
            report = bring_up_to_date(store)
        except BaseException:
            store.close()
            raise
        if report.failed:
            logger.warning("findings tables not brought up to date (computed on read): %s", report.failed)
        logger.info("findings tables of %s brought up to change %d", url, report.target)
    return store


def follow(store, interval: float, lease) -> int:
    """Resolve passes every ``interval`` seconds until SIGTERM / SIGINT, each followed by a pass
    of the findings tables' materializer, logging after each how far behind `spans` and the
    tables are; a failed pass is logged and tried again at the next one. ``lease``: the writer
    lease this process holds (``collector.clickhouse_lease``), renewed meanwhile; lost to another
    writer, it stops after the pass under way and returns 1 (0 when stopped by a signal)."""
    import time  # noqa: PLC0415

    from analytics.materialize_clickhouse import ClickHouseMaterializer  # noqa: PLC0415
    from analytics.read_clickhouse import freshness  # noqa: PLC0415
    from collector.clickhouse_changes import ChangeLog  # noqa: PLC0415
    from collector.clickhouse_resolve import resolve_spans, resolve_status  # noqa: PLC0415

    changes = ChangeLog(store)
    materializer = ClickHouseMaterializer(store, changes=changes)  # its passes run here, not as a thread
    versions = None

    halt = threading.Event()
    lost = []
    lease.start_renewing(lambda claim: (lost.append(claim), halt.set()))
    previous = {sig: signal.signal(sig, lambda *_: halt.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    logger.info("resolving %s every %.1f s until SIGTERM or Ctrl-C", store.database, interval)
    try:
        while not halt.is_set():
            started = time.monotonic()
            try:
                rewritten = resolve_spans(store, changes=changes)
                status = resolve_status(store)
                versions = versions or materializer.versions()
                materializer.run_once(versions)
                fresh = freshness(store)
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                logger.error("resolve pass failed (tried again in %.1f s): %s", interval, exc)
            else:
                logger.info(
                    "resolve pass: %d span rows rewritten in %.2f s; resolved to %s, %d span(s) "
                    "behind, lag %.1f s; findings tables %s change(s) behind, lag %s s",
                    rewritten,
                    time.monotonic() - started,
                    status["resolved_to"],
                    status["unresolved_spans"],
                    status["lag_seconds"],
                    fresh["behind_changes"],
                    fresh["lag_seconds"],
                )
            halt.wait(max(0.0, interval - (time.monotonic() - started)))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if lost:
        logger.error("stopped resolving %s: %s took its writer lease", store.database, lost[0].describe())
        return 1
    logger.info("stopped resolving %s", store.database)
    return 0
