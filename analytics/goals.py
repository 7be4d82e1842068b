"""Goal divergence: how far each subtask's statement drifted from the root goal.

Scoring is per distinct (raw root-goal text, raw subtask text) pair, not per span: a pair's task
statements are extracted (``analytics.tasks``), embedded through the cache
(``analytics.embeddings``) and its ``1 - cosine`` is stored in table ``goal_scores`` by the
embedding worker through the single writer (a connection without the table, e.g. a read-only
copy of an older file, gets a temporary one). A detector call never writes the database: pairs
it has to score itself go to its connection's temporary ``goal_scores_local``.
The SQL (``analytics/sql/goal_*.sql`` around the shared ``_goal_subtasks.sql``) joins the stored
scores back to the subtasks, so a warm call is one query:

* ``goal_divergence`` (detector): the drifted subtasks only, each with its span ids;
* ``goal_divergence_distribution`` (registered, not a detector): how many subtasks sit at each
  (hop, divergence), for the goal-drift chart and the calibration histogram;
* ``goal_run_stats``: drifted subtasks and worst divergence per run, for ``run_summary``;
* ``goal_pairs``: every subtask with its score, for calibration.

Texts the embedding worker has not embedded yet are embedded on demand by the call itself (that
call then waits for the model), once per distinct text per process (the vectors stay in this
process's memory, the scores in the connection's temporary table), except on a connection marked
``goal_refresh.read_stored_scores_only`` (serve's materializer while the worker runs): there the
unscored pairs are left out, and the worker's stored scores log the runs to recompute.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics._evidence import EVIDENCE, THRESHOLD, TIMES
from analytics.embeddings import BATCH_SIZE, MODEL_NAME, embed_counting, text_hash
from analytics.engine import has_tables, is_clickhouse
from analytics.goal_refresh import log_rescored, rescored_runs, stored_scores_only
from analytics.materialize import (
    PARTS,
    TABLE_PREFIX,
    Maintained,
    detector_compute,
    maintain,
    maintain_with,
    read_findings,
    read_findings_arrow,
    run_scope,
    spans_of_no_run,
)
from analytics.registry import register
from analytics.sql_loader import (
    expand_fragments,
    filter_params,
    load_sql,
    memory_cursor,
    query_arrow,
    query_df,
    query_tables,
    quote_identifier,
)
from analytics.tasks import EXTRACTION_VERSION, extract_task
from analytics.thresholds import current_threshold
from analytics.types import Filters, Window, WriteFn

logger = logging.getLogger(__name__)


# The model's float32 output differs by ~1e-7 with batch composition (padding), so the same text
# pair embedded in two processes can differ in the 7th decimal; results are rounded to this.
DIVERGENCE_DECIMALS = 4
SCORER = f"{MODEL_NAME};tasks=v{EXTRACTION_VERSION}"
_RAW = ["_root_raw", "_subtask_raw"]
_SCORES_COLUMNS = """
    root_hash VARCHAR NOT NULL, subtask_hash VARCHAR NOT NULL, scorer VARCHAR NOT NULL,
    root_goal VARCHAR, subtask VARCHAR, divergence DOUBLE, created_at TIMESTAMP NOT NULL,
    PRIMARY KEY (root_hash, subtask_hash, scorer)"""
_SCORES_DDL = f"CREATE TEMP TABLE IF NOT EXISTS goal_scores ({_SCORES_COLUMNS})"
_LOCAL_SCORES_DDL = f"CREATE TEMP TABLE IF NOT EXISTS goal_scores_local ({_SCORES_COLUMNS})"
# ClickHouse: the same columns in a temporary table of the store's session.
_CH_SCORE_TYPES = ("String", "String", "String", "String", "String", "Float64", "DateTime64(6)")
_CH_LOCAL_SCORES_DDL = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS goal_scores_local (root_hash String, subtask_hash String, "
    "scorer String, root_goal Nullable(String), subtask Nullable(String), divergence Nullable(Float64), "
    "created_at DateTime64(6)) ENGINE = Memory"
)
# The goal-drift chart draws a line per delegation chain up to this many chains in the window,
# else the distribution per hop (goal_divergence_distribution returns rows to match).
MAX_CHART_CHAINS = 40


def cosine_divergence(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Row-wise ``1 - cos`` of two matrices of L2-normalised vectors."""
    if len(left) == 0:
        return np.zeros(0, dtype=np.float64)
    left, right = np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64)
    return 1.0 - np.einsum("ij,ij->i", left, right)


def ensure_scores_table(conn: duckdb.DuckDBPyConnection) -> None:
    """Make ``goal_scores`` resolvable (the migrated table, else a temporary one) and create the
    temporary ``goal_scores_local`` for scores this connection cannot store."""
    if is_clickhouse(conn):  # goal_scores comes from `driftscope clickhouse init`
        conn.execute(_CH_LOCAL_SCORES_DDL)
        return
    if not has_tables(conn, "goal_scores"):
        conn.execute(_SCORES_DDL)
    conn.execute(_LOCAL_SCORES_DDL)


def _goal_query(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window,
    filters: Filters,
    ingested_after: datetime | None = None,
    span_condition: str | None = None,
    **extra,
) -> pd.DataFrame:
    """Goal SQL ``name`` (``span_condition`` as in ``sql_loader.expand_fragments``)."""
    ensure_scores_table(conn)
    params = filter_params(window, filters)
    params.update(ingested_after=ingested_after, scorer=SCORER, **extra)
    return query_df(conn, load_sql(name, span_condition), params)


def _subtask_rows(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    ingested_after: datetime | None = None,
    threshold: float | None = None,
) -> pd.DataFrame:
    """The subtasks of ``goal_divergence.sql`` (those above ``threshold``; all when None), their
    pairs scored first when some have no stored score."""
    frame = _scored_query(
        conn, "goal_divergence", window, filters, ingested_after=ingested_after, threshold=threshold
    )
    return _without_empty_row(frame, "trace_id")


def _without_empty_row(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """``frame`` without the row a statement returns only to carry ``pending`` (``key`` NULL),
    typed as DuckDB types a statement's empty answer: that row's NULLs made its integer columns
    pandas' nullable ones (``Int32``), where no row gives numpy's (``int32``)."""
    rows = frame[frame[key].notna()]
    if len(rows) == len(frame):
        return frame
    rows = rows.reset_index(drop=True)
    if rows.empty:
        nullable = {
            column: dtype.numpy_dtype
            for column, dtype in rows.dtypes.items()
            if isinstance(dtype, pd.api.extensions.ExtensionDtype)
            and hasattr(dtype, "numpy_dtype")
            and not isinstance(dtype, (pd.StringDtype, pd.ArrowDtype))
        }
        rows = rows.astype(nullable) if nullable else rows
    return rows


def _scored_query(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window,
    filters: Filters,
    ingested_after: datetime | None = None,
    span_condition: str | None = None,
    **extra,
) -> pd.DataFrame:
    """Run goal SQL ``name`` (whose rows carry ``pending``, the unscored pairs in the window);
    when pairs are pending, score them first (the distinct text pairs only: ``goal_pending``,
    under the same ``span_condition``) and run it again, unless ``conn`` reads stored scores
    only (then the unscored pairs stay out of the answer). ``pending`` is dropped; rows without
    data are left to the caller."""
    frame = _goal_query(conn, name, window, filters, ingested_after, span_condition, **extra)
    if len(frame) and frame["pending"].iloc[0] > 0 and not stored_scores_only(conn):
        pending = _goal_query(
            conn, "goal_pending", window, filters, ingested_after, span_condition, pending_limit=None
        )
        score_raw_pairs(conn, pending)
        frame = _goal_query(conn, name, window, filters, ingested_after, span_condition, **extra)
    return frame.drop(columns="pending")


def score_pairs(
    roots: list[str],
    subtasks: list[str],
    conn: duckdb.DuckDBPyConnection | None = None,
    threads: int | None = None,
) -> np.ndarray:
    """``1 - cos`` between each root goal and subtask statement, embedding each distinct text once."""
    return _score_statements(roots, subtasks, conn, threads)[0]


def _score_statements(
    roots: list[str],
    subtasks: list[str],
    conn: duckdb.DuckDBPyConnection | None,
    threads: int | None = None,
    batch_size: int = BATCH_SIZE,
    write: WriteFn | None = None,
) -> tuple[np.ndarray, int]:
    distinct = list(dict.fromkeys([*roots, *subtasks]))
    if not distinct:
        return np.zeros(0), 0
    vectors, embedded = embed_counting(distinct, conn, batch_size, threads, write)
    index = {text: row for row, text in enumerate(distinct)}
    left = vectors[[index[text] for text in roots]]
    right = vectors[[index[text] for text in subtasks]]
    return cosine_divergence(left, right), embedded


def score_raw_pairs(
    conn: duckdb.DuckDBPyConnection,
    pairs: pd.DataFrame,
    threads: int | None = None,
    batch_size: int = BATCH_SIZE,
    strict: bool = False,
    write: WriteFn | None = None,
) -> tuple[pd.DataFrame, int]:
    """Score distinct raw (``_root_raw``, ``_subtask_raw``) pairs.

    With ``write`` (the process's single writer) the scores and new vectors are stored in
    ``goal_scores`` / ``embeddings``, the runs of the scored subtasks logged as a change in the
    scores' transaction (``goal_refresh.log_rescored``); without it (a read: detector calls never
    write the database) they go to this connection's temporary ``goal_scores_local`` only. Returns
    the pairs with ``root_goal``, ``subtask`` (None when the text holds no task statement) and
    ``divergence``, and how many texts the model embedded now. A failed store is logged and the
    scores are still returned, unless ``strict``.
    """
    pairs = pairs[_RAW].drop_duplicates().reset_index(drop=True)
    raw = pd.unique(pd.concat([pairs["_root_raw"], pairs["_subtask_raw"]]))
    tasks = {text: extract_task(text) for text in raw}  # per distinct text
    pairs["root_goal"] = pairs["_root_raw"].map(tasks)
    pairs["subtask"] = pairs["_subtask_raw"].map(tasks)
    usable = pairs["root_goal"].notna() & pairs["subtask"].notna()
    scores, embedded = _score_statements(
        list(pairs.loc[usable, "root_goal"]),
        list(pairs.loc[usable, "subtask"]),
        conn,
        threads,
        batch_size,
        write,
    )
    pairs["divergence"] = np.nan
    pairs.loc[usable, "divergence"] = scores
    if pairs.empty:
        return pairs, embedded
    table = _scores_table(pairs)
    try:
        if write is not None:
            subtasks = pairs["_subtask_raw"].tolist()
            write(lambda c: (_insert_scores(c, table, "goal_scores"), log_rescored(c, subtasks)))
        else:
            _insert_scores(conn, table, "goal_scores_local")
    except duckdb.Error as error:
        if strict:
            raise
        logger.debug("goal scores not stored: %s", error)
    return pairs, embedded


def _scores_table(pairs: pd.DataFrame) -> pa.Table:
    now = datetime.now(UTC).replace(tzinfo=None)
    table = pa.table(
        {
            "root_hash": pa.array([text_hash(text) for text in pairs["_root_raw"]], pa.string()),
            "subtask_hash": pa.array([text_hash(text) for text in pairs["_subtask_raw"]], pa.string()),
            "scorer": pa.array([SCORER] * len(pairs), pa.string()),
            "root_goal": pa.array(pairs["root_goal"].tolist(), pa.string()),
            "subtask": pa.array(pairs["subtask"].tolist(), pa.string()),
            "divergence": pa.array(
                pairs["divergence"].to_numpy(dtype=np.float64), pa.float64(), from_pandas=True
            ),
            "created_at": pa.array([now] * len(pairs), pa.timestamp("us")),
        }
    )
    return table


def _insert_scores(conn: duckdb.DuckDBPyConnection, table: pa.Table, target: str) -> None:
    """Insert scores into ``goal_scores`` (through the writer) or this connection's temporary
    ``goal_scores_local`` (a read keeps what it scored to itself)."""
    ensure_scores_table(conn)
    if is_clickhouse(conn):
        if target != "goal_scores_local":
            raise ValueError("goal scores are stored in ClickHouse by its writer, not by analytics")
        columns = ", ".join(f"__r.{i + 1}" for i in range(table.num_columns))
        arrays = ", ".join(f"{{c{i}:Array(Nullable({kind}))}}" for i, kind in enumerate(_CH_SCORE_TYPES))
        conn.execute(
            f"INSERT INTO goal_scores_local SELECT {columns} FROM (SELECT arrayJoin(arrayZip({arrays})) AS __r)",
            {f"c{i}": column.to_pylist() for i, column in enumerate(table.columns)},
        )
        return
    conn.register("_new_goal_scores", table)
    try:
        conn.execute(f"INSERT OR IGNORE INTO {target} SELECT * FROM _new_goal_scores")
    finally:
        conn.unregister("_new_goal_scores")


def goal_pairs(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    ingested_after: datetime | None = None,
) -> pd.DataFrame:
    """Every subtask row (drifted or not) with its ``root_goal`` and ``subtask`` task statements
    and unrounded ``divergence``: the scores calibration takes its baseline from.

    Pairs without a stored score are scored (and stored) first. ``ingested_after`` keeps subtask
    spans stored at or after that time. One row per subtask, so this grows with the window; the
    detector and the dashboard read ``goal_divergence`` and ``goal_divergence_distribution``.
    """
    return _subtask_rows(conn, window, filters, ingested_after)


def score_pending_pairs(
    conn: duckdb.DuckDBPyConnection,
    limit: int = 2048,
    ingested_after: datetime | None = None,
    batch_size: int = BATCH_SIZE,
    threads: int | None = None,
    write: WriteFn | None = None,
) -> tuple[int, int]:
    """Score up to ``limit`` distinct pairs of subtask spans (stored since ``ingested_after``)
    that have no stored score and store them through ``write``; return (pairs scored, texts
    embedded). Raises if it cannot store."""
    pending = _goal_query(conn, "goal_pending", Window(), Filters(), ingested_after, pending_limit=limit)
    if pending.empty:
        return 0, 0
    scored, embedded = score_raw_pairs(conn, pending, threads, batch_size, strict=True, write=write)
    return len(scored), embedded


def goal_run_stats(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    threshold: float,
) -> pd.DataFrame:
    """Per run (index ``run_id``): ``drifted_subtasks`` (subtasks whose divergence, rounded to
    4 decimals, is above ``threshold``) and ``worst_divergence`` (the highest divergence of its
    subtasks, rounded). Runs without a scored subtask are absent. Computed in SQL, no row per
    subtask; pairs without a stored score are scored first."""
    frame = _scored_query(conn, "goal_run_stats", window, filters, threshold=threshold)
    frame = frame[frame["run_id"].notna()]
    return frame.set_index("run_id")[["drifted_subtasks", "worst_divergence"]]


def _with_threshold(conn: duckdb.DuckDBPyConnection, frame: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    info = current_threshold(conn, "goal_divergence")
    frame["threshold"] = info.value
    frame["threshold_version"] = info.version
    frame["calibrated"] = info.calibrated
    return frame, info.value


@register(
    "goal_divergence",
    description="Subtasks whose statement drifted from the root goal: 1 - cosine(root goal, "
    "subtask statement) above the threshold (all-MiniLM-L6-v2).",
    columns={
        **EVIDENCE,
        "agent": "agent that delegated or ran the subtask",
        "delegate_to": "receiving agent of a delegation, if any",
        "origin_task_id": "root task of the chain, if known",
        "hop": "delegation depth, if known",
        "root_goal": "root goal task statement (extracted)",
        "subtask": "subtask task statement (extracted)",
        "source": "'driftscope' (driftscope.goal.*) or 'inferred' (top agent/chain span input vs nested agent inputs)",
        "divergence": "1 - cosine similarity of the two statements, 0..2 (0 = same meaning), 4 decimals",
        **THRESHOLD,
        "drifted": "divergence > threshold (always true: only drifted subtasks are listed)",
        **TIMES,
    },
    row=(
        "one drifted subtask: the spans of one agent in one run carrying the same subtask "
        "statement under the same root goal (a delegation, a nested agent, the tool calls working "
        "on it), whose divergence is above the threshold; span_ids lists them. Subtasks at or "
        "below the threshold are counted in goal_divergence_distribution"
    ),
    failure_mode="task derailment: a subtask drifted away from the root goal",
    mast_category="inter-agent misalignment",
    title="goal drift along delegation",
    findings=True,
    needs=(
        "delegations with goal texts (`driftscope.goal.root` and `driftscope.goal.text`, or a "
        "framework's task description) that diverge from the root goal past its threshold"
    ),
    flag_column="drifted",
    failing=True,
    review_unless="calibrated",
    rank_column="divergence",
    page="goal_drift",
    blind_spots=(
        "Embedding divergence compares what an agent was asked to do with the root goal, not what "
        "it then did: an on-topic subtask worked with wrong or useless steps (the wrong year, the "
        "wrong tool, an answer from memory) scores low and is never flagged here; it shows up, if "
        "at all, as loops, runaway runs or errors."
    ),
    kept="run_id",
    order=[("first_seen", False), ("trace_id", False), ("span_ids", False)],  # fmt: skip
)
def goal_divergence(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """The subtasks whose statement diverges from its root goal by more than the threshold.

    While the default 0.45 is in force (``calibrated`` False) the flag only suits short, clean
    task statements; calibrate on labelled pairs or a healthy baseline window. Only drifted
    subtasks are rows (the SQL drops the others before it builds span lists); the spread of all
    subtasks is ``goal_divergence_distribution``.
    """
    info = current_threshold(conn, "goal_divergence")
    frame = _subtask_rows(conn, window, filters, threshold=info.value)
    frame["divergence"] = np.round(frame["divergence"].to_numpy(dtype=np.float64), DIVERGENCE_DECIMALS)
    frame["threshold"] = info.value
    frame["threshold_version"] = info.version
    frame["calibrated"] = info.calibrated
    frame["drifted"] = True
    return frame


# Kept per run as registered, and also recomputed for the runs the worker's stored scores name.
maintain_with(
    "goal_divergence", detector_compute(goal_divergence), extra_keys=rescored_runs("goal_divergence")
)


@register(
    "goal_divergence_distribution",
    description="How the goal divergence of every subtask is spread: subtasks per hop and "
    "divergence (per delegation chain when there are few), for charts and calibration.",
    columns={
        "chain": f"delegation chain (origin task, else run) when the window holds at most "
        f"{MAX_CHART_CHAINS} chains, else None (all chains together)",
        "hop": "delegation depth, if known",
        "divergence": "1 - cosine similarity of root goal and subtask statement, 4 decimals",
        "subtask": "subtask task statement when rows are per chain, else None",
        "subtasks": "subtasks with this hop and divergence (and chain and statement)",
        "chains": "delegation chains in the window",
        **THRESHOLD,
        "drifted": "divergence > threshold",
    },
    row=(
        "one (hop, divergence) value with the number of subtasks that have it; one (chain, hop, "
        f"divergence, subtask statement) when the window holds at most {MAX_CHART_CHAINS} chains"
    ),
    failure_mode=None,
    mast_category=None,
    kept="whole",
)
def goal_divergence_distribution(
    conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters
) -> pd.DataFrame:
    """Subtask counts per (hop, divergence): the goal-drift chart and the divergence histogram
    without a row per subtask. Its ``subtasks`` summed over ``drifted`` rows equal the rows of
    ``goal_divergence``."""
    frame = _scored_query(conn, "goal_divergence_distribution", window, filters, max_chains=MAX_CHART_CHAINS)
    return _spread_frame(conn, frame)


def _spread_frame(conn: duckdb.DuckDBPyConnection, frame: pd.DataFrame) -> pd.DataFrame:
    """The distribution's rows from its statement's (without the row that only carries
    ``pending``), with the threshold and whether each divergence is over it."""
    frame = frame[frame["subtasks"].notna()].reset_index(drop=True)
    frame["subtasks"] = frame["subtasks"].astype("int64")
    frame["chains"] = frame["chains"].astype("int64")
    frame, threshold = _with_threshold(conn, frame)
    frame["drifted"] = frame["divergence"].to_numpy(dtype=np.float64) > threshold
    return frame


# goal_divergence_distribution depends on every run, so it is kept whole; its first step (each
# run's scored subtasks counted per chain, hop, divergence and statement: a few rows a run) is
# kept per run, and the whole answer sums that table with the subtasks of no run (counted at
# once) instead of resolving every stored statement to its root and score each time it is due.
# The sum runs in process over the part's rows read through ``read_findings``, so a ClickHouse
# store keeps it the same way.
RUNS_PART = "goal_divergence_runs"
_NO_RUN = "run_id IS NULL"


def _run_counts(
    conn: duckdb.DuckDBPyConnection, filters: Filters, span_condition: str | None = None
) -> pd.DataFrame:
    """``RUNS_PART``'s statement: the subtask counts of ``filters``' spans."""
    frame = _scored_query(conn, RUNS_PART, Window(), filters, span_condition=span_condition)
    return _without_empty_row(frame, "subtasks")


def _runs_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    """The part's rows of runs ``keys`` (every run when None; the subtasks of no run are counted
    where they are summed: no change names them)."""
    frame = _run_counts(conn, run_scope(conn, keys))
    return frame[frame["run_id"].notna()].reset_index(drop=True)


def _spread_from_runs(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    """goal_divergence_distribution over every stored span: ``RUNS_PART``'s rows summed with the
    subtasks of no run (computed from the spans when that table cannot answer)."""
    columns = ["run_id", "chain", "hop", "divergence", "subtask", "subtasks"]
    if is_clickhouse(conn):
        summed = _spread_summed_in_clickhouse(conn)
        if summed is not None:
            return _spread_frame(conn, summed)
        found = read_findings(conn, RUNS_PART, columns=columns)
        runs = None if found is None else pa.Table.from_pandas(found, preserve_index=False)
    else:  # Arrow straight from DuckDB: the part of many small runs is millions of rows
        arrow = read_findings_arrow(conn, RUNS_PART, columns=columns)
        runs = None if arrow is None else arrow[0]
    if runs is None:
        return goal_divergence_distribution(conn, Window(), run_scope(conn, None))
    loose = runs.schema.empty_table()  # the subtasks of no run, if any span has none
    if spans_of_no_run(conn):
        counted = _run_counts(conn, run_scope(conn, None), span_condition=_NO_RUN)
        loose = pa.Table.from_pandas(counted[columns], preserve_index=False)
    frame = query_tables(
        "goal_divergence_spread", {"_counts": runs, "_loose": loose}, {"max_chains": MAX_CHART_CHAINS}
    )
    return _spread_frame(conn, frame)


_SPREAD_IN_CLICKHOUSE = """
WITH spread_counts AS (
    SELECT run_id::VARCHAR AS run_id, chain::VARCHAR AS chain, hop::INTEGER AS hop,
           divergence::DOUBLE AS divergence, subtask::VARCHAR AS subtask, subtasks::BIGINT AS subtasks
    FROM {table} WHERE {current}
),
{{goal_spread}}
SELECT s.chain, s.hop, s.divergence, s.subtask, s.subtasks, s.chains
FROM (SELECT 1) n
LEFT JOIN spread s ON true
ORDER BY s.chain NULLS FIRST, s.hop NULLS FIRST, s.divergence, s.subtask
"""


def _spread_summed_in_clickhouse(store) -> pd.DataFrame | None:
    """On ClickHouse: ``RUNS_PART``'s current rows summed where they are (goal_divergence_spread.sql
    over the part's rows, translated; read out, the part of 10M spans was 1.8M rows). None when
    the part cannot answer (not built, no subtask yet) or spans of no run exist (no part holds
    their subtasks): then they are summed in process."""
    from analytics.findings_clickhouse import current_rows  # noqa: PLC0415
    from analytics.read_clickhouse import ready as table_ready  # noqa: PLC0415

    found = table_ready(store, RUNS_PART)
    if found is None or not found[1] or spans_of_no_run(store):
        return None
    state, _ = found
    database = quote_identifier(store.database)
    sql = _SPREAD_IN_CLICKHOUSE.format(
        table=f"{database}.{quote_identifier(TABLE_PREFIX + RUNS_PART)}",
        current=current_rows(store, RUNS_PART, state.base, dialect="duckdb"),
    )
    table = query_arrow(store, expand_fragments(sql), {"max_chains": MAX_CHART_CHAINS})
    with memory_cursor() as mem:  # its few rows typed as the in-process sum gives them
        mem.register("_spread", table)
        return mem.execute(
            "SELECT chain::VARCHAR AS chain, hop::INTEGER AS hop, divergence::DOUBLE AS divergence, "
            "subtask::VARCHAR AS subtask, subtasks::BIGINT AS subtasks, chains::BIGINT AS chains FROM _spread"
        ).df()


# recomputed for the runs the change log names and those the worker's stored scores name
maintain(
    Maintained(
        RUNS_PART, "run_id", _runs_rows, (("run_id", False),), "1", extra_keys=rescored_runs(RUNS_PART)
    )
)
PARTS.add(RUNS_PART)
maintain_with("goal_divergence_distribution", _spread_from_runs, depends=(RUNS_PART,), portable=True)
