"""What changed? A run beside its crew's healthy runs (issue 35).

``compare_run`` builds the crew baseline (the runs of the run's service in a window whose
``run_summary`` verdict, over that window as the Overview shows it, is healthy), summarises it per agent and tool, and says how the run differs:
per agent and tool (``compare_logic.differences``) and where it first departed (the earliest span
whose step no healthy run takes at that point of its sequence). With ``baseline=<run id>`` it
compares two runs side by side instead. The verdicts come from the ``run_summary`` metric; the
run's steps (and its closest baseline run's) from ``compare_steps.sql``; the baseline in one pass
over its spans from ``compare_baseline.sql``; the rest is the pure functions of
``analytics.compare_logic``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow.compute as pc

import analytics.compare_kept as compare_kept
from analytics import compare_findings
from analytics import compare_logic as logic
from analytics.engine import is_clickhouse
from analytics.registry import METRICS, run_metric
from analytics.sql_loader import filter_params, load_sql, query_df, run_sql
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

AUTO = "auto"
# Most healthy runs one baseline summarises (the newest); bounds a comparison's cost.
MAX_BASELINE_RUNS = 2000
# Other runs of the crew offered to compare with when it has no healthy run.
MAX_CANDIDATES = 20
# A healthy run of the service is in the run's crew when their agent sets overlap this much
# (Jaccard: shared agents over all agents of the two); none does: every healthy run of the service.
CREW_OVERLAP = 0.5


class RunNotFoundError(LookupError):
    """The run (or the chosen baseline run) has no spans in the store."""


class UnsupportedStoreError(NotImplementedError):
    """The store is ClickHouse: the comparison's SQL is DuckDB's."""


def _run_info(conn: duckdb.DuckDBPyConnection, run_id: str, what: str) -> dict[str, Any]:
    info = query_df(conn, load_sql("compare_run_service"), {"run": run_id})
    if info.empty:
        raise RunNotFoundError(f"no spans for {what} {run_id[:80]!r}; pick a run id from /api/v1/runs")
    row = info.iloc[0]
    return {"service": str(row["service"]), "spans": int(row["spans"]), "first_seen": row["first_seen"], "last_seen": row["last_seen"]}  # fmt: skip


def _verdict(conn: duckdb.DuckDBPyConnection, run_id: str, verdicts: pd.DataFrame) -> str | None:
    """The run's verdict from the crew's run_summary, else from run_summary of that run alone
    (the window may leave the run out)."""
    found = verdicts.loc[verdicts["run_id"] == run_id, "verdict"]
    if len(found) == 0:
        found = run_metric(conn, "run_summary", Window(), Filters(run=run_id), ["run_id", "verdict"])[
            "verdict"
        ]
    return str(found.iloc[0]) if len(found) else None


def _agents(conn: duckdb.DuckDBPyConnection, run_id: str, verdicts: pd.DataFrame) -> set[str]:
    """The run's agents from the crew's run_summary, else from run_summary of that run alone."""
    found = verdicts.loc[verdicts["run_id"] == run_id, "agents"]
    if len(found) == 0:
        found = run_metric(conn, "run_summary", Window(), Filters(run=run_id), ["run_id", "agents"])["agents"]
    return _agent_set(found.iloc[0]) if len(found) else set()


def _agent_set(value: Any) -> set[str]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return set()
    return {str(a) for a in value if a is not None and str(a) != ""}


def same_crew(healthy: pd.DataFrame, agents: set[str]) -> tuple[pd.DataFrame, str | None]:
    """The healthy runs (run_summary rows with ``agents``) of the run's crew: those whose agent
    set overlaps the run's ``agents`` by at least ``CREW_OVERLAP`` (Jaccard), since a service
    may host several crews; every one of them when none does (or the run names no agent), with
    a note saying so."""
    if healthy.empty or not agents:
        return healthy, None
    overlap = [
        len(agents & theirs) / len(agents | theirs) if theirs else 0.0
        for theirs in (_agent_set(v) for v in healthy["agents"])
    ]
    close = healthy[np.asarray(overlap) >= CREW_OVERLAP]
    if close.empty:
        return healthy, (
            f"no healthy run shares at least {CREW_OVERLAP:.0%} of its agents with this run: "
            "compared with every healthy run of the service"
        )
    if len(close) == len(healthy):
        return healthy, None
    return close, (
        f"the {len(close)} of {len(healthy)} healthy runs of the service whose agents overlap "
        f"this run's by at least {CREW_OVERLAP:.0%}"
    )


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain values (NaN -> None, numpy scalars -> Python), ready for JSON. Numpy
    columns convert whole (``tolist``); only the others value by value."""
    columns: dict[str, list[Any]] = {}
    for name in frame.columns:
        column = frame[name]
        kind = column.dtype.kind if isinstance(column.dtype, np.dtype) else "O"
        values = column.tolist()
        if kind in "iub":
            columns[name] = values
        elif kind == "f":
            columns[name] = [None if v != v else v for v in values]
        else:
            columns[name] = [_plain(v) for v in values]
    return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    return value


def compare_run(
    conn: duckdb.DuckDBPyConnection, run_id: str, baseline: str = AUTO, window: Window = Window()
) -> dict[str, Any]:
    """How run ``run_id`` differs from its crew's healthy runs in ``window`` (``baseline="auto"``)
    or from one chosen run (``baseline=<run id>``). ``RunNotFoundError`` when either has no spans,
    ``UnsupportedStoreError`` on a ClickHouse store.

    Keys: ``run`` (id, service, verdict, spans); ``baseline`` (mode, service, runs, run ids up to
    20, closest run, ``note`` when there is none to compare with); ``departure`` (None, or the
    first span whose step no baseline run takes at that point, or earlier a span a detector's
    finding names that no baseline run has (``compare_findings``): pos, span, agent, operation,
    tool, argument shape, reason, the steps the closest runs take there, ``evidence`` 'step' or
    'finding'); ``differences`` (per agent and tool, each with its span ids; the run's findings
    the baseline never has first, kind ``finding``); ``profile`` (the baseline per agent and
    tool beside the run's own counts); ``alignment`` (the run and the closest baseline run step by step);
    ``candidates`` (other runs of the crew with their verdicts, to pick one when there is no
    healthy run).
    """
    if is_clickhouse(conn):
        raise UnsupportedStoreError(
            "run comparison reads a DuckDB store; on a ClickHouse store it is not available yet. Compare "
            "on a DuckDB copy of the spans (driftscope ingest, or the serve database file)"
        )
    info = _run_info(conn, run_id, "run")
    service = info["service"]
    # The verdicts of the scope the Overview shows (the window, no filter: in serve the all-time
    # one is assembled from the findings tables), of the crew's runs.
    counted = list(compare_findings.count_columns(list(METRICS["run_summary"].columns)).values())
    verdicts = run_metric(
        conn, "run_summary", window, Filters(), ["run_id", "verdict", "last_seen", "agents", *counted]
    )
    crew = query_df(conn, load_sql("compare_crew_runs"), filter_params(window, Filters(service=service)))
    verdicts = verdicts[verdicts["run_id"].isin(set(crew["run_id"]))]
    others = verdicts[verdicts["run_id"] != run_id].sort_values("last_seen", ascending=False, kind="stable")
    result: dict[str, Any] = {
        "run": {"run_id": run_id, "service": service, "verdict": _verdict(conn, run_id, verdicts), "spans": info["spans"]},
        "departure": None,
        "differences": [],
        "profile": [],
        "alignment": [],
        "candidates": _records(others[["run_id", "verdict"]].head(MAX_CANDIDATES)),
    }  # fmt: skip
    crew_note = None
    if baseline == AUTO:
        healthy_runs = others[others["verdict"] == "healthy"]
        healthy_runs, crew_note = same_crew(healthy_runs, _agents(conn, run_id, verdicts))
        healthy = healthy_runs["run_id"].head(MAX_BASELINE_RUNS).astype(str).tolist()
        mode = "healthy runs"
        known = compare_findings.baseline_detectors(healthy_runs.head(MAX_BASELINE_RUNS))
    else:
        other = _run_info(conn, baseline, "baseline run")
        healthy = [baseline]
        mode = "chosen run"
        service = other["service"]
        known = None  # the chosen run's own findings, read below
    result["baseline"] = {"mode": mode, "service": service, "runs": len(healthy), "run_ids": healthy[:20], "closest_run": None}  # fmt: skip
    if crew_note:
        result["baseline"]["crew"] = crew_note
    if not healthy:
        result["baseline"]["note"] = (
            f"no baseline: crew {service!r} has no healthy run "
            + ("in this window" if window != Window() else "in the store")
            + " besides this one; compare with a run you pick (baseline=<run id>)"
        )
        return result
    own = run_steps(conn, run_id)
    base = baseline_parts(conn, healthy)
    found = departure(own, base)
    closest = found.pop("closest_run")
    closest_steps = own if closest == run_id else run_steps(conn, closest)
    # A healthy verdict: no finding took effect (past the crew's calibrated count), none to read.
    findings = compare_findings.run_findings(conn, run_id, own, result["run"]["verdict"])
    if known is None and len(findings):
        known = set(compare_findings.run_findings(conn, baseline, closest_steps)["metric"])
    findings = findings[~findings["metric"].isin(known or set())]
    found["departure"] = compare_findings.earliest(found["departure"], findings, own, base["runs"])
    result.update(found)
    result.update(differ(own, base, closest_steps, found["departure"]))
    result["differences"] = [
        {k: _plain(v) for k, v in d.items()} for d in compare_findings.finding_differences(findings, own)
    ] + result["differences"]
    result["baseline"]["closest_run"] = closest
    return result


def run_steps(conn: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """``compare_steps.sql`` rows of one run, from its spans (the run may be live: the steps
    table can be a pass behind)."""
    return run_sql(conn, "compare_steps", Window(), Filters(), runs=[run_id])


def baseline_parts(conn: duckdb.DuckDBPyConnection, runs: list[str]) -> dict[str, Any]:
    """The crew baseline over ``runs`` (``compare_kept.baseline_table``): its 'run' part as one
    entry per distinct step sequence (the newest run that took it, how many did, its length) and
    every sequence's step hashes concatenated (numpy, from Arrow lists without Python objects);
    its other parts as frames; ``runs``, how many runs it summarises."""
    table = compare_kept.baseline_table(conn, runs)
    part = table.column("part")
    per_run = table.filter(pc.equal(part, "run"))
    steps = pc.list_flatten(per_run.column("steps")).to_numpy(zero_copy_only=False)
    rest = table.filter(pc.not_equal(part, "run")).to_pandas()
    named = rest[rest["part"] == "step"]
    weights = per_run.column("run_count").to_numpy(zero_copy_only=False).astype(np.int64)
    return {
        "run_ids": [str(r) for r in per_run.column("run_id").to_pylist()],
        "weights": weights,
        "runs": int(weights.sum()),
        "lengths": pc.list_value_length(per_run.column("steps")).to_numpy(zero_copy_only=False),
        "steps": steps,
        "named": named.assign(step=[int(s[0]) for s in named["steps"]]),
        "counts": rest[rest["part"] == "count"],
        "subjects": rest[rest["part"] == "subject"],
    }


def departure(own: pd.DataFrame, base: dict[str, Any]) -> dict[str, Any]:
    """The first point of departure of a run's steps (``compare_steps.sql`` rows) from the
    baseline runs (``baseline_parts``) and the closest baseline run: of those that cover the
    run furthest, the one most like it (``compare_logic.closest_run``)."""
    run_ids = base["run_ids"]
    named = base["named"]
    named_hashes = [int(h) for h in named["step"]]
    own_hashes = [int(h) for h in own["step"]]
    hashes = list(dict.fromkeys(own_hashes + named_hashes))
    codes_of = {h: i for i, h in enumerate(hashes)}
    labels = dict(zip(own_hashes, own.itertuples(index=False), strict=True))
    labels.update(zip(named_hashes, named.itertuples(index=False), strict=True))
    text = [logic.step_label(*(getattr(labels[h], f) for f in logic.STEP_FIELDS)) for h in hashes]
    own_codes = np.array([codes_of[h] for h in own_hashes], dtype=np.int64)
    target = logic.to_blocks(np.zeros(len(own), dtype=np.int64), own_codes, own["pos"].to_numpy())
    blocks = logic.blocks_from_lists(base["lengths"], base["steps"], codes_of)
    stop_pos, stop_block = logic.departures(target, blocks, len(run_ids))
    lengths = np.asarray(base["lengths"], dtype=np.int64)
    weights = np.asarray(base["weights"], dtype=np.int64)
    furthest = stop_pos.max() if len(stop_pos) else logic.NO_DEPARTURE
    best = np.flatnonzero(stop_pos == furthest)
    subject_index: dict[tuple, int] = {}
    subject_of = np.array(
        [subject_index.setdefault(tuple(getattr(labels[h], f) for f in logic.SUBJECT_FIELDS), len(subject_index)) for h in hashes],
        dtype=np.int64,
    )  # fmt: skip
    closest = run_ids[logic.closest_run(blocks, best, subject_of, own_codes, lengths, len(own))]
    if furthest == logic.NO_DEPARTURE or own.empty:
        return {"departure": None, "closest_run": closest}
    row = own.iloc[int(furthest)]
    block = int(stop_block[best[0]])
    expected = logic.expected_steps(
        blocks, best, block, int(target.code[block]), int(target.count[block]), text, weights
    )
    repeats = block < len(target.code) and int(furthest) > int(target.start[block])
    found = {
        **logic.step_fields(row),
        "reason": "more repeats of this step than any baseline run makes here" if repeats
        else "no baseline run takes this step at this point",
        "expected": expected,
        "covered_by": int(weights[best].sum()),
    }  # fmt: skip
    return {"departure": found, "closest_run": closest}


def differ(
    own: pd.DataFrame, base: dict[str, Any], closest: pd.DataFrame, found: dict | None
) -> dict[str, Any]:
    """Differences per agent and tool, the profile beside the run's own counts, and the run
    aligned step by step with the closest baseline run."""
    profile = logic.baseline_profile(base["counts"], base["subjects"], base["runs"])
    targets = {str(t) for ts in profile["delegates_to"] for t in ts}
    diffs = logic.differences(own, profile, closest, targets)
    mine = logic.run_counts(own).rename(
        columns={"calls": "run_calls", "errors": "run_errors", "refusals": "run_refusals"}
    )
    profile = profile.merge(mine, on=list(logic.SUBJECT_FIELDS), how="outer")
    aligned = logic.alignment(own, closest, found["pos"] if found else None)
    return {
        "differences": [{k: _plain(v) for k, v in d.items()} for d in diffs],
        "profile": _records(profile),
        "alignment": _records(aligned),
    }
