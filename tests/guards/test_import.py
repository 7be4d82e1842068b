"""`import guards` stays light: no SDK, torch, sentence-transformers or pydantic at import time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = [
    "torch",
    "sentence_transformers",
    "pydantic",
    "transformers",
    "numpy",
    "opentelemetry.sdk",
    "google.protobuf",
]


def test_import_guards_loads_no_heavy_modules():
    code = (
        "import json, sys, guards, guards.embedding, guards.execution;"
        f"heavy = {HEAVY!r};"
        "print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in heavy))))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(output.stdout) == []


def test_the_check_catches_a_heavy_import():
    # the same probe, after importing the simulator (which needs the SDK), must see it
    code = "import json, sys, guards.simulator;print(json.dumps('opentelemetry.sdk' in sys.modules))"
    output = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(output.stdout) is True
