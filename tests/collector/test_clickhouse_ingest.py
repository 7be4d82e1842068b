"""serve's direct inserts (``collector.clickhouse_ingest``) give the tables the materialized views
give: `spans` in every column (ingest time apart), `otel_traces` and the exporter's trace-id
lookup, on the captured framework corpora and simulated crews; and serve falls back to the views
when `otel_traces` feeds a view of someone else's."""

from __future__ import annotations

import copy

import pyarrow as pa
import pytest

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")

from collector import clickhouse_ingest  # noqa: E402
from collector.clickhouse_store import ChdbStore, init_clickhouse, insert_otel_traces  # noqa: E402
from collector.decode import PROTOBUF, decode_payload  # noqa: E402
from tests.collector.test_clickhouse_store import FRAMEWORKS, SIMULATED, _payloads  # noqa: E402
from tests.otlp_builders import make_request, set_attr  # noqa: E402


def _linked_request() -> bytes:
    """Spans with links and events whose attributes are typed and need escaping in JSON."""
    request = make_request(
        [
            {"name": "a/b", "span_id": bytes([1] * 8)},
            {"name": "c", "span_id": bytes([2] * 8), "parent": bytes([1] * 8)},
        ]
    )
    for span in request.resource_spans[0].scope_spans[0].spans:
        link = span.links.add()
        link.trace_id, link.span_id, link.trace_state = b"\x07" * 16, b"\x08" * 8, "k=v"
        set_attr(link.attributes, "weight", 0.5)
        set_attr(link.attributes, "url", 'https://example.test/x?a=1&b="2"')
        event = span.events.add()
        event.name, event.time_unix_nano = "ev/1 \u00e9", span.start_time_unix_nano + 1
        set_attr(event.attributes, "count", 3)
        set_attr(event.attributes, "ok", True)
        set_attr(event.attributes, "text", "line\nnext\t</tag>")
    return request.SerializeToString()


@pytest.fixture(scope="module")
def chdb_store(tmp_path_factory):
    store = ChdbStore(str(tmp_path_factory.mktemp("chdb-ingest")))
    yield store
    store.close()


def _database(store, name: str):
    other = copy.copy(store)
    other.database = name
    init_clickhouse(other)
    return other


def _rows(store, sql: str) -> list[dict]:
    return store.execute(sql.format(db=store.database)).to_pylist()


def test_direct_inserts_give_the_tables_the_views_give(chdb_store):
    views, direct = _database(chdb_store, "through_views"), _database(chdb_store, "direct")
    ok, reason = clickhouse_ingest.direct_ingest_possible(direct)
    assert ok, reason
    staging = clickhouse_ingest.prepare_staging(direct)
    spans = 0
    # one insert per corpus (inserts cost tens of milliseconds each, whatever their size)
    corpora = [list(_payloads(path)) for path in [*FRAMEWORKS, *SIMULATED]] + [
        [(_linked_request(), PROTOBUF)]
    ]
    for requests in corpora:
        table = pa.concat_tables([decode_payload(payload, kind).table for payload, kind in requests])
        insert_otel_traces(views, table)
        clickhouse_ingest.insert_direct(direct, table, staging, lookup=True)
        spans += table.num_rows
    spans_sql = "SELECT * EXCEPT ingested_at FROM {db}.spans ORDER BY TraceId, SpanId"
    expected = _rows(views, spans_sql)
    assert len(expected) == spans > 3000
    assert sum(row["Events"] != "[]" for row in expected) > 50  # events and links are compared too
    assert sum(row["Links"] != "[]" for row in expected) == 2
    assert _rows(direct, spans_sql) == expected
    traces_sql = "SELECT * FROM {db}.otel_traces ORDER BY TraceId, SpanId"
    assert _rows(direct, traces_sql) == _rows(views, traces_sql)
    lookup_sql = (
        "SELECT TraceId, min(Start) AS s, max(End) AS e FROM {db}.otel_traces_trace_id_ts "
        "GROUP BY TraceId ORDER BY TraceId"
    )
    assert _rows(direct, lookup_sql) == _rows(views, lookup_sql)
    # the staged parts left the staging table; the rows are attached once
    assert _rows(direct, f"SELECT count() AS n FROM {{db}}.{staging}") == [{"n": 0}]
    # the spans just inserted are new to the resolve pass: their ingest time is ClickHouse's
    assert _rows(direct, "SELECT countIf(ingested_at > now64(6, 'UTC')) AS n FROM {db}.spans") == [{"n": 0}]


def test_serve_inserts_through_the_views_when_otel_traces_feeds_another(chdb_store):
    store = _database(chdb_store, "with_other_view")
    store.command(
        "CREATE TABLE with_other_view.by_service (ServiceName String, n UInt64) ENGINE = SummingMergeTree ORDER BY ServiceName"
    )
    store.command(
        "CREATE MATERIALIZED VIEW with_other_view.by_service_mv TO with_other_view.by_service "
        "AS SELECT toString(ServiceName) AS ServiceName, count() AS n FROM with_other_view.otel_traces GROUP BY ServiceName"
    )
    ok, reason = clickhouse_ingest.direct_ingest_possible(store)
    assert not ok and "by_service_mv" in reason


def test_direct_inserts_resolve_children_stored_before_their_agent_and_store_a_resend_once(chdb_store):
    """serve's writer resolves each batch as it goes in: children stored before their agent
    ancestor are replaced when it arrives, and a resent request adds nothing, as DuckDB's ingest
    of the same requests gives."""
    import duckdb

    from collector.clickhouse_resolve import clickhouse_to_duckdb, scratch_duckdb
    from collector.migrations_runner import apply_migrations
    from collector.store import TraceIndex, insert_batches
    from tests.collector.test_clickhouse_store import NOT_COMPARED, SAMPLES, _children_first, _rows_by_key

    store = _database(chdb_store, "direct_incremental")
    staging = clickhouse_ingest.prepare_staging(store)
    captured = list(_payloads(SAMPLES / "frameworks" / "openai-agents" / "otlp.jsonl"))[:3]
    requests = [half for payload, _ in captured for half in _children_first(payload)]
    requests.append(requests[1])  # an exporter's retry of a request already stored
    conn = duckdb.connect()
    apply_migrations(conn)
    traces = TraceIndex(conn)
    scratch = scratch_duckdb()
    added = []
    for payload in requests:
        batch = decode_payload(payload, PROTOBUF)
        insert_batches(conn, [batch], traces)
        added.append(clickhouse_ingest.insert_direct(store, batch.table, staging, True, resolver=scratch)[1])
    scratch.close()
    assert added[-1] == 0  # the resent spans were stored already
    expected = conn.sql("SELECT * FROM spans").to_arrow_table()
    got = clickhouse_to_duckdb(store.execute("SELECT * FROM direct_incremental.spans"))
    assert got.num_rows == expected.num_rows
    columns = [name for name in expected.column_names if name not in NOT_COMPARED]
    assert _rows_by_key(got, columns) == _rows_by_key(expected, columns)
    children = {
        span_id
        for payload in requests[:-1:2]
        for span_id in decode_payload(payload, PROTOBUF).table.column("SpanId").to_pylist()
    }
    inherited_later = [
        r for r in expected.to_pylist() if r["SpanId"] in children and r["agent_source"] == "ancestor"
    ]
    assert len(inherited_later) > 10  # agents taken from an ancestor stored after them
