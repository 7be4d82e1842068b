"""Streamlit entry script: `streamlit run dashboard/app.py` (the source comes in DRIFTSCOPE_SOURCE)."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

# `streamlit run` puts this file's folder on sys.path, not the project root; without an installed
# package the `dashboard` and `analytics` imports below need the root.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from dashboard import ui  # noqa: E402
from dashboard.datasource import SourceUnavailable  # noqa: E402

# No page icons: the current page's icon becomes the favicon, and Streamlit fetches material
# favicons from the network (the dashboard must work offline; Debian's chromium has no emoji font).
PAGES = [
    st.Page(ui.view("overview"), title="Overview", url_path="overview", default=True),
    st.Page(ui.view("split_brain"), title="Split-brain", url_path="split_brain"),
    st.Page(ui.view("rejections"), title="Rejections & enforcement", url_path="rejections"),
    st.Page(ui.view("constraints"), title="Constraints", url_path="constraints"),
    st.Page(ui.view("goal_drift"), title="Goal drift", url_path="goal_drift"),
    st.Page(ui.view("context_drift"), title="Context drift", url_path="context_drift"),
    st.Page(ui.view("loops"), title="Loops & budgets", url_path="loops"),
    st.Page(ui.view("findings"), title="Other findings", url_path="findings"),
    st.Page(ui.view("alerts"), title="Alerts", url_path="alerts"),
    st.Page(ui.view("run_explorer"), title="Run explorer", url_path="run_explorer"),
    st.Page(ui.view("calibration"), title="Calibration", url_path="calibration"),
]

st.set_page_config(page_title="driftscope", layout="wide")
navigation = st.navigation(PAGES)
context = ui.sidebar()
# Without a readable source the banner is the whole page: no page script runs to fail on it.
if context is not None:
    ui.report_download(context)
    try:
        navigation.run()
    except SourceUnavailable as exc:  # the collector went away between the health check and a read
        ui.unavailable_banner(str(exc))
