"""repeated_calls' calls as state, folded from the spans each commit stored.

A loop is a linked component of one (run, agent, tool) group's calls (``analytics.loops``). This
keeps every call of every group (``findings__repeated_calls_calls``: the call, its normalized
arguments, the lowest similarity of its links and its component's id), so a pass appends the new
calls of a group to it instead of recomputing the group: a tool call that arrives after the
group's calls is linked to the calls of its signature (one lookup) and to the last
``NEIGHBOUR_WINDOW`` calls of the group (their similarity tokens, in Python:
``analytics.loop_similarity`` is repeated_calls.sql's tested twin), and the components it joins
are merged. With a fleet of crews streaming, every group is touched every few seconds: appending
costs the new calls, recomputing cost every call of every touched group (2.6 s of a 6 s pass at
1M stored spans).

A group of tool calls that takes a call before its last one is linked again from its kept
calls and the new ones (``_relink``: the same rules in time order, no span read). What a fold
cannot append or relink is recomputed per (run, tool) group, exactly as before (``calls_of``:
repeated_calls.sql over the group's spans, every call kept): groups a delegation, an agent span
or an LLM output with code touched (their calls depend on other spans: reverse hand-offs, agent
chains, the run's tools), groups of spans stored before a parent that arrived later, of spans
that were calls already (changed or deleted), of runs whose LLM outputs hold code, groups holding
other than tool calls, and delegations that do not come after their group's calls.

``analytics.loops_live`` forms the loops from this table. The tests hold the loops to a full
recomputation after every batch (tests/analytics/test_materialize.py) and the fold to its
appending (tests/analytics/test_loops_fold.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
from scipy import sparse
from scipy.sparse import csgraph

import analytics.loops as loops
from analytics.embeddings import embed_texts
from analytics.loop_similarity import could_link, signature, similarity_tokens, task_similarity
from analytics.materialize import (
    CHUNK_KEYS,
    PARTS,
    POSITION,
    RUN_TOOL_SEP,
    TABLE_PREFIX,
    Maintained,
    SpanChanges,
    _arrow,
    _write_rows,
    kept_mark,
    keys_of_folded_changes,
    maintain,
    read_mark,
    run_chunks,
    run_scope,
    run_tool_where,
    split_run_tools,
    table_exists,
    write_mark,
)
from analytics.sql_loader import query_arrow, quote_identifier, run_sql
from analytics.thresholds import current_threshold
from analytics.types import Filters, Window

CALLS = "repeated_calls_calls"
TABLE = quote_identifier(TABLE_PREFIX + CALLS)
COLUMNS = [
    "TraceId", "SpanId", "run_id", "agent", "tool_name", "Timestamp", "start_ns", "failing", "rejected",
    "source", "args", "norm_args", "basis", "min_similarity", "comp",
]  # fmt: skip
_GROUP = ["run_id", "agent", "tool_name"]
# Per group, what appending to it needs (kept beside the calls, rewritten for the groups a pass
# changes: reading it from every kept call of the touched groups took 1-1.4 s a pass at 1M):
# the sources of its calls, its last call (start, span id) and its last NEIGHBOUR_WINDOW calls
# with arguments (newest first).
TAILS = quote_identifier(TABLE_PREFIX + "repeated_calls_tails")
_TAILS_SQL = """
SELECT run_id, agent, tool_name, list_sort(list_distinct(list(source))) AS sources,
       max({{'n': start_ns, 's': SpanId}}) AS last,
       coalesce(max_by({{'comp': comp, 'args': args, 'norm_args': norm_args}}, {{'n': start_ns, 's': SpanId}},
                       {window}) FILTER (WHERE basis = 'arguments'),
                []::STRUCT(comp BIGINT, args VARCHAR, norm_args VARCHAR)[]) AS tail
FROM {calls} {where}
GROUP BY run_id, agent, tool_name
"""


_TAILS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("agent", pa.string()), ("tool_name", pa.string()),
        ("sources", pa.list_(pa.string())),
        ("last", pa.struct([("n", pa.int64()), ("s", pa.string())])),
        ("tail", pa.list_(pa.struct([("comp", pa.int64()), ("args", pa.string()), ("norm_args", pa.string())]))),
    ]
)  # fmt: skip


def _tails_sql(where: str = "") -> str:
    return _TAILS_SQL.format(window=loops.NEIGHBOUR_WINDOW, calls=TABLE, where=where)


@dataclasses.dataclass
class Fold:
    """What a pass changes in the state: ``rows`` inserted; before them, the rows of the (run,
    tool) groups ``replace`` names removed ('run_tool' keys; None: every row) and components
    ``merged`` (old id -> new id) relabelled. ``appended``: groups new calls were appended to."""

    rows: pd.DataFrame | pa.Table  # Arrow for a first build (``_build``)
    replace: set[str] | None
    merged: dict[int, int] = dataclasses.field(default_factory=dict)
    appended: int = 0
    next_id: int = 0  # the lowest component id no row has
    tails: pa.Table | None = None  # the appended groups' new tails (_TAILS_SQL's columns)
    # The change it folds up to, and the groups whose loops it may change ('run_tool' keys):
    # recorded in CHANGED for repeated_calls_groups (None: a build; every group may change).
    upto: int | None = None
    changed: set[str] = dataclasses.field(default_factory=set)
    # The newest ``ingested_at`` of any span stored when it was computed (``materialize.read_mark``): every
    # span its state reflects was ingested at or before it. None: unknown.
    mark: datetime | None = None
    # Of ``replace``, the groups relinked from their kept calls and new ones (``_relink``) rather
    # than computed from their spans (``calls_of``), and those new calls.
    relinked: set[str] = dataclasses.field(default_factory=set)
    to_relink: pd.DataFrame | None = None

    def counts(self) -> dict[str, int]:
        """What the fold did, for health: groups new calls were appended to, groups relinked from
        their kept calls, groups computed from their runs' spans (each such computation scans
        the spans for its runs: at 10M the dearest part of a pass), and call rows written."""
        replaced = set() if self.replace is None else self.replace
        return {
            "groups_appended": int(self.appended),
            "groups_relinked": len(self.relinked),
            "groups_from_spans": len(replaced - self.relinked),
            "calls_written": len(self.rows) if isinstance(self.rows, pd.DataFrame) else self.rows.num_rows,
        }


def calls_of(conn: duckdb.DuckDBPyConnection, keys: list[str] | None, first_id: int) -> pd.DataFrame:
    """Every call of the (run, tool) groups ``keys`` ('run_tool' keys; None: every group), linked
    as repeated_calls links them, with its component's id (numbered from ``first_id``)."""
    info = current_threshold(conn, "near_duplicate_similarity")
    tasks = current_threshold(conn, "near_duplicate_task_similarity")
    if keys is None:
        calls = loops.linked_calls(conn, Window(), Filters(from_spans=True), info.value, all_calls=True)
    else:
        whole, groups = split_run_tools(keys)
        pairs = [tuple(key.split(RUN_TOOL_SEP, 1)) for key in groups]
        runs = sorted({*whole, *(run for run, _ in pairs)})
        groups_of = loops.group_params(pairs, whole)
        calls = loops.linked_calls(
            conn, Window(), run_scope(conn, runs), info.value, groups=groups_of, all_calls=True
        )
    calls = loops.task_links(conn, calls, tasks.value, min_calls=1).reset_index(drop=True)
    comp = loops.component_labels(calls).astype(np.int64) + first_id
    return calls.assign(comp=comp, min_similarity=calls["min_similarity"].astype(float))[COLUMNS]


def compute(conn: duckdb.DuckDBPyConnection, partition: str | None, changes: SpanChanges | None) -> Fold:
    """The state's change for the spans ``changes`` lists (every call when None)."""
    if changes is None or not table_exists(conn, TABLE_PREFIX + CALLS):
        return _build(conn, None if changes is None else changes.upto)
    params = changes.params()
    mark = kept_mark(conn, MARK)
    replace = _logged_keys(conn, changes, mark)
    others = run_sql(conn, "loop_changed_spans", Window(), Filters(), **changes.bounded_params())
    replace |= {run + RUN_TOOL_SEP + tool for run, tool in zip(others["run_id"], others["tool"], strict=True)}
    new = run_sql(
        conn,
        "loop_new_calls",
        Window(),
        Filters(),
        min_output_words=loops.MIN_OUTPUT_WORDS,
        **changes.bounded_params(),
    )
    # calls already kept that changed or went: their groups (the groups they have now are
    # recomputed because they are among the kept: below). None when every listed span is new
    # (a scan of every kept call: 10M rows at 10M spans).
    kept = []
    if not changes.only_new:
        kept = conn.execute(
            f"SELECT k.TraceId, k.SpanId, k.run_id, k.tool_name FROM {TABLE} k "
            "SEMI JOIN (SELECT DISTINCT TraceId, SpanId FROM span_changes WHERE seq > $after AND seq <= $upto) c "
            "ON c.TraceId = k.TraceId AND c.SpanId = k.SpanId",
            params,
        ).fetchall()
    replace |= {run + RUN_TOOL_SEP + tool for _, _, run, tool in kept}
    again = {(trace, span) for trace, span, _, _ in kept}
    if again:
        calls_again = [(t, s) in again for t, s in zip(new["TraceId"], new["SpanId"], strict=True)]
        replace |= set((new["run_id"] + RUN_TOOL_SEP + new["tool_name"])[calls_again])
    whole = {key.split(RUN_TOOL_SEP, 1)[0] for key in replace if key.endswith(RUN_TOOL_SEP + "*")}
    key = new["run_id"] + RUN_TOOL_SEP + new["tool_name"]
    new = new[~key.isin(replace) & ~new["run_id"].isin(whole)]
    if not new.empty:  # runs whose LLM outputs hold code: a new tool of the run is a code call's too
        coded = _runs_with_code(conn, sorted(set(new["run_id"])))
        replace |= {k for k, run in zip(key[new.index], new["run_id"], strict=True) if run in coded}
        new = new[~new["run_id"].isin(coded)]
    fold = _append(conn, new.reset_index(drop=True), replace)
    fold.upto = changes.upto
    # (before the relinked calls join the rows: every relinked group is among those it changes)
    fold.changed = _loops_changed(conn, fold)
    if fold.relinked:
        fold.rows = pd.concat(
            [f for f in (fold.rows, _relink(conn, fold)) if len(f)] or [fold.rows], ignore_index=True
        )
    keys = sorted(fold.replace - fold.relinked)
    first = fold.next_id
    frames = [fold.rows]
    for start in range(0, len(keys), CHUNK_KEYS):
        chunk = calls_of(conn, keys[start : start + CHUNK_KEYS], int(first))
        first = int(chunk["comp"].max()) + 1 if len(chunk) else first
        frames.append(chunk)
    frames = [f for f in frames if len(f)] or frames[:1]
    fold.rows = pd.concat(frames, ignore_index=True)
    fold.mark = read_mark(conn, mark)  # after every read of spans above
    return fold


# The mark of the kept calls (``Fold.mark`` of the last fold applied): one row, or none (unknown).
MARK = TABLE_PREFIX + "repeated_calls_mark"


# The (run, tool) keys the changes logged for the spans their walks changed (the keys those spans
# had before: collector.changes), but for the changes of spans every one of which was first
# stored after the kept calls' mark (``materialize.keys_of_folded_changes``). An exporter sends a
# trace's spans as they end, parents after children: the walks mostly change spans stored a few
# commits before, which the pass folds anyway, and recomputing the groups they left read whole
# runs (100,000-call runs: most of a pass).
def _logged_keys(conn: duckdb.DuckDBPyConnection, changes: SpanChanges, mark: datetime | None) -> set[str]:
    return set(keys_of_folded_changes(conn, "run_tool", changes, mark))


def _loops_changed(conn: duckdb.DuckDBPyConnection, fold: Fold) -> set[str]:
    """The groups whose loops ``fold`` may change: those it recomputes, those whose components
    it merges, and those where an appended call is in a component of MIN_REPEATS calls or more
    (kept and appended together). A call that links to nothing, or only to a component still too
    small to be a loop, changes no loop: with a fleet streaming, 81 of 3,245 groups a pass
    appended to at 1M spans."""
    changed = set(fold.replace or ())
    rows = fold.rows
    if not len(rows):
        return changed
    keys = (rows["run_id"] + RUN_TOOL_SEP + rows["tool_name"]).to_numpy()
    comps = rows["comp"].to_numpy(dtype=np.int64)
    targets = set(fold.merged.values())
    changed |= {key for key, comp in zip(keys, comps, strict=True) if comp in targets}
    added = pd.Series(1, index=pd.MultiIndex.from_arrays([keys, comps])).groupby(level=[0, 1]).sum()
    conn.register("_appended_comps", pa.table({"comp": np.unique(comps)}))
    try:
        kept = dict(
            conn.execute(
                f"SELECT comp, count(*) FROM {TABLE} SEMI JOIN _appended_comps USING (comp) GROUP BY comp"
            ).fetchall()
        )
    finally:
        conn.unregister("_appended_comps")
    changed |= {
        key for (key, comp), count in added.items() if kept.get(int(comp), 0) + count >= loops.MIN_REPEATS
    }
    return changed


# A first build computes the calls of runs holding at most this many spans at once (a run with
# more alone): every call at once took 2.3 GiB more at 1M spans of 1,000-call runs, chunks of
# 100k spans 0.9 GiB (and 1.3x the time: each chunk reads the spans again).
BUILD_CHUNK_SPANS = 250_000


def _build_chunks(conn: duckdb.DuckDBPyConnection) -> list[list[str]]:
    """The stored runs as 'run_tool' keys ("<run>\x1f*"), in chunks of BUILD_CHUNK_SPANS spans."""
    return [[run + RUN_TOOL_SEP + "*" for run in chunk] for chunk in run_chunks(conn, BUILD_CHUNK_SPANS)]


def build(conn: duckdb.DuckDBPyConnection, upto: int | None = None) -> Iterator[Fold]:
    """The first build in parts, one run chunk each (a group is within one run, so the chunks'
    calls are the calls of all): the first part replaces the table, each later one adds its
    runs' groups. The materializer applies each part before computing the next, so what a build
    holds is bounded by the chunk, not by the store."""
    first, mark = 0, None
    for number, chunk in enumerate(_build_chunks(conn)):
        calls = calls_of(conn, chunk, first) if chunk else calls_of(conn, None, first)
        if number and not len(calls):
            continue
        if len(calls):
            first = int(calls["comp"].max()) + 1
        rows = _arrow(calls).drop_columns([POSITION])
        mark = read_mark(conn, mark)  # the last part's bounds every part's reads
        yield Fold(rows, None if number == 0 else set(chunk), next_id=first, upto=upto, mark=mark)


def _build(conn: duckdb.DuckDBPyConnection, upto: int | None = None) -> Fold:
    """Every call of every group at once: ``build``'s parts as one change."""
    parts = list(build(conn, upto))
    tables = [part.rows for part in parts if part.rows.num_rows] or [parts[0].rows]
    rows = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return Fold(rows, None, next_id=parts[-1].next_id, upto=upto, mark=parts[-1].mark)


def _runs_with_code(conn: duckdb.DuckDBPyConnection, runs: list[str]) -> set[str]:
    rows = conn.execute(
        "SELECT DISTINCT run_id FROM spans WHERE run_id IN (SELECT unnest($runs::VARCHAR[])) "
        "AND span_family = 'llm' AND (contains(output_text, '<code>') OR contains(output_text, '```'))",
        {"runs": runs},
    ).fetchall()
    return {row[0] for row in rows}


def _next_id(conn: duckdb.DuckDBPyConnection) -> int:
    ((top,),) = conn.execute(f"SELECT max(comp) FROM {TABLE}").fetchall()
    return 0 if top is None else int(top) + 1


def _append(conn: duckdb.DuckDBPyConnection, new: pd.DataFrame, replace: set[str]) -> Fold:
    """Append the calls ``new`` (tool calls and delegations) to their groups' kept calls; a
    group that cannot take them (its calls, kept and new, are not all tool calls or all
    delegations, or a kept call is at or after a new one) joins ``replace``."""
    if new.empty:
        return Fold(pd.DataFrame(columns=COLUMNS), replace, next_id=_next_id(conn))
    new = new.sort_values(["start_ns", "SpanId"], kind="stable").reset_index(drop=True)
    signatures = {args: signature(args) for args in set(new["args"].tolist())}
    new["norm_args"] = new["args"].map(signatures)
    groups = new[_GROUP].drop_duplicates()
    conn.register("_fold_groups", groups)
    conn.register("_fold_sigs", new[[*_GROUP, "basis", "norm_args"]].drop_duplicates())
    try:
        if table_exists(conn, TABLE_PREFIX + "repeated_calls_tails"):
            stats = conn.execute(
                f"SELECT run_id, agent, tool_name, sources, last, tail FROM {TAILS} "
                "SEMI JOIN _fold_groups USING (run_id, agent, tool_name)"
            ).fetchall()
        else:  # kept before the tails were
            stats = conn.execute(
                _tails_sql("SEMI JOIN _fold_groups USING (run_id, agent, tool_name)")
            ).fetchall()
        same = conn.execute(
            f"SELECT run_id, agent, tool_name, basis, norm_args, min(comp) FROM {TABLE} "
            "SEMI JOIN _fold_sigs USING (run_id, agent, tool_name, basis, norm_args) GROUP BY ALL"
        ).fetchall()
        next_id = _next_id(conn)
    finally:
        conn.unregister("_fold_groups")
        conn.unregister("_fold_sigs")
    by_group = {
        (run, agent, tool): (set(kinds), last, tail or []) for run, agent, tool, kinds, last, tail in stats
    }
    firsts = {(run, agent, tool, basis, sig): comp for run, agent, tool, basis, sig, comp in same}
    new_kinds: dict[tuple, set[str]] = {}
    for run, agent, tool, source in zip(*(new[c].tolist() for c in [*_GROUP, "source"]), strict=True):
        new_kinds.setdefault((run, agent, tool), set()).add(source)
    starts = new.drop_duplicates(_GROUP)  # each group's earliest new call
    columns = (starts[c].tolist() for c in [*_GROUP, "start_ns", "SpanId"])
    relink: set[str] = set()  # groups of tool calls taking a call before their last: relinked
    for run, agent, tool, start, span in zip(*columns, strict=True):
        kinds, last, _ = by_group.get((run, agent, tool), (set(), None, []))
        kinds = kinds | new_kinds[(run, agent, tool)]
        if len(kinds) > 1 or (
            last is not None and (last["n"], last["s"]) >= (start, span) and kinds != {"tool"}
        ):
            replace.add(run + RUN_TOOL_SEP + tool)
        elif last is not None and (last["n"], last["s"]) >= (start, span):
            relink.add(run + RUN_TOOL_SEP + tool)
    keys = new["run_id"] + RUN_TOOL_SEP + new["tool_name"]
    relink -= replace  # a (run, tool) key is relinked whole, every agent's group of it
    to_relink = new[keys.isin(relink)].reset_index(drop=True)
    new = new[~keys.isin(replace | relink)].reset_index(drop=True)
    links = _Links(next_id)
    tails = {
        group: [(t["comp"], t["norm_args"], t["args"]) for t in reversed(tail)]
        for group, (_, _, tail) in by_group.items()
    }
    threshold = current_threshold(conn, "near_duplicate_similarity").value
    asks = _link(links, new, firsts, tails, threshold)
    task_threshold = current_threshold(conn, "near_duplicate_task_similarity").value
    asks = [ask for ask in asks if could_link(ask[2], ask[3], task_threshold)]
    if asks:  # as loops.task_links scores them
        texts = list(dict.fromkeys(text for _, _, a, b in asks for text in (a, b)))
        vectors = dict(zip(texts, embed_texts(texts, conn), strict=True))
        for mine, comp, mine_text, their_text in asks:
            cosine = float(np.dot(vectors[mine_text], vectors[their_text]))
            score = task_similarity(mine_text, their_text, cosine)
            if score >= task_threshold:
                links.join(mine, comp, score)
    mine_ids = range(links.first, links.next)
    out = new.assign(comp=[links.find(c) for c in mine_ids], min_similarity=[links.low(c) for c in mine_ids])
    ends = new.drop_duplicates(_GROUP, keep="last")  # each appended group's last call
    return Fold(
        out[COLUMNS],
        replace | relink,
        links.merged(),
        appended=len(ends),
        next_id=links.next,
        tails=_new_tails(ends, by_group, new_kinds, tails, links),
        relinked=relink,
        to_relink=to_relink,
    )


def _link(
    links: _Links, calls: pd.DataFrame, firsts: dict[tuple, int], tails: dict[tuple, list], threshold: float
) -> list[tuple[int, int, str, str]]:
    """Link ``calls`` (in time order) one by one, each a new id of ``links``: to the first call of
    its signature (``firsts``: (group, basis, signature) -> id) and, with arguments, to the last
    NEIGHBOUR_WINDOW calls with arguments of its group (``tails``: group -> [(id, signature,
    arguments)]) whose token sets are similar enough; both are updated. Returns the hand-offs to
    score on their tasks: (new call, other's id, its task, the other's)."""
    tokens = similarity_tokens
    asks: list[tuple[int, int, str, str]] = []
    rows = zip(*(calls[c].tolist() for c in [*_GROUP, "basis", "norm_args", "args", "source"]), strict=True)
    for run, agent, tool, basis, sig, args, source in rows:
        group = (run, agent, tool)
        mine = links.add()
        same_key = (*group, basis, sig)
        if same_key in firsts:  # identical calls link (repeated_calls.sql's `firsts`)
            links.join(mine, firsts[same_key], 1.0)
        else:
            firsts[same_key] = mine
        if basis != "arguments":
            continue  # errors and outputs link only when identical
        tail = tails.setdefault(group, [])
        for comp, their_sig, their_args in tail[-loops.NEIGHBOUR_WINDOW :]:
            if their_sig == sig:
                continue
            if source == "delegation":  # re-worded hand-offs: on their task similarity
                asks.append((mine, comp, args, their_args))
                continue
            mine_tokens, theirs = tokens(args), tokens(their_args)
            if mine_tokens and theirs:  # repeated_calls.sql's `near`: the token-set Jaccard
                common = len(mine_tokens & theirs)
                score = common / (len(mine_tokens) + len(theirs) - common)
                if score >= threshold:
                    links.join(mine, comp, score)
        tail.append((mine, sig, args))
    return asks


def _relink(conn: duckdb.DuckDBPyConnection, fold: Fold) -> pd.DataFrame:
    """The calls of ``fold.relinked``'s groups (their kept calls and ``fold.to_relink``) linked
    again from the first: a group of tool calls that takes a call before its last cannot append
    it (the four calls after it change their links, and a component may split), but its calls
    are all kept here with their arguments, so the group is linked anew in the order of its
    calls by the append's own rules (``link_tool_calls``, ``_link`` column-wise), instead of
    computed from the spans of its run (``calls_of``: a (run, tool) group of a 100,000-call run
    is ~12k calls). New component ids from ``fold.next_id``, which moves past them."""
    new = fold.to_relink if fold.to_relink is not None else pd.DataFrame(columns=COLUMNS)
    conn.register("_relink_keys", _key_table(fold.relinked))
    try:  # a join on the two columns, not a key built from them for every kept call
        # a key with another agent's group of delegations (a hand-off target named like the
        # tool): those link on their tasks' embeddings, so the key is computed from its spans
        others = conn.execute(
            f"SELECT DISTINCT run_id, tool_name FROM {TABLE} SEMI JOIN _relink_keys USING (run_id, tool_name) "
            "WHERE source <> 'tool'"
        ).fetchall()
        if others:
            fold.relinked -= {run + RUN_TOOL_SEP + tool for run, tool in others}
            conn.unregister("_relink_keys")
            conn.register("_relink_keys", _key_table(fold.relinked))
        # the kept calls and the new ones (a new call replaces its kept row), in group and time
        # order, merged and sorted where they are: a relink of large groups reads a million
        # kept calls or more (read through Arrow: DuckDB's own DataFrame conversion of their
        # strings is slower, with the same dtypes)
        columns = ", ".join(quote_identifier(c) for c in COLUMNS[:-2])
        kept = f"SELECT {columns} FROM {TABLE} k SEMI JOIN _relink_keys USING (run_id, tool_name)"
        if len(new):
            conn.register("_relink_new", pa.Table.from_pandas(new[COLUMNS[:-2]], preserve_index=False))
            fresh = "(SELECT * FROM _relink_new SEMI JOIN _relink_keys USING (run_id, tool_name))"
            kept = (
                f"{kept} WHERE NOT EXISTS (SELECT 1 FROM {fresh} n "
                f"WHERE n.TraceId = k.TraceId AND n.SpanId = k.SpanId) UNION ALL SELECT {columns} FROM {fresh}"
            )
        calls = query_arrow(
            conn, f"SELECT * FROM ({kept}) ORDER BY run_id, agent, tool_name, start_ns, SpanId, TraceId", {}
        ).to_pandas()
    finally:
        conn.unregister("_relink_keys")
        if len(new):
            conn.unregister("_relink_new")
    threshold = current_threshold(conn, "near_duplicate_similarity").value
    first = fold.next_id
    fold.next_id = first + len(calls)
    if (calls["source"] == "tool").all():
        roots, lows = link_tool_calls(calls, threshold)
        return calls.assign(comp=roots + first, min_similarity=lows)[COLUMNS]
    links = _Links(first)  # hand-offs among them (their tasks are scored): one by one
    _link(links, calls, {}, {}, threshold)
    ids = range(links.first, links.next)
    return calls.assign(comp=[links.find(c) for c in ids], min_similarity=[links.low(c) for c in ids])[
        COLUMNS
    ]


def _key_table(keys: set[str]) -> pa.Table:
    """'run_tool' keys as a (run_id, tool_name) table to join on."""
    pairs = [key.split(RUN_TOOL_SEP, 1) for key in sorted(keys)]
    return pa.table(
        {
            "run_id": pa.array([p[0] for p in pairs], pa.string()),
            "tool_name": pa.array([p[1] for p in pairs], pa.string()),
        }
    )


def link_tool_calls(calls: pd.DataFrame, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """``_link`` over tool calls in group and time order with no kept state (``_relink``), as
    arrays: each call's component, as the index of its first call, and the lowest similarity of
    its links (NaN: none). The same links, found column-wise rather than call by call (a relink
    of a 100,000-call run's (run, tool) key links ~12k calls): a call to the first call of its
    group's (basis, signature) at 1.0; a call with arguments to each of its group's last
    NEIGHBOUR_WINDOW calls with arguments of another signature, at their token sets' Jaccard
    when that is at least ``threshold`` and neither set is empty."""
    n = len(calls)
    index = np.arange(n)
    if not n:
        return index, np.zeros(0)
    group = calls.groupby(_GROUP, sort=False, dropna=False).ngroup().to_numpy()
    keyed = calls[[*_GROUP, "basis", "norm_args"]].assign(i=index)
    firsts = keyed.groupby([*_GROUP, "basis", "norm_args"], sort=False, dropna=False)["i"].transform("min")
    firsts = firsts.to_numpy()
    mine, other, score = (
        [index[firsts != index]],
        [firsts[firsts != index]],
        [np.ones(int((firsts != index).sum()))],
    )
    with_args = index[calls["basis"].to_numpy(dtype=object) == "arguments"]
    if len(with_args) > 1:
        # (signatures as codes: compared as integers, not as Python strings)
        signatures = pd.factorize(
            calls["norm_args"].to_numpy(dtype=object)[with_args], use_na_sentinel=False
        )[0]
        # each distinct argument text tokenized once (calls repeat their arguments: that is
        # what a loop is), its token set a row of a sparse matrix; a call's row is its text's
        codes, texts = pd.factorize(calls["args"].to_numpy(dtype=object)[with_args], use_na_sentinel=False)
        vocabulary: dict[str, int] = {}
        columns: list[int] = []
        text_sizes = np.zeros(len(texts), dtype=np.int64)
        for row, text in enumerate(texts):
            tokens = similarity_tokens(text)
            text_sizes[row] = len(tokens)
            columns.extend(vocabulary.setdefault(token, len(vocabulary)) for token in tokens)
        by_text = sparse.csr_matrix(
            (np.ones(len(columns)), np.array(columns, dtype=np.int64), np.r_[0, np.cumsum(text_sizes)]),
            shape=(len(texts), max(len(vocabulary), 1)),
        )
        sizes = text_sizes[codes]
        arg_group = group[with_args]
        for lag in range(1, min(loops.NEIGHBOUR_WINDOW, len(with_args) - 1) + 1):
            later = np.arange(lag, len(with_args))
            earlier = later - lag
            candidate = np.flatnonzero(
                (arg_group[later] == arg_group[earlier])
                & (signatures[later] != signatures[earlier])
                & (sizes[later] > 0)
                & (sizes[earlier] > 0)
            )
            later, earlier = later[candidate], earlier[candidate]
            # the shared tokens of each distinct pair of texts once (loops repeat their pairs)
            pairs = codes[later].astype(np.int64) * len(texts) + codes[earlier]
            distinct, inverse = np.unique(pairs, return_inverse=True)
            shared = by_text[distinct // len(texts)].multiply(by_text[distinct % len(texts)]).sum(axis=1)
            common = np.asarray(shared).ravel()[inverse]
            jaccard = common / (sizes[later] + sizes[earlier] - common)
            linked = jaccard >= threshold
            mine.append(with_args[later[linked]])
            other.append(with_args[earlier[linked]])
            score.append(jaccard[linked])
    mine_all, other_all, score_all = np.concatenate(mine), np.concatenate(other), np.concatenate(score)
    lows = np.full(n, np.inf)
    np.minimum.at(lows, mine_all, score_all)
    lows[np.isinf(lows)] = np.nan
    graph = sparse.coo_matrix((np.ones(len(mine_all)), (mine_all, other_all)), shape=(n, n))
    _, labels = csgraph.connected_components(graph, directed=False)
    roots = np.full(labels.max() + 1, n)
    np.minimum.at(roots, labels, index)  # a component's id is its first call's (``_Links``)
    return roots[labels], lows


def _new_tails(ends: pd.DataFrame, by_group: dict, new_kinds: dict, tails: dict, links: _Links) -> pa.Table:
    """The appended groups' tails (``_TAILS_SCHEMA``), built column by column: a dict per row
    and per tail entry took 0.4 s of a 1.2 s fold at 1M."""
    groups = list(zip(*(ends[c].tolist() for c in _GROUP), strict=True))
    sources, offsets, comps, args, sigs = [], [0], [], [], []
    find = links.find
    for group in groups:
        sources.append(sorted(by_group.get(group, (set(), None, []))[0] | new_kinds[group]))
        for comp, sig, text in reversed(tails.get(group, [])[-loops.NEIGHBOUR_WINDOW :]):
            comps.append(find(comp))
            args.append(text)
            sigs.append(sig)
        offsets.append(len(comps))
    tail_type = _TAILS_SCHEMA.field("tail").type
    entries = pa.StructArray.from_arrays(
        [pa.array(comps, pa.int64()), pa.array(args, pa.string()), pa.array(sigs, pa.string())],
        fields=list(tail_type.value_type),
    )
    last = pa.StructArray.from_arrays(
        [pa.array(ends["start_ns"].tolist(), pa.int64()), pa.array(ends["SpanId"].tolist(), pa.string())],
        fields=list(_TAILS_SCHEMA.field("last").type),
    )
    return pa.Table.from_arrays(
        [
            *(pa.array([g[i] for g in groups], pa.string()) for i in range(3)),
            pa.array(sources, pa.list_(pa.string())),
            last,
            pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), entries, type=tail_type),
        ],
        schema=_TAILS_SCHEMA,
    )


class _Links:
    """Union-find over component ids: kept components (ids below ``first``) and new calls (one id
    each from ``first``); a merge keeps the lowest id, so a kept component keeps its own."""

    def __init__(self, first: int):
        self.first = self.next = first
        self.parent: dict[int, int] = {}
        self.lows: dict[int, float] = {}

    def add(self) -> int:
        self.next += 1
        return self.next - 1

    def find(self, x: int) -> int:
        while self.parent.get(x, x) != x:
            self.parent[x] = self.parent.get(self.parent[x], self.parent[x])
            x = self.parent[x]
        return x

    def join(self, call: int, other: int, similarity: float) -> None:
        """Link new call ``call`` to ``other`` (a component or a new call) at ``similarity``."""
        self.lows[call] = min(self.lows.get(call, similarity), similarity)
        a, b = self.find(call), self.find(other)
        if a != b:
            self.parent[max(a, b)] = min(a, b)

    def low(self, call: int) -> float:
        """The lowest similarity of ``call``'s links (NaN: none): its component's lowest is the
        lowest of its members'."""
        return self.lows.get(call, np.nan)

    def merged(self) -> dict[int, int]:
        """Kept components merged into another: old id -> new id."""
        return {old: self.find(old) for old in self.parent if old < self.first and self.find(old) != old}


def apply(conn: duckdb.DuckDBPyConnection, fold: Fold) -> None:
    """In the writer's transaction: ``fold``'s rows replace the groups it names, after its
    merged components are relabelled."""
    item = Maintained(
        CALLS, "run_tool", compute, (), ""
    )  # the rows of groups, as a run_tool table writes them
    rows = _arrow(fold.rows)
    _record_changed(conn, fold)
    write_mark(conn, MARK, fold.mark)
    if fold.replace is None or not table_exists(conn, TABLE_PREFIX + CALLS):
        _write_rows(conn, item, rows, None)
        conn.execute(f"CREATE OR REPLACE TABLE {TAILS} AS {_tails_sql()}")
        return
    if fold.merged:
        conn.register("_merged", pa.table({"old": list(fold.merged), "new": list(fold.merged.values())}))
        try:
            conn.execute(f"UPDATE {TABLE} t SET comp = m.new FROM _merged m WHERE t.comp = m.old")
        finally:
            conn.unregister("_merged")
    keys = sorted(fold.replace)
    _write_rows(conn, item, rows, keys)
    # the tails of the groups appended to (from the fold) and of the groups recomputed
    if not table_exists(conn, TABLE_PREFIX + "repeated_calls_tails"):
        conn.execute(f"CREATE TABLE {TAILS} AS {_tails_sql()}")
        return
    replaced, params = run_tool_where(keys)
    appended = fold.tails if fold.tails is not None and fold.tails.num_rows else None
    if appended is not None:
        conn.register("_tails", appended)
    try:
        conn.execute(
            f"DELETE FROM {TAILS} WHERE {replaced}"
            + (
                " OR (run_id, agent, tool_name) IN (SELECT (run_id, agent, tool_name) FROM _tails)"
                if appended is not None
                else ""
            ),
            params,
        )
        if appended is not None:
            conn.execute(
                f"INSERT INTO {TAILS} SELECT run_id, agent, tool_name, sources, last, tail FROM _tails"
            )
    finally:
        if appended is not None:
            conn.unregister("_tails")
    if keys:
        conn.execute(f"INSERT INTO {TAILS} {_tails_sql('WHERE ' + replaced)}", params)


# The groups whose loops each fold may have changed, by the change it folded up to ("*": every
# group, a build), so repeated_calls_groups recomputes those instead of every group the change
# log names (analytics.loops_live). Rows repeated_calls_groups has reflected are pruned.
CHANGED = quote_identifier(TABLE_PREFIX + "repeated_calls_changed")


def _record_changed(conn: duckdb.DuckDBPyConnection, fold: Fold) -> None:
    if fold.upto is None:
        return
    conn.execute(f"CREATE TABLE IF NOT EXISTS {CHANGED} (seq BIGINT NOT NULL, key VARCHAR NOT NULL)")
    conn.execute(
        f"DELETE FROM {CHANGED} WHERE seq <= (SELECT coalesce(max(seq), -1) FROM findings_state "
        "WHERE metric = 'repeated_calls_groups')"
    )
    keys = ["*"] if fold.replace is None else sorted(fold.changed)
    if keys:
        conn.execute(
            f"INSERT INTO {CHANGED} SELECT $seq, unnest($keys::VARCHAR[])", {"seq": fold.upto, "keys": keys}
        )


def loops_changed(conn: duckdb.DuckDBPyConnection, after: int, upto: int) -> list[str] | None:
    """The groups whose loops the folds after change ``after`` up to ``upto`` may have changed
    ('run_tool' keys); None when every group may have (a build, or nothing recorded)."""
    if not table_exists(conn, TABLE_PREFIX + "repeated_calls_changed"):
        return None
    keys = [
        row[0]
        for row in conn.execute(
            f"SELECT DISTINCT key FROM {CHANGED} WHERE seq > $after AND seq <= $upto",
            {"after": after, "upto": upto},
        ).fetchall()
    ]
    return None if "*" in keys else keys


maintain(Maintained(CALLS, "span", compute, (), "1", apply=apply, build=build))
PARTS.add(CALLS)
