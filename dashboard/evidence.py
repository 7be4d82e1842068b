"""Evidence spans of findings: read in one request for every listed finding, then shared out.

A finding names its run and the ids of its evidence spans. ``evidence_keys`` collects the (run,
span id) pairs of every finding a report lists, the data source reads those spans in one query
(``DataSource.evidence_spans``), and ``EvidenceIndex`` hands each finding its rows. Span ids are
only unique within a trace, so spans are matched by run and span id, never by span id alone.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from dashboard.findings import Finding

MAX_EVIDENCE_SPANS = 25
MAX_TEXT = 400
# Span texts joined into an evidence row's ``text`` (in this order), as run_spans names them.
TEXT_COLUMNS = (
    "goal_root",
    "goal_text",
    "tool_args",
    "tool_result",
    "input_text",
    "output_text",
    "status_message",
)
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
# Columns a data source returns from ``evidence_spans``: run_spans names, plus run_id.
SPAN_COLUMNS = [
    "run_id",
    "span_id",
    "trace_id",
    "Timestamp",
    "start_ns",
    "span_name",
    "agent_id",
    "tool_name",
    "op",
    "outcome",
    "reject_reason",
    "status_code",
    *TEXT_COLUMNS,
]


def evidence_keys(findings: Iterable[Finding], max_spans: int = MAX_EVIDENCE_SPANS) -> pd.DataFrame:
    """Distinct (run_id, span_id) pairs of the first ``max_spans`` evidence ids of each finding."""
    pairs = {(f.run_id, span_id) for f in findings if f.run_id for span_id in f.span_ids[:max_spans]}
    return pd.DataFrame(sorted(pairs), columns=["run_id", "span_id"])


def evidence_table(spans: pd.DataFrame, max_text: int = MAX_TEXT) -> pd.DataFrame:
    """Spans as evidence rows (``EVIDENCE_COLUMNS`` plus run_id and start_ns); text unescaped.

    ``text`` joins the span's non-empty texts with " | " and is cut at ``max_text`` characters.
    """
    if spans is None or spans.empty:
        return pd.DataFrame(columns=["run_id", "start_ns", *EVIDENCE_COLUMNS])
    parts = [
        [_text_or_none(v) for v in spans[column].tolist()]
        for column in TEXT_COLUMNS
        if column in spans.columns
    ]
    joined = [" | ".join(t for t in texts if t is not None) for texts in zip(*parts, strict=True)]
    text = pd.Series(joined, index=spans.index, dtype=object)
    cut = text.str.len() > max_text
    text = text.str.slice(0, max_text).where(~cut, text.str.slice(0, max_text) + "…")
    stamps = pd.to_datetime(spans["Timestamp"], errors="coerce")
    if getattr(stamps.dt, "tz", None) is not None:
        stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
    return pd.DataFrame(
        {
            "run_id": spans["run_id"],
            "start_ns": pd.to_numeric(spans.get("start_ns", 0), errors="coerce"),
            "span_id": spans["span_id"],
            "trace_id": spans["trace_id"],
            "timestamp": [None if pd.isna(t) else t.to_pydatetime() for t in stamps],
            "span_name": spans.get("span_name"),
            "agent": spans.get("agent_id"),
            "tool": spans.get("tool_name"),
            "op": spans.get("op"),
            "outcome": spans.get("outcome"),
            "reject_reason": spans.get("reject_reason"),
            "status": spans.get("status_code"),
            "text": text,
        }
    ).astype(object)


def _text_or_none(value) -> str | None:
    """A span text as str, or None when missing or empty (NaN included)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    text = str(value)
    return text or None


class EvidenceIndex:
    """Evidence rows by (run, span id), handed out per finding in span start order."""

    def __init__(self, table: pd.DataFrame):
        table = table.sort_values(["start_ns", "span_id"], kind="stable") if not table.empty else table
        self._rows: dict[tuple, list[dict]] = {}
        records = table.astype(object).where(table.notna(), None).to_dict("records")
        for record in records:
            key = (record.pop("run_id"), record["span_id"])
            self._rows.setdefault(key, []).append(record)

    def rows(self, finding: Finding, max_spans: int = MAX_EVIDENCE_SPANS) -> list[dict]:
        """The evidence rows of ``finding`` (``EVIDENCE_COLUMNS`` keys), earliest span first."""
        if not finding.run_id:
            return []
        found = [
            row
            for span_id in dict.fromkeys(finding.span_ids[:max_spans])
            for row in self._rows.get((finding.run_id, span_id), ())
        ]
        found.sort(key=lambda r: (r["start_ns"] if r["start_ns"] is not None else 0, r["span_id"]))
        return [{c: row[c] for c in EVIDENCE_COLUMNS} for row in found]
