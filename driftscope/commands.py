"""The commands that wire the other packages: dashboard, demo, report, calibrate."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from driftscope.settings import ConfigError
from driftscope.timeparse import parse_instant

logger = logging.getLogger(__name__)


def _open_source(source: str, token: str | None):
    """The dashboard's data source for a read-API URL or a DuckDB file path."""
    from dashboard.datasource import DuckDBFileSource, HttpSource

    if source.startswith(("http://", "https://")):
        return HttpSource(source, token=token)
    if not Path(source).is_file():
        raise ConfigError(
            f"--source {source!r} is neither an http(s) URL of a running `driftscope serve` nor an existing "
            "DuckDB file"
        )
    return DuckDBFileSource(source)


def cmd_dashboard(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from dashboard.launch import run_dashboard

    source = values["source"]
    if not source.startswith(("http://", "https://")) and not Path(source).is_file():
        raise ConfigError(f"--source {source!r} is neither an http(s) URL nor an existing DuckDB file")
    process = run_dashboard(source, values["dashboard_port"], token=values.get("token"))
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait(30)


def cmd_demo(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from guards.demo import run_demo

    endpoint = values.get("endpoint") or "http://127.0.0.1:4318"
    try:
        return run_demo(endpoint, args.scenario, args.live, token=values.get("token"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def cmd_report(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from analytics.types import Filters, Window
    from dashboard.report import build_report

    source = _open_source(values["source"], values.get("token"))
    window = Window()
    if args.since:
        try:
            window = Window(since=parse_instant("--since", args.since))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    started = time.monotonic()
    from dashboard.datasource import SourceUnavailable

    try:
        content = build_report(source, window, Filters(), run=args.run, fmt=args.fmt)
    except SourceUnavailable as exc:
        raise ConfigError(str(exc)) from exc
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        output.write_bytes(content)
    else:
        output.write_text(content, encoding="utf-8")
    logger.info("wrote %s report to %s in %.1fs", args.fmt, output, time.monotonic() - started)
    return 0


def cmd_calibrate(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from analytics.calibration import calibrate_from_baseline, calibrate_from_pairs
    from analytics.types import Window
    from collector.store import StoreLockedError
    from driftscope.database import open_database

    db = args.db or os.environ.get("DRIFTSCOPE_DB") or "./driftscope-data/driftscope.duckdb"
    if not args.pairs and not args.baseline_since:
        raise ConfigError(
            "Give --pairs FILE.csv (labelled pairs) and/or --baseline-since DURATION (healthy window)"
        )
    if args.pairs and not Path(args.pairs).is_file():
        raise ConfigError(f"No such file: {args.pairs}")
    try:
        conn = open_database(db)
    except StoreLockedError as exc:
        raise ConfigError(str(exc)) from exc
    results: dict[str, Any] = {}
    try:
        if args.pairs:
            try:
                result = calibrate_from_pairs(conn, args.pairs, target_fpr=args.target_fpr)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
            result.pop("roc", None)
            results["pairs"] = result
        if args.baseline_since:
            try:
                window = Window(
                    since=parse_instant("--baseline-since", args.baseline_since),
                    until=parse_instant("--baseline-until", args.baseline_until)
                    if args.baseline_until
                    else None,
                )
                results["baseline"] = calibrate_from_baseline(conn, window, quantile=args.quantile)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
    finally:
        conn.close()
    print(json.dumps(results, indent=2, default=str))
    return 0


def run(command: str, args: argparse.Namespace, values: dict[str, Any]) -> int:
    handlers = {
        "dashboard": cmd_dashboard,
        "demo": cmd_demo,
        "report": cmd_report,
        "calibrate": cmd_calibrate,
    }
    if command not in handlers:
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    return handlers[command](args, values)
