"""The scenario catalogue, running one scenario, and regenerating ``sample_traces/``.

Each scenario is a crew; its failure run is one of many runs of that crew. ``crew_runs`` gives
the crew's healthy runs (the same agents and tools, the failure not injected), as a deployment
would have before the failing one; ``regenerate`` writes them to ``crews/``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from guards.embedding import Embedder, SentenceTransformerEmbedder
from guards.simulator.otlp_json import spans_to_otlp_json, write_otlp_json
from guards.simulator.runtime import FakeClock, SimRun
from guards.simulator.scenarios_context import context_drift
from guards.simulator.scenarios_delegation import constraint_drop, goal_drift, ping_pong
from guards.simulator.scenarios_execution import healthy, recursion_loop, step_budget
from guards.simulator.scenarios_state import duplicate_side_effect, split_brain

logger = logging.getLogger(__name__)

VARIANTS = ("unguarded", "guarded")
BASE_SEED = 20260115
BASE_TIME = datetime(2026, 1, 15, 9, 0, tzinfo=UTC)
RUN_SPACING_NS = 10 * 60 * 1_000_000_000
# Healthy runs of each scenario's crew and variant in sample_traces/crews/; they start a day
# before the failure runs, one round of every crew's runs every three hours.
HEALTHY_RUNS = 8
CREW_ROUND_NS = 3 * 60 * 60 * 1_000_000_000
CREWS_DIR = "crews"


@dataclass(frozen=True)
class Scenario:
    """One failure mode (or the healthy baseline) and its scripted crew."""

    name: str
    script: Callable[[SimRun], None]
    failure_mode: str

    @property
    def description(self) -> str:
        """First line of the script's docstring."""
        return (self.script.__doc__ or "").strip().splitlines()[0]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("split_brain", split_brain, "lost update on a shared key"),
        Scenario("constraint_drop", constraint_drop, "constraint dropped at a handoff"),
        Scenario("goal_drift", goal_drift, "goal drift across handoffs"),
        Scenario("context_drift", context_drift, "action on a superseded policy / stale objective"),
        Scenario("recursion_loop", recursion_loop, "the same failing call retried"),
        Scenario("ping_pong", ping_pong, "planner/worker ping-pong"),
        Scenario("step_budget", step_budget, "step budget exhaustion"),
        Scenario("duplicate_side_effect", duplicate_side_effect, "side effect repeated after a resume"),
        Scenario("healthy", healthy, "none"),
    ]
}


def scenario_seed(name: str, variant: str, base_seed: int = BASE_SEED) -> int:
    """The seed of one scenario variant (stable: position in the catalogue, not a hash)."""
    index = list(SCENARIOS).index(name) * len(VARIANTS) + VARIANTS.index(variant)
    return base_seed * 100 + index


def run_scenario(
    name: str,
    variant: str,
    *,
    seed: int | None = None,
    clock: Any = None,
    exporters: Sequence[SpanExporter] = (),
    embedder: Embedder | None = None,
    inject: bool = True,
) -> tuple[SimRun, list[Any]]:
    """Run one scenario variant; returns the finished run (with ``truth``) and its spans.

    Without ``clock`` the run uses the fixed timestamps of the sample traces. ``inject=False``:
    one of the scenario crew's healthy runs (the failure not injected; its truth lists none).
    """
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    if variant not in VARIANTS:
        raise KeyError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    if clock is None:
        index = list(SCENARIOS).index(name) * len(VARIANTS) + VARIANTS.index(variant)
        clock = FakeClock(int(BASE_TIME.timestamp()) * 1_000_000_000 + index * RUN_SPACING_NS)
    run = SimRun(
        name,
        variant,
        seed=scenario_seed(name, variant) if seed is None else seed,
        clock=clock,
        exporters=exporters,
        embedder=embedder,
        inject=inject,
    )
    run.truth["failure_mode"] = SCENARIOS[name].failure_mode if inject else "none"
    run.truth["description"] = SCENARIOS[name].description
    SCENARIOS[name].script(run)
    spans = run.finish()
    return run, spans


def crew_runs(
    name: str, variant: str, count: int = HEALTHY_RUNS, *, embedder: Embedder | None = None
) -> list[tuple[SimRun, list[Any]]]:
    """``count`` healthy runs of scenario ``name``'s crew (``run_scenario(..., inject=False)``),
    each with its own seed, at the fixed timestamps of ``sample_traces/crews/``: every run
    before the scenario's failure run."""
    index = list(SCENARIOS).index(name) * len(VARIANTS) + VARIANTS.index(variant)
    start = int(BASE_TIME.timestamp()) * 1_000_000_000 + index * RUN_SPACING_NS
    runs = []
    for k in range(count):
        clock = FakeClock(start - (count - k) * CREW_ROUND_NS)
        seed = scenario_seed(name, variant) * 100 + k + 1
        runs.append(run_scenario(name, variant, seed=seed, clock=clock, embedder=embedder, inject=False))
    return runs


def regenerate(out_dir: Path | str, embedder: Embedder | None = None) -> list[Path]:
    """Write ``<scenario>_<variant>.json`` (OTLP JSON) and ``.truth.json`` for every scenario, and
    its crew's healthy runs to ``crews/<scenario>_<variant>.jsonl`` (one OTLP JSON request a line,
    a run each) with their truths, a list, in ``crews/<scenario>_<variant>.truth.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    embedder = embedder or SentenceTransformerEmbedder()
    written: list[Path] = []
    for name in SCENARIOS:
        for variant in VARIANTS:
            run, spans = run_scenario(name, variant, embedder=embedder)
            trace_path = out / f"{name}_{variant}.json"
            truth_path = out / f"{name}_{variant}.truth.json"
            write_otlp_json(spans, trace_path)
            truth_path.write_text(json.dumps(run.truth, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            written += [trace_path, truth_path]
            logger.info("wrote %s (%d spans)", trace_path, len(spans))
    crews = out / CREWS_DIR
    crews.mkdir(exist_ok=True)
    for name in SCENARIOS:
        for variant in VARIANTS:
            runs = crew_runs(name, variant, embedder=embedder)
            trace_path = crews / f"{name}_{variant}.jsonl"
            truth_path = crews / f"{name}_{variant}.truth.json"
            lines = [
                json.dumps(spans_to_otlp_json(spans), separators=(",", ":"), ensure_ascii=False)
                for _, spans in runs
            ]
            trace_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            truths = [run.truth for run, _ in runs]
            truth_path.write_text(json.dumps(truths, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            written += [trace_path, truth_path]
            logger.info("wrote %s (%d healthy runs)", trace_path, len(runs))
    return written
