"""Split-brain: divergent reads and lost updates, and a per-key version timeline of one run."""

import streamlit as st

from dashboard import ui
from dashboard.figures_run import version_timeline_figure
from dashboard.findings import as_list

ctx = ui.page_context()
st.title("Split-brain: shared state")
st.caption(
    "Agents that held different versions of the same key at once, and writes that silently replaced "
    "another agent's unread write."
)

reads = ui.load_metric(ctx, "divergent_reads")
updates = ui.load_metric(ctx, "lost_updates")
st.subheader("Divergent reads")
ui.findings_table(reads, "divergent reads", ui.described(ctx, "divergent_reads"))
st.subheader("Lost updates")
ui.findings_table(updates, "lost updates", ui.described(ctx, "lost_updates"))

st.subheader("Version timeline")
frames = [f for f in (reads, updates) if f is not None and not f.empty]
# Runs with a lost update first (the failure that took effect), then those with divergent reads.
runs = list(dict.fromkeys(r for f in reversed(frames) for r in sorted(f["run_id"].dropna().unique())))
runs = runs[: ui.PAGE_ROWS]
if ctx.filters.run and ctx.filters.run not in runs:
    runs.insert(0, ctx.filters.run)
if not runs:
    st.info(
        "Pick a run with split-brain findings (or a run in the sidebar) to see who read and wrote which version."
    )
else:
    # Not "Run": the sidebar's run filter is the page's one control of that name.
    run = st.selectbox("Timeline of run", runs, key="split_brain_run")
    spans = ui.cached_run_spans(ctx.source_key, ctx.version, run)
    keys = sorted(k for k in spans.get("state_key", []).dropna().unique()) if not spans.empty else []
    if not keys:
        st.info("This run has no shared-state reads or writes.")
    else:
        flagged = [k for f in frames for k in f.loc[f["run_id"] == run, "state_key"] if k in keys]
        first = keys.index(flagged[0]) if flagged else 0
        key = st.selectbox("State key", keys, index=first, key="split_brain_key")
        evidence = {s for f in frames for ids in f.loc[f["run_id"] == run, "span_ids"] for s in as_list(ids)}
        ui.plot(version_timeline_figure(spans, key, evidence), key="version_timeline")
        st.page_link(
            ui.view("run_explorer"), label="Open this run in the run explorer", query_params={"run": run}
        )
