"""The ground truth of a captured run set: which runs are healthy, which failure each other run
carries and which detector should find it. Standard library only (the evaluation reads it too).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The failures injected into the corpus and the detector meant to find each. The runaway detector
# of issue 13 part 4 is not registered yet; when it lands under another name, change it here (and
# nowhere else: the truth files store the failure, the evaluation looks the detector up here).
FAILURE_DETECTORS: dict[str, str] = {
    "retry_loop": "repeated_calls",
    "redelegation": "repeated_calls",
    "off_topic_task": "goal_divergence",
    "ping_pong": "ping_pong",
    "duplicate_side_effect": "duplicate_side_effects",
    "runaway": "runaway_runs",
}
FAILURE_TEXT: dict[str, str] = {
    "retry_loop": "a retry loop with re-worded arguments (errors and successes mixed)",
    "redelegation": "the manager re-delegates the same question to its sub-agent",
    "off_topic_task": "a sub-agent is handed an off-topic task",
    "ping_pong": "a handoff ping-pong between two agents",
    "duplicate_side_effect": "a side-effecting tool called twice with the same arguments",
    "runaway": "a step budget blown: far more calls than the crew's usual runs, no budget set",
}


@dataclass
class Subtask:
    agent: str
    task: str
    off_topic: bool = False


@dataclass
class RunTruth:
    run: str
    failure: str | None
    task: str
    session_id: str | None = None
    trace_ids: list[str] = field(default_factory=list)
    # Session / conversation ids the framework put on the run's spans (may include ids of its own
    # for delegated sub-runs, besides session_id).
    emitted_run_ids: list[str] = field(default_factory=list)
    spans_started: int = 0
    # Emails the side-effecting tool (send_report) really sent during the run.
    side_effects_executed: int = 0
    subtasks: list[Subtask] = field(default_factory=list)
    note: str = ""

    @property
    def detector(self) -> str | None:
        return FAILURE_DETECTORS.get(self.failure) if self.failure else None


@dataclass
class RunSet:
    framework: str
    instrumentation: str
    service_name: str
    versions: dict[str, str]
    session: str
    agent_span_names: dict[str, str]
    runs: list[RunTruth] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Traces the framework emits while the crew is built, outside any run (OpenLLMetry's
    # create_agent spans): part of the capture, belonging to no run.
    setup_trace_ids: list[str] = field(default_factory=list)

    def write(self, path: Path) -> None:
        payload = asdict(self)
        for run, stored in zip(self.runs, payload["runs"], strict=True):
            stored["detector"] = run.detector
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n")


def load_run_set(path: Path) -> RunSet:
    """Read a truth.json written by ``RunSet.write``."""
    data: dict[str, Any] = json.loads(path.read_text())
    runs = []
    for raw in data.pop("runs"):
        raw.pop("detector", None)
        raw["subtasks"] = [Subtask(**s) for s in raw.get("subtasks", [])]
        runs.append(RunTruth(**raw))
    return RunSet(runs=runs, **data)


def check_side_effects(spec: dict[str, Any], sent: int) -> int:
    """Fail the generation when a duplicate-side-effect run did not really execute the side effect
    twice (a framework's tool cache, for one, answers an identical second call without running it)."""
    if spec.get("failure") == "duplicate_side_effect" and sent != 2:
        raise RuntimeError(f"{spec['label']}: the side effect ran {sent} time(s), the run needs 2")
    return sent


def package_versions(*names: str) -> dict[str, str]:
    """Installed versions of ``names`` (in the venv that generates the corpus)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out
