"""Goal divergence with the real all-MiniLM-L6-v2 model, the embedding cache and worker."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import duckdb
import numpy as np
import pandas as pd
import pytest

from analytics import Filters, Window, goals, run_metric
from analytics.embeddings import embed_texts, text_hash
from analytics.goals import MAX_CHART_CHAINS, cosine_divergence, goal_pairs, goal_run_stats
from analytics.registry import compute_metric
from analytics.thresholds import DEFAULTS, store_threshold
from analytics.types import direct_write
from analytics.worker import EmbeddingWorker, embed_pending
from dashboard.figures import goal_divergence_figure
from driftscope.database import migrate
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, new_db

GOAL = "Plan a three-day team offsite in Lisbon for 25 people under a 20,000 EUR budget"


def _delegations(run: str = "run-1", task: str = "T1") -> list[dict]:
    deleg = dict(op="delegate", origin_task_id=task, run=run)
    return [
        make_span(0, agent_id="planner", op="objective", origin_task_id=task, goal_root=GOAL, hop=0, run=run),
        make_span(1, agent_id="planner", delegate_to="venues", hop=1,
                  goal_text="Find venues in Lisbon that can host 25 people for three days", **deleg),
        make_span(2, agent_id="venues", delegate_to="writer", hop=2,
                  goal_text="Write a blog post about the history of Portuguese tiles", **deleg),
    ]  # fmt: skip


def test_cosine_divergence_rowwise():
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    b = np.array([[1.0, 0.0], [1.0, 0.0]])
    assert list(cosine_divergence(a, b)) == [0.0, 1.0]


def test_goal_divergence_flags_drifted_delegation_with_uncalibrated_default():
    conn = new_db()
    insert_spans(conn, _delegations())
    found = run_metric(conn, "goal_divergence").set_index("delegate_to")
    assert list(found.index) == ["writer"]  # only the drifted subtask is a row
    default = DEFAULTS["goal_divergence"][0]
    assert found.loc["writer", "divergence"] > default and bool(found.loc["writer", "drifted"])
    assert (found["threshold"] == default).all() and (found["threshold_version"] == 0).all()
    assert not found["calibrated"].any()
    assert (found["root_goal"] == GOAL).all() and (found["source"] == "driftscope").all()
    every = goal_pairs(conn, Window(), Filters()).set_index("delegate_to")
    assert set(every.index) == {"venues", "writer"}
    assert every.loc["venues", "divergence"] < default < every.loc["writer", "divergence"]
    assert found.loc["writer", "divergence"] == round(every.loc["writer", "divergence"], 4)
    assert found.loc["writer", "span_ids"].tolist() == every.loc["writer", "span_ids"].tolist()


def test_calibrated_threshold_decides_which_subtasks_are_rows():
    conn = new_db()
    insert_spans(conn, _delegations())
    every = goal_pairs(conn, Window(), Filters()).set_index("delegate_to")["divergence"].round(4)
    store_threshold(conn, "goal_divergence", float(every["venues"]) - 0.01, "quantile", {})
    found = run_metric(conn, "goal_divergence")
    assert set(found["delegate_to"]) == {"venues", "writer"} and found["calibrated"].all()
    store_threshold(conn, "goal_divergence", float(every["writer"]), "quantile", {})
    assert run_metric(conn, "goal_divergence").empty  # not above a threshold equal to it


def test_distribution_and_run_stats_count_every_subtask():
    conn = new_db()
    spans = _delegations()
    other = [dict(span, SpanId=f"{i:016x}", TraceId="f" * 32, run_id="run-2", origin_task_id="T2")
             for i, span in enumerate(spans, 50)]  # fmt: skip
    insert_spans(conn, spans + other)
    every = goal_pairs(conn, Window(), Filters())
    spread = run_metric(conn, "goal_divergence_distribution")
    assert spread["subtasks"].sum() == len(every) == 4 and (spread["chains"] == 2).all()
    expected = every.assign(divergence=every["divergence"].round(4)).groupby(["hop", "divergence"]).size()
    assert spread.groupby(["hop", "divergence"])["subtasks"].sum().to_dict() == expected.to_dict()
    assert spread.loc[spread["drifted"], "subtasks"].sum() == len(run_metric(conn, "goal_divergence")) == 2
    assert set(spread["chain"]) == {"T1", "T2"} and set(spread["subtask"]) == set(every["subtask"])
    stats = goal_run_stats(conn, Window(), Filters(), 0.45)
    worst = every.groupby("run_id")["divergence"].max().round(4)
    assert stats["drifted_subtasks"].to_dict() == {run: 1 for run in worst.index}
    assert stats["worst_divergence"].to_dict() == worst.to_dict()
    summary = run_metric(conn, "run_summary").set_index("run_id")
    assert summary["drifted_subtasks"].to_dict() == stats["drifted_subtasks"].to_dict()
    # Over the uncalibrated default a drifted subtask asks for review; once calibrated it fails the run.
    assert (summary["verdict"] == "to review").all()
    store_threshold(conn, "goal_divergence", 0.45, "quantile", {})
    assert (run_metric(conn, "run_summary")["verdict"] == "failing").all()


def test_distribution_of_many_chains_is_per_hop():
    conn = new_db()
    spans = []
    for chain in range(MAX_CHART_CHAINS + 1):
        for span in _delegations():
            spans.append(dict(span, SpanId=f"{chain:08x}{span['SpanId'][-8:]}", TraceId=f"{chain:032x}",
                              run_id=f"run-{chain}", origin_task_id=f"T{chain}"))  # fmt: skip
    insert_spans(conn, spans)
    spread = run_metric(conn, "goal_divergence_distribution")
    assert spread["chain"].isna().all() and spread["subtask"].isna().all()
    assert (spread["chains"] == MAX_CHART_CHAINS + 1).all() and len(spread) == 2  # hop 1 and hop 2
    assert (spread["subtasks"] == MAX_CHART_CHAINS + 1).all()
    fig = goal_divergence_figure(spread, chain="chain")
    assert [t.name for t in fig.data] == ["median", "p90", "max"] and list(fig.data[0].x) == [1, 2]
    assert f"{MAX_CHART_CHAINS + 1} chains" in fig.layout.title.text


def test_embeddings_cached_by_sha256_and_reused():
    conn = new_db()
    vectors = embed_texts(["alpha task", "beta task", "alpha task"], conn, write=direct_write(conn))
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[0], vectors[2])
    rows = conn.execute("SELECT text_hash, dim FROM embeddings ORDER BY text_hash").fetchall()
    assert sorted(key for key, _ in rows) == sorted([text_hash("alpha task"), text_hash("beta task")])
    assert conn.execute("SELECT sha256('alpha task')").fetchone()[0] == text_hash("alpha task")


def test_inferred_goals_for_openinference_style_agent_spans():
    conn = new_db()
    trace = dict(run="oi-run")
    root_input = json.dumps({"messages": [{"role": "system", "content": "You are a crew supervisor."},
                                          {"role": "user", "content": GOAL}]})  # fmt: skip
    root = make_span(0, span_family="chain", input_text=root_input, SpanName="LangGraph", **trace)
    insert_spans(
        conn,
        [
            root,
            make_span(1, span_family="agent", agent_id="venue_agent", ParentSpanId=root["SpanId"],
                      input_text=json.dumps({"task": "Find venues in Lisbon for 25 people"}), **trace),
            make_span(2, span_family="agent", agent_id="tiles_agent", ParentSpanId=root["SpanId"],
                      input_text="You are a writer.\nTask: Write a poem about the sea", **trace),
            make_span(3, span_family="llm", agent_id="venue_agent", input_text="ignored", **trace),
        ],
    )  # fmt: skip
    found = run_metric(conn, "goal_divergence").set_index("agent")
    assert list(found.index) == ["tiles_agent"] and bool(found.loc["tiles_agent", "drifted"])
    assert (found["source"] == "inferred").all() and (found["root_goal"] == GOAL).all()
    assert found.loc["tiles_agent", "subtask"] == "Write a poem about the sea"
    every = goal_pairs(conn, Window(), Filters()).set_index("agent")
    assert set(every.index) == {"venue_agent", "tiles_agent"} and (every["source"] == "inferred").all()
    assert every.loc["venue_agent", "divergence"] < 0.45


def _wait_for_embeddings(conn, expected: int) -> int:
    deadline = time.monotonic() + 120
    count = 0
    while time.monotonic() < deadline:
        (count,) = conn.cursor().execute("SELECT count(*) FROM embeddings").fetchone()
        if count >= expected:
            break
        time.sleep(0.1)
    return count


def _wait_caught_up(worker, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not worker.caught_up:
        time.sleep(0.05)
    return worker.caught_up


def test_embedding_worker_embeds_pending_texts_in_background(tmp_path):
    conn = duckdb.connect(str(tmp_path / "serve.duckdb"))
    migrate(conn)
    insert_spans(conn, _delegations())
    worker = EmbeddingWorker(lambda: conn.cursor(), interval_s=60.0, min_gap_s=0.05).start()
    try:
        worker.notify()
        # the root goal and two distinct subtask statements
        assert _wait_for_embeddings(conn, 3) == 3, worker.last_error
        # caught up (what serve's health reports): every pair committed before is scored
        assert _wait_caught_up(worker), worker.last_error
        assert conn.execute("SELECT count(*) FROM goal_scores").fetchone()[0] == 2
        later = make_span(5, agent_id="planner", op="delegate", origin_task_id="T1", hop=1,
                          delegate_to="budget", goal_text="Check the offsite costs against the budget",
                          ingested_at=BASE_TIME + timedelta(hours=1))  # fmt: skip
        insert_spans(conn, [later])
        worker.notify()
        assert not worker.caught_up  # a commit it has not looked at yet
        assert _wait_for_embeddings(conn, 4) == 4, worker.last_error
        assert _wait_caught_up(worker), worker.last_error
        assert conn.execute("SELECT count(*) FROM goal_scores").fetchone()[0] == 3
    finally:
        worker.stop()
    assert worker.embedded == 4 and worker.last_error is None
    (stored,) = conn.execute("SELECT count(*) FROM embeddings WHERE dim = 384").fetchone()
    assert stored == 4


def test_goal_divergence_same_before_and_after_the_worker_stored_scores():
    conn = new_db()
    insert_spans(conn, _delegations())
    cold = run_metric(conn, "goal_divergence")["divergence"].to_numpy()
    # a detector call is a read: it scores what it needs but never writes the database
    assert conn.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM goal_scores").fetchone()[0] == 0
    assert embed_pending(conn.cursor()) == (2, 3)  # the worker (own cursor) stores 2 pairs, 3 texts
    assert conn.execute("SELECT count(*) FROM goal_scores").fetchone()[0] == 2
    warm = run_metric(conn, "goal_divergence")["divergence"].to_numpy()
    assert len(cold) == 1 and np.allclose(cold, warm, atol=1e-6)


def test_a_cold_result_is_the_frame_stored_scores_give():
    """Scored in Python on a cold call (the texts were NULL in DuckDB's answer) or read from
    stored scores: the same frame, text columns typed alike (a findings table is made from the
    first frame and takes the next ones), and one row a subtask once the worker stored a pair
    the read had scored for itself (the read's own scores and the stored ones both matched:
    every subtask came twice)."""
    conn = new_db()
    insert_spans(conn, _delegations())
    cold = compute_metric(conn, "goal_divergence")
    embed_pending(conn.cursor())
    warm = compute_metric(conn, "goal_divergence")
    assert len(cold) == 1 and cold["root_goal"].notna().all()
    pd.testing.assert_frame_equal(cold, warm, check_exact=False, atol=1e-6)


def test_a_cold_call_that_finds_nothing_drifted_is_typed_as_a_warm_one():
    """Every pair scored on a cold call lands under the threshold: the empty answer has the
    types a warm call's (DuckDB's empty answer) has (found on the framework corpus, ingested
    batch by batch: a table's rows and a full computation differed in type)."""
    conn = new_db()
    insert_spans(conn, _delegations()[:2])  # the on-topic delegation only
    cold = compute_metric(conn, "goal_divergence")
    embed_pending(conn.cursor())
    warm = compute_metric(conn, "goal_divergence")
    assert cold.empty and warm.empty
    pd.testing.assert_frame_equal(cold, warm)


def test_a_cold_statement_answers_pending_pairs_not_a_row_per_unscored_subtask():
    """On a cold database the statement returns one row carrying how many pairs are pending, not
    every unscored subtask with its raw texts (4.9M rows and over 11 GB at 10M spans of 10-call
    runs, for 925 distinct pairs); the pairs are scored once and the statement run again."""
    conn = new_db()
    # 40 runs delegating the same two statements: 2 distinct pairs
    insert_spans(conn, [span for run in range(40) for span in _delegations(f"run-{run}", f"T{run}")])
    threshold = DEFAULTS["goal_divergence"][0]
    first = goals._goal_query(conn, "goal_divergence", Window(), Filters(), threshold=threshold)
    assert len(first) == 1 and first["trace_id"].isna().all()
    assert first["pending"].tolist() == [2]
    found = run_metric(conn, "goal_divergence")
    assert len(found) == 40 and (found["delegate_to"] == "writer").all()
    again = goals._goal_query(conn, "goal_divergence", Window(), Filters(), threshold=threshold)
    assert len(again) == 40 and (again["pending"] == 0).all()  # this connection's scores now


def test_distribution_and_summary_score_pending_pairs_on_a_cold_database():
    conn = new_db()
    insert_spans(conn, _delegations())
    spread = run_metric(conn, "goal_divergence_distribution")
    assert spread["subtasks"].sum() == 2 and spread["drifted"].sum() == 1
    assert conn.execute("SELECT count(*) FROM goal_scores").fetchone()[0] == 0  # reads never write


def test_goal_divergence_on_read_only_database_file(tmp_path):
    path = tmp_path / "incident.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn)
    insert_spans(conn, _delegations())
    conn.close()
    readonly = duckdb.connect(str(path), read_only=True)
    spread = run_metric(readonly, "goal_divergence_distribution")  # scores kept in a temp table
    assert spread["subtasks"].sum() == 2 and spread["drifted"].sum() == 1
    found = run_metric(readonly, "goal_divergence")
    assert len(found) == 1 and found["drifted"].all() and found.iloc[0]["delegate_to"] == "writer"
    assert run_metric(readonly, "run_summary")["drifted_subtasks"].tolist() == [1]
    assert readonly.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 0
    assert readonly.execute("SELECT count(*) FROM goal_scores").fetchone()[0] == 0
    fresh = duckdb.connect(str(path), read_only=True)  # another connection scores them again
    assert len(run_metric(fresh, "goal_divergence")) == 1


@pytest.mark.slow  # over 5 s on an idle machine (make test runs it)
def test_onnx_runtime_gives_the_sentence_transformers_vectors():
    from sentence_transformers import SentenceTransformer

    from analytics.embeddings import _model_dir, load_model

    model = load_model()
    texts = [GOAL, "Find venues", "", "word " * 400, "Écrire un billet sur les azulejos"]
    reference = SentenceTransformer(str(_model_dir()), device="cpu").encode(texts, normalize_embeddings=True)
    got = model.encode(texts, batch_size=2, threads=1)
    assert got.shape == (5, 384)
    assert np.min(np.sum(got * reference, axis=1)) > 0.99999, model.runtime


def _worker_db(tmp_path):
    conn = duckdb.connect(str(tmp_path / "serve.duckdb"))
    migrate(conn)
    insert_spans(conn, _delegations())
    return conn


def test_embedding_worker_runs_at_low_priority_and_waits_while_ingest_is_active(tmp_path):
    conn = _worker_db(tmp_path)
    worker = EmbeddingWorker(
        lambda: conn.cursor(), interval_s=60.0, min_gap_s=0.05, quiet_s=0.3, max_defer_s=600
    )
    worker.notify()  # spans were just committed
    worker.start()
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # a commit every 50 ms: ingest is busy
            worker.notify()
            time.sleep(0.05)
        assert (
            worker.embedded == 0
            and conn.cursor().execute("SELECT count(*) FROM embeddings").fetchone()[0] == 0
        )
        if hasattr(os, "getpriority"):
            assert os.getpriority(os.PRIO_PROCESS, worker._thread.native_id) == 19
        assert _wait_for_embeddings(conn, 3) == 3, worker.last_error  # quiet now: it catches up
    finally:
        worker.stop()
    assert worker.scored_pairs == 2 and worker.last_error is None
    (scored,) = conn.execute("SELECT count(*) FROM goal_scores WHERE divergence IS NOT NULL").fetchone()
    assert scored == 2


@pytest.mark.slow  # over 5 s on an idle machine (make test runs it)
def test_embedding_worker_makes_progress_under_sustained_ingest(tmp_path):
    conn = _worker_db(tmp_path)
    worker = EmbeddingWorker(
        lambda: conn.cursor(), interval_s=60.0, min_gap_s=0.05, quiet_s=10.0, max_defer_s=0.5
    )
    worker.notify()
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and worker.scored_pairs < 2:
            worker.notify()  # never quiet: only the overdue chunk runs
            time.sleep(0.05)
    finally:
        worker.stop()
    assert worker.scored_pairs == 2 and worker.embedded == 3, worker.last_error


def _aggregated_rows(profile: dict) -> list[int]:
    """Rows out of each grouping operator of a DuckDB JSON profile."""
    found = []

    def walk(node: dict) -> None:
        if "GROUP_BY" in node.get("name", ""):
            found.append(int(node.get("operator_cardinality", node.get("intermediate_rows", 0))))
        for child in node.get("children", []):
            walk(child)

    for node in profile.get("operator", profile.get("children", [])):
        walk(node)
    return found


@pytest.mark.parametrize("statement", ["goal_divergence", "goal_run_stats", "goal_pending"])
def test_a_statement_scoped_to_a_few_runs_looks_up_the_roots_of_their_traces_only(tmp_path, statement):
    """After a batch the goal statements run over the touched runs (``Filters.runs``);
    their roots (a statement without ``goal.root`` takes its trace's or origin task's) are
    grouped over those runs' traces and tasks only, not over every trace of the store (at 1M
    spans of 10-call runs that grouping was half of the statement's time). Same rows either way."""
    from analytics.goals import SCORER, ensure_scores_table
    from analytics.sql_loader import filter_params, load_sql, query_df

    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    rows = []
    for k in range(40):
        run = f"run-{k}"
        rows += [
            make_span(k, run=run, agent_id="planner", op="objective", goal_root=f"{GOAL} ({k})", hop=0),
            make_span(k + 0.5, run=run, agent_id="planner", op="delegate", delegate_to="venues", hop=1,
                      origin_task_id=f"T{k % 3}", goal_text="Find venues in Lisbon for 25 people"),
        ]  # fmt: skip
    insert_spans(conn, rows)
    ensure_scores_table(conn)
    params = {
        **filter_params(Window(), Filters()),
        "scorer": SCORER,
        "threshold": None,
        "pending_limit": None,
    }
    scoped = {**params, **filter_params(Window(), Filters(runs=("run-7",)))}
    profile_path = tmp_path / "profile.json"
    conn.execute("PRAGMA enable_profiling = 'json'")
    conn.execute(f"SET profiling_output = '{profile_path}'")
    got = query_df(conn, load_sql(statement), scoped)
    conn.execute("PRAGMA disable_profiling")
    grouped = _aggregated_rows(json.loads(profile_path.read_text()))
    assert grouped and max(grouped) <= 3, grouped  # not a row per trace or task of the store
    everything = query_df(conn, load_sql(statement), params)
    if "run_id" in everything.columns:  # the run's rows are those the whole store's statement gives it

        def of_run(frame: pd.DataFrame) -> pd.DataFrame:
            return (
                frame[frame["run_id"] == "run-7"]
                .drop(columns=["pending"], errors="ignore")
                .reset_index(drop=True)
            )

        pd.testing.assert_frame_equal(of_run(got), of_run(everything))
