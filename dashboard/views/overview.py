"""Overview: one tile per failure mode, the rejection rate against its threshold, the worst runs."""

import streamlit as st

from dashboard import ui
from dashboard.figures import findings_by_mode_figure, rejection_rate_figure

ctx = ui.page_context()
st.title("Coordination failures")
st.caption(
    "Counts of each failure mode in the window; a red status means it occurred (or crossed its threshold)."
)


found = ui.load_findings(ctx)
if found is not None:
    tiles, summary, worst = ui.cached_overview(ctx.source_key, ctx.version, ctx.window, ctx.filters)
    for start in range(0, len(tiles), 4):
        for column, tile in zip(st.columns(4), tiles[start : start + 4], strict=False):
            column.metric(
                tile.title,
                tile.count,
                delta="breached" if tile.breached else "clear",
                delta_color="red" if tile.breached else "green",
                delta_arrow="off",
                chart_data=tile.trend,
                chart_type="bar",
                border=True,
                help=f"{tile.failure_mode} (MAST: {tile.mast_category}; detector `{tile.metric}`)",
            )
    left, right = st.columns(2)
    with left:
        ui.plot(findings_by_mode_figure(summary), key="by_mode")
    with right:
        ui.plot(rejection_rate_figure(found.frames.get("rejection_rates")), key="rejection_rate")
    st.subheader("Worst runs")
    ui.findings_table(worst, "runs with findings, rejections or errors", key="worst_runs")
