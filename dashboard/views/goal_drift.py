"""Goal drift: divergence of each delegated subtask from the root goal, hop by hop."""

import streamlit as st

from dashboard import ui
from dashboard.figures import goal_divergence_figure
from dashboard.findings import finding_rows

ctx = ui.page_context()
st.title("Goal drift")
st.caption(
    "Each delegated subtask's statement is embedded and compared with the chain's root goal; "
    "subtasks above the threshold (red band) drifted from what was asked."
)

# The chart reads the spread of every subtask (counts per hop and divergence, computed in SQL);
# the table lists the drifted subtasks, the rows of the goal_divergence detector.
spread = ui.load_metric(ctx, "goal_divergence_distribution")
if spread is not None:
    if spread.empty:
        ui.empty_state("delegated subtasks with goal texts")
    else:
        ui.plot(goal_divergence_figure(spread, chain="chain"), key="divergence")
frame = ui.load_metric(ctx, "goal_divergence")
if frame is not None and (spread is None or not spread.empty):
    st.subheader("Subtasks above the threshold")
    described = ui.described(ctx, "goal_divergence")
    ui.findings_table(finding_rows(frame, described), "subtasks above the threshold", described)
