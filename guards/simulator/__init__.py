"""Deterministic crew simulator: scripted agents run against the guards and export real OTLP.

Importing this package imports the OpenTelemetry SDK and protobuf (unlike :mod:`guards`).
"""

from guards.simulator.catalog import SCENARIOS, VARIANTS, Scenario, regenerate, run_scenario
from guards.simulator.runtime import FakeClock, PacedClock, SeededIdGenerator, SimRun

__all__ = [
    "SCENARIOS",
    "VARIANTS",
    "FakeClock",
    "PacedClock",
    "Scenario",
    "SeededIdGenerator",
    "SimRun",
    "regenerate",
    "run_scenario",
]
