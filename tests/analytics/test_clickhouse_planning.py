"""No statement a read runs on ClickHouse takes long to plan: its query tree is bounded.

ClickHouse's analyzer inlines a CTE at every mention, so a statement whose CTEs are read by CTEs
that are themselves read twice grows a query tree exponential in its nesting: context_drift_holders
as one statement built 137,026 nodes and planned for 23.6 s on 265 spans, repeated_calls ~80 s.
``analytics.dialect`` runs such statements in stages (``to_clickhouse_staged``) and every
translated statement carries ``max_expanded_ast_elements = MAX_QUERY_TREE``. The work of planning
is measured here as the size of the query tree (rows of ``EXPLAIN QUERY TREE``), not as time:
the same on any machine and under any load. Planning times are in ``benchmarks.chdb_plan``.
"""

from __future__ import annotations

import pytest

from tests.clickhouse_stores import SERVER_URL, store_params

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")
pytest.importorskip("sqlglot", reason="sqlglot is in the clickhouse extra")

from analytics import Filters, Window, registry  # noqa: E402
from analytics.dialect import MAX_QUERY_TREE, format_param, to_clickhouse  # noqa: E402
from analytics.engine import PlanTooLarge, clickhouse_table  # noqa: E402
from analytics.sql_loader import filter_params, load_sql, mentioned_params, prune_unset_filters  # noqa: E402
from benchmarks.chdb_plan import PlanningRecorder, load_samples, sample_store  # noqa: E402
from collector.clickhouse_store import open_store_url  # noqa: E402

# The largest query tree of a detector statement is constraint_ledger's: ~1,650 nodes, ~2,550
# with every filter set (its delegations a materialized CTE, listed once more in the tree, since
# they are scanned once instead of four times). A statement growing past 60% of the hard bound
# is worth looking at before it reaches it.
TREE_BUDGET = MAX_QUERY_TREE * 3 // 5


@pytest.fixture(scope="module", params=store_params("its database driftscope_test_planning is"))
def store(request, tmp_path_factory):
    """The sample traces (exporter rows -> view -> spans -> resolve) in chdb, and on a ClickHouse
    server in database ``<url database>_planning`` when DRIFTSCOPE_CLICKHOUSE_URL is set."""
    if request.param == "chdb":
        store = sample_store(tmp_path_factory.mktemp("chdb-plan"))
    else:
        store = open_store_url(SERVER_URL)
        store.database = f"{store.database}_planning"
        store.command(f"DROP DATABASE IF EXISTS {store.database}")
        load_samples(store)
    yield store
    store.close()


@pytest.mark.slow  # ~20 s under load: every metric twice on chdb, each SELECT explained
def test_every_detector_statement_has_a_small_query_tree(store):
    spans = f"{store.database}.spans"
    first, last = (
        store.execute(f"SELECT min(Timestamp) AS a, max(Timestamp) AS b FROM {spans}").to_pylist()[0].values()
    )
    # every filter set: each adds its condition wherever spans are read
    every = Filters(
        service="crew", agent="planner", run="r", origin_task="t", runs=("r",), origin_tasks=("t",)
    )
    cases = [(Window(), Filters()), (Window(since=first, until=last), every)]
    sizes: dict[tuple[str, int], int] = {}
    for window, filters in cases:
        for metric in registry.catalogue():
            recorder = PlanningRecorder(store, events=False, plan_cpu=False)
            registry.run_metric(recorder, metric.name, window, filters)
            trees = [s["tree_rows"] for s in recorder.statements if s["tree_rows"] is not None]
            assert trees, f"{metric.name} ran no SELECT on ClickHouse"
            for index, rows in enumerate(trees):
                sizes[(metric.name, index)] = max(rows, sizes.get((metric.name, index), 0))
    over = {key: rows for key, rows in sizes.items() if rows > TREE_BUDGET}
    assert over == {}, f"statements whose query tree is past {TREE_BUDGET} nodes: {over}"
    assert max(sizes.values()) > 100  # the counting saw real statements


def _one_statement(name: str, store) -> tuple[str, dict]:
    """``analytics/sql/<name>.sql`` as one ClickHouse statement (every CTE inlined at each
    mention, no stages) and its parameters as ``store`` takes them (chdb: ClickHouse text)."""
    params = filter_params(Window(), Filters())
    sql = prune_unset_filters(load_sql(name), params)
    bound = {key: params[key] for key in mentioned_params(sql)}
    text, _ = to_clickhouse(sql, bound, store.database)
    if store.engine == "chdb":
        bound = {key: format_param(value) for key, value in bound.items()}
    return text, bound


def test_a_statement_that_would_plan_for_long_is_refused_at_once(store):
    """context_drift_holders as one statement: ClickHouse refuses it at once instead of
    analyzing ~137,000 nodes for tens of seconds; staged, the same SQL runs."""
    text, params = _one_statement("context_drift_holders", store)
    with pytest.raises(Exception, match="Query tree is too big"):  # unbounded: planned ~24 CPU-s
        store.execute(text, params)
    assert registry.run_metric(store, "context_drift_holders") is not None


def test_a_refused_statement_says_what_to_do(store):
    """A statement past the bound through the read path: an error naming the bound and the
    statement, not ClickHouse's bare message."""
    # each alias read twice by the next: ClickHouse expands a0 2**13 times in a13
    doubling = "SELECT 1 AS a0, " + ", ".join(f"a{i - 1} + a{i - 1} AS a{i}" for i in range(1, 14))
    with pytest.raises(PlanTooLarge, match="MAX_QUERY_TREE.*driftscope bug.*SELECT 1 AS a0, a0 \\+ a0"):
        clickhouse_table(store, doubling, {})
    assert clickhouse_table(store, "SELECT 1 AS a0, a0 + a0 AS a1", {}).to_pylist() == [{"a0": 1, "a1": 2}]
