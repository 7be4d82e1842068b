"""Constraint-ledger detectors: where each constraint of an origin task was carried or lost.

Both are kept per origin task. Their cells (``_constraint_cells.sql``) are made of an origin
task's delegations and ledger declarations, which the materializer keeps as a table of their
own (``constraint_spans``, one row per such span: ``_constraint_spans.sql``), folding each
change's new and changed spans into it. A pass then computes the ledger and the drops of the
origin tasks it touched from those narrow rows instead of scanning every stored span twice for
each (the regex over free-text hand-offs runs once per span, when it is committed). The same
rows come from the spans when that table is not built, and every read a window or filter cuts
computes from the spans (tests/analytics/test_materialize.py holds both to a full computation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import duckdb
import pandas as pd
import pyarrow as pa

import analytics.materialize as materialize
from analytics._evidence import EVIDENCE, TIMES
from analytics.materialize import (
    PARTS,
    TABLE_PREFIX,
    Maintained,
    SpanChanges,
    detector_compute,
    maintain,
    maintain_with,
    run_chunks,
    table_exists,
)
from analytics.registry import register
from analytics.sql_loader import (
    _read,
    expand_fragments,
    filter_params,
    load_sql,
    query_arrow,
    query_df,
    run_sql,
)
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


SPANS = "constraint_spans"
_SPAN_COLUMNS = (
    "TraceId, SpanId, run_id, agent_id, delegate_to, Timestamp, origin_task_id, hop, constraints_waived, "
    "waiver_reasons, constraints_ledger, is_delegation, constraints_carried"
)
# The table's rows of the origin tasks asked for, standing in for _constraint_spans.sql
_FROM_TABLE = (
    f"SELECT {_SPAN_COLUMNS} FROM {TABLE_PREFIX}{SPANS} "
    "WHERE ($origin_tasks::VARCHAR[] IS NULL OR origin_task_id = ANY($origin_tasks::VARCHAR[]))"
)
# Rows of the first build's parts: a chunk of runs at a time (materialize.run_chunks)
BUILD_CHUNK_SPANS = 500_000


def _span_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, changes: SpanChanges | None
) -> pa.Table:
    """The table's rows of every span (``changes`` None) or of the spans ``changes`` lists, as
    Arrow (each column its SQL type, so parts concatenate into one table)."""
    params = filter_params(Window(), Filters())
    if changes is None:
        params.update(after=None, upto=None)
    else:  # the changed spans, from the row groups since their oldest ingest
        params.update(changes.params(), ingested_after=changes.since)
    return query_arrow(conn, load_sql(SPANS), params)


def _build_spans(conn: duckdb.DuckDBPyConnection, target: int) -> Iterator[pa.Table]:
    for chunk in run_chunks(conn, BUILD_CHUNK_SPANS):
        params = filter_params(Window(), Filters(runs=tuple(chunk)))
        params.update(after=None, upto=None)
        yield query_arrow(conn, load_sql(SPANS), params)


def _from_table_sql(name: str) -> str:
    """Statement ``name`` (constraint_ledger / constraint_drops) over the table's rows."""
    text = _read(name).replace("{constraint_cells}", _read("_constraint_cells"))
    return expand_fragments(text.replace("{constraint_spans}", _FROM_TABLE))


def _kept(
    name: str,
    detector: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    finish: Callable[[pd.DataFrame], pd.DataFrame],
):
    """``name``'s rows of the origin tasks ``keys`` (every one when None) from the
    ``constraint_spans`` table, brought up to date first (``depends``); from the spans when that
    table is not built."""
    from_spans = detector_compute(detector)

    def compute(
        conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
    ) -> pd.DataFrame:
        if materialize.ready(conn, SPANS) is None or not table_exists(conn, TABLE_PREFIX + SPANS):
            return from_spans(conn, partition, keys)
        scope = Filters() if keys is None else Filters(origin_tasks=tuple(keys))
        return finish(query_df(conn, _from_table_sql(name), filter_params(Window(), scope)))

    return compute


maintain(
    Maintained(SPANS, "span", _span_rows, (("TraceId", False), ("SpanId", False)), "1", build=_build_spans)
)
PARTS.add(SPANS)
maintain_with(
    "constraint_ledger",
    _kept(
        "constraint_ledger",
        constraint_ledger,
        lambda f: as_text_lists(f, ("span_ids", "agents", "delegate_to")),
    ),
    depends=(SPANS,),
)
maintain_with("constraint_drops", _kept("constraint_drops", constraint_drops, lambda f: f), depends=(SPANS,))
