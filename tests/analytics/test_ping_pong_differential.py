"""ping_pong against its previous SQL on random span sets, and the cost it must not pay again.

The previous statement (tests/reference_sql/ping_pong_v1.sql) grouped every hand-off of a run
that passed the busy-pair prefilter into a bounce of its own, with span lists, before dropping
the bounces shorter than four: at 1M spans of depth-3 crews (every run passes the prefilter, no
bounce anywhere) that was ~2.2 of its 2.3 CPU-s. The statement now groups only the hand-offs that
reverse one or are reversed (or, through a manager, go back to the agent two before, and the two
before those); the answers must be the previous statement's, row for row and type for type.
Since then a run is ordered only when a pair's hand-offs both ways (a manager's to two agents)
overlap in time: depth-3 crews hand off both ways in separate stretches, and their two window
sorts were most of what was left; the tests at the end hold that prefilter to the previous
statement where stretches touch, at a single shared start time.
"""

from __future__ import annotations

import json
import pathlib
import random
import tempfile

import duckdb
import pandas as pd
import pytest

from analytics import Filters, Window, run_metric
from analytics.loops import MIN_PING_PONG_DELEGATIONS, MIN_PING_PONG_INFERRED
from analytics.sql_loader import (
    expand_fragments,
    filter_params,
    load_sql,
    mentioned_params,
    prune_unset_filters,
    query_df,
)
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, new_db

OLD_SQL = expand_fragments(
    (pathlib.Path(__file__).resolve().parents[1] / "reference_sql" / "ping_pong_v1.sql").read_text()
)
_TASKS = ["Compute the 2024 growth", "Find the 2023 revenue", "Review the pricing page", "Draft the email"]
_SORT = ["run_id", "source", "via", "first_seen", "span_text"]


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in a total order (the detector orders by first_seen only)."""
    keyed = frame.assign(span_text=frame["span_ids"].map(lambda ids: ",".join(ids)))
    return keyed.sort_values(_SORT, na_position="first").drop(columns="span_text").reset_index(drop=True)


def old_ping_pong(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    params = filter_params(window, filters)
    params.update(min_delegations=MIN_PING_PONG_DELEGATIONS, min_inferred=MIN_PING_PONG_INFERRED)
    return query_df(conn, OLD_SQL, params)


def _pair_sequence(rng: random.Random, n: int) -> list[tuple[str | None, str | None]]:
    """Hand-offs of one run: stretches of a direct bounce, of a manager alternating two agents,
    one-way hand-offs and noise (no agent, to itself)."""
    out: list[tuple[str | None, str | None]] = []
    while len(out) < n:
        kind = rng.choice(["direct", "direct", "manager", "manager", "oneway", "noise"])
        length = rng.randint(1, 7)
        a, b = rng.sample(["a", "b", "c"], 2)
        for i in range(length):
            if kind == "direct":
                out.append((a, b) if i % 2 == 0 else (b, a))
            elif kind == "manager":
                out.append(("m", a if i % 2 == 0 else b))
            elif kind == "oneway":
                out.append((a, b))
            else:
                out.append(rng.choice([(None, a), (a, None), (a, a), ("m", rng.choice("abc"))]))
    return out[:n]


def _explicit_run(rng: random.Random, run: str | None, t0: float) -> list[dict]:
    rows = []
    t = t0
    tasks = rng.sample(_TASKS, 2)
    for src, dst in _pair_sequence(rng, rng.randint(3, 30)):
        t += rng.choice([0.0, 0.1, 0.5, 1.0])  # equal start times: the span id orders them
        task = rng.choice(tasks) if rng.random() < 0.8 else rng.choice(_TASKS)
        text = rng.choice(["goal", "goal", "args", "input", None])
        fields = {
            "goal": dict(goal_text=task),
            "args": dict(tool_args=json.dumps({"task": task})),
            "input": dict(input_text=task),
            None: {},
        }[text]
        outcome = "rejected" if rng.random() < 0.08 else rng.choice(["ok", None])
        rows.append(
            make_span(
                t, run=run or "none", op="delegate", agent_id=src, delegate_to=dst, outcome=outcome, **fields
            )
        )
        if run is None:
            rows[-1]["run_id"] = None
    return rows


def _agent_run(rng: random.Random, run: str, t0: float, nested: bool) -> list[dict]:
    """Agent spans: each inside the one before it (nested hand-offs) or one after another
    (hand-offs inferred from changes of agent)."""
    rows = [make_span(t0, run=run, agent_id="m", span_family="agent", SpanName="invoke_agent m")]
    t = t0
    for src, dst in _pair_sequence(rng, rng.randint(3, 24)):
        t += rng.choice([0.0, 0.5, 1.0])
        who = dst or src or "m"
        parent = rows[-1]["SpanId"] if nested and rng.random() < 0.9 else ""
        family = rng.choice(["agent", "agent", "agent", None])  # or an invoke_agent span of no family
        rows.append(
            make_span(t, run=run, agent_id=who, span_family=family, operation="invoke_agent",
                      SpanName=f"invoke_agent {who}", ParentSpanId=parent, input_text=rng.choice(_TASKS))
        )  # fmt: skip
    return rows


def _random_spans(rng: random.Random) -> list[dict]:
    rows = []
    for r in range(rng.randint(4, 10)):
        run = f"run-{r}"
        kind = rng.choice(["explicit", "explicit", "nested", "inferred", "mixed", "none"])
        t0 = rng.random() * 100
        if kind == "explicit":
            rows += _explicit_run(rng, run, t0)
        elif kind == "none":
            rows += _explicit_run(rng, None, t0)
        elif kind == "mixed":  # delegate spans come first, then nested ones
            rows += _agent_run(rng, run, t0, nested=True) + _explicit_run(rng, run, t0)
        else:
            rows += _agent_run(rng, run, t0, nested=kind == "nested")
    return rows


def _seeds(count: int, fast: int = 6) -> list:
    return [s if s < fast else pytest.param(s, marks=pytest.mark.deep) for s in range(count)]


@pytest.mark.parametrize("seed", _seeds(30))  # make test: 6 seeds (~2 s each); test-deep: 30
def test_ping_pong_equals_the_previous_statement_on_random_span_sets(seed):
    rng = random.Random(seed)
    conn = new_db()
    insert_spans(conn, _random_spans(rng))
    scopes = [
        (Window(), Filters()),
        (Window(), Filters(agent=rng.choice(["a", "b", "m"]))),
        (Window(), Filters(run=f"run-{rng.randint(0, 3)}")),
        (Window(since=BASE_TIME + pd.Timedelta(seconds=rng.random() * 100)), Filters()),
    ]
    for window, filters in scopes:
        new = run_metric(conn, "ping_pong", window, filters)
        old = old_ping_pong(conn, window, filters)
        pd.testing.assert_frame_equal(_sorted(new), _sorted(old))
        assert list(new["first_seen"]) == sorted(new["first_seen"])


def test_random_span_sets_have_bounces_of_every_kind():
    # Otherwise the equality above would compare empty frames for some kind.
    kinds = set()
    for seed in range(12):
        conn = new_db()
        insert_spans(conn, _random_spans(random.Random(seed)))
        found = run_metric(conn, "ping_pong")
        kinds |= {(source, via is None) for source, via in zip(found["source"], found["via"], strict=True)}
        kinds |= {("null run", True) for run in found["run_id"] if pd.isna(run)}
    assert {("driftscope", True), ("driftscope", False), ("nested", True), ("nested", False),
            ("inferred", True), ("null run", True)} <= kinds  # fmt: skip


_GROUP_BYS = ("HASH_GROUP_BY", "PERFECT_HASH_GROUP_BY")


def _largest_group_by(
    conn: duckdb.DuckDBPyConnection, sql: str, params: dict, operators: tuple[str, ...] = _GROUP_BYS
) -> int:
    """Rows out of the statement's largest hash aggregate, or of its largest of ``operators``
    (DuckDB's JSON profile)."""
    sql = prune_unset_filters(sql, params)
    params = {key: params[key] for key in mentioned_params(sql)}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        conn.execute("PRAGMA enable_profiling='json'")
        conn.execute(f"PRAGMA profiling_output='{out.name}'")
        try:
            conn.execute(sql, params).fetchall()
        finally:
            conn.execute("PRAGMA disable_profiling")
        profile = json.loads(pathlib.Path(out.name).read_text())
    largest = 0
    stack = list(profile.get("operator", profile.get("children", [])))
    while stack:
        node = stack.pop()
        if node.get("name", node.get("operator_name", "")).strip() in operators:
            largest = max(largest, node.get("intermediate_rows", node.get("operator_cardinality", 0)))
        stack.extend(node.get("children", []))
    return largest


def test_hand_offs_of_busy_runs_without_a_bounce_are_not_grouped_one_by_one():
    # A depth-3 crew's run: pairs handing off both ways and agents handing off to two agents
    # (the prefilter lets it through), but each agent's hand-offs come in one stretch: no bounce.
    conn = new_db()
    rows, t = [], 0.0
    for src, dst in [("a", "b"), ("b", "a"), ("a", "c"), ("c", "b"), ("b", "c"), ("m", "a"), ("m", "b")]:
        for _ in range(40):
            t += 1
            rows.append(make_span(t, op="delegate", agent_id=src, delegate_to=dst, goal_text="the task"))
    insert_spans(conn, rows)
    assert run_metric(conn, "ping_pong").empty
    params = filter_params(Window(), Filters())
    params.update(min_delegations=MIN_PING_PONG_DELEGATIONS, min_inferred=MIN_PING_PONG_INFERRED)
    old = _largest_group_by(conn, OLD_SQL, params)
    new = _largest_group_by(conn, load_sql("ping_pong"), params)
    assert old >= len(rows)  # the previous statement: a bounce of one per hand-off
    assert new < 20  # now: per (run, pair) counts and the few hand-offs at a change of stretch


def _stretches(rng: random.Random, run: str) -> list[dict]:
    """Delegations of one run in stretches of one pair each (a depth-3 crew's shape, which the
    prefilter drops by time alone), start times from a few values, so stretches touch at equal
    start times, and short bounces where stretches meet."""
    rows, t = [], rng.random()
    src, dst = "a", "b"
    for _ in range(rng.randint(2, 8)):
        if rng.random() < 0.6:  # back the other way (the manager to its other agent)
            src, dst = ("m", "b" if dst == "a" else "a") if src == "m" else (dst, src)
        else:
            src, dst = rng.choice([("a", "b"), ("b", "a"), ("m", "a"), ("m", "b"), ("a", "c"), ("c", "a")])
        for _ in range(rng.choice([1, 1, 2, 4])):
            t += rng.choice([0.0, 0.0, 1.0])
            rows.append(make_span(t, run=run, op="delegate", agent_id=src, delegate_to=dst,
                                  goal_text=rng.choice(_TASKS[:2])))  # fmt: skip
    return rows


def test_ping_pong_equals_the_previous_statement_where_stretches_touch():
    # The busy-pair prefilter lets a run through only when a pair's hand-offs one way and back (a
    # manager's to two agents) overlap in time; at the edge they share one start time and the span
    # id orders them. Equal to the previous statement (no prefilter by time) on such runs.
    rng = random.Random(0)
    conn = new_db()
    insert_spans(conn, [row for r in range(24) for row in _stretches(rng, f"run-{r}")])  # ~250 spans
    new = run_metric(conn, "ping_pong")
    pd.testing.assert_frame_equal(_sorted(new), _sorted(old_ping_pong(conn, Window(), Filters())))
    assert len(new) >= 5


@pytest.mark.parametrize("manager", [False, True])
def test_a_bounce_whose_directions_meet_at_one_start_time_is_found(manager):
    # A -> B (t=1), B -> A (t=2), A -> B (t=2), B -> A (t=3): the hand-offs one way span 1..2 and
    # back 2..3, overlapping at t=2 only (the span ids order the two at t=2); after a long one-way
    # stretch, as where a depth-3 crew's stretches meet. Through a manager: M -> A, M -> B, M -> A,
    # M -> B likewise.
    conn = new_db()
    hops = (
        [("m", "a"), ("m", "b"), ("m", "a"), ("m", "b")]
        if manager
        else [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
    )
    rows = [make_span(t / 10, op="delegate", agent_id=hops[0][0], delegate_to=hops[0][1], goal_text="the task")
            for t in range(-40, 0)]  # fmt: skip
    for t, (src, dst) in zip([1, 2, 2, 3], hops, strict=True):
        rows.append(make_span(t, op="delegate", agent_id=src, delegate_to=dst, goal_text="the task"))
    insert_spans(conn, rows)
    found = run_metric(conn, "ping_pong")
    assert list(found["delegations"]) == [4]
    assert list(found["via"]) == (["m"] if manager else [None])
    pd.testing.assert_frame_equal(_sorted(found), _sorted(old_ping_pong(conn, Window(), Filters())))


def test_runs_whose_pairs_hand_off_each_way_in_separate_stretches_are_not_ordered():
    # A depth-3 crew's run (as in test_hand_offs_of_busy_runs_without_a_bounce_...): pairs hand off
    # both ways and agents to two agents, each in a stretch of its own; the prefilter by time drops
    # it before any window sorts its hand-offs (at 1M spans of such crews the two window sorts were
    # most of the statement).
    conn = new_db()
    rows, t = [], 0.0
    for src, dst in [("a", "b"), ("b", "a"), ("a", "c"), ("c", "b"), ("b", "c"), ("m", "a"), ("m", "b")]:
        for _ in range(40):
            t += 1
            rows.append(make_span(t, op="delegate", agent_id=src, delegate_to=dst, goal_text="the task"))
    insert_spans(conn, rows)
    params = filter_params(Window(), Filters())
    params.update(min_delegations=MIN_PING_PONG_DELEGATIONS, min_inferred=MIN_PING_PONG_INFERRED)
    assert _largest_group_by(conn, OLD_SQL, params, ("WINDOW", "STREAMING_WINDOW")) >= len(rows)
    assert _largest_group_by(conn, load_sql("ping_pong"), params, ("WINDOW", "STREAMING_WINDOW")) == 0
