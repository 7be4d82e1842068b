"""Screenshots of every dashboard page and of the HTML report at 1600x1000, for a person to look at.

``make screenshots`` runs ``python -m tests.e2e.screenshots OUT``: it builds the sample-traces
database the dashboard tests use, starts a real ``streamlit run`` on it, visits every page in
Debian's headless Chromium (as tests/e2e/test_browser.py does) and saves one full-page PNG per page
(``dashboard-<page>.png`` the first screen, ``-full.png`` the whole page; the run explorer opened
on its default run), then writes the HTML report
of the same data and saves ``report.png``. Reviewers look at them before resolving a dashboard
issue; nothing here asserts (the browser tests do).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from analytics.types import Filters, Window
from dashboard.datasource import open_source
from dashboard.launch import run_dashboard
from dashboard.report import build_report
from tests.e2e.test_browser import _wait_healthy
from tests.serve_helpers import free_port

logger = logging.getLogger(__name__)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1600, "height": 1000}
# url path, page title (the heading that says the page has drawn)
PAGES = [
    ("", "Coordination failures"),
    ("split_brain", "Split-brain: shared state"),
    ("rejections", "Rejections & enforcement"),
    ("constraints", "Constraints along delegation chains"),
    ("goal_drift", "Goal drift"),
    ("context_drift", "Context drift"),
    ("loops", "Loops & budgets"),
    ("findings", "Other findings"),
    ("alerts", "Alerts"),
    ("run_explorer", "Run explorer"),
    ("calibration", "Calibration"),
]
# The height of a page's content: Streamlit's main block scrolls inside the window.
FULL_HEIGHT = """() => {
  const main = document.querySelector('[data-testid="stMain"]');
  return Math.max(main ? main.scrollHeight : 0, document.documentElement.scrollHeight);
}"""
SCRIPT_DONE = "[data-testid='stApp'][data-test-script-state='notRunning']"


def settle(page, title: str) -> None:
    """Wait until the page's heading is drawn and Streamlit's script run has ended, then a moment
    for charts and tables to paint."""
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=90_000)
    page.wait_for_selector(SCRIPT_DONE, state="attached", timeout=90_000)
    page.wait_for_timeout(1500)


def shoot(page, stem: Path) -> list[Path]:
    """``<stem>.png``, the first screen at 1600x1000 as a person sees it, and ``<stem>-full.png``,
    the whole page (Streamlit scrolls inside its main block, so the window is made as tall as the
    content for it)."""
    first, full = stem.with_name(stem.name + ".png"), stem.with_name(stem.name + "-full.png")
    page.screenshot(path=str(first))
    height = page.evaluate(FULL_HEIGHT)
    page.set_viewport_size({"width": VIEWPORT["width"], "height": max(int(height), VIEWPORT["height"])})
    page.wait_for_timeout(800)
    page.screenshot(path=str(full), full_page=True)
    page.set_viewport_size(VIEWPORT)
    return [first, full]


def take(db: Path, out: Path) -> list[Path]:
    """Screenshots of every page of a dashboard on ``db`` and of its HTML report, saved in ``out``."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = run_dashboard(str(db), port, "127.0.0.1")
    saved = []
    try:
        _wait_healthy(base, process)
        report = out / "report.html"
        report.write_text(
            build_report(open_source(str(db)), Window(), Filters(), None, "html", dashboard_url=base),
            encoding="utf-8",
        )
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport=VIEWPORT)
            for path, title in PAGES:
                page.goto(f"{base}/{path}", wait_until="domcontentloaded")
                settle(page, title)
                saved.extend(shoot(page, out / f"dashboard-{path or 'overview'}"))
            page.goto(report.resolve().as_uri())
            page.wait_for_timeout(1000)
            saved.extend(shoot(page, out / "report"))
            browser.close()
    finally:
        process.terminate()
        process.wait(timeout=15)
    return saved


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.e2e.screenshots OUT``: build the sample database, take the screenshots."""
    from tests.dashboard.test_dashboard_db import build_dashboard_db

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the PNG files (created)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as folder:
        db = build_dashboard_db(Path(folder) / "crew.duckdb")
        for path in take(db, args.out):
            logger.info("saved %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
