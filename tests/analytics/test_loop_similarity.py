"""The similarities loop detection links calls with, and their calibration on labelled pairs."""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics import run_metric
from analytics.calibration import TASK_PAIR_COLUMNS, calibrate_from_pairs, read_loop_pairs
from analytics.loop_similarity import (
    argument_similarity,
    could_link,
    specifics_overlap,
    task_similarity,
    task_specifics,
)
from analytics.thresholds import DEFAULTS, current_threshold
from tests.fixtures_analytics import insert_spans, make_span, new_db

CALIBRATION = pathlib.Path(__file__).resolve().parents[2] / "sample_traces" / "calibration"


def test_task_specifics_are_numbers_and_names_not_sentence_starts():
    assert task_specifics("Find Contoso's employee count at the end of 2023.") == {"contoso", "2023"}
    assert task_specifics("What was Globex's R&D spending in Q3? I need it.") == {"globex", "r&d", "q3"}
    assert task_specifics("Investigate the memory leak since v2.3.") == {"v2.3"}
    assert task_specifics("Summarise the notes. Then send them.") == frozenset()


def test_specifics_overlap_counts_a_name_that_starts_the_other_sentence():
    assert specifics_overlap("Find Contoso's employee count in 2023", "Contoso employee count 2023") == 1.0
    assert specifics_overlap(
        "Find Globex's revenue for 2023.", "Find Globex's revenue for 2024."
    ) == pytest.approx(1 / 3)
    assert specifics_overlap("Summarise the notes", "Write a summary of the notes") == 1.0


def test_task_similarity_is_cosine_times_specifics_overlap():
    assert task_similarity("Find X for 2024", "find x for 2024", 0.2) == 1.0  # same signature
    assert task_similarity("Find Globex's revenue for 2023.", "Find Globex's revenue for 2024.", 0.97) == (
        pytest.approx(0.97 / 3)
    )
    assert task_similarity("Find the churn of Acme", "Look up Acme's churn", -0.1) == 0.0


def test_shipped_task_pairs_calibrate_the_task_threshold_at_its_default():
    firsts, seconds, labels = read_loop_pairs(CALIBRATION / "task_pairs.csv", TASK_PAIR_COLUMNS)
    assert len(labels) >= 600 and 0.4 <= labels.mean() <= 0.6
    conn = new_db()
    result = calibrate_from_pairs(conn, CALIBRATION / "task_pairs.csv")
    assert result["name"] == "near_duplicate_task_similarity" and result["method"] == "youden_j"
    assert result["auroc"] >= 0.95 and result["fpr"] <= 0.06 and result["recall"] >= 0.85
    # the shipped default is this calibration's point (thresholds.DEFAULTS says where it comes from)
    assert result["value"] == pytest.approx(DEFAULTS["near_duplicate_task_similarity"][0], abs=0.01)
    info = current_threshold(conn, "near_duplicate_task_similarity")
    provenance = json.loads(info.provenance)
    assert info.calibrated and provenance["data_sha256"] and provenance["pairs"] == len(labels)
    assert "all-MiniLM-L6-v2" in provenance["measure"]
    # the argument measure on the same pairs: far fewer re-worded asks reach its own threshold
    reached = [
        argument_similarity(a, b) >= 0.75 for a, b, same in zip(firsts, seconds, labels, strict=True) if same
    ]
    assert sum(reached) / len(reached) < 0.5


def test_argument_pairs_still_calibrate_the_argument_threshold():
    conn = new_db()
    result = calibrate_from_pairs(conn, CALIBRATION / "loop_pairs.csv")
    assert result["name"] == "near_duplicate_similarity" and result["auroc"] >= 0.9
    assert not current_threshold(conn, "near_duplicate_task_similarity").calibrated


def test_the_detector_links_tasks_at_the_calibrated_threshold():
    conn = new_db()
    manager = make_span(0, agent_id="manager", span_family="agent", SpanName="manager.run")
    tasks = ["Find Contoso's employee count at the end of 2023."] * 2 + [
        "Find the number of employees Contoso had at the end of 2023."
    ]
    insert_spans(conn, [manager] + [
        make_span(1 + i, agent_id="search_agent", span_family="agent", ParentSpanId=manager["SpanId"],
                  input_text=json.dumps({"task": task}))
        for i, task in enumerate(tasks)
    ])  # fmt: skip
    assert run_metric(conn, "repeated_calls").loc[0, "calls"] == 3
    # a target false-positive rate of 0 gives a stricter threshold: the re-worded ask is below it
    calibrate_from_pairs(conn, CALIBRATION / "task_pairs.csv", target_fpr=0.0)
    assert current_threshold(conn, "near_duplicate_task_similarity").value > 0.9
    assert run_metric(conn, "repeated_calls").empty


_TASK_WORDS = [
    "Find",
    "the",
    "Contoso",
    "employee",
    "count",
    "for",
    "2023",
    "2024",
    "Fabrikam",
    "report",
    "of",
]


@given(
    st.lists(st.sampled_from(_TASK_WORDS), min_size=1, max_size=8),
    st.lists(st.sampled_from(_TASK_WORDS), min_size=1, max_size=8),
    st.floats(0.05, 1.0),
)
def test_a_pair_could_link_rules_out_is_below_the_threshold_whatever_its_embeddings(first, second, threshold):
    a, b = " ".join(first), " ".join(second)
    if not could_link(a, b, threshold):
        assert task_similarity(a, b, 1.0) < threshold
