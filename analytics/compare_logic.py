"""Pure functions behind run comparison (issue 35): step codes, the first point of departure,
per agent and tool differences, and the step-by-step alignment of two runs.

Inputs are ``compare_steps.sql`` rows (one per span of a run, ``pos`` from 0 in start order) and
the parts of ``compare_baseline.sql`` (step hashes per baseline run, counts and statistics per
agent and tool); nothing here reads a store. A *step* is a span's (agent, operation, tool,
argument shape, status: failed, refused or neither); runs are aligned by the order of their
steps, never by time. A run of repeats of one step (a block) is compared by its length, so a
healthy run that searched twice covers a run that searched twice but not one that searched five
times.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np
import pandas as pd

STEP_FIELDS = ("agent", "operation", "tool", "arg_shape", "status")
SUBJECT_FIELDS = ("agent", "operation", "tool")
# Most expected steps a departure lists (the steps the closest healthy runs take there).
MAX_EXPECTED = 5
# Most span ids one difference links to (a runaway run may have thousands of extra calls).
MAX_DIFFERENCE_SPANS = 50
# Most steps of each run the alignment pairs up (the waterfalls show them).
MAX_ALIGNED_STEPS = 2000
NO_DEPARTURE = np.iinfo(np.int64).max


def step_label(agent: str, operation: str, tool: str, arg_shape: str = "", status: str = "") -> str:
    """A step as people read it: ``agent · tool {keys} (error)`` (the operation when there is no
    tool)."""
    what = tool or operation or "span"
    who = agent or "(no agent)"
    shape = f" {arg_shape}" if arg_shape and arg_shape != "{}" else ""
    return f"{who} · {what}{shape}" + (f" ({status})" if status else "")


def step_fields(row) -> dict:
    """A departure's span and step, from a row of a run's steps (``pos``, ``span_id``,
    ``trace_id``, ``agent``, ``operation``, ``tool``, ``arg_shape``, ``status``)."""
    return {
        "pos": int(row["pos"]),
        "span_id": str(row["span_id"]),
        "trace_id": str(row["trace_id"]),
        "agent": row["agent"],
        "operation": row["operation"],
        "tool": row["tool"],
        "arg_shape": row["arg_shape"],
        "status": row["status"],
        "step": step_label(row["agent"], row["operation"], row["tool"], row["arg_shape"], row["status"]),
    }


@dataclass(frozen=True)
class Blocks:
    """Consecutive repeats of one step, per run: ``run`` (index into the runs), ``index`` (the
    block's number in its run), ``code`` (step code), ``count`` (repeats), ``start`` (pos of the
    block's first span)."""

    run: np.ndarray
    index: np.ndarray
    code: np.ndarray
    count: np.ndarray
    start: np.ndarray


def to_blocks(run_codes: np.ndarray, codes: np.ndarray, pos: np.ndarray) -> Blocks:
    """Blocks of rows sorted by (run, pos): a new block where the run or the step changes."""
    n = len(codes)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Blocks(empty, empty, empty, empty, empty)
    new = np.ones(n, dtype=bool)
    new[1:] = (codes[1:] != codes[:-1]) | (run_codes[1:] != run_codes[:-1])
    first = np.flatnonzero(new)
    counts = np.diff(np.append(first, n))
    runs = run_codes[first]
    new_run = np.ones(len(first), dtype=bool)
    new_run[1:] = runs[1:] != runs[:-1]
    run_first = np.flatnonzero(new_run)
    index = np.arange(len(first)) - np.repeat(run_first, np.diff(np.append(run_first, len(first))))
    return Blocks(runs.astype(np.int64), index.astype(np.int64), codes[first], counts, pos[first])


def departures(target: Blocks, baseline: Blocks, baseline_runs: int) -> tuple[np.ndarray, np.ndarray]:
    """For each baseline run, the pos of the target run where that run stops covering it
    (``NO_DEPARTURE`` when it covers every step) and the target block index where it stopped.

    A baseline run covers the target's block k when both have block k of the same step and the
    target repeats it no more often; it covers the target up to where the first block fails, or
    to the end of its own blocks (the target's next block is then a step it never takes there).
    """
    k_target = len(target.code)
    stop_pos = np.full(baseline_runs, NO_DEPARTURE, dtype=np.int64)
    stop_block = np.full(baseline_runs, k_target, dtype=np.int64)
    if k_target == 0 or baseline_runs == 0:
        return stop_pos, stop_block
    inside = baseline.index < k_target
    runs, index = baseline.run[inside], baseline.index[inside]
    code, count = baseline.code[inside], baseline.count[inside]
    same = code == target.code[index]
    over = same & (target.count[index] > count)
    failing = ~same | over
    at = np.where(same, target.start[index] + count, target.start[index])
    # First failing block per run: rows are in (run, index) order, so the first hit per run.
    fail_rows = np.flatnonzero(failing)
    fail_runs, first = np.unique(runs[fail_rows], return_index=True)
    rows = fail_rows[first]
    stop_pos[fail_runs] = at[rows]
    stop_block[fail_runs] = index[rows]
    # A run with fewer blocks than the target and no failing block stops at its end.
    blocks_per_run = np.bincount(baseline.run, minlength=baseline_runs)
    short = (blocks_per_run < k_target) & (stop_pos == NO_DEPARTURE)
    stop_block[short] = blocks_per_run[short]
    stop_pos[short] = target.start[blocks_per_run[short]]
    return stop_pos, stop_block


def closest_run(
    baseline: Blocks,
    candidates: np.ndarray,
    subject_of: np.ndarray,
    target_codes: np.ndarray,
    lengths: np.ndarray,
    target_length: int,
) -> int:
    """Of the baseline runs ``candidates`` (those that cover the target furthest), the one to show
    beside it: the one whose subjects (agent, operation, tool: ``subject_of`` a step code's) are
    most like the target's (Jaccard of the two sets, so a run doing other things besides is
    further), then the nearest in length (``lengths``, in steps), then the first."""
    candidates = np.asarray(candidates, dtype=np.int64)
    runs = len(lengths)
    subjects = int(subject_of.max()) + 1 if len(subject_of) else 1
    chosen = np.zeros(runs, dtype=bool)
    chosen[candidates] = True
    rows = chosen[baseline.run]
    pairs = np.unique(baseline.run[rows] * subjects + subject_of[baseline.code[rows]])
    run_of, subject = pairs // subjects, pairs % subjects
    mine = np.zeros(subjects, dtype=bool)
    mine[subject_of[target_codes]] = True
    shared = np.bincount(run_of[mine[subject]], minlength=runs)
    union = np.bincount(run_of, minlength=runs) + int(mine.sum()) - shared
    likeness = shared / np.maximum(union, 1)
    distance = np.abs(np.asarray(lengths, dtype=np.int64)[candidates] - target_length)
    return int(candidates[np.lexsort((distance, -likeness[candidates]))[0]])


def expected_steps(
    baseline: Blocks,
    runs: np.ndarray,
    block: int,
    target_code: int,
    target_count: int,
    labels: list[str],
    weights: np.ndarray | None = None,
) -> list[str]:
    """What the baseline runs ``runs`` do at ``block``: their step there (with how often they
    repeat it when it is the target's step, repeated fewer times), or the end of the run; the
    commonest first. ``weights``: how many runs each baseline entry stands for (one each when
    None)."""
    weight = np.ones(int(baseline.run.max()) + 1 if len(baseline.run) else 0, dtype=np.int64)
    if weights is not None:
        weight = np.asarray(weights, dtype=np.int64)
    chosen = np.zeros(int(baseline.run.max()) + 1 if len(baseline.run) else 0, dtype=bool)
    chosen[runs] = True
    rows = (
        np.flatnonzero((baseline.index == block) & chosen[baseline.run]) if len(chosen) else np.zeros(0, int)
    )
    seen: dict[str, int] = {}
    for row in rows:
        text = labels[baseline.code[row]]
        if baseline.code[row] == target_code and baseline.count[row] < target_count:
            text += f" x{baseline.count[row]} at most"
        seen[text] = seen.get(text, 0) + int(weight[baseline.run[row]])
    ended = int(weight[runs].sum()) - sum(int(weight[baseline.run[row]]) for row in rows)
    if ended:
        seen["(run ends)"] = ended
    return [t for t, _ in sorted(seen.items(), key=lambda kv: -kv[1])][:MAX_EXPECTED]


def run_counts(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (agent, operation, tool) of one run's steps: calls, errors, refusals."""
    if steps.empty:
        return pd.DataFrame(columns=[*SUBJECT_FIELDS, "calls", "errors", "refusals"])
    grouped = steps.groupby(list(SUBJECT_FIELDS), sort=False).agg(
        calls=("pos", "size"), errors=("is_error", "sum"), refusals=("is_refused", "sum")
    )
    return grouped.reset_index()


def blocks_from_lists(lengths: np.ndarray, flat: np.ndarray, codes_of: dict) -> Blocks:
    """Blocks of the baseline runs from their step hashes in order, all runs' concatenated in
    ``flat`` (``lengths``: how many are each run's; ``compare_baseline.sql`` part 'run'), the
    hashes turned into codes by ``codes_of``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.sum() == 0:
        empty = np.zeros(0, dtype=np.int64)
        return to_blocks(empty, empty, empty)
    unique, inverse = np.unique(np.asarray(flat, dtype=np.uint64), return_inverse=True)
    lookup = np.array([codes_of[int(h)] for h in unique], dtype=np.int64)
    runs = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return to_blocks(runs, lookup[inverse], np.arange(len(runs), dtype=np.int64) - starts)


PROFILE_COLUMNS = [
    *SUBJECT_FIELDS, "runs_with", "calls_median", "calls_min", "calls_max", "error_rate",
    "refusal_rate", "errors", "refusals", "duration_ms_median", "duration_ms_p95", "max_hop",
    "delegates_to", "usual_order", "arg_shapes", "arg_chars_median", "distinct_args",
    "tokens_median", "cost_median",
]  # fmt: skip


def baseline_profile(counts: pd.DataFrame, subjects: pd.DataFrame, runs: int) -> pd.DataFrame:
    """The crew baseline per agent and tool over ``runs`` healthy runs, from
    ``compare_baseline.sql``'s 'count' rows (per run and subject) and 'subject' rows: call counts
    (median, min, max over every run, zero where a run has none; share of runs with any), error
    and refusal rates, durations, hops, delegation targets, the usual order (median rank of its
    first call among the run's subjects), argument shapes, lengths and distinct values, tokens and
    cost per run (medians over the runs that have them)."""
    if counts.empty or runs == 0:
        return pd.DataFrame(columns=PROFILE_COLUMNS)
    key = list(SUBJECT_FIELDS)
    counts = counts.copy()
    counts["rank"] = counts.groupby("run_id")["first_ns"].rank(method="first")
    grouped = counts.groupby(key, sort=False)
    profile = grouped.agg(
        present=("calls", "size"),
        calls_max=("calls", "max"),
        errors=("errors", "sum"),
        refusals=("refusals", "sum"),
        total=("calls", "sum"),
        usual_order=("rank", "median"),
        tokens_median=("tokens", "median"),
        cost_median=("cost", "median"),
    )
    profile["runs_with"] = profile["present"] / runs
    lowest = grouped["calls"].min()
    profile["calls_min"] = lowest.where(profile["present"] == runs, 0)
    profile["calls_median"] = grouped["calls"].agg(lambda c: float(np.median(np.concatenate([c.to_numpy(), np.zeros(runs - len(c))]))))  # fmt: skip
    profile["error_rate"] = profile["errors"] / profile["total"].where(profile["total"] > 0)
    profile["refusal_rate"] = profile["refusals"] / profile["total"].where(profile["total"] > 0)
    profile = profile.join(subjects.set_index(key)[[
        "duration_ms_median", "duration_ms_p95", "max_hop", "delegates_to", "arg_shapes", "arg_chars_median", "distinct_args"
    ]])  # fmt: skip
    for column in ("delegates_to", "arg_shapes"):
        profile[column] = profile[column].map(
            lambda v: [str(x) for x in v] if isinstance(v, list | np.ndarray) else []
        )
    profile = profile.reset_index().sort_values(["usual_order", "agent", "tool"], kind="stable")
    return profile[PROFILE_COLUMNS].reset_index(drop=True)


def _spans(frame: pd.DataFrame, limit: int = MAX_DIFFERENCE_SPANS) -> list[str]:
    return [str(s) for s in frame["span_id"].head(limit)]


def differences(
    run: pd.DataFrame, profile: pd.DataFrame, closest: pd.DataFrame, baseline_targets: set[str]
) -> list[dict]:
    """What differs, per agent and tool, between a run's steps and the baseline ``profile``:
    ``new`` (no healthy run has it), ``missing`` (at least half the healthy runs have it, this
    run does not), ``more`` / ``fewer`` (calls outside the healthy runs' range), ``errors`` and
    ``refusals`` the baseline never has, ``new_delegation`` (to an agent no healthy run hands
    work to), ``argument_shape`` (keys the baseline never passes to this tool). Each names the
    run's spans it is about (``closest``: the closest healthy run's spans, for what is missing)."""
    out: list[dict] = []
    key = list(SUBJECT_FIELDS)
    known = {tuple(r): r for r in profile[key].itertuples(index=False, name=None)} if len(profile) else {}
    by_subject = profile.set_index(key) if len(profile) else None
    for subject, spans in run.groupby(key, sort=False):
        agent, operation, tool = subject
        row = {"agent": agent, "operation": operation, "tool": tool, "calls": int(len(spans))}
        errors, refusals = spans[spans["is_error"]], spans[spans["is_refused"]]
        if subject not in known:
            targets = set(spans["delegate_to"].dropna())
            if targets and not targets & baseline_targets:
                kind = "new_delegation"
                detail = f"hands work to {', '.join(sorted(targets))}, which no healthy run delegates to"
            else:
                kind = "new"
                detail = f"{len(spans)} call(s); no healthy run takes this step"
            out.append(
                {**row, "kind": kind, "baseline": "never", "detail": detail, "span_ids": _spans(spans)}
            )
            for kind, bad in (("errors", errors), ("refusals", refusals)):
                if len(bad):
                    detail = f"{len(bad)} {kind[:-1]}(s); the baseline never has this step"
                    out.append(
                        {**row, "kind": kind, "baseline": "never", "detail": detail, "span_ids": _spans(bad)}
                    )
            continue
        base = by_subject.loc[subject]
        lo, hi, med = int(base["calls_min"]), int(base["calls_max"]), float(base["calls_median"])
        span_range = f"{lo}-{hi} (median {med:g})"
        if len(spans) > hi:
            extra = spans.iloc[hi:]
            detail = f"{len(spans)} calls; healthy runs make {span_range}"
            out.append(
                {**row, "kind": "more", "baseline": span_range, "detail": detail, "span_ids": _spans(extra)}
            )
        elif len(spans) < lo:
            detail = f"{len(spans)} calls; healthy runs make {span_range}"
            out.append(
                {**row, "kind": "fewer", "baseline": span_range, "detail": detail, "span_ids": _spans(spans)}
            )
        for kind, bad, total in (
            ("errors", errors, base["errors"]),
            ("refusals", refusals, base["refusals"]),
        ):
            if len(bad) and total == 0:
                detail = f"{len(bad)} of {len(spans)} calls; no healthy run ever has one here"
                out.append({**row, "kind": kind, "baseline": "0", "detail": detail, "span_ids": _spans(bad)})
        shapes = set(base["arg_shapes"])
        new_shape = spans[(spans["arg_shape"] != "") & ~spans["arg_shape"].isin(shapes)]
        if len(new_shape) and shapes:
            detail = f"arguments {', '.join(sorted(set(new_shape['arg_shape'])))}; healthy runs pass {', '.join(sorted(shapes))}"
            out.append({**row, "kind": "argument_shape", "baseline": ", ".join(sorted(shapes)), "detail": detail, "span_ids": _spans(new_shape)})  # fmt: skip
    present = set(run.groupby(key, sort=False).size().index) if len(run) else set()
    theirs_by = dict(tuple(closest.groupby(key, sort=False))) if len(closest) else {}
    for r in profile.itertuples(index=False):
        subject = (r.agent, r.operation, r.tool)
        if subject in present or r.calls_median <= 0:
            continue
        theirs = theirs_by.get(subject, closest.head(0))
        out.append(
            {
                "agent": r.agent, "operation": r.operation, "tool": r.tool, "calls": 0, "kind": "missing",
                "baseline": f"{int(r.calls_min)}-{int(r.calls_max)} (median {r.calls_median:g})",
                "detail": f"{r.runs_with:.0%} of healthy runs take this step; this run never does",
                "span_ids": [], "baseline_span_ids": _spans(theirs),
            }
        )  # fmt: skip
    return out


def alignment(run: pd.DataFrame, other: pd.DataFrame, departure_pos: int | None) -> pd.DataFrame:
    """The two runs' steps (``compare_steps.sql`` rows) paired up in order (difflib's longest
    matching blocks on the step hashes): one row per aligned step with each side's pos, span,
    step label, start offset and duration (ms) and whether it failed, ``status`` same / changed /
    only_run / only_baseline, and the departure marked."""
    a = run.head(MAX_ALIGNED_STEPS).reset_index(drop=True)
    b = other.head(MAX_ALIGNED_STEPS).reset_index(drop=True)
    matcher = difflib.SequenceMatcher(None, a["step"].tolist(), b["step"].tolist(), autojunk=False)
    left: list[int] = []
    right: list[int] = []
    status: list[str] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        n = max(i2 - i1, j2 - j1)
        for k in range(n):
            i = i1 + k if i1 + k < i2 else -1
            j = j1 + k if j1 + k < j2 else -1
            left.append(i)
            right.append(j)
            if tag == "equal":
                status.append("same")
            else:
                status.append("changed" if i >= 0 and j >= 0 else ("only_run" if j < 0 else "only_baseline"))
    out = pd.DataFrame({"step": np.arange(len(status)), "status": status})
    for side, frame, index in (
        ("run", a, np.array(left, dtype=np.int64)),
        ("baseline", b, np.array(right, dtype=np.int64)),
    ):
        for name, values in _side_columns(frame).items():
            picked = pd.Series(
                values[np.clip(index, 0, None)] if len(values) else np.full(len(index), None, dtype=object)
            )
            out[f"{side}_{name}"] = picked.where(index >= 0, None).astype(object)
    out["departure"] = (out["run_pos"] == departure_pos) if departure_pos is not None else False
    out["departure"] = out["departure"].astype(bool)
    return out[_ALIGNED_COLUMNS]


_ALIGNED_COLUMNS = [
    "step", "status", "departure",
    "run_pos", "run_span_id", "run_step", "run_start_ms", "run_duration_ms", "run_error",
    "baseline_pos", "baseline_span_id", "baseline_step", "baseline_start_ms", "baseline_duration_ms", "baseline_error",
]  # fmt: skip


def _side_columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """One run's aligned columns as arrays: pos, span id, step label, start (ms after its first
    span), duration (ms), failed."""
    if frame.empty:
        return {
            name: np.array([], dtype=object)
            for name in ("pos", "span_id", "step", "start_ms", "duration_ms", "error")
        }
    origin = int(frame["start_ns"].iloc[0])
    labels = [step_label(*fields) for fields in frame[list(STEP_FIELDS)].itertuples(index=False, name=None)]
    return {
        "pos": frame["pos"].to_numpy(dtype=np.int64),
        "span_id": frame["span_id"].astype(str).to_numpy(dtype=object),
        "step": np.array(labels, dtype=object),
        "start_ms": (frame["start_ns"].to_numpy(dtype=np.int64) - origin) / 1e6,
        "duration_ms": frame["duration_ns"].to_numpy(dtype=np.int64) / 1e6,
        "error": frame["is_error"].to_numpy(dtype=bool),
    }
