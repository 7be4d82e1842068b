"""Runaway runs: a run (or an agent in a run) with far more spans than its crew's runs usually
have, and no step budget to stop it.

The crew is the service (``ServiceName``). Its limits are calibrated from a healthy baseline
window (``analytics.calibration.calibrate_from_baseline`` stores
``runaway_spans_per_run:<service>`` and ``runaway_spans_per_agent:<service>``: the baseline's
quantile times ``RUNAWAY_MARGIN``). Uncalibrated, the limit is conservative: ``UNCALIBRATED_FACTOR``
times the crew's median run in the window, never below ``UNCALIBRATED_FLOOR`` spans, and only
when the window holds ``UNCALIBRATED_MIN_RUNS`` runs of the crew (fewer say nothing about what is
usual; runs of fewer than ``MEDIAN_MIN_SPANS`` spans are not counted in the median). Spans, not tool calls: agents that act through code have no tool spans, and on real agent
traces the span count of a run separates resource-abuse runs from the rest.
"""

from __future__ import annotations

import dataclasses
import logging

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analytics._evidence import EVIDENCE, TIMES
from analytics.engine import fetch_rows, is_clickhouse
from analytics.materialize import (
    PARTS,
    TABLE_PREFIX,
    Maintained,
    column_types,
    maintain,
    maintain_with,
    newest_change,
    read_findings,
    ready,
    run_scope,
    span_changes,
    table_exists,
)
from analytics.registry import register
from analytics.sql_loader import filter_params, load_sql, query_arrow, quote_identifier, run_sql
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

RUN_THRESHOLD = "runaway_spans_per_run"
AGENT_THRESHOLD = "runaway_spans_per_agent"
RUNAWAY_MARGIN = 2.0
# Uncalibrated limit: on the framework corpus (sample_traces/frameworks, 6 crews) healthy runs have
# at most 2.3x the median run of their crew and the injected runaway runs 5.1-9.8x; runs of 1-2
# spans (set-up traces, stray spans with their own trace id as run) say nothing about a crew's
# runs and are left out of the median.
UNCALIBRATED_FACTOR = 4.0
UNCALIBRATED_FLOOR = 25
UNCALIBRATED_MIN_RUNS = 5
MEDIAN_MIN_SPANS = 3
EVIDENCE_SPANS = 20
# where a limit came from, by the code _crew_limits gives each row
BASELINES = np.array(["none", "window_median", "calibrated"], dtype=object)
CALIBRATED = 2

_COLUMNS = [
    "trace_id", "span_ids", "run_id", "agent", "service", "spans", "calls", "limit", "ratio",
    "baseline", "threshold_version", "calibrated", "first_seen", "last_seen",
]  # fmt: skip


def baseline_limit(values: np.ndarray, quantile: float) -> float:
    """The limit a healthy baseline gives: its ``quantile`` times ``RUNAWAY_MARGIN``."""
    return float(np.quantile(np.asarray(values, dtype=np.float64), quantile) * RUNAWAY_MARGIN)


def _calibrated(conn: duckdb.DuckDBPyConnection) -> dict[str, tuple[float, int]]:
    rows = fetch_rows(
        conn,
        "SELECT name, arg_max(value, version), max(version) FROM thresholds "
        "WHERE name LIKE 'runaway_spans_per_%' GROUP BY name",
    )
    return {name: (float(value), int(version)) for name, value, version in rows}


def _per_crew(values: np.ndarray, codes: np.ndarray, crews: int, rows: np.ndarray, how: str) -> np.ndarray:
    """Per crew (``codes``: each row's crew, 0 to ``crews`` - 1), over the ``rows`` of it: the
    median of ``values``, or (``how="size"``) how many rows there are; NaN (0 for sizes) for a
    crew without."""
    if how == "size":
        return np.bincount(codes[rows], minlength=crews).astype(np.float64)
    out = np.full(crews, np.nan)
    medians = pd.Series(values[rows]).groupby(codes[rows]).median()
    out[medians.index.to_numpy()] = medians.to_numpy(dtype=np.float64)
    return out


def _crew_limits(
    service: pa.ChunkedArray | pa.Array,
    spans: np.ndarray,
    whole: np.ndarray,
    calibrated: dict[str, tuple[float, int]],
    missing_name: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per count row (its crew ``service``, its ``spans``, ``whole`` for a run's row): its limit,
    the baseline it came from (a code into ``BASELINES``) and the threshold version (0 = window).
    A row without a crew looks its calibrated name up as ``missing_name`` (its missing value as it
    prints: "nan", "None")."""
    # Vectorized over crew codes (a Python loop over the rows cost ~80 s at 1M stored spans of
    # 10-call runs; a pandas copy of every count row with three columns set on it took 0.37 of
    # runaway_runs' 0.55 CPU-s after a batch there, the crews' medians 0.02). A limit depends on
    # the row's crew and kind only: it is set per (crew, run or agent) and gathered per row once
    # (at 10M spans of 10-call runs, 5.3M rows: the per-row arithmetic cost 0.1-0.5 s a batch).
    if isinstance(service, pa.ChunkedArray):
        service = service.combine_chunks()
    encoded = pc.dictionary_encode(service)  # codes in order of first appearance, as pd.factorize
    crews = encoded.dictionary.to_pylist()
    # the crew's row in the per-crew tables; rows without a crew: the last one
    codes = encoded.indices.fill_null(len(crews)).to_numpy(zero_copy_only=False).astype(np.intp)
    spans = np.asarray(spans, dtype=np.float64)
    whole = np.asarray(whole, dtype=bool)
    typical = spans >= MEDIAN_MIN_SPANS
    tables = len(crews) + 1
    median = np.full((tables, 2), np.nan)  # column 1: a run's row, 0: an agent's
    median[:, 1] = _per_crew(spans, codes, tables, typical & whole, "median")
    median[:, 0] = _per_crew(spans, codes, tables, typical & ~whole, "median")
    runs = _per_crew(spans, codes, tables, typical & whole, "size")
    enough = np.repeat((runs >= UNCALIBRATED_MIN_RUNS)[:, None], 2, axis=1)
    enough[len(crews)] = False  # no crew: no window median
    median[len(crews)] = np.nan
    limit = np.where(enough, np.maximum(UNCALIBRATED_FACTOR * median, UNCALIBRATED_FLOOR), np.inf)
    # codes into BASELINES, not a text per row (an object array of 5.3M texts cost ~0.3 s a batch
    # at 10M spans of 10-call runs; only the rows over their limit are reported)
    baseline = enough.astype(np.int8)
    version = np.zeros((tables, 2), dtype=np.int64)
    named = list(enumerate(crews)) + ([(len(crews), missing_name)] if (codes == len(crews)).any() else [])
    for code, crew in named:
        for is_run, prefix in ((True, RUN_THRESHOLD), (False, AGENT_THRESHOLD)):
            found = calibrated.get(f"{prefix}:{crew}")
            if found is not None:
                limit[code, int(is_run)], version[code, int(is_run)] = found
                baseline[code, int(is_run)] = CALIBRATED
    kind = whole.astype(np.intp)
    return limit[codes, kind], baseline[codes, kind], version[codes, kind]


def _limits(counts: pd.DataFrame, calibrated: dict[str, tuple[float, int]]) -> pd.DataFrame:
    """``counts`` with each row's limit, the baseline it came from and the threshold version
    (``_crew_limits`` set on every row: the definition the tests read row by row)."""
    out = counts.copy()
    missing = out["service"].isna()
    limits, baselines, versions = _crew_limits(
        pa.array(out["service"], pa.string(), from_pandas=True),
        out["spans"].to_numpy(dtype=np.float64),
        out["whole_run"].to_numpy(dtype=bool),
        calibrated,
        str(out["service"][missing].iloc[0]) if missing.any() else "",
    )
    out["limit"] = limits.tolist()
    out["baseline"] = BASELINES[baselines].tolist()
    out["threshold_version"] = versions.tolist()
    return out


@register(
    "runaway_runs",
    description="Runs (and agents in a run) with far more spans than their crew's runs usually have, "
    "and no step budget to stop them.",
    columns={
        **EVIDENCE,
        "agent": "agent over its limit; None when the whole run is",
        "service": "the run's service (its crew)",
        "spans": "spans of the run (or of the agent in the run)",
        "calls": "tool calls among them",
        "limit": "the crew's limit in spans: calibrated baseline quantile x margin, else "
        "4 x the crew's median in the window (at least 25)",
        "ratio": "spans / limit (> 1)",
        "baseline": "'calibrated' (thresholds runaway_spans_per_run|agent:<service>) or "
        "'window_median' (uncalibrated)",
        "threshold_version": "thresholds.version of the limit; 0 = uncalibrated",
        "calibrated": "False while the uncalibrated window-median limit is in force",
        **TIMES,
    },
    row="one run, or one agent in one run, over its crew's span limit (evidence: the first spans past it)",
    failure_mode="unaware of termination conditions: no budget stops a runaway run",
    mast_category="specification issues",
    title="runaway runs",
    findings=True,
    needs="several runs of the same crew, one of them far longer (25 spans or more) than the crew's baseline",
    counted=True,
    failing=True,
    kept="whole",
)
def runaway_runs(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Runs and agents whose span count exceeds their crew's limit (runs with a budget excluded).

    Counts always come from the whole window of the crew (the run and agent filters only select
    the findings), so a filter never changes what counts as usual. Kept whole, from the per-run
    counts table the materializer keeps (``_from_counts``).
    """
    return _over_limits(conn, _counts(conn, window, filters), window, filters)


def _over_limits(
    conn: duckdb.DuckDBPyConnection,
    counts: pa.Table,
    window: Window,
    filters: Filters,
    kept: dict[tuple[str, str], tuple[int, list[str]]] | None = None,
) -> pd.DataFrame:
    """runaway_runs' rows from ``counts`` (``runaway_runs.sql``'s rows: per run and per agent in
    a run): each row's crew limit, the rows over it, their evidence spans. ``kept``: evidence
    still valid for (run, agent or '') at a limit (``_kept_evidence``), not looked up again."""
    if counts.num_rows == 0:
        return pd.DataFrame(columns=_COLUMNS)
    spans = counts.column("spans").to_numpy()
    service = counts.column("service")
    # a row without a crew: its name as DuckDB's frame printed its missing value (NaN in a text
    # column, None in a column of objects when no row had a crew)
    missing_name = "nan" if service.null_count < len(service) else "None"
    limits, baselines, versions = _crew_limits(
        service, spans, counts.column("whole_run").to_numpy(), _calibrated(conn), missing_name
    )
    # only the rows over their limit become a frame (one count row per run and per agent in it)
    chosen = spans > limits
    for column, value in (("run_id", filters.run), ("agent", filters.agent)):
        if value is not None:
            chosen &= pc.fill_null(pc.equal(counts.column(column), value), False).to_numpy()
    if not chosen.any():
        return pd.DataFrame(columns=_COLUMNS)
    over = counts.filter(pa.array(chosen)).to_pandas()
    over["limit"] = limits[chosen].tolist()
    over["baseline"] = BASELINES[baselines[chosen]].tolist()
    over["threshold_version"] = versions[chosen].tolist()
    agents = [
        "" if whole else str(agent) for whole, agent in zip(over["whole_run"], over["agent"], strict=True)
    ]
    keys = list(zip(over["run_id"], agents, strict=True))
    lims = [int(np.floor(limit)) for limit in over["limit"]]
    kept = kept or {}
    spans = {
        key: kept[key][1] for key, lim in zip(keys, lims, strict=True) if kept.get(key, (None,))[0] == lim
    }
    ask = [i for i, key in enumerate(keys) if key not in spans]
    if ask:  # the evidence numbers every span of its runs: only where it may have changed
        evidence = run_sql(
            conn,
            "runaway_evidence",
            window,
            Filters(),
            flag_runs=[keys[i][0] for i in ask],
            flag_agents=[keys[i][1] for i in ask],
            flag_limits=[lims[i] for i in ask],
            evidence_spans=EVIDENCE_SPANS,
        )
        spans.update({(r.run_id, r.agent): list(r.span_ids) for r in evidence.itertuples()})
    over = over.assign(
        agent=[agent or None for agent in agents],
        span_ids=[spans.get(key, []) for key in zip(over["run_id"], agents, strict=True)],
    )
    out = over.assign(
        ratio=over["spans"] / over["limit"],
        calibrated=over["baseline"] == "calibrated",
    )
    return out.sort_values(["first_seen", "run_id"]).reset_index(drop=True)


def _counts(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pa.Table:
    """Spans and calls per run and per agent in a run (``runaway_runs.sql``), in the crew's whole
    window: only the service and origin-task filters apply (and the internal scopes: a run's
    counts come from its own spans). An Arrow table: only the rows over their limit become a
    frame."""
    params = filter_params(window, dataclasses.replace(filters, run=None, agent=None))
    return query_arrow(conn, load_sql("runaway_runs"), params)


# runaway_runs depends on every run of a crew (its median), so it is kept whole; the counts it is
# computed from are per run, so they are kept per run (``COUNTS``: ``runaway_runs.sql``'s rows of
# the touched runs) and a pass finishes with the small aggregate over them (crew medians and
# limits over one row per run and agent) plus the evidence of the runs over their limit, instead
# of counting every stored span again.
COUNTS = "runaway_counts"
# runaway_runs.sql's columns, typed as DuckDB gives them (a ClickHouse read of the table is a frame)
_COUNT_COLUMNS = pa.schema(
    [
        ("run_id", pa.string()), ("service", pa.string()), ("agent", pa.string()), ("spans", pa.int64()),
        ("calls", pa.int64()), ("trace_id", pa.string()), ("first_seen", pa.timestamp("us")),
        ("last_seen", pa.timestamp("us")), ("whole_run", pa.bool_()),
    ]
)  # fmt: skip


def _count_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    scope = run_scope(conn, keys)
    return _counts(conn, Window(), scope).to_pandas()


def _from_counts(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    """runaway_runs over every stored span, from ``COUNTS``' table (computed from the spans
    when that table cannot answer). On ClickHouse the evidence of every run over its limit is
    read again (the evidence kept from the last pass is DuckDB's, ``_kept_evidence``)."""
    if is_clickhouse(conn):
        found = read_findings(conn, COUNTS, columns=_COUNT_COLUMNS.names)
        if found is None:
            return runaway_runs(conn, Window(), Filters(from_spans=True))
        counts = pa.Table.from_pandas(found, schema=_COUNT_COLUMNS, preserve_index=False, safe=False)
        return _over_limits(conn, counts, Window(), Filters())
    if ready(conn, COUNTS) is None:
        return runaway_runs(conn, Window(), Filters(from_spans=True))
    table = TABLE_PREFIX + COUNTS
    if not table_exists(conn, table):
        return pd.DataFrame(columns=_COLUMNS)  # built, no run counted
    counts = conn.sql(
        f"SELECT * EXCLUDE (_pos) FROM {quote_identifier(table)} ORDER BY _pos"
    ).to_arrow_table()
    return _over_limits(conn, counts, Window(), Filters(), kept=_kept_evidence(conn))


# The evidence of a run over its limit numbers every span of the run in time order, and with a
# fleet streaming, runs grow past their limits (docs/performance.md). A row's evidence as its
# table holds it stays what it is while the run's new spans all start after it: they come later
# in the numbering.
_KEPT_EVIDENCE_SQL = """
WITH kept AS (
    SELECT run_id, coalesce(agent, '') AS agent, CAST(floor(TRY_CAST("limit" AS DOUBLE)) AS BIGINT) AS lim, span_ids,
           len(span_ids) AS n, list_last(span_ids) AS last_span
    FROM {table}
),
ends AS (  -- the start of each row's last evidence span
    SELECT k.run_id, k.agent, any_value(k.lim) AS lim, any_value(k.span_ids) AS span_ids,
           any_value(k.n) AS n, max(s.start_ns) AS last_ns
    FROM kept k JOIN spans s ON s.run_id = k.run_id AND s.SpanId = k.last_span
    GROUP BY k.run_id, k.agent
),
new AS (  -- the spans of those runs the changes since the table's state stored or changed (a
          -- walk may have given one another agent: any of the run's counts, not the agent's)
    SELECT s.run_id, s.start_ns
    FROM spans s
    SEMI JOIN {changes} c ON c.TraceId = s.TraceId AND c.SpanId = s.SpanId
    WHERE s.ingested_at >= $since_ingested AND s.run_id IN (SELECT run_id FROM kept)
)
SELECT e.run_id, e.agent, e.lim, e.span_ids
FROM ends e
WHERE NOT EXISTS (
    SELECT 1 FROM new n
    WHERE n.run_id = e.run_id AND (n.start_ns <= e.last_ns OR e.n < $evidence_spans))
"""


def _kept_evidence(conn: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], tuple[int, list[str]]]:
    """The evidence of runaway_runs' rows as its table holds them that no change since could
    alter: (run, agent or '') -> (the limit it was taken at, its spans). A row's run has no span
    stored or changed since that starts at or before its last evidence span (nor any, when it
    has fewer than EVIDENCE_SPANS). Empty when a change since was not one of spans (a delete, a
    rebuild)."""
    state = ready(conn, "runaway_runs")
    table = TABLE_PREFIX + "runaway_runs"
    if state is None or not table_exists(conn, table):
        return {}
    if not column_types(conn, table).get("span_ids", "").endswith("[]"):
        return {}  # made from a computation without rows: its columns are not typed yet
    upto = newest_change(conn)
    others = conn.execute(
        "SELECT count(*) FROM change_log WHERE seq > $after AND seq <= $upto AND kind <> 'spans'",
        {"after": state.seq, "upto": upto},
    ).fetchall()[0][0]
    if others:
        return {}
    changes = span_changes(conn, state.seq, upto)
    rows = conn.execute(
        _KEPT_EVIDENCE_SQL.replace("{table}", quote_identifier(table)).replace("{changes}", changes.sql()),
        {**changes.bounded_params(), "evidence_spans": EVIDENCE_SPANS},
    ).fetchall()
    return {(run, agent): (lim, list(spans)) for run, agent, lim, spans in rows}


maintain(Maintained(COUNTS, "run_id", _count_rows, (("run_id", False), ("agent", False)), "1"))
PARTS.add(COUNTS)
maintain_with("runaway_runs", _from_counts, depends=(COUNTS,), portable=True)
