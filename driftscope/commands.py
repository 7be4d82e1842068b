"""The commands that wire the other packages: dashboard, demo, report, calibrate."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from driftscope.checks import check_db_path, check_port_free
from driftscope.settings import BY_NAME, ConfigError
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


def _apply_side_effect_tools(source: str, pattern: str | None) -> None:
    """Use ``--side-effect-tools`` where analytics runs: in this process for a database file; a
    read-API source answers with its collector's own setting."""
    if source.startswith(("http://", "https://")):
        if pattern is not None:
            logger.warning(
                "--side-effect-tools is ignored for a read-API source: %s answers with the value its "
                "`driftscope serve` was started with; pass it there",
                source,
            )
        return
    from analytics.side_effects import configure_side_effect_tools

    configure_side_effect_tools(pattern)


def cmd_dashboard(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from dashboard.launch import run_dashboard

    source = values["source"]
    if not source.startswith(("http://", "https://")) and not Path(source).is_file():
        raise ConfigError(f"--source {source!r} is neither an http(s) URL nor an existing DuckDB file")

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    # SIGTERM (a service manager, `kill`) stops the Streamlit child too, as Ctrl-C does: it must
    # not stay behind holding the port.
    signal.signal(signal.SIGTERM, stop)

    check_port_free("127.0.0.1", values["dashboard_port"], "dashboard_port")
    _apply_side_effect_tools(source, values.get("side_effect_tools"))
    if values.get("side_effect_tools") is not None and not source.startswith(("http://", "https://")):
        # The Streamlit child runs analytics on the file and reads the setting from its environment.
        os.environ[BY_NAME["side_effect_tools"].env] = values["side_effect_tools"]
    process = run_dashboard(source, values["dashboard_port"], token=values.get("token"))
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return 0


def cmd_demo(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from guards.demo import run_demo

    endpoint = values.get("endpoint") or "http://127.0.0.1:4318"
    try:
        return run_demo(endpoint, args.scenario, args.live, token=values.get("token"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _dashboard_url(args: argparse.Namespace) -> str | None:
    """``--dashboard-url``, checked: the report links ids to this dashboard (issue 16)."""
    url = getattr(args, "dashboard_url", None)
    if url is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(
            f"--dashboard-url must be the dashboard's http(s) address, like http://127.0.0.1:8501, got {url!r}"
        )
    return url.rstrip("/")


def cmd_report(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from analytics.types import Filters, Window
    from dashboard.report import build_report

    source = _open_source(values["source"], values.get("token"))
    _apply_side_effect_tools(values["source"], values.get("side_effect_tools"))
    window = Window()
    if args.since:
        try:
            window = Window(since=parse_instant("--since", args.since))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    started = time.monotonic()
    from dashboard.datasource import SourceUnavailable

    try:
        if args.run and source.run_totals(Window(), Filters(run=args.run)).empty:
            newest = [str(r) for r in source.filter_options(Window())["runs"][:5]]
            raise ConfigError(
                f"No spans of run {args.run!r} in {source.description}; nothing to report. "
                + (f"Newest runs: {', '.join(newest)}." if newest else "The source holds no run.")
            )
        content = build_report(
            source, window, Filters(), run=args.run, fmt=args.fmt, dashboard_url=_dashboard_url(args)
        )
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


def finding_counts(conn, window) -> dict[str, int]:
    """Findings per finding detector in ``window`` under the thresholds in force (zeros left out)."""
    from analytics import read
    from analytics.types import Filters
    from dashboard.findings import finding_metrics, finding_rows

    counts = {}
    for metric in finding_metrics(read.describe_metrics()):
        rows = finding_rows(read.metric(conn, metric["name"], window, Filters()), metric)
        if len(rows):
            counts[metric["name"]] = len(rows)
    return counts


def _threshold_versions(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT name, max(version) FROM thresholds GROUP BY name").fetchall())


def _thresholds_in_force(conn) -> dict[str, dict]:
    from analytics.thresholds import list_thresholds

    return {t["name"]: t for t in list_thresholds(conn)}


def threshold_diff(before: dict[str, dict], after: dict[str, dict]) -> list[dict]:
    """Thresholds whose value or version changed: name, before, after, method."""
    rows = []
    for name in sorted(after):
        old, new = before.get(name, {}), after[name]
        if (old.get("value"), old.get("version")) != (new.get("value"), new.get("version")):
            rows.append(
                {
                    "name": name,
                    "before": old.get("value"),
                    "after": new.get("value"),
                    "method": new.get("method"),
                }
            )
    return rows


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
    if not Path(db).is_file():
        check_db_path(db)
        raise ConfigError(f"No database at {db}: ingest spans first (--db PATH or DRIFTSCOPE_DB)")
    window = None
    if args.baseline_since:
        try:
            window = Window(
                since=parse_instant("--baseline-since", args.baseline_since),
                until=parse_instant("--baseline-until", args.baseline_until) if args.baseline_until else None,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    try:
        conn = open_database(db)
    except StoreLockedError as exc:
        raise ConfigError(str(exc)) from exc
    results: dict[str, Any] = {}
    try:
        if window is not None:
            # A baseline is what "healthy" looks like: thresholds calibrated on failures let those
            # failures pass from then on, silently switching detectors off.
            in_window = finding_counts(conn, window)
            if in_window and not (args.allow_findings or args.dry_run):
                listed = ", ".join(f"{name} {n}" for name, n in sorted(in_window.items()))
                raise ConfigError(
                    f"The baseline window ({args.baseline_since} to {args.baseline_until or 'now'}) holds "
                    f"{sum(in_window.values())} finding(s) ({listed}); a baseline must be healthy, or the "
                    "new thresholds will let these failures pass. Pick a window without failures, preview "
                    "the effect with --dry-run, or pass --allow-findings to calibrate anyway."
                )
            if in_window:
                logger.warning("the baseline window holds findings: %s", in_window)
            results["baseline_findings"] = in_window
        before_versions = _threshold_versions(conn)
        before = _thresholds_in_force(conn)
        findings_before = finding_counts(conn, Window()) if args.dry_run else None
        if args.pairs:
            try:
                result = calibrate_from_pairs(conn, args.pairs, target_fpr=args.target_fpr)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
            result.pop("roc", None)
            results["pairs"] = result
        if window is not None:
            try:
                results["baseline"] = calibrate_from_baseline(conn, window, quantile=args.quantile)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        results["changed"] = threshold_diff(before, _thresholds_in_force(conn))
        if args.dry_run:
            results["findings_all_time"] = {
                "before": findings_before,
                "after": finding_counts(conn, Window()),
            }
            # Nothing stays stored: remove the versions this run added.
            for name in _threshold_versions(conn):
                conn.execute(
                    "DELETE FROM thresholds WHERE name = ? AND version > ?",
                    [name, before_versions.get(name, 0)],
                )
            results["dry_run"] = "nothing was stored"
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
