"""Alert evaluation: rules over detector findings, and the state of every alert in the store.

``evaluate`` reads: each rule's detector runs over a fixed window (``since`` the evaluator's
anchor; ``registry.run_metric``: from the findings tables, plus the runs that window cuts
computed alone); the finding rows are filtered (rule filters, run pattern, the rule's time ``window``),
grouped (by run, or by agent for rejection rates) and compared with the threshold. Against the
alert episodes stored in ``alerts`` that gives the changes: a group over its threshold starts a
``pending`` episode, firing once it stayed over for the rule's ``for``; a group back under it
resolves its firing episode (a pending one is dropped). ``store_changes`` returns the function
that writes them, for the single writer. Reads never write.

``due_notifications`` reads which episodes a receiver has not yet been told about (its last
acknowledged state in ``alert_deliveries`` differs), and ``mark_delivered`` writes the
acknowledgement, so a restart or a receiver outage loses and repeats nothing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics import materialize, registry
from analytics.alert_rules import AlertRule, render
from analytics.engine import has_tables
from analytics.sql_loader import load_sql, query_df
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

ACTIVE = ("pending", "firing")
# Columns dating a finding row, most telling first; rows of detectors without one are dated by
# their run's newest span.
TIME_COLUMNS = ("last_seen", "held_until", "bucket_start", "first_seen")
# A notification not delivered within this time is given up (a receiver configured later is not
# flooded with months of history).
DELIVERY_HORIZON = timedelta(hours=24)
ALERT_COLUMNS = (
    "alert_id", "rule", "group_key", "episode", "alertname", "severity", "labels", "summary",
    "description", "run_id", "evidence_span", "state", "findings", "active_since", "starts_at",
    "ends_at", "last_finding_at", "updated_at",
)  # fmt: skip


def utcnow() -> datetime:
    """Now as naive UTC, like ``spans.Timestamp``."""
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass
class Group:
    """The findings of one rule's group at one evaluation."""

    key: str
    run_id: str | None
    agent: str | None
    service: str | None
    count: int
    rate: float | None
    last_at: datetime | None
    evidence_span: str | None


@dataclass
class Change:
    """A row to write into ``alerts`` (``delete``: remove a pending episode that never fired)."""

    row: dict
    delete: bool = False


@dataclass
class Evaluation:
    """What one evaluation saw and decided."""

    changes: list[Change] = field(default_factory=list)
    groups: dict[str, dict[str, Group]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


AGENT_COLUMNS = ("agent", "agents", "clobbered_agent", "delegate_to")


def _agents_by_group(rows: pd.DataFrame, keys: pd.Series) -> dict[str, str]:
    """Each group's agents (of ``AGENT_COLUMNS``: a name or a list of names per row), sorted and
    joined by commas, by group key (``keys``, aligned with ``rows``). Column-wise: a per-row walk
    held the GIL for seconds at 10M spans, beside ingest and the materializer."""
    longs = []
    for column in AGENT_COLUMNS:
        if column not in rows.columns:
            continue
        values = rows[column].to_numpy(dtype=object, na_value=None)
        longs.append(pd.Series(values, index=keys.to_numpy(), dtype=object).explode())
    if not longs:
        return {}
    agents = pd.concat(longs)
    agents = agents[agents.notna().to_numpy()]
    if agents.empty:
        return {}
    pairs = pd.DataFrame({"key": agents.index, "agent": agents.astype(str).to_numpy()})
    pairs = pairs[pairs["agent"] != ""].drop_duplicates().sort_values(["key", "agent"])
    return {key: ",".join(part) for key, part in pairs.groupby("key", sort=False)["agent"]}


def _first_span(value) -> str | None:
    if value is None or isinstance(value, float):
        return None
    if isinstance(value, str):
        return value or None
    values = list(value)
    return str(values[0]) if values else None


def finding_frame(conn: duckdb.DuckDBPyConnection, rule: AlertRule, since: datetime | None) -> pd.DataFrame:
    """The finding rows of ``rule``'s detector over spans since ``since``, after the rule's filters."""
    metric = rule.metric
    frame = registry.run_metric(
        conn, rule.detector, Window(since=since), Filters(service=rule.service, agent=rule.agent)
    )
    if rule.rate is not None:
        rows = frame[frame["rejection_rate"].astype(float) >= rule.rate]
    elif metric.flag_column:
        rows = frame[frame[metric.flag_column].fillna(False).astype(bool)]
    else:
        rows = frame
    if rule.run is not None and "run_id" in rows.columns:
        pattern = re.compile(rule.run)
        rows = rows[rows["run_id"].map(lambda run: bool(run) and pattern.search(str(run)) is not None)]
    return rows.reset_index(drop=True)


def _run_context(conn: duckdb.DuckDBPyConnection, runs: list[str]) -> pd.DataFrame:
    if not runs:
        return pd.DataFrame(columns=["service", "last_span"])
    found = query_df(conn, load_sql("alert_run_context"), {"run_list": sorted(set(runs))})
    return found.set_index("run_id")


def group_findings(
    conn: duckdb.DuckDBPyConnection, rule: AlertRule, rows: pd.DataFrame, now: datetime
) -> dict[str, Group]:
    """The groups of ``rows`` with findings in the rule's window that meet its threshold."""
    column = rule.group_column
    if rows.empty or column is None:
        return {}
    runs = [str(r) for r in rows["run_id"].dropna()] if "run_id" in rows.columns else []
    context = _run_context(conn, runs)
    time_column = next((c for c in TIME_COLUMNS if c in rows.columns), None)
    if time_column is not None:
        times = pd.to_datetime(rows[time_column])
        if time_column == "bucket_start" and "bucket_seconds" in rows.columns:
            times = times + pd.to_timedelta(rows["bucket_seconds"].astype(float), unit="s")
    else:
        times = pd.to_datetime(
            rows["run_id"].map(context["last_span"]) if runs else pd.Series(pd.NaT, index=rows.index)
        )
    cutoff = now - timedelta(seconds=rule.window_s)
    recent = rows[(times >= cutoff).fillna(False).to_numpy()]
    times = times[(times >= cutoff).fillna(False).to_numpy()]
    keys = recent[column].astype(str)
    named = ~keys.isin(["", "None"]).to_numpy()
    recent, times, keys = recent[named], times[named], keys[named]
    if recent.empty:
        return {}
    counts = keys.value_counts()
    rates = (
        recent["rejection_rate"].astype(float).groupby(keys).max()
        if "rejection_rate" in recent.columns
        else None
    )
    newest = times.groupby(keys).idxmax()  # the row of each group's newest finding
    agents = _agents_by_group(recent, keys) if column != "agent" else {}
    spans = recent["span_ids"] if "span_ids" in recent.columns else None
    groups: dict[str, Group] = {}
    for key in sorted(counts.index):
        count = int(counts[key])
        if rule.rate is None and count < rule.threshold:
            continue
        run_id = key if column == "run_id" else None
        service = None
        if run_id is not None and run_id in context.index:
            service = context.loc[run_id, "service"]
        at = newest[key]
        groups[key] = Group(
            key=key,
            run_id=run_id,
            agent=key if column == "agent" else (agents.get(key) or None),
            service=service if isinstance(service, str) else rule.service,
            count=count,
            rate=float(rates[key]) if rates is not None else None,
            last_at=times.loc[at].to_pydatetime(),
            evidence_span=_first_span(spans.loc[at]) if spans is not None else None,
        )
    return groups


def template_fields(rule: AlertRule, group: Group) -> dict[str, object]:
    metric = rule.metric
    return {
        "rule": rule.name,
        "detector": rule.detector,
        "title": metric.title or rule.detector,
        "failure_mode": metric.failure_mode or "",
        "severity": rule.severity,
        "count": group.count,
        "rate": group.rate if group.rate is not None else 0.0,
        "run_id": group.run_id or "",
        "agent": group.agent or "",
        "service": group.service or "",
        "window": _duration_text(rule.window_s),
    }


def _duration_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def alert_labels(rule: AlertRule, group: Group) -> dict[str, str]:
    """The label set Alertmanager identifies the alert by (fixed for the episode)."""
    labels = {
        "alertname": rule.detector,
        "severity": rule.severity,
        "service": group.service or "",
        "run_id": group.run_id or "",
        "agent": group.agent or "",
    }
    if rule.name != rule.detector:
        labels["rule"] = rule.name
    labels.update(rule.labels)
    return {key: value for key, value in labels.items() if value != ""}


def read_active(conn: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Pending and firing episodes, plus each (rule, group)'s newest episode number."""
    return conn.execute("SELECT * FROM alerts WHERE state IN ('pending', 'firing') ORDER BY alert_id").df()


def _episodes(conn: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        "SELECT rule, group_key, max(episode) FROM alerts GROUP BY rule, group_key"
    ).fetchall()
    return {(rule, key): episode for rule, key, episode in rows}


def plan_changes(
    rules: list[AlertRule],
    observed: dict[str, dict[str, Group]],
    active: pd.DataFrame,
    episodes: dict[tuple[str, str], int],
    now: datetime,
    failed: frozenset[str] = frozenset(),
) -> list[Change]:
    """The state changes from stored ``active`` episodes and this evaluation's groups (pure).

    Rules in ``failed`` (their detector raised) keep their episodes unchanged.
    """
    by_rule = {rule.name: rule for rule in rules}
    changes: list[Change] = []
    current = {
        (row["rule"], row["group_key"]): {key: _plain(value) for key, value in row.items()}
        for row in active.to_dict("records")
    }
    for (rule_name, key), row in current.items():
        rule = by_rule.get(rule_name)
        if rule_name in failed:
            continue
        group = observed.get(rule_name, {}).get(key) if rule else None
        if group is None:
            if row["state"] == "pending":
                changes.append(Change(row, delete=True))
            else:
                changes.append(Change({**row, "state": "resolved", "ends_at": now, "updated_at": now}))
            continue
        updated = {
            **row,
            "findings": group.count,
            "last_finding_at": group.last_at,
            "evidence_span": group.evidence_span or row["evidence_span"],
            "updated_at": now,
        }
        fields = template_fields(rule, group)
        updated["summary"] = render(rule.summary, fields)
        updated["description"] = render(rule.description, fields)
        if row["state"] == "pending" and now - _ts(row["active_since"]) >= timedelta(seconds=rule.for_s):
            updated.update(state="firing", starts_at=now)
        if updated != {**row, "updated_at": now}:
            changes.append(Change(updated))
    for rule in rules:
        if rule.name in failed:
            continue
        for key, group in observed.get(rule.name, {}).items():
            if (rule.name, key) in current:
                continue
            episode = episodes.get((rule.name, key), 0) + 1
            fields = template_fields(rule, group)
            firing = rule.for_s <= 0
            changes.append(
                Change(
                    {
                        "alert_id": f"{rule.name}/{key}/{episode}",
                        "rule": rule.name,
                        "group_key": key,
                        "episode": episode,
                        "alertname": rule.detector,
                        "severity": rule.severity,
                        "labels": json.dumps(alert_labels(rule, group), sort_keys=True),
                        "summary": render(rule.summary, fields),
                        "description": render(rule.description, fields),
                        "run_id": group.run_id,
                        "evidence_span": group.evidence_span,
                        "state": "firing" if firing else "pending",
                        "findings": group.count,
                        "active_since": now,
                        "starts_at": now if firing else None,
                        "ends_at": None,
                        "last_finding_at": group.last_at,
                        "updated_at": now,
                    }
                )
            )
    return changes


def _ts(value) -> datetime:
    return value.to_pydatetime() if isinstance(value, pd.Timestamp) else value


def _plain(value):
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, pd.Timestamp):
        return None if pd.isna(value) else value.to_pydatetime()
    if value is pd.NaT:
        return None
    if isinstance(value, np.integer):
        return int(value)
    return value


def store_changes(changes: list[Change]) -> Callable[[duckdb.DuckDBPyConnection], int]:
    """The write function storing ``changes`` (hand it to the single writer); returns rows
    written. An alert's last change decides: one DELETE and one INSERT OR REPLACE for all (a
    statement per change held the single writer, ingest waiting behind it); the insert casts
    the rows to the columns of ``alerts``."""
    last = {change.row["alert_id"]: change for change in changes}
    gone = [alert for alert, change in last.items() if change.delete]
    rows = [change.row for change in last.values() if not change.delete]
    table = pa.table({c: [_plain(row[c]) for row in rows] for c in ALERT_COLUMNS})
    columns = ", ".join(ALERT_COLUMNS)

    def write(conn: duckdb.DuckDBPyConnection) -> int:
        if gone:
            conn.execute(
                "DELETE FROM alerts WHERE alert_id IN (SELECT unnest($ids::VARCHAR[]))", {"ids": gone}
            )
        if rows:
            conn.register("_alert_rows", table)
            try:
                conn.execute(f"INSERT OR REPLACE INTO alerts ({columns}) SELECT {columns} FROM _alert_rows")
            finally:
                conn.unregister("_alert_rows")
        return len(changes)

    return write


def evaluate(
    conn: duckdb.DuckDBPyConnection,
    rules: list[AlertRule],
    now: datetime | None = None,
    since: datetime | None = None,
    state: duckdb.DuckDBPyConnection | None = None,
    turn: Callable[[], AbstractContextManager] | None = None,
    wait_for_tables: bool = False,
) -> Evaluation:
    """Evaluate every rule on ``conn`` (read only) and plan the state changes.

    ``wait_for_tables`` (serve, beside its materializer): a rule whose detector's findings table
    is not built yet is not evaluated (reported in ``errors``, its alerts left as they are)
    instead of computed from every span: at 10M spans its 13 rules every 30 s during the first
    build took serve from 1.8 to 7.6 GiB.

    ``since`` bounds the spans the detectors read (``registry.run_metric``: the runs it holds
    whole read from the findings tables, the runs it cuts computed); a rule whose detector fails is reported in ``errors`` and
    its alerts are left as they are. ``state`` is where the alert tables are when they are not
    in ``conn``'s database (``serve --store``: the detectors read ClickHouse, the episodes live
    in a DuckDB file beside the serve). ``turn``, when given, is held around each rule's reads
    of ``conn`` (there the read API's requests take turns with them, between rules).
    """
    state = conn if state is None else state
    now = now or utcnow()
    result = Evaluation()
    maintained = materialize.maintained() if wait_for_tables else {}
    for rule in rules:
        if rule.detector in maintained and materialize.ready(conn, rule.detector) is None:
            result.errors[rule.name] = (
                f"not evaluated yet: the findings table of {rule.detector} is being built (serve's first pass)"
            )
            continue
        try:
            with turn() if turn is not None else nullcontext():
                rows = finding_frame(conn, rule, since)
                result.groups[rule.name] = group_findings(conn, rule, rows, now)
        except Exception as exc:  # noqa: BLE001 - one broken detector must not stop the others' alerts
            logger.warning("alert rule %s: detector %s failed: %s", rule.name, rule.detector, exc)
            result.errors[rule.name] = f"{type(exc).__name__}: {exc}"
    result.changes = plan_changes(
        rules, result.groups, read_active(state), _episodes(state), now, frozenset(result.errors)
    )
    return result


def has_active(conn: duckdb.DuckDBPyConnection) -> bool:
    """Whether any episode is pending or firing (time alone can change those)."""
    return bool(
        conn.execute("SELECT count(*) FROM alerts WHERE state IN ('pending', 'firing')").fetchone()[0]
    )


def due_notifications(
    conn: duckdb.DuckDBPyConnection,
    receiver: str,
    now: datetime | None = None,
    resend_after: timedelta | None = None,
    limit: int = 500,
) -> pd.DataFrame:
    """Firing and resolved episodes ``receiver`` has not acknowledged in their current state
    (and, with ``resend_after``, firing ones acknowledged longer ago than that), oldest first."""
    now = now or utcnow()
    resend = now - resend_after if resend_after is not None else None
    return conn.execute(
        "SELECT a.*, d.sent_state, d.sent_at FROM alerts a "
        "LEFT JOIN alert_deliveries d ON d.alert_id = a.alert_id AND d.receiver = $receiver "
        "WHERE a.state IN ('firing', 'resolved') AND a.updated_at >= $horizon "
        "AND (d.sent_state IS DISTINCT FROM a.state "
        "     OR (a.state = 'firing' AND $resend IS NOT NULL AND d.sent_at < $resend)) "
        "ORDER BY a.updated_at, a.alert_id LIMIT $limit",
        {"receiver": receiver, "horizon": now - DELIVERY_HORIZON, "resend": resend, "limit": limit},
    ).df()


def mark_delivered(
    receiver: str, sent: list[tuple[str, str]], now: datetime | None = None
) -> Callable[[duckdb.DuckDBPyConnection], int]:
    """The write function recording that ``receiver`` acknowledged (alert_id, state) pairs."""
    sent_at = now or utcnow()

    last = dict(sent)  # an alert's last acknowledged state (one statement for all: store_changes)

    def write(conn: duckdb.DuckDBPyConnection) -> int:
        if last:
            conn.execute(
                "INSERT OR REPLACE INTO alert_deliveries "
                "SELECT unnest($ids::VARCHAR[]), $receiver, unnest($states::VARCHAR[]), $at",
                {"ids": list(last), "states": list(last.values()), "receiver": receiver, "at": sent_at},
            )
        return len(sent)

    return write


def _has_tables(conn: duckdb.DuckDBPyConnection) -> bool:
    return has_tables(conn, "alerts", "alert_deliveries")


def list_alerts(conn: duckdb.DuckDBPyConnection, window: Window = Window(), limit: int = 500) -> pd.DataFrame:
    """Alert episodes active in ``window`` (firing first, then newest), with the receivers that
    acknowledged each; empty (same columns) for a database without alert tables."""
    columns = [c for c in ALERT_COLUMNS if c not in ("group_key", "episode")] + ["delivered_to"]
    try:
        present = _has_tables(conn)
    except Exception:  # noqa: BLE001 - a store without DuckDB's catalogue (ClickHouse) keeps no alerts
        present = False
    if not present:
        return pd.DataFrame(columns=columns)
    frame = conn.execute(
        "SELECT a.*, coalesce((SELECT string_agg(d.receiver || ':' || d.sent_state, ', ' ORDER BY d.receiver) "
        "  FROM alert_deliveries d WHERE d.alert_id = a.alert_id), '') AS delivered_to "
        "FROM alerts a WHERE a.state <> 'pending' "
        "AND ($since IS NULL OR coalesce(a.ends_at, $far) >= $since) "
        "AND ($until IS NULL OR a.active_since < $until) "
        "ORDER BY a.state = 'firing' DESC, a.active_since DESC, a.alert_id LIMIT $limit",
        {"since": window.since, "until": window.until, "far": datetime(9999, 1, 1), "limit": limit},
    ).df()
    return frame.loc[:, columns]
