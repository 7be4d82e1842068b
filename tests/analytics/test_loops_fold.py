"""repeated_calls' calls kept as state: a commit's tool calls are appended to their groups (not
the groups recomputed), and the state's components always equal a full recomputation's."""

from __future__ import annotations

import dataclasses
import math
import random
from datetime import timedelta

import pandas as pd
import pytest

from analytics import loops, loops_fold, materialize, run_metric
from analytics.loop_similarity import signature
from analytics.registry import compute_metric
from tests import tiers
from tests.analytics.test_materialize import _canonical, _commit, _loop_batch, _store
from tests.analytics.test_materialize import _pass as _pass_of
from tests.analytics.test_summary import _random_batch
from tests.fixtures_analytics import BASE_TIME, make_span, trace_id

TASKS = ["Find the Contoso employee count for 2023", "Contoso employee count 2023",
         "Summarise the Fabrikam annual report"]  # fmt: skip
QUERIES = ["alpha beta gamma", "alpha  beta gamma", "alpha beta gamma delta", "weather in paris", "zeta"]


def _pass(conn) -> materialize.PassReport:
    """A pass over repeated_calls and what it reads (the loop groups, the kept calls): what these
    tests hold; the other results' tables are held by tests/analytics/test_materialize.py."""
    return _pass_of(conn, ["repeated_calls"])


def _tool_calls(rng: random.Random, start: float, runs: list[str], count: int) -> list[dict]:
    """``count`` tool calls after ``start`` (seconds), repeated and re-worded, in ``runs``."""
    rows = []
    for number in range(count):
        run = rng.choice(runs)
        if rng.random() < 0.3:  # a manager handing (re-worded) tasks to a worker
            rows.append(
                make_span(
                    start + number * 0.5,
                    run=run,
                    TraceId=trace_id(f"{run}/m"),
                    agent_id="m",
                    op="delegate",
                    delegate_to="w",
                    goal_text=rng.choice(TASKS),
                    ingested_at=BASE_TIME + timedelta(seconds=start),
                )  # fmt: skip
            )
            continue
        call = {"tool_name": rng.choice(["search", "fetch"]), "tool_args": {"q": rng.choice(QUERIES)},
                "outcome": rng.choice(["ok", "error"])}  # fmt: skip
        if rng.random() < 0.15:  # arguments not captured: matched on the error (a group without a tail)
            call = {"tool_name": "probe", "outcome": "error", "StatusMessage": "TimeoutError: timed out"}
        rows.append(
            make_span(
                start + number * 0.5 + rng.random() * 0.1,
                run=run,
                TraceId=trace_id(f"{run}/{rng.randint(0, 2)}"),
                agent_id=rng.choice(["a", "b"]),
                ingested_at=BASE_TIME + timedelta(seconds=start),
                **call,
            )
        )
    return rows


def _components(frame: pd.DataFrame) -> dict[frozenset, float | None]:
    """The state's components as sets of calls, each with the lowest similarity of its links."""
    members: dict[int, set] = {}
    lows: dict[int, float] = {}
    for comp, trace, span, tool, args, low in zip(
        frame["comp"], frame["TraceId"], frame["SpanId"], frame["tool_name"], frame["args"],
        frame["min_similarity"], strict=True,
    ):  # fmt: skip
        members.setdefault(int(comp), set()).add((trace, span, tool, args))
        if low is not None and not (isinstance(low, float) and math.isnan(low)):
            lows[int(comp)] = min(lows.get(int(comp), 1.0), round(float(low), 9))
    return {frozenset(calls): lows.get(comp) for comp, calls in members.items()}


def _assert_state_equals_full(conn) -> None:
    kept = conn.sql(f"SELECT * FROM {loops_fold.TABLE}").df()
    full = loops_fold.calls_of(conn, None, 0)
    assert _components(kept) == _components(full)
    by_call = dict(zip(full["SpanId"] + full["args"], full["norm_args"], strict=True))
    assert dict(zip(kept["SpanId"] + kept["args"], kept["norm_args"], strict=True)) == by_call
    pd.testing.assert_frame_equal(
        _canonical(run_metric(conn, "repeated_calls")), _canonical(compute_metric(conn, "repeated_calls"))
    )


def _fold_now(conn) -> loops_fold.Fold:
    """What the next pass would fold (computed, not written)."""
    state = materialize.ready(conn, loops_fold.CALLS)
    cursor = conn.cursor()
    try:
        return loops_fold.compute(
            cursor, "span", materialize.span_changes(cursor, state.seq, materialize.newest_change(conn))
        )
    finally:
        cursor.close()


def test_tool_calls_after_their_groups_are_appended_not_recomputed(tmp_path):
    rng = random.Random(3)
    conn = _store(tmp_path)
    runs = ["run-1", "run-2", "run-3"]
    _commit(conn, _tool_calls(rng, 0, runs, 40))
    assert not _pass(conn).failed
    _assert_state_equals_full(conn)
    loops_before = len(run_metric(conn, "repeated_calls"))
    for round_ in range(1, 4):
        _commit(conn, _tool_calls(rng, 100 * round_, runs, 30))
        fold = _fold_now(conn)
        assert fold.replace == set(), "every group took its new calls: none is recomputed"
        assert fold.appended > 0 and len(fold.rows) == 30
        assert "delegation" in set(fold.rows["source"])
        assert not _pass(conn).failed
        _assert_state_equals_full(conn)
    assert len(run_metric(conn, "repeated_calls")) > loops_before  # the appended calls made loops


def test_calls_that_cannot_be_appended_recompute_only_their_groups(tmp_path):
    rng = random.Random(4)
    conn = _store(tmp_path)
    there = make_span(90, run="run-3", TraceId=trace_id("run-3/0"), agent_id="a", op="delegate",
                      delegate_to="b", goal_text="compile the report")  # fmt: skip
    _commit(conn, _tool_calls(rng, 100, ["run-1", "run-2"], 30) + [there])
    assert not _pass(conn).failed
    # a call before its group's last one; a hand-off back (a ping-pong: neither is a call now)
    late = make_span(50, run="run-1", TraceId=trace_id("run-1/0"), agent_id="a", tool_name="search",
                     tool_args={"q": "alpha beta gamma"})  # fmt: skip
    back = make_span(200, run="run-3", TraceId=trace_id("run-3/0"), agent_id="b", op="delegate",
                     delegate_to="a", goal_text="compile the report again")  # fmt: skip
    # appended: a delegation with its own task, a tool call after its group's calls
    handoff = make_span(200, run="run-2", TraceId=trace_id("run-2/0"), agent_id="a", op="delegate",
                        delegate_to="b", goal_text="compile the report")  # fmt: skip
    after = make_span(300, run="run-2", TraceId=trace_id("run-2/1"), agent_id="b", tool_name="fetch",
                      tool_args={"q": "zeta"})  # fmt: skip
    _commit(conn, [late, back, handoff, after])
    fold = _fold_now(conn)
    sep = materialize.RUN_TOOL_SEP
    assert fold.replace == {f"run-1{sep}search", f"run-3{sep}a", f"run-3{sep}b"}
    assert fold.appended == 2 and {handoff["SpanId"], after["SpanId"]} <= set(fold.rows["SpanId"])
    # the late call's group holds tool calls alone: relinked from its kept calls, not its spans
    assert fold.relinked == {f"run-1{sep}search"}
    relinked = fold.rows[fold.rows["run_id"] + sep + fold.rows["tool_name"] == f"run-1{sep}search"]
    assert late["SpanId"] in set(relinked["SpanId"])
    assert (
        len(relinked)
        == conn.execute(
            "SELECT count(*) FROM spans WHERE run_id = 'run-1' AND tool_name = 'search'"
        ).fetchone()[0]
    )
    report = _pass(conn)
    assert not report.failed
    # the pass says what its fold did (serve's health sums it: findings.counts_by_result)
    assert report.counts[loops_fold.CALLS] == {
        "groups_appended": 2,
        "groups_relinked": 1,
        "groups_from_spans": 2,
        "calls_written": len(fold.rows),
    }
    _assert_state_equals_full(conn)


def test_a_call_before_its_groups_last_relinks_the_group_in_time_order(tmp_path):
    """A late call pushes the call NEIGHBOUR_WINDOW places before each of the calls after it out
    of their windows: two similar calls four calls apart are linked, and one more call between
    them (arriving late) splits them, as a full recomputation does."""
    conn = _store(tmp_path)
    sep = materialize.RUN_TOOL_SEP

    def call(at: float, query: str) -> dict:
        return make_span(at, run="run-1", TraceId=trace_id("run-1/0"), agent_id="a", tool_name="search",
                         tool_args={"q": query})  # fmt: skip

    first, last = call(1, "alpha beta gamma delta"), call(5, "alpha beta gamma delta epsilon")
    between = [call(2, "weather in paris"), call(3, "zeta eta"), call(4, "theta iota kappa")]
    assert loops.NEIGHBOUR_WINDOW == 4
    _commit(conn, [first, *between, last])
    assert not _pass(conn).failed
    comps = lambda: dict(conn.execute(f"SELECT SpanId, comp FROM {loops_fold.TABLE}").fetchall())  # noqa: E731
    assert comps()[first["SpanId"]] == comps()[last["SpanId"]]  # within the last call's window
    _commit(conn, [call(4.5, "lambda mu")])
    fold = _fold_now(conn)
    assert fold.relinked == {f"run-1{sep}search"}
    assert not _pass(conn).failed
    assert comps()[first["SpanId"]] != comps()[last["SpanId"]]  # four calls between them now
    _assert_state_equals_full(conn)


@pytest.mark.parametrize("seed", range(12))
def test_linking_a_groups_calls_column_wise_equals_linking_them_one_by_one(seed):
    """A relink (``_relink``) links a key's calls column-wise (``link_tool_calls``): the same
    components and lowest link similarities as the fold's call-by-call ``_link``, over groups of
    several agents and tools, calls matched on errors and outputs, repeated, re-worded and
    unrelated arguments, and arguments with no token to compare (stop words only)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "paris", "weather", "report", "2023", "the", "of"]
    rows = []
    for number in range(rng.randint(0, 300)):
        basis = rng.choice(["arguments"] * 6 + ["error", "output"])
        if basis == "arguments":
            args = " ".join(rng.choice(words) for _ in range(rng.randint(0, 5)))
            args = rng.choice([args, args, "the of", ""]) if rng.random() < 0.1 else args
        else:
            args = rng.choice(["TimeoutError: timed out", "no such file", "done done done done done"])
        rows.append({
            "run_id": rng.choice(["r1", "r2"]), "agent": rng.choice(["", "a", "b"]),
            "tool_name": rng.choice(["search", "fetch"]), "start_ns": number, "SpanId": f"{number:016x}",
            "basis": basis, "args": args, "norm_args": signature(args), "source": "tool",
        })  # fmt: skip
    calls = pd.DataFrame(rows, columns=["run_id", "agent", "tool_name", "start_ns", "SpanId", "basis",
                                        "args", "norm_args", "source"])  # fmt: skip
    calls = calls.sort_values(["run_id", "agent", "tool_name", "start_ns", "SpanId"]).reset_index(drop=True)
    threshold = rng.choice([0.5, 0.6, 0.75])
    links = loops_fold._Links(0)
    loops_fold._link(links, calls, {}, {}, threshold)
    roots, lows = loops_fold.link_tool_calls(calls, threshold)
    assert roots.tolist() == [links.find(c) for c in range(len(calls))]
    expected = [links.low(c) for c in range(len(calls))]
    assert [None if math.isnan(x) else x for x in lows.tolist()] == [
        None if math.isnan(x) else x for x in expected
    ]


def test_a_walk_recomputes_the_groups_it_moves_a_span_out_of_only_once_that_span_was_folded(tmp_path):
    """A parent arriving after its children (as exporters send them) changes the children (their
    agent here): the writer logs the groups they leave. A child stored since the kept calls'
    mark was never folded, so nothing of it is in those groups: they are not recomputed (whole
    runs read at 100,000 calls a run). A child folded before counts."""
    conn = _store(tmp_path)
    sep = materialize.RUN_TOOL_SEP
    _commit(conn, _tool_calls(random.Random(5), 0, ["run-1", "run-2"], 20))
    assert not _pass(conn).failed

    def family(t: float, trace: str) -> tuple[dict, list[dict]]:
        parent = make_span(
            t, run="run-1", TraceId=trace_id(trace), agent_id="planner", SpanName="invoke_agent"
        )
        children = [
            make_span(
                t + 1 + i,
                run="run-1",
                TraceId=trace_id(trace),
                ParentSpanId=parent["SpanId"],
                tool_name="lookup",
                tool_args={"q": f"alpha beta {i}"},
            )  # fmt: skip
            for i in range(3)
        ]
        return parent, children

    parent, children = family(500, "run-1/late")
    _commit(conn, children)  # not folded yet: no pass between the two commits
    _commit(conn, [parent])
    assert conn.execute("SELECT count(*) FROM change_partitions WHERE partition = 'run_tool'").fetchone()[0]
    fold = _fold_now(conn)
    assert fold.replace == set(), "the children left groups that never held them"
    assert not _pass(conn).failed
    _assert_state_equals_full(conn)
    kept = conn.execute(f"SELECT agent FROM {loops_fold.TABLE} WHERE tool_name = 'lookup'").fetchall()
    assert kept == [("planner",)] * 3

    parent, children = family(600, "run-1/folded")
    _commit(conn, children)
    assert not _pass(conn).failed  # folded with no agent
    _commit(conn, [parent])
    assert f"run-1{sep}lookup" in _fold_now(conn).replace
    assert not _pass(conn).failed
    _assert_state_equals_full(conn)


def test_hand_offs_between_agents_that_already_bounced_recompute_nothing(tmp_path):
    """Agents that delegate to each other: their hand-offs are no calls (a ping-pong's). The
    first hand-off back turns the other way's calls into none (their groups recomputed); once
    both ways were folded, more hand-offs either way change no group (in a crew whose agents
    delegate to each other, every turn of it)."""
    conn = _store(tmp_path)
    sep = materialize.RUN_TOOL_SEP
    _commit(conn, _tool_calls(random.Random(6), 0, ["run-1"], 10))

    def handoff(t: float, source: str, target: str, task: str) -> dict:
        return make_span(t, run="run-2", TraceId=trace_id(f"run-2/{t}"), agent_id=source, op="delegate",
                         delegate_to=target, goal_text=task)  # fmt: skip

    _commit(conn, [handoff(10 + i, "m", "w", "compile the report") for i in range(3)])
    assert not _pass(conn).failed
    assert len(conn.execute(f"SELECT * FROM {loops_fold.TABLE} WHERE run_id = 'run-2'").fetchall()) == 3
    _commit(conn, [handoff(20, "w", "m", "check the figures")])  # the first hand-off back
    assert _fold_now(conn).replace == {f"run-2{sep}m", f"run-2{sep}w"}
    assert not _pass(conn).failed
    _assert_state_equals_full(conn)
    assert not conn.execute(f"SELECT * FROM {loops_fold.TABLE} WHERE run_id = 'run-2'").fetchall()
    for turn in range(3):  # both ways folded: nothing to recompute
        _commit(
            conn,
            [
                handoff(30 + 2 * turn, "m", "w", "compile the report"),
                handoff(31 + 2 * turn, "w", "m", "again"),
            ],
        )
        assert _fold_now(conn).replace == set()
        assert not _pass(conn).failed
        _assert_state_equals_full(conn)


@pytest.mark.parametrize("seed", [0, 1, pytest.param(2, marks=pytest.mark.deep)])
def test_the_kept_calls_equal_a_full_recomputation_after_every_batch(tmp_path, seed):
    """Tool calls in and out of time order, delegations, agent invocations, code actions and
    the detectors' other spans, in random batches, and tool calls without an agent whose agent's
    span comes a batch or two later (as exporters send parents after children): after each pass
    the components are a full recomputation's, and some passes appended calls and some relinked
    groups."""
    rng = random.Random(seed)
    conn = _store(tmp_path)
    runs = [f"run-{i}" for i in range(3)]
    appended = relinked = 0
    waiting: list[tuple[int, dict]] = []  # (batch it comes in, parent span)
    for batch in range(tiers.batches(full=8, quick=4)):
        rows = _tool_calls(rng, 60 * batch + rng.choice([0, 0, -90]), runs, rng.randint(5, 25))
        rows += [parent for due, parent in waiting if due == batch]
        waiting = [(due, parent) for due, parent in waiting if due != batch]
        # an agent's tool calls now, its own span later (or never: calls of no agent, which
        # repeat into loops of their own)
        for _ in range(rng.randint(1, 2)):
            run, at = rng.choice(runs), 60 * batch + rng.random() * 30
            trace = trace_id(f"{run}/late-{batch}-{len(waiting)}")
            parent = make_span(at, run=run, TraceId=trace, agent_id=rng.choice(["a", "b", "p"]),
                               SpanName="invoke_agent", ingested_at=BASE_TIME + timedelta(seconds=60 * batch))  # fmt: skip
            rows += [
                make_span(
                    at + 0.1 + i,
                    run=run,
                    TraceId=trace,
                    ParentSpanId=parent["SpanId"],
                    tool_name=rng.choice(["search", "fetch"]),
                    tool_args={"q": rng.choice(QUERIES[:3])},
                    ingested_at=BASE_TIME + timedelta(seconds=60 * batch),
                )  # fmt: skip
                for i in range(rng.randint(1, 4))
            ]
            waiting.append((batch + rng.choice([1, 2, 99]), parent))
        _commit(conn, rows + _loop_batch(rng, batch, runs) + _random_batch(rng, batch, runs))
        if materialize.ready(conn, loops_fold.CALLS) is not None:
            fold = _fold_now(conn)
            appended, relinked = appended + fold.appended, relinked + len(fold.relinked)
        assert not _pass(conn).failed
        _assert_state_equals_full(conn)
    assert appended > 0 and relinked > 0
    # loops of calls no agent made were found (and kept: their rows say no agent)
    assert run_metric(conn, "repeated_calls")["agent"].isna().any()


def test_a_first_build_in_run_chunks_keeps_every_call_once(tmp_path, monkeypatch):
    """A first build goes run chunk by run chunk (each part written before the next is
    computed): the state is a full recomputation's, each call once, component ids unique across
    the parts; and appending to it afterwards still holds."""
    rng = random.Random(7)
    conn = _store(tmp_path)
    runs = [f"run-{i}" for i in range(6)]
    _commit(conn, _tool_calls(rng, 0, runs, 80) + _loop_batch(rng, 0, runs) + _random_batch(rng, 0, runs))
    monkeypatch.setattr(loops_fold, "BUILD_CHUNK_SPANS", 12)
    assert len(loops_fold._build_chunks(conn)) >= 4
    parts = []
    real_build = loops_fold.build

    def counted(cursor, upto=None):
        for part in real_build(cursor, upto):
            parts.append(part.rows.num_rows)
            yield part

    item = materialize._items[loops_fold.CALLS]
    monkeypatch.setitem(materialize._items, loops_fold.CALLS, dataclasses.replace(item, build=counted))
    assert not _pass(conn).failed
    assert len(parts) >= 4 and all(parts)
    kept = conn.sql(f"SELECT TraceId, SpanId, comp, run_id FROM {loops_fold.TABLE}").df()
    assert not kept.duplicated(["TraceId", "SpanId"]).any()
    assert kept.groupby("comp")["run_id"].nunique().max() == 1  # no id shared by two chunks
    _assert_state_equals_full(conn)
    _commit(conn, _tool_calls(rng, 100, runs, 30))
    assert not _pass(conn).failed
    _assert_state_equals_full(conn)
