"""`driftscope clickhouse init|resolve`: driftscope's objects beside the OpenTelemetry Collector's
ClickHouse tables (docs/scale-out.md)."""

from __future__ import annotations

import argparse
import logging
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
        "--ttl-days",
        type=int,
        default=0,
        metavar="DAYS",
        help="init: days kept in spans (and in otel_traces when init creates it); match the exporter's ttl "
        "(0: no TTL).",
    )


def cmd_clickhouse(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from collector.clickhouse_resolve import resolve_spans
    from collector.clickhouse_store import ClickHouseStore, StoreURLError, open_store_url

    url = values.get("store")
    if not url:
        raise ConfigError(
            f"Give the ClickHouse store with --store chdb:PATH or --store clickhouse://HOST:8123/DB (or set {STORE_ENV})"
        )
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
                rewritten = resolve_spans(store)
                print(f"resolved: {rewritten} span rows rewritten")
        except StoreURLError as exc:
            raise ConfigError(str(exc)) from None
    finally:
        store.close()
    return 0
