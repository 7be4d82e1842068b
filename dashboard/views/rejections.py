"""Rejections and enforcement: rejection rates over time, what the guards prevented, guard coverage."""

import streamlit as st

from dashboard import ui
from dashboard.figures import rejection_rate_figure, rejections_by_figure

ctx = ui.page_context()
st.title("Rejections & enforcement")
st.caption(
    "A rejection is a guard refusing a call (stale version, missing constraint, superseded policy, …): "
    "the failure it prevented. Errors are tools that failed on their own."
)

rates = ui.load_metric(ctx, "rejection_rates")
if rates is not None:
    if rates.empty:
        ui.empty_state("guarded calls")
    else:
        by = st.segmented_control(
            "Group by", ["tool_name", "state_key", "agent"], default="tool_name", key="rejections_by",
            format_func=lambda c: c.replace("_", " "),
        ) or "tool_name"  # fmt: skip
        left, right = st.columns(2)
        with left:
            ui.plot(rejection_rate_figure(rates, by=by), key="rate")
        with right:
            ui.plot(rejections_by_figure(rates, by), key="by")
        st.subheader("Buckets over the threshold")
        over = rates[rates["over_threshold"]]
        ui.findings_table(over, "buckets over the rejection-rate threshold", key="over")

names = {m["name"] for m in ui.cached_metrics_list(ctx.source_key)}
st.subheader("What each guard prevented")
if "enforcement_coverage" in names:
    coverage = ui.load_metric(ctx, "enforcement_coverage")
    if coverage is not None and not coverage.empty:
        ui.table(coverage, key="coverage")
    else:
        ui.empty_state("guarded or unguarded tool calls")
else:
    st.info("This source has no `enforcement_coverage` detector yet, so guard coverage cannot be shown.")
