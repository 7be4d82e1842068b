"""Edge cases of the detectors' performance pre-filters (issue 5).

divergent_reads and lost_updates order (window) only the keys of a run where a finding is
possible; context_drift_holders looks up a holder's last span only when it never refreshed. These
tests pin the cases a too-eager pre-filter would lose: runless writes, writers without an agent,
keys next to unrelated ones, a holder whose last span is not an observation of the subject.
"""

from __future__ import annotations

from datetime import timedelta

from analytics import run_metric
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, new_db


def test_lost_update_among_runless_writes_is_still_reported():
    conn = new_db()
    write = dict(op="write", state_key="k", outcome="ok", run="no-run", run_id=None)
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", state_version="v1", state_expected_version="v0", **write),
            make_span(1, agent_id="b", state_version="v2", **write),  # unversioned clobber
        ],
    )
    found = run_metric(conn, "lost_updates")
    assert len(found) == 1
    row = found.iloc[0]
    assert row.run_id is None
    assert (row.agent, row.clobbered_agent, row.clobbered_version) == ("b", "a", "v1")


def test_lost_update_of_a_writer_without_agent_is_reported():
    conn = new_db()
    write = dict(op="write", state_key="k", outcome="ok")
    insert_spans(
        conn,
        [
            make_span(0, agent_id=None, state_version="v1", state_expected_version="v0", **write),
            make_span(1, agent_id="b", state_version="v2", **write),
            # a key only one agent ever wrote cannot hold a lost update (pre-filtered away)
            make_span(2, agent_id="b", op="write", state_key="solo", state_version="v1", outcome="ok"),
            make_span(3, agent_id="b", op="write", state_key="solo", state_version="v2", outcome="ok"),
        ],
    )
    found = run_metric(conn, "lost_updates")
    assert len(found) == 1
    row = found.iloc[0]
    assert row.state_key == "k" and row.agent == "b" and row.clobbered_agent is None


def test_divergent_reads_found_next_to_keys_where_no_pair_is_possible():
    conn = new_db()
    read = dict(op="read", outcome="ok")
    write = dict(op="write", outcome="ok")
    insert_spans(
        conn,
        [
            # the split brain on "plan"
            make_span(0, agent_id="a", state_key="plan", state_version="v1", **read),
            make_span(1, agent_id="b", state_key="plan", state_version="v1", **read),
            make_span(2, agent_id="b", state_key="plan", state_version="v2", **write),
            make_span(3, agent_id="a", state_key="plan", state_version="v3", **write),
            # "notes": two readers of v1, but only one agent writes it
            make_span(4, agent_id="a", state_key="notes", state_version="v1", **read),
            make_span(5, agent_id="b", state_key="notes", state_version="v1", **read),
            make_span(6, agent_id="a", state_key="notes", state_version="v2", **write),
            # "budget": two writers, but they read different versions
            make_span(7, agent_id="a", state_key="budget", state_version="v1", **read),
            make_span(8, agent_id="a", state_key="budget", state_version="v2", **write),
            make_span(9, agent_id="b", state_key="budget", state_version="v2", **read),
            make_span(10, agent_id="b", state_key="budget", state_version="v3", **write),
        ],
    )
    found = run_metric(conn, "divergent_reads")
    assert list(found.state_key) == ["plan"]
    assert list(found.iloc[0].agents) == ["a", "b"] and found.iloc[0].version == "v1"


def test_context_drift_holder_without_refresh_holds_until_its_last_span():
    conn = new_db()
    read = dict(op="read", state_key="policy", outcome="ok")
    spans = [
        make_span(0, agent_id="a", state_version="v1", **read),
        make_span(0.5, agent_id="c", state_version="v1", **read),
        make_span(1, agent_id="b", op="write", state_key="policy", state_version="v2", outcome="ok"),
        make_span(3, agent_id="c", state_version="v2", **read),  # c refreshes
        make_span(5, duration_s=0.5, agent_id="a", op="step"),  # a's last span: not a read
    ]
    insert_spans(conn, spans)
    found = run_metric(conn, "context_drift_holders").set_index("agent")
    assert sorted(found.index) == ["a", "c"]
    assert not found.loc["a", "refreshed"]
    assert found.loc["a", "held_until"] == BASE_TIME + timedelta(seconds=5.5)
    assert found.loc["c", "refreshed"]
    assert found.loc["c", "refresh_span_id"] == spans[3]["SpanId"]
    assert found.loc["c", "held_until"] == BASE_TIME + timedelta(seconds=3)
    assert set(found.superseded_by) == {"v2"} and set(found.current_version) == {"v2"}
