"""The batch mapping by plans (``collector.mapping_plans.map_columns``) against the reference
per-span mapper (``map_columns_per_span``: every source of the table asked for every span).

Every column must be identical, value and type, on every captured framework request in the
repo, the simulated crews, the benchmark generator's payloads, hand-made edge cases and random
attribute sets over every key the table reads. Plans are forced for every group of spans
(``MIN_PLAN_SPANS`` = 1) so that no span slips through the reference path unnoticed.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.generator import Shape, template_payloads
from collector import conventions, decode, mapping_plans, plan_source
from collector.decode import JSON, PROTOBUF, decode_payload
from collector.files import iter_file_requests
from collector.mapping_plans import map_columns, map_columns_per_span
from corpus.dump import request_bodies
from tests.otlp_builders import make_request

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
NOW = datetime(2026, 12, 5, 12, 0, 0)


def _captured(path: Path):
    for body, content_type in request_bodies(path):
        yield body, PROTOBUF if "protobuf" in content_type else JSON


def _requests() -> list[tuple[str, bytes, str]]:
    out = []
    for path in sorted((SAMPLES / "frameworks").glob("*/otlp.jsonl")):
        out += [(f"{path.parent.name}#{n}", body, kind) for n, (body, kind) in enumerate(_captured(path))]
    for path in sorted(SAMPLES.glob("*.json")) + sorted((SAMPLES / "crews").glob("*.jsonl")):
        if not path.name.endswith(".truth.json"):
            out += [(f"{path.name}#{n}", body, JSON) for n, (_, body) in enumerate(iter_file_requests(path))]
    for shape in (Shape(), Shape(calls_per_session=40, agents_per_run=3, depth=2, fanout=2)):
        payloads = template_payloads(1024, 11, 256, shape=shape)
        out += [(f"generator-{shape.label}#{n}", body, PROTOBUF) for n, body in enumerate(payloads)]
    return out


REQUESTS = _requests()


@pytest.fixture
def plans_for_every_group(monkeypatch):
    monkeypatch.setattr(mapping_plans, "MIN_PLAN_SPANS", 1)


def _assert_same_columns(got: dict, want: dict, where: str) -> None:
    assert list(got) == list(want) == list(conventions.COORDINATION_COLUMNS)
    for column in want:
        for row, (a, b) in enumerate(zip(got[column], want[column], strict=True)):
            assert type(a) is type(b) and a == b, f"{where}: {column} row {row}: {a!r} != reference {b!r}"


def test_the_corpus_covers_every_framework_and_the_generator():
    names = {name.split("#")[0] for name, _, _ in REQUESTS}
    frameworks = {p.parent.name for p in (SAMPLES / "frameworks").glob("*/otlp.jsonl")}
    assert len(frameworks) >= 13 and frameworks <= names
    assert {"generator-classic", "healthy_guarded.json"} <= names


@pytest.mark.usefixtures("plans_for_every_group")
@pytest.mark.parametrize("name,body,kind", REQUESTS, ids=[r[0] for r in REQUESTS])
def test_decoded_rows_equal_the_reference_mapping(name, body, kind, monkeypatch):
    """Every column of the decoded table (both decoders: the compiled one for protobuf, the
    Python one for JSON) equals the table decoded with the reference mapping."""
    fast = decode_payload(body, kind, now=NOW)
    monkeypatch.setattr(decode, "map_columns", map_columns_per_span)
    reference = decode_payload(body, kind, now=NOW)
    assert fast.accepted == reference.accepted and fast.accepted > 0
    for column in reference.table.column_names:
        assert fast.table.column(column).equals(reference.table.column(column)), f"{name}: {column}"


def test_decoders_hand_the_mapping_strings(monkeypatch):
    """The plans read attribute values as the decoders' string map: hold the decoders to it."""
    seen = []

    def spy(span_attributes, resource_attributes, *rest):
        seen.append(all(type(v) is str for v in [*span_attributes[2], *resource_attributes[2]]))
        return map_columns(span_attributes, resource_attributes, *rest)

    monkeypatch.setattr(decode, "map_columns", spy)
    for _, body, kind in REQUESTS[::7]:
        decode_payload(body, kind, now=NOW)
    assert seen and all(seen)


def _triple(rows: list[list[tuple[str, str]]]) -> tuple[list[int], list[str], list[str]]:
    offsets, keys, values = [0], [], []
    for pairs in rows:
        keys += [k for k, _ in pairs]
        values += [v for _, v in pairs]
        offsets.append(len(keys))
    return offsets, keys, values


def _map_both(spans: list[dict]) -> tuple[dict, dict]:
    """(plans, reference) for spans given as dicts of attrs / resource / name / scope / events."""
    args = (
        _triple(
            [
                list(s.get("attrs", {}).items()) if isinstance(s.get("attrs"), dict) else s["attrs"]
                for s in spans
            ]
        ),
        _triple([list(s.get("resource", {}).items()) for s in spans]),
        [s.get("name", "span") for s in spans],
        [s.get("scope", "tests") for s in spans],
        [f"{n:032x}" for n in range(len(spans))],
        [s.get("events", "[]") for s in spans],
    )
    return map_columns(*args), map_columns_per_span(*args)


@pytest.mark.usefixtures("plans_for_every_group")
def test_edge_cases_equal_the_reference():
    transfer = json.dumps([{"Name": "gen_ai.tool.message", "Attributes": {"content": '[{"text": "x"}]'}}])
    spans = [
        # a duplicate key: the last value wins, as in a dict
        {"attrs": [("driftscope.state.key", "a"), ("driftscope.state.key", "b"), ("driftscope.op", "write")]},
        {"attrs": [("gen_ai.operation.name", ""), ("driftscope.op", ""), ("driftscope.hop", "")]},
        {"attrs": {"driftscope.hop": " 7 ", "driftscope.step": "99999999999", "driftscope.budget.max_steps": "x"}},
        {"attrs": {"driftscope.hop": "٣", "driftscope.step": "-4", "driftscope.side_effect": "YES"}},
        {"attrs": {"driftscope.constraints.ledger": '["a","b"]', "driftscope.constraints.carried": '[",","]'}},
        {"attrs": {"driftscope.constraints.waived": '["a\\"b"]', "driftscope.waiver_reasons": "plain"}},
        {"attrs": {"gen_ai.operation.name": "invoke_agent"}, "resource": {"session.id": "from-resource"}},
        {"attrs": {"gen_ai.operation.name": "chat"}, "resource": {"gen_ai.conversation.id": "c", "session.id": "s"}},
        {"name": "handoff to analyst", "scope": conventions.SCOPE_OPENAI_AGENTS,
         "attrs": {"openinference.span.kind": "TOOL", "input.value": "manager", "output.value": "analyst"}},
        {"name": "CodeAgent.run", "scope": conventions.SCOPE_SMOLAGENTS,
         "attrs": {"openinference.span.kind": "AGENT", "input.value": "You're a helpful agent named 'scout'."}},
        {"name": "researcher.run", "scope": conventions.SCOPE_SMOLAGENTS, "attrs": {"openinference.span.kind": "agent"}},
        {"attrs": {"tool.name": "Delegate work to coworker", "input.value": '{"coworker": " Analyst "}',
                   "openinference.span.kind": "TOOL"}},
        {"attrs": {"gen_ai.tool.name": "transfer_to_agent", "gen_ai.tool.call.arguments": '{"agent_name": "b"}'}},
        {"attrs": {"gen_ai.tool.name": "researcher", "gen_ai.tool.type": "AgentTool"}},
        {"attrs": {"gen_ai.tool.call.arguments": '{"args": ["q"], "sanitize_inputs_outputs": true, "kwargs": {}}'}},
        {"attrs": {"gen_ai.operation.name": "execute_tool"}, "events": transfer},
        {"attrs": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": "u-1", "gen_ai.agent.name": "m"},
         "scope": conventions.SCOPE_AGENT_FRAMEWORK},
        {"attrs": {"traceloop.span.kind": "Tool", "traceloop.entity.name": "search", "traceloop.entity.input":
                   '{"input_str": "q", "tags": [], "metadata": {}, "inputs": {}, "kwargs": {}}'}},
        {"attrs": {"openinference.span.kind": "CHAIN",
                   "metadata": '{"langgraph_node": "n", "langgraph_checkpoint_ns": "researcher:1|agent:2"}'}},
        {"attrs": {}},
    ]  # fmt: skip
    plans, reference = _map_both(spans)
    _assert_same_columns(plans, reference, "edge cases")
    assert plans["state_key"][0] == "b" and plans["run_id"][6] == "from-resource"


@pytest.mark.usefixtures("plans_for_every_group")
def test_the_reference_path_serves_spans_without_a_plan(monkeypatch):
    monkeypatch.setattr(mapping_plans, "_compiled", {})
    monkeypatch.setattr(mapping_plans, "_by_keys", {})
    monkeypatch.setattr(mapping_plans, "MAX_PLANS", 1)
    spans = [{"attrs": {"driftscope.op": "read"}}, {"attrs": {"gen_ai.operation.name": "chat"}}] * 3
    plans, reference = _map_both(spans)
    _assert_same_columns(plans, reference, "one plan, the rest per span")
    assert len(mapping_plans._compiled) == 1


def test_a_signature_is_compiled_once_seen_on_enough_spans(monkeypatch):
    monkeypatch.setattr(mapping_plans, "_compiled", {})
    monkeypatch.setattr(mapping_plans, "_seen", {})
    monkeypatch.setattr(mapping_plans, "_by_keys", {})
    one = [{"attrs": {"driftscope.op": "read", "unrelated": str(n)}} for n in range(3)]
    _map_both(one)
    assert mapping_plans._compiled == {}
    _map_both(one * 3)  # 3 + 9 spans with the same read keys
    assert len(mapping_plans._compiled) == 1


def test_a_condition_on_the_scope_other_than_equality_is_refused():
    with pytest.raises(ValueError, match="compare scope only"):
        plan_source._scopes_compared({"odd": "scope.startswith(SCOPE_SMOLAGENTS)"})
    with pytest.raises(ValueError, match="compare scope only"):
        plan_source._scopes_compared({"odd": "scope == 'literal'"})


def test_a_decoded_request_is_mapped_by_its_plans():
    request = make_request([{"attrs": {"driftscope.op": "read", "driftscope.state.key": "k"}}] * 32)
    batch = decode_payload(request.SerializeToString(), PROTOBUF, now=NOW)
    signature = ("driftscope.op", "driftscope.state.key")
    assert (mapping_plans.OTHER_SCOPE, signature) in mapping_plans._compiled
    assert batch.columns["state_key"] == ["k"] * 32


_KEYS = sorted(mapping_plans.READ_KEYS) + ["other.key", "resource.only"]
_VALUES = st.sampled_from(
    [
        "", "0", "12", " 3", "x", "true", "no", "agent", "AGENT", "tool", "TOOL", "llm", "chat", "invoke_agent",
        "execute_tool", "Tool", "delegate", "transfer_to_agent", "AgentTool", "Delegate work to coworker",
        '["a","b"]', '["a"]', "[1, 2]", '{"agent_name": "z"}', '{"coworker": "w"}', '{"args": [], "kwargs": {}}',
        '{"langgraph_node": "n", "langgraph_checkpoint_ns": "r:1"}', "r:1|a:2", "__start__:1",
        '[{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]', "You're a helpful agent named 'q'",
    ]
)  # fmt: skip
_SPAN = st.fixed_dictionaries(
    {
        "attrs": st.lists(st.tuples(st.sampled_from(_KEYS), _VALUES), max_size=8),
        "resource": st.dictionaries(st.sampled_from(["session.id", "gen_ai.conversation.id", "k"]), _VALUES),
        "name": st.sampled_from(["span", "handoff to b", "CodeAgent.run", "a.run", ".run"]),
        "scope": st.sampled_from(sorted(mapping_plans.KNOWN_SCOPES) + ["tests", ""]),
        "events": st.sampled_from(
            [
                "[]",
                json.dumps([{"Name": "gen_ai.user.message", "Attributes": {"content": '[{"text": "t"}]'}}]),
                json.dumps([{"Name": "gen_ai.tool.message", "Attributes": {"content": "{}"}}]),
                '[{"Name": "gen_ai.tool.message"',
            ]
        ),
    }
)


@pytest.mark.usefixtures("plans_for_every_group")
@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(st.lists(_SPAN, min_size=1, max_size=12))
def test_random_attribute_sets_equal_the_reference(spans):
    plans, reference = _map_both(spans)
    _assert_same_columns(plans, reference, "random spans")


@pytest.mark.usefixtures("plans_for_every_group")
def test_without_the_compiled_loops_the_rows_are_the_same(monkeypatch):
    """A build without ``group_rows`` / ``copy_columns`` groups and copies in Python."""
    monkeypatch.setattr(mapping_plans, "_copy_columns_c", None)
    monkeypatch.setattr(mapping_plans, "_group_rows_c", None)
    for name, body, kind in REQUESTS[::5]:
        fast = decode_payload(body, kind, now=NOW)
        with monkeypatch.context() as patch:
            patch.setattr(decode, "map_columns", map_columns_per_span)
            reference = decode_payload(body, kind, now=NOW)
        assert fast.table.equals(reference.table), name


@pytest.mark.skipif(mapping_plans._group_rows_c is None, reason="the compiled decoder is not built")
def test_the_compiled_loops_refuse_offsets_outside_the_lists():
    group_rows, copy_columns = mapping_plans._group_rows_c, mapping_plans._copy_columns_c
    assert group_rows([0, 2, 2], ["a", "b"], ["s", "t"]) == {("s", ("a", "b")): [0], ("t", ()): [1]}
    for offsets in ([0, 3], [2, 1], [-1, 0]):
        with pytest.raises(ValueError):
            group_rows(offsets, ["a", "b"], None)
        with pytest.raises(ValueError):
            copy_columns(offsets, ["a", "b"], ["1", "2"], {"a": 0}, [[None]])
    with pytest.raises(ValueError):
        copy_columns([0, 1], ["a"], ["1"], {"a": 5}, [[None]])
    cols = [[None, None]]
    copy_columns([0, 2, 3], ["a", "a", "a"], ["1", "2", "3"], {"a": 0}, cols)
    assert cols == [["2", "3"]]


def test_only_small_key_tuples_are_remembered(monkeypatch):
    monkeypatch.setattr(mapping_plans, "_by_keys", {})
    small = [{"attrs": {"driftscope.op": "read", "k": "1"}}] * 8
    large = [{"attrs": {"driftscope.op": "read", "k" * 5000: "1"}}] * 8
    plans, reference = _map_both(small + large)
    _assert_same_columns(plans, reference, "small and large key tuples")
    assert [len(keys) for _, keys in mapping_plans._by_keys] == [2]


def test_a_rule_added_to_the_table_reaches_the_plans():
    """Plans are generated from the rules like the reference mapper: a new source is all it takes."""
    rules = tuple(
        conventions.Rule(
            rule.column, (conventions.Source("example", "example.agent"), *rule.sources), rule.kind
        )
        if rule.column == "agent_name"
        else rule
        for rule in conventions.RULES
    )
    namespace = dict(conventions._ENV, list_once=mapping_plans.list_once)
    exec(plan_source.generate_plan({"example.agent": 0}, rules=rules), namespace)  # noqa: S102
    cols = [[None] for _ in conventions.COORDINATION_COLUMNS]
    names, events, trace_ids = ["span"], ["[]"], ["t"]
    namespace["plan"](
        [0],
        [0, 1],
        ["example.agent"],
        ["scout"],
        names,
        events,
        trace_ids,
        lambda i, key: None,
        {},
        cols,
        (0,),
    )
    index = conventions._INDEX
    assert (cols[index["agent_name"]], cols[index["agent_id"]], cols[index["run_id"]]) == (
        ["scout"],
        ["scout"],
        ["t"],
    )
