"""Durable ingest of this tree against another commit's, alternating in the same minutes.

`python -m benchmarks.ingest_ab --base 20d8bda --spans 200000 --rounds 3 [--embeddings] --out FILE`

The machine is shared and noisy: one ingest of each tree says little, so the two serves take
turns (A B A B ...) on the very same payloads (``benchmarks.ingest``'s templates, stamped into
fresh namespaces), each into a fresh database, over HTTP from 4 connections. The base tree is a
detached git worktree of ``--base`` with its own compiled decoder (built here with its
setup.py), removed afterwards. Reported: each run's acknowledged spans/s and, per tree, the
median; the ratio this/base of the medians.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.generator import template_payloads
from benchmarks.ingest import TEMPLATES, LoadClient
from benchmarks.serve_proc import REPO, ServeProcess

logger = logging.getLogger(__name__)


def base_tree(commit: str, into: Path) -> Path:
    """A worktree of ``commit`` at ``into`` with its compiled decoder built."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(into), commit], check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=into, check=True,
                   capture_output=True)  # fmt: skip
    return into


def ingest_once(
    repo: Path, workdir: Path, templates: list[bytes], spans: int, batch: int, embeddings: bool = False
) -> dict:
    db = workdir / f"ab-{repo.name}-{time.monotonic_ns()}.duckdb"
    serve = ServeProcess(db, repo=repo, embeddings=embeddings).start()
    try:
        client = LoadClient(serve, "http", templates, -(-spans // batch))
        elapsed = client.run(4, [batch] * len(templates))
        peak = serve.peak_rss_bytes()
        health = serve.health()
    finally:
        code = serve.stop()
        for path in (db, Path(f"{db}.wal")):
            path.unlink(missing_ok=True)
    if code != 0 or client.errors:
        raise RuntimeError(f"{repo}: serve exited {code}, errors {client.errors[:3]}")
    return {
        "acked_spans_per_s": round(client.acked_spans / elapsed, 1),
        "elapsed_s": round(elapsed, 2),
        "serve_peak_rss_bytes": peak,
        "load": [round(x, 2) for x in os.getloadavg()],
        # where serve's time went, as far as its health says (older trees say less)
        "writer_busy_s": health.get("writer_busy_seconds"),
        "writer_span_commit_s": health.get("writer_span_commit_seconds"),
        "commits": health.get("commits"),
        "materializer_pass_s": health.get("findings", {}).get("pass_seconds_total"),
        "deferred_to_ingest_s": health.get("findings", {}).get("deferred_to_ingest_seconds"),
        "writer_commit_s": health.get("writer_commit_seconds"),
        "writer_auto_checkpoint_s": health.get("writer_auto_checkpoint_seconds"),
    }


def run_ab(base: str, spans: int, rounds: int, batch: int = 512, embeddings: bool = False) -> dict:
    templates = template_payloads(TEMPLATES * batch, 7, batch)
    with tempfile.TemporaryDirectory(prefix="driftscope-ab-") as tmp:
        workdir = Path(tmp)
        old = base_tree(base, workdir / "base")
        try:
            runs: dict[str, list[dict]] = {"base": [], "this": []}
            for _ in range(rounds):
                for name, repo in (("base", old), ("this", REPO)):
                    runs[name].append(ingest_once(repo, workdir, templates, spans, batch, embeddings))
                    logger.info("%s: %s", name, runs[name][-1])
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False,
                           capture_output=True)  # fmt: skip
    medians = {name: statistics.median(r["acked_spans_per_s"] for r in rs) for name, rs in runs.items()}
    return {
        "base": base,
        "spans_per_run": spans,
        "rounds": rounds,
        "embeddings": embeddings,
        "runs": runs,
        "median_acked_spans_per_s": medians,
        "this_over_base": round(medians["this"] / medians["base"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ingest_ab", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--base", default="20d8bda", help="the commit to compare with")
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--embeddings", action="store_true",
                        help="both serves with their embedding worker, as serve runs by default")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result = run_ab(args.base, args.spans, args.rounds, embeddings=args.embeddings)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("median_acked_spans_per_s", "this_over_base")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
