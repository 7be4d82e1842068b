"""The ClickHouse store on real chdb: the exporter's `otel_traces`, driftscope's objects beside it,
and `spans` filled through the materialized view equal to DuckDB's ingest of the same OTLP.

OTLP is decoded with our decoder, written into `otel_traces` in the column layout the
OpenTelemetry Collector clickhouse exporter inserts, and read back from `spans` after the
resolve pass. A ClickHouse server is used too when DRIFTSCOPE_CLICKHOUSE_URL is set.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")

from collector import clickhouse_schema as schema  # noqa: E402
from collector.clickhouse_resolve import clickhouse_to_duckdb, resolve_spans  # noqa: E402
from collector.clickhouse_store import (  # noqa: E402
    ChdbStore,
    DuckDBStore,
    StoreURLError,
    init_clickhouse,
    insert_otel_traces,
    open_store_url,
    parse_store_url,
)
from collector.conventions import (  # noqa: E402
    COORDINATION_COLUMNS,
    CREWAI_DELEGATION_TOOLS,
    RULES,
    SCOPE_OPENAI_AGENTS,
    SCOPE_SMOLAGENTS,
    SCOPE_TRACELOOP_CREWAI,
    SCOPE_TRACELOOP_LANGCHAIN,
)
from collector.decode import JSON, PROTOBUF, decode_payload  # noqa: E402
from collector.files import iter_file_requests  # noqa: E402
from collector.migrations_runner import apply_migrations  # noqa: E402
from collector.store import TraceIndex, insert_batches  # noqa: E402
from tests.otlp_builders import make_request  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
FRAMEWORKS = sorted((SAMPLES / "frameworks").glob("*/otlp.jsonl"))
SIMULATED = [SAMPLES / f"{name}.json" for name in ("split_brain_unguarded", "constraint_drop_guarded")]
# Compared separately: ingest time differs by design; Events/Links are JSON text of the exporter's
# Nested columns (attribute values as the exporter's strings).
NOT_COMPARED = {"ingested_at", "Events", "Links"}


def _payloads(path: Path):
    """The OTLP requests of a sample file (one JSON request) or a captured corpus (gzip protobuf)."""
    if path.name == "otlp.jsonl":
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                body = __import__("base64").b64decode(record["body_b64"])
                if record.get("content_encoding") == "gzip":
                    body = gzip.decompress(body)
                yield body, PROTOBUF if "protobuf" in record["content_type"] else JSON
    else:
        for _, payload in iter_file_requests(path):
            yield payload, JSON


@pytest.fixture(scope="module")
def chdb_store(tmp_path_factory):
    store = ChdbStore(str(tmp_path_factory.mktemp("chdb")))
    yield store
    store.close()


def _database(store, name: str):
    """The same chdb session on another database (chdb runs one data path per process)."""
    other = copy.copy(store)
    other.database = name
    return other


def _files(paths: list[Path]) -> list[list[tuple[bytes, str]]]:
    return [list(_payloads(path)) for path in paths]


def _span_ids(payload: bytes) -> set[str]:
    return set(decode_payload(payload, PROTOBUF).table.column("SpanId").to_pylist())


def _rows_by_key(table, columns):
    return {(row["TraceId"], row["SpanId"]): row for row in table.select(columns).to_pylist()}


def _spans(store):
    return clickhouse_to_duckdb(store.execute(f"SELECT * FROM {store.database}.spans"))


# --- the exporter's table --------------------------------------------------------------------------

# (column, type) of `otel_traces` as the exporter's traces_table.sql declares it.
EXPORTER_COLUMNS = [
    ("Timestamp", "DateTime64(9)"),
    ("TraceId", "String"),
    ("SpanId", "String"),
    ("ParentSpanId", "String"),
    ("TraceState", "String"),
    ("SpanName", "LowCardinality(String)"),
    ("SpanKind", "LowCardinality(String)"),
    ("ServiceName", "LowCardinality(String)"),
    ("ResourceAttributes", "Map(LowCardinality(String), String)"),
    ("ScopeName", "String"),
    ("ScopeVersion", "String"),
    ("SpanAttributes", "Map(LowCardinality(String), String)"),
    ("Duration", "UInt64"),
    ("StatusCode", "LowCardinality(String)"),
    ("StatusMessage", "String"),
    ("Events.Timestamp", "Array(DateTime64(9))"),
    ("Events.Name", "Array(LowCardinality(String))"),
    ("Events.Attributes", "Array(Map(LowCardinality(String), String))"),
    ("Links.TraceId", "Array(String)"),
    ("Links.SpanId", "Array(String)"),
    ("Links.TraceState", "Array(String)"),
    ("Links.Attributes", "Array(Map(LowCardinality(String), String))"),
    ("ResourceAttributeItems", "Array(String)"),
    ("SpanAttributeItems", "Array(String)"),
]


def test_init_creates_otel_traces_in_the_exporters_layout(chdb_store):
    store = _database(chdb_store, "layout")
    created = init_clickhouse(store, ttl_days=3)
    assert {
        "otel_traces",
        "otel_traces_trace_id_ts",
        "otel_traces_trace_id_ts_mv",
        "spans",
        "spans_mv",
    } <= set(created)
    assert {"embeddings", "thresholds", "goal_scores"} <= set(created)
    columns = store.execute(
        "SELECT name, type FROM system.columns WHERE database = 'layout' AND table = 'otel_traces' ORDER BY position"
    ).to_pylist()
    assert [(c["name"], c["type"]) for c in columns] == EXPORTER_COLUMNS
    table = store.execute(
        "SELECT partition_key, sorting_key, primary_key, engine, create_table_query FROM system.tables "
        "WHERE database = 'layout' AND name = 'otel_traces'"
    ).to_pylist()[0]
    assert table["engine"] == "MergeTree"
    assert table["partition_key"] == "toDate(Timestamp)"
    assert table["sorting_key"] == "ServiceName, SpanName, toDateTime(Timestamp), Timestamp"
    assert table["primary_key"] == "ServiceName, SpanName, toDateTime(Timestamp)"
    ddl = table["create_table_query"]
    assert "TTL toDateTime(Timestamp) + toIntervalDay(3)" in ddl
    assert "ttl_only_drop_parts = 1" in ddl
    # chdb is ClickHouse >= 26.2, where the exporter creates text indexes instead of bloom filters
    assert "TYPE text(tokenizer = 'array')" in ddl and "bloom_filter" not in ddl
    spans = store.execute(
        "SELECT sorting_key, create_table_query FROM system.tables WHERE database = 'layout' AND name = 'spans'"
    ).to_pylist()[0]
    assert spans["sorting_key"] == "run_id, agent_id, Timestamp"
    assert "TTL toDateTime(Timestamp) + toIntervalDay(3)" in spans["create_table_query"]


def test_spans_has_duckdbs_columns_in_duckdbs_order(chdb_store):
    store = _database(chdb_store, "columns")
    init_clickhouse(store)
    names = (
        store.execute(
            "SELECT name FROM system.columns WHERE database = 'columns' AND table = 'spans' ORDER BY position"
        )
        .column("name")
        .to_pylist()
    )
    flags = schema.list_null_columns()
    assert names == schema.duckdb_spans_columns() + list(flags.values())
    assert set(flags) == {
        "constraints_ledger",
        "constraints_carried",
        "constraints_waived",
        "waiver_reasons",
        "acceptance_constraint_ids",
    }


def test_init_is_idempotent_and_keeps_rows(chdb_store):
    store = _database(chdb_store, "again")
    init_clickhouse(store)
    batch = decode_payload(
        make_request([{"name": "a", "attrs": {"gen_ai.agent.name": "x"}}]).SerializeToString(), PROTOBUF
    )
    insert_otel_traces(store, batch.table)
    ddl_before = store.execute("SELECT name, create_table_query FROM system.tables WHERE database = 'again'")
    assert init_clickhouse(store) == []
    assert store.execute(
        "SELECT name, create_table_query FROM system.tables WHERE database = 'again'"
    ).sort_by("name") == ddl_before.sort_by("name")
    assert store.execute("SELECT count() AS n FROM again.otel_traces").column("n")[0].as_py() == 1
    assert store.execute("SELECT count() AS n FROM again.spans").column("n")[0].as_py() == 1


def test_init_beside_an_exporter_table_leaves_it_untouched_and_takes_its_earlier_rows(chdb_store):
    store = _database(chdb_store, "existing")
    store.command("CREATE DATABASE existing")
    for statement in schema.otel_traces_ddl("existing", ttl_days=7, full_text_search=False):
        store.command(statement)  # as the collector created it, before driftscope
    before = store.execute(
        "SELECT create_table_query FROM system.tables WHERE database = 'existing' AND name = 'otel_traces'"
    )
    now = time.time_ns()  # inside the table's 7-day TTL (ClickHouse drops expired rows on insert)
    span = {"name": "early", "start": now, "end": now + 1000, "attrs": {"gen_ai.agent.name": "w"}}
    batch = decode_payload(make_request([span]).SerializeToString(), PROTOBUF)
    insert_otel_traces(store, batch.table)
    created = init_clickhouse(store)
    assert "otel_traces" not in created and "spans" in created
    after = store.execute(
        "SELECT create_table_query FROM system.tables WHERE database = 'existing' AND name = 'otel_traces'"
    )
    assert after == before
    rows = _spans(store).to_pylist()
    assert [(r["SpanName"], r["agent_id"]) for r in rows] == [("early", "w")]


def test_init_upgrades_the_spans_table_and_view_of_an_older_version(chdb_store):
    store = _database(chdb_store, "upgrade")
    init_clickhouse(store)
    # as an older driftscope left them: spans without `scenario`, a view without it
    store.command("DROP VIEW upgrade.spans_mv")
    store.command("ALTER TABLE upgrade.spans DROP COLUMN scenario")
    store.command(
        "CREATE MATERIALIZED VIEW upgrade.spans_mv TO upgrade.spans AS SELECT * EXCEPT (scenario) FROM ("
        f"{schema.spans_select_sql('upgrade')}) COMMENT 'driftscope spans view 0000000000000000'"
    )
    assert init_clickhouse(store) == [
        "spans.scenario (column added)",
        "spans_mv (view replaced: the convention table changed)",
    ]
    names = store.execute(
        "SELECT name FROM system.columns WHERE database = 'upgrade' AND table = 'spans' ORDER BY position"
    )
    assert names.column("name").to_pylist() == list(schema.spans_clickhouse_types())
    batch = decode_payload(
        make_request([{"name": "sim", "attrs": {"driftscope.scenario": "ping_pong"}}]).SerializeToString(),
        PROTOBUF,
    )
    insert_otel_traces(store, batch.table)
    rows = store.execute("SELECT scenario FROM upgrade.spans").to_pylist()
    assert rows == [{"scenario": "ping_pong"}]  # one view: the old one is gone
    assert init_clickhouse(store) == []


def test_init_refuses_an_otel_traces_that_is_not_the_exporters(chdb_store):
    store = _database(chdb_store, "foreign")
    store.command("CREATE DATABASE foreign")
    store.command(
        "CREATE TABLE foreign.otel_traces (TraceId String, x Int32) ENGINE = MergeTree ORDER BY TraceId"
    )
    with pytest.raises(StoreURLError, match=r"lacks the columns Timestamp, SpanId.*\?table=NAME"):
        init_clickhouse(store)


# --- the key test: the view + resolve give DuckDB's spans -----------------------------------------


def _duckdb_and_chdb(store, files, resolve_every_request: bool):
    """``files``: per file, its (payload, content type) requests. DuckDB ingests request by
    request with ``resolve_every_request``, else a file's requests in one ``insert_batches`` call
    (as serve's writer takes the requests queued meanwhile)."""
    init_clickhouse(store)
    conn = duckdb.connect()
    apply_migrations(conn)
    traces = TraceIndex(conn)
    for requests in files:
        batches = [decode_payload(payload, content_type) for payload, content_type in requests]
        if resolve_every_request:
            for batch in batches:
                insert_batches(conn, [batch], traces)
                insert_otel_traces(store, batch.table)
                resolve_spans(store, settle_seconds=0)
            continue
        insert_batches(conn, batches, traces)
        # One INSERT per file, as a collector's batch processor would group them: each chdb
        # insert writes a part of ~25 files per table (text indexes), slow to write and delete.
        insert_otel_traces(store, pa.concat_tables([b.table for b in batches], promote_options="default"))
    if not resolve_every_request:  # the files share no trace: one pass after them resolves each
        resolve_spans(store, settle_seconds=0)
    expected = conn.sql("SELECT * FROM spans").to_arrow_table()
    conn.close()
    return expected, _spans(store)


@pytest.mark.slow
def test_spans_through_the_view_equal_duckdb_ingest_of_the_same_otlp(chdb_store):
    store = _database(chdb_store, "corpus")
    expected, got = _duckdb_and_chdb(store, _files(FRAMEWORKS + SIMULATED), resolve_every_request=False)
    columns = [name for name in expected.column_names if name not in NOT_COMPARED]
    want, have = _rows_by_key(expected, columns), _rows_by_key(got, columns)
    assert len(want) == expected.num_rows > 2000
    assert have.keys() == want.keys() and got.num_rows == expected.num_rows
    differences = {
        (key, column): (want[key][column], have[key][column])
        for key in want
        for column in columns
        if want[key][column] != have[key][column]
    }
    assert differences == {}
    # the comparison covers what matters: agents inherited, tool arguments unwrapped, every convention
    rows = expected.to_pylist()
    assert sum(r["agent_source"] == "ancestor" for r in rows) > 100
    assert sum(r["tool_args"] is not None for r in rows) > 50
    assert sum(r["op"] == "delegate" for r in rows) > 5
    assert sum(r["constraints_ledger"] is not None for r in rows) > 0
    assert sum(r["state_version"] is not None for r in rows) > 0
    assert len({r["ScopeName"] for r in rows}) >= 6
    # Events: the same events, from the exporter's Nested columns
    want_events = {(r["TraceId"], r["SpanId"]): r["Events"] for r in rows}
    for row in got.to_pylist():
        ours = json.loads(want_events[(row["TraceId"], row["SpanId"])])
        theirs = json.loads(row["Events"])
        assert [(e["Timestamp"], e["Name"]) for e in theirs] == [(e["Timestamp"], e["Name"]) for e in ours]


def _children_first(payload: bytes) -> list[bytes]:
    """A captured request as two: its spans without an agent attribute, then the agent spans (an
    exporter flushing an agent's children before the agent span ends). No captured request of
    the corpus splits a trace over requests, so this makes children arrive before their ancestor."""
    batch = decode_payload(payload, PROTOBUF)
    agent_spans = {
        span_id
        for span_id, source in zip(
            batch.table.column("SpanId").to_pylist(),
            batch.table.column("agent_source").to_pylist(),
            strict=True,
        )
        if source == "attribute"
    }
    request = ExportTraceServiceRequest.FromString(payload)
    halves = []
    for agents in (False, True):
        half = ExportTraceServiceRequest()
        half.CopyFrom(request)
        for resource_spans in half.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                kept = [span for span in scope_spans.spans if (span.span_id.hex() in agent_spans) == agents]
                del scope_spans.spans[:]
                scope_spans.spans.extend(kept)
        halves.append(half.SerializeToString())
    return halves


@pytest.mark.slow
def test_spans_resolved_request_by_request_equal_duckdb_ingest(chdb_store):
    """A collector inserts request by request and the resolve pass runs between them: children
    stored before their agent ancestor are rewritten when it arrives, as DuckDB updates them."""
    store = _database(chdb_store, "incremental")
    captured = list(_payloads(SAMPLES / "frameworks" / "openai-agents" / "otlp.jsonl"))[:3]  # 3 runs
    requests = [(half, PROTOBUF) for payload, _ in captured for half in _children_first(payload)]
    expected, got = _duckdb_and_chdb(store, [requests], resolve_every_request=True)
    columns = [name for name in expected.column_names if name not in NOT_COMPARED]
    assert _rows_by_key(got, columns) == _rows_by_key(expected, columns)
    children = {span_id for payload, _ in requests[::2] for span_id in _span_ids(payload)}
    inherited_later = [
        r for r in expected.to_pylist() if r["SpanId"] in children and r["agent_source"] == "ancestor"
    ]
    assert len(inherited_later) > 10  # agents taken from an ancestor stored after them


def test_list_fields_keep_null_apart_from_an_empty_list(chdb_store):
    store = _database(chdb_store, "lists")
    init_clickhouse(store)
    attrs = {
        "driftscope.constraints.carried": "[]",  # an empty list as SDKs that flatten arrays send it
        "driftscope.constraints.ledger": ["C1", "C2"],
        "driftscope.hop": 2,
        "driftscope.side_effect": True,
        "driftscope.state.key": "",
        "gen_ai.conversation.id": "run-7",
    }
    batch = decode_payload(make_request([{"name": "hand-off", "attrs": attrs}]).SerializeToString(), PROTOBUF)
    insert_otel_traces(store, batch.table)
    resolve_spans(store, settle_seconds=0)
    row = _spans(store).to_pylist()[0]
    assert {k: v for k, v in row.items() if k not in NOT_COMPARED} == {
        k: v for k, v in batch.table.to_pylist()[0].items() if k not in NOT_COMPARED
    }
    assert row["constraints_carried"] == [] and row["constraints_ledger"] == ["C1", "C2"]
    assert row["constraints_waived"] is None
    assert (row["hop"], row["side_effect"], row["state_key"], row["run_id"]) == (2, True, "", "run-7")
    flags = store.execute(
        "SELECT constraints_carried_null, constraints_waived_null FROM lists.spans"
    ).to_pylist()
    assert flags == [{"constraints_carried_null": 0, "constraints_waived_null": 1}]


def test_a_pass_in_chunks_of_traces_resolves_each_trace(chdb_store):
    store = _database(chdb_store, "chunks")
    init_clickhouse(store)
    spans = []
    for n in range(1, 6):
        trace = n.to_bytes(16, "big")
        agent, tool = (n * 10).to_bytes(8, "big"), (n * 10 + 1).to_bytes(8, "big")
        spans.append(
            {
                "name": f"invoke_agent a{n}",
                "trace_id": trace,
                "span_id": agent,
                "attrs": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": f"a{n}"},
            }
        )
        spans.append({"name": "search", "trace_id": trace, "span_id": tool, "parent": agent,
                      "attrs": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}})  # fmt: skip
    batch = decode_payload(make_request(spans).SerializeToString(), PROTOBUF)
    insert_otel_traces(store, batch.table)
    assert resolve_spans(store, settle_seconds=0, traces_per_chunk=2) == 5  # three chunks
    conn = duckdb.connect()
    apply_migrations(conn)
    insert_batches(conn, [batch])
    expected = conn.sql("SELECT * FROM spans").to_arrow_table()
    columns = [name for name in expected.column_names if name not in NOT_COMPARED]
    got = _rows_by_key(_spans(store), columns)
    assert got == _rows_by_key(expected, columns)
    assert sorted((r["SpanName"], r["agent_id"], r["agent_source"]) for r in got.values())[:2] == [
        ("invoke_agent a1", "a1", "attribute"),
        ("invoke_agent a2", "a2", "attribute"),
    ]
    assert {r["agent_source"] for r in got.values() if r["SpanName"] == "search"} == {"ancestor"}


def test_a_retried_export_is_stored_once_after_resolve(chdb_store):
    store = _database(chdb_store, "retry")
    init_clickhouse(store)
    batch = decode_payload(
        make_request([{"name": "call", "span_id": b"\x07" * 8}]).SerializeToString(), PROTOBUF
    )
    insert_otel_traces(store, batch.table)
    insert_otel_traces(store, batch.table)  # the exporter retried the batch
    assert store.execute("SELECT count() AS n FROM retry.otel_traces").column("n")[0].as_py() == 2
    resolve_spans(store, settle_seconds=0)
    assert store.execute("SELECT count() AS n FROM retry.spans").column("n")[0].as_py() == 1


def _mutations(store, database: str) -> int:
    rows = store.execute(
        "SELECT count() AS n FROM system.mutations WHERE database = {db:String} AND table = 'spans'",
        {"db": database},
    )
    return rows.column("n")[0].as_py()


def test_resolve_deletes_are_patch_parts_also_on_a_spans_made_before(chdb_store):
    """A DELETE as a mutation costs every part of `spans` (tens of seconds on a large store
    whatever it matches); as a patch part it costs the rows. A `spans` created before gets the
    block-number settings at init; its rows are kept and deletes after that are patch parts."""
    assert chdb_store.patch_deletes
    store = _database(chdb_store, "patches")
    store.command("CREATE DATABASE patches")
    for statement in schema.otel_traces_ddl("patches", full_text_search=False):
        store.command(statement)
    store.command(schema.spans_table_ddl("patches"))  # as an older driftscope created it
    assert (
        "enable_block_number_column"
        not in store.execute(
            "SELECT engine_full FROM system.tables WHERE database = 'patches' AND name = 'spans'"
        )
        .column("engine_full")[0]
        .as_py()
    )
    first = decode_payload(
        make_request([{"name": "one", "span_id": b"\x01" * 8}]).SerializeToString(), PROTOBUF
    )
    insert_otel_traces(store, first.table)
    created = init_clickhouse(store)
    assert "spans (deletes as patch parts)" in created
    assert init_clickhouse(store) == []
    batch = decode_payload(
        make_request([{"name": "call", "span_id": b"\x07" * 8}]).SerializeToString(), PROTOBUF
    )
    insert_otel_traces(store, batch.table)
    insert_otel_traces(store, batch.table)  # a retried export: resolve deletes one copy
    resolve_spans(store, settle_seconds=0)
    names = (
        store.execute("SELECT SpanName FROM patches.spans ORDER BY SpanName").column("SpanName").to_pylist()
    )
    assert names == ["call", "one"]
    assert _mutations(store, "patches") == 0
    patches = store.execute(
        "SELECT count() AS n FROM system.parts WHERE database = 'patches' AND table = 'spans' "
        "AND active AND startsWith(name, 'patch-')"
    )
    assert patches.column("n")[0].as_py() >= 1


# --- URLs and engines ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", r"Expected --store to be a DuckDB file path, chdb:PATH or clickhouse://HOST:8123/DB"),
        ("postgres://db/otel", r"Unknown store scheme 'postgres'.*expected a DuckDB file path, chdb:PATH"),
        ("chdb:", r"Expected a local data path after chdb:"),
        ("chdb:/tmp/x?tabel=t", r"Unknown option\(s\) tabel.*allowed: database, table"),
        ("chdb:/tmp/x?database=my-db", r"database in store URL .* letters, digits and _, got 'my-db'"),
        ("clickhouse:///otel", r"Expected a host in .*clickhouse://127.0.0.1:8123/otel"),
        (
            "clickhouse://127.0.0.1:http/otel",
            r"port .* integer between 1 and 65535 \(ClickHouse HTTP: 8123\)",
        ),
    ],
)
def test_a_bad_store_url_says_what_was_wrong_and_what_to_give(url, message):
    with pytest.raises(StoreURLError, match=message):
        parse_store_url(url)


def test_store_urls_name_their_engine_database_and_table():
    chdb_url = parse_store_url("chdb:/data/ch?database=traces&table=otel_spans")
    assert (chdb_url.engine, chdb_url.path, chdb_url.database, chdb_url.table) == (
        "chdb",
        "/data/ch",
        "traces",
        "otel_spans",
    )
    server = parse_store_url("clickhouse://reader:s%40cret@127.0.0.1:8123/otel")
    assert (server.engine, server.host, server.port, server.username, server.password, server.database) == (
        "clickhouse",
        "127.0.0.1",
        8123,
        "reader",
        "s@cret",
        "otel",
    )
    assert parse_store_url("data/driftscope.duckdb").engine == "duckdb"
    assert parse_store_url("duckdb:data/x.duckdb").path == "data/x.duckdb"


def test_duckdb_store_runs_the_same_interface(tmp_path):
    store = open_store_url(str(tmp_path / "d.duckdb"))
    assert isinstance(store, DuckDBStore)
    batch = decode_payload(
        make_request([{"name": "a", "attrs": {"gen_ai.agent.name": "x"}}]).SerializeToString(), PROTOBUF
    )
    store.insert_arrow("spans", batch.table)
    rows = store.execute("SELECT SpanName, agent_id FROM spans WHERE SpanName = $name", {"name": "a"})
    assert rows.to_pylist() == [{"SpanName": "a", "agent_id": "x"}]
    store.close()


def test_a_second_chdb_path_in_the_same_process_gets_a_clear_error(chdb_store, tmp_path):
    with pytest.raises(StoreURLError, match="one data path per process"):
        ChdbStore(str(tmp_path / "other"))


@pytest.mark.skipif(
    not os.environ.get("DRIFTSCOPE_CLICKHOUSE_URL"),
    reason="needs a ClickHouse server: set DRIFTSCOPE_CLICKHOUSE_URL=clickhouse://127.0.0.1:8123/driftscope_test "
    "(the database is dropped and created)",
)
def test_a_clickhouse_server_gives_the_same_spans_as_duckdb():
    store = open_store_url(os.environ["DRIFTSCOPE_CLICKHOUSE_URL"])
    store.command(f"DROP DATABASE IF EXISTS {schema.ident(store.database)}")
    try:
        expected, got = _duckdb_and_chdb(store, _files(FRAMEWORKS[:2]), resolve_every_request=False)
        columns = [name for name in expected.column_names if name not in NOT_COMPARED]
        assert _rows_by_key(got, columns) == _rows_by_key(expected, columns)
    finally:
        store.close()


def test_the_cli_creates_driftscopes_objects_once(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "driftscope", "clickhouse", "init", "--store", f"chdb:{tmp_path / 'ch'}"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    assert "created in otel (beside otel_traces):" in first.stdout and "spans_mv" in first.stdout
    second = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert (second.returncode, second.stdout.strip()) == (0, "otel (beside otel_traces): nothing to create")


def test_the_cli_explains_a_bad_store(capsys):
    from driftscope.cli import main

    assert main(["clickhouse", "init", "--store", "postgres://127.0.0.1/otel"]) == 2
    assert "Unknown store scheme 'postgres'" in capsys.readouterr().err
    assert main(["clickhouse", "resolve", "--store", "chdb:"]) == 2
    assert "Expected a local data path after chdb:" in capsys.readouterr().err


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "through_views"])
def test_the_clickhouse_writer_acknowledges_after_the_insert_and_resolves(chdb_store, direct):
    from collector.clickhouse_resolve import resolve_status
    from collector.clickhouse_writer import ClickHouseWriter
    from collector.writer import IngestQueue

    store = _database(chdb_store, f"writer_{'direct' if direct else 'views'}")
    init_clickhouse(store)
    writer = ClickHouseWriter(store, IngestQueue(64 * 1024 * 1024), resolve_interval=3600, direct=direct)
    writer.start()
    conn = duckdb.connect()
    apply_migrations(conn)
    traces = TraceIndex(conn)
    sent = 0
    try:
        # 8 of the 18 captured requests (113 spans): each insert writes a part of ~25 files per table
        captured = list(_payloads(SAMPLES / "frameworks" / "smolagents" / "otlp.jsonl"))[:8]
        for payload, content_type in captured:
            batch = decode_payload(payload, content_type)
            insert_batches(conn, [batch], traces)
            assert writer.submit(batch).result(timeout=120) == batch.accepted
            sent += batch.accepted
            # acknowledged: the rows are in ClickHouse already
            traces_table = f"{store.database}.otel_traces"
            assert store.execute(f"SELECT count() AS n FROM {traces_table}").column("n")[0].as_py() == sent
    finally:
        writer.stop()
    assert writer.healthy and writer.committed_spans == sent > 100
    # direct: no pass was needed, the watermark moved past the resolved inserts (when ingest
    # paused); through the views, passes resolved them
    assert (writer.resolver.advances > 0, writer.resolve_passes > 0) == (direct, not direct)
    assert resolve_status(store)["unresolved_spans"] == 0
    expected = conn.sql("SELECT * FROM spans").to_arrow_table()
    columns = [name for name in expected.column_names if name not in NOT_COMPARED]
    assert _rows_by_key(_spans(store), columns) == _rows_by_key(expected, columns)


# --- the view's SQL against the Python mapping, value by value -----------------------------------

_KEYS = sorted({source.key for rule in RULES for source in rule.sources if ":" not in source.key})
_SCOPES = [SCOPE_SMOLAGENTS, SCOPE_OPENAI_AGENTS, SCOPE_TRACELOOP_LANGCHAIN, SCOPE_TRACELOOP_CREWAI, "x"]
_NAMES = ["web.run", "CodeAgent.run", ".run", "handoff to writer", "handoff to ", "chat", "x"]
_VALUES = [
    "", " ", "x", "writer", "AGENT", "agent", "Tool", "TOOL", "llm", "workflow", "task", "RETRIEVER", "CHAIN",
    "invoke_agent", "execute_tool", "chat", "create_agent", "embeddings", "delegate",
    "3", " 7 ", "+2", "-1", "3.0", "2147483648", "true", "FALSE", " yes ", "0", "1", "no", "maybe",
    "[]", '["a","b"]', '["a\\"b"]', '[1, 2.5, true, null, "x"]', '[["n"], {"k": 1}]', "[not json", "  [\"s\"]  ",
    '{"args": ["q"], "sanitize_inputs_outputs": true, "kwargs": {}}',
    '{"args": [], "kwargs": {"city": "Paris", "n": 2}}',
    '{"args": [1, 2], "kwargs": {}}',
    '{"args": ["a"], "kwargs": {"b": 1}}',
    '{"args": [{"k": "v"}], "kwargs": null}',
    '{"args": "oops", "kwargs": {}}',
    '{"input_str": "raw", "tags": [], "metadata": {"id": 1}, "inputs": {"q": "é"}}',
    '{"input_str": "raw only", "metadata": {}}',
    '{"input_str": 5}',
    '{"kwargs": {"x": 1}, "other": 2}',
    '{"langgraph_node": "researcher", "langgraph_checkpoint_ns": "researcher:1|agent:2"}',
    '{"langgraph_checkpoint_ns": "__start__:1"}',
    '{"langgraph_node": ""}',
    "researcher:abc|agent:def", "__pregel:1", ":x", "|",
    '{"task": "t", "context": "c", "coworker": "  Analyst "}',
    '{"coworker": ""}',
    "Delegate work to coworker", "Ask question to coworker",
    "You are a helpful agent named 'search_agent'. Do it.",
    "helpful agent named ''", "naïve – unicode ✓", "tab\there\nnewline", "back\\slash 'quote'",
]  # fmt: skip


def _random_spans(seed: int, count: int) -> list[dict]:
    import random

    rng = random.Random(seed)
    spans = []
    for index in range(count):
        attrs = {key: rng.choice(_VALUES) for key in rng.sample(_KEYS, rng.randint(1, 12))}
        if rng.random() < 0.5:  # a span kind of one convention or another
            kind_key = rng.choice(["gen_ai.operation.name", "openinference.span.kind", "traceloop.span.kind"])
            attrs[kind_key] = rng.choice(_VALUES[4:18])
        if rng.random() < 0.3:
            attrs["tool.name"] = rng.choice(sorted(CREWAI_DELEGATION_TOOLS))
        if rng.random() < 0.3:
            attrs["input.value"] = rng.choice(_VALUES[-8:])
        spans.append(
            {
                "name": rng.choice(_NAMES),
                "scope": rng.choice(_SCOPES),
                "attrs": attrs,
                "trace_id": (index + 1).to_bytes(16, "big"),
                "span_id": (index + 1).to_bytes(8, "big"),
            }
        )
    return spans


def test_the_views_extraction_equals_the_python_mapping_on_random_spans(chdb_store):
    """Before any resolve pass, each `spans` row is the view's per-span mapping: it must equal
    what the decoders' mapping (collector.conventions) gives the same attributes."""
    store = _database(chdb_store, "mapping")
    init_clickhouse(store)
    batches = []
    for spec in _random_spans(seed=17, count=600):
        request = make_request([{k: v for k, v in spec.items() if k != "scope"}])
        request.resource_spans[0].scope_spans[0].scope.name = spec["scope"]
        batches.append(decode_payload(request.SerializeToString(), PROTOBUF).table)
    import pyarrow as pa

    table = pa.concat_tables(batches)
    insert_otel_traces(store, table)
    got = _rows_by_key(_spans(store), ["TraceId", "SpanId", *COORDINATION_COLUMNS])
    want = _rows_by_key(table, ["TraceId", "SpanId", *COORDINATION_COLUMNS])
    assert got.keys() == want.keys() and len(want) == 600
    differences = [
        (column, want[key][column], got[key][column])
        for key in want
        for column in COORDINATION_COLUMNS
        if want[key][column] != got[key][column]
    ]
    assert differences == []
    # the sample reaches the readers: unwrapped arguments, agents from names, families, lists
    rows = list(want.values())
    assert sum(r["tool_args"] is not None for r in rows) > 50
    assert sum(r["agent_name"] is not None for r in rows) > 100
    assert len({r["span_family"] for r in rows}) == 5
    assert sum(r["constraints_carried"] == [] for r in rows) > 0
