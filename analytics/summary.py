"""Enforcement coverage per tool and the per-run summary with a health verdict."""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics.registry import register, run_metric
from analytics.sql_loader import run_sql
from analytics.types import Filters, Window

COUNTED_DETECTORS = (
    "divergent_reads", "lost_updates", "constraint_drops", "context_drift_holders",
    "repeated_calls", "ping_pong", "budget_exhaustion", "duplicate_side_effects",
)  # fmt: skip
# Findings that mean a coordination failure took effect. The others (divergent reads whose
# writes a guard sorted out, budgets that stopped an agent, stale holders that refreshed,
# refused calls) are warnings: the crew degraded but a guard or the agent caught it.
FAILING_DETECTORS = (
    "lost_updates", "constraint_drops", "repeated_calls", "ping_pong", "duplicate_side_effects",
)  # fmt: skip


@register(
    "enforcement_coverage",
    description="Per tool: calls carrying guard fields vs unguarded anti-patterns; prevented failures.",
    columns={
        "service": "ServiceName",
        "tool_name": "tool (or 'op:<driftscope.op>' for guard spans without a tool name)",
        "calls": "calls in the window",
        "guarded_calls": "calls with driftscope.outcome or driftscope.guard (went through a guard)",
        "prevented": "calls a guard refused (outcome = rejected)",
        "prevented_reasons": "distinct reject reasons",
        "writes": "state writes",
        "versioned_writes": "writes with an expected version",
        "delegations": "delegations",
        "structured_delegations": "delegations with task id, origin task and carried constraints",
        "sends": "outbound sends",
        "sends_with_policy": "sends with a policy version",
        "side_effects": "side-effecting calls",
        "side_effects_with_key": "side-effecting calls with an idempotency key",
        "anti_patterns": "unversioned writes + unstructured delegations + sends without policy + side effects without key",
        "coverage": "'enforced' (all guarded, no anti-pattern), 'partial', or 'watch_only' (never guarded)",
        "agents": "agents that called the tool",
        "first_seen": "first call (naive UTC)",
        "last_seen": "last call (naive UTC)",
    },  # fmt: skip
    row="one tool of one service",
    failure_mode=None,
    mast_category=None,
)
def enforcement_coverage(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Which tools are enforced by guards and which can only be watched."""
    return run_sql(conn, "enforcement_coverage", window, filters)


def _count_thresholds(conn: duckdb.DuckDBPyConnection) -> dict[str, float]:
    rows = conn.execute(
        "SELECT arg_max(name, version), arg_max(value, version) FROM thresholds "
        "WHERE name LIKE 'count_per_run:%' GROUP BY name"
    ).fetchall()
    return {name.split(":", 1)[1]: float(value) for name, value in rows}


def _counts_by_run(frame: pd.DataFrame) -> pd.Series:
    if frame.empty:
        return pd.Series(dtype="int64")
    return frame.groupby("run_id").size()


@register(
    "run_summary",
    description="Per run: agents, hops, spans, each detector's finding count, worst divergence, verdict.",
    columns={
        "run_id": "run (conversation id)",
        "trace_id": "first trace of the run",
        "agents": "agents seen in the run",
        "hops": "deepest delegation hop",
        "spans": "spans in the run",
        "traces": "traces in the run",
        "errors": "spans that failed (outcome error or status Error)",
        "rejections": "calls refused by a guard (failures prevented)",
        **{f"{name}_count": f"{name} findings in the run" for name in COUNTED_DETECTORS},
        "stale_holders_unrefreshed": "context_drift_holders that never refreshed",
        "stale_policy_sends_count": "sends against a superseded policy (refused or allowed)",
        "stale_sends_allowed": "stale-policy sends that went out",
        "drifted_subtasks": "subtasks over the goal-divergence threshold",
        "worst_divergence": "highest goal divergence in the run (1 - cosine), None without subtasks",
        "verdict": "'failing' (lost update, dropped constraint, loop, ping-pong, duplicate side effect, "
        "drifted subtask, unrefreshed stale holder or allowed stale send), 'degraded' (only "
        "refused calls, divergent reads, budget stops, refreshed holders), or 'healthy'",
        "first_seen": "first span (naive UTC)",
        "last_seen": "last span (naive UTC)",
    },  # fmt: skip
    row="one run (conversation id)",
    failure_mode=None,
    mast_category=None,
)
def run_summary(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Health of every run, combining every detector's findings.

    A count above its baseline-calibrated ``count_per_run:<detector>`` threshold (0 until
    calibrated) makes the run fail.
    """
    base = run_sql(conn, "run_summary", window, filters).set_index("run_id", drop=False)
    allowed = _count_thresholds(conn)
    failing = pd.Series(False, index=base.index)
    degraded = base["rejections"] > 0
    findings = {name: run_metric(conn, name, window, filters) for name in COUNTED_DETECTORS}
    for name, frame in findings.items():
        base[f"{name}_count"] = _counts_by_run(frame).reindex(base.index, fill_value=0).astype("int64")
        over = base[f"{name}_count"] > allowed.get(name, 0.0)
        if name in FAILING_DETECTORS:
            failing |= over
        else:
            degraded |= over
    holders = findings["context_drift_holders"]
    unrefreshed = holders[~holders["refreshed"].astype(bool)] if not holders.empty else holders
    base["stale_holders_unrefreshed"] = _counts_by_run(unrefreshed).reindex(base.index, fill_value=0)
    sends = run_metric(conn, "stale_policy_sends", window, filters)
    base["stale_policy_sends_count"] = _counts_by_run(sends).reindex(base.index, fill_value=0)
    allowed_sends = sends[sends["allowed"].astype(bool)] if not sends.empty else sends
    base["stale_sends_allowed"] = _counts_by_run(allowed_sends).reindex(base.index, fill_value=0)
    goals = run_metric(conn, "goal_divergence", window, filters)
    drifted = goals[goals["drifted"].astype(bool)] if not goals.empty else goals
    base["drifted_subtasks"] = _counts_by_run(drifted).reindex(base.index, fill_value=0)
    worst = goals.groupby("run_id")["divergence"].max() if not goals.empty else pd.Series(dtype=float)
    base["worst_divergence"] = worst.reindex(base.index)
    failing |= (base["stale_sends_allowed"] > 0) | (base["drifted_subtasks"] > 0)
    failing |= base["stale_holders_unrefreshed"] > 0
    degraded |= base["stale_policy_sends_count"] > 0
    base["verdict"] = "healthy"
    base.loc[degraded, "verdict"] = "degraded"
    base.loc[failing, "verdict"] = "failing"
    return base.reset_index(drop=True)
