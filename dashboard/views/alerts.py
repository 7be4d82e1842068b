"""Alerts: what is firing now, what fired recently in the window, and whether delivery works."""

import streamlit as st

from dashboard import ui
from dashboard.alerts import alert_table, delivery_problems, split_alerts

ctx = ui.page_context()
st.title("Alerts")
st.caption(
    "Alerts `driftscope serve` raised from the findings (rules: docs/alerts.md), firing first; "
    "each links to its run at the finding's evidence span."
)
source = ui.get_source(ctx.source_key)
health = source.alerting_health()
for problem in delivery_problems(health):
    st.error(problem)
if health is not None and not health.get("enabled"):
    st.info(
        "This collector evaluates no alerts: start `driftscope serve` with --alertmanager-url, "
        "--alert-webhook-url, --alert-slack-url or --alert-rules."
    )
elif health:
    receivers = ", ".join(health.get("receivers") or {}) or "none"
    st.caption(
        f"{health.get('rules')} rule(s) every {health.get('interval_seconds'):g}s; receivers: {receivers}; "
        f"last evaluation {health.get('last_evaluation_at') or 'not yet'}."
    )
frame = source.alerts(ctx.window)
firing, resolved = split_alerts(frame)
st.subheader(f"Firing ({len(firing)})")
if firing.empty:
    st.success("No alert is firing.")
else:
    ui.table(alert_table(firing), key="firing_alerts")
st.subheader(f"Recent ({len(resolved)})")
if resolved.empty:
    ui.empty_state("resolved alerts")
else:
    ui.table(alert_table(resolved), key="recent_alerts")
