"""Reports and dashboard: the HTML drift report and every page (AppTest) on a span database.

``python -m benchmarks.dashboard DB --out r.json`` renders every page (``PAGES``), each opened
directly in a fresh process (``page_render``); ``overview_render`` is the Overview's.

Both read the database file the way an incident responder would: ``DuckDBFileSource`` (read-only,
analytics in this process). The window covers every stored span. Each result splits the time into
``detector_s`` (inside ``DuckDBFileSource.metric``, i.e. the analytics detectors, timed by a
wrapper that calls the real method) and ``other_s`` (everything else: browse queries, evidence,
findings indexing, rendering, Streamlit).

``in_subprocess`` first fills the goal-text embedding cache of the database (one read-write
``goal_divergence`` call, outside the timing), as the queries benchmark's cold call does: a
served database has it filled by the embedding worker, and model inference is measured by the
embeddings benchmark, not here.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)


class DetectorClock:
    """Accumulates the seconds spent in ``DuckDBFileSource.metric`` while installed.

    The real method runs unchanged; the wrapper only reads the clock around it.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls: dict[str, int] = {}
        self.by_detector: dict[str, float] = {}
        self._originals: dict = {}

    def __enter__(self) -> DetectorClock:
        from dashboard.datasource import DuckDBFileSource, HttpSource

        self._originals = {kind: kind.metric for kind in (DuckDBFileSource, HttpSource)}
        clock = self

        def timing(original):
            def timed(source, name, window, filters, *columns):  # columns: a projection read
                start = time.perf_counter()
                try:
                    return original(source, name, window, filters, *columns)
                finally:
                    elapsed = time.perf_counter() - start
                    clock.seconds += elapsed
                    clock.calls[name] = clock.calls.get(name, 0) + 1
                    clock.by_detector[name] = round(clock.by_detector.get(name, 0.0) + elapsed, 3)

            return timed

        for kind, original in self._originals.items():
            kind.metric = timing(original)
        return self

    def __exit__(self, *exc) -> None:
        for kind, original in self._originals.items():
            kind.metric = original


# The data source's reads other than detectors (``ReadClock``).
SOURCE_READS = (
    "health",
    "data_version",
    "filter_options",
    "run_totals",
    "run_details",
    "run_spans",
    "evidence_spans",
    "thresholds",
    "search_spans",
    "alerts",
)


class ReadClock:
    """Accumulates the seconds spent in ``DuckDBFileSource``'s other reads (``SOURCE_READS``:
    browse queries, run spans, thresholds) while installed, by read."""

    def __init__(self) -> None:
        self.by_read: dict[str, float] = {}
        self._originals: dict[str, object] = {}

    def __enter__(self) -> ReadClock:
        from dashboard.datasource import DuckDBFileSource, HttpSource

        for kind in (DuckDBFileSource, HttpSource):
            for name in SOURCE_READS:
                if hasattr(kind, name):
                    original = self._originals[(kind, name)] = getattr(kind, name)
                    setattr(kind, name, self._timed(name, original))
        return self

    def _timed(self, name: str, original):
        clock = self

        def timed(source, *args, **kwargs):
            start = time.perf_counter()
            try:
                return original(source, *args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                clock.by_read[name] = round(clock.by_read.get(name, 0.0) + elapsed, 3)

        return timed

    def __exit__(self, *exc) -> None:
        for (kind, name), original in self._originals.items():
            setattr(kind, name, original)


def report_build(db: Path, window) -> dict:
    """Seconds to build the HTML report for ``window`` (cold source, then a second build)."""
    from analytics.types import Filters
    from dashboard.datasource import DuckDBFileSource
    from dashboard.report import build_report

    timings, detector, calls, by_detector = [], [], {}, {}
    size = 0
    for _ in range(2):
        source = DuckDBFileSource(db)
        with DetectorClock() as clock:
            start = time.perf_counter()
            html = build_report(source, window, Filters(), None, "html")
            timings.append(time.perf_counter() - start)
        detector.append(clock.seconds)
        if not by_detector:
            calls, by_detector = clock.calls, clock.by_detector
        size = len(html)
        source.close()
    return {
        "first_s": round(timings[0], 3),
        "second_s": round(timings[1], 3),
        "detector_s": round(detector[0], 3),
        "other_s": round(timings[0] - detector[0], 3),
        "detector_calls": calls,
        "detector_seconds": by_detector,
        "html_bytes": size,
        "load_average": os.getloadavg(),
    }


# Every page of the app (dashboard/app.py's navigation), by its script name under dashboard/views/.
PAGES = (
    "overview",
    "split_brain",
    "rejections",
    "constraints",
    "goal_drift",
    "context_drift",
    "loops",
    "findings",
    "alerts",
    "run_explorer",
    "calibration",
)


def page_render(
    db: Path, window=None, timeout: float = 600.0, page: str = "overview", query: dict | None = None
) -> dict:
    """Seconds for one page to render with AppTest, opened directly (its address pasted in a fresh
    browser tab: no other page ran in this process before).

    The first run is cold (Streamlit's caches empty, detectors run); the second reruns the
    script with warm caches, as a user's next interaction would. ``query``: the page's query
    parameters (the run explorer's ``run``). The page uses its default window (all time), which
    covers every span of the benchmark databases; ``window`` is not used. ``cpu_s`` is this
    process's CPU time during the first run (every thread: the script runs in one of Streamlit's).
    """
    from streamlit.testing.v1 import AppTest

    from dashboard import app_main
    from dashboard.launch import SOURCE_ENV

    if page not in PAGES:
        raise ValueError(f"page must be one of {', '.join(PAGES)}, got {page!r}")
    previous = os.environ.get(SOURCE_ENV)
    os.environ[SOURCE_ENV] = str(db)
    try:
        at = AppTest.from_file(app_main, default_timeout=timeout)
        # Before the first run AppTest names a page by its file name, which is each page's url_path.
        at.switch_page(f"views/{page}.py")
        for key, value in (query or {}).items():
            at.query_params[key] = value
        with DetectorClock() as clock, ReadClock() as reads:
            start, start_cpu = time.perf_counter(), time.process_time()
            at.run()
            cold, cold_cpu = time.perf_counter() - start, time.process_time() - start_cpu
            detector, calls, by_detector = clock.seconds, dict(clock.calls), dict(clock.by_detector)
            read_seconds = dict(reads.by_read)
            # a detector that failed is a warning on the page, not an exception: both are errors here
            errors = [str(e.value) for e in at.exception] + [str(w.value) for w in at.warning]
            load = os.getloadavg()
            start = time.perf_counter()
            at.run()
            warm = time.perf_counter() - start
        title = at.title[0].value if len(at.title) else None
        tiles = len(at.metric)
        tables = [len(df.value) for df in at.dataframe]
        charts = len(at.get("plotly_chart"))
    finally:
        if previous is None:
            os.environ.pop(SOURCE_ENV, None)
        else:
            os.environ[SOURCE_ENV] = previous
    return {
        "page": page,
        "query": query or {},
        "cold_s": round(cold, 3),
        "cpu_s": round(cold_cpu, 3),
        "warm_s": round(warm, 3),
        "detector_s": round(detector, 3),
        "other_s": round(cold - detector, 3),
        "detector_calls": calls,
        "detector_seconds": by_detector,
        "read_seconds": read_seconds,
        "load_average": load,
        "title": title,
        "tiles": tiles,
        "table_rows": tables,
        "charts": charts,
        "errors": errors,
    }


def overview_render(db: Path, window=None, timeout: float = 600.0) -> dict:
    """Seconds for the Overview page (the app's default page) to render with AppTest
    (``page_render`` of ``overview``)."""
    return page_render(db, window, timeout, "overview")


_FILLED: set[str] = set()


def fill_embedding_cache(db: Path) -> float:
    """Run ``goal_divergence`` once on a read-write connection (fills its caches); seconds taken."""
    import duckdb

    import analytics  # noqa: F401 - registers every detector
    from analytics.registry import run_metric

    start = time.perf_counter()
    with duckdb.connect(str(db)) as conn:
        run_metric(conn, "goal_divergence")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - start


def in_subprocess(
    function: str, db: Path | str, window, timeout: float, warm_cache: bool = True, **kwargs
) -> dict:
    """Run ``report_build``, ``overview_render`` or ``page_render`` in a fresh Python process,
    killed at ``timeout``; ``kwargs`` (JSON values) go to the function (``page``, ``query``).
    ``db``: a database file, or (pages) the URL of a running serve, read through its API.

    A fresh process also means cold imports and caches, as a user opening the dashboard has. With
    ``warm_cache`` the embedding cache is filled first (``fill_embedding_cache``, not timed).
    """
    import json
    import subprocess
    import sys

    filled = None
    if warm_cache and str(db) not in _FILLED:
        filled = fill_embedding_cache(db)
        _FILLED.add(str(db))

    since = window.since.isoformat() if window.since else None
    until = window.until.isoformat() if window.until else None
    code = (
        "import json, sys\n"
        "from datetime import datetime\n"
        "from analytics.types import Window\n"
        f"from benchmarks.dashboard import {function}\n"
        f"w = Window(*(datetime.fromisoformat(v) if v else None for v in ({since!r}, {until!r})))\n"
        f"kwargs = json.loads({json.dumps(kwargs)!r})\n"
        f"source = {str(db)!r}\n"  # a database file, or a serve's URL (the HTTP source)
        "source = source if '://' in source else __import__('pathlib').Path(source)\n"
        f"result = {function}(source, w, **kwargs)\n"
        "print('RESULT ' + json.dumps(result))\n"
    )
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(repo)}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"timed_out_after_s": timeout}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"error": done.stderr[-2000:], "returncode": done.returncode}
    result = json.loads(lines[-1][len("RESULT ") :])
    result["process_s"] = round(time.perf_counter() - start, 3)
    if filled is not None:
        result["embedding_cache_fill_s"] = round(filled, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.dashboard DB --out r.json [--pages ...] [--run RUN]``: every page
    (or those named) rendered once each in a fresh process, one after the other; the JSON file is
    rewritten after every page."""
    import argparse
    import json

    from analytics.types import Window

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dashboard", description=main.__doc__.split(":")[0]
    )
    parser.add_argument("db", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pages", nargs="*", default=list(PAGES), choices=PAGES)
    parser.add_argument("--run", help="also open the run explorer at this run (?run=)")
    parser.add_argument("--repeat", type=int, default=1, help="renders of each page (fresh processes)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a page's process may take")
    parser.add_argument("--label", default="", help="stored in the results (which code was measured)")
    parser.add_argument(
        "--fill-embeddings",
        action="store_true",
        help="fill the goal-text embedding cache first (a database without stored results)",
    )
    args = parser.parse_args(argv)

    jobs = [(page, None) for page in args.pages]
    if args.run:
        jobs.append(("run_explorer", {"run": args.run}))
    out: dict = {"db": str(args.db), "label": args.label, "pages": []}
    for _ in range(args.repeat):
        for page, query in jobs:
            kwargs = {"page": page, **({"query": query} if query else {})}
            result = in_subprocess(
                "page_render", args.db, Window(), args.timeout, warm_cache=args.fill_embeddings, **kwargs
            )
            result.setdefault("page", page)
            out["pages"].append(result)
            logger.info("%s %s", page, {k: result.get(k) for k in ("cold_s", "cpu_s", "detector_s")})
            args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    raise SystemExit(main())
