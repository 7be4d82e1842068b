"""`driftscope calibrate` as one procedure for the two places it runs.

Offline, on a database file no process holds, the CLI runs it on its own connection. While
`driftscope serve` holds the file, the CLI posts the same request to the collector
(``POST /api/v1/calibrate``): the collector computes on a read cursor and hands every threshold
insert to its single writer, so nobody takes the file's lock and ingest keeps going.

Both keep the same guard rails: a baseline window with findings is refused unless
``allow_findings``; ``dry_run`` computes the thresholds and the findings they would leave, inside
a transaction that is always rolled back, so nothing reaches the file and no other reader sees
the trial thresholds.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import duckdb
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from analytics.types import Window, WriteFn
from collector.auth import token_matches
from driftscope.api import is_unicode_text
from driftscope.checks import check_db_path
from driftscope.timeparse import parse_instant

logger = logging.getLogger(__name__)

CALIBRATE_PATH = "/api/v1/calibrate"
# A labelled-pairs CSV is small (the bundled one is 90 KB); the limit keeps a request bounded.
MAX_CALIBRATE_BODY = 16 * 1024 * 1024


class CalibrationInputError(ValueError):
    """The request is malformed or its data cannot be calibrated on (a 400 / exit code 2)."""


class CalibrationRefused(RuntimeError):
    """The baseline window holds findings and the request did not allow that (a 409 / exit 2)."""

    def __init__(self, message: str, findings: dict[str, int]) -> None:
        super().__init__(message)
        self.findings = findings


@dataclass(frozen=True)
class CalibrationRequest:
    """What to calibrate on: labelled pairs (CSV text) and/or a healthy baseline window."""

    pairs_csv: str | None = None
    pairs_name: str | None = None  # the file the CSV came from, for messages and provenance
    target_fpr: float | None = None
    baseline_since: str | None = None  # as the user wrote it: a duration ago (24h) or ISO-8601
    baseline_until: str | None = None
    quantile: float = 0.99
    dry_run: bool = False
    allow_findings: bool = False

    @classmethod
    def from_json(cls, payload: Any) -> CalibrationRequest:
        """Validate a JSON object of these fields (each optional, none unknown)."""
        if not isinstance(payload, dict):
            raise CalibrationInputError("expected a JSON object with the calibration request's fields")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise CalibrationInputError(f"unknown field(s) {unknown[:5]}; known: {', '.join(sorted(known))}")
        text = ("pairs_csv", "pairs_name", "baseline_since", "baseline_until")
        for name in text:
            if payload.get(name) is not None and not isinstance(payload[name], str):
                raise CalibrationInputError(f"{name} must be a string")
            if isinstance(payload.get(name), str) and not is_unicode_text(payload[name]):
                raise CalibrationInputError(f"{name} contains a lone UTF-16 surrogate; send valid Unicode")
        for name in ("target_fpr", "quantile"):
            value = payload.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise CalibrationInputError(f"{name} must be a number")
        for name in ("dry_run", "allow_findings"):
            if not isinstance(payload.get(name, False), bool):
                raise CalibrationInputError(f"{name} must be true or false")
        request = cls(**payload)
        if request.quantile is None:
            raise CalibrationInputError("quantile must be a number")
        return request

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def window(self) -> Window | None:
        """The baseline window, or None without ``baseline_since``."""
        if not self.baseline_since:
            if self.baseline_until:
                raise CalibrationInputError("--baseline-until needs --baseline-since")
            return None
        try:
            return Window(
                since=parse_instant("--baseline-since", self.baseline_since),
                until=parse_instant("--baseline-until", self.baseline_until) if self.baseline_until else None,
            )
        except ValueError as exc:
            raise CalibrationInputError(str(exc)) from exc


def finding_counts(
    conn: duckdb.DuckDBPyConnection, window: Window, from_spans: bool = False
) -> dict[str, int]:
    """Findings per finding detector in ``window`` under the thresholds in force (zeros left
    out); ``from_spans``: computed from the spans, not read from the findings tables (which hold
    the committed thresholds' findings, not a dry run's)."""
    from driftscope.commands import finding_counts as count_findings

    return count_findings(conn, window, from_spans)


def thresholds_in_force(conn: duckdb.DuckDBPyConnection) -> dict[str, dict]:
    """Every threshold in force by name (newest stored version, or the default)."""
    from analytics.thresholds import list_thresholds

    return {t["name"]: t for t in list_thresholds(conn)}


def threshold_diff(before: dict[str, dict], after: dict[str, dict]) -> list[dict]:
    """Thresholds whose value or version changed: name, before, after, method."""
    rows = []
    for name in sorted(after):
        old, new = before.get(name, {}), after[name]
        if (old.get("value"), old.get("version")) != (new.get("value"), new.get("version")):
            rows.append(
                {
                    "name": name,
                    "before": old.get("value"),
                    "after": new.get("value"),
                    "method": new.get("method"),
                }
            )
    return rows


def run_calibration(
    conn: duckdb.DuckDBPyConnection,
    request: CalibrationRequest,
    write: WriteFn | None = None,
    pairs_path: str | Path | None = None,
) -> dict[str, Any]:
    """Calibrate as ``request`` asks and return the report the CLI prints.

    ``conn`` reads (in ``serve``: a cursor of the collector's connection); ``write`` stores each
    threshold (``SpanWriter.execute_write_fn`` in ``serve``; None: a transaction of ``conn``,
    for a process that is the file's only writer). ``pairs_path`` names a CSV file already on
    this machine; otherwise ``request.pairs_csv`` is written to a temporary file.

    Raises ``CalibrationRefused`` when the baseline window holds findings (unless allowed or a
    dry run) and ``CalibrationInputError`` for data that cannot be calibrated on.
    """
    if not request.pairs_csv and pairs_path is None and not request.baseline_since:
        raise CalibrationInputError(
            "Give --pairs FILE.csv (labelled pairs) and/or --baseline-since DURATION (healthy window)"
        )
    window = request.window()
    results: dict[str, Any] = {}
    if window is not None:
        # A baseline is what "healthy" looks like: thresholds calibrated on failures let those
        # failures pass from then on, silently switching detectors off.
        in_window = finding_counts(conn, window)
        if in_window and not (request.allow_findings or request.dry_run):
            listed = ", ".join(f"{name} {n}" for name, n in sorted(in_window.items()))
            raise CalibrationRefused(
                f"The baseline window ({request.baseline_since} to {request.baseline_until or 'now'}) holds "
                f"{sum(in_window.values())} finding(s) ({listed}); a baseline must be healthy, or the "
                "new thresholds will let these failures pass. Pick a window without failures, preview "
                "the effect with --dry-run, or pass --allow-findings to calibrate anyway.",
                in_window,
            )
        if in_window:
            logger.warning("the baseline window holds findings: %s", in_window)
        results["baseline_findings"] = in_window
    before = thresholds_in_force(conn)
    with tempfile.TemporaryDirectory(prefix="driftscope-calibrate-") as scratch:
        if pairs_path is None and request.pairs_csv:
            name = (
                re.sub(r"[^A-Za-z0-9._-]", "_", Path(request.pairs_name or "pairs.csv").name) or "pairs.csv"
            )
            pairs_path = Path(scratch) / name
            pairs_path.write_text(request.pairs_csv, encoding="utf-8")
        if not request.dry_run:
            _calibrate(conn, request, window, pairs_path, write, results)
            results["changed"] = threshold_diff(before, thresholds_in_force(conn))
            return results
        # The trial thresholds live only in this transaction: detectors run under them here and
        # nowhere else (other cursors see the committed versions), and the rollback leaves the
        # file as it was.
        conn.execute("BEGIN TRANSACTION")
        try:
            # computed under each version, not read from the findings tables
            findings_before = finding_counts(conn, Window(), from_spans=True)
            _calibrate(conn, request, window, pairs_path, lambda fn: fn(conn), results)
            results["changed"] = threshold_diff(before, thresholds_in_force(conn))
            results["findings_all_time"] = {
                "before": findings_before,
                "after": finding_counts(conn, Window(), from_spans=True),
            }
        finally:
            conn.execute("ROLLBACK")
    results["dry_run"] = "nothing was stored"
    return results


def _calibrate(
    conn: duckdb.DuckDBPyConnection,
    request: CalibrationRequest,
    window: Window | None,
    pairs_path: str | Path | None,
    write: WriteFn | None,
    results: dict[str, Any],
) -> None:
    from analytics.calibration import calibrate_from_baseline, calibrate_from_pairs

    if pairs_path is not None:
        try:
            result = calibrate_from_pairs(
                conn, pairs_path, target_fpr=request.target_fpr, write=write, data_name=request.pairs_name
            )
        except ValueError as exc:
            raise CalibrationInputError(
                str(exc).replace(str(pairs_path), request.pairs_name or "pairs")
            ) from exc
        result.pop("roc", None)
        results["pairs"] = result
    if window is not None:
        try:
            results["baseline"] = calibrate_from_baseline(
                conn, window, quantile=request.quantile, write=write
            )
        except ValueError as exc:
            raise CalibrationInputError(str(exc)) from exc


def build_calibrate_routes(cursor_factory, write: WriteFn, token: str | None) -> list[Route]:
    """``POST /api/v1/calibrate`` of ``serve``: a JSON ``CalibrationRequest`` in, the report out.

    Reads run on cursors from ``cursor_factory``; thresholds are stored through ``write`` (the
    single writer). One calibration runs at a time (409 while another is running); a refused
    baseline is a 409 with the findings, bad input a 400; the token, when set, is required.
    """
    running = threading.Lock()

    def calibrate_now(request: CalibrationRequest) -> dict[str, Any]:
        cursor = cursor_factory()
        try:
            return run_calibration(cursor, request, write)
        finally:
            cursor.close()

    async def calibrate(http_request: Request) -> Response:
        if not token_matches(http_request.headers.get("authorization"), token):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        # A web page can make a browser POST text/plain to 127.0.0.1 without asking first; it cannot
        # send application/json without a CORS preflight, which this server never grants.
        if http_request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            return JSONResponse(
                {"error": "send the calibration request as JSON (Content-Type: application/json)"},
                status_code=415,
            )
        try:
            body = await _read_body(http_request)
            request = CalibrationRequest.from_json(json.loads(body or b"null"))
        except ClientDisconnect:
            return Response(status_code=400)
        except (CalibrationInputError, ValueError, RecursionError) as exc:
            message = str(exc) if isinstance(exc, CalibrationInputError) else "the body is not valid JSON"
            return JSONResponse({"error": message}, status_code=400)
        if not running.acquire(blocking=False):
            return JSONResponse(
                {"error": "another calibration is running on this collector; try again when it ends"},
                status_code=409,
            )
        try:
            result = await run_in_threadpool(calibrate_now, request)
        except CalibrationRefused as exc:
            return JSONResponse({"error": str(exc), "baseline_findings": exc.findings}, status_code=409)
        except CalibrationInputError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except Exception as exc:  # noqa: BLE001 - answered with the reason; the log has the traceback
            logger.exception("calibration through the API failed")
            return JSONResponse(
                {
                    "error": f"the calibration failed on the collector ({type(exc).__name__}: {exc}); see its log"
                },
                status_code=500,
            )
        finally:
            running.release()
        logger.info(
            "calibration%s through the API: %d threshold(s) changed",
            " (dry run, nothing stored)" if request.dry_run else "",
            len(result.get("changed", [])),
        )
        return Response(json.dumps(result, default=str).encode(), media_type="application/json")

    return [Route(CALIBRATE_PATH, calibrate, methods=["POST"])]


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "").strip()
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_CALIBRATE_BODY:
        raise CalibrationInputError(f"the request body is over {MAX_CALIBRATE_BODY} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_CALIBRATE_BODY:
            raise CalibrationInputError(f"the request body is over {MAX_CALIBRATE_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def cmd_calibrate(args, values: dict[str, Any]) -> int:
    """`driftscope calibrate`: offline on a database file, or through the collector holding it.

    With ``--endpoint`` the request goes to that collector. Otherwise the database file is
    opened; when a running `driftscope serve` holds it (its health names the same file), the
    request goes through that collector instead of failing on the lock.
    """
    import os

    from collector.store import StoreLockedError
    from driftscope.database import open_database
    from driftscope.settings import BY_NAME, ConfigError

    if not args.pairs and not args.baseline_since:
        raise ConfigError(
            "Give --pairs FILE.csv (labelled pairs) and/or --baseline-since DURATION (healthy window)"
        )
    if args.pairs and not Path(args.pairs).is_file():
        raise ConfigError(f"No such file: {args.pairs}")
    request = CalibrationRequest(
        pairs_name=args.pairs,
        target_fpr=args.target_fpr,
        baseline_since=args.baseline_since,
        baseline_until=args.baseline_until,
        quantile=args.quantile,
        dry_run=args.dry_run,
        allow_findings=args.allow_findings,
    )
    try:
        request.window()
    except CalibrationInputError as exc:
        raise ConfigError(str(exc)) from exc
    token = values.get("token")
    if values.get("store"):  # a ClickHouse store (issue 17): reads and the threshold insert go there
        if args.db or getattr(args, "endpoint", None):
            raise ConfigError("Give one of --store URL, --db PATH or --endpoint URL, not several")
        try:
            result = calibrate_on_store(values["store"], request, args.pairs)
        except (CalibrationRefused, CalibrationInputError) as exc:
            raise ConfigError(str(exc)) from exc
        _report(result, f"in {values['store']}")
        return 0
    # Only an explicit --endpoint / DRIFTSCOPE_ENDPOINT: OTEL_EXPORTER_OTLP_ENDPOINT says where agents
    # send spans (often not a driftscope serve), not where to calibrate.
    explicit = getattr(args, "endpoint", None) or os.environ.get(BY_NAME["endpoint"].env)
    endpoint = values.get("endpoint") if explicit else None
    if endpoint and args.db:
        raise ConfigError(
            "Give either --db PATH (offline: no collector holds the file) or --endpoint URL (calibrate "
            "through that running collector), not both"
        )
    if endpoint:
        logger.info("calibrating through the collector at %s (--endpoint)", endpoint)
        result = calibrate_through(endpoint, token, request)
        _report(result, f"by the collector at {endpoint}")
        return 0
    db = args.db or os.environ.get(BY_NAME["db"].env) or BY_NAME["db"].default
    if not Path(db).is_file():
        check_db_path(db)
        raise ConfigError(f"No database at {db}: ingest spans first (--db PATH or {BY_NAME['db'].env})")
    try:
        conn = open_database(db)
    except StoreLockedError as exc:
        url = find_collector_holding(db, token)
        if url is None:
            raise ConfigError(
                f"{exc} No collector answering on this machine's serve address "
                f"({_local_collector_url()}) reports writing {db}: pass --endpoint URL of the "
                "`driftscope serve` that holds it, and the calibration goes through that collector."
            ) from exc
        logger.info(
            "%s is held by the running collector at %s: calibrating through it (POST %s; its single "
            "writer stores the thresholds, nothing takes the database lock)",
            db,
            url,
            CALIBRATE_PATH,
        )
        result = calibrate_through(url, token, request)
        _report(result, f"by the collector at {url}")
        return 0
    try:
        result = run_calibration(conn, request, pairs_path=args.pairs)
    except CalibrationRefused as exc:
        raise ConfigError(str(exc)) from exc
    except CalibrationInputError as exc:
        raise ConfigError(str(exc)) from exc
    finally:
        conn.close()
    _report(result, f"in {db}")
    return 0


def calibrate_on_store(
    url: str, request: CalibrationRequest, pairs_path: str | Path | None
) -> dict[str, Any]:
    """``run_calibration`` on the ClickHouse store ``url`` names (issue 17): reads through analytics
    there, each new threshold version inserted by ``calibrate_store.threshold_write``."""
    from driftscope.calibrate_store import open_calibration_store, threshold_write

    store = open_calibration_store(url, request.dry_run)
    try:
        return run_calibration(store, request, write=threshold_write(store), pairs_path=pairs_path)
    finally:
        store.close()


def _report(result: dict[str, Any], where: str) -> None:
    print(json.dumps(result, indent=2, default=str))
    if result.get("dry_run"):
        logger.info(
            "dry run %s: %d threshold(s) would change; nothing was stored", where, len(result["changed"])
        )
    else:
        logger.info("stored %d new threshold version(s) %s", len(result.get("changed", [])), where)


def _local_collector_url() -> str:
    """The URL a `driftscope serve` started here with the same settings would answer on."""
    from driftscope.settings import BY_NAME, resolve

    host = resolve(BY_NAME["host"], None)
    port = resolve(BY_NAME["http_port"], None)
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def find_collector_holding(db: str | Path, token: str | None) -> str | None:
    """The URL of the local collector writing ``db``, or None when none answers for that file.

    Asks the health endpoint on the serve address this machine's settings give
    (``DRIFTSCOPE_HOST`` / ``DRIFTSCOPE_HTTP_PORT`` or the defaults) and compares its ``db``.
    """
    import httpx

    from driftscope.settings import ConfigError

    url = _local_collector_url()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"{url}/api/v1/health", headers=headers, timeout=5)
    except httpx.HTTPError:
        return None
    if response.status_code == 401:
        raise ConfigError(
            f"The collector at {url} may hold the database but requires a token: pass --token TOKEN "
            "(or set DRIFTSCOPE_TOKEN)"
        )
    if response.status_code != 200:
        return None
    try:
        held = response.json().get("db")
    except ValueError:
        return None
    return url if held and Path(held) == Path(db).resolve() else None


def calibrate_through(endpoint: str, token: str | None, request: CalibrationRequest) -> dict[str, Any]:
    """POST ``request`` (with the pairs CSV's text) to a running collector; return its report."""
    import httpx

    from driftscope.settings import ConfigError

    base = endpoint.rstrip("/").removesuffix("/v1/traces")
    if request.pairs_name and request.pairs_csv is None:
        request = CalibrationRequest(
            **{**request.to_json(), "pairs_csv": Path(request.pairs_name).read_text(encoding="utf-8")}
        )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        # Scoring pairs and running every detector on a large store takes minutes, not seconds.
        response = httpx.post(
            base + CALIBRATE_PATH,
            json=request.to_json(),
            headers=headers,
            timeout=httpx.Timeout(1800, connect=10),
        )
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"Could not reach the collector at {base} ({exc}); is `driftscope serve` running there?"
        ) from exc
    try:
        payload = response.json()
    except ValueError:
        payload = {}
    if response.status_code == 401:
        raise ConfigError(
            f"The collector at {base} requires a token: pass --token TOKEN (or set DRIFTSCOPE_TOKEN)"
        )
    if response.status_code == 404:
        raise ConfigError(
            f"{base} has no calibration endpoint (POST {CALIBRATE_PATH}): is it a `driftscope serve` of "
            "this version?"
        )
    if response.status_code != 200 or not isinstance(payload, dict):
        error = payload.get("error") if isinstance(payload, dict) else None
        raise ConfigError(
            error or f"The collector at {base} answered {response.status_code}: {response.text[:300]}"
        )
    return payload
