"""Alert rules: which findings page someone, parsed from a TOML rules file or derived from the registry.

A rule names a finding detector (``alertname`` is the detector's name as the read API lists it),
optional filters (service, agent, a regular expression on run ids), a threshold (findings of one
group within ``window``, or for ``rejection_rates`` a ``rate``), a ``for`` duration the group must
stay over it before the alert fires, a severity, extra labels and summary / description templates.

Without a rules file every finding detector gets one rule (``default_rules``), its severity derived
from its ``Metric`` record: ``critical`` when each finding means a failure took effect
(``failing``), else ``warning``. A rules file adds rules and replaces a default rule of the same
name (``enabled = false`` turns one off; top-level ``defaults = false`` drops them all).
"""

from __future__ import annotations

import re
import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from analytics import registry
from analytics.registry import Metric

SEVERITIES = ("critical", "warning", "info")
DEFAULT_WINDOW_S = 15 * 60.0
RATE_DETECTOR = "rejection_rates"
RULE_KEYS = (
    "name", "detector", "enabled", "severity", "threshold", "rate", "window", "for", "service",
    "agent", "run", "labels", "summary", "description",
)  # fmt: skip
TOP_KEYS = ("defaults", "window", "for", "rule")
TEMPLATE_FIELDS = (
    "rule", "detector", "title", "failure_mode", "severity", "count", "rate", "run_id", "agent",
    "service", "window",
)  # fmt: skip
# Labels the evaluator sets itself; a rule's labels may not override them.
RESERVED_LABELS = ("alertname", "severity", "service", "run_id", "agent", "rule")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class RuleError(ValueError):
    """A rules file a person must fix; ``line`` is where (1-based), when known."""

    def __init__(self, message: str, line: int | None = None, source: str = "rules file") -> None:
        self.line = line
        self.source = source
        where = f"{source}, line {line}" if line else source
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class AlertRule:
    """One alert rule (see the module docstring; docs/alerts.md documents every key)."""

    name: str
    detector: str
    severity: str
    threshold: int = 1
    rate: float | None = None
    window_s: float = DEFAULT_WINDOW_S
    for_s: float = 0.0
    service: str | None = None
    agent: str | None = None
    run: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    description: str = ""
    line: int | None = None

    @property
    def metric(self) -> Metric:
        return registry.METRICS[self.detector]

    @property
    def group_column(self) -> str | None:
        """The column whose value makes one finding group: the run, or the agent for rate rules."""
        columns = self.metric.columns
        if "run_id" in columns:
            return "run_id"
        return "agent" if "agent" in columns else None


def default_severity(metric: Metric) -> str:
    """``critical`` when each finding means a failure took effect, else ``warning``."""
    return "critical" if metric.failing or metric.failing_unless else "warning"


def default_summary(metric: Metric) -> str:
    if "run_id" in metric.columns:
        return "{title}: {count} finding(s) in run {run_id} of {service}"
    return "{title}: rejection rate {rate:.0%} for agent {agent}"


def default_description(metric: Metric) -> str:
    text = f"{metric.failure_mode or metric.title} ({metric.mast_category}). {metric.description}"
    return text.replace("{", "{{").replace("}", "}}")


def default_rules(window_s: float = DEFAULT_WINDOW_S, for_s: float = 0.0) -> list[AlertRule]:
    """One rule per finding detector, in catalogue order, facts taken from its Metric record."""
    return [
        AlertRule(
            name=metric.name,
            detector=metric.name,
            severity=default_severity(metric),
            window_s=window_s,
            for_s=for_s,
            summary=default_summary(metric),
            description=default_description(metric),
        )
        for metric in registry.finding_metrics()
    ]


def parse_duration(text: object) -> float:
    """Seconds from ``30s``, ``15m``, ``2h``, ``1d``, ``500ms`` or a number of seconds."""
    if isinstance(text, bool):
        raise ValueError(f"expected a duration such as 30s, 15m or 2h, got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise ValueError(f"expected a duration such as 30s, 15m or 2h, got {text!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"expected a duration of zero or more, got {text!r}")
    return seconds


def _key_lines(text: str) -> list[tuple[int, dict[str, int]]]:
    """For each ``[[rule]]`` table in order: its header line and the line of each key in it."""
    tables: list[tuple[int, dict[str, int]]] = []
    current: dict[str, int] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if re.match(r"^\[\[\s*rule\s*\]\]", line):
            current = {}
            tables.append((number, current))
        elif line.startswith("["):
            current = None
        elif current is not None:
            match = re.match(r"^([A-Za-z0-9_\"'-]+)\s*=", line)
            if match:
                current.setdefault(match.group(1).strip("\"'"), number)
    return tables


def _check_template(template: str, key: str, line: int | None, source: str) -> None:
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise RuleError(
            f"{key} is not a valid template ({exc}); write literal braces as {{{{ }}}}", line, source
        ) from None
    for name in names:
        base = re.split(r"[.\[]", name, maxsplit=1)[0]
        if base not in TEMPLATE_FIELDS:
            raise RuleError(
                f"{key} uses {{{name}}}, which is not a field; use any of "
                + ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS),
                line,
                source,
            )
    try:
        render(template, sample_fields())
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise RuleError(f"{key} cannot be rendered ({type(exc).__name__}: {exc})", line, source) from None


def sample_fields(rule: AlertRule | None = None) -> dict[str, object]:
    """Template values of a sample alert (``driftscope alerts test``, template checks)."""
    metric = rule.metric if rule else None
    return {
        "rule": rule.name if rule else "sample",
        "detector": rule.detector if rule else "sample",
        "title": (metric.title if metric else None) or "sample",
        "failure_mode": (metric.failure_mode if metric else None) or "sample",
        "severity": rule.severity if rule else "warning",
        "count": 1,
        "rate": 0.5,
        "run_id": "sample-run",
        "agent": "sample-agent",
        "service": "sample-service",
        "window": "15m",
    }


def render(template: str, fields: dict[str, object]) -> str:
    """``template`` with ``{field}``s filled (``str.format``)."""
    return template.format_map(fields)


def _rule_from_table(
    table: dict,
    index: int,
    lines: dict[str, int],
    header: int | None,
    source: str,
    window_s: float = DEFAULT_WINDOW_S,
    for_s: float = 0.0,
) -> tuple[AlertRule, bool]:
    def line_of(key: str) -> int | None:
        return lines.get(key, header)

    unknown = [key for key in table if key not in RULE_KEYS]
    if unknown:
        key = unknown[0]
        close = [k for k in RULE_KEYS if k.startswith(key[:3])]
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise RuleError(
            f"rule {index}: unknown key {key!r}{hint}; known keys: {', '.join(RULE_KEYS)}",
            line_of(key),
            source,
        )
    detector = table.get("detector")
    findings = [m.name for m in registry.finding_metrics()]
    if not isinstance(detector, str) or not detector:
        raise RuleError(
            f'rule {index} needs detector = "NAME", one of: {", ".join(findings)}', header, source
        )
    if detector not in findings:
        kind = "lists no findings" if detector in registry.METRICS else "is not a detector"
        raise RuleError(
            f"rule {index}: detector {detector!r} {kind}; use one of: {', '.join(findings)}",
            line_of("detector"),
            source,
        )
    metric = registry.METRICS[detector]
    name = table.get("name", detector)
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_.-]+$", name):
        raise RuleError(
            f"rule {index}: name must be letters, digits, _ . or -, got {name!r}", line_of("name"), source
        )

    def text(key: str) -> str | None:
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise RuleError(
                f"rule {name!r}: {key} must be a non-empty string, got {value!r}", line_of(key), source
            )
        return value

    severity = table.get("severity", default_severity(metric))
    if severity not in SEVERITIES:
        raise RuleError(
            f"rule {name!r}: severity must be one of {', '.join(SEVERITIES)}, got {severity!r}",
            line_of("severity"),
            source,
        )
    threshold = table.get("threshold", 1)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise RuleError(
            f"rule {name!r}: threshold is the findings of one group in the window that fire it, a whole "
            f"number of 1 or more, got {threshold!r}",
            line_of("threshold"),
            source,
        )
    rate = table.get("rate")
    if rate is not None:
        if detector != RATE_DETECTOR:
            raise RuleError(
                f"rule {name!r}: rate applies to {RATE_DETECTOR} only (its rows carry a rate); "
                f"for {detector} use threshold = N findings",
                line_of("rate"),
                source,
            )
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
            raise RuleError(
                f"rule {name!r}: rate is a fraction of calls rejected, above 0 and at most 1 (0.2 = 20%), got {rate!r}",
                line_of("rate"),
                source,
            )
    durations = {}
    for key, default in (("window", window_s), ("for", for_s)):
        try:
            durations[key] = parse_duration(table[key]) if key in table else default
        except ValueError as exc:
            raise RuleError(f"rule {name!r}: {key}: {exc}", line_of(key), source) from None
    if durations["window"] <= 0:
        raise RuleError(f"rule {name!r}: window must be longer than 0s", line_of("window"), source)
    run = text("run")
    if run is not None:
        try:
            re.compile(run)
        except re.error as exc:
            raise RuleError(
                f"rule {name!r}: run is a regular expression of run ids such as '^prod-', and {run!r} is not one ({exc})",
                line_of("run"),
                source,
            ) from None
    labels = table.get("labels", {})
    if not isinstance(labels, dict):
        raise RuleError(
            f'rule {name!r}: labels must be a table such as {{ team = "agents" }}', line_of("labels"), source
        )
    for key, value in labels.items():
        if not _LABEL_NAME.match(key) or key in RESERVED_LABELS:
            raise RuleError(
                f"rule {name!r}: label {key!r} must match [a-zA-Z_][a-zA-Z0-9_]* and not be one of "
                f"{', '.join(RESERVED_LABELS)} (driftscope sets those)",
                line_of("labels"),
                source,
            )
        if not isinstance(value, str):
            raise RuleError(
                f"rule {name!r}: label {key} must be a string, got {value!r}", line_of("labels"), source
            )
    summary = text("summary") or default_summary(metric)
    description = text("description") or default_description(metric)
    for key, template in (("summary", summary), ("description", description)):
        _check_template(template, key, line_of(key), source)
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RuleError(
            f"rule {name!r}: enabled must be true or false, got {enabled!r}", line_of("enabled"), source
        )
    return AlertRule(
        name=name,
        detector=detector,
        severity=severity,
        threshold=threshold,
        rate=float(rate) if rate is not None else None,
        window_s=durations["window"],
        for_s=durations["for"],
        service=text("service"),
        agent=text("agent"),
        run=run,
        labels=dict(labels),
        summary=summary,
        description=description,
        line=header,
    ), enabled


def parse_rules(text: str, source: str = "rules file") -> list[AlertRule]:
    """The rules in force for a rules file's text (defaults included unless ``defaults = false``).

    Raises ``RuleError`` naming the line and what to write instead.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"at line (\d+)", str(exc))
        raise RuleError(
            f"not valid TOML ({exc}); rules are [[rule]] tables of key = value lines",
            int(match.group(1)) if match else None,
            source,
        ) from None
    unknown = [key for key in document if key not in TOP_KEYS]
    if unknown:
        raise RuleError(
            f"unknown top-level key {unknown[0]!r}; a rules file holds `defaults = true|false`, `window` and "
            "`for` (defaults of every rule) and [[rule]] tables",
            _top_line(text, unknown[0]),
            source,
        )
    use_defaults = document.get("defaults", True)
    if not isinstance(use_defaults, bool):
        raise RuleError(
            f"defaults must be true or false, got {use_defaults!r}", _top_line(text, "defaults"), source
        )
    top = {}
    for key, default in (("window", DEFAULT_WINDOW_S), ("for", 0.0)):
        try:
            top[key] = parse_duration(document[key]) if key in document else default
        except ValueError as exc:
            raise RuleError(f"{key}: {exc}", _top_line(text, key), source) from None
    if top["window"] <= 0:
        raise RuleError("window must be longer than 0s", _top_line(text, "window"), source)
    tables = document.get("rule", [])
    if not isinstance(tables, list):
        raise RuleError(
            "rules are written as [[rule]] tables (double brackets)", _top_line(text, "rule"), source
        )
    positions = _key_lines(text)
    shipped = default_rules(top["window"], top["for"]) if use_defaults else []
    rules: dict[str, AlertRule] = {r.name: r for r in shipped}
    declared: dict[str, int | None] = {}
    for index, table in enumerate(tables, start=1):
        header, lines = positions[index - 1] if index - 1 < len(positions) else (None, {})
        rule, enabled = _rule_from_table(table, index, lines, header, source, top["window"], top["for"])
        if rule.name in declared:
            raise RuleError(
                f"rule {index}: another rule (line {declared[rule.name]}) is also named {rule.name!r}; "
                'give each rule of one detector its own name = "..."',
                header,
                source,
            )
        declared[rule.name] = header
        rules.pop(rule.name, None)
        if enabled:
            rules[rule.name] = rule
    return list(rules.values())


def _top_line(text: str, key: str) -> int | None:
    for number, raw in enumerate(text.splitlines(), start=1):
        if re.match(rf"^\s*{re.escape(key)}\s*=", raw):
            return number
    return None


def load_rules(path: str | Path | None) -> list[AlertRule]:
    """The rules of a rules file, or the default rules for ``None``; ``RuleError`` when it is wrong."""
    if path is None:
        return default_rules()
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise RuleError(f"cannot read it ({exc.strerror}); check the path", None, str(file)) from None
    except UnicodeDecodeError:
        raise RuleError("is not UTF-8 text; a rules file is TOML", None, str(file)) from None
    return parse_rules(text, str(file))
