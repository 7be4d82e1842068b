"""How a findings table reads and where a click on one of its rows leads (no Streamlit).

A detector's frame is shown with the run, a sentence of what happened and the evidence span ids
first (the columns a person on call reads), then the detector's own columns; a click on a row
opens the run explorer at exactly that row's finding (``finding_key``), or, for a row that is not
a finding (a send a guard refused), at its first evidence span.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from dashboard.findings import REVIEW, as_list, cell_text, finding_run_ids, row_statuses

# The columns a findings table leads with, in order.
LEAD_COLUMNS = ["run_id", "what_happened", "evidence"]
# Columns that are ids of the evidence or its place, shown after the detector's own.
TAIL_COLUMNS = ("trace_id", "run_ids")
# How many detail columns the "what happened" sentence names, and how many evidence ids it lists.
DETAIL_FACTS = 4
EVIDENCE_IDS = 3
# Detail columns a sentence skips: ids, thresholds and times have columns of their own.
_QUIET = ("threshold", "threshold_version", "calibrated", "first_seen", "last_seen", "bucket_seconds")
# What a row's status says first.
STATUS_WORDS = {"failure": "failed", REVIEW: "to review", "warning": "caught"}


def finding_key(metric: str, span_ids) -> str:
    """A stable name for one finding: its detector and a digest of its evidence span ids (the same
    finding read through any window, filter or order has the same key)."""
    ids = ",".join(sorted(as_list(span_ids)))
    return f"{metric}.{hashlib.sha1(ids.encode()).hexdigest()[:12]}"


def finding_flags(frame: pd.DataFrame, metric: dict) -> np.ndarray:
    """Which rows of a detector frame are findings (its flag column, else every row)."""
    column = metric.get("flag_column")
    if column and column in frame.columns:
        return frame[column].fillna(False).to_numpy(dtype=bool)
    return np.ones(len(frame), dtype=bool)


def _quiet(column: str, metric: dict) -> bool:
    return (
        column in _QUIET
        or column == metric.get("flag_column")
        or column.endswith(("span_id", "span_ids"))
        or column in ("run_id", "trace_id", "run_ids", "agents")
    )


def what_happened(frame: pd.DataFrame, metric: dict) -> list[str]:
    """Per row: its status (failed, to review, caught, or not a finding) and the first
    ``DETAIL_FACTS`` non-empty facts of the detector's own columns (its rank column first), as one
    line of text."""
    if frame.empty:
        return []
    statuses = row_statuses(metric, frame)
    flags = finding_flags(frame, metric)
    columns = [c for c in frame.columns if not _quiet(c, metric)]
    rank = metric.get("rank_column")
    if rank in columns:  # the detector's measure of how bad it is comes first
        columns = [rank, *(c for c in columns if c != rank)]
    cells = {c: [cell_text(v) for v in frame[c].tolist()] for c in columns}
    out = []
    for i in range(len(frame)):
        facts = [f"{c.replace('_', ' ')} {cells[c][i]}" for c in columns if cells[c][i] not in ("", "nan")]
        word = STATUS_WORDS.get(statuses[i], statuses[i]) if flags[i] else "not a finding"
        out.append(f"{word}: " + "; ".join(facts[:DETAIL_FACTS]))
    return out


def evidence_text(span_ids) -> str:
    """The first ``EVIDENCE_IDS`` evidence span ids, and how many there are when more."""
    ids = as_list(span_ids)
    shown = ", ".join(ids[:EVIDENCE_IDS])
    return shown if len(ids) <= EVIDENCE_IDS else f"{shown} … ({len(ids)} spans)"


def lead_columns(frame: pd.DataFrame, metric: dict) -> pd.DataFrame:
    """The frame as a findings table shows it: ``LEAD_COLUMNS``, the detector's own columns (lists
    as comma-separated text), then ``TAIL_COLUMNS``."""
    runs = finding_run_ids(frame) if len(frame) else []
    spans = frame["span_ids"].tolist() if "span_ids" in frame.columns else [None] * len(frame)
    lead = pd.DataFrame(
        {
            "run_id": [r or "" for r in runs],
            "what_happened": what_happened(frame, metric),
            "evidence": [evidence_text(s) for s in spans],
        },
        index=frame.index,
    )
    rest = [c for c in frame.columns if c not in ("run_id", "span_ids", *TAIL_COLUMNS)]
    tail = [c for c in TAIL_COLUMNS if c in frame.columns]
    shown = pd.concat([lead, frame[rest + tail]], axis=1)
    for column in rest + tail:
        values = shown[column]
        if values.dtype == object and values.map(lambda v: isinstance(v, list | tuple | np.ndarray)).any():
            shown[column] = values.map(lambda v: ", ".join(as_list(v)) if not isinstance(v, str) else v)
    return shown.reset_index(drop=True)


def row_target(frame: pd.DataFrame, metric: dict, position: int) -> dict[str, str] | None:
    """The run explorer's query parameters for a click on row ``position`` of ``frame``: the run
    and the finding (``finding_key``), or the first evidence span of a row that is no finding;
    None when the row names no single run."""
    row = frame.iloc[[position]]
    run = finding_run_ids(row)[0]
    if not run:
        return None
    spans = as_list(row["span_ids"].iloc[0]) if "span_ids" in row.columns else []
    if finding_flags(row, metric)[0]:
        return {"run": run, "finding": finding_key(metric["name"], spans)} if spans else {"run": run}
    return {"run": run, "span": spans[0]} if spans else {"run": run}
