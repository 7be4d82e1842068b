"""Constraints: per origin task, which constraint each hop carried, waived or lost, and who dropped it."""

import streamlit as st

from dashboard import ui
from dashboard.figures import constraint_heatmap_figure

ctx = ui.page_context()
st.title("Constraints along delegation chains")
st.caption(
    "Each delegation hop should carry every constraint of the origin task verbatim, or waive it with a reason."
)

# The columns the task picker, heatmap and waivers show (not the ledger's evidence lists).
LEDGER_COLUMNS = (
    "origin_task_id",
    "constraint_id",
    "hop",
    "status",
    "waiver_reason",
    "agents",
    "delegate_to",
)
ledger = ui.load_metric(ctx, "constraint_ledger", LEDGER_COLUMNS)
drops = ui.load_metric(ctx, "constraint_drops")
if ledger is not None:
    tasks = sorted(ledger["origin_task_id"].dropna().unique())
    if not tasks:
        ui.empty_state("delegations with a constraint ledger")
    else:
        dropped = set(drops["origin_task_id"]) if drops is not None and not drops.empty else set()
        if len(tasks) > ui.PAGE_ROWS:  # offer the tasks with drops first, then the others, up to a page
            st.caption(
                f"{len(tasks):,} origin tasks; the picker offers {ui.PAGE_ROWS} (those with drops first)."
            )
            tasks = sorted(
                ([t for t in tasks if t in dropped] + [t for t in tasks if t not in dropped])[: ui.PAGE_ROWS]
            )
        default = next((i for i, t in enumerate(tasks) if t in dropped), 0)
        task = st.selectbox("Origin task", tasks, index=default, key="origin_task")
        ui.plot(constraint_heatmap_figure(ledger, task), key="heatmap")
        waivers = ledger[(ledger["origin_task_id"] == task) & (ledger["status"] == "waived")]
        st.subheader("Waivers")
        if waivers.empty:
            st.caption("No constraint of this task was waived.")
        else:
            ui.table(
                waivers[["constraint_id", "hop", "waiver_reason", "agents", "delegate_to"]], key="waivers"
            )
st.subheader("Dropped constraints (hop and agent that dropped each)")
ui.findings_table(drops, "dropped constraints", ui.described(ctx, "constraint_drops"))
