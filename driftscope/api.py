"""The read API the dashboard and reports use: /api/v1/... on the serve process's HTTP port.

It serialises analytics' read interface (``analytics.read``): each route validates its parameters
against a fixed list, calls one function there and writes the answer as JSON or Arrow. No request
carries SQL, a path or a database name. Queries run on cursors of the serve process's own
connection, off the event loop.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from datetime import date, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from analytics import read
from analytics.compare import AUTO, RunNotFoundError, UnsupportedStoreError
from analytics.search import DEFAULT_SEARCH_LIMIT
from analytics.types import Filters, Page, Window
from collector.auth import token_matches
from driftscope.timeparse import parse_instant

logger = logging.getLogger(__name__)

ARROW = "application/vnd.apache.arrow.stream"
FILTER_PARAMS = ("service", "agent", "run", "origin_task")
WINDOW_PARAMS = ("since", "until")
MAX_PARAM_CHARS = 512
# Largest JSON body a lookup (POST) endpoint reads: 10,000 evidence keys of two ids each fit.
MAX_LOOKUP_BODY = 2 * 1024 * 1024
# Most spans one search returns (GET /api/v1/search).
MAX_SEARCH_RESULTS = 1000


class BadParameterError(ValueError):
    """A query parameter is unknown, repeated or of the wrong form (400)."""


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date, pd.Timestamp)):
        return value.isoformat()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, pd.Timedelta):
        return value.total_seconds()
    return str(value)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NaT:
        return None
    return value


def frame_payload(frame: pd.DataFrame) -> dict:
    """Rows of a DataFrame as JSON-ready dicts (NaN -> null, timestamps ISO-8601)."""
    records = frame.to_dict(orient="records")
    return {
        "columns": [str(c) for c in frame.columns],
        "rows": [{k: _clean(v) for k, v in row.items()} for row in records],
    }


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, default=_json_default, ensure_ascii=False, allow_nan=False).encode()


def wants_arrow(request: Request) -> bool:
    return ARROW in request.headers.get("accept", "")


def arrow_response(table: pa.Table) -> Response:
    """``table`` as an Arrow IPC stream (sent from Arrow's buffer, not a copy of it)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return Response(memoryview(sink.getvalue()), media_type=ARROW)


def frame_response(request: Request, frame: pd.DataFrame, extra: dict | None = None) -> Response:
    """Arrow IPC stream when the client asks for it, else JSON."""
    if wants_arrow(request):
        return arrow_response(read.arrow_table(frame))  # list columns read back as Python lists
    payload = dict(extra or {})
    payload.update(frame_payload(frame))
    return Response(dumps(payload), media_type="application/json")


def window_and_filters(params: dict) -> tuple[Window, Filters]:
    """The validated query parameters as the analytics window and filters."""
    window = Window(since=params.get("since"), until=params.get("until"))
    filters = Filters(**{name: params.get(name) for name in FILTER_PARAMS})
    return window, filters


def is_unicode_text(text: str) -> bool:
    """False for a str holding a lone UTF-16 surrogate (JSON's "\\ud800" decodes to one), which
    no database or UTF-8 encoder takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_param(name: str, raw: str) -> str:
    if len(raw) > MAX_PARAM_CHARS:
        raise BadParameterError(f"{name} is longer than {MAX_PARAM_CHARS} characters")
    if any(ord(ch) < 32 for ch in raw):
        raise BadParameterError(f"{name} contains control characters")
    if not raw.isascii() and not is_unicode_text(raw):
        raise BadParameterError(
            f"{name} contains a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode"
        )
    return raw


def parse_query(request: Request, allowed: tuple[str, ...]) -> dict[str, Any]:
    """Validate query parameters: only ``allowed`` names, each once, each of its type."""
    params: dict[str, Any] = {}
    for name, raw in request.query_params.multi_items():
        if name not in allowed:
            raise BadParameterError(
                f"unknown parameter {name[:40]!r}; allowed here: {', '.join(allowed) or 'none'}"
            )
        if name in params:
            raise BadParameterError(f"parameter {name!r} given more than once")
        if name in WINDOW_PARAMS:
            try:
                params[name] = parse_instant(name, raw)
            except ValueError as exc:
                raise BadParameterError(str(exc)) from None
        elif name == "limit":
            # isascii(): "²" and other Unicode digits pass isdigit() but not int().
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 1 <= int(raw) <= 100_000:
                raise BadParameterError(f"limit must be an integer between 1 and 100000, got {raw[:20]!r}")
            params[name] = int(raw)
        elif name == "offset":
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 12):
                raise BadParameterError(
                    f"offset must be an integer between 0 and 999999999999, got {raw[:20]!r}"
                )
            params[name] = int(raw)
        else:
            params[name] = _text_param(name, raw)
    if params.get("since") and params.get("until") and params["since"] > params["until"]:
        raise BadParameterError("since is after until")
    return params


async def read_body_capped(request: Request, limit: int) -> bytes:
    """The request body, refused (400) as soon as ``Content-Length`` or the bytes streamed so far
    pass ``limit``: a huge body is never held in memory."""
    declared = request.headers.get("content-length")
    if declared is not None:
        declared = declared.strip()
        if not (declared.isascii() and declared.isdigit()):
            raise BadParameterError(f"Content-Length must be a byte count, got {declared[:20]!r}")
        if int(declared) > limit:
            raise BadParameterError(
                f"request body of {declared} bytes is over {limit} bytes; ask for fewer items at a time"
            )
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadParameterError(f"request body is over {limit} bytes; ask for fewer items at a time")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_list(request: Request, key: str) -> list:
    """The list under ``key`` of a small JSON object body (the lookup endpoints' only input)."""
    body = await read_body_capped(request, MAX_LOOKUP_BODY)
    try:
        payload = json.loads(body or b"null")
    except (ValueError, RecursionError):
        raise BadParameterError(
            f'expected a JSON object like {{"{key}": [...]}} as the body (valid JSON, nested at most '
            "a few levels)"
        ) from None
    if not isinstance(payload, dict) or not isinstance(payload.get(key), list) or set(payload) != {key}:
        raise BadParameterError(f'expected a JSON object with exactly one key, {{"{key}": [...]}}')
    return payload[key]


def _text_items(name: str, items: list, limit: int) -> list[str]:
    if len(items) > limit:
        raise BadParameterError(f"{name}: at most {limit} items per request, got {len(items)}")
    if not all(isinstance(item, str) for item in items):
        raise BadParameterError(f"{name} must be a list of strings")
    return [_text_param(name, item) for item in items]


def build_api_routes(
    cursor_factory: Callable,
    token: str | None,
    health_extra: Callable[[], dict],
    store_health: Callable[[Any], dict] = read.store_health,
) -> list[Route]:
    """Routes of /api/v1, reading through cursors from ``cursor_factory`` (anything the read
    interface takes, with a ``close()``: a DuckDB cursor, or a turn on a ClickHouse store);
    ``store_health`` gives the health answer's store part."""

    def guarded(handler):
        async def wrapper(request: Request) -> Response:
            if not token_matches(request.headers.get("authorization"), token):
                return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
            try:
                return await handler(request)
            except BadParameterError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            except ClientDisconnect:
                return Response(status_code=400)

        return wrapper

    def run(fn, *args):
        def call():
            cursor = cursor_factory()
            try:
                return fn(cursor, *args)
            finally:
                cursor.close()

        return run_in_threadpool(call)

    def framed(request: Request, fn, *args, extra: dict | None = None, missing=None):
        """``fn``'s frame answered (JSON or Arrow) from the worker thread that read it: the event
        loop, which also takes ingest, only sends the bytes. ``missing(frame)``: a Response to
        send instead (a 404), or None."""

        def call(cursor) -> Response:
            frame = fn(cursor, *args)
            instead = missing(frame) if missing is not None else None
            return instead if instead is not None else frame_response(request, frame, extra)

        return run(call)

    async def health(request: Request) -> Response:
        parse_query(request, ())
        payload = await run(store_health)
        payload.update(health_extra())
        return Response(dumps(payload), media_type="application/json")

    async def list_metrics(request: Request) -> Response:
        parse_query(request, ())
        return Response(dumps({"metrics": read.describe_metrics()}), media_type="application/json")

    async def metric(request: Request) -> Response:
        name = request.path_params["name"]
        known = read.metric_names()
        if name not in known:
            return JSONResponse(
                {"error": f"unknown metric {name[:60]!r}; known: {', '.join(sorted(known))}"}, status_code=404
            )
        params = parse_query(request, WINDOW_PARAMS + FILTER_PARAMS + ("columns", "limit", "offset"))
        try:  # ?columns=a,b: only those documented columns (the Overview needs no evidence lists)
            columns = read.metric_columns(name, params.get("columns"))
        except ValueError as exc:
            raise BadParameterError(str(exc)) from None
        window, filters = window_and_filters(params)
        # ?limit=&offset=: one page of the rows in their documented order (a findings table
        # gives just those rows); without them, every row
        paged = "limit" in params or "offset" in params
        page = Page(params.get("limit"), params.get("offset", 0)) if paged else None

        def answer(cursor) -> Response:
            # one worker thread and cursor for the read, how current it is and the encoding: the
            # event loop, which also takes ingest, only sends the bytes
            arrow = (
                read.metric_arrow(cursor, name, window, filters, columns, page)
                if wants_arrow(request)
                else None
            )
            if arrow is not None:
                # the table's own Arrow rows, no pandas on the way (read.arrow_frame reads
                # them back as run_metric's frame)
                table, total = arrow
                fresh = read.findings_freshness(cursor, None, name)
                rows = table.num_rows
            else:
                frame = read.metric(cursor, name, window, filters, columns, page)
                fresh = read.findings_freshness(cursor, frame, name)
                total, rows = int(frame.attrs.get("total_rows", len(frame))), len(frame)
            as_of = fresh["findings_as_of"]
            fresh["findings_as_of"] = as_of.isoformat() if as_of is not None else None
            envelope = {"metric": name, **fresh, "total_rows": total}
            if page is not None:
                end = page.offset + rows
                envelope.update(
                    offset=page.offset, limit=page.limit, next_offset=end if end < total else None
                )
            if arrow is not None:
                response = arrow_response(table)
            else:
                response = frame_response(request, frame, envelope)
            response.headers["X-Driftscope-Total-Rows"] = str(total)
            # the Arrow answer carries no JSON envelope: how current it is travels in headers
            response.headers["X-Driftscope-Source"] = fresh["source"]
            if fresh["findings_as_of"] is not None:
                response.headers["X-Driftscope-Findings-As-Of"] = fresh["findings_as_of"]
            if fresh["lag_seconds"] is not None:
                response.headers["X-Driftscope-Findings-Lag"] = f"{fresh['lag_seconds']:.3f}"
            return response

        return await run(answer)

    async def runs(request: Request) -> Response:
        params = parse_query(request, WINDOW_PARAMS + FILTER_PARAMS + ("limit",))
        return await framed(request, read.runs, *window_and_filters(params), params.get("limit", 500))

    async def run_spans(request: Request) -> Response:
        run_id = _text_param("run id", request.path_params["run_id"])
        params = parse_query(request, ("limit", "containing"))
        try:  # ?containing=C1,C2: only spans whose texts state one of them
            containing = read.containing_texts(params.get("containing"))
        except ValueError as exc:
            raise BadParameterError(str(exc)) from None

        def missing(frame: pd.DataFrame) -> Response | None:
            if frame.empty and containing is None:  # with a text filter, no span may contain it
                return JSONResponse({"error": f"no spans for run {run_id[:80]!r}"}, status_code=404)
            return None

        limit = params.get("limit", read.RUN_SPAN_LIMIT)
        return await framed(
            request, read.run_spans, run_id, limit, containing, extra={"run": run_id}, missing=missing
        )

    async def run_compare(request: Request) -> Response:
        # What changed (issue 35): the run beside its crew's healthy runs, or beside ?baseline=RUN.
        run_id = _text_param("run id", request.path_params["run_id"])
        params = parse_query(request, ("baseline",) + WINDOW_PARAMS)
        baseline = params.get("baseline") or AUTO
        try:
            answer = await run(read.compare_run, run_id, baseline, window_and_filters(params)[0])
        except RunNotFoundError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except UnsupportedStoreError as exc:
            return JSONResponse({"error": str(exc)}, status_code=501)
        return Response(dumps(answer), media_type="application/json")

    async def run_totals(request: Request) -> Response:
        params = parse_query(request, WINDOW_PARAMS + FILTER_PARAMS)
        return await framed(request, read.run_totals, *window_and_filters(params))

    async def run_details(request: Request) -> Response:
        params = parse_query(request, WINDOW_PARAMS + FILTER_PARAMS)
        run_ids = _text_items("run_ids", await read_json_list(request, "run_ids"), read.MAX_LOOKUP_ITEMS)
        return await framed(request, read.run_details, *window_and_filters(params), run_ids)

    async def filter_options(request: Request) -> Response:
        params = parse_query(request, WINDOW_PARAMS + ("limit",))
        options = await run(read.filter_options, window_and_filters(params)[0], params.get("limit", 500))
        return Response(dumps(options), media_type="application/json")

    async def evidence_spans(request: Request) -> Response:
        parse_query(request, ())
        keys = await read_json_list(request, "keys")
        if len(keys) > read.MAX_LOOKUP_ITEMS:
            raise BadParameterError(f"keys: at most {read.MAX_LOOKUP_ITEMS} per request, got {len(keys)}")
        if not all(isinstance(k, list) and len(k) == 2 and all(isinstance(v, str) for v in k) for k in keys):
            raise BadParameterError('keys must be [run_id, span_id] pairs of strings, e.g. [["r1", "ab12"]]')
        pairs = [(_text_param("run_id", r), _text_param("span_id", s)) for r, s in keys]
        return await framed(request, read.evidence_spans, pairs)

    async def thresholds(request: Request) -> Response:
        parse_query(request, ())
        return await framed(request, read.thresholds_in_force)

    async def alerts(request: Request) -> Response:
        # Firing and recent alerts (issue 18): the dashboard's Alerts page and the report.
        params = parse_query(request, ("limit",) + WINDOW_PARAMS)
        window, _ = window_and_filters(params)
        return await framed(request, read.alerts, window, params.get("limit", 500))

    async def search(request: Request) -> Response:
        # Trace search across runs (issue 16): what the run explorer's "Search all runs" asks.
        params = parse_query(request, ("q", "limit") + WINDOW_PARAMS + FILTER_PARAMS)
        if not params.get("q"):
            raise BadParameterError("q is required: the trace id, span id or attribute value to search for")
        if params.get("limit", 0) > MAX_SEARCH_RESULTS:
            raise BadParameterError(f"limit must be at most {MAX_SEARCH_RESULTS} for a search")
        limit = params.get("limit", DEFAULT_SEARCH_LIMIT)
        try:
            return await framed(
                request,
                read.search_spans,
                params["q"],
                *window_and_filters(params),
                limit,
                extra={"q": params["q"]},
            )
        except ValueError as exc:
            raise BadParameterError(str(exc)) from None

    return [
        Route("/api/v1/health", guarded(health), methods=["GET"]),
        Route("/api/v1/metrics", guarded(list_metrics), methods=["GET"]),
        Route("/api/v1/metrics/{name}", guarded(metric), methods=["GET"]),
        Route("/api/v1/runs", guarded(runs), methods=["GET"]),
        Route("/api/v1/runs/totals", guarded(run_totals), methods=["GET"]),
        Route("/api/v1/runs/details", guarded(run_details), methods=["POST"]),
        Route("/api/v1/filter-options", guarded(filter_options), methods=["GET"]),
        Route("/api/v1/evidence-spans", guarded(evidence_spans), methods=["POST"]),
        Route("/api/v1/runs/{run_id:path}/spans", guarded(run_spans), methods=["GET"]),
        Route("/api/v1/runs/{run_id:path}/compare", guarded(run_compare), methods=["GET"]),
        Route("/api/v1/thresholds", guarded(thresholds), methods=["GET"]),
        Route("/api/v1/alerts", guarded(alerts), methods=["GET"]),
        Route("/api/v1/search", guarded(search), methods=["GET"]),
    ]
