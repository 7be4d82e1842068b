"""Detector results kept per data version equal a full recomputation after every batch."""

from __future__ import annotations

import ast
import gc
import json
import random
import time
from datetime import timedelta

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from analytics import METRICS, Filters, Window, kept, kept_store, kept_worker, read, run_metric, summary
from analytics.side_effects import configure_side_effect_tools
from analytics.types import direct_write
from driftscope.database import migrate
from tests import tiers
from tests.analytics.test_summary import _random_batch
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, trace_id


def _full(conn, name, window, filters) -> pd.DataFrame:
    with kept.computed_in_full():
        return run_metric(conn, name, window, filters)


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells as text, rows sorted: two frames equal up to the order of rows tied on the
    detector's own ORDER BY (which a full run leaves to DuckDB as well)."""
    out = frame.copy()
    for column in out.columns:
        out[column] = [repr(list(v)) if isinstance(v, list | tuple) else repr(v) for v in out[column]]
    return out.sort_values(list(out.columns)).reset_index(drop=True)


def _equal_as_is(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Same cells in the same order (stricter than equal up to tied rows); False where pandas
    cannot compare the cells element-wise."""
    try:
        return bool(a.equals(b))
    except (TypeError, ValueError):
        return False


def _assert_same(got: pd.DataFrame, full: pd.DataFrame, name: str) -> None:
    assert list(got.columns) == list(full.columns), name
    assert list(got.dtypes) == list(full.dtypes), name
    if not _equal_as_is(got, full):  # rows tied on the ORDER BY may come in another order
        pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=name)
    order = kept.ORDER.get(name)
    if order and len(got) > 1:  # the merged rows are in the detector's order
        pd.testing.assert_frame_equal(kept._sorted(got, order), got, obj=name)


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


@pytest.mark.parametrize(
    "seed",
    [
        0,  # make test-fast: one seed, three batches (tests/tiers.py); make test: two; make test-deep: sixteen
        pytest.param(1, marks=pytest.mark.slow),
        *(pytest.param(s, marks=pytest.mark.deep) for s in range(2, 16)),
    ],
)
def test_kept_results_equal_a_full_recomputation_after_every_batch(tmp_path, seed):
    rng = random.Random(seed)
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    runs = [f"run-{i}" for i in range(rng.randint(2, 6))]
    scopes = [(Window(), Filters()), (Window(), Filters(agent="a")),
              (Window(since=BASE_TIME + timedelta(seconds=8)), Filters(origin_task="t1"))]  # fmt: skip
    kept.clear_cache()
    before = kept.stats.copy()
    for batch in range(tiers.batches(full=6, quick=3)):
        insert_spans(conn, _random_batch(rng, batch, runs) + _loop_batch(rng, batch, runs))
        if rng.random() < 0.3:
            # The collector fills inherited fields of earlier spans of a trace in the commit that
            # stores new spans of that trace (the new span starts 1 us later: detectors break
            # ties of start times arbitrarily, in full runs as well).
            trace = trace_id(f"{rng.choice(runs)}/0")
            conn.execute("UPDATE spans SET agent_id = 'c' WHERE agent_id IS NULL AND TraceId = ?", [trace])
            conn.execute("INSERT INTO spans SELECT * REPLACE (SpanId || 'x' AS SpanId, "
                         "ingested_at + INTERVAL 1 MICROSECOND AS ingested_at, "
                         "Timestamp + INTERVAL 1 MICROSECOND AS Timestamp, start_ns + 1000 AS start_ns, "
                         "end_ns + 1000 AS end_ns) FROM spans WHERE TraceId = ? LIMIT 1", [trace])  # fmt: skip
        for window, filters in scopes:
            for name in sorted(kept.KEPT):
                _assert_same(
                    run_metric(conn, name, window, filters), _full(conn, name, window, filters), name
                )
    assert kept.stats["partial"] > before["partial"]  # the incremental path was taken
    assert kept.stats["refined"] > before["refined"]  # repeated_calls: only the changed groups


def test_unchanged_data_answers_from_the_kept_result_and_new_spans_touch_only_their_run(tmp_path):
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    kept.clear_cache()
    write = dict(op="write", state_key="k", outcome="ok", tool_name="state_write")
    insert_spans(conn, [make_span(0, run="run-1", agent_id="a", state_version="v1", **write),
                        make_span(0, run="run-2", agent_id="a", state_version="v1", **write)])  # fmt: skip
    assert run_metric(conn, "lost_updates").empty
    before = kept.stats.copy()
    assert run_metric(conn, "lost_updates").empty
    assert kept.stats["unchanged"] == before["unchanged"] + 1
    # b clobbers a's write in run-2: only run-2 is recomputed, and its finding appears
    insert_spans(conn, [make_span(1, run="run-2", agent_id="b", state_version="v2", **write)])
    found = run_metric(conn, "lost_updates")
    assert kept.stats["partial"] == before["partial"] + 1
    assert list(found["run_id"]) == ["run-2"]
    # a delete cannot be followed span by span: a full run, and the finding is gone
    conn.execute("DELETE FROM spans WHERE agent_id = 'b'")
    assert run_metric(conn, "lost_updates").empty
    assert kept.stats["full"] > before["full"]


def test_kept_results_follow_a_changed_side_effect_pattern(tmp_path):
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    kept.clear_cache()
    send = dict(tool_name="post_invoice", tool_args={"to": "x"}, outcome="ok")
    insert_spans(conn, [make_span(0, agent_id="a", **send), make_span(1, agent_id="a", **send)])
    assert len(run_metric(conn, "duplicate_side_effects")) == 1  # "post" is a side-effect verb
    try:
        configure_side_effect_tools(r"^charge_")
        assert run_metric(conn, "duplicate_side_effects").empty  # not kept from the other pattern
    finally:
        configure_side_effect_tools(None)
    assert len(run_metric(conn, "duplicate_side_effects")) == 1


def random_store(
    tmp_path, rng: random.Random, batches: int, most_runs: int = 6
) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    """A file database of ``batches`` random batches (every kind the kept detectors look at) over
    2 to ``most_runs`` runs."""
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    runs = [f"run-{i}" for i in range(rng.randint(2, most_runs))]
    for batch in range(batches):
        insert_spans(conn, _random_batch(rng, batch, runs) + _loop_batch(rng, batch, runs))
    return conn, runs


def _stored_conn(tmp_path, seed: int) -> tuple[duckdb.DuckDBPyConnection, random.Random, list[str]]:
    """A file database with random spans, every kept detector and run_summary computed and stored
    (as serve's background refresh stores them), and nothing kept in this process."""
    rng = random.Random(seed)
    conn, runs = random_store(tmp_path, rng, batches=3)
    kept.clear_cache()
    summary.clear_cache()
    kept_worker.refresh(conn)
    assert kept_worker.store(conn, direct_write(conn)) == len(kept.KEPT) + 1
    assert kept_worker.store(conn, direct_write(conn)) == 0  # nothing new to store
    kept.clear_cache()
    summary.clear_cache()
    return conn, rng, runs


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_stored_results_answer_a_fresh_process_and_are_brought_up_to_date(tmp_path, seed):
    conn, rng, runs = _stored_conn(tmp_path, seed)
    before = kept.stats.copy()
    for name in sorted(kept.KEPT):  # a restarted process: read from the store, not computed
        _assert_same(run_metric(conn, name), _full(conn, name, Window(), Filters()), name)
    assert kept.stats["loaded"] == before["loaded"] + len(kept.KEPT)
    assert kept.stats["full"] == before["full"]
    pd.testing.assert_frame_equal(
        run_metric(conn, "run_summary"), _full(conn, "run_summary", Window(), Filters())
    )
    # new spans after the restart: the stored results are brought up to date like kept ones
    kept.clear_cache()
    summary.clear_cache()
    insert_spans(conn, _random_batch(rng, 3, runs) + _loop_batch(rng, 3, runs))
    for name in [*sorted(kept.KEPT), "run_summary"]:
        _assert_same(run_metric(conn, name), _full(conn, name, Window(), Filters()), name)


def test_stored_results_serve_a_read_only_copy_and_other_code_or_scopes_are_not_used(tmp_path):
    conn, _, _ = _stored_conn(tmp_path, 3)
    expected = {name: _full(conn, name, Window(), Filters()) for name in [*sorted(kept.KEPT), "run_summary"]}
    # another code's rows are never used (a changed detector computes again)
    conn.execute("UPDATE kept_results SET code = 'other' WHERE metric = 'lost_updates'")
    conn.close()
    kept_store.forget_fetched()  # the reader is a fresh process: nothing fetched before the change
    reader = duckdb.connect(str(tmp_path / "spans.duckdb"), read_only=True)
    before = kept.stats.copy()
    for name, frame in expected.items():
        _assert_same(run_metric(reader, name), frame, name)
    assert kept.stats["loaded"] == before["loaded"] + len(kept.KEPT) - 1
    assert kept.stats["full"] == before["full"] + 1  # lost_updates
    # a scope nothing was stored for is computed (and nothing is written on a read-only file)
    agent = Filters(agent="a")
    _assert_same(
        run_metric(reader, "repeated_calls", filters=agent),
        _full(reader, "repeated_calls", Window(), agent),
        "x",
    )
    assert kept.stats["full"] == before["full"] + 2
    reader.close()


def test_stored_frames_round_trip_exactly_or_are_not_stored():
    frame = pd.DataFrame(
        {
            "span_ids": [["a", "b"], ["c"]],
            "arrays": [pd.array([1, 2]).to_numpy(), pd.array([3]).to_numpy()],
            "when": pd.to_datetime(["2026-01-01", "2026-01-02"]).as_unit("us"),
            "nothing": [None, None],
            "flag": [True, None],
            "n": [1, 2],
        }
    )
    back = kept_store.decode(kept_store.encode(frame))
    pd.testing.assert_frame_equal(back, frame)
    assert [type(v) for v in back["span_ids"]] == [list, list]
    assert kept_store.encode(pd.DataFrame({"mixed": [1, "a"]})) is None  # no exact Arrow form


def test_list_columns_come_back_as_lists_in_their_place():
    frame = pd.DataFrame(
        {
            "ids": [["a", "b"], [], None, ["d"]],
            "n": [1, 2, 3, 4],
            "agents": [["x"], ["y", "z"], ["x", "x"], []],
            "name": ["p", None, "r", "s"],
        },
        index=[3, 1, 7, 0],
    )
    back = kept_store.decode(kept_store.encode(frame))
    pd.testing.assert_frame_equal(back, frame)
    assert list(back.columns) == ["ids", "n", "agents", "name"]
    assert back["ids"].tolist() == [["a", "b"], [], None, ["d"]]
    assert all(type(v) is list for v in back["agents"])
    assert gc.isenabled()  # paused only while the lists were built


def test_kept_rows_whose_text_column_is_all_missing_take_the_type_duckdb_gives_them():
    """A subset of a whole result (a run filter, a derived window, a partition update) must type a
    text column as computing the subset would: DuckDB gives text only when some value is there."""
    conn = duckdb.connect()
    sql = (
        "SELECT * FROM (VALUES ('r1', 'tool', TIMESTAMP '2026-01-01 00:00:01'), "
        "('r2', NULL, TIMESTAMP '2026-01-01 00:00:02'), ('r3', NULL, TIMESTAMP '2026-01-01 00:00:03')) "
        "AS t(run_id, via, first_seen) WHERE run_id IN ({}) ORDER BY first_seen"
    )
    whole = conn.execute(sql.format("'r1', 'r2', 'r3'")).df()
    assert str(whole["via"].dtype) != "object"  # text: r1 has a value
    alone = conn.execute(sql.format("'r2', 'r3'")).df()
    assert alone["via"].dtype == object  # all NULL: objects
    # the rows of r2 kept, r3 computed again (the partition update)
    fresh = conn.execute(sql.format("'r3'")).df()
    merged = kept.merge_rows(whole, whole["run_id"] == "r2", fresh, "ping_pong")
    pd.testing.assert_frame_equal(merged, alone)
    assert merged["via"].tolist() == [None, None]
    # the rows of r2 and r3 kept, nothing new (a run filter derived from the whole result)
    subset = kept.merge_rows(whole, whole["run_id"] != "r1", fresh.iloc[:0], "ping_pong")
    pd.testing.assert_frame_equal(subset, alone)
    # a subset that keeps a value keeps the text type
    with_text = kept.merge_rows(whole, whole["run_id"] != "r3", fresh.iloc[:0], "ping_pong")
    pd.testing.assert_frame_equal(with_text, conn.execute(sql.format("'r1', 'r2'")).df())


def test_code_hash_is_per_detector_module_and_its_sql():
    loops = kept_store._dependencies("loops.py")
    assert {"sql/repeated_calls.sql", "sql/loop_touched_groups.sql", "sql/_filtered_spans.sql"} <= loops
    assert {"kept.py", "kept_store.py", "sql_loader.py"} <= loops  # what keeps and stores it
    assert "sql/constraint_ledger.sql" not in loops and "constraints.py" not in loops
    codes = summary.result_codes()
    assert codes["repeated_calls"] != codes["constraint_ledger"]
    assert codes["repeated_calls"] == codes["ping_pong"]  # one module
    assert len({codes[n] for n in kept.KEPT}) > 3
    # run_summary is assembled from every kept detector's result: their sources are its own
    assert codes["run_summary"] not in {codes[n] for n in kept.KEPT}


def _parsed_dependencies(path: str) -> set[str]:
    """What ``path`` depends on, read with ``ast``: the imported analytics modules and the SQL
    files named by a string constant passed to a call."""
    sources = kept_store._sources()
    sql = {name.removeprefix("sql/").removesuffix(".sql") for name in sources if name.startswith("sql/")}
    found = set()
    for node in ast.walk(ast.parse(sources[path])):
        if isinstance(node, ast.Import):
            found.update(kept_store._module_path(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(kept_store._module_path(node.module))
            found.update(kept_store._module_path(f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call):
            for arg in [*node.args, *(keyword.value for keyword in node.keywords)]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value in sql:
                    found.add(f"sql/{arg.value}.sql")
    return {
        name for name in found if name is not None and name != "__init__.py"
    } - kept_store._NOT_KEPT_ENGINES


def test_the_code_hash_reads_the_dependencies_python_itself_would_parse():
    """The code hash reads imports and SQL names as text (parsing every module cost a process's
    first stored read 0.14-0.24 CPU-s): on every analytics source it finds what ``ast`` finds."""
    modules = [name for name in kept_store._sources() if name.endswith(".py")]
    assert len(modules) > 20
    for module in modules:
        assert set(kept_store._direct_dependencies(module)) == _parsed_dependencies(module), module


def test_a_stored_row_of_other_code_is_dropped_only_for_its_own_detector(tmp_path):
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    insert_spans(conn, [make_span(0, run="run-1", agent_id="a", tool_name="t")])
    kept.clear_cache()
    for name in ("lost_updates", "constraint_ledger"):
        run_metric(conn, name)
    assert kept_worker.store(conn, direct_write(conn)) == 2
    conn.execute("UPDATE kept_results SET code = 'other' WHERE metric = 'lost_updates'")
    kept.clear_cache()
    before = kept.stats.copy()
    run_metric(conn, "constraint_ledger")
    run_metric(conn, "lost_updates")
    assert kept.stats["loaded"] == before["loaded"] + 1  # the ledger's row is still this code's
    assert kept.stats["full"] == before["full"] + 1
    assert kept_worker.store(conn, direct_write(conn)) == 1
    rows = conn.execute("SELECT metric, code FROM kept_results ORDER BY metric").fetchall()
    assert rows == [(name, summary.result_codes()[name]) for name in ("constraint_ledger", "lost_updates")]


@pytest.mark.parametrize("too_large", ["none", "half"])
def test_a_scope_s_stored_rows_are_fetched_once_for_all_its_reads(tmp_path, monkeypatch, too_large):
    """The first read fetches every stored row of its scope for the reads that follow, except
    frames over ``FETCH_AHEAD_BYTES`` ("half": half of them), fetched at their own read; every
    read is answered from the store, none computed again."""
    conn, _, _ = _stored_conn(tmp_path, 3)
    names = [*sorted(kept.KEPT), "run_summary"]
    sizes = dict(conn.execute("SELECT metric, octet_length(frame) FROM kept_results").fetchall())
    limit = kept_store.FETCH_AHEAD_BYTES if too_large == "none" else sorted(sizes.values())[len(sizes) // 2]
    monkeypatch.setattr(kept_store, "FETCH_AHEAD_BYTES", limit)
    expected = {name: _full(conn, name, Window(), Filters()) for name in names}
    kept.clear_cache()
    summary.clear_cache()
    before = kept.stats.copy()
    _assert_same(run_metric(conn, names[0]), expected[names[0]], names[0])
    (fetched,) = [rows for _, rows in kept_store._fetched.values()]
    assert set(fetched) == set(names[1:])  # the others wait, undecoded, for their reads
    large = {name for name, (_, _, frame) in fetched.items() if frame is None}
    assert large == {name for name in names[1:] if sizes[name] > limit}
    assert bool(large) == (too_large == "half")
    for name in names[1:]:
        _assert_same(run_metric(conn, name), expected[name], name)
    assert not fetched and kept.stats["loaded"] == before["loaded"] + len(kept.KEPT)
    assert kept.stats["full"] == before["full"]  # the large ones were read, not computed again


def test_kept_worker_refreshes_after_commits_and_stores_through_its_write_function(tmp_path):
    path = tmp_path / "spans.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn)
    kept.clear_cache()
    summary.clear_cache()
    write = dict(op="write", state_key="k", outcome="ok", tool_name="state_write")
    insert_spans(conn, [make_span(0, run="run-1", agent_id="a", state_version="v1", **write)])
    writes = []
    writer_conn = conn.cursor()

    def through_writer(fn):  # what serve's SpanWriter.execute_write_fn does, counted
        writes.append(fn)
        return direct_write(writer_conn)(fn)

    worker = kept_worker.KeptWorker(
        conn.cursor, through_writer, min_gap_s=0.01, quiet_s=0.01, store_every_s=0
    )
    worker.start()
    try:
        assert worker.idle.wait(60)
        assert worker.passes == 1 and not writes  # no commit yet: a read-only serve writes nothing
        assert gc.get_freeze_count() > 0  # what the pass kept is out of the collector's sight
        insert_spans(conn, [make_span(1, run="run-1", agent_id="b", state_version="v2", **write)])
        worker.notify()
        deadline = time.monotonic() + 60
        while not (worker.idle.is_set() and writes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert writes and worker.stored == len(kept.KEPT) + 1
    finally:
        worker.stop()
        gc.unfreeze()
    assert worker.last_error is None
    stored = dict(conn.execute("SELECT metric, rows FROM kept_results").fetchall())
    assert stored["lost_updates"] == 1 and set(stored) == {*kept.KEPT, "run_summary"}
    kept.clear_cache()
    before = kept.stats.copy()
    assert list(run_metric(conn, "lost_updates")["run_id"]) == ["run-1"]
    assert kept.stats["loaded"] == before["loaded"] + 1


@pytest.mark.parametrize("seed", [4, pytest.param(5, marks=pytest.mark.slow)])
def test_a_detector_computed_from_nothing_in_chunks_of_runs_equals_one_pass(tmp_path, seed, monkeypatch):
    rng = random.Random(seed)
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    runs = [f"run-{i}" for i in range(6)]
    for batch in range(4):
        insert_spans(conn, _random_batch(rng, batch, runs) + _loop_batch(rng, batch, runs))
    monkeypatch.setattr(kept, "CHUNK_SPANS", 8)
    for window, filters in [(Window(), Filters()), (Window(), Filters(agent="a"))]:
        kept.clear_cache()
        before = kept.stats.copy()
        got = run_metric(conn, "repeated_calls", window, filters)
        assert kept.stats["chunks"] > before["chunks"] + 2
        one_pass = METRICS["repeated_calls"].func(conn, window, filters)  # the detector itself, unchunked
        _assert_same(got, one_pass, "repeated_calls")
        # A reference in full (nothing kept) is computed in the same chunks: the same rows.
        before = kept.stats.copy()
        _assert_same(_full(conn, "repeated_calls", window, filters), one_pass, "repeated_calls")
        assert kept.stats["chunks"] > before["chunks"] + 2


def _projection(frame: pd.DataFrame) -> list[str]:
    """A few columns in an order of their own: a list column when the frame has one, then
    run_id and first_seen (those it has)."""
    lists = [c for c in frame.columns if any(isinstance(v, list) for v in frame[c])]
    return [c for c in [*lists[:1], "first_seen", "run_id"] if c in frame.columns] or [frame.columns[-1]]


def test_a_projection_read_equals_those_columns_of_the_whole_frame(tmp_path):
    conn, rng, runs = _stored_conn(tmp_path, 3)
    names = [*sorted(kept.KEPT), "run_summary"]
    expected = {name: _full(conn, name, Window(), Filters()) for name in names}
    wanted = {name: _projection(frame) for name, frame in expected.items()}
    before = kept.stats.copy()
    # stored and up to date: only those columns decoded, nothing kept
    projected = {name: read.metric(conn, name, columns=wanted[name]) for name in names}
    assert kept.stats["loaded_columns"] == before["loaded_columns"] + len(kept.KEPT)
    assert kept.stats["loaded"] == before["loaded"] and not kept._cache
    for name in names:  # a whole read after it is whole (the store read again), and the same
        whole = read.metric(conn, name)
        _assert_same(whole, expected[name], name)
        pd.testing.assert_frame_equal(projected[name], whole[wanted[name]], obj=name)
    # new spans: brought up to date (or computed) whole, then projected; then from the kept frame
    kept.clear_cache()
    summary.clear_cache()
    insert_spans(conn, _random_batch(rng, 3, runs) + _loop_batch(rng, 3, runs))
    for name in names:
        got = read.metric(conn, name, columns=wanted[name])
        whole = read.metric(conn, name)
        _assert_same(whole, _full(conn, name, Window(), Filters()), name)
        pd.testing.assert_frame_equal(got, whole[wanted[name]], obj=name)
        pd.testing.assert_frame_equal(read.metric(conn, name, columns=wanted[name]), got, obj=name)
    with pytest.raises(ValueError, match="documented columns .* got 'nope'"):
        read.metric(conn, "repeated_calls", columns=["run_id", "nope"])


def test_a_stored_frame_decodes_only_the_columns_asked_for():
    frame = pd.DataFrame({"ids": [["a"], None], "n": [1, 2], "agents": [["x"], []]}, index=[4, 2])
    data = kept_store.encode(frame)
    pd.testing.assert_frame_equal(kept_store.decode(data, ["n", "ids"]), frame[["n", "ids"]])
    pd.testing.assert_frame_equal(kept_store.decode(data, ["agents"]), frame[["agents"]])


def test_a_stored_frame_decodes_only_the_rows_of_the_runs_asked_for():
    frame = pd.DataFrame({"run_id": ["r1", "r2", "r1", "r3"], "ids": [["a"], None, [], ["b", "c"]],
                          "n": [1, 2, 3, 4]})  # fmt: skip
    data = kept_store.encode(frame)
    want = frame[frame["run_id"].isin({"r1", "r3"})].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept_store.decode_runs(data, {"r1", "r3", "r9"}), want)
    none = kept_store.decode_runs(data, set())
    assert none.empty and list(none.dtypes) == list(frame.dtypes)
    empty = frame.iloc[0:0].assign(run_id=pd.Series([], dtype=object))  # stored as Arrow's null type
    pd.testing.assert_frame_equal(kept_store.decode_runs(kept_store.encode(empty), {"r1"}), empty)
    # a row without a run id cannot be placed in a window's runs: the caller falls back
    assert (
        kept_store.decode_runs(kept_store.encode(frame.assign(run_id=["r1", None, "r1", "r3"])), {"r1"})
        is None
    )


def test_a_run_s_rows_come_from_the_batches_that_hold_them(monkeypatch):
    monkeypatch.setattr(kept_store, "BATCH_ROWS", 3)  # a 10M store's frame: hundreds of batches
    rng = random.Random(5)
    runs = [rng.choice(["r1", "r2", "r3", "r4"]) for _ in range(23)]
    frame = pd.DataFrame({"run_id": runs, "ids": [[str(i)] * (i % 3) for i in range(23)], "n": range(23)})
    data = kept_store.encode(frame)
    pd.testing.assert_frame_equal(kept_store.decode(data), frame)
    for wanted in ({"r1"}, {"r2", "r4"}, {"r9"}, {"r1", "r2", "r3", "r4"}):
        want = frame[frame["run_id"].isin(wanted)].reset_index(drop=True)
        pd.testing.assert_frame_equal(kept_store.decode_runs(data, wanted), want)


def test_results_of_windows_are_dropped_before_the_all_time_ones(tmp_path, monkeypatch):
    conn, _ = random_store(tmp_path, random.Random(3), batches=2)
    kept.clear_cache()
    monkeypatch.setattr(kept, "_CACHE_SIZE", 4)
    run_metric(conn, "lost_updates")  # the all-time result serve keeps up to date
    for seconds in range(1, 13):  # an alert evaluation's "since N minutes ago" each pass
        run_metric(conn, "rejection_rates", Window(since=BASE_TIME + timedelta(seconds=seconds)))
    assert kept.is_kept(conn, "lost_updates", Window(), Filters())
    assert len(kept._cache) == 4
    monkeypatch.setattr(kept, "_CACHE_SIZE", 1)  # only all-time results left: the oldest goes
    run_metric(conn, "duplicate_side_effects")
    assert not kept.is_kept(conn, "lost_updates", Window(), Filters())
    assert kept.is_kept(conn, "duplicate_side_effects", Window(), Filters())


_MERGE_SQL = (
    "SELECT 'r' || lpad((i % $runs)::VARCHAR, 3, '0') AS run_id, "
    "TIMESTAMP '2026-01-01' + to_seconds((i * 7919) % $spread) AS first_seen, "
    "((i * 31) % 5)::INTEGER AS hop, "
    "CASE WHEN i % 4 = 0 THEN NULL ELSE 'v' || (i % 3)::VARCHAR END AS label, "
    "[('s' || i::VARCHAR), ('t' || i::VARCHAR)] AS span_ids, "
    # lists of text that tie, are prefixes of one another, or hold a NULL (not compared as tuples)
    "CASE WHEN i % 11 = 0 THEN ['x', NULL] WHEN i % 2 = 0 THEN ['x' || (i % 3)::VARCHAR] "
    "ELSE ['x' || (i % 3)::VARCHAR, 'y'] END AS tags, i "
    "FROM range($lo, $hi) AS t(i) WHERE hash(i, $seed) % 5 > 0"
)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "order",
    [
        [("first_seen", False), ("run_id", False)],
        [("run_id", False), ("hop", True), ("first_seen", False)],  # a partition key first, a descending key
        [("label", False), ("first_seen", False), ("run_id", False)],  # NULL keys: not sorted alike
        [("first_seen", False), ("span_ids", False)],  # lists of text: compared as tuples
        [("first_seen", True), ("tags", True), ("run_id", False)],  # descending lists, some with a NULL
    ],
)
def test_merged_rows_are_in_the_order_duckdb_gives_all_of_them(monkeypatch, seed, order):
    """``merge_rows`` puts the fresh rows among the kept ones by bisection and slices (or sorts
    the keys when they do not sort alike): the rows of the runs kept plus the fresh ones, in the
    order DuckDB's ORDER BY gives all of them, whatever the places the fresh rows land in (one,
    a few, more than ``_MAX_SLICES``), merge after merge, with Arrow columns kept in few chunks."""
    monkeypatch.setitem(kept.ORDER, "merge_probe", order)
    rng = np.random.default_rng(seed)
    conn = duckdb.connect()
    runs, spread = int(rng.integers(5, 200)), int(rng.choice([50, 100_000]))
    by = ", ".join(f"{column}{' DESC' if desc else ''} NULLS LAST" for column, desc in order) + ", i"

    def rows(lo: int, hi: int, where: str = "TRUE") -> pd.DataFrame:
        sql = f"SELECT * FROM ({_MERGE_SQL}) WHERE {where} ORDER BY {by}"
        params = {"runs": runs, "spread": spread, "lo": lo, "hi": hi, "seed": seed}
        return conn.execute(sql, params).df()

    frame, stored = rows(0, 3000), 3000
    for step in range(tiers.batches(full=25, quick=8)):
        dropped = [f"r{r:03d}" for r in rng.choice(runs, size=int(rng.integers(0, 4)), replace=False)]
        new = int(rng.choice([0, 1, 5, 200]))
        # the dropped runs' rows computed again (with new rows of some of them) as a partition update
        in_runs = "run_id IN ({})".format(", ".join(f"'{r}'" for r in dropped) or "NULL")
        fresh = rows(0, stored + new, in_runs) if dropped else rows(stored, stored + new)
        stored += new
        keep = ~frame["run_id"].isin(dropped).to_numpy()
        got = kept.merge_rows(frame, keep, fresh, "merge_probe")
        ids = pd.DataFrame({"i": np.concatenate([frame["i"].to_numpy()[keep], fresh["i"].to_numpy()])})
        conn.register("ids", ids)
        expected = rows(0, stored, "i IN (SELECT i FROM ids)")  # the same rows computed together
        pd.testing.assert_frame_equal(got, expected, obj=f"step {step}")
        for column in ("span_ids",):
            chunks = getattr(got[column].array, "_pa_array", None)
            assert chunks is None or chunks.num_chunks <= kept._MAX_CHUNKS
        frame = got


def test_fresh_rows_among_kept_ones_ordered_by_lists_of_text_are_placed_without_a_sort(monkeypatch):
    """goal_divergence's rows are ordered by (first_seen, trace_id, span_ids): its span lists
    compare as tuples in the bisection, so fresh rows landing among the kept ones are placed by
    slices, not by sorting every row's keys in DuckDB (0.06 CPU-s of its update after a batch at
    1M spans of 10-call runs)."""
    order = kept.ORDER["goal_divergence"]
    conn = duckdb.connect()
    sql = ("SELECT TIMESTAMP '2026-01-01' + to_seconds(i // 3) AS first_seen, 't' || (i % 2)::VARCHAR AS trace_id, "
           "['s' || (i % 7)::VARCHAR, 's' || i::VARCHAR] AS span_ids, 'r' || (i % 5)::VARCHAR AS run_id "
           "FROM range(600) t(i) WHERE {} ORDER BY first_seen, trace_id, span_ids")  # fmt: skip
    old, fresh = conn.execute(sql.format("i % 5 <> 2")).df(), conn.execute(sql.format("i % 5 = 2")).df()
    expected = conn.execute(sql.format("TRUE")).df()
    monkeypatch.setitem(kept.ORDER, "merge_probe", order)
    monkeypatch.setattr(kept, "_MAX_SLICES", 10_000)
    sorted_keys = kept._sorted
    calls = []
    monkeypatch.setattr(kept, "_sorted", lambda *args: calls.append(1) or sorted_keys(*args))
    got = kept.merge_rows(old, np.ones(len(old), dtype=bool), fresh, "merge_probe")
    pd.testing.assert_frame_equal(got, expected)
    assert not calls


def test_kept_arrow_parts_stay_in_few_chunks_batch_after_batch():
    """``replace_runs`` on Arrow parts (runaway_runs' counts, the goal distribution's) adds a
    chunk per batch; past ``_MAX_CHUNKS`` the columns are made one chunk again, same rows."""
    parts = pa.table({"run_id": [f"r{i}" for i in range(50)], "n": list(range(50))})
    expected = parts.to_pandas()
    for batch in range(3 * kept._MAX_CHUNKS):
        run = f"r{batch % 50}"
        parts = kept.replace_runs(parts, [run], pa.table({"run_id": [run], "n": [batch + 100]}))
        expected = pd.concat(
            [expected[expected["run_id"] != run], pd.DataFrame({"run_id": [run], "n": [batch + 100]})]
        )
        assert parts.column("run_id").num_chunks <= kept._MAX_CHUNKS + 1
    pd.testing.assert_frame_equal(parts.to_pandas(), expected.reset_index(drop=True))


_PART_DETECTORS = ["enforcement_coverage", "rejection_rates", "goal_divergence_distribution", "runaway_runs"]


def _goal_batch(rng: random.Random, batch: int, runs: list[str]) -> list[dict]:
    """Delegations stating a subtask under a root goal (scored by the model), some on origin
    tasks shared by runs, some from a second service."""
    rows = []
    for _ in range(rng.randint(0, 4)):
        run = rng.choice(runs)
        rows.append(make_span(
            batch * 5 + rng.random() * 20, run=run, TraceId=trace_id(f"{run}/{rng.randint(0, 1)}"),
            agent_id=rng.choice(["a", "b"]), op="delegate", delegate_to=rng.choice(["b", "c"]),
            origin_task_id=rng.choice(["t1", f"t-{run}"]), hop=rng.randint(1, 3),
            goal_root=rng.choice([None, "Write the quarterly sales report for ACME"]),
            goal_text=rng.choice(["Collect ACME's quarterly sales figures", "Book a flight to Lisbon",
                                  "Summarise the sales figures of ACME"]),
            ServiceName=rng.choice(["crew", "crew", "other"]), ingested_at=BASE_TIME + timedelta(seconds=batch),
        ))  # fmt: skip
    return rows


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_detectors_kept_whole_are_formed_from_the_parts_of_every_run_after_each_batch(tmp_path, seed):
    """enforcement_coverage, rejection_rates and goal_divergence_distribution aggregate across
    runs: after a batch each is formed from per-run parts kept with its result, the touched runs
    counted again (kept.keeps_parts). Batches start new runs, grow old ones, put spans before a
    window's start and after its end, and come under agent, service and origin-task filters;
    each answer equals a full computation (values and types)."""
    rng = random.Random(seed)
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    runs = [f"run-{i}" for i in range(3)]
    scopes = [(Window(), Filters()), (Window(since=BASE_TIME + timedelta(seconds=12)), Filters()),
              (Window(until=BASE_TIME + timedelta(seconds=30)), Filters(agent="a")),
              (Window(), Filters(service="other")), (Window(), Filters(origin_task="t1"))]  # fmt: skip
    kept.clear_cache()
    before = kept.stats.copy()
    for batch in range(tiers.batches(full=6, quick=4)):
        if rng.random() < 0.5:
            runs.append(f"run-{len(runs)}")  # touched for the first time by this batch
        insert_spans(conn, _random_batch(rng, batch, runs) + _goal_batch(rng, batch, runs))
        for window, filters in scopes:
            for name in _PART_DETECTORS:
                _assert_same(
                    run_metric(conn, name, window, filters), _full(conn, name, window, filters), name
                )
    # the first computation kept its parts and later batches brought them up to date (but when
    # rejection_rates' buckets widen as the data spans more time: then every run is counted)
    possible = len(_PART_DETECTORS) * len(scopes) * (tiers.batches(full=6, quick=4) - 1)
    assert kept.stats["parts_kept"] - before["parts_kept"] >= 0.9 * possible
    # runaway_runs' and goal_divergence_distribution's parts are kept compact: their text
    # columns dictionary-encoded (kept.compact_parts), and the answers above came from them
    for name in ("runaway_runs", "goal_divergence_distribution"):
        held = [parts for _, parts, _ in kept.PARTS[name].kept.values()]
        assert held and all(pa.types.is_dictionary(parts.schema.field("run_id").type) for parts in held), name


@pytest.mark.parametrize(
    "name, bound",
    [
        ("enforcement_coverage", "max_rows"),
        ("enforcement_coverage", "max_runs"),
        ("runaway_runs", "max_bytes"),
    ],
)
def test_a_result_whose_parts_are_too_many_is_computed_in_full_after_a_batch(
    tmp_path, monkeypatch, name, bound
):
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    monkeypatch.setattr(kept.PARTS[name], bound, 1)
    kept.clear_cache()
    rng = random.Random(3)
    for batch in range(3):
        insert_spans(conn, _random_batch(rng, batch, ["run-0", "run-1"]))
        before = kept.stats.copy()
        _assert_same(run_metric(conn, name), _full(conn, name, Window(), Filters()), name)
        if batch == 2:  # the first batch found too many parts (counted, or runs stored)
            assert kept.stats["full"] == before["full"] + 1
            assert kept.stats["parts_kept"] == before["parts_kept"]


def test_a_result_another_thread_is_computing_is_waited_for_not_computed_again(tmp_path):
    """Serve's worker and a request (or two requests) asking for the same kept result at once:
    the second waits for the first's answer and reads it (kept._flight), so a restarted serve's
    start pass and the requests racing it do not compute the same detector side by side."""
    import threading

    from analytics.loops import repeated_calls

    path = tmp_path / "spans.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn)
    insert_spans(conn, _random_batch(random.Random(5), 0, ["run-0", "run-1", "run-2"]))
    kept.clear_cache()
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow_repeated_calls(c, window, filters):  # the real detector, held until both are in
        calls.append(threading.current_thread().name)
        started.set()
        assert release.wait(30)
        return repeated_calls(c, window, filters)

    answers = {}

    def ask(label):
        cursor = conn.cursor()
        answers[label] = kept.kept_result(cursor, "repeated_calls", slow_repeated_calls, Window(), Filters())

    first = threading.Thread(target=ask, args=("first",), name="first")
    first.start()
    assert started.wait(30)
    before = kept.stats.copy()
    second = threading.Thread(target=ask, args=("second",), name="second")
    second.start()
    deadline = time.monotonic() + 30
    while kept.stats["waited"] == before["waited"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kept.stats["waited"] == before["waited"] + 1  # the second is waiting, not computing
    release.set()
    first.join(30)
    second.join(30)
    assert calls == ["first"]
    assert kept.stats["unchanged"] == before["unchanged"] + 1  # it read the first's answer
    pd.testing.assert_frame_equal(answers["second"], answers["first"])
    _assert_same(answers["first"], _full(conn, "repeated_calls", Window(), Filters()), "repeated_calls")
    assert not kept._flights  # no thread holds or waits for a key: nothing left behind


def test_compact_parts_are_measured_by_the_buffers_they_hold_each_once():
    """A batch's filter and concatenation leave a compact column in many chunks sharing one
    dictionary: the byte bound counts it once (Arrow's nbytes counts it per chunk, and made
    goal_divergence_distribution's 101 MB of parts at 10M spans look like 690 MB: past the
    bound, so every batch computed it in full)."""
    runs = pa.array([f"run-{i // 4:08d}-with-a-longer-id" for i in range(40_000)])
    table = kept.compact_parts(pa.table({"run_id": runs, "spans": pa.array(range(40_000))}))
    assert pa.types.is_dictionary(table.schema.field("run_id").type)
    held = kept._bytes(table)
    column = table.column("run_id").chunk(0)
    pieces = pa.table(
        {
            "run_id": pa.chunked_array([column.slice(i, 2_000) for i in range(0, 40_000, 2_000)]),
            "spans": pa.chunked_array(
                [table.column("spans").chunk(0).slice(i, 2_000) for i in range(0, 40_000, 2_000)]
            ),
        }
    )
    assert pieces.nbytes > 5 * held  # the dictionary counted for each of the 20 chunks
    assert kept._bytes(pieces) == held
    fresh = pa.table({"run_id": ["run-00000001-with-a-longer-id"] * 4, "spans": pa.array([4, 5, 6, 7])})
    replaced = kept.replace_runs(table, ["run-00000001-with-a-longer-id"], fresh)
    assert replaced.num_rows == 40_000
    assert kept._bytes(replaced) <= held * 1.01  # the kept dictionary shared, not copied


def test_a_worker_pass_leaves_the_collector_only_what_came_after_it():
    """After each pass of serve's worker the objects alive (its kept results) are frozen out of
    the collector's sight, so a later collection does not walk them; the next pass gives them
    back and collects what the pass before left as garbage, cycles included."""
    import weakref

    class Node:
        pass

    try:
        node = Node()
        node.itself = node  # a cycle: only the collector frees it
        alive = weakref.ref(node)
        kept_worker.settle_collector()
        assert gc.get_freeze_count() > 0
        del node
        gc.collect()
        assert alive() is not None  # frozen: not walked, not freed
        kept_worker.settle_collector()
        assert alive() is None  # given back and collected by the next pass
    finally:
        gc.unfreeze()
