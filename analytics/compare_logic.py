"""Pure functions behind run comparison (issue 35): step codes, the first point of departure,
per agent and tool differences, and the step-by-step alignment of two runs.

Inputs are frames of ``compare_steps.sql`` rows (one per span, ``pos`` from 0 in start order);
nothing here reads a store. A *step* is a span's (agent, operation, tool, argument shape, status:
failed, refused or neither); runs
are aligned by the order of their steps, never by time. A run of repeats of one step (a block)
is compared by its length, so a healthy run that searched twice covers a run that searched twice
but not one that searched five times.
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


def step_keys(steps: pd.DataFrame) -> pd.Series:
    """Each row's step as one text (the fields joined by a separator no id contains)."""
    if steps.empty:
        return pd.Series([], dtype=object, index=steps.index)
    parts = [steps[f].fillna("").astype(str) for f in STEP_FIELDS]
    return parts[0].str.cat(parts[1:], sep="\x1f")


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


def expected_steps(
    baseline: Blocks, runs: np.ndarray, block: int, target_code: int, target_count: int, labels: list[str]
) -> list[str]:
    """What the baseline runs ``runs`` do at ``block``: their step there (with how often they
    repeat it when it is the target's step, repeated fewer times), or the end of the run; the
    commonest first."""
    seen: dict[str, int] = {}
    for run in runs:
        hit = np.flatnonzero((baseline.run == run) & (baseline.index == block))
        if len(hit) == 0:
            text = "(run ends)"
        else:
            row = hit[0]
            text = labels[baseline.code[row]]
            if baseline.code[row] == target_code and baseline.count[row] < target_count:
                text += f" x{baseline.count[row]} at most"
        seen[text] = seen.get(text, 0) + 1
    return [t for t, _ in sorted(seen.items(), key=lambda kv: -kv[1])][:MAX_EXPECTED]


def run_counts(steps: pd.DataFrame, run_index: pd.Index | None = None) -> pd.DataFrame:
    """Per (run, agent, operation, tool): calls, errors, refusals (zeros where a run has none of
    a subject another run has, when ``run_index`` lists the runs)."""
    if steps.empty:
        return pd.DataFrame(columns=["run_id", *SUBJECT_FIELDS, "calls", "errors", "refusals"])
    grouped = steps.groupby(["run_id", *SUBJECT_FIELDS], sort=False).agg(
        calls=("pos", "size"), errors=("is_error", "sum"), refusals=("is_refused", "sum")
    )
    if run_index is not None:
        subjects = grouped.reset_index()[list(SUBJECT_FIELDS)].drop_duplicates()
        full = pd.MultiIndex.from_frame(
            pd.DataFrame(run_index, columns=["run_id"]).merge(subjects, how="cross")
        )
        grouped = grouped.reindex(full, fill_value=0)
    return grouped.reset_index()


def baseline_profile(baseline: pd.DataFrame, baseline_runs: list[str]) -> pd.DataFrame:
    """The crew baseline per agent and tool over the healthy runs: call counts (median, min,
    max, share of runs with any), error and refusal rates, durations, hops, delegation targets,
    usual position (median first pos), argument shapes, lengths and distinct values, tokens and
    cost per run (medians, NaN when no span carries them)."""
    columns = [
        *SUBJECT_FIELDS, "runs_with", "calls_median", "calls_min", "calls_max", "error_rate",
        "refusal_rate", "errors", "refusals", "duration_ms_median", "duration_ms_p95", "max_hop",
        "delegates_to", "usual_pos", "arg_shapes", "arg_chars_median", "distinct_args",
        "tokens_median", "cost_median",
    ]  # fmt: skip
    if baseline.empty or not baseline_runs:
        return pd.DataFrame(columns=columns)
    counts = run_counts(baseline, pd.Index(baseline_runs))
    per_subject = counts.groupby(list(SUBJECT_FIELDS), sort=False)
    profile = per_subject.agg(
        runs_with=("calls", lambda c: float((c > 0).mean())),
        calls_median=("calls", "median"),
        calls_min=("calls", "min"),
        calls_max=("calls", "max"),
        errors=("errors", "sum"),
        refusals=("refusals", "sum"),
        total=("calls", "sum"),
    )
    profile["error_rate"] = profile["errors"] / profile["total"].where(profile["total"] > 0)
    profile["refusal_rate"] = profile["refusals"] / profile["total"].where(profile["total"] > 0)
    spans = baseline.groupby(list(SUBJECT_FIELDS), sort=False)
    profile["duration_ms_median"] = spans["duration_ns"].median() / 1e6
    profile["duration_ms_p95"] = spans["duration_ns"].quantile(0.95) / 1e6
    profile["max_hop"] = spans["hop"].max()
    profile["delegates_to"] = spans["delegate_to"].agg(lambda v: sorted(set(v.dropna())))
    profile["arg_shapes"] = spans["arg_shape"].agg(lambda v: sorted(set(v) - {""}))
    profile["arg_chars_median"] = spans["arg_chars"].median()
    with_args = baseline[baseline["arg_chars"].notna()]
    distinct = with_args.groupby(list(SUBJECT_FIELDS), sort=False)["arg_hash"].nunique()
    profile["distinct_args"] = distinct.reindex(profile.index, fill_value=0)
    firsts = baseline.groupby(["run_id", *SUBJECT_FIELDS], sort=False)["pos"].min()
    profile["usual_pos"] = firsts.groupby(level=list(SUBJECT_FIELDS), sort=False).median()
    per_run = baseline.groupby(["run_id", *SUBJECT_FIELDS], sort=False)[["tokens", "cost"]].sum(min_count=1)
    medians = per_run.groupby(level=list(SUBJECT_FIELDS), sort=False).median()
    profile["tokens_median"] = medians["tokens"]
    profile["cost_median"] = medians["cost"]
    profile = profile.drop(columns="total").reset_index()
    return profile.sort_values(["usual_pos", "agent", "tool"], kind="stable")[columns].reset_index(drop=True)


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
    for r in profile.itertuples(index=False):
        subject = (r.agent, r.operation, r.tool)
        if subject in present or r.calls_median <= 0:
            continue
        theirs = closest[(closest["agent"] == r.agent) & (closest["operation"] == r.operation) & (closest["tool"] == r.tool)]  # fmt: skip
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
    """The two runs' steps paired up in order (difflib's longest matching blocks on the step
    keys): one row per aligned step with each side's pos, span, step label, start offset and
    duration (ms), ``status`` same / changed / only_run / only_baseline, and the departure marked."""
    a = run.head(MAX_ALIGNED_STEPS).reset_index(drop=True)
    b = other.head(MAX_ALIGNED_STEPS).reset_index(drop=True)
    matcher = difflib.SequenceMatcher(None, list(step_keys(a)), list(step_keys(b)), autojunk=False)
    pairs: list[tuple[int | None, int | None, str]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += [(i1 + k, j1 + k, "same") for k in range(i2 - i1)]
        elif tag == "replace":
            n = max(i2 - i1, j2 - j1)
            for k in range(n):
                i = i1 + k if i1 + k < i2 else None
                j = j1 + k if j1 + k < j2 else None
                pairs.append((i, j, "changed" if i is not None and j is not None else ("only_run" if j is None else "only_baseline")))  # fmt: skip
        elif tag == "delete":
            pairs += [(i, None, "only_run") for i in range(i1, i2)]
        else:
            pairs += [(None, j, "only_baseline") for j in range(j1, j2)]
    rows = [
        _aligned_row(step, a, i, b, j, status, departure_pos) for step, (i, j, status) in enumerate(pairs)
    ]
    return pd.DataFrame(rows, columns=_ALIGNED_COLUMNS)


_ALIGNED_COLUMNS = [
    "step", "status", "departure",
    "run_pos", "run_span_id", "run_step", "run_start_ms", "run_duration_ms", "run_error",
    "baseline_pos", "baseline_span_id", "baseline_step", "baseline_start_ms", "baseline_duration_ms", "baseline_error",
]  # fmt: skip


def _side(frame: pd.DataFrame, i: int | None) -> list:
    if i is None:
        return [None] * 6
    row = frame.iloc[i]
    origin = int(frame["start_ns"].iloc[0])
    label = step_label(row["agent"], row["operation"], row["tool"], row["arg_shape"], row["status"])
    return [
        int(row["pos"]), str(row["span_id"]), label, (int(row["start_ns"]) - origin) / 1e6,
        int(row["duration_ns"]) / 1e6, bool(row["is_error"]),
    ]  # fmt: skip


def _aligned_row(step, a, i, b, j, status, departure_pos) -> list:
    marked = departure_pos is not None and i is not None and int(a["pos"].iloc[i]) == departure_pos
    return [step, status, marked, *_side(a, i), *_side(b, j)]
