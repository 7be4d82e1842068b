"""Regenerate the real-framework corpus: ``python -m corpus.generate [framework ...]``.

Runs in the framework venv (``make framework-corpus``). Each framework's generator drives the real
framework with scripted models, captures the OTLP its exporter sends and writes
``sample_traces/frameworks/<run set>/otlp.jsonl`` and ``truth.json``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

# run set -> generator module (corpus.frameworks.<module>.generate)
GENERATORS = {
    "smolagents": "smolagents_crew:generate",
    "langgraph-openinference": "langgraph_crew:generate_openinference",
    "langgraph-openllmetry": "langgraph_crew:generate_openllmetry",
    "openai-agents": "openai_agents_crew:generate",
    "pydantic-ai": "pydantic_ai_crew:generate",
    "crewai": "crewai_crew:generate",
    "adk": "adk_crew:generate",
    "adk-content": "adk_crew:generate_content",
    "strands": "strands_crew:generate",
    "strands-content": "strands_crew:generate_content",
    "agent-framework": "agent_framework_crew:generate",
    "agent-framework-content": "agent_framework_crew:generate_content",
    "ag2": "ag2_crew:generate",
}
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "sample_traces" / "frameworks"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "run_sets", nargs="*", help=f"run sets to regenerate (default: all of {', '.join(GENERATORS)})"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="corpus folder")
    args = parser.parse_args(argv)
    unknown = [name for name in args.run_sets if name not in GENERATORS]
    if unknown:
        parser.error(f"unknown run set(s) {', '.join(unknown)}; known: {', '.join(GENERATORS)}")
    # No framework may reach a network service or a model hub while the corpus is made.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OPENAI_API_KEY", "sk-scripted-no-network")
    os.environ["OTEL_SDK_DISABLED"] = "false"
    for name in args.run_sets or list(GENERATORS):
        module_name, function = GENERATORS[name].split(":")
        module = importlib.import_module(f"corpus.frameworks.{module_name}")
        truth = getattr(module, function)(args.out / name)
        print(f"{name}: wrote {truth.parent}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
