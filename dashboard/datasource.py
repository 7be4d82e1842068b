"""One object the dashboard and the reports read through: the read API over HTTP, a DuckDB file
or a ClickHouse store.

``HttpSource`` is a thin client of a running ``driftscope serve``'s read API (Arrow IPC for
frames, JSON for the rest). ``DuckDBFileSource`` opens an incident copy of the database read-only
and calls the same read interface the API serialises (``analytics.read``) in this process;
``StoreSource`` does the same on a ClickHouse store opened by the composition. All raise ``SourceUnavailable`` with a message a person can act on; the
pages turn it into a banner instead of a traceback.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import duckdb
import httpx
import pandas as pd
import pyarrow as pa

from analytics import read
from analytics.compare import RunNotFoundError
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DEFAULT_URL = "http://127.0.0.1:4318"

# Columns of ``run_totals`` (analytics.browse.run_totals / GET /api/v1/runs/totals).
RUN_TOTAL_COLUMNS = ["run_id", "spans", "rejected", "errors", "first_seen", "last_seen"]
# How many recent runs the sidebar offers.
FILTER_RUN_LIMIT = 500

# Span texts joined into an evidence row's ``text`` (in this order), as run_spans names them.
TEXT_COLUMNS = (
    "goal_root",
    "goal_text",
    "tool_args",
    "tool_result",
    "input_text",
    "output_text",
    "status_message",
)
# Columns a data source returns from ``evidence_spans``: run_spans names, plus run_id.
SPAN_COLUMNS = [
    "run_id",
    "span_id",
    "trace_id",
    "Timestamp",
    "start_ns",
    "span_name",
    "agent_id",
    "tool_name",
    "op",
    "outcome",
    "reject_reason",
    "status_code",
    *TEXT_COLUMNS,
]

RUN_COLUMNS = [
    "run_id",
    "first_seen",
    "last_seen",
    "spans",
    "traces",
    "agents",
    "services",
    "rejected",
    "errors",
    "max_hop",
    "scenario",
]


class SourceUnavailable(RuntimeError):
    """The data source cannot be read; the message says what to do about it."""


@dataclass(frozen=True)
class Health:
    """Whether the source answers, and a one-line description for the sidebar."""

    ok: bool
    detail: str
    spans: int | None = None  # spans stored (any window), when the source says
    findings: str | None = None  # how current the findings tables are (read.describe_freshness)


class DataSource(Protocol):
    """What every page and the report builder read through.

    Besides the contract's six reads: ``data_version`` (a string that changes when spans are
    added or the findings tables move on; cache keys include it), ``filter_options`` (sidebar choices), ``run_totals`` (every run
    in scope with its counts, no lists), ``run_details`` (``runs`` columns for a few runs) and
    ``evidence_spans`` (the spans named by (run_id, span_id) pairs, ``SPAN_COLUMNS``).
    """

    description: str

    def health(self) -> Health: ...

    def list_metrics(self) -> list[dict]: ...

    def metric(
        self, name: str, window: Window, filters: Filters, columns: list[str] | None = None
    ) -> pd.DataFrame: ...

    def runs(self, window: Window, filters: Filters) -> pd.DataFrame: ...

    def run_spans(self, run_id: str, containing: list[str] | None = None) -> pd.DataFrame: ...

    def thresholds(self) -> pd.DataFrame: ...

    def data_version(self) -> str: ...

    def filter_options(self, window: Window) -> dict: ...

    def run_totals(self, window: Window, filters: Filters) -> pd.DataFrame: ...

    def run_details(self, window: Window, filters: Filters, run_ids: list[str]) -> pd.DataFrame: ...

    def evidence_spans(self, keys: pd.DataFrame) -> pd.DataFrame: ...

    def search_spans(self, text: str, window: Window, filters: Filters, limit: int = 100) -> pd.DataFrame: ...

    def alerts(self, window: Window) -> pd.DataFrame: ...

    def compare(self, run_id: str, baseline: str = "auto", window: Window = Window()) -> dict | None: ...

    def alerting_health(self) -> dict | None: ...


def cannot_reach(url: str, exc: Exception) -> str:
    """The message for a collector that does not answer at ``url`` (the dashboard, ``report`` and
    ``demo`` say the same)."""
    return (
        f"Cannot reach the driftscope collector at {url} ({type(exc).__name__}). "
        "Start it with `driftscope serve` (or `driftscope up`), or open an incident copy "
        "with `driftscope dashboard --source PATH.duckdb`."
    )


def window_params(window: Window, filters: Filters) -> dict[str, str]:
    """Query parameters of the read API for a window and filters (ISO-8601 UTC times)."""
    params: dict[str, str] = {}
    if window.since is not None:
        params["since"] = window.since.isoformat()
    if window.until is not None:
        params["until"] = window.until.isoformat()
    for key in ("service", "agent", "run", "origin_task"):
        value = getattr(filters, key)
        if value:
            params[key] = value
    return params


class HttpSource:
    """The read API of a running ``driftscope serve``."""

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.description = f"collector at {self.url}"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def _get(self, path: str, params: dict | None = None, accept: str = "application/json", missing_ok=False):
        return self._request("GET", path, params, accept, missing_ok=missing_ok)

    def _post(self, path: str, body: dict, params: dict | None = None, accept: str = ARROW_STREAM):
        return self._request("POST", path, params, accept, body=body)

    def _frame(self, response) -> pd.DataFrame:
        """A frame answer: Arrow IPC when the server sent it, else the JSON rows."""
        if response.headers.get("content-type", "").startswith(ARROW_STREAM):
            with pa.ipc.open_stream(response.content) as reader:
                return read.arrow_frame(reader.read_all())
        body = response.json()
        return pd.DataFrame(body.get("rows", []), columns=body.get("columns"))

    def _request(self, method, path, params=None, accept="application/json", missing_ok=False, body=None):
        try:
            response = self._client.request(
                method, path, params=params, headers={"Accept": accept}, json=body
            )
        except httpx.HTTPError as exc:
            raise SourceUnavailable(cannot_reach(self.url, exc)) from exc
        if response.status_code in (401, 403):
            raise SourceUnavailable(
                f"The collector at {self.url} refused the request (HTTP {response.status_code}): "
                "pass its token (DRIFTSCOPE_TOKEN)."
            )
        if missing_ok and response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise SourceUnavailable(
                f"The collector at {self.url} answered HTTP {response.status_code} for {path}: "
                f"{response.text[:300]}"
            )
        return response

    def health(self) -> Health:
        """Ask ``/api/v1/health``; never raises."""
        try:
            body = self._get("/api/v1/health").json()
        except (SourceUnavailable, ValueError) as exc:
            return Health(False, str(exc))
        spans = body.get("spans") if isinstance(body, dict) else None
        count = spans if isinstance(spans, int) else None
        status = body.get("findings") if isinstance(body, dict) else None
        findings = read.describe_freshness(status if isinstance(status, dict) else None)
        return Health(
            True, f"{self.description}: {spans if spans is not None else '?'} spans", count, findings
        )

    def list_metrics(self) -> list[dict]:
        """Metric descriptions as the API lists them."""
        body = self._get("/api/v1/metrics").json()
        return body.get("metrics", []) if isinstance(body, dict) else list(body)

    def metric(
        self, name: str, window: Window, filters: Filters, columns: list[str] | None = None
    ) -> pd.DataFrame:
        """One metric's frame (only ``columns`` when given), transferred as an Arrow IPC stream."""
        params = window_params(window, filters)
        if columns is not None:
            params["columns"] = ",".join(columns)
        response = self._get(f"/api/v1/metrics/{quote(name, safe='')}", params, ARROW_STREAM)
        return self._frame(response)

    def runs(self, window: Window, filters: Filters, limit: int = 500) -> pd.DataFrame:
        """Runs in the window, newest first (at most ``limit``)."""
        params = {**window_params(window, filters), "limit": str(limit)}
        body = self._get("/api/v1/runs", params).json()
        return normalise_runs(_rows_of(body, "runs"))

    def data_version(self) -> str:
        """The health answer (span count, newest span, embeddings) as one string."""
        body = self._get("/api/v1/health").json()
        if isinstance(body, dict):
            findings = body.get("findings") if isinstance(body.get("findings"), dict) else {}
            return "|".join(
                [str(body.get(k)) for k in ("spans", "newest_span", "embeddings", "schema_version")]
                + [str(findings.get(k)) for k in ("findings_as_of", "behind_changes")]
            )
        return str(body)

    def filter_options(self, window: Window) -> dict:
        """Services, agents and the newest run ids in the window (``/api/v1/filter-options``)."""
        params = {**window_params(window, Filters()), "limit": str(FILTER_RUN_LIMIT)}
        body = self._get("/api/v1/filter-options", params).json()
        return {key: [str(v) for v in body.get(key, [])] for key in ("services", "agents", "runs")}

    def run_totals(self, window: Window, filters: Filters) -> pd.DataFrame:
        """Every run in scope with its counts (``/api/v1/runs/totals``, no limit, Arrow)."""
        response = self._get("/api/v1/runs/totals", window_params(window, filters), ARROW_STREAM)
        return typed_run_totals(self._frame(response))

    def run_details(self, window: Window, filters: Filters, run_ids: list[str]) -> pd.DataFrame:
        """``runs`` rows of the given runs (``POST /api/v1/runs/details``)."""
        if not run_ids:
            return normalise_runs(pd.DataFrame(columns=RUN_COLUMNS))
        response = self._post(
            "/api/v1/runs/details", {"run_ids": [str(r) for r in run_ids]}, window_params(window, filters)
        )
        return normalise_runs(self._frame(response))

    def evidence_spans(self, keys: pd.DataFrame) -> pd.DataFrame:
        """The spans named by (run_id, span_id) pairs (``POST /api/v1/evidence-spans``)."""
        if keys.empty:
            return pd.DataFrame(columns=SPAN_COLUMNS)
        pairs = [[str(r), str(s)] for r, s in zip(keys["run_id"], keys["span_id"], strict=True)]
        return self._frame(self._post("/api/v1/evidence-spans", {"keys": pairs}))

    def run_spans(self, run_id: str, containing: list[str] | None = None) -> pd.DataFrame:
        """Every span of one run, in start order (``containing``: only those whose tool arguments,
        input or goal text contain one of these texts; a text with a comma asks for every span)."""
        params = (
            {"containing": ",".join(containing)}
            if containing and not any("," in t for t in containing)
            else None
        )
        response = self._get(f"/api/v1/runs/{quote(run_id, safe='')}/spans", params, missing_ok=True)
        if response is None:  # the API answers 404 for a run without spans
            return pd.DataFrame()
        return normalise_spans(_rows_of(response.json(), "spans"))

    def thresholds(self) -> pd.DataFrame:
        """The thresholds in force, with provenance (JSON text)."""
        body = self._get("/api/v1/thresholds").json()
        return normalise_thresholds(_rows_of(body, "thresholds"))

    def search_spans(self, text: str, window: Window, filters: Filters, limit: int = 100) -> pd.DataFrame:
        """Spans of any run matching a trace id, span id or attribute value (``GET /api/v1/search``)."""
        params = {**window_params(window, filters), "q": text, "limit": str(limit)}
        return _typed_search(self._frame(self._get("/api/v1/search", params, accept=ARROW_STREAM)))

    def alerts(self, window: Window) -> pd.DataFrame:
        """Firing and recent alert episodes (``GET /api/v1/alerts``; issue 18)."""
        response = self._get("/api/v1/alerts", window_params(window, Filters()), ARROW_STREAM)
        return typed_alerts(self._frame(response))

    def compare(self, run_id: str, baseline: str = "auto", window: Window = Window()) -> dict | None:
        """The run beside its crew's healthy runs or a chosen run (``GET /api/v1/runs/<id>/compare``;
        issue 35); None when the run (or the chosen run) has no spans."""
        params = {**window_params(window, Filters()), "baseline": baseline}
        response = self._get(f"/api/v1/runs/{quote(run_id, safe='')}/compare", params, missing_ok=True)
        return None if response is None else response.json()

    def alerting_health(self) -> dict | None:
        """The collector's evaluator and delivery state (``alerting`` of /api/v1/health)."""
        body = self._get("/api/v1/health").json()
        return body.get("alerting") if isinstance(body, dict) else None


def _typed_search(frame: pd.DataFrame) -> pd.DataFrame:
    """Search results with ``start`` as timestamps whatever the transport."""
    frame = frame.reindex(columns=SEARCH_COLUMNS)
    frame["start"] = pd.to_datetime(frame["start"])
    return frame


# Columns of a span search (analytics.search.search_spans).
SEARCH_COLUMNS = ["run_id", "trace_id", "span_id", "span_name", "agent_id", "service", "start", "matched"]


def _rows_of(body, key: str) -> pd.DataFrame:
    """Accept ``[...]``, ``{key: [...]}`` or ``{"columns": [...], "rows": [[...]]}``."""
    if isinstance(body, list):
        return pd.DataFrame(body)
    if "columns" in body and "rows" in body:
        return pd.DataFrame(body["rows"], columns=body["columns"])
    return pd.DataFrame(body.get(key, []))


class DuckDBFileSource:
    """An incident copy of the database, opened read-only; analytics run in this process."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.description = f"database file {self.path}"
        self._lock = threading.Lock()
        self._conn: duckdb.DuckDBPyConnection | None = None

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            if not self.path.exists():
                raise SourceUnavailable(
                    f"No database file at {self.path}. Create one with `driftscope ingest FILE --db "
                    f"{self.path}` or `driftscope demo`, or point --source at a running collector."
                )
            try:
                self._conn = duckdb.connect(str(self.path), read_only=True)
            except duckdb.Error as exc:
                raise SourceUnavailable(
                    f"Cannot open {self.path} read-only ({exc}). If a `driftscope serve` holds it, "
                    "use its URL as the source, or copy the file and open the copy."
                ) from exc
        return self._conn

    def _query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        with self._lock:
            try:
                return self._connection().execute(sql, params or []).df()
            except duckdb.CatalogException as exc:
                raise SourceUnavailable(
                    f"{self.path} is not a driftscope database ({exc}). Create one with "
                    "`driftscope ingest FILE --db PATH`."
                ) from exc

    def health(self) -> Health:
        """Count spans; never raises."""
        try:
            count = int(self._query("SELECT count(*) AS n FROM spans")["n"].iloc[0])
            findings = read.describe_freshness(self._read(read.findings_status))
        except (SourceUnavailable, duckdb.Error) as exc:
            return Health(False, str(exc))
        return Health(True, f"{self.description}: {count} spans", count, findings)

    def list_metrics(self) -> list[dict]:
        """The registered metrics described as the read API lists them."""
        return read.describe_metrics()

    def metric(
        self, name: str, window: Window, filters: Filters, columns: list[str] | None = None
    ) -> pd.DataFrame:
        """Run one registered detector on the file (its errors, and KeyError, reach the page as
        raised); only ``columns`` of its result when given (``analytics.read.metric``)."""
        with self._lock:
            # A cursor keeps detector temp state (registered frames) off the shared connection.
            cursor = self._connection().cursor()
            try:
                return read.metric(cursor, name, window, filters, columns)
            finally:
                cursor.close()

    def _read(self, func, *args):
        """``func(cursor, *args)`` of the read interface on a cursor of the file."""
        with self._lock:
            cursor = self._connection().cursor()
            try:
                return func(cursor, *args)
            except duckdb.CatalogException as exc:
                raise SourceUnavailable(
                    f"{self.path} is not a driftscope database ({exc}). Create one with "
                    "`driftscope ingest FILE --db PATH`."
                ) from exc
            finally:
                cursor.close()

    def runs(self, window: Window, filters: Filters, limit: int = 500) -> pd.DataFrame:
        """Runs in the window, newest first (at most ``limit``)."""
        return normalise_runs(self._read(read.runs, window, filters, limit))

    def run_spans(self, run_id: str, containing: list[str] | None = None) -> pd.DataFrame:
        """Every span of one run, in start order (``containing``: see ``analytics.read.run_spans``)."""
        return normalise_spans(self._read(read.run_spans, run_id, read.RUN_SPAN_LIMIT, containing))

    def data_version(self) -> str:
        """Span count and newest ingest time."""
        return self._read(read.data_version)

    def filter_options(self, window: Window) -> dict:
        """Services, agents and the newest run ids in the window, aggregated in SQL."""
        return self._read(read.filter_options, window, FILTER_RUN_LIMIT)

    def run_totals(self, window: Window, filters: Filters) -> pd.DataFrame:
        """Every run in scope with its counts (one aggregate query, no lists)."""
        return typed_run_totals(self._read(read.run_totals, window, filters))

    def run_details(self, window: Window, filters: Filters, run_ids: list[str]) -> pd.DataFrame:
        """``runs`` rows of the given runs only."""
        if not run_ids:
            return normalise_runs(pd.DataFrame(columns=RUN_COLUMNS))
        return normalise_runs(self._read(read.run_details, window, filters, list(run_ids)))

    def evidence_spans(self, keys: pd.DataFrame) -> pd.DataFrame:
        """The spans named by (run_id, span_id) pairs, in one joined query."""
        if keys.empty:
            return pd.DataFrame(columns=SPAN_COLUMNS)
        return self._read(read.evidence_spans, keys)

    def thresholds(self) -> pd.DataFrame:
        """The thresholds in force (newest calibrated version, else the default), provenance as JSON text."""
        return normalise_thresholds(self._read(read.thresholds_in_force))

    def search_spans(self, text: str, window: Window, filters: Filters, limit: int = 100) -> pd.DataFrame:
        """Spans of any run matching a trace id, span id or attribute value."""
        return _typed_search(self._read(read.search_spans, text, window, filters, limit))

    def alerts(self, window: Window) -> pd.DataFrame:
        """Alert episodes the file holds (a copy of a serve database that evaluated alerts)."""
        return typed_alerts(self._read(read.alerts, window))

    def compare(self, run_id: str, baseline: str = "auto", window: Window = Window()) -> dict | None:
        """The run beside its crew's healthy runs or a chosen run (``analytics.read.compare_run``);
        None when the run (or the chosen run) has no spans."""
        try:
            return self._read(read.compare_run, run_id, baseline, window)
        except RunNotFoundError:
            return None

    def alerting_health(self) -> dict | None:
        """None: delivery state lives in a running serve, not in the file."""
        return None

    def close(self) -> None:
        """Release the file."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class StoreSource(DuckDBFileSource):
    """A ClickHouse store (``chdb:PATH`` or a server; issue 17): analytics run in this process on
    it through the same read interface, translated for ClickHouse (``analytics.engine``).

    The dashboard imports no store code: the composition (``driftscope``) passes ``open_store``,
    a function of no arguments that opens the store. It is called on the first read, so a store
    that cannot be opened is a banner, not a traceback."""

    def __init__(self, open_store: Callable[[], Any], description: str):
        self.path = None
        self.description = description
        self._lock = threading.Lock()
        self._open_store = open_store
        self._conn = None

    def _connection(self):
        if self._conn is None:
            try:
                self._conn = self._open_store()
            except Exception as exc:  # noqa: BLE001 - any failure to open is an unavailable source
                hint = (
                    " chdb lets one process open a data path: while `driftscope serve --store` holds it, "
                    "use that serve's URL as the source (--source http://HOST:4318) or read a copy."
                    if "chdb:" in self.description and "open in another process" not in str(exc)
                    else ""  # the store's own message names the holder and what to do
                )
                raise SourceUnavailable(f"Cannot open the {self.description} ({exc}).{hint}") from exc
        return self._conn

    def health(self) -> Health:
        """Count spans; never raises."""
        from analytics.engine import fetch_rows

        try:
            with self._lock:
                ((count,),) = fetch_rows(self._connection(), "SELECT count(*) FROM spans")
        except Exception as exc:  # noqa: BLE001 - any store error is an unhealthy source
            return Health(False, str(exc))
        return Health(True, f"{self.description}: {count} spans", int(count))

    def metric(
        self, name: str, window: Window, filters: Filters, columns: list[str] | None = None
    ) -> pd.DataFrame:
        """Run one registered detector on the store (only ``columns`` of it when given)."""
        with self._lock:
            return read.metric(self._connection(), name, window, filters, columns)

    def _read(self, func, *args):
        with self._lock:
            return func(self._connection(), *args)

    def alerts(self, window: Window) -> pd.DataFrame:
        """None stored: alert episodes live in a DuckDB store's serve."""
        return pd.DataFrame()

    def close(self) -> None:
        """Release the store."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


ALERT_TIME_COLUMNS = ("active_since", "starts_at", "ends_at", "last_finding_at", "updated_at")


def typed_alerts(frame: pd.DataFrame) -> pd.DataFrame:
    """Alert episodes with their times as timestamps whatever the transport."""
    frame = frame.copy()
    for column in ALERT_TIME_COLUMNS:
        if column in frame.columns:
            frame[column] = pd.to_datetime(frame[column])
    return frame


def typed_run_totals(frame: pd.DataFrame) -> pd.DataFrame:
    """``run_totals`` columns with integer counts (an empty answer keeps its columns)."""
    frame = frame.reindex(columns=RUN_TOTAL_COLUMNS)
    for column in ("spans", "rejected", "errors"):
        frame[column] = frame[column].fillna(0).astype(int)
    return frame


def normalise_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Give a runs frame the documented columns whatever the transport returned."""
    frame = frame.copy()
    for column in RUN_COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    for column in ("first_seen", "last_seen"):
        frame[column] = pd.to_datetime(frame[column], errors="coerce", utc=True).dt.tz_localize(None)
    for column in ("spans", "traces", "errors", "rejected"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").fillna(0).astype(int)
    for column in ("services", "agents"):
        frame[column] = frame[column].map(_as_list)
    return frame[RUN_COLUMNS + [c for c in frame.columns if c not in RUN_COLUMNS]]


def normalise_spans(frame: pd.DataFrame) -> pd.DataFrame:
    """Spans frame (analytics.browse.run_spans columns) with ints for ns and ``attributes`` a dict."""
    frame = frame.copy()
    if frame.empty:
        return frame
    for column in ("start_ns", "end_ns", "duration_ns"):
        if column in frame.columns:
            frame[column] = pd.to_numeric(frame[column], errors="coerce").fillna(0).astype("int64")
    for column in ("attributes",):
        if column in frame.columns:
            frame[column] = frame[column].map(_as_dict)
    if "Timestamp" in frame.columns:
        frame["Timestamp"] = pd.to_datetime(frame["Timestamp"], errors="coerce", utc=True).dt.tz_localize(
            None
        )
    return frame.sort_values(["start_ns"], kind="stable").reset_index(drop=True)


def normalise_thresholds(frame: pd.DataFrame) -> pd.DataFrame:
    """Thresholds frame with the schema's columns."""
    columns = ["name", "value", "version", "method", "calibrated", "provenance"]
    frame = frame.copy()
    for column in columns:
        if column not in frame.columns:
            frame[column] = None
    return frame[columns].reset_index(drop=True)


def _as_list(value) -> list:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return []
    if isinstance(value, str):
        return [value]
    return [v for v in list(value) if v is not None]


def _as_dict(value) -> dict:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return {}
    if isinstance(value, dict):
        return value
    # DuckDB returns MAP columns as {'key': [...], 'value': [...]} or a list of pairs.
    if isinstance(value, list | tuple):
        return {k: v for k, v in value}
    return dict(value)


# --source values naming a ClickHouse store (issue 17; docs/scale-out.md)
STORE_PREFIXES = ("chdb:", "clickhouse://", "clickhouses://")
_store_opener: Callable[[str], Any] | None = None


def is_store_url(source: str | None) -> bool:
    """Whether ``source`` names a ClickHouse store rather than a read API or a DuckDB file."""
    return bool(source) and source.startswith(STORE_PREFIXES)


def set_store_opener(opener: Callable[[str], Any] | None) -> None:
    """Give ``open_source`` the function that opens a store URL (read-only). The composition
    (``driftscope``) calls this: the dashboard may import analytics only, not the store code."""
    global _store_opener
    _store_opener = opener


def open_source(source: str | None, token: str | None = None) -> DataSource:
    """A URL opens the read API; a store URL the store (through the opener the composition set);
    anything else is a DuckDB file path."""
    if not source:
        return HttpSource(DEFAULT_URL, token)
    if source.startswith(("http://", "https://")):
        return HttpSource(source, token)
    if is_store_url(source):
        opener = _store_opener
        if opener is None:
            raise SourceUnavailable(
                f"{source} is a ClickHouse store: start the dashboard with `driftscope dashboard --source "
                f"{source}`, which opens it (`streamlit run dashboard/app.py` alone reads files and URLs)."
            )
        return StoreSource(lambda: opener(source), f"ClickHouse store {source}")
    return DuckDBFileSource(source)
