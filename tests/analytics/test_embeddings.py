"""The ONNX encoder's batching and threads: same vectors as sentence-transformers, every text once."""

from __future__ import annotations

import csv
import pathlib

import numpy as np
import pytest

from analytics.embeddings import embed_counting, load_model
from analytics.goals import cosine_divergence
from analytics.onnx_runtime import MAX_SEQ_LENGTH, TOKENS_PER_BATCH, plan_batches
from analytics.types import direct_write
from tests.fixtures_analytics import new_db

PAIRS = pathlib.Path(__file__).resolve().parents[2] / "sample_traces" / "calibration" / "goal_pairs.csv"


@pytest.fixture(scope="module")
def onnx_model():
    model = load_model()
    if model.runtime != "onnx":
        pytest.skip(f"embedding runtime is {model.runtime}")
    return model


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    from analytics.embeddings import _model_dir

    model = SentenceTransformer(str(_model_dir()), device="cpu")
    return lambda texts: model.encode(texts, normalize_embeddings=True, show_progress_bar=False)


def _pairs(every: int = 3) -> tuple[list[str], list[str]]:
    with PAIRS.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))[::every]
    return [row["root_goal"] for row in rows], [row["subtask"] for row in rows]


def test_plan_batches_covers_every_row_once_under_the_token_budget():
    lengths = np.array([5, 300, 12, 12, 7, 256, 40, 3, 90, 12, 64, 18] * 9)
    for batch_size, threads in [(32, 1), (32, 2), (4, 1), (2, 2), (100, 3)]:
        batches = plan_batches(lengths, batch_size, threads)
        rows = np.concatenate(batches)
        assert sorted(rows.tolist()) == list(range(len(lengths)))
        assert [int(lengths[b].max()) for b in batches] == sorted(int(lengths[b].max()) for b in batches)
        for batch in batches:
            assert 1 <= len(batch) <= batch_size
            assert len(batch) == 1 or len(batch) * lengths[batch].max() <= TOKENS_PER_BATCH
        assert len(batches) >= threads


def test_plan_batches_gives_each_thread_work_for_a_few_texts():
    assert [len(b) for b in plan_batches(np.array([9, 9, 9, 9]), 32, threads=2)] == [2, 2]
    assert [len(b) for b in plan_batches(np.array([9, 9, 9, 9]), 32, threads=1)] == [4]
    assert plan_batches(np.array([], dtype=np.int64), 32, threads=2) == []


@pytest.mark.slow
def test_threads_and_batching_do_not_change_the_vectors(onnx_model, reference):
    roots, subtasks = _pairs()
    texts = [*dict.fromkeys([*roots, *subtasks])]
    texts += ["", "word " * 400, "Écrire un billet sur les azulejos", "Find venues"]
    expected = reference(texts)
    single = onnx_model.encode(texts, threads=1)
    for got in (
        single,
        onnx_model.encode(texts, threads=2),
        onnx_model.encode(texts, batch_size=3, threads=2),
    ):
        assert got.shape == (len(texts), 384) and got.dtype == np.float32
        assert np.min(np.sum(got * expected, axis=1)) > 0.999999
        assert np.max(np.abs(got - single)) < 1e-6


def test_tokens_truncated_as_sentence_transformers_does(onnx_model):
    from transformers import AutoTokenizer

    from analytics.embeddings import _model_dir

    texts = ["word " * 400, "Find venues", "", "Écrire un billet sur les azulejos"]
    expected = AutoTokenizer.from_pretrained(str(_model_dir()))(
        texts, truncation=True, max_length=MAX_SEQ_LENGTH
    )["input_ids"]
    assert onnx_model.tokenize(texts, threads=1) == expected
    assert onnx_model.tokenize(texts, threads=2) == expected
    assert len(expected[0]) == MAX_SEQ_LENGTH


@pytest.mark.slow
def test_goal_pair_divergences_equal_sentence_transformers_with_two_threads(onnx_model, reference):
    roots, subtasks = _pairs()
    conn = new_db()
    texts = [*dict.fromkeys([*roots, *subtasks])]
    vectors, embedded = embed_counting(texts * 2, conn, threads=2, write=direct_write(conn))  # once each
    assert embedded == len(texts)
    assert conn.execute("SELECT count(*) FROM embeddings").fetchone()[0] == len(texts)
    index = {text: row for row, text in enumerate(texts)}
    got = cosine_divergence(vectors[[index[t] for t in roots]], vectors[[index[t] for t in subtasks]])
    want = cosine_divergence(reference(roots), reference(subtasks))
    assert np.max(np.abs(got - want)) < 5e-6
    _, again = embed_counting(texts, conn, threads=2)
    assert again == 0


def test_embedding_without_a_writer_never_writes_the_database(onnx_model):
    conn = new_db()
    vectors, embedded = embed_counting(["a read-side text", "another one"], conn, threads=1)
    assert embedded == 2 and vectors.shape[0] == 2
    assert conn.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 0
