"""benchmarks.decode_ab's pieces on a small payload file (the A/B itself takes minutes)."""

from __future__ import annotations

import pickle

from benchmarks.decode_ab import decode_once, framework_payloads, generator_payloads
from benchmarks.serve_proc import REPO


def test_a_run_decodes_every_span_of_the_payload_file_in_the_tree_given(tmp_path):
    payloads = generator_payloads(spans=1024, batch=256)
    assert len(payloads) == 4
    path = tmp_path / "payloads.pickle"
    path.write_bytes(pickle.dumps(payloads))
    run = decode_once(REPO, path, passes=2)
    assert run["spans"] == 2 * 1024 and run["cpu_spans_per_s"] > 0


def test_framework_payloads_are_every_captured_request():
    payloads = framework_payloads()
    assert len(payloads) > 100 and all(body[:1] == b"\x0a" for body in payloads)  # field 1: resource_spans
