"""The crew simulator: byte-identical regeneration, valid OTLP JSON, and ground truth that matches the spans."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from guards import call_signature
from guards.simulator import SCENARIOS, VARIANTS, regenerate, run_scenario
from guards.simulator.catalog import HEALTHY_RUNS, crew_runs
from guards.simulator.otlp_json import spans_to_otlp_json
from guards.simulator.runtime import TRUTH_CATEGORIES

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
CREWS = SAMPLES / "crews"
PAIRS = [(s, v) for s in SCENARIOS for v in VARIANTS]


def load(scenario: str, variant: str) -> tuple[dict, dict]:
    trace = json.loads((SAMPLES / f"{scenario}_{variant}.json").read_text())
    truth = json.loads((SAMPLES / f"{scenario}_{variant}.truth.json").read_text())
    return trace, truth


def attribute_value(value: dict):
    if "arrayValue" in value:
        return [attribute_value(v) for v in value["arrayValue"].get("values", [])]
    ((kind, raw),) = value.items()
    return int(raw) if kind == "intValue" else raw


def flat_spans(trace: dict) -> list[dict]:
    """Spans with attributes as a plain dict, plus their resource and scope."""
    out = []
    for resource_spans in trace["resourceSpans"]:
        resource = {a["key"]: attribute_value(a["value"]) for a in resource_spans["resource"]["attributes"]}
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                attributes = {a["key"]: attribute_value(a["value"]) for a in span.get("attributes", [])}
                out.append(
                    {**span, "attrs": attributes, "resource": resource, "scope": scope_spans["scope"]["name"]}
                )
    return out


@pytest.mark.slow
def test_regeneration_is_byte_identical_to_the_committed_files(tmp_path):
    # the documented command, in a fresh process
    subprocess.run(
        [sys.executable, "-m", "guards.simulator", "regenerate", str(tmp_path)],
        cwd=SAMPLES.parent,
        check=True,
        capture_output=True,
        timeout=300,
    )
    generated = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert len(generated) == 2 * len(PAIRS) * 2  # the failure runs, and each crew's healthy runs
    for name in sorted(generated):
        committed = SAMPLES / name
        assert committed.exists(), f"{name} is generated but not committed"
        assert (tmp_path / name).read_bytes() == committed.read_bytes(), f"{name} differs from sample_traces/"
    committed_names = {p.name for p in SAMPLES.glob("*.json")} | {f"crews/{p.name}" for p in CREWS.iterdir()}
    assert committed_names == generated, f"stale files in sample_traces/: {committed_names - generated}"


def test_regenerate_writes_every_scenario_and_leaves_other_files_alone(tmp_path):
    keep = tmp_path / "README.md"
    keep.write_text("hand-written")

    def embed(texts):
        return [[1.0, 0.0] for _ in texts]

    written = regenerate(tmp_path, embedder=embed)
    assert {str(p.relative_to(tmp_path)) for p in written} == {
        f"{s}_{v}{ext}" for s, v in PAIRS for ext in (".json", ".truth.json")
    } | {f"crews/{s}_{v}{ext}" for s, v in PAIRS for ext in (".jsonl", ".truth.json")}
    assert keep.read_text() == "hand-written"


@pytest.mark.parametrize(("scenario", "variant"), PAIRS)
def test_sample_files_are_valid_otlp_json(scenario, variant):
    trace, truth = load(scenario, variant)
    spans = flat_spans(trace)
    assert spans
    for span in spans:
        assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"])
        assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"])
        assert re.fullmatch(r"[0-9a-f]{16}", span.get("parentSpanId", "0" * 16))
        assert isinstance(span["startTimeUnixNano"], str) and int(span["endTimeUnixNano"]) > int(
            span["startTimeUnixNano"]
        )
        assert span["kind"] == 1  # SPAN_KIND_INTERNAL as an integer enum
    # protobuf accepts it once ids are put back to the proto JSON (base64) form
    proto_json = json.loads(
        re.sub(
            r'"(traceId|spanId|parentSpanId)": "([0-9a-f]+)"',
            lambda m: f'"{m.group(1)}": "{base64.b64encode(bytes.fromhex(m.group(2))).decode()}"',
            json.dumps(trace),
        )
    )
    request = ParseDict(proto_json, ExportTraceServiceRequest())
    assert sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans) == len(spans)


@pytest.mark.parametrize(("scenario", "variant"), PAIRS)
def test_truth_counts_and_run_identity_match_the_spans(scenario, variant):
    trace, truth = load(scenario, variant)
    spans = flat_spans(trace)
    assert truth["scenario"] == scenario and truth["variant"] == variant
    assert truth["span_counts"]["total"] == len(spans)
    assert truth["span_counts"]["by_outcome"] == dict(
        Counter(s["attrs"].get("driftscope.outcome", "none") for s in spans)
    )
    reasons = Counter(
        s["attrs"]["driftscope.reject_reason"] for s in spans if "driftscope.reject_reason" in s["attrs"]
    )
    assert truth["span_counts"]["by_reject_reason"] == dict(reasons)
    assert sorted({s["traceId"] for s in spans}) == truth["trace_ids"]
    for span in spans:
        assert span["resource"] == {"service.name": "crew-sim"}
        assert span["attrs"]["gen_ai.conversation.id"] == truth["run_id"]
        assert span["attrs"]["driftscope.scenario"] == scenario
        assert span["attrs"]["driftscope.variant"] == variant
    # every span id the truth names is in the file
    ids = {s["spanId"] for s in spans}
    named = re.findall(r'"[a-z_]*span_ids?": (\[[^\]]*\]|"[0-9a-f]{16}")', json.dumps(truth))
    for chunk in named:
        for span_id in re.findall(r"[0-9a-f]{16}", chunk):
            assert span_id in ids, f"{span_id} named in truth is not in the trace"
    # every guard refusal is in `prevented`, and nothing is refused in an unguarded run
    rejected = {
        s["spanId"]: s["attrs"]["driftscope.reject_reason"]
        for s in spans
        if s["attrs"].get("driftscope.outcome") == "rejected"
    }
    assert rejected == {p["span_id"]: p["reason"] for p in truth["prevented"]}
    if variant == "unguarded":
        assert not rejected and not any("driftscope.guard" in s["attrs"] for s in spans)


def test_run_ids_are_unique_across_runs():
    run_ids = [load(s, v)[1]["run_id"] for s, v in PAIRS]
    assert len(set(run_ids)) == len(run_ids)


def by_id(scenario, variant):
    trace, truth = load(scenario, variant)
    return {s["spanId"]: s for s in flat_spans(trace)}, truth


def test_split_brain_unguarded_loses_the_researchers_update_and_guarded_keeps_it():
    spans, truth = by_id("split_brain", "unguarded")
    lost = {u["key"]: u for u in truth["lost_updates"]}
    assert set(lost) == {"report/q3/draft", "report/q3/status"}
    draft = lost["report/q3/draft"]
    assert spans[draft["clobbered_span_id"]]["attrs"]["gen_ai.agent.id"] == "researcher"
    assert spans[draft["clobbering_span_id"]]["attrs"]["gen_ai.agent.id"] == "writer"
    assert (
        spans[draft["clobbering_span_id"]]["attrs"]["driftscope.state.version"] == draft["clobbering_version"]
    )
    for read_id in truth["divergent_reads"][0]["read_span_ids"]:
        assert spans[read_id]["attrs"]["driftscope.state.version"] == draft["based_on_version"]
    final_reads = [
        s
        for s in spans.values()
        if s["attrs"].get("gen_ai.agent.id") == "critic" and s["name"] == "execute_tool get"
    ]
    assert "findings" not in final_reads[0]["attrs"]["gen_ai.tool.call.result"]
    forced = json.loads(
        spans[lost["report/q3/status"]["clobbering_span_id"]]["attrs"]["gen_ai.tool.call.arguments"]
    )
    assert forced["force"] is True

    spans, truth = by_id("split_brain", "guarded")
    assert truth["lost_updates"] == []
    final = [
        s
        for s in spans.values()
        if s["attrs"].get("gen_ai.agent.id") == "critic"
        and s["attrs"].get("driftscope.state.key") == "report/q3/draft"
    ]
    assert json.loads(final[0]["attrs"]["gen_ai.tool.call.result"])["value"]["sections"] == [
        "outline",
        "findings",
        "intro",
    ]


def test_constraint_drop_truth_points_at_the_hop_that_lost_c2():
    spans, truth = by_id("constraint_drop", "unguarded")
    (drop,) = truth["constraint_drops"]
    span = spans[drop["span_id"]]
    assert span["attrs"]["driftscope.hop"] == 2 == drop["hop"]
    context = json.loads(span["attrs"]["gen_ai.tool.call.arguments"])["context"]
    assert "[C1]" in context and "[C2]" not in context
    spans, truth = by_id("constraint_drop", "guarded")
    missing = [p for p in truth["prevented"] if p["reason"] == "missing_constraint"][0]
    assert missing["hop"] == 2 and missing["missing_constraints"] == ["C2"] and "hop 2" in missing["message"]
    assert "hop 2" in spans[missing["span_id"]]["attrs"]["gen_ai.tool.call.result"]
    ok_delegations = [
        s
        for s in spans.values()
        if s["attrs"].get("driftscope.op") == "delegate" and s["attrs"]["driftscope.outcome"] == "ok"
    ]
    for span in ok_delegations:
        accounted = set(span["attrs"]["driftscope.constraints.carried"]) | set(
            span["attrs"].get("driftscope.constraints.waived", [])
        )
        assert accounted == {"C1", "C2", "C3"}


def test_recursion_loop_members_share_one_normalised_signature():
    spans, truth = by_id("recursion_loop", "unguarded")
    (loop,) = truth["looped_calls"]
    signatures = {
        call_signature(loop["tool"], json.loads(spans[i]["attrs"]["gen_ai.tool.call.arguments"]))
        for i in loop["span_ids"]
    }
    assert signatures == {loop["signature"]}
    raw = {spans[i]["attrs"]["gen_ai.tool.call.arguments"] for i in loop["span_ids"]}
    assert len(raw) == loop["count"] == 5  # every attempt is typed differently
    assert all(spans[i]["attrs"]["driftscope.outcome"] == "error" for i in loop["span_ids"])


def test_ping_pong_alternates_between_two_agents():
    spans, truth = by_id("ping_pong", "unguarded")
    (bounce,) = truth["ping_pong"]
    receivers = [spans[i]["attrs"]["driftscope.delegate.to"] for i in bounce["span_ids"]]
    assert receivers == ["worker", "planner"] * 3


def test_context_drift_stale_send_used_the_superseded_version():
    spans, truth = by_id("context_drift", "unguarded")
    (send,) = truth["stale_policy_sends"]
    assert (
        spans[send["span_id"]]["attrs"]["driftscope.policy.version"]
        == send["policy_version"]
        != send["current_version"]
    )
    assert (
        spans[send["span_id"]]["startTimeUnixNano"]
        > spans[truth["stale_holders"][0]["supersede_span_id"]]["startTimeUnixNano"]
    )
    spans, truth = by_id("context_drift", "guarded")
    assert {h["agent"] for h in truth["stale_holders"]} == {"responder", "kb_writer"}
    supersede = spans[truth["stale_holders"][0]["supersede_span_id"]]
    assert sorted(supersede["attrs"]["driftscope.objective.stale_holders"]) == ["kb_writer", "responder"]


def test_duplicate_side_effect_spans_two_traces():
    spans, truth = by_id("duplicate_side_effect", "unguarded")
    (dup,) = truth["duplicate_side_effects"]
    assert len({spans[i]["traceId"] for i in dup["span_ids"]}) == 2
    assert len(truth["trace_ids"]) == 2


def test_same_seed_same_bytes_and_different_seed_different_ids():
    def embed(texts):
        return [[1.0, float(len(t) % 7)] for t in texts]

    first = json.dumps(spans_to_otlp_json(run_scenario("healthy", "guarded", embedder=embed)[1]))
    second = json.dumps(spans_to_otlp_json(run_scenario("healthy", "guarded", embedder=embed)[1]))
    other = json.dumps(spans_to_otlp_json(run_scenario("healthy", "guarded", seed=7, embedder=embed)[1]))
    assert first == second
    assert first != other


@pytest.mark.slow
def test_only_the_subtasks_the_truth_calls_drifted_are_past_the_threshold():
    from guards.embedding import SentenceTransformerEmbedder, cosine_distance

    embed = SentenceTransformerEmbedder()
    for scenario, variant in PAIRS:
        trace, truth = load(scenario, variant)
        drifted = {d["span_id"] for d in truth["drifted_subtasks"]}
        refused = {p["span_id"] for p in truth["prevented"] if p["reason"] == "goal_divergence"}
        for span in flat_spans(trace):
            a = span["attrs"]
            if a.get("driftscope.outcome") != "ok" and span["spanId"] not in refused:
                continue
            if "driftscope.goal.text" not in a or a.get("driftscope.hop") == 0:
                continue
            root, text = embed([a["driftscope.goal.root"], a["driftscope.goal.text"]])
            far = cosine_distance(root, text) > 0.45
            assert far == (span["spanId"] in drifted | refused), (
                scenario,
                variant,
                a["driftscope.goal.text"],
            )


def load_crew(scenario: str, variant: str) -> list[tuple[list[dict], dict]]:
    """The committed healthy runs of a scenario's crew: (spans, truth) per run."""
    lines = (CREWS / f"{scenario}_{variant}.jsonl").read_text().splitlines()
    truths = json.loads((CREWS / f"{scenario}_{variant}.truth.json").read_text())
    assert len(lines) == len(truths) == HEALTHY_RUNS
    return [(flat_spans(json.loads(line)), truth) for line, truth in zip(lines, truths, strict=True)]


@pytest.mark.parametrize(("scenario", "variant"), PAIRS)
def test_each_scenario_crew_has_healthy_runs_of_its_own(scenario, variant):
    """The crew's other runs: the same service and agents, before the failure run, none with a
    failure in its truth; the failure run's own files are unchanged by them."""
    failure_trace, failure_truth = load(scenario, variant)
    failure_spans = flat_spans(failure_trace)
    failure_start = min(int(s["startTimeUnixNano"]) for s in failure_spans)
    failure_agents = {s["attrs"]["gen_ai.agent.id"] for s in failure_spans if "gen_ai.agent.id" in s["attrs"]}
    crew_agents: set[str] = set()
    run_ids = set()
    for spans, truth in load_crew(scenario, variant):
        assert truth["scenario"] == scenario and truth["variant"] == variant
        assert truth["failure_injected"] is False and "-ok-" in truth["run_id"]
        assert truth["span_counts"]["total"] == len(spans)
        # a waiver is a reasoned choice the crew makes in every run, not a failure
        assert {k: truth[k] for k in TRUTH_CATEGORIES if truth[k] and k != "waivers"} == {}
        assert not any(s["attrs"].get("driftscope.outcome") in ("rejected", "error") for s in spans)
        for span in spans:
            assert span["resource"] == {"service.name": "crew-sim"}
            assert span["attrs"]["gen_ai.conversation.id"] == truth["run_id"]
            assert int(span["startTimeUnixNano"]) < failure_start
        crew_agents |= {s["attrs"]["gen_ai.agent.id"] for s in spans if "gen_ai.agent.id" in s["attrs"]}
        run_ids.add(truth["run_id"])
    assert failure_agents <= crew_agents
    assert len(run_ids) == HEALTHY_RUNS and failure_truth["run_id"] not in run_ids


def test_crew_runs_leave_the_failure_run_as_it_was():
    def embed(texts):
        return [[1.0, 0.0] for _ in texts]

    before = json.dumps(spans_to_otlp_json(run_scenario("ping_pong", "unguarded", embedder=embed)[1]))
    runs = crew_runs("ping_pong", "unguarded", 2, embedder=embed)
    after = json.dumps(spans_to_otlp_json(run_scenario("ping_pong", "unguarded", embedder=embed)[1]))
    assert before == after
    assert [run.truth["ping_pong"] for run, _ in runs] == [[], []]
    assert len({run.run_id for run, _ in runs}) == 2
