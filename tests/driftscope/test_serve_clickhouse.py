"""`driftscope serve --store chdb:PATH`: the real serve, fed over OTLP/HTTP with the bodies the
framework instrumentations sent (the captured corpus, gzip protobuf as recorded), writes the
exporter's `otel_traces` layout; after a clean stop `spans` equals DuckDB's ingest of the same."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import duckdb
import httpx
import pytest

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")

from collector.clickhouse_resolve import clickhouse_to_duckdb  # noqa: E402
from collector.clickhouse_store import ChdbStore  # noqa: E402
from collector.decode import PROTOBUF, decode_payload  # noqa: E402
from collector.migrations_runner import apply_migrations  # noqa: E402
from collector.store import TraceIndex, insert_batches  # noqa: E402
from tests.serve_helpers import free_port, new_serve  # noqa: E402

CORPUS = Path(__file__).resolve().parents[2] / "sample_traces" / "frameworks" / "openai-agents" / "otlp.jsonl"


def _recorded_requests():
    for line in CORPUS.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            yield record, base64.b64decode(record["body_b64"])


@pytest.mark.slow
def test_serve_writes_otlp_into_clickhouse_in_the_exporters_layout(tmp_path):
    path = tmp_path / "ch"
    serve = new_serve(tmp_path, extra_args=["--store", f"chdb:{path}"]).start(timeout=180)
    conn = duckdb.connect()
    apply_migrations(conn)
    traces = TraceIndex(conn)
    sent = 0
    try:
        assert serve.health()["store"] == {"engine": "chdb", "database": "otel", "table": "otel_traces"}
        for record, body in _recorded_requests():
            headers = {"Content-Type": record["content_type"]}
            if record.get("content_encoding"):
                headers["Content-Encoding"] = record["content_encoding"]
            response = httpx.post(f"{serve.http_url}/v1/traces", content=body, headers=headers, timeout=60)
            assert response.status_code == 200, response.text
            raw = gzip.decompress(body) if record.get("content_encoding") == "gzip" else body
            batch = decode_payload(raw, PROTOBUF)
            insert_batches(conn, [batch], traces)
            sent += batch.accepted
        assert serve.health()["committed_spans"] == sent > 50  # acknowledged = inserted
        read_api = httpx.get(f"{serve.http_url}/api/v1/runs", timeout=10)
        assert read_api.status_code == 501 and "driftscope report --source chdb:" in read_api.json()["error"]
    finally:
        assert serve.stop() == 0, serve.log()
    store = ChdbStore(str(path))
    try:
        got = clickhouse_to_duckdb(store.execute("SELECT * FROM otel.spans"))
        assert store.execute("SELECT count() AS n FROM otel.otel_traces").column("n")[0].as_py() == sent
    finally:
        store.close()
    expected = conn.sql("SELECT * FROM spans").to_arrow_table()
    columns = [c for c in expected.column_names if c not in ("ingested_at", "Events", "Links")]

    def by_key(table):
        return {(r["TraceId"], r["SpanId"]): r for r in table.select(columns).to_pylist()}

    assert by_key(got) == by_key(expected)


def test_serve_refuses_a_bad_store_url_with_a_clear_message(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "driftscope",
            "serve",
            "--store",
            "clickhouse://:8123/otel",
            "--db",
            str(tmp_path / "d"),
            "--http-port",
            str(free_port()),
            "--grpc-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    assert "Expected a host in 'clickhouse://:8123/otel'" in result.stderr


def test_alert_settings_with_a_clickhouse_store_are_refused_not_ignored(tmp_path):
    import pytest

    from driftscope.serve import ServeConfig, build_service
    from driftscope.settings import ConfigError

    config = ServeConfig(
        db=str(tmp_path / "d.duckdb"),
        store=f"chdb:{tmp_path / 'ch'}",
        alertmanager_url="http://127.0.0.1:9093",
        embeddings=False,
    )
    with pytest.raises(
        ConfigError, match="--alertmanager-url: alerts are evaluated on the DuckDB store only"
    ):
        build_service(config)
