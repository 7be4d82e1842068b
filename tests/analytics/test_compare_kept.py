"""The run comparison's maintained tables (issue 35, analytics.compare_kept): kept as spans commit,
each equal to its SQL over the spans, and a comparison reading the baseline from them answers
exactly what one computing it from the spans does."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from analytics import compare, compare_kept, materialize
from analytics.types import direct_write
from tests.analytics.test_materialize import _canonical, _commit, _pass, _store
from tests.compare_crews import crew_rows, crew_steps


def _table(conn, name: str) -> pd.DataFrame:
    return conn.sql(f"SELECT * EXCLUDE (_pos) FROM findings__{name}").df()


def _assert_tables_equal_sql(conn) -> int:
    rows = 0
    for name in compare_kept.TABLES:
        assert materialize.ready(conn, name) is not None, name
        kept, full = _table(conn, name), compare_kept.per_run_rows(conn, name)
        assert sorted(kept.columns) == sorted(full.columns), name
        pd.testing.assert_frame_equal(_canonical(kept[list(full.columns)]), _canonical(full), obj=name)
        rows += len(full)
    return rows


def _random_run(rng: random.Random, run: str, t0: float) -> list[dict]:
    steps = crew_steps(
        searches=rng.randint(0, 4),
        failing=rng.randint(0, 2),
        delegate_to=rng.choice(["researcher", "researcher", "writer"]),
        final=rng.random() < 0.8,
        query=f"{run} words",
        vary=rng.random() < 0.7,
    )
    return crew_rows(run, steps, service=rng.choice(["crew", "crew", "other"]), t0=t0)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_tables_equal_their_sql_after_every_commit_of_runs_arriving_in_pieces(tmp_path, seed):
    rng = random.Random(seed)
    conn = _store(tmp_path)
    spans = [s for i in range(8) for s in _random_run(rng, f"r{i}", 100.0 * i)]
    rng.shuffle(spans)  # a run's spans over several commits, children before parents
    cuts = sorted(rng.sample(range(1, len(spans)), 3))
    for a, b in zip([0, *cuts], [*cuts, len(spans)], strict=True):
        _commit(conn, spans[a:b])
        report = _pass(conn, list(compare_kept.TABLES))
        assert not report.failed
        assert _assert_tables_equal_sql(conn) > 0


def test_a_comparison_reads_the_baseline_from_the_tables_and_answers_as_from_the_spans(tmp_path):
    conn = _store(tmp_path)
    rows = []
    for i in range(5):
        rows += crew_rows(f"h{i}", crew_steps(searches=1 + i % 3, query=f"h{i}"), t0=100 * i)
    rows += crew_rows("bad", crew_steps(searches=4, failing=2, delegate_to="writer"), t0=1000)
    _commit(conn, rows)
    healthy = [f"h{i}" for i in range(5)]
    assert not compare_kept.tables_ready(conn)
    from_spans = compare_kept.baseline_table(conn, healthy)
    answer_from_spans = compare.compare_run(conn, "bad")

    cursor = conn.cursor()
    materialize.bring_up_to_date(cursor, direct_write(conn), list(compare_kept.TABLES))
    cursor.close()
    assert compare_kept.tables_ready(conn)
    from_tables = compare_kept.baseline_table(conn, healthy)
    assert from_tables.schema == from_spans.schema
    pd.testing.assert_frame_equal(
        _canonical(from_tables.to_pandas()), _canonical(from_spans.to_pandas()), obj="baseline"
    )
    # 5 healthy runs, 3 distinct step sequences (1, 2 or 3 searches): aligned once each
    runs = from_tables.to_pandas().query("part == 'run'")
    assert sorted(runs["run_count"]) == [1, 2, 2]
    answer_from_tables = compare.compare_run(conn, "bad")
    assert answer_from_tables == answer_from_spans
    assert answer_from_tables["departure"]["agent"] == "manager"  # the hand-off to the writer
    assert answer_from_tables["baseline"]["runs"] == 5
