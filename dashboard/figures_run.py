"""Figures of one run: span waterfall, delegation graph, per-key version timeline (pure functions).

Every string from a span goes through ``esc`` (Plotly renders a small HTML subset in labels).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures import FAIL_COLOR, MUTED_COLOR, OK_COLOR, WARN_COLOR, _layout, empty_figure, esc


def span_records(spans: pd.DataFrame) -> list[dict]:
    """Span rows as dicts with missing values as None (NaN is truthy and unorderable)."""
    return spans.astype(object).where(spans.notna(), None).to_dict("records")


def _failed(row) -> bool:
    return row.get("outcome") in ("rejected", "error") or row.get("status_code") == "Error"


def waterfall_figure(
    spans: pd.DataFrame,
    highlight: set[str] | None = None,
    rows: list | None = None,
    matches: set[str] | None = None,
    selected: str | None = None,
) -> go.Figure:
    """A run's spans as a timeline (ms from the run's first span) beside the trace tree.

    With ``rows`` (``dashboard.trace.trace_rows``) the bars follow the tree's depth-first order
    and labels are indented by depth. Red: rejected or failed; orange: evidence of the selected
    finding (``highlight``); black outline: search ``matches``; thick outline: the ``selected`` span.
    """
    title = "Timeline"
    if spans is None or spans.empty:
        return empty_figure(title, "No spans for this run")
    highlight = highlight or set()
    matches = matches or set()
    t0 = int(spans["start_ns"].min())
    every = span_records(spans)
    if rows is None:
        records, depths = every, [0] * len(every)
    else:
        records = [every[r.position] for r in rows]
        depths = [r.depth for r in rows]
    starts = [(int(r["start_ns"]) - t0) / 1e6 for r in records]
    widths = [max((int(r["end_ns"]) - int(r["start_ns"])) / 1e6, 0.05) for r in records]
    colors = [
        FAIL_COLOR if _failed(r) else WARN_COLOR if r.get("span_id") in highlight else OK_COLOR
        for r in records
    ]
    outline = [
        3 if r.get("span_id") == selected else 1.5 if r.get("span_id") in matches else 0 for r in records
    ]
    labels = [
        f"{'· ' * min(d, 12)}{esc(r.get('agent_id') or '-', 30)} · {esc(r.get('span_name'), 40)}"
        for r, d in zip(records, depths, strict=True)
    ]
    hover = [
        "<br>".join(
            [
                f"<b>{esc(r.get('span_name'), 80)}</b>",
                f"span {esc(r.get('span_id'))} · trace {esc(r.get('trace_id'))}",
                f"agent {esc(r.get('agent_id'))}",
                f"tool {esc(r.get('tool_name'))}",
                f"op {esc(r.get('op'))} outcome {esc(r.get('outcome'))} {esc(r.get('reject_reason'))}",
                f"status {esc(r.get('status_code'))}",
                "finding evidence" if r.get("span_id") in highlight else "",
            ]
        )
        for r in records
    ]
    fig = go.Figure(
        go.Bar(
            y=list(range(len(records))),
            x=widths,
            base=starts,
            orientation="h",
            marker=dict(color=colors, line=dict(color="#111111", width=outline)),
            hovertext=hover,
            hoverinfo="text",
            customdata=[r.get("span_id") for r in records],
        )
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(range(len(records))),
        ticktext=labels,
        autorange="reversed",
    )
    fig.update_xaxes(title="ms since the run's first span")
    return _layout(
        fig,
        title + " — red: rejected or failed, orange: evidence of the selected finding",
        height=140 + 22 * len(records),
    )


def delegation_levels(edges: list[tuple[str, str]], nodes: list[str]) -> dict[str, int]:
    """Depth of each agent in the delegation graph (roots: agents nobody delegates to)."""
    targets = {b for _, b in edges}
    roots = [n for n in nodes if n not in targets] or nodes[:1]  # a pure cycle: start anywhere
    level = {n: 0 for n in roots}
    frontier = list(level)
    while frontier:
        nxt = []
        for a, b in edges:
            if a in frontier and b not in level:
                level[b] = level[a] + 1
                nxt.append(b)
        frontier = nxt
    for n in nodes:
        level.setdefault(n, max(level.values(), default=-1) + 1)
    return level


def delegation_edges(delegations: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Delegation spans grouped by (delegating agent, receiving agent), in first-seen order."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for r in delegations:
        grouped.setdefault((r["agent_id"], r["delegate_to"]), []).append(r)
    return grouped


def delegation_graph_figure(spans: pd.DataFrame, failed_agents: set[str] | None = None) -> go.Figure:
    """Agents as nodes, delegations as arrows labelled by hop; failing agents and delegations in red."""
    title = "Delegation graph"
    if spans is None or spans.empty:
        return empty_figure(title, "No spans for this run")
    failed_agents = set(failed_agents or ())
    records = span_records(spans)
    for r in records:
        if _failed(r) and r.get("agent_id"):
            failed_agents.add(r["agent_id"])
    delegations = [
        r for r in records if r.get("op") == "delegate" and r.get("agent_id") and r.get("delegate_to")
    ]
    nodes = sorted(
        {r["agent_id"] for r in records if r.get("agent_id")} | {r["delegate_to"] for r in delegations}
    )
    if not nodes:
        return empty_figure(title, "No agents recorded in this run")
    edges = [(r["agent_id"], r["delegate_to"]) for r in delegations]
    pairs = set(edges)
    level = delegation_levels(edges, nodes)
    positions: dict[str, tuple[float, float]] = {}
    for depth in sorted(set(level.values())):
        members = [n for n in nodes if level[n] == depth]
        for i, n in enumerate(members):
            positions[n] = (float(depth), (len(members) - 1) / 2 - i)
    fig = go.Figure()
    for (source, target), group in delegation_edges(delegations).items():
        (x0, y0), (x1, y1) = positions[source], positions[target]
        # A -> B and B -> A both exist in ping-pong: draw them a little apart.
        shift = (
            0.12
            if (target, source) in pairs and source < target
            else -0.12
            if (target, source) in pairs
            else 0
        )
        y0, y1 = y0 + shift, y1 + shift
        bad = any(_failed(r) for r in group) or target in failed_agents
        fig.add_annotation(
            x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y",
            showarrow=True, arrowhead=3, arrowwidth=2, standoff=14, startstandoff=14,
            arrowcolor=FAIL_COLOR if bad else MUTED_COLOR,
        )  # fmt: skip
        hops = sorted({int(r["hop"]) for r in group if r.get("hop") is not None and not pd.isna(r["hop"])})
        label = (
            ("hop " if len(hops) == 1 else "hops ") + ", ".join(map(str, hops)) if hops else f"{len(group)}×"
        )
        fig.add_annotation(
            x=(x0 + x1) / 2, y=(y0 + y1) / 2, text=label, showarrow=False, yshift=10 if shift >= 0 else -10
        )
    fig.add_scatter(
        x=[positions[n][0] for n in nodes],
        y=[positions[n][1] for n in nodes],
        mode="markers+text",
        text=[esc(n, 40) for n in nodes],
        textposition="bottom center",
        marker=dict(size=26, color=[FAIL_COLOR if n in failed_agents else OK_COLOR for n in nodes]),
        hovertext=[f"{esc(n)}{' — failures' if n in failed_agents else ''}" for n in nodes],
        hoverinfo="text",
        showlegend=False,
    )
    fig.update_xaxes(visible=False, range=[-0.5, max(level.values()) + 0.5])
    ys = [y for _, y in positions.values()]
    fig.update_yaxes(visible=False, range=[min(ys) - 0.8, max(ys) + 0.8])
    return _layout(
        fig, title + " — red: agent or delegation with failures", height=260 + 40 * len(nodes) // 2
    )


def version_timeline_figure(
    spans: pd.DataFrame, state_key: str, highlight: set[str] | None = None
) -> go.Figure:
    """Who read (circle) and wrote (square) which version of one key over time; rejected writes as X."""
    title = f"Versions of {state_key}"
    if spans is None or spans.empty or "state_key" not in spans.columns:
        return empty_figure(title, "No state operations")
    ops = spans[(spans["state_key"] == state_key) & spans["op"].isin(["read", "write"])]
    if ops.empty:
        return empty_figure(title, "No reads or writes of this key in the run")
    highlight = highlight or set()
    fig = go.Figure()
    for op, symbol in (("read", "circle"), ("write", "square")):
        part = ops[ops["op"] == op]
        if part.empty:
            continue
        rejected = part["outcome"].eq("rejected")
        fig.add_scatter(
            x=part["Timestamp"],
            y=[esc(a, 30) for a in part["agent_id"]],
            mode="markers+text",
            name=f"{op}",
            text=[esc(v, 20) for v in part["state_version"]],
            textposition="top center",
            marker=dict(
                size=14,
                symbol=["x" if rej else symbol for rej in rejected],
                color=[
                    FAIL_COLOR if rej or sid in highlight else OK_COLOR
                    for rej, sid in zip(rejected, part["span_id"], strict=True)
                ],
            ),
            hovertext=[
                f"{op} {esc(v)} (expected {esc(e)}) {esc(o)}"
                for v, e, o in zip(
                    part["state_version"], part["state_expected_version"], part["outcome"], strict=True
                )
            ],
            hoverinfo="text",
        )
    fig.update_yaxes(title="agent")
    return _layout(fig, title + " — red: finding evidence or rejected")
