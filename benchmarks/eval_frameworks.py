"""Detection quality on real-framework traces: ``python -m benchmarks.eval_frameworks``.

Starts a real ``driftscope serve`` on free loopback ports, POSTs every captured OTLP request of
``sample_traces/frameworks/*/otlp.jsonl`` to /v1/traces unchanged (same body, content type and
encoding as the framework's exporter sent), reads every detector back through the read API
(/api/v1/metrics/<name>, /api/v1/metrics/run_summary, /api/v1/runs/<run>/spans) and scores it
against each run set's ``truth.json``:

- per injected failure: found by the detector meant for it, or missed; other detectors' findings;
- per healthy run: findings of any detector (false findings) and the run verdict;
- per run set: of the spans under an agent span, the share that got an agent (and the right one).

Writes ``docs/detection-quality.md`` (with the date and commit) and prints the same tables.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from benchmarks.serve_proc import REPO, ServeProcess
from corpus.dump import read_requests
from corpus.truth import FAILURE_DETECTORS, FAILURE_TEXT, RunSet, RunTruth, load_run_set

logger = logging.getLogger(__name__)

CORPUS = REPO / "sample_traces" / "frameworks"
REPORT = REPO / "docs" / "detection-quality.md"
# Findings of goal_divergence come from embeddings; the worker scores new subtasks in the
# background, so the evaluation waits until serve's health says the worker has caught up with
# every commit (``embedding_worker.caught_up``).
EMBEDDING_WAIT_SECONDS = 240.0


# A finding counts for an injected failure only when its evidence names the tool the failure was
# injected on (a loop of some other tool in the same run is not that failure being found).
FAILURE_TOOL = {"retry_loop": "web_search", "duplicate_side_effect": "send_report"}
# detector -> the words run_summary's coverage uses for a run that detector cannot see
# (analytics.coverage): a missed failure in such a run is "not measurable", not "missed".
NOT_MEASURABLE = {
    "repeated_calls": "repeated calls and duplicate side effects not measurable",
    "duplicate_side_effects": "repeated calls and duplicate side effects not measurable",
    "goal_divergence": "goal drift not measurable",
}


def _norm(text: str) -> str:
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split())


def statement_matches(extracted: str | None, truth: str) -> bool:
    """True when an extracted task statement is the true one (or contains it, or is contained in
    it and at least half as long): a statement lost in framework boilerplate does not match."""
    if not extracted:
        return False
    got, want = _norm(extracted), _norm(truth)
    return want in got and len(got) <= 3 * len(want) + 40 or (got in want and len(got) * 2 >= len(want))


@dataclass
class RunResult:
    run_set: str
    truth: RunTruth
    stored_run_ids: list[str] = field(default_factory=list)
    findings: dict[str, int] = field(default_factory=dict)  # detector -> findings in this run
    verdicts: list[str] = field(default_factory=list)  # run_summary verdict of each stored run id
    coverage: list[str] = field(default_factory=list)  # run_summary coverage notes of its stored run ids
    spans: int = 0
    matched: int = 0  # findings of the expected detector whose evidence is the injected failure
    flagged_subtasks: list[str] = field(default_factory=list)  # goal_divergence's subtask statements
    extracted_subtasks: list[str] = field(default_factory=list)  # every subtask statement scored

    @property
    def tasks_extracted(self) -> tuple[int, int]:
        """(true task statements found among the extracted subtask statements, true statements)."""
        truths = {s.task for s in self.truth.subtasks}
        found = sum(
            1 for want in truths if any(statement_matches(got, want) for got in self.extracted_subtasks)
        )
        return found, len(truths)

    @property
    def unclean_flagged(self) -> list[str]:
        """Flagged statements that are not a true task statement of the run (boilerplate kept)."""
        truths = [s.task for s in self.truth.subtasks]
        return [t for t in self.flagged_subtasks if not any(statement_matches(t, want) for want in truths)]

    @property
    def expected_detector(self) -> str | None:
        return FAILURE_DETECTORS.get(self.truth.failure) if self.truth.failure else None

    @property
    def found(self) -> bool | None:
        """True/False for an injected failure (was its detector's finding there); None if healthy."""
        if self.expected_detector is None:
            return None
        return self.matched > 0

    @property
    def not_measurable(self) -> bool:
        """A missed failure whose run says its detector could not see it (run_summary coverage)."""
        phrase = NOT_MEASURABLE.get(self.expected_detector or "")
        return not self.found and phrase is not None and any(phrase in note for note in self.coverage)

    @property
    def other_findings(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.findings.items()) if v and k != self.expected_detector}

    @property
    def verdict(self) -> str:
        """The worst verdict over the stored runs of this run ('missing' when none was stored)."""
        order = ["missing", "healthy", "degraded", "to review", "failing"]
        return (
            max(self.verdicts, key=lambda v: order.index(v) if v in order else 2.5)
            if self.verdicts
            else "missing"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_set": self.run_set,
            "run": self.truth.run,
            "failure": self.truth.failure,
            "expected_detector": self.expected_detector,
            "found": self.found,
            "not_measurable": self.not_measurable,
            "coverage": sorted(set(self.coverage)),
            "matched_findings": self.matched,
            "findings": dict(sorted(self.findings.items())),
            "verdict": self.verdict,
            "stored_run_ids": self.stored_run_ids,
            "flagged_subtasks": [t[:300] for t in self.flagged_subtasks],
            "unclean_flagged": len(self.unclean_flagged),
            "tasks_extracted": list(self.tasks_extracted),
            "extracted_subtasks": [t[:300] for t in self.extracted_subtasks],
            "spans": self.spans,
        }


@dataclass
class AgentCoverage:
    """Spans under an agent span (ancestor-or-self named in the truth's agent_span_names)."""

    under_agent: int = 0
    with_agent: int = 0
    right_agent: int = 0
    wrong: Counter = field(default_factory=Counter)  # (span name, expected, got) -> spans

    def as_dict(self) -> dict[str, Any]:
        return {
            "under_agent": self.under_agent,
            "with_agent": self.with_agent,
            "right_agent": self.right_agent,
            "with_agent_share": share(self.with_agent, self.under_agent),
            "right_agent_share": share(self.right_agent, self.under_agent),
            "most_common_misses": [
                {"span_name": n, "expected": e, "got": g, "spans": c}
                for (n, e, g), c in self.wrong.most_common(8)
            ],
        }


@dataclass
class Evaluation:
    results: list[RunResult]
    coverage: dict[str, AgentCoverage]
    run_sets: dict[str, RunSet]
    detectors: list[str]
    unmatched_run_ids: dict[str, int]
    requests: int
    spans_stored: int
    embeddings: bool
    detector_errors: dict[str, str] = field(default_factory=dict)
    calibration: dict[str, Any] | None = None  # `driftscope calibrate` output, calibrated mode only
    baseline: list[str] = field(default_factory=list)  # runs calibrated on (not scored)

    def case_results(self) -> dict[str, Any]:
        return {f"{r.run_set}/{r.truth.run}": r for r in self.results}

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": [r.as_dict() for r in self.results],
            "agent_coverage": {k: v.as_dict() for k, v in self.coverage.items()},
            "detectors": self.detectors,
            "unmatched_run_ids": self.unmatched_run_ids,
            "requests": self.requests,
            "spans_stored": self.spans_stored,
            "embeddings": self.embeddings,
            "detector_errors": self.detector_errors,
            "calibration": self.calibration,
            "baseline": self.baseline,
        }


def failing_cases(evaluation: Evaluation) -> list[str]:
    """The case ids of tests/benchmarks/test_eval_frameworks.py that fail on ``evaluation`` (what its
    KNOWN_MISSES should list): ``<kind>[<run set>/<run>]`` or ``<kind>[<run set>]``. A failure
    whose run says its detector could not see it (not measurable) is no ``found`` miss: the test
    accepts that for the run sets it names as recording no content (``BLIND``)."""
    cases = []
    for r in evaluation.results:
        case = f"{r.run_set}/{r.truth.run}"
        if r.truth.failure:
            if not r.found and not r.not_measurable:
                cases.append(f"found[{case}]")
            if r.verdict != "failing":
                cases.append(f"verdict_failing[{case}]")
        else:
            if any(r.findings.values()):
                cases.append(f"no_findings[{case}]")
            if r.verdict != "healthy":
                cases.append(f"verdict_healthy[{case}]")
    for name, cov in evaluation.coverage.items():
        if cov.under_agent == 0 or cov.right_agent != cov.under_agent:
            cases.append(f"agents[{name}]")
        if any(len(r.stored_run_ids) != 1 for r in evaluation.results if r.run_set == name):
            cases.append(f"one_run[{name}]")
        if any(r.tasks_extracted[0] < r.tasks_extracted[1] for r in evaluation.results if r.run_set == name):
            cases.append(f"tasks[{name}]")
        if any(r.unclean_flagged for r in evaluation.results if r.run_set == name):
            cases.append(f"statements[{name}]")
    return cases


def share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def load_corpus(root: Path = CORPUS, names: list[str] | None = None) -> dict[str, RunSet]:
    """The run sets under ``root`` (each a folder with truth.json and otlp.jsonl), by folder name."""
    found = {p.parent.name: p for p in sorted(root.glob("*/truth.json"))}
    if not found:
        raise FileNotFoundError(f"no run sets (*/truth.json) under {root}; run `make framework-corpus` first")
    if names:
        unknown = sorted(set(names) - set(found))
        if unknown:
            raise ValueError(f"unknown run set(s) {', '.join(unknown)}; found: {', '.join(found)}")
        found = {name: found[name] for name in names}
    return {name: load_run_set(path) for name, path in found.items()}


def post_records(client: httpx.Client, base_url: str, records: list[dict[str, Any]], source: str) -> int:
    """POST captured requests to the collector unchanged (body, content type, encoding)."""
    for number, record in enumerate(records, 1):
        headers = {"Content-Type": record["content_type"]}
        if record.get("content_encoding"):
            headers["Content-Encoding"] = record["content_encoding"]
        response = client.post(f"{base_url}{record['path']}", content=record["body"], headers=headers)
        if response.status_code != 200:
            raise RuntimeError(
                f"{source}: request {number} was refused with {response.status_code}: {response.text[:300]}"
            )
    return len(records)


def post_captured(client: httpx.Client, base_url: str, otlp_path: Path) -> int:
    """POST every captured request of ``otlp_path`` to the collector unchanged; returns the count."""
    return post_records(client, base_url, list(read_requests(otlp_path)), str(otlp_path))


def requests_by_run(otlp_path: Path, run_set: RunSet) -> list[tuple[dict[str, Any], str | None]]:
    """Each captured request with the run its spans belong to (None: only set-up spans).

    The generators flush after every run, so a request holds one run's spans (plus, at most,
    set-up spans); a request mixing runs is an error.
    """
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    owner = {trace_id: run.run for run in run_set.runs for trace_id in run.trace_ids}
    out = []
    for number, record in enumerate(read_requests(otlp_path), 1):
        body = gzip.decompress(record["body"]) if record.get("content_encoding") == "gzip" else record["body"]
        request = ExportTraceServiceRequest.FromString(body)
        runs = {
            owner.get(span.trace_id.hex())
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        } - {None}
        if len(runs) > 1:
            raise ValueError(f"{otlp_path}: request {number} mixes runs {sorted(runs)}")
        out.append((record, runs.pop() if runs else None))
    return out


def get_json(client: httpx.Client, url: str) -> dict[str, Any]:
    response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"GET {url} answered {response.status_code}: {response.text[:300]}")
    return response.json()


def wait_for_embeddings(client: httpx.Client, base_url: str) -> int:
    """Wait until the embedding worker has scored every committed span (its last pass ran to the
    end and started after the last commit); returns the stored vectors. Two answers in a row, half
    a second apart: serve acknowledges a request just before it notifies the worker of the commit."""
    deadline = time.monotonic() + EMBEDDING_WAIT_SECONDS
    in_a_row, health = 0, {}
    while time.monotonic() < deadline:
        health = get_json(client, f"{base_url}/api/v1/health")
        in_a_row = in_a_row + 1 if (health.get("embedding_worker") or {}).get("caught_up") else 0
        if in_a_row == 2:
            return health.get("embeddings", 0)
        time.sleep(0.5)
    logger.warning(
        "the embedding worker had not caught up after %ss; evaluating what is there", EMBEDDING_WAIT_SECONDS
    )
    return health.get("embeddings", 0)


def wait_for_findings(client: httpx.Client, base_url: str) -> None:
    """Wait until serve's findings tables reflect every committed change (reads are SELECTs over
    them: scored before that, the newest runs' findings would be missing). Two answers in a row,
    as for the embeddings."""
    deadline = time.monotonic() + EMBEDDING_WAIT_SECONDS
    in_a_row = 0
    while time.monotonic() < deadline:
        findings = get_json(client, f"{base_url}/api/v1/health").get("findings") or {}
        current = findings.get("behind_changes") == 0 and findings.get("findings_as_of") is not None
        in_a_row = in_a_row + 1 if current else 0
        if in_a_row == 2:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the findings tables had not caught up after {EMBEDDING_WAIT_SECONDS}s")


SETUP = "__setup__"


def run_keys(run_sets: dict[str, RunSet]) -> dict[str, tuple[str, str]]:
    """Stored run id -> (run set, run): a session id the run set gave, else one of its trace ids.
    Traces emitted while a crew was built map to (run set, SETUP)."""
    keys: dict[str, tuple[str, str]] = {}
    for name, run_set in run_sets.items():
        for trace_id in run_set.setup_trace_ids:
            keys[trace_id] = (name, SETUP)
        for run in run_set.runs:
            for key in [run.session_id, *run.trace_ids, *run.emitted_run_ids]:
                if key:
                    keys[key] = (name, run.run)
    return keys


def expected_agents(spans: list[dict[str, Any]], agent_span_names: dict[str, str]) -> dict[str, str | None]:
    """Span id -> the agent it belongs to: the nearest ancestor-or-self whose name is an agent span
    (a key ending in ``*`` matches span names starting with the rest)."""
    by_id = {s["span_id"]: s for s in spans}
    memo: dict[str, str | None] = {}
    prefixes = [(key[:-1], agent) for key, agent in agent_span_names.items() if key.endswith("*")]

    def agent_named(span_name: str) -> str | None:
        if span_name in agent_span_names:
            return agent_span_names[span_name]
        return next((agent for prefix, agent in prefixes if span_name.startswith(prefix)), None)

    def agent_of(span_id: str, depth: int = 0) -> str | None:
        if span_id in memo:
            return memo[span_id]
        span = by_id.get(span_id)
        if span is None or depth > 512:
            return None
        agent = agent_named(span["span_name"])
        if agent is None and span["parent_span_id"]:
            agent = agent_of(span["parent_span_id"], depth + 1)
        memo[span_id] = agent
        return agent

    return {s["span_id"]: agent_of(s["span_id"]) for s in spans}


def finding_is_the_failure(truth: RunTruth, row: dict[str, Any]) -> bool:
    """Whether a finding of the detector meant for the run's failure points at that failure:
    goal drift must flag the invocation that got the off-topic statement (its extracted statement
    contains it), loops and duplicates must be of the injected tool, a re-delegation loop of the
    sub-agent's invocations."""
    if truth.failure == "off_topic_task":
        off_topic = [_norm(s.task) for s in truth.subtasks if s.off_topic]
        flagged = _norm(str(row.get("subtask") or ""))
        return any(task in flagged for task in off_topic)
    if truth.failure == "redelegation" and row.get("tool_name") is not None:
        # The loop must be of the invocations of the sub-agent (its name, or the framework's
        # delegation tool), not of some span inside it.
        tool = str(row["tool_name"]).lower()
        return "delegate" in tool or any(s.agent.lower() in tool for s in truth.subtasks)
    tool = FAILURE_TOOL.get(truth.failure or "")
    if tool and row.get("tool_name") is not None:
        return tool in str(row["tool_name"]).lower()
    return True


def baseline_runs(run_sets: dict[str, RunSet]) -> set[tuple[str, str]]:
    """The healthy runs a calibrated evaluation learns from: every other healthy run of each crew
    (in the order they were made); the others and every failure run are held out."""
    chosen = set()
    for name, run_set in run_sets.items():
        healthy = [run.run for run in run_set.runs if run.failure is None]
        chosen |= {(name, run) for run in healthy[::2]}
    return chosen


def calibrate_offline(db: Path) -> dict[str, Any]:
    """``driftscope calibrate`` on the stopped collector's file, from every stored span (the
    baseline runs only). Failure findings in the baseline are reported, not refused: that healthy
    runs have findings is itself a result of the evaluation."""
    done = subprocess.run(
        [sys.executable, "-m", "driftscope", "calibrate", "--db", str(db),
         "--baseline-since", "2000-01-01T00:00:00Z", "--allow-findings"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"driftscope calibrate failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def evaluate(
    root: Path = CORPUS,
    names: list[str] | None = None,
    embeddings: bool = True,
    workdir: Path | None = None,
    keep_db: Path | None = None,
    calibrate: bool = False,
) -> Evaluation:
    """Ingest the corpus through a fresh ``driftscope serve`` and score every detector on it.

    ``calibrate``: first ingest only the baseline runs (``baseline_runs``), stop the collector, run
    ``driftscope calibrate`` on them, restart it, ingest the held-out runs and score only those
    (the path the product recommends: thresholds from a healthy window of the crew).
    ``keep_db``: copy the database there after serve stopped (to inspect it with ``duckdb``).
    """
    run_sets = load_corpus(root, names)
    baseline = baseline_runs(run_sets) if calibrate else set()
    calibration = None
    with tempfile.TemporaryDirectory(prefix="eval-frameworks-", dir=workdir) as tmp:
        db = Path(tmp) / "eval.duckdb"
        requests = 0
        if calibrate:
            first, later = [], []
            for name, run_set in run_sets.items():
                for record, run in requests_by_run(root / name / "otlp.jsonl", run_set):
                    (first if run is None or (name, run) in baseline else later).append(record)
            with ServeProcess(db, embeddings=embeddings) as serve, httpx.Client(timeout=300) as client:
                requests += post_records(client, serve.http_url, first, "baseline")
                if embeddings:
                    wait_for_embeddings(client, serve.http_url)
                wait_for_findings(client, serve.http_url)  # the file calibrate reads holds them
            calibration = calibrate_offline(db)
        with ServeProcess(db, embeddings=embeddings) as serve, httpx.Client(timeout=300) as client:
            base = serve.http_url
            if calibrate:
                requests += post_records(client, base, later, "held-out runs")
            else:
                requests += sum(post_captured(client, base, root / name / "otlp.jsonl") for name in run_sets)
            if embeddings:
                wait_for_embeddings(client, base)
            wait_for_findings(client, base)
            evaluation = _score(client, base, run_sets, requests, embeddings, skip=baseline)
        evaluation.calibration = calibration
        evaluation.baseline = sorted(f"{name}/{run}" for name, run in baseline)
        if keep_db is not None:
            shutil.copyfile(db, keep_db)
        return evaluation


def _score(
    client: httpx.Client,
    base: str,
    run_sets: dict[str, RunSet],
    requests: int,
    embeddings: bool,
    skip: set[tuple[str, str]] = frozenset(),
) -> Evaluation:
    """Score the stored runs against the truth; runs in ``skip`` (a calibration baseline) are
    neither scored nor counted as unmatched."""
    keys = run_keys(run_sets)
    metrics = get_json(client, f"{base}/api/v1/metrics")["metrics"]
    detectors = sorted(m["name"] for m in metrics if m.get("failure_mode"))
    results = {
        (name, run.run): RunResult(name, run)
        for name, rs in run_sets.items()
        for run in rs.runs
        if (name, run.run) not in skip
    }
    unmatched: Counter = Counter()

    def result_for(run_id: str) -> RunResult | None:
        key = keys.get(run_id)
        if key is None:
            unmatched[run_id] += 1
            return None
        return results.get(key)  # None for set-up traces

    errors: dict[str, str] = {}
    for name in detectors:
        try:
            rows = get_json(client, f"{base}/api/v1/metrics/{name}")["rows"]
        except RuntimeError as exc:  # one broken detector must not hide the others' results
            logger.error("%s", exc)
            errors[name] = str(exc)[:300]
            continue
        for row in rows:
            result = result_for(str(row.get("run_id")))
            if result is not None:
                result.findings[name] = result.findings.get(name, 0) + 1
                if name == result.expected_detector and finding_is_the_failure(result.truth, row):
                    result.matched += 1
                if name == "goal_divergence":
                    result.flagged_subtasks.append(str(row.get("subtask")))
    # Detectors a run needs that are not registered count as zero findings (missed).
    summary = get_json(client, f"{base}/api/v1/metrics/run_summary")["rows"]
    coverage = {name: AgentCoverage() for name in run_sets}
    spans_stored = 0
    for row in summary:
        run_id = str(row["run_id"])
        result = result_for(run_id)
        spans_stored += int(row["spans"])
        if result is None:
            continue
        result.stored_run_ids.append(run_id)
        result.verdicts.append(row["verdict"])
        if row.get("coverage"):
            result.coverage.append(str(row["coverage"]))
        result.spans += int(row["spans"])
        quoted = quote(run_id, safe="")
        goal_rows = get_json(client, f"{base}/api/v1/metrics/goal_divergence_distribution?run={quoted}")[
            "rows"
        ]
        result.extracted_subtasks += [str(g["subtask"]) for g in goal_rows if g.get("subtask")]
        spans = get_json(client, f"{base}/api/v1/runs/{quoted}/spans?limit=100000")["rows"]
        agent_names = run_sets[result.run_set].agent_span_names
        expected = expected_agents(spans, agent_names)
        cov = coverage[result.run_set]
        for span in spans:
            want = expected[span["span_id"]]
            if want is None:
                continue
            cov.under_agent += 1
            got = span.get("agent_id")
            if got:
                cov.with_agent += 1
            if got == want:
                cov.right_agent += 1
            else:
                cov.wrong[(span["span_name"], want, got)] += 1
    return Evaluation(
        results=list(results.values()),
        coverage=coverage,
        run_sets=run_sets,
        detectors=detectors,
        unmatched_run_ids=dict(unmatched.most_common(20)),
        detector_errors=errors,
        requests=requests,
        spans_stored=spans_stored,
        embeddings=embeddings,
    )


# ----------------------------------------------------------------------------------------------
# The report


def _fmt_share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}" if value in (0, 1) else f"{value:.1%}"


def _findings_text(findings: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(findings.items()) if v) or "none"


def summary_tables(evaluation: Evaluation, level: str = "##") -> str:
    """The per-framework and per-failure tables as Markdown (section headings at ``level``)."""
    lines: list[str] = []
    by_set: dict[str, list[RunResult]] = defaultdict(list)
    for result in evaluation.results:
        by_set[result.run_set].append(result)

    lines += [
        f"{level} Summary per run set",
        "",
        "| run set | instrumentation | runs | failures found | healthy runs without findings | healthy verdicts | failing verdicts on failures | spans under an agent with an agent | with the right agent | true task statements extracted | goal findings whose statement is a true task |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    totals = Counter()
    for name, results in by_set.items():
        failures = [r for r in results if r.truth.failure]
        healthy = [r for r in results if not r.truth.failure]
        found = sum(1 for r in failures if r.found)
        unseen = sum(1 for r in failures if r.not_measurable)
        clean = sum(1 for r in healthy if not any(r.findings.values()))
        healthy_ok = sum(1 for r in healthy if r.verdict == "healthy")
        failing_ok = sum(1 for r in failures if r.verdict == "failing")
        cov = evaluation.coverage[name].as_dict()
        flagged = sum(len(r.flagged_subtasks) for r in results)
        clean_flagged = flagged - sum(len(r.unclean_flagged) for r in results)
        tasks_found = sum(r.tasks_extracted[0] for r in results)
        tasks_total = sum(r.tasks_extracted[1] for r in results)
        totals.update(
            runs=len(results), failures=len(failures), found=found, healthy=len(healthy), clean=clean,
            healthy_ok=healthy_ok, failing_ok=failing_ok, unseen=unseen,
        )  # fmt: skip
        lines.append(
            f"| {name} | {evaluation.run_sets[name].instrumentation} | {len(results)} | {found}/{len(failures)}"
            f"{f' (+{unseen} not measurable)' if unseen else ''} | "
            f"{clean}/{len(healthy)} | {healthy_ok}/{len(healthy)} | {failing_ok}/{len(failures)} | "
            f"{_fmt_share(cov['with_agent_share'])} ({cov['with_agent']}/{cov['under_agent']}) | "
            f"{_fmt_share(cov['right_agent_share'])} | {tasks_found}/{tasks_total} | {clean_flagged}/{flagged} |"
        )
    unseen_all = f" (+{totals['unseen']} not measurable)" if totals["unseen"] else ""
    lines.append(
        f"| **all** | | {totals['runs']} | {totals['found']}/{totals['failures']}"
        f"{unseen_all} | "
        f"{totals['clean']}/{totals['healthy']} | {totals['healthy_ok']}/{totals['healthy']} | "
        f"{totals['failing_ok']}/{totals['failures']} | | | | |"
    )
    if evaluation.detector_errors:
        lines += ["", "**Detectors that answered with an error** (counted as no finding):", ""]
        lines += [f"- `{name}`: {error}" for name, error in evaluation.detector_errors.items()]
    lines += ["", f"{level} Injected failures", ""]
    lines += [
        "| failure | detector meant for it | run set | run | found | its findings (on the injected failure) | other findings | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for failure in FAILURE_DETECTORS:
        for result in (r for r in evaluation.results if r.truth.failure == failure):
            detector = result.expected_detector
            registered = detector in evaluation.detectors
            found = (
                "found"
                if result.found
                else "not measurable (run coverage)"
                if result.not_measurable
                else ("missed" if registered else "missed (detector not registered)")
            )
            lines.append(
                f"| {failure} | {detector} | {result.run_set} | {result.truth.run} | {found} | "
                f"{result.findings.get(detector, 0)} ({result.matched}) | {_findings_text(result.other_findings)} | "
                f"{result.verdict} |"
            )
    lines += ["", f"{level} Healthy runs", ""]
    lines += ["| run set | run | spans | false findings | verdict |", "|---|---|---|---|---|"]
    for result in (r for r in evaluation.results if not r.truth.failure):
        lines.append(
            f"| {result.run_set} | {result.truth.run} | {result.spans} | {_findings_text(result.findings)} | "
            f"{result.verdict} |"
        )
    lines += ["", f"{level} Agent attribution: spans that got the wrong agent or none", ""]
    if not any(cov.wrong for cov in evaluation.coverage.values()):
        lines.append("None: every span under an agent span got that agent.")
    else:
        lines += [
            "| run set | expected agent | agent_id stored | spans | most common span names |",
            "|---|---|---|---|---|",
        ]
    for name, cov in evaluation.coverage.items():
        pairs: Counter = Counter()
        examples: dict[tuple, Counter] = defaultdict(Counter)
        for (span_name, want, got), count in cov.wrong.items():
            pairs[(want, got)] += count
            examples[(want, got)][span_name] += count
        for (want, got), count in pairs.most_common(8):
            names = ", ".join(f"`{n}`" for n, _ in examples[(want, got)].most_common(4))
            lines.append(f"| {name} | {want} | {got or '(none)'} | {count} | {names} |")
    if evaluation.unmatched_run_ids:
        lines += [
            "",
            "Stored run ids that match no run of the ground truth (neither its session id nor one of "
            f"its trace ids): {len(evaluation.unmatched_run_ids)} (e.g. "
            + ", ".join(f"`{k}`" for k in list(evaluation.unmatched_run_ids)[:5])
            + ").",
        ]
    return "\n".join(lines) + "\n"


def git_commit() -> str:
    """The short HEAD commit, plus the runtime files that differ from it (the tree is shared)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *RUNTIME_PACKAGES],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout.split("\n")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"{head}` with uncommitted changes to `{', '.join(changed)}" if changed else head


RUNTIME_PACKAGES = ("collector", "analytics", "driftscope", "dashboard", "guards")


def _mode_section(evaluation: Evaluation) -> str:
    if evaluation.calibration is None:
        return (
            "## Uncalibrated: a new user's first look\n\n"
            "Every run ingested into an empty store; every threshold at its default.\n\n"
            f"{summary_tables(evaluation, '###')}\n"
        )
    cal = evaluation.calibration
    changed = [c for c in cal.get("changed") or [] if isinstance(c, dict)]
    findings = cal.get("baseline_findings") or {}
    stored = ", ".join(
        f"`{c['name']}` {c.get('before')} -> {round(c['after'], 3) if isinstance(c.get('after'), float) else c.get('after')}"
        for c in changed
        if not str(c.get("name", "")).startswith("count_per_run:") or c.get("after")
    )
    return (
        "## Calibrated from a healthy baseline of each crew\n\n"
        f"Every other healthy run of each crew ({len(evaluation.baseline)} runs) ingested first, the "
        "collector stopped, `driftscope calibrate --baseline-since ... --allow-findings` run on them, "
        "the collector restarted and the held-out runs (the other healthy runs and every failure run) "
        "ingested and scored; the baseline runs are not scored. "
        f"Findings in the baseline: {_findings_text(findings) if findings else 'none'}. "
        f"Thresholds it stored (besides `count_per_run:*` at 0): {stored or 'none'}.\n\n"
        f"{summary_tables(evaluation, '###')}\n"
    )


def render_report(evaluations: list[Evaluation], notes: str = "") -> str:
    """The Markdown report of one or more evaluations of the same corpus (uncalibrated, calibrated)."""
    first = evaluations[0]
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    failures = "\n".join(
        f"- `{name}` ({FAILURE_TEXT[name]}): `{detector}`" for name, detector in FAILURE_DETECTORS.items()
    )
    run_sets = "\n".join(
        f"- **{name}**: {rs.instrumentation}; run id: {rs.session}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in rs.versions.items())
        for name, rs in first.run_sets.items()
    )
    runs = sum(len(rs.runs) for rs in first.run_sets.values())
    return (
        "# Detection quality on real agent frameworks\n\n"
        f"Measured {today} on commit `{git_commit()}` by `make eval-frameworks` "
        "(`python -m benchmarks.eval_frameworks`): the captured OTLP of `sample_traces/frameworks/` "
        f"({runs} runs, {first.requests} requests, {first.spans_stored} spans stored) POSTed unchanged to a "
        f"real `driftscope serve` (embeddings {'on' if first.embeddings else 'off'}), every detector "
        "read back through `/api/v1/metrics/<name>` and `/api/v1/metrics/run_summary`, spans through "
        "`/api/v1/runs/<run>/spans`. How the corpus is made: `corpus/README.md`.\n\n"
        "## Run sets\n\n"
        f"{run_sets}\n\n"
        "## Failures injected and the detector meant for each\n\n"
        f"{failures}\n\n"
        "A failure is *found* when its detector lists a finding in that run that points at it: goal "
        "drift must flag the invocation that got the off-topic statement (not another subtask), "
        "`repeated_calls` on a retry loop and `duplicate_side_effects` must name the injected tool "
        "(`web_search`, `send_report`), on a re-delegation the sub-agent (its name or the "
        "framework's delegation tool). A healthy run "
        "should have no finding of any detector and the verdict `healthy`; a run with an injected "
        "failure should get `failing`. *Spans under an agent* are the spans whose nearest "
        "ancestor-or-self is an agent span of the ground truth (`agent_span_names` in each "
        "`truth.json`); *with an agent* counts those with any `agent_id`, *right agent* those whose "
        "`agent_id` is that agent. *True task statements extracted* counts the distinct task "
        "statements of the ground truth (`subtasks`: what each sub-agent was really asked) found "
        "among the subtask statements driftscope scores for the run "
        "(`/api/v1/metrics/goal_divergence_distribution?run=...`). *Goal findings whose statement is a true task* counts the "
        "`goal_divergence` findings whose extracted subtask statement is one of the run's true task "
        "statements (`subtasks` in `truth.json`), not a prompt with the framework's boilerplate.\n\n"
        + "".join(_mode_section(e) for e in evaluations)
        + notes
    )


def kept_sections(report: Path) -> str:
    """The sections other evaluations wrote into ``report`` between their markers
    (``benchmarks.eval_compare``'s run comparison), kept when this one rewrites the file."""
    from benchmarks.eval_compare import BEGIN, END

    text = report.read_text() if report.exists() else ""
    if BEGIN not in text or END not in text:
        return ""
    return "\n" + text[text.index(BEGIN) : text.index(END) + len(END)] + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_sets", nargs="*", help="run sets to evaluate (default: every one in the corpus)")
    parser.add_argument(
        "--corpus", type=Path, default=CORPUS, help="corpus folder (sample_traces/frameworks)"
    )
    parser.add_argument("--report", type=Path, default=REPORT, help="Markdown report to write ('-' = none)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--embeddings", choices=("true", "false"), default="true", help="run the embedding worker"
    )
    parser.add_argument("--notes", type=Path, help="Markdown appended to the report (the reasons for misses)")
    parser.add_argument("--keep-db", type=Path, help="copy the evaluated DuckDB file here (to inspect it)")
    parser.add_argument(
        "--known-misses", action="store_true", help="also print the failing test case ids (KNOWN_MISSES keys)"
    )
    parser.add_argument(
        "--mode",
        choices=("uncalibrated", "calibrated", "both"),
        default="both",
        help="uncalibrated (empty store, default thresholds), calibrated (thresholds from every other healthy "
        "run of each crew, held-out runs scored), or both (default)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    modes = {"uncalibrated": [False], "calibrated": [True], "both": [False, True]}[args.mode]
    try:
        evaluations = [
            evaluate(
                args.corpus,
                args.run_sets or None,
                embeddings=args.embeddings == "true",
                keep_db=args.keep_db,
                calibrate=calibrate,
            )
            for calibrate in modes
        ]
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for evaluation in evaluations:
        print("# calibrated" if evaluation.calibration is not None else "# uncalibrated")
        print(summary_tables(evaluation))
        if args.known_misses:
            print("failing cases (tests/benchmarks/test_eval_frameworks.py KNOWN_MISSES keys):")
            print("\n".join(failing_cases(evaluation)) or "none")
    if str(args.report) != "-":
        notes = args.notes.read_text() if args.notes else ""
        args.report.write_text(render_report(evaluations, notes) + kept_sections(args.report))
        print(f"wrote {args.report}", file=sys.stderr)
    if args.json:
        payload = {
            "uncalibrated" if e.calibration is None else "calibrated": e.as_dict() for e in evaluations
        }
        args.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
