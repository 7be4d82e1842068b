"""Stream the simulator's scripted crews to a running collector over OTLP/HTTP.

``run_demo`` is what ``driftscope demo`` and ``driftscope up --demo`` call. Each run gets fresh
ids (seeded from the current time) so repeated demos add new runs instead of duplicating spans.
Without ``live`` every run is sent in one request with timestamps starting now; with ``live`` the
spans are exported one by one as they end, at a pace a person can watch. Before a scenario's runs
go out, its crew's history does: a few healthy runs of the same crew (the failure not injected),
back-dated by minutes and sent at once, so a failing run has healthy runs of its own crew to be
compared with (``driftscope compare``, the dashboard's "Compare with healthy runs").
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from guards.embedding import Embedder, SentenceTransformerEmbedder
from guards.simulator.catalog import SCENARIOS, VARIANTS, run_scenario
from guards.simulator.runtime import FakeClock, PacedClock

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
LIVE_PACE_S = 0.25
# Healthy runs of each scenario's crew (per variant) sent before its runs, ten minutes apart.
HEALTHY_RUNS = 3
HISTORY_SPACING_NS = 10 * 60 * 1_000_000_000


def traces_url(endpoint: str | None) -> str:
    """The OTLP/HTTP traces URL for a collector base URL (``/v1/traces`` appended if missing)."""
    base = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


class _ResultCountingExporter(SpanExporter):
    """Forwards to the real exporter and remembers whether every export succeeded."""

    def __init__(self, inner: SpanExporter):
        self.inner = inner
        self.failures = 0
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failures += 1
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def run_demo(
    endpoint: str | None,
    scenario: str | None,
    live: bool,
    *,
    token: str | None = None,
    pace_s: float = LIVE_PACE_S,
    timeout_s: float = 10.0,
    embedder: Embedder | None = None,
    healthy_runs: int = HEALTHY_RUNS,
) -> int:
    """Send every scenario (or only ``scenario``), guarded and unguarded, to ``endpoint``, each
    after ``healthy_runs`` healthy runs of its crew (one request per scenario and variant).

    ``embedder`` embeds the goal-drift scenario's texts (default: the bundled model through
    sentence-transformers; the CLI passes analytics' ONNX Runtime encoder of the same model, which
    loads in a fraction of the time). Returns 0 when every export succeeded, 1 otherwise. Raises
    ``ValueError`` for an unknown scenario name.
    """
    if scenario is not None and scenario not in SCENARIOS:
        raise ValueError(f"Unknown scenario {scenario!r}; expected one of: {', '.join(SCENARIOS)}")
    url = traces_url(endpoint)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    names = [scenario] if scenario else list(SCENARIOS)
    embedder = embedder or SentenceTransformerEmbedder()
    seed_base = time.time_ns() // 1000
    failures = 0
    for index, name in enumerate(n for n in names for _ in VARIANTS):
        variant = VARIANTS[index % len(VARIANTS)]
        if healthy_runs > 0:
            failures += _send_history(
                OTLPSpanExporter(endpoint=url, headers=headers, timeout=timeout_s),
                name,
                variant,
                healthy_runs,
                seed_base + 10_000 + index * healthy_runs,
                embedder,
            )
        exporter = _ResultCountingExporter(OTLPSpanExporter(endpoint=url, headers=headers, timeout=timeout_s))
        seed = seed_base + index
        if live:
            run, spans = run_scenario(
                name, variant, seed=seed, clock=PacedClock(pace_s), exporters=[exporter], embedder=embedder
            )
        else:
            run, spans = run_scenario(
                name, variant, seed=seed, clock=FakeClock(time.time_ns(), 20_000_000), embedder=embedder
            )
            exporter.export(spans)
            exporter.shutdown()
        failures += exporter.failures
        logger.info(
            "%s %s: run %s, %d spans sent to %s%s",
            name,
            variant,
            run.run_id,
            exporter.exported,
            url,
            f" ({exporter.failures} failed exports)" if exporter.failures else "",
        )
    return 0 if failures == 0 else 1


def _send_history(
    inner: SpanExporter, name: str, variant: str, count: int, seed: int, embedder: Embedder
) -> int:
    """Send ``count`` healthy runs of scenario ``name``'s crew, ending before now, in one request;
    returns how many exports failed."""
    exporter = _ResultCountingExporter(inner)
    now = time.time_ns()
    spans: list[ReadableSpan] = []
    for k in range(count):
        clock = FakeClock(now - (count - k) * HISTORY_SPACING_NS, 20_000_000)
        _, run_spans = run_scenario(
            name, variant, seed=seed + k, clock=clock, embedder=embedder, inject=False
        )
        spans += run_spans
    exporter.export(spans)
    exporter.shutdown()
    logger.info("%s %s: %d healthy runs of its crew, %d spans sent", name, variant, count, exporter.exported)
    return exporter.failures
