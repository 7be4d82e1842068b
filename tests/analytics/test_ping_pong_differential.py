"""ping_pong against its previous SQL on random span sets, and the cost it must not pay again.

The previous statement (tests/reference_sql/ping_pong_v1.sql) grouped every hand-off of a run
that passed the busy-pair prefilter into a bounce of its own, with span lists, before dropping
the bounces shorter than four: at 1M spans of depth-3 crews (every run passes the prefilter, no
bounce anywhere) that was ~2.2 of its 2.3 CPU-s. The statement now groups only the hand-offs that
reverse one or are reversed (or, through a manager, go back to the agent two before, and the two
before those); the answers must be the previous statement's, row for row and type for type.
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


def _largest_group_by(conn: duckdb.DuckDBPyConnection, sql: str, params: dict) -> int:
    """Rows out of the statement's largest hash aggregate (DuckDB's JSON profile)."""
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
        if node.get("name", node.get("operator_name", "")).strip() in (
            "HASH_GROUP_BY",
            "PERFECT_HASH_GROUP_BY",
        ):
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
