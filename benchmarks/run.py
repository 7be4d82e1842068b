"""Run the benchmark suite: `python -m benchmarks.run [--smoke] [--sizes 100000 1000000 ...]`.

Sections: ingest (http, grpc, memory/disk run, embedding worker busy vs idle), queries (every
detector at each size), shapes (every detector on crews of different shapes at the same stored
spans, with a growth table per dimension), embeddings (texts/s, cache hits on sample_traces),
dashboard (HTML report, Overview page) and chdb (every detector on a ClickHouse store in process,
filled through the exporter's `otel_traces` layout, beside DuckDB on the same spans),
chdb_ingest (OTLP into `serve --store chdb:PATH` with its resolve, and the resolve pass behind an
exporter), chdb_live (every detector read from ClickHouse's findings tables beside DuckDB's, and
spans streamed in with the tables' lag). Results are merged into ``benchmarks/results/<date>.json`` (or --out) and
a Markdown table of targets against measurements is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.report import check_targets, detector_table, markdown_table

logger = logging.getLogger(__name__)

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = (
    "ingest",
    "queries",
    "shapes",
    "embeddings",
    "dashboard",
    "chdb",
    "chdb_ingest",
    "chdb_live",
    "live",
    "compare",
)
FULL = {
    "ingest_spans": 200_000,
    # The sizes: peak RSS across a 10M-span ingest (~15-20 min on 2 cores) and every
    # detector at 100k, 1M and 10M stored spans (growing to 10M takes ~3 min).
    "memory_spans": 10_000_000,
    "embedding_ingest_spans": 100_000,
    "sizes": [100_000, 1_000_000, 10_000_000],
    "repeats": 5,
    "texts": 2048,
    "base_spans": 4096,
    "dashboard_spans": 1_000_000,
    "query_limit_s": 300.0,
    "dashboard_limit_s": 600.0,
    # Issue 14: the shape matrix (benchmarks.shapes.DIMENSIONS) at 1M and 10M stored spans.
    "shape_spans": [1_000_000, 10_000_000],
    "shape_dimensions": "full",
    "shape_repeats": 3,
    "shape_limit_s": 60.0,
    # Issue 17: every detector on chdb beside DuckDB at 1M and 10M spans (benchmarks.chdb); the
    # first 1M through the exporter's layout, the view and the resolve pass, the rest copied.
    "chdb_sizes": [1_000_000, 10_000_000],
    "chdb_repeats": 3,
    "chdb_skip_slow": False,
    "chdb_copy_above": 1_000_000,
    # Issue 36: OTLP into serve --store chdb:PATH (4 and 16 client connections) with the resolve
    # beside it, and the resolve pass behind an exporter (benchmarks.chdb_ingest).
    "chdb_ingest_spans": 200_000,
    "chdb_ingest_connections": [4, 16],
    "chdb_resolve_spans": 200_000,
    # Issue 36: reads from the findings tables on chdb beside DuckDB's, then streamed rounds
    # (benchmarks.chdb_live).
    "chdb_live_spans": 1_000_000,
    "chdb_live_rounds": 5,
    # Issue 31: a live incident (benchmarks.live): reads while ~2,000 spans/s stream into the
    # stored runs, at 1M spans of 1,000-call runs and of the other shapes users send.
    "live": [
        {"spans": 1_000_000, "shape": None},
        {"spans": 1_000_000, "shape": "calls_per_session=10"},
        {"spans": 1_000_000, "shape": "calls_per_session=100000"},
        {"spans": 1_000_000, "shape": "calls_per_session=1000,agents_per_run=64"},
        {"spans": 1_000_000, "shape": "calls_per_session=1000,writes_per_key=1000"},
    ],
    "live_seconds": 120.0,
    "live_rate": 2000.0,
    # Issue 35: a 1,000-call run against its crew's 999 healthy runs at 1M stored spans.
    "compare_spans": 1_000_000,
    "compare_calls": 1000,
    "compare_repeats": 3,
}
# Smoke: every script runs once at a tiny size (the embedding-worker ingest pair is left out: it
# loads the model inside serve, which alone takes longer than the whole smoke run should).
SMOKE = {
    "ingest_spans": 1024,
    "memory_spans": 1024,
    "embedding_ingest_spans": 0,
    "sizes": [512, 1024],
    "repeats": 1,
    "texts": 8,
    "base_spans": 512,
    "dashboard_spans": 512,
    "query_limit_s": 120.0,
    "dashboard_limit_s": 300.0,
    "shape_spans": [2048],
    "shape_dimensions": "smoke",
    "shape_repeats": 1,
    "shape_limit_s": 60.0,
    "chdb_sizes": [1024],
    "chdb_repeats": 1,
    # The three detectors once slow to plan on ClickHouse (benchmarks.chdb.SLOW_TO_PLAN; staged
    # now, but still the longest: run_summary recomputes every detector per call) are left out: the
    # section's wiring is the same for every detector, and tests/analytics/
    # test_clickhouse_detectors.py holds all of them equal to DuckDB's on chdb.
    "chdb_skip_slow": True,
    "chdb_copy_above": None,
    "chdb_ingest_spans": 2048,
    "chdb_ingest_connections": [4],
    "chdb_resolve_spans": 2048,
    "chdb_live_spans": 4096,
    "chdb_live_rounds": 1,
    "live": [{"spans": 4096, "shape": None}],
    "live_seconds": 3.0,
    "live_rate": 500.0,
    "compare_spans": 20_000,
    "compare_calls": 100,
    "compare_repeats": 1,
}


def machine() -> dict:
    """Cores, memory and versions of the machine the numbers come from."""
    import duckdb

    memory_kib = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model
            )
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "duckdb": duckdb.__version__,
        "load_average_at_start": os.getloadavg(),
    }


def run_sections(sections: list[str], config: dict, workdir: Path) -> dict:
    """Run the chosen sections; return their results keyed by section."""
    out: dict = {}
    if "ingest" in sections:
        from benchmarks.ingest import run_ingest

        ingest = {
            "http": run_ingest(workdir, config["ingest_spans"], "http"),
            "grpc": run_ingest(workdir, config["ingest_spans"], "grpc"),
        }
        if config["memory_spans"] != config["ingest_spans"]:
            ingest["memory_run"] = run_ingest(workdir, config["memory_spans"], "http")
        else:
            ingest["memory_run"] = ingest["http"]
        if config["embedding_ingest_spans"]:
            ingest["worker_idle"] = run_ingest(workdir, config["embedding_ingest_spans"], "http")
            ingest["worker_busy"] = run_ingest(
                workdir, config["embedding_ingest_spans"], "http", embeddings=True
            )
        out["ingest"] = ingest
    keep = workdir / "dashboard.duckdb"
    if "queries" in sections:
        from benchmarks.queries import run_queries

        out["queries"] = run_queries(
            workdir,
            config["sizes"],
            config["repeats"],
            keep=keep,
            keep_at=config["dashboard_spans"],
            limit_s=config["query_limit_s"],
            base_spans=config["base_spans"],
        )
    if "shapes" in sections:
        from benchmarks.shapes import DIMENSIONS, SMOKE_DIMENSIONS, run_shapes

        dimensions = SMOKE_DIMENSIONS if config["shape_dimensions"] == "smoke" else DIMENSIONS
        out["shapes"] = {
            str(spans): run_shapes(
                workdir,
                spans,
                dimensions,
                repeats=config["shape_repeats"],
                limit_s=config["shape_limit_s"],
                appends=1 if config["smoke"] else 3,
                only=config.get("shape_labels"),
                # The base's distinct goal texts are embedded on goal_divergence's cold call:
                # the smoke run's small base keeps that to a few dozen texts, not ~400.
                base_spans=config["base_spans"],
            )
            for spans in config["shape_spans"]
        }
    if "embeddings" in sections:
        from benchmarks.embeddings import sample_trace_cache, texts_per_second

        out["embeddings"] = {
            "throughput": texts_per_second(config["texts"]),
            "sample_traces": sample_trace_cache(workdir),
        }
    if "dashboard" in sections:
        import duckdb

        from analytics.types import Window
        from benchmarks.dashboard import in_subprocess
        from benchmarks.dbbuild import SpanDatabase
        from benchmarks.generator import Shape

        if config.get("dashboard_shape"):  # the shape is built here, not taken from queries
            keep.unlink(missing_ok=True)
        if not keep.exists():
            shape = Shape.parse(config.get("dashboard_shape") or "classic")
            db = SpanDatabase(keep, base_spans=config["base_spans"], shape=shape)
            db.grow_to(config["dashboard_spans"])
            db.close()
        with duckdb.connect(str(keep), read_only=True) as conn:
            stored, first, last = conn.execute(
                "SELECT count(*), min(Timestamp), max(Timestamp) FROM spans"
            ).fetchone()
        window = Window(since=first, until=last)
        limit = config["dashboard_limit_s"]
        out["dashboard"] = {
            "shape": config.get("dashboard_shape") or "classic",
            "spans": stored,
            "report_html": in_subprocess("report_build", keep, window, limit),
            "overview_page": in_subprocess("overview_render", keep, window, limit),
        }
        keep.unlink(missing_ok=True)
    if "live" in sections:
        from benchmarks.live import run_live

        out["live"] = [
            run_live(workdir, case["spans"], config["live_seconds"], config["live_rate"], case["shape"])
            for case in config["live"]
        ]
    if "chdb" in sections:
        from benchmarks.chdb import SLOW_TO_PLAN, run_chdb

        out["chdb"] = run_chdb(
            workdir,
            config["chdb_sizes"],
            config["chdb_repeats"],
            base_spans=config["base_spans"],
            skip=SLOW_TO_PLAN if config["chdb_skip_slow"] else {},
            copy_above=config["chdb_copy_above"],
        )
    if "chdb_ingest" in sections:
        from benchmarks.chdb_ingest import exporter_resolve_in_child, run_chdb_ingest

        out["chdb_ingest"] = {
            "serve": [
                run_chdb_ingest(workdir, config["chdb_ingest_spans"], connections)
                for connections in config["chdb_ingest_connections"]
            ],
            "exporter_resolve": exporter_resolve_in_child(workdir, config["chdb_resolve_spans"]),
        }
    if "chdb_live" in sections:
        from benchmarks.chdb_live import run_chdb_live_in_child

        out["chdb_live"] = run_chdb_live_in_child(
            workdir,
            config["chdb_live_spans"],
            3,
            min(100_000, config["chdb_live_spans"]),
            config["chdb_live_rounds"],
        )
    if "compare" in sections:
        from benchmarks.compare import run_compare_bench

        out["compare"] = run_compare_bench(
            workdir, config["compare_spans"], config["compare_calls"], config["compare_repeats"]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the scripts work (CI)")
    parser.add_argument("--sizes", type=int, nargs="+", help="stored-span sizes for the query benchmark")
    parser.add_argument("--ingest-spans", type=int, help="spans per ingest run (http and grpc)")
    parser.add_argument("--memory-spans", type=int, help="spans in the memory/disk ingest run")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--shape-spans", type=int, nargs="+", help="stored spans of each shape database")
    parser.add_argument("--shapes", nargs="+", help="only these shape labels (see benchmarks.shapes.matrix)")
    parser.add_argument(
        "--shape-limit", type=float, help="seconds after which a shape's detector call is interrupted"
    )
    parser.add_argument("--dashboard-shape", help="shape label of the dashboard section's database")
    parser.add_argument(
        "--dashboard-spans", type=int, help="stored spans of the dashboard section's database"
    )
    parser.add_argument("--chdb-sizes", type=int, nargs="+", help="stored spans of the chdb section's stores")
    parser.add_argument(
        "--chdb-skip-slow",
        action="store_true",
        help="chdb: leave out the detectors that were slow to plan there (benchmarks.chdb.SLOW_TO_PLAN)",
    )
    parser.add_argument("--compare-spans", type=int, help="stored spans of the compare section's database")
    parser.add_argument("--out", type=Path, help="results JSON (default benchmarks/results/<date>.json)")
    parser.add_argument("--workdir", type=Path, help="scratch directory for databases")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    config = dict(SMOKE if args.smoke else FULL, smoke=args.smoke)
    if args.sizes:
        config["sizes"] = sorted(args.sizes)
    if args.ingest_spans:
        config["ingest_spans"] = args.ingest_spans
    if args.memory_spans:
        config["memory_spans"] = args.memory_spans
    if args.shape_spans:
        config["shape_spans"] = sorted(args.shape_spans)
    if args.shapes:
        config["shape_labels"] = args.shapes
    if args.shape_limit:
        config["shape_limit_s"] = args.shape_limit
    if args.dashboard_shape:
        config["dashboard_shape"] = args.dashboard_shape
    if args.dashboard_spans:
        config["dashboard_spans"] = args.dashboard_spans
    if args.chdb_sizes:
        config["chdb_sizes"] = sorted(args.chdb_sizes)
    if args.chdb_skip_slow:
        config["chdb_skip_slow"] = True
    if args.compare_spans:
        config["compare_spans"] = args.compare_spans
    sections = args.only or list(SECTIONS)
    today = datetime.now(UTC).date().isoformat()
    out_path = args.out or (
        Path(tempfile.gettempdir()) / f"driftscope-bench-smoke-{today}.json"
        if args.smoke
        else RESULTS / f"{today}.json"
    )
    existing = json.loads(out_path.read_text()) if out_path.exists() else {}
    started = time.perf_counter()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="driftscope-bench-", dir=args.workdir) as scratch:
        results = run_sections(sections, config, Path(scratch))
    for spans, section in (results.get("shapes") or {}).items():
        # Shapes run a few at a time (--shapes) add to the shapes already in the file.
        kept = ((existing.get("shapes") or {}).get(spans) or {}).get("by_shape") or {}
        section["by_shape"] = {**kept, **section["by_shape"]}
        results["shapes"] = {**(existing.get("shapes") or {}), **results["shapes"]}
    document = {
        **existing,
        "date": today,
        "machine": existing.get("machine") or machine(),
        "config": {**existing.get("config", {}), **{k: v for k, v in config.items()}},
        **results,
    }
    document.setdefault("elapsed_s", {})
    if isinstance(document["elapsed_s"], dict):
        document["elapsed_s"].update({section: None for section in sections})
        document["elapsed_s"]["last_run"] = round(time.perf_counter() - started, 1)
    document["targets"] = check_targets(document)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(markdown_table(document))
    if document.get("queries"):
        print("\n" + detector_table(document))
    for section in (document.get("shapes") or {}).values():
        from benchmarks.shapes import growth_table

        for metric in ("cold_s", "median_cpu_s", "after_batch_s", "after_batch_cpu_s"):
            print(growth_table(section, metric))
    if document.get("chdb"):
        from benchmarks.chdb import chdb_table

        print("\n" + chdb_table(document["chdb"]))
    print(f"\nresults written to {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
