"""The benchmark scripts still run and write well-formed results (tiny sizes; no timing checks)."""

from __future__ import annotations

import json

import pytest

from benchmarks.generator import TEMPLATE_NAMESPACE, generate_requests, stamp, template_payloads
from benchmarks.report import check_targets, markdown_table
from collector.decode import PROTOBUF, decode_payload


def test_generator_is_deterministic_and_stamping_equals_generating_the_namespace():
    first = template_payloads(1024, seed=3)
    assert first == template_payloads(1024, seed=3)
    assert first != template_payloads(1024, seed=4)
    generated = [r.SerializeToString() for r in generate_requests(1024, seed=3, namespace=42)]
    assert [stamp(p, 42) for p in first] == generated
    batch = decode_payload(generated[0], PROTOBUF)
    assert batch.accepted == 512 and batch.rejected == 0
    assert all(f"{42:016x}" in run for run in batch.columns["run_id"])
    assert not any(f"{TEMPLATE_NAMESPACE:016x}" in trace for trace in batch.columns["TraceId"])
    tool_rows = [i for i, name in enumerate(batch.columns["SpanName"]) if name.startswith("execute_tool")]
    assert tool_rows and all(len(batch.columns["SpanAttributes"][i]) >= 10 for i in tool_rows)


@pytest.mark.slow
def test_smoke_run_writes_results_for_every_section(tmp_path, capsys):
    import analytics
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

    targets = document["targets"]
    assert targets == check_targets(document)
    assert {"target", "limit", "measured", "met", "note"} <= set(targets[0])
    table = markdown_table(document)
    assert table in capsys.readouterr().out
    assert table.count("\n|") == len(targets) + 2  # header, separator, one row per target
