"""Alerts: every rule the collector evaluates and its state, what fires now and fired recently in
the window, which receivers get them, and whether delivery works."""

import streamlit as st

from dashboard import ui
from dashboard.alerts import alert_table, delivery_problems, receivers_line, rule_states, split_alerts

ctx = ui.page_context()
st.title("Alerts")
st.caption(
    "Alerts `driftscope serve` raises from the findings (rules: docs/alerts.md), firing first; "
    "each links to its run at the finding's evidence span."
)
source = ui.get_source(ctx.source_key)
health = source.alerting_health()
for problem in delivery_problems(health):
    st.error(problem)
evaluated = bool(health and health.get("enabled"))
if health is None:
    st.info(
        "This dashboard reads a file offline: no rule is evaluated here. A running `driftscope serve` "
        "evaluates the rules; the alert episodes the file holds are listed below."
    )
elif not evaluated:
    st.warning("This collector evaluates no alert rules (a driftscope serve older than this dashboard).")
else:
    receivers = receivers_line(health)
    if receivers:
        st.caption(f"Receivers configured: {receivers}.")
    else:
        st.warning(
            "No receiver is configured: the rules are evaluated and their state is shown here, but no "
            "alert is sent. Start `driftscope serve` with --alertmanager-url, --alert-webhook-url or "
            "--alert-slack-url to deliver them."
        )
    st.caption(
        f"{health.get('rules')} rule(s) evaluated every {health.get('interval_seconds'):g} s; last "
        f"evaluation {health.get('last_evaluation_at') or 'not yet'}."
    )
frame = source.alerts(ctx.window)
firing, resolved = split_alerts(frame)
st.subheader(f"Firing ({len(firing)})")
if not firing.empty:
    ui.table(alert_table(firing), key="firing_alerts")
elif evaluated and health.get("last_evaluation_at"):
    st.info(
        f"No alert is firing: the rules found no findings over their thresholds in their look-back "
        f"windows at the last evaluation ({health['last_evaluation_at']}). Older findings are on the "
        "Overview."
    )
elif evaluated:
    st.info(f"The rules have not been evaluated yet (every {health.get('interval_seconds'):g} s).")
else:
    st.info("No alert episode is firing in this file.")
if evaluated:
    st.subheader("Rules")
    ui.table(rule_states(health, frame), key="rules")
st.subheader(f"Recent ({len(resolved)})")
if resolved.empty:
    st.caption("No alert resolved in this window.")
else:
    ui.table(alert_table(resolved), key="recent_alerts")
