"""Live findings: the writer logs what each commit touched, the materializer keeps every detector's
findings table equal to a full recomputation, and reads are SELECTs over those tables."""

from __future__ import annotations

import gzip
import json
import random
from datetime import timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from analytics import (
    METRICS,
    Filters,
    Window,
    compare_kept,
    loops_live,
    materialize,
    run_metric,
    runaway,
    summary,
)
from analytics.registry import compute_metric, register, scratch_registry
from analytics.sql_loader import filter_params
from analytics.thresholds import store_threshold
from analytics.types import Page, direct_write
from collector.decode import JSON, PROTOBUF, DecodedBatch, decode_payload
from collector.files import iter_file_requests
from collector.store import TraceIndex, delete_expired, insert_batches
from driftscope.database import migrate
from tests import tiers
from tests.analytics.test_summary import _random_batch
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, trace_id


def _loop_batch(rng: random.Random, batch: int, runs: list[str]) -> list[dict]:
    """Repeated tool calls, delegations bouncing between two agents and goal statements."""
    rows = []
    for _ in range(rng.randint(0, 6)):
        run = rng.choice(runs)
        t = batch * 5 + rng.random() * 20
        fields = dict(run=run, TraceId=trace_id(f"{run}/{rng.randint(0, 2)}"),
                      ingested_at=BASE_TIME + timedelta(seconds=batch))  # fmt: skip
        kind = rng.choice(["loop", "loop", "pingpong", "goal", "invoke", "code", "handoff"])
        if kind == "invoke":  # a manager invoking its sub-agent with a (re-worded) task
            manager = make_span(t, agent_id="m", span_family="agent", SpanName="m.run", **fields)
            task = rng.choice(["Find the Contoso employee count for 2023", "Contoso employee count 2023",
                               "Summarise the Fabrikam annual report"])  # fmt: skip
            sub = make_span(t + 0.1, agent_id=rng.choice(["s", None]), agent_name="s", span_family="agent",
                            SpanName="s.run", ParentSpanId=manager["SpanId"],
                            input_text=json.dumps({"task": task}), **fields)  # fmt: skip
            rows += [manager, sub] if rng.random() < 0.8 else [sub]  # sometimes the parent never comes
        elif kind == "code":  # code actions, or the same agent's tool spans of that name
            query = rng.choice(["EU revenue 2024", "revenue of the EU in 2024"])
            if rng.random() < 0.8:
                output = f'<code>\nr = web_search(query="{query}")\n</code>'
                rows.append(make_span(t, agent_id="c", span_family="llm", output_text=output, **fields))
            else:
                rows.append(
                    make_span(t, agent_id="c", tool_name="web_search", tool_args={"query": query}, **fields)
                )
        elif kind == "handoff":
            rows.append(make_span(t, agent_id=rng.choice(["a", "m"]), tool_name=rng.choice(["transfer_to_b", "transfer_to_a"]),
                                  tool_args={"reason": "next"}, **fields))  # fmt: skip
        elif kind == "loop":
            rows.append(make_span(t, agent_id=rng.choice(["a", "b"]), tool_name="search",
                                  tool_args={"q": rng.choice(["alpha beta", "alpha  beta", "gamma"])},
                                  outcome=rng.choice(["ok", "error"]), **fields))  # fmt: skip
        elif kind == "pingpong":
            src = rng.choice(["a", "b"])
            rows.append(make_span(t, agent_id=src, op="delegate", delegate_to="b" if src == "a" else "a",
                                  origin_task_id=f"t-{run}", hop=1, goal_text="compile the report",
                                  **fields))  # fmt: skip
    return rows


def _cell(value) -> str:
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and value != value):
        return "missing"  # NULL: None, NaN or NaT by the column's dtype; null in every answer
    if hasattr(value, "__len__") and not isinstance(value, str):
        return repr([_cell(v) for v in value])
    return repr(value.item() if hasattr(value, "item") else value)


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells as text (lists element by element, every missing value alike), rows sorted: equal
    up to the order of rows tied on the detector's own ORDER BY and the dtype of a NULL."""
    out = pd.DataFrame({column: [_cell(v) for v in frame[column]] for column in frame.columns})
    return out.sort_values(list(out.columns)).reset_index(drop=True)


def _store(tmp_path) -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    return conn


# Each store's TraceIndex, kept across its commits as the writer keeps it (the change log's
# ingest bounds come from it: the materializer's reads of the changed spans rely on them). Held by
# the connection itself, never by its id: a new store must not inherit another's index.
_TRACES: dict[duckdb.DuckDBPyConnection, TraceIndex] = {}


def _traces(conn: duckdb.DuckDBPyConnection) -> TraceIndex:
    if conn not in _TRACES:
        _TRACES[conn] = TraceIndex(conn)
    return _TRACES[conn]


def _commit(conn: duckdb.DuckDBPyConnection, rows: list[dict]) -> int:
    """Store ``rows`` as the collector's writer does (``insert_batches`` in one transaction: the
    ancestor walks and the change log with the spans); return the rows stored."""
    scratch = duckdb.connect()
    migrate(scratch)
    insert_spans(scratch, rows)
    # each commit's spans ingested a second after the last's, as the writer stamps them
    commits = conn.execute("SELECT count(*) FROM change_log").fetchone()[0]
    table = scratch.sql(
        "SELECT * REPLACE (ingested_at + to_seconds($n::BIGINT) AS ingested_at) FROM spans",
        params={"n": commits},
    ).to_arrow_table()
    conn.execute("BEGIN TRANSACTION")
    stored = insert_batches(conn, [DecodedBatch(table=table, accepted=table.num_rows)], _traces(conn))
    conn.execute("COMMIT")
    return stored


def _pass(
    conn: duckdb.DuckDBPyConnection, names: list[str] | None = None, between=None
) -> materialize.PassReport:
    cursor = conn.cursor()
    try:
        return materialize.bring_up_to_date(cursor, direct_write(conn), names, between=between)
    finally:
        cursor.close()


def _full(conn, name: str) -> pd.DataFrame:
    return compute_metric(conn, name)


def _assert_tables_equal_full(conn, seen: dict[str, int]) -> None:
    fulls: dict[str, pd.DataFrame] = {}  # run_summary's reference counts these findings
    for name in materialize.maintained():
        if name == "run_summary" or (name in materialize.PARTS and name not in compare_kept.TABLES):
            continue  # run_summary and its parts (held below) and the state tables others read
        assert materialize.ready(conn, name) is not None, name
        if name in compare_kept.TABLES:  # the comparison's per-run tables: not detectors
            full = compare_kept.per_run_rows(conn, name)
            got = conn.sql(f"SELECT * EXCLUDE (_pos) FROM findings__{name}").df()[list(full.columns)]
            pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=name)
            seen[name] = seen.get(name, 0) + len(full)
            continue
        got = run_metric(conn, name)
        full = fulls[name] = _full(conn, name)
        assert list(got.columns) == list(full.columns), name
        pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=name)
        seen[name] = seen.get(name, 0) + len(full)
    assert summary.summary_from_tables(conn, Window(), Filters()) is not None  # from tables alone
    tabled = run_metric(conn, "run_summary")
    pd.testing.assert_frame_equal(
        _canonical(tabled), _canonical(summary.run_summary_of(conn, fulls)), obj="run_summary"
    )
    seen["run_summary"] = seen.get("run_summary", 0) + len(tabled)


@pytest.mark.parametrize(
    "seed",
    [0, *(pytest.param(s, marks=pytest.mark.deep) for s in range(1, 10))],
)
def test_findings_tables_equal_a_full_recomputation_after_every_batch(tmp_path, seed):
    rng = random.Random(seed)
    conn = _store(tmp_path)
    runs = [f"run-{i}" for i in range(rng.randint(2, 5))]
    seen: dict[str, int] = {}
    for batch in range(tiers.batches(full=6, quick=3)):
        _commit(conn, _random_batch(rng, batch, runs) + _loop_batch(rng, batch, runs))
        report = _pass(conn)
        assert not report.failed
        _assert_tables_equal_full(conn, seen)
    # after the first pass only the partitions a commit touched are recomputed
    assert materialize.freshness(conn)["lag_seconds"] == 0.0


SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _sample_spans(names: list[str]) -> pa.Table:
    """The spans of the simulator's sample traces ``names``, decoded from their OTLP JSON."""
    tables = [
        decode_payload(payload, JSON).table
        for name in names
        for _, payload in iter_file_requests(SAMPLES / f"{name}.json")
    ]
    return pa.concat_tables(tables)


def _runaway_crew(rng: random.Random) -> list[dict]:
    """Five usual runs of a crew and one with many times their spans (a runaway run)."""
    rows = []
    for run in range(6):
        calls = 36 if run == 5 else 5
        for call in range(calls):
            rows.append(make_span(call * 0.5 + rng.random(), run=f"crew-r-{run}", ServiceName="crew-r",
                                  agent_id="worker", tool_name="search", tool_args={"q": f"{run}-{call}"}))  # fmt: skip
    return rows


def _no_progress_run(rng: random.Random) -> list[dict]:
    """An agent searching again and again with other words and getting the same answer."""
    return [
        make_span(call + rng.random() * 0.5, run="run-stuck", agent_id="researcher", tool_name="search",
                  tool_args={"q": f"revenue 2024 attempt {call}"}, tool_result="no results", outcome="ok")
        for call in range(6)
    ]  # fmt: skip


def _commit_table(conn: duckdb.DuckDBPyConnection, table: pa.Table) -> None:
    conn.execute("BEGIN TRANSACTION")
    insert_batches(conn, [DecodedBatch(table=table, accepted=table.num_rows)], _traces(conn))
    conn.execute("COMMIT")


# The simulator's scenarios whose failures every maintained detector finds (with the runaway crew).
SCENARIOS = [
    "split_brain_unguarded", "ping_pong_unguarded", "recursion_loop_unguarded", "goal_drift_unguarded",
    "constraint_drop_unguarded", "context_drift_unguarded", "duplicate_side_effect_unguarded",
    "step_budget_unguarded", "step_budget_guarded", "split_brain_guarded", "healthy_guarded",
]  # fmt: skip


@pytest.mark.parametrize(
    "seed",
    [0, *(pytest.param(s, marks=pytest.mark.deep) for s in range(1, 8))],
)
def test_spans_arriving_in_any_batches_keep_every_table_equal_to_a_full_recomputation(tmp_path, seed):
    _sample_batches_property(tmp_path, seed)


def test_passes_touching_most_partitions_compute_unscoped_and_stay_equal(tmp_path, monkeypatch):
    monkeypatch.setattr(materialize, "MANY_KEYS", 0)  # every pass over half the runs: unscoped
    _sample_batches_property(tmp_path, 0)


def _sample_batches_property(tmp_path, seed: int) -> None:
    """Real OTLP spans of the simulator's failing crews, cut into random batches in random order
    (children before their parents, a run's spans over many commits), plus a runaway crew: after
    every commit and pass each table equals a full recomputation, and every maintained detector
    has rows on both sides (so the equality proves something for each)."""
    rng = random.Random(seed)
    conn = _store(tmp_path)
    spans = _sample_spans(SCENARIOS)
    order = list(range(spans.num_rows))
    rng.shuffle(order)
    spans = spans.take(order)
    cuts = sorted(rng.sample(range(1, spans.num_rows), tiers.batches(full=5, quick=3) - 1))
    pieces = [spans.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, spans.num_rows], strict=True)]
    crew = _runaway_crew(rng) + _no_progress_run(rng)
    seen: dict[str, int] = {}
    for number, piece in enumerate(pieces):
        _commit_table(conn, piece)
        _commit(conn, crew[number :: len(pieces)])
        report = _pass(conn)
        assert not report.failed
        seen = {}
        _assert_tables_equal_full(conn, seen)
    empty = sorted(name for name, rows in seen.items() if not rows and name != "run_summary")
    assert not empty, f"these detectors found nothing, so equality proved nothing for them: {empty}"


FRAMEWORKS = SAMPLES / "frameworks"


@pytest.mark.parametrize("run_set", ["openai-agents", "adk-content", "langgraph-openinference"])
def test_the_framework_corpus_keeps_every_table_equal_to_a_full_recomputation(tmp_path, run_set):
    """What frameworks' own exporters sent (hand-offs, agents invoked by no agent, ping-pongs),
    committed request by request: every table equals a full computation after each pass."""
    from corpus.dump import read_requests

    conn = _store(tmp_path)
    records = list(read_requests(FRAMEWORKS / run_set / "otlp.jsonl"))
    for number, record in enumerate(records):
        body = record["body"]
        if record.get("content_encoding") == "gzip":
            body = gzip.decompress(body)
        conn.execute("BEGIN TRANSACTION")
        insert_batches(conn, [decode_payload(body, PROTOBUF)], _traces(conn))
        conn.execute("COMMIT")
        if number % 3 == 2 or number == len(records) - 1:
            assert not _pass(conn).failed
            _assert_tables_equal_full(conn, {})


def test_the_change_log_lists_every_run_a_commit_touched_and_the_run_a_span_left(tmp_path):
    conn = _store(tmp_path)
    trace = trace_id("t")
    child = make_span(1, run="x", TraceId=trace, agent_id="a", SpanId="c" * 16, ParentSpanId="p" * 16)
    child["run_id"] = trace  # no conversation id yet: its run is its trace id
    _commit(conn, [child])
    root = make_span(0, run="run-42", TraceId=trace, agent_id="a", SpanId="p" * 16)
    _commit(conn, [root])
    logged = conn.execute(
        "SELECT seq, partition, key FROM change_partitions WHERE partition = 'run_id' ORDER BY seq, key"
    ).fetchall()
    first, second = sorted({seq for seq, _, _ in logged})
    assert [key for seq, _, key in logged if seq == first] == [trace]
    # the child moved from its trace-id run to run-42: both are touched by the second commit
    assert sorted(key for seq, _, key in logged if seq == second) == sorted([trace, "run-42"])
    assert conn.execute("SELECT DISTINCT run_id FROM spans").fetchall() == [("run-42",)]
    kinds = conn.execute("SELECT kind, spans FROM change_log ORDER BY seq").fetchall()
    assert kinds == [("spans", 1), ("spans", 1)]


def test_a_run_scope_reaches_back_to_a_span_a_late_parent_moved_into_the_run(tmp_path):
    """A scoped computation reads only spans ingested since its runs' first (``run_scope``): a
    span stored long before its run's others (here under its trace id, until its parent came)
    is inside the bound, so the scoped rows equal the whole computation's rows of the run."""
    conn = _store(tmp_path)
    trace = trace_id("t")
    child = make_span(1, run="x", TraceId=trace, agent_id="a", tool_name="search", SpanId="c" * 16,
                      ParentSpanId="p" * 16, tool_args={"q": "alpha"})  # fmt: skip
    child["run_id"] = trace
    _commit(conn, [child])
    for number in range(5):  # other runs' history between the child and its run's other spans
        _commit(conn, [make_span(2 + number, run=f"other-{number}", agent_id="b", tool_name="search")])
    root = make_span(0, run="run-42", TraceId=trace, agent_id="a", SpanId="p" * 16)
    later = make_span(
        8, run="run-42", TraceId=trace, agent_id="a", tool_name="search", tool_args={"q": "alpha"}
    )
    _commit(conn, [root, later])
    first, last = conn.execute(
        "SELECT min(ingested_at), max(ingested_at) FROM spans WHERE run_id = 'run-42'"
    ).fetchone()
    assert first < last  # the moved child keeps its own, older ingest time
    scope = materialize.run_scope(conn, ["run-42"])
    assert scope.runs == ("run-42",) and scope.scope_from == first
    assert materialize.run_scope(conn, None) == Filters(from_spans=True)
    counts = materialize.maintained()["runaway_counts"]
    whole = counts.compute(conn, "run_id", None)
    expected = whole[whole["run_id"] == "run-42"].reset_index(drop=True)
    scoped = counts.compute(conn, "run_id", ["run-42"])
    pd.testing.assert_frame_equal(_canonical(scoped), _canonical(expected))
    # the bound is applied: from the run's last ingest on, the detector's scan leaves the child out
    params = filter_params(Window(), Filters(runs=("run-42",), scope_from=last))
    assert params["scope_from"] == last
    narrow = runaway._counts(conn, Window(), Filters(runs=("run-42",), scope_from=last)).to_pandas()
    assert list(narrow["spans"]) == [n - 1 for n in expected["spans"]]
    assert filter_params(Window(), Filters(scope_from=last))["scope_from"] is None  # only with runs


def test_an_origin_task_scope_reaches_back_to_its_first_delegation(tmp_path):
    """The constraint ledger, kept per origin task, scoped to a task whose first delegation was
    stored before other tasks' history: the bound is that delegation's ingest time and the scoped
    rows are the whole computation's rows of the task."""
    conn = _store(tmp_path)
    fields = dict(op="delegate", origin_task_id="task-1", goal_text="compile the report")
    _commit(conn, [make_span(0, run="r1", agent_id="a", delegate_to="b", hop=1,
                             constraints_ledger=["C1", "C2"], constraints_carried=["C1", "C2"], **fields)])  # fmt: skip
    for number in range(4):
        _commit(conn, [make_span(1 + number, run=f"o{number}", agent_id="x", op="delegate", delegate_to="y",
                                 hop=1, origin_task_id=f"other-{number}", constraints_carried=["C9"])])  # fmt: skip
    _commit(
        conn,
        [make_span(6, run="r1", agent_id="b", delegate_to="c", hop=2, constraints_carried=["C1"], **fields)],
    )
    first = conn.execute("SELECT min(ingested_at) FROM spans WHERE origin_task_id = 'task-1'").fetchone()[0]
    scope = materialize.run_scope(conn, ["task-1"], "origin_task_id")
    assert scope.origin_tasks == ("task-1",) and scope.runs is None and scope.scope_from == first
    assert filter_params(Window(), scope)["scope_from"] == first
    ledger = materialize.maintained()["constraint_ledger"]
    whole = ledger.compute(conn, "origin_task_id", None)
    expected = whole[whole["origin_task_id"] == "task-1"].reset_index(drop=True)
    assert set(expected["status"]) >= {"carried", "missing"}
    scoped = ledger.compute(conn, "origin_task_id", ["task-1"])
    pd.testing.assert_frame_equal(_canonical(scoped), _canonical(expected))


def _run_tools(conn, seq: int) -> list[str]:
    """The (run, tool) keys change ``seq`` touched: logged by the writer (what changed spans had
    before) and read from the spans it lists (what they have now), as the materializer reads them."""
    return sorted(
        key.replace("\x1f", "/") for key in set(materialize._touched(conn, "run_tool", seq - 1, seq))
    )


def test_the_change_log_lists_the_run_tool_groups_of_new_and_changed_spans(tmp_path):
    conn = _store(tmp_path)
    trace = trace_id("t")
    child = make_span(1, run="x", TraceId=trace, agent_id="a", SpanId="c" * 16, ParentSpanId="p" * 16,
                      tool_name="search", tool_args={"q": "x"})  # fmt: skip
    child["run_id"] = trace  # no conversation id yet: its run is its trace id
    _commit(conn, [child])
    first = conn.execute("SELECT max(seq) FROM change_log").fetchone()[0]
    assert _run_tools(conn, first) == [f"{trace}/a", f"{trace}/search"]
    other = make_span(2, run="run-7", agent_id="b", tool_name="fetch", tool_args={"u": 1})
    root = make_span(0, run="run-42", TraceId=trace, agent_id="a", SpanId="p" * 16)
    _commit(conn, [root, other])
    second = conn.execute("SELECT max(seq) FROM change_log").fetchone()[0]
    # the new spans' groups; the child's groups in the run it left (logged by the writer: the
    # spans no longer say it) and in the run it joined; no group of a span nothing changed
    assert _run_tools(conn, second) == sorted(
        ["run-42/a", "run-7/b", "run-7/fetch", f"{trace}/a", f"{trace}/search", "run-42/search"]
    )
    logged = conn.execute(
        "SELECT key FROM change_partitions WHERE partition = 'run_tool' AND seq = ?", [second]
    ).fetchall()
    assert sorted(key.replace("\x1f", "/") for (key,) in logged) == [f"{trace}/a", f"{trace}/search"]
    _commit(conn, [make_span(3, run="run-7", agent_id="b", tool_name="fetch", tool_args={"u": 2})])
    third = conn.execute("SELECT max(seq) FROM change_log").fetchone()[0]
    assert _run_tools(conn, third) == ["run-7/b", "run-7/fetch"]


def test_span_changes_list_stored_changed_and_deleted_spans_and_per_span_state_follows(tmp_path):
    conn = _store(tmp_path)
    trace = trace_id("t")
    child = make_span(1, run="x", TraceId=trace, agent_id="a", SpanId="c" * 16, ParentSpanId="p" * 16,
                      tool_name="search", tool_args={"q": "x"})  # fmt: skip
    child["run_id"] = trace
    _commit(conn, [child])
    _pass(conn)
    steps = "findings__" + compare_kept.SPAN_STEPS
    assert conn.execute(f"SELECT SpanId, run_id FROM {steps}").fetchall() == [("c" * 16, trace)]
    other = make_span(2, run="run-7", agent_id="b", tool_name="fetch", tool_args={"u": 1})
    root = make_span(0, run="run-42", TraceId=trace, agent_id="a", SpanId="p" * 16)
    _commit(conn, [root, other])
    second = conn.execute("SELECT max(seq) FROM change_log").fetchone()[0]
    listed = conn.execute(
        "SELECT SpanId FROM span_changes WHERE seq = ? ORDER BY SpanId", [second]
    ).fetchall()
    # the two stored spans and the child its run changed under
    assert sorted(span for (span,) in listed) == sorted(["c" * 16, "p" * 16, other["SpanId"]])
    report = _pass(conn)
    assert report.recomputed[compare_kept.SPAN_STEPS] == 1  # one change folded, not a rebuild
    rows = dict(conn.execute(f"SELECT SpanId, run_id FROM {steps}").fetchall())
    assert rows == {"c" * 16: "run-42", "p" * 16: "run-42", other["SpanId"]: "run-7"}
    first_end = conn.execute("SELECT min(end_ns) FROM spans").fetchone()[0]
    conn.execute("BEGIN TRANSACTION")
    assert delete_expired(conn, first_end + 1, 10) == 1
    conn.execute("COMMIT")
    _pass(conn)
    assert sorted(r[0] for r in conn.execute(f"SELECT SpanId FROM {steps}").fetchall()) == sorted(
        r[0] for r in conn.execute("SELECT SpanId FROM spans").fetchall()
    )
    _assert_tables_equal_full(conn, {})


def test_repeated_calls_recomputes_only_the_groups_a_commit_changed(tmp_path):
    conn = _store(tmp_path)
    calls = lambda run, tool, n, at=0: [  # noqa: E731
        make_span(at + i, run=run, agent_id="worker", tool_name=tool, tool_args={"q": f"{tool} same"})
        for i in range(n)
    ]
    _commit(conn, calls("run-1", "search", 3) + calls("run-1", "fetch", 2) + calls("run-2", "search", 3))
    _pass(conn)
    assert sorted(run_metric(conn, "repeated_calls")["run_id"]) == ["run-1", "run-2"]
    # a call that links to nothing changes no loop: no group's loops are recomputed
    _commit(conn, [make_span(9, run="run-2", agent_id="worker", tool_name="lookup", tool_args={"q": "x"})])
    assert _pass(conn).recomputed[loops_live.GROUPS] == 0
    # a third fetch in run-1 makes its component a loop: only (run-1, fetch) is recomputed
    _commit(conn, calls("run-1", "fetch", 1, at=10))
    report = _pass(conn)
    assert report.recomputed[loops_live.GROUPS] == 1
    assert report.recomputed["repeated_calls"] == 1  # run-1's rows, from the groups' table
    got = run_metric(conn, "repeated_calls")
    assert sorted(zip(got["run_id"], got["tool_name"], got["calls"], strict=True)) == [
        ("run-1", "fetch", 3), ("run-1", "search", 3), ("run-2", "search", 3)
    ]  # fmt: skip
    pd.testing.assert_frame_equal(_canonical(got), _canonical(_full(conn, "repeated_calls")))
    # a retention delete recomputes every group of the runs it changed
    first_end = conn.execute("SELECT min(end_ns) FROM spans WHERE run_id = 'run-2'").fetchone()[0]
    conn.execute("BEGIN TRANSACTION")
    delete_expired(conn, first_end + 1, 10)
    conn.execute("COMMIT")
    _pass(conn)
    got = run_metric(conn, "repeated_calls")
    assert "run-2" not in set(got["run_id"])
    pd.testing.assert_frame_equal(_canonical(got), _canonical(_full(conn, "repeated_calls")))


def test_run_summary_is_a_table_following_findings_its_run_did_not_change(tmp_path):
    """run_summary is kept per run; a run whose own spans did not change is recomputed when a
    detector's table changes its findings: runaway_runs is computed from every run of the crew,
    so other runs growing make the runaway run usual."""
    conn = _store(tmp_path)
    _commit(conn, _runaway_crew(random.Random(3)))
    _pass(conn)
    got = run_metric(conn, "run_summary")
    assert got.attrs["source"] == "table"
    runaway = dict(zip(got["run_id"], got["runaway_runs_count"], strict=True))
    assert runaway["crew-r-5"] >= 1 and got.set_index("run_id").loc["crew-r-5", "verdict"] == "failing"
    # the five usual runs grow to the runaway run's size: crew-r-5's spans do not change
    more = [
        make_span(10 + call * 0.5, run=f"crew-r-{run}", ServiceName="crew-r", agent_id="worker",
                  tool_name="search", tool_args={"q": f"{run}-more-{call}"})
        for run in range(5) for call in range(31)
    ]  # fmt: skip
    _commit(conn, more)
    report = _pass(conn)
    assert report.recomputed["run_summary"] == 6  # the five touched runs and crew-r-5
    got = run_metric(conn, "run_summary")
    assert got.attrs["source"] == "table"
    assert got.set_index("run_id").loc["crew-r-5", "runaway_runs_count"] == 0
    pd.testing.assert_frame_equal(_canonical(got), _canonical(_full(conn, "run_summary")))
    # nothing new: nothing recomputed
    assert "run_summary" not in _pass(conn).recomputed


def test_a_delete_is_logged_with_the_runs_it_changed_and_their_findings_follow(tmp_path):
    conn = _store(tmp_path)
    write = dict(op="write", state_key="k", outcome="ok", tool_name="state_write")
    _commit(conn, [make_span(0, run="run-1", agent_id="a", state_version="v1", **write),
                   make_span(5, run="run-1", agent_id="b", state_version="v2", **write)])  # fmt: skip
    _pass(conn)
    assert list(run_metric(conn, "lost_updates")["run_id"]) == ["run-1"]
    first_end = conn.execute("SELECT min(end_ns) FROM spans").fetchone()[0]
    conn.execute("BEGIN TRANSACTION")
    assert delete_expired(conn, first_end + 1, 10) == 1
    conn.execute("COMMIT")
    assert conn.execute("SELECT kind FROM change_log ORDER BY seq DESC LIMIT 1").fetchone() == ("delete",)
    report = _pass(conn)
    assert report.recomputed["lost_updates"] == 1  # run-1 alone
    assert run_metric(conn, "lost_updates").empty


def test_a_new_detector_is_maintained_live_from_its_touched_partitions(tmp_path):
    conn = _store(tmp_path)
    asked: list = []
    with scratch_registry():

        @register(
            "toy_writes",
            description="Writes per run and agent.",
            columns={"run_id": "run", "agent": "agent", "writes": "count"},
            row="one agent of one run",
            kept="run_id",
            order=[("run_id", False), ("agent", False)],
        )
        def toy_writes(conn, window: Window, filters: Filters) -> pd.DataFrame:
            params = filter_params(window, filters)
            asked.append(params["runs"])
            return conn.execute(
                "SELECT run_id, agent_id AS agent, count(*) AS writes FROM spans "
                "WHERE op = 'write' AND ($runs::VARCHAR[] IS NULL OR run_id = ANY($runs::VARCHAR[])) "
                "GROUP BY ALL ORDER BY run_id, agent",
                {"runs": params["runs"]},
            ).df()

        write = dict(op="write", state_key="k", outcome="ok")
        _commit(conn, [make_span(0, run="run-1", agent_id="a", **write),
                       make_span(0, run="run-2", agent_id="a", **write)])  # fmt: skip
        _pass(conn, ["toy_writes"])
        assert asked == [["run-1", "run-2"]] or sorted(asked[0]) == ["run-1", "run-2"]
        _commit(conn, [make_span(1, run="run-2", agent_id="b", **write)])
        _pass(conn, ["toy_writes"])
        assert asked[-1] == ["run-2"]  # only the run the commit touched
        calls = len(asked)
        got = run_metric(conn, "toy_writes")
        assert len(asked) == calls  # the answer is a SELECT over its table, nothing computed
        assert got.to_dict("records") == [
            {"run_id": "run-1", "agent": "a", "writes": 1},
            {"run_id": "run-2", "agent": "a", "writes": 1},
            {"run_id": "run-2", "agent": "b", "writes": 1},
        ]
        # a run filter is answered from the table too; a service filter computes
        assert list(run_metric(conn, "toy_writes", filters=Filters(run="run-1"))["run_id"]) == ["run-1"]
        assert len(asked) == calls
        run_metric(conn, "toy_writes", filters=Filters(service="other"))
        assert len(asked) == calls + 1


def test_a_detector_failing_on_one_partition_is_isolated_and_reported(tmp_path):
    conn = _store(tmp_path)
    with scratch_registry():

        @register(
            "toy_fragile",
            description="Fails on run-bad.",
            columns={"run_id": "run", "spans": "count"},
            row="one run",
            kept="run_id",
            order=[("run_id", False)],
        )
        def toy_fragile(conn, window: Window, filters: Filters) -> pd.DataFrame:
            runs = filter_params(window, filters)["runs"]
            if runs is not None and "run-bad" in runs:
                raise ValueError("cannot read run-bad")
            return conn.execute(
                "SELECT run_id, count(*) AS spans FROM spans "
                "WHERE $runs::VARCHAR[] IS NULL OR run_id = ANY($runs::VARCHAR[]) GROUP BY ALL ORDER BY 1",
                {"runs": runs},
            ).df()

        _commit(conn, [make_span(0, run=run, agent_id="a") for run in ("run-1", "run-bad", "run-2")])
        report = _pass(conn)
        assert "toy_fragile" in report.failed and "run-bad" in report.failed["toy_fragile"]
        state = materialize.read_states(conn)["toy_fragile"]
        assert state.failed_keys == ["run-bad"] and "cannot read run-bad" in state.last_error
        assert list(run_metric(conn, "toy_fragile")["run_id"]) == ["run-1", "run-2"]
        # the other detectors are up to date all the same
        assert materialize.ready(conn, "lost_updates") is not None
        assert "lost_updates" not in report.failed


def test_a_threshold_change_rebuilds_every_table(tmp_path):
    conn = _store(tmp_path)
    rng = random.Random(3)
    _commit(conn, _random_batch(rng, 0, ["run-1", "run-2"]) + _loop_batch(rng, 0, ["run-1", "run-2"]))
    _pass(conn)
    store_threshold(conn, "near_duplicate_similarity", 0.2, "test", {}, write=direct_write(conn))
    report = _pass(conn)
    assert (
        report.recomputed["repeated_calls"]
        == conn.execute("SELECT count(DISTINCT run_id) FROM spans").fetchone()[0]
    )
    seen: dict[str, int] = {}
    _assert_tables_equal_full(conn, seen)


def test_reads_wait_for_nothing_and_say_how_far_behind_they_are(tmp_path):
    conn = _store(tmp_path)
    write = dict(op="write", state_key="k", outcome="ok")
    _commit(conn, [make_span(0, run="run-1", agent_id="a", **write)])
    assert materialize.freshness(conn)["findings_as_of"] is None  # nothing built yet
    _pass(conn)
    fresh = materialize.freshness(conn)
    assert fresh["lag_seconds"] == 0.0 and fresh["behind_changes"] == 0
    assert fresh["findings_as_of"] is not None
    _commit(conn, [make_span(1, run="run-1", agent_id="b", **write)])
    behind = materialize.freshness(conn)
    assert behind["behind_changes"] == 1 and behind["lag_seconds"] >= 0.0
    # the tables answer at once, as of the change they reflect: b's clobbering write is not in yet
    assert run_metric(conn, "lost_updates").empty
    _pass(conn)
    assert len(run_metric(conn, "lost_updates")) == 1


def test_a_question_about_one_run_the_tables_are_behind_on_is_computed(tmp_path):
    """The run explorer of a run still streaming shows it as committed: a one-run read of a run
    changed after a table's last pass is computed from its spans; other runs read the table."""
    conn = _store(tmp_path)
    write = dict(op="write", state_key="k", outcome="ok")
    _commit(conn, [make_span(0, run="run-1", agent_id="a", **write)])
    _pass(conn)
    _commit(conn, [make_span(1, run="run-1", agent_id="b", **write), make_span(2, run="run-2", agent_id="a")])
    got = run_metric(conn, "lost_updates", filters=Filters(run="run-1"))
    assert got.attrs.get("source") != "table" and len(got) == 1  # b's clobbering write is in
    summary = run_metric(conn, "run_summary", filters=Filters(run="run-2"))  # a run no pass saw
    assert list(summary["run_id"]) == ["run-2"] and summary.attrs.get("source") != "table"
    _commit(conn, [make_span(3, run="run-3", agent_id="a")])
    _pass(conn, ["run_summary"])
    _commit(conn, [make_span(4, run="run-2", agent_id="a")])
    assert run_metric(conn, "run_summary", filters=Filters(run="run-3")).attrs["source"] == "table"
    assert run_metric(conn, "run_summary", filters=Filters(run="run-2")).attrs.get("source") != "table"


def test_consumed_change_log_entries_are_pruned(tmp_path):
    conn = _store(tmp_path)
    for t in range(3):
        _commit(conn, [make_span(t, run="run-1", agent_id="a", op="read", state_key="k")])
    _pass(conn)
    conn.execute("BEGIN TRANSACTION")
    assert materialize.prune_change_log(conn) == 2  # the newest stays: readers read its seq
    conn.execute("COMMIT")
    assert conn.execute("SELECT count(*) FROM change_log").fetchone()[0] == 1
    assert materialize.freshness(conn)["lag_seconds"] == 0.0


def test_every_registered_detector_with_a_partition_is_maintained():
    kept_facts = {name for name, metric in METRICS.items() if metric.kept is not None}
    assert kept_facts <= set(materialize.maintained())
    assert {summary.BASE_PART, summary.GOALS_PART} <= set(materialize.maintained())
    # run_summary is assembled from tables only when every detector it counts has one
    counted = {metric.name for metric in summary._summed_metrics()}
    assert counted <= set(materialize.maintained()), counted - set(materialize.maintained())
    assert BASE_TIME  # the fixtures' clock is the one the random batches use


def test_windows_and_filters_read_whole_runs_from_tables_and_compute_only_the_rest(tmp_path):
    rng = random.Random(5)
    conn = _store(tmp_path)
    _commit_table(conn, _sample_spans(SCENARIOS))
    crew = _runaway_crew(rng) + _no_progress_run(rng)
    for row in crew[::3]:  # a run of two services: a service filter cuts it
        row["ServiceName"] = "crew-r-sidecar"
    _commit(conn, crew)
    _pass(conn)
    first, last = conn.execute("SELECT min(Timestamp), max(Timestamp) FROM spans").fetchone()
    cuts = [first + (last - first) * share for share in (0.2, 0.5, 0.8)]
    windows = [Window(), Window(since=cuts[0]), Window(until=cuts[1]), Window(since=cuts[0], until=cuts[2])]

    def pick(sql: str) -> str:
        return conn.execute(sql).fetchone()[0]

    filters = [
        Filters(),
        Filters(run=pick("SELECT min(run_id) FROM spans WHERE run_id LIKE 'run-split%'")),
        Filters(service="crew-r"),
        Filters(service=pick("SELECT min(ServiceName) FROM spans WHERE ServiceName LIKE '%split%'")),
        Filters(agent=pick("SELECT min(agent_id) FROM spans WHERE op = 'write'")),
        Filters(agent=pick("SELECT min(delegate_to) FROM spans WHERE delegate_to IS NOT NULL")),
        Filters(origin_task=pick("SELECT min(origin_task_id) FROM spans WHERE origin_task_id IS NOT NULL")),
    ]
    # Every window with no filter and with a run filter (read_window's cases); each other filter
    # unwindowed and under the window cutting runs at both ends (a filter's rows of whole runs
    # read from the tables, of cut runs computed): the filters' since-only and until-only cases
    # took 9 of this test's 23 s and cut runs no differently.
    cases = [(window, scope) for window in windows[1:] for scope in filters[:2]]
    cases += [(window, scope) for scope in filters[2:] for window in (windows[0], windows[3])]
    compared = 0
    for window, scope in cases:
        fulls: dict[str, pd.DataFrame] = {}  # run_summary's reference counts these findings
        for name, item in materialize.maintained().items():
            # run_summary's parts and the comparison's tables are not detectors: no window reads
            if item.partition != "run_id" or name in materialize.PARTS or name == "run_summary":
                continue
            got = run_metric(conn, name, window, scope)
            assert got.attrs.get("source") == "table", (name, window, scope)
            full = fulls[name] = compute_metric(conn, name, window, scope)
            assert list(got.columns) == list(full.columns)
            pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=f"{name} {window} {scope}")
            compared += len(full)
        # run_summary over the window and filters: its counts read from the tables where
        # they answer (run_metric), equal to counting every detector computed from the spans
        got = run_metric(conn, "run_summary", window, scope)
        full = summary.run_summary_of(conn, fulls, window, scope)
        pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=f"run_summary {window} {scope}")
    assert compared > 0


def test_a_window_holding_a_run_whole_still_counts_its_findings_from_the_window(tmp_path):
    """run_summary over a window is not its table's rows of the runs the window holds whole: a
    run's counts there may come from spans outside the window (a constraint drop is found per
    origin task, whose ledger another run carried earlier), so they are counted from the
    detectors' answers for the window, as its full computation counts them."""
    conn = _store(tmp_path)
    task = dict(op="delegate", origin_task_id="task-x", ServiceName="crew-x")
    _commit(conn, [
        make_span(0, run="run-x-a", agent_id="planner", hop=1, delegate_to="researcher",
                  constraints_ledger=["C1", "C2"], constraints_carried=["C1", "C2"], **task),
        make_span(100, run="run-x-b", agent_id="researcher", hop=2, delegate_to="writer",
                  constraints_carried=["C1"], **task),
    ])  # fmt: skip
    _pass(conn)
    whole = run_metric(conn, "run_summary").set_index("run_id")
    assert whole.loc["run-x-b", "constraint_drops_count"] == 1  # C2 dropped at hop 2
    window = Window(since=BASE_TIME + timedelta(seconds=50))  # holds run-x-b whole, not its ledger
    got = run_metric(conn, "run_summary", window)
    full = compute_metric(conn, "run_summary", window)
    pd.testing.assert_frame_equal(_canonical(got), _canonical(full))
    drops = run_metric(conn, "constraint_drops", window)
    assert got.set_index("run_id").loc["run-x-b", "constraint_drops_count"] == len(drops)


def test_a_page_is_those_rows_of_the_whole_answer_read_from_the_table(tmp_path):
    rng = random.Random(6)
    conn = _store(tmp_path)
    _commit_table(conn, _sample_spans(SCENARIOS))
    _commit(conn, _runaway_crew(rng) + _no_progress_run(rng))
    _pass(conn)
    first, last = conn.execute("SELECT min(Timestamp), max(Timestamp) FROM spans").fetchone()
    cut = Window(since=first + (last - first) * 0.5)  # cuts runs: their rows computed, then paged
    paged, largest, most = 0, None, 0
    for name in [*materialize.maintained(), "run_summary"]:
        if name in materialize.PARTS or name in compare_kept.TABLES:
            continue
        for window in (Window(), cut):
            whole = run_metric(conn, name, window)
            if window != Window() and whole.attrs.get("source") != "table":
                continue  # kept whole: a window is computed (the computed path is held below)
            total = len(whole)
            if window == Window() and total > most:
                largest, most = name, total
            for size in (3, total + 1):
                pages, offset = [], 0
                while True:
                    page = run_metric(conn, name, window, page=Page(size, offset))
                    assert page.attrs["total_rows"] == total, (name, window, size, offset)
                    assert page.attrs["source"] == whole.attrs["source"] == "table", name
                    assert list(page.columns) == list(whole.columns) and len(page) <= size
                    if page.empty:
                        break
                    pages.append(page)
                    offset += len(page)
                got = pd.concat(pages, ignore_index=True) if pages else whole.iloc[:0]
                # the documented order, row for row: pages join up to the whole answer
                pd.testing.assert_frame_equal(got, whole, obj=f"{name} {window} pages of {size}")
                paged += total
            # a page of some columns, from an offset to the end
            columns = list(whole.columns)[:2]
            tail = run_metric(conn, name, window, Filters(), columns, Page(None, total // 2))
            pd.testing.assert_frame_equal(
                tail, whole[columns].iloc[total // 2 :].reset_index(drop=True), obj=f"{name} tail"
            )
    assert paged > 0
    # computed for the question (from the spans): computed whole, then cut, the same way
    whole = compute_metric(conn, largest)
    page = run_metric(conn, largest, Window(), Filters(from_spans=True), page=Page(2, 1))
    assert page.attrs.get("source") != "table"
    assert page.attrs["total_rows"] == len(whole) >= 3
    pd.testing.assert_frame_equal(page, whole.iloc[1:3].reset_index(drop=True))
    with pytest.raises(ValueError, match="offset must be at least 0"):
        Page(1, -1)


def _queued_pass(conn: duckdb.DuckDBPyConnection, names: list[str] | None = None) -> materialize.PassReport:
    """A pass whose writes are queued to another thread (serve's writer) without waiting."""
    from concurrent.futures import ThreadPoolExecutor

    write = direct_write(conn)
    cursor = conn.cursor()
    try:
        with ThreadPoolExecutor(max_workers=1) as writer:
            return materialize.bring_up_to_date(
                cursor, write, names, submit=lambda fn: writer.submit(write, fn)
            )
    finally:
        cursor.close()


def test_queued_writes_keep_every_table_equal_to_a_full_recomputation(tmp_path):
    """The writes of a pass queued, not awaited one by one (results that read others' tables
    wait for them): the same tables as writing each at once."""
    rng = random.Random(6)
    conn = _store(tmp_path)
    runs = ["run-1", "run-2", "run-3"]
    seen: dict[str, int] = {}
    for batch in range(tiers.batches(full=4, quick=2)):
        _commit(conn, _random_batch(rng, batch, runs) + _loop_batch(rng, batch, runs))
        report = _queued_pass(conn)
        assert not report.failed
        _assert_tables_equal_full(conn, seen)


def test_each_result_is_brought_up_to_the_newest_change_when_its_turn_comes(tmp_path):
    """Spans committed during a pass: the results computed after them reflect them (a pass of
    several seconds under ingest no longer leaves every result as old as the pass's start), each
    result's state claims no more than its table holds, and none goes past what it reads."""
    rng = random.Random(11)
    conn = _store(tmp_path)
    runs = ["run-1", "run-2", "run-3"]
    for batch in range(2):
        _commit(conn, _random_batch(rng, batch, runs) + _loop_batch(rng, batch, runs))
        assert not _pass(conn).failed
    _commit(conn, _random_batch(rng, 2, runs) + _loop_batch(rng, 2, runs))
    before = materialize.newest_change(conn)
    turns: list[str] = []

    def between(name: str) -> None:  # half way through the pass, more spans commit
        turns.append(name)
        if len(turns) == 8:
            _commit(conn, _random_batch(rng, 3, runs) + _loop_batch(rng, 3, runs))

    cursor = conn.cursor()
    try:
        report = materialize.bring_up_to_date(cursor, direct_write(conn), between=between)
    finally:
        cursor.close()
    assert not report.failed and len(turns) > 8
    newest = materialize.newest_change(conn)
    assert newest > before
    states = materialize.read_states(conn)
    items = materialize.maintained()
    seqs = {name: states[name].seq for name in items}
    assert {seqs[name] for name in turns[:7]} == {before}
    later = [name for name in turns[8:] if seqs[name] == newest]
    assert later, seqs  # brought up to the change committed during the pass
    for name, item in items.items():
        assert all(seqs[name] <= seqs[first] for first in item.depends), name
    for name in later:  # a state at the newest change: the table holds every span committed
        if name in METRICS:
            got, full = run_metric(conn, name), _full(conn, name)
            pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=name)
    assert materialize.freshness(conn)["behind_changes"] == newest - before
    assert not _pass(conn).failed
    _assert_tables_equal_full(conn, {})


def test_run_summary_is_visited_midway_and_takes_in_what_its_inputs_reflect_then(tmp_path):
    """run_summary reads results spread over the whole pass: visited only after the last, it
    reflected the pass's first result (up to two passes behind). Visited midway too, it takes
    in what every input reflects at that point, the inputs later in the pass at the change their
    previous visit reached."""
    order = materialize.visit_order(materialize.maintained())
    assert order.count(summary.SUMMARY) == 2 and order[-1] != summary.SUMMARY
    middle = order.index(summary.SUMMARY)
    assert any(n in summary._summary_depends() for n in order[middle + 1 :])  # inputs after it
    rng = random.Random(5)
    conn = _store(tmp_path)
    runs = ["run-1", "run-2", "run-3"]
    _commit(conn, _random_batch(rng, 0, runs) + _loop_batch(rng, 0, runs))
    assert not _pass(conn).failed
    _commit(conn, _random_batch(rng, 1, runs) + _loop_batch(rng, 1, runs))
    first = materialize.newest_change(conn)
    seen: dict[str, int] = {}

    def commit_at(turn: str, key: str):
        def between(name: str) -> None:
            if name == turn and key not in seen:
                _commit(conn, _random_batch(rng, len(seen) + 2, runs) + _loop_batch(rng, len(seen) + 2, runs))
                seen[key] = materialize.newest_change(conn)
            if name == order[middle + 1] and "second" in seen and "midway" not in seen:
                seen["midway"] = materialize.read_states(conn)[summary.SUMMARY].seq

        return between

    # spans commit as the pass reaches its second result: the rest of the pass reflects them
    assert not _pass(conn, between=commit_at(order[1], "first")).failed
    states = materialize.read_states(conn)
    assert states[order[0]].seq == first and states[order[1]].seq == seen["first"]
    assert states[summary.SUMMARY].seq == first  # what its first input reflects
    # the next pass, spans committing at its start: midway, run_summary reflects what its inputs
    # did then (the later ones as the last pass left them), not what its first input did
    assert not _pass(conn, between=commit_at(order[0], "second")).failed
    assert seen["midway"] == seen["first"]
    assert materialize.read_states(conn)[summary.SUMMARY].seq == seen["second"]
    assert not _pass(conn).failed
    _assert_tables_equal_full(conn, {})


def test_results_kept_whole_are_recomputed_as_often_as_they_are_cheap(monkeypatch):
    """Under ingest a result kept whole waits WHOLE_COST_RATIO times its cost, the least of its
    last WHOLE_COST_SAMPLES computations (never less than WHOLE_MIN_INTERVAL_S): a cheap one
    follows every pass of a few seconds, a costly one takes at most a fifth of the
    materializer's time, one stalled computation does not hold it."""
    clock = [100.0]
    monkeypatch.setattr(materialize.time, "monotonic", lambda: clock[0])
    due = materialize.WholeSchedule()
    assert due("cheap") and due("costly")  # never computed: due
    due.took({"cheap": 0.1, "costly": 2.0})
    clock[0] += materialize.WHOLE_MIN_INTERVAL_S - 0.01
    assert not due("cheap") and not due("costly")
    clock[0] += 0.02
    assert due("cheap") and not due("costly")
    clock[0] = 100.0 + materialize.WHOLE_COST_RATIO * 2.0 - 0.01
    assert not due("costly")
    clock[0] += 0.02
    assert due("costly")
    due.took({"costly": 0.0})  # got cheap: the floor alone
    clock[0] += materialize.WHOLE_MIN_INTERVAL_S
    assert due("costly")
    # one computation stalled (a checkpoint) among cheap ones: not held for five times the stall
    due.took({"cheap": 0.1})
    due.took({"cheap": 3.0})
    clock[0] += materialize.WHOLE_MIN_INTERVAL_S + 0.01
    assert due("cheap")
    # costly in each of its last computations: held again
    for _ in range(materialize.WHOLE_COST_SAMPLES):
        due.took({"cheap": 1.0})
    clock[0] += materialize.WHOLE_COST_RATIO * 1.0 - 0.02
    assert not due("cheap")
    clock[0] += 0.03
    assert due("cheap")


def test_a_queued_write_that_fails_is_reported_and_the_others_land(tmp_path):
    conn = _store(tmp_path)
    _commit(conn, [make_span(0, run="run-1", agent_id="a")])
    assert not _queued_pass(conn).failed
    with scratch_registry():

        @register(
            "toy_retyped",
            description="Its column changes type without a version bump.",
            columns={"run_id": "run", "value": "a value"},
            row="one run",
            kept="run_id",
            order=[("run_id", False)],
        )
        def toy_retyped(conn, window: Window, filters: Filters) -> pd.DataFrame:
            typed = "1" if materialize.table_exists(conn, "findings__toy_retyped") else "1::BIGINT"
            return conn.execute(f"SELECT run_id, {typed} AS value FROM spans GROUP BY ALL").df()

        assert not _queued_pass(conn).failed
        _commit(conn, [make_span(1, run="run-1", agent_id="a")])
        conn.execute("UPDATE findings__toy_retyped SET value = 2")
        conn.execute("ALTER TABLE findings__toy_retyped ALTER value TYPE VARCHAR")
        report = _queued_pass(conn)
        assert (
            "toy_retyped" in report.failed and "bump the detector's version" in report.failed["toy_retyped"]
        )
        assert "bump the detector's version" in materialize.read_states(conn)["toy_retyped"].last_error
        assert "lost_updates" not in report.failed
        assert materialize.ready(conn, "lost_updates").seq == materialize.newest_change(conn)


def test_run_summary_read_while_its_parts_are_built_on_an_empty_store(tmp_path):
    """A first pass on an empty store builds run_summary's parts before run_summary itself: a
    part with no run has no table yet. A read of run_summary in between assembles it from the
    parts and must answer (from the spans that arrived meanwhile), not fail on the tableless part."""
    conn = _store(tmp_path)
    assert not _pass(conn, list(summary._summary_depends())).failed
    assert materialize.ready(conn, summary.BASE_PART) is not None
    assert not materialize.table_exists(conn, materialize.TABLE_PREFIX + summary.BASE_PART)
    assert materialize.ready(conn, summary.SUMMARY) is None
    _commit(conn, [make_span(1, run="run-1", agent_id="worker", tool_name="search", tool_args={"q": "a"})])
    got = run_metric(conn, "run_summary")
    assert list(got["run_id"]) == ["run-1"]


def test_the_span_steps_first_build_in_run_chunks_equals_one_computation(tmp_path, monkeypatch):
    """compare_span_steps' first build goes a chunk of runs at a time (every span's steps at
    once held +5 GiB at 10M spans): the parts together are every span's steps, once each, and
    folding new spans into them afterwards still holds."""
    import dataclasses

    rng = random.Random(11)
    conn = _store(tmp_path)
    runs = [f"run-{i}" for i in range(6)]
    for batch in range(4):
        _commit(conn, _random_batch(rng, batch, runs) + _loop_batch(rng, batch, runs))
    monkeypatch.setattr(compare_kept, "BUILD_CHUNK_SPANS", 8)
    parts: list[int] = []
    item = materialize._items[compare_kept.SPAN_STEPS]

    def counted(cursor, target):
        for part in item.build(cursor, target):
            parts.append(part.num_rows)
            yield part

    monkeypatch.setitem(materialize._items, compare_kept.SPAN_STEPS, dataclasses.replace(item, build=counted))
    assert not _pass(conn).failed
    assert len(parts) >= 3 and all(parts)

    def assert_steps_whole() -> None:
        table = "findings__" + compare_kept.SPAN_STEPS
        got = conn.sql(f"SELECT * EXCLUDE (_pos) FROM {table} ORDER BY TraceId, SpanId").to_arrow_table()
        full = compare_kept._span_steps(conn, None, None).sort_by(
            [("TraceId", "ascending"), ("SpanId", "ascending")]
        )
        assert (
            got.num_rows
            == full.num_rows
            == conn.execute("SELECT count(*) FROM spans WHERE run_id IS NOT NULL").fetchone()[0]
        )
        assert got.to_pylist() == full.select(got.column_names).to_pylist()

    assert_steps_whole()
    _assert_tables_equal_full(conn, {})
    _commit(conn, _random_batch(rng, 4, runs))
    assert not _pass(conn).failed
    assert_steps_whole()
    _assert_tables_equal_full(conn, {})


def test_between_results_a_pass_yields_to_queued_ingest_while_it_lasts_and_up_to_its_cap(
    tmp_path, monkeypatch
):
    """Requests queued for the writer (INGEST_BACKLOG or more): the materializer waits, polling
    every INGEST_POLL_S, and goes on at the first poll that finds the backlog gone; a backlog
    that never clears holds a pass INGEST_MAX_DEFER_S at most (the findings still move)."""
    conn = _store(tmp_path)
    monkeypatch.setattr(materialize, "INGEST_POLL_S", 0.01)
    seen: list[int] = []
    backlog = iter([1, materialize.INGEST_BACKLOG, 5, materialize.INGEST_BACKLOG, 0, 9])

    def queued() -> int:
        seen.append(next(backlog))
        return seen[-1]

    worker = materialize.Materializer(conn.cursor, direct_write(conn), ingest_backlog=queued)
    worker._yield_to_ingest("first")  # one request queued: no wait
    assert seen == [1] and worker.deferred_seconds == 0
    worker._yield_to_ingest("second")  # three polls while it lasted, the fourth found it gone
    assert seen == [1, materialize.INGEST_BACKLOG, 5, materialize.INGEST_BACKLOG, 0]
    assert worker.deferred_seconds == pytest.approx(0.03)
    monkeypatch.setattr(materialize, "INGEST_MAX_DEFER_S", 0.05)
    stuck = materialize.Materializer(conn.cursor, direct_write(conn), ingest_backlog=lambda: 9)
    stuck._yield_to_ingest("a")
    stuck._yield_to_ingest("b")  # the pass's allowance is spent: no more waiting
    assert stuck.deferred_seconds == pytest.approx(0.05)
    stuck.run_once(conn.cursor())  # a new pass: a new allowance (spent before its first result)
    assert stuck.deferred_seconds == pytest.approx(0.10)
    # requests queued behind a writer that spent little of its recent time committing spans (a
    # stream below the store's capacity, queued behind one commit): no wait; at capacity, waits
    shares = iter([0.1, materialize.INGEST_SHARE, materialize.INGEST_SHARE, 0.2])
    windows: list[float] = []

    def share(window: float) -> float:
        windows.append(window)
        return next(shares)

    steady = materialize.Materializer(
        conn.cursor, direct_write(conn), ingest_backlog=lambda: 9, ingest_share=share
    )
    steady._yield_to_ingest("below")
    assert steady.deferred_seconds == 0
    steady._yield_to_ingest("at capacity")  # two polls at capacity, the third found it below
    assert steady.deferred_seconds == pytest.approx(0.02)
    assert windows == [materialize.INGEST_SHARE_WINDOW_S] * 4


@pytest.mark.parametrize("partition", [None, "run_id"])
def test_stopping_interrupts_the_running_computation_and_records_no_failure(tmp_path, partition):
    """A first build at 10M computes one result for minutes; serve's shutdown stopped the
    materializer with a 30 s join and then closed the store under its running query (the process
    aborted). Stop now interrupts that query and ends before the next result. A result kept by
    run is not isolated run by run when interrupted: that took each of 100 runs' interrupt in
    turn, 0.5 s apart, past serve's join (CI aborted the same way)."""
    import threading
    import time

    conn = _store(tmp_path)
    runs = 1 if partition is None else 100
    _commit(
        conn,
        [make_span(i, run=f"run-{i}", agent_id="a", tool_name="t", tool_args={"q": 1}) for i in range(runs)],
    )
    started = threading.Event()

    def slow(cursor, partition, keys):
        started.set()  # minutes of work unless interrupted
        return cursor.execute("SELECT sum(hash(range)) AS n FROM range(100000000000)").df()

    materialize.maintain(materialize.Maintained("toy_slow", partition, slow, (), "1"))
    try:
        worker = materialize.Materializer(conn.cursor, direct_write(conn))
        worker.start()
        assert started.wait(120)
        asked = time.monotonic()
        worker.stop(timeout=60)
        assert not worker.is_alive()
        assert time.monotonic() - asked < 30
        states = materialize.read_states(conn)
        slow_state = states.get("toy_slow")  # interrupted: neither built nor failed
        assert slow_state is None or (
            slow_state.seq is None and not slow_state.failed_keys and slow_state.last_error is None
        )
        assert states["repeated_calls"].seq is not None  # what came before it stays built
        assert worker.last_error is None
        assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == runs
    finally:
        materialize.forget("toy_slow")
