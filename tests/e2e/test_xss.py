"""An XSS corpus sent through the real ingest comes out escaped in reports and the dashboard."""

import html
import os
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from analytics.types import Filters, Window
from dashboard.datasource import HttpSource
from dashboard.report import build_report
from tests.e2e.test_browser import CHROMIUM, CHROMIUM_ARGS, Session, _launch_dashboard, _stop, _wait_healthy

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
RUN = "run-xss"
CORPUS = [
    "<script>window.__xss = 'script';</script>",
    "<img src=x onerror=\"window.__xss='img'\">",
    "<svg/onload=window.__xss='svg'>",
    "\"><iframe src=javascript:window.__xss='iframe'></iframe>",
    "<a href=\"javascript:window.__xss='link'\">click</a>",
    "</textarea><body onload=window.__xss='body'>",
    "[click](javascript:window.__xss='md') ![x](http://127.0.0.1:1/x.png)",
    "{{7*7}} ${7*7} <b>bold</b> <style>*{display:none}</style>",
]


def _send_corpus(serve) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "xss-crew"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{serve.http_url}/v1/traces")))
    tracer = provider.get_tracer("xss")
    root = {
        "gen_ai.agent.id": "planner",
        "gen_ai.conversation.id": RUN,
        "gen_ai.operation.name": "invoke_agent",
    }
    with tracer.start_as_current_span(
        f"plan {CORPUS[0]}", attributes={**root, "driftscope.goal.root": CORPUS[1]}
    ):
        for index, payload in enumerate(CORPUS):
            attrs = {
                "gen_ai.agent.id": f"agent{index % 2}",
                "gen_ai.conversation.id": RUN,
                "gen_ai.tool.name": "write_state",
                "gen_ai.tool.call.arguments": payload,
                "gen_ai.tool.call.result": payload,
                "driftscope.op": "write",
                "driftscope.state.key": f"key {payload}",
                "driftscope.state.version": f"v{index}",
                "driftscope.outcome": "ok",
                # A plain root goal: every payload subtask drifts far past the default threshold
                # (0.80), so each is a finding whose evidence the reports must escape.
                "driftscope.goal.root": "Plan a three-day team offsite in Lisbon for 25 people",
                "driftscope.goal.text": payload,
                "input.value": payload,
            }
            with tracer.start_as_current_span(payload, attributes=attrs) as span:
                span.add_event(payload)
                span.set_status(Status(StatusCode.ERROR, payload))
    provider.shutdown()


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    from tests.serve_helpers import new_serve

    server = new_serve(tmp_path_factory.mktemp("xss")).start()
    _send_corpus(server)
    yield server
    server.stop()


def _raw_markup_left(text: str) -> list[str]:
    return [payload for payload in CORPUS if "<" in payload and payload in text]


def test_reports_escape_the_corpus_in_every_format(fed):
    source = HttpSource(fed.http_url)
    for fmt in ("html", "md", "json"):
        for run in (RUN, None):
            text = build_report(source, Window(), Filters(), run=run, fmt=fmt)
            text = text.decode() if isinstance(text, bytes) else text
            if fmt == "json":
                import json

                json.loads(text)  # well-formed even with hostile text
                continue
            assert not _raw_markup_left(text), (fmt, run, _raw_markup_left(text))
            for tag in ("<img src=x", "<svg/onload", "<iframe", "<body onload", "<style>*"):
                assert tag not in text, (fmt, tag)
    html_report = build_report(source, Window(), Filters(), run=RUN, fmt="html")
    assert html.escape("window.__xss", quote=True) in html_report or "window.__xss" in html_report


# url path, title: the run first (a deep link), then pages reached from the sidebar's links
PAGES = [
    (f"run_explorer?run={RUN}", "Run explorer"),
    ("split_brain", "Split-brain: shared state"),
    ("goal_drift", "Goal drift"),
    ("", "Coordination failures"),
]


def _assert_no_script_ran(page, path: str) -> None:
    assert page.evaluate("window.__xss") is None, (path, page.evaluate("window.__xss"))
    assert page.locator("iframe[src^='javascript']").count() == 0
    assert page.locator("img[src='x']").count() == 0
    assert page.locator('[data-testid="stException"]').count() == 0


@pytest.mark.slow
def test_dashboard_pages_run_no_script_from_span_text(fed):
    """Each page that shows span text, in one tab as a user moves through them: no payload runs
    (``window.__xss`` stays unset in the tab's one JavaScript realm, no dialog opens), no markup
    becomes an element, and the run explorer still shows the text as text."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    base, process = _launch_dashboard(fed.http_url)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            _wait_healthy(base, process)  # the browser started meanwhile
            tab = Session(browser.new_page(viewport={"width": 1400, "height": 2000}), base)
            for path, title in PAGES:
                if "?" in path:
                    tab.open(path, title, charts=0)
                else:
                    tab.follow_sidebar(path, title, charts=0)
                tab.page.wait_for_function(
                    '!document.querySelector(\'[data-testid="stSpinner"], [data-testid="stSkeleton"]\')',
                    timeout=120_000,
                )
                tab.settle(title, charts=0)
                _assert_no_script_ran(tab.page, path)
                if path.startswith("run_explorer"):
                    # The span text must still be shown, as text.
                    tab.page.wait_for_function(
                        "document.body.innerText.includes('window.__xss')", timeout=120_000
                    )
                    tab.settle(title, charts=0)
                    tab.page.screenshot(path=str(ARTIFACTS / "xss-run-explorer.png"), full_page=True)
                    _assert_no_script_ran(tab.page, path)
                problems = tab.take_problems()
                assert not problems, problems
            # A payload that runs late, on any page: the tab kept one JavaScript realm throughout.
            tab.page.wait_for_timeout(1500)
            _assert_no_script_ran(tab.page, "(any page, late)")
            problems = tab.take_problems()
            assert not problems, problems
            browser.close()
    finally:
        _stop(process)
