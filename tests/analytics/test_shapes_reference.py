"""Detectors rewritten to stay linear on every crew shape (issue 14) equal their old SQL.

The old statements are kept in tests/reference_sql/ and run on the same random span sets (many
runs, agents and versions per key, flagged objectives; timestamps random to the microsecond, so no
two versions are first seen at the same instant: with ties both pick among the tied versions).
"""

from __future__ import annotations

import pathlib
import random

import pandas as pd
import pytest

from analytics import Filters, Window, run_metric
from analytics.sql_loader import expand_fragments, filter_params, load_sql, query_df
from tests.fixtures_analytics import insert_spans, make_span, new_db, trace_id

REFERENCE = pathlib.Path(__file__).resolve().parents[1] / "reference_sql"


def _reference_sql(name: str) -> str:
    """``tests/reference_sql/<name>.sql`` with today's shared fragments expanded."""
    text = (REFERENCE / f"{name}.sql").read_text()
    text = text.replace("{held_versions}", load_sql("_held_versions"))
    text = text.replace("{constraint_cells}", expand_fragments("{constraint_cells}"))
    return text.replace("{span_filter}", "(\n" + load_sql("_span_filter").strip() + "\n)")


def _observations(rng: random.Random, runs: int, long: bool = False) -> list[dict]:
    """Reads, writes and objective sightings of a few hot keys by several agents per run
    (``long``: hundreds of them by a writer and a reader, who holds dozens of versions of a key)."""
    rows = []
    for r in range(runs):
        run = f"run-{r}"
        versions = {"k": 0, "plan": 0, "goal": 0}
        for _ in range(rng.randint(500, 900) if long else rng.randint(5, 60)):
            agent = rng.choice(["a", "b"] if long else ["a", "b", "c", "d"])
            t = rng.random() * 100
            subject = rng.choice(list(versions))
            fields = dict(run=run, TraceId=trace_id(f"{run}/{rng.randint(0, 1)}"), agent_id=agent)
            if rng.random() < 0.3:
                versions[subject] += 1
            version = f"v{max(0, versions[subject] - rng.randint(0, 2))}"
            if subject == "goal":
                fields.update(op="step", objective_id="goal", objective_version=version,
                              objective_superseded=rng.random() < 0.05)  # fmt: skip
            else:
                op = (
                    rng.choice(["read", "read", "write"]) if not long else "write" if agent == "a" else "read"
                )
                fields.update(op=op, state_key=subject, state_version=version,
                              outcome=rng.choice(["ok", "ok", "ok", "rejected"]))  # fmt: skip
            rows.append(make_span(t, **fields))
    return rows


def _sorted(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return frame.sort_values(keys, kind="stable").reset_index(drop=True)


@pytest.mark.parametrize(
    "seed",
    [
        *range(5),  # make test-fast: five seeds; make test: fifteen; make test-deep: eighty
        *(pytest.param(s, marks=pytest.mark.slow) for s in range(5, 15)),
        *(pytest.param(s, marks=pytest.mark.deep) for s in range(15, 80)),
    ],
)
def test_context_drift_holders_equals_the_old_sql_on_random_span_sets(seed):
    rng = random.Random(seed)
    conn = new_db()
    insert_spans(conn, _observations(rng, rng.randint(1, 4), long=seed >= 10 and seed % 4 == 3))
    for filters in (Filters(), Filters(agent="b")):
        params = filter_params(Window(), filters)
        old = query_df(conn, _reference_sql("context_drift_holders_v1"), params)
        new = run_metric(conn, "context_drift_holders", Window(), filters)
        keys = ["run_id", "agent", "objective_id", "held_version"]
        pd.testing.assert_frame_equal(_sorted(new, keys), _sorted(old[list(new.columns)], keys))


@pytest.mark.slow
def test_random_span_sets_hold_stale_holders_also_dozens_per_agent_and_key():
    # Otherwise the equality above could compare empty frames only, or never take the path of
    # holders with many holdings of one subject (over 32: "crowded" in the SQL).
    found = 0
    for seed in range(20):
        conn = new_db()
        insert_spans(conn, _observations(random.Random(seed), 3))
        found += len(run_metric(conn, "context_drift_holders"))
    assert found > 20
    conn = new_db()
    insert_spans(conn, _observations(random.Random(3), 1, long=True))
    # A reader holding 34+ versions of one key: every one but the newest is superseded.
    (read,) = conn.execute(
        "SELECT max(n) FROM (SELECT count(DISTINCT state_version) AS n FROM spans "
        "WHERE op = 'read' GROUP BY agent_id, state_key)"
    ).fetchone()
    new = run_metric(conn, "context_drift_holders")
    assert read > 34 and len(new) > 20
    old = query_df(conn, _reference_sql("context_drift_holders_v1"), filter_params(Window(), Filters()))
    keys = ["run_id", "agent", "objective_id", "held_version"]
    pd.testing.assert_frame_equal(_sorted(new, keys), _sorted(old[list(new.columns)], keys))


def test_holding_ended_by_another_version_seen_at_the_same_instant_as_its_first_read():
    conn = new_db()
    rows = [make_span(0, agent_id="w", op="write", state_key="k", state_version="v1", outcome="ok")]
    rows += [make_span(1 + i, agent_id="w", op="write", state_key="k", state_version=f"v{i + 2}",
                       outcome="ok") for i in range(40)]  # fmt: skip
    # a reads v1 and, at the same instant, sees v2; its next observation later is v3
    rows += [make_span(0.5, agent_id="a", op="read", state_key="k", state_version="v1", outcome="ok")]
    rows += [make_span(0.5, agent_id="a", op="read", state_key="k", state_version="v2", outcome="ok")]
    rows += [make_span(2 + i, agent_id="a", op="read", state_key="k", state_version=f"v{i + 1}",
                       outcome="ok") for i in range(40)]  # fmt: skip
    insert_spans(conn, rows)
    params = filter_params(Window(), Filters())
    old = query_df(conn, _reference_sql("context_drift_holders_v1"), params)
    new = run_metric(conn, "context_drift_holders")
    keys = ["run_id", "agent", "objective_id", "held_version"]
    pd.testing.assert_frame_equal(_sorted(new, keys), _sorted(old[list(new.columns)], keys))
    held_v1 = new[(new.agent == "a") & (new.held_version == "v1")].iloc[0]
    assert held_v1.refreshed and held_v1.held_until > held_v1.first_seen


def _delegations(rng: random.Random, tasks: int) -> list[dict]:
    """Delegation chains of a few origin tasks over several runs: several delegations per hop by
    different agents, each constraint carried, waived (with a reason), or dropped, free-text
    hand-offs citing constraints as "[C1]", refused delegations, ledgers declared late."""
    rows, constraints = [], ["C1", "C2", "C3", "C4"]
    for task in range(tasks):
        origin = f"task-{task}"
        for _ in range(rng.randint(1, 25)):
            hop = rng.randint(1, 4)
            fields = dict(run=f"run-{rng.randint(0, 2)}", TraceId=trace_id(f"{origin}/{rng.randint(0, 3)}"),
                          op="delegate", origin_task_id=origin, hop=hop, agent_id=rng.choice(["a", "b", "c", None]),
                          delegate_to=rng.choice(["b", "c", "d", None]),
                          outcome=rng.choice(["ok", "ok", "ok", "rejected", None]))  # fmt: skip
            if rng.random() < 0.2:  # an unguarded hand-off: the constraints its text cites
                fields["tool_args"] = {"task": " ".join(f"[{c}]" for c in rng.sample(constraints, 2))}
            else:
                kept = [c for c in constraints if rng.random() < 0.6]
                waived = [c for c in constraints if c not in kept and rng.random() < 0.2]
                fields["constraints_carried"] = kept
                if waived:
                    fields.update(
                        constraints_waived=waived, waiver_reasons=[f"r-{rng.randint(0, 2)}" for _ in waived]
                    )
            rows.append(make_span(rng.random() * 100, **fields))
        if rng.random() < 0.7:
            rows.append(make_span(rng.random() * 100, run="run-0", origin_task_id=origin, op="step",
                                  constraints_ledger=rng.sample([*constraints, "C5"], 3)))  # fmt: skip
    return rows


def _sorted_reasons(reasons: str | None) -> str | None:
    return None if pd.isna(reasons) else "; ".join(sorted(reasons.split("; ")))


@pytest.mark.parametrize(
    "seed", [*range(3), *(pytest.param(s, marks=pytest.mark.deep) for s in range(3, 40))]
)
def test_constraint_ledger_equals_the_old_sql_on_random_span_sets(seed):
    """A hop's evidence aggregated once from its delegations equals the aggregates over every
    (constraint, delegation) cell the ledger took before."""
    rng = random.Random(seed)
    conn = new_db()
    insert_spans(conn, _delegations(rng, rng.randint(1, 6)))
    statuses = set()
    for filters in (Filters(), Filters(agent="b"), Filters(origin_task="task-0")):
        params = filter_params(Window(), filters)
        old = query_df(conn, _reference_sql("constraint_ledger_v1"), params)
        new = run_metric(conn, "constraint_ledger", Window(), filters)
        assert len(old) or filters != Filters(), "no ledger cell: the equality would prove nothing"
        keys = ["origin_task_id", "constraint_id", "hop"]
        new_rows = _sorted(new, keys)
        old_rows = _sorted(old[list(new.columns)], keys)
        for column in ("span_ids", "agents", "delegate_to"):  # Arrow lists (text_lists) vs Python ones
            new_rows[column] = new_rows[column].map(list)
            old_rows[column] = old_rows[column].map(list)
        # the old SQL joined a hop's waiver reasons in no set order; the ledger sorts them now
        old_rows["waiver_reason"] = old_rows["waiver_reason"].map(_sorted_reasons)
        assert new_rows["waiver_reason"].map(_sorted_reasons).equals(new_rows["waiver_reason"])
        pd.testing.assert_frame_equal(new_rows, old_rows, check_dtype=False)
        statuses |= set(new["status"])
    assert {"carried", "missing"} <= statuses
