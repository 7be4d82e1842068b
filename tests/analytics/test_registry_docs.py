"""docs/analytics.md documents every registered detector exactly as the registry does."""

from __future__ import annotations

import pathlib

from analytics.reference import generated_block, render_markdown
from analytics.registry import list_metrics

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "analytics.md"


def test_detector_reference_in_docs_matches_registry():
    assert generated_block(DOC) == render_markdown(), (
        "docs/analytics.md is stale: run `python -m analytics.reference docs/analytics.md`"
    )


def test_every_metric_has_its_sql_file_and_section():
    text = DOC.read_text()
    sql_dir = pathlib.Path(__file__).resolve().parents[2] / "analytics" / "sql"
    for metric in list_metrics():
        assert f"### `{metric.name}`" in text
        assert (sql_dir / f"{metric.name}.sql").is_file(), metric.name
