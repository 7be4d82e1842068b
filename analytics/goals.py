"""Goal divergence: how far each subtask's statement drifted from the root goal."""

from __future__ import annotations

import logging
from datetime import datetime

import duckdb
import numpy as np
import pandas as pd

from analytics._evidence import EVIDENCE, THRESHOLD, TIMES
from analytics.embeddings import cached_vectors, embed_texts, text_hash
from analytics.registry import register
from analytics.sql_loader import run_sql
from analytics.tasks import extract_task
from analytics.thresholds import current_threshold
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)


# The model's float32 output differs by ~1e-7 with batch composition (padding), so the same text
# pair embedded in two processes can differ in the 7th decimal; results are rounded to this.
DIVERGENCE_DECIMALS = 4


def cosine_divergence(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Row-wise ``1 - cos`` of two matrices of L2-normalised vectors."""
    if len(left) == 0:
        return np.zeros(0, dtype=np.float64)
    left, right = np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64)
    return 1.0 - np.einsum("ij,ij->i", left, right)


def goal_pairs(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    ingested_after: datetime | None = None,
) -> pd.DataFrame:
    """Subtask rows with extracted ``root_goal`` and ``subtask`` task statements (no scores).

    ``ingested_after`` keeps subtask spans stored at or after that time (the worker's watermark).
    """
    frame = run_sql(conn, "goal_divergence", window, filters, ingested_after=ingested_after)
    raw = pd.unique(pd.concat([frame["root_raw"], frame["subtask_raw"]]).dropna())
    tasks = {text: extract_task(text) for text in raw}  # per distinct text, not per span
    frame["root_goal"] = frame["root_raw"].map(tasks)
    frame["subtask"] = frame["subtask_raw"].map(tasks)
    return frame.dropna(subset=["root_goal", "subtask"]).reset_index(drop=True)


def score_pairs(
    roots: list[str], subtasks: list[str], conn: duckdb.DuckDBPyConnection | None = None
) -> np.ndarray:
    """``1 - cos`` between each root goal and subtask, embedding each distinct text once."""
    distinct = list(dict.fromkeys([*roots, *subtasks]))
    if not distinct:
        return np.zeros(0)
    vectors = embed_texts(distinct, conn)
    index = {text: row for row, text in enumerate(distinct)}
    left = vectors[[index[text] for text in roots]]
    right = vectors[[index[text] for text in subtasks]]
    return cosine_divergence(left, right)


@register(
    "goal_divergence",
    description="1 - cosine(root goal, subtask statement) per subtask span (all-MiniLM-L6-v2).",
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
    row="one subtask (delegation or nested agent) span",
    failure_mode="task derailment: a subtask drifted away from the root goal",
    mast_category="inter-agent misalignment",
)
def goal_divergence(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Divergence of every subtask statement from its root goal, against the threshold.

    While the default 0.45 is in force (``calibrated`` False) the flag only suits short, clean
    task statements; calibrate on labelled pairs or a healthy baseline window.
    """
    frame = goal_pairs(conn, window, filters)
    scores = score_pairs(list(frame["root_goal"]), list(frame["subtask"]), conn)
    frame["divergence"] = np.round(scores, DIVERGENCE_DECIMALS)
    info = current_threshold(conn, "goal_divergence")
    frame["threshold"] = info.value
    frame["threshold_version"] = info.version
    frame["calibrated"] = info.calibrated
    frame["drifted"] = frame["divergence"] > info.value
    return frame


def pending_task_texts(
    conn: duckdb.DuckDBPyConnection, limit: int = 2048, ingested_after: datetime | None = None
) -> list[str]:
    """Distinct extracted task texts of stored spans that have no cached embedding yet."""
    frame = goal_pairs(conn, Window(), Filters(), ingested_after)
    texts = list(dict.fromkeys([*frame["root_goal"], *frame["subtask"]]))
    if not texts:
        return []
    cached = cached_vectors(conn, [text_hash(text) for text in texts])
    return [text for text in texts if text_hash(text) not in cached][:limit]
