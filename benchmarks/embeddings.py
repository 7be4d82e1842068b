"""Embeddings: distinct texts/s, cache hits on sample_traces, ingest with the worker busy vs idle."""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path

import duckdb

from benchmarks.generator import OBJECTS, QUALIFIERS, VERBS
from driftscope.database import migrate

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
GOAL_PAIRS = REPO / "sample_traces" / "calibration" / "goal_pairs.csv"


def distinct_texts(count: int, seed: int) -> list[str]:
    """``count`` distinct task statements of the generator's shape (never seen by this process)."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(QUALIFIERS)} for ticket {seed}-{i}-{rng.getrandbits(32):08x}"
        for i in range(count)
    ]


def goal_texts() -> list[str]:
    """Distinct root goals and subtasks of the shipped calibration pairs (hand-written goal
    texts, ~13 tokens each against ~23 for ``distinct_texts``)."""
    from analytics.calibration import read_pairs

    roots, subtasks, _ = read_pairs(GOAL_PAIRS)
    return list(dict.fromkeys([*roots, *subtasks]))


def _embed_rate(texts: list[str], threads: int | None) -> dict:
    """Time ``embed_texts`` over ``texts`` (new to this process) into a fresh in-memory cache
    (stored as the worker stores them, through a write function)."""
    from analytics.embeddings import embed_texts, text_hash
    from analytics.types import direct_write

    assert len({text_hash(text) for text in texts}) == len(texts), "texts must be distinct"
    conn = duckdb.connect(":memory:")
    migrate(conn)
    start, cpu_start = time.perf_counter(), time.process_time()
    vectors = embed_texts(texts, conn, threads=threads, write=direct_write(conn))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    stored = conn.execute("SELECT count(*) FROM embeddings").fetchone()[0]
    start = time.perf_counter()
    embed_texts(texts, conn, threads=threads)
    again = time.perf_counter() - start
    conn.close()
    return {
        "texts": len(texts),
        "elapsed_s": round(elapsed, 3),
        "texts_per_s": round(len(texts) / elapsed, 1),
        "texts_per_cpu_s": round(len(texts) / cpu, 1),
        "vectors_shape": list(vectors.shape),
        "rows_in_cache": stored,
        "cached_repeat_s": round(again, 4),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def texts_per_second(count: int, seed: int = 11) -> dict:
    """Embed ``count`` new distinct texts through ``embed_texts`` (cache table in memory).

    The headline rate is the call as detectors make it (``threads`` None: every core, as
    ``goal_divergence`` embeds what the worker has not). ``single_thread`` embeds another
    ``count`` new texts with ``threads=1``, as the background worker does; ``goal_pairs`` times
    the (at most ``count``) distinct texts of the calibration pairs, shorter and more like real
    goal texts than the generated ones, with every core. Besides texts per
    wall-clock second each reports texts per CPU-second of this process (every thread of the
    runtime included), which depends much less on what else the box is running, and the mean
    token count of the texts ([CLS] and [SEP] included), which the cost per text follows.
    """
    from analytics.embeddings import load_model

    load_start = time.perf_counter()
    model = load_model()
    load_s = time.perf_counter() - load_start
    texts = distinct_texts(count, seed)
    result = _embed_rate(texts, threads=None)
    single_texts = distinct_texts(count, seed + 1)
    single = _embed_rate(single_texts, threads=1)
    goals = goal_texts()[:count]
    goal_pairs = _embed_rate(goals, threads=None)
    tokenize = getattr(model, "tokenize", None)
    if tokenize is not None:
        for measured, measured_texts in [(result, texts), (single, single_texts), (goal_pairs, goals)]:
            measured["mean_tokens"] = round(sum(map(len, tokenize(measured_texts))) / len(measured_texts), 1)
    return {
        **result,
        "threads": os.cpu_count(),
        "model_load_s": round(load_s, 2),
        "runtime": getattr(model, "runtime", type(model).__name__),
        "single_thread": single,
        "goal_pairs": goal_pairs,
    }


def sample_trace_cache(workdir: Path, paths: list[Path] | None = None) -> dict:
    """Cache behaviour of goal divergence over ``sample_traces/*.json``.

    ``referenced`` counts the task texts the detector's pairs use (with repeats); each distinct
    text should be embedded once, so the first pass hit rate is 1 - distinct/referenced and the
    second pass embeds nothing. A pass is what ``serve`` does: the embedding worker's pass
    (which stores through the writer; detector calls never write), then the detector.
    """
    import analytics  # noqa: F401
    from analytics.goals import goal_pairs
    from analytics.registry import run_metric
    from analytics.types import Filters, Window
    from analytics.worker import embed_pending
    from collector.files import ingest_files
    from driftscope.database import open_database

    paths = paths or sorted(
        p for p in (REPO / "sample_traces").glob("*.json") if not p.name.endswith(".truth.json")
    )
    db = workdir / "sample-embeddings.duckdb"
    for stale in (db, Path(f"{db}.wal")):
        stale.unlink(missing_ok=True)
    open_database(db).close()
    ingest_files(db, paths)
    conn = duckdb.connect(str(db))
    start = time.perf_counter()
    embed_pending(conn, limit=1_000_000)
    run_metric(conn, "goal_divergence", Window(), Filters())
    first_s = time.perf_counter() - start
    embedded_first = conn.execute("SELECT count(*) FROM embeddings").fetchone()[0]
    pairs = goal_pairs(conn, Window(), Filters())
    referenced = [*pairs["root_goal"], *pairs["subtask"]]
    distinct = len(set(referenced))
    start = time.perf_counter()
    embed_pending(conn, limit=1_000_000)
    run_metric(conn, "goal_divergence", Window(), Filters())
    second_s = time.perf_counter() - start
    embedded_second = conn.execute("SELECT count(*) FROM embeddings").fetchone()[0]
    conn.close()
    db.unlink(missing_ok=True)
    return {
        "files": len(paths),
        "texts_referenced": len(referenced),
        "distinct_texts": distinct,
        "embedded_first_pass": embedded_first,
        "embedded_second_pass": embedded_second - embedded_first,
        "hit_rate_first_pass": round(1 - embedded_first / len(referenced), 3) if referenced else None,
        "hit_rate_second_pass": 1.0 if embedded_second == embedded_first else 0.0,
        "each_distinct_text_once": embedded_first <= distinct,
        "goal_divergence_first_s": round(first_s, 3),
        "goal_divergence_second_s": round(second_s, 3),
    }
