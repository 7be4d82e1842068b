"""Every detector scored against the simulator's ground truth (sample_traces/*.truth.json).

All scenario files are ingested through the collector's real file path into one in-memory
database; each scenario is then selected with the run filter (its gen_ai.conversation.id).
Precision and recall must both be 1.0: the detector's set of findings equals the truth's.
"""

from __future__ import annotations

import json
import pathlib

import duckdb
import pytest

from analytics import Filters, run_metric
from tests.fixtures_analytics import sample_traces_db

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "sample_traces"
TRUTH_FILES = sorted(SAMPLES.glob("*.truth.json"))
SCENARIOS = [path.name.removesuffix(".truth.json") for path in TRUTH_FILES]

# What a run's truth lists as having happened, by the category the simulator uses.
# runaway_steps: an agent that keeps calling without converging (no_progress finds it: its
# calls return the same result) fails its run, as a loop does.
FAILING_CATEGORIES = (
    "lost_updates", "constraint_drops", "drifted_subtasks", "looped_calls", "ping_pong",
    "duplicate_side_effects", "runaway_steps",
)  # fmt: skip


@pytest.fixture(scope="module")
def db() -> duckdb.DuckDBPyConnection:
    return sample_traces_db(list(SCENARIOS))


def _truth(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.truth.json").read_text())


def _run(db, name: str, metric: str):
    return run_metric(db, metric, filters=Filters(run=_truth(name)["run_id"]))


def _score(found: set, expected: set) -> tuple[float, float]:
    precision = len(found & expected) / len(found) if found else 1.0
    recall = len(found & expected) / len(expected) if expected else 1.0
    return precision, recall


def _assert_exact(found: set, expected: set) -> None:
    assert _score(found, expected) == (1.0, 1.0), f"found {found}\nexpected {expected}"


def test_sample_traces_present():
    assert len(SCENARIOS) >= 18 and "healthy_unguarded" in SCENARIOS


@pytest.mark.parametrize("name", SCENARIOS)
def test_divergent_reads_match_truth(db, name):
    rows = _run(db, name, "divergent_reads")
    found = {(r.state_key, r.version, frozenset(r.agents), frozenset(r.read_span_ids),
              frozenset(r.write_span_ids)) for r in rows.itertuples()}  # fmt: skip
    expected = {(t["key"], t["version"], frozenset(t["agents"]), frozenset(t["read_span_ids"]),
                 frozenset(t["write_span_ids"])) for t in _truth(name)["divergent_reads"]}  # fmt: skip
    _assert_exact(found, expected)


@pytest.mark.parametrize("name", SCENARIOS)
def test_lost_updates_match_truth(db, name):
    rows = _run(db, name, "lost_updates")
    found = {(r.state_key, r.clobbered_agent, r.clobbered_version, r.agent, r.written_version,
              tuple(r.span_ids)) for r in rows.itertuples()}  # fmt: skip
    expected = {(t["key"], t["clobbered_writer"], t["clobbered_version"], t["clobbered_by"],
                 t["clobbering_version"], (t["clobbered_span_id"], t["clobbering_span_id"]))
                for t in _truth(name)["lost_updates"]}  # fmt: skip
    _assert_exact(found, expected)


@pytest.mark.parametrize("name", SCENARIOS)
def test_constraint_drops_and_waivers_match_truth(db, name):
    rows = _run(db, name, "constraint_drops")
    found = {(r.origin_task_id, r.constraint_id, r.hop, r.agent, tuple(r.delegate_to), tuple(r.span_ids))
             for r in rows.itertuples()}  # fmt: skip
    expected = {(t["origin_task_id"], t["constraint_id"], t["hop"], t["from_agent"], (t["to_agent"],),
                 (t["span_id"],)) for t in _truth(name)["constraint_drops"]}  # fmt: skip
    _assert_exact(found, expected)
    ledger = _run(db, name, "constraint_ledger")
    waived = ledger[ledger["status"] == "waived"]
    found = {(r.constraint_id, r.hop, tuple(r.agents), tuple(r.delegate_to), r.waiver_reason,
              tuple(r.span_ids)) for r in waived.itertuples()}  # fmt: skip
    expected = {(t["constraint_id"], t["hop"], (t["agent"],), (t["to_agent"],), t["reason"],
                 (t["span_id"],)) for t in _truth(name)["waivers"]}  # fmt: skip
    _assert_exact(found, expected)


@pytest.mark.parametrize("name", SCENARIOS)
def test_goal_divergence_matches_truth(db, name):
    rows = _run(db, name, "goal_divergence")
    drifted = rows[rows["drifted"]]
    found = {(r.span_ids[0], r.agent, r.delegate_to, r.hop, r.subtask) for r in drifted.itertuples()}
    truth = _truth(name)["drifted_subtasks"]
    expected = {(t["span_id"], t["agent"], t["to_agent"], t["hop"], t["text"]) for t in truth}
    _assert_exact(found, expected)
    by_span = {r.span_ids[0]: r.divergence for r in rows.itertuples()}
    for t in truth:  # the same model gives the same numbers as the simulator's guard
        assert by_span[t["span_id"]] == pytest.approx(t["divergence"], abs=1e-3)


@pytest.mark.parametrize("name", SCENARIOS)
def test_context_drift_holders_match_truth(db, name):
    rows = _run(db, name, "context_drift_holders")
    found = {(r.agent, r.objective_id, r.held_version, r.read_span_id, r.current_version,
              r.supersede_span_id, bool(r.refreshed)) for r in rows.itertuples()}  # fmt: skip
    expected = {(t["agent"], t["objective_id"], t["held_version"], t["read_span_id"],
                 t["current_version"], t["supersede_span_id"], t["refreshed"])
                for t in _truth(name)["stale_holders"]}  # fmt: skip
    _assert_exact(found, expected)


@pytest.mark.parametrize("name", SCENARIOS)
def test_stale_policy_sends_match_truth_allowed_and_refused(db, name):
    rows = _run(db, name, "stale_policy_sends")
    truth = _truth(name)
    allowed = rows[rows["allowed"]]
    found = {(r.agent, r.span_ids[0], r.policy_version, r.current_policy_version)
             for r in allowed.itertuples()}  # fmt: skip
    expected = {(t["agent"], t["span_id"], t["policy_version"], t["current_version"])
                for t in truth["stale_policy_sends"]}  # fmt: skip
    _assert_exact(found, expected)
    refused = rows[~rows["allowed"]]
    found = {
        (r.agent, r.span_ids[0], r.policy_version, r.current_policy_version) for r in refused.itertuples()
    }
    expected = {(t["agent"], t["span_id"], t["policy_version"], t["current_version"])
                for t in truth["prevented"] if t["reason"] == "superseded_policy"}  # fmt: skip
    _assert_exact(found, expected)


@pytest.mark.parametrize("name", SCENARIOS)
def test_repeated_calls_match_truth(db, name):
    rows = _run(db, name, "repeated_calls")
    found = {(r.agent, r.tool_name, frozenset(r.span_ids), r.calls) for r in rows.itertuples()}
    expected = {(t["agent"], t["tool"], frozenset(t["span_ids"]), t["count"])
                for t in _truth(name)["looped_calls"]}  # fmt: skip
    _assert_exact(found, expected)


@pytest.mark.parametrize("name", SCENARIOS)
def test_ping_pong_matches_truth(db, name):
    rows = _run(db, name, "ping_pong")
    found = {(frozenset(r.agents), tuple(r.span_ids), r.delegations) for r in rows.itertuples()}
    expected = {(frozenset(t["agents"]), tuple(t["span_ids"]), t["handoffs"])
                for t in _truth(name)["ping_pong"]}  # fmt: skip
    _assert_exact(found, expected)


@pytest.mark.parametrize("name", SCENARIOS)
def test_budget_exhaustion_matches_truth(db, name):
    rows = _run(db, name, "budget_exhaustion")
    truth = {t["agent"]: t for t in _truth(name)["budget_exhaustion"]}
    _assert_exact(set(rows["agent"]), set(truth))
    for row in rows.itertuples():
        assert truth[row.agent]["span_id"] in list(row.span_ids)
        assert row.budget_rejections == 1


@pytest.mark.parametrize("name", SCENARIOS)
def test_duplicate_side_effects_match_truth(db, name):
    rows = _run(db, name, "duplicate_side_effects")
    found = {(tuple(r.agents), r.tool_name, tuple(r.span_ids)) for r in rows.itertuples()}
    expected = {((t["agent"],), t["tool"], tuple(t["span_ids"]))
                for t in _truth(name)["duplicate_side_effects"]}  # fmt: skip
    _assert_exact(found, expected)


@pytest.mark.parametrize("name", SCENARIOS)
def test_rejection_counts_and_coverage_match_truth(db, name):
    truth = _truth(name)
    rates = _run(db, name, "rejection_rates")
    outcomes = truth["span_counts"]["by_outcome"]
    assert int(rates["rejections"].sum()) == outcomes.get("rejected", 0)
    assert int(rates["errors"].sum()) == outcomes.get("error", 0)
    rejected = sorted(span for spans in rates["span_ids"] for span in spans)
    assert rejected == sorted(t["span_id"] for t in truth["prevented"])
    coverage = _run(db, name, "enforcement_coverage")
    assert int(coverage["prevented"].sum()) == len(truth["prevented"])
    reasons = {reason for reasons in coverage["prevented_reasons"] for reason in reasons}
    assert reasons == {t["reason"] for t in truth["prevented"]}


@pytest.mark.parametrize("name", SCENARIOS)
def test_run_summary_verdict_follows_truth(db, name):
    truth = _truth(name)
    summary = _run(db, name, "run_summary")
    assert list(summary["run_id"]) == [truth["run_id"]]
    others = (
        any(truth[category] for category in FAILING_CATEGORIES if category != "drifted_subtasks")
        or truth["stale_policy_sends"]
        or any(not holder["refreshed"] for holder in truth["stale_holders"])
    )
    failing = others or truth["drifted_subtasks"]
    degraded = (
        truth["prevented"] or truth["divergent_reads"] or truth["stale_holders"] or truth["budget_exhaustion"]
    )
    expected = "failing" if failing else "degraded" if degraded else "healthy"
    if failing and not others:  # goal drift alone fails a run only once the threshold is calibrated
        expected = "to review"
    assert summary.iloc[0]["verdict"] == expected


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith("healthy")])
def test_healthy_crew_has_no_findings(db, name):
    for metric in ("divergent_reads", "lost_updates", "constraint_drops", "context_drift_holders",
                   "stale_policy_sends", "repeated_calls", "ping_pong", "budget_exhaustion",
                   "duplicate_side_effects"):  # fmt: skip
        assert _run(db, name, metric).empty, metric
    assert _run(db, name, "goal_divergence").empty  # only drifted subtasks are rows
    spread = _run(db, name, "goal_divergence_distribution")
    assert spread["subtasks"].sum() > 0 and not spread["drifted"].any()
    assert not _run(db, name, "rejection_rates")["over_threshold"].any()


def test_origin_task_filter_selects_the_runs_of_that_task(db):
    truth = _truth("constraint_drop_unguarded")
    origin = truth["constraint_drops"][0]["origin_task_id"]
    drops = run_metric(db, "constraint_drops", filters=Filters(origin_task=origin))
    assert list(drops["origin_task_id"]) == [origin]
    summary = run_metric(db, "run_summary", filters=Filters(origin_task=origin))
    assert list(summary["run_id"]) == [truth["run_id"]]
    assert run_metric(db, "constraint_drops", filters=Filters(origin_task="no-such-task")).empty
