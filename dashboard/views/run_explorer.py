"""Run explorer: one run's spans as a waterfall, its delegation graph, and each span's attributes."""

import streamlit as st

from dashboard import ui
from dashboard.figures_run import delegation_graph_figure, waterfall_figure
from dashboard.findings import findings_frame, run_failures

SPAN_COLUMNS = (
    "span_name", "agent_id", "tool_name", "op", "outcome", "reject_reason", "hop", "state_key",
    "state_version", "status_code", "span_id",
)  # fmt: skip


def _text(value) -> str:
    """A span field as display text (arrays joined)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def show_run(ctx: ui.PageContext, run: str) -> None:
    """Findings, waterfall, delegation graph and span attributes of one run."""
    spans = ui.cached_run_spans(ctx.source_key, ctx.version, run)
    if spans.empty:
        st.info(f"No spans stored for run {run!r}. It may be outside the data this source holds.")
        return
    found = ui.load_findings(ctx)
    findings = found.findings(run=run) if found is not None else []
    evidence, failed_agents = run_failures(findings)
    top = st.columns(4)
    top[0].metric("Spans", len(spans), border=True)
    top[1].metric("Agents", spans["agent_id"].nunique(), border=True)
    top[2].metric("Rejected / failed", int(spans["outcome"].isin(["rejected", "error"]).sum()), border=True)
    top[3].metric("Findings", len(findings), border=True)
    if findings:
        ui.table(findings_frame(findings), key="run_findings")
    left, right = st.columns([3, 2])
    with left:
        ui.plot(waterfall_figure(spans, evidence), key="waterfall")
    with right:
        ui.plot(delegation_graph_figure(spans, failed_agents), key="graph")

    st.subheader("Spans")
    columns = [c for c in SPAN_COLUMNS if c in spans.columns]
    picked = st.dataframe(
        spans[columns], hide_index=True, on_select="rerun", selection_mode="single-row", key="span_table"
    )
    rows = picked.selection.rows if picked is not None else []
    failing = spans.index[spans["outcome"].isin(["rejected", "error"]) | (spans["status_code"] == "Error")]
    # Without a click, show the first failing span: what an on-call engineer looks at first.
    span = spans.iloc[rows[0]] if rows else spans.loc[failing[0]] if len(failing) else spans.iloc[0]
    st.subheader(f"Attributes of span {span['span_id']}")
    st.caption(
        "Click a row above to inspect another span (default: the first failing one). Shown as text, never rendered."
    )
    blank = ("", "nan", "None", "NaT", "<NA>")
    fields = {k: _text(v) for k, v in span.items() if k != "attributes" and _text(v) not in blank}
    left, right = st.columns(2)
    left.json(fields, expanded=True)
    right.json(span.get("attributes") or {}, expanded=True)


ctx = ui.page_context()
st.title("Run explorer")
runs = ui.cached_run_totals(ctx.source_key, ctx.version, ctx.window, ctx.filters)
run_ids = [str(r) for r in runs["run_id"].head(ui.PAGE_ROWS)]  # the newest runs; others by ?run=
wanted = st.query_params.get("run") or ctx.filters.run
if wanted and wanted not in run_ids:
    run_ids.insert(0, wanted)
if not run_ids:
    ui.empty_state("runs")
else:
    run = st.selectbox("Run", run_ids, index=run_ids.index(wanted) if wanted else 0, key="explorer_run")
    if run != st.query_params.get("run"):
        st.query_params["run"] = run
    show_run(ctx, run)
