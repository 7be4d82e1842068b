"""Streamlit glue shared by every page: the source, the cached reads, the sidebar, banners, tables.

Span text reaches the screen only through ``st.dataframe``, ``st.code``, ``st.text`` and
``st.json`` (which never interpret HTML) or through Plotly figures whose labels the figure
functions escape; nothing here uses ``unsafe_allow_html``.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, replace
from datetime import datetime
from datetime import time as dtime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import streamlit as st
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

from analytics.side_effects import configure_side_effect_tools
from analytics.types import Filters, Window
from dashboard.datasource import DataSource, HttpSource, SourceUnavailable, is_store_url, open_source
from dashboard.filters import (
    DEFAULT_PRESET,
    WINDOW_PRESETS,
    dashboard_base,
    describe_filters,
    describe_window,
    run_link,
    utc_now,
    window_for,
)
from dashboard.findings import FindingSet, counted_columns, finding_metrics, gather_findings
from dashboard.launch import SIDE_EFFECT_TOOLS_ENV, SOURCE_ENV, TOKEN_ENV
from dashboard.overview import newest_span, tile_for
from dashboard.report import build_report
from dashboard.tables import lead_columns, row_target

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 15
# Cache keys include the source's data version (span count and newest ingest), so new spans make
# new entries at once and the TTL only bounds memory; relative windows move every 10 s anyway.
CACHE_TTL = 600
# Detector frames and findings are cached as shared objects (st.cache_resource): a 1M-span window
# has frames of ~1M rows that st.cache_data would pickle and copy on every rerun. Callers treat
# them as read-only.
FRAME_ENTRIES = 64
# Detector reads a page sends a collector at once (its API answers each on its own cursor).
PARALLEL_READS = 4
# Tables longer than this are shown a page at a time.
PAGE_ROWS = 500
# Findings tables longer than this read their evidence-span lists only on request (``load_listed``).
EVIDENCE_ROWS = 50_000
VIEWS = Path(__file__).resolve().with_name("views")
# Rows taller than 4rem let Streamlit's grid wrap long text; tables of up to CONTENT_ROWS rows are
# drawn whole (no scroll inside the table), longer ones scroll.
WRAP_ROW_HEIGHT = 72
CONTENT_ROWS = 60
# The query parameters the sidebar binds (the window and filters a link carries to another page).
SCOPE_PARAMS = ("window", "service", "agent", "run_filter")
LEAD_CONFIG = {
    "run_id": st.column_config.TextColumn("run", width=300),
    "what_happened": st.column_config.TextColumn("what happened", width="large"),
    "evidence": st.column_config.TextColumn("evidence spans", width="medium"),
}


def view(name: str) -> str:
    """The absolute path of page script ``views/<name>.py``: Streamlit resolves page paths against
    its main script's folder, which is ``driftscope/`` under ``driftscope dashboard``."""
    return str(VIEWS / f"{name}.py")


def is_live(key: str) -> bool:
    """Whether the source is a running collector (spans keep arriving) rather than a file."""
    return key.startswith(("http://", "https://"))


def exporter_help(key: str) -> str:
    """Where to point OTLP exporters: the collector this dashboard reads, or how to get one."""
    if is_live(key):
        return (
            f"Point your agents' OTLP exporters at this collector: "
            f"`export OTEL_EXPORTER_OTLP_ENDPOINT={key}` (OTLP/HTTP), or load the sample crews with "
            f"`driftscope demo --endpoint {key}`."
        )
    if is_store_url(key):
        return (
            f"This dashboard reads the ClickHouse store `{key}`: spans reach it through otelcol-contrib's "
            f"clickhouse exporter or `driftscope serve --store {key}` (docs/scale-out.md)."
        )
    return (
        f"This dashboard reads the file `{key}`. Load spans into it with `driftscope ingest FILE --db "
        f"{key}`, or run a collector (`driftscope up`), point OTEL_EXPORTER_OTLP_ENDPOINT at it and "
        "load the sample crews with `driftscope demo`."
    )


@dataclass(frozen=True)
class PageContext:
    """What a page needs: the source key and data version, the window and filters chosen."""

    source_key: str
    window: Window
    filters: Filters
    version: str = ""


def source_key() -> str:
    """The configured source (URL or file path) from ``DRIFTSCOPE_SOURCE``."""
    return os.environ.get(SOURCE_ENV, "http://127.0.0.1:4318")


@st.cache_resource(show_spinner=False)
def get_source(key: str) -> DataSource:
    """One data-source object per configured source, shared by all sessions."""
    if not key.startswith(("http://", "https://")):  # analytics runs here: the same setting as serve
        configure_side_effect_tools(os.environ.get(SIDE_EFFECT_TOOLS_ENV) or None)
    return open_source(key, os.environ.get(TOKEN_ENV) or None)


@st.cache_resource(ttl=CACHE_TTL, max_entries=FRAME_ENTRIES, show_spinner=False)
def cached_metric(
    key: str,
    version: str,
    name: str,
    window: Window,
    filters: Filters,
    columns: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """A metric frame (shared, read-only), cached by source, data version, name, window, filters;
    only ``columns`` of it when given (a projection read: the evidence lists are never built)."""
    if columns is None:
        return get_source(key).metric(name, window, filters)
    return get_source(key).metric(name, window, filters, list(columns))


@st.cache_data(ttl=REFRESH_SECONDS * 0.8, show_spinner=False)
def cached_data_version(key: str) -> str:
    """The source's data version, re-read at most about once per ``REFRESH_SECONDS``.

    While a collector ingests, the version changes with every batch; reading it at most once per
    refresh period keeps reruns within that period (a click, a filter) on the cached results, as
    a plain TTL did, while an idle source keeps its cache for ``CACHE_TTL``.
    """
    return get_source(key).data_version()


@st.cache_data(ttl=CACHE_TTL, max_entries=FRAME_ENTRIES, show_spinner=False)
def cached_filter_options(key: str, version: str, window: Window) -> dict:
    """Sidebar choices (services, agents, newest runs) for the window."""
    return get_source(key).filter_options(window)


@st.cache_resource(ttl=CACHE_TTL, max_entries=FRAME_ENTRIES, show_spinner=False)
def cached_run_totals(key: str, version: str, window: Window, filters: Filters) -> pd.DataFrame:
    """Every run in scope with its counts (shared, read-only)."""
    return get_source(key).run_totals(window, filters)


@st.cache_data(ttl=CACHE_TTL, max_entries=FRAME_ENTRIES, show_spinner=False)
def cached_run_details(
    key: str, version: str, window: Window, filters: Filters, run_ids: tuple[str, ...]
) -> pd.DataFrame:
    """``runs`` rows of a few runs."""
    return get_source(key).run_details(window, filters, list(run_ids))


@st.cache_data(ttl=CACHE_TTL, max_entries=FRAME_ENTRIES, show_spinner=False)
def cached_run_spans(key: str, version: str, run_id: str) -> pd.DataFrame:
    """Spans of one run."""
    return get_source(key).run_spans(run_id)


@st.cache_data(ttl=CACHE_TTL, show_spinner=False)
def cached_thresholds(key: str, version: str) -> pd.DataFrame:
    """Thresholds in force."""
    return get_source(key).thresholds()


@st.cache_data(ttl=300, show_spinner=False)
def cached_metrics_list(key: str) -> list[dict]:
    """The registry's metric descriptions."""
    return get_source(key).list_metrics()


def described(ctx: PageContext, name: str) -> dict:
    """The source's description of metric ``name`` (``{"name": name}`` when it does not list it)."""
    return next((m for m in cached_metrics_list(ctx.source_key) if m["name"] == name), {"name": name})


def unavailable_banner(message: str) -> None:
    """The banner shown instead of a traceback when the source cannot be read."""
    st.error(f"**Data source unavailable.** {message}")


def empty_message(
    what: str, stored_spans: int | None, scope: str, ingest_help: str, needs: str | None = None
) -> str:
    """What an empty table says. With no span stored, where to send spans; otherwise that spans
    arrived and nothing matched in ``scope`` (and what the detector needs to see, when known):
    pointing at the exporters when spans are there sends a person to fix what works."""
    if stored_spans == 0:
        return f"No {what}: no span has been received yet. {ingest_help}"
    held = f" ({stored_spans:,} stored)" if stored_spans else ""
    text = f"Spans arrived{held}, and there are no {what} in this window ({scope})."
    if needs:
        text += f" This detector needs to see {needs}."
    return text + " If spans exist outside the window, widen it in the sidebar."


def empty_state(what: str, needs: str | None = None) -> None:
    """An empty result that says what to do next (``empty_message``)."""
    stored = st.session_state.get("_source_spans")
    st.info(empty_message(what, stored, _context_line(), exporter_help(source_key()), needs))


def detector_empty_state(what: str, metric: dict) -> None:
    """A detector that found nothing: ``empty_state`` with what the detector needs to see."""
    empty_state(what, metric.get("needs"))


def no_spans_state() -> None:
    """The first screen of a source that holds no span at all: not "all clear", but where to send spans."""
    st.warning(f"**No spans received yet.** {exporter_help(source_key())}")


_MARKDOWN_SPECIAL = set("\\`*_{}[]()#+-.!|<>~$:=&\"'")


def md_escape(text: object) -> str:
    """``text`` with every Markdown-special character backslash-escaped (labels render Markdown)."""
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in str(text))


def describe_scope(ctx: PageContext) -> str:
    """``all time, no filters``: the window and filters a page shows."""
    return f"{describe_window(ctx.window)}, {describe_filters(ctx.filters)}"


def _context_line() -> str:
    ctx = st.session_state.get("_page_context")
    if ctx is None:
        return "no data"
    return f"{describe_window(ctx.window)}, {describe_filters(ctx.filters)}"


def sidebar(page: str = "") -> PageContext | None:
    """Render the shared sidebar; return the context, or None after a banner if the source is down.

    On the run explorer (``page``), whose run picker is the page's one "Run" control, the sidebar
    offers no run filter."""
    key = source_key()
    source = get_source(key)
    health = source.health()
    st.sidebar.caption(f"Source: {source.description}")
    if not health.ok:
        unavailable_banner(health.detail)
        return None
    st.session_state["_source_spans"] = health.spans
    if health.findings:  # "Findings as of 12:04:31 UTC, 2 s behind": how current every page is
        st.sidebar.caption(health.findings)
    # Window and filters live in the URL (bind="query-params"), so a link pasted into an incident
    # channel opens the same view.
    preset = st.sidebar.selectbox(
        "Time window",
        list(WINDOW_PRESETS),
        index=list(WINDOW_PRESETS).index(DEFAULT_PRESET),
        key="window",
        bind="query-params",
    )
    since = until = None
    if preset == "Custom":
        now = utc_now()
        left, right = st.sidebar.columns(2)
        day = left.date_input("From (UTC)", value=now.date(), key="custom_from")
        at = right.time_input("at", value=dtime(0, 0), key="custom_from_time")
        day_to = left.date_input("To (UTC)", value=now.date(), key="custom_to")
        at_to = right.time_input("at ", value=dtime(23, 59), key="custom_to_time")
        since = datetime.combine(day, at)
        until = datetime.combine(day_to, at_to)
    window = window_for(preset, custom_since=since, custom_until=until)
    try:
        version = cached_data_version(key)
        options = cached_filter_options(key, version, window)
    except SourceUnavailable as exc:
        unavailable_banner(str(exc))
        return None
    run_ids = [str(r) for r in options["runs"]]
    service = _choice("Service", options["services"], "service")
    agent = _choice("Agent", options["agents"], "agent")
    # A run named in the URL (the run explorer's ?run=, a pasted ?run_filter=) is offered even
    # when it is older than the newest runs listed.
    for wanted_run in (st.query_params.get("run"), st.query_params.get("run_filter")):
        if wanted_run and wanted_run not in run_ids:
            run_ids = [wanted_run, *run_ids]
    run = None if page == "run_explorer" else _choice("Run", run_ids, "run_filter")
    filters = Filters(service=service, agent=agent, run=run)
    ctx = PageContext(key, window, filters, version)
    st.session_state["_page_context"] = ctx
    live = is_live(key)
    if st.sidebar.toggle(
        "Auto-refresh",
        value=live,
        key="auto_refresh",
        help=f"Check for new spans every {REFRESH_SECONDS} s (on by default for a live collector)",
    ):
        _auto_refresh(REFRESH_SECONDS, key, version)
    return ctx


def _choice(label: str, options: list[str], key: str) -> str | None:
    value = st.sidebar.selectbox(label, ["(all)", *options], key=key, bind="query-params")
    return None if value == "(all)" else value


def _auto_refresh(seconds: int, key: str, version: str) -> None:
    """Check the source's data version every ``seconds``; rerun the app when spans arrived."""

    @st.fragment(run_every=seconds)
    def ticker() -> None:
        # Only new data reruns the page: an idle collector does not redraw (and reset the
        # reader's scroll position) every few seconds.
        try:
            changed = cached_data_version(key) != version
        except SourceUnavailable:
            changed = True  # the next full run shows the banner
        if changed:
            st.rerun()
        st.sidebar.caption(f"Auto-refresh every {seconds} s")

    ticker()


def load_metric(ctx: PageContext, name: str, columns: tuple[str, ...] | None = None) -> pd.DataFrame | None:
    """A metric frame (only ``columns`` of it when given: a projection read, so what a page does
    not show is never built), or None after showing why it could not be read."""
    try:
        return cached_metric(ctx.source_key, ctx.version, name, ctx.window, ctx.filters, columns)
    except SourceUnavailable as exc:
        unavailable_banner(str(exc))
    except KeyError as exc:
        st.warning(f"The metric `{name}` is not available from this source ({exc}).")
    except Exception as exc:  # a broken detector shows its error, the rest of the page still renders
        logger.exception("metric %s failed", name)
        st.warning(f"The metric `{name}` failed: {type(exc).__name__}: {exc}")
    return None


def load_listed(ctx: PageContext, name: str, key: str | None = None) -> pd.DataFrame | None:
    """A metric frame for a findings table (``findings_table``): the whole frame, unless it has
    more than ``EVIDENCE_ROWS`` rows. Then its evidence-span lists (``span_ids``, of which a table
    links only each row's first) are read only when the reader switches them on: at 10M spans of
    100,000-call runs, ``repeated_calls``' 440,200 loops hold 7.1M span ids, and building them
    took 2-4 s of the Loops page's first render. The rows are the same either way."""
    documented = list(described(ctx, name).get("columns") or [])
    if "span_ids" not in documented:
        return load_metric(ctx, name)
    listed = load_metric(ctx, name, tuple(c for c in documented if c != "span_ids"))
    if listed is None or len(listed) <= EVIDENCE_ROWS:
        return load_metric(ctx, name)
    if st.toggle(
        "Evidence span links",
        key=f"{key or name}_evidence",
        help=f"Link each row to its first evidence span (reads the evidence of all {len(listed):,} rows).",
    ):
        return load_metric(ctx, name)
    st.caption(
        f"{len(listed):,} rows: their evidence-span links are not loaded (switch them on above). "
        "The run and trace links open each row's run in the run explorer."
    )
    return listed


def with_run_links(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Add an ``explore`` link column to the run explorer; return frame and column config."""
    frame = frame.copy()
    config: dict = {}
    if "run_id" in frame.columns:
        frame.insert(0, "explore", [run_link(r) for r in frame["run_id"]])
        config["explore"] = st.column_config.LinkColumn(
            "run", display_text=r"run=(.*)$", help="Open in the run explorer"
        )
        # Evidence ids open the run with that span selected, trace ids with the trace searched.
        if "span_ids" in frame.columns:
            frame["span_ids"] = [
                run_link(r, span=_first(s)) if _first(s) else None
                for r, s in zip(frame["run_id"], frame["span_ids"], strict=True)
            ]
            config["span_ids"] = st.column_config.LinkColumn(
                "evidence span", display_text=r"span=([^&]*)", help="Open the run at this evidence span"
            )
        if "trace_id" in frame.columns:
            frame["trace_id"] = [
                run_link(r, query=t) if isinstance(t, str) and t else None
                for r, t in zip(frame["run_id"], frame["trace_id"], strict=True)
            ]
            config["trace_id"] = st.column_config.LinkColumn(
                "trace", display_text=r"q=([^&]*)", help="Open the run with this trace searched"
            )
    # What happened first, evidence ids last.
    tail = [c for c in ("run_id", "trace_id", "span_ids", "run_ids") if c in frame.columns]
    frame = frame[[c for c in frame.columns if c not in tail] + tail]
    for column in frame.columns:
        if frame[column].map(lambda v: isinstance(v, list | tuple)).any():
            frame[column] = frame[column].map(
                lambda v: ", ".join(map(str, v)) if isinstance(v, list | tuple) else v
            )
    return frame, config


def _first(ids) -> str | None:
    """The first id of a list-ish cell (None when empty)."""
    if ids is None or isinstance(ids, float):
        return None
    if isinstance(ids, str):
        return ids or None
    ids = list(ids)
    return str(ids[0]) if ids else None


def findings_table(frame: pd.DataFrame | None, what: str, metric: dict) -> None:
    """A detector's frame as a findings table (``dashboard.tables``: run, what happened and
    evidence first, text wrapped), or the detector's empty state. One click on a row (any cell)
    opens the run explorer in this tab at exactly that row's finding (``tables.row_target``)."""
    if frame is None:
        return
    if frame.empty:
        detector_empty_state(what, metric)
        return
    name = metric["name"]
    page = page_of(frame, f"findings_{name}")
    shown = lead_columns(_plain_cells(page), metric)
    picked = st.dataframe(
        shown,
        hide_index=True,
        key=f"findings_{name}",
        on_select="rerun",
        selection_mode=["single-row", "single-cell"],
        row_height=WRAP_ROW_HEIGHT,
        height="content" if len(shown) <= CONTENT_ROWS else "auto",
        column_config=LEAD_CONFIG,
    )
    st.caption("Click a row: the run explorer opens on that finding, its evidence highlighted.")
    position = selected_row(picked)
    if position is not None:
        target = row_target(page, metric, position)
        if target is None:
            st.info("This row names no single run (it sums several); open one of its runs from `run_ids`.")
        else:
            st.switch_page(view("run_explorer"), query_params={**scope_params(), **target})


def runs_table(frame: pd.DataFrame, key: str) -> None:
    """Runs (a ``run_id`` column) as a table drawn whole, the run first, long text wrapped; one
    click on a row opens that run in the run explorer in this tab."""
    shown = _plain_cells(frame)
    # a column with nothing in any row (coverage when every run recorded everything) is noise
    shown = shown[["run_id", *[c for c in shown.columns if c != "run_id" and _has_value(shown[c])]]]
    for column in shown.columns:
        if shown[column].map(lambda v: isinstance(v, list | tuple)).any():
            shown[column] = shown[column].map(
                lambda v: ", ".join(map(str, v)) if isinstance(v, list | tuple) else v
            )
    picked = st.dataframe(
        shown,
        hide_index=True,
        key=key,
        on_select="rerun",
        selection_mode=["single-row", "single-cell"],
        row_height=WRAP_ROW_HEIGHT,
        height="content",
        column_config={
            "run_id": LEAD_CONFIG["run_id"],
            "worst_failure_mode": st.column_config.TextColumn("what happened", width="large"),
        },
    )
    position = selected_row(picked)
    if position is not None:
        st.switch_page(
            view("run_explorer"), query_params={**scope_params(), "run": str(frame["run_id"].iloc[position])}
        )


def _has_value(column: pd.Series) -> bool:
    """Whether any cell of ``column`` holds something (not missing, not empty text)."""

    def held(value) -> bool:
        if value is None or value is pd.NA or value is pd.NaT:
            return False
        if isinstance(value, float):
            return value == value
        if isinstance(value, str):
            return value != ""
        return not hasattr(value, "__len__") or len(value) > 0

    return bool(column.map(held).any())


def selected_row(picked) -> int | None:
    """The row position a click on a table picked (a row's checkbox or any of its cells), or None."""
    if picked is None:
        return None
    selection = picked.selection
    if selection.rows:
        return int(selection.rows[0])
    cells = selection.get("cells") or []
    return int(cells[0][0]) if cells else None


def scope_params() -> dict[str, str]:
    """The sidebar's window and filters as query parameters (those not at their defaults), carried
    by a click that opens another page so it shows the same scope. Read from the widgets' state:
    the address is written back by the browser, after this run."""
    chosen = {k: st.session_state.get(k) for k in SCOPE_PARAMS}
    defaults = {"window": DEFAULT_PRESET}
    return {k: str(v) for k, v in chosen.items() if v is not None and v != defaults.get(k, "(all)")}


def page_start(total: int, key: str | None, at: int = 0) -> int:
    """The first row of the page picked for a table of ``total`` rows (0 when they fit one page;
    else a page picker is drawn, opening on the page that holds row ``at``)."""
    if total <= PAGE_ROWS:
        return 0
    pages = (total + PAGE_ROWS - 1) // PAGE_ROWS
    opening = min(max(at, 0) // PAGE_ROWS + 1, pages)
    page = int(st.number_input("Page", 1, pages, opening, key=f"{key or 'table'}_page"))
    first = (page - 1) * PAGE_ROWS
    st.caption(f"Rows {first + 1:,}-{min(first + PAGE_ROWS, total):,} of {total:,} ({pages:,} pages)")
    return first


def page_of(frame: pd.DataFrame, key: str | None) -> pd.DataFrame:
    """The rows of ``frame`` on the page picked under the table (all of them when they fit one)."""
    first = page_start(len(frame), key)
    return frame if len(frame) <= PAGE_ROWS else frame.iloc[first : first + PAGE_ROWS]


def _plain_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Arrays (numpy, from Arrow) and Arrow lists (``analytics.text_lists``) as lists so tables
    show them as text."""
    frame = frame.copy()
    for column in frame.columns:
        dtype = frame[column].dtype
        if isinstance(dtype, pd.ArrowDtype) and pa.types.is_list(dtype.pyarrow_dtype):
            frame[column] = pd.Series(frame[column].tolist(), index=frame.index, dtype=object)
        elif frame[column].dtype == object:
            frame[column] = frame[column].map(
                lambda v: list(v) if hasattr(v, "tolist") and not isinstance(v, str) else v
            )
    return frame


def plot(figure, key: str | None = None) -> None:
    """A Plotly figure at full width."""
    st.plotly_chart(figure, key=key, config={"displaylogo": False})


def page_context() -> PageContext:
    """The context the app script stored for this run (pages call this first)."""
    return st.session_state["_page_context"]


def report_download(ctx: PageContext) -> None:
    """Sidebar download of the drift report for the current window and filters (built on click).

    The report reuses the page's cached detector frames, so a click runs no detector twice.
    """
    fmt = st.sidebar.selectbox("Report format", ["html", "md", "json"], key="report_format")
    mime = {"html": "text/html", "md": "text/markdown", "json": "application/json"}[fmt]
    base = dashboard_base(st.context.url)  # ids in the report link back here (issue 16)

    def make() -> str:
        # Runs on click, outside the page script: the spinner-less frame cache, not cached_findings.
        key, version, window, filters = ctx.source_key, ctx.version, ctx.window, ctx.filters
        found = gather_findings(
            get_source(key),
            window,
            filters,
            read=lambda name: cached_metric(key, version, name, window, filters),
            metrics=cached_metrics_list(key),
        )
        return build_report(get_source(key), window, filters, None, fmt, found=found, dashboard_url=base)

    st.sidebar.download_button(
        "Download report",
        data=make,
        file_name=f"driftscope-report.{fmt}",
        mime=mime,
        key="download_report",
        on_click="ignore",
    )


def run_report(ctx: PageContext, run: str, fmt: str = "html", dashboard_url: str | None = None) -> str:
    """The drift report of one run (the run explorer's download), from the cached detector frames;
    ids link to ``dashboard_url``'s run explorer when given."""
    key, version, window = ctx.source_key, ctx.version, ctx.window
    filters = replace(ctx.filters, run=run)
    found = gather_findings(
        get_source(key),
        window,
        filters,
        read=lambda name: cached_metric(key, version, name, window, filters),
        metrics=cached_metrics_list(key),
    )
    return build_report(get_source(key), window, filters, run, fmt, found=found, dashboard_url=dashboard_url)


@st.cache_resource(ttl=CACHE_TTL, max_entries=FRAME_ENTRIES, show_spinner="Running detectors…")
def cached_findings(
    key: str, version: str, window: Window, filters: Filters, counts_only: bool = False
) -> FindingSet:
    """Every finding detector's result for the window and filters (shared, read-only).

    ``counts_only``: each frame holds only the columns counts, runs, trends and ranking read
    (``counted_columns``; the Overview), so findings cannot be listed from it."""
    metrics = cached_metrics_list(key)
    wanted = {m["name"]: counted_columns(m) if counts_only else None for m in metrics}
    source = get_source(key)
    script = get_script_run_ctx()

    def read(name: str) -> pd.DataFrame:
        if script is not None and get_script_run_ctx() is None:  # a reader thread: the run's
            add_script_run_ctx(threading.current_thread(), script)  # context, for the cache
        return cached_metric(key, version, name, window, filters, wanted.get(name))

    # A collector answers reads concurrently (a cursor per request); a file source reads on one
    # connection, one at a time.
    parallel = PARALLEL_READS if isinstance(source, HttpSource) else 1
    return gather_findings(source, window, filters, read=read, metrics=metrics, parallel=parallel)


@dataclass(frozen=True)
class Overview:
    """What the Overview page draws: small aggregates of the findings and the run verdicts."""

    tiles: list
    by_mode: pd.DataFrame
    verdicts: pd.DataFrame  # run_summary: one row per run in scope
    newest_span: object  # naive-UTC time of the newest span in scope, or None


@st.cache_resource(ttl=CACHE_TTL, max_entries=FRAME_ENTRIES, show_spinner=False)
def cached_overview(key: str, version: str, window: Window, filters: Filters) -> Overview:
    """Tiles, per-mode summary, run verdicts and freshness of the Overview."""
    found = cached_findings(key, version, window, filters, counts_only=True)
    tiles = [tile_for(m, found.by_metric.get(m["name"])) for m in finding_metrics(cached_metrics_list(key))]
    summary = found.summary()
    verdicts = cached_metric(key, version, "run_summary", window, filters)
    newest = newest_span(cached_run_totals(key, version, window, filters))
    return Overview(tiles, summary, verdicts, newest)


def load_findings(ctx: PageContext, counts_only: bool = False) -> FindingSet | None:
    """Findings for the page, or None after a banner when the source is down (``counts_only``:
    see ``cached_findings``)."""
    try:
        found = cached_findings(ctx.source_key, ctx.version, ctx.window, ctx.filters, counts_only=counts_only)
    except SourceUnavailable as exc:
        unavailable_banner(str(exc))
        return None
    for name, message in found.errors.items():
        st.warning(f"Detector `{name}` failed: {message}")
    return found


def table(frame: pd.DataFrame, key: str | None = None) -> None:
    """A plain escaped table (lists shown as comma-separated text, run ids linked), paginated."""
    shown, config = with_run_links(_plain_cells(page_of(frame, key)))
    height = "content" if len(shown) <= CONTENT_ROWS else "auto"  # drawn whole, no scroll inside
    st.dataframe(shown, hide_index=True, column_config=config, key=key, height=height)


def has_spans() -> bool:
    """Whether the source holds any span at all (any window): an empty store gets its own first screen."""
    return st.session_state.get("_source_spans") != 0
