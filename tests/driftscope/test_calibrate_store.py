"""`driftscope calibrate --store chdb:PATH`: calibration reads through analytics on ClickHouse and
stores a new threshold version in the store's `thresholds`, numbered as on DuckDB."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")
pytest.importorskip("sqlglot", reason="sqlglot is in the clickhouse extra")

from analytics.thresholds import current_threshold  # noqa: E402
from collector.clickhouse_store import ChdbStore  # noqa: E402
from driftscope.calibrate import CalibrationRequest, calibrate_on_store  # noqa: E402
from driftscope.settings import ConfigError  # noqa: E402
from tests.dashboard.test_dashboard_chdb import SAMPLES, write_chdb_store  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOOP_PAIRS = REPO / "sample_traces" / "calibration" / "loop_pairs.csv"


@pytest.mark.slow  # ~13 s: a CLI process and two chdb sessions
def test_calibrate_on_a_chdb_store_stores_versioned_thresholds_there(tmp_path):
    path = tmp_path / "ch"
    write_chdb_store(path, SAMPLES[:1])
    url = f"chdb:{path}"
    run = subprocess.run(
        [sys.executable, "-m", "driftscope", "calibrate", "--store", url, "--pairs", str(LOOP_PAIRS)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    first = json.loads(run.stdout)["pairs"]
    assert first["name"] == "near_duplicate_similarity" and first["version"] == 1
    # again, in this process: the next version, numbered from what the store holds
    second = calibrate_on_store(url, CalibrationRequest(pairs_name=str(LOOP_PAIRS)), LOOP_PAIRS)
    assert second["pairs"]["version"] == 2 and second["pairs"]["value"] == first["value"]
    assert [c["name"] for c in second["changed"]] == ["near_duplicate_similarity"]
    store = ChdbStore(str(path))
    try:
        info = current_threshold(store, "near_duplicate_similarity")
        assert (info.version, info.method, info.calibrated) == (2, "youden_j", True)
        assert json.loads(info.provenance)["data_sha256"]
    finally:
        store.close()
    with pytest.raises(ConfigError, match="--dry-run needs a DuckDB store"):
        calibrate_on_store(url, CalibrationRequest(pairs_name="x", dry_run=True), LOOP_PAIRS)
