"""While the embedding worker runs, serve's materializer reads stored goal scores only (never the
model), and the worker's stored scores log the runs whose goal findings they change."""

from __future__ import annotations

import random
from datetime import timedelta

import pandas as pd
import pytest

from analytics import Filters, Window, goals, materialize
from analytics.goal_refresh import RESCORED, read_stored_scores_only
from analytics.registry import compute_metric
from analytics.types import direct_write
from analytics.worker import embed_pending
from tests import tiers
from tests.analytics.test_goals import _delegations
from tests.analytics.test_materialize import _assert_tables_equal_full, _commit, _store
from tests.analytics.test_summary import _random_batch
from tests.fixtures_analytics import BASE_TIME, make_span

GOAL_RESULTS = {"goal_divergence", "goal_divergence_runs", "run_summary_goals", "run_summary"}


def _count(conn, sql: str) -> int:
    return conn.execute(sql).fetchall()[0][0]


def _rescored(conn) -> set[str]:
    rows = conn.execute(
        "SELECT p.key FROM change_partitions p JOIN change_log l USING (seq) "
        "WHERE l.kind = 'rescore' AND p.partition = $partition",
        {"partition": RESCORED},
    ).fetchall()
    return {key for (key,) in rows}


def test_a_pass_reading_stored_scores_only_never_embeds_and_follows_the_workers_scores(tmp_path):
    conn = _store(tmp_path)
    _commit(conn, _delegations("run-1", "T1") + _delegations("run-2", "T2"))
    cursor = read_stored_scores_only(conn.cursor())
    try:
        report = materialize.bring_up_to_date(cursor, direct_write(conn))
        assert not report.failed and "goal_divergence" in report.recomputed
        # nothing was embedded or scored for the pass, not even in its connection's own table
        assert _count(cursor, "SELECT count(*) FROM goal_scores_local") == 0
        assert _count(conn, "SELECT count(*) FROM embeddings") == 0
        assert _count(conn, "SELECT count(*) FROM goal_scores") == 0
        # so the findings lack the unscored subtasks a full computation finds
        assert materialize.read_findings(conn, "goal_divergence").empty
        goal_rows = materialize.read_findings(conn, "run_summary_goals")
        assert goal_rows.empty or goal_rows["worst_divergence"].isna().all()
        assert len(compute_metric(conn, "goal_divergence")) == 2  # the drifted subtask of each run

        # the worker stores the scores, logging the runs they change in the same transaction
        assert embed_pending(conn.cursor(), write=direct_write(conn)) == (2, 3)
        assert _rescored(conn) == {"run-1", "run-2"}

        report = materialize.bring_up_to_date(cursor, direct_write(conn))
        assert not report.failed
        for name in GOAL_RESULTS:
            assert report.recomputed[name] == 2, name
        assert report.recomputed["goal_divergence_distribution"] == -1  # kept whole
        # only the goal results read the rescored runs: no other detector recomputes them
        others = [
            name
            for name, item in materialize.maintained().items()
            if item.partition == "run_id" and name not in GOAL_RESULTS
        ]
        assert others and all(report.recomputed.get(name, 0) == 0 for name in others)
        _assert_tables_equal_full(conn, {})
        assert len(materialize.read_findings(conn, "goal_divergence")) == 2
        assert _count(cursor, "SELECT count(*) FROM goal_scores_local") == 0
    finally:
        cursor.close()


def test_a_pass_on_an_unmarked_connection_still_scores_what_is_pending(tmp_path):
    """Without the worker (serve --embeddings false, reports, tests) a pass scores pending pairs
    on demand as before: the findings hold every subtask from the first pass."""
    conn = _store(tmp_path)
    _commit(conn, _delegations("run-1", "T1"))
    cursor = conn.cursor()
    try:
        assert not materialize.bring_up_to_date(cursor, direct_write(conn)).failed
        assert _count(cursor, "SELECT count(*) FROM goal_scores_local") == 2
    finally:
        cursor.close()
    assert len(materialize.read_findings(conn, "goal_divergence")) == 1
    assert _count(conn, "SELECT count(*) FROM goal_scores") == 0  # a pass's reads never write


def test_the_scores_write_names_a_run_committed_after_the_worker_found_its_pairs(tmp_path):
    """The runs are looked up in the writer's transaction that stores the scores: a run with the
    same statements committed while the worker was embedding is named too."""
    conn = _store(tmp_path)
    _commit(conn, _delegations("run-1", "T1"))
    reader = conn.cursor()
    pending = goals._goal_query(reader, "goal_pending", Window(), Filters(), pending_limit=None)
    assert len(pending) == 2
    _commit(conn, _delegations("run-2", "T2"))  # the same two statements, after the lookup
    goals.score_raw_pairs(reader, pending, write=direct_write(conn))
    assert _rescored(conn) == {"run-1", "run-2"}


_ROOTS = ["Plan a three-day team offsite in Lisbon for 25 people under a 20,000 EUR budget",
          "Compare the 2024 revenue of Contoso and Fabrikam"]  # fmt: skip
_SUBTASKS = ["Find venues in Lisbon that can host 25 people for three days",
             "Write a blog post about the history of Portuguese tiles",
             "Book flights to Lisbon for 25 people",
             "Collect the 2024 annual reports of Contoso and Fabrikam",
             "Summarise the history of foreign-exchange markets"]  # fmt: skip


def _goal_batch(rng: random.Random, batch: int, runs: list[str]) -> list[dict]:
    """Delegations drawing statements from a small pool shared by runs (a task template), their
    root on the span or only on their origin task's objective; sometimes a refused one."""
    rows = []
    for _ in range(rng.randint(1, 4)):
        run = rng.choice(runs)
        task = rng.choice([f"t-{run}", "shared"])
        fields = dict(run=run, origin_task_id=task, ingested_at=BASE_TIME + timedelta(seconds=batch))
        t = batch * 5 + rng.random() * 20
        root = rng.choice(_ROOTS)
        if rng.random() < 0.5:
            rows.append(make_span(t, agent_id="planner", op="objective", goal_root=root, hop=0, **fields))
            root = None  # the delegation's root comes from its origin task
        rows.append(make_span(t + 0.1, agent_id=rng.choice(["planner", "lead"]), op="delegate",
                              delegate_to=rng.choice(["venues", "writer"]), hop=rng.randint(1, 2),
                              goal_root=root, goal_text=rng.choice(_SUBTASKS),
                              outcome=rng.choice(["ok", "ok", "ok", "rejected"]), **fields))  # fmt: skip
    return rows


def _pending(conn) -> pd.DataFrame:
    return goals._goal_query(conn.cursor(), "goal_pending", Window(), Filters(), pending_limit=None)


@pytest.mark.parametrize(
    "seed", [pytest.param(0, marks=pytest.mark.slow), pytest.param(1, marks=pytest.mark.deep)]
)
def test_worker_scores_between_commits_keep_every_table_equal_to_a_full_recomputation(tmp_path, seed):
    """Commits, passes on the materializer's stored-only cursor and the worker's score writes in
    any order (its write sometimes of pairs it found before the last commit, after a pass that
    took that commit in): once every stored pair is scored and a pass ran, every table equals a
    full recomputation."""
    rng = random.Random(seed)
    conn = _store(tmp_path)
    runs = [f"run-{i}" for i in range(rng.randint(2, 5))]
    cursor = read_stored_scores_only(conn.cursor())
    seen: dict[str, int] = {}
    try:
        for batch in range(tiers.batches(full=5, quick=3)):
            found = _pending(conn) if rng.random() < 0.5 else None  # the worker looks ...
            _commit(conn, _random_batch(rng, batch, runs) + _goal_batch(rng, batch, runs))
            assert not materialize.bring_up_to_date(cursor, direct_write(conn)).failed
            if found is not None and len(found):  # ... and stores what it found after the pass
                goals.score_raw_pairs(conn.cursor(), found, write=direct_write(conn))
                assert not materialize.bring_up_to_date(cursor, direct_write(conn)).failed
                if _pending(conn).empty:  # its write named every run the new commit gave its pairs
                    _assert_tables_equal_full(conn, seen)
            while embed_pending(conn.cursor(), write=direct_write(conn))[0]:
                pass
            assert not materialize.bring_up_to_date(cursor, direct_write(conn)).failed
            _assert_tables_equal_full(conn, seen)
        assert _count(cursor, "SELECT count(*) FROM goal_scores_local") == 0
    finally:
        cursor.close()
    assert seen.get("goal_divergence") and seen.get("goal_divergence_distribution")
