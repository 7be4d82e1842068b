"""Commands that fail loudly (issue 16 §5): each wrong input gets a message naming what was wrong and
what to do, and a non-zero exit code; never a traceback. Every case runs the real `driftscope`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import httpx
import pytest

from tests.driftscope.test_cli import README, _cli, _sample_file

SAMPLES = README.parent / "sample_traces"


def _no_traceback(result) -> None:
    assert "Traceback" not in result.stderr and "Error:" not in result.stderr.replace("error:", ""), (
        result.stderr
    )


def test_ingest_of_a_json_file_that_is_not_otlp_names_it_and_fails(tmp_path):
    hello = tmp_path / "hello.json"
    hello.write_text('{"hello": 1}')
    result = _cli("ingest", str(hello), "--db", str(tmp_path / "d.duckdb"))
    assert result.returncode == 1
    assert (
        f'{hello}: no span ingested: the file has no "resourceSpans" (its top-level keys: hello)'
        in result.stderr
    )
    assert "0 span(s) accepted" in result.stderr
    _no_traceback(result)


def test_ingest_of_a_ground_truth_file_beside_the_traces_names_it(tmp_path):
    truth = SAMPLES / "split_brain_unguarded.truth.json"
    traces = SAMPLES / "split_brain_unguarded.json"
    db = tmp_path / "d.duckdb"
    result = _cli("ingest", str(traces), str(truth), "--db", str(db))
    assert result.returncode == 1  # the traces were stored, but one file held no span
    assert f"{truth}: no span ingested" in result.stderr and str(traces) + ":" not in result.stderr
    with duckdb.connect(str(db), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] > 0


def test_ingest_of_text_that_is_not_json_says_so(tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text("hello\nworld\n")
    result = _cli("ingest", str(notes), "--db", str(tmp_path / "d.duckdb"))
    assert result.returncode == 1 and f"{notes}: no span ingested: the file is not JSON" in result.stderr


def test_ingest_through_a_collector_prints_the_span_count(serve, tmp_path):
    result = _cli("ingest", str(_sample_file(tmp_path)), "--endpoint", serve.http_url)
    assert result.returncode == 0, result.stderr
    assert f"1 span(s) accepted by {serve.http_url}/v1/traces, 0 rejected" in result.stderr
    hello = tmp_path / "hello.json"
    hello.write_text('{"hello": 1}')
    result = _cli("ingest", str(hello), "--endpoint", serve.http_url)
    assert result.returncode == 1 and f"{hello}: no span ingested" in result.stderr
    assert "0 span(s) accepted" in result.stderr


def test_db_under_a_file_is_a_clean_message(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    for command in (["ingest", str(_sample_file(tmp_path))], ["serve"]):
        result = _cli(*command, "--db", str(blocker / "d.duckdb"))
        assert result.returncode == 2, result.stderr
        assert f"--db {blocker}/d.duckdb: {blocker} is a file, not a folder" in result.stderr
        assert "DRIFTSCOPE_DB" in result.stderr
        _no_traceback(result)


def test_db_in_a_folder_that_cannot_be_created_is_a_clean_message(tmp_path):
    # /proc refuses new folders even to root (a chmod'ed folder would not stop root). serve creates
    # a missing folder (ingest refuses one: test_ingest_refuses_a_typod_folder...).
    result = _cli("serve", "--db", "/proc/driftscope-test/d.duckdb")
    assert result.returncode == 2
    assert (
        "--db /proc/driftscope-test/d.duckdb: cannot create the folder /proc/driftscope-test" in result.stderr
    )
    _no_traceback(result)
    folder = _cli("ingest", str(_sample_file(tmp_path)), "--db", str(tmp_path))
    assert folder.returncode == 2 and "is a folder, not a database file" in folder.stderr


def test_settings_into_a_closed_pipe_ends_quietly():
    process = subprocess.Popen(
        [sys.executable, "-m", "driftscope", "settings"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # the reader is gone before the command writes (as `| head -0`)
    stderr = process.stderr.read().decode()
    assert process.wait(60) == 0
    assert "BrokenPipeError" not in stderr and "Traceback" not in stderr, stderr


def test_settings_piped_into_head_in_a_shell():
    result = subprocess.run(
        f"{sys.executable} -m driftscope settings | head -n 1", shell=True, capture_output=True, text=True
    )
    assert result.stdout.startswith("| flag |") and "BrokenPipeError" not in result.stderr


def test_mistyped_flag_prints_the_subcommands_usage_and_a_close_match():
    result = _cli("serve", "--port", "4318")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: driftscope serve ")
    assert (
        "unrecognized arguments: --port 4318" in result.stderr
        and "did you mean --http-port?" in result.stderr
    )
    report = _cli("report", "--formt", "md", "-o", "x.md")
    assert report.returncode == 2 and report.stderr.startswith("usage: driftscope report ")
    assert "did you mean --format?" in report.stderr


def test_report_of_an_unknown_run_fails_and_lists_runs(tmp_path):
    db = tmp_path / "d.duckdb"
    assert _cli("ingest", str(SAMPLES / "split_brain_unguarded.json"), "--db", str(db)).returncode == 0
    out = tmp_path / "r.html"
    result = _cli("report", "--source", str(db), "--run", "does-not-exist", "-o", str(out))
    assert result.returncode == 2
    assert (
        "No spans of run 'does-not-exist'" in result.stderr and "run-split_brain-unguarded-" in result.stderr
    )
    assert not out.exists()
    _no_traceback(result)


@pytest.fixture(scope="module")
def crew_db(tmp_path_factory) -> Path:
    from tests.dashboard.test_dashboard_db import build_dashboard_db

    return build_dashboard_db(tmp_path_factory.mktemp("cal") / "crew.duckdb")


def _thresholds(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as conn:
        return conn.execute("SELECT count(*) FROM thresholds").fetchone()[0]


def test_calibrate_refuses_a_baseline_window_with_findings(crew_db, tmp_path):
    db = tmp_path / "crew.duckdb"
    db.write_bytes(crew_db.read_bytes())
    result = _cli("calibrate", "--db", str(db), "--baseline-since", "2026-01-01", timeout=300)
    assert result.returncode == 2
    assert "The baseline window (2026-01-01 to now) holds" in result.stderr
    assert (
        "lost_updates 2" in result.stderr
        and "--dry-run" in result.stderr
        and "--allow-findings" in result.stderr
    )
    assert _thresholds(db) == 0  # nothing stored
    _no_traceback(result)


@pytest.mark.slow
def test_calibrate_dry_run_shows_thresholds_and_findings_before_and_after_and_stores_nothing(
    crew_db, tmp_path
):
    db = tmp_path / "crew.duckdb"
    db.write_bytes(crew_db.read_bytes())
    result = _cli("calibrate", "--db", str(db), "--baseline-since", "2026-01-01", "--dry-run", timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dry_run"] == "nothing was stored" and _thresholds(db) == 0
    goal = next(row for row in report["changed"] if row["name"] == "goal_divergence")
    assert goal["before"] == 0.80 and goal["after"] != goal["before"]
    before, after = report["findings_all_time"]["before"], report["findings_all_time"]["after"]
    assert after["goal_divergence"] < before["goal_divergence"]  # the drift this baseline would hide
    assert report["baseline_findings"]["lost_updates"] == 2
    stored = _cli(
        "calibrate", "--db", str(db), "--baseline-since", "2026-01-01", "--allow-findings", timeout=300
    )
    assert stored.returncode == 0, stored.stderr
    assert _thresholds(db) > 0 and "the baseline window holds findings" in stored.stderr


def test_sigterm_to_dashboard_stops_its_streamlit_child(crew_db):
    from tests.serve_helpers import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "driftscope", "dashboard", "--source", str(crew_db), "--dashboard-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("the dashboard did not start")
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        with pytest.raises(httpx.HTTPError):  # nobody holds the port any more
            httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()


def _listening(port: int, reuseport: bool = False) -> socket.socket:
    holder = socket.socket()
    if reuseport:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


@pytest.mark.parametrize(("taken", "flag", "env"), [
    ("http", "--http-port", "DRIFTSCOPE_HTTP_PORT"), ("grpc", "--grpc-port", "DRIFTSCOPE_GRPC_PORT"),
])  # fmt: skip
def test_serve_refuses_a_taken_port_naming_the_flag_and_variable(tmp_path, taken, flag, env):
    from tests.serve_helpers import free_port

    ports = {"http": free_port(), "grpc": free_port()}
    with _listening(ports[taken], reuseport=True):  # as another collector's grpc server holds it
        result = _cli(
            "serve", "--db", str(tmp_path / "d.duckdb"),
            "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
        )  # fmt: skip
    assert result.returncode == 2
    assert f"Port {ports[taken]} on 127.0.0.1 ({flag}) is already in use" in result.stderr
    assert f"{flag} PORT or {env}=PORT" in result.stderr
    _no_traceback(result)


def test_up_checks_every_port_before_announcing_anything(tmp_path):
    from tests.serve_helpers import free_port

    http_port, grpc_port, dash_port = free_port(), free_port(), free_port()
    with _listening(dash_port):
        result = _cli(
            "up", "--db", str(tmp_path / "d.duckdb"), "--http-port", str(http_port),
            "--grpc-port", str(grpc_port), "--dashboard-port", str(dash_port),
        )  # fmt: skip
    assert result.returncode == 2
    assert f"Port {dash_port} on 127.0.0.1 (--dashboard-port) is already in use" in result.stderr
    assert "DRIFTSCOPE_DASHBOARD_PORT=PORT" in result.stderr and "collector on" not in result.stderr
    assert not (tmp_path / "d.duckdb").exists()  # no collector was started


def test_grpc_receiver_refuses_a_port_another_server_holds_with_so_reuseport():
    """grpc binds with SO_REUSEPORT unless told not to; two collectors would then share a port."""
    from collector.grpc_receiver import start_grpc_server
    from collector.http_receiver import ReceiverConfig
    from collector.stats import IngestStats
    from collector.writer import IngestQueue
    from tests.serve_helpers import free_port

    port = free_port()
    with _listening(port, reuseport=True), pytest.raises((OSError, RuntimeError)):
        server = start_grpc_server("127.0.0.1", port, IngestQueue(1 << 20), ReceiverConfig(), IngestStats())
        server.stop(None)


def test_up_announces_the_ports_it_really_uses_once_both_answer(tmp_path):
    from tests.serve_helpers import free_port

    http_port, grpc_port, dash_port = free_port(), free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "driftscope", "up", "--db", str(tmp_path / "up.duckdb"),
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--dashboard-port", str(dash_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "DRIFTSCOPE_EMBEDDINGS": "false"},
    )  # fmt: skip
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("write a report" in line for line in lines):
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
        announced = "".join(lines)
        url = f"http://127.0.0.1:{http_port}"
        assert f"collector on {url} (OTLP/HTTP; OTLP/gRPC on port {grpc_port})" in announced, announced
        assert f"dashboard on http://127.0.0.1:{dash_port}" in announced
        # a command this shell can run (python -m driftscope here), one per line, no "|" between
        assert f"-m driftscope demo --endpoint {url}" in announced and f"report --source {url}" in announced
        # announced only once the dashboard answers
        assert httpx.get(f"http://127.0.0.1:{dash_port}/_stcore/health", timeout=5).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=90)
    assert process.returncode == 0


def test_demo_at_a_dead_endpoint_fails_at_once_with_the_reports_message(serve_factory):
    """Issue 34: `driftscope demo` at a dead endpoint took 123 s, printed 54 exporter retry
    warnings and exited 1 with no final error line."""
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{port.getsockname()[1]}"
    port.close()
    started = time.monotonic()
    result = _cli("demo", "--endpoint", dead)
    assert result.returncode == 2 and time.monotonic() - started < 10
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"driftscope demo: Cannot reach the driftscope collector at {dead}")
    )
    assert "Transient error" not in result.stderr and "retry" not in result.stderr.lower()
    # a live collector that is not OTLP at that path is named as such; a real one is probed quietly
    server = serve_factory(token="t0ken").start()
    refused = _cli("demo", "--endpoint", server.http_url)
    assert refused.returncode == 2 and "pass its token" in refused.stderr
    from driftscope.commands import check_reachable

    check_reachable(server.http_url, "t0ken")  # an empty export request is accepted


def test_ingest_refuses_a_typod_folder_and_a_value_is_not_matched_to_a_flag(tmp_path):
    """Issue 34: `ingest --db /nonexistent/dir/x.duckdb` created the folders and exited 0;
    `report --sinse 1h` also suggested "1h: did you mean -h?"."""
    missing = tmp_path / "no" / "such" / "x.duckdb"
    result = _cli("ingest", str(_sample_file(tmp_path)), "--db", str(missing))
    assert result.returncode == 2 and "does not exist (a typo?)" in result.stderr
    assert not missing.parent.exists()
    report = _cli("report", "--sinse", "1h", "-o", str(tmp_path / "r.html"))
    assert report.returncode == 2 and "did you mean --since?" in report.stderr
    assert "1h: did you mean" not in report.stderr


def test_an_ingest_whose_spans_were_all_rejected_by_the_collector_exits_1(serve_factory, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "", "spanId": "", "name": "x", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}
        ]}]}]})
    )  # fmt: skip
    server = serve_factory().start()
    result = _cli("ingest", str(bad), "--endpoint", server.http_url)
    assert result.returncode == 1, result.stderr
    assert "0 span(s) accepted" in result.stderr and "1 rejected" in result.stderr


def test_library_request_logs_stay_quiet_unless_debug():
    import logging

    from driftscope.cli import _configure_logging

    _configure_logging("INFO")
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
    _configure_logging("DEBUG")
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.DEBUG
    _configure_logging("INFO")
