"""Context drift: agents that kept acting on a superseded objective, sends under an old policy."""

import streamlit as st

from dashboard import ui
from dashboard.figures import holders_figure

ctx = ui.page_context()
st.title("Context drift")
st.caption("Who kept working from an outdated objective, and which outbound sends used a superseded policy.")

holders = ui.load_metric(ctx, "context_drift_holders")
st.subheader("Stale objective holders")
if holders is not None and not holders.empty:
    ui.plot(holders_figure(holders), key="holders")
ui.findings_table(holders, "agents holding superseded objectives", ui.described(ctx, "context_drift_holders"))

sends = ui.load_metric(ctx, "stale_policy_sends")
st.subheader("Sends against superseded policies")
if sends is not None and not sends.empty:
    allowed = int(sends["allowed"].sum())
    left, right = st.columns(2)
    left.metric("Stale sends that went out", allowed, border=True)
    right.metric("Stale sends a guard refused", int(len(sends) - allowed), border=True)
ui.findings_table(sends, "sends against superseded policies", ui.described(ctx, "stale_policy_sends"))
