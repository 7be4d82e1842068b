"""Embeddings: distinct texts/s, cache hits on sample_traces, ingest with the worker busy vs idle."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import duckdb

from benchmarks.generator import OBJECTS, QUALIFIERS, VERBS
from collector.migrations_runner import apply_migrations

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]


def distinct_texts(count: int, seed: int) -> list[str]:
    """``count`` distinct task statements of the generator's shape (never seen by this process)."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(QUALIFIERS)} for ticket {seed}-{i}-{rng.getrandbits(32):08x}"
        for i in range(count)
    ]


def texts_per_second(count: int, seed: int = 11) -> dict:
    """Embed ``count`` new distinct texts through ``embed_texts`` (cache table in memory).

    Besides texts per wall-clock second it reports texts per CPU-second of this process (every
    thread of the runtime included), which depends much less on what else the box is running.
    """
    import os

    from analytics.embeddings import embed_texts, load_model

    load_start = time.perf_counter()
    model = load_model()
    load_s = time.perf_counter() - load_start
    conn = duckdb.connect(":memory:")
    apply_migrations(conn)
    texts = distinct_texts(count, seed)
    start, cpu_start = time.perf_counter(), time.process_time()
    vectors = embed_texts(texts, conn)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    stored = conn.execute("SELECT count(*) FROM embeddings").fetchone()[0]
    start = time.perf_counter()
    embed_texts(texts, conn)
    again = time.perf_counter() - start
    conn.close()
    return {
        "texts": count,
        "model_load_s": round(load_s, 2),
        "elapsed_s": round(elapsed, 3),
        "texts_per_s": round(count / elapsed, 1),
        "texts_per_cpu_s": round(count / cpu, 1),
        "runtime": getattr(model, "runtime", type(model).__name__),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "vectors_shape": list(vectors.shape),
        "rows_in_cache": stored,
        "cached_repeat_s": round(again, 4),
    }


def sample_trace_cache(workdir: Path, paths: list[Path] | None = None) -> dict:
    """Cache behaviour of goal divergence over ``sample_traces/*.json``.

    ``referenced`` counts the task texts the detector's pairs use (with repeats); each distinct
    text should be embedded once, so the first pass hit rate is 1 - distinct/referenced and the
    second pass embeds nothing.
    """
    import analytics  # noqa: F401
    from analytics.goals import goal_pairs
    from analytics.registry import run_metric
    from analytics.types import Filters, Window
    from collector.files import ingest_files

    paths = paths or sorted(
        p for p in (REPO / "sample_traces").glob("*.json") if not p.name.endswith(".truth.json")
    )
    db = workdir / "sample-embeddings.duckdb"
    for stale in (db, Path(f"{db}.wal")):
        stale.unlink(missing_ok=True)
    ingest_files(db, paths)
    conn = duckdb.connect(str(db))
    pairs = goal_pairs(conn, Window(), Filters())
    referenced = [*pairs["root_goal"], *pairs["subtask"]]
    distinct = len(set(referenced))
    start = time.perf_counter()
    run_metric(conn, "goal_divergence", Window(), Filters())
    first_s = time.perf_counter() - start
    embedded_first = conn.execute("SELECT count(*) FROM embeddings").fetchone()[0]
    start = time.perf_counter()
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
