"""Edge cases of the context-drift detectors' performance shortcuts (issue 5).

stale_policy_sends decides most sends from their cited version's first and next sighting and
runs the as-of lookup only for the rest; context_drift_holders aggregates holdings only for
superseded or flagged versions and checks the holder's own writes only for holdings already
held past the stale moment. These tests pin the cases such shortcuts could get wrong: versions
first seen at the same instant, a send citing a version nobody had seen yet, a guard-stated
current version, a version only flagged as superseded, a refresh before the supersede, and a
write by the holder after the version went stale.
"""

from __future__ import annotations

from analytics import Filters, run_metric
from tests.fixtures_analytics import insert_spans, make_span, new_db


def _send(t, agent, version, **fields):
    return make_span(t, agent_id=agent, op="send", tool_name="send_email", policy_version=version, **fields)


def test_stale_sends_with_versions_first_seen_at_the_same_instant():
    conn = new_db()
    insert_spans(
        conn,
        [
            _send(0, "a", "p1", outcome="ok"),  # p1 current: fine
            # p9 only appears in this refused send, so it was never in force: p1 is current
            _send(3, "d", "p9", outcome="rejected", reject_reason="guard"),
            make_span(5, agent_id="o", op="step", policy_version="p2"),
            make_span(5, agent_id="o", op="step", policy_version="p3"),  # same instant as p2
            _send(10, "b", "p2", outcome="ok"),  # tie p2/p3: the higher version text is current
            _send(11, "c", "p3", outcome="ok"),  # current
            _send(12, "a", "p1", outcome="ok"),  # stale
        ],
    )
    found = run_metric(conn, "stale_policy_sends")
    got = sorted(
        zip(found.agent.fillna("-"), found.policy_version, found.current_policy_version, strict=True)
    )
    assert got == [("a", "p1", "p3"), ("b", "p2", "p3"), ("d", "p9", "p1")]
    assert list(found.sort_values("agent").allowed) == [True, True, False]
    only_b = run_metric(conn, "stale_policy_sends", filters=Filters(agent="b"))
    assert list(only_b.agent) == ["b"] and list(only_b.current_policy_version) == ["p3"]


def test_stale_send_by_guard_statement_even_when_its_version_looks_current():
    conn = new_db()
    insert_spans(
        conn,
        [
            _send(0, "a", "p1", outcome="ok"),
            # the guard says p2 is in force although no span carried p2 yet
            _send(
                1,
                "a",
                "p1",
                outcome="rejected",
                reject_reason="superseded_policy",
                policy_current_version="p2",
            ),
            # refused as superseded while the guard names the same version: still reported
            _send(
                2,
                "b",
                "p1",
                outcome="rejected",
                reject_reason="superseded_policy",
                policy_current_version="p1",
            ),
        ],
    )
    found = run_metric(conn, "stale_policy_sends").sort_values("first_seen")
    assert list(zip(found.agent, found.current_policy_version, strict=True)) == [("a", "p2"), ("b", "p1")]
    assert not found.allowed.any()


def test_stale_send_names_the_state_key_that_carries_its_version():
    conn = new_db()
    insert_spans(
        conn,
        [
            make_span(0, agent_id="w", op="write", state_key="policy", state_version="v1", outcome="ok"),
            make_span(4, agent_id="w", op="write", state_key="policy", state_version="v2", outcome="ok"),
            _send(6, "a", "v1", outcome="ok"),
            _send(7, "b", "v2", outcome="ok"),
        ],
    )
    found = run_metric(conn, "stale_policy_sends")
    assert list(zip(found.agent, found.policy_id, found.current_policy_version, strict=True)) == [
        ("a", "policy", "v2")
    ]


def test_holder_of_a_version_only_flagged_as_superseded_is_reported():
    conn = new_db()
    objective = dict(objective_id="goal")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", objective_version="v1", **objective),
            make_span(3, agent_id="a", objective_version="v1", objective_superseded=True, **objective),
            make_span(6, agent_id="a", op="step"),
        ],
    )
    found = run_metric(conn, "context_drift_holders")
    assert len(found) == 1
    row = found.iloc[0]
    assert row.agent == "a" and row.held_version == "v1" and row.superseded_by is None
    assert row.held_s == 3.5  # flagged at 3 s, last span (6 s + 0.5 s) ends at 6.5 s
    assert len(row.span_ids) == 2


def test_holding_refreshed_before_the_supersede_is_not_reported_but_the_older_one_is():
    conn = new_db()
    state = dict(state_key="k", outcome="ok")
    insert_spans(
        conn,
        [
            make_span(-1, agent_id="w", op="write", state_version="v0", **state),
            make_span(0, agent_id="w", op="write", state_version="v1", **state),
            make_span(0.5, agent_id="a", op="read", state_version="v1", **state),
            make_span(2, agent_id="a", op="read", state_version="v0", **state),  # refresh (to an older one)
            make_span(5, agent_id="w", op="write", state_version="v2", **state),
            make_span(9, agent_id="a", op="step"),
        ],
    )
    found = run_metric(conn, "context_drift_holders")
    # v1 was left at 2 s, before v2 appeared at 5 s; v0 was already superseded when a read it
    assert list(zip(found.agent, found.held_version, found.superseded_by, strict=True)) == [("a", "v0", "v1")]
    assert found.iloc[0].current_version == "v2"


def test_holder_that_wrote_the_subject_after_it_went_stale_is_left_out():
    conn = new_db()
    state = dict(state_key="k")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="b", op="write", state_version="v1", outcome="ok", **state),
            make_span(1, agent_id="a", op="read", state_version="v1", outcome="ok", **state),
            make_span(1.5, agent_id="c", op="read", state_version="v1", outcome="ok", **state),
            make_span(3, agent_id="b", op="write", state_version="v2", outcome="ok", **state),
            # a's refused write while still holding v1: a write conflict, not context drift
            make_span(5, agent_id="a", op="write", state_version="v3", outcome="rejected", **state),
            make_span(8, agent_id="a", op="step"),
            make_span(8, agent_id="c", op="step"),
        ],
    )
    found = run_metric(conn, "context_drift_holders")
    assert list(found.agent) == ["c"]
    assert run_metric(conn, "context_drift_holders", filters=Filters(agent="a")).empty
    assert list(run_metric(conn, "context_drift_holders", filters=Filters(agent="c")).agent) == ["c"]
