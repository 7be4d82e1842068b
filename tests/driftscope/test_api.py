"""driftscope/api.py: the read API over analytics' read interface, in process.

Serve's composition behind an ASGI client (``in_process``); the same routes over a real socket
with the SDK exporters are in tests/driftscope/test_serve.py."""

import random

import pandas as pd
import pyarrow as pa

from analytics import materialize, read, run_metric
from analytics.types import Filters, Page, Window
from dashboard.datasource import HttpSource
from tests.analytics.test_materialize import (
    SCENARIOS,
    _commit,
    _commit_table,
    _no_progress_run,
    _pass,
    _runaway_crew,
    _sample_spans,
    _store,
)  # fmt: skip
from tests.otlp_builders import make_request

PB = {"Content-Type": "application/x-protobuf"}


def test_read_api_rejects_bad_parameters(in_process):
    assert in_process.get("/api/v1/runs", params={"since": "yesterday-ish"}).status_code == 400
    assert "unknown parameter" in in_process.get("/api/v1/runs", params={"sql": "select 1"}).json()["error"]
    assert in_process.get("/api/v1/metrics/no_such_metric").status_code == 404
    assert in_process.get("/api/v1/runs", params={"limit": "-1"}).status_code == 400


def test_thresholds_endpoint_lists_what_is_in_force(in_process):
    rows = in_process.get("/api/v1/thresholds").json()["rows"]
    by_name = {row["name"]: row for row in rows}
    assert by_name["goal_divergence"]["value"] == 0.80 and by_name["goal_divergence"]["calibrated"] is False
    assert all({"value", "version", "method", "provenance", "calibrated"} <= set(row) for row in rows)


def test_every_listed_metric_answers_with_its_documented_columns_in_json_and_arrow(in_process):
    attrs = {"gen_ai.agent.id": "planner", "gen_ai.conversation.id": "run-arrow", "driftscope.op": "write"}
    body = make_request([{"attrs": attrs}]).SerializeToString()
    assert in_process.post("/v1/traces", content=body, headers=PB).status_code == 200
    metrics = in_process.get("/api/v1/metrics").json()["metrics"]
    assert metrics and all({"name", "description", "columns", "params"} <= set(m) for m in metrics)
    runs = in_process.get("/api/v1/runs", headers={"Accept": "application/vnd.apache.arrow.stream"})
    assert pa.ipc.open_stream(runs.content).read_all().column("run_id").to_pylist() == ["run-arrow"]
    for metric in metrics:
        answer = in_process.get(f"/api/v1/metrics/{metric['name']}", params={"since": "24h"})
        assert answer.status_code == 200, (metric["name"], answer.text)
        assert answer.json()["columns"] == list(metric["columns"])
        arrow = in_process.get(
            f"/api/v1/metrics/{metric['name']}",
            params={"since": "24h"},
            headers={"Accept": "application/vnd.apache.arrow.stream"},
        )
        assert pa.ipc.open_stream(arrow.content).read_all().column_names == list(metric["columns"])


def test_a_metric_answers_only_the_columns_asked_for_and_names_the_documented_ones(in_process):
    attrs = {"gen_ai.agent.id": "planner", "gen_ai.conversation.id": "run-cols", "driftscope.op": "write"}
    body = make_request([{"attrs": attrs}]).SerializeToString()
    assert in_process.post("/v1/traces", content=body, headers=PB).status_code == 200
    whole = in_process.get("/api/v1/metrics/run_summary").json()
    answer = in_process.get("/api/v1/metrics/run_summary", params={"columns": "verdict,run_id"})
    assert answer.status_code == 200 and answer.json()["columns"] == ["verdict", "run_id"]
    rows = [{"verdict": row["verdict"], "run_id": row["run_id"]} for row in whole["rows"]]
    assert answer.json()["rows"] == rows != []
    bad = in_process.get("/api/v1/metrics/run_summary", params={"columns": "run_id,span_ids"})
    assert bad.status_code == 400
    assert "documented columns" in bad.json()["error"] and "'span_ids'" in bad.json()["error"]
    assert in_process.get("/api/v1/metrics/run_summary", params={"columns": ""}).status_code == 400


def test_a_metric_answers_a_page_of_its_rows_with_their_total(in_process):
    spans = [
        {
            "attrs": {
                "gen_ai.agent.id": "worker",
                "gen_ai.conversation.id": f"run-page-{i}",
                "driftscope.op": "write",
            }
        }
        for i in range(7)
    ]
    assert (
        in_process.post("/v1/traces", content=make_request(spans).SerializeToString(), headers=PB).status_code
        == 200
    )
    whole = in_process.get("/api/v1/metrics/run_summary").json()
    assert whole["total_rows"] == len(whole["rows"]) == 7
    pages, offset = [], 0
    while offset is not None:
        answer = in_process.get("/api/v1/metrics/run_summary", params={"limit": "3", "offset": str(offset)})
        assert answer.status_code == 200 and answer.headers["x-driftscope-total-rows"] == "7"
        body = answer.json()
        assert body["total_rows"] == 7 and body["limit"] == 3 and body["offset"] == offset
        pages.append(body["rows"])
        offset = body["next_offset"]
    assert [len(p) for p in pages] == [3, 3, 1] and sum(pages, []) == whole["rows"]
    past = in_process.get("/api/v1/metrics/run_summary", params={"offset": "50", "columns": "run_id"}).json()
    assert past["rows"] == [] and past["total_rows"] == 7 and past["next_offset"] is None
    arrow = in_process.get(
        "/api/v1/metrics/run_summary",
        params={"limit": "2", "offset": "5"},
        headers={"Accept": "application/vnd.apache.arrow.stream"},
    )
    assert arrow.headers["x-driftscope-total-rows"] == "7"
    assert pa.ipc.open_stream(arrow.content).read_all().column("run_id").to_pylist() == [
        row["run_id"] for row in whole["rows"][5:]
    ]
    for bad, words in [({"limit": "0"}, "limit must be"), ({"offset": "-3"}, "offset must be"),
                       ({"offset": "2.5"}, "offset must be"), ({"limit": "100001"}, "limit must be")]:  # fmt: skip
        answer = in_process.get("/api/v1/metrics/run_summary", params=bad)
        assert answer.status_code == 400 and words in answer.json()["error"], bad


def test_an_arrow_answer_from_a_findings_table_reads_back_as_the_files_frame(tmp_path, in_process_factory):
    """The metric read sends a findings table's own Arrow rows (no pandas on the way); the
    dashboard's HTTP source reads them back as exactly the frame a file read gives."""
    conn = _store(tmp_path)
    _commit_table(conn, _sample_spans(SCENARIOS))
    _commit(conn, _runaway_crew(random.Random(3)) + _no_progress_run(random.Random(3)))
    _pass(conn)
    names = [n for n in materialize.maintained() if n in read.metric_names()]
    expected = {name: run_metric(conn, name) for name in names}
    paged = {name: run_metric(conn, name, page=Page(2, 1)) for name in names}
    conn.close()
    http = HttpSource("http://127.0.0.1")
    http._client = in_process_factory(db=str(tmp_path / "spans.duckdb"))
    rows = 0
    for name in names:
        assert expected[name].attrs["source"] == "table", name
        arrow = http._client.get(
            f"/api/v1/metrics/{name}", headers={"Accept": "application/vnd.apache.arrow.stream"}
        )
        assert arrow.headers["x-driftscope-source"] == "table", name
        assert pa.ipc.open_stream(arrow.content).schema.pandas_metadata is None  # not through pandas
        pd.testing.assert_frame_equal(http.metric(name, Window(), Filters()), expected[name], obj=name)
        page = http._client.get(
            f"/api/v1/metrics/{name}",
            params={"limit": "2", "offset": "1"},
            headers={"Accept": "application/vnd.apache.arrow.stream"},
        )
        assert page.headers["x-driftscope-total-rows"] == str(len(expected[name])), name
        pd.testing.assert_frame_equal(http._frame(page), paged[name], obj=f"{name} page")
        rows += len(expected[name])
    assert rows > 0
