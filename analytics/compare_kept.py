"""The run comparison's maintained tables (issue 35): each run's steps, kept as spans commit.

A comparison's crew baseline summarises up to ``compare.MAX_BASELINE_RUNS`` healthy runs; from
the spans that means parsing every baseline span's JSON arguments and sorting every run's steps
on each request. The materializer (``analytics.materialize``) keeps what the baseline needs per
run instead, each table partitioned by ``run_id``:

* ``compare_sequences``: the run's step hashes in start order (a step: agent, operation, tool,
  argument shape, failed or refused) and a hash of that list, so runs that took the same steps
  are aligned once (``compare_sequences.sql``);
* ``compare_run_steps``: each distinct step of the run with its fields, to name the steps a
  departure expected (``compare_run_steps.sql``);
* ``compare_subjects``: per agent and tool of the run: calls, errors, refusals, first call,
  durations, hops, delegation targets, argument shapes and lengths, tokens, cost
  (``compare_subjects.sql``).

The three are computed from ``compare_span_steps``, a row of step columns per span that the
materializer folds each commit's new and changed spans into (``compare_span_steps.sql``): a
span's JSON arguments and attributes are read once, when it arrives, not each time its run is
touched again; a run's three rows are then group-bys over its narrow step rows
(``_compare_from_steps.sql``), or over its spans when that table is not built.

``baseline_table`` reads the baseline from those tables when all are built
(``materialize.ready``; ``compare_baseline_kept.sql``) and from the spans otherwise
(``compare_baseline.sql``, the same per-run fragments): the same rows either way
(tests/analytics/test_compare_kept.py). The compared run's own steps, and its closest baseline
run's, are always read from the spans (``compare_steps.sql``): the run may still be arriving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import duckdb
import pandas as pd
import pyarrow as pa

import analytics.materialize as materialize
from analytics.materialize import PARTS, Maintained, SpanChanges, maintain, run_chunks
from analytics.sql_loader import _read, expand_fragments, load_sql, query_arrow, query_df, run_sql
from analytics.types import Filters, Window

SEQUENCES = "compare_sequences"
RUN_STEPS = "compare_run_steps"
SUBJECTS = "compare_subjects"
TABLES = (SEQUENCES, RUN_STEPS, SUBJECTS)
SPAN_STEPS = "compare_span_steps"
_ORDER = {
    SEQUENCES: (("run_id", False),),
    RUN_STEPS: (("run_id", False), ("step", False)),
    SUBJECTS: (("run_id", False), ("agent", False), ("operation", False), ("tool", False)),
}


def _rows(name: str) -> Callable[[duckdb.DuckDBPyConnection, str | None, list[str] | None], pd.DataFrame]:
    def compute(
        conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
    ) -> pd.DataFrame:
        return run_sql(conn, name, Window(), Filters(), runs=keys)

    return compute


def _from_steps(
    name: str,
) -> Callable[[duckdb.DuckDBPyConnection, str | None, list[str] | None], pd.DataFrame]:
    """Table ``name``'s rows of the runs ``keys`` from the per-span steps the materializer keeps
    (from the spans when that table is not built). The materializer brings this table up to date
    only after the steps table reached the same change (``depends``)."""
    sql = expand_fragments(_read("_compare_from_steps").replace("{part}", "{" + name + "_of}"))
    from_spans = _rows(name)

    def compute(
        conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
    ) -> pd.DataFrame:
        if materialize.ready(conn, SPAN_STEPS) is None:
            return from_spans(conn, partition, keys)
        return query_df(conn, sql, {"runs": keys})

    return compute


def _span_steps(
    conn: duckdb.DuckDBPyConnection, partition: str | None, changes: SpanChanges | None
) -> pa.Table:
    """Step columns of every span (``changes`` None) or of the spans committed in ``changes``,
    as Arrow (the first build's million rows took 0.9 GiB more as pandas, at 1M spans)."""
    bounds = (
        {"after": None, "upto": None, "since_ingested": None} if changes is None else changes.bounded_params()
    )
    return query_arrow(conn, load_sql(SPAN_STEPS), {**bounds, "runs": None})


# Spans of one part of the first build: every span's steps at once held +5 GiB at 10M spans.
BUILD_CHUNK_SPANS = 500_000


def _build_steps(conn: duckdb.DuckDBPyConnection, target: int) -> Iterator[pa.Table]:
    """The first build, a chunk of runs at a time (``materialize.run_chunks``)."""
    for chunk in run_chunks(conn, BUILD_CHUNK_SPANS):
        params = {"after": None, "upto": None, "since_ingested": None, "runs": chunk or None}
        yield query_arrow(conn, load_sql(SPAN_STEPS), params)


maintain(
    Maintained(
        SPAN_STEPS, "span", _span_steps, (("TraceId", False), ("SpanId", False)), "1", build=_build_steps
    )
)
for _name in TABLES:
    maintain(Maintained(_name, "run_id", _from_steps(_name), _ORDER[_name], "1", depends=(SPAN_STEPS,)))
PARTS.update((*TABLES, SPAN_STEPS))


def per_run_rows(conn: duckdb.DuckDBPyConnection, name: str, runs: list[str] | None = None) -> pd.DataFrame:
    """Table ``name``'s rows computed from the spans (of ``runs``; every run when None)."""
    return _rows(name)(conn, "run_id", runs)


def tables_ready(conn: duckdb.DuckDBPyConnection) -> bool:
    """Whether both tables are built by these definitions (a store the materializer keeps)."""
    return all(materialize.ready(conn, name) is not None for name in TABLES)


def baseline_table(conn: duckdb.DuckDBPyConnection, runs: list[str]) -> pa.Table:
    """The crew baseline's parts over ``runs`` (``_compare_baseline_parts.sql``): from the
    maintained tables when they are built, else from the spans. A run the tables do not hold
    yet (spans committed since their last pass) is left out of the baseline until they do."""
    name = "compare_baseline_kept" if tables_ready(conn) else "compare_baseline"
    return query_arrow(conn, load_sql(name), {"runs": runs})
