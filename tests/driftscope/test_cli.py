import re
import subprocess
import sys
from pathlib import Path

import pytest

from driftscope.settings import SETTINGS, ConfigError, parse_port, parse_size, resolve, settings_markdown

README = Path(__file__).resolve().parents[2] / "README.md"


def _cli(*args, env=None, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "driftscope", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_every_setting_is_documented_in_the_readme():
    text = README.read_text()
    table = re.search(r"<!-- settings-table.*?-->\n(.*?)<!-- end settings-table -->", text, re.S).group(1)
    assert table.strip() == settings_markdown().strip(), (
        "README settings table is stale: run `driftscope settings`"
    )
    for setting in SETTINGS:
        assert setting.env in table and setting.flag in table


def test_every_setting_appears_in_its_commands_help():
    commands = sorted({command for setting in SETTINGS for command in setting.commands})
    help_texts = {command: _cli(command, "--help").stdout for command in commands}  # one process each
    for setting in SETTINGS:
        for command in setting.commands:
            help_text = help_texts[command]
            assert setting.flag in help_text and setting.env in help_text, (command, setting.name)


def test_precedence_flag_over_env_over_otel_over_default():
    endpoint = next(s for s in SETTINGS if s.name == "endpoint")
    env = {"DRIFTSCOPE_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:2"}
    assert resolve(endpoint, "http://127.0.0.1:3", env) == "http://127.0.0.1:3"
    assert resolve(endpoint, None, env) == "http://127.0.0.1:1"
    assert (
        resolve(endpoint, None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:2"}) == "http://127.0.0.1:2"
    )
    assert resolve(endpoint, None, {}) is None


def test_setting_errors_say_what_was_wrong():
    with pytest.raises(
        ConfigError, match=r"Expected --http-port to be an integer between 1 and 65535.*'abc'"
    ):
        parse_port("--http-port", "abc")
    with pytest.raises(ConfigError, match="64MiB"):
        parse_size("--max-body-bytes", "lots")
    assert parse_size("x", "64MiB") == 64 * 1024**2


def test_bad_flag_is_a_clean_message_not_a_traceback(tmp_path):
    result = _cli("serve", "--http-port", "abc", "--db", str(tmp_path / "x.duckdb"))
    assert result.returncode == 2
    assert "Expected --http-port to be an integer" in result.stderr and "Traceback" not in result.stderr


def test_env_variable_is_validated_too(tmp_path):
    import os

    env = {**os.environ, "DRIFTSCOPE_GRPC_PORT": "99999"}
    result = _cli("serve", "--db", str(tmp_path / "x.duckdb"), env=env)
    assert result.returncode == 2 and "Expected DRIFTSCOPE_GRPC_PORT" in result.stderr


def test_non_loopback_bind_without_token_refuses_to_start(tmp_path):
    result = _cli("serve", "--host", "0.0.0.0", "--db", str(tmp_path / "x.duckdb"))
    assert result.returncode == 2
    assert "Refusing to bind 0.0.0.0 without a token" in result.stderr and "--insecure" in result.stderr
    assert not (tmp_path / "x.duckdb").exists()


def _sample_file(tmp_path) -> Path:
    from tests.otlp_builders import spec_example_bytes

    path = tmp_path / "one.json"
    path.write_bytes(spec_example_bytes())
    return path


def test_ingest_loads_json_and_json_lines_into_a_database(tmp_path):
    import json

    import duckdb

    from tests.otlp_builders import SPEC_EXAMPLE_JSON

    single = _sample_file(tmp_path)
    lines = tmp_path / "export.jsonl"
    docs = []
    for index in range(3):
        doc = json.loads(json.dumps(SPEC_EXAMPLE_JSON))
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = f"{index + 1:016x}"
        docs.append(json.dumps(doc))
    lines.write_text("\n".join(docs) + "\n")
    db = tmp_path / "db.duckdb"
    result = _cli("ingest", str(single), str(lines), "--db", str(db))
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(db), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 4


def test_ingest_into_a_file_held_by_serve_gives_a_clear_message(serve, tmp_path):
    result = _cli("ingest", str(_sample_file(tmp_path)), "--db", str(serve.db))
    assert result.returncode == 2
    assert "held by another process" in result.stderr and "Traceback" not in result.stderr


def test_ingest_through_a_running_collector(serve, tmp_path):
    result = _cli("ingest", str(_sample_file(tmp_path)), "--endpoint", serve.http_url)
    assert result.returncode == 0, result.stderr
    assert serve.health()["spans"] == 1


def test_ingest_of_a_missing_file_says_so(tmp_path):
    result = _cli("ingest", str(tmp_path / "nope.json"), "--db", str(tmp_path / "d.duckdb"))
    assert result.returncode == 2 and "No such file" in result.stderr


@pytest.mark.slow
def test_up_starts_collector_and_dashboard_and_stops_on_sigterm(tmp_path):
    import os
    import signal
    import time

    import httpx

    from tests.serve_helpers import free_port

    http_port, grpc_port, dash_port = free_port(), free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "driftscope", "up", "--db", str(tmp_path / "up.duckdb"),
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--dashboard-port", str(dash_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "DRIFTSCOPE_EMBEDDINGS": "false"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        ready = set()
        while time.monotonic() < deadline and len(ready) < 2:
            assert process.poll() is None, process.stdout.read().decode()
            for name, url in (
                ("collector", f"http://127.0.0.1:{http_port}/api/v1/health"),
                ("dashboard", f"http://127.0.0.1:{dash_port}/_stcore/health"),
            ):
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        ready.add(name)
                except httpx.HTTPError:
                    pass
            time.sleep(0.3)
        assert ready == {"collector", "dashboard"}
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=90)[0].decode()
    assert process.returncode == 0, output
    assert "driftscope serve stopped" in output


@pytest.mark.slow
def test_calibrate_then_report_from_the_command_line(tmp_path):
    import glob
    import json

    db = tmp_path / "crew.duckdb"
    traces = sorted(glob.glob(str(README.parent / "sample_traces" / "*_unguarded.json")))
    assert _cli("ingest", *traces, "--db", str(db)).returncode == 0
    pairs = README.parent / "sample_traces" / "calibration" / "goal_pairs.csv"
    result = _cli("calibrate", "--db", str(db), "--pairs", str(pairs), timeout=300)
    assert result.returncode == 0, result.stderr
    calibrated = json.loads(result.stdout)["pairs"]
    assert calibrated["auroc"] >= 0.85 and 0 < calibrated["value"] < 1 and calibrated["version"] == 1
    for fmt in ("md", "json"):
        out = tmp_path / f"report.{fmt}"
        result = _cli("report", "--source", str(db), "--format", fmt, "-o", str(out), timeout=300)
        assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "report.json").read_text())
    assert document["findings"], "the unguarded crews must produce findings"
    assert str(round(calibrated["value"], 3))[:4] in (tmp_path / "report.md").read_text()


def test_calibrate_and_report_refuse_bad_input_clearly(tmp_path):
    assert "--pairs" in _cli("calibrate", "--db", str(tmp_path / "x.duckdb")).stderr
    missing = _cli("calibrate", "--db", str(tmp_path / "x.duckdb"), "--pairs", str(tmp_path / "none.csv"))
    assert missing.returncode == 2 and "No such file" in missing.stderr
    bad = _cli("report", "--source", str(tmp_path / "nope.duckdb"), "-o", str(tmp_path / "r.html"))
    assert bad.returncode == 2 and "neither an http(s) URL" in bad.stderr
    since = _cli(
        "report", "--source", "http://127.0.0.1:9", "--since", "yesterday", "-o", str(tmp_path / "r.html")
    )
    assert since.returncode == 2 and "Expected --since" in since.stderr


def test_report_against_a_collector_that_is_down_says_so(tmp_path):
    from tests.serve_helpers import free_port

    result = _cli("report", "--source", f"http://127.0.0.1:{free_port()}", "-o", str(tmp_path / "r.html"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "driftscope serve" in result.stderr


def test_up_names_a_command_a_newcomer_can_run(tmp_path, monkeypatch):
    """Issue 34: `make up` does not put `driftscope` on PATH, yet `up` said "From another shell:
    driftscope demo ... | driftscope report ..." (and the `|` read as a pipe)."""
    from driftscope.cli import runnable_command

    script = tmp_path / ".venv" / "bin" / "driftscope"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the venv is not activated
    assert runnable_command(str(script)) == ".venv/bin/driftscope"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")  # activated
    assert runnable_command(str(script)) == "driftscope"
    assert runnable_command("/some/where/cli.py").endswith(" -m driftscope")
