"""all-MiniLM-L6-v2 on ONNX Runtime: the local fp32 export and the encoder that runs it.

The ONNX file is exported from the shipped weights on first use (nothing is downloaded), checked
against torch on probe texts and cached (``analytics.embeddings`` decides where). It is the same
fp32 model as sentence-transformers: vectors agree to ~1e-7.

Where the time goes (2 Zen 3 vCPUs, AVX2): a text of ~23 tokens is ~0.49 GFLOP, 85% of it in the
six layers' dense matrix products, which ONNX Runtime already runs near the core's fp32 peak. So
the encoder avoids waste rather than computation: texts are sorted by token count and batched
under a token budget (padding and the quadratic attention stay small, activations stay in
cache), and a call with several threads runs whole batches concurrently on one single-threaded
session instead of splitting every operator across threads (no per-operator synchronisation,
and a thread that loses its core to another process does not stall the others). A call with
one thread does all its work, tokenizing included, on the calling thread, so the embedding
worker's low priority covers all of it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DIM = 384
MAX_SEQ_LENGTH = 256  # sentence_bert_config.json of the shipped model
ONNX_OPSET = 17
# Padded tokens per batch (batch size x longest text in it). Measured on this model: batches of
# 100-1,000 tokens run at the same speed per token; larger ones get slower (activations leave
# the core's cache) and batches of long texts also pay the attention matrices (batch x 12 x n^2).
TOKENS_PER_BATCH = 512
# Minimum cosine between ONNX and torch vectors of the probe texts for the export to be used.
EXPORT_MIN_COSINE = 0.99999
PROBES = (
    "Plan a three-day team offsite in Lisbon for 25 people under a 20,000 EUR budget",
    "Find venues",
    "Write a blog post about the history of Portuguese tiles, with three sections and a short summary",
)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, float32."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of the token vectors where ``mask`` is 1 (sentence-transformers' mean pooling)."""
    weights = mask[..., None].astype(np.float32)
    return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


def plan_batches(
    lengths: np.ndarray, batch_size: int, threads: int = 1, tokens_per_batch: int = TOKENS_PER_BATCH
) -> list[np.ndarray]:
    """Row indices of each batch: rows sorted by token count (stable), at most ``batch_size``
    rows and, unless one row alone exceeds it, ``tokens_per_batch`` padded tokens per batch.

    With several ``threads`` batches are made small enough that every thread gets one.
    """
    order = np.argsort(lengths, kind="stable")
    count = len(order)
    cap = max(1, min(batch_size, -(-count // max(1, threads))))
    batches = []
    start = 0
    while start < count:
        # Ascending order: the last row of a batch is its widest.
        widest = int(lengths[order[min(start + cap, count) - 1]])
        size = max(1, min(cap, tokens_per_batch // max(1, widest)))
        batches.append(order[start : start + size])
        start += size
    return batches


class OnnxEncoder:
    """The exported model run by ONNX Runtime; mean pooling and L2 norm in numpy.

    One session with a single intra-op thread, shared by every caller (``InferenceSession.run``
    is thread-safe and releases the GIL): a call with ``threads`` > 1 runs that many batches at
    once, each on its own thread.
    """

    runtime = "onnx"

    def __init__(self, onnx_path: pathlib.Path, tokenizer_path: pathlib.Path) -> None:
        from tokenizers import Tokenizer

        self.path = onnx_path
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.no_padding()
        # Counts [CLS] and [SEP], as sentence-transformers' max_seq_length does.
        self._tokenizer.enable_truncation(max_length=MAX_SEQ_LENGTH)
        self._session: Any = None
        self._lock = threading.Lock()

    def session(self) -> Any:
        """The inference session, created on first use (about half a second)."""
        with self._lock:
            if self._session is None:
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                self._session = ort.InferenceSession(
                    str(self.path), options, providers=["CPUExecutionProvider"]
                )
            return self._session

    def tokenize(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        """Token ids of each text, [CLS] and [SEP] included, truncated to ``MAX_SEQ_LENGTH``.

        One thread: on the calling thread. More: the tokenizer's own (Rust) thread pool.
        """
        if threads > 1:
            encodings = self._tokenizer.encode_batch(texts)
        else:
            encodings = [self._tokenizer.encode(text) for text in texts]
        return [encoding.ids for encoding in encodings]

    def encode(self, texts: list[str], batch_size: int = 32, threads: int | None = None) -> np.ndarray:
        """L2-normalised float32 vectors, one per text, in order (``threads`` None: every core)."""
        threads = max(1, threads or os.cpu_count() or 1)
        out = np.empty((len(texts), DIM), dtype=np.float32)
        if not texts:
            return out
        session = self.session()
        ids = self.tokenize(texts, threads)
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        batches = plan_batches(lengths, batch_size, threads)

        def run(rows: np.ndarray) -> None:
            width = int(lengths[rows].max())
            input_ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for i, row in enumerate(rows):
                n = lengths[row]
                input_ids[i, :n] = ids[row]
                mask[i, :n] = 1
            feed = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(mask)}
            (hidden,) = session.run(None, feed)
            out[rows] = normalize(mean_pool(hidden, mask))

        if threads == 1 or len(batches) == 1:
            for rows in batches:
                run(rows)
        else:
            # Widest batches first, so the last ones to finish are short.
            with ThreadPoolExecutor(min(threads, len(batches)), thread_name_prefix="embed") as pool:
                list(pool.map(run, reversed(batches)))
        return out


def export_key(model_dir: pathlib.Path) -> str:
    """Weights digest + exporter versions (read without importing torch)."""
    from importlib.metadata import version

    digest = hashlib.sha256()
    with (model_dir / "model.safetensors").open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    digest.update(f"torch={version('torch')};opset={ONNX_OPSET};seq={MAX_SEQ_LENGTH}".encode())
    return digest.hexdigest()[:20]


def export_onnx(model_dir: pathlib.Path, out_path: pathlib.Path) -> pathlib.Path:
    """Export the shipped BERT weights to ONNX (fp32) and check them against torch; return path.

    Raises ``RuntimeError`` when ONNX and torch disagree on the probe texts.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    bert = AutoModel.from_pretrained(str(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    class _Hidden(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    sample = tokenizer(
        list(PROBES), padding=True, truncation=True, max_length=MAX_SEQ_LENGTH, return_tensors="pt"
    )
    names = ["input_ids", "attention_mask", "token_type_ids"]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx.tmp", dir=out_path.parent)
    os.close(fd)
    wrapper = _Hidden(bert).eval()  # a new Module trains by default; export restores that mode
    with torch.no_grad():
        hidden = wrapper(*(sample[name] for name in names)).numpy()
    try:
        with torch.no_grad():
            torch.onnx.export(
                wrapper,
                tuple(sample[name] for name in names),
                tmp,
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={name: {0: "batch", 1: "tokens"} for name in [*names, "last_hidden_state"]},
                opset_version=ONNX_OPSET,
                dynamo=False,
            )
        expected = normalize(mean_pool(hidden, sample["attention_mask"].numpy()))
        got = OnnxEncoder(pathlib.Path(tmp), model_dir / "tokenizer.json").encode(list(PROBES), threads=1)
        cosine = float((expected * got).sum(axis=1).min())
        if cosine < EXPORT_MIN_COSINE:
            raise RuntimeError(f"ONNX export disagrees with torch (min cosine {cosine:.7f})")
        os.replace(tmp, out_path)
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)
    logger.info("exported embedding model to %s (probe cosine vs torch %.7f)", out_path, cosine)
    return out_path


def load_onnx(model_dir: pathlib.Path, cache_dir: pathlib.Path) -> OnnxEncoder:
    """The encoder for the export of ``model_dir`` in ``cache_dir`` (exported first if missing),
    with its session created."""
    import onnxruntime  # noqa: F401 - fail early, before an export, when it is missing

    path = cache_dir / f"all-MiniLM-L6-v2-{export_key(model_dir)}.onnx"
    if not path.exists():
        logger.info("exporting the embedding model to ONNX (once per machine): %s", path)
        export_onnx(model_dir, path)
    encoder = OnnxEncoder(path, model_dir / "tokenizer.json")
    encoder.session()
    return encoder
