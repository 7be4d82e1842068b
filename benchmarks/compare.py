"""Compare: one run against its crew's healthy runs at a number of stored spans (issue 35).

The benchmark generator's crews carry refusals and loops in every long run (no run of them is
healthy), so this section builds its own crew: one template run of ``calls`` tool calls (a
manager hands work to four agents in turn; each call a distinct question, so no detector finds
anything) decoded and stored by the collector, then copied in SQL to ``spans`` stored spans, each
copy its own run, trace and time. The newest run gets one failing call and one call to a tool
the crew never uses, mid-run. With 1,000-call runs at 1M spans the baseline is 999 healthy runs.
The findings tables (the comparison's, ``analytics.compare_kept``, and the rest) are then built as serve keeps
them (``tables_s``; ``kept=False`` leaves them out: the baseline is read from the spans).
``analytics.read.compare_run`` is timed on a read-only connection: its cold call (run_summary's
verdicts for the crew: computed, or read from the findings tables when built), the median of
``repeats`` further calls, and the parts of a warm call (the verdicts, the steps query, the pure
post-processing) once each.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import time
from pathlib import Path

import duckdb

from analytics import compare, materialize, read
from analytics.registry import run_metric
from analytics.types import Filters, Window, direct_write
from collector.decode import JSON, SPAN_COLUMNS, decode_payload
from collector.store import insert_batches
from driftscope.database import open_database

logger = logging.getLogger(__name__)

SERVICE = "bench-crew"
WORKERS = ("researcher", "analyst", "writer", "reviewer")
TOOLS = ("search", "fetch_doc", "summarise", "write_note")
BASE_NS = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z
CALL_NS = 1_000_000  # a call every millisecond
RUN_STRIDE_S = 3600  # copies an hour apart
WORDS = tuple(
    "alpha bravo cedar delta ember fjord garnet harbor iris jasper kelp lumen maple nickel onyx pebble quartz "
    "raven sierra tundra umber violet willow xenon yarrow zephyr amber basalt cobalt dune".split()
)


def _attr(key: str, value) -> dict:
    return {
        "key": key,
        "value": {"intValue": str(value)} if isinstance(value, int) else {"stringValue": str(value)},
    }


def template_request(calls: int, seed: int = 35) -> dict:
    """One run of the crew as an OTLP JSON request: ``calls`` spans in all (the manager's agent
    span, a hand-off and an agent span per worker among them)."""
    rng = random.Random(seed)
    spans = []

    def span(i: int, name: str, attrs: dict, parent: str = "") -> str:
        span_id = f"{i + 1:016x}"
        spans.append(
            {
                "traceId": "ab" * 16, "spanId": span_id, "parentSpanId": parent, "name": name, "kind": 1,
                "startTimeUnixNano": str(BASE_NS + i * CALL_NS), "endTimeUnixNano": str(BASE_NS + i * CALL_NS + CALL_NS // 2),
                "attributes": [_attr("gen_ai.conversation.id", "bench-run-template"), *(_attr(k, v) for k, v in attrs.items())],
            }
        )  # fmt: skip
        return span_id

    root = span(
        0, "invoke_agent manager", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": "manager"}
    )
    per_worker = (calls - 1) // len(WORKERS)
    i = 1
    for w, worker in enumerate(WORKERS):
        hand = {"gen_ai.operation.name": "execute_tool", "gen_ai.agent.id": "manager", "gen_ai.tool.name": "delegate",
                "driftscope.op": "delegate", "driftscope.delegate.to": worker,
                "gen_ai.tool.call.arguments": json.dumps({"task": f"part {w}"})}  # fmt: skip
        span(i, "execute_tool delegate", hand, root)
        agent = span(i + 1, f"invoke_agent {worker}", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": worker}, root)  # fmt: skip
        i += 2
        last = calls if w == len(WORKERS) - 1 else 1 + (w + 1) * per_worker
        while i < last:
            question = " ".join(rng.sample(WORDS, 6)) + f" {i}"
            call = {"gen_ai.operation.name": "execute_tool", "gen_ai.agent.id": worker,
                    "gen_ai.tool.name": TOOLS[i % len(TOOLS)], "gen_ai.tool.call.arguments": json.dumps({"query": question})}  # fmt: skip
            span(i, f"execute_tool {TOOLS[i % len(TOOLS)]}", call, agent)
            i += 1
    resource = {"attributes": [_attr("service.name", SERVICE)]}
    return {
        "resourceSpans": [
            {"resource": resource, "scopeSpans": [{"scope": {"name": "bench"}, "spans": spans}]}
        ]
    }


def _copy_sql() -> str:
    """SELECT of copy ``k`` of ``_template`` (column order of `spans`): its own run, trace, time."""
    exprs = []
    for name in SPAN_COLUMNS:
        if name == "run_id":
            exprs.append("printf('bench-run-%06d', k) AS run_id")
        elif name == "TraceId":
            exprs.append("printf('%032x', k + 1) AS TraceId")
        elif name == "SpanAttributes":
            exprs.append(
                "list_transform(SpanAttributes, lambda e: {'key': e.key, 'value': "
                "CASE WHEN e.key = 'gen_ai.conversation.id' THEN printf('bench-run-%06d', k) ELSE e.value END}) "
                "AS SpanAttributes"
            )
        elif name == "Timestamp":
            exprs.append(f"Timestamp + to_microseconds(k * {RUN_STRIDE_S * 1_000_000}) AS Timestamp")
        elif name in ("start_ns", "end_ns"):
            exprs.append(f"{name} + k * {RUN_STRIDE_S * 1_000_000_000} AS {name}")
        else:
            exprs.append(name)
    return "SELECT " + ", ".join(exprs) + " FROM _template, range(?, ?) AS r(k)"


def build_crew_database(path: Path, spans: int, calls: int) -> tuple[int, str]:
    """The crew's runs in a new database at ``path``: (runs, the newest run's id)."""
    path.unlink(missing_ok=True)
    conn = open_database(path)
    batch = decode_payload(json.dumps(template_request(calls)).encode(), JSON)
    conn.execute("BEGIN")
    insert_batches(conn, [batch])
    conn.execute("COMMIT")
    conn.execute("CREATE TEMP TABLE _template AS SELECT * FROM spans")
    conn.execute("DELETE FROM spans")
    runs = max(2, spans // calls)
    step = max(1, 800_000 // calls)
    for first in range(0, runs, step):
        conn.execute(f"INSERT INTO spans {_copy_sql()}", [first, min(runs, first + step)])
    newest = f"bench-run-{runs - 1:06d}"
    # The failing run: one call fails and one calls a tool the crew never uses, mid-run.
    middle = calls // 2
    conn.execute(
        "UPDATE spans SET StatusCode = 'Error', outcome = 'error' WHERE run_id = ? AND SpanId = ?",
        [newest, f"{middle + 11:016x}"],
    )
    conn.execute(
        "UPDATE spans SET tool_name = 'drop_table' WHERE run_id = ? AND SpanId = ?",
        [newest, f"{middle + 13:016x}"],
    )
    conn.execute("CHECKPOINT")
    conn.close()
    return runs, newest


def keep_tables(path: Path) -> float:
    """Build the findings tables as serve's materializer does after the spans commit (every
    maintained result: the comparison's own (``analytics.compare_kept``) and the run summary
    whose verdicts pick the healthy runs); return the seconds it took."""
    conn = duckdb.connect(str(path))
    started = time.perf_counter()
    try:
        cursor = conn.cursor()
        report = materialize.bring_up_to_date(cursor, direct_write(conn))
        cursor.close()
        if report.failed:
            raise RuntimeError(f"comparison tables not built: {report.failed}")
        conn.execute("CHECKPOINT")
    finally:
        conn.close()
    return time.perf_counter() - started


def _timed(call):
    start, cpu = time.perf_counter(), time.process_time()
    value = call()
    return value, time.perf_counter() - start, time.process_time() - cpu


def run_compare_bench(workdir: Path, spans: int, calls: int, repeats: int, kept: bool = True) -> dict:
    """Build the crew's database (and, with ``kept``, the comparison's maintained tables), time
    compare_run cold and warm; return the figures."""
    path = workdir / f"compare-{spans}.duckdb"
    started = time.perf_counter()
    runs, run = build_crew_database(path, spans, calls)
    build_s = time.perf_counter() - started
    tables_s = keep_tables(path) if kept else None
    conn = duckdb.connect(str(path), read_only=True)
    try:
        (stored,) = conn.execute("SELECT count(*) FROM spans").fetchone()
        answer, cold, cold_cpu = _timed(lambda: read.compare_run(conn, run))
        warm, warm_cpu = [], []
        for _ in range(repeats):
            answer, wall, cpu = _timed(lambda: read.compare_run(conn, run))
            warm.append(wall)
            warm_cpu.append(cpu)
        frame, verdicts_s, _ = _timed(
            lambda: run_metric(conn, "run_summary", Window(), Filters(), ["run_id", "verdict"])
        )
        ids = [
            str(r) for r in frame.loc[(frame["verdict"] == "healthy") & (frame["run_id"] != run), "run_id"]
        ]
        own, own_s, _ = _timed(lambda: compare.run_steps(conn, run))
        base, base_s, base_cpu = _timed(lambda: compare.baseline_parts(conn, ids))
        found, departure_s, _ = _timed(lambda: compare.departure(own, base))
        closest = compare.run_steps(conn, found["closest_run"])
        _, differ_s, _ = _timed(lambda: compare.differ(own, base, closest, found["departure"]))
    finally:
        conn.close()
    path.unlink(missing_ok=True)
    first = answer["departure"]
    result = {
        "spans": stored,
        "runs": runs,
        "calls_per_run": calls,
        "build_s": round(build_s, 1),
        "baseline_from": "tables" if kept else "spans",
        "tables_s": None if tables_s is None else round(tables_s, 1),
        "baseline_runs": answer["baseline"]["runs"],
        "departure": {k: first[k] for k in ("pos", "step")} if first else None,
        "differences": [f"{d['kind']} {d['agent']} {d['tool']}" for d in answer["differences"]],
        "cold_s": round(cold, 3),
        "cold_cpu_s": round(cold_cpu, 3),
        "median_s": round(statistics.median(warm), 3),
        "median_cpu_s": round(statistics.median(warm_cpu), 3),
        "runs_s": [round(w, 3) for w in warm],
        "parts_s": {
            "verdicts": round(verdicts_s, 3), "run_steps_sql": round(own_s, 3), "baseline_sql": round(base_s, 3),
            "baseline_sql_cpu": round(base_cpu, 3), "departure": round(departure_s, 3), "differences_profile_alignment": round(differ_s, 3),
        },
        "target_s": 0.5,
    }  # fmt: skip
    logger.info("compare at %d spans (%d runs of %d calls): %s", stored, runs, calls, result)
    return result
