"""Calibration: the thresholds in force with their provenance, the ROC curve, divergence histograms."""

import streamlit as st

from dashboard import ui
from dashboard.calibration import roc_points
from dashboard.figures import divergence_histogram_figure, roc_figure, threshold_label
from dashboard.report_document import provenance_object

ctx = ui.page_context()
st.title("Calibration")
st.caption("Every threshold a detector uses, where its value came from, and how well it separates.")

thresholds = ui.cached_thresholds(ctx.source_key, ctx.version)
rows = thresholds.to_dict("records")
if not rows:
    st.info(
        "No thresholds are recorded. Run `driftscope calibrate` to fit them on labelled or baseline data."
    )
else:
    ui.table(thresholds[["name", "value", "version", "method", "calibrated"]], key="thresholds")
for row in rows:
    state = "calibrated" if row["calibrated"] else "uncalibrated default"
    with st.expander(f"{row['name']}: {row['value']:.3g} ({state}, method {row['method']})"):
        st.json(provenance_object(row["provenance"]))

st.subheader("ROC")
curves = [(row, *roc_points(provenance_object(row["provenance"]))) for row in rows]
curves = [(row, points, auc) for row, points, auc in curves if points is not None]
for row, points, auc in curves:
    ui.plot(roc_figure(points, row["value"], auc), key=f"roc_{row['name']}")
if not curves:
    st.info(
        "No threshold was calibrated on labelled data, so there is no ROC curve yet. "
        "`driftscope calibrate` with labelled pairs records one."
    )

st.subheader("Goal-divergence distribution")
frame = ui.load_metric(ctx, "goal_divergence_distribution")  # subtasks per divergence value
if frame is not None and frame.empty:
    ui.empty_state("delegated subtasks with goal texts")
elif frame is not None:
    first = frame.iloc[0]
    label = threshold_label(float(first["threshold"]), bool(first["calibrated"]), first["threshold_version"])
    ui.plot(
        divergence_histogram_figure(
            frame["divergence"], float(first["threshold"]), label, weights=frame["subtasks"]
        ),
        key="divergence_hist",
    )
