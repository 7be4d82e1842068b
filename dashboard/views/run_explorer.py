"""Run explorer: one run's findings; the selected finding's evidence spans highlighted in a nested,
collapsible trace view with its timeline; each span's inputs, outputs and attributes.

URL: ``?run=`` the run, ``&span=`` a span to inspect, ``&q=`` a search (trace id, span id or any
attribute value), ``&finding=`` the finding (1-based, worst first) whose evidence is highlighted;
``?find=`` a search across every run in the sidebar's window and filters, each result a link here;
``&compare=auto|RUN`` the run beside its crew's healthy runs or another run (dashboard/compare_view.py).
"""

from dataclasses import replace

import pandas as pd
import streamlit as st

from analytics.search import MIN_SEARCH_CHARS
from dashboard import ui
from dashboard.compare_view import comparison_toggle, show_comparison
from dashboard.figures_run import delegation_graph_figure, waterfall_figure
from dashboard.filters import dashboard_base, run_link
from dashboard.findings import findings_frame, order_by_run_and_severity, run_failures
from dashboard.overview import worst_first
from dashboard.search import describe_results, search_results_table
from dashboard.tables import evidence_text, finding_key
from dashboard.trace import ancestors, duration_text, failed, search_spans, span_io, trace_rows

# Spans drawn as nested expanders; past this the tree lists the first ones (the timeline has all).
TREE_LIMIT = 250
# Bars of the timeline (a browser draws a few hundred bars quickly, not tens of thousands).
TIMELINE_LIMIT = 500
# Deeper spans are drawn flat inside their deepest drawn ancestor (Streamlit nests containers).
MAX_NESTING = 10
BLANK = ("", "nan", "None", "NaT", "<NA>")
# Most results of a search across runs.
SEARCH_LIMIT = 200
# Evidence span ids named in the selected finding's line (the tree marks every one).
EVIDENCE_LISTED = 12
EXPLORER_CONFIG = {
    "#": st.column_config.NumberColumn("#", width="small"),
    "what_happened": st.column_config.TextColumn("what happened", width="large"),
    "evidence": st.column_config.TextColumn("evidence spans", width="medium"),
}


def _text(value) -> str:
    """A span field as display text (arrays joined)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _label(span: pd.Series, evidence: set[str], matches: set[str], selected: str | None) -> str:
    """An expander label: markers, then agent · span name · duration (span text escaped)."""
    marks = []
    if span["span_id"] == selected:
        marks.append(":blue-background[inspected]")
    if span["span_id"] in evidence:
        marks.append(":orange-background[evidence]")
    if failed(span):
        marks.append(":red-background[failed]")
    if span["span_id"] in matches:
        marks.append(":violet-background[match]")
    agent = _text(span.get("agent_id"))
    who = f"{ui.md_escape(agent)} · " if agent not in BLANK else ""
    label = f"{who}{ui.md_escape(span['span_name'])} · {duration_text(span)} · :gray[{ui.md_escape(span['span_id'])}]"
    return " ".join([*marks, label])


def _span_body(span: pd.Series, t0: int, run: str) -> None:
    """What an expanded span shows: its id and trace id as links (this run at this span, the run
    with the trace searched: addresses to paste into an incident channel), fields as plain text,
    inputs and outputs as code."""
    start = (int(span["start_ns"]) - t0) / 1e6
    span_id, trace_id = str(span["span_id"]), str(span["trace_id"])
    st.markdown(
        f"[span {ui.md_escape(span_id)}]({run_link(run, span=span_id)}) · "
        f"[trace {ui.md_escape(trace_id)}]({run_link(run, query=trace_id)})"
    )
    facts = [f"+{start:.1f} ms"]
    for name in ("tool_name", "op", "outcome", "reject_reason", "status_code", "state_key", "hop"):
        value = _text(span.get(name))
        if value not in BLANK:
            facts.append(f"{name} {value}")
    st.text(" · ".join(facts))
    inputs, outputs = span_io(span)
    if inputs or outputs:
        left, right = st.columns(2)
        with left:
            for name, text in inputs.items():
                st.caption(f"input: {name}")
                st.code(text, language=None, wrap_lines=True)
        with right:
            for name, text in outputs.items():
                st.caption(f"output: {name}")
                st.code(text, language=None, wrap_lines=True)


def trace_tree(
    spans: pd.DataFrame, rows, evidence: set[str], matches: set[str], selected: str | None, run: str = ""
) -> None:
    """The spans as nested expanders: the path to evidence, matches and the inspected span open."""
    shown = rows[:TREE_LIMIT]
    marked = {i for i, r in enumerate(shown) if r.span_id in evidence | matches | {selected}}
    open_rows = ancestors(shown, marked) | marked
    t0 = int(spans["start_ns"].min())

    def draw(index: int, depth: int) -> None:
        row = shown[index]
        span = spans.iloc[row.position]
        with st.expander(_label(span, evidence, matches, selected), expanded=index in open_rows):
            _span_body(span, t0, run)
            for child in row.children:
                if child < len(shown):
                    if depth < MAX_NESTING:
                        draw(child, depth + 1)
                    else:
                        flat(child)

    def flat(index: int) -> None:  # past MAX_NESTING: the whole subtree at this level
        draw_flat = [index]
        while draw_flat:
            i = draw_flat.pop(0)
            row = shown[i]
            span = spans.iloc[row.position]
            with st.expander(_label(span, evidence, matches, selected), expanded=i in open_rows):
                _span_body(span, t0, run)
            draw_flat.extend(c for c in row.children if c < len(shown))

    for index, row in enumerate(shown):
        if row.parent is None:
            draw(index, 0)
    if len(rows) > TREE_LIMIT:
        st.caption(f"The tree lists the first {TREE_LIMIT:,} of {len(rows):,} spans; the timeline shows all.")


def attribute_panel(spans: pd.DataFrame, rows, span_id: str) -> None:
    """Every field and attribute of one span, shown as text (never rendered)."""
    position = next((r.position for r in rows if r.span_id == span_id), 0)
    span = spans.iloc[position]
    st.subheader(f"Attributes of span {span['span_id']}")
    fields = {
        k: _text(v) for k, v in span.items() if k not in ("attributes", "events") and _text(v) not in BLANK
    }
    left, right = st.columns(2)
    left.json(fields, expanded=True)
    right.json(span.get("attributes") or {}, expanded=True)


def chosen_finding(findings: list, wanted: str | None) -> int | None:
    """The position of the finding ``?finding=`` names: a ``finding_key`` (what a click on a
    detector table's row sends), or a 1-based number in this run's list; None when it names none."""
    if not wanted:
        return None
    if wanted.isdigit():
        number = int(wanted)
        return number - 1 if 0 < number <= len(findings) else None
    return next((i for i, f in enumerate(findings) if finding_key(f.metric, f.span_ids) == wanted), None)


def explorer_findings_frame(page: list, first: int) -> pd.DataFrame:
    """A page of the run's findings as its table shows them: number, what happened (status,
    failure mode, details), evidence ids, then agents, time, category and trace."""
    frame = findings_frame(page)
    return pd.DataFrame(
        {
            "#": range(first + 1, first + len(page) + 1),
            "what_happened": [
                f"{status}: {mode}" + (f" ({details})" if details else "")
                for status, mode, details in zip(
                    frame["status"], frame["failure_mode"], frame["details"], strict=True
                )
            ],
            "evidence": [evidence_text(f.span_ids) for f in page],
            "agents": [", ".join(f.agents) for f in page],
            "first_seen": frame["first_seen"],
            "mast_category": frame["mast_category"],
            "trace_id": frame["trace_id"],
        }
    )


def run_coverage(ctx: ui.PageContext, run: str) -> str | None:
    """run_summary's ``coverage`` of ``run``: which detectors its telemetry leaves blind and the
    setting that turns content capture on; None when nothing is missing."""
    summary = ui.load_metric(
        replace(ctx, filters=replace(ctx.filters, run=run)), "run_summary", ("run_id", "coverage")
    )
    if summary is None or summary.empty:
        return None
    notes = summary.loc[summary["run_id"].astype(str) == run, "coverage"].dropna()
    return next((note for note in notes if isinstance(note, str) and note), None)


def show_run(ctx: ui.PageContext, run: str) -> None:
    """Findings, trace tree with timeline, delegation graph and span attributes of one run."""
    spans = ui.cached_run_spans(ctx.source_key, ctx.version, run)
    if spans.empty:
        st.info(f"No spans stored for run {run!r}. It may be outside the data this source holds.")
        return
    # The run's own findings, as its report lists them (a run filter: a run-partitioned detector
    # answers it from its findings table's rows of that run).
    found = ui.load_findings(replace(ctx, filters=replace(ctx.filters, run=run)))
    findings = found.findings(run=run) if found is not None else []
    findings = [findings[i] for i in order_by_run_and_severity(findings)]
    all_evidence, failed_agents = run_failures(findings)
    note = run_coverage(ctx, run)
    if note:  # what the telemetry lacks, not a failure of driftscope's (as on the Overview)
        st.info(
            "This run could not be fully measured: its framework did not record what a detector "
            f"needs. {note}"
        )
    top = st.columns(4)
    top[0].metric("Spans", len(spans), border=True)
    top[1].metric("Agents", spans["agent_id"].nunique(), border=True)
    top[2].metric("Rejected / failed", int(spans["outcome"].isin(["rejected", "error"]).sum()), border=True)
    top[3].metric("Findings", len(findings), border=True)

    chosen = None
    if findings:
        st.subheader("Findings")
        st.caption("Worst first. Select a finding to highlight its evidence spans in the trace below.")
        wanted = chosen_finding(findings, st.query_params.get("finding"))
        # A run with thousands of findings (a 100,000-call run's loops) lists a page at a time,
        # opening on the page of the finding named in the address.
        first = ui.page_start(len(findings), f"findings_{run}", at=wanted or 0)
        page = findings[first : first + ui.PAGE_ROWS]
        shown = explorer_findings_frame(page, first)
        picked = st.dataframe(
            shown, hide_index=True, column_config=EXPLORER_CONFIG, on_select="rerun",
            selection_mode=["single-row", "single-cell"], key=f"findings_{run}_{first}",
            row_height=ui.WRAP_ROW_HEIGHT, height="content" if len(shown) <= ui.CONTENT_ROWS else "auto",
        )  # fmt: skip
        row = ui.selected_row(picked)
        chosen = first + row if row is not None else (wanted or 0)
        if row is not None:
            st.query_params["finding"] = finding_key(findings[chosen].metric, findings[chosen].span_ids)
        finding = findings[chosen]
        st.markdown(
            f"**Finding {chosen + 1}: {ui.md_escape(finding.failure_mode)}** "
            f"({ui.md_escape(findings_frame([finding])['status'][0])}); "
            f"{len(finding.span_ids)} evidence span(s), highlighted in orange: "
            + ", ".join(f"`{ui.md_escape(s)}`" for s in finding.span_ids[:EVIDENCE_LISTED])
            + (" …" if len(finding.span_ids) > EVIDENCE_LISTED else "")
        )
    evidence = set(findings[chosen].span_ids) if findings else set()

    rows = trace_rows(spans)
    query = st.text_input(
        "Search spans", key="q", bind="query-params", placeholder="trace id, span id or attribute value"
    )
    matches = search_spans(spans, query)
    if query:
        st.caption(f"{len(matches)} span(s) match {query!r}." if matches else f"No span matches {query!r}.")
    # The inspected span: a ?span= link, else the selected finding's first evidence span (as the
    # detector lists them, like the evidence links), else the first search match, else the first failing span, else the first span.
    order = [r.span_id for r in rows]
    position = {span_id: i for i, span_id in enumerate(order)}
    failed_mask = spans["outcome"].isin(["rejected", "error"]) | (spans["status_code"] == "Error")
    failing = spans.loc[failed_mask, "span_id"].astype(str).tolist()
    candidates = [
        st.query_params.get("span") if st.query_params.get("span") in position else None,
        next((s for s in (findings[chosen].span_ids if findings else []) if s in position), None),
        next((s for s in order if s in matches), None),
        failing[0] if failing else None,
        order[0],
    ]
    default = next(c for c in candidates if c)
    # A long run offers its first spans, the first evidence spans and matches, and the default.
    marked = [s for s in order if s in evidence or s in matches][:TIMELINE_LIMIT]
    choices = sorted({default, *order[:TIMELINE_LIMIT], *marked}, key=position.__getitem__)
    names = dict(zip(spans["span_id"].astype(str), spans["span_name"].astype(str), strict=True))
    # Keyed by the finding and search, so choosing another finding moves the panel to its evidence.
    inspected = st.selectbox(
        "Inspect span",
        choices,
        index=choices.index(default),
        format_func=lambda s: f"{s} · {names.get(s, '')}"[:120],
        key=f"inspect_{run}_{chosen}_{query}_{st.query_params.get('span')}",
    )

    st.subheader("Trace")
    left, right = st.columns([1, 1])
    with left:
        trace_tree(spans, rows, evidence, matches, inspected, run)
    with right:
        ui.plot(waterfall_figure(spans, evidence, rows[:TIMELINE_LIMIT], matches, inspected), key="waterfall")
        if len(rows) > TIMELINE_LIMIT:
            st.caption(
                f"The timeline draws the first {TIMELINE_LIMIT:,} of {len(rows):,} spans in tree order."
            )
    attribute_panel(spans, rows, inspected)
    st.subheader("Agents")
    ui.plot(delegation_graph_figure(spans, failed_agents, all_evidence), key="graph")
    st.download_button(
        "Download this run's report",
        # Ids in the report link back to this dashboard (the address is read here, in the page run).
        data=lambda base=dashboard_base(st.context.url): ui.run_report(ctx, run, dashboard_url=base),
        file_name=f"driftscope-report-{run[:60]}.html".replace("/", "_"),
        mime="text/html",
        key="download_run_report",
        on_click="ignore",
    )


@st.cache_data(ttl=ui.CACHE_TTL, max_entries=32, show_spinner=False)
def cached_search(key: str, version: str, text: str, window, filters) -> pd.DataFrame:
    """Spans of any run matching ``text`` (trace id, span id or attribute value)."""
    return ui.get_source(key).search_spans(text, window, filters, SEARCH_LIMIT)


def search_all_runs(ctx: ui.PageContext) -> None:
    """The search across runs: results link to the run explorer at their span."""
    text = st.text_input(
        "Search all runs",
        key="find",
        bind="query-params",
        placeholder="trace id, span id, run id or any attribute value (an order number, a tool argument)",
    ).strip()
    if not text:
        return
    if len(text) < MIN_SEARCH_CHARS:
        st.caption(f"Type at least {MIN_SEARCH_CHARS} characters to search.")
        return
    results = cached_search(ctx.source_key, ctx.version, text, ctx.window, ctx.filters)
    st.caption(f"{describe_results(results, text, SEARCH_LIMIT)} Searched {ui.describe_scope(ctx)}.")
    if results.empty:
        return
    st.dataframe(
        search_results_table(results),
        hide_index=True,
        key="search_results",
        column_config={
            "open": st.column_config.LinkColumn(
                "run", display_text=r"run=([^&]*)", help="Open the run explorer at this span"
            )
        },
    )


ctx = ui.page_context()
st.title("Run explorer")
search_all_runs(ctx)
# The picker lists runs worst first (failing, to review, degraded, healthy; newest first within a
# verdict) with their verdicts, so it opens on the worst failing run; others by ?run=.
verdicts = ui.load_metric(ctx, "run_summary", ("run_id", "verdict", "last_seen"))
ranked = worst_first(verdicts) if verdicts is not None and not verdicts.empty else None
verdict_of = (
    dict(zip(ranked["run_id"].astype(str), ranked["verdict"], strict=True)) if ranked is not None else {}
)
run_ids = list(verdict_of)[: ui.PAGE_ROWS]
wanted = st.query_params.get("run") or ctx.filters.run
if wanted and wanted not in run_ids:
    run_ids.insert(0, wanted)
if not run_ids:
    ui.empty_state("runs")
else:
    run = st.selectbox(
        "Run",
        run_ids,
        index=run_ids.index(wanted) if wanted else 0,
        format_func=lambda r: f"{r} · {verdict_of.get(r, 'no verdict')}",
        key="explorer_run",
    )
    if run != st.query_params.get("run"):
        st.query_params["run"] = run
        for stale in ("span", "finding"):  # they named spans and findings of the previous run
            st.query_params.pop(stale, None)
    if comparison_toggle(run):
        show_comparison(ctx, run)
    else:
        show_run(ctx, run)
