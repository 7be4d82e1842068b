"""The DuckDB file the dashboard, report and browser tests read, and checks that it is what they expect.

It holds every simulator run of ``sample_traces/`` (ground truth in the ``*.truth.json`` files) and
one extra run, ``run-xss``, whose span texts carry an XSS payload, all loaded through the real
ingest path (``collector.files.ingest_files``: OTLP JSON decode, convention mapping, insert).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from collector.files import ingest_files

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
XSS = '<script>alert("driftscope-xss")</script><img src=x onerror=alert(1)>'
XSS_RUN = "run-xss"

# truth category (simulator) -> detector that must find it
TRUTH_METRICS = {
    "divergent_reads": "divergent_reads",
    "lost_updates": "lost_updates",
    "constraint_drops": "constraint_drops",
    "drifted_subtasks": "goal_divergence",
    "stale_holders": "context_drift_holders",
    "stale_policy_sends": "stale_policy_sends",
    "looped_calls": "repeated_calls",
    "ping_pong": "ping_pong",
    "budget_exhaustion": "budget_exhaustion",
    "duplicate_side_effects": "duplicate_side_effects",
    "runaway_steps": "no_progress",  # twelve searches, one answer: no run length threshold sees it
}


def trace_files() -> list[Path]:
    """The simulator's OTLP JSON files (not the ground truth)."""
    return sorted(p for p in SAMPLES.glob("*.json") if not p.name.endswith(".truth.json"))


def truths() -> list[dict]:
    """Every ground-truth document of the sample traces."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(SAMPLES.glob("*.truth.json"))]


def expected_findings() -> dict[str, dict[str, int]]:
    """run id -> detector -> number of injected failures, from the ground truth (plus ``run-xss``)."""
    expected: dict[str, dict[str, int]] = {}
    for truth in truths():
        counts = {TRUTH_METRICS[c]: len(truth[c]) for c in TRUTH_METRICS if truth.get(c)}
        expected[truth["run_id"]] = counts
    expected[XSS_RUN] = {"repeated_calls": 1}
    return expected


def _attr(key: str, value) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def xss_request() -> dict:
    """One OTLP JSON request: agent ``mallory`` repeats a failing call whose text is markup."""
    trace = "5" * 32
    start = 1_768_600_000_000_000_000  # 2026-01-16T21:46:40Z, after the simulator's runs
    common = [_attr("gen_ai.conversation.id", XSS_RUN), _attr("gen_ai.agent.id", "mallory")]
    spans = [
        {
            "traceId": trace,
            "spanId": "a" * 16,
            "name": "invoke_agent mallory",
            "kind": 1,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 9_000_000_000),
            "attributes": [*common, _attr("gen_ai.operation.name", "invoke_agent")],
        }
    ]
    for i in range(3):
        spans.append(
            {
                "traceId": trace,
                "spanId": f"{i + 1:016x}",
                "parentSpanId": "a" * 16,
                "name": "execute_tool web_search",
                "kind": 1,
                "startTimeUnixNano": str(start + (i + 1) * 1_000_000_000),
                "endTimeUnixNano": str(start + (i + 1) * 1_000_000_000 + 300_000_000),
                "attributes": [
                    *common,
                    _attr("gen_ai.operation.name", "execute_tool"),
                    _attr("gen_ai.tool.name", "web_search"),
                    _attr("gen_ai.tool.call.arguments", json.dumps({"query": XSS})),
                    _attr("gen_ai.tool.call.result", "error: " + XSS),
                    _attr("driftscope.outcome", "error"),
                ],
                "status": {"code": 2, "message": XSS},
            }
        )
    resource = {"attributes": [_attr("service.name", "xss-crew")]}
    return {
        "resourceSpans": [
            {"resource": resource, "scopeSpans": [{"scope": {"name": "tests"}, "spans": spans}]}
        ]
    }


def build_dashboard_db(path: Path) -> Path:
    """Ingest the sample traces and the XSS run into a new database file at ``path``."""
    xss_file = path.with_name(path.stem + "-xss.json")
    xss_file.write_text(json.dumps(xss_request()), encoding="utf-8")
    result = ingest_files(path, [*trace_files(), xss_file])
    if result.rejected or result.errors:
        raise AssertionError(f"ingest rejected spans: {result.errors}")
    return path


def test_built_database_holds_every_sample_run_and_the_xss_run(tmp_path):
    assert len(trace_files()) >= 18, "sample_traces/ is missing: run `python -m guards.simulator regenerate`"
    path = build_dashboard_db(tmp_path / "d.duckdb")
    conn = duckdb.connect(str(path), read_only=True)
    runs = {r[0] for r in conn.execute("SELECT DISTINCT run_id FROM spans").fetchall()}
    assert runs == set(expected_findings())
    texts = conn.execute(
        "SELECT tool_args, tool_result FROM spans WHERE run_id = ? AND tool_name IS NOT NULL", [XSS_RUN]
    ).fetchall()
    assert len(texts) == 3
    assert all(json.loads(args)["query"] == XSS and XSS in result for args, result in texts)
