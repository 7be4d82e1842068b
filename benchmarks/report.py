"""Targets of issue 5 checked against a results document, and the Markdown table of them."""

from __future__ import annotations

from typing import Any

GIB = 1024**3


def _get(document: dict, *path: str) -> Any:
    node: Any = document
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _size_entry(document: dict, wanted: int) -> tuple[int | None, dict | None]:
    by_size = _get(document, "queries", "by_size") or {}
    for key, entry in by_size.items():
        if int(key) == wanted:
            return entry["spans"], entry
    return None, None


def _row(target: str, limit: str, measured: Any, met: bool | None, note: str = "") -> dict:
    return {"target": target, "limit": limit, "measured": measured, "met": met, "note": note}


def _split(result: dict | None) -> str:
    """``detectors X s + rest Y s (load a)`` for a dashboard result that has the split."""
    if not result or result.get("detector_s") is None:
        return ""
    load = result.get("load_average")
    at = f", load average {load[0]:.1f}" if load else ""
    return f"detectors {result['detector_s']} s + rest {result['other_s']} s{at}"


def check_targets(document: dict) -> list[dict]:
    """One row per target: the limit, what was measured (None = not measured) and whether met."""
    return _base_targets(document) + _live_targets(document) + _chdb_ingest_targets(document)


def _chdb_ingest_targets(document: dict) -> list[dict]:
    """Issue 36: OTLP into serve --store chdb:PATH >= 20k spans/s; the resolve keeps up."""
    section = document.get("chdb_ingest") or {}
    rows = []
    for run in section.get("serve") or []:
        rate = run.get("acked_spans_per_s")
        rows.append(
            _row(
                f"serve --store chdb: acknowledged spans/s, {run['connections']} connections x "
                f"{run['batch_spans']} spans",
                ">= 20,000",
                rate,
                None if rate is None else rate >= 20_000,
                f"{run.get('serve_cpu_s')} CPU-s of serve for {run.get('spans_acknowledged'):,} spans; resolved "
                f"{run.get('resolved_after_last_ack_s')} s after the last ack; load "
                + "/".join(f"{x:.1f}" for x in run.get("load_average_after") or ()),
            )
        )
    behind = section.get("exporter_resolve")
    if behind:
        rows.append(
            _row(
                f"resolve pass behind an exporter, {behind['spans']:,} spans: spans/s",
                f">= the insert through the views ({behind['insert_spans_per_s']:,.0f})",
                behind["resolve_spans_per_s"],
                behind["resolve_spans_per_s"] >= behind["insert_spans_per_s"],
                f"pass over one more insert of {behind['pass_after_one_insert_spans']:,}: "
                f"{behind['pass_after_one_insert_s']} s",
            )
        )
    return rows


def _live_targets(document: dict) -> list[dict]:
    """Issue 31: every detector's p95 and the findings lag under live ingest, per shape."""
    rows = []
    for case in document.get("live") or []:
        live = case.get("live") or {}
        shape = (case.get("args") or {}).get("shape") or "calls_per_session=1000"
        spans = (case.get("store") or {}).get("spans", 0)
        big = spans > 5_000_000
        limit_s, lag_limit = (1.0, 10.0) if big else (0.3, 5.0)
        worst = max(
            (
                (name, v["p95"])
                for name, v in (live.get("detectors") or {}).items()
                if v.get("p95") is not None
            ),
            key=lambda item: item[1],
            default=(None, None),
        )
        rows.append(
            _row(
                f"live: every detector p95, {spans:,} spans ({shape})",
                f"<= {int(limit_s * 1000)} ms",
                None if worst[1] is None else round(worst[1], 3),
                None if worst[1] is None else worst[1] <= limit_s,
                f"worst {worst[0]}; {live.get('spans_per_s')} spans/s streamed; load "
                + "/".join(f"{x:.1f}" for x in live.get("load_after") or ()),
            )
        )
        lag = (live.get("lag_s") or {}).get("p95")
        rows.append(
            _row(
                f"live: findings lag p95, {spans:,} spans ({shape})",
                f"<= {lag_limit:g} s",
                lag,
                None if lag is None else lag <= lag_limit,
                f"build {case.get('build_s')} s; serve peak RSS {live.get('serve_peak_rss_bytes')} B",
            )
        )
    return rows


def _base_targets(document: dict) -> list[dict]:
    rows = []
    http = _get(document, "ingest", "http") or {}
    grpc = _get(document, "ingest", "grpc") or {}
    rate = http.get("acked_spans_per_s")
    rows.append(
        _row(
            "durable ingest, OTLP/HTTP protobuf",
            ">= 50,000 spans/s",
            rate,
            None if rate is None else rate >= 50_000,
            f"{http.get('spans_acknowledged')} spans, 4 connections, 512-span requests" if http else "",
        )
    )
    ratio = http.get("ack_to_decode_ratio")
    rows.append(
        _row(
            "ingest / decode-only rate (same payloads)",
            ">= 0.10",
            ratio,
            None if ratio is None else ratio >= 0.10,
            f"decode-only {http.get('decode_only_spans_per_s')} spans/s" if http else "",
        )
    )
    grpc_rate = grpc.get("acked_spans_per_s")
    grpc_ratio = round(grpc_rate / rate, 3) if grpc_rate and rate else None
    rows.append(
        _row(
            "gRPC within 20% of HTTP",
            "0.8 - 1.2 x HTTP",
            grpc_ratio,
            None if grpc_ratio is None else grpc_ratio >= 0.8,
            f"gRPC {grpc_rate} spans/s" if grpc else "",
        )
    )
    for wanted, limit_s, label in ((1_000_000, 0.2, "200 ms"), (10_000_000, 1.0, "1 s")):
        spans, entry = _size_entry(document, wanted)
        if entry is None:
            rows.append(
                _row(f"every detector at {wanted:,} spans", f"<= {label}", None, None, "not measured")
            )
            continue
        timed = {n: t for n, t in entry["detectors"].items() if t["median_s"] is not None}
        slowest = max(timed.items(), key=lambda item: item[1]["median_s"])
        over = sorted(
            n for n, t in entry["detectors"].items() if t["median_s"] is None or t["median_s"] > limit_s
        )
        rows.append(
            _row(
                f"every detector at {spans:,} spans",
                f"<= {label} (median)",
                f"slowest {slowest[0]} {slowest[1]['median_s']:.3f} s",
                not over,
                f"over: {', '.join(over)}" if over else "",
            )
        )
    growth = []
    for entry in (_get(document, "queries", "by_size") or {}).values():
        if "time_growth" in entry:
            for name, factor in entry["time_growth"].items():
                growth.append(
                    (factor / entry["span_growth"], name, factor, entry["span_growth"], entry["spans"])
                )
    if growth:
        worst = max(growth)
        rows.append(
            _row(
                "no detector grows faster than linearly",
                "time growth <= span growth",
                f"worst {worst[1]}: x{worst[2]} time for x{worst[3]} spans (to {worst[4]:,})",
                worst[0] <= 1.0,
            )
        )
    else:
        rows.append(_row("no detector grows faster than linearly", "time growth <= span growth", None, None))
    sample = _get(document, "embeddings", "sample_traces") or {}
    throughput = _get(document, "embeddings", "throughput") or {}
    once = sample.get("each_distinct_text_once")
    rows.append(
        _row(
            "each distinct text embedded once",
            "embedded <= distinct; 2nd pass embeds 0",
            f"{sample.get('embedded_first_pass')} embedded for {sample.get('distinct_texts')} distinct / "
            f"{sample.get('texts_referenced')} referenced; hit rate {sample.get('hit_rate_first_pass')}"
            if sample
            else None,
            None if once is None else bool(once and sample.get("embedded_second_pass") == 0),
        )
    )
    tps = throughput.get("texts_per_s")
    rows.append(_row("embedding throughput", ">= 300 texts/s", tps, None if tps is None else tps >= 300))
    busy = _get(document, "ingest", "worker_busy", "acked_spans_per_s")
    idle = _get(document, "ingest", "worker_idle", "acked_spans_per_s")
    busy_ratio = round(busy / idle, 3) if busy and idle else None
    rows.append(
        _row(
            "ingest with embedding worker busy vs idle",
            ">= 0.9",
            busy_ratio,
            None if busy_ratio is None else busy_ratio >= 0.9,
            f"busy {busy} / idle {idle} spans/s" if busy_ratio else "",
        )
    )
    memory = _get(document, "ingest", "memory_run") or {}
    rss = memory.get("serve_peak_rss_bytes")
    rows.append(
        _row(
            "serve peak RSS during ingest",
            "<= 1.5 GiB over 10M spans",
            f"{rss / GIB:.2f} GiB over {memory.get('spans_acknowledged'):,} spans" if rss else None,
            None if not rss else rss <= 1.5 * GIB,
            "measured over fewer than 10M spans"
            if rss and memory.get("spans_acknowledged", 0) < 10_000_000
            else "",
        )
    )
    per_span = memory.get("bytes_per_span")
    at_largest = _get(document, "queries", "bytes_per_span_at_largest")
    rows.append(
        _row(
            "bytes per stored span on disk",
            "<= 200",
            per_span,
            None if per_span is None else per_span <= 200,
            f"ingested DB; SQL-grown query DB at its largest size: {at_largest}" if at_largest else "",
        )
    )
    compare = _get(document, "compare") or {}
    compare_s = compare.get("median_s")
    rows.append(
        _row(
            f"run comparison (issue 35): a {compare.get('calls_per_run', 1000):,}-call run against "
            f"{compare.get('baseline_runs', 1000):,} healthy runs at {compare.get('spans', 1_000_000):,} spans",
            "<= 0.5 s",
            compare_s,
            None if compare_s is None else compare_s <= 0.5,
            f"warm median; cold {compare.get('cold_s')} s, CPU {compare.get('median_cpu_s')} s; "
            f"parts {compare.get('parts_s')}"
            if compare
            else "not measured",
        )
    )
    dashboard = _get(document, "dashboard") or {}
    report_s = _get(dashboard, "report_html", "first_s")
    report_cut = _get(dashboard, "report_html", "timed_out_after_s")
    rows.append(
        _row(
            f"HTML report, window of {dashboard.get('spans', 0):,} spans",
            "<= 10 s",
            f"> {report_cut} s (stopped)" if report_cut else report_s,
            False if report_cut else (None if report_s is None else report_s <= 10),
            "did not finish; killed at the time limit"
            if report_cut
            else _split(dashboard.get("report_html")),
        )
    )
    page_cut = _get(dashboard, "overview_page", "timed_out_after_s")
    if page_cut:
        rows.append(
            _row(
                f"Overview page render (AppTest), {dashboard.get('spans', 0):,} spans",
                "<= 3 s",
                f"> {page_cut} s (stopped)",
                False,
                "did not finish; killed at the time limit",
            )
        )
        return rows
    page_s = _get(dashboard, "overview_page", "cold_s")
    rows.append(
        _row(
            f"Overview page render (AppTest), {dashboard.get('spans', 0):,} spans",
            "<= 3 s",
            page_s,
            None if page_s is None else page_s <= 3,
            f"warm rerun {_get(dashboard, 'overview_page', 'warm_s')} s; "
            + _split(dashboard.get("overview_page"))
            if page_s is not None
            else "",
        )
    )
    return rows


def markdown_table(document: dict) -> str:
    """The targets as a Markdown table, headed by the machine and date."""
    machine = document.get("machine", {})
    lines = [
        f"Measured {document.get('date')} on {machine.get('cores')} cores ({machine.get('cpu')}), "
        f"{machine.get('memory_gib')} GiB memory, Python {machine.get('python')}, DuckDB {machine.get('duckdb')}.",
        "",
        "| target | limit | measured | met | note |",
        "|---|---|---|---|---|",
    ]
    for row in document.get("targets") or check_targets(document):
        met = {True: "yes", False: "**no**", None: "not measured"}[row["met"]]
        lines.append(f"| {row['target']} | {row['limit']} | {row['measured']} | {met} | {row['note']} |")
    return "\n".join(lines)


def detector_table(document: dict) -> str:
    """Median seconds of every detector at each measured size, with the growth between sizes."""
    by_size = (document.get("queries") or {}).get("by_size") or {}
    if not by_size:
        return ""
    sizes = list(by_size)
    names = sorted({name for entry in by_size.values() for name in entry["detectors"]})
    header = ["detector"] + [f"{by_size[s]['spans']:,} spans (s)" for s in sizes]
    header += [f"growth to {by_size[s]['spans']:,} (x{by_size[s]['span_growth']} spans)" for s in sizes[1:]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        cells = [name]
        for size in sizes:
            timing = by_size[size]["detectors"].get(name, {})
            cells.append("timed out" if timing.get("median_s") is None else f"{timing['median_s']:.3f}")
        for size in sizes[1:]:
            factor = by_size[size].get("time_growth", {}).get(name)
            cells.append("-" if factor is None else f"x{factor}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
