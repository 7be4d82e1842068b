"""Overview: which runs are failing (then to review, then degraded), how fresh the data is, then
one tile per failure mode and the rejection rate against its threshold."""

import streamlit as st

from dashboard import ui
from dashboard.figures import findings_by_mode_figure, rejection_rate_figure
from dashboard.filters import PAGE_TITLES, utc_now
from dashboard.overview import TILE_STATES, age_text, incident_runs, unmeasured_runs, verdict_counts

# How many incident runs get an "open" link above the table (the table links every run).
OPEN_LINKS = 3

ctx = ui.page_context()
st.title("Coordination failures")

if not ui.has_spans():
    ui.no_spans_state()
else:
    found = ui.load_findings(ctx, counts_only=True)
    if found is not None:
        overview = ui.cached_overview(ctx.source_key, ctx.version, ctx.window, ctx.filters)
        now = utc_now()
        if overview.newest_span is None:
            st.caption("No span in this window.")
        else:
            age = age_text((now - overview.newest_span.to_pydatetime()).total_seconds())
            st.caption(
                f"Newest span in this window: {overview.newest_span.isoformat(sep=' ', timespec='seconds')} "
                f"UTC ({age}) · {ui.describe_scope(ctx)}"
            )
        counts = verdict_counts(overview.verdicts)
        columns = st.columns(4)
        for column, (verdict, help_text) in zip(
            columns,
            (
                ("failing", "a coordination failure took effect"),
                ("to review", "only goal drift over the uncalibrated default threshold"),
                ("degraded", "a guard refused calls or caught the failure"),
                ("healthy", "no finding, refusal or error"),
            ),
            strict=True,
        ):
            column.metric(f"{verdict} runs", counts[verdict], border=True, help=help_text)
        incidents = incident_runs(overview.verdicts, found, now)
        st.subheader("Runs that need attention")
        if incidents.empty:
            ui.empty_state("failing, to-review or degraded runs")
        else:
            st.caption(
                "Failing runs first, then runs to review, then degraded ones; newest activity first. "
                "Open a run to see its findings and their evidence spans in the trace."
            )
            for row in incidents.head(OPEN_LINKS).itertuples():
                st.page_link(
                    ui.view("run_explorer"),
                    label=f"Open {ui.md_escape(row.verdict)} run {ui.md_escape(row.run_id)}: "
                    f"{ui.md_escape(row.worst_failure_mode or 'no finding')}",
                    query_params={"run": row.run_id},
                )
                if row.verdict == "failing":  # what differs from the crew's healthy runs (issue 35)
                    st.page_link(
                        ui.view("run_explorer"),
                        label=f"Compare run {ui.md_escape(row.run_id)} with healthy runs",
                        query_params={"run": row.run_id, "compare": "auto"},
                    )
            ui.runs_table(incidents, key="incidents")
        # after the runs that need attention: what the telemetry did not let detectors see
        blind = unmeasured_runs(overview.verdicts)
        if not blind.empty:
            st.info(  # what the telemetry lacks, not a failure of driftscope's (warnings are)
                f"{len(blind):,} runs could not be fully measured: their framework did not record "
                f"what a detector needs. {blind['coverage'].iloc[0]}"
            )
            ui.table(blind, key="unmeasured")

        st.subheader("Failure modes")
        st.caption(
            "Findings of each failure mode in the window. Failing: it took effect; prevented: a guard "
            "or the agent caught every one (a refusal is a guard working). Each tile opens its page "
            "for this window."
        )
        scope = ui.scope_params()
        for start in range(0, len(overview.tiles), 4):
            for column, tile in zip(st.columns(4), overview.tiles[start : start + 4], strict=False):
                text, colour = TILE_STATES[tile.state]
                with column.container(border=True, key=f"tile_{tile.metric}"):
                    st.metric(
                        tile.title,
                        tile.count,
                        delta=text,
                        delta_color=colour,
                        delta_arrow="off",
                        help=f"{tile.failure_mode} (MAST: {tile.mast_category}; detector `{tile.metric}`)",
                    )
                    st.caption(f"in {tile.runs} run(s)" if tile.count else "no finding in this window")
                    st.page_link(ui.view(tile.page), label=f"{PAGE_TITLES[tile.page]} →", query_params=scope)
        left, right = st.columns(2)
        with left:
            ui.plot(findings_by_mode_figure(overview.by_mode), key="by_mode")
        with right:
            # The findings hold only counted columns (``counts_only``); the figure needs the whole frame.
            rejections = (
                ui.load_metric(ctx, "rejection_rates") if "rejection_rates" in found.by_metric else None
            )
            ui.plot(rejection_rate_figure(rejections), key="rejection_rate")
