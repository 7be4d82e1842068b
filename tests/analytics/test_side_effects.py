"""duplicate_side_effects on framework tool calls: spans without driftscope.side_effect are side
effects by their tool name (analytics.side_effects), configurable with --side-effect-tools."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from analytics import run_metric
from analytics.side_effects import configure_side_effect_tools, current_side_effect_tools
from driftscope.settings import BY_NAME, ConfigError, resolve
from tests.fixtures_analytics import insert_spans, make_span, new_db
from tests.serve_helpers import new_serve

ARGS = {"recipient": "cfo@initech.example", "subject": "margin", "body": "11.8%"}


@pytest.fixture(autouse=True)
def default_pattern():
    configure_side_effect_tools(None)
    yield
    configure_side_effect_tools(None)


def _twice(tool: str, run: str | None = None, **fields) -> list[dict]:
    """Two identical, successful calls of ``tool`` by one agent, as a framework records them."""
    run = run or f"run-{tool}"
    return [
        make_span(t, run=run, agent_id="writer", tool_name=tool, tool_args=ARGS, **fields) for t in (0, 5)
    ]


def _found(rows: list[dict]) -> list[str]:
    conn = new_db()
    insert_spans(conn, rows)
    return sorted(run_metric(conn, "duplicate_side_effects")["tool_name"])


@pytest.mark.parametrize(
    "tool",
    [
        "send_report",
        "sendEmail",
        "create-ticket",
        "slack_post_message",
        "Book Flight",
        "refund_order",
        "deploy",
    ],
)
def test_a_side_effecting_tool_name_called_twice_is_a_duplicate(tool):
    assert _found(_twice(tool)) == [tool]


@pytest.mark.parametrize(
    "tool",
    ["web_search", "get_order", "search_email", "read_file", "list_tickets", "lookup", "fetchReport",
     "transfer_to_analyst", "final_answer", "compute_growth", "resend", "emails_count"],
)  # fmt: skip
def test_read_only_names_hand_offs_and_partial_words_are_not_side_effects(tool):
    assert _found(_twice(tool)) == []


def test_one_send_different_arguments_and_failed_calls_are_no_duplicate():
    once = [make_span(0, run="once", agent_id="w", tool_name="send_report", tool_args=ARGS)]
    other = dict(ARGS, body="12.1%")
    different = [
        make_span(0, run="diff", agent_id="w", tool_name="send_report", tool_args=ARGS),
        make_span(5, run="diff", agent_id="w", tool_name="send_report", tool_args=other),
    ]
    failed_then_ok = [
        make_span(0, run="retry", agent_id="w", tool_name="send_report", tool_args=ARGS, StatusCode="Error"),
        make_span(5, run="retry", agent_id="w", tool_name="send_report", tool_args=ARGS),
    ]
    assert _found(once + different + failed_then_ok) == []


def test_the_explicit_attribute_wins_both_ways():
    assert _found(_twice("send_report", side_effect=False)) == []
    assert _found(_twice("web_search", side_effect=True)) == ["web_search"]


def test_mcp_tool_annotations_decide_before_the_name():
    read_only = {"mcp.tool.annotations.readOnlyHint": "true"}
    writes = {"mcp.tool.annotations.readOnlyHint": "false"}
    destructive = {"tool.annotations.destructiveHint": "True"}
    rows = (
        _twice("send_report", attrs=read_only)  # a verb in the name, but annotated read-only
        + _twice("crm_sync", attrs=writes)  # no verb, annotated as writing
        + _twice("purge_cache", attrs=destructive)
        + _twice("web_search", attrs={"mcp.tool.annotations.destructiveHint": "false"})  # name decides
    )
    assert _found(rows) == ["crm_sync", "purge_cache"]
    # The explicit attribute still wins over an annotation.
    assert _found(_twice("crm_sync", attrs=writes, side_effect=False)) == []


def test_guard_state_writes_are_left_to_the_state_detectors():
    # A guarded shared-state write (driftscope op) is not inferred from its name.
    assert _found(_twice("state_write", op="write", state_key="k")) == []


def test_a_configured_pattern_replaces_the_default():
    rows = _twice("file_claim") + _twice("send_report") + _twice("routeUnit")
    assert _found(rows) == ["send_report"]
    configure_side_effect_tools(r"^(file_claim|route_unit)$")  # matched on the words too
    assert _found(rows) == ["file_claim", "routeUnit"]
    configure_side_effect_tools(None)
    assert _found(rows) == ["send_report"]


def test_run_summary_counts_inferred_duplicates_under_the_pattern_in_force(tmp_path):
    import duckdb

    from driftscope.database import migrate

    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))  # a file: run_summary keeps results
    migrate(conn)
    insert_spans(conn, _twice("send_report", run="r1"))
    first = run_metric(conn, "run_summary").set_index("run_id")
    assert first.loc["r1", "duplicate_side_effects_count"] == 1 and first.loc["r1", "verdict"] == "failing"
    configure_side_effect_tools("^nothing_matches$")
    second = run_metric(conn, "run_summary").set_index("run_id")
    assert second.loc["r1", "duplicate_side_effects_count"] == 0 and second.loc["r1", "verdict"] == "healthy"


def test_a_bad_pattern_is_a_clear_error():
    with pytest.raises(ValueError, match="not a valid RE2"):
        configure_side_effect_tools("send_(report")
    assert not current_side_effect_tools().configured  # the previous value stays in force
    with pytest.raises(ConfigError, match="--side-effect-tools.*regular expression"):
        resolve(BY_NAME["side_effect_tools"], "send_(report")
    # RE2 has no look-ahead: refused up front, not when the detector first runs.
    with pytest.raises(ConfigError):
        resolve(BY_NAME["side_effect_tools"], None, {"DRIFTSCOPE_SIDE_EFFECT_TOOLS": "^(?!get)"})


def test_serve_cli_refuses_a_bad_pattern(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "driftscope",
            "serve",
            "--db",
            str(tmp_path / "x.duckdb"),
            "--side-effect-tools",
            "a(",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        result.returncode != 0 and "--side-effect-tools" in result.stderr and "Traceback" not in result.stderr
    )


def _otlp_tool_calls(tool: str, run: str) -> dict:
    """Two OTLP/JSON GenAI tool-call spans of ``tool`` with the same arguments, no driftscope keys."""

    def span(i: int) -> dict:
        start = 1_700_000_000_000_000_000 + i * 1_000_000_000
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.arguments": json.dumps(ARGS),
            "gen_ai.conversation.id": run,
            "gen_ai.agent.name": "writer",
        }
        return {
            "traceId": f"{i + 1:032x}",
            "spanId": f"{i + 1:016x}",
            "name": f"execute_tool {tool}",
            "kind": 1,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 1_000_000),
            "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
        }

    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "crew"}}]}
    return {
        "resourceSpans": [
            {"resource": resource, "scopeSpans": [{"scope": {"name": "t"}, "spans": [span(0), span(1)]}]}
        ]
    }


def test_serve_applies_its_setting_to_the_read_api(tmp_path):
    serve = new_serve(tmp_path, extra_args=["--side-effect-tools", "^file_claim$"]).start()
    try:
        for tool, run in (("file_claim", "r-claim"), ("send_report", "r-send")):
            response = httpx.post(f"{serve.http_url}/v1/traces", json=_otlp_tool_calls(tool, run), timeout=30)
            assert response.status_code == 200, response.text
        assert serve.health()["side_effect_tools"] == "^file_claim$"
        for _ in range(100):  # the writer commits shortly after the request is answered
            found = httpx.get(f"{serve.http_url}/api/v1/metrics/duplicate_side_effects", timeout=30).json()
            if found.get("rows"):
                break
        rows = found["rows"]
        assert [(r["run_id"], r["tool_name"]) for r in rows] == [("r-claim", "file_claim")]
    finally:
        serve.stop()


def test_side_effects_whose_arguments_were_not_recorded_are_no_duplicate_by_arguments():
    # a framework's default telemetry (ADK, Agent Framework) records no tool arguments: two sends
    # are not known to be the same send
    conn = new_db()
    insert_spans(conn, [make_span(i, agent_id="mailer", tool_name="send_email") for i in range(2)])
    assert run_metric(conn, "duplicate_side_effects").empty
    conn = new_db()
    insert_spans(conn, [make_span(i, agent_id="mailer", tool_name="send_email", tool_args={"to": "a"})
                        for i in range(2)])  # fmt: skip
    assert len(run_metric(conn, "duplicate_side_effects")) == 1
