"""`driftscope compare RUN [--baseline RUN] [--since 7d] --format md|json`: what changed (issue 35).

Reads through the same sources as the report (a running serve's read API, a DuckDB file or a
ClickHouse store; ``--source``) and prints the comparison, or writes it to ``-o FILE``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from driftscope.settings import ConfigError
from driftscope.timeparse import parse_instant

logger = logging.getLogger(__name__)


def render_comparison(answer: dict, fmt: str) -> str:
    """The comparison as Markdown (a heading, the baseline, the departure, the differences) or
    as the JSON the read API answers."""
    if fmt == "json":
        return json.dumps(answer, indent=1, ensure_ascii=False, default=str) + "\n"
    from dashboard.compare_render import comparison_markdown
    from dashboard.text_cells import md_escape

    lines = [f"# What differs: run {md_escape(answer['run']['run_id'])}", "", *comparison_markdown(answer)]
    return "\n".join(lines)


def cmd_compare(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from analytics.types import Filters, Window
    from dashboard.datasource import SourceUnavailable
    from driftscope.commands import _apply_side_effect_tools, _open_source

    source = _open_source(values["source"], values.get("token"))
    _apply_side_effect_tools(values["source"], values.get("side_effect_tools"))
    window = Window()
    if args.since:
        try:
            window = Window(since=parse_instant("--since", args.since))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    try:
        answer = source.compare(args.run, args.baseline or "auto", window)
        if answer is None:
            newest = [str(r) for r in source.filter_options(Window())["runs"][:5]]
            named = [args.run] + ([args.baseline] if args.baseline else [])
            missing = next((r for r in named if source.run_totals(Window(), Filters(run=r)).empty), args.run)
            raise ConfigError(
                f"No spans of run {missing!r} in {source.description}; nothing to compare. "
                + (f"Newest runs: {', '.join(newest)}." if newest else "The source holds no run.")
            )
    except (SourceUnavailable, NotImplementedError) as exc:
        raise ConfigError(str(exc)) from exc
    text = render_comparison(answer, args.fmt)
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
        logger.info("wrote the comparison of run %s to %s", args.run, output)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0
