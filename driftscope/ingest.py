"""`driftscope ingest`: files into a database file, or through a running collector."""

from __future__ import annotations

import json
import logging
import sys
import time

import httpx
from tqdm import tqdm

from collector.files import IngestResult, ingest_files, iter_file_requests
from collector.store import StoreLockedError
from driftscope.database import open_database
from driftscope.settings import ConfigError

logger = logging.getLogger(__name__)


OTLP_HINT = (
    'expected OTLP/JSON trace data: an ExportTraceServiceRequest with "resourceSpans" per file, '
    "or one per line (JSON Lines, as the OpenTelemetry Collector's file exporter writes)"
)


def _count_requests(paths: list[str]) -> int:
    return sum(1 for path in paths for _ in iter_file_requests(path))


def what_is_missing(path: str) -> str:
    """Why a file that yielded no span is not trace data, in a few words."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 20)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not head.strip():
        return "is empty"
    first_line = head.strip().splitlines()[0]
    document = None
    for candidate in (head, first_line):
        try:
            document = json.loads(candidate)
            break
        except ValueError:
            continue
    else:
        return "is not JSON"
    if not isinstance(document, dict):
        return f"holds a JSON {type(document).__name__}, not an object"
    if "resourceSpans" not in document:
        keys = ", ".join(sorted(map(str, document))[:6]) or "none"
        return f'has no "resourceSpans" (its top-level keys: {keys})'
    return 'has "resourceSpans" but no span in them'


def count_spans(payload: bytes) -> int:
    """Spans in one OTLP/JSON request (0 when it is not one)."""
    try:
        document = json.loads(payload)
    except ValueError:
        return 0
    if not isinstance(document, dict):
        return 0
    total = 0
    for resource in document.get("resourceSpans") or []:
        scopes = (resource or {}).get("scopeSpans") or (resource or {}).get("instrumentationLibrarySpans")
        for scope in scopes or []:
            total += len((scope or {}).get("spans") or [])
    return total


def _report_empty_files(empty: list[str]) -> None:
    for path in empty:
        logger.error("%s: no span ingested: the file %s; %s", path, what_is_missing(path), OTLP_HINT)


def ingest_to_db(db: str, paths: list[str]) -> int:
    """Decode and store straight into ``db``.

    Exit status 1 if anything was rejected or a file held no span (each such file is named with
    what it lacks).
    """
    total = IngestResult()
    empty = []
    with tqdm(desc="spans", unit="span", file=sys.stderr, disable=None) as bar:
        try:
            conn = open_database(db)  # the analytics tables too, as `serve` would create them
        except StoreLockedError as exc:
            raise ConfigError(str(exc)) from exc
        try:
            for path in paths:
                result = ingest_files(db, [path], progress=bar.update, conn=conn)
                if result.accepted + result.rejected == 0:
                    empty.append(path)
                for name in ("requests", "accepted", "stored", "rejected"):
                    setattr(total, name, getattr(total, name) + getattr(result, name))
                total.errors.extend(result.errors)
        finally:
            conn.close()
    for error in total.errors[:20]:
        logger.warning("%s", error)
    _report_empty_files(empty)
    logger.info(
        "%d request(s), %d span(s) accepted (%d new), %d rejected, into %s",
        total.requests,
        total.accepted,
        total.stored,
        total.rejected,
        db,
    )
    return 1 if total.errors or empty else 0


def ingest_to_endpoint(endpoint: str, paths: list[str], token: str | None, max_attempts: int = 8) -> int:
    """POST every request to ``endpoint``/v1/traces, retrying 429/503 as the OTLP spec says."""
    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    failures = 0
    sent = 0
    rejected = 0
    per_file: dict[str, int] = {path: 0 for path in paths}
    with (
        httpx.Client(timeout=60) as client,
        tqdm(total=_count_requests(paths), desc="requests", unit="req", file=sys.stderr, disable=None) as bar,
    ):
        for path, where, payload in iter_file_requests_all(paths):
            spans = count_spans(payload)
            per_file[path] += spans
            for attempt in range(max_attempts):
                try:
                    response = client.post(url, content=payload, headers=headers)
                except httpx.HTTPError as exc:
                    if attempt == max_attempts - 1:
                        raise ConfigError(f"Could not reach the collector at {url}: {exc}") from exc
                    time.sleep(min(2**attempt * 0.2, 5))
                    continue
                if response.status_code in (429, 502, 503, 504):
                    delay = response.headers.get("retry-after", "")
                    time.sleep(float(delay) if delay.isdigit() else min(2**attempt * 0.2, 5))
                    continue
                break
            if response.status_code != 200:
                failures += 1
                logger.warning("%s: HTTP %d %s", where, response.status_code, response.text[:300])
            else:
                refused = rejected_spans(response.content)
                rejected += refused
                sent += spans - refused
                if response.content not in (b"", b"{}"):
                    logger.warning("%s: %s", where, response.text[:300])
            bar.update(1)
    empty = [path for path, spans in per_file.items() if spans == 0]
    _report_empty_files(empty)
    logger.info(
        "%d span(s) accepted by %s, %d rejected (listed above); %d request(s) failed",
        sent,
        url,
        rejected,
        failures,
    )
    return 1 if failures or empty or rejected else 0


def rejected_spans(body: bytes) -> int:
    """The spans a collector's OTLP/JSON answer says it rejected (``partialSuccess``), else 0."""
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        return 0
    partial = answer.get("partialSuccess") if isinstance(answer, dict) else None
    try:
        return int((partial or {}).get("rejectedSpans") or 0)
    except (TypeError, ValueError):
        return 0


def iter_file_requests_all(paths: list[str]):
    """``(path, where, payload)`` of every request in ``paths``."""
    for path in paths:
        for where, payload in iter_file_requests(path):
            yield path, where, payload
