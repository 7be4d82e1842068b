"""Plotly figures for the pages and reports: pure functions of DataFrames, testable without Streamlit.

Plotly renders label and hover text as a small HTML subset, so every string that may come from a
span (agent names, keys, versions, texts) goes through ``esc`` before it reaches a figure.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

FAIL_COLOR = "#d62728"
OK_COLOR = "#1f77b4"
MUTED_COLOR = "#9aa5b1"
WARN_COLOR = "#ff7f0e"
MAST_COLORS = {
    "specification": "#9467bd",
    "inter-agent misalignment": "#d62728",
    "task verification": "#ff7f0e",
}


def esc(value, limit: int = 200) -> str:
    """Escape (and shorten) text for a Plotly label or hover."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    text = str(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    return html.escape(text)


def _layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(
        title=esc(title), height=height, margin=dict(l=10, r=10, t=50, b=10), legend_title_text=""
    )
    return fig


def empty_figure(title: str, message: str) -> go.Figure:
    """A blank figure carrying a message (used where a chart has no data)."""
    fig = go.Figure()
    fig.add_annotation(text=esc(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height=220)


def findings_by_mode_figure(summary: pd.DataFrame) -> go.Figure:
    """Horizontal bars: findings per failure mode, coloured by MAST category."""
    if summary.empty:
        return empty_figure("Findings by failure mode", "No findings in this window")
    fig = go.Figure()
    for category, part in summary.groupby("mast_category", sort=False):
        fig.add_bar(
            y=[esc(m, 60) for m in part.get("title", part["failure_mode"])],
            x=part["findings"],
            orientation="h",
            name=esc(category),
            marker_color=MAST_COLORS.get(category, MUTED_COLOR),
        )
    fig.update_layout(barmode="stack", yaxis=dict(autorange="reversed"))
    fig.update_xaxes(title="findings")
    return _layout(fig, "Findings by failure mode (colour: MAST category)", height=120 + 32 * len(summary))


def threshold_label(threshold: float, calibrated: bool, version) -> str:
    """``threshold 0.25 (calibrated v3)`` or ``... (uncalibrated default)``."""
    state = f"calibrated v{int(version)}" if calibrated else "uncalibrated default"
    return f"threshold {threshold:.3g} ({state})"


def rejection_rate_figure(frame: pd.DataFrame, by: str = "tool_name") -> go.Figure:
    """Rejection rate per time bucket, a bar per ``by`` value in each bucket, with the threshold line."""
    title = "Rejection rate over time"
    if frame is None or frame.empty:
        return empty_figure(title, "No guarded calls in this window")
    data = frame.copy()
    data[by] = data[by].fillna("(none)")
    grouped = data.groupby(["bucket_start", by], sort=True)[["attempts", "rejections"]].sum().reset_index()
    grouped["rate"] = grouped["rejections"] / grouped["attempts"].where(grouped["attempts"] > 0)
    refused = grouped.groupby(by)["rejections"].sum()
    if (refused > 0).any():  # series that never refused anything only add noise at 0 %
        grouped = grouped[grouped[by].isin(refused[refused > 0].index)]
    fig = go.Figure()
    # Bars, one per bucket and series: a rate is per bucket, and lines between hourly buckets drew
    # diagonals that read as a trend.
    for value, part in grouped.groupby(by, sort=True):
        fig.add_bar(
            x=part["bucket_start"],
            y=part["rate"],
            name=esc(value, 40),
            customdata=part[["rejections", "attempts"]].to_numpy(),
            hovertemplate="%{y:.0%} (%{customdata[0]} of %{customdata[1]})<extra>"
            + esc(value, 40)
            + "</extra>",
        )
    first = frame.iloc[0]
    threshold = float(first["threshold"])
    fig.add_hline(
        y=threshold,
        line_dash="dash",
        line_color=FAIL_COLOR,
        annotation_text=esc(
            threshold_label(threshold, bool(first["calibrated"]), first["threshold_version"])
        ),
        annotation_position="top left",
    )
    if grouped["bucket_start"].nunique() == 1 and "bucket_seconds" in frame.columns:
        # One bucket: give the axis the bucket's width instead of Plotly's sub-millisecond ticks.
        start = pd.Timestamp(grouped["bucket_start"].iloc[0])
        width = pd.Timedelta(seconds=int(frame["bucket_seconds"].iloc[0]))
        fig.update_xaxes(range=[start - width / 2, start + width / 2])
    fig.update_yaxes(title="rejected / attempted", tickformat=".0%", rangemode="tozero")
    fig.update_layout(barmode="group")
    return _layout(fig, f"{title} by {by.replace('_', ' ')}")


def rejections_by_figure(frame: pd.DataFrame, by: str) -> go.Figure:
    """Bars of rejections and errors per ``by`` value (tool, key or agent) over the window."""
    title = f"Rejections by {by.replace('_', ' ')}"
    if frame is None or frame.empty:
        return empty_figure(title, "No guarded calls in this window")
    data = frame.copy()
    data[by] = data[by].fillna("(none)")
    totals = (
        data.groupby(by)[["attempts", "rejections", "errors"]]
        .sum()
        .sort_values("rejections", ascending=False)
    )
    fig = go.Figure()
    labels = [esc(v, 40) for v in totals.index]
    fig.add_bar(x=labels, y=totals["rejections"], name="rejected by a guard", marker_color=FAIL_COLOR)
    fig.add_bar(x=labels, y=totals["errors"], name="tool error", marker_color=WARN_COLOR)
    fig.add_bar(
        x=labels,
        y=totals["attempts"] - totals["rejections"] - totals["errors"],
        name="ok",
        marker_color=OK_COLOR,
    )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="guarded calls")
    return _layout(fig, title)


def divergence_histogram_figure(
    values: pd.Series, threshold: float, label: str, bin_width: float = 0.02, weights: pd.Series | None = None
) -> go.Figure:
    """Histogram of goal-divergence scores with the threshold line.

    Binned here (``bin_width`` wide bins, split at the threshold), so the figure carries counts per
    bin rather than every score: a window with a million subtasks is still a small figure.
    ``weights`` counts each value that many times (``subtasks`` of goal_divergence_distribution).
    """
    title = "Goal divergence distribution"
    values = pd.to_numeric(values, errors="coerce")
    counts = np.ones(len(values), dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    keep = values.notna().to_numpy()
    values, counts = values.to_numpy(dtype=float)[keep], counts[keep]
    if values.size == 0:
        return empty_figure(title, "No divergence scores in this window")
    fig = go.Figure()
    for name, over, color in (
        ("at or below threshold", False, OK_COLOR),
        ("above threshold", True, FAIL_COLOR),
    ):
        side = (values > threshold) == over
        if not side.any():
            continue
        bins = np.floor(values[side] / bin_width).astype(np.int64)
        keys, inverse = np.unique(bins, return_inverse=True)
        per_bin = np.bincount(inverse, weights=counts[side], minlength=len(keys)).astype(np.int64)
        fig.add_bar(
            x=(keys + 0.5) * bin_width, y=per_bin, width=bin_width, name=name, marker_color=color,
            hovertemplate="%{y} subtasks at %{x:.2f}<extra></extra>",
        )  # fmt: skip
    fig.add_vline(x=threshold, line_dash="dash", line_color=FAIL_COLOR, annotation_text=esc(label))
    fig.update_layout(barmode="overlay", bargap=0)
    fig.update_traces(opacity=0.8)
    fig.update_xaxes(title="1 - cosine similarity to the root goal")
    fig.update_yaxes(title="subtasks")
    return _layout(fig, title)


def roc_figure(points: pd.DataFrame, chosen: float | None = None, auc: float | None = None) -> go.Figure:
    """ROC curve from ``fpr``/``tpr`` (and optional ``threshold``) columns, with the chosen point."""
    title = "ROC of the calibrated threshold" + (f" (AUC {auc:.3f})" if auc is not None else "")
    if points is None or points.empty:
        return empty_figure(title, "No labelled calibration data recorded")
    fig = go.Figure()
    fig.add_scatter(x=points["fpr"], y=points["tpr"], mode="lines+markers", name="ROC", marker_color=OK_COLOR)
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="chance", line=dict(dash="dot", color=MUTED_COLOR))
    if chosen is not None and "threshold" in points.columns:
        nearest = points.iloc[(points["threshold"] - chosen).abs().argsort()[:1]]
        fig.add_scatter(
            x=nearest["fpr"], y=nearest["tpr"], mode="markers", name=f"chosen {chosen:.3g}",
            marker=dict(size=14, color=FAIL_COLOR, symbol="star"),
        )  # fmt: skip
    fig.update_xaxes(title="false-positive rate", range=[0, 1])
    fig.update_yaxes(title="true-positive rate", range=[0, 1.02])
    return _layout(fig, title)


def holders_figure(holders: pd.DataFrame, limit: int = 40) -> go.Figure:
    """How long each agent kept acting on a superseded objective, per run (s since the run's first hold)."""
    title = "Time spent on a superseded objective"
    if holders is None or holders.empty:
        return empty_figure(title, "No agent held a superseded objective")
    data = holders.dropna(subset=["held_from"])
    if data.empty:
        return empty_figure(title, "No hold intervals recorded")
    if len(data) > limit:  # one bar per hold: show the longest holds, not thousands of bars
        title += f" ({limit} longest of {len(data):,})"
        data = data.assign(_w=pd.to_datetime(data["held_until"]) - pd.to_datetime(data["held_from"]))
        data = data.sort_values("_w", ascending=False, kind="stable").head(limit).drop(columns="_w")
    data = data.copy()
    data["held_from"] = pd.to_datetime(data["held_from"])
    data["held_until"] = pd.to_datetime(data["held_until"]).fillna(data["held_from"])
    first = data.groupby("run_id")["held_from"].transform("min")
    starts = (data["held_from"] - first).dt.total_seconds()
    widths = (data["held_until"] - data["held_from"]).dt.total_seconds().clip(lower=0.05)
    labels = [f"{esc(a, 24)} · {esc(r, 40)}" for a, r in zip(data["agent"], data["run_id"], strict=True)]
    fig = go.Figure(
        go.Bar(
            y=labels,
            x=widths,
            base=starts,
            orientation="h",
            marker_color=FAIL_COLOR,
            hovertext=[
                f"{esc(o, 40)}: held {esc(v, 20)}, superseded by {esc(n, 20)} for {w:.1f} s"
                for o, v, n, w in zip(
                    data["objective_id"], data["held_version"], data["superseded_by"], widths, strict=True
                )
            ],
            hoverinfo="text",
        )  # fmt: skip
    )
    fig.update_xaxes(title="seconds since the run's first stale hold", rangemode="tozero")
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, title, height=160 + 30 * len(data))


_STATUS_CODES = {"carried": 0, "waived": 1, "missing_after_waiver": 2, "missing": 3}
_STATUS_SCALE = [
    [0.0, "#2ca02c"], [0.25, "#2ca02c"], [0.25, "#f2c14e"], [0.5, "#f2c14e"],
    [0.5, "#ff7f0e"], [0.75, "#ff7f0e"], [0.75, FAIL_COLOR], [1.0, FAIL_COLOR],
]  # fmt: skip


def constraint_heatmap_figure(ledger: pd.DataFrame, origin_task: str) -> go.Figure:
    """Constraint x hop for one origin task: carried (green), waived (yellow), missing (red)."""
    title = f"Constraints of {origin_task} along the delegation chain"
    rows = (
        ledger[ledger["origin_task_id"] == origin_task] if ledger is not None and not ledger.empty else None
    )
    if rows is None or rows.empty:
        return empty_figure(title, "No ledger for this origin task")
    rows = rows.drop_duplicates(["constraint_id", "hop"])
    hops = sorted(int(h) for h in rows["hop"].dropna().unique())
    constraints = sorted(rows["constraint_id"].dropna().unique())
    z, text, hover = [], [], []
    for cid in constraints:
        zrow, trow, hrow = [], [], []
        for hop in hops:
            cell = rows[(rows["constraint_id"] == cid) & (rows["hop"] == hop)]
            status = cell["status"].iloc[0] if not cell.empty else None
            reason = cell["waiver_reason"].iloc[0] if not cell.empty and "waiver_reason" in cell else None
            zrow.append(_STATUS_CODES.get(status))
            trow.append(esc(status or ""))
            hrow.append(
                esc(status or "") + (f": {esc(reason, 160)}" if isinstance(reason, str) and reason else "")
            )
        z.append(zrow)
        text.append(trow)
        hover.append(hrow)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"hop {h}" for h in hops],
            y=[esc(c, 40) for c in constraints],
            text=text,
            hovertext=hover,
            hoverinfo="text",
            texttemplate="%{text}",
            textfont=dict(size=14, color="white"),
            colorscale=_STATUS_SCALE,
            zmin=-0.5,
            zmax=3.5,
            showscale=False,
            xgap=2,
            ygap=2,
        )  # fmt: skip
    )
    fig.update_yaxes(autorange="reversed")
    return _layout(
        fig, title + " — green carried · yellow waived · red missing", height=160 + 36 * len(constraints)
    )


def _weighted_quantile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """``np.quantile(np.repeat(values, counts), q)`` (linear interpolation) without repeating."""
    order = np.argsort(values, kind="stable")
    values, ends = values[order], np.cumsum(counts[order])
    position = (ends[-1] - 1) * q
    low = int(np.floor(position))
    at = np.searchsorted(ends, [low, min(low + 1, ends[-1] - 1)], side="right")
    return float(values[at[0]] + (position - low) * (values[at[1]] - values[at[0]]))


def goal_divergence_figure(
    frame: pd.DataFrame, score: str = "divergence", chain: str = "origin_task_id", max_chains: int = 40
) -> go.Figure:
    """Divergence from the root goal per hop, one line per delegation chain, the band above threshold red.

    ``frame`` is one row per subtask, or a ``goal_divergence_distribution`` frame (a ``subtasks``
    count per row, ``chains`` counted in SQL, ``chain`` None when there are too many for lines).
    """
    title = "Goal divergence along delegation chains"
    if frame is None or frame.empty:
        return empty_figure(title, "No delegated subtasks with goal texts in this window")
    used = [
        c
        for c in (score, chain, "run_id", "hop", "subtask", "threshold", "calibrated", "threshold_version")
        + ("subtasks", "chains")
        if c in frame
    ]
    data = frame.loc[:, used].dropna(subset=[score])
    if "chains" in data:  # aggregated rows: chains were counted before aggregation
        chains = int(data["chains"].max()) if len(data) else 0
    else:
        data[chain] = data[chain].fillna(data["run_id"] if "run_id" in data else "(chain)")
        chains = data[chain].nunique()
    data["hop"] = data["hop"].fillna(0)
    data = data.sort_values([chain, "hop"])
    fig = go.Figure()
    if chains <= max_chains and data[chain].notna().any():
        for name, part in data.groupby(chain, sort=True):
            fig.add_scatter(
                x=part["hop"], y=part[score], mode="lines+markers", name=esc(name, 40),
                hovertext=[esc(t, 160) for t in part.get("subtask", pd.Series([""] * len(part)))],
                hoverinfo="text+y",
            )  # fmt: skip
    else:  # too many chains for a line each: the distribution per hop
        title += f" ({chains:,} chains: median, 90th percentile and maximum per hop)"
        counts = data["subtasks"] if "subtasks" in data else pd.Series(1, index=data.index)
        rows = []
        for hop, part in data.groupby("hop", sort=True):
            values = part[score].to_numpy(dtype=float)
            weights = counts.loc[part.index].to_numpy(dtype=np.int64)
            rows.append(
                {
                    "hop": hop,
                    "median": _weighted_quantile(values, weights, 0.5),
                    "p90": _weighted_quantile(values, weights, 0.9),
                    "max": float(values.max()),
                    "n": int(weights.sum()),
                }
            )
        stats = pd.DataFrame(rows, columns=["hop", "median", "p90", "max", "n"])
        for column, dash in (("median", None), ("p90", "dot"), ("max", "dash")):
            fig.add_scatter(
                x=stats["hop"], y=stats[column], mode="lines+markers", name=column, line=dict(dash=dash),
                customdata=stats["n"], hovertemplate="hop %{x}: %{y:.3f} (%{customdata} subtasks)",
            )  # fmt: skip
    threshold = float(data["threshold"].iloc[0]) if "threshold" in data and not data.empty else None
    if threshold is not None:
        calibrated = bool(data["calibrated"].iloc[0]) if "calibrated" in data else False
        version = data["threshold_version"].iloc[0] if "threshold_version" in data else 0
        fig.add_hrect(
            y0=threshold,
            y1=max(1.0, float(data[score].max())),
            fillcolor=FAIL_COLOR,
            opacity=0.08,
            line_width=0,
        )
        fig.add_hline(
            y=threshold, line_dash="dash", line_color=FAIL_COLOR,
            annotation_text=esc(threshold_label(threshold, calibrated, version)), annotation_position="top left",
        )  # fmt: skip
    fig.update_xaxes(title="hop", dtick=1)
    fig.update_yaxes(title="1 - cosine similarity to the root goal", rangemode="tozero")
    return _layout(fig, title)
