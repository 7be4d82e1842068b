"""Run comparison (issue 35): the crew baseline, differences per agent and tool, the first point
of departure, and the property that a run compared with itself has no differences."""

from __future__ import annotations

import random

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import compare, compare_logic
from analytics.compare import RunNotFoundError, compare_run
from tests.compare_crews import crew_rows, crew_steps
from tests.fixtures_analytics import insert_spans, make_span, new_db


def crew_db(failing_run: list | None = None, healthy: int = 3, searches=(1, 1, 2)):
    """A store with ``healthy`` healthy runs (h0, h1, ...) of crew ``crew`` and, when given, the
    steps of run ``bad``."""
    conn = new_db()
    rows = []
    for i in range(healthy):
        rows += crew_rows(
            f"h{i}", crew_steps(searches=searches[i % len(searches)], query=f"h{i}"), t0=100 * i
        )
    if failing_run is not None:
        rows += crew_rows("bad", failing_run, t0=1000)
    insert_spans(conn, rows)
    return conn


def spans_of(conn, run: str) -> list[str]:
    return [
        r[0]
        for r in conn.execute("SELECT SpanId FROM spans WHERE run_id = ? ORDER BY start_ns", [run]).fetchall()
    ]


def test_a_retry_loop_departs_at_its_first_failing_call_and_names_the_agent():
    conn = crew_db(crew_steps(searches=4, failing=3))
    answer = compare_run(conn, "bad")
    assert answer["baseline"]["mode"] == "healthy runs" and answer["baseline"]["runs"] == 3
    assert set(answer["baseline"]["run_ids"]) == {"h0", "h1", "h2"}
    departure = answer["departure"]
    ids = spans_of(conn, "bad")
    assert departure["pos"] == 3 and departure["span_id"] == ids[3]
    assert departure["agent"] == "researcher" and departure["tool"] == "web_search"
    assert departure["status"] == "error" and "researcher · web_search {query} (error)" == departure["step"]
    assert departure["expected"] == ["researcher · web_search {query}"]
    kinds = {(d["kind"], d["agent"], d["tool"]): d for d in answer["differences"]}
    more = kinds[("more", "researcher", "web_search")]
    assert more["calls"] == 4 and more["baseline"] == "1-2 (median 1)" and more["span_ids"] == ids[5:7]
    assert kinds[("errors", "researcher", "web_search")]["span_ids"] == ids[3:6]
    assert len(answer["differences"]) == 2


def test_more_repeats_than_any_healthy_run_depart_at_the_first_repeat_past_their_most():
    conn = crew_db(crew_steps(searches=3))
    answer = compare_run(conn, "bad")
    assert answer["departure"]["pos"] == 5 and answer["departure"]["span_id"] == spans_of(conn, "bad")[5]
    assert answer["departure"]["reason"].startswith("more repeats")
    assert answer["departure"]["expected"] == ["researcher · web_search {query} x2 at most"]
    assert answer["baseline"]["closest_run"] == "h2"  # the healthy run that searched twice


def test_a_hand_off_to_an_agent_no_healthy_run_uses_and_a_missing_step_are_named():
    conn = crew_db(crew_steps(delegate_to="writer", final=False))
    answer = compare_run(conn, "bad")
    ids = spans_of(conn, "bad")
    assert answer["departure"]["pos"] == 1 and answer["departure"]["tool"] == "delegate -> writer"
    by_kind = {}
    for diff in answer["differences"]:
        by_kind.setdefault(diff["kind"], []).append(diff)
    assert [d["span_ids"] for d in by_kind["new_delegation"]] == [[ids[1]]]
    assert "writer" in by_kind["new_delegation"][0]["detail"]
    missing = {(d["agent"], d["tool"] or d["operation"]) for d in by_kind["missing"]}
    assert ("manager", "final_answer") in missing and ("researcher", "web_search") in missing
    final = next(d for d in by_kind["missing"] if d["tool"] == "final_answer")
    closest = answer["baseline"]["closest_run"]
    assert final["span_ids"] == [] and final["baseline_span_ids"] == [spans_of(conn, closest)[-1]]


def test_a_run_like_its_healthy_runs_has_no_departure_and_no_difference():
    conn = crew_db(crew_steps(searches=2, query="other words"))
    answer = compare_run(conn, "bad")
    assert answer["departure"] is None and answer["differences"] == []
    assert {row["status"] for row in answer["alignment"]} == {"same"}


def test_a_crew_without_a_healthy_run_says_so_and_compares_with_a_chosen_run():
    conn = new_db()
    insert_spans(
        conn,
        crew_rows("bad", crew_steps(searches=5, vary=False), t0=0)
        + crew_rows("worse", crew_steps(searches=6, vary=False), t0=100),
    )
    # Five and six near-identical searches: repeated_calls makes both runs failing.
    answer = compare_run(conn, "bad")
    assert answer["baseline"]["runs"] == 0 and "no baseline" in answer["baseline"]["note"]
    assert answer["departure"] is None and answer["differences"] == []
    assert [c["run_id"] for c in answer["candidates"]] == ["worse"]
    chosen = compare_run(conn, "bad", baseline="worse")
    assert chosen["baseline"]["mode"] == "chosen run" and chosen["baseline"]["closest_run"] == "worse"
    assert chosen["departure"] is None  # five searches are covered by a run that made six
    assert [d["kind"] for d in chosen["differences"]] == ["fewer"]


def test_an_unknown_run_or_baseline_is_named():
    conn = crew_db()
    with pytest.raises(RunNotFoundError, match="no spans for run 'nope'"):
        compare_run(conn, "nope")
    with pytest.raises(RunNotFoundError, match="no spans for baseline run 'gone'"):
        compare_run(conn, "h0", baseline="gone")


def test_the_profile_summarises_the_healthy_runs_per_agent_and_tool_with_tokens():
    conn = crew_db(crew_steps())
    insert_spans(
        conn,
        [
            make_span(t=100 * i + 50, run=f"h{i}", ServiceName="crew", span_family="llm", agent_id="researcher",
                      operation="chat", attrs={"gen_ai.usage.input_tokens": 100 + i, "gen_ai.usage.output_tokens": 10,
                                               "gen_ai.usage.total_tokens": 999})
            for i in range(3)
        ],
    )  # fmt: skip
    profile = pd.DataFrame(compare_run(conn, "bad")["profile"])
    search = profile[(profile["agent"] == "researcher") & (profile["tool"] == "web_search")].iloc[0]
    assert (search["calls_min"], search["calls_max"], search["run_calls"]) == (1, 2, 1)
    assert search["arg_shapes"] == ["{query}"] and search["error_rate"] == 0
    chat = profile[(profile["agent"] == "researcher") & (profile["operation"] == "chat")].iloc[0]
    assert chat["tokens_median"] == 111  # input + output, the total left out
    assert chat["runs_with"] == 1.0 and pd.isna(chat["run_calls"])
    assert search["usual_order"] > profile.iloc[0]["usual_order"]  # the manager's agent span comes first


# --- the property: a run compared with itself -------------------------------------------------

AGENTS = ("a", "b", "c")
TOOLS = (None, "search", "write", "delegate")


@st.composite
def random_run(draw):
    """Steps of a run of any shape: agents, tools, argument shapes, repeats, failures."""
    n = draw(st.integers(min_value=1, max_value=25))
    steps = []
    for _ in range(n):
        agent = draw(st.sampled_from(AGENTS))
        tool = draw(st.sampled_from(TOOLS))
        args = draw(st.sampled_from([None, {"q": 1}, {"q": 1, "k": 2}])) if tool else None
        to = draw(st.sampled_from(AGENTS)) if tool == "delegate" else None
        failed = draw(st.booleans())
        steps += [(agent, "tool" if tool else "agent", tool, args, to, failed)] * draw(st.integers(1, 3))
    return steps


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_run())
def test_a_run_compared_with_itself_has_no_differences(steps):
    conn = new_db()
    insert_spans(conn, crew_rows("r", steps))
    answer = compare_run(conn, "r", baseline="r")
    assert answer["departure"] is None and answer["differences"] == []
    assert {row["status"] for row in answer["alignment"]} == {"same"}
    assert len(answer["alignment"]) == len(steps)
    profile = pd.DataFrame(answer["profile"])
    assert (profile["run_calls"] == profile["calls_min"]).all() and (
        profile["calls_min"] == profile["calls_max"]
    ).all()


def test_a_stored_run_compared_with_itself_has_no_differences():
    rng = random.Random(35)
    conn = crew_db()
    steps = [
        (rng.choice(AGENTS), "tool", rng.choice(TOOLS[1:]), {"q": rng.random()}, rng.choice(AGENTS), rng.random() < 0.3)
        for _ in range(40)
    ]  # fmt: skip
    insert_spans(conn, crew_rows("bad", steps, t0=1000))
    for run in ("bad", "h0", "h2"):
        answer = compare_run(conn, run, baseline=run)
        assert answer["departure"] is None and answer["differences"] == [], run


def test_blocks_and_departures_on_codes():
    runs = pd.Series([0, 0, 0, 1, 1]).to_numpy()
    codes = pd.Series([7, 7, 8, 7, 8]).to_numpy()
    blocks = compare_logic.to_blocks(runs, codes, pd.Series([0, 1, 2, 0, 1]).to_numpy())
    assert blocks.index.tolist() == [0, 1, 0, 1] and blocks.count.tolist() == [2, 1, 1, 1]
    target = compare_logic.to_blocks(
        pd.Series([0, 0, 0]).to_numpy(), pd.Series([7, 7, 9]).to_numpy(), pd.Series([0, 1, 2]).to_numpy()
    )
    stop_pos, _ = compare_logic.departures(target, blocks, 2)
    # Run 0 covers the two 7s and stops at the 9; run 1 took one 7 only: it stops at the second.
    assert stop_pos.tolist() == [2, 1]


def test_the_closest_run_is_the_one_doing_the_same_things_not_the_nearest_in_length():
    # Codes 0 crew, 1 agent, 2 call (ok), 3 call (error: the same subject as 2), 4 a guard check.
    subject_of = pd.Series([0, 1, 2, 2, 3]).to_numpy()
    target = pd.Series([0, 1, 3, 3, 3, 3]).to_numpy()
    plain = [0, 1, 2]  # the same calls, succeeding
    checked = [0, 1, 4, 2]  # a check before the call: a step the target never takes
    runs = pd.Series([0] * 3 + [1] * 4).to_numpy()
    codes = pd.Series(plain + checked).to_numpy()
    blocks = compare_logic.to_blocks(runs, codes, pd.Series([0, 1, 2, 0, 1, 2, 3]).to_numpy())
    lengths = pd.Series([3, 4]).to_numpy()
    both = pd.Series([0, 1]).to_numpy()
    # Both stop covering the target at its third step; the checked run is nearer in length.
    assert compare_logic.closest_run(blocks, both, subject_of, target, lengths, 6) == 0
    assert compare_logic.closest_run(blocks, both[1:], subject_of, target, lengths, 6) == 1
    # Alike in subjects (every code one subject): the nearest in length.
    assert compare_logic.closest_run(blocks, both, pd.Series([0] * 5).to_numpy(), target, lengths, 6) == 1


def _other_crew(run: str, t0: float) -> list[dict]:
    """A run of another crew of the same service: a triage agent hands a ticket to billing."""
    steps = [
        ("triage", "agent", None, None, None, False),
        ("triage", "tool", "delegate", {"ticket": "t"}, "billing", False),
        ("billing", "agent", None, None, None, False),
        ("billing", "tool", "refund", {"order": "o"}, None, False),
    ]
    return crew_rows(run, steps, t0=t0)


def test_the_baseline_is_the_healthy_runs_whose_agents_overlap_the_runs():
    conn = new_db()
    rows = []
    for i in range(3):
        rows += crew_rows(f"h{i}", crew_steps(query=f"h{i}"), t0=100 * i)
        rows += _other_crew(f"o{i}", t0=500 + 100 * i)
    rows += crew_rows("bad", crew_steps(searches=3, failing=2), t0=1000)
    insert_spans(conn, rows)
    answer = compare_run(conn, "bad")
    assert sorted(answer["baseline"]["run_ids"]) == ["h0", "h1", "h2"]  # not the triage crew's
    assert "3 of 6 healthy runs" in answer["baseline"]["crew"]
    assert answer["departure"]["agent"] == "researcher"
    other = compare_run(conn, "o0")  # the triage crew's run: its crew's two other runs
    assert sorted(other["baseline"]["run_ids"]) == ["o1", "o2"] and other["departure"] is None
    # a crew with no healthy run of its own: every healthy run of the service, said so
    insert_spans(conn, crew_rows("solo", [("auditor", "agent", None, None, None, False)], t0=2000))
    solo = compare_run(conn, "solo")
    # (run_summary finds nothing in run bad's two failed searches: it is healthy too)
    assert solo["baseline"]["runs"] == 7 and "every healthy run of the service" in solo["baseline"]["crew"]


def test_crew_overlap_is_jaccard_of_the_agent_sets():
    healthy = pd.DataFrame({"run_id": ["a", "b", "c"], "agents": [["x", "y"], ["x", "z", "w"], ["q"]]})
    close, note = compare.same_crew(healthy, {"x", "y", "z"})
    assert list(close["run_id"]) == ["a", "b"]  # 2/3 and 2/4; q shares nothing
    assert "2 of 3" in note
    assert compare.same_crew(healthy, set())[0] is healthy
