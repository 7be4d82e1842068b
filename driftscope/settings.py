"""The one settings table: every option of every command, declared once.

The CLI builds its flags from it, the README's settings section is generated from it
(``driftscope settings --markdown``), and a test fails if a setting is missing from the README.
Precedence: CLI flag > ``DRIFTSCOPE_*`` > standard ``OTEL_*`` where one applies > default.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A setting has a value a person must fix; the message says what and how."""


def parse_count(name: str, raw: Any) -> int:
    """A positive whole number such as 1024 (underscores allowed: 100_000)."""
    text = str(raw).strip().replace("_", "")
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 2**62:
        raise ConfigError(f"Expected {name} to be a positive whole number such as 1024, got {raw!r}")
    return int(text)


def parse_port(name: str, raw: Any) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise ConfigError(
            f"Expected {name} to be an integer between 1 and 65535 (0 = any free port), got {raw!r}"
        )
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(name: str, raw: Any) -> int:
    match = _SIZE.match(str(raw))
    if not match:
        raise ConfigError(f"Expected {name} to be a size such as 67108864, 64MiB or 512KiB, got {raw!r}")
    unit = (match.group(2) or "").lower()[:1]
    value = int(match.group(1)) * _SIZE_UNITS[unit]
    if value <= 0:
        raise ConfigError(f"Expected {name} to be a positive size, got {raw!r}")
    return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(name: str, raw: Any) -> float:
    """Seconds from ``30s``, ``15m``, ``2h``, ``7d``, ``1w``."""
    match = _DURATION.match(str(raw))
    if not match:
        raise ConfigError(f"Expected {name} to be a duration such as 30s, 15m, 2h or 7d, got {raw!r}")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


def parse_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"Expected {name} to be true or false, got {raw!r}")


def parse_host(name: str, raw: Any) -> str:
    text = str(raw).strip().strip("[]")
    if text == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.ip_address(text)
    except ValueError as exc:
        raise ConfigError(
            f"Expected {name} to be an IP address such as 127.0.0.1 or ::1, got {raw!r}"
        ) from exc
    return text


def parse_host_list(name: str, raw: Any) -> tuple[str, ...]:
    """Host names or addresses, comma-separated (``collector.example.com,10.0.0.5``); ``*`` = any."""
    if isinstance(raw, tuple):
        return raw
    names = tuple(part.strip().lower() for part in str(raw).split(",") if part.strip())
    for host in names:
        if host != "*" and not re.fullmatch(r"[a-z0-9._:\[\]-]+", host):
            raise ConfigError(
                f"Expected {name} to be host names or addresses separated by commas, such as "
                f"collector.internal,10.0.0.5 (or * for any), got {raw!r}"
            )
    return names


def parse_text(name: str, raw: Any) -> str:
    return str(raw)


def parse_tool_pattern(name: str, raw: Any) -> str:
    """An RE2 regular expression of tool names (checked by DuckDB, which matches it)."""
    from analytics.side_effects import check_pattern

    try:
        return check_pattern(str(raw))
    except ValueError as exc:
        raise ConfigError(
            f"Expected {name} to be a regular expression of tool names such as '^(send_report|file_claim)$': {exc}"
        ) from None


def parse_url(name: str, raw: Any) -> str:
    """An http(s) URL such as http://127.0.0.1:9093."""
    from urllib.parse import urlsplit

    text = str(raw).strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"Expected {name} to be an http(s) URL such as http://127.0.0.1:9093, got {raw!r}")
    return text


def parse_log_level(name: str, raw: Any) -> str:
    text = str(raw).strip().upper()
    if text not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"Expected {name} to be one of debug, info, warning, error, got {raw!r}")
    return text


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str
    parse: Callable[[str, Any], Any] = parse_text
    commands: tuple[str, ...] = ()
    otel_env: str | None = None
    flag_kind: str = "value"  # "value" or "switch"
    metavar: str | None = None
    choices: tuple[str, ...] = field(default=())

    @property
    def env(self) -> str:
        return "DRIFTSCOPE_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SERVE = ("serve", "up")
ALERTS = ("serve", "up", "alerts")
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "db",
        "./driftscope-data/driftscope.duckdb",
        "DuckDB database file the collector owns.",
        commands=SERVE + ("ingest",),
        metavar="PATH",
    ),
    Setting(
        "store",
        None,
        "A ClickHouse store instead of --db: chdb:PATH or clickhouse://HOST:8123/DB (docs/scale-out.md).",
        commands=("serve", "clickhouse", "calibrate"),
        metavar="URL",
    ),
    Setting(
        "host",
        "127.0.0.1",
        "Address to bind. Anything but loopback needs --token or --insecure.",
        parse_host,
        SERVE,
        metavar="ADDR",
    ),
    Setting(
        "http_port",
        4318,
        "OTLP/HTTP port; also serves the read API (/api/v1).",
        parse_port,
        SERVE,
        metavar="PORT",
    ),
    Setting("grpc_port", 4317, "OTLP/gRPC port.", parse_port, SERVE, metavar="PORT"),
    Setting(
        "token",
        None,
        "Bearer token required on ingest and the read API (Authorization: Bearer ...).",
        commands=SERVE + ("ingest", "dashboard", "report", "compare", "demo", "calibrate"),
        metavar="TOKEN",
    ),
    Setting(
        "allowed_hosts",
        None,
        "Host names (comma-separated) the HTTP endpoints and the dashboard answer to besides loopback "
        "names and the bound address; any other Host header is refused (DNS rebinding). * allows any.",
        parse_host_list,
        SERVE + ("dashboard",),
        metavar="HOSTS",
    ),
    Setting(
        "insecure",
        False,
        "Allow binding a non-loopback address without a token.",
        parse_bool,
        SERVE,
        flag_kind="switch",
    ),
    Setting(
        "max_body_bytes",
        64 * 1024**2,
        "Largest accepted request body, checked again after gzip.",
        parse_size,
        SERVE,
        metavar="SIZE",
    ),
    Setting(
        "queue_max_bytes",
        256 * 1024**2,
        "Ingest queue byte limit; past it requests get 429 / RESOURCE_EXHAUSTED with Retry-After.",
        parse_size,
        SERVE,
        metavar="SIZE",
    ),
    Setting(
        "memory_limit",
        1024**3,
        "DuckDB's memory for caching and query work; past it DuckDB spills to disk. Keeps serve's memory flat as the database grows.",
        parse_size,
        SERVE,
        metavar="SIZE",
    ),
    Setting(
        "max_attribute_bytes",
        64 * 1024,
        "Attribute values longer than this are truncated with a marker.",
        parse_size,
        SERVE,
        metavar="SIZE",
    ),
    Setting(
        "max_spans_per_request",
        100_000,
        "Most spans one OTLP request may carry; a request with more is refused (HTTP 413 / gRPC "
        "INVALID_ARGUMENT) before its spans are built.",
        parse_count,
        SERVE,
        metavar="N",
    ),
    Setting(
        "max_attributes_per_span",
        1024,
        "Most attributes one span, event, link or resource may carry; a span past it (or under a "
        "resource past it) is rejected in partial_success.",
        parse_count,
        SERVE,
        metavar="N",
    ),
    Setting(
        "max_items_per_request",
        2_000_000,
        "Most messages and values one OTLP request may carry (ResourceSpans, ScopeSpans, spans, events, "
        "links, attributes, AnyValue array items and kvlist entries; every value of a JSON body); past it "
        "the request is refused (HTTP 413 / gRPC INVALID_ARGUMENT) before they are built.",
        parse_count,
        SERVE,
        metavar="N",
    ),
    Setting(
        "header_timeout",
        "10s",
        "An HTTP client must send its request line and headers within this time, or the connection is closed.",
        parse_duration,
        SERVE,
        metavar="DURATION",
    ),
    Setting(
        "body_timeout",
        "60s",
        "An HTTP request body must arrive within this time of its headers (408 past it); a gRPC call "
        "whose message has not arrived within it is cancelled.",
        parse_duration,
        SERVE,
        metavar="DURATION",
    ),
    Setting(
        "max_pending_bytes",
        256 * 1024**2,
        "Bytes of request bodies waiting to be decoded (HTTP bodies being read, gRPC messages) may hold "
        "together; past it HTTP gets 503 + Retry-After, gRPC RESOURCE_EXHAUSTED + RetryInfo.",
        parse_size,
        SERVE,
        metavar="SIZE",
    ),
    Setting(
        "decode_workers",
        2,
        "Threads decoding OTLP bodies (HTTP and gRPC share them): at most this many decode at once.",
        parse_count,
        SERVE,
        metavar="N",
    ),
    Setting(
        "retention",
        None,
        "Delete spans older than this duration in the background (e.g. 7d).",
        parse_duration,
        SERVE,
        metavar="DURATION",
    ),
    Setting(
        "retention_interval",
        "60s",
        "How often the retention pass runs.",
        parse_duration,
        SERVE,
        metavar="DURATION",
    ),
    Setting(
        "embeddings",
        True,
        "Run the background embedding worker for goal divergence.",
        parse_bool,
        SERVE,
        metavar="BOOL",
    ),
    Setting(
        "side_effect_tools",
        None,
        "Tool names duplicate_side_effects treats as side-effecting when a span does not say "
        "(driftscope.side_effect), as an RE2 regex matched against the name and its words "
        "(sendEmail -> send_email); replaces the default verb list (docs/analytics.md).",
        parse_tool_pattern,
        SERVE + ("dashboard", "report", "compare"),
        metavar="REGEX",
    ),
    Setting(
        "alert_rules",
        None,
        "TOML file of alert rules (docs/alerts.md; check it with `driftscope alerts check FILE`). Without "
        "it every finding detector has one default rule. Alerts are evaluated when this or a receiver is set.",
        commands=ALERTS,
        metavar="FILE",
    ),
    Setting(
        "alertmanager_url",
        None,
        "Prometheus Alertmanager to push alerts to (POST /api/v2/alerts), e.g. http://127.0.0.1:9093.",
        parse_url,
        ALERTS,
        metavar="URL",
    ),
    Setting(
        "alert_interval",
        "30s",
        "How often alert rules are evaluated on the spans that arrived since.",
        parse_duration,
        ALERTS,
        metavar="DURATION",
    ),
    Setting(
        "alert_webhook_url",
        None,
        "Webhook receiving each alert in Alertmanager's webhook JSON (version 4).",
        parse_url,
        ALERTS,
        metavar="URL",
    ),
    Setting(
        "alert_webhook_secret",
        None,
        "Secret signing webhooks: X-Driftscope-Signature: sha256=HMAC-SHA256(secret, timestamp.body) hex, "
        "the timestamp in X-Driftscope-Timestamp (docs/alerts.md).",
        commands=ALERTS,
        metavar="SECRET",
    ),
    Setting(
        "alert_slack_url",
        None,
        "Slack incoming-webhook URL receiving one message per alert.",
        parse_url,
        ALERTS,
        metavar="URL",
    ),
    Setting(
        "alert_dashboard_url",
        "http://127.0.0.1:8501",
        "Dashboard address alerts link their findings to (Alertmanager generatorURL, webhook, Slack).",
        parse_url,
        ALERTS,
        metavar="URL",
    ),
    Setting(
        "endpoint",
        None,
        "Collector base URL to send spans (ingest, demo) or a calibration (calibrate) to "
        "(http://127.0.0.1:4318).",
        commands=("ingest", "demo", "calibrate"),
        otel_env="OTEL_EXPORTER_OTLP_ENDPOINT",
        metavar="URL",
    ),
    Setting(
        "source",
        "http://127.0.0.1:4318",
        "Read API URL of a running serve, a DuckDB file path, or a ClickHouse store: chdb:PATH or "
        "clickhouse://HOST:8123/DB (docs/scale-out.md).",
        commands=("dashboard", "report", "compare"),
        metavar="URL|PATH",
    ),
    Setting(
        "dashboard_port",
        8501,
        "Port of the Streamlit dashboard.",
        parse_port,
        ("dashboard", "up"),
        metavar="PORT",
    ),
    Setting(
        "log_level",
        "INFO",
        "Log level: debug, info, warning, error.",
        parse_log_level,
        ("serve", "up", "ingest", "dashboard", "demo", "report", "compare", "calibrate"),
        metavar="LEVEL",
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}


def resolve(setting: Setting, cli_value: Any, environ: dict[str, str] | None = None) -> Any:
    """Apply the precedence rule to one setting and parse the winner."""
    environ = os.environ if environ is None else environ
    if cli_value is not None:
        return setting.parse(setting.flag, cli_value)
    if setting.env in environ and environ[setting.env] != "":
        return setting.parse(setting.env, environ[setting.env])
    if setting.otel_env and environ.get(setting.otel_env):
        return setting.parse(setting.otel_env, environ[setting.otel_env])
    if setting.default is None:
        return None
    return setting.parse(setting.flag, setting.default)


def settings_markdown() -> str:
    """The README table of every setting."""
    lines = [
        "| flag | environment | default | commands | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        env = f"`{s.env}`" + (f" (or `{s.otel_env}`)" if s.otel_env else "")
        default = "" if s.default is None else f"`{s.default}`"
        lines.append(f"| `{s.flag}` | {env} | {default} | {', '.join(s.commands)} | {s.help} |")
    return "\n".join(lines)
