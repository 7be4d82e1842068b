"""Calibrate thresholds and store them, versioned, with provenance.

* ``calibrate_from_pairs``: goal-divergence threshold from labelled (root goal, subtask,
  drifted) pairs - ROC curve, threshold at maximal Youden J or at a target false-positive rate,
  AUROC, precision and recall at the chosen point.
* ``calibrate_from_baseline``: thresholds from a healthy window of the user's own crews - the
  divergence, rejection-rate and near-duplicate-similarity thresholds at a quantile (or mean +
  k sigma) of what that window shows, and per-run finding counts of every detector.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import pathlib
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from analytics.crew_limits import count_threshold_name, run_services
from analytics.embeddings import MODEL_NAME, embed_texts
from analytics.goals import goal_pairs, score_pairs
from analytics.loop_similarity import argument_similarity, task_similarity
from analytics.registry import counted_metrics, run_metric
from analytics.runaway import AGENT_THRESHOLD, RUN_THRESHOLD, RUNAWAY_MARGIN, baseline_limit
from analytics.sql_loader import run_sql
from analytics.tasks import extract_task
from analytics.thresholds import store_threshold
from analytics.types import Filters, Window, WriteFn

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("root_goal", "subtask", "drifted")
_TRUE = {"1", "yes", "y", "true", "t", "drifted"}
_FALSE = {"0", "no", "n", "false", "f", "on_goal", "ok"}
# A baseline threshold from a handful of values is noise (a 0.99 quantile of 5 values is their
# maximum); below these sizes a threshold is skipped and the reason reported.
MIN_BASELINE_VALUES = 20
MIN_BASELINE_RUNS = 10
LOOP_PAIR_COLUMNS = ("first", "second", "same_request")
TASK_PAIR_COLUMNS = ("first_task", "second_task", "same_request")


@dataclass(frozen=True)
class RocPoint:
    """Operating point: flag ``score > threshold``."""

    threshold: float
    tpr: float
    fpr: float
    precision: float
    recall: float
    tp: int
    fp: int
    tn: int
    fn: int


def read_pairs(csv_path: str | pathlib.Path) -> tuple[list[str], list[str], np.ndarray]:
    """Read a labelled pairs CSV (header with root_goal, subtask, drifted); return its columns."""
    path = pathlib.Path(csv_path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in REQUIRED_COLUMNS if column not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"Expected columns {list(REQUIRED_COLUMNS)} in {path}, missing {missing}")
        roots, subtasks, labels = [], [], []
        for line, row in enumerate(reader, start=2):
            label = str(row["drifted"]).strip().lower()
            if label not in _TRUE | _FALSE:
                raise ValueError(f"{path}:{line}: expected drifted to be 1/0 or yes/no, got {label!r}")
            root, subtask = extract_task(row["root_goal"]), extract_task(row["subtask"])
            if not root or not subtask:
                raise ValueError(f"{path}:{line}: empty root_goal or subtask")
            roots.append(root)
            subtasks.append(subtask)
            labels.append(label in _TRUE)
    if not labels:
        raise ValueError(f"{path} holds no pairs")
    return roots, subtasks, np.asarray(labels, dtype=bool)


def auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties)."""
    labels = np.asarray(labels, dtype=bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if positives == 0 or negatives == 0:
        raise ValueError("AUROC needs both drifted and on-goal pairs")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.arange(1, len(scores) + 1)
    sorted_scores = np.asarray(scores)[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    for start, count in zip(first, counts, strict=True):  # average rank within ties
        if count > 1:
            ranks[order[start : start + count]] = start + (count + 1) / 2
    u = ranks[labels].sum() - positives * (positives + 1) / 2
    return float(u / (positives * negatives))


def roc_points(labels: np.ndarray, scores: np.ndarray) -> list[RocPoint]:
    """Every operating point, from strictest to loosest; thresholds sit between distinct scores."""
    labels = np.asarray(labels, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    distinct = np.unique(scores)[::-1]
    cuts = np.append((distinct[:-1] + distinct[1:]) / 2, distinct[-1] - 1e-6)
    cuts = np.insert(cuts, 0, distinct[0] + 1e-6)
    flagged = scores[None, :] > cuts[:, None]
    tp = (flagged & labels).sum(axis=1)
    fp = (flagged & ~labels).sum(axis=1)
    fn = labels.sum() - tp
    tn = (~labels).sum() - fp
    points = []
    for i, cut in enumerate(cuts):
        precision = tp[i] / (tp[i] + fp[i]) if tp[i] + fp[i] else 1.0
        recall = tp[i] / (tp[i] + fn[i]) if tp[i] + fn[i] else 0.0
        fpr = fp[i] / (fp[i] + tn[i]) if fp[i] + tn[i] else 0.0
        points.append(
            RocPoint(float(cut), float(recall), float(fpr), float(precision), float(recall),
                     int(tp[i]), int(fp[i]), int(tn[i]), int(fn[i]))
        )  # fmt: skip
    return points


def choose_point(points: list[RocPoint], target_fpr: float | None = None) -> RocPoint:
    """Maximal Youden J (tpr - fpr), or the best recall with fpr <= ``target_fpr``."""
    if target_fpr is not None:
        if not 0.0 <= target_fpr <= 1.0:
            raise ValueError(f"Expected target_fpr between 0 and 1, got {target_fpr}")
        allowed = [point for point in points if point.fpr <= target_fpr]
        return max(allowed, key=lambda point: (point.tpr, point.threshold))
    return max(points, key=lambda point: (point.tpr - point.fpr, point.threshold))


def point_metrics(area: float, chosen: RocPoint) -> dict[str, Any]:
    """AUROC and the chosen ROC point's precision, recall, rates, Youden J and confusion counts."""
    return {
        "auroc": area,
        "precision": chosen.precision,
        "recall": chosen.recall,
        "fpr": chosen.fpr,
        "tpr": chosen.tpr,
        "youden_j": chosen.tpr - chosen.fpr,
        "confusion": {"tp": chosen.tp, "fp": chosen.fp, "tn": chosen.tn, "fn": chosen.fn},
    }


def calibrate_from_pairs(
    conn: duckdb.DuckDBPyConnection,
    csv_path: str | pathlib.Path,
    target_fpr: float | None = None,
    write: WriteFn | None = None,
    data_name: str | None = None,
) -> dict[str, Any]:
    """Calibrate the goal-divergence threshold on labelled pairs and store it.

    A CSV of labelled argument pairs (first, second, same_request) calibrates the loop
    similarity instead (``calibrate_loop_similarity``), one of labelled task statement pairs
    (first_task, second_task, same_request) the task similarity (``calibrate_task_similarity``).

    Returns the stored version and value with AUROC, the chosen point's precision, recall,
    false-positive rate and Youden J, and the ROC curve. ``write`` stores the threshold through
    the process's single writer (``store_threshold``); ``data_name`` is the file named in the
    provenance when ``csv_path`` is a copy (a file uploaded to ``serve``).
    """
    path = pathlib.Path(csv_path)
    if _has_columns(path, TASK_PAIR_COLUMNS):
        return calibrate_task_similarity(conn, path, target_fpr, write, data_name)
    if is_loop_pairs(path):
        return calibrate_loop_similarity(conn, path, target_fpr, write, data_name)
    roots, subtasks, labels = read_pairs(path)
    scores = score_pairs(roots, subtasks, conn)
    area = auroc(labels, scores)
    points = roc_points(labels, scores)
    chosen = choose_point(points, target_fpr)
    method = "target_fpr" if target_fpr is not None else "youden_j"
    metrics = point_metrics(area, chosen)
    provenance = {
        "model": MODEL_NAME,
        "data": data_name or str(path),
        "data_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "pairs": int(len(labels)),
        "drifted": int(labels.sum()),
        "target_fpr": target_fpr,
        "metrics": metrics,
    }
    info = store_threshold(conn, "goal_divergence", chosen.threshold, method, provenance, write)
    logger.info("goal_divergence calibrated: %.4f (AUROC %.3f, %s)", chosen.threshold, area, method)
    return {
        "name": "goal_divergence",
        "version": info.version,
        "value": info.value,
        "method": method,
        "pairs": int(len(labels)),
        **metrics,
        "roc": [{"threshold": p.threshold, "tpr": p.tpr, "fpr": p.fpr} for p in points],
    }


def _has_columns(csv_path: str | pathlib.Path, columns: tuple[str, ...]) -> bool:
    with pathlib.Path(csv_path).open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), [])
    return all(column in header for column in columns)


def is_loop_pairs(csv_path: str | pathlib.Path) -> bool:
    """Whether ``csv_path`` holds labelled argument pairs (first, second, same_request)."""
    return _has_columns(csv_path, LOOP_PAIR_COLUMNS)


def read_loop_pairs(
    csv_path: str | pathlib.Path, columns: tuple[str, ...] = LOOP_PAIR_COLUMNS
) -> tuple[list[str], list[str], np.ndarray]:
    """Read labelled argument pairs (header with first, second, same_request); return its columns."""
    path = pathlib.Path(csv_path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in columns if column not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"Expected columns {list(columns)} in {path}, missing {missing}")
        firsts, seconds, labels = [], [], []
        for line, row in enumerate(reader, start=2):
            label = str(row["same_request"]).strip().lower()
            if label not in _TRUE | _FALSE | {"same", "different"}:
                raise ValueError(f"{path}:{line}: expected same_request to be 1/0 or yes/no, got {label!r}")
            firsts.append(row[columns[0]])
            seconds.append(row[columns[1]])
            labels.append(label in _TRUE | {"same"})
    if not labels:
        raise ValueError(f"{path} holds no pairs")
    return firsts, seconds, np.asarray(labels, dtype=bool)


def calibrate_loop_similarity(
    conn: duckdb.DuckDBPyConnection,
    csv_path: str | pathlib.Path,
    target_fpr: float | None = None,
    write: WriteFn | None = None,
    data_name: str | None = None,
) -> dict[str, Any]:
    """Calibrate ``near_duplicate_similarity`` (repeated_calls) on labelled argument pairs.

    Each pair is scored with the detector's similarity (``analytics.loop_similarity``); the
    threshold is the ROC point at maximal Youden J or the best recall at ``target_fpr``, stored
    with AUROC, precision, recall, the confusion matrix, the file and its sha256.
    """
    path = pathlib.Path(csv_path)
    firsts, seconds, labels = read_loop_pairs(path)
    scores = np.asarray([argument_similarity(a, b) for a, b in zip(firsts, seconds, strict=True)])
    measure = "token-set Jaccard of stemmed argument words, stop words dropped (analytics.loop_similarity)"
    return _store_pair_calibration(
        conn, "near_duplicate_similarity", path, labels, scores, target_fpr, measure, write, data_name
    )


def task_pair_scores(
    firsts: list[str], seconds: list[str], conn: duckdb.DuckDBPyConnection | None = None
) -> np.ndarray:
    """``task_similarity`` of each (first, second) task statement pair (vectors from the cache of
    ``conn`` where stored, else encoded here; nothing is written)."""
    vectors = embed_texts(list(firsts) + list(seconds), conn)
    left, right = vectors[: len(firsts)], vectors[len(firsts) :]
    cosines = np.einsum("ij,ij->i", left.astype(np.float64), right.astype(np.float64))
    return np.asarray(
        [task_similarity(a, b, c) for a, b, c in zip(firsts, seconds, cosines, strict=True)], dtype=np.float64
    )


def calibrate_task_similarity(
    conn: duckdb.DuckDBPyConnection,
    csv_path: str | pathlib.Path,
    target_fpr: float | None = None,
    write: WriteFn | None = None,
    data_name: str | None = None,
) -> dict[str, Any]:
    """Calibrate ``near_duplicate_task_similarity`` (repeated_calls on delegations and agent
    invocations) on labelled task statement pairs (first_task, second_task, same_request).

    Each pair is scored with ``analytics.loop_similarity.task_similarity`` (embedding cosine times
    the overlap of the statements' numbers and names); the ROC point is chosen and stored as in
    ``calibrate_loop_similarity``.
    """
    path = pathlib.Path(csv_path)
    firsts, seconds, labels = read_loop_pairs(path, TASK_PAIR_COLUMNS)
    scores = task_pair_scores(firsts, seconds, conn)
    measure = (
        f"cosine of the task statements' embeddings ({MODEL_NAME}) x Jaccard of their numbers and "
        "names (analytics.loop_similarity.task_similarity)"
    )
    return _store_pair_calibration(
        conn, "near_duplicate_task_similarity", path, labels, scores, target_fpr, measure, write, data_name
    )


def _store_pair_calibration(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    path: pathlib.Path,
    labels: np.ndarray,
    scores: np.ndarray,
    target_fpr: float | None,
    measure: str,
    write: WriteFn | None = None,
    data_name: str | None = None,
) -> dict[str, Any]:
    """Choose the ROC point of a similarity on labelled same-request pairs and store it (through
    ``write`` when given; ``data_name`` names the file in the provenance)."""
    area = auroc(labels, scores)
    points = roc_points(labels, scores)
    chosen = choose_point(points, target_fpr)
    # flag score > cut; the detector links score >= threshold: the cut sits between two scores
    method = "target_fpr" if target_fpr is not None else "youden_j"
    metrics = point_metrics(area, chosen)
    provenance = {
        "measure": measure,
        "data": data_name or str(path),
        "data_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "pairs": int(len(labels)),
        "same_request": int(labels.sum()),
        "target_fpr": target_fpr,
        "metrics": metrics,
    }
    value = float(np.clip(chosen.threshold, 0.05, 1.0))
    info = store_threshold(conn, name, value, method, provenance, write)
    logger.info("%s calibrated: %.4f (AUROC %.3f, %s)", name, value, area, method)
    return {
        "name": name,
        "version": info.version,
        "value": info.value,
        "method": method,
        "pairs": int(len(labels)),
        **metrics,
        "roc": [{"threshold": p.threshold, "tpr": p.tpr, "fpr": p.fpr} for p in points],
    }


def baseline_value(values: np.ndarray, quantile: float, k_sigma: float | None) -> tuple[float, str]:
    """Threshold from baseline values: ``mean + k_sigma * std`` if given, else the quantile."""
    values = np.asarray(values, dtype=np.float64)
    if k_sigma is not None:
        return float(values.mean() + k_sigma * values.std()), "mean_k_sigma"
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"Expected quantile in (0, 1], got {quantile}")
    return float(np.quantile(values, quantile)), "quantile"


def _consecutive_call_similarity(
    conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters
) -> np.ndarray:
    """The loop similarity of each tool call to the previous call of its (run, agent, tool)."""
    frame = run_sql(conn, "call_similarity", window, filters)
    scores = [argument_similarity(a, b) for a, b in zip(frame["args"], frame["previous"], strict=True)]
    return np.repeat(np.asarray(scores, dtype=np.float64), frame["n"].to_numpy(dtype=np.int64))


def calibrate_from_baseline(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    quantile: float = 0.99,
    k_sigma: float | None = None,
    filters: Filters = Filters(),
    write: WriteFn | None = None,
) -> dict[str, Any]:
    """Calibrate thresholds from a healthy baseline window and store those with enough data
    (through ``write``, the process's single writer, when given).

    Needs at least ``MIN_BASELINE_VALUES`` values per threshold (``MIN_BASELINE_RUNS`` runs for
    per-run counts). Returns ``{"window": ..., "thresholds": {name: {...}}, "skipped": {name: reason}}``.
    """
    stored: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    window_info = {
        "since": window.since.isoformat() if window.since else None,
        "until": window.until.isoformat() if window.until else None,
        "filters": {key: value for key, value in vars(filters).items() if value is not None},
    }

    def store(
        name: str, values: np.ndarray, unit: str, clip: tuple[float, float] | None = None, minimum: int = 0
    ) -> None:
        minimum = minimum or MIN_BASELINE_VALUES
        if len(values) < minimum:
            skipped[name] = f"{len(values)} values in the baseline window; need at least {minimum}"
            return
        value, method = baseline_value(values, quantile, k_sigma)
        if clip is not None:
            value = float(np.clip(value, *clip))
        provenance = {
            "model": MODEL_NAME if name == "goal_divergence" else None,
            "data": "baseline window",
            "window": window_info,
            "quantile": quantile if k_sigma is None else None,
            "k_sigma": k_sigma,
            "unit": unit,
            "metrics": {"n": int(len(values)), "mean": float(np.mean(values)),
                        "std": float(np.std(values)), "max": float(np.max(values))},
        }  # fmt: skip
        info = store_threshold(conn, name, value, method, provenance, write)
        stored[name] = {"value": info.value, "version": info.version, "method": method, "n": len(values)}

    divergences = goal_pairs(conn, window, filters)["divergence"].to_numpy(dtype=np.float64)
    store("goal_divergence", divergences, "1 - cosine")
    rates = run_metric(conn, "rejection_rates", window, filters)["rejection_rate"].to_numpy()
    store("rejection_rate", rates, "rejections / attempts per bucket", clip=(0.0, 1.0))
    # A loop threshold must sit above the similarity healthy consecutive calls already show.
    similarity = _consecutive_call_similarity(conn, window, filters)
    store(
        "near_duplicate_similarity",
        similarity,
        "token-set Jaccard of stemmed argument words",
        clip=(0.5, 1.0),
    )
    # Runaway limits per crew (service): the baseline's spans per run / per agent in a run.
    counts = run_sql(conn, "runaway_runs", window, filters)
    for service, group in counts.groupby("service"):
        for whole, prefix in ((True, RUN_THRESHOLD), (False, AGENT_THRESHOLD)):
            values = group.loc[group["whole_run"].astype(bool) == whole, "spans"].to_numpy(dtype=np.float64)
            name = f"{prefix}:{service}"
            if len(values) < MIN_BASELINE_RUNS:
                skipped[name] = (
                    f"{len(values)} values in the baseline window; need at least {MIN_BASELINE_RUNS}"
                )
                continue
            limit = baseline_limit(values, quantile)
            provenance = {
                "data": "baseline window",
                "window": window_info,
                "quantile": quantile,
                "margin": RUNAWAY_MARGIN,
                "unit": "spans per run" if whole else "spans per agent in a run",
                "metrics": {"n": int(len(values)), "median": float(np.median(values)),
                            "max": float(np.max(values))},
            }  # fmt: skip
            info = store_threshold(conn, name, limit, "quantile_x_margin", provenance, write)
            stored[name] = {"value": info.value, "version": info.version, "method": "quantile_x_margin",
                            "n": len(values)}  # fmt: skip
    # Finding counts per run, per crew: false findings in one crew's baseline must not switch a
    # detector off for the others (analytics.crew_limits).
    runs = run_metric(conn, "run_summary", window, filters)
    runs = runs.assign(service=run_services(conn, runs["run_id"]).to_numpy())
    for service, crew in runs.dropna(subset=["service"]).groupby("service"):
        for detector in (m.name for m in counted_metrics()):  # the counts the verdict compares
            column = f"{detector}_count"
            if column in crew.columns:
                store(count_threshold_name(detector, service), crew[column].to_numpy(),
                      "findings per run of the crew", minimum=MIN_BASELINE_RUNS)  # fmt: skip
    return {"window": window_info, "thresholds": stored, "skipped": skipped}
