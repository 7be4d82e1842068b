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
    if rows is None:
        records = span_records(spans)
        depths = [0] * len(records)
    else:
        records = span_records(spans.iloc[[r.position for r in rows]])
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


def interaction_edges(records: list[dict], conflict_spans: set[str] | None = None) -> list[dict]:
    """Every interaction between two agents of a run, one dict per (kind, from, to):

    * ``delegation``: a delegate span of ``from`` naming ``to`` (labelled by hop);
    * ``handoff``: a span of ``to`` whose parent span belongs to ``from`` (one agent invoking another);
    * ``shared key``: ``from`` wrote a state key that ``to`` read or also wrote (two writers: one
      edge, from the agent whose id sorts first).

    ``conflict`` is True when a span behind the edge failed or is evidence of a finding
    (``conflict_spans``), e.g. the clobbering write of a lost update. Edges come in the order
    their first span comes; linear in the spans (a 100,000-span run has one key written
    thousands of times: pairs of its spans are never listed).
    """
    conflict_spans = conflict_spans or set()
    edges: dict[tuple[str, str, str], dict] = {}
    labels: dict[tuple[str, str, str], set[str]] = {}

    def bad(r: dict) -> bool:
        return _failed(r) or r.get("span_id") in conflict_spans

    def add(kind: str, source: str, target: str, label: str, conflict: bool) -> None:
        if not source or not target or source == target:
            return
        key = (kind, source, target)
        edge = edges.get(key)
        if edge is None:
            edge = edges[key] = {
                "kind": kind,
                "source": source,
                "target": target,
                "labels": [],
                "conflict": False,
            }
            labels[key] = set()
        if label and label not in labels[key]:
            labels[key].add(label)
            edge["labels"].append(label)
        edge["conflict"] |= conflict

    for r in records:
        if r.get("op") == "delegate" and r.get("agent_id") and r.get("delegate_to"):
            hop = r.get("hop")
            add(
                "delegation",
                r["agent_id"],
                r["delegate_to"],
                "" if hop is None else f"hop {int(hop)}",
                bad(r),
            )
    by_id = {(r.get("trace_id"), r.get("span_id")): r for r in records}
    for r in records:
        parent = by_id.get((r.get("trace_id"), r.get("parent_span_id")))
        if parent is not None and r.get("op") != "delegate":
            add("handoff", parent.get("agent_id"), r.get("agent_id"), "", bad(r))
    # Per key and agent, in first-seen order: whether it wrote or read the key, and whether any of
    # those writes (reads) failed or is evidence. Every write of an agent has the same partners,
    # so the edges of a key are those of its first write per agent.
    keys: dict[str, dict[str, dict[str, list[bool]]]] = {}
    for r in records:
        if r.get("state_key") and r.get("op") in ("read", "write") and r.get("agent_id"):
            agents = keys.setdefault(r["state_key"], {"read": {}, "write": {}})[r["op"]]
            seen = agents.setdefault(r["agent_id"], [False])
            seen[0] |= bad(r)
    for key, ops in keys.items():
        writers, readers = ops["write"], ops["read"]
        for writer, writes_bad in writers.items():
            for op, partners in (("read", readers), ("write", writers)):
                for other, others_bad in partners.items():
                    if other == writer or (op == "write" and other < writer):
                        continue  # two writers: one edge, not two
                    add("shared key", writer, other, key, writes_bad[0] or others_bad[0])
    return list(edges.values())


def _positions(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    """Delegation depth from left to right when agents delegate, else a circle."""
    import math

    if edges:
        level = delegation_levels(edges, nodes)
        positions = {}
        for depth in sorted(set(level.values())):
            members = [n for n in nodes if level[n] == depth]
            for i, n in enumerate(members):
                positions[n] = (float(depth), (len(members) - 1) / 2 - i)
        return positions
    if len(nodes) == 1:
        return {nodes[0]: (0.0, 0.0)}
    return {
        n: (math.cos(2 * math.pi * i / len(nodes)), math.sin(2 * math.pi * i / len(nodes)))
        for i, n in enumerate(nodes)
    }


EDGE_STYLE = {"delegation": "solid", "handoff": "dot", "shared key": "dash"}
# The span fields the agent graph reads (a long run's other columns are not converted).
GRAPH_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "agent_id", "op", "delegate_to", "hop", "state_key",
    "outcome", "status_code",
)  # fmt: skip


def delegation_graph_figure(
    spans: pd.DataFrame, failed_agents: set[str] | None = None, conflict_spans: set[str] | None = None
) -> go.Figure:
    """Agents and every interaction of the run: delegations (arrows, by hop), handoffs (dotted
    arrows) and shared state keys (dashed lines, named on hover). Red: failing agents, and edges
    with a failed span or a finding's evidence (``conflict_spans``)."""
    title = "Agents and interactions"
    if spans is None or spans.empty:
        return empty_figure(title, "No spans for this run")
    failed_agents = set(failed_agents or ())
    records = span_records(spans[[c for c in GRAPH_COLUMNS if c in spans.columns]])
    for r in records:
        if _failed(r) and r.get("agent_id"):
            failed_agents.add(r["agent_id"])
    edges = interaction_edges(records, conflict_spans)
    nodes = sorted({r["agent_id"] for r in records if r.get("agent_id")} | {e["target"] for e in edges})
    if not nodes:
        return empty_figure(title, "No agents recorded in this run")
    delegations = [(e["source"], e["target"]) for e in edges if e["kind"] in ("delegation", "handoff")]
    positions = _positions(nodes, delegations)
    pairs = {(e["source"], e["target"]) for e in edges}
    fig = go.Figure()
    for kind in EDGE_STYLE:  # one legend entry per kind of interaction
        fig.add_scatter(
            x=[None], y=[None], mode="lines", name=kind,
            line=dict(color=MUTED_COLOR, dash=EDGE_STYLE[kind]), hoverinfo="skip",
        )  # fmt: skip
    for edge in edges:
        (x0, y0), (x1, y1) = positions[edge["source"]], positions[edge["target"]]
        # Edges both ways (ping-pong, two writers) and of several kinds are drawn a little apart.
        offset = {"delegation": 0.0, "handoff": 0.06, "shared key": -0.06}[edge["kind"]]
        if (edge["target"], edge["source"]) in pairs:
            offset += 0.12 if edge["source"] < edge["target"] else -0.12
        y0, y1 = y0 + offset, y1 + offset
        color = (
            FAIL_COLOR
            if edge["conflict"] or edge["target"] in failed_agents and edge["kind"] == "delegation"
            else MUTED_COLOR
        )
        label = ", ".join(edge["labels"][:3]) + (" …" if len(edge["labels"]) > 3 else "")
        hover = f"{esc(edge['kind'])}: {esc(edge['source'], 40)} → {esc(edge['target'], 40)}"
        if label:
            hover += f"<br>{esc(label, 120)}"
        if edge["conflict"]:
            hover += "<br>conflict: a failed span or a finding's evidence"
        fig.add_scatter(
            x=[x0, (x0 + x1) / 2, x1], y=[y0, (y0 + y1) / 2, y1], mode="lines",
            line=dict(color=color, width=2, dash=EDGE_STYLE[edge["kind"]]),
            hovertext=[hover] * 3, hoverinfo="text", showlegend=False,
        )  # fmt: skip
        if edge["kind"] != "shared key":
            fig.add_annotation(
                x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y",
                showarrow=True, arrowhead=3, arrowwidth=2, standoff=14, startstandoff=14, arrowcolor=color,
            )  # fmt: skip
        if edge["kind"] == "delegation" and label:
            fig.add_annotation(
                x=(x0 + x1) / 2, y=(y0 + y1) / 2, text=esc(label, 40), showarrow=False, yshift=10
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
    xs = [x for x, _ in positions.values()]
    ys = [y for _, y in positions.values()]
    fig.update_xaxes(visible=False, range=[min(xs) - 0.5, max(xs) + 0.5])
    fig.update_yaxes(visible=False, range=[min(ys) - 0.8, max(ys) + 0.8])
    return _layout(
        fig,
        title + " — solid: delegation, dotted: handoff, dashed: shared key; red: failing or conflicting",
        height=300 + 40 * len(nodes) // 2,
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
