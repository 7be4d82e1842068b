"""`driftscope ingest`: files into a database file, or through a running collector."""

from __future__ import annotations

import logging
import sys
import time

import httpx
from tqdm import tqdm

from collector.files import ingest_files, iter_file_requests
from collector.store import StoreLockedError
from driftscope.database import open_database
from driftscope.settings import ConfigError

logger = logging.getLogger(__name__)


def _count_requests(paths: list[str]) -> int:
    return sum(1 for path in paths for _ in iter_file_requests(path))


def ingest_to_db(db: str, paths: list[str]) -> int:
    """Decode and store straight into ``db``; exit status 1 if anything was rejected."""
    with tqdm(desc="spans", unit="span", file=sys.stderr, disable=None) as bar:
        try:
            open_database(db).close()  # the analytics tables too, as `serve` would create them
            result = ingest_files(db, paths, progress=bar.update)
        except StoreLockedError as exc:
            raise ConfigError(str(exc)) from exc
    for error in result.errors[:20]:
        logger.warning("%s", error)
    logger.info(
        "%d request(s), %d span(s) accepted (%d new), %d rejected, into %s",
        result.requests,
        result.accepted,
        result.stored,
        result.rejected,
        db,
    )
    return 1 if result.errors else 0


def ingest_to_endpoint(endpoint: str, paths: list[str], token: str | None, max_attempts: int = 8) -> int:
    """POST every request to ``endpoint``/v1/traces, retrying 429/503 as the OTLP spec says."""
    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    failures = 0
    with (
        httpx.Client(timeout=60) as client,
        tqdm(total=_count_requests(paths), desc="requests", unit="req", file=sys.stderr, disable=None) as bar,
    ):
        for where, payload in iter_file_requests_all(paths):
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
            elif response.content not in (b"", b"{}"):
                logger.warning("%s: %s", where, response.text[:300])
            bar.update(1)
    return 1 if failures else 0


def iter_file_requests_all(paths: list[str]):
    for path in paths:
        yield from iter_file_requests(path)
