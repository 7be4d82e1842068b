"""`driftscope calibrate` while `driftscope serve` holds the database (issue 16 §5): the CLI finds
the collector (or takes --endpoint), the collector calibrates on a read cursor and stores the
thresholds through its single writer, and the guard rails of the offline command hold there too.
Every case runs the real `driftscope serve` and the real CLI."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.driftscope.test_cli import README, _cli
from tests.serve_helpers import new_serve

PAIRS = README.parent / "sample_traces" / "calibration" / "goal_pairs.csv"


def _no_traceback(result) -> None:
    assert "Traceback" not in result.stderr, result.stderr


@pytest.fixture(scope="module")
def crew_db(tmp_path_factory) -> Path:
    from tests.dashboard.test_dashboard_db import build_dashboard_db

    return build_dashboard_db(tmp_path_factory.mktemp("cal-serve") / "crew.duckdb")


@pytest.fixture
def small_pairs(tmp_path) -> Path:
    """Twelve labelled pairs of the bundled file (six on goal, six drifted): quick to embed."""
    with PAIRS.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    chosen = [r for r in rows if r["drifted"] == "0"][:6] + [r for r in rows if r["drifted"] == "1"][:6]
    path = tmp_path / "pairs.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(chosen)
    return path


def _serve(tmp_path: Path, crew_db: Path, **kwargs):
    db = tmp_path / "live.duckdb"
    db.write_bytes(crew_db.read_bytes())
    return new_serve(tmp_path, db=db, **kwargs).start()


def _thresholds(serve) -> dict[str, dict]:
    response = httpx.get(f"{serve.http_url}/api/v1/thresholds", headers=serve.headers, timeout=30)
    response.raise_for_status()
    return {row["name"]: row for row in response.json()["rows"]}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRIFTSCOPE_", "OTEL_EXPORTER"))}
    return {**env, **extra}


@pytest.mark.slow
def test_calibrate_on_a_file_serve_holds_goes_through_that_collector(tmp_path, crew_db, small_pairs):
    serve = _serve(tmp_path, crew_db)
    try:
        writes_before = serve.health()["writer_writes"]
        result = _cli(
            "calibrate", "--db", str(serve.db), "--pairs", str(small_pairs),
            env=_env(DRIFTSCOPE_HTTP_PORT=str(serve.http_port)), timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr + serve.log()
        assert (
            f"{serve.db} is held by the running collector at {serve.http_url}: calibrating through it"
            in result.stderr
        )
        assert f"stored 1 new threshold version(s) by the collector at {serve.http_url}" in result.stderr
        report = json.loads(result.stdout)
        assert report["pairs"]["version"] == 1 and report["pairs"]["pairs"] == 12
        assert [row["name"] for row in report["changed"]] == ["goal_divergence"]
        # Stored by the collector's single writer, readable at once through its API.
        goal = _thresholds(serve)["goal_divergence"]
        assert goal["calibrated"] is True and goal["value"] == pytest.approx(report["pairs"]["value"])
        assert json.loads(goal["provenance"])["data"] == str(small_pairs)
        # (the materializer's writes go through the same writer: at least the calibration's one)
        assert serve.health()["writer_writes"] >= writes_before + 1
        # The collector still ingests after the calibration.
        ingest = _cli(
            "ingest", "--endpoint", serve.http_url,
            str(README.parent / "sample_traces" / "split_brain_unguarded.json"), env=_env(),
        )  # fmt: skip
        assert ingest.returncode == 0, ingest.stderr
    finally:
        assert serve.stop() == 0
    _no_traceback(result)


@pytest.mark.slow
def test_calibrate_through_the_collector_refuses_a_baseline_with_findings_and_dry_run_stores_nothing(
    tmp_path, crew_db
):
    serve = _serve(tmp_path, crew_db)
    try:
        before = _thresholds(serve)
        refused = _cli(
            "calibrate", "--endpoint", serve.http_url, "--baseline-since", "2026-01-01",
            env=_env(), timeout=300,
        )  # fmt: skip
        assert refused.returncode == 2
        assert "The baseline window (2026-01-01 to now) holds" in refused.stderr
        assert "lost_updates 2" in refused.stderr and "--dry-run" in refused.stderr
        assert "--allow-findings" in refused.stderr
        _no_traceback(refused)
        assert _thresholds(serve) == before

        dry = _cli(
            "calibrate", "--endpoint", serve.http_url, "--baseline-since", "2026-01-01", "--dry-run",
            env=_env(), timeout=300,
        )  # fmt: skip
        assert dry.returncode == 0, dry.stderr + serve.log()
        report = json.loads(dry.stdout)
        assert report["dry_run"] == "nothing was stored"
        assert "nothing was stored" in dry.stderr and f"by the collector at {serve.http_url}" in dry.stderr
        goal = next(row for row in report["changed"] if row["name"] == "goal_divergence")
        assert goal["before"] == 0.80 and goal["after"] != goal["before"]
        findings = report["findings_all_time"]
        assert findings["after"]["goal_divergence"] < findings["before"]["goal_divergence"]
        assert _thresholds(serve) == before  # the trial thresholds were rolled back

        stored = _cli(
            "calibrate", "--endpoint", serve.http_url, "--baseline-since", "2026-01-01", "--allow-findings",
            env=_env(), timeout=300,
        )  # fmt: skip
        assert stored.returncode == 0, stored.stderr
        after = _thresholds(serve)
        assert after["goal_divergence"]["calibrated"] is True
        assert after["goal_divergence"]["value"] == pytest.approx(goal["after"])
    finally:
        assert serve.stop() == 0


@pytest.mark.slow
def test_calibrate_through_a_collector_with_a_token_needs_that_token(tmp_path, crew_db, small_pairs):
    serve = _serve(tmp_path, crew_db, token="s3cret-calibration-token")
    try:
        args = ("calibrate", "--endpoint", serve.http_url, "--pairs", str(small_pairs))
        missing = _cli(*args, env=_env(), timeout=120)
        assert missing.returncode == 2
        assert f"The collector at {serve.http_url} requires a token: pass --token TOKEN" in missing.stderr
        _no_traceback(missing)
        assert _thresholds(serve)["goal_divergence"]["calibrated"] is False
        ok = _cli(*args, env=_env(DRIFTSCOPE_TOKEN=serve.token), timeout=300)
        assert ok.returncode == 0, ok.stderr
        assert _thresholds(serve)["goal_divergence"]["calibrated"] is True
        assert serve.token not in ok.stderr + ok.stdout
    finally:
        assert serve.stop() == 0


def test_calibrate_endpoint_refuses_bad_requests_with_a_reason(tmp_path, crew_db):
    serve = _serve(tmp_path, crew_db)
    url = f"{serve.http_url}/api/v1/calibrate"
    try:
        cases = [
            (b"not json", "the body is not valid JSON"),
            (json.dumps({"pairs": "x"}).encode(), "unknown field(s) ['pairs']"),
            (json.dumps({}).encode(), "Give --pairs FILE.csv"),
            (json.dumps({"baseline_since": "yesterday-ish"}).encode(), "--baseline-since"),
            (json.dumps({"pairs_csv": "a,b\n1,2\n", "pairs_name": "p.csv"}).encode(), "missing"),
            (
                json.dumps({"dry_run": "yes", "baseline_since": "1h"}).encode(),
                "dry_run must be true or false",
            ),
        ]
        json_type = {"Content-Type": "application/json"}
        for body, reason in cases:
            response = httpx.post(url, content=body, headers=json_type, timeout=60)
            assert response.status_code == 400, (body, response.text)
            assert reason in response.json()["error"], (body, response.text)
        # What a web page can make a browser send without a CORS preflight is refused.
        forged = json.dumps({"baseline_since": "1h", "allow_findings": True}).encode()
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": content_type} if content_type else {}
            response = httpx.post(url, content=forged, headers=headers, timeout=60)
            assert (
                response.status_code == 415 and "Content-Type: application/json" in response.json()["error"]
            )
        assert _thresholds(serve)["goal_divergence"]["calibrated"] is False
    finally:
        assert serve.stop() == 0


def test_calibrate_on_a_file_another_program_holds_says_how_to_reach_its_collector(tmp_path, crew_db):
    db = tmp_path / "held.duckdb"
    db.write_bytes(crew_db.read_bytes())
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, time\nc = duckdb.connect({str(db)!r})\nprint('ok', flush=True)\n"
         "time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "ok"
        from tests.serve_helpers import free_port

        result = _cli(
            "calibrate", "--db", str(db), "--baseline-since", "1h",
            env=_env(DRIFTSCOPE_HTTP_PORT=str(free_port())), timeout=120,
        )  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2
    assert "held by another process" in result.stderr
    assert (
        f"reports writing {db}: pass --endpoint URL of the `driftscope serve` that holds it" in result.stderr
    )
    _no_traceback(result)


def test_db_and_endpoint_together_are_refused(tmp_path):
    result = _cli(
        "calibrate", "--db", str(tmp_path / "x.duckdb"), "--endpoint", "http://127.0.0.1:9",
        "--baseline-since", "1h", env=_env(),
    )  # fmt: skip
    assert result.returncode == 2 and "not both" in result.stderr


def test_the_otel_exporter_endpoint_alone_does_not_redirect_calibration(tmp_path, crew_db):
    db = tmp_path / "offline.duckdb"
    db.write_bytes(crew_db.read_bytes())
    result = _cli(
        "calibrate", "--db", str(db), "--baseline-since", "2026-01-01", "--dry-run",
        env=_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dry_run"] == "nothing was stored"
    assert f"in {db}" in result.stderr and "by the collector" not in result.stderr
