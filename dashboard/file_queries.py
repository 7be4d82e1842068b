"""Browse queries the dashboard runs on a database file (``DuckDBFileSource``) besides detectors.

They read typed columns only (never the attribute lists) and aggregate in SQL, so pages and
reports fetch what they show: the data version, sidebar choices, per-run totals, details of a few
runs and the evidence spans of listed findings. ``HttpSource`` answers the same questions through
the read API's existing endpoints. Values are bound as parameters; window and filters mean what
they mean for ``analytics.browse.list_runs`` (whole runs for an agent or origin-task filter).
"""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics.types import Filters, Window

_SCOPE = """
    ($since::TIMESTAMP IS NULL OR Timestamp >= $since::TIMESTAMP)
    AND ($until::TIMESTAMP IS NULL OR Timestamp <= $until::TIMESTAMP)
    AND ($service::VARCHAR IS NULL OR ServiceName = $service::VARCHAR)
    AND ($run::VARCHAR IS NULL OR run_id = $run::VARCHAR)
    AND ($agent::VARCHAR IS NULL OR run_id IN (SELECT run_id FROM spans WHERE agent_id = $agent::VARCHAR))
    AND ($origin_task::VARCHAR IS NULL
         OR run_id IN (SELECT run_id FROM spans WHERE origin_task_id = $origin_task::VARCHAR))
"""

RUN_TOTALS = f"""
SELECT run_id,
       count(*) AS spans,
       count(*) FILTER (WHERE outcome = 'rejected') AS rejected,
       count(*) FILTER (WHERE outcome = 'error' OR StatusCode = 'Error') AS errors,
       min(Timestamp) AS first_seen,
       max(Timestamp) AS last_seen
FROM spans
WHERE run_id IS NOT NULL AND {_SCOPE}
GROUP BY run_id
ORDER BY last_seen DESC, run_id
"""

RUN_DETAILS = f"""
SELECT run_id,
       min(Timestamp) AS first_seen,
       max(Timestamp) AS last_seen,
       count(*) AS spans,
       count(DISTINCT TraceId) AS traces,
       list_sort(list_distinct(list(agent_id) FILTER (WHERE agent_id IS NOT NULL))) AS agents,
       list_sort(list_distinct(list(ServiceName))) AS services,
       count(*) FILTER (WHERE outcome = 'rejected') AS rejected,
       count(*) FILTER (WHERE outcome = 'error' OR StatusCode = 'Error') AS errors,
       max(hop) AS max_hop
FROM spans
WHERE run_id IN (SELECT unnest($runs::VARCHAR[])) AND {_SCOPE}
GROUP BY run_id
ORDER BY last_seen DESC, run_id
"""

FILTER_RUNS = f"""
SELECT run_id, max(Timestamp) AS last_seen
FROM spans
WHERE run_id IS NOT NULL AND {_SCOPE}
GROUP BY run_id
ORDER BY last_seen DESC, run_id
LIMIT $limit
"""

DISTINCT_SERVICES = f"SELECT DISTINCT ServiceName AS v FROM spans WHERE ServiceName IS NOT NULL AND {_SCOPE}"
DISTINCT_AGENTS = f"SELECT DISTINCT agent_id AS v FROM spans WHERE agent_id IS NOT NULL AND {_SCOPE}"

EVIDENCE_SPANS = """
SELECT s.run_id, s.SpanId AS span_id, s.TraceId AS trace_id, s.Timestamp, s.start_ns,
       s.SpanName AS span_name, s.agent_id, s.tool_name, s.op, s.outcome, s.reject_reason,
       s.StatusCode AS status_code, s.goal_root, s.goal_text, s.tool_args, s.tool_result,
       s.input_text, s.output_text, s.StatusMessage AS status_message
FROM spans AS s
JOIN _evidence_keys AS k ON s.run_id = k.run_id AND s.SpanId = k.span_id
ORDER BY s.start_ns, s.SpanId
"""


def scope_params(window: Window, filters: Filters) -> dict:
    """Named parameters of ``_SCOPE``."""
    return {
        "since": window.since,
        "until": window.until,
        "service": filters.service,
        "agent": filters.agent,
        "run": filters.run,
        "origin_task": filters.origin_task,
    }


def data_version(cursor: duckdb.DuckDBPyConnection) -> str:
    """Changes whenever spans are added: span count and newest ``ingested_at`` (metadata-cheap)."""
    count, newest = cursor.execute("SELECT count(*), max(ingested_at) FROM spans").fetchone()
    return f"{count}:{newest}"


def filter_options(cursor: duckdb.DuckDBPyConnection, window: Window, run_limit: int) -> dict:
    """Sidebar choices: services and agents seen in the window, the newest ``run_limit`` runs."""
    params = scope_params(window, Filters())
    services = [r[0] for r in cursor.execute(DISTINCT_SERVICES, params).fetchall()]
    agents = [r[0] for r in cursor.execute(DISTINCT_AGENTS, params).fetchall()]
    runs = [r[0] for r in cursor.execute(FILTER_RUNS, {**params, "limit": run_limit}).fetchall()]
    return {"services": sorted(services), "agents": sorted(agents), "runs": runs}


def run_totals(cursor: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Every run in scope: spans, rejected, errors, first_seen, last_seen (newest first)."""
    return cursor.execute(RUN_TOTALS, scope_params(window, filters)).df()


def run_details(
    cursor: duckdb.DuckDBPyConnection, window: Window, filters: Filters, run_ids: list[str]
) -> pd.DataFrame:
    """``list_runs`` columns (without scenario) for the given runs only."""
    return cursor.execute(RUN_DETAILS, {**scope_params(window, filters), "runs": list(run_ids)}).df()


def evidence_spans(cursor: duckdb.DuckDBPyConnection, keys: pd.DataFrame) -> pd.DataFrame:
    """The spans named by (run_id, span_id) pairs, in start order."""
    cursor.register("_evidence_keys", keys[["run_id", "span_id"]])
    try:
        return cursor.execute(EVIDENCE_SPANS).df()
    finally:
        cursor.unregister("_evidence_keys")
