"""Findings tables on ClickHouse (chdb): kept from the store's change log, equal to DuckDB's full
computation after every batch, and read as tables (no recomputation) by a new reader."""

from __future__ import annotations

import copy
import hashlib
import random

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from tests import tiers
from tests.clickhouse_stores import SERVER_URL, store_params

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")
pytest.importorskip("sqlglot", reason="sqlglot is in the clickhouse extra")

from analytics import Filters, Window, goals, read_clickhouse, registry, summary  # noqa: E402
from analytics import materialize_clickhouse as chm  # noqa: E402
from analytics.findings_clickhouse import read_states, target_change  # noqa: E402
from analytics.goals import score_pending_pairs  # noqa: E402
from analytics.read import findings_freshness  # noqa: E402
from analytics.types import direct_write  # noqa: E402
from collector import clickhouse_ingest  # noqa: E402
from collector.clickhouse_changes import ChangeLog  # noqa: E402
from collector.clickhouse_resolve import resolve_spans, scratch_duckdb  # noqa: E402
from collector.clickhouse_store import ChdbStore, init_clickhouse, insert_otel_traces, open_store_url  # noqa: E402
from collector.decode import PROTOBUF, decode_payload  # noqa: E402
from collector.store import TraceIndex, insert_batches  # noqa: E402
from driftscope.database import migrate  # noqa: E402
from tests.analytics.test_clickhouse_detectors import _cell, _random_payload, _sample_payloads  # noqa: E402
from tests.otlp_builders import BASE_NS, make_request  # noqa: E402


@pytest.fixture(scope="module", params=store_params("its driftscope_test_findings_* databases are"))
def chdb_store(request, tmp_path_factory):
    store = (
        open_store_url(SERVER_URL)
        if request.param == "server"
        else ChdbStore(str(tmp_path_factory.mktemp("chf")))
    )
    yield store
    store.close()


def _rows(frame) -> list[tuple]:
    """The frame's rows as comparable tuples, sorted. A pandas integer column holding a NULL is
    float (either engine's computation): a table keeps the type of its first rows, so a number is
    sorted by its value, 3 and 3.0 alike; the cells are still compared exactly (3 == 3.0)."""

    def key(cell):
        if isinstance(cell, tuple):
            return tuple(key(c) for c in cell)
        return int(cell) if isinstance(cell, float) and cell.is_integer() else cell

    rows = [tuple(_cell(v) for v in row) for row in frame.itertuples(index=False)]
    return sorted(rows, key=lambda row: repr(key(row)))


def _fresh(store, name: str):
    other = copy.copy(store)
    other.database = f"{store.database}_findings_{name}"
    store.command(f"DROP DATABASE IF EXISTS {other.database}")
    init_clickhouse(other)
    return other


def _copy_scores(duck: duckdb.DuckDBPyConnection, store) -> None:
    """The goal scores, embeddings and thresholds scored on DuckDB, as the store's own."""
    score_pending_pairs(duck, limit=1_000_000, write=direct_write(duck))
    for table in ("goal_scores", "embeddings", "thresholds"):
        store.command(f"TRUNCATE TABLE `{store.database}`.`{table}`")
        store.insert_arrow(table, duck.sql(f"SELECT * FROM {table}").to_arrow_table())


def _scored_up_front(store, payloads: list[tuple[bytes, str]]) -> duckdb.DuckDBPyConnection:
    """A DuckDB store holding the goal scores, embeddings and thresholds of every pair of
    ``payloads``, which ``store`` holds too, and no span yet: the stored scores then stay as
    they are while the spans arrive, so a pass recomputes only what its batch touched (a new
    score rebuilds every table on ClickHouse: ``materialize_clickhouse.inputs``)."""
    everything = duckdb.connect()
    migrate(everything)
    insert_batches(everything, [decode_payload(p, t) for p, t in payloads], TraceIndex(everything))
    _copy_scores(everything, store)
    duck = duckdb.connect()
    migrate(duck)
    for table in ("goal_scores", "embeddings", "thresholds"):
        rows = everything.sql(f"SELECT * FROM {table}").to_arrow_table()  # noqa: F841 - read by name
        duck.execute(f"INSERT INTO {table} SELECT * FROM rows")
    everything.close()
    return duck


def _in_batches_tables_equal_full(
    duck: duckdb.DuckDBPyConnection, store, payloads: list[tuple[bytes, str]], batches: int
) -> tuple[set[str], dict[str, int]]:
    """``payloads`` in ``batches`` batches into both engines (on ClickHouse through the exporter's
    path, a logged resolve pass), a pass after each, then every table equal to DuckDB's full
    computation. Returns the results a later pass recomputed only touched partitions of, and the
    rows each detector had after the last batch."""
    traces = TraceIndex(duck)
    changes = ChangeLog(store)
    step = max(1, -(-len(payloads) // batches))
    scoped: set[str] = set()
    seen: dict[str, int] = {}
    for start in range(0, len(payloads), step):
        decoded = [decode_payload(p, t) for p, t in payloads[start : start + step]]
        insert_batches(duck, decoded, traces)
        insert_otel_traces(store, pa.concat_tables([b.table for b in decoded], promote_options="default"))
        resolve_spans(store, settle_seconds=0, changes=changes)
        report = chm.bring_up_to_date(store)
        assert not report.failed
        if start:
            scoped |= {name for name, keys in report.recomputed.items() if keys >= 0}
        seen = {}
        _assert_tables_equal_full(duck, store, seen)
    return scoped, seen


def _kept_metrics() -> list[str]:
    return [name for name in chm.maintained() if name in registry.METRICS]


def _assert_tables_equal_full(duck, store, seen: dict[str, int]) -> None:
    fulls: dict[str, pd.DataFrame] = {}  # run_summary's reference counts these findings
    names = _kept_metrics()
    for name in sorted(names, key=lambda name: name == "run_summary"):  # run_summary last
        metric = registry.METRICS[name]
        if name == "run_summary":
            want = summary.run_summary_of(duck, fulls)
        else:
            want = fulls[name] = registry.compute_metric(duck, name)
        got = read_clickhouse.read_findings(store, name, documented=list(metric.columns))
        assert got is not None, f"{name}: its table cannot answer"
        assert list(got.columns) == list(want.columns), name
        assert _rows(got) == _rows(want), f"{name}: table != DuckDB's full computation"
        seen[name] = seen.get(name, 0) + len(want)


@pytest.mark.parametrize(
    ("seed", "path"), [(0, "exporter"), (1, "direct"), pytest.param(2, "exporter", marks=pytest.mark.deep)]
)
def test_tables_equal_duckdb_full_computation_after_every_batch(chdb_store, seed, path):
    """Random span sets in batches, through the exporter's path (view + resolve pass) or serve's
    direct inserts: after each batch and pass every kept table on chdb equals DuckDB's full
    computation of the same spans, and a later pass recomputes only the touched partitions."""
    rng = random.Random(seed)
    store = _fresh(chdb_store, f"random{seed}")
    duck = duckdb.connect()
    migrate(duck)
    traces = TraceIndex(duck)
    changes = ChangeLog(store)
    staging = clickhouse_ingest.prepare_staging(store) if path == "direct" else None
    scratch = scratch_duckdb()
    seen: dict[str, int] = {}
    scoped = []
    for index in range(tiers.batches(full=3, quick=2)):
        pair = [decode_payload(*_random_payload(rng, 2 * index + k)) for k in range(2)]
        insert_batches(duck, pair, traces)
        table = pa.concat_tables([b.table for b in pair])
        if path == "direct":
            clickhouse_ingest.insert_direct(store, table, staging, False, resolver=scratch, changes=changes)
        else:
            insert_otel_traces(store, table)
            resolve_spans(store, settle_seconds=0, changes=changes)
        _copy_scores(duck, store)
        report = chm.bring_up_to_date(store)
        assert not report.failed
        scoped += [n for n, k in report.recomputed.items() if k >= 0]
        _assert_tables_equal_full(duck, store, seen)
        if index:  # older row versions and the consumed log deleted: the reads do not change
            assert chm.prune(store) > 0
            _assert_tables_equal_full(duck, store, {})
    found = [name for name, rows in seen.items() if rows and registry.METRICS[name].findings]
    assert len(found) >= 5, f"too few detectors with rows for the equality to prove much: {found}"
    assert scoped, "no pass recomputed only the touched partitions"
    scratch.close()
    duck.close()


@pytest.mark.slow  # ~20 s: the sample traces request by request; make test runs it
def _crew_payload(
    rng: random.Random, index: int, runaway_calls: int, long_runs: int = 0
) -> tuple[bytes, str]:
    """One request of a crew (service crew-r): in the first, five usual runs of 5 tool calls;
    in each, ``runaway_calls`` calls of run 5, which grows batch by batch past the crew's limit
    (4 x the median run, at least 25); ``long_runs`` new runs of 40 calls; each run's batch one
    trace, ``index * 30`` s after BASE_NS."""
    spans = []
    runs = [*(range(6) if index == 0 else [5] if runaway_calls else []), *range(6, 6 + long_runs)]
    for run in runs:
        for call in range(runaway_calls if run == 5 else 40 if run > 5 else 5):
            start = BASE_NS + int((index * 30 + call * 0.2 + rng.random() * 0.1) * 1e9)
            spans.append({
                "name": "search",
                "trace_id": hashlib.sha256(f"crew-r-{run}/{index}".encode()).digest()[:16],
                "start": start,
                "end": start + 100_000_000,
                "attrs": {"gen_ai.conversation.id": f"crew-r-{run}", "gen_ai.agent.id": rng.choice(["w1", "w2"]),
                          "gen_ai.tool.name": "search", "gen_ai.tool.call.arguments": f'{{"q": "{run}-{index}-{call}"}}'},
                "status": 0,
            })  # fmt: skip
    return make_request(spans, service="crew-r").SerializeToString(), PROTOBUF


def test_runaway_runs_is_summed_from_its_per_run_counts_and_equals_duckdb(chdb_store):
    """runaway_runs on ClickHouse is the crew limits over its per-run counts part (as on DuckDB),
    not a recomputation of every run: batch after batch, while one run of a crew grows past its
    limit (and its evidence with it), its table equals DuckDB's full computation and each pass
    recomputes only the touched runs' counts. Then long new runs raise the crew's limit past the
    run, untouched: run_summary (by run) takes in the count the table changed for it."""
    rng = random.Random(12)
    store = _fresh(chdb_store, "runaway")
    assert chm.maintained()["runaway_runs"].depends == ("runaway_counts",)
    duck = duckdb.connect()
    migrate(duck)
    traces = TraceIndex(duck)
    changes = ChangeLog(store)
    found = []
    for index, (calls, long_runs) in enumerate([(5, 0), (12, 0), (30, 0), (20, 0), (0, 10)]):
        batch = decode_payload(*_crew_payload(rng, index, calls, long_runs))
        insert_batches(duck, [batch], traces)
        insert_otel_traces(store, batch.table)
        resolve_spans(store, settle_seconds=0, changes=changes)
        report = chm.bring_up_to_date(store)
        assert not report.failed
        if index:
            assert report.recomputed["runaway_counts"] == (long_runs or 1)  # the runs touched
        fulls = {}
        for name in ("runaway_runs", "run_summary"):
            metric = registry.METRICS[name]
            want = (
                summary.run_summary_of(duck, fulls)
                if name == "run_summary"
                else registry.compute_metric(duck, name)
            )
            fulls[name] = want
            got = read_clickhouse.read_findings(store, name, documented=list(metric.columns))
            assert _rows(got) == _rows(want), (index, name)
        found.append(len(fulls["runaway_runs"]))
    assert found[0] == 0 and found[-2] >= 1 and found[-1] == 0  # past its crew's limit, then not
    assert report.recomputed["run_summary"] == 11  # the ten new runs and the runaway one
    duck.close()


def test_sample_traces_request_by_request_keep_every_table_equal(chdb_store, monkeypatch):
    store = _fresh(chdb_store, "samples")
    payloads = _sample_payloads()
    duck = _scored_up_front(store, payloads)
    scoped, _ = _in_batches_tables_equal_full(duck, store, payloads, 2)
    assert {"repeated_calls", "run_summary", "constraint_drops"} <= scoped, scoped
    # the goal distribution is summed inside ClickHouse: the frame the sum in process gives, per
    # chain and statement, and over more chains than a chart shows (those columns NULL)
    summed_inside = goals._spread_summed_in_clickhouse
    for max_chains in (goals.MAX_CHART_CHAINS, 0):
        monkeypatch.setattr(goals, "MAX_CHART_CHAINS", max_chains)
        inside = summed_inside(store)
        assert inside is not None and len(inside) > 0
        assert inside["chain"].isna().all() == (max_chains == 0)
        monkeypatch.setattr(goals, "_spread_summed_in_clickhouse", lambda store: None)
        in_process = goals._spread_from_runs(store, None, None)
        monkeypatch.setattr(goals, "_spread_summed_in_clickhouse", summed_inside)
        pd.testing.assert_frame_equal(goals._spread_frame(store, inside), in_process)


def test_a_new_reader_answers_from_the_tables_without_the_spans(chdb_store):
    """A reader opened after the tables were built (another store object: nothing in process
    memory) answers every kept metric and run_summary from the tables, as of the last change:
    with `spans` emptied behind the change log's back, the answers are still the findings."""
    rng = random.Random(4)
    store = _fresh(chdb_store, "restart")
    duck = duckdb.connect()
    migrate(duck)
    traces = TraceIndex(duck)
    for index in range(3):
        batch = decode_payload(*_random_payload(rng, index))
        insert_batches(duck, [batch], traces)
        insert_otel_traces(store, batch.table)
    resolve_spans(store, settle_seconds=0)
    _copy_scores(duck, store)
    assert not chm.bring_up_to_date(store).failed
    reader = copy.copy(store)
    (run,) = duck.execute("SELECT run_id FROM spans WHERE op = 'write' ORDER BY Timestamp LIMIT 1").fetchone()
    one_run = registry.run_metric(reader, "lost_updates", filters=Filters(run=run))
    assert one_run.attrs.get("source") == "table"  # a run the tables hold as committed
    assert _rows(one_run) == _rows(registry.compute_metric(duck, "lost_updates", filters=Filters(run=run)))
    reader.command(f"TRUNCATE TABLE `{reader.database}`.`spans`")
    for name in [*_kept_metrics(), "run_summary"]:
        got = registry.run_metric(reader, name)
        assert got.attrs.get("source") == "table", name
        assert _rows(got) == _rows(registry.compute_metric(duck, name)), name
        fresh = findings_freshness(reader, got, name)
        assert (
            fresh["source"] == "table" and fresh["lag_seconds"] == 0.0 and fresh["findings_as_of"] is not None
        )
    duck.close()


def test_a_window_cutting_runs_reads_the_runs_it_holds_from_the_tables(chdb_store):
    """A time window (and a run filter) on ClickHouse, as on DuckDB: the runs the window holds
    whole are read from the tables and only the runs it cuts are computed; the answer equals
    DuckDB's full computation of the same window."""
    rng = random.Random(9)
    store = _fresh(chdb_store, "windows")
    duck = duckdb.connect()
    migrate(duck)
    traces = TraceIndex(duck)
    for index in range(4):  # each batch its own runs, 10 s apart: a window holds some, cuts some
        batch = decode_payload(*_random_payload(rng, 2 * index, runs=f"b{index}-"))
        insert_batches(duck, [batch], traces)
        insert_otel_traces(store, batch.table)
    resolve_spans(store, settle_seconds=0)
    _copy_scores(duck, store)
    assert not chm.bring_up_to_date(store).failed
    first, last = duck.execute("SELECT min(Timestamp), max(Timestamp) FROM spans").fetchone()
    middle = first + (last - first) / 2
    (run,) = duck.execute("SELECT run_id FROM spans WHERE Timestamp >= ? LIMIT 1", [middle]).fetchone()
    runs = duck.execute(
        "SELECT count(*) FILTER (WHERE min_ts >= $m), count(*) FILTER (WHERE min_ts < $m AND max_ts >= $m) "
        "FROM (SELECT run_id, min(Timestamp) min_ts, max(Timestamp) max_ts FROM spans GROUP BY run_id)",
        {"m": middle},
    ).fetchone()
    assert runs[0] and runs[1], "the window must hold some runs whole and cut others"
    cases = [(Window(since=middle), Filters()), (Window(since=first, until=middle), Filters()),
             (Window(since=middle), Filters(run=run))]  # fmt: skip
    items = chm.maintained()
    partitioned = [
        name for name in _kept_metrics() if items[name].partition == "run_id" and items[name].run_local
    ]
    assert len(partitioned) >= 8
    for window, filters in cases:
        for name in partitioned:
            got = registry.run_metric(store, name, window, filters)
            assert got.attrs.get("source") == "table", (name, window, filters)
            want = registry.compute_metric(duck, name, window, filters)
            assert list(got.columns) == list(want.columns), name
            assert _rows(got) == _rows(want), (name, window, filters)
        # run_summary (by run, not run-local: constraint drops per origin task) is assembled from
        # each detector's answer for the window
        got = registry.run_metric(store, "run_summary", window, filters)
        assert _rows(got) == _rows(registry.compute_metric(duck, "run_summary", window, filters))
    # an agent filter is computed as before (no table of each run's actors here)
    got = registry.run_metric(store, "lost_updates", Window(since=middle), Filters(agent="a"))
    assert got.attrs.get("source") is None
    duck.close()


def test_each_result_goes_up_to_the_newest_change_when_its_turn_comes(chdb_store):
    """Spans resolved during a pass: the results after them reflect them (equal to DuckDB's full
    computation of every span), none goes past what it reads, and a next pass brings the rest."""
    rng = random.Random(12)
    store = _fresh(chdb_store, "turns")
    duck = duckdb.connect()
    migrate(duck)
    traces = TraceIndex(duck)
    changes = ChangeLog(store)

    def add(index: int) -> None:
        batch = decode_payload(*_random_payload(rng, index))
        insert_batches(duck, [batch], traces)
        insert_otel_traces(store, batch.table)
        resolve_spans(store, settle_seconds=0, changes=changes)
        _copy_scores(duck, store)

    add(0)
    assert not chm.bring_up_to_date(store).failed
    add(1)
    before = target_change(store)
    turns: list[str] = []

    def between(name: str) -> None:  # half way through the pass, more spans are resolved
        turns.append(name)
        if len(turns) == 6:
            add(2)

    report = chm.bring_up_to_date(store, between=between)
    assert not report.failed and len(turns) > 6
    newest = target_change(store)
    assert newest > before
    seqs = {name: state.seq for name, state in read_states(store).items()}
    items = chm.maintained()
    assert {seqs[name] for name in turns[:5]} == {before}
    later = [name for name in turns[6:] if seqs[name] == newest]
    assert later, seqs
    for name, item in items.items():
        assert all(seqs[name] <= seqs[first] for first in item.depends), name
    for name in later:
        if name in registry.METRICS:
            got = read_clickhouse.read_findings(store, name, documented=list(registry.METRICS[name].columns))
            assert _rows(got) == _rows(registry.compute_metric(duck, name)), name
    assert not chm.bring_up_to_date(store).failed
    _assert_tables_equal_full(duck, store, {})
    duck.close()


def test_a_change_begun_and_not_committed_holds_the_tables_back_until_recovered(chdb_store):
    """A writer killed between logging a change's partitions and committing it: no pass goes past
    it (its spans may be half written); the next ChangeLog opened on the store commits it."""
    store = _fresh(chdb_store, "begun")
    changes = ChangeLog(store)
    first = changes.begin([("run_id", "r1")])
    changes.commit(first, "spans", 1)
    begun = changes.begin([("run_id", "r2")])
    later = changes.begin([("run_id", "r3")])
    changes.commit(later, "spans", 1)
    assert chm.target_change(store) == first
    ChangeLog(store)  # a restarted writer
    assert chm.target_change(store) == later > begun


def test_spans_written_by_a_writer_killed_before_it_committed_reach_the_tables(chdb_store):
    """The order of serve's direct insert, stopped where a kill would stop it: partitions logged,
    spans written, no commit. The next ChangeLog (a restarted serve) commits the change, and the
    next pass takes those spans in: the tables equal DuckDB's full computation of every span."""
    from collector.clickhouse_changes import touched_rows
    from collector.clickhouse_resolve import resolve_batch

    rng = random.Random(6)
    store = _fresh(chdb_store, "killed")
    duck = duckdb.connect()
    migrate(duck)
    traces = TraceIndex(duck)
    staging = clickhouse_ingest.prepare_staging(store)
    scratch = scratch_duckdb()
    changes = ChangeLog(store)
    first = decode_payload(*_random_payload(rng, 0))
    insert_batches(duck, [first], traces)
    clickhouse_ingest.insert_direct(store, first.table, staging, False, resolver=scratch, changes=changes)
    _copy_scores(duck, store)
    assert not chm.bring_up_to_date(store).failed
    second = decode_payload(*_random_payload(rng, 1))
    insert_batches(duck, [second], traces)
    stamped = second.table  # as insert_direct does, up to the commit it never reached
    touched: list = []
    rows, changed = resolve_batch(store, scratch, stamped, touched)
    changes.begin(touched + touched_rows(rows))
    clickhouse_ingest._write_batch(store, second.table, staging, False, rows, changed)
    _copy_scores(duck, store)
    before = chm.target_change(store)
    assert not chm.bring_up_to_date(store).failed and chm.target_change(store) == before
    ChangeLog(store)  # the restarted writer commits what the killed one began
    assert chm.target_change(store) > before
    assert not chm.bring_up_to_date(store).failed
    _assert_tables_equal_full(duck, store, {})
    scratch.close()
    duck.close()


def test_runs_whose_spans_expired_leave_every_table(chdb_store):
    """ClickHouse's TTL drops whole days of `spans` and logs nothing: the findings of the runs it
    dropped stayed in the tables, the run summary and the results kept whole until a rebuild. A
    materializer with the store's change log logs the partitions whose spans are gone as a
    change, and its pass leaves every table equal to DuckDB's computation of what is left."""
    import time

    rng = random.Random(7)
    store = copy.copy(chdb_store)
    store.database = f"{chdb_store.database}_findings_expiry"
    store.command(f"DROP DATABASE IF EXISTS {store.database}")
    init_clickhouse(store, ttl_days=30)
    changes = ChangeLog(store)
    staging = clickhouse_ingest.prepare_staging(store)
    scratch = scratch_duckdb()
    now = time.time_ns()
    days_ago = now - 3 * 86_400 * 1_000_000_000
    old = [decode_payload(*_random_payload(rng, i, runs="old-", base_ns=days_ago)) for i in range(3)]
    new = [decode_payload(*_random_payload(rng, i, runs="new-", base_ns=now - 600 * 10**9)) for i in range(3)]
    for batch in [*old, *new]:
        clickhouse_ingest.insert_direct(store, batch.table, staging, False, resolver=scratch, changes=changes)
    materializer = chm.ClickHouseMaterializer(store, changes=changes)
    versions = materializer.versions()
    assert not materializer.run_once(versions).failed
    old_runs = set(
        store.execute(
            f"SELECT DISTINCT run_id FROM `{store.database}`.spans "
            "WHERE Timestamp < now() - INTERVAL 2 DAY AND run_id IS NOT NULL"
        )
        .column("run_id")
        .to_pylist()
    )
    assert {f"old-{i}" for i in range(4)} <= old_runs  # and the runs of traces without a run id
    summary = read_clickhouse.read_findings(store, "run_summary")
    assert old_runs <= set(summary["run_id"])
    assert materializer.expired_partitions == 0

    # as if 28 days went by: the TTL drops the day the old runs were in (a new TTL is applied to
    # the parts at once; the spans of a year ago never land: a TTL applies at insert too)
    store.command(f"ALTER TABLE `{store.database}`.spans MODIFY TTL toDateTime(Timestamp) + toIntervalDay(2)")
    store.command(f"OPTIMIZE TABLE `{store.database}`.spans FINAL")
    left = store.execute(f"SELECT DISTINCT run_id FROM `{store.database}`.spans").column("run_id").to_pylist()
    assert left and not any(run and run.startswith("old-") for run in left)
    expired = chm.expired_partitions(store)
    assert {key for partition, key in expired if partition == "run_id"} == old_runs

    materializer._expiry_checked = None  # due now (every EXPIRY_CHECK_S in serve)
    assert not materializer.run_once(versions).failed
    assert materializer.expired_partitions == len(expired)
    assert chm.expired_partitions(store) == []  # taken in: not logged again
    duck = duckdb.connect()
    migrate(duck)
    insert_batches(duck, new, TraceIndex(duck))
    _copy_scores(duck, store)
    assert not chm.bring_up_to_date(store).failed  # the scores copied in rebuild every table
    seen: dict[str, int] = {}
    _assert_tables_equal_full(duck, store, seen)
    assert sum(seen.values()) > 0
    summary = read_clickhouse.read_findings(store, "run_summary")
    assert summary["run_id"].tolist() and not old_runs & set(summary["run_id"])


def test_the_framework_corpus_batch_by_batch_keeps_every_table_equal(chdb_store):
    """What frameworks' own exporters sent (hand-offs, agents invoked by no agent, ping-pongs,
    code actions), three run sets interleaved request by request and resolved in three batches:
    after each pass every table equals DuckDB's full computation, as on DuckDB
    (tests/analytics/test_materialize.py). Every goal pair is scored before the first batch, so
    the stored scores stay as they are and the later passes recompute only what the batch touched
    (new scores rebuild every table on ClickHouse: ``materialize_clickhouse.inputs``)."""
    from tests.analytics.test_clickhouse_detectors import _captured

    store = _fresh(chdb_store, "frameworks")
    sets = [_captured(name) for name in ("openai-agents", "adk-content", "langgraph-openinference")]
    payloads = [p for group in zip(*sets, strict=False) for p in group]
    payloads += [p for group in sets for p in group[min(len(s) for s in sets) :]]
    assert len(payloads) == sum(len(s) for s in sets)
    duck = _scored_up_front(store, payloads)
    scoped, seen = _in_batches_tables_equal_full(duck, store, payloads, 3)
    found = {name for name, rows in seen.items() if rows}
    assert {"repeated_calls", "ping_pong", "goal_divergence", "no_progress", "run_summary"} <= found, found
    assert {"repeated_calls", "ping_pong", "run_summary"} <= scoped, scoped
    duck.close()
