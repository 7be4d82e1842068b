"""The commands that wire the other packages: dashboard, demo, report (calibrate: driftscope/calibrate.py)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from driftscope.checks import check_port_free
from driftscope.settings import BY_NAME, ConfigError
from driftscope.timeparse import parse_instant

logger = logging.getLogger(__name__)

# --source values naming a ClickHouse store (collector.clickhouse_store.open_store_url; issue 17)
CLICKHOUSE_SOURCES = ("chdb:", "clickhouse://", "clickhouses://")
# The Streamlit entry script `driftscope dashboard` runs: dashboard/app.py with a store opener.
DASHBOARD_APP = str(Path(__file__).with_name("dashboard_app.py"))


def _open_source(source: str, token: str | None):
    """The dashboard's data source for a read-API URL, a ClickHouse store URL or a DuckDB file path."""
    from dashboard.datasource import DuckDBFileSource, HttpSource, StoreSource

    if source.startswith(("http://", "https://")):
        return HttpSource(source, token=token)
    if source.startswith(CLICKHOUSE_SOURCES):
        from collector.clickhouse_store import StoreURLError
        from driftscope.clickhouse_command import open_for_reading

        try:
            store = open_for_reading(source)
        except StoreURLError as exc:
            raise ConfigError(str(exc)) from exc
        return StoreSource(lambda: store, f"ClickHouse store {source}")
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
    if source.startswith(CLICKHOUSE_SOURCES):
        from collector.clickhouse_store import StoreURLError, parse_store_url

        try:  # the Streamlit child opens the store (driftscope/dashboard_app.py); check the URL here
            parse_store_url(source)
        except StoreURLError as exc:
            raise ConfigError(str(exc)) from exc
    elif not source.startswith(("http://", "https://")) and not Path(source).is_file():
        raise ConfigError(
            f"--source {source!r} is neither an http(s) URL, a ClickHouse store (chdb:PATH, "
            "clickhouse://HOST:8123/DB) nor an existing DuckDB file"
        )

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
    process = run_dashboard(
        source,
        values["dashboard_port"],
        token=values.get("token"),
        script=DASHBOARD_APP,
        allowed_hosts=values.get("allowed_hosts"),
    )
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


def onnx_embedder(texts) -> list[list[float]]:
    """The demo's goal texts embedded by analytics' ONNX Runtime encoder of the bundled model
    (the vectors sentence-transformers gives, tests/analytics/test_goals.py; no torch to load)."""
    from analytics.embeddings import encode

    return encode(list(texts)).tolist()


def check_reachable(endpoint: str, token: str | None = None, timeout: float = 1.5) -> None:
    """Refuse, within ``timeout`` seconds, an endpoint that does not take OTLP/HTTP: the exporters
    would retry each batch for minutes. The probe is an empty export request (any OTLP/HTTP
    collector answers it with 200)."""
    import httpx

    from dashboard.datasource import cannot_reach

    url = endpoint.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--endpoint {endpoint!r} is not an http(s) URL (e.g. http://127.0.0.1:4318)")
    headers = {"Content-Type": "application/x-protobuf"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = httpx.post(f"{url}/v1/traces", content=b"", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ConfigError(cannot_reach(url, exc)) from exc
    if response.status_code in (401, 403):
        raise ConfigError(
            f"The collector at {url} refused the request (HTTP {response.status_code}): pass its token (DRIFTSCOPE_TOKEN)."
        )
    if response.status_code != 200:
        raise ConfigError(
            f"{url}/v1/traces answered HTTP {response.status_code}, not as an OTLP/HTTP collector does: "
            "check --endpoint (a driftscope serve or `driftscope up` listens on http://127.0.0.1:4318)."
        )


def cmd_demo(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from guards.demo import run_demo

    endpoint = values.get("endpoint") or "http://127.0.0.1:4318"
    check_reachable(endpoint, values.get("token"))
    try:
        return run_demo(endpoint, args.scenario, args.live, token=values.get("token"), embedder=onnx_embedder)
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


def finding_counts(conn, window, from_spans: bool = False) -> dict[str, int]:
    """Findings per finding detector in ``window`` under the thresholds in force (zeros left
    out); with ``from_spans`` computed from the spans, not read from the findings tables."""
    from analytics import read
    from analytics.types import Filters
    from dashboard.findings import finding_metrics, finding_rows

    counts = {}
    for metric in finding_metrics(read.describe_metrics()):
        rows = finding_rows(read.metric(conn, metric["name"], window, Filters(from_spans=from_spans)), metric)
        if len(rows):
            counts[metric["name"]] = len(rows)
    return counts


def run(command: str, args: argparse.Namespace, values: dict[str, Any]) -> int:
    handlers = {
        "dashboard": cmd_dashboard,
        "demo": cmd_demo,
        "report": cmd_report,
    }
    if command not in handlers:
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    return handlers[command](args, values)
