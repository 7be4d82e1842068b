"""Other findings: every finding detector without a page of its own (runaway runs, new detectors).

The list follows the metric descriptions of the source, so a newly registered detector shows here
with no dashboard change.
"""

import streamlit as st

from dashboard import ui
from dashboard.findings import finding_metrics, finding_rows, naming, short_title

ctx = ui.page_context()
st.title("Other findings")
st.caption("Detectors whose findings have no page of their own, each with its runs and evidence spans.")

metrics = [m for m in finding_metrics(ui.cached_metrics_list(ctx.source_key)) if not m.get("page")]
if not metrics:
    st.info("Every detector of this source has a page of its own.")
for metric in metrics:
    mode, category = naming(metric)
    st.subheader(short_title(metric))
    st.caption(
        f"{metric.get('description', '')} Failure mode: {mode} (MAST: {category}); detector `{metric['name']}`."
    )
    frame = ui.load_metric(ctx, metric["name"])
    rows = finding_rows(frame, metric) if frame is not None else None
    ui.findings_table(rows, short_title(metric), metric)
