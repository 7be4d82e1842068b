"""Render the detector reference (docs/analytics.md) from the registry, so docs cannot drift.

Regenerate with ``python -m analytics.reference docs/analytics.md``: the text between the
``<!-- metrics:begin -->`` and ``<!-- metrics:end -->`` markers is replaced.
"""

from __future__ import annotations

import pathlib
import sys

from analytics.registry import Metric, list_metrics

BEGIN = "<!-- metrics:begin -->"
END = "<!-- metrics:end -->"


def _verdict(metric: Metric) -> str:
    """How a metric's findings weigh in a run's verdict, in words."""
    if metric.failing_unless:
        effect = f"a finding makes its run failing unless `{metric.failing_unless}` (then degraded)"
    elif metric.failing:
        effect = "a finding makes its run failing"
    else:
        effect = "a finding makes its run degraded (a guard or the agent caught it)"
    if metric.review_unless:
        effect += f"; to review instead while `{metric.review_unless}` is false"
    counted = f"; run_summary counts them (`{metric.name}_count`)" if metric.counted else ""
    return effect + counted


def render_markdown() -> str:
    """One section per registered metric: description, row, failure mode, how findings are read,
    column table."""
    parts = []
    for metric in list_metrics():
        parts.append(f"### `{metric.name}`\n")
        parts.append(f"{metric.description}\n")
        parts.append(f"- One row = {metric.row}.")
        if metric.failure_mode:
            parts.append(f"- Failure mode: {metric.failure_mode} (MAST: {metric.mast_category}).")
        if metric.findings:
            flagged = f"where `{metric.flag_column}` is true" if metric.flag_column else "every row"
            parts.append(f'- Findings: {flagged}, titled "{metric.title}"; {_verdict(metric)}.')
        if metric.needs:
            parts.append(f"- Needs to see: {metric.needs}.")
        if metric.blind_spots:
            parts.append(f"- Cannot see: {metric.blind_spots}")
        parts.append(f"- SQL: `analytics/sql/{metric.name}.sql`.\n")
        parts.append("| column | meaning / unit |\n|---|---|")
        for column, meaning in metric.columns.items():
            parts.append(f"| `{column}` | {meaning.replace('|', '/')} |")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def update_file(path: pathlib.Path) -> bool:
    """Replace the generated block in ``path``; return True when the file changed."""
    text = path.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:start] + "\n" + render_markdown() + text[end:]
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


def generated_block(path: pathlib.Path) -> str:
    """The text currently between the markers of ``path``."""
    text = path.read_text(encoding="utf-8")
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].lstrip("\n")


if __name__ == "__main__":
    update_file(pathlib.Path(sys.argv[1]))
