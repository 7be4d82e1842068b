"""The sidebar's time-window presets and query-parameter handling, as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from analytics.types import Filters, Window

WINDOW_PRESETS: dict[str, timedelta | None] = {
    "Last 15 min": timedelta(minutes=15),
    "Last 1 h": timedelta(hours=1),
    "Last 24 h": timedelta(hours=24),
    "All time": None,
    "Custom": None,
}
DEFAULT_PRESET = "All time"

# Relative windows are rounded so reruns within a few seconds share a cache entry.
_ROUND_SECONDS = 10


def utc_now() -> datetime:
    """Now, as naive UTC (the form spans.Timestamp uses)."""
    return datetime.now(UTC).replace(tzinfo=None)


def window_for(
    preset: str,
    now: datetime | None = None,
    custom_since: datetime | None = None,
    custom_until: datetime | None = None,
) -> Window:
    """The ``Window`` a sidebar preset stands for (raises ``ValueError`` for unknown presets)."""
    if preset not in WINDOW_PRESETS:
        raise ValueError(f"Expected a window preset among {list(WINDOW_PRESETS)}, got {preset!r}")
    if preset == "Custom":
        return Window(custom_since, custom_until)
    span = WINDOW_PRESETS[preset]
    if span is None:
        return Window()
    now = now or utc_now()
    rounded = now.replace(microsecond=0) - timedelta(seconds=now.second % _ROUND_SECONDS)
    return Window(since=rounded - span, until=None)


def describe_window(window: Window) -> str:
    """A short human description of a window."""
    if window.since is None and window.until is None:
        return "all time"
    since = window.since.isoformat(sep=" ", timespec="seconds") if window.since else "the beginning"
    until = window.until.isoformat(sep=" ", timespec="seconds") if window.until else "now"
    return f"{since} to {until} UTC"


def describe_filters(filters: Filters) -> str:
    """``service=a, run=b`` or ``no filters``."""
    parts = [
        f"{k}={getattr(filters, k)}"
        for k in ("service", "agent", "run", "origin_task")
        if getattr(filters, k)
    ]
    return ", ".join(parts) or "no filters"


def run_link(
    run_id: str | None, page: str = "run_explorer", span: str | None = None, query: str | None = None
) -> str | None:
    """A relative link to the run explorer showing ``run_id`` (and selecting ``span`` or searching
    for ``query``, e.g. a trace id)."""
    if not run_id:
        return None
    from urllib.parse import quote

    link = f"{page}?run={quote(str(run_id), safe='')}"
    if span:
        link += f"&span={quote(str(span), safe='')}"
    if query:
        link += f"&q={quote(str(query), safe='')}"
    return link


# Every page's URL path (the last part of its address in the browser) and title, in the sidebar's
# order (dashboard/app.py builds the navigation from it; Overview tiles name their page by it).
PAGE_TITLES = {
    "overview": "Overview",
    "split_brain": "Split-brain",
    "rejections": "Rejections & enforcement",
    "constraints": "Constraints",
    "goal_drift": "Goal drift",
    "context_drift": "Context drift",
    "loops": "Loops & budgets",
    "findings": "Other findings",
    "alerts": "Alerts",
    "run_explorer": "Run explorer",
    "calibration": "Calibration",
}
PAGE_PATHS = frozenset(PAGE_TITLES)


def dashboard_base(page_url: str | None) -> str | None:
    """The dashboard's base address from the address of one of its pages (query dropped), for
    links a downloaded report makes back to the run explorer; None when it is not an http(s) URL."""
    from urllib.parse import urlsplit

    if not page_url:
        return None
    parts = urlsplit(page_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    path = parts.path.rstrip("/")
    head, _, last = path.rpartition("/")
    if last in PAGE_PATHS:
        path = head
    return f"{parts.scheme}://{parts.netloc}{path}"
