"""A run comparison (``analytics.compare.compare_run``'s answer; issue 35) as text: Markdown for
``driftscope compare`` and the report, an HTML fragment for the HTML report. Values that may come
from spans are escaped (``html.escape``; Markdown through ``md_escape``)."""

from __future__ import annotations

import html
from collections.abc import Callable

from dashboard.text_cells import md_escape

# Most differences one rendering lists (the dashboard and the JSON answer have all of them).
MAX_LISTED = 30
KIND_TEXT = {
    "new": "new step",
    "missing": "missing step",
    "more": "more calls",
    "fewer": "fewer calls",
    "errors": "errors",
    "refusals": "refusals",
    "new_delegation": "new delegation target",
    "argument_shape": "new argument shape",
    "finding": "finding healthy runs never have",
}


def subject_text(diff: dict) -> str:
    """``agent · tool`` (the operation when there is no tool) of a difference or profile row."""
    what = diff.get("tool") or diff.get("operation") or "span"
    return f"{diff.get('agent') or '(no agent)'} · {what}"


def baseline_sentence(answer: dict) -> str:
    """One sentence naming what the run was compared with."""
    base = answer["baseline"]
    if base["runs"] == 0:
        return base.get("note", "no baseline")
    if base["mode"] == "chosen run":
        return f"compared with run {base['run_ids'][0]}"
    crew = f"; {base['crew']}" if base.get("crew") else ""
    return (
        f"compared with {base['runs']} healthy run(s) of crew {base['service']} "
        f"(closest: {base.get('closest_run')}{crew})"
    )


def departure_sentence(answer: dict) -> str:
    """Where the run first departed, in one sentence (or that it never did)."""
    dep = answer.get("departure")
    if answer["baseline"]["runs"] == 0:
        return "No departure computed: there is no run to compare with."
    if dep is None:
        return "No departure: every step of this run is one a baseline run takes at that point."
    expected = "; ".join(dep.get("expected") or []) or "nothing"
    return (
        f"First departs at step {dep['pos']} (span {dep['span_id']}): {dep['step']}, {dep['reason']}; "
        f"baseline runs take {expected} there."
    )


def comparison_markdown(answer: dict, span_link: Callable[[str, str], str | None] | None = None) -> list[str]:
    """Markdown lines: the baseline, the departure, the differences table (``span_link(run,
    span)``: a URL for a span id, or None for plain ids)."""
    run_id = answer["run"]["run_id"]

    def span_md(span: str, run: str = run_id) -> str:
        url = span_link(run, span) if span_link else None
        return f"[{md_escape(span)}]({url})" if url else md_escape(span)

    lines = [
        f"Run {md_escape(run_id)} (crew {md_escape(answer['run']['service'])}, verdict "
        f"{md_escape(answer['run'].get('verdict'))}): {md_escape(baseline_sentence(answer))}.",
        "",
        md_escape(departure_sentence(answer)),
        "",
    ]
    diffs = answer.get("differences") or []
    if answer["baseline"]["runs"] and not diffs:
        lines += ["No differences per agent and tool.", ""]
    if diffs:
        closest = answer["baseline"].get("closest_run") or ""
        lines += [
            "| difference | agent · tool | calls | baseline | detail | spans |",
            "|---|---|---|---|---|---|",
        ]
        for diff in diffs[:MAX_LISTED]:
            spans = [span_md(s) for s in diff.get("span_ids", [])[:5]]
            spans += [span_md(s, closest) + " (baseline)" for s in diff.get("baseline_span_ids", [])[:3]]
            lines.append(
                f"| {KIND_TEXT.get(diff['kind'], diff['kind'])} | {md_escape(subject_text(diff))} | {diff['calls']} "
                f"| {md_escape(diff.get('baseline'))} | {md_escape(diff.get('detail'))} | {', '.join(spans)} |"
            )
        if len(diffs) > MAX_LISTED:
            lines.append(f"\n{len(diffs) - MAX_LISTED} more difference(s) in the JSON answer.")
        lines.append("")
    return lines


def comparison_html(answer: dict, span_url: Callable[[str, str], str | None] | None = None) -> str:
    """An HTML fragment with the same content as ``comparison_markdown``."""
    e = html.escape
    run_id = answer["run"]["run_id"]

    def span_html(span: str, run: str = run_id) -> str:
        url = span_url(run, span) if span_url else None
        code = f"<code>{e(span)}</code>"
        return f"<a href='{e(url)}'>{code}</a>" if url else code

    parts = [f"<p>{e(baseline_sentence(answer))}.</p>", f"<p><b>{e(departure_sentence(answer))}</b></p>"]
    diffs = answer.get("differences") or []
    if answer["baseline"]["runs"] and not diffs:
        parts.append("<p>No differences per agent and tool.</p>")
    if diffs:
        closest = answer["baseline"].get("closest_run") or ""
        rows = []
        for diff in diffs[:MAX_LISTED]:
            spans = [span_html(s) for s in diff.get("span_ids", [])[:5]]
            spans += [span_html(s, closest) + " (baseline)" for s in diff.get("baseline_span_ids", [])[:3]]
            rows.append(
                f"<tr><td>{e(KIND_TEXT.get(diff['kind'], diff['kind']))}</td><td>{e(subject_text(diff))}</td>"
                f"<td>{diff['calls']}</td><td>{e(str(diff.get('baseline') or ''))}</td>"
                f"<td>{e(str(diff.get('detail') or ''))}</td><td>{' '.join(spans)}</td></tr>"
            )
        parts.append(
            "<table><tr><th>difference</th><th>agent · tool</th><th>calls</th><th>baseline</th>"
            "<th>detail</th><th>spans</th></tr>" + "".join(rows) + "</table>"
        )
    return "\n".join(parts)
