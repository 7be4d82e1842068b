"""Context-drift detectors: superseded objectives still held, sends against stale policy."""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics._evidence import EVIDENCE, TIMES
from analytics.registry import register
from analytics.sql_loader import run_sql
from analytics.types import Filters, Window


@register(
    "context_drift_holders",
    description="Agents that kept working from an objective version after it was superseded.",
    columns={
        **EVIDENCE,
        "agent": "agent holding the superseded version",
        "objective_id": "objective id, or the shared-state key (e.g. a policy) the agent read",
        "held_version": "version the agent held",
        "superseded_by": "first newer version seen in the run (None if only flagged)",
        "current_version": "newest version when the holding ended",
        "read_span_id": "the holder's first read of the held version",
        "supersede_span_id": "span that first carried the newer version (None if only flagged)",
        "refreshed": "True when the holder later read a newer version",
        "refresh_span_id": "that refreshing read, if any",
        "held_from": "when the held version became superseded while held (naive UTC)",
        "held_until": "the agent's next span with another version, else its last span end",
        "held_s": "seconds the agent held the superseded version",
        **TIMES,
    },
    row="one agent x superseded objective version in one run",
    failure_mode="context drift: acting on an outdated objective",
    mast_category="inter-agent misalignment",
    title="acting on a superseded objective",
    findings=True,
    needs=(
        "versioned objectives: spans with `driftscope.objective.id` and "
        "`driftscope.objective.version`, and a newer version marked with "
        "`driftscope.objective.superseded` while an agent still holds the old one"
    ),
    counted=True,
    failing_unless="refreshed",
    page="context_drift",
    kept="run_id",
    order=[("first_seen", False), ("agent", False)],  # fmt: skip
)
def context_drift_holders(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Holders of superseded objective versions and how long they held them."""
    return run_sql(conn, "context_drift_holders", window, filters)


@register(
    "stale_policy_sends",
    description="Outbound sends drafted against a superseded policy version (refused or allowed).",
    columns={
        **EVIDENCE,
        "agent": "sending agent",
        "tool_name": "send tool",
        "policy_id": "objective or state key whose version the send cites ('(policy_version)' if none)",
        "policy_version": "policy version the send was drafted against",
        "current_policy_version": "policy version in force at the send",
        "outcome": "'rejected' (a guard refused it) or 'ok' (it went out) or 'error'",
        "allowed": "True when the stale send actually went out (the worse case)",
        **TIMES,
    },
    row="one send against a superseded policy",
    failure_mode="stale policy: outbound action under an outdated policy",
    mast_category="inter-agent misalignment",
    title="send against a superseded policy",
    findings=True,
    needs="outbound sends stamped with `driftscope.policy.version` and `driftscope.policy.current_version`",
    flag_column="allowed",
    failing=True,
    page="context_drift",
    kept="run_id",
    order=[("first_seen", False)],  # fmt: skip
)
def stale_policy_sends(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Sends whose policy version was superseded when they were made."""
    return run_sql(conn, "stale_policy_sends", window, filters)
