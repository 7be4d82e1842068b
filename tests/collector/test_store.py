import duckdb
import pytest

from collector.decode import PROTOBUF, decode_payload
from collector.migrations_runner import apply_migrations, list_migrations
from collector.store import StoreLockedError, insert_batches, open_store
from tests.otlp_builders import make_request

TRACE = b"\x07" * 16
ROOT, CHILD, GRANDCHILD = b"\x01" * 8, b"\x02" * 8, b"\x03" * 8


def _insert(conn, spans):
    batch = decode_payload(make_request(spans).SerializeToString(), PROTOBUF)
    conn.execute("BEGIN")
    stored = insert_batches(conn, [batch])
    conn.execute("COMMIT")
    return stored


@pytest.fixture
def conn():
    connection = duckdb.connect(":memory:")
    apply_migrations(connection)
    yield connection
    connection.close()


def test_migrations_are_recorded_and_applied_once(conn):
    versions = conn.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    assert versions == [(n, name) for n, name, _ in list_migrations()]
    assert apply_migrations(conn) == []


def test_database_written_by_an_older_version_upgrades_on_open(tmp_path):
    path = tmp_path / "v1.duckdb"
    number, name, sql = list_migrations()[0]
    old = duckdb.connect(str(path))
    # What version 1 of driftscope left on disk: the first migration and its bookkeeping only.
    old.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)"
    )
    old.execute(sql)
    old.execute("INSERT INTO schema_migrations VALUES (?, ?, now()::TIMESTAMP)", [number, name])
    # A row as version 1 stored it: attributes in MAP columns, no guard/scenario columns.
    old.execute(
        """INSERT INTO spans (Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind,
               ServiceName, ResourceAttributes, ScopeName, ScopeVersion, SpanAttributes, Duration,
               StatusCode, StatusMessage, Events, Links, start_ns, end_ns, op, ingested_at)
           VALUES ('2025-11-30 00:00:00', ?, ?, '', '', 'from v1', 'Internal', 'crew',
               MAP {'service.name': 'crew'}, 'tests', '1', MAP {'driftscope.guard': 'versioned_store',
               'driftscope.policy.current_version': 'p2', 'driftscope.scenario': 'split_brain',
               'driftscope.op': 'write'}, 5, 'Unset', '', '[]', '[]', 1, 6, 'write', now()::TIMESTAMP)""",
        [TRACE.hex(), ROOT.hex()],
    )
    old.close()
    upgraded = open_store(path)
    versions = [
        row[0] for row in upgraded.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
    ]
    assert versions == [n for n, _, _ in list_migrations()] and len(versions) >= 3
    assert upgraded.execute("SELECT SpanName FROM otel_traces").fetchall() == [("from v1",)]
    # Migration 0003: attribute lists keep every entry in order; the new typed fields are filled.
    row = upgraded.execute(
        "SELECT SpanAttributes, ResourceAttributes, guard, policy_current_version, scenario, op FROM spans"
    ).fetchone()
    assert [(e["key"], e["value"]) for e in row[0]] == [
        ("driftscope.guard", "versioned_store"),
        ("driftscope.policy.current_version", "p2"),
        ("driftscope.scenario", "split_brain"),
        ("driftscope.op", "write"),
    ]
    assert [(e["key"], e["value"]) for e in row[1]] == [("service.name", "crew")]
    assert row[2:] == ("versioned_store", "p2", "split_brain", "write")
    view = upgraded.execute("SELECT SpanAttributes['driftscope.op'], ResourceAttributes FROM otel_traces")
    assert view.fetchone() == ("write", {"service.name": "crew"})
    # New spans go into the upgraded table, and the primary key still deduplicates.
    assert _insert(upgraded, [{"name": "after", "trace_id": TRACE, "span_id": CHILD}]) == 1
    assert _insert(upgraded, [{"name": "again", "trace_id": TRACE, "span_id": ROOT}]) == 0
    upgraded.close()


def test_database_from_an_earlier_run_opens_with_its_data(tmp_path):
    path = tmp_path / "old.duckdb"
    first = open_store(path)
    _insert(first, [{"name": "kept", "trace_id": TRACE, "span_id": ROOT}])
    first.close()
    again = open_store(path)
    assert again.execute("SELECT SpanName FROM spans").fetchall() == [("kept",)]
    again.close()


def test_same_span_twice_is_stored_once(conn):
    span = {"name": "retry", "trace_id": TRACE, "span_id": ROOT}
    assert _insert(conn, [span, span]) == 1
    assert _insert(conn, [span]) == 0
    assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 1


def test_tool_span_takes_the_agent_of_its_nearest_agent_ancestor(conn):
    _insert(
        conn,
        [
            {
                "trace_id": TRACE,
                "span_id": ROOT,
                "attrs": {"gen_ai.agent.id": "planner", "gen_ai.conversation.id": "r1"},
            },
            {"trace_id": TRACE, "span_id": CHILD, "parent": ROOT, "attrs": {"gen_ai.operation.name": "chat"}},
            {
                "trace_id": TRACE,
                "span_id": GRANDCHILD,
                "parent": CHILD,
                "attrs": {"gen_ai.tool.name": "search"},
            },
        ],
    )
    rows = conn.execute("SELECT SpanId, agent_id, agent_source, run_id FROM spans ORDER BY SpanId").fetchall()
    assert rows == [
        (ROOT.hex(), "planner", "attribute", "r1"),
        (CHILD.hex(), "planner", "ancestor", "r1"),
        (GRANDCHILD.hex(), "planner", "ancestor", "r1"),
    ]


def test_agent_ancestor_arriving_in_a_later_request_is_applied(conn):
    _insert(
        conn,
        [{"trace_id": TRACE, "span_id": GRANDCHILD, "parent": CHILD, "attrs": {"gen_ai.tool.name": "t"}}],
    )
    _insert(conn, [{"trace_id": TRACE, "span_id": CHILD, "parent": ROOT}])
    assert conn.execute("SELECT count(*) FROM spans WHERE agent_id IS NOT NULL").fetchone()[0] == 0
    _insert(
        conn,
        [{"trace_id": TRACE, "span_id": ROOT, "attrs": {"agent.name": "researcher", "session.id": "s1"}}],
    )
    rows = conn.execute("SELECT agent_id, run_id FROM spans ORDER BY SpanId").fetchall()
    assert rows == [("researcher", "s1")] * 3


def test_nearest_agent_wins_over_a_farther_one(conn):
    _insert(
        conn,
        [
            {"trace_id": TRACE, "span_id": ROOT, "attrs": {"gen_ai.agent.id": "planner"}},
            {"trace_id": TRACE, "span_id": CHILD, "parent": ROOT, "attrs": {"gen_ai.agent.id": "worker"}},
            {"trace_id": TRACE, "span_id": GRANDCHILD, "parent": CHILD, "attrs": {"gen_ai.tool.name": "t"}},
        ],
    )
    agent = conn.execute("SELECT agent_id FROM spans WHERE SpanId = ?", [GRANDCHILD.hex()]).fetchone()[0]
    assert agent == "worker"


def test_a_second_writer_process_gets_a_clear_message(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "held.duckdb"
    holder = open_store(path)
    code = (
        "import sys\nfrom collector.store import open_store, StoreLockedError\n"
        f"try:\n    open_store({str(path)!r})\nexcept StoreLockedError as e:\n    print(e); sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    holder.close()
    assert result.returncode == 3, result.stderr
    assert "held by another process" in result.stdout and "--endpoint" in result.stdout
    assert StoreLockedError.__doc__


def _reference_agents(parents: dict[int, int | None], agents: dict[int, str | None]) -> dict[int, str | None]:
    """Nearest agent up the tree, computed naively: what the stored column must say."""
    out = {}
    for node in parents:
        current = node
        found = agents[current]
        while found is None and parents[current] is not None:
            current = parents[current]
            found = agents[current]
        out[node] = found
    return out


def test_agent_inheritance_matches_a_reference_for_any_arrival_order(conn):
    import random

    rng = random.Random(5)
    for scenario in range(25):
        trace = rng.randbytes(16)
        size = rng.randint(3, 14)
        parents = {0: None, **{n: rng.randrange(n) for n in range(1, size)}}
        agents = {n: (f"agent{n}" if rng.random() < 0.3 else None) for n in range(size)}
        ids = {n: (scenario * 100 + n + 1).to_bytes(8, "big") for n in range(size)}
        order = list(range(size))
        rng.shuffle(order)
        cut = sorted(rng.sample(range(1, size), k=min(2, size - 1)))
        for batch in (order[: cut[0]], order[cut[0] : cut[-1]], order[cut[-1] :]):
            spans = [
                {
                    "trace_id": trace,
                    "span_id": ids[n],
                    "parent": ids[parents[n]] if parents[n] is not None else b"",
                    "attrs": {"gen_ai.agent.id": agents[n]} if agents[n] else {},
                }
                for n in batch
            ]
            if spans:
                _insert(conn, spans)
        stored = dict(
            conn.execute("SELECT SpanId, agent_id FROM spans WHERE TraceId = ?", [trace.hex()]).fetchall()
        )
        expected = _reference_agents(parents, agents)
        assert {n: stored[ids[n].hex()] for n in range(size)} == expected, scenario


# A run holds all its spans: the README's caller spans around `acting_as("run-42")` (parent,
# siblings, the root) carry no conversation id; the trace's one run id reaches them at ingest.
README_TRACE = b"\x42" * 16
CALLER, PLAN, GUARD_A, GUARD_B, SIBLING = (bytes([n]) * 8 for n in range(0x11, 0x16))


def _readme_spans() -> dict[bytes, dict]:
    """The shape of the README example: invoke_agent root (no run), a planning child (no run),
    guard spans with the conversation id, and a caller tool call beside them (no run)."""
    run = {"gen_ai.conversation.id": "run-42"}
    return {
        CALLER: {"trace_id": README_TRACE, "span_id": CALLER, "name": "invoke_agent planner",
                 "attrs": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"}},
        PLAN: {"trace_id": README_TRACE, "span_id": PLAN, "parent": CALLER, "name": "chat"},
        GUARD_A: {"trace_id": README_TRACE, "span_id": GUARD_A, "parent": PLAN, "attrs": {**run, "gen_ai.tool.name": "delegate"}},
        GUARD_B: {"trace_id": README_TRACE, "span_id": GUARD_B, "parent": CALLER, "attrs": {**run, "gen_ai.tool.name": "write_state"}},
        SIBLING: {"trace_id": README_TRACE, "span_id": SIBLING, "parent": CALLER, "attrs": {"gen_ai.tool.name": "search"}},
    }  # fmt: skip


def _runs(conn, trace: bytes) -> dict[str, str]:
    return dict(conn.execute("SELECT SpanId, run_id FROM spans WHERE TraceId = ?", [trace.hex()]).fetchall())


@pytest.mark.parametrize(
    "batches",
    [
        [[CALLER, PLAN, GUARD_A, GUARD_B, SIBLING]],  # one request
        [[GUARD_A, GUARD_B], [CALLER, PLAN, SIBLING]],  # the run's spans first
        [[CALLER, SIBLING], [PLAN], [GUARD_B], [GUARD_A]],  # the runless spans first
        [[SIBLING, GUARD_A], [CALLER], [PLAN, GUARD_B]],  # interleaved
    ],
    ids=["one-request", "run-first", "run-last", "interleaved"],
)
def test_every_span_of_a_trace_with_one_conversation_id_belongs_to_that_run(conn, batches):
    spans = _readme_spans()
    for batch in batches:
        _insert(conn, [spans[span_id] for span_id in batch])
    assert _runs(conn, README_TRACE) == {span_id.hex(): "run-42" for span_id in spans}


def test_run_join_goes_through_the_single_writer_across_commits(tmp_path):
    from collector.decode import PROTOBUF, decode_payload
    from collector.writer import IngestQueue, SpanWriter

    connection = open_store(tmp_path / "join.duckdb")
    writer = SpanWriter(connection.cursor(), IngestQueue(64 * 1024 * 1024))
    writer.start()
    try:
        spans = _readme_spans()
        for batch in ([CALLER, SIBLING], [GUARD_A], [PLAN, GUARD_B]):
            payload = make_request([spans[s] for s in batch]).SerializeToString()
            writer.queue.submit(decode_payload(payload, PROTOBUF)).result(30)
        assert writer.commits == 3
        assert _runs(connection, README_TRACE) == {span_id.hex(): "run-42" for span_id in spans}
    finally:
        writer.stop()
        connection.close()


def test_a_trace_naming_two_runs_leaves_its_root_alone_and_children_follow_their_ancestor(conn):
    root, a, a_child, b = (bytes([n]) * 8 for n in range(0x21, 0x25))
    trace = b"\x43" * 16
    _insert(
        conn,
        [
            {"trace_id": trace, "span_id": a_child, "parent": a},
            {"trace_id": trace, "span_id": root},
            {"trace_id": trace, "span_id": a, "parent": root, "attrs": {"gen_ai.conversation.id": "A"}},
            {"trace_id": trace, "span_id": b, "parent": root, "attrs": {"session.id": "B"}},
        ],
    )
    assert _runs(conn, trace) == {root.hex(): trace.hex(), a.hex(): "A", a_child.hex(): "A", b.hex(): "B"}


def test_a_trace_without_any_conversation_id_stays_its_own_run(conn):
    trace = b"\x44" * 16
    _insert(
        conn, [{"trace_id": trace, "span_id": ROOT}, {"trace_id": trace, "span_id": CHILD, "parent": ROOT}]
    )
    assert set(_runs(conn, trace).values()) == {trace.hex()}


def _hops_after(batches_of_spans) -> dict:
    connection = duckdb.connect(":memory:")
    apply_migrations(connection)
    for spans in batches_of_spans:
        _insert(connection, spans)
    hops = dict(connection.execute("SELECT SpanId, hop FROM spans").fetchall())
    connection.close()
    return hops


def test_a_traces_hops_do_not_depend_on_what_shared_its_request():
    # Trace A: a manager agent invokes a worker agent (a hop); trace B: one agent, no nesting.
    agent = {"gen_ai.operation.name": "invoke_agent"}
    nested = [
        {"trace_id": b"\x0a" * 16, "span_id": b"\x11" * 8, "attrs": {**agent, "gen_ai.agent.id": "manager"}},
        {"trace_id": b"\x0a" * 16, "span_id": b"\x12" * 8, "parent": b"\x11" * 8,
         "attrs": {**agent, "gen_ai.agent.id": "worker"}},
        {"trace_id": b"\x0a" * 16, "span_id": b"\x13" * 8, "parent": b"\x12" * 8,
         "attrs": {"gen_ai.tool.name": "search"}},
    ]  # fmt: skip
    flat = [
        {"trace_id": b"\x0b" * 16, "span_id": b"\x21" * 8, "attrs": {**agent, "gen_ai.agent.id": "solo"}},
        {"trace_id": b"\x0b" * 16, "span_id": b"\x22" * 8, "parent": b"\x21" * 8,
         "attrs": {"gen_ai.tool.name": "search"}},
    ]  # fmt: skip
    together = _hops_after([nested + flat])
    apart = _hops_after([nested, flat])
    reversed_order = _hops_after([flat, nested])
    assert together == apart == reversed_order
    assert together[(b"\x13" * 8).hex()] == 1  # the worker's tool call is one hop down


def test_each_change_bounds_the_ingest_time_of_the_spans_it_lists(conn):
    """The change log's ``oldest_ingested`` is at or before the ``ingested_at`` of every span
    ``span_changes`` lists under it (a materializer scans only spans ingested since), and
    ``only_new`` is true only when none of them was stored before (no resend, no walk)."""
    from datetime import datetime, timedelta

    from collector.store import TraceIndex

    traces = TraceIndex(conn)
    start = datetime(2026, 1, 1)

    def insert_at(minutes: int, spans) -> int:
        batch = decode_payload(
            make_request(spans).SerializeToString(), PROTOBUF, now=start + timedelta(minutes=minutes)
        )
        conn.execute("BEGIN")
        insert_batches(conn, [batch], traces)
        conn.execute("COMMIT")
        return conn.execute("SELECT max(seq) FROM change_log").fetchone()[0]

    other = b"\x09" * 16
    first = insert_at(
        0, [{"trace_id": TRACE, "span_id": GRANDCHILD, "parent": CHILD, "attrs": {"gen_ai.tool.name": "t"}}]
    )
    insert_at(5, [{"trace_id": other, "span_id": ROOT, "attrs": {"agent.name": "a", "session.id": "s2"}}])
    # the ancestor of the first span arrives 10 minutes later: the walk changes the old span
    late = insert_at(
        10, [{"trace_id": TRACE, "span_id": ROOT, "attrs": {"agent.name": "r", "session.id": "s1"}}]
    )
    # an exporter's retry: a stored span again, beside a new one
    resend = insert_at(
        15,
        [
            {"trace_id": other, "span_id": ROOT, "attrs": {"agent.name": "a", "session.id": "s2"}},
            {"trace_id": other, "span_id": CHILD, "parent": ROOT, "attrs": {"gen_ai.tool.name": "t"}},
        ],
    )
    assert resend > late
    rows = conn.execute(
        "SELECT l.seq, l.oldest_ingested, l.only_new, min(s.ingested_at) "
        "FROM change_log l JOIN span_changes c USING (seq) JOIN spans s USING (TraceId, SpanId) "
        "GROUP BY ALL ORDER BY l.seq"
    ).fetchall()
    for seq, oldest, _, listed in rows:
        assert oldest is not None and oldest <= listed, seq
    flags = {seq: only_new for seq, _, only_new, _ in rows}
    assert flags[first] is True
    assert flags[late] is False  # it changed the span stored at minute 0
    assert dict((seq, oldest) for seq, oldest, _, _ in rows)[late] == start
    # a resend changes nothing: it is not listed (the new span beside it is), and only new spans
    # are listed then
    listed = conn.execute("SELECT SpanId FROM span_changes WHERE seq = ?", [resend]).fetchall()
    assert len(listed) == 1 and flags[resend] is True
    # a resend whose parent arrives beside it: the walk changes the stored copy, which is listed
    # as changed, with the keys it had before
    orphan = b"\x0a" * 16
    insert_at(
        20, [{"trace_id": orphan, "span_id": CHILD, "parent": ROOT, "attrs": {"gen_ai.tool.name": "t"}}]
    )
    both = insert_at(
        25,
        [
            {"trace_id": orphan, "span_id": CHILD, "parent": ROOT, "attrs": {"gen_ai.tool.name": "t"}},
            {"trace_id": orphan, "span_id": ROOT, "attrs": {"agent.name": "p", "session.id": "s3"}},
        ],
    )
    ((listed, only_new),) = conn.execute(
        "SELECT count(*), any_value(l.only_new) FROM span_changes c JOIN change_log l USING (seq) WHERE seq = ?",
        [both],
    ).fetchall()
    assert listed == 2 and only_new is False
    assert conn.execute(
        "SELECT count(*) FROM change_partitions WHERE seq = ? AND partition = 'run_tool'", [both]
    ).fetchone()[0]
