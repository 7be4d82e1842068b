"""Constraint-ledger detectors: where each constraint of an origin task was carried or lost."""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics._evidence import EVIDENCE, TIMES
from analytics.registry import register
from analytics.sql_loader import run_sql
from analytics.text_lists import as_text_lists
from analytics.types import Filters, Window

_LEDGER_COLUMNS = {
    "origin_task_id": "root task of the delegation chain (driftscope.task.origin_id)",
    "constraint_id": "constraint id from the origin task's ledger",
    "hop": "delegation depth (driftscope.hop)",
    "status": "'carried', 'waived', 'missing' (dropped without waiver) or 'missing_after_waiver'",
    "unwaived_drop": "True when the constraint is missing here and was never waived up to this hop",
    "waiver_reason": "reason given for the waiver at this hop, if waived",
    "last_hop_seen": "last hop where the constraint was carried (None if never)",
    **EVIDENCE,
    "agents": "delegating agents at this hop",
    "delegate_to": "receiving agents at this hop",
    **TIMES,
}


@register(
    "constraint_ledger",
    description="Constraint x hop matrix per origin task: carried, waived with reason, or missing.",
    columns=_LEDGER_COLUMNS,
    row="one constraint x hop of one origin task",
    failure_mode="constraints lost along delegation chains",
    mast_category="specification issues",
    kept="origin_task_id",
    order=[("origin_task_id", False), ("constraint_id", False), ("hop", False)],  # fmt: skip
)
def constraint_ledger(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """The ledger matrix; the dashboard pivots it to constraints x hops. Its lists are Arrow lists
    (``analytics.text_lists``: a stored ledger is read back without a Python string per span id)."""
    ledger = run_sql(conn, "constraint_ledger", window, filters)
    return as_text_lists(ledger, ("span_ids", "agents", "delegate_to"))


@register(
    "constraint_drops",
    description="Constraints that disappeared from a delegation without a waiver: hop and agent.",
    columns={
        "origin_task_id": "root task of the delegation chain",
        "constraint_id": "constraint that was dropped",
        "hop": "first hop where it went missing without a waiver",
        **EVIDENCE,
        "agents": "delegating agents that dropped it at that hop",
        "agent": "the (first) delegating agent that dropped it",
        "delegate_to": "agents that received the delegation without it",
        "last_hop_seen": "last hop where it was still carried (None if never)",
        **TIMES,
    },
    row="one dropped constraint of one origin task",
    failure_mode="constraint dropped in delegation (information withholding)",
    mast_category="inter-agent misalignment",
    title="constraint dropped on delegation",
    findings=True,
    needs=(
        "delegations carrying a constraint ledger: `driftscope.constraints.ledger` on the origin "
        "task, `driftscope.constraints.carried` or `driftscope.constraints.waived` on each hop "
        "(`driftscope.hop`)"
    ),
    counted=True,
    failing=True,
    page="constraints",
    kept="origin_task_id",
    order=[("origin_task_id", False), ("constraint_id", False)],  # fmt: skip
)
def constraint_drops(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """First unwaived disappearance of each constraint of each origin task."""
    return run_sql(conn, "constraint_drops", window, filters)
