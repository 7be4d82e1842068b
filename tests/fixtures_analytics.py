"""Build real ``spans`` rows in an in-memory DuckDB for analytics tests.

``make_span`` fills every NOT NULL column with a sensible default so a test states only the
fields its scenario is about; ``insert_spans`` writes the rows with plain INSERTs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from datetime import datetime, timedelta
from typing import Any

import duckdb

from driftscope.database import migrate

BASE_TIME = datetime(2026, 1, 5, 9, 0, 0)

_counter = itertools.count(1)

_COLUMNS = [
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind",
    "ServiceName", "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes",
    "Duration", "StatusCode", "StatusMessage", "Events", "Links", "start_ns", "end_ns",
    "span_family", "operation", "agent_id", "agent_name", "agent_source", "tool_name",
    "tool_call_id", "tool_args", "tool_result", "run_id", "input_text", "output_text",
    "graph_node_id", "graph_node_parent_id", "op", "state_key", "state_version",
    "state_expected_version", "outcome", "reject_reason", "task_id", "origin_task_id", "hop",
    "delegate_to", "constraints_ledger", "constraints_carried", "constraints_waived",
    "waiver_reasons", "acceptance_constraint_ids", "goal_root", "goal_text", "objective_id",
    "objective_version", "objective_superseded", "policy_version", "step", "budget_max_steps",
    "idempotency_key", "side_effect", "guard", "policy_current_version", "scenario", "ingested_at",
]  # fmt: skip


def new_db() -> duckdb.DuckDBPyConnection:
    """An in-memory database with the real schema applied."""
    conn = duckdb.connect(":memory:")
    migrate(conn)
    return conn


def trace_id(label: str) -> str:
    """A deterministic 32-hex trace id derived from ``label``."""
    return hashlib.sha256(label.encode()).hexdigest()[:32]


def make_span(t: float = 0.0, duration_s: float = 0.5, run: str = "run-1", **fields: Any) -> dict:
    """One span row. ``t`` is seconds after ``BASE_TIME``; ``run`` sets run_id and the trace.

    Any column of ``spans`` may be given by name; ``attrs`` sets SpanAttributes.
    """
    start = BASE_TIME + timedelta(seconds=t)
    start_ns = int((start - datetime(1970, 1, 1)).total_seconds() * 1_000_000) * 1000
    duration_ns = int(duration_s * 1e9)
    attrs = fields.pop("attrs", {})
    row = {column: None for column in _COLUMNS}
    row.update(
        Timestamp=start,
        TraceId=trace_id(run),
        SpanId=f"{next(_counter):016x}",
        ParentSpanId="",
        TraceState="",
        SpanName=fields.get("tool_name") or fields.get("op") or "span",
        SpanKind="Internal",
        ServiceName="crew",
        ResourceAttributes={"service.name": "crew"},
        ScopeName="tests",
        ScopeVersion="0",
        SpanAttributes={key: str(value) for key, value in attrs.items()},
        Duration=duration_ns,
        StatusCode="Unset",
        StatusMessage="",
        Events="[]",
        Links="[]",
        start_ns=start_ns,
        end_ns=start_ns + duration_ns,
        run_id=run,
        agent_source="attribute" if fields.get("agent_id") else None,
        # Typed fields the collector extracts from these attributes (collector/conventions.py).
        guard=attrs.get("driftscope.guard"),
        policy_current_version=attrs.get("driftscope.policy.current_version"),
        scenario=attrs.get("driftscope.scenario"),
        ingested_at=BASE_TIME,
    )
    unknown = set(fields) - set(_COLUMNS)
    if unknown:
        raise KeyError(f"unknown span columns {sorted(unknown)}")
    row.update(fields)
    if isinstance(row["tool_args"], dict):
        row["tool_args"] = json.dumps(row["tool_args"])
    return row


def insert_spans(conn: duckdb.DuckDBPyConnection, rows: list[dict]) -> None:
    """INSERT the rows into ``spans`` (attribute dicts bound as key and value lists)."""
    placeholders = []
    for column in _COLUMNS:
        if column in ("ResourceAttributes", "SpanAttributes"):
            placeholders.append("map_entries(MAP(?::VARCHAR[], ?::VARCHAR[]))")
        else:
            placeholders.append("?")
    sql = f"INSERT INTO spans ({', '.join(_COLUMNS)}) VALUES ({', '.join(placeholders)})"
    values = []
    for row in rows:
        args: list[Any] = []
        for column in _COLUMNS:
            if column in ("ResourceAttributes", "SpanAttributes"):
                args.extend([list(row[column].keys()), list(row[column].values())])
            else:
                args.append(row[column])
        values.append(args)
    conn.executemany(sql, values)


def sample_traces_db(names: list[str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory store holding ``sample_traces/<name>.json`` for each name (default: every
    sample trace), ingested through the collector's file path; fails if any span is refused."""
    from pathlib import Path

    from collector.files import ingest_files

    samples = Path(__file__).resolve().parents[1] / "sample_traces"
    if names is None:
        paths = sorted(p for p in samples.glob("*.json") if not p.name.endswith(".truth.json"))
    else:
        paths = [samples / f"{name}.json" for name in names]
    conn = duckdb.connect(":memory:")
    migrate(conn)
    result = ingest_files(None, paths, conn=conn)
    assert not result.errors and result.rejected == 0
    return conn
