"""repeated_calls kept live by (run, tool) group, not by run.

A loop is one (run, agent, tool) group's linked calls, so a commit changes the loops of the
groups its spans are (or can change) calls of, and no other. The collector logs those groups as
'run_tool' keys (collector.changes); ``GROUPS`` keeps every group's loops (before ping-pongs
drop any), formed from the group's kept calls (``analytics.loops_fold``, which folds each
commit's calls into them): a pass reads only the calls of components big enough to be a loop.

repeated_calls' own table is then, per touched run, the run's loops from ``GROUPS`` without the
ones a ping-pong of the run reports (``drop_bounced``), with the threshold they were linked at:
no call is read again. Its full computation (``analytics.loops.repeated_calls``) stays what a
window that cuts runs computes and what the tests hold both tables to.
"""

from __future__ import annotations

import duckdb
import pandas as pd

import analytics.loops as loops
import analytics.loops_fold as loops_fold
from analytics.materialize import (
    PARTS,
    TABLE_PREFIX,
    Maintained,
    maintain,
    maintain_with,
    pandas_type,
    ready,
    run_scope,
    run_tool_where,
    table_exists,
)
from analytics.sql_loader import load_sql, query_arrow, quote_identifier
from analytics.thresholds import current_threshold
from analytics.types import Window

GROUPS = "repeated_calls_groups"
_ORDER = (("first_seen", False), ("run_id", False), ("tool_name", False))


def _group_loops(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    """The loops of the (run, tool) groups ``keys`` name (every group when None), before
    ping-pongs drop any: the components of their kept calls (``analytics.loops_fold``), formed
    where they are (loop_groups.sql, ``loops.loop_rows``' twin)."""
    where, params = run_tool_where(keys) if keys is not None else ("true", {})
    sql = load_sql("loop_groups").replace("{kept_calls}", loops_fold.TABLE).replace("{keys}", where)
    table = query_arrow(conn, sql, {**params, "min_calls": loops.MIN_REPEATS})
    return table.to_pandas(types_mapper=pandas_type)


def _run_loops(
    conn: duckdb.DuckDBPyConnection, partition: str | None, runs: list[str] | None
) -> pd.DataFrame:
    """repeated_calls' rows of ``runs`` (all when None) from ``GROUPS``' table; the full
    computation when that table cannot say (not built, or a group failed)."""
    state = ready(conn, GROUPS)
    if state is None or state.failed_keys:
        scope = run_scope(conn, runs)
        return loops.repeated_calls(conn, Window(), scope)
    table = quote_identifier(TABLE_PREFIX + GROUPS)
    if not table_exists(conn, TABLE_PREFIX + GROUPS):
        found = _empty()
    else:
        where = "" if runs is None else "WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))"
        found = (
            conn.sql(
                f"SELECT * EXCLUDE (_pos) FROM {table} {where} ORDER BY first_seen, run_id, tool_name, _pos",
                params={} if runs is None else {"runs": runs},
            )
            .to_arrow_table()
            .to_pandas(types_mapper=pandas_type)
        )
    scope = run_scope(conn, runs)
    bounces = loops.ping_pong(conn, Window(), scope)
    info = current_threshold(conn, "near_duplicate_similarity")
    return loops._with_threshold(loops.drop_bounced(found.reset_index(drop=True), bounces), info)


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in loops._EMPTY_LOOP_TYPES.items()})


maintain(
    Maintained(
        GROUPS,
        "run_tool",
        _group_loops,
        _ORDER,
        "4",
        depends=(loops_fold.CALLS,),
        touched=loops_fold.loops_changed,
    )
)
PARTS.add(GROUPS)
maintain_with("repeated_calls", _run_loops, depends=(GROUPS,))
