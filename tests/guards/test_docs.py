"""The agent-author snippet in docs/guards.md runs as written and its spans reach an OTLP receiver."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

from tests.guards.test_demo import OtlpReceiver

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "guards.md"


def snippet() -> str:
    return re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)


def test_snippet_is_under_twenty_lines():
    assert len(snippet().splitlines()) < 20


def test_snippet_runs_and_exports_one_span_per_guard_call(tmp_path):
    receiver = OtlpReceiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        code = snippet().replace("http://127.0.0.1:4318", receiver.url)
        assert receiver.url in code
        script = tmp_path / "agent.py"
        script.write_text(code + "\nprovider.shutdown()\n")
        # a fresh process: the snippet sets the global tracer provider, which can be set only once
        subprocess.run([sys.executable, str(script)], cwd=REPO, check=True, timeout=120)
        spans = receiver.spans()
        names = [span.name for span, _ in spans]
        assert names == [
            "execute_tool read_state",
            "execute_tool write_state",
            "execute_tool open_task",
            "execute_tool delegate",
        ]
        for span, _ in spans:
            attributes = {kv.key: kv.value.string_value for kv in span.attributes}
            assert attributes["gen_ai.conversation.id"] == "run-42"
            assert attributes["gen_ai.agent.id"] == "planner"
    finally:
        receiver.shutdown()
        receiver.server_close()
