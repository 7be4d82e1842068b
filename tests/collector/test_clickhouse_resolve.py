"""Reading a ClickHouse store that only the OpenTelemetry Collector's exporter has written:
`driftscope report --source chdb:PATH` creates driftscope's objects and resolves before reading
(collector.clickhouse_resolve.open_for_reading), as issue 17 asks. Each test runs the CLI in a
child process: chdb keeps one data path per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")

REPO = Path(__file__).resolve().parents[2]

# Writes otel_traces exactly as otelcol-contrib's clickhouse exporter creates it, and nothing of
# driftscope's: a split-brain pair (two agents read v1, both write v2 unversioned) ten minutes ago.
_EXPORTER_ONLY = """
import sys, time
from collector import clickhouse_schema as schema
from collector.clickhouse_store import ChdbStore, insert_otel_traces
from collector.decode import PROTOBUF, decode_payload
from tests.otlp_builders import make_request

store = ChdbStore(sys.argv[1])
store.command("CREATE DATABASE IF NOT EXISTS otel")
for statement in schema.otel_traces_ddl():
    store.command(statement)
start = time.time_ns() - 600 * 10**9
spans = []
for i, (op, agent, version) in enumerate([("read", "a", "v1"), ("read", "b", "v1"),
                                          ("write", "a", "v2"), ("write", "b", "v2")]):
    at = start + i * 10**9
    spans.append({"name": op, "trace_id": bytes([i + 1]) * 16, "start": at, "end": at + 1000,
                  "status": 0, "attrs": {"gen_ai.conversation.id": "run-x", "driftscope.op": op,
                                         "gen_ai.agent.id": agent, "driftscope.state.key": "k",
                                         "driftscope.state.version": version}})
batch = decode_payload(make_request(spans).SerializeToString(), PROTOBUF)
insert_otel_traces(store, batch.table)
tables = store.execute("SELECT name FROM system.tables WHERE database = 'otel'").column("name").to_pylist()
store.close()
print(",".join(sorted(tables)))
"""


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.mark.slow  # two child processes (chdb start, the report): ~15 s
def test_report_reads_a_chdb_path_only_the_exporter_wrote(tmp_path):
    path = tmp_path / "ch"
    written = _run("-c", _EXPORTER_ONLY, str(path))
    assert written.returncode == 0, written.stderr
    assert written.stdout.split()[-1] == "otel_traces,otel_traces_trace_id_ts,otel_traces_trace_id_ts_mv"
    out = tmp_path / "out.json"
    report = _run("-m", "driftscope", "report", "--source", f"chdb:{path}", "--since", "2h",
                  "--format", "json", "-o", str(out))  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert "had no driftscope objects: created" in report.stderr
    document = json.loads(out.read_text())
    assert not document["errors"], document["errors"]
    assert document["summary"]["runs"] == 1
    found = {row["metric"]: row["findings"] for row in document["summary"]["by_failure_mode"]}
    assert found.get("divergent_reads", 0) >= 1 and found.get("lost_updates", 0) >= 1, found


_STATUS = """
import json, sys
from collector.clickhouse_resolve import resolve_status
from collector.clickhouse_store import ChdbStore
store = ChdbStore(sys.argv[1])
status = resolve_status(store)
store.close()
print(json.dumps(status))
"""


@pytest.mark.slow  # three child processes: ~20 s
def test_resolve_follow_resolves_beside_the_exporter_and_says_how_far_behind(tmp_path):
    path = tmp_path / "ch"
    assert _run("-c", _EXPORTER_ONLY, str(path)).returncode == 0
    init = _run("-m", "driftscope", "clickhouse", "init", "--store", f"chdb:{path}")
    assert init.returncode == 0, init.stderr
    before = json.loads(_run("-c", _STATUS, str(path)).stdout)
    # init copied the exporter's four spans into `spans`; no pass has run: all four are behind
    assert before["resolved_to"] is None and before["unresolved_spans"] == 4 and before["lag_seconds"] >= 0
    log = tmp_path / "follow.log"
    with log.open("w") as out:
        follower = subprocess.Popen(
            [sys.executable, "-m", "driftscope", "clickhouse", "resolve", "--follow", "--interval", "0.5",
             "--store", f"chdb:{path}"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        try:
            import time

            deadline = time.monotonic() + 120
            # rows younger than 2 s wait for a later pass (an exporter's insert may be in flight);
            # each pass is followed by one of the findings tables' materializer
            caught_up = "0 span(s) behind, lag 0.0 s; findings tables 0 change(s) behind, lag 0.0 s"
            while caught_up not in log.read_text() and time.monotonic() < deadline:
                assert follower.poll() is None, log.read_text()
                time.sleep(0.2)
            assert caught_up in log.read_text(), log.read_text()
        finally:
            follower.send_signal(__import__("signal").SIGTERM)
            assert follower.wait(60) == 0, log.read_text()
    assert "stopped resolving otel" in log.read_text()
    after = json.loads(_run("-c", _STATUS, str(path)).stdout)
    assert after["unresolved_spans"] == 0 and after["lag_seconds"] == 0.0 and after["resolved_to"] is not None


# Opens a chdb path and holds it until its stdin closes (a serve, dashboard or report on it).
_HOLDER = """
import sys
from collector.clickhouse_store import ChdbStore

store = ChdbStore(sys.argv[1])
print("open", flush=True)
sys.stdin.read()
store.close()
"""


def test_a_chdb_path_another_process_holds_gets_a_clear_error_naming_it(tmp_path):
    """chdb takes a data path for one process; a second one got the embedded server's
    "Error initializing EmbeddedServer: . (BAD_ARGUMENTS)" as a traceback. It now says which
    process holds the path and what to do, and exits 2 as other bad input does."""
    path = tmp_path / "ch"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        for args in (
            ("report", "--source", f"chdb:{path}", "--out", str(tmp_path / "r.html")),
            ("clickhouse", "resolve", "--store", f"chdb:{path}"),
        ):
            done = _run("-m", "driftscope", *args, timeout=120)
            assert done.returncode == 2, done.stderr
            message = done.stderr.strip().splitlines()[-1]
            assert f"chdb:{path} is open in another process (process {holder.pid}: " in message
            assert "Traceback" not in done.stderr and "clickhouse://HOST:8123/DB" in message
    finally:
        holder.stdin.close()
        holder.wait(30)
    # once the holder is gone the path opens again
    done = _run("-m", "driftscope", "clickhouse", "resolve", "--store", f"chdb:{path}", timeout=120)
    assert "open in another process" not in done.stderr
