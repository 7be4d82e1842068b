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
from dashboard.filters import PAGE_TITLES  # noqa: E402

# No page icons: the current page's icon becomes the favicon, and Streamlit fetches material
# favicons from the network (the dashboard must work offline; Debian's chromium has no emoji font).
# The Overview is served at the root; the same page at /overview (hidden from the menu) answers a
# link typed or pasted with the page's name, which Streamlit otherwise calls "Page not found".
PAGES = [
    st.Page(
        ui.view(path), title=title, url_path="" if path == "overview" else path, default=path == "overview"
    )
    for path, title in PAGE_TITLES.items()
] + [st.Page(ui.view("overview"), title="Overview", url_path="overview", visibility="hidden")]

st.set_page_config(page_title="driftscope", layout="wide")
navigation = st.navigation(PAGES)
context = ui.sidebar(navigation.url_path)
# Without a readable source the banner is the whole page: no page script runs to fail on it.
if context is not None:
    ui.report_download(context)
    try:
        navigation.run()
    except SourceUnavailable as exc:  # the collector went away between the health check and a read
        ui.unavailable_banner(str(exc))
