"""Decode throughput of this tree against another commit's, alternating on the same payloads.

`python -m benchmarks.decode_ab --base 20d8bda --out FILE [--payloads generator|frameworks]`

``collector.decode.decode_payload`` (wire bytes to the Arrow table the writer inserts: compiled
decoder, convention mapping, table) runs in a fresh process per tree and round, the two trees
taking turns (A B A B ...) over the very same payloads, one thread, nothing else in the
process. ``generator``: a 200k-span burst of ``benchmarks.ingest``'s stamped templates (512-span
requests); ``frameworks``: every request captured from the real frameworks under
``sample_traces/frameworks`` (decompressed), decoded ``--passes`` times. Each run reports
spans/s of CPU time (the machine is shared: wall clock mostly measures waiting for a core) and
wall clock; per tree, the median and best over the rounds; and the ratio this/base of the
medians. The base tree is a detached worktree of ``--base`` with its own compiled decoder built
there, removed afterwards, or an existing checkout given with ``--base-tree``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.generator import stamp, template_payloads
from benchmarks.ingest import TEMPLATES
from benchmarks.ingest_ab import base_tree
from benchmarks.serve_proc import REPO
from corpus.dump import request_bodies

logger = logging.getLogger(__name__)

# Runs in the tree under test (its collector first on the path): only decode_payload and
# PROTOBUF, which every tree since the compiled decoder has.
_CHILD = """
import json, pickle, sys, time
from collector.decode import PROTOBUF, decode_payload
payloads = pickle.load(open(sys.argv[1], "rb"))
passes = int(sys.argv[2])
spans = sum(decode_payload(p, PROTOBUF).accepted for p in payloads)  # warm: imports, plans
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(passes):
    for p in payloads:
        decode_payload(p, PROTOBUF)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"spans": spans * passes, "cpu_s": cpu, "wall_s": wall}))
"""


def generator_payloads(spans: int = 200_000, batch: int = 512) -> list[bytes]:
    """``spans`` spans as ``benchmarks.ingest`` sends them: 8 templates stamped into namespaces."""
    templates = template_payloads(TEMPLATES * batch, 7, batch)
    return [stamp(templates[i % len(templates)], 1 + i // len(templates)) for i in range(-(-spans // batch))]


def framework_payloads() -> list[bytes]:
    """Every captured protobuf request of ``sample_traces/frameworks/*/otlp.jsonl``."""
    return [
        body
        for path in sorted((REPO / "sample_traces" / "frameworks").glob("*/otlp.jsonl"))
        for body, content_type in request_bodies(path)
        if "protobuf" in content_type
    ]


def decode_once(tree: Path, payload_file: Path, passes: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(payload_file), str(passes)],
        cwd=tree, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    run = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "cpu_spans_per_s": round(run["spans"] / run["cpu_s"]),
        "wall_spans_per_s": round(run["spans"] / run["wall_s"]),
        "spans": run["spans"],
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def run_ab(base: str, kind: str, rounds: int, passes: int, base_checkout: Path | None = None) -> dict:
    payloads = generator_payloads() if kind == "generator" else framework_payloads()
    with tempfile.TemporaryDirectory(prefix="driftscope-decode-ab-") as tmp:
        workdir = Path(tmp)
        payload_file = workdir / "payloads.pickle"
        payload_file.write_bytes(pickle.dumps(payloads))
        old = base_checkout or base_tree(base, workdir / "base")
        try:
            runs: dict[str, list[dict]] = {"base": [], "this": []}
            for _ in range(rounds):
                for name, tree in (("base", old), ("this", REPO)):
                    runs[name].append(decode_once(tree, payload_file, passes))
                    logger.info("%s: %s", name, runs[name][-1])
        finally:
            if base_checkout is None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False,
                               capture_output=True)  # fmt: skip
    medians = {name: statistics.median(r["cpu_spans_per_s"] for r in rs) for name, rs in runs.items()}
    return {
        "base": base,
        "payloads": kind,
        "requests": len(payloads),
        "passes": passes,
        "rounds": rounds,
        "runs": runs,
        "median_cpu_spans_per_s": medians,
        "best_cpu_spans_per_s": {name: max(r["cpu_spans_per_s"] for r in rs) for name, rs in runs.items()},
        "this_over_base": round(medians["this"] / medians["base"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decode_ab", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--base", default="20d8bda", help="the commit to compare with")
    parser.add_argument("--base-tree", type=Path, help="an existing checkout of --base (its decoder built)")
    parser.add_argument("--payloads", choices=("generator", "frameworks"), default="generator")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--passes", type=int, help="passes over the payloads per run (default 1; frameworks 20)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    passes = args.passes or (1 if args.payloads == "generator" else 20)
    result = run_ab(args.base, args.payloads, args.rounds, passes, args.base_tree)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_cpu_spans_per_s", "this_over_base")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
