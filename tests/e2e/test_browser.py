"""Every dashboard page in a real headless Chromium, served by a real `streamlit run` process.

Runs once on a DuckDB file of the sample traces and once on a `driftscope serve` fed by the demo.
Fails on any Streamlit exception element, browser console error, page error or JavaScript dialog
(span text carries an XSS payload), and saves one screenshot per page under test-artifacts/.
Needs Debian's chromium at /usr/bin/chromium (`apt-get install -y chromium`); it fails, never
skips, when the browser is missing.
"""

from __future__ import annotations

import html
import json
import os
import re
import socket
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from analytics.types import Filters, Window
from dashboard.datasource import HttpSource
from dashboard.launch import run_dashboard
from tests.dashboard.test_dashboard_db import XSS_RUN, build_dashboard_db, truths, xss_request

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def _start_dashboard(source: str, token: str | None = None):
    port = _free_port()
    process = run_dashboard(source, port, "127.0.0.1", token=token)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, process)
    except BaseException:
        _stop(process)
        raise
    return base, process


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
    """(dashboard URL, ping-pong run id): on a DuckDB file of the sample traces, or on a running
    `driftscope serve` fed by the demo (real OTLP exporters) and read through its API."""
    folder = tmp_path_factory.mktemp(f"browser-{request.param}")
    if request.param == "file":
        db = build_dashboard_db(folder / "crew.duckdb")
        base, process = _start_dashboard(str(db))
        try:
            yield base, PING_PONG_RUN
        finally:
            _stop(process)
        return
    from guards.demo import run_demo
    from tests.serve_helpers import new_serve

    server = new_serve(folder, token=TOKEN).start()
    try:
        assert run_demo(server.http_url, None, live=False, token=TOKEN) == 0
        response = httpx.post(
            f"{server.http_url}/v1/traces", content=json.dumps(xss_request()),
            headers={"Content-Type": "application/json", **server.headers}, timeout=30,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        base, process = _start_dashboard(server.http_url, TOKEN)
        try:
            yield base, _ping_pong_run(HttpSource(server.http_url, TOKEN))
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
    JavaScript bundle is fetched once (~1 s per page otherwise); each test opens its own page,
    so each is a new Streamlit session with its own listeners."""
    shared = browser.new_context(viewport={"width": 1500, "height": 2400}, accept_downloads=True)
    yield shared
    shared.close()


# Opened at a page's own URL, Streamlit's frontend first probes for a base path under that URL
# (`/<page>/_stcore/health`, `/<page>/_stcore/host-config`) and falls back to the root on a 404.
_BASE_PATH_PROBE = re.compile(r"^https?://[^/]+/[a-z_]+/_stcore/(health|host-config)$")


def _bad_response(response) -> bool:
    return response.status >= 400 and not _BASE_PATH_PROBE.match(response.url)


def _console_problem(message, problems: list[str]) -> None:
    if message.type != "error":
        return
    url = (message.location or {}).get("url", "")
    if _BASE_PATH_PROBE.match(url) and "404" in message.text:
        return
    problems.append(f"console error: {message.text} ({url})")


def _settle(page, title: str, charts: int) -> None:
    """Wait until the page's title, its charts and the end of Streamlit's script run are visible."""
    page.get_by_role("heading", name=title).first.wait_for(timeout=90_000)
    if charts:
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {charts}", timeout=90_000
        )
    page.wait_for_function(
        "!document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText.includes('Running')",
        timeout=90_000,
    )
    page.wait_for_timeout(500)  # errors raised just after the run ends


@pytest.mark.parametrize(("path", "title", "charts"), PAGES, ids=[_page_id(p[0]) for p in PAGES])
def test_page_renders_without_errors_in_chromium(context, dashboard, path, title, charts, request):
    dashboard_url, ping_pong = dashboard
    path = path.replace("{ping_pong}", ping_pong)
    source = request.node.callspec.params["dashboard"]
    ARTIFACTS.mkdir(exist_ok=True)
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: _console_problem(m, problems))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status} {r.url}") if _bad_response(r) else None)
    page.on("dialog", lambda d: (problems.append(f"dialog opened: {d.message}"), d.dismiss()))
    try:
        page.goto(f"{dashboard_url}/{path}", wait_until="domcontentloaded")
        _settle(page, title, charts)
        page.screenshot(path=str(ARTIFACTS / f"dashboard-{source}-{_page_id(path)}.png"), full_page=True)
        exceptions = page.locator('[data-testid="stException"]')
        assert exceptions.count() == 0, exceptions.all_inner_texts()
        assert page.locator(".js-plotly-plot").count() == charts
        if path.startswith("run_explorer"):
            picker = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"] input').first
            assert picker.input_value() == path.partition("?run=")[2]
        assert not problems, problems
    finally:
        page.close()


def test_sidebar_download_builds_the_report_on_click(context, dashboard, tmp_path):
    """The report is generated when the button is clicked, from the page's cached detector frames."""
    dashboard_url, _ = dashboard
    page = context.new_page()
    try:
        page.goto(f"{dashboard_url}/", wait_until="domcontentloaded")
        _settle(page, "Coordination failures", 2)
        with page.expect_download(timeout=120_000) as download_info:
            page.get_by_role("button", name="Download report").click()
        saved = tmp_path / "report.html"
        download_info.value.save_as(saved)
        html = saved.read_text(encoding="utf-8")
        assert download_info.value.suggested_filename == "driftscope-report.html"
        assert "<h1>driftscope coordination-failure report</h1>" in html
        assert "<h2>Findings</h2>" in html and "class='finding " in html
        assert "<script>alert(" not in html  # span text stays escaped
    finally:
        page.close()


def test_incident_path_overview_to_evidence_to_report(context, dashboard, tmp_path, request):
    """The on-call path: the Overview's first row is a failing run; one click opens it with the
    worst finding's evidence spans highlighted in a nested trace view; the report downloaded from
    there lists that finding first."""
    dashboard_url, _ = dashboard
    source = request.node.callspec.params["dashboard"]
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog opened: {d.message}"), d.dismiss()))
    try:
        page.goto(f"{dashboard_url}/", wait_until="domcontentloaded")
        _settle(page, "Coordination failures", 2)
        main = page.locator('[data-testid="stMain"]')
        # The first screen leads with the runs that need attention, failing first.
        headings = main.locator("h3").all_inner_texts()
        assert headings.index("Runs that need attention") < headings.index("Failure modes")
        first = main.locator('[data-testid="stPageLink"]').first
        label = first.inner_text()
        assert label.startswith("Open failing run "), label
        run = label.removeprefix("Open failing run ").split(": ", 1)[0]
        first.click()
        page.get_by_role("heading", name="Trace").first.wait_for(timeout=90_000)
        _settle(page, "Run explorer", 2)
        page.screenshot(path=str(ARTIFACTS / f"incident-{source}-run.png"), full_page=True)
        assert f"run={run}" in page.url
        picker = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"] input').first
        assert picker.input_value() == run
        finding = main.locator(
            '[data-testid="stMarkdownContainer"]', has_text="Finding 1: "
        ).last.inner_text()
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
        assert not problems, problems
    finally:
        page.close()


def test_report_fits_the_window_and_the_url_keeps_the_filters(context, dashboard, tmp_path):
    """The HTML report is not wider than a 1,400 px window; a filter chosen in the sidebar is in
    the URL, and opening that URL restores it."""
    dashboard_url, _ = dashboard
    page = context.new_page()
    page.set_viewport_size({"width": 1400, "height": 1200})
    try:
        page.goto(f"{dashboard_url}/", wait_until="domcontentloaded")
        _settle(page, "Coordination failures", 2)
        with page.expect_download(timeout=120_000) as download_info:
            page.get_by_role("button", name="Download report").click()
        saved = tmp_path / "report.html"
        download_info.value.save_as(saved)
        page.goto(saved.as_uri())
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1400, width
        page.goto(f"{dashboard_url}/loops", wait_until="domcontentloaded")
        _settle(page, "Loops & budgets", 0)
        page.get_by_label("Agent").click()
        page.get_by_role("option", name="analyst", exact=True).click()
        page.wait_for_url(re.compile(r"agent=analyst"), timeout=30_000)
        _settle(page, "Loops & budgets", 0)
        page.goto(page.url, wait_until="domcontentloaded")  # the pasted link
        _settle(page, "Loops & budgets", 0)
        assert page.get_by_label("Agent").input_value() == "analyst"
    finally:
        page.close()
