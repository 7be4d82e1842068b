"""Every detector gives the same findings on ClickHouse (chdb) as on DuckDB, from the same spans.

The same OTLP requests go into DuckDB (our ingest) and into chdb through the exporter's
`otel_traces` layout -> the materialized view -> `spans` -> the resolve pass
(``collector.clickhouse_store`` / ``clickhouse_resolve``). The analytics tables the detectors read
beside the spans (goal scores, embeddings, thresholds) are scored once on DuckDB and copied, so
both engines read the same scores. Then each registered metric runs on both through the same read
interface (``analytics.registry.run_metric``; on ClickHouse its SQL is translated by
``analytics.dialect``) and the answers are compared cell by cell (floats to 1e-9).
"""

from __future__ import annotations

import hashlib
import math
import random
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.clickhouse_stores import SERVER_URL, store_params

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")
pytest.importorskip("sqlglot", reason="sqlglot is in the clickhouse extra")

from analytics import Filters, Window, registry  # noqa: E402
from analytics.dialect import STAGE_PREFIX, format_param, to_clickhouse, to_clickhouse_staged  # noqa: E402
from analytics.goals import score_pending_pairs  # noqa: E402
from analytics.sql_loader import query_df  # noqa: E402
from analytics.types import direct_write  # noqa: E402
from collector.clickhouse_resolve import resolve_spans  # noqa: E402
from collector.clickhouse_store import ChdbStore, init_clickhouse, insert_otel_traces, open_store_url  # noqa: E402
from collector.decode import JSON, PROTOBUF, decode_payload  # noqa: E402
from collector.files import iter_file_requests  # noqa: E402
from collector.store import TraceIndex, insert_batches  # noqa: E402
from driftscope.database import migrate  # noqa: E402
from tests.otlp_builders import BASE_NS, make_request  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
SAMPLE_FILES = sorted(p for p in SAMPLES.glob("*.json") if not p.name.endswith(".truth.json"))


# Metrics whose ClickHouse answer is allowed to differ (none).
KNOWN_DIFFERENCES: set[str] = set()


@pytest.fixture(scope="module", params=store_params("its driftscope_test_* databases are"))
def chdb_store(request, tmp_path_factory):
    """chdb in process; and a ClickHouse server through clickhouse-connect when
    DRIFTSCOPE_CLICKHOUSE_URL is set (the same tests, the same statements)."""
    if request.param == "server":
        store = open_store_url(SERVER_URL)
    else:
        store = ChdbStore(str(tmp_path_factory.mktemp("chdb")))
    yield store
    store.close()


def _on_database(store: ChdbStore, name: str) -> ChdbStore:
    """The same session on a fresh database of its own (chdb runs one data path per process; on
    a server, ``<url database>_<name>``)."""
    import copy

    other = copy.copy(store)
    other.database = f"{store.database}_{name}"
    store.command(f"DROP DATABASE IF EXISTS {other.database}")
    return other


def _load_both(store: ChdbStore, payloads: list[tuple[bytes, str]]) -> duckdb.DuckDBPyConnection:
    """The same OTLP requests into DuckDB and into chdb's otel_traces (then the view and resolve);
    goal pairs scored on DuckDB and the analytics tables copied to chdb."""
    init_clickhouse(store)
    conn = duckdb.connect()
    migrate(conn)
    traces = TraceIndex(conn)
    tables = []
    for payload, content_type in payloads:
        batch = decode_payload(payload, content_type)
        insert_batches(conn, [batch], traces)
        tables.append(batch.table)
    # One INSERT, as a collector's batch processor groups requests (each chdb insert writes a part
    # of ~25 files per table); the resolve pass runs after it either way. Request-by-request
    # inserts with a resolve pass between them: tests/collector/test_clickhouse_store.py.
    insert_otel_traces(store, pa.concat_tables(tables, promote_options="default"))
    resolve_spans(store, settle_seconds=0)
    score_pending_pairs(conn, limit=1_000_000, write=direct_write(conn))
    for table in ("goal_scores", "embeddings", "thresholds"):
        rows = conn.sql(f"SELECT * FROM {table}").to_arrow_table()
        store.insert_arrow(table, rows)
    return conn


def _cell(value):
    if isinstance(value, np.ndarray | list | tuple):
        return tuple(_cell(item) for item in value)
    if value is None or value is pd.NaT or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return round(float(value), 9)
    if isinstance(value, pd.Timestamp):
        return value.to_pydatetime()
    return value


def _rows(frame: pd.DataFrame) -> list[tuple]:
    """The frame's rows as comparable tuples, sorted (rows tied on a detector's ORDER BY may come
    in either order on either engine)."""
    rows = [tuple(_cell(v) for v in row) for row in frame.itertuples(index=False)]
    return sorted(rows, key=repr)


def _compare_all(duck, store, window=Window(), filters=Filters()) -> dict[str, str]:
    """name -> how the ClickHouse answer differs (empty when every metric is equal)."""
    differences = {}
    for metric in registry.catalogue():
        want = registry.compute_metric(duck, metric.name, window, filters)
        try:
            got = registry.run_metric(store, metric.name, window, filters)
        except Exception as error:  # noqa: BLE001  (reported per metric)
            differences[metric.name] = f"fails: {str(error)[:200]}"
            continue
        if list(got.columns) != list(want.columns):
            differences[metric.name] = f"columns {list(got.columns)} != {list(want.columns)}"
        elif _rows(got) != _rows(want):
            only = [row for row in _rows(got) if row not in _rows(want)][:1]
            missing = [row for row in _rows(want) if row not in _rows(got)][:1]
            differences[metric.name] = f"{len(got)} rows != DuckDB's {len(want)}: {only} instead of {missing}"
    return differences


def _unexpected(differences: dict[str, str]) -> dict[str, str]:
    return {name: why for name, why in differences.items() if name not in KNOWN_DIFFERENCES}


def _sample_payloads() -> list[tuple[bytes, str]]:
    return [(payload, JSON) for path in SAMPLE_FILES for _, payload in iter_file_requests(path)]


@pytest.fixture(scope="module")
def sample_traces(chdb_store):
    """(DuckDB, store) holding the sample traces, loaded once for the tests that only read them."""
    store = _on_database(chdb_store, "samples")
    duck = _load_both(store, _sample_payloads())
    yield duck, store
    duck.close()


@pytest.fixture(scope="module")
def random_span_set(chdb_store):
    """``load(seed)`` -> (DuckDB, store) of that seed's random span set, loaded once per module
    (the tests on a set only read it)."""
    loaded = {}

    def load(seed: int):
        if seed not in loaded:
            rng = random.Random(seed)
            store = _on_database(chdb_store, f"random{seed}")
            loaded[seed] = (
                _load_both(store, [_random_payload(rng, i) for i in range(rng.randint(2, 6))]),
                store,
            )
        return loaded[seed]

    yield load
    for duck, _ in loaded.values():
        duck.close()


@pytest.mark.slow  # ~15 s: every metric on both engines; make test runs it
def test_every_detector_equals_duckdb_on_the_sample_traces(sample_traces):
    duck, store = sample_traces
    assert duck.execute("SELECT count(*) FROM spans").fetchone()[0] > 200
    found = {m.name: len(registry.compute_metric(duck, m.name)) for m in registry.finding_metrics()}
    assert sum(1 for n in found.values() if n) >= 8  # the samples hold findings of most detectors
    assert _unexpected(_compare_all(duck, store)) == {}


@pytest.mark.slow  # ~30 s: every metric four times on both engines; make test runs it
def test_filters_and_windows_mean_the_same_on_both_engines(sample_traces):
    duck, store = sample_traces
    first, last = duck.execute("SELECT min(Timestamp), max(Timestamp) FROM spans").fetchone()
    agent, run, service = duck.execute(
        "SELECT agent_id, run_id, ServiceName FROM spans WHERE agent_id IS NOT NULL ORDER BY Timestamp LIMIT 1"
    ).fetchone()
    middle = first + (last - first) / 2
    for window, filters in [
        (Window(since=middle), Filters()),
        (Window(until=middle), Filters(agent=agent)),
        (Window(), Filters(run=run)),
        (Window(), Filters(service=service)),
    ]:
        assert _unexpected(_compare_all(duck, store, window, filters)) == {}


def _random_payload(
    rng: random.Random, index: int, runs: str = "run-", base_ns: int = BASE_NS
) -> tuple[bytes, str]:
    """One OTLP request of random coordination spans (reads, writes, sends, delegations, steps,
    tool calls over a few runs and traces; some without run or agent), built with the collector
    tests' builders: runs ``<runs>0`` to ``<runs>3``, starting ``index * 10`` s after ``base_ns``."""
    spans = []
    for _ in range(rng.randint(5, 25)):
        run = rng.randint(0, 3)
        kind = rng.choice(["read", "write", "send", "delegate", "step", "call"])
        attrs: dict = {"gen_ai.conversation.id": f"{runs}{run}"} if rng.random() > 0.1 else {}
        if rng.random() > 0.1:
            attrs["gen_ai.agent.id"] = rng.choice(["a", "b", "c"])
        if kind in ("read", "write"):
            attrs.update({"driftscope.op": kind, "driftscope.state.key": rng.choice(["k1", "k2"]),
                          "driftscope.state.version": f"v{rng.randint(1, 4)}",
                          "driftscope.outcome": rng.choice(["ok", "ok", "rejected"])})  # fmt: skip
            if kind == "write" and rng.random() < 0.6:
                attrs["driftscope.state.expected_version"] = f"v{rng.randint(0, 3)}"
        elif kind == "send":
            attrs.update({"driftscope.op": "send", "gen_ai.tool.name": "send_email",
                          "driftscope.side_effect": True,
                          "driftscope.policy.version": f"p{rng.randint(1, 3)}",
                          "gen_ai.tool.call.arguments": rng.choice(['{"to": "x"}', '{"to": "y"}'])})  # fmt: skip
            if rng.random() < 0.5:
                attrs["driftscope.idempotency_key"] = rng.choice(["i1", "i2"])
        elif kind == "delegate":
            attrs.update({"driftscope.op": "delegate", "driftscope.delegate.to": rng.choice(["a", "b", "c"]),
                          "driftscope.task.origin_id": rng.choice(["t1", "t2"]),
                          "driftscope.hop": rng.randint(1, 3)})  # fmt: skip
            if rng.random() < 0.7:
                attrs["driftscope.constraints.carried"] = rng.sample(["C1", "C2", "C3"], rng.randint(0, 3))
            if rng.random() < 0.3:
                attrs["driftscope.constraints.ledger"] = ["C1", "C2", "C3"]
        elif kind == "step":
            attrs.update({"driftscope.op": "step", "driftscope.step": rng.randint(1, 5),
                          "driftscope.budget.max_steps": 3,
                          "driftscope.objective.id": "goal",
                          "driftscope.objective.version": f"o{rng.randint(1, 3)}"})  # fmt: skip
        else:
            attrs.update({"gen_ai.tool.name": rng.choice(["search", "fetch"]),
                          "gen_ai.tool.call.arguments": rng.choice(['{"q": "a"}', '{"q": "b"}'])})  # fmt: skip
        start = base_ns + int((index * 10 + rng.random() * 20) * 1e9)
        trace = f"{run}/{rng.randint(0, 2)}" if runs == "run-" else f"{runs}{run}/{rng.randint(0, 2)}"
        spans.append({
            "name": kind,
            "trace_id": hashlib.sha256(trace.encode()).digest()[:16],
            "start": start,
            "end": start + 500_000_000,
            "attrs": attrs,
            "status": rng.choice([0, 0, 0, 2]),
        })  # fmt: skip
    return make_request(spans).SerializeToString(), PROTOBUF


@pytest.mark.slow  # ~5 s each; make test runs them
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_detector_equals_duckdb_on_random_span_sets(random_span_set, seed):
    duck, store = random_span_set(seed)
    # the random delegations name their targets (a key no convention maps left all of them empty)
    assert duck.execute("SELECT count(*) FROM spans WHERE delegate_to IS NOT NULL").fetchone()[0] > 0
    assert _unexpected(_compare_all(duck, store)) == {}


def test_a_statement_gives_the_same_answer_when_run_again(random_span_set):
    # chdb 26.9's query condition cache answered constraint_ledger's second run with no rows
    # (analytics.dialect.SETTINGS turns it off)
    duck, store = random_span_set(0)
    want = _rows(registry.compute_metric(duck, "constraint_ledger"))
    assert want
    for _ in range(3):
        assert _rows(registry.run_metric(store, "constraint_ledger")) == want


def test_ctes_read_more_than_once_run_in_stages_that_leave_no_table(chdb_store):
    store = _on_database(chdb_store, "stages")
    duck = _load_both(store, [_random_payload(random.Random(3), i) for i in range(3)])
    sql = """
        WITH per_run AS (SELECT run_id, count(*) AS n FROM spans GROUP BY run_id),
        doubled AS (SELECT a.run_id, a.n + b.n AS n2 FROM per_run a JOIN per_run b USING (run_id)),
        once AS (SELECT run_id, n2 FROM doubled)
        SELECT d.run_id, d.n2, p.n, o.n2 AS n3
        FROM doubled d JOIN per_run p USING (run_id) JOIN once o USING (run_id)
        ORDER BY d.run_id"""
    staged = to_clickhouse_staged(sql, {}, store.database)
    # per_run and doubled are read twice: computed once each; once (read once) stays inline
    assert [name for name, _ in staged.stages] == [STAGE_PREFIX + "per_run", STAGE_PREFIX + "doubled"]
    assert "once AS" in staged.sql
    listing = (
        "SELECT database, name FROM system.tables WHERE is_temporary OR database = {db:String} ORDER BY ALL"
    )
    before = store.execute(listing, {"db": store.database}).to_pylist()
    got = query_df(store, sql, {})
    assert len(got) > 1 and _rows(got) == _rows(duck.execute(sql).df())
    assert store.execute(listing, {"db": store.database}).to_pylist() == before


def test_an_inner_cte_of_the_same_name_is_not_a_mention_of_the_outer_one(chdb_store):
    # _constraint_cells.sql declares its own `cells` inside the `cells` of constraint_drops.sql
    sql = """
        WITH c AS (SELECT * FROM (WITH c AS (SELECT 1 AS x UNION ALL SELECT 2 AS x)
                                  SELECT c.x FROM c JOIN c AS c2 USING (x)))
        SELECT a.x, b.x AS y FROM c a JOIN c b USING (x) ORDER BY a.x"""
    staged = to_clickhouse_staged(sql)
    assert [name for name, _ in staged.stages] == [STAGE_PREFIX + "c"]
    assert "RECURSIVE" not in staged.stages[0][1]
    want = duckdb.connect().execute(sql).df()
    assert _rows(query_df(chdb_store, sql, {})) == _rows(want) == [(1, 1), (2, 2)]


def test_an_overwrite_of_an_agentless_write_that_another_agent_read_is_no_lost_update(chdb_store):
    def span(offset: int, attrs: dict) -> dict:
        start = BASE_NS + offset * 1_000_000_000
        base = {"gen_ai.conversation.id": "run-1", "driftscope.state.key": "k"}
        return {"name": attrs["driftscope.op"], "trace_id": b"\x01" * 16, "start": start,
                "end": start + 1000, "attrs": base | attrs, "status": 0}  # fmt: skip

    spans = [
        span(0, {"driftscope.op": "write", "driftscope.state.version": "v1"}),  # no agent
        span(1, {"driftscope.op": "read", "driftscope.state.version": "v1", "gen_ai.agent.id": "b"}),
        span(2, {"driftscope.op": "write", "driftscope.state.version": "v2", "gen_ai.agent.id": "c"}),
    ]
    store = _on_database(chdb_store, "agentless")
    duck = _load_both(store, [(make_request(spans).SerializeToString(), PROTOBUF)])
    assert registry.compute_metric(duck, "lost_updates").empty  # b read v1 before c replaced it
    assert registry.run_metric(store, "lost_updates").empty


def test_a_rounded_negative_zero_groups_with_zero_as_in_duckdb(chdb_store):
    # goal divergences (1 - cos) just below 0 round to -0.0; DuckDB keys -0.0 and 0.0 as one group
    sql = """
        SELECT d, count(*) AS n
        FROM (SELECT round_even(x * 10000, 0) / 10000 AS d
              FROM (SELECT unnest([-0.00000001, 0.00000001, 0.5]) AS x))
        GROUP BY d ORDER BY d"""
    want = duckdb.connect().execute(sql).df()
    assert _rows(query_df(chdb_store, sql, {})) == _rows(want) == [(0.0, 2), (0.5, 1)]


def test_a_value_in_a_list_parameter_is_a_set_lookup_that_leaves_null_out_as_in_duckdb(chdb_store):
    """``x = ANY($list)`` (how the materializer scopes a computation to its touched runs and
    origin tasks) is ``x IN {list}`` on ClickHouse: one set, not SQLGlot's ``has(list, x)``,
    which searched the list per row (slow on origin tasks, which no index orders) and took
    a NULL x for a match under NOT, where DuckDB leaves it out."""
    sql = """
        SELECT count(*) FILTER (WHERE x = ANY($keys::VARCHAR[])) AS hit,
               count(*) FILTER (WHERE NOT (x = ANY($keys::VARCHAR[]))) AS miss
        FROM (SELECT unnest(['a', 'b', NULL, 'c']) AS x)"""
    keys = {"keys": ["a", "c", "z"]}
    translated, _ = to_clickhouse(sql, keys)
    assert "has(" not in translated and "x IN {keys:Array(String)}" in translated
    want = duckdb.connect().execute(sql, keys).df()
    assert _rows(query_df(chdb_store, sql, keys)) == _rows(want) == [(2, 1)]


def test_parameters_reach_clickhouse_as_values_not_sql(chdb_store):
    hostile = "x'); DROP TABLE spans; --\t\\n\n"
    sql, types = to_clickhouse("SELECT $text::VARCHAR AS t, $items::VARCHAR[] AS l", {})
    assert hostile not in sql and types == {"text": "Nullable(String)", "items": "Array(String)"}
    got = chdb_store.execute(sql, {"text": format_param(hostile), "items": format_param([hostile, "b"])})
    assert got.to_pylist() == [{"t": hostile, "l": [hostile, "b"]}]


def test_run_spans_containing_means_the_same_on_both_engines(sample_traces):
    """The report's lookup of where a constraint id is stated (a list parameter in a lambda)."""
    from analytics import read
    from tests.dashboard.test_dashboard_db import truths

    duck, store = sample_traces
    run, drop = next((t["run_id"], d) for t in truths() for d in t["constraint_drops"])
    texts = [drop["constraint_id"], "no such text anywhere"]
    local = read.run_spans(duck, run, containing=texts)
    assert 0 < len(local) < len(read.run_spans(duck, run))
    assert list(read.run_spans(store, run, containing=texts)["span_id"]) == list(local["span_id"])


def _hand_off_payload(rng: random.Random, index: int) -> tuple[bytes, str]:
    """One OTLP request of delegations that bounce directly and through a manager, with tasks
    handed again (tests/analytics/test_ping_pong_differential.py's sequences)."""
    from tests.analytics.test_ping_pong_differential import _TASKS, _pair_sequence

    spans = []
    for run in range(3):
        tasks = rng.sample(_TASKS, 2)
        for i, (src, dst) in enumerate(_pair_sequence(rng, rng.randint(4, 30))):
            attrs: dict = {"gen_ai.conversation.id": f"run-{run}", "driftscope.op": "delegate"}
            if src is not None:
                attrs["gen_ai.agent.id"] = src
            if dst is not None:
                attrs["driftscope.delegate.to"] = dst
            if rng.random() < 0.8:
                attrs["driftscope.goal.text"] = rng.choice(tasks)
            if rng.random() < 0.05:
                attrs["driftscope.outcome"] = "rejected"
            start = BASE_NS + int((index * 1000 + run * 100 + i) * 1e9)
            spans.append({
                "name": "delegate",
                "trace_id": hashlib.sha256(f"{index}/{run}".encode()).digest()[:16],
                "start": start,
                "end": start + 500_000_000,
                "attrs": attrs,
                "status": 0,
            })  # fmt: skip
    return make_request(spans).SerializeToString(), PROTOBUF


@pytest.mark.slow  # ~5 s; make test runs it
def test_ping_pong_bounces_of_both_shapes_equal_duckdb(chdb_store):
    rng = random.Random(5)
    store = _on_database(chdb_store, "handoffs")
    duck = _load_both(store, [_hand_off_payload(rng, i) for i in range(4)])
    want = registry.compute_metric(duck, "ping_pong")
    got = registry.run_metric(store, "ping_pong")
    assert set(want["via"].isna()) == {True, False}  # direct bounces and bounces through a manager
    assert _rows(got) == _rows(want)
    duck.close()


def _captured(run_set: str) -> list[tuple[bytes, str]]:
    """The requests a framework's own exporter sent (sample_traces/frameworks), as received."""
    from corpus.dump import read_requests

    payloads = []
    for record in read_requests(SAMPLES / "frameworks" / run_set / "otlp.jsonl"):
        body = record["body"]
        if record.get("content_encoding") == "gzip":
            body = __import__("gzip").decompress(body)
        payloads.append((body, PROTOBUF))
    return payloads


def test_loops_on_errors_and_declared_tool_lists_equal_duckdb(chdb_store):
    # Agent Framework's default: calls without arguments matched on error.type; smolagents: a
    # CodeAgent's code actions against the tool lists its agents declare (smolagents.tools_names)
    store = _on_database(chdb_store, "frameworks")
    duck = _load_both(store, _captured("agent-framework") + _captured("smolagents"))
    want = registry.compute_metric(duck, "repeated_calls")
    got = registry.run_metric(store, "repeated_calls")
    assert "error" in set(want["matched_on"])
    assert _rows(got) == _rows(want)
    duck.close()
