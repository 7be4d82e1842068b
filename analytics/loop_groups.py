"""Kept (run, tool) groups of repeated_calls: every call of the group with its loop component, so
that new calls appended at the end of their groups are compared only with each group's kept tail
and merged into its components (``analytics.loops.update_repeated_calls``).

A group kept here holds only tool calls (no ``transfer_to_<agent>`` hand-off tool) or only
delegations whose arguments come from their own span (``own_args``: a goal text, or no input
text), no agent invocation or code action: a new span elsewhere in the run can change those. Such
a call is a call by its own span's fields alone, and earlier spans change only when the collector
fills their run or agent; each kept (run, agent, tool) group therefore carries its calls' count
and a sum of a hash of their span ids, which the SQL returns beside the calls it reads, so a group
whose members changed in any other way than new calls at its end is seen (a hand-off back, which
removes the delegations both ways, empties the group), and recomputed whole by the caller. What
else can change a kept delegation group's loops without a call of its own, a ping-pong of its
run, the caller checks (``analytics.loops``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# What a kept call holds (the SQL's columns a loop row is formed from, and what a call is checked by).
CALL_COLUMNS = [
    "SpanId", "TraceId", "agent", "Timestamp", "start_ns", "failing", "rejected", "source", "norm_args",
]  # fmt: skip
_CHECKED = ["agent", "start_ns", "failing", "rejected", "source", "norm_args"]


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


def columns_of(frame: pd.DataFrame, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """``frame``'s columns ``names`` (all when None) as numpy arrays (text as objects): a few rows
    are taken from them far faster than from a frame's Arrow-backed text columns."""
    return {name: frame[name].to_numpy() for name in (names or list(frame.columns))}


def link_edges(calls: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The links of ``calls`` (the SQL's rows as ``columns_of``: ``call_idx`` and its ``linked``
    call_idx list) as pairs of row positions; links to calls not among the rows are left out."""
    n = len(calls["call_idx"])
    if not n:
        return np.array([], np.int64), np.array([], np.int64)
    counts = np.fromiter((len(x) for x in calls["linked"]), dtype=np.int64, count=n)
    left = np.repeat(np.arange(n), counts)
    right_idx = np.concatenate([np.asarray(x, dtype=np.int64) for x in calls["linked"]])
    order = calls["call_idx"].astype(np.int64)
    sorter = np.argsort(order, kind="stable")
    found = np.searchsorted(order, right_idx, sorter=sorter)
    found = np.minimum(found, n - 1)
    right = sorter[found]
    ok = order[right] == right_idx
    return left[ok], right[ok]


@dataclass
class Group:
    """One kept (run, agent, tool) group: its calls' count and span-id hash sum, and the keys
    (start_ns, SpanId) of its last calls (the neighbour window)."""

    calls: int
    hash_sum: int
    tail: list[tuple[int, str]]


@dataclass
class PairCalls:
    """Every call of one (run, tool) group of tool calls, with its loop component (``label``) and
    its lowest link similarity (NaN: unlinked)."""

    run_id: str
    tool_name: str
    kind: str  # the calls' source: "tool" or "delegation"
    calls: dict[str, np.ndarray]  # CALL_COLUMNS (columns_of)
    dtypes: dict[str, object]  # the SQL's column types, to give loop_rows the frame it reads
    label: np.ndarray
    min_similarity: np.ndarray
    position: dict[str, int]
    groups: dict[str, Group]  # by agent
    firsts: dict[tuple[str, str], int]  # (agent, norm_args) -> position of a call with them
    next_label: int = 0
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.label)

    def cuts(self) -> dict[str, tuple[int, str]]:
        """Per (run, agent, tool) group, by agent: the first key of its tail. Reading its calls
        from there on gives every new call appended to the group its neighbours."""
        return {agent: group.tail[0] for agent, group in self.groups.items()}

    def members(self, labels: set[int], min_calls: int) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """The calls of the components ``labels`` with ``min_calls``+ calls (loop_rows' input; a
        smaller one cannot be a loop) as numpy columns (``member_frame`` makes them a frame) and
        their labels; None when there are none."""
        mask = np.isin(self.label, list(labels))
        found, counts = np.unique(self.label[mask], return_counts=True)
        if not (counts >= min_calls).all():
            mask &= np.isin(self.label, found[counts >= min_calls])
        if not mask.any():
            return None
        n = int(mask.sum())
        columns = {name: self.calls[name][mask] for name in CALL_COLUMNS}
        columns["run_id"] = np.full(n, self.run_id, dtype=object)
        columns["tool_name"] = np.full(n, self.tool_name, dtype=object)
        columns["min_similarity"] = self.min_similarity[mask]
        return columns, self.label[mask]


def member_frame(parts: list[tuple[PairCalls, dict[str, np.ndarray]]]) -> pd.DataFrame:
    """The ``PairCalls.members`` columns of several kept groups as one frame with the SQL's column
    types (one conversion per column, not per group and column; every read gives them alike)."""
    dtypes = parts[0][0].dtypes
    columns = {
        name: pd.array(np.concatenate([part[name] for _, part in parts]), dtype=dtypes[name])
        for name in [*CALL_COLUMNS, "run_id", "tool_name"]
    }
    columns["min_similarity"] = np.concatenate([part["min_similarity"] for _, part in parts])
    return pd.DataFrame(columns)


def is_keepable(rows: pd.DataFrame, handoff_prefix: str) -> bool:
    """Whether a (run, tool) group's rows (every candidate call) can be kept: tool calls only, and
    not a hand-off tool; or delegations only, each with its own arguments."""
    source = str(rows["source"].iloc[0])
    if not bool((rows["source"] == source).all()) or not bool(rows["own_args"].all()):
        return False
    if source == "tool":
        return not str(rows["tool_name"].iloc[0]).startswith(handoff_prefix)
    return source == "delegation"


def build_pair(rows: pd.DataFrame, labels: np.ndarray, window: int) -> PairCalls:
    """A kept group from every candidate call of one (run, tool) group (the SQL's rows read with
    ``all_calls``) and their component labels."""
    frame = rows[CALL_COLUMNS].reset_index(drop=True)
    calls = columns_of(frame)
    label = np.asarray(labels, dtype=np.int64)
    keys = frame[["agent", "start_ns", "SpanId"]].sort_values(["agent", "start_ns", "SpanId"])
    sums = rows.groupby("agent", sort=False)[["group_calls", "group_sum"]].first()
    groups = {}
    for agent, part in keys.groupby("agent", sort=False):
        tail = list(
            zip(
                part["start_ns"].to_numpy()[-window:].tolist(), part["SpanId"].tolist()[-window:], strict=True
            )
        )
        groups[agent] = Group(int(sums.at[agent, "group_calls"]), int(sums.at[agent, "group_sum"]), tail)
    firsts_frame = frame[["agent", "norm_args"]].drop_duplicates()
    return PairCalls(
        run_id=str(rows["run_id"].iloc[0]),
        tool_name=str(rows["tool_name"].iloc[0]),
        kind=str(rows["source"].iloc[0]),
        calls=calls,
        dtypes={name: rows[name].dtype for name in [*CALL_COLUMNS, "run_id", "tool_name"]},
        label=label,
        min_similarity=rows["min_similarity"].to_numpy(dtype=float, na_value=np.nan),
        position={span: i for i, span in enumerate(calls["SpanId"].tolist())},
        groups=groups,
        firsts=dict(
            zip(
                zip(firsts_frame["agent"], firsts_frame["norm_args"], strict=True),
                firsts_frame.index,
                strict=True,
            )
        ),
        next_label=int(label.max()) + 1 if len(label) else 0,
    )


@dataclass
class Grown:
    """A kept loop whose component only gained new calls: the index of its row in the kept
    result, the group's calls it held before, the positions of its new calls (in member order)
    and how many arguments among them the group had not seen (each a new distinct argument)."""

    row: object
    kept_calls: int
    added: list[int]
    new_arguments: int


def append_calls(
    pair: PairCalls, rows: dict[str, np.ndarray], old_first_spans: pd.Series, window: int
) -> tuple[set[int], pd.Index, dict[int, Grown]] | None:
    """Bring ``pair`` up to date with the SQL's rows of its calls from its ``cuts`` on (read with
    ``all_calls``, as ``columns_of``; a group not kept is read whole): the new calls join the
    components they link to. Returns the labels of the components that changed and the index of
    the rows of the kept result to drop (those of ``old_first_spans``, the first member of each
    kept loop of the group, whose component changed), and of those the loops that only gained
    new calls (``Grown``, by label: their rows can be extended rather than formed again); None when
    the group changed otherwise than by new calls of its kind at the end of its (run, agent, tool)
    groups (the caller recomputes it whole; ``pair`` is then unchanged)."""
    # the rows are few (each kept group's tail and its new calls): plain Python over lists
    spans = rows["SpanId"].tolist()
    known = np.array([pair.position.get(span, -1) for span in spans], dtype=np.int64)
    is_new = known < 0
    seen_at = known[~is_new]
    for column in _CHECKED:  # a kept call read again is the same call
        if pair.calls[column][seen_at].tolist() != rows[column][~is_new].tolist():
            return None
    if not (all(source == pair.kind for source in rows["source"].tolist()) and bool(rows["own_args"].all())):
        return None  # a call of another kind
    sums: dict[str, tuple[int, int]] = {}
    for agent, calls, hash_sum in zip(
        rows["agent"].tolist(), rows["group_calls"].tolist(), rows["group_sum"].tolist(), strict=True
    ):
        sums.setdefault(agent, (int(calls), int(hash_sum)))
    if set(sums) != set(pair.groups):  # a kept group lost its tail, or a group not kept came
        return None
    new = {name: values[is_new] for name, values in rows.items()}
    new_agents, new_args = new["agent"].tolist(), new["norm_args"].tolist()
    new_spans, new_starts = new["SpanId"].tolist(), new["start_ns"].tolist()
    new_keys: dict[str, list[tuple[int, str]]] = {}
    added: dict[str, int] = {}
    for agent, start, span, span_hash in zip(
        new_agents, new_starts, new_spans, new["span_hash"].tolist(), strict=True
    ):
        new_keys.setdefault(agent, []).append((start, span))
        added[agent] = added.get(agent, 0) + int(span_hash)
    for agent, group in pair.groups.items():
        keys = sorted(new_keys.get(agent, []))
        new_keys[agent] = keys
        if keys and keys[0] <= group.tail[-1]:  # older than the group's last call
            return None
        if sums[agent] != (group.calls + len(keys), group.hash_sum + added.get(agent, 0)):
            return None
    m = len(new_spans)
    if not m:
        return set(), pd.Index([]), {}
    # links with a new call at one end at least (links between kept calls are kept already; the
    # rows read from the cut on miss the earlier neighbours of the first of them)
    left, right = link_edges(rows)
    with_new = is_new[left] | is_new[right]
    left, right = left[with_new], right[with_new]
    new_at = np.cumsum(is_new) - 1  # row -> index among the new calls
    min_similarity = np.asarray(new["min_similarity"], dtype=float)
    # a new call with the arguments of a kept call not among the rows links to it (identical calls
    # link to the first of them in the full computation: the same component, similarity 1)
    rep = np.array(
        [pair.firsts.get(key, -1) for key in zip(new_agents, new_args, strict=True)], dtype=np.int64
    )
    min_similarity = np.where(rep >= 0, np.fmin(min_similarity, 1.0), min_similarity)
    old_ends = np.concatenate([known[left[~is_new[left]]], known[right[~is_new[right]]], rep[rep >= 0]])
    old_labels = np.unique(pair.label[old_ends]) if len(old_ends) else np.array([], np.int64)

    def node(rows_at: np.ndarray) -> np.ndarray:
        new_node = new_at[rows_at]
        old_node = m + np.searchsorted(old_labels, pair.label[np.maximum(known[rows_at], 0)])
        return np.where(is_new[rows_at], new_node, old_node)

    has_rep = np.flatnonzero(rep >= 0)
    edge_left = np.concatenate([node(left), has_rep])
    edge_right = np.concatenate([node(right), m + np.searchsorted(old_labels, pair.label[rep[has_rep]])])
    components = connected_components(m + len(old_labels), edge_left, edge_right)
    # each component of a new call: the smallest kept label it holds, else a new label
    target = {}
    next_label = pair.next_label
    for comp in np.unique(components[:m]):
        held = old_labels[components[m:] == comp]
        if len(held):
            target[int(comp)] = int(held.min())
        else:
            target[int(comp)] = next_label
            next_label += 1
    merged_old = {int(old_labels[i]): target[int(components[m + i])] for i in range(len(old_labels))}
    first_positions = np.array([pair.position.get(span, -1) for span in old_first_spans.tolist()], np.int64)
    first_labels = np.where(first_positions >= 0, pair.label[np.maximum(first_positions, 0)], -1)
    drop = old_first_spans.index[np.isin(first_labels, list(merged_old))]
    # the group brought up to date
    if any(old != new_label for old, new_label in merged_old.items()):
        relabel = np.isin(pair.label, list(merged_old))
        pair.label[relabel] = [merged_old[int(x)] for x in pair.label[relabel]]
    new_labels = np.array([target[int(c)] for c in components[:m]], dtype=np.int64)
    start = pair.size
    # loops that only grew: one kept component (with a row in the kept result) and new calls
    rows_of = dict(zip(first_labels.tolist(), old_first_spans.index, strict=True))
    grown: dict[int, Grown] = {}
    sources = collections.Counter(merged_old.values())
    new_label_list = new_labels.tolist()
    for old_label, label in merged_old.items():
        if old_label == label and sources[label] == 1 and label in rows_of:
            gained = sorted(
                (i for i in range(m) if new_label_list[i] == label),
                key=lambda i: (new_starts[i], new_spans[i]),
            )
            fresh_args = {
                (new_agents[i], new_args[i])
                for i in gained
                if (new_agents[i], new_args[i]) not in pair.firsts
            }
            grown[label] = Grown(
                rows_of[label],
                int(np.count_nonzero(pair.label == label)),
                [start + i for i in gained],
                len(fresh_args),
            )
    for name in CALL_COLUMNS:
        pair.calls[name] = np.concatenate([pair.calls[name], new[name]])
    pair.label = np.concatenate([pair.label, new_labels])
    pair.min_similarity = np.concatenate([pair.min_similarity, min_similarity])
    for i, span in enumerate(new_spans):
        pair.position[span] = start + i
    for i, key in enumerate(zip(new_agents, new_args, strict=True)):
        pair.firsts.setdefault(key, start + i)
    for agent, keys in new_keys.items():
        group = pair.groups[agent]
        group.calls += len(keys)
        group.hash_sum += added.get(agent, 0)
        group.tail = (group.tail + keys)[-window:]
    pair.next_label = next_label
    pair.size = len(pair.label)
    return set(target.values()), drop, grown
