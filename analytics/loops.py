"""Loop detectors: repeated (exact and near-duplicate) tool calls, ping-pong delegation,
step-budget exhaustion and duplicate side effects."""

from __future__ import annotations

import logging

import duckdb
import numpy as np
import pandas as pd

from analytics._evidence import EVIDENCE, THRESHOLD, TIMES
from analytics.registry import register
from analytics.sql_loader import run_sql
from analytics.thresholds import current_threshold
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

# A loop is the same (or nearly the same) call executed 3+ times; calls a guard refused did not
# execute, so they count towards a loop only when 3+ of them were refused (the agent hammering
# a guard). A retry after one failure, or one re-check, is normal.
MIN_REPEATS = 3
# Ping-pong: 4+ alternating hand-offs (A -> B -> A -> B); a single return hand-off is normal.
# Inferred from agent turns (no delegate spans), 6+: a supervisor going back to the same worker
# for a second round is normal too.
MIN_PING_PONG_DELEGATIONS = 4
MIN_PING_PONG_INFERRED = 6


def connected_components(n: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Component label (smallest member index) of each of ``n`` nodes joined by edges.

    Vectorised min-label propagation: each round pushes the smaller label across every edge.
    """
    labels = np.arange(n)
    if len(left) == 0:
        return labels
    while True:
        before = labels.copy()
        low = np.minimum(labels[left], labels[right])
        np.minimum.at(labels, left, low)
        np.minimum.at(labels, right, low)
        labels = labels[labels]
        if np.array_equal(labels, before):
            return labels


def group_loops(calls: pd.DataFrame) -> pd.DataFrame:
    """Turn candidate calls (with ``similar_later`` edges) into one row per loop."""
    n = len(calls)
    pairs = calls[["call_idx", "similar_later"]].explode("similar_later").dropna()
    left = pairs["call_idx"].to_numpy(dtype=np.int64)
    right = pairs["similar_later"].to_numpy(dtype=np.int64)
    # call_idx identifies a call (its rowid, unordered and sparse): map it to its row position
    order = calls["call_idx"].to_numpy(dtype=np.int64)
    sorter = np.argsort(order, kind="stable")

    def position(idx: np.ndarray) -> np.ndarray:
        return sorter[np.searchsorted(order, idx, sorter=sorter)]

    labels = connected_components(n, position(left), position(right)) if n else np.array([], int)
    calls = calls.assign(loop=labels)
    calls["rejected"] = calls["rejected"].astype(bool)
    refused = calls.groupby("loop")["rejected"].transform("sum")
    executed = calls.groupby("loop")["rejected"].transform("size") - refused
    is_loop = (executed >= MIN_REPEATS) | (refused >= MIN_REPEATS)
    members = calls[is_loop].sort_values(["loop", "start_ns", "SpanId"])
    if members.empty:
        return pd.DataFrame(columns=_LOOP_COLUMNS)
    grouped = members.groupby("loop", sort=False)
    out = pd.DataFrame(
        {
            "trace_id": grouped["TraceId"].first(),
            "span_ids": grouped["SpanId"].agg(list),
            "run_id": grouped["run_id"].first(),
            "agent": grouped["agent"].first().replace({"": None}),
            "tool_name": grouped["tool_name"].first(),
            "kind": np.where(grouped["norm_args"].nunique() == 1, "exact", "near_duplicate"),
            "failing": grouped["failing"].first(),
            "calls": grouped.size(),
            "refused": grouped["rejected"].sum().astype(int),
            "distinct_arguments": grouped["norm_args"].nunique(),
            "min_similarity": grouped["min_similarity"].min().astype(float),
            "signature": grouped["norm_args"].first(),
            "first_seen": grouped["Timestamp"].min(),
            "last_seen": grouped["Timestamp"].max(),
        }
    )
    return out.sort_values(["first_seen", "run_id", "tool_name"]).reset_index(drop=True)


_LOOP_COLUMNS = [
    "trace_id", "span_ids", "run_id", "agent", "tool_name", "kind", "failing", "calls", "refused",
    "distinct_arguments", "min_similarity", "signature", "first_seen", "last_seen",
]  # fmt: skip


@register(
    "repeated_calls",
    description="Loops of repeated tool calls: identical or near-identical arguments, same outcome.",
    columns={
        **EVIDENCE,
        "agent": "agent that repeated the call",
        "tool_name": "tool called",
        "kind": "'exact' (one normalized signature) or 'near_duplicate' (similar arguments)",
        "failing": "True when every call in the loop failed (error, rejected or status Error)",
        "calls": "number of calls in the loop (executed and refused)",
        "refused": "calls of the loop a guard refused (did not execute)",
        "distinct_arguments": "distinct normalized argument strings in the loop",
        "min_similarity": "lowest token-set Jaccard similarity that links a member, 0..1",
        "signature": "normalized arguments of the first call: its argument words, lower case, sorted",
        **TIMES,
        **THRESHOLD,
    },
    row="one loop (a group of repeated calls of one tool by one agent in one run)",
    failure_mode="step repetition: the agent retries the same call without progress",
    mast_category="specification issues",
)
def repeated_calls(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Exact and near-duplicate repeated tool calls, each loop reported once with its members."""
    info = current_threshold(conn, "near_duplicate_similarity")
    calls = run_sql(conn, "repeated_calls", window, filters, similarity=info.value)
    out = group_loops(calls)
    out["threshold"] = info.value
    out["threshold_version"] = info.version
    out["calibrated"] = info.calibrated
    return out


@register(
    "ping_pong",
    description="Delegations bouncing between the same two agents (A -> B -> A -> B ...).",
    columns={
        **EVIDENCE,
        "agents": "the two agents",
        "delegations": "consecutive hand-offs in the cycle",
        "round_trips": "delegations // 2",
        "source": "'driftscope' (delegate spans) or 'inferred' (changes of agent between agent turns)",
        **TIMES,
    },
    row="one ping-pong cycle in one run",
    failure_mode="delegation loop without progress",
    mast_category="inter-agent misalignment",
)
def ping_pong(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Maximal alternating hand-off sequences (4+ delegations, or 6+ inferred agent turns)."""
    return run_sql(
        conn,
        "ping_pong",
        window,
        filters,
        min_delegations=MIN_PING_PONG_DELEGATIONS,
        min_inferred=MIN_PING_PONG_INFERRED,
    )


@register(
    "budget_exhaustion",
    description="Agents that reached their step budget or were refused a step for budget.",
    columns={
        **EVIDENCE,
        "agent": "agent that exhausted its budget",
        "max_step": "highest driftscope.step reached",
        "budget_max_steps": "step budget in force (driftscope.budget.max_steps)",
        "budget_rejections": "steps refused with reject_reason = step_budget",
        **TIMES,
    },
    row="one agent in one run that hit its step budget",
    failure_mode="unaware of termination conditions",
    mast_category="specification issues",
)
def budget_exhaustion(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Runs whose agents hit their step budget."""
    return run_sql(conn, "budget_exhaustion", window, filters)


@register(
    "duplicate_side_effects",
    description="Side effects executed more than once in a run (same idempotency key or arguments).",
    columns={
        **EVIDENCE,
        "agents": "agents that executed it",
        "tool_name": "side-effecting tool",
        "matched_by": "'idempotency_key' or 'arguments'",
        "idempotency_key": "shared idempotency key (matched_by = idempotency_key)",
        "arguments": "normalized arguments (matched_by = arguments)",
        "executions": "times it was executed",
        **TIMES,
    },
    row="one repeated side effect in one run",
    failure_mode="duplicate side effect (double send / double charge)",
    mast_category="task verification",
)
def duplicate_side_effects(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Side effects executed twice or more, by key or by identical normalized arguments."""
    return run_sql(conn, "duplicate_side_effects", window, filters)
