"""The "Compare with healthy runs" view (issue 35) in a real headless Chromium, served by a real
`streamlit run` on a DuckDB file of the sample traces: one click from a failing run on the
Overview to its comparison, drawn without an exception, console error or bad response
(tests/e2e/test_browser.py's Session records them). Needs Debian's chromium, as that file does."""

from __future__ import annotations

import pytest

from tests.dashboard.test_dashboard_db import build_dashboard_db
from tests.e2e.test_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    Session,
    _launch_dashboard,
    _stop,
    _wait_healthy,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tab(tmp_path_factory):
    import os

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y chromium`")
    from playwright.sync_api import sync_playwright

    db = tmp_path_factory.mktemp("browser-compare") / "crew.duckdb"
    base, process = _launch_dashboard(str(db))
    try:
        build_dashboard_db(db)
        _wait_healthy(base, process)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            context = browser.new_context(viewport={"width": 1500, "height": 2400})
            yield Session(context.new_page(), base)
            browser.close()
    finally:
        _stop(process)


def test_one_click_from_a_failing_run_on_the_overview_to_its_comparison(tab):
    tab.open("", "Coordination failures", 2)
    page = tab.page
    main = page.locator('[data-testid="stMain"]')
    # A failing run of the simulator's crew (the XSS run's crew has no healthy run).
    links = main.locator('[data-testid="stPageLink"]', has_text="with healthy runs")
    link = next(links.nth(i) for i in range(links.count()) if "xss" not in links.nth(i).inner_text())
    label = link.inner_text()
    run = label.removeprefix("Compare run ").removesuffix(" with healthy runs")
    tab.shown = f"run_explorer?run={run}&compare=auto"
    link.click()
    page.get_by_role("heading", name="What differs from healthy runs").first.wait_for(timeout=90_000)
    tab.settle("Run explorer", 1)  # the two waterfalls aligned by step are one figure
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-file-compare.png"), full_page=True)
    assert "compare=auto" in page.url and f"run={run}" in page.url
    assert page.locator('[data-testid="stException"]').count() == 0
    alert = main.locator('[data-testid="stAlert"]').first.inner_text()
    assert "departs at step" in alert or "No departure" in alert, alert
    assert main.locator('[data-testid="stDataFrame"]').count() >= 1
    assert page.locator('[data-testid="stCheckbox"], [data-testid="stToggle"]').count() >= 1
    problems = tab.take_problems()
    assert not problems, problems
