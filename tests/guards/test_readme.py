"""The README's guard example, run as written against a real `driftscope serve` (issue 16 §3).

It must make one run (`run-42`) in one trace under its own service name, with the caller's own span
in the run too (ActingAsSpanProcessor), and the run must not be flagged: "Plan the offsite"
delegating "Find venues" is an ordinary decomposition.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analytics.types import Filters, Window
from dashboard.datasource import HttpSource
from guards import ActingAsSpanProcessor, VersionedStore, acting_as
from guards.telemetry import Telemetry

REPO = Path(__file__).resolve().parents[2]


def readme_snippet() -> str:
    section = (REPO / "README.md").read_text().split("## Guard your agents' tools", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_is_one_run_in_one_trace_and_not_failing(serve, tmp_path):
    code = readme_snippet().replace("http://127.0.0.1:4318", serve.http_url)
    assert serve.http_url in code
    script = tmp_path / "agent.py"
    script.write_text(code + "\nprovider.shutdown()\n")
    subprocess.run([sys.executable, str(script)], cwd=REPO, check=True, timeout=120)
    source = HttpSource(serve.http_url)
    runs = source.runs(Window(), Filters())
    assert list(runs["run_id"]) == ["run-42"]  # no second run named after the trace id
    spans = source.run_spans("run-42")
    assert len(spans) == 5 and spans["trace_id"].nunique() == 1
    assert set(spans["service"]) == {"offsite-planner"}
    assert set(spans["agent_id"]) == {"planner"}
    root = spans[spans["span_name"] == "invoke_agent planner"]
    assert len(root) == 1 and (spans["parent_span_id"].fillna("") != "").sum() == 4
    summary = source.metric("run_summary", Window(), Filters(run="run-42"))
    assert list(summary["verdict"]) == ["healthy"], summary.T
    assert summary["worst_divergence"][0] < 0.80  # 0.777: under the default threshold
    assert source.metric("goal_divergence", Window(), Filters()).empty


def test_acting_as_processor_stamps_every_span_inside_the_block_and_explicit_values_win():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(ActingAsSpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = trace.get_tracer("test", tracer_provider=provider)
    store = VersionedStore(telemetry=Telemetry(tracer_provider=provider))
    with acting_as("planner", conversation_id="run-7"):
        with tracer.start_as_current_span("invoke_agent planner"):
            store.read_state("k")
            with tracer.start_as_current_span("chat", attributes={"gen_ai.agent.id": "llm-router"}):
                pass
    with tracer.start_as_current_span("outside"):
        pass
    spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    assert spans["invoke_agent planner"]["gen_ai.conversation.id"] == "run-7"
    assert spans["invoke_agent planner"]["gen_ai.agent.id"] == "planner"
    assert spans["execute_tool read_state"]["gen_ai.conversation.id"] == "run-7"
    assert (
        spans["chat"]["gen_ai.agent.id"] == "llm-router"
        and spans["chat"]["gen_ai.conversation.id"] == "run-7"
    )
    assert "gen_ai.conversation.id" not in spans["outside"] and "gen_ai.agent.id" not in spans["outside"]
