"""Sample traces through the collector: span counts and coordination columns in DuckDB match the truth."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import duckdb
import httpx
import pytest

from collector.files import ingest_files
from guards.demo import HEALTHY_RUNS, run_demo

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
TRACE_FILES = sorted(p for p in SAMPLES.glob("*.json") if not p.name.endswith(".truth.json"))
TRUTHS = [json.loads(p.read_text()) for p in sorted(SAMPLES.glob("*.truth.json"))]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("roundtrip") / "samples.duckdb"
    result = ingest_files(path, TRACE_FILES)
    assert result.errors == [] and result.rejected == 0
    assert result.stored == sum(t["span_counts"]["total"] for t in TRUTHS)
    conn = duckdb.connect(str(path), read_only=True)
    yield conn
    conn.close()


def test_span_counts_by_scenario_and_outcome_match_the_truth(db):
    rows = db.execute(
        """
        SELECT scenario, map_from_entries(SpanAttributes)['driftscope.variant'],
               coalesce(outcome, 'none'), count(*)
        FROM spans GROUP BY ALL
        """
    ).fetchall()
    stored: dict[tuple[str, str], dict[str, int]] = {}
    for scenario, variant, outcome, count in rows:
        stored.setdefault((scenario, variant), {})[outcome] = count
    expected = {(t["scenario"], t["variant"]): t["span_counts"]["by_outcome"] for t in TRUTHS}
    assert stored == expected


def test_runs_reject_reasons_and_services_match_the_truth(db):
    for truth in TRUTHS:
        spans, traces, services = db.execute(
            "SELECT count(*), count(DISTINCT TraceId), list_distinct(list(ServiceName)) FROM spans WHERE run_id = ?",
            [truth["run_id"]],
        ).fetchone()
        assert spans == truth["span_counts"]["total"]
        assert traces == len(truth["trace_ids"])
        assert services == ["crew-sim"]
        reasons = dict(
            db.execute(
                "SELECT reject_reason, count(*) FROM spans WHERE run_id = ? AND reject_reason IS NOT NULL GROUP BY 1",
                [truth["run_id"]],
            ).fetchall()
        )
        assert reasons == truth["span_counts"]["by_reject_reason"]


def column(db, span_id: str, name: str):
    return db.execute(f"SELECT {name} FROM spans WHERE SpanId = ?", [span_id]).fetchone()[0]


def truth_of(scenario: str, variant: str) -> dict:
    return next(t for t in TRUTHS if t["scenario"] == scenario and t["variant"] == variant)


def test_coordination_columns_carry_what_the_truth_points_at(db):
    lost = truth_of("split_brain", "unguarded")["lost_updates"][0]
    assert column(db, lost["clobbering_span_id"], "state_key") == lost["key"]
    assert column(db, lost["clobbering_span_id"], "state_version") == lost["clobbering_version"]
    assert column(db, lost["clobbering_span_id"], "state_expected_version") is None  # unversioned write
    assert column(db, lost["clobbering_span_id"], "agent_id") == "writer"
    guarded = truth_of("split_brain", "guarded")["prevented"][0]
    assert column(db, guarded["span_id"], "state_expected_version") is not None
    assert column(db, guarded["span_id"], "reject_reason") == "version_conflict"

    drop = truth_of("constraint_drop", "unguarded")["constraint_drops"][0]
    assert column(db, drop["span_id"], "hop") == drop["hop"]
    assert column(db, drop["span_id"], "delegate_to") == drop["to_agent"]
    assert column(db, drop["span_id"], "constraints_ledger") is None
    missing = [
        p for p in truth_of("constraint_drop", "guarded")["prevented"] if p["reason"] == "missing_constraint"
    ][0]
    assert column(db, missing["span_id"], "constraints_ledger") == ["C1", "C2", "C3"]
    assert column(db, missing["span_id"], "constraints_carried") == ["C1", "C3"]
    waiver = truth_of("constraint_drop", "guarded")["waivers"][0]
    assert column(db, waiver["span_id"], "constraints_waived") == ["C3"]
    assert column(db, waiver["span_id"], "waiver_reasons") == [waiver["reason"]]

    drifted = truth_of("goal_drift", "unguarded")["drifted_subtasks"][0]
    assert column(db, drifted["span_id"], "goal_text") == drifted["text"]
    assert column(db, drifted["span_id"], "goal_root") == "Analyze Q3 revenue trends"

    send = truth_of("context_drift", "unguarded")["stale_policy_sends"][0]
    assert column(db, send["span_id"], "policy_version") == send["policy_version"]
    assert column(db, send["span_id"], "side_effect") is True

    dup = truth_of("duplicate_side_effect", "guarded")["prevented"][0]
    assert column(db, dup["span_id"], "idempotency_key") == dup["idempotency_key"]

    budget = truth_of("step_budget", "guarded")["budget_exhaustion"][0]
    assert column(db, budget["span_id"], "op") == "step"
    assert column(db, budget["span_id"], "budget_max_steps") == budget["max_steps"]
    assert column(db, budget["span_id"], "step") == budget["steps_taken"] + 1


def test_agent_spans_and_tool_spans_map_to_families(db):
    families = dict(
        db.execute(
            "SELECT span_family, count(*) FROM spans WHERE SpanName LIKE 'invoke_agent %' GROUP BY 1"
        ).fetchall()
    )
    assert set(families) == {"agent"}
    unattributed = db.execute(
        "SELECT count(*) FROM spans WHERE operation = 'execute_tool' AND agent_id IS NULL"
    ).fetchone()[0]
    assert unattributed == 0


@pytest.mark.slow
def test_demo_through_a_running_collector_matches_the_truth_counts(serve):
    assert run_demo(serve.http_url, "context_drift", live=False) == 0
    expected = {t["variant"]: t["span_counts"] for t in TRUTHS if t["scenario"] == "context_drift"}
    deadline = time.monotonic() + 30
    runs = []
    while time.monotonic() < deadline:
        every = httpx.get(f"{serve.http_url}/api/v1/runs", headers=serve.headers, timeout=5).json()["rows"]
        # the crew's healthy runs the demo sends first are "-ok-" runs; the scenario's are the others
        runs = [r for r in every if "-ok-" not in r["run_id"]]
        total = sum(r["spans"] for r in runs) == sum(c["total"] for c in expected.values())
        if len(runs) == 2 and total and len(every) == 2 + 2 * HEALTHY_RUNS:
            break
        time.sleep(0.2)
    assert len(runs) == 2 and len(every) == 2 + 2 * HEALTHY_RUNS
    for run in runs:
        rows = httpx.get(
            f"{serve.http_url}/api/v1/runs/{run['run_id']}/spans", headers=serve.headers, timeout=5
        ).json()["rows"]
        variant = rows[0]["attributes"]["driftscope.variant"]
        assert run["scenario"] == "context_drift"
        assert dict(Counter(r["outcome"] or "none" for r in rows)) == expected[variant]["by_outcome"]
