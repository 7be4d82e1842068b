"""Evidence spans of findings: read in one request for every listed finding, then shared out.

A finding names its run and the ids of its evidence spans. ``evidence_keys`` collects the (run,
span id) pairs of every finding a report lists, the data source reads those spans in one query
(``DataSource.evidence_spans``), and ``EvidenceIndex`` hands each finding its rows. Span ids are
only unique within a trace, so spans are matched by run and span id, never by span id alone.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from dashboard.datasource import TEXT_COLUMNS
from dashboard.findings import Finding

MAX_EVIDENCE_SPANS = 25
MAX_TEXT = 400
EVIDENCE_COLUMNS = [
    "span_id",
    "trace_id",
    "timestamp",
    "span_name",
    "agent",
    "tool",
    "op",
    "outcome",
    "reject_reason",
    "status",
    "text",
]


def evidence_keys(findings: Iterable[Finding], max_spans: int = MAX_EVIDENCE_SPANS) -> pd.DataFrame:
    """Distinct (run_id, span_id) pairs of the first ``max_spans`` evidence ids of each finding."""
    pairs = {(f.run_id, span_id) for f in findings if f.run_id for span_id in f.span_ids[:max_spans]}
    return pd.DataFrame(list(pairs), columns=["run_id", "span_id"])


def evidence_table(spans: pd.DataFrame, max_text: int = MAX_TEXT) -> dict[str, list]:
    """Spans as evidence columns (``EVIDENCE_COLUMNS`` plus run_id and start_ns), as lists.

    ``text`` joins the span's non-empty texts with " | " and is cut at ``max_text`` characters;
    ``timestamp`` is ISO-8601 text. Text is unescaped (renderers escape it).
    """
    if spans is None or spans.empty:
        return {c: [] for c in ["run_id", "start_ns", *EVIDENCE_COLUMNS]}
    parts = [
        [_text_or_none(v) for v in spans[column].tolist()]
        for column in TEXT_COLUMNS
        if column in spans.columns
    ]
    texts = [" | ".join(t for t in row if t is not None) for row in zip(*parts, strict=True)]
    texts = [t if len(t) <= max_text else t[:max_text] + "…" for t in texts]
    stamps = pd.to_datetime(spans["Timestamp"], errors="coerce")
    if getattr(stamps.dt, "tz", None) is not None:
        stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
    starts = pd.to_numeric(spans["start_ns"], errors="coerce") if "start_ns" in spans else None
    return {
        "run_id": spans["run_id"].tolist(),
        "start_ns": [0] * len(spans) if starts is None else starts.fillna(0).astype("int64").tolist(),
        "span_id": spans["span_id"].tolist(),
        "trace_id": spans["trace_id"].tolist(),
        "timestamp": [None if pd.isna(t) else t.isoformat() for t in stamps.tolist()],
        **{
            out: [_missing_as_none(v) for v in spans[column].tolist()]
            if column in spans
            else [None] * len(spans)
            for out, column in (
                ("span_name", "span_name"),
                ("agent", "agent_id"),
                ("tool", "tool_name"),
                ("op", "op"),
                ("outcome", "outcome"),
                ("reject_reason", "reject_reason"),
                ("status", "status_code"),
            )
        },
        "text": texts,
    }


def _missing_as_none(value):
    """NaN (pandas' missing value in some columns) as None; anything else unchanged."""
    return None if isinstance(value, float) and pd.isna(value) else value


def _text_or_none(value) -> str | None:
    """A span text as str, or None when missing or empty (NaN included)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    text = str(value)
    return text or None


class EvidenceIndex:
    """Evidence rows by (run, span id), handed out per finding in span start order."""

    def __init__(self, table: dict[str, list]):
        self._rows: dict[tuple, list[tuple]] = {}
        columns = [table[c] for c in ("run_id", "start_ns", *EVIDENCE_COLUMNS)]
        for run_id, start, *row in zip(*columns, strict=True):
            self._rows.setdefault((run_id, row[0]), []).append((start, row))

    def rows(self, finding: Finding, max_spans: int = MAX_EVIDENCE_SPANS) -> list[dict]:
        """The evidence rows of ``finding`` (``EVIDENCE_COLUMNS`` keys), earliest span first."""
        if not finding.run_id:
            return []
        found = [
            entry
            for span_id in dict.fromkeys(finding.span_ids[:max_spans])
            for entry in self._rows.get((finding.run_id, span_id), ())
        ]
        found.sort(key=lambda entry: (entry[0], entry[1][0]))
        return [dict(zip(EVIDENCE_COLUMNS, row, strict=True)) for _, row in found]
