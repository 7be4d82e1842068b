"""repeated_calls against two references on random span sets.

* The old detector (tests/reference_sql/repeated_calls_v1.sql: every pair of calls of a (run,
  agent, tool, failing) group compared, loops of 3+ as components) where its answer was right:
  groups whose calls all succeed or all fail (the old SQL split a retry loop at its first
  success), arguments that are exact re-spellings (case, white space, key order) or
  near-duplicates (a word added) of a request, and groups short enough that every pair of calls
  is within the new neighbour window. There the new loops must be exactly the old ones.
* A pure-Python all-pairs reference of the new definition (any two calls of a (run, agent,
  tool) group with identical normalized arguments, or within NEIGHBOUR_WINDOW calls of each
  other with a similarity >= the threshold; components of 3+ executed or 3+ refused calls), on
  long groups with English words, stop words, plurals, JSON escapes and mixed outcomes. This
  checks that the size and prefix filters of the SQL never drop a link.
On long groups the new loops refine the old ones: every new loop of one outcome class lies inside
an old loop (a link between far-apart re-worded calls is no longer made).
"""

from __future__ import annotations

import json
import pathlib
import random

import duckdb
import numpy as np
import pytest

from analytics import run_metric
from analytics.loop_similarity import argument_words, similarity_tokens
from analytics.loops import MIN_REPEATS, NEIGHBOUR_WINDOW, connected_components
from analytics.sql_loader import filter_params, query_df
from analytics.types import Filters, Window
from tests.fixtures_analytics import insert_spans, make_span, new_db

OLD_SQL = (
    pathlib.Path(__file__).resolve().parents[1] / "reference_sql" / "repeated_calls_v1.sql"
).read_text()
SPAN_FILTER = "(TRUE)"
THRESHOLD = 0.75  # the uncalibrated default of near_duplicate_similarity, as in the old detector


def _words(args: str) -> list[str]:
    return argument_words(args)


def _tokens(args: str) -> frozenset[str]:
    return similarity_tokens(args)


def _jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def reference_loops(calls: list[dict], threshold: float = THRESHOLD) -> set:
    """The new definition, all pairs in Python: {(run, agent, tool, frozenset(span ids))}."""
    found = set()
    groups: dict[tuple, list[dict]] = {}
    for call in calls:
        if call["run_id"] is None:
            continue
        groups.setdefault((call["run_id"], call["agent_id"] or "", call["tool_name"]), []).append(call)
    for key, members in groups.items():
        members = sorted(members, key=lambda c: (c["start_ns"], c["SpanId"]))
        sigs = [" ".join(sorted(_words(c["tool_args"] or ""))) for c in members]
        toks = [_tokens(c["tool_args"] or "") for c in members]
        left, right = [], []
        for i in range(len(members)):
            for j in range(i):
                exact = sigs[i] == sigs[j]
                near = i - j <= NEIGHBOUR_WINDOW and toks[i] and _jaccard(toks[i], toks[j]) >= threshold
                if exact or near:
                    left.append(i)
                    right.append(j)
        labels = connected_components(len(members), np.array(left, int), np.array(right, int))
        for label in set(labels):
            comp = [members[k] for k in range(len(members)) if labels[k] == label]
            refused = sum(c["outcome"] == "rejected" for c in comp)
            if len(comp) - refused >= MIN_REPEATS or refused >= MIN_REPEATS:
                found.add((*key, frozenset(c["SpanId"] for c in comp)))
    return found


def old_loops(conn: duckdb.DuckDBPyConnection) -> set:
    """The old detector: its SQL and its grouping (3+ executed or 3+ refused per component)."""
    params = {**filter_params(Window(), Filters()), "similarity": THRESHOLD}
    calls = query_df(conn, OLD_SQL.replace("{span_filter}", SPAN_FILTER), params)
    if calls.empty:
        return set()
    pairs = calls[["call_idx", "similar_later"]].explode("similar_later").dropna()
    order = calls["call_idx"].to_numpy(dtype=np.int64)
    sorter = np.argsort(order)

    def position(idx):
        return sorter[np.searchsorted(order, np.asarray(idx, dtype=np.int64), sorter=sorter)]

    labels = connected_components(len(calls), position(pairs["call_idx"]), position(pairs["similar_later"]))
    calls = calls.assign(loop=labels)
    found = set()
    for _, comp in calls.groupby("loop"):
        refused = int(comp["rejected"].sum())
        if len(comp) - refused >= MIN_REPEATS or refused >= MIN_REPEATS:
            row = comp.iloc[0]
            agent = row["agent"] or ""
            found.add((row["run_id"], agent, row["tool_name"], frozenset(comp["SpanId"])))
    return found


def new_loops(conn: duckdb.DuckDBPyConnection) -> set:
    loops = run_metric(conn, "repeated_calls")
    return {(r.run_id, r.agent or "", r.tool_name, frozenset(r.span_ids)) for r in loops.itertuples()}


SYLLABLES = ["ka", "lo", "mi", "ru", "te", "zo", "vi", "na", "po", "qu"]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(2)) + rng.choice("kmnprtvz")


def _spelling(rng: random.Random, words: list[str], extra: str | None) -> str:
    """One call's arguments: the words re-spelled (case, white space, key order)."""
    text = " ".join(words + ([extra] if extra else []))
    text = rng.choice([text, text.upper(), text.title(), "  " + text.replace(" ", "   ") + " "])
    args = {"q": text, "n": "1"}
    items = list(args.items())
    rng.shuffle(items)
    return json.dumps(dict(items), separators=rng.choice([(",", ":"), (", ", ": ")]))


def _random_calls(rng: random.Random, max_group: int, mixed_outcomes: bool, english: bool) -> list[dict]:
    rows: list[dict] = []
    t = 0.0
    for run in ("run-1", "run-2"):
        for agent in ("a", "b"):
            for tool in ("search", "fetch"):
                size = rng.randint(0, max_group)
                families = [[_word(rng) for _ in range(rng.randint(4, 6))] for _ in range(rng.randint(1, 3))]
                if english:
                    families = [rng.sample(ENGLISH, rng.randint(2, 6)) for _ in range(rng.randint(1, 3))]
                group_outcome = rng.choice(["ok", "error"])
                for _ in range(size):
                    words = rng.choice(families)
                    extra = None
                    if rng.random() < 0.3:
                        extra = rng.choice(ENGLISH) if english else _word(rng)
                    outcome = (
                        rng.choice(["ok", "error", "error", "rejected"]) if mixed_outcomes else group_outcome
                    )
                    t += rng.choice([0.0, 0.5, 1.0])  # ties in time are ordered by span id
                    rows.append(make_span(t, run=run, agent_id=agent, tool_name=tool, outcome=outcome,
                                          tool_args=_spelling(rng, words, extra)))  # fmt: skip
    rng.shuffle(rows)  # storage order is not time order
    return rows


ENGLISH = (
    "weather forecast paris revenue revenues eu 2024 2023 region regions searching searched search "
    "what is the of in latest current companies company prices price hotel hotels lisbon venues "
    "people report reports quarterly q3_sales table.name v1.2 please find me show"
).split()


def _seeds(count: int, fast: int = 10) -> list:
    """Random seeds: the first ``fast`` in `make test-fast` (the inner loop), all in `make test`."""
    return [s if s < fast else pytest.param(s, marks=pytest.mark.slow) for s in range(count)]


@pytest.mark.parametrize("seed", _seeds(30))
def test_new_loops_equal_old_loops_where_old_was_right(seed):
    rng = random.Random(seed)
    conn = new_db()
    insert_spans(conn, _random_calls(rng, NEIGHBOUR_WINDOW + 1, mixed_outcomes=False, english=False))
    old, new = old_loops(conn), new_loops(conn)
    assert new == old


@pytest.mark.parametrize("seed", _seeds(15, fast=5))
def test_new_loops_on_long_groups_refine_old_loops(seed):
    rng = random.Random(1000 + seed)
    conn = new_db()
    insert_spans(conn, _random_calls(rng, 25, mixed_outcomes=False, english=False))
    old = old_loops(conn)
    for loop in new_loops(conn):
        assert any(loop[:3] == o[:3] and loop[3] <= o[3] for o in old), loop


@pytest.mark.parametrize("seed", _seeds(30))
def test_sql_equals_all_pairs_reference_of_the_new_definition(seed):
    rng = random.Random(5000 + seed)
    conn = new_db()
    rows = _random_calls(rng, 25, mixed_outcomes=True, english=seed % 2 == 0)
    if seed % 3 == 0:  # JSON escapes and refused calls
        for row in rows[::4]:
            row["tool_args"] = row["tool_args"].replace(" ", "\\n", 1)
    insert_spans(conn, rows)
    assert new_loops(conn) == reference_loops(rows)


@pytest.mark.slow  # builds every random set again (32 s of `make test-fast` on 2 cores); CI runs it
def test_differential_sets_have_loops_of_every_kind():
    # otherwise the tests above would compare empty sets
    kinds, refined = set(), 0
    for seed in range(20):
        conn = new_db()
        insert_spans(conn, _random_calls(random.Random(seed), NEIGHBOUR_WINDOW + 1, False, False))
        kinds |= set(run_metric(conn, "repeated_calls")["kind"])
        conn = new_db()
        insert_spans(conn, _random_calls(random.Random(1000 + seed), 25, False, False))
        refined += len(old_loops(conn)) != len(new_loops(conn)) or old_loops(conn) != new_loops(conn)
    assert kinds == {"exact", "near_duplicate"}
    assert refined > 0  # on long groups some far-apart links were dropped
