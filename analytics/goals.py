"""Goal divergence: how far each subtask's statement drifted from the root goal.

Scoring is per distinct (raw root-goal text, raw subtask text) pair, not per span: a pair's task
statements are extracted (``analytics.tasks``), embedded through the cache
(``analytics.embeddings``) and its ``1 - cosine`` is stored in table ``goal_scores`` (migration
0004; a connection without it, e.g. a read-only copy of an older file, gets a temporary table).
The detector SQL joins the stored scores back to the subtask rows, so a warm call is one query.

Texts the embedding worker has not embedded yet are embedded on demand by the detector call
itself (that call then waits for the model), exactly once per distinct text; on a read-only
database the vectors and scores stay in this process's memory / temporary table.
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
from analytics.registry import register
from analytics.sql_loader import filter_params, load_sql, query_df
from analytics.tasks import EXTRACTION_VERSION, extract_task
from analytics.thresholds import current_threshold
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)


# The model's float32 output differs by ~1e-7 with batch composition (padding), so the same text
# pair embedded in two processes can differ in the 7th decimal; results are rounded to this.
DIVERGENCE_DECIMALS = 4
SCORER = f"{MODEL_NAME};tasks=v{EXTRACTION_VERSION}"
_RAW = ["_root_raw", "_subtask_raw"]
_SCORES_DDL = """
CREATE TEMP TABLE IF NOT EXISTS goal_scores (
    root_hash VARCHAR NOT NULL, subtask_hash VARCHAR NOT NULL, scorer VARCHAR NOT NULL,
    root_goal VARCHAR, subtask VARCHAR, divergence DOUBLE, created_at TIMESTAMP NOT NULL,
    PRIMARY KEY (root_hash, subtask_hash, scorer))
"""


def cosine_divergence(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Row-wise ``1 - cos`` of two matrices of L2-normalised vectors."""
    if len(left) == 0:
        return np.zeros(0, dtype=np.float64)
    left, right = np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64)
    return 1.0 - np.einsum("ij,ij->i", left, right)


def ensure_scores_table(conn: duckdb.DuckDBPyConnection) -> None:
    """Make ``goal_scores`` resolvable: the migrated table, else a temporary one."""
    ((found,),) = conn.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'goal_scores'"
    ).fetchall()
    if not found:
        conn.execute(_SCORES_DDL)


def _subtask_rows(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    ingested_after: datetime | None = None,
) -> pd.DataFrame:
    ensure_scores_table(conn)
    params = filter_params(window, filters)
    params.update(ingested_after=ingested_after, scorer=SCORER)
    return query_df(conn, load_sql("goal_divergence"), params)


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
) -> tuple[np.ndarray, int]:
    distinct = list(dict.fromkeys([*roots, *subtasks]))
    if not distinct:
        return np.zeros(0), 0
    vectors, embedded = embed_counting(distinct, conn, batch_size, threads)
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
) -> tuple[pd.DataFrame, int]:
    """Score distinct raw (``_root_raw``, ``_subtask_raw``) pairs and store them in ``goal_scores``.

    Returns the pairs with ``root_goal``, ``subtask`` (None when the text holds no task
    statement) and ``divergence``, and how many texts the model embedded now. A failed store
    (read-only file, a concurrent insert) is logged and the scores are still returned, unless
    ``strict``.
    """
    pairs = pairs[_RAW].drop_duplicates().reset_index(drop=True)
    raw = pd.unique(pd.concat([pairs["_root_raw"], pairs["_subtask_raw"]]))
    tasks = {text: extract_task(text) for text in raw}  # per distinct text
    pairs["root_goal"] = pairs["_root_raw"].map(tasks)
    pairs["subtask"] = pairs["_subtask_raw"].map(tasks)
    usable = pairs["root_goal"].notna() & pairs["subtask"].notna()
    scores, embedded = _score_statements(
        list(pairs.loc[usable, "root_goal"]), list(pairs.loc[usable, "subtask"]), conn, threads, batch_size
    )
    pairs["divergence"] = np.nan
    pairs.loc[usable, "divergence"] = scores
    try:
        _store_scores(conn, pairs)
    except duckdb.Error as error:
        if strict:
            raise
        logger.debug("goal scores not stored: %s", error)
    return pairs, embedded


def _store_scores(conn: duckdb.DuckDBPyConnection, pairs: pd.DataFrame) -> None:
    if pairs.empty:
        return
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
    ensure_scores_table(conn)
    conn.register("_new_goal_scores", table)
    try:
        conn.execute("INSERT OR IGNORE INTO goal_scores SELECT * FROM _new_goal_scores")
    finally:
        conn.unregister("_new_goal_scores")


def _fill_unscored(conn: duckdb.DuckDBPyConnection, frame: pd.DataFrame) -> pd.DataFrame:
    """Score the rows whose pair had no stored score (cold call) and drop unusable pairs."""
    pending = frame["_root_raw"].notna()
    if not pending.any():
        return frame
    scored, _ = score_raw_pairs(conn, frame.loc[pending, _RAW])
    filled = frame.loc[pending, _RAW].merge(scored, on=_RAW, how="left")
    for column in ("root_goal", "subtask", "divergence"):
        frame.loc[pending, column] = filled[column].to_numpy()
    return frame[frame["divergence"].notna()].reset_index(drop=True)


def goal_pairs(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    ingested_after: datetime | None = None,
) -> pd.DataFrame:
    """Subtask rows with their ``root_goal`` and ``subtask`` task statements and ``divergence``.

    Pairs without a stored score are scored (and stored) first. ``ingested_after`` keeps subtask
    spans stored at or after that time.
    """
    frame = _fill_unscored(conn, _subtask_rows(conn, window, filters, ingested_after))
    return frame.drop(columns=_RAW)


def score_pending_pairs(
    conn: duckdb.DuckDBPyConnection,
    limit: int = 2048,
    ingested_after: datetime | None = None,
    batch_size: int = BATCH_SIZE,
    threads: int | None = None,
) -> tuple[int, int]:
    """Score up to ``limit`` distinct pairs of subtask spans (stored since ``ingested_after``)
    that have no stored score; return (pairs scored, texts embedded). Raises if it cannot store."""
    ensure_scores_table(conn)
    params = filter_params(Window(), Filters())
    params.update(ingested_after=ingested_after, scorer=SCORER, pending_limit=limit)
    sql = (
        "SELECT DISTINCT _root_raw, _subtask_raw FROM (" + load_sql("goal_divergence") + ") "
        "WHERE _root_raw IS NOT NULL LIMIT $pending_limit"
    )
    pending = query_df(conn, sql, params)
    if pending.empty:
        return 0, 0
    scored, embedded = score_raw_pairs(conn, pending, threads, batch_size, strict=True)
    return len(scored), embedded


@register(
    "goal_divergence",
    description="1 - cosine(root goal, subtask statement) per subtask (all-MiniLM-L6-v2).",
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
        "drifted": "divergence > threshold",
        **TIMES,
    },
    row=(
        "one subtask: the spans of one agent in one run carrying the same subtask statement under "
        "the same root goal (a delegation, a nested agent, the tool calls working on it); "
        "span_ids lists them"
    ),
    failure_mode="task derailment: a subtask drifted away from the root goal",
    mast_category="inter-agent misalignment",
)
def goal_divergence(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Divergence of every subtask statement from its root goal, against the threshold.

    While the default 0.45 is in force (``calibrated`` False) the flag only suits short, clean
    task statements; calibrate on labelled pairs or a healthy baseline window.
    """
    frame = goal_pairs(conn, window, filters)
    frame["divergence"] = np.round(frame["divergence"].to_numpy(dtype=np.float64), DIVERGENCE_DECIMALS)
    info = current_threshold(conn, "goal_divergence")
    frame["threshold"] = info.value
    frame["threshold_version"] = info.version
    frame["calibrated"] = info.calibrated
    frame["drifted"] = frame["divergence"] > info.value
    return frame
