"""Loop detectors: repeated (exact and re-worded) calls, ping-pong delegation,
step-budget exhaustion and duplicate side effects."""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Iterator

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

import analytics.loop_groups as loop_groups
from analytics._evidence import EVIDENCE, THRESHOLD, TIMES
from analytics.code_actions import code_calls, declared_tool_names
from analytics.data_version import Scope, Version
from analytics.embeddings import embed_texts
from analytics.kept import kept_result, kept_version, merge_rows, refines, stats
from analytics.loop_groups import connected_components
from analytics.loop_similarity import task_similarity
from analytics.registry import register
from analytics.side_effects import HANDOFF_TOOL_PREFIX, current_side_effect_tools
from analytics.sql_loader import run_scope, run_sql
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
    if members.empty:  # typed as a full computation's empty result (a kept result can become it)
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
    text only). A loop's calls share one basis (repeated_calls.sql links only within a basis); the
    kept groups' members (analytics.loop_groups) carry none: they are all matched on arguments."""
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


# Member span ids are Arrow lists (a pandas ArrowDtype column), not Python lists: a stored result
# is read back without a Python string per member (715k at 1M spans of 100,000-call runs, most of
# a cold read's time), and a loop's members are one slice of the sorted members' ids.
MEMBER_LISTS = pd.ArrowDtype(pa.list_(pa.string()))


def _as_member_lists(lists: list[list[str]]) -> pd.Series:
    """Python lists of span ids as a ``MEMBER_LISTS`` column."""
    return pd.Series(pa.array(lists, type=MEMBER_LISTS.pyarrow_dtype), dtype=MEMBER_LISTS)


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


_LOOP_COLUMNS = [
    "trace_id", "span_ids", "run_id", "agent", "tool_name", "call_type", "kind", "matched_on", "failing",
    "calls", "failed", "refused", "distinct_arguments", "min_similarity", "signature", "first_seen", "last_seen",
]  # fmt: skip
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
) -> pd.DataFrame:
    """Calls of (run, agent, tool) groups linked to another call of their group (repeated_calls.sql).

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
        **(_group_limit.get() or _NO_LIMIT),
    )


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


# Internal (update_repeated_calls): while set, repeated_calls computes only these (run, tool)
# groups ($loop_runs / $loop_tools pairs), every group of $loop_whole_runs and the calls of the
# kept groups ($loop_tail_*) from their cut on; with $all_calls, every candidate call.
_group_limit: contextvars.ContextVar[dict | None] = contextvars.ContextVar("loop_group_limit", default=None)
# The tails are empty lists, not NULL: ClickHouse cannot bind a NULL array parameter (no group
# is read from a cut either way).
_NO_LIMIT = {
    "loop_runs": None, "loop_tools": None, "loop_whole_runs": None, "loop_tail_runs": [],
    "loop_tail_agents": [], "loop_tail_tools": [], "loop_tail_ns": [], "loop_tail_spans": [],
    "all_calls": False,
}  # fmt: skip


@contextlib.contextmanager
def _groups_only(
    pairs: set[tuple[str, str]],
    whole_runs: set[str],
    tails: dict[tuple[str, str, str], tuple[int, str]] | None = None,
    all_calls: bool = False,
) -> Iterator[None]:
    ordered = sorted(pairs)
    cut = sorted((tails or {}).items())  # (run, agent, tool) -> the group's cut
    token = _group_limit.set(
        {
            "loop_runs": [run for run, _ in ordered],
            "loop_tools": [tool for _, tool in ordered],
            "loop_whole_runs": sorted(whole_runs),
            "loop_tail_runs": [run for (run, _, _), _ in cut],
            "loop_tail_agents": [agent for (_, agent, _), _ in cut],
            "loop_tail_tools": [tool for (_, _, tool), _ in cut],
            "loop_tail_ns": [ns for _, (ns, _) in cut],
            "loop_tail_spans": [span for _, (_, span) in cut],
            "all_calls": all_calls,
        }
    )
    try:
        yield
    finally:
        _group_limit.reset(token)


class _RunBounces:
    """The ping-pongs of ``runs`` (``ping_pong`` under the caller's run scope of those runs),
    computed once, when first asked for: the rows of ping_pong's own kept result, brought up to
    date, when this process keeps one for the scope at data version ``since`` or later (serve and
    a dashboard keep both detectors up to date after a batch: the touched runs' ping-pongs are
    then computed once, not once for each; an older one could have more runs to bring up to date
    than the caller's); else computed for those runs alone."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        window: Window,
        filters: Filters,
        runs: set[str],
        since: Version | None = None,
    ) -> None:
        self._args = (conn, window, filters)
        self._runs = runs
        self._since = since
        self._frame: pd.DataFrame | None = None
        self._keys: dict[str, tuple] | None = None

    def frame(self) -> pd.DataFrame:
        if self._frame is None:
            conn, window, filters = self._args
            if _no_older(kept_version(conn, "ping_pong", window, filters), self._since):
                with run_scope():  # its result is of every run: out of the caller's run scope
                    every = kept_result(conn, "ping_pong", ping_pong, window, filters)
                self._frame = every[every["run_id"].isin(self._runs)].reset_index(drop=True)
                stats["ping_pong_kept"] += 1
            else:
                self._frame = ping_pong(*self._args)
        return self._frame

    def key(self, run: str) -> tuple:
        """What ``drop_bounced`` reads of ``run``'s ping-pongs, comparable across batches."""
        if self._keys is None:
            frame = self.frame()
            self._keys = {}
            for row in zip(
                frame["run_id"],
                frame["agents"],
                frame["via"],
                frame["first_seen"],
                frame["last_seen"],
                strict=True,
            ):
                self._keys.setdefault(row[0], []).append((tuple(row[1]), row[2], row[3], row[4]))
            self._keys = {name: tuple(sorted(rows, key=repr)) for name, rows in self._keys.items()}
        return self._keys.get(run, ())


def _no_older(version: Version | None, than: Version | None) -> bool:
    """Whether ``version`` is of at least the spans of ``than`` (both known)."""
    if version is None or than is None:
        return False
    if than.newest is not None and (version.newest is None or version.newest < than.newest):
        return False
    return version.spans >= than.spans


def _handoff_rows(frame: pd.DataFrame) -> pd.Series:
    """Loops a ping-pong can drop (``drop_bounced``): of delegations, agent invocations or
    hand-off tools."""
    return frame["call_type"].isin(["agent", "delegation"]) | frame["tool_name"].fillna("").str.startswith(
        HANDOFF_TOOL_PREFIX
    )


def _in_groups(frame: pd.DataFrame, pairs: set[tuple[str, str]], whole_runs: set[str]) -> np.ndarray:
    """Rows of ``frame`` in one of the (run, tool) ``pairs`` or in one of ``whole_runs``."""
    found = np.zeros(len(frame), dtype=bool)
    if frame.empty:
        return found
    at = np.flatnonzero(frame["run_id"].isin({run for run, _ in pairs} | set(whole_runs)).to_numpy())
    if len(at):  # the rows of those runs only (a few of a large result), a run at a time
        runs, tools = frame["run_id"].take(at), frame["tool_name"].take(at)
        hit = runs.isin(set(whole_runs)).to_numpy(dtype=bool, na_value=False).copy()
        names: dict[str, set[str]] = {}
        for run, tool in pairs:
            names.setdefault(run, set()).add(tool)
        for run, tools_of_run in names.items():
            if run not in whole_runs:
                hit |= ((runs == run) & tools.isin(tools_of_run)).to_numpy(dtype=bool, na_value=False)
        found[at] = hit
    return found


@refines("repeated_calls")
def update_repeated_calls(
    conn: duckdb.DuckDBPyConnection,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    window: Window,
    filters: Filters,
    old: pd.DataFrame,
    traces: set[str],
    scope: Scope,
) -> pd.DataFrame | None:
    """``old`` (repeated_calls kept before spans of ``traces`` came) brought up to date by
    recomputing only the groups those spans may have changed, not their whole runs (a run of
    100,000 calls after a batch of a few hundred), and, for groups of tool calls kept since the
    previous batch, by comparing only their new calls with each group's tail; None when that
    cannot be told (the caller then recomputes the touched runs whole).

    A loop is one (run, agent, tool) group's linked calls, so a group none of whose calls changed
    keeps its loops, unless a call elsewhere in its run changes which calls it holds or how they
    are argued: a hand-off back removes delegations both ways, a new agent invocation or
    delegation can make earlier ones candidates and removes code calls of that name, a tool call
    removes code calls of its name, and a new ping-pong can drop hand-off loops. So recomputed are
    the (run, tool) groups (every agent) of the names the touched spans carry
    (``loop_touched_groups.sql``), those of kept loops with a member among them, every hand-off
    group of their runs, and whole runs where they hold code in an LLM output.

    Of those, a (run, tool) group of tool calls only, or of delegations only that carry their own
    arguments (``analytics.loop_groups``), that was computed here before, for all time and no
    filters, is kept with its calls and components: then only its calls from the earliest of its
    (run, agent, tool) groups' last ``NEIGHBOUR_WINDOW`` calls on are read (delegations linked on
    their task similarity there), and its new calls join the components they link to. A kept
    group whose calls changed otherwise (an earlier call arrived late, a call moved to another
    agent or run, a call of another kind came, a hand-off back emptied it) is recomputed whole,
    and so are a run's kept delegation groups when its ping-pongs changed (they drop hand-off
    loops without a call of the group). Equal to a full recomputation
    (tests/analytics/test_kept.py and test_loops_incremental.py, after every random batch).
    """
    state, seen_until, late, bounced = _take_state(old, window, filters)
    (newest,) = conn.execute("SELECT max(ingested_at) FROM spans").fetchone()
    span_ids = conn.execute(
        "SELECT SpanId FROM spans WHERE TraceId = ANY($traces::VARCHAR[])", {"traces": sorted(traces)}
    ).fetchnumpy()["SpanId"]
    in_runs = old[old["run_id"].isin(scope.runs)]
    members = in_runs["span_ids"].explode()
    with_member = in_runs.loc[members[members.isin(span_ids)].index.unique()]
    old_runs = set(with_member["run_id"])
    if not old_runs.issubset(scope.runs):
        return None
    found = run_sql(
        conn,
        "loop_touched_groups",
        Window(),
        Filters(),
        traces=sorted(traces),
        old_runs=sorted(old_runs),
        runs_since=scope.since,
        handoff_prefix=HANDOFF_TOOL_PREFIX,
    )
    runs = set(found["run_id"]) | old_runs
    if not runs:
        _keep_state(old, state, seen_until, late, bounced)
        return old
    if not runs.issubset(scope.runs):
        return None
    whole = set(found.loc[found["kind"] == "code", "run_id"])
    named = found[found["kind"] != "code"]
    pairs = set(zip(named["run_id"], named["tool"], strict=True))
    pairs |= set(zip(with_member["run_id"], with_member["tool_name"], strict=True))
    handoffs = in_runs[in_runs["run_id"].isin(runs) & _handoff_rows(in_runs)]
    pairs |= set(zip(handoffs["run_id"], handoffs["tool_name"], strict=True))
    firsts = [scope.first_seen.get(run) for run in runs]
    since = None if None in firsts else min(firsts)
    keeping = state is not None
    tails = set()
    if keeping:
        tails = {key for key in pairs if key in state and key[0] not in whole}
        found_late = _late_pairs(conn, traces, seen_until, state, tails)
        stats["loop_groups_recomputed"] += len(found_late)
        tails -= found_late
        late |= found_late
    pairs -= tails
    info = current_threshold(conn, "near_duplicate_similarity")
    tasks = current_threshold(conn, "near_duplicate_task_similarity")
    fresh_parts: list[pd.DataFrame] = []
    dropped: list[pd.Index] = []
    with run_scope(runs=sorted(runs), runs_since=since):
        bounces = _RunBounces(
            conn, window, filters, runs, kept_version(conn, "repeated_calls", window, filters)
        )
        if keeping:
            # a kept delegation group's loops stand while its run's ping-pongs do (a ping-pong
            # drops hand-off loops without a call of the group): otherwise they are recomputed
            moved = {
                key
                for key, pair in state.items()
                if pair.kind == "delegation" and key[0] in runs and bounces.key(key[0]) != bounced.get(key[0])
            }
            for key in moved:
                del state[key]
            stats["loop_groups_recomputed"] += len(moved & tails)
            tails -= moved
            pairs |= moved
        cuts = {
            (run, agent, tool): cut for (run, tool) in tails for agent, cut in state[run, tool].cuts().items()
        }
        # every candidate call only where groups are kept from them
        building = keeping and bool(tails or whole or pairs - late)
        with _groups_only(pairs, whole, cuts, all_calls=building):
            rows = linked_calls(conn, window, filters, info.value)
        if tails:
            at_tail = _in_groups(rows, tails, set())
            tail_rows = task_links(conn, rows[at_tail].reset_index(drop=True), tasks.value)
            failed = _append_to_kept(state, tails, tail_rows, old, fresh_parts, dropped)
            rows = rows[~at_tail]
            if failed:  # recomputed whole, read again with the others (call_idx is per read)
                pairs |= failed
                with _groups_only(pairs, whole, None, all_calls=True):
                    rows = linked_calls(conn, window, filters, info.value)
        if keeping:
            rows = task_links(conn, rows.reset_index(drop=True), tasks.value)
            _keep_pairs(state, rows if building else rows.iloc[0:0], pairs, whole, late)
            for run in {run for (run, _), pair in state.items() if pair.kind == "delegation" and run in runs}:
                bounced[run] = bounces.key(run)  # the ping-pongs its kept delegation groups stand on
            out = group_loops(rows[rows["linked"].map(len) > 0].reset_index(drop=True))
        else:
            out = group_loops(link_tasks(conn, rows.reset_index(drop=True), tasks.value))
        if _handoff_rows(out).any():
            out = drop_bounced(out, bounces.frame())
        fresh_parts = [
            drop_bounced(part, bounces.frame()) if _handoff_rows(part).any() else part for part in fresh_parts
        ]
    frames = [_with_threshold(out, info)[_in_groups(out, pairs, whole)]]
    frames += [_with_threshold(part, info) for part in fresh_parts]
    filled = [frame for frame in frames if not frame.empty]
    if len(filled) > 1:  # both sides sorted (merge_rows): the rows of changed kept groups come in
        fresh = pd.concat(filled, ignore_index=True)
        fresh = fresh.sort_values(["first_seen", "run_id", "tool_name"], kind="stable", ignore_index=True)
    else:
        fresh = filled[0] if filled else frames[0]
    keep = ~_in_groups(old, pairs, whole)
    if dropped:
        keep &= ~old.index.isin(dropped[0].append(dropped[1:]))
    result = _agent_as_computed(merge_rows(old, keep, fresh, "repeated_calls"))
    if keeping:
        held = {run for (run, _), pair in state.items() if pair.kind == "delegation"}
        bounced = {run: key for run, key in bounced.items() if run in held}
    _keep_state(result, state, newest, late, bounced)
    return result


def _agent_as_computed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``agent`` column of the type ``loop_rows`` gives a whole result: text, or
    objects with None when a loop has no agent (``replace`` of "" makes it so). Merged rows can
    carry either: a part without a missing agent is text, and ``merge_rows`` gives an all-missing
    side the other's type."""
    agent = frame["agent"]
    missing = agent.isna()
    if missing.any():
        if agent.dtype != object or agent[missing].map(lambda value: value is not None).any():
            frame = frame.assign(agent=agent.astype(object).where(~missing, None))
    elif agent.dtype == object and len(agent):
        frame = frame.assign(agent=agent.astype(frame["tool_name"].dtype))
    return frame


def _late_pairs(
    conn: duckdb.DuckDBPyConnection, traces: set[str], seen_until, state: dict, tails: set[tuple[str, str]]
) -> set[tuple[str, str]]:
    """Of the kept groups ``tails``, those that spans of ``traces`` ingested after ``seen_until``
    (the newest span when the groups were brought up to date) reach before the last call of one
    of their (run, agent, tool) groups: they are recomputed whole at once instead of after a
    read of their tails. A guess (a span ingested earlier but committed later is not seen here;
    ``loop_groups.append_calls`` tells them all)."""
    if seen_until is None or not tails:
        return set()
    rows = conn.execute(
        "SELECT run_id, coalesce(agent_id, ''), CASE WHEN op = 'delegate' THEN delegate_to ELSE tool_name END "
        "AS tool, min(start_ns) FROM spans WHERE TraceId = ANY($traces::VARCHAR[]) AND ingested_at > $seen "
        "AND (tool_name IS NOT NULL OR op = 'delegate') AND run_id IS NOT NULL GROUP BY ALL",
        {"traces": sorted(traces), "seen": seen_until},
    ).fetchall()
    late = set()
    for run, agent, tool, start in rows:
        group = state[run, tool].groups.get(agent) if (run, tool) in tails else None
        if group is not None and start <= group.tail[-1][0]:
            late.add((run, tool))
    return late


def _append_to_kept(
    state: dict,
    tails: set[tuple[str, str]],
    rows: pd.DataFrame,
    old: pd.DataFrame,
    fresh_parts: list[pd.DataFrame],
    dropped: list[pd.Index],
) -> set[tuple[str, str]]:
    """Bring the kept groups ``tails`` up to date with their ``rows`` (their calls from the cuts
    on): the loop rows of the components that changed go to ``fresh_parts``, the index of the rows
    of ``old`` they replace to ``dropped``. Returns the groups that must be recomputed whole (they
    are no longer kept)."""
    columns = loop_groups.columns_of(rows.drop(columns=["min_similarity"]))
    columns["min_similarity"] = rows["min_similarity"].to_numpy(dtype=float, na_value=np.nan)
    positions: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(columns["run_id"].tolist(), columns["tool_name"].tolist(), strict=True)):
        positions.setdefault(key, []).append(i)
    kept_rows = old[_in_groups(old, tails, set())]
    members_of = kept_rows["span_ids"]
    if isinstance(members_of.dtype, pd.ArrowDtype):
        firsts = members_of.list[0].tolist()
    else:  # an empty result's column of objects
        firsts = [ids[0] for ids in members_of]
    old_firsts = pd.Series(firsts, index=kept_rows.index, dtype=object)
    by_pair = dict(iter(old_firsts.groupby([kept_rows["run_id"], kept_rows["tool_name"]], sort=False)))
    failed = set()
    members: list[tuple[loop_groups.PairCalls, dict[str, np.ndarray], np.ndarray]] = []
    extended: list[tuple[loop_groups.PairCalls, loop_groups.Grown]] = []
    for key in tails:
        pair = state[key]
        at = positions.get(key)
        firsts = by_pair.get(key, old_firsts.iloc[0:0])
        changed = None
        if at:
            part = {name: values[at] for name, values in columns.items()}
            changed = loop_groups.append_calls(pair, part, firsts, NEIGHBOUR_WINDOW)
        if changed is None:
            failed.add(key)
            del state[key]
            stats["loop_groups_recomputed"] += 1
            continue
        stats["loop_groups_appended"] += 1
        stats["loop_delegation_groups_appended"] += pair.kind == "delegation"
        state[key] = state.pop(key)  # most recently used last
        labels, drop, grown = changed
        dropped.append(drop)
        # a loop that only gained calls is its kept row extended (its members' lists are long:
        # forming every changed loop of a 100,000-call run again cost 0.1 CPU-s per batch)
        grown = {label: part for label, part in grown.items() if old.at[part.row, "calls"] == part.kept_calls}
        extended.extend((pair, part) for part in grown.values())
        stats["loop_rows_extended"] += len(grown)
        labels -= set(grown)
        part = pair.members(labels, MIN_REPEATS) if labels else None
        if part is not None:
            members.append((pair, *part))
    if members:  # labels are per kept group: loop_rows splits components by (run, agent, tool)
        calls = loop_groups.member_frame([(pair, columns) for pair, columns, _ in members])
        fresh_parts.append(loop_rows(calls, np.concatenate([labels for _, _, labels in members])))
    if extended:
        fresh_parts.append(_extended_rows(old, extended))
    return failed


def _extended_rows(
    old: pd.DataFrame, extended: list[tuple[loop_groups.PairCalls, loop_groups.Grown]]
) -> pd.DataFrame:
    """The rows of ``old`` whose loops only gained calls (``loop_groups.Grown``), with those calls:
    what ``loop_rows`` gives for the loop's members (the new calls come after the kept ones in
    member order: each is later than its (run, agent, tool) group's last kept call)."""
    rows = old.loc[[part.row for _, part in extended], _LOOP_COLUMNS].reset_index(drop=True)
    span_ids, calls, failed, refused, failing, distinct, lowest, first, last = ([] for _ in range(9))
    for (pair, part), old_ids, row in zip(
        extended,
        rows["span_ids"],
        rows[["calls", "failed", "refused", "failing", "distinct_arguments", "min_similarity"]].itertuples(
            index=False
        ),
        strict=True,
    ):
        at = part.added
        new_failing = pair.calls["failing"][at]
        new_rejected = pair.calls["rejected"][at]
        times = pair.calls["Timestamp"][at]
        span_ids.append([*old_ids, *pair.calls["SpanId"][at].tolist()])
        calls.append(row.calls + len(at))
        failed.append(row.failed + int(new_failing.sum()) - int(new_rejected.sum()))
        refused.append(row.refused + int(new_rejected.sum()))
        failing.append(bool(row.failing) and bool(new_failing.all()))
        distinct.append(row.distinct_arguments + part.new_arguments)
        lowest.append(float(np.nanmin(np.r_[row.min_similarity, pair.min_similarity[at]])))
        first.append(times.min())
        last.append(times.max())
    rows["span_ids"] = _as_member_lists(span_ids)
    for name, values in [("calls", calls), ("failed", failed), ("refused", refused), ("failing", failing),
                         ("distinct_arguments", distinct), ("min_similarity", lowest)]:  # fmt: skip
        rows[name] = np.asarray(values, dtype=rows[name].dtype)
    rows["kind"] = pd.array(
        np.where(rows["distinct_arguments"] == 1, "exact", "near_duplicate"), dtype=rows["kind"].dtype
    )
    # kept groups are matched on arguments only (repeated_calls.sql: own_args)
    rows["matched_on"] = pd.array(
        np.where(rows["distinct_arguments"] == 1, "arguments", "similar arguments"),
        dtype=rows["matched_on"].dtype,
    )
    rows["first_seen"] = np.minimum(
        rows["first_seen"].to_numpy(), np.asarray(first, dtype=rows["first_seen"].dtype)
    )
    rows["last_seen"] = np.maximum(
        rows["last_seen"].to_numpy(), np.asarray(last, dtype=rows["last_seen"].dtype)
    )
    return rows.sort_values(["first_seen", "run_id", "tool_name"]).reset_index(drop=True)


def _keep_pairs(
    state: dict, rows: pd.DataFrame, pairs: set[tuple[str, str]], whole: set[str], late: set[tuple[str, str]]
) -> None:
    """Keep the (run, tool) groups of tool calls among ``rows`` (every candidate call of the groups
    ``pairs`` and of the runs ``whole``, just computed) but those that got late calls (``late``:
    their next batch would likely be late too, and keeping a group costs about as much as
    computing it); forget the others of those groups."""
    for key in [key for key in state if key in pairs or key[0] in whole]:
        del state[key]
    if rows.empty:
        return
    for key, part in rows.groupby(["run_id", "tool_name"], sort=False):
        if key not in late and loop_groups.is_keepable(part, HANDOFF_TOOL_PREFIX):
            part = part.reset_index(drop=True)
            state[key] = loop_groups.build_pair(part, component_labels(part), NEIGHBOUR_WINDOW)


# Kept groups (analytics.loop_groups) of the repeated_calls result they describe: id(frame) ->
# (frame, {(run, tool): PairCalls}, the newest ingested_at they saw, the (run, tool) groups not
# kept since they got late calls, {run: its ping-pongs (``_RunBounces.key``)} for the runs with
# kept delegation groups). Only for all time and no filters; bounded by calls kept.
_states: collections.OrderedDict[int, tuple[pd.DataFrame, dict, object, set, dict]] = (
    collections.OrderedDict()
)
_states_lock = threading.Lock()
# About five live 100,000-call runs. A kept call holds its strings and an entry in the span-id
# lookup: a few hundred bytes (estimated, not measured), so at most some 100-250 MB.
MAX_KEPT_CALLS = 500_000


def _take_state(old: pd.DataFrame, window: Window, filters: Filters) -> tuple[dict | None, object, set, dict]:
    """The kept groups of ``old`` (removed: the caller keeps them with the frame it returns), the
    newest ingested_at they saw, the groups not kept because they got late calls and the
    ping-pongs of the runs of kept delegation groups; {} when there are none, None when groups
    are not kept for this window and filters."""
    if window != Window() or filters != Filters():
        return None, None, set(), {}
    with _states_lock:
        entry = _states.pop(id(old), None)
    return entry[1:] if entry is not None and entry[0] is old else ({}, None, set(), {})


def _keep_state(frame: pd.DataFrame, state: dict | None, newest, late: set, bounced: dict) -> None:
    if state is None:
        return
    total = sum(pair.size for pair in state.values())
    for key in list(state):  # least recently used first
        if total <= MAX_KEPT_CALLS:
            break
        total -= state.pop(key).size
    with _states_lock:
        _states[id(frame)] = (frame, state, newest, late, bounced)
        while len(_states) > 2:
            _states.popitem(last=False)


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
    # each distinct pair of task statements is scored once
    pairs = pd.DataFrame({"first": args[i], "second": args[j]})
    distinct = pairs.drop_duplicates(ignore_index=True)
    texts = list(dict.fromkeys([*distinct["first"], *distinct["second"]]))
    vectors = dict(zip(texts, embed_texts(texts, conn), strict=True))
    distinct["score"] = [
        task_similarity(a, b, float(np.dot(vectors[a], vectors[b])))
        for a, b in zip(distinct["first"], distinct["second"], strict=True)
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
            and (caller is None or caller in set(agents) or caller == via)
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
