"""Figures and tables of a run comparison (issue 35): the run and a baseline run as two
waterfalls aligned by step, the departure marked, and the difference table (pure functions).

Every string from a span goes through ``esc`` (Plotly renders a small HTML subset in labels).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.compare_render import KIND_TEXT, subject_text
from dashboard.figures import FAIL_COLOR, MUTED_COLOR, OK_COLOR, WARN_COLOR, _layout, empty_figure, esc
from dashboard.filters import run_link

# Steps the aligned waterfalls draw (a browser draws a few hundred bars quickly).
ALIGNED_LIMIT = 400
DEPARTURE_COLOR = "#9467bd"
STATUS_COLOR = {"same": OK_COLOR, "changed": WARN_COLOR, "only_run": WARN_COLOR, "only_baseline": MUTED_COLOR}


def _bars(rows: pd.DataFrame, side: str, run_id: str | None) -> dict:
    """Bar arguments of one side (``run`` or ``baseline``) of the aligned steps."""
    present = rows[f"{side}_span_id"].notna()
    colors = []
    for status, error, marked in zip(rows["status"], rows[f"{side}_error"], rows["departure"], strict=True):
        if side == "run" and marked:
            colors.append(DEPARTURE_COLOR)
        elif error is True:
            colors.append(FAIL_COLOR)
        else:
            colors.append(STATUS_COLOR.get(status, OK_COLOR))
    hover = [
        f"<b>{esc(label, 80)}</b><br>{esc(run_id, 60)} · step {step} · span {esc(span)}<br>{esc(status)}"
        if isinstance(span, str)
        else ""
        for label, step, span, status in zip(
            rows[f"{side}_step"], rows["step"], rows[f"{side}_span_id"], rows["status"], strict=True
        )
    ]
    return dict(
        y=rows["step"].where(present).tolist(),
        x=rows[f"{side}_duration_ms"].clip(lower=0.05).where(present).tolist(),
        base=rows[f"{side}_start_ms"].where(present).tolist(),
        orientation="h",
        marker=dict(color=colors),
        hovertext=hover,
        hoverinfo="text",
        customdata=rows[f"{side}_span_id"].tolist(),
        showlegend=False,
    )


def aligned_waterfalls_figure(alignment: pd.DataFrame, run: str, baseline: str | None) -> go.Figure:
    """The run (left) and the baseline run (right) step by step (their ids in the hover): one row per aligned step, each
    side's bar at its time from its own run's start. Purple: the first point of departure; red:
    a failed call; orange: a step only one side takes, or another step in its place."""
    title = "Steps aligned"
    if alignment is None or alignment.empty:
        return empty_figure(title, "No steps to align")
    rows = alignment.head(ALIGNED_LIMIT)
    fig = make_subplots(
        rows=1,
        cols=2,
        shared_yaxes=True,
        horizontal_spacing=0.03,
        subplot_titles=(
            f"this run: {esc(run, 28)}",
            f"baseline: {esc(baseline, 28)}" if baseline else "baseline",
        ),
    )
    fig.add_trace(go.Bar(**_bars(rows, "run", run)), row=1, col=1)
    fig.add_trace(go.Bar(**_bars(rows, "baseline", baseline)), row=1, col=2)
    labels = [
        f"{'▶ ' if marked else ''}{esc(a if isinstance(a, str) else b, 50)}"
        for a, b, marked in zip(rows["run_step"], rows["baseline_step"], rows["departure"], strict=True)
    ]
    fig.update_yaxes(tickmode="array", tickvals=rows["step"].tolist(), ticktext=labels, autorange="reversed")
    fig.update_xaxes(title="ms from the run's start")
    return _layout(fig, title, height=160 + 22 * len(rows))


LEGEND = (
    "Each row is one step of the two runs, aligned by the order of their steps (not by time). "
    "Purple: the first departure; red: a failed call; orange: a step only one side takes, or "
    "another step in its place; grey: a step only the baseline run takes."
)


def difference_table(answer: dict) -> pd.DataFrame:
    """One row per difference: what, agent · tool, calls, baseline range, detail and a link to
    the run explorer at its first span (the closest baseline run's span for a missing step)."""
    run = answer["run"]["run_id"]
    closest = answer["baseline"].get("closest_run")
    rows = []
    for diff in answer.get("differences") or []:
        spans = diff.get("span_ids") or []
        theirs = diff.get("baseline_span_ids") or []
        if spans:
            link = run_link(run, span=spans[0])
        elif theirs and closest:
            link = run_link(closest, span=theirs[0])
        else:
            link = None
        rows.append(
            {
                "difference": KIND_TEXT.get(diff["kind"], diff["kind"]),
                "agent · tool": subject_text(diff),
                "calls": diff.get("calls"),
                "baseline": diff.get("baseline"),
                "detail": diff.get("detail"),
                "spans": len(spans),
                "span": link,
            }
        )
    columns = ["difference", "agent · tool", "calls", "baseline", "detail", "spans", "span"]
    return pd.DataFrame(rows, columns=columns)


def profile_table(answer: dict) -> pd.DataFrame:
    """The crew baseline per agent and tool beside the run's own calls."""
    frame = pd.DataFrame(answer.get("profile") or [])
    if frame.empty:
        return frame
    frame.insert(0, "agent · tool", [subject_text(r) for r in frame.to_dict("records")])
    keep = [
        "agent · tool", "run_calls", "calls_median", "calls_min", "calls_max", "runs_with", "run_errors",
        "error_rate", "refusal_rate", "duration_ms_median", "duration_ms_p95", "max_hop", "delegates_to",
        "usual_pos", "arg_shapes", "arg_chars_median", "distinct_args", "tokens_median", "cost_median",
    ]  # fmt: skip
    return frame[[c for c in keep if c in frame.columns]]
