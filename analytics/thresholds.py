"""Versioned thresholds with provenance (table ``thresholds``); detectors use the newest.

Until a threshold is calibrated, its default below is in force and every result that uses it
says so (``calibrated = False``, ``threshold_version = 0``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb

from analytics.engine import fetch_rows
from analytics.schema import ensure_readable
from analytics.types import WriteFn, direct_write

logger = logging.getLogger(__name__)

# Defaults in force until calibrated; calibrate on your own crews (labelled pairs or a healthy
# baseline window). The goal-divergence default lets ordinary decompositions pass: on the 367
# labelled pairs of sample_traces/calibration, 0.80 flags 0.6% of on-goal subtasks and 77% of
# drifted ones (0.45 flagged 55% of on-goal subtasks: "Plan the offsite" -> "Find venues" is 0.777).
# Until calibrated, run_summary treats what it flags as "to review", not as a failure.
DEFAULTS: dict[str, tuple[float, str]] = {
    "goal_divergence": (
        0.80,
        "uncalibrated default 0.80 (1 - cosine, all-MiniLM-L6-v2): flags clear drift only; short "
        "subtasks of long goals score high - run `driftscope calibrate`",
    ),
    "near_duplicate_similarity": (
        0.75,
        "uncalibrated default 0.75 (token-set Jaccard of normalized tool arguments)",
    ),
    # The Youden point (0.7503) on sample_traces/calibration/task_pairs.csv (720 labelled pairs):
    # AUROC 0.977, recall 0.91, false-positive rate 0.047, precision 0.95 (docs/analytics.md).
    "near_duplicate_task_similarity": (
        0.75,
        "default 0.75 (embedding cosine x overlap of numbers and names of two task statements), "
        "the Youden point on sample_traces/calibration/task_pairs.csv",
    ),
    "rejection_rate": (
        0.25,
        "uncalibrated default 0.25 (rejected / attempted guarded calls per bucket)",
    ),
}


@dataclass(frozen=True)
class ThresholdInfo:
    """The threshold in force: value, version (0 = default), method, provenance JSON text."""

    value: float
    version: int
    method: str
    provenance: str
    calibrated: bool


def default_threshold(name: str) -> ThresholdInfo:
    """The uncalibrated default for ``name`` (raises ``KeyError`` for unknown names)."""
    value, note = DEFAULTS[name]
    return ThresholdInfo(value, 0, "default", json.dumps({"note": note}), False)


def current_threshold(conn: duckdb.DuckDBPyConnection, name: str) -> ThresholdInfo:
    """The newest stored threshold for ``name``, else its uncalibrated default."""
    rows = fetch_rows(
        conn,
        "SELECT value, version, method, provenance FROM thresholds WHERE name = $name "
        "ORDER BY version DESC LIMIT 1",
        {"name": name},
    )
    if not rows:
        return default_threshold(name)
    value, version, method, provenance = rows[0]
    return ThresholdInfo(float(value), int(version), method, provenance, method != "default")


def store_threshold(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    value: float,
    method: str,
    provenance: dict[str, Any],
    write: WriteFn | None = None,
) -> ThresholdInfo:
    """Store a new version of threshold ``name``; return what is now in force.

    ``write`` runs the insert on the process's single writer (``serve``); without it the insert
    is a transaction of its own on ``conn`` (a process that is the file's only writer).
    """
    provenance = dict(provenance)
    provenance.setdefault("created_at", datetime.now(UTC).isoformat())
    text = json.dumps(provenance, sort_keys=True, default=str)

    def insert(target: duckdb.DuckDBPyConnection) -> int:
        (version,) = target.execute(
            "SELECT coalesce(max(version), 0) + 1 FROM thresholds WHERE name = ?", [name]
        ).fetchone()
        target.execute(
            "INSERT INTO thresholds VALUES (?, ?, ?, ?, ?, now()::TIMESTAMP)",
            [name, version, float(value), method, text],
        )
        from analytics.materialize import log_rebuild  # findings computed with the old value are stale

        log_rebuild(target)
        return version

    version = (write or direct_write(conn))(insert)
    logger.info("stored threshold %s v%s = %.4f (%s)", name, version, value, method)
    return ThresholdInfo(float(value), int(version), method, text, method != "default")


def list_thresholds(conn: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Every threshold in force (newest stored version, or the default), one dict per name."""
    ensure_readable(conn)
    names = set(DEFAULTS)
    names.update(row[0] for row in fetch_rows(conn, "SELECT DISTINCT name FROM thresholds"))
    out = []
    for name in sorted(names):
        info = current_threshold(conn, name)
        out.append(
            {
                "name": name,
                "value": info.value,
                "version": info.version,
                "method": info.method,
                "calibrated": info.calibrated,
                "provenance": info.provenance,
            }
        )
    return out
