"""Rejections and enforcement: rejection rates over time, what the guards prevented, guard coverage."""

import streamlit as st

from dashboard import ui
from dashboard.figures import rejection_rate_figure, rejections_by_figure
from dashboard.findings import finding_rows

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
        described = ui.described(ctx, "rejection_rates")
        over = finding_rows(rates, described)  # the flagged buckets
        ui.findings_table(over, "buckets over the rejection-rate threshold", described)

coverage = ui.load_metric(ctx, "enforcement_coverage")
if coverage is not None:
    st.subheader("What each guard prevented")
    prevented = coverage[coverage["prevented"] > 0]
    if prevented.empty:
        st.caption("No guard refused a call in this window.")
    else:
        ui.table(
            prevented[["service", "tool_name", "prevented", "prevented_reasons", "agents"]], key="prevented"
        )
    st.subheader("Guard coverage: guarded vs unguarded tools")
    st.caption(
        "`enforced`: every call went through a guard; `partial`: some anti-patterns (unversioned writes, "
        "unstructured delegations, sends without policy, side effects without idempotency key); "
        "`watch_only`: never guarded, driftscope can only detect failures after the fact."
    )
    if coverage.empty:
        ui.empty_state("tool calls")
    else:
        columns = ["service", "tool_name", "coverage", "calls", "guarded_calls", "prevented", "anti_patterns",
                   "writes", "versioned_writes", "delegations", "structured_delegations", "sends",
                   "sends_with_policy", "side_effects", "side_effects_with_key"]  # fmt: skip
        ui.table(coverage[columns], key="coverage")
