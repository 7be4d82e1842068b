"""Findings: detector rows turned into named failures with evidence, shared by pages and reports.

Pure functions over DataFrames plus one collector (``gather_findings``) that reads through a data
source. Everything about a detector (whether its rows are findings, which column flags them, its
title, failure mode, MAST category, page, whether it makes a run failing) comes from its metric
description: the analytics registry's ``Metric`` record as ``analytics.read.describe_metric``
gives it, in process or through the read API. Nothing here lists detectors by name.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd

from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

MAST_CATEGORIES = ("specification", "inter-agent misalignment", "task verification")


def finding_metrics(metrics: list[dict]) -> list[dict]:
    """The metrics whose rows are findings, in the order given (the registry's catalogue order)."""
    return [m for m in metrics if m.get("findings")]


def mast_category(text: str | None) -> str:
    """One of the three MAST categories for the registry's wording ("specification issues" ...)."""
    lowered = (text or "").lower()
    if lowered.startswith("spec"):
        return "specification"
    if "inter" in lowered or "misalign" in lowered:
        return "inter-agent misalignment"
    if "verif" in lowered or "termination" in lowered:
        return "task verification"
    return lowered or "unclassified"


def short_title(metric: dict) -> str:
    """A short label for a detector's failure mode (tiles and chart axes)."""
    return metric.get("title") or metric["name"].replace("_", " ")


def naming(metric: dict) -> tuple[str, str]:
    """(failure mode, MAST category) of a metric description."""
    mode = metric.get("failure_mode") or short_title(metric)
    return mode, mast_category(metric.get("mast_category"))


def fails_runs(metric: dict) -> bool:
    """Whether run_summary counts this detector's findings and each makes its run failing."""
    return bool(metric.get("counted") and metric.get("failing"))


def finding_rows(frame: pd.DataFrame, metric: dict) -> pd.DataFrame:
    """Rows of a detector frame that are findings (all, unless the metric has a flag column)."""
    column = metric.get("flag_column")
    if column and column in frame.columns:
        return frame[frame[column].fillna(False).astype(bool)]
    return frame


_EVIDENCE = ("run_id", "trace_id", "span_ids", "agents", "agent", "first_seen", "last_seen")


@dataclass
class Finding:
    """One detector row that is a coordination failure, with its evidence."""

    metric: str
    failure_mode: str
    mast_category: str
    run_id: str | None
    trace_id: str | None
    span_ids: list[str]
    agents: list[str]
    first_seen: datetime | None
    last_seen: datetime | None
    details: dict[str, str] = field(default_factory=dict)
    status: str = "warning"
    """``failure``, ``to review (threshold not calibrated)`` or ``warning`` (``row_status``)."""
    fails_runs: bool = False
    """Its detector's findings make a run failing by their count (``fails_runs``)."""


def as_list(value) -> list[str]:
    """A list-ish cell (list, numpy array, None, scalar) as a list of strings."""
    if value is None:
        return []
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [v if type(v) is str else str(v) for v in value.tolist() if v is not None]
    if isinstance(value, list | tuple | np.ndarray | pd.Series):
        return [str(v) for v in value if v is not None]
    if isinstance(value, float) and np.isnan(value):
        return []
    return [str(value)]


def _time(value) -> datetime | None:
    if value is None or (not isinstance(value, datetime) and pd.isna(value)):
        return None
    stamp = pd.Timestamp(value)
    if stamp.tzinfo is not None:
        stamp = stamp.tz_convert("UTC").tz_localize(None)
    return stamp.to_pydatetime()


def cell_text(value) -> str:
    """A cell as plain text for details (lists joined, floats rounded, NaN empty)."""
    if type(value) is str:  # the common case first: this runs once per detail cell
        return value
    if isinstance(value, list | tuple | np.ndarray):
        return ", ".join(str(v) for v in value)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, pd.Timestamp | datetime):
        return _time(value).isoformat(sep=" ", timespec="milliseconds")
    return str(value)


def findings_from_frame(metric: dict, frame: pd.DataFrame) -> list[Finding]:
    """Turn a detector frame into findings named by failure mode and MAST category."""
    return findings_from_rows(metric, finding_rows(frame, metric))


def findings_from_rows(metric: dict, rows: pd.DataFrame) -> list[Finding]:
    """Findings of rows that are already findings (``finding_rows``), in row order.

    Details are converted column by column (one pass per column, not per cell of a record dict),
    so this stays linear and cheap even for the complete JSON report of a large window.
    """
    if rows.empty:
        return []
    mode, category = naming(metric)
    detail_columns = [c for c in rows.columns if c not in _EVIDENCE]
    details = [[cell_text(v) for v in rows[c].tolist()] for c in detail_columns]
    runs = finding_run_ids(rows)
    traces = rows["trace_id"].tolist() if "trace_id" in rows.columns else [None] * len(rows)
    spans = rows["span_ids"].tolist() if "span_ids" in rows.columns else [None] * len(rows)
    agents = agent_lists(rows)
    firsts = _times(rows, "first_seen")
    lasts = _times(rows, "last_seen")
    statuses = row_statuses(metric, rows)
    counted_failing = fails_runs(metric)
    out = []
    for i in range(len(rows)):
        out.append(
            Finding(
                metric=metric["name"],
                failure_mode=mode,
                mast_category=category,
                run_id=runs[i],
                trace_id=_opt_str(traces[i]),
                span_ids=as_list(spans[i]),
                agents=agents[i],
                first_seen=firsts[i],
                last_seen=lasts[i],
                details={c: column[i] for c, column in zip(detail_columns, details, strict=True)},
                status=statuses[i],
                fails_runs=counted_failing,
            )
        )
    return out


def _times(rows: pd.DataFrame, column: str) -> list[datetime | None]:
    if column not in rows.columns:
        return [None] * len(rows)
    return [_time(v) for v in rows[column].tolist()]


def agent_lists(rows: pd.DataFrame) -> list[list[str]]:
    """Per row: the ``agents`` list, else ``[agent]``."""
    many = rows["agents"].tolist() if "agents" in rows.columns else [None] * len(rows)
    one = rows["agent"].tolist() if "agent" in rows.columns else [None] * len(rows)
    return [as_list(a) or as_list(b) for a, b in zip(many, one, strict=True)]


def finding_run_ids(rows: pd.DataFrame) -> list[str | None]:
    """The run of each finding row: ``run_id``, else the single run of a per-bucket ``run_ids``."""
    runs = [_opt_str(v) for v in rows["run_id"].tolist()] if "run_id" in rows.columns else [None] * len(rows)
    if "run_ids" in rows.columns:
        single = [
            (lambda ids: ids[0] if len(ids) == 1 else None)(as_list(v)) for v in rows["run_ids"].tolist()
        ]
        runs = [r if r is not None else s for r, s in zip(runs, single, strict=True)]
    return runs


def _opt_str(value) -> str | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    return str(value)


def counted_columns(metric: dict) -> tuple[str, ...] | None:
    """The columns of a detector's frame that ``MetricFindings`` reads for counts, runs, trends,
    ranking and statuses (flag, rank, failing-unless and review-unless columns, ``run_id``,
    ``run_ids``, ``first_seen``: those the metric documents), or None (all) when it documents none of them. A frame of only these columns
    cannot list findings (no evidence): the Overview reads them so ``repeated_calls``' span-id
    lists are never built."""
    documented = metric.get("columns") or {}
    wanted = (
        metric.get("flag_column"), metric.get("rank_column"), metric.get("failing_unless"),
        metric.get("review_unless"), "run_id", "run_ids", "first_seen",
    )  # fmt: skip
    found = tuple(c for c in dict.fromkeys(wanted) if c and c in documented)
    return found or None


@dataclass
class MetricFindings:
    """One detector's result: its full frame and which of its rows are findings.

    ``positions`` are the finding rows' positions in ``frame``, in listing order. Nothing is
    copied out of the frame until a page or report lists findings: counts, runs and trends are
    read from single columns.
    """

    metric: dict
    frame: pd.DataFrame
    positions: np.ndarray

    @property
    def name(self) -> str:
        return self.metric["name"]

    @property
    def count(self) -> int:
        return int(len(self.positions))

    def column(self, name: str) -> pd.Series:
        """One column of the finding rows, in listing order."""
        return self.frame[name].take(self.positions).reset_index(drop=True)

    @functools.cached_property
    def run_ids(self) -> pd.Series:
        """The run of each finding (missing as NA), in listing order."""
        if "run_id" in self.frame.columns:
            if "run_ids" not in self.frame.columns:
                return self.column("run_id")
        if "run_ids" in self.frame.columns or "run_id" in self.frame.columns:
            rows = self.frame.iloc[self.positions][[c for c in ("run_id", "run_ids") if c in self.frame]]
            return pd.Series(finding_run_ids(rows), dtype=object)
        return pd.Series([None] * self.count, dtype=object)

    @functools.cached_property
    def per_run(self) -> pd.Series:
        """Findings per run (run id -> count) for the runs this detector's findings name."""
        codes, uniques = pd.factorize(self.run_ids)  # one hashing pass; missing runs are -1
        counts = np.bincount(codes[codes >= 0], minlength=len(uniques))
        return pd.Series(counts, index=pd.Index(np.asarray(uniques, dtype=object), name="run_id"))

    @property
    def distinct_runs(self) -> pd.Index:
        """The runs named by this detector's findings."""
        return self.per_run.index

    def findings(self, limit: int | None = None, run: str | None = None) -> list[Finding]:
        """The first ``limit`` findings (all when None), of one run when ``run`` is given."""
        positions = self.positions
        if run is not None:
            positions = positions[(self.run_ids == run).fillna(False).to_numpy(dtype=bool)]
        if limit is not None:
            positions = positions[:limit]
        return findings_from_rows(self.metric, self.frame.iloc[positions].reset_index(drop=True))


def metric_findings(metric: dict, frame: pd.DataFrame) -> MetricFindings:
    """A detector frame's finding rows, ranked for listing: the worst first by the metric's rank
    column (the report lists the first findings of each mode in full and counts the rest; stable:
    ties keep the detector's order)."""
    flag = metric.get("flag_column")
    if flag and flag in frame.columns:
        positions = np.flatnonzero(frame[flag].fillna(False).to_numpy(dtype=bool))
    else:
        positions = np.arange(len(frame))
    rank = metric.get("rank_column")
    if rank and rank in frame.columns and len(positions) > 1:
        score = pd.to_numeric(frame[rank], errors="coerce").to_numpy(dtype=float)[positions]
        order = np.argsort(np.where(np.isnan(score), np.inf, -score), kind="stable")
        positions = positions[order]
    return MetricFindings(metric, frame, positions)


@dataclass
class FindingSet:
    """Every finding detector's result for one window and filters, each detector run once.

    Counts and summaries are computed over all finding rows (vectorised); ``Finding`` objects are
    built only for the findings a page or report actually lists.
    """

    by_metric: dict[str, MetricFindings]
    errors: dict[str, str]

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        """Detector frames by metric (rows that are not findings included)."""
        return {name: m.frame for name, m in self.by_metric.items()}

    @property
    def total(self) -> int:
        return sum(m.count for m in self.by_metric.values())

    def findings(self, limit_per_metric: int | None = None, run: str | None = None) -> list[Finding]:
        """Findings in report order (metric by metric), at most ``limit_per_metric`` of each."""
        return [f for m in self.by_metric.values() for f in m.findings(limit_per_metric, run)]

    def summary(self) -> pd.DataFrame:
        """Counts per failure mode (and its short title) and MAST category, with the runs affected."""
        rows = []
        for m in self.by_metric.values():
            if m.count:
                mode, category = naming(m.metric)
                rows.append(
                    {
                        "metric": m.name,
                        "title": short_title(m.metric),
                        "failure_mode": mode,
                        "mast_category": category,
                        "findings": m.count,
                        "runs": int(len(m.distinct_runs)),
                    }
                )
        return pd.DataFrame(
            rows, columns=["metric", "title", "failure_mode", "mast_category", "findings", "runs"]
        )

    def by_category(self) -> dict[str, int]:
        """Finding count per MAST category (all three always present)."""
        counts = {c: 0 for c in MAST_CATEGORIES}
        for m in self.by_metric.values():
            if m.count:
                category = naming(m.metric)[1]
                counts[category] = counts.get(category, 0) + m.count
        return counts

    def runs_with_findings(self) -> int:
        """Distinct runs named by any finding."""
        return int(len(self.run_counts()))

    def run_counts(self) -> pd.Series:
        """Findings per run (run id -> count), all metrics together."""
        parts = [m.per_run for m in self.by_metric.values() if m.count]
        if not parts:
            return pd.Series(dtype="int64")
        return pd.concat(parts).groupby(level=0, sort=False).sum()

    def failure_modes(self, run_ids: list[str]) -> dict[str, list[str]]:
        """The failure modes seen in each of ``run_ids`` (sorted), for a few runs."""
        wanted = set(run_ids)
        modes: dict[str, set[str]] = {r: set() for r in run_ids}
        for m in self.by_metric.values():
            if not m.count:
                continue
            hits = set(pd.unique(m.run_ids[m.run_ids.isin(wanted)].astype(object)))
            for run in hits:
                modes[run].add(naming(m.metric)[0])
        return {run: sorted(found) for run, found in modes.items()}


def gather_findings(
    source,
    window: Window,
    filters: Filters,
    read: Callable[[str], pd.DataFrame] | None = None,
    metrics: list[dict] | None = None,
    parallel: int = 1,
) -> FindingSet:
    """Run every finding metric once and index the findings.

    A detector that fails is reported in ``errors`` (its message) rather than aborting the rest.
    ``read(name)`` replaces ``source.metric(name, window, filters)``: the dashboard passes its
    cached reader, so a detector a page already ran is not run again; ``metrics`` likewise
    replaces ``source.list_metrics()``. ``parallel``: how many reads at once (a source that
    answers concurrent requests, a collector's API: the Overview waited on its 15 reads one
    after another, half of its first render during a live incident).
    """
    described = finding_metrics(metrics if metrics is not None else source.list_metrics())

    def one(name: str) -> pd.DataFrame | Exception:
        try:
            return read(name) if read is not None else source.metric(name, window, filters)
        except Exception as exc:  # one broken detector must not hide the others' findings
            logger.warning("metric %s failed: %s", name, exc)
            return exc

    names = [metric["name"] for metric in described]
    if parallel > 1 and len(names) > 1:
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="findings-read") as pool:
            answers = dict(zip(names, pool.map(one, names), strict=True))
    else:
        answers = {name: one(name) for name in names}
    by_metric: dict[str, MetricFindings] = {}
    errors: dict[str, str] = {}
    for metric in described:
        name = metric["name"]
        answer = answers[name]
        if isinstance(answer, Exception):
            errors[name] = f"{type(answer).__name__}: {answer}"
            continue
        by_metric[name] = metric_findings(metric, answer)
    return FindingSet(by_metric, errors)


def collect_findings(
    source, window: Window, filters: Filters
) -> tuple[list[Finding], dict[str, pd.DataFrame], dict[str, str]]:
    """Every finding as a list: (findings, frames by metric, errors by metric).

    Convenient for small scopes and tests; pages and reports use ``gather_findings``, which builds
    ``Finding`` objects only for what they list.
    """
    found = gather_findings(source, window, filters)
    return found.findings(), found.frames, found.errors


def run_failures(findings: list[Finding]) -> tuple[set[str], set[str]]:
    """(evidence span ids, agents involved) of a run's findings, for highlighting."""
    spans = {s for f in findings for s in f.span_ids}
    agents = {a for f in findings for a in f.agents}
    return spans, agents


def findings_frame(findings: list[Finding]) -> pd.DataFrame:
    """Findings as a table: status, failure mode, MAST category, run, agents, time, evidence, details."""
    rows = [
        {
            "status": finding_status(f),
            "failure_mode": f.failure_mode,
            "mast_category": f.mast_category,
            "run_id": f.run_id,
            "agents": f.agents,
            "first_seen": f.first_seen,
            "details": "; ".join(f"{k}={v}" for k, v in f.details.items() if v)[:300],
            "trace_id": f.trace_id,
            "span_ids": f.span_ids,
        }
        for f in findings
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "status", "failure_mode", "mast_category", "run_id", "agents", "first_seen", "details",
            "trace_id", "span_ids",
        ],
    )  # fmt: skip


REVIEW = "to review (threshold not calibrated)"
STATUS_RANK = {"failure": 0, REVIEW: 1, "warning": 2}


def _truthy(values: pd.Series) -> np.ndarray:
    """A boolean column (or its text, as a remote source may send it) as booleans; missing is False."""
    if pd.api.types.is_bool_dtype(values.dtype):  # the usual case, without a Python call per row
        return values.fillna(False).to_numpy(dtype=bool)
    text = values.astype(object).map(lambda v: str(v).strip().lower() if v is not None else "")
    return text.isin(("true", "1")).to_numpy(dtype=bool)


def row_statuses(metric: dict, rows: pd.DataFrame) -> list[str]:
    """The status of each finding row, as run_summary's verdict reads it.

    ``failure``: it makes its run failing (the metric is ``failing``, or its ``failing_unless``
    column is not true); ``to review (threshold not calibrated)``: its ``review_unless`` column is
    not true (goal drift over the uncalibrated default); ``warning``: a guard or the agent caught
    it (divergent reads, budget stops, refreshed holders, refused calls)."""
    n = len(rows)
    failing = np.full(n, bool(metric.get("failing")))
    unless = metric.get("failing_unless")
    if unless and unless in rows.columns:
        failing = ~_truthy(rows[unless])
    statuses = np.where(failing, "failure", "warning").astype(object)
    review = metric.get("review_unless")
    if review and review in rows.columns:
        statuses[~_truthy(rows[review]) & failing] = REVIEW
    return statuses.tolist()


def finding_status(finding: Finding) -> str:
    """``failure``, ``to review (threshold not calibrated)`` or ``warning`` (see ``row_statuses``)."""
    return finding.status


def severity_key(finding: Finding) -> tuple[int, int]:
    """Sort key, worst first: status, then whether the detector makes runs failing by its count."""
    return (STATUS_RANK[finding.status], 0 if finding.fails_runs else 1)


def order_by_run_and_severity(findings: list[Finding]) -> list[int]:
    """Positions of ``findings`` grouped by run, worst first within a run; runs whose worst finding is
    worse come first (ties: first listed first). Findings without a run come last.

    Between equally severe findings, a metric listed earlier in ``findings`` (they come in catalogue
    order) comes first."""
    catalogue: dict[str, int] = {}
    for finding in findings:
        catalogue.setdefault(finding.metric, len(catalogue))
    keys = [(*severity_key(f), catalogue[f.metric]) for f in findings]
    worst: dict[str | None, tuple] = {}
    first: dict[str | None, int] = {}
    for i, (finding, key) in enumerate(zip(findings, keys, strict=True)):
        worst[finding.run_id] = min(worst.get(finding.run_id, key), key)
        first.setdefault(finding.run_id, i)
    return sorted(
        range(len(findings)),
        key=lambda i: (
            findings[i].run_id is None,
            worst[findings[i].run_id],
            first[findings[i].run_id],
            keys[i],
            i,
        ),
    )
