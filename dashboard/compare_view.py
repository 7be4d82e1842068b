"""The run explorer's "Compare with healthy runs" view (issue 35): the run beside its crew's
healthy runs (or a run the user picks), the first point of departure, the two waterfalls aligned
by step and the difference table.

URL: ``?run=R&compare=auto`` (the crew's healthy runs in the sidebar's window) or
``&compare=<run id>`` (that run side by side). The Overview links failing runs here.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analytics.types import Window
from dashboard import ui
from dashboard.compare_render import baseline_sentence, departure_sentence
from dashboard.datasource import SourceUnavailable
from dashboard.figures_compare import LEGEND, aligned_waterfalls_figure, difference_table, profile_table
from dashboard.filters import run_link

PARAM = "compare"
AUTO = "auto"


@st.cache_data(ttl=ui.CACHE_TTL, max_entries=32, show_spinner=False)
def cached_compare(key: str, version: str, run: str, baseline: str, window: Window) -> dict | None:
    """The comparison answer (None: the run or the chosen run has no spans)."""
    return ui.get_source(key).compare(run, baseline, window)


def comparison_toggle(run: str) -> bool:
    """The "Compare with healthy runs" switch, kept in the address (``?compare=``)."""
    on = st.toggle(
        "Compare with healthy runs",
        value=bool(st.query_params.get(PARAM)),
        key=f"compare_toggle_{run}",
        help="This run beside its crew's healthy runs (or a run you pick): what differs per agent "
        "and tool, and the first step where it departed from them.",
    )
    if on and not st.query_params.get(PARAM):
        st.query_params[PARAM] = AUTO
    elif not on:
        st.query_params.pop(PARAM, None)
    return on


def _pick_baseline(answer: dict, baseline: str) -> None:
    """Choose what to compare with: the crew's healthy runs or one of its other runs."""
    verdicts = {c["run_id"]: c.get("verdict") for c in answer.get("candidates") or []}
    options = [AUTO, *verdicts]
    if baseline not in options:
        options.append(baseline)
    chosen = st.selectbox(
        "Compare with",
        options,
        index=options.index(baseline),
        format_func=lambda r: (
            "the crew's healthy runs" if r == AUTO else f"run {r} ({verdicts.get(r) or 'chosen'})"
        ),
        key=f"compare_with_{answer['run']['run_id']}",
    )
    if chosen != baseline:
        st.query_params[PARAM] = chosen
        st.rerun()


def show_comparison(ctx: ui.PageContext, run: str) -> None:
    """The comparison of ``run`` with the baseline the address names."""
    baseline = st.query_params.get(PARAM) or AUTO
    try:
        answer = cached_compare(ctx.source_key, ctx.version, run, baseline, ctx.window)
    except (NotImplementedError, SourceUnavailable) as exc:  # a ClickHouse store; a collector away
        st.warning(str(exc))
        return
    if answer is None:
        st.info(f"No spans stored for run {run!r} or for run {baseline!r}; pick another run to compare with.")
        if baseline != AUTO and st.button("Compare with the crew's healthy runs", key="compare_reset"):
            st.query_params[PARAM] = AUTO
            st.rerun()
        return
    st.subheader("What differs from healthy runs" if baseline == AUTO else "Side by side")
    st.caption(
        f"Run {ui.md_escape(run)} of crew {ui.md_escape(answer['run']['service'])} "
        f"(verdict {ui.md_escape(answer['run'].get('verdict'))}): {ui.md_escape(baseline_sentence(answer))}. "
        f"Healthy runs are those of the sidebar's window ({ui.describe_scope(ctx)})."
    )
    _pick_baseline(answer, baseline)
    if answer["baseline"]["runs"] == 0:
        st.warning(
            f"{answer['baseline'].get('note', 'No baseline.')} Pick one of the crew's runs above to compare with."
        )
        return
    departure = answer.get("departure")
    if departure:
        link = run_link(run, span=departure["span_id"])
        st.error(f"{ui.md_escape(departure_sentence(answer))} [Open that span]({link})")
    else:
        st.success(departure_sentence(answer))
    left, right = st.columns([3, 2])
    with left:
        closest = answer["baseline"].get("closest_run")
        ui.plot(
            aligned_waterfalls_figure(pd.DataFrame(answer.get("alignment") or []), run, closest),
            key="aligned",
        )
        st.caption(LEGEND)
    with right:
        st.markdown("**Differences per agent and tool**")
        table = difference_table(answer)
        if table.empty:
            st.caption("None: every agent and tool is within the baseline's range.")
        else:
            st.dataframe(
                table,
                hide_index=True,
                key="compare_differences",
                column_config={
                    "span": st.column_config.LinkColumn(
                        "span", display_text=r"span=([^&]*)", help="Open the run explorer at this span"
                    )
                },
            )
    with st.expander("The baseline per agent and tool"):
        st.dataframe(profile_table(answer), hide_index=True, key="compare_profile")
