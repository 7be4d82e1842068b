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
        "Summarize the history of the gold standard and currency pegs",
    ]
    for n, text in enumerate(on_topic):
        decision = guard.check("analyst", "delegate", {"n": n}, subtask_text=text)
        assert decision.allowed, (text, decision.divergence)
        assert decision.divergence < 0.4
    for n, text in enumerate(drifted):
        decision = guard.check("analyst", "delegate", {"n": 10 + n}, subtask_text=text)
        assert not decision.allowed and decision.reason == "goal_divergence", (text, decision.divergence)
        assert decision.divergence > 0.6
    spans = exporter.get_finished_spans()
    assert [s.attributes["driftscope.outcome"] for s in spans] == ["ok"] * 3 + ["rejected"] * 2
    assert all(s.attributes["driftscope.goal.root"] == ROOT for s in spans)


def test_default_embedder_is_the_bundled_model_and_normalised(embedder):
    vectors = embedder(["Analyze Q3 revenue trends"])
    assert len(vectors[0]) == 384
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0, abs=1e-4)
    guard = ExecutionGuard(root_goal=ROOT)  # no embedder passed: loads the bundled model lazily
    assert guard.divergence(ROOT) == pytest.approx(0.0, abs=1e-4)
