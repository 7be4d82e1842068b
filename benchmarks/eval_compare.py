"""How well run comparison points at what went wrong: ``python -m benchmarks.eval_compare``.

Loads the framework corpus (``sample_traces/frameworks/*/otlp.jsonl``, through the collector's
decoder and store) and the simulator's scenarios (``sample_traces/*.json``, the failure runs, and
``sample_traces/crews/*.jsonl``, each scenario crew's healthy runs, through its file ingest) into
one in-memory store, compares every run of a ground truth with its crew's healthy runs (``analytics.read.compare_run``, ``baseline=auto``: the run itself is never in its own
baseline) and scores the first point of departure:

- failure runs: does the departure name an agent the ground truth says went wrong, and is it
  within ``NEAR`` spans (in start order) of the injected failure's first span;
- healthy runs: how many have a departure at all (each is compared with the crew's other healthy
  runs).

Ground truth. Simulator (``*.truth.json``): the failure's spans are every span id its failure
records list (``prevented`` too in guarded runs), its agents every agent they name; a run of
``crews/`` (``failure_injected: false``) and the ``healthy`` scenario's runs are healthy. Framework
corpus (``truth.json``): a tool failure (``retry_loop``, ``runaway``: ``web_search``;
``duplicate_side_effect``: ``send_report``) starts at the first call of that tool, made by the
agent that went wrong; a delegation failure starts at the hand-off the truth describes (a *turn*
is a stretch of consecutive spans of one sub-agent: ``redelegation`` starts at the sub-agent's
second turn, ``ping_pong`` at the first, ``off_topic_task`` at the first turn of the agent handed
the off-topic task), and the agents that went wrong are the delegating agent (the run's first)
and the sub-agents the truth's subtasks name (the run set's ``agent_span_names``: its agents, the
delegating one first; other agent ids, such as a graph's own, do not make turns).

Writes the section between the ``compare`` markers of ``docs/detection-quality.md`` (the rest of
that file is ``benchmarks.eval_frameworks``'s) and prints the same tables.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from analytics import read
from benchmarks.serve_proc import REPO
from collector.decode import decode_payload
from collector.files import ingest_files
from collector.store import insert_batches
from corpus.dump import read_requests
from corpus.truth import RunSet, RunTruth, load_run_set
from driftscope.database import migrate

logger = logging.getLogger(__name__)

CORPUS = REPO / "sample_traces" / "frameworks"
SAMPLES = REPO / "sample_traces"
CREWS = SAMPLES / "crews"
REPORT = REPO / "docs" / "detection-quality.md"
BEGIN, END = "<!-- compare: written by benchmarks/eval_compare.py -->", "<!-- end compare -->"
NEAR = 3  # spans: "the step within 3 spans of the injected failure's first span"
TOOL_FAILURES = {"retry_loop": "web_search", "runaway": "web_search", "duplicate_side_effect": "send_report"}
# Keys of a simulator truth record that name agents, and that name spans of the failure.
AGENT_KEYS = ("agent", "agents", "from_agent", "to_agent", "clobbered_writer", "clobbered_by")
SPAN_KEYS = (
    "span_id",
    "span_ids",
    "read_span_ids",
    "write_span_ids",
    "clobbered_span_id",
    "clobbering_span_id",
)
NOT_FAILURES = ("span_counts", "waivers")


@dataclass
class Case:
    """One scored run."""

    run_set: str
    run: str
    stored_run: str
    failure: str | None
    truth_agents: list[str] = field(default_factory=list)
    failure_pos: int | None = None
    departure_pos: int | None = None
    departure_agent: str | None = None
    departure_step: str | None = None
    baseline_runs: int = 0
    differences: int = 0
    seconds: float = 0.0

    @property
    def agent_hit(self) -> bool:
        named = {a.lower() for a in self.truth_agents if a}
        return self.departure_agent is not None and self.departure_agent.lower() in named

    @property
    def step_hit(self) -> bool:
        return (
            self.departure_pos is not None
            and self.failure_pos is not None
            and abs(self.departure_pos - self.failure_pos) <= NEAR
        )


def load_store() -> tuple[duckdb.DuckDBPyConnection, dict[str, RunSet]]:
    """An in-memory store with the framework corpus and the simulator's sample traces."""
    conn = duckdb.connect(":memory:")
    migrate(conn)
    run_sets = {}
    for path in sorted(CORPUS.glob("*/otlp.jsonl")):
        run_sets[path.parent.name] = load_run_set(path.parent / "truth.json")
        batches = []
        for record in read_requests(path):
            body = record["body"]
            if record.get("content_encoding") == "gzip":
                body = gzip.decompress(body)
            batches.append(decode_payload(body, record["content_type"]))
        conn.execute("BEGIN")
        insert_batches(conn, batches)
        conn.execute("COMMIT")
    samples = sorted(p for p in SAMPLES.glob("*.json") if not p.name.endswith(".truth.json"))
    samples += sorted(CREWS.glob("*.jsonl"))
    result = ingest_files(None, samples, conn=conn)
    if result.errors or result.rejected:
        raise RuntimeError(f"sample traces not stored: {result.errors} ({result.rejected} rejected)")
    return conn, run_sets


def stored_run(conn: duckdb.DuckDBPyConnection, truth: RunTruth) -> str | None:
    """The stored run id of a truth run: of the ids its framework emitted, the one with most spans."""
    keys = [k for k in [truth.session_id, *truth.emitted_run_ids, *truth.trace_ids] if k]
    row = conn.execute(
        "SELECT run_id FROM spans WHERE run_id IN (SELECT unnest($k::VARCHAR[])) "
        "GROUP BY run_id ORDER BY count(*) DESC, run_id LIMIT 1",
        {"k": keys},
    ).fetchone()
    return row[0] if row else None


def turns(spans: list[dict], crew: list[str]) -> list[tuple[str, int]]:
    """(agent, first pos) of each stretch of consecutive spans of one of the ``crew`` agents
    (spans of no agent, or of another, do not break a stretch)."""
    out: list[tuple[str, int]] = []
    for pos, span in enumerate(spans):
        agent = span.get("agent_id")
        if agent in crew and (not out or out[-1][0] != agent):
            out.append((agent, pos))
    return out


def framework_truth(truth: RunTruth, spans: list[dict], agents_of: list[str]) -> tuple[int | None, list[str]]:
    """The injected failure's first span (pos) and the agents that went wrong (module docstring;
    ``agents_of``: the run set's agents, the delegating one first)."""
    if truth.failure in TOOL_FAILURES:
        tool = TOOL_FAILURES[truth.failure]
        for pos, span in enumerate(spans):
            if span.get("tool_name") == tool:
                return pos, [span.get("agent_id")]
        return None, []
    crew = list(dict.fromkeys(agents_of))
    stretches = turns(spans, crew)
    if not stretches:
        return None, []
    root = crew[0]
    subs = [(agent, pos) for agent, pos in stretches if agent != root]
    named = sorted({s.agent for s in truth.subtasks if s.off_topic or truth.failure != "off_topic_task"})
    agents = [root, *named]
    if truth.failure == "off_topic_task":
        target = {s.agent.lower() for s in truth.subtasks if s.off_topic}
        picked = [pos for agent, pos in subs if agent.lower() in target]
    elif truth.failure == "redelegation":
        picked = [pos for _, pos in subs][1:]
    else:  # ping_pong
        picked = [pos for _, pos in subs]
    return (picked[0] if picked else None), agents


def simulator_truth(truth: dict, spans: list[dict]) -> tuple[int | None, list[str]]:
    """The first span (pos) of every failure record of a simulator truth and the agents named. A
    record that names no span but an agent and a tool (``runaway_steps``) starts, as the
    framework corpus's tool failures do, at that agent's first call of that tool."""
    ids: set[str] = set()
    agents: set[str] = set()
    calls: set[tuple[str, str]] = set()
    for key, records in truth.items():
        if key in NOT_FAILURES or not isinstance(records, list):
            continue
        for record in records:
            if not isinstance(record, dict):
                continue
            for name in SPAN_KEYS:
                value = record.get(name)
                ids |= set(value) if isinstance(value, list) else ({value} if value else set())
            for name in AGENT_KEYS:
                value = record.get(name)
                agents |= set(value) if isinstance(value, list) else ({value} if value else set())
            if not any(record.get(name) for name in SPAN_KEYS) and record.get("agent") and record.get("tool"):
                calls.add((record["agent"], record["tool"]))
    positions = [
        pos
        for pos, span in enumerate(spans)
        if span["span_id"] in ids or (span.get("agent_id"), span.get("tool_name")) in calls
    ]
    return (min(positions) if positions else None), sorted(agents)


def score(conn: duckdb.DuckDBPyConnection, case: Case, spans: list[dict]) -> Case:
    """Compare the case's run with its crew's healthy runs and record the departure."""
    started = time.perf_counter()
    answer = read.compare_run(conn, case.stored_run)
    case.seconds = time.perf_counter() - started
    case.baseline_runs = answer["baseline"]["runs"]
    case.differences = len(answer["differences"])
    departure = answer["departure"]
    if departure is not None:
        case.departure_pos = departure["pos"]
        case.departure_agent = departure["agent"]
        case.departure_step = departure["step"]
    return case


def evaluate(conn: duckdb.DuckDBPyConnection, run_sets: dict[str, RunSet]) -> list[Case]:
    """Every framework truth run and every simulator scenario, scored."""
    cases = []
    for name, run_set in run_sets.items():
        for truth in run_set.runs:
            run_id = stored_run(conn, truth)
            if run_id is None:
                logger.warning("%s/%s: no stored run", name, truth.run)
                continue
            spans = read.run_spans(conn, run_id).to_dict("records")
            crew = list(run_set.agent_span_names.values())
            failure_pos, agents = framework_truth(truth, spans, crew) if truth.failure else (None, [])
            case = Case(name, truth.run, run_id, truth.failure, agents, failure_pos)
            cases.append(score(conn, case, spans))
    for truth in simulator_truths():
        spans = read.run_spans(conn, truth["run_id"]).to_dict("records")
        healthy = truth["scenario"] == "healthy" or truth.get("failure_injected") is False
        failure = None if healthy else truth["scenario"]
        failure_pos, agents = simulator_truth(truth, spans) if failure else (None, [])
        run_set = f"simulator ({truth['variant']})"
        name = f"{truth['scenario']}_{truth['variant']}" + (
            "" if truth.get("failure_injected", True) else " (healthy)"
        )
        case = Case(run_set, name, truth["run_id"], failure, agents, failure_pos)
        cases.append(score(conn, case, spans))
    return cases


def simulator_truths() -> list[dict]:
    """Every simulator run's ground truth: the scenarios' (one run a file) and their crews'
    healthy runs (a list a file)."""
    truths = [json.loads(p.read_text()) for p in sorted(SAMPLES.glob("*.truth.json"))]
    for path in sorted(CREWS.glob("*.truth.json")):
        truths += json.loads(path.read_text())
    return truths


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "-"


def _summary(name: str, cases: list[Case], baseline: Any) -> dict[str, Any]:
    failed = [c for c in cases if c.failure]
    healthy = [c for c in cases if not c.failure]
    return {
        "run set": name,
        "failure runs": len(failed),
        "departure names a true agent": _share(sum(c.agent_hit for c in failed), len(failed)),
        f"departure within {NEAR} spans": _share(sum(c.step_hit for c in failed), len(failed)),
        "healthy runs with a departure": _share(
            sum(c.departure_pos is not None for c in healthy), len(healthy)
        ),
        "baseline runs (median)": baseline,
    }


def summary_rows(cases: list[Case]) -> list[dict[str, Any]]:
    """Per run set, then the framework corpus, the simulator and everything: failure runs, agent
    named, step within NEAR, healthy runs with a departure."""
    rows = []
    for name in dict.fromkeys(c.run_set for c in cases):
        mine = [c for c in cases if c.run_set == name]
        rows.append(_summary(name, mine, sorted(c.baseline_runs for c in mine)[len(mine) // 2]))
    simulator = [c for c in cases if c.run_set.startswith("simulator")]
    frameworks = [c for c in cases if not c.run_set.startswith("simulator")]
    rows.append(_summary("**framework corpus**", frameworks, ""))
    rows.append(_summary("**simulator**", simulator, ""))
    rows.append(_summary("**all**", cases, ""))
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_none_\n"
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "\\|") for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def case_rows(cases: list[Case]) -> list[dict[str, Any]]:
    """One row per failure run: where it departed against where the failure started."""
    return [
        {
            "run set": c.run_set,
            "run": c.run,
            "failure": c.failure,
            "failure starts at": c.failure_pos,
            "departs at": c.departure_pos if c.departure_pos is not None else "none",
            "departure step": c.departure_step or "",
            "agent": "yes" if c.agent_hit else "no",
            f"within {NEAR}": "yes" if c.step_hit else "no",
        }
        for c in cases
        if c.failure
    ]


def render_section(cases: list[Case]) -> str:
    """The Markdown section of docs/detection-quality.md (between the markers)."""
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    healthy_departures = [c for c in cases if not c.failure and c.departure_pos is not None]
    slowest = max((c.seconds for c in cases), default=0.0)
    return (
        f"{BEGIN}\n"
        "## What changed: the first point of departure (run comparison)\n\n"
        f"Measured {today} by `make eval-compare` (`python -m benchmarks.eval_compare`): every run of the framework corpus "
        "and the simulator's scenarios compared with its crew's healthy runs "
        "(`GET /api/v1/runs/{id}/compare`, `baseline=auto`, the run itself left out; docs/compare.md). "
        "The departure is the first span whose step no healthy run takes at that point, or an "
        "earlier span that a detector's finding names alone when no healthy run has a finding of "
        "that detector (a failure in a span's contents: a dropped constraint, a drifted subtask). "
        f"A departure *names a true agent* when its span's agent is one the ground truth says went wrong; "
        f"it is *within {NEAR} spans* when its position in the run's start order is at most {NEAR} "
        "from the injected failure's first span. Ground truth as `benchmarks/eval_compare.py` states "
        "it. Targets: at least 80% and 60% of failure runs, a departure in at most 10% of healthy "
        f"runs. Slowest comparison: {slowest * 1000:.0f} ms.\n\n"
        + _table(summary_rows(cases))
        + "\n### Failure runs\n\n"
        + _table(case_rows(cases))
        + "\n### Why the misses\n\n"
        "- `off_topic_task`: the off-topic hand-off is the same step as a healthy one (same agents, "
        "tool and argument keys); only its text differs. Where the spans carry the task text, the "
        "`goal_divergence` detector's finding on that one span (for review while its threshold is "
        "the uncalibrated default; no healthy run has one, since one makes a run 'to review') places "
        "the departure there. Without content capture (`adk`, `agent-framework`) no detector sees "
        "the text and there is no departure.\n"
        "- `runaway` (and a retry loop without errors): healthy runs of the crew already repeat the "
        "search a few times, so the earliest span no healthy run takes is the first search past the "
        "most a healthy run makes, which in frameworks that wrap each search in LLM and chain spans "
        "is more than 3 spans after the first search the ground truth starts the failure at. The "
        "loop detectors' findings name every repeat, the first of them one a healthy run makes too, "
        "so they do not move the departure (only a finding that names one span does).\n"
        "- The simulator: each scenario is one crew (all under the service `crew-sim`), its two failure "
        "runs (unguarded, guarded) beside 8 healthy runs of that crew per variant (`sample_traces/crews/`: the same "
        "agents and tools, the failure not injected). The baseline is the service's healthy runs "
        "whose agents overlap the run's by half or more: the crew's own runs of both variants, and "
        "crews with the same agents (split_brain's and constraint_drop's are the same four). "
        "`constraint_drop` and `goal_drift` unguarded: the dropped constraint and the drifted "
        "subtask are in the hand-off's text, the same step as a healthy hand-off; the "
        "`constraint_drops` and `goal_divergence` findings on that hand-off place the departure "
        "there. Guarded, the guard's refusal is the departure. `context_drift` (the agent misses): "
        "the first departure is the manager publishing a new policy mid-run (the crew's healthy runs "
        "set the policy at the start only, so no healthy run takes that step there), within 3 spans "
        "of the stale send the ground truth starts the failure at; the ground truth names the agents "
        "that acted on the stale policy (responder, kb_writer), not the one that changed it. The "
        "`stale_policy_sends` finding on the responder's send (unguarded; guarded, the send is "
        "refused) is listed among the differences but comes after that step. "
        "`duplicate_side_effect` guarded: "
        "the departure is the ledger call that failed before the resume; the ground truth's span "
        "is the refused second send after it. `step_budget` unguarded (a runaway; its truth names "
        "no span, so it starts at the researcher's first search, as the corpus's runaways do): "
        "the departure is the first search past the most a healthy run makes (5).\n"
        + "\n### Healthy runs with a departure\n\n"
        + _table(
            [
                {"run set": c.run_set, "run": c.run, "departs at": c.departure_pos, "step": c.departure_step}
                for c in healthy_departures
            ]
        )
        + f"\n{END}\n"
    )


def write_section(report: Path, section: str) -> None:
    """Replace the marked section of ``report`` (append it when absent)."""
    text = report.read_text() if report.exists() else ""
    if BEGIN in text and END in text:
        start, stop = text.index(BEGIN), text.index(END) + len(END) + 1
        text = text[:start] + section + text[stop:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    report.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=REPORT, help="Markdown report to update ('-' = none)")
    parser.add_argument("--json", type=Path, help="also write every case as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    conn, run_sets = load_store()
    cases = evaluate(conn, run_sets)
    print(_table(summary_rows(cases)))
    print(_table(case_rows(cases)))
    if str(args.report) != "-":
        write_section(args.report, render_section(cases))
        print(f"updated {args.report}", file=sys.stderr)
    if args.json:
        payload = [dict(asdict(c), agent_hit=c.agent_hit, step_hit=c.step_hit) for c in cases]
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
