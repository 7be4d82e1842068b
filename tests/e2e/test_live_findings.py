"""Live findings end to end: the real `driftscope serve`, fed by the demo's crews through the real
OpenTelemetry exporters, killed with SIGKILL while its materializer works; restarted, it resumes
from the change log and every findings table equals a full recomputation. A restarted serve
answers every detector from its tables at once."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import duckdb
import httpx
import pandas as pd
import pytest

from analytics import compare_kept, materialize, read, run_metric, summary
from analytics.registry import compute_metric
from tests.analytics.test_materialize import _canonical
from tests.serve_helpers import wait_until

ARROW = "application/vnd.apache.arrow.stream"


def _demo(url: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "driftscope", "demo", "--endpoint", url, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _caught_up(server) -> bool:
    findings = server.health().get("findings", {})
    return findings.get("behind_changes") == 0 and findings.get("lag_seconds") == 0.0


def _assert_tables_equal_full(path) -> None:
    with duckdb.connect(str(path), read_only=True) as conn:
        states = materialize.read_states(conn)
        fulls = {}  # run_summary's reference counts these findings
        for name in materialize.maintained():
            assert states[name].seq is not None and not states[name].failed_keys, name
            if name in compare_kept.TABLES:  # the comparison's per-run tables: not detectors
                full = compare_kept.per_run_rows(conn, name)
                got = conn.sql(f"SELECT * EXCLUDE (_pos) FROM findings__{name}").df()[list(full.columns)]
                pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=name)
                continue
            if name in materialize.PARTS or name == "run_summary":
                continue  # run_summary: held below
            got = run_metric(conn, name)
            assert got.attrs.get("source") == "table", name
            full = fulls[name] = compute_metric(conn, name)
            pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=name)
        tabled = run_metric(conn, "run_summary")
        assert tabled.attrs.get("source") == "table"
        full = summary.run_summary_of(conn, fulls)
        pd.testing.assert_frame_equal(_canonical(tabled), _canonical(full), obj="run_summary")
        assert (full["verdict"] == "failing").any()  # the demo's failures are in the tables


@pytest.mark.slow
def test_sigkill_during_materialization_loses_nothing_and_resumes_from_the_log(serve_factory):
    rng = random.Random(20261205)
    server = serve_factory().start()
    kills_while_behind = 0
    for _ in range(4):
        # a crew's spans, every export acknowledged; then SIGKILL while the materializer brings
        # them in (or, if it was quicker, right after)
        demo = _demo(server.http_url)
        assert demo.wait(180) == 0, demo.stderr.read().decode()[-2000:]
        time.sleep(rng.uniform(0.0, 0.4))
        kills_while_behind += server.health()["findings"]["behind_changes"] != 0
        server.kill()
        server.start()
    wait_until(lambda: _caught_up(server), "the findings tables to catch up", 180)
    assert kills_while_behind >= 2, "the kills did not land while the materializer had work"
    assert server.stop() == 0
    _assert_tables_equal_full(server.db)


@pytest.mark.slow
def test_a_restarted_serve_answers_every_detector_from_its_tables(serve_factory):
    server = serve_factory().start()
    demo = _demo(server.http_url)
    assert demo.wait(180) == 0
    wait_until(lambda: _caught_up(server), "the findings tables to catch up", 180)
    # where the passes' time went: every result built, its computation and writes timed
    spent = server.health()["findings"]["seconds_by_result"]
    assert set(spent) == set(materialize.maintained()), set(materialize.maintained()) ^ set(spent)
    # (a write is queued and run by the writer: a small one rounds to 0.00 s)
    assert all(s["compute"] >= 0 and s["write"] >= 0 for s in spent.values()), spent
    assert sum(s["write"] for s in spent.values()) > 0, spent
    health = server.health()
    assert 0 <= health["findings"]["write_wait_seconds"] <= health["findings"]["pass_seconds_total"]
    assert health["findings"]["pass_seconds_total"] >= max(s["compute"] for s in spent.values())
    # what DuckDB's buffer manager holds, by tag (the rest of serve's memory is Python's)
    assert "working_on" in health["findings"]  # the result a pass is on (None between passes)
    held = health["duckdb_memory"]
    assert held["total_bytes"] == sum(held["by_tag"].values()) > 0, held
    assert server.stop() == 0
    server.start()
    with httpx.Client(timeout=60) as client:
        for name in read.metric_names():
            response = client.get(f"{server.http_url}/api/v1/metrics/{name}", headers={"Accept": ARROW})
            assert response.status_code == 200, name
            # the first answer of the new process is a SELECT over what the last one left
            assert response.headers["X-Driftscope-Source"] == "table", name
            assert float(response.headers["X-Driftscope-Findings-Lag"]) == 0.0, name
        body = client.get(f"{server.http_url}/api/v1/metrics/lost_updates").json()
        assert body["source"] == "table" and body["findings_as_of"] and body["rows"]
