"""Loop detectors: repeated (exact and re-worded) calls, ping-pong delegation,
step-budget exhaustion and duplicate side effects."""

from __future__ import annotations

import functools
import logging

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics._evidence import EVIDENCE, THRESHOLD, TIMES
from analytics.code_actions import code_calls, declared_tool_names
from analytics.embeddings import embed_texts
from analytics.loop_similarity import could_link, task_similarity
from analytics.registry import register
from analytics.side_effects import HANDOFF_TOOL_PREFIX, current_side_effect_tools
from analytics.sql_loader import run_sql
from analytics.tasks import extract_task
from analytics.text_lists import as_text_lists
from analytics.thresholds import current_threshold
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

# A loop is the same (or a re-worded) call executed 3+ times (2 repeats); calls a guard refused
# did not execute, so they count towards a loop only when 3+ of them were refused (the agent
# hammering a guard). A retry after one failure, or one re-check, is normal. On the framework
# corpus (sample_traces/frameworks, 72 healthy runs) no healthy run has a repeat at 2, 3 or 4
# calls, and every injected retry loop is found at 3 and 4; 2 would add findings in 11 failure
# runs (two identical asks of a re-delegation, the two sends of a duplicate side effect) but
# flag every single retry after a transient error, which that corpus has no healthy example of.
MIN_REPEATS = 3
# A call is compared with at most this many calls before it in its (run, agent, tool) group
# (exact repeats are linked at any distance): loops are bursts of retries, and a window keeps the
# cost linear in the number of calls.
NEIGHBOUR_WINDOW = 4
# Ping-pong: 4+ alternating hand-offs (A -> B -> A -> B); a single return hand-off is normal.
# Inferred from agent turns (no delegate spans), 6+: a supervisor going back to the same worker
# for a second round is normal too.
MIN_PING_PONG_DELEGATIONS = 4
MIN_PING_PONG_INFERRED = 6
# A tool call whose arguments were not captured is matched on its error text, else on its result
# when that has this many distinct words: "ok", "sent" or {"status": "success"} are what different
# successful calls all return (repeated_calls.sql's header).
MIN_OUTPUT_WORDS = 5


def connected_components(n: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Component label (smallest member index) of each of ``n`` nodes joined by edges.

    Vectorised min-label propagation: each round pushes the smaller label across every edge.
    """
    labels = np.arange(n)
    if len(left) == 0:
        return labels
    while True:
        before = labels.copy()
        low = np.minimum(labels[left], labels[right])
        np.minimum.at(labels, left, low)
        np.minimum.at(labels, right, low)
        labels = labels[labels]
        if np.array_equal(labels, before):
            return labels


def component_labels(calls: pd.DataFrame) -> np.ndarray:
    """The linked component (a row position) of each of ``calls`` (each with the ``linked``
    call_idx list)."""
    n = len(calls)
    counts = calls["linked"].map(len).to_numpy(dtype=np.int64) if n else np.array([], np.int64)
    left = np.repeat(calls["call_idx"].to_numpy(dtype=np.int64), counts)
    right = np.concatenate([np.asarray(x, dtype=np.int64) for x in calls["linked"]]) if n else left
    # call_idx identifies a call (unordered and sparse): map it to its row position
    order = calls["call_idx"].to_numpy(dtype=np.int64)
    sorter = np.argsort(order, kind="stable")

    def position(idx: np.ndarray) -> np.ndarray:
        return sorter[np.searchsorted(order, idx, sorter=sorter)]

    return connected_components(n, position(left), position(right)) if n else np.array([], int)


def group_loops(calls: pd.DataFrame, min_repeats: int = MIN_REPEATS) -> pd.DataFrame:
    """Turn linked calls (each with the ``linked`` call_idx list) into one row per loop."""
    return loop_rows(calls, component_labels(calls), min_repeats)


def loop_rows(calls: pd.DataFrame, labels: np.ndarray, min_repeats: int = MIN_REPEATS) -> pd.DataFrame:
    """One row per loop of ``calls`` in components ``labels``: the components with
    ``min_repeats``+ executed (or refused) calls, in the detector's order."""
    n = len(calls)
    # a loop is one (run, agent, tool) group: split a component a 64-bit hash collision merged
    if n:
        keyed = calls[["run_id", "agent", "tool_name"]].assign(component=labels)
        labels = keyed.groupby(["component", "run_id", "agent", "tool_name"], sort=False).ngroup().to_numpy()
    calls = calls.assign(loop=labels)
    calls["rejected"] = calls["rejected"].astype(bool)
    calls["failing"] = calls["failing"].astype(bool)
    refused = calls.groupby("loop")["rejected"].transform("sum")
    executed = calls.groupby("loop")["rejected"].transform("size") - refused
    is_loop = (executed >= min_repeats) | (refused >= min_repeats)
    members = calls[is_loop].sort_values(["loop", "start_ns", "SpanId"])
    if members.empty:  # typed as a result with loops
        return pd.DataFrame({column: pd.Series(dtype=dtype) for column, dtype in _EMPTY_LOOP_TYPES.items()})
    grouped = members.groupby("loop", sort=False)
    out = pd.DataFrame(
        {
            "trace_id": grouped["TraceId"].first(),
            "span_ids": _member_lists(members["loop"].to_numpy(), members["SpanId"]),
            "run_id": grouped["run_id"].first(),
            "agent": grouped["agent"].first().replace({"": None}),
            "tool_name": grouped["tool_name"].first(),
            "call_type": grouped["source"].first(),
            "kind": np.where(grouped["norm_args"].nunique() == 1, "exact", "near_duplicate"),
            "matched_on": _matched_on(grouped),
            "failing": grouped["failing"].all(),
            "calls": grouped.size(),
            "failed": (grouped["failing"].sum() - grouped["rejected"].sum()).astype(int),
            "refused": grouped["rejected"].sum().astype(int),
            "distinct_arguments": grouped["norm_args"].nunique(),
            "min_similarity": grouped["min_similarity"].min().astype(float),
            "signature": _signature(grouped),
            "first_seen": grouped["Timestamp"].min(),
            "last_seen": grouped["Timestamp"].max(),
        }
    )
    return out.sort_values(["first_seen", "run_id", "tool_name"]).reset_index(drop=True)


def _matched_on(grouped) -> np.ndarray:
    """What a loop's calls matched on: 'arguments' (one normalized signature), 'similar
    arguments', or, for calls whose arguments were not captured, 'error' or 'output' (identical
    text only). A loop's calls share one basis (repeated_calls.sql links only within a basis)."""
    exact = np.where(grouped["norm_args"].nunique() == 1, "arguments", "similar arguments")
    if "basis" not in grouped.obj.columns:
        return exact
    basis = grouped["basis"].first().to_numpy(dtype=object)
    return np.where(basis == "arguments", exact, basis)


def _signature(grouped) -> pd.Series:
    """The normalized arguments of a loop's first call; its error or output text as recorded
    (200 characters at most) for a loop matched on those."""
    signature = grouped["norm_args"].first()
    if "basis" not in grouped.obj.columns:
        return signature
    text = grouped["args"].first().str.slice(0, 200)
    return signature.where(grouped["basis"].first() == "arguments", text)


# Member span ids are Arrow lists (a pandas ArrowDtype column), not Python lists, as a findings
# table gives them back (``analytics.materialize``); a loop's members are one slice of the sorted
# members' ids.
MEMBER_LISTS = pd.ArrowDtype(pa.list_(pa.string()))


def _member_lists(loops: np.ndarray, span_ids: pd.Series) -> pd.Series:
    """Per loop (``loops`` sorted, one label per member): its members' span ids (``MEMBER_LISTS``),
    in member order; indexed by loop label. What ``groupby(...).agg(list)`` gives, without a
    Python call per group (4,432 loops recomputed after one batch into a 100,000-call run took
    1.3 s that way, 440,200 at 10M a minute)."""
    starts = np.flatnonzero(np.r_[True, loops[1:] != loops[:-1]])
    values = pa.array(span_ids, from_pandas=True)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    lists = pa.ListArray.from_arrays(
        pa.array(np.r_[starts, len(loops)], type=pa.int32()), values.cast(pa.string())
    )
    return pd.Series(lists, index=pd.Index(loops[starts], name="loop"), dtype=MEMBER_LISTS)


# The types a full computation gives each column (loop_rows when no call repeats returns them).
_EMPTY_LOOP_TYPES = {
    "trace_id": "str", "span_ids": pd.ArrowDtype(pa.list_(pa.string())), "run_id": "str", "agent": "str",
    "tool_name": "str", "call_type": "str", "kind": "str", "matched_on": "str", "failing": "bool", "calls": "int64",
    "failed": "int64", "refused": "int64", "distinct_arguments": "int64", "min_similarity": "float64",
    "signature": "str", "first_seen": "datetime64[us]", "last_seen": "datetime64[us]",
}  # fmt: skip


@functools.lru_cache(maxsize=65536)
def _task_of(text: str) -> str:
    return extract_task(text) or ""


@functools.lru_cache(maxsize=16384)
def _code_calls_of(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(code_calls(text))


def linked_calls(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    similarity: float,
    neighbour_window: int = NEIGHBOUR_WINDOW,
    min_calls: int = MIN_REPEATS,
    groups: dict | None = None,
    all_calls: bool = False,
) -> pd.DataFrame:
    """Calls of (run, agent, tool) groups linked to another call of their group (repeated_calls.sql).
    ``groups`` (``group_params``): only those (run, tool) groups and every group of its whole runs;
    ``all_calls``: every call of every group, linked or not (``analytics.loops_fold``'s state).

    Agent invocations are compared on their task statements, extracted here from the inputs of
    agent spans invoked ``min_calls``+ times in a run; code actions are parsed here from the
    LLM outputs holding code (``analytics.code_actions``).
    """
    inputs = run_sql(conn, "loop_agent_inputs", window, filters, min_calls=min_calls)["input_text"].tolist()
    outputs = run_sql(conn, "loop_code_outputs", window, filters)["output_text"].tolist()
    found = [(output, name, args) for output in outputs for name, args in _code_calls_of(output)]
    declared = _declared_tools(conn, window, filters) if found else set()
    return run_sql(
        conn,
        "repeated_calls",
        window,
        filters,
        similarity=similarity,
        neighbours=neighbour_window,
        min_calls=min_calls,
        min_output_words=MIN_OUTPUT_WORDS,
        agent_inputs=inputs,
        agent_tasks=[_task_of(text) for text in inputs],
        code_outputs=[output for output, _, _ in found],
        code_tools=[name for _, name, _ in found],
        code_args=[args for _, _, args in found],
        declared_runs=[run for run, _, _ in declared],
        declared_agents=[agent for _, agent, _ in declared],
        declared_tools=[tool for _, _, tool in declared],
        all_calls=all_calls,
        **(groups or _ALL_GROUPS),
    )


# repeated_calls.sql's internal group limit, unset (every group).
_ALL_GROUPS = {"loop_runs": None, "group_runs": [], "group_tools": [], "loop_whole_runs": []}


def group_params(pairs: list[tuple[str, str]], whole_runs: list[str]) -> dict:
    """repeated_calls.sql's group limit: the (run, tool) ``pairs`` and every group of ``whole_runs``."""
    ordered = sorted(set(pairs))
    return {
        "loop_runs": sorted({run for run, _ in ordered} | set(whole_runs)),
        "group_runs": [run for run, _ in ordered],
        "group_tools": [tool for _, tool in ordered],
        "loop_whole_runs": sorted(set(whole_runs)),
    }


def _declared_tools(
    conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters
) -> set[tuple[str, str, str]]:
    """(run, agent, tool) of every tool an agent declares (loop_declared_tools.sql) in the runs
    whose LLM outputs hold code."""
    rows = run_sql(conn, "loop_declared_tools", window, filters)
    return {
        (run, agent, name)
        for run, agent, values in zip(rows["run_id"], rows["agent"], rows["declared"], strict=True)
        for value in values
        for name in declared_tool_names(value)
    }


def _with_threshold(out: pd.DataFrame, info) -> pd.DataFrame:
    """``out`` with the similarity threshold it was computed at."""
    out = out.copy(deep=False)  # copy-on-write: the new columns are this frame's own
    out["threshold"] = info.value
    out["threshold_version"] = info.version
    out["calibrated"] = info.calibrated
    return out


def link_tasks(
    conn: duckdb.DuckDBPyConnection,
    calls: pd.DataFrame,
    threshold: float,
    neighbour_window: int = NEIGHBOUR_WINDOW,
    min_calls: int = MIN_REPEATS,
) -> pd.DataFrame:
    """Link re-worded delegations and agent invocations of ``calls`` (linked_calls' rows), see
    ``task_links``; the calls that stay unlinked are dropped."""
    if calls.empty:
        return calls
    linked = task_links(conn, calls, threshold, neighbour_window, min_calls)
    if linked is calls and not calls["source"].isin(["agent", "delegation"]).any():
        return calls
    return linked[linked["linked"].map(len) > 0].reset_index(drop=True)


def task_links(
    conn: duckdb.DuckDBPyConnection,
    calls: pd.DataFrame,
    threshold: float,
    neighbour_window: int = NEIGHBOUR_WINDOW,
    min_calls: int = MIN_REPEATS,
) -> pd.DataFrame:
    """``calls`` (linked_calls' rows) with re-worded delegations and agent invocations linked.

    Within each (run, agent, invoked agent) group with ``min_calls``+ calls, a call is compared
    with the ``neighbour_window`` calls before it that have another signature, on
    ``analytics.loop_similarity.task_similarity`` of their task statements (the embedding cosine
    times the overlap of their numbers and names); pairs at ``threshold`` or above are linked.
    Vectors come from the embeddings cache (the embedding worker stores those of the task
    statements it scores) or are encoded here; nothing is written. Every call is returned (the
    same frame when no link was added).
    """
    if calls.empty:
        return calls
    handoff = calls["source"].isin(["agent", "delegation"]).to_numpy()
    if not handoff.any():
        return calls
    sub = calls.loc[
        handoff, ["run_id", "agent", "tool_name", "start_ns", "SpanId", "call_idx", "args", "norm_args"]
    ]
    sub = sub.sort_values(["run_id", "agent", "tool_name", "start_ns", "SpanId"]).reset_index(drop=True)
    group = sub.groupby(["run_id", "agent", "tool_name"], sort=False, dropna=False)
    key = group.ngroup().to_numpy()
    keep = (
        (group["call_idx"].transform("size") >= min_calls) & (group["norm_args"].transform("nunique") > 1)
    ).to_numpy()
    sigs, args, idx = sub["norm_args"].to_numpy(), sub["args"].to_numpy(), sub["call_idx"].to_numpy()
    later, earlier = [], []
    for lag in range(1, neighbour_window + 1):  # each call with the calls up to the window before it
        i = np.arange(lag, len(sub))
        j = i - lag
        ok = keep[i] & (key[i] == key[j]) & (sigs[i] != sigs[j])
        later.append(i[ok])
        earlier.append(j[ok])
    i, j = np.concatenate(later), np.concatenate(earlier)
    if not len(i):
        return calls
    # each distinct pair of task statements is scored once; only pairs whose specifics allow a
    # link are embedded (the score is at most their overlap)
    pairs = pd.DataFrame({"first": args[i], "second": args[j]})
    distinct = pairs.drop_duplicates(ignore_index=True)
    possible = [
        could_link(a, b, threshold) for a, b in zip(distinct["first"], distinct["second"], strict=True)
    ]
    wanted = distinct[possible]
    texts = list(dict.fromkeys([*wanted["first"], *wanted["second"]]))
    vectors = dict(zip(texts, embed_texts(texts, conn), strict=True)) if texts else {}
    distinct["score"] = [
        task_similarity(a, b, float(np.dot(vectors[a], vectors[b]))) if ok else 0.0
        for a, b, ok in zip(distinct["first"], distinct["second"], possible, strict=True)
    ]
    score = pairs.merge(distinct, on=["first", "second"], how="left")["score"].to_numpy()
    linked = score >= threshold
    left = np.concatenate([idx[i][linked], idx[j][linked]])
    right = np.concatenate([idx[j][linked], idx[i][linked]])
    scores = np.concatenate([score[linked], score[linked]])
    if len(left):
        extra = pd.DataFrame({"call_idx": left, "other": right, "score": scores}).groupby("call_idx")
        others, lowest = extra["other"].agg(list), extra["score"].min()
        calls = calls.copy()
        calls["linked"] = [
            list(current) + others.get(call, [])
            for call, current in zip(calls["call_idx"], calls["linked"], strict=True)
        ]
        calls["min_similarity"] = np.fmin(
            calls["min_similarity"].astype(float), calls["call_idx"].map(lowest).astype(float)
        )
    return calls


def drop_bounced(loops: pd.DataFrame, bounces: pd.DataFrame) -> pd.DataFrame:
    """``loops`` without the loops of hand-offs that a ping-pong of their run already reports: a
    loop of delegations or invocations of one of the ping-pong's agents by the other, by the
    manager they bounce through or by no agent (the framework's runner at the top), or of the
    hand-off tool ``transfer_to_<agent>`` to one of them, in its time span: the task bounced back
    and handed on again is one failure, the ping-pong."""
    handoffs = loops["call_type"].isin(["agent", "delegation"]) | (
        (loops["call_type"] == "tool") & loops["tool_name"].str.startswith(HANDOFF_TOOL_PREFIX)
    )
    if bounces.empty or not handoffs.any():
        return loops
    matched = (
        loops[handoffs]
        .reset_index()
        .merge(
            bounces[["run_id", "agents", "via", "first_seen", "last_seen"]],
            on="run_id",
            suffixes=("", "_bounce"),
        )
    )
    if matched.empty:
        return loops
    between = np.array(
        [
            tool.removeprefix(HANDOFF_TOOL_PREFIX) in set(agents)
            # no caller: None, or NaN where a findings table's NULL came back so
            and (caller is None or caller != caller or caller in set(agents) or caller == via)
            for tool, caller, agents, via in zip(
                matched["tool_name"], matched["agent"], matched["agents"], matched["via"], strict=True
            )
        ],
        dtype=bool,
    )
    overlap = (matched["first_seen"] <= matched["last_seen_bounce"]) & (
        matched["last_seen"] >= matched["first_seen_bounce"]
    )
    return loops.drop(index=matched.loc[overlap & between, "index"].unique()).reset_index(drop=True)


@register(
    "repeated_calls",
    description="Loops of repeated calls (tool calls, delegations, agent invocations, code actions): "
    "identical or re-worded arguments, whatever their outcome; calls whose arguments were not captured: "
    "identical errors or outputs.",
    columns={
        **EVIDENCE,
        "agent": "agent that repeated the call (for agent invocations: the caller, None at the top)",
        "tool_name": "tool called (the invoked agent for delegations and agent invocations)",
        "call_type": "'tool' (tool span), 'delegation' (driftscope delegate span), 'agent' (agent span "
        "invoked with a task) or 'code' (a call in a code block of an LLM output)",
        "kind": "'exact' (one normalized signature) or 'near_duplicate' (similar arguments)",
        "matched_on": "what the calls matched on: 'arguments' (identical normalized arguments), 'similar "
        "arguments', or, for tool calls whose arguments were not captured, 'error' (the same error "
        "text: error.type and status message) or 'output' (the same result of 5+ distinct words)",
        "failing": "True when every call in the loop failed (error, rejected or status Error)",
        "calls": "number of calls in the loop (executed and refused)",
        "failed": "executed calls of the loop that failed (error or status Error)",
        "refused": "calls of the loop a guard refused (did not execute)",
        "distinct_arguments": "distinct normalized argument strings in the loop",
        "min_similarity": "lowest similarity of a link between members (token-set Jaccard of stemmed "
        "argument words, stop words dropped; for delegations and agent invocations the task similarity: "
        "embedding cosine x share of numbers and names both task statements name; 1 for identical "
        "arguments), 0..1",
        "signature": "normalized arguments of the first call: its argument words, lower case, sorted "
        "(matched on an error or output: that text, 200 characters at most)",
        **TIMES,
        **THRESHOLD,
    },
    row="one loop (repeated calls of one tool or agent by one agent in one run)",
    failure_mode="step repetition: the agent retries the same call without progress",
    mast_category="specification issues",
    title="repeated tool calls (loop)",
    findings=True,
    needs=(
        "tool calls (`gen_ai.tool.name`, or the span name) one agent repeats with the same or near-"
        "same arguments within a run (without arguments: the same error or result)"
    ),
    counted=True,
    failing=True,
    rank_column="calls",
    page="loops",
    kept="run_id",
    order=[("first_seen", False), ("run_id", False), ("tool_name", False)],  # fmt: skip
    version=2,  # 2: matched_on; calls without arguments matched on errors/outputs
)
def repeated_calls(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Exact and re-worded repeated calls, each loop reported once with its members.

    A call is linked to identical calls of its group and to similar calls among the
    ``NEIGHBOUR_WINDOW`` before it; loops are the linked components with ``MIN_REPEATS``+ calls.
    """
    info = current_threshold(conn, "near_duplicate_similarity")
    tasks = current_threshold(conn, "near_duplicate_task_similarity")
    out = group_loops(link_tasks(conn, linked_calls(conn, window, filters, info.value), tasks.value))
    return _with_threshold(drop_bounced(out, ping_pong(conn, window, filters)), info)


@register(
    "ping_pong",
    description="Delegations bouncing between the same two agents (A -> B -> A -> B ...).",
    columns={
        **EVIDENCE,
        "agents": "the two agents",
        "delegations": "consecutive hand-offs in the cycle",
        "round_trips": "delegations // 2",
        "source": "'driftscope' (delegate spans), 'nested' (an agent span inside a span of another "
        "agent) or 'inferred' (changes of agent between agent turns)",
        "via": "the manager both agents hand the task back to (a bounce through a manager: it "
        "alternates between the two, re-sending each a task it already had), None for a direct bounce",
        **TIMES,
    },
    row="one ping-pong cycle in one run",
    failure_mode="delegation loop without progress",
    mast_category="inter-agent misalignment",
    title="ping-pong between agents",
    findings=True,
    needs=(
        "delegations (`driftscope.delegate.to`, or a framework's handoffs) that bounce between the "
        "same agents"
    ),
    counted=True,
    failing=True,
    page="loops",
    kept="run_id",
    order=[("first_seen", False)],  # fmt: skip
)
def ping_pong(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Maximal alternating hand-off sequences (4+ delegations, or 6+ inferred agent turns), direct
    (A -> B -> A -> B) or through a manager (M -> A, M -> B, M -> A, M -> B with repeated tasks)."""
    return run_sql(
        conn,
        "ping_pong",
        window,
        filters,
        min_delegations=MIN_PING_PONG_DELEGATIONS,
        min_inferred=MIN_PING_PONG_INFERRED,
    )


@register(
    "budget_exhaustion",
    description="Agents that reached their step budget or were refused a step for budget.",
    columns={
        **EVIDENCE,
        "agent": "agent that exhausted its budget",
        "max_step": "highest driftscope.step reached",
        "budget_max_steps": "step budget in force (driftscope.budget.max_steps)",
        "budget_rejections": "steps refused with reject_reason = step_budget",
        **TIMES,
    },
    row="one agent in one run that hit its step budget",
    failure_mode="unaware of termination conditions",
    mast_category="specification issues",
    title="step budget exhausted",
    findings=True,
    needs="step budgets: `driftscope.budget.max_steps` and `driftscope.step` on an agent's calls",
    counted=True,
    page="loops",
    kept="run_id",
    order=[("first_seen", False)],  # fmt: skip
)
def budget_exhaustion(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Runs whose agents hit their step budget."""
    return run_sql(conn, "budget_exhaustion", window, filters)


@register(
    "duplicate_side_effects",
    description="Side effects executed more than once in a run (same idempotency key or arguments).",
    columns={
        **EVIDENCE,
        "agents": "agents that executed it",
        "tool_name": "side-effecting tool",
        "matched_by": "'idempotency_key' or 'arguments'",
        "idempotency_key": "shared idempotency key (matched_by = idempotency_key)",
        "arguments": "normalized arguments (matched_by = arguments)",
        "executions": "times it was executed",
        **TIMES,
    },
    row="one repeated side effect in one run",
    failure_mode="duplicate side effect (double send / double charge)",
    mast_category="task verification",
    title="duplicate side effect",
    findings=True,
    needs=(
        "side-effecting calls (`driftscope.side_effect`, or tools named in --side-effect-tools) "
        "executed twice with the same arguments or `driftscope.idempotency_key`"
    ),
    counted=True,
    failing=True,
    page="loops",
    kept="run_id",
    order=[
        ("first_seen", False),
        ("run_id", False),
        ("matched_by", True),
        ("tool_name", False),
        ("idempotency_key", False),
        ("arguments", False),
    ],  # fmt: skip
)
def duplicate_side_effects(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Side effects executed twice or more, by key or by identical normalized arguments.

    A span without ``driftscope.side_effect`` is a side effect when its tool name matches the
    side-effect tool pattern in force (``analytics.side_effects``). Its lists are Arrow lists
    (``analytics.text_lists``: a stored result is read back without a Python object per row).
    """
    found = run_sql(conn, "duplicate_side_effects", window, filters, **current_side_effect_tools().params())
    return as_text_lists(found, ("span_ids", "agents"))
