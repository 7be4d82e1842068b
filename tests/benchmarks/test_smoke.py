"""The benchmark scripts still run and write well-formed results (tiny sizes; no timing checks)."""

from __future__ import annotations

import json

import pytest

from benchmarks.generator import (
    TEMPLATE_NAMESPACE,
    Shape,
    SpanGenerator,
    generate_requests,
    stamp,
    template_payloads,
)
from benchmarks.report import check_targets, markdown_table
from collector.decode import PROTOBUF, decode_payload


@pytest.mark.slow
def test_generator_is_deterministic_and_stamping_equals_generating_the_namespace():
    first = template_payloads(1024, seed=3)
    assert first == template_payloads(1024, seed=3)
    assert first != template_payloads(1024, seed=4)
    generated = [r.SerializeToString() for r in generate_requests(1024, seed=3, namespace=42)]
    assert [stamp(p, 42) for p in first] == generated
    batch = decode_payload(generated[0], PROTOBUF)
    assert batch.accepted == 512 and batch.rejected == 0
    columns = batch.columns  # a property that converts the whole table: once, not once per row
    assert all(f"{42:016x}" in run for run in columns["run_id"])
    assert not any(f"{TEMPLATE_NAMESPACE:016x}" in trace for trace in columns["TraceId"])
    tool_rows = [i for i, name in enumerate(columns["SpanName"]) if name.startswith("execute_tool")]
    assert tool_rows and all(len(columns["SpanAttributes"][i]) >= 10 for i in tool_rows)


def test_shapes_make_the_runs_they_describe_and_stamp_like_the_classic_one():
    shape = Shape(calls_per_session=40, agents_per_run=3, depth=2, fanout=2, writes_per_key=5,
                  spans_per_trace=7, distinct_args=0.0)  # fmt: skip
    assert Shape.parse(shape.label) == shape and Shape.parse("classic").classic
    run = SpanGenerator(5, shape=shape).next_run()
    assert len(run) == shape.spans_per_run == 1 + (2 + 4) + 40
    traces = [span.trace_id for span in run]
    assert len(set(traces)) == -(-len(run) // 7)  # cut into traces of 7 spans
    by_id = {span.span_id: span for span in run}
    assert all(by_id[s.parent_span_id].trace_id == s.trace_id for s in run if s.parent_span_id)

    def attr(span, key):
        return next((kv.value for kv in span.attributes if kv.key == key), None)

    agents = {attr(s, "gen_ai.agent.id").string_value for s in run if attr(s, "gen_ai.agent.id")}
    assert agents == {"orchestrator", "agent-00", "agent-01", "agent-02"}
    assert {attr(s, "driftscope.hop").int_value for s in run if attr(s, "driftscope.hop")} == {1, 2}
    arguments = [
        attr(s, "gen_ai.tool.call.arguments").string_value for s in run if s.name.startswith("execute_tool")
    ]
    assert len(set(arguments)) <= 8  # no distinct arguments: all from the shared pool
    # Tool spans cut from their agent span's trace still name their agent.
    cut = [s for s in run if s.name.startswith("execute_tool") and not s.parent_span_id]
    assert cut and all(attr(s, "gen_ai.agent.id") is not None for s in cut)
    first = template_payloads(200, seed=3, shape=shape)
    generated = [r.SerializeToString() for r in generate_requests(200, seed=3, namespace=9, shape=shape)]
    assert [stamp(p, 9) for p in first] == generated
    with pytest.raises(ValueError, match="distinct_args"):
        Shape(distinct_args=2.0)
    with pytest.raises(ValueError, match="Expected shape fields"):
        Shape.parse("calls=3")


def test_shape_database_appends_live_batches_to_its_newest_runs(tmp_path):
    from benchmarks.dbbuild import SpanDatabase
    from benchmarks.shapes import growth_table

    shape = Shape(calls_per_session=30, agents_per_run=2, fanout=2)
    db = SpanDatabase(tmp_path / "shape.duckdb", shape=shape, base_spans=100)
    try:
        db.grow_to(300)
        runs_before = db.conn.execute("SELECT count(DISTINCT run_id) FROM spans").fetchone()[0]
        assert db.conn.execute("SELECT count(*) FROM spans").fetchone()[0] % shape.spans_per_run == 0
        assert db.append_batch(20) == 20
        assert db.conn.execute("SELECT count(DISTINCT run_id) FROM spans").fetchone()[0] == runs_before
    finally:
        db.close()
    section = {
        "spans": 300,
        "dimensions": {"calls_per_session": [10, 1000]},
        "by_shape": {
            "calls_per_session=10,agents_per_run=8,fanout=8,distinct_args=0.5": {
                "detectors": {"x": {"median_s": 0.1, "cold_s": 1.0}},
                "live": {"after_batch": {"x": {"median_s": 0.01, "median_cpu_s": 0.02}}}},
            "calls_per_session=1000,agents_per_run=8,fanout=8,distinct_args=0.5": {
                "detectors": {"x": {"median_s": 0.3, "cold_s": 5.0}},
                "live": {"after_batch": {"x": {"median_s": 0.02, "median_cpu_s": 0.08}}}},
        },
    }  # fmt: skip
    assert "| x | 0.100 | 0.300 | x3.0 / x100 |" in growth_table(section)
    assert "| x | 1.000 | 5.000 | x5.0 / x100 |" in growth_table(section, "cold_s")
    assert "| x | 0.010 | 0.020 | x2.0 / x100 |" in growth_table(section, "after_batch_s")
    assert "| x | 0.020 | 0.080 | x4.0 / x100 |" in growth_table(section, "after_batch_cpu_s")


@pytest.mark.slow
def test_smoke_run_writes_results_for_every_section(tmp_path, capsys):
    import analytics
    from analytics.dialect import MAX_QUERY_TREE
    from analytics.registry import METRICS
    from benchmarks.run import main

    assert analytics  # importing it registers the detectors
    out = tmp_path / "results.json"
    assert main(["--smoke", "--out", str(out), "--workdir", str(tmp_path)]) == 0
    document = json.loads(out.read_text())

    assert document["machine"]["cores"] >= 1 and document["machine"]["memory_gib"] > 0
    for transport in ("http", "grpc"):
        run = document["ingest"][transport]
        assert run["error_count"] == 0
        assert run["spans_acknowledged"] == run["spans_stored"] == run["spans_requested"] == 1024
        assert run["acked_spans_per_s"] > 0 and run["decode_only_spans_per_s"] > 0
        assert run["ack_to_decode_ratio"] == pytest.approx(
            run["acked_spans_per_s"] / run["decode_only_spans_per_s"], rel=0.01
        )
        assert run["serve_peak_rss_bytes"] > 0 and run["bytes_per_span"] > 0

    sizes = document["queries"]["by_size"]
    assert list(sizes) == ["512", "1024"]
    for entry in sizes.values():
        assert set(entry["detectors"]) == set(METRICS)
        assert all(t["median_s"] is not None and t["median_s"] >= 0 for t in entry["detectors"].values())
    assert sizes["1024"]["span_growth"] == 2.0 and set(sizes["1024"]["time_growth"]) == set(METRICS)

    (live,) = document["live"]  # issue 31: reads from the findings tables while spans stream in
    assert live["build_s"] >= 0 and live["live"]["spans_sent"] > 0 and live["live"]["refused_requests"] == 0
    assert set(live["live"]["detectors"]) == set(METRICS)
    assert all(entry["n"] >= 1 for entry in live["live"]["detectors"].values())
    assert live["health"]["findings"]["last_error"] is None

    shapes = document["shapes"]["2048"]["by_shape"]
    assert len(shapes) == 2
    for entry in shapes.values():
        assert entry["spans"] >= 2048 and set(entry["detectors"]) == set(METRICS)
        live = entry["live"]
        assert set(live["identical_to_full"]) == set(live["after_batch"]) and all(
            live["identical_to_full"].values()
        )

    embeddings = document["embeddings"]
    assert embeddings["throughput"]["vectors_shape"] == [8, 384]
    assert embeddings["throughput"]["rows_in_cache"] == 8
    sample = embeddings["sample_traces"]
    assert sample["each_distinct_text_once"] and sample["embedded_second_pass"] == 0

    dashboard = document["dashboard"]
    assert dashboard["spans"] == 512
    assert dashboard["report_html"]["html_bytes"] > 0, dashboard["report_html"]
    assert dashboard["overview_page"]["title"] == "Coordination failures", dashboard["overview_page"]
    assert dashboard["overview_page"]["errors"] == []

    chdb = document["chdb"]["by_size"]["1024"]
    assert chdb["spans"] == 1024 and chdb["same_spans"], chdb["fingerprint"]
    assert chdb["chdb_build"]["rows_inserted"] == 1024 and chdb["chdb_build"]["resolve_s"] >= 0
    assert set(chdb["chdb"]) == set(chdb["duckdb"]) == set(METRICS)
    run_on_chdb = {name for name, t in chdb["chdb"].items() if "skipped" not in t}
    assert run_on_chdb and all(chdb["chdb"][name]["median_s"] is not None for name in run_on_chdb)
    assert chdb["same_rows"] == dict.fromkeys(run_on_chdb, True)
    # each statement's planning measured apart (benchmarks.chdb_plan), within the bound
    assert set(chdb["chdb_planning"]) == run_on_chdb
    assert all(0 < p["max_tree_rows"] <= MAX_QUERY_TREE for p in chdb["chdb_planning"].values())

    ingest = document["chdb_ingest"]  # issue 36: OTLP into serve --store chdb:PATH, and the resolve
    (serve,) = ingest["serve"]
    assert serve["error_count"] == 0 and serve["spans_acknowledged"] == serve["stored_spans"] == 2048
    assert serve["direct_insert"] and serve["resolve"]["unresolved_spans"] == 0
    behind = ingest["exporter_resolve"]
    assert (
        behind["spans"] == 2048 and behind["unresolved_after"] == 0 and behind["resolve_rows_rewritten"] > 0
    )

    live = document["chdb_live"]  # issue 36: reads from ClickHouse's findings tables beside DuckDB's
    assert live["spans"]["chdb"] == live["spans"]["duckdb"] == 4096 and not live["build"]["chdb"]["failed"]
    assert {r["source"] for engine in live["reads"].values() for r in engine.values()} == {"table"}
    assert set(live["same_rows"].values()) == {True} and len(live["stream"]) == 1

    compare = document["compare"]
    assert compare["spans"] == 20_000 and compare["baseline_runs"] == compare["runs"] - 1 == 199
    assert compare["departure"] is not None and compare["median_s"] > 0

    targets = document["targets"]
    assert targets == check_targets(document)
    assert {"target", "limit", "measured", "met", "note"} <= set(targets[0])
    table = markdown_table(document)
    assert table in capsys.readouterr().out
    assert table.count("\n|") == len(targets) + 2  # header, separator, one row per target


@pytest.mark.slow
def test_restart_benchmark_stores_results_then_times_two_fresh_serves(tmp_path):
    """benchmarks.restart: findings tables built as a cleanly stopped serve leaves them, then a
    real serve asked at once and another asked after its start pass; every request answered."""
    from benchmarks import restart
    from benchmarks.dbbuild import SpanDatabase

    db = SpanDatabase(
        tmp_path / "shape.duckdb", shape=Shape(calls_per_session=40, agents_per_run=2), base_spans=100
    )
    try:
        db.grow_to(800)
    finally:
        db.close()
    out = tmp_path / "restart.json"
    names = ["repeated_calls", "run_summary"]
    assert restart.main([str(tmp_path / "shape.duckdb"), "--out", str(out), "--names", *names,
                         "--workdir", str(tmp_path)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["prepare"]["failed"] == {} and "repeated_calls" in result["prepare"]["built"]
    assert set(result["at_start"]) == set(result["after_start"]) == set(names)
    assert result["start_pass_s"] >= 0 and result["peak_rss_bytes"] > 0
    for name in names:
        assert result["after_start"][name]["bytes"] == result["at_start"][name]["bytes"] > 0
        assert result["after_start"][name]["first_s"] > 0 and result["after_start"][name]["warm_s"] > 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("driftscope-restart-")] == []
