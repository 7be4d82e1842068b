"""Constraints: per origin task, which constraint each hop carried, waived or lost, and who dropped it."""

import streamlit as st

from dashboard import ui
from dashboard.figures import constraint_heatmap_figure
from dashboard.report import constraint_texts, mentioning


@st.cache_data(ttl=ui.CACHE_TTL, max_entries=64, show_spinner=False)
def cached_constraint_texts(key: str, version: str, run: str, ids: tuple[str, ...]) -> dict[str, str]:
    """The text of each constraint id as the run's spans state it (the ledger a guard carried, or a
    free-text context): the spans that mention an id only."""
    spans = ui.get_source(key).run_spans(run, containing=mentioning(set(ids)))
    return constraint_texts(spans, set(ids))


def texts_of(ctx: ui.PageContext, frame) -> dict[tuple[str, str], str]:
    """(run, constraint id) -> its text, for the runs of ``frame`` (up to a page's worth of runs)."""
    found = {}
    for run, rows in list(frame.groupby("run_id"))[: ui.PAGE_ROWS]:
        ids = tuple(sorted(rows["constraint_id"].dropna().astype(str).unique()))
        for cid, text in cached_constraint_texts(ctx.source_key, ctx.version, str(run), ids).items():
            found[(str(run), cid)] = text
    return found


ctx = ui.page_context()
st.title("Constraints along delegation chains")
st.caption(
    "Each delegation hop should carry every constraint of the origin task verbatim, or waive it with a reason."
)

# The columns the task picker, heatmap and waivers show (not the ledger's evidence lists).
LEDGER_COLUMNS = (
    "origin_task_id",
    "constraint_id",
    "hop",
    "status",
    "waiver_reason",
    "agents",
    "delegate_to",
    "run_id",
)
ledger = ui.load_metric(ctx, "constraint_ledger", LEDGER_COLUMNS)
drops = ui.load_metric(ctx, "constraint_drops")
if ledger is not None:
    tasks = sorted(ledger["origin_task_id"].dropna().unique())
    if not tasks:
        ui.empty_state("delegations with a constraint ledger")
    else:
        dropped = set(drops["origin_task_id"]) if drops is not None and not drops.empty else set()
        if len(tasks) > ui.PAGE_ROWS:  # offer the tasks with drops first, then the others, up to a page
            st.caption(
                f"{len(tasks):,} origin tasks; the picker offers {ui.PAGE_ROWS} (those with drops first)."
            )
            tasks = sorted(
                ([t for t in tasks if t in dropped] + [t for t in tasks if t not in dropped])[: ui.PAGE_ROWS]
            )
        default = next((i for i, t in enumerate(tasks) if t in dropped), 0)
        task = st.selectbox("Origin task", tasks, index=default, key="origin_task")
        ui.plot(constraint_heatmap_figure(ledger, task), key="heatmap")
        of_task = ledger[ledger["origin_task_id"] == task]
        texts = texts_of(ctx, of_task)
        st.subheader("The task's constraints")
        listed = of_task.drop_duplicates("constraint_id").sort_values("constraint_id")
        ui.table(
            listed.assign(
                constraint_text=[
                    texts.get((str(r), str(c)), "")
                    for r, c in zip(listed["run_id"], listed["constraint_id"], strict=True)
                ]
            )[["constraint_id", "constraint_text"]],
            key="task_constraints",
        )
        waivers = of_task[of_task["status"] == "waived"]
        st.subheader("Waivers")
        if waivers.empty:
            st.caption("No constraint of this task was waived.")
        else:
            ui.table(
                waivers[["constraint_id", "hop", "waiver_reason", "agents", "delegate_to"]], key="waivers"
            )
st.subheader("Dropped constraints (hop and agent that dropped each)")
if drops is not None and not drops.empty:
    dropped_texts = texts_of(ctx, drops)
    position = list(drops.columns).index("constraint_id") + 1
    drops = drops.copy()
    drops.insert(
        position,
        "constraint_text",
        [
            dropped_texts.get((str(r), str(c)), "")
            for r, c in zip(drops["run_id"], drops["constraint_id"], strict=True)
        ],
    )
ui.findings_table(drops, "dropped constraints", ui.described(ctx, "constraint_drops"))
