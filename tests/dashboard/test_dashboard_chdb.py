"""`driftscope dashboard --source chdb:PATH`: the composition's entry script (driftscope/dashboard_app.py)
hands the dashboard a store opener, and the pages read a chdb store written in the exporter's
`otel_traces` layout, through Streamlit's AppTest.

The quick tests render pages that run a few detectors; the Overview (every detector and
run_summary on chdb, ~8 s here) is marked slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")
pytest.importorskip("sqlglot", reason="sqlglot is in the clickhouse extra")

from streamlit.testing.v1 import AppTest  # noqa: E402

from collector.clickhouse_resolve import resolve_spans  # noqa: E402
from collector.clickhouse_store import ChdbStore, init_clickhouse, insert_otel_traces  # noqa: E402
from collector.decode import JSON, decode_payload  # noqa: E402
from collector.files import iter_file_requests  # noqa: E402
from dashboard import datasource  # noqa: E402
from dashboard.launch import SOURCE_ENV  # noqa: E402
from driftscope.commands import DASHBOARD_APP  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SAMPLES = [REPO / "sample_traces" / f"{name}.json" for name in ("split_brain_unguarded", "healthy_guarded")]
SPLIT_BRAIN_RUN = "run-split_brain-unguarded-5712e27d"


def write_chdb_store(path: Path, samples: list[Path]) -> int:
    """A chdb store at ``path`` holding ``samples`` as the clickhouse exporter writes them
    (otel_traces -> spans_mv -> spans, then a resolve pass); the store is closed again.
    Returns the spans written."""
    store = ChdbStore(str(path))
    try:
        init_clickhouse(store)
        written = 0
        for sample in samples:
            for _, payload in iter_file_requests(sample):
                batch = decode_payload(payload, JSON)
                written += insert_otel_traces(store, batch.table)
        resolve_spans(store, settle_seconds=0)
    finally:
        store.close()
    return written


@pytest.fixture(scope="module")
def chdb_source(tmp_path_factory):
    """``chdb:PATH`` of a small store; the dashboard's store (cached by Streamlit for the process)
    is closed afterwards, since chdb keeps one data path per process."""
    path = tmp_path_factory.mktemp("dash-chdb") / "ch"
    spans = write_chdb_store(path, SAMPLES)
    yield f"chdb:{path}", spans
    import streamlit as st

    from dashboard import ui

    try:
        ui.get_source(f"chdb:{path}").close()
    finally:
        st.cache_resource.clear()
        st.cache_data.clear()
        datasource.set_store_opener(None)


def _page(monkeypatch, source: str, page: str) -> AppTest:
    monkeypatch.setenv(SOURCE_ENV, source)
    at = AppTest.from_file(DASHBOARD_APP, default_timeout=300)
    # The first run goes straight to the page (the Overview runs every detector).
    at.switch_page(str(REPO / "dashboard" / "views" / f"{page}.py"))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_split_brain_page_reads_a_chdb_store(monkeypatch, chdb_source):
    source, spans = chdb_source
    at = _page(monkeypatch, source, "split_brain")
    assert at.title[0].value == "Split-brain: shared state"
    assert f"Source: ClickHouse store {source}" in [c.value for c in at.sidebar.caption]
    assert not at.error, [e.value for e in at.error]
    lost = at.dataframe[1].value
    assert set(lost["run_id"]) == {SPLIT_BRAIN_RUN} and len(lost) == 2
    assert set(lost["state_key"]) == {"report/q3/draft", "report/q3/status"}
    assert "Run" in [s.label for s in at.selectbox]  # the version timeline read the run's spans
    assert spans > 20


def test_calibration_page_lists_thresholds_from_a_chdb_store(monkeypatch, chdb_source):
    at = _page(monkeypatch, chdb_source[0], "calibration")
    assert not at.error, [e.value for e in at.error]
    names = set(at.dataframe[0].value["name"])
    assert "goal_divergence" in names


def test_the_plain_streamlit_script_says_how_to_open_a_store(monkeypatch, chdb_source):
    datasource.set_store_opener(None)
    try:
        with pytest.raises(datasource.SourceUnavailable, match="driftscope dashboard --source chdb:"):
            datasource.open_source(chdb_source[0])
    finally:
        datasource.set_store_opener(None)


def test_a_chdb_path_another_process_holds_is_a_banner_not_a_traceback(chdb_source):
    """chdb locks its data path per process (the `status` file): a dashboard on the path of a
    running `serve --store chdb:PATH` (here: this test process) says what to read instead."""
    import streamlit as st

    from dashboard import ui
    from driftscope.clickhouse_command import open_for_reading

    source = chdb_source[0]
    # as `driftscope dashboard` sets it (not left to an earlier test's app run: the test before
    # this one clears it)
    datasource.set_store_opener(open_for_reading)
    assert ui.get_source(source).health().ok  # this process holds the path now
    code = (
        "from functools import partial\n"
        "from collector.clickhouse_store import open_store_url\n"
        "from dashboard import datasource\n"
        "datasource.set_store_opener(partial(open_store_url, read_only=True))\n"
        f"print(datasource.open_source({source!r}).health().detail)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert (
        f"Cannot open the ClickHouse store {source} ({source} is open in another process (process "
        in run.stdout
    )
    assert f"process {os.getpid()}: " in run.stdout  # this test process holds it
    assert "read the store through the serve that holds it (`--source http://HOST:PORT`" in run.stdout
    assert run.stdout.count("one process") == 1  # said once
    st.cache_data.clear()


def test_dashboard_command_checks_a_store_url_before_starting_streamlit():
    run = subprocess.run(
        [sys.executable, "-m", "driftscope", "dashboard", "--source", "clickhouse://:8123/otel"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert run.returncode == 2
    assert "Expected a host in 'clickhouse://:8123/otel'" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow  # every detector on chdb (seconds of CPU each for the staged statements)
def test_overview_on_a_chdb_store_counts_the_split_brain_findings(monkeypatch, chdb_source):
    monkeypatch.setenv(SOURCE_ENV, chdb_source[0])
    at = AppTest.from_file(DASHBOARD_APP, default_timeout=600)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.warning, [w.value for w in at.warning]  # no detector failed
    tiles = {m.label: int(m.value) for m in at.metric}
    assert tiles["lost updates (split-brain)"] == 2
    incidents = at.dataframe[0].value
    assert list(incidents["run_id"]) == [SPLIT_BRAIN_RUN]
    assert incidents["verdict"][0] == "failing"


def test_run_comparison_on_a_clickhouse_store_says_it_needs_a_duckdb_copy(chdb_source):
    from analytics.compare import UnsupportedStoreError
    from analytics.read import compare_run
    from dashboard import ui

    # the module's store, as the dashboard opened it: chdb runs one data path per process
    store = ui.get_source(chdb_source[0])._connection()
    with pytest.raises(UnsupportedStoreError, match="DuckDB copy"):
        compare_run(store, SPLIT_BRAIN_RUN)
