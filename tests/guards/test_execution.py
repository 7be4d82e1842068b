"""Goal divergence with the real bundled all-MiniLM-L6-v2 model (loaded offline, once)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from guards import ExecutionGuard, Telemetry
from guards.embedding import SentenceTransformerEmbedder

ROOT = "Analyze Q3 revenue trends"


@pytest.fixture(scope="module")
def embedder():
    return SentenceTransformerEmbedder()


def test_on_topic_subtasks_pass_and_fx_history_is_refused(embedder):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    guard = ExecutionGuard(Telemetry(provider), root_goal=ROOT, embedder=embedder)
    on_topic = [
        "Break down Q3 revenue trends by region and product line",
        "Compare Q3 revenue growth against Q2 and last year's Q3",
        "Summarize the Q3 revenue impact of exchange rate movements",
    ]
    drifted = [
        "Write a history of foreign exchange markets since the Bretton Woods agreement",
        "Explain how exchange rates between the euro and the dollar have moved over the past decade",
    ]
    for n, text in enumerate(on_topic):
        decision = guard.check("analyst", "delegate", {"n": n}, subtask_text=text)
        assert decision.allowed, (text, decision.divergence)
        assert decision.divergence < 0.4
    for n, text in enumerate(drifted):
        decision = guard.check("analyst", "delegate", {"n": 10 + n}, subtask_text=text)
        assert not decision.allowed and decision.reason == "goal_divergence", (text, decision.divergence)
        assert decision.divergence > 0.8
    spans = exporter.get_finished_spans()
    assert [s.attributes["driftscope.outcome"] for s in spans] == ["ok"] * 3 + ["rejected"] * 2
    assert all(s.attributes["driftscope.goal.root"] == ROOT for s in spans)


def test_default_embedder_is_the_bundled_model_and_normalised(embedder):
    vectors = embedder(["Analyze Q3 revenue trends"])
    assert len(vectors[0]) == 384
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0, abs=1e-4)
    guard = ExecutionGuard(root_goal=ROOT)  # no embedder passed: loads the bundled model lazily
    assert guard.divergence(ROOT) == pytest.approx(0.0, abs=1e-4)


def test_default_threshold_is_the_collectors_and_lets_ordinary_decompositions_pass(embedder):
    from analytics.thresholds import DEFAULTS
    from guards.execution import DEFAULT_DIVERGENCE_THRESHOLD

    # One number for the guard and the collector's uncalibrated goal drift (367 labelled pairs).
    assert DEFAULT_DIVERGENCE_THRESHOLD == DEFAULTS["goal_divergence"][0] == 0.80
    offsite = ExecutionGuard(root_goal="Plan the offsite", embedder=embedder)
    venues = offsite.check("planner", "delegate", {"to": "scout"}, subtask_text="Find venues")
    assert venues.allowed and 0.75 < venues.divergence < 0.80  # the README example: 0.777, passes
    # Drift just under the default passes it; a threshold calibrated on the labelled pairs
    # (Youden's J: 0.745) refuses it.
    gold = "Summarize the history of the gold standard and currency pegs"
    assert (
        ExecutionGuard(root_goal=ROOT, embedder=embedder)
        .check("a", "delegate", {}, subtask_text=gold)
        .allowed
    )
    calibrated = ExecutionGuard(root_goal=ROOT, embedder=embedder, divergence_threshold=0.745)
    refused = calibrated.check("a", "delegate", {}, subtask_text=gold)
    assert not refused.allowed and refused.reason == "goal_divergence" and refused.divergence > 0.745
