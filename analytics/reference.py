"""Render the detector reference (docs/analytics.md) from the registry, so docs cannot drift.

Regenerate with ``python -m analytics.reference docs/analytics.md``: the text between the
``<!-- metrics:begin -->`` and ``<!-- metrics:end -->`` markers is replaced.
"""

from __future__ import annotations

import pathlib
import sys

from analytics.registry import list_metrics

BEGIN = "<!-- metrics:begin -->"
END = "<!-- metrics:end -->"


def render_markdown() -> str:
    """One section per registered metric: description, row, failure mode, column table."""
    import analytics  # noqa: F401  (registers every detector)

    parts = []
    for metric in list_metrics():
        parts.append(f"### `{metric.name}`\n")
        parts.append(f"{metric.description}\n")
        parts.append(f"- One row = {metric.row}.")
        if metric.failure_mode:
            parts.append(f"- Failure mode: {metric.failure_mode} (MAST: {metric.mast_category}).")
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
