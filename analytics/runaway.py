"""Runaway runs: a run (or an agent in a run) with far more spans than its crew's runs usually
have, and no step budget to stop it.

The crew is the service (``ServiceName``). Its limits are calibrated from a healthy baseline
window (``analytics.calibration.calibrate_from_baseline`` stores
``runaway_spans_per_run:<service>`` and ``runaway_spans_per_agent:<service>``: the baseline's
quantile times ``RUNAWAY_MARGIN``). Uncalibrated, the limit is conservative: ``UNCALIBRATED_FACTOR``
times the crew's median run in the window, never below ``UNCALIBRATED_FLOOR`` spans, and only
when the window holds ``UNCALIBRATED_MIN_RUNS`` runs of the crew (fewer say nothing about what is
usual; runs of fewer than ``MEDIAN_MIN_SPANS`` spans are not counted in the median). Spans, not tool calls: agents that act through code have no tool spans, and on real agent
traces the span count of a run separates resource-abuse runs from the rest.
"""

from __future__ import annotations

import logging

import duckdb
import numpy as np
import pandas as pd

from analytics._evidence import EVIDENCE, TIMES
from analytics.engine import fetch_rows
from analytics.registry import register
from analytics.sql_loader import run_sql
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

RUN_THRESHOLD = "runaway_spans_per_run"
AGENT_THRESHOLD = "runaway_spans_per_agent"
RUNAWAY_MARGIN = 2.0
# Uncalibrated limit: on the framework corpus (sample_traces/frameworks, 6 crews) healthy runs have
# at most 2.3x the median run of their crew and the injected runaway runs 5.1-9.8x; runs of 1-2
# spans (set-up traces, stray spans with their own trace id as run) say nothing about a crew's
# runs and are left out of the median.
UNCALIBRATED_FACTOR = 4.0
UNCALIBRATED_FLOOR = 25
UNCALIBRATED_MIN_RUNS = 5
MEDIAN_MIN_SPANS = 3
EVIDENCE_SPANS = 20

_COLUMNS = [
    "trace_id", "span_ids", "run_id", "agent", "service", "spans", "calls", "limit", "ratio",
    "baseline", "threshold_version", "calibrated", "first_seen", "last_seen",
]  # fmt: skip


def baseline_limit(values: np.ndarray, quantile: float) -> float:
    """The limit a healthy baseline gives: its ``quantile`` times ``RUNAWAY_MARGIN``."""
    return float(np.quantile(np.asarray(values, dtype=np.float64), quantile) * RUNAWAY_MARGIN)


def _calibrated(conn: duckdb.DuckDBPyConnection) -> dict[str, tuple[float, int]]:
    rows = fetch_rows(
        conn,
        "SELECT name, arg_max(value, version), max(version) FROM thresholds "
        "WHERE name LIKE 'runaway_spans_per_%' GROUP BY name",
    )
    return {name: (float(value), int(version)) for name, value, version in rows}


def _limits(counts: pd.DataFrame, calibrated: dict[str, tuple[float, int]]) -> pd.DataFrame:
    """Per row: its limit, the baseline it came from and the threshold version (0 = window)."""
    out = counts.copy()
    typical = out[out["spans"] >= MEDIAN_MIN_SPANS]
    runs = typical[typical["whole_run"]]
    medians = runs.groupby("service")["spans"].median()
    sizes = runs.groupby("service").size()
    agent_medians = typical[~typical["whole_run"]].groupby("service")["spans"].median()
    # Vectorized (a Python loop over the rows cost ~80 s at 1M stored spans of 10-call runs).
    whole = out["whole_run"].to_numpy(dtype=bool)
    service = out["service"]
    run_median = service.map(medians).to_numpy(dtype=np.float64, na_value=np.nan)
    agent_median = service.map(agent_medians).to_numpy(dtype=np.float64, na_value=np.nan)
    median = np.where(whole, run_median, agent_median)
    enough = service.map(sizes).fillna(0).to_numpy(dtype=np.float64) >= UNCALIBRATED_MIN_RUNS
    limits = np.where(enough, np.maximum(UNCALIBRATED_FACTOR * median, UNCALIBRATED_FLOOR), np.inf)
    baselines = np.where(enough, "window_median", "none").astype(object)
    versions = np.zeros(len(out), dtype=np.int64)
    if calibrated:
        for i, (is_run, crew) in enumerate(zip(whole, service, strict=True)):
            name = f"{RUN_THRESHOLD if is_run else AGENT_THRESHOLD}:{crew}"
            if name in calibrated:
                limits[i], versions[i] = calibrated[name]
                baselines[i] = "calibrated"
    limits, baselines, versions = limits.tolist(), baselines.tolist(), versions.tolist()
    out["limit"] = limits
    out["baseline"] = baselines
    out["threshold_version"] = versions
    return out


@register(
    "runaway_runs",
    description="Runs (and agents in a run) with far more spans than their crew's runs usually have, "
    "and no step budget to stop them.",
    columns={
        **EVIDENCE,
        "agent": "agent over its limit; None when the whole run is",
        "service": "the run's service (its crew)",
        "spans": "spans of the run (or of the agent in the run)",
        "calls": "tool calls among them",
        "limit": "the crew's limit in spans: calibrated baseline quantile x margin, else "
        "4 x the crew's median in the window (at least 25)",
        "ratio": "spans / limit (> 1)",
        "baseline": "'calibrated' (thresholds runaway_spans_per_run|agent:<service>) or "
        "'window_median' (uncalibrated)",
        "threshold_version": "thresholds.version of the limit; 0 = uncalibrated",
        "calibrated": "False while the uncalibrated window-median limit is in force",
        **TIMES,
    },
    row="one run, or one agent in one run, over its crew's span limit (evidence: the first spans past it)",
    failure_mode="unaware of termination conditions: no budget stops a runaway run",
    mast_category="specification issues",
    title="runaway runs",
    findings=True,
    counted=True,
    failing=True,
    kept="whole",
)
def runaway_runs(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Runs and agents whose span count exceeds their crew's limit (runs with a budget excluded).

    Counts always come from the whole window of the crew (the run and agent filters only select
    the findings), so a filter never changes what counts as usual.
    """
    counts = run_sql(
        conn, "runaway_runs", window, Filters(service=filters.service, origin_task=filters.origin_task)
    )
    if counts.empty:
        return pd.DataFrame(columns=_COLUMNS)
    counts["whole_run"] = counts["whole_run"].astype(bool)
    rows = _limits(counts, _calibrated(conn))
    over = rows[rows["spans"] > rows["limit"]]
    if filters.run is not None:
        over = over[over["run_id"] == filters.run]
    if filters.agent is not None:
        over = over[over["agent"] == filters.agent]
    if over.empty:
        return pd.DataFrame(columns=_COLUMNS)
    agents = [
        "" if whole else str(agent) for whole, agent in zip(over["whole_run"], over["agent"], strict=True)
    ]
    evidence = run_sql(
        conn,
        "runaway_evidence",
        window,
        Filters(),
        flag_runs=over["run_id"].tolist(),
        flag_agents=agents,
        flag_limits=[int(np.floor(limit)) for limit in over["limit"]],
        evidence_spans=EVIDENCE_SPANS,
    )
    spans = {(r.run_id, r.agent): list(r.span_ids) for r in evidence.itertuples()}
    over = over.assign(
        agent=[agent or None for agent in agents],
        span_ids=[spans.get(key, []) for key in zip(over["run_id"], agents, strict=True)],
    )
    out = over.assign(
        ratio=over["spans"] / over["limit"],
        calibrated=over["baseline"] == "calibrated",
    )
    return out.sort_values(["first_seen", "run_id"]).reset_index(drop=True)
