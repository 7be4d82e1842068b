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

from collector.clickhouse_lease import WriterLease  # noqa: E402
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
        assert serve.health()["writer_lease"] == "held"  # one writer per database
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
        assert serve.health()["spans"] == sent  # the read API answers over the store
    finally:
        assert serve.stop() == 0, serve.log()
    store = ChdbStore(str(path))
    try:
        got = clickhouse_to_duckdb(store.execute("SELECT * FROM otel.spans"))
        assert store.execute("SELECT count() AS n FROM otel.otel_traces").column("n")[0].as_py() == sent
        # it gave the writer lease up on stopping: the next writer need not wait for it to lapse
        assert WriterLease(store, "test").current() is None
        assert store.execute("SELECT count() AS n FROM otel.driftscope_writer").column("n")[0].as_py() >= 2
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


def test_a_bad_rules_file_with_a_clickhouse_store_names_the_line_before_opening_the_store(tmp_path):
    from driftscope.serve import ServeConfig, build_service
    from driftscope.settings import ConfigError

    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\ndetector = "no_such_detector"\n')
    config = ServeConfig(
        db=str(tmp_path / "d.duckdb"),
        store=f"chdb:{tmp_path / 'ch'}",
        alert_rules=str(rules),
        embeddings=False,
    )
    with pytest.raises(ConfigError, match="line 2.*driftscope alerts check FILE"):
        build_service(config)
    assert not (tmp_path / "ch").exists()  # refused before the store was opened


# --- the read API over the store, in process (serve's composition behind an ASGI client) ---------

SAMPLES = [
    Path(__file__).resolve().parents[2] / "sample_traces" / f"{name}.json"
    for name in ("split_brain_unguarded", "healthy_guarded")
]
SPLIT_BRAIN_RUN = "run-split_brain-unguarded-5712e27d"


@pytest.fixture(scope="module")
def chdb_serve(tmp_path_factory):
    """serve --store chdb:PATH in process, fed two sample crews over OTLP/HTTP and resolved."""
    import time

    from starlette.testclient import TestClient

    from collector.files import iter_file_requests
    from driftscope.serve import ServeConfig, build_service

    root = tmp_path_factory.mktemp("serve-chdb")
    service = build_service(
        ServeConfig(db=str(root / "unused.duckdb"), store=f"chdb:{root / 'ch'}", embeddings=False)
    )
    service.writer.resolve_interval = 0.0  # passes back to back: the test reads resolved spans
    client = TestClient(service.app, base_url="http://127.0.0.1").__enter__()
    try:
        sent = 0
        for sample in SAMPLES:
            for _, payload in iter_file_requests(sample):
                response = client.post(
                    "/v1/traces", content=payload, headers={"Content-Type": "application/json"}
                )
                assert response.status_code == 200, response.text
                sent += _span_count(payload)
        deadline = time.monotonic() + 60
        while (
            client.get("/api/v1/health").json()["resolve"]["unresolved_spans"] and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert client.get("/api/v1/health").json()["resolve"]["unresolved_spans"] == 0
        yield client, sent
    finally:
        client.__exit__(None, None, None)
        service.stop()


def _span_count(payload: bytes) -> int:
    body = json.loads(payload)
    return sum(len(scope["spans"]) for rs in body["resourceSpans"] for scope in rs["scopeSpans"])


def _http_source(client):
    """The dashboard's HTTP source, its requests sent to the in-process app."""
    from dashboard.datasource import HttpSource

    source = HttpSource("http://127.0.0.1")
    source._client = client
    return source


def test_read_api_answers_over_a_chdb_store(chdb_serve):
    from analytics.types import Filters, Window

    client, sent = chdb_serve
    source = _http_source(client)
    health = client.get("/api/v1/health").json()
    assert health["spans"] == sent > 20 and health["store"]["engine"] == "chdb"
    assert source.health().ok and source.health().spans == sent
    assert SPLIT_BRAIN_RUN in source.filter_options(Window())["runs"]
    runs = source.runs(Window(), Filters())
    assert SPLIT_BRAIN_RUN in set(runs["run_id"]) and len(runs) == 2
    lost = source.metric("lost_updates", Window(), Filters())
    assert list(lost["run_id"]) == [SPLIT_BRAIN_RUN] * 2
    assert set(lost["state_key"]) == {"report/q3/draft", "report/q3/status"}
    spans = source.run_spans(SPLIT_BRAIN_RUN)
    assert len(spans) == 20 and set(spans["agent_id"].dropna()) >= {"researcher", "writer"}
    totals = source.run_totals(Window(), Filters(run=SPLIT_BRAIN_RUN))
    assert totals["spans"].tolist() == [20]
    details = source.run_details(Window(), Filters(), [SPLIT_BRAIN_RUN])
    assert details["run_id"].tolist() == [SPLIT_BRAIN_RUN] and details["spans"].tolist() == [20]
    clobbering = lost["span_ids"].iloc[0][0]
    import pandas as pd

    evidence = source.evidence_spans(pd.DataFrame({"run_id": [SPLIT_BRAIN_RUN], "span_id": [clobbering]}))
    assert evidence["span_id"].tolist() == [clobbering]
    assert "goal_divergence" in set(source.thresholds()["name"])
    assert SPLIT_BRAIN_RUN in set(source.search_spans(SPLIT_BRAIN_RUN[:20], Window(), Filters())["run_id"])
    assert source.alerts(Window()).empty  # the default rules look back 15 min; the spans are older
    assert [m["name"] for m in source.list_metrics()] == [
        m["name"] for m in client.get("/api/v1/metrics").json()["metrics"]
    ]


def test_serve_keeps_findings_tables_and_answers_from_them_with_their_lag(chdb_serve):
    """serve --store runs the materializer after resolve: health says how far behind the findings
    tables are, and a metric is answered from its table, saying as of when."""
    import time

    client, _ = chdb_serve
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        findings = client.get("/api/v1/health").json()["findings"]
        if findings["lag_seconds"] == 0.0 and findings["behind_changes"] == 0:
            break
        time.sleep(0.2)
    assert findings["lag_seconds"] == 0.0 and findings["findings_as_of"], findings
    assert findings["materializer_passes"] >= 1 and not findings["failed"] and not findings["last_error"]
    for name in ("lost_updates", "run_summary"):
        response = client.get(f"/api/v1/metrics/{name}")
        assert response.status_code == 200
        body = response.json()
        assert response.headers["X-Driftscope-Source"] == "table", name
        assert body["lag_seconds"] == 0.0 and body["findings_as_of"]
    rows = client.get("/api/v1/metrics/lost_updates").json()["rows"]
    assert {row["run_id"] for row in rows} == {SPLIT_BRAIN_RUN} and len(rows) == 2


def test_read_api_over_a_store_keeps_its_checks_and_names_what_is_missing(chdb_serve):
    client, _ = chdb_serve
    assert client.get("/api/v1/runs", params={"limit": "0"}).status_code == 400
    assert client.get("/api/v1/metrics/nope").status_code == 404
    assert client.get("/api/v1/runs/no-such-run/spans").status_code == 404
    calibrate = client.post("/api/v1/calibrate", json={})
    assert (
        calibrate.status_code == 501
        and "calibration runs on the DuckDB store only" in calibrate.json()["error"]
    )


@pytest.mark.slow
def test_serve_resolves_sdk_spans_as_they_arrive_and_reports_how_far_behind(tmp_path):
    """The real serve --store chdb:PATH fed by the OpenTelemetry SDK's HTTP exporter, one span per
    request (a tool span reaches serve before the agent span it ran under): the health answer
    says the spans are resolved up to now, and the tool span took its agent from the ancestor."""
    import time

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    serve = new_serve(tmp_path, extra_args=["--store", f"chdb:{tmp_path / 'ch'}"]).start(timeout=180)
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "crew-chdb"}))
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{serve.http_url}/v1/traces"))
        )
        tracer = provider.get_tracer("tests")
        for run in ("run-a", "run-b"):
            agent = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.id": "planner",
                "gen_ai.conversation.id": run,
            }
            with tracer.start_as_current_span("invoke_agent planner", attributes=agent):
                with tracer.start_as_current_span(
                    "execute_tool search", attributes={"gen_ai.tool.name": "search"}
                ):
                    pass
        provider.shutdown()
        deadline = time.monotonic() + 60
        while (health := serve.health())["resolve"]["unresolved_spans"] and time.monotonic() < deadline:
            time.sleep(0.1)
        resolve = health["resolve"]
        assert health["committed_spans"] == health["spans"] == 4
        assert resolve["unresolved_spans"] == 0 and resolve["lag_seconds"] == 0.0 and resolve["resolved_to"]
        # serve resolved each request as it went in: the watermark moved without a pass
        assert (
            health["direct_insert"]
            and health["resolve_watermark_advances"] >= 1
            and health["resolve_passes"] == 0
        )
        rows = httpx.get(f"{serve.http_url}/api/v1/runs/run-a/spans", timeout=60).json()["rows"]
        tool = next(row for row in rows if row["span_name"] == "execute_tool search")
        assert (tool["agent_id"], tool["agent_source"]) == ("planner", "ancestor")
    finally:
        assert serve.stop() == 0, serve.log()
