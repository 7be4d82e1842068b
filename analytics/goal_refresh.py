"""How the maintained goal results follow the scores the embedding worker stores.

In ``serve`` the embedding worker embeds new task texts and stores their pair scores in
``goal_scores`` through the single writer. The materializer must not embed the same texts again
in its pass (the findings lag would wait on the model, and ingest bursts would lose the cores),
so serve gives it a cursor marked with ``read_stored_scores_only``: on that cursor the goal SQL
leaves pairs without a stored score out of its answer, as it always does for unscored pairs,
instead of scoring them first (``analytics.goals``). Every other connection (reads, reports,
tests, ``serve --embeddings false``) still scores what is pending on demand.

Each write of stored scores also logs a ``rescore`` change in its transaction
(``log_rescored``): the runs with a subtask whose statement got a score, under partition
``RESCORED``. Only the goal results read those keys (``rescored_runs``, their ``extra_keys``),
so a score shared by thousands of runs (a task template) recomputes the goal tables and
run_summary of those runs, not every run-partitioned detector; the goal result kept whole
(the distribution) recomputes on any change.
"""

from __future__ import annotations

import duckdb

from analytics.engine import is_clickhouse
from analytics.materialize import ExtraKeys, log_change, read_states
from analytics.sql_loader import load_sql

# A DuckDB variable of the connection: set to 'stored', the goal SQL on it reads stored scores only.
SCORES_VARIABLE = "driftscope_goal_scores"
# The change_partitions partition of a rescore change: runs whose subtasks got a stored score.
RESCORED = "rescored_run_id"


def read_stored_scores_only(conn: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Mark ``conn`` (a cursor of its own: DuckDB variables are per connection) so the goal
    computations on it use stored scores only, never the model; return it."""
    conn.execute(f"SET VARIABLE {SCORES_VARIABLE} = 'stored'")
    return conn


def stored_scores_only(conn: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``conn`` was marked by ``read_stored_scores_only``."""
    if is_clickhouse(conn):
        return False
    ((value,),) = conn.execute(f"SELECT getvariable('{SCORES_VARIABLE}')").fetchall()
    return value == "stored"


def log_rescored(conn: duckdb.DuckDBPyConnection, subtasks: list[str]) -> None:
    """In the writer's transaction that stores scores of pairs with the raw subtask texts
    ``subtasks``: log a ``rescore`` change naming every run with a subtask of one of those texts.
    The runs are looked up in this transaction, so a run committed after the worker found its
    pending pairs is named too."""
    log_change(conn, "rescore", RESCORED, load_sql("goal_rescored_runs"), {"subtasks": subtasks})


def rescored_runs(name: str) -> ExtraKeys:
    """The ``extra_keys`` of the result ``name`` (partitioned by run): the runs rescore changes
    named after the change its table reflects (those past the pass's target too: a superset)."""

    def keys(conn: duckdb.DuckDBPyConnection) -> list[str]:
        state = read_states(conn).get(name)
        if state is None or state.seq is None:
            return []
        return [
            row[0]
            for row in conn.execute(
                "SELECT DISTINCT key FROM change_partitions WHERE partition = $partition AND seq > $seq",
                {"partition": RESCORED, "seq": state.seq},
            ).fetchall()
        ]

    return keys
