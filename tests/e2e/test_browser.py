"""Every dashboard page in a real headless Chromium, served by a real `streamlit run` process.

Runs once on a DuckDB file of the sample traces and once on a `driftscope serve` fed by the demo.
Each dashboard's tests share one tab, as a person on call does: the Overview and the run
explorer's deep links are loaded from their URLs, the other pages are reached through the
sidebar's links (no new page load, so Streamlit's and Plotly's JavaScript is parsed once per tab).
Fails on any Streamlit exception element, browser console error, page error, bad HTTP response or
JavaScript dialog (span text carries an XSS payload), and saves one screenshot per page under
test-artifacts/.
Needs Debian's chromium at /usr/bin/chromium (`apt-get install -y chromium`); it fails, never
skips, when the browser is missing.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest

from analytics.types import Filters, Window
from dashboard.datasource import DuckDBFileSource, HttpSource
from dashboard.findings import as_list, finding_metrics, finding_rows
from dashboard.launch import run_dashboard
from dashboard.tables import evidence_text, finding_key
from tests.dashboard.test_dashboard_db import XSS_RUN, build_dashboard_db, truths, xss_request
from tests.serve_helpers import free_port

CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-test-token"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

PING_PONG_RUN = next(
    t["run_id"] for t in truths() if t["scenario"] == "ping_pong" and t["variant"] == "unguarded"
)

# url path, page title, how many Plotly charts the page draws on the test database
PAGES = [
    ("", "Coordination failures", 2),  # the default page lives at the root
    ("split_brain", "Split-brain: shared state", 1),
    ("rejections", "Rejections & enforcement", 2),
    ("constraints", "Constraints along delegation chains", 1),
    ("goal_drift", "Goal drift", 1),
    ("context_drift", "Context drift", 1),
    ("loops", "Loops & budgets", 0),
    ("findings", "Other findings", 0),  # detectors without a page of their own (runaway runs)
    ("alerts", "Alerts", 0),
    ("run_explorer?run={ping_pong}", "Run explorer", 2),
    (f"run_explorer?run={XSS_RUN}", "Run explorer", 2),  # span text is markup: must stay text
    ("calibration", "Calibration", 1),
]

pytestmark = pytest.mark.slow


def _page_id(path: str) -> str:
    """``overview``, ``split_brain``, ``run_explorer-run-xss`` ..."""
    if not path:
        return "overview"
    page, _, query = path.partition("?run=")
    return f"{page}-{query}" if query.startswith("run-xss") else page


def _wait_healthy(base: str, process, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"streamlit exited early with code {process.returncode}")
        try:
            if httpx.get(f"{base}/_stcore/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"dashboard at {base} not healthy after {timeout} s")


def _launch_dashboard(source: str, token: str | None = None):
    """Start a dashboard on a free port; return (URL, process). The caller waits for it with
    ``_wait_healthy`` (meanwhile it can load the data: the dashboard reads its source only when a
    page is first viewed) and stops it with ``_stop``."""
    port = free_port()
    return f"http://127.0.0.1:{port}", run_dashboard(source, port, "127.0.0.1", token=token)


def _stop(process) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except Exception:
        process.kill()
        process.wait(timeout=15)


def _ping_pong_run(source) -> str:
    runs = source.runs(Window(), Filters())
    return next(r for r in runs["run_id"] if r.startswith("run-ping_pong-unguarded-"))


@pytest.fixture(scope="module", params=["file", "demo"])
def dashboard(request, tmp_path_factory):
    """(dashboard URL, ping-pong run id, data source the test reads the truth from): on a DuckDB file of the sample traces, or on a running
    `driftscope serve` fed by the demo (real OTLP exporters) and read through its API."""
    folder = tmp_path_factory.mktemp(f"browser-{request.param}")
    if request.param == "file":
        db = folder / "crew.duckdb"
        base, process = _launch_dashboard(str(db))  # starts while the file is built
        try:
            build_dashboard_db(db)
            _wait_healthy(base, process)
            yield base, PING_PONG_RUN, DuckDBFileSource(db)
        finally:
            _stop(process)
        return
    from driftscope.commands import onnx_embedder  # as `driftscope demo` embeds (no torch to load)
    from guards.demo import run_demo
    from tests.serve_helpers import new_serve

    server = new_serve(folder, token=TOKEN).start()
    try:
        base, process = _launch_dashboard(server.http_url, TOKEN)  # starts while the demo runs
        try:
            assert run_demo(server.http_url, None, live=False, token=TOKEN, embedder=onnx_embedder) == 0
            response = httpx.post(
                f"{server.http_url}/v1/traces", content=json.dumps(xss_request()),
                headers={"Content-Type": "application/json", **server.headers}, timeout=30,
            )  # fmt: skip
            assert response.status_code == 200, response.text
            _wait_healthy(base, process)
            source = HttpSource(server.http_url, TOKEN)
            yield base, _ping_pong_run(source), source
        finally:
            _stop(process)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y chromium`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield instance
        instance.close()


@pytest.fixture(scope="module")
def context(browser, dashboard):
    """One browser context per dashboard: its pages share the HTTP cache, so Streamlit's
    JavaScript bundle is fetched once (~1 s per page otherwise)."""
    shared = browser.new_context(viewport={"width": 1500, "height": 2400}, accept_downloads=True)
    yield shared
    shared.close()


# Opened at a page's own URL, Streamlit's frontend first probes for a base path under that URL
# (`/<page>/_stcore/health`, `/<page>/_stcore/host-config`) and falls back to the root on a 404.
_BASE_PATH_PROBE = re.compile(r"^https?://[^/]+/[a-z_]+/_stcore/(health|host-config)$")
_SCRIPT_DONE = "[data-testid='stApp'][data-test-script-state='notRunning']"
_TWO_FRAMES = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


def _bad_response(response) -> bool:
    return response.status >= 400 and not _BASE_PATH_PROBE.match(response.url)


def _console_problem(message) -> str | None:
    if message.type != "error":
        return None
    url = (message.location or {}).get("url", "")
    if _BASE_PATH_PROBE.match(url) and "404" in message.text:
        return None
    return f"console error: {message.text} ({url})"


def _settle(page, title: str, charts: int) -> None:
    """Wait until the page's title and charts are drawn and Streamlit's script run has ended.

    The title comes first (the whole heading: no other page has one of that text): it is drawn
    by the page's own run, so the end-of-run state that follows is this page's (and not that of
    the page a link was clicked on)."""
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=90_000)
    if charts:
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {charts}", timeout=90_000
        )
    page.wait_for_selector(_SCRIPT_DONE, state="attached", timeout=90_000)


class Session:
    """One browser tab on one dashboard, visited as a person does during an incident: a URL
    opens a page (a new Streamlit session), the sidebar's links move between pages in that
    session (no new page load, websocket or JavaScript parse).

    Every console error, page error, bad HTTP response and JavaScript dialog is recorded with the
    page shown when it arrived; ``take_problems`` hands them to the check of that page."""

    def __init__(self, page, base: str) -> None:
        self.page, self.base = page, base
        self.shown = ""  # the page being visited, named in each recorded problem
        self.problems: list[str] = []
        self.in_flight: set = set()
        self.on_app = False  # whether the tab shows this dashboard (else the sidebar has no links)
        page.on("console", lambda m: self._record(_console_problem(m)))
        page.on("pageerror", lambda e: self._record(f"page error: {e}"))
        page.on("response", lambda r: self._record(f"HTTP {r.status} {r.url}" if _bad_response(r) else None))
        page.on("dialog", lambda d: (self._record(f"dialog opened: {d.message}"), d.dismiss()))
        page.on("request", lambda r: self.in_flight.add(r))
        page.on("requestfinished", lambda r: self.in_flight.discard(r))
        page.on("requestfailed", lambda r: self.in_flight.discard(r))

    def _record(self, problem: str | None) -> None:
        if problem:
            self.problems.append(f"{problem} [while on {self.shown or 'no page'}]")

    def open(self, path: str, title: str, charts: int) -> None:
        """Load ``path`` as a typed or pasted URL (a new Streamlit session)."""
        self.shown = path or "/"
        self.page.goto(f"{self.base}/{path}", wait_until="domcontentloaded")
        self.on_app = True
        self.settle(title, charts)

    def follow_sidebar(self, url_path: str, title: str, charts: int) -> None:
        """Click the sidebar's link to page ``url_path`` ("" for the Overview), as a user does;
        load the page's URL instead when the tab shows no dashboard (a test run on its own, or
        the first after a failed one)."""
        if not self.on_app:
            self.open(url_path, title, charts)
            return
        self.shown = url_path or "/"
        self.page.locator(f'[data-testid="stSidebarNav"] a[href="{self.base}/{url_path}"]').click()
        self.settle(title, charts)
        assert urlsplit(self.page.url).path == f"/{url_path}", self.page.url

    def settle(self, title: str, charts: int) -> None:
        """``_settle``, then wait for quiet: no request in flight (images, media, a failing
        resource whose error is a finding) for a few drawn frames in a row."""
        _settle(self.page, title, charts)
        deadline = time.monotonic() + 60
        calm = 0
        while calm < 3:
            self.page.evaluate(_TWO_FRAMES)
            calm = 0 if self.in_flight else calm + 1
            if time.monotonic() > deadline:
                raise AssertionError(f"requests still in flight: {[r.url for r in self.in_flight]}")

    def take_problems(self) -> list[str]:
        """The problems recorded since the last call (and forget them)."""
        taken, self.problems[:] = list(self.problems), []
        return taken

    def leave(self) -> None:
        """The next visit loads a URL again (after a test changed the session's filters)."""
        self.on_app = False


@pytest.fixture(scope="module")
def shared_tab(context, dashboard):
    """The tab the tests of one dashboard share (in file order: the pages, then the paths through
    them). After the last test, problems that arrived after its checks fail the teardown."""
    dashboard_url, *_ = dashboard
    tab = Session(context.new_page(), dashboard_url)
    try:
        yield tab
        tab.page.wait_for_timeout(500)  # the last page's late errors, once per dashboard
        late = tab.take_problems()
        assert not late, late
    finally:
        tab.page.close()


@pytest.fixture
def tab(shared_tab, request):
    """The shared tab for one test. Problems that arrived after the previous test's checks fail
    this test's setup (each names the page it arrived on); after a failed test the next one
    reloads its page rather than starting from the failed one's state."""
    shared_tab.page.evaluate(_TWO_FRAMES)  # events reach Python only during a browser call
    late = shared_tab.take_problems()
    assert not late, late
    failures = request.session.testsfailed
    yield shared_tab
    if request.session.testsfailed != failures:
        shared_tab.leave()
        shared_tab.take_problems()  # the failed test's (reported with it, or lost with it)


@pytest.mark.parametrize(("path", "title", "charts"), PAGES, ids=[_page_id(p[0]) for p in PAGES])
def test_page_renders_without_errors_in_chromium(tab, dashboard, path, title, charts, request):
    """The Overview is opened at its URL (a first load), pages named by a run id at theirs (a
    deep link), every other page from the sidebar's link in the same tab."""
    _, ping_pong, _ = dashboard
    path = path.replace("{ping_pong}", ping_pong)
    source = request.node.callspec.params["dashboard"]
    ARTIFACTS.mkdir(exist_ok=True)
    if path == "" or "?" in path:
        tab.open(path, title, charts)
    else:
        tab.follow_sidebar(path, title, charts)
    page = tab.page
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{source}-{_page_id(path)}.png"), full_page=True)
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, exceptions.all_inner_texts()
    assert page.locator(".js-plotly-plot").count() == charts
    if path.startswith("run_explorer"):
        picker = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"] input').first
        assert picker.input_value().split(" · ")[0] == path.partition("?run=")[2]  # "run · verdict"
    problems = tab.take_problems()
    assert not problems, problems


def test_sidebar_download_builds_the_report_on_click_and_it_fits_the_window(tab, context, tmp_path):
    """The report is generated when the button is clicked (on any page: it is the sidebar's), from
    the page's cached detector frames; the HTML report is not wider than a 1,400 px window."""
    if not tab.on_app:
        tab.open("", "Coordination failures", 2)
    with tab.page.expect_download(timeout=120_000) as download_info:
        tab.page.get_by_role("button", name="Download report").click()
    saved = tmp_path / "report.html"
    download_info.value.save_as(saved)
    html_text = saved.read_text(encoding="utf-8")
    assert download_info.value.suggested_filename == "driftscope-report.html"
    assert "<h1>driftscope coordination-failure report</h1>" in html_text
    assert "<h2>Findings</h2>" in html_text and "class='finding " in html_text
    assert "<script>alert(" not in html_text  # span text stays escaped
    problems = tab.take_problems()
    assert not problems, problems
    narrow = context.new_page()
    try:
        narrow.set_viewport_size({"width": 1400, "height": 1200})
        narrow.goto(saved.as_uri())
        width = narrow.evaluate("document.documentElement.scrollWidth")
        assert width <= 1400, width
    finally:
        narrow.close()


def test_incident_path_overview_to_evidence_to_report(tab, dashboard, tmp_path, request):
    """The on-call path: the Overview's first row is a failing run; one click opens it with the
    worst finding's evidence spans highlighted in a nested trace view; the report downloaded from
    there lists that finding first."""
    dashboard_url, *_ = dashboard
    source = request.node.callspec.params["dashboard"]
    tab.follow_sidebar("", "Coordination failures", 2)
    page = tab.page
    main = page.locator('[data-testid="stMain"]')
    # The first screen leads with the runs that need attention, failing first.
    headings = main.locator("h3").all_inner_texts()
    assert headings.index("Runs that need attention") < headings.index("Failure modes")
    first = main.locator('[data-testid="stPageLink"]').first
    label = first.inner_text()
    assert label.startswith("Open failing run "), label
    run = label.removeprefix("Open failing run ").split(": ", 1)[0]
    tab.shown = f"run_explorer?run={run}"
    first.click()
    page.get_by_role("heading", name="Trace").first.wait_for(timeout=90_000)
    tab.settle("Run explorer", 2)
    page.screenshot(path=str(ARTIFACTS / f"incident-{source}-run.png"), full_page=True)
    assert f"run={run}" in page.url
    picker = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"] input').first
    assert picker.input_value().split(" · ")[0] == run
    finding = main.locator('[data-testid="stMarkdownContainer"]', has_text="Finding 1: ").last.inner_text()
    mode = finding.removeprefix("Finding 1: ").split(" (", 1)[0].strip()
    assert mode and "evidence span(s), highlighted" in finding
    # The evidence spans are marked in a nested tree (an expander inside an expander), and
    # the attribute panel opened on one of them.
    headers = main.locator('[data-testid="stExpander"] summary')
    marked = headers.filter(has_text="evidence")
    assert marked.count() >= 1
    assert main.locator('[data-testid="stExpander"] [data-testid="stExpander"]').count() >= 1
    inspected = main.get_by_role("heading", name=re.compile("^Attributes of span ")).first.inner_text()
    span_id = inspected.rsplit(" ", 1)[1]
    assert marked.filter(has_text="inspected").count() == 1
    # The report from there lists the same finding first.
    with page.expect_download(timeout=120_000) as download_info:
        page.get_by_role("button", name="Download this run's report").click()
    saved = tmp_path / "run-report.html"
    download_info.value.save_as(saved)
    html_text = saved.read_text(encoding="utf-8")
    first_finding = re.search(r"<div class='finding [a-z-]+' id='F\d+'><h4>F\d+: (.*?) \(", html_text)
    assert first_finding is not None and first_finding.group(1) == html.escape(mode)
    assert span_id in html_text[first_finding.start() :].split("<div class='finding", 2)[1]
    # Ids in the downloaded report link back to this dashboard's run explorer.
    runs = re.findall(r"<h3 class='run'>Run <a href='([^']*)'><code>(.*?)</code></a></h3>", html_text)
    assert [text for _, text in runs] == [html.escape(run)]
    assert html.unescape(runs[0][0]) == f"{dashboard_url}/run_explorer?run={quote(run, safe='')}"
    span_link = f"{dashboard_url}/run_explorer?run={quote(run, safe='')}&amp;span={span_id}"
    assert f"<a href='{span_link}'>{span_id}</a>" in html_text
    problems = tab.take_problems()
    assert not problems, problems


# The page each detector's findings table is on: url path -> (heading, charts drawn).
PAGE_HEADINGS = {path.partition("?")[0]: (title, charts) for path, title, charts in PAGES}
# A findings table's grid: a header row, then rows of ui.WRAP_ROW_HEIGHT px.
GRID_HEADER = 36


def _last_finding_row(table) -> int:
    """The last row of a findings table that is a finding (the one a wrong "finding #1" misses)."""
    table.locator("#glide-cell-1-0").wait_for(state="attached", timeout=30_000)  # the grid drew its rows
    texts = [
        table.locator(f"#glide-cell-2-{row}").inner_text()  # column 2: what happened
        for row in range(table.locator("tr").count() - 1)  # the first row is the header
    ]  # fmt: skip
    return max(i for i, text in enumerate(texts) if not text.startswith("not a finding"))


def test_each_tile_leads_to_a_table_whose_row_opens_exactly_its_finding(tab, dashboard, request):
    """The on-call path from every failure mode with findings: the Overview's tile opens its
    page; one click on the last finding row of the detector's table opens the run explorer in
    this tab with exactly that finding selected, and the spans marked as evidence on screen are
    that finding's (issue 34: the explorer used to highlight the run's finding #1)."""
    from dashboard.ui import WRAP_ROW_HEIGHT

    _, _, source = dashboard
    page = tab.page
    walked = []
    for metric in finding_metrics(source.list_metrics()):
        name, path = metric["name"], metric.get("page") or "findings"
        findings = finding_rows(source.metric(name, Window(), Filters()), metric)
        if findings.empty:
            continue
        evidence_of = {finding_key(name, ids): as_list(ids) for ids in findings["span_ids"]}
        tab.follow_sidebar("", "Coordination failures", 2)
        tab.shown = path
        page.locator(f".st-key-tile_{name} a").click()
        tab.settle(*PAGE_HEADINGS[path])
        table = page.locator(f".st-key-findings_{name}")
        table.scroll_into_view_if_needed()
        row = _last_finding_row(table)
        shown_evidence = table.locator(f"#glide-cell-3-{row}").inner_text()
        box = table.locator('[data-testid="stDataFrame"]').bounding_box()
        tab.shown = f"run_explorer ({name} row {row + 1})"
        page.mouse.click(box["x"] + 400, box["y"] + GRID_HEADER + WRAP_ROW_HEIGHT * (row + 0.5))
        page.get_by_role("heading", name="Trace").first.wait_for(timeout=90_000)
        tab.settle("Run explorer", 2)
        query = dict(part.split("=", 1) for part in urlsplit(page.url).query.split("&"))
        evidence = evidence_of[query["finding"]]  # one finding of this detector ...
        assert evidence_text(evidence) == shown_evidence, name  # ... the one clicked
        main = page.locator('[data-testid="stMain"]')
        line = main.locator(
            '[data-testid="stMarkdownContainer"]', has_text="evidence span(s), highlighted"
        ).last
        listed = re.findall(r"\b[0-9a-f]{16}\b", line.inner_text())
        assert listed == evidence[:12], (name, listed, evidence)
        marked = main.locator('[data-testid="stExpander"] summary').filter(has_text="evidence")
        on_screen = {text.rsplit(" · ", 1)[1].strip() for text in marked.all_inner_texts()}
        run_spans = set(source.run_spans(query["run"])["span_id"])
        assert on_screen == set(evidence) & run_spans and on_screen, (name, on_screen, evidence)
        walked.append(name)
        problems = tab.take_problems()
        assert not problems, problems
    page.screenshot(path=str(ARTIFACTS / f"incident-{request.node.callspec.params['dashboard']}-walk.png"))
    assert len(walked) >= 10, walked  # the sample crews and the demo inject ten failure modes or more


def test_the_overview_answers_at_its_own_name(tab):
    """/overview (a link typed with the page's name) shows the Overview, not "Page not found"."""
    tab.open("overview", "Coordination failures", 2)
    tab.page.wait_for_timeout(500)  # the frontend shows its not-found notice after the run
    assert tab.page.get_by_text("Page not found").count() == 0
    assert tab.page.locator(".st-key-tile_lost_updates").count() == 1
    problems = tab.take_problems()
    assert not problems, problems


def test_the_url_keeps_the_filters(tab):
    """A filter chosen in the sidebar is in the URL, and opening that URL restores it."""
    tab.follow_sidebar("loops", "Loops & budgets", 0)
    page = tab.page
    try:
        page.get_by_label("Agent").click()
        page.get_by_role("option", name="analyst", exact=True).click()
        page.wait_for_url(re.compile(r"agent=analyst"), timeout=30_000)
        tab.settle("Loops & budgets", 0)
        tab.open(page.url.removeprefix(tab.base + "/"), "Loops & budgets", 0)  # the pasted link
        assert page.get_by_label("Agent").input_value() == "analyst"
    finally:
        tab.leave()  # the tab's filters are no longer the defaults the other tests expect
    problems = tab.take_problems()
    assert not problems, problems
