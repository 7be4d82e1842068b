"""Every dashboard page rendered with Streamlit's AppTest against a real DuckDB file."""

from __future__ import annotations

import socket

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import app_main
from dashboard.launch import SOURCE_ENV
from tests.dashboard.test_dashboard_db import XSS, XSS_RUN, build_dashboard_db, expected_findings, truths

TIMEOUT = 120


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    return build_dashboard_db(tmp_path_factory.mktemp("dash") / "crew.duckdb")


def _run_page(monkeypatch, source: str, page: str | None, query: dict | None = None) -> AppTest:
    monkeypatch.setenv(SOURCE_ENV, source)
    at = AppTest.from_file(app_main, default_timeout=TIMEOUT)
    at.run()
    if page:
        at.switch_page(f"views/{page}.py")
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if not at.error:  # every working page offers the report for its filters
        assert "Download report" in [b.proto.label for b in at.get("download_button")]
    return at


def _truth(scenario: str, variant: str = "unguarded") -> dict:
    return next(t for t in truths() if t["scenario"] == scenario and t["variant"] == variant)


def _table_text(at: AppTest) -> str:
    return "\n".join(df.value.to_string() for df in at.dataframe)


def test_overview_tiles_count_each_injected_failure_mode(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), None)
    assert at.title[0].value == "Coordination failures"
    tiles = {m.label: int(m.value) for m in at.metric}
    expected = expected_findings()
    for label, metric in (
        ("lost updates (split-brain)", "lost_updates"),
        ("ping-pong between agents", "ping_pong"),
        ("duplicate side effect", "duplicate_side_effects"),
        ("constraint dropped on delegation", "constraint_drops"),
        ("goal drift along delegation", "goal_divergence"),
    ):
        assert tiles[label] == sum(runs.get(metric, 0) for runs in expected.values()), label
    incidents = at.dataframe[0].value
    assert _truth("split_brain")["run_id"] in set(incidents["run_id"])
    assert not any(r.startswith("run-healthy") for r in incidents["run_id"])


def test_overview_leads_with_failing_runs_then_review_then_degraded(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), None)
    incidents = at.dataframe[0].value
    verdicts = list(incidents["verdict"])
    assert verdicts[0] == "failing" and verdicts == sorted(
        verdicts, key=["failing", "to review", "degraded"].index
    )
    # the dropped constraint is a failure (guarded runs, where a guard did its job, come after it)
    drop = _truth("constraint_drop")["run_id"]
    assert verdicts[list(incidents["run_id"]).index(drop)] == "failing"
    row = incidents.set_index("run_id").loc[_truth("goal_drift")["run_id"]]
    assert row["verdict"] == "to review" and "threshold not calibrated" in row["worst_failure_mode"]
    assert list(incidents.columns)[:3] == ["run_id", "verdict", "worst_failure_mode"]  # run, what happened
    assert "UTC (" in incidents["last_span"][0] and "ago)" in incidents["last_span"][0]
    assert "Newest span in this window: 2026-01-16 21:46:43 UTC" in at.caption[0].value
    links = at.get("page_link")
    assert links[0].proto.page.endswith("run_explorer") or "run_explorer" in str(links[0].proto)
    assert "Open failing run" in links[0].proto.label
    counts = {m.label: int(m.value) for m in at.metric if m.label.endswith(" runs")}
    assert counts["failing runs"] == verdicts.count("failing") and counts["healthy runs"] >= 2


def test_filters_are_read_from_and_kept_in_the_url(monkeypatch, db_path):
    run = _truth("recursion_loop")["run_id"]
    monkeypatch.setenv(SOURCE_ENV, str(db_path))
    at = AppTest.from_file(app_main, default_timeout=TIMEOUT)
    at.query_params["run_filter"] = run  # a pasted link: the URL is there before the first run
    at.query_params["window"] = "All time"
    at.run()
    at.switch_page("views/loops.py").run()
    assert not at.exception and at.selectbox(key="run_filter").value == run
    assert list(at.dataframe[0].value["run_id"]) == [run]
    # Writing the URL back is the browser's side of bind="query-params" (tests/e2e/test_browser.py).


def test_split_brain_lists_divergent_reads_and_lost_updates(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "split_brain")
    truth = _truth("split_brain")
    reads, updates = at.dataframe[0].value, at.dataframe[1].value
    unguarded = reads[reads["run_id"] == truth["run_id"]]
    assert set(unguarded["state_key"]) == {r["key"] for r in truth["divergent_reads"]}
    assert sorted(
        zip(updates["state_key"], updates["clobbered_agent"], updates["agent"], strict=True)
    ) == sorted((u["key"], u["clobbered_writer"], u["clobbered_by"]) for u in truth["lost_updates"])
    assert len(at.get("plotly_chart")) == 1  # the version timeline


def test_rejections_page_shows_rates_prevention_and_coverage(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "rejections")
    assert len(at.get("plotly_chart")) == 2
    over, prevented, coverage = (df.value for df in at.dataframe)
    assert (over["rejection_rate"] > over["threshold"]).all() and len(over) > 0
    reasons = ", ".join(prevented["prevented_reasons"])
    prevented_truth = {p["reason"] for t in truths() for p in t["prevented"]}
    assert prevented_truth <= set(reasons.split(", "))
    assert set(coverage["coverage"]) <= {"enforced", "partial", "watch_only"} and len(coverage) > 5


def test_constraints_page_shows_dropped_constraint_with_hop_and_agent(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "constraints")
    drops = at.dataframe[-1].value
    truth = _truth("constraint_drop")["constraint_drops"]
    assert sorted(
        zip(drops["constraint_id"], drops["hop"], drops["agent"], drops["delegate_to"], strict=True)
    ) == sorted((d["constraint_id"], d["hop"], d["from_agent"], d["to_agent"]) for d in truth)
    assert len(at.get("plotly_chart")) == 1  # the constraint x hop heatmap
    # the constraints' text, as the ledger carries it, beside their ids (issue 34)
    texts = dict(zip(drops["constraint_id"], drops["constraint_text"], strict=True))
    assert texts == {d["constraint_id"]: d["constraint_text"] for d in truth}
    listed = next(df.value for df in at.dataframe if "constraint_text" in df.value and "hop" not in df.value)
    assert listed["constraint_text"].str.len().min() > 0


def test_goal_drift_page_flags_the_drifted_subtasks(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "goal_drift")
    drifted = at.dataframe[0].value
    truth = _truth("goal_drift")["drifted_subtasks"]
    assert sorted(drifted["hop"]) == sorted(d["hop"] for d in truth)
    assert set(drifted["subtask"]) == {d["text"] for d in truth}
    assert len(at.get("plotly_chart")) == 1


def test_context_drift_page_names_stale_holders_and_the_stale_send(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "context_drift")
    holders, sends = at.dataframe[0].value, at.dataframe[1].value
    truth = _truth("context_drift")
    unguarded = holders[holders["run_id"] == truth["run_id"]]
    assert set(unguarded["agent"]) == {h["agent"] for h in truth["stale_holders"]}
    allowed = sends[sends["allowed"]]
    assert list(allowed["agent"]) == [s["agent"] for s in truth["stale_policy_sends"]]
    assert list(allowed["run_id"]) == [truth["run_id"]]
    assert [m.value for m in at.metric] == ["1", "1"]  # one stale send went out, one was refused


def test_loops_page_lists_all_four_loop_failures(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "loops")
    repeated, ping_pong, budget, dupes, _ = (df.value for df in at.dataframe)  # and no progress
    loop = _truth("recursion_loop")["looped_calls"][0]
    row = repeated[repeated["run_id"] == _truth("recursion_loop")["run_id"]].iloc[0]
    assert (row["agent"], row["tool_name"], row["calls"]) == (loop["agent"], loop["tool"], loop["count"])
    assert set(ping_pong["agents"].iloc[0].split(", ")) == set(_truth("ping_pong")["ping_pong"][0]["agents"])
    assert sorted(budget["agent"]) == sorted(
        b["agent"] for b in _truth("step_budget", "guarded")["budget_exhaustion"]
    )
    assert list(dupes["tool_name"]) == [
        d["tool"] for d in _truth("duplicate_side_effect")["duplicate_side_effects"]
    ]
    # run, what happened and evidence lead every table
    assert all(list(t.columns)[:3] == ["run_id", "what_happened", "evidence"] for t in (repeated, budget))
    # span text is data in a grid, not markup
    assert XSS in " ".join(repeated["signature"]) or "xss" in " ".join(repeated["signature"])


def test_run_explorer_opens_the_run_named_in_the_query(monkeypatch, db_path):
    run = _truth("ping_pong")["run_id"]
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": run})
    assert at.selectbox(key="explorer_run").value == run
    assert len(at.get("plotly_chart")) == 2  # timeline and delegation graph
    findings = at.dataframe[0].value
    assert any("delegation loop without progress" in text for text in findings["what_happened"])
    assert "Download this run's report" in [b.proto.label for b in at.get("download_button")]


def _evidence_labels(at: AppTest) -> list[str]:
    return [e.label for e in at.expander if "evidence]" in e.label]


def test_run_explorer_highlights_only_the_selected_findings_evidence(monkeypatch, db_path):
    from dashboard.datasource import DuckDBFileSource

    run = _truth("split_brain")["run_id"]
    spans = DuckDBFileSource(db_path).run_spans(run).set_index("span_id")
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": run})
    findings = at.dataframe[0].value
    assert findings["what_happened"][0].startswith("failure: lost update")
    first = findings["evidence"][0].split(", ")[0]  # the evidence column names the spans
    # the first finding's evidence spans, and only they, are marked; the panel opens on the first
    labels = _evidence_labels(at)
    assert len(labels) == 2 and all(e.proto.expanded for e in at.expander if "evidence]" in e.label)
    evidence = [
        s
        for s in spans.sort_values("start_ns").index
        if any(spans.loc[s, "span_name"].replace("_", "\\_") in label for label in labels)
    ]
    assert first in evidence
    assert at.subheader[2].value.startswith("Attributes of span ")
    assert at.subheader[2].value == f"Attributes of span {first}"
    # the tree nests: the root span holds the agents' spans, which hold their tool calls
    root = at.expander[0]
    assert root.label.startswith("crew run") and root.proto.expanded
    assert len(root.expander) > 3 and len(root.expander[0].expander) >= 1
    # another finding (?finding=3, a divergent read) moves the highlight to its own evidence
    at.query_params["finding"] = "3"
    at.run()
    third = at.dataframe[0].value["evidence"][2].split(", ")[0]
    assert at.subheader[2].value == f"Attributes of span {third}"
    assert _evidence_labels(at) != labels


def test_run_explorer_search_and_span_links(monkeypatch, db_path):
    from dashboard.datasource import DuckDBFileSource

    run = _truth("split_brain")["run_id"]
    spans = DuckDBFileSource(db_path).run_spans(run)
    span = spans["span_id"][5]
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": run, "span": span})
    assert at.subheader[2].value == f"Attributes of span {span}"
    trace = spans["trace_id"][0]
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": run, "q": trace})
    assert f"{(spans['trace_id'] == trace).sum()} span(s) match" in " ".join(c.value for c in at.caption)
    at.text_input(key="q").set_value("report/q3/status").run()  # an attribute value
    matched = [e.label for e in at.expander if "match]" in e.label]
    assert matched and len(matched) == int((spans["state_key"] == "report/q3/status").sum())


def test_run_explorer_shows_span_text_as_text_not_markup(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": XSS_RUN})
    assert len(at.expander) == 4
    assert all("<script" not in m.value for m in at.markdown)
    assert all("<script" not in e.label for e in at.expander)
    assert any("error: <script>alert(" in str(j.value) for j in at.json)  # shown as JSON text
    assert any("<script>alert(" in c.value for c in at.code)  # inputs/outputs as code, not HTML


def test_calibration_page_lists_thresholds_with_provenance(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "calibration")
    names = set(at.dataframe[0].value["name"])
    assert {"goal_divergence", "rejection_rate"} <= names
    assert len(at.expander) >= 2 and len(at.json) >= 2
    assert any("no ROC curve" in i.value for i in at.info)
    assert len(at.get("plotly_chart")) == 1  # divergence histogram


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_collector_down_gives_a_banner_not_a_traceback(monkeypatch):
    at = _run_page(monkeypatch, f"http://127.0.0.1:{_free_port()}", None)
    assert len(at.error) == 1
    assert "Data source unavailable" in at.error[0].value and "driftscope serve" in at.error[0].value
    assert not at.title  # the page itself did not run


def test_empty_database_says_how_to_send_spans(monkeypatch, tmp_path):
    import duckdb

    from driftscope.database import migrate

    path = tmp_path / "empty.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn)
    conn.close()
    at = _run_page(monkeypatch, str(path), "loops")
    assert len(at.info) == 5  # one per table of the page
    assert all("OTEL_EXPORTER_OTLP_ENDPOINT" in i.value and "driftscope demo" in i.value for i in at.info)
    # The Overview of an empty store does not show green "clear" tiles: it says where spans go.
    at = _run_page(monkeypatch, str(path), None)
    assert not at.metric and "No spans received yet" in at.warning[0].value
    assert f"driftscope ingest FILE --db {path}" in at.warning[0].value


def test_missing_database_file_gives_a_banner(monkeypatch, tmp_path):
    at = _run_page(monkeypatch, str(tmp_path / "nope.duckdb"), None)
    assert "driftscope ingest" in at.error[0].value


def test_sidebar_run_filter_scopes_every_table(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "loops")
    run = _truth("recursion_loop")["run_id"]
    at.selectbox(key="run_filter").set_value(run).run()
    assert not at.exception
    repeated = at.dataframe[0].value
    assert list(repeated["run_id"]) == [run]
    assert len(at.info) == 4  # ping-pong, budget, duplicate and no-progress tables are empty for this run
    assert all(run in i.value for i in at.info)


def test_sidebar_agent_and_window_filters(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "context_drift")
    at.selectbox(key="agent").set_value("kb_writer").run()
    holders = at.dataframe[0].value
    assert set(holders["agent"]) == {"kb_writer"}
    at.selectbox(key="window").set_value("Last 15 min").run()  # the sample runs are from January
    assert not at.exception and not at.dataframe
    # spans are stored: an empty window says so and what each detector needs, never "point
    # your exporters here"
    assert len(at.info) == 2 and all(
        i.value.startswith("Spans arrived") and "OTEL_EXPORTER_OTLP_ENDPOINT" not in i.value for i in at.info
    )
    assert all("This detector needs to see" in i.value for i in at.info)


def test_auto_refresh_toggle_keeps_the_page_working(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), None)
    at.toggle(key="auto_refresh").set_value(True).run()
    assert not at.exception
    assert any("Auto-refresh every" in c.value for c in at.sidebar.caption)


def test_custom_window_selects_the_sample_day(monkeypatch, db_path):
    from datetime import date, time

    at = _run_page(monkeypatch, str(db_path), "loops")
    at.selectbox(key="window").set_value("Custom").run()
    at.date_input(key="custom_from").set_value(date(2026, 1, 15)).run()
    at.date_input(key="custom_to").set_value(date(2026, 1, 15)).run()
    at.time_input(key="custom_from_time").set_value(time(10, 30)).run()
    assert not at.exception
    # 10:30 to the end of January 15: the 10:40 ping-pong, 11:10 budget stops and the 11:00
    # searches without progress are inside, the 10:20 query loop and the January 16 XSS run are not.
    assert [len(df.value) for df in at.dataframe] == [1, 2, 1, 1]
    assert "repeated tool calls" in at.info[0].value


def test_run_explorer_bounds_what_it_draws_for_a_long_run(monkeypatch, tmp_path):
    import json

    from collector.files import ingest_files
    from driftscope.database import open_database
    from tests.dashboard.test_dashboard_db import _attr

    start = 1_768_600_000_000_000_000
    common = [_attr("gen_ai.conversation.id", "run-big"), _attr("gen_ai.agent.id", "worker")]
    spans = [
        {"traceId": "6" * 32, "spanId": "b" * 16, "name": "invoke_agent worker", "kind": 1,
         "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 10**12), "attributes": common}
    ]  # fmt: skip
    for i in range(619):
        spans.append(
            {"traceId": "6" * 32, "spanId": f"{i + 1:016x}", "parentSpanId": "b" * 16, "name": f"step {i}",
             "kind": 1, "startTimeUnixNano": str(start + i * 10**6), "endTimeUnixNano": str(start + i * 10**6 + 5),
             "attributes": [*common, _attr("gen_ai.tool.name", "search")]}
        )  # fmt: skip
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}))
    db = tmp_path / "big.duckdb"
    open_database(db).close()
    assert ingest_files(db, [path]).accepted == 620
    at = _run_page(monkeypatch, str(db), "run_explorer", {"run": "run-big"})
    captions = " ".join(c.value for c in at.caption)
    assert "first 250 of 620 spans" in captions and "first 500 of 620 spans" in captions
    inspect = next(box for box in at.selectbox if box.label == "Inspect span")
    assert len(at.expander) == 250 and 500 <= len(inspect.options) <= 501  # + the inspected span


def test_run_explorer_span_and_trace_ids_are_links(monkeypatch, db_path):
    from dashboard.datasource import DuckDBFileSource

    run = _truth("split_brain")["run_id"]
    spans = DuckDBFileSource(db_path).run_spans(run)
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": run})
    texts = {m.value for m in at.markdown}
    for span, trace in zip(spans["span_id"], spans["trace_id"], strict=True):
        assert (
            f"[span {span}](run_explorer?run={run}&span={span}) · [trace {trace}](run_explorer?run={run}&q={trace})"
            in texts
        )


def test_run_explorer_lists_many_findings_a_page_at_a_time(monkeypatch, db_path):
    from dashboard import ui

    run = _truth("split_brain")["run_id"]
    whole = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": run}).dataframe[0].value
    assert len(whole) >= 3
    monkeypatch.setattr(ui, "PAGE_ROWS", 2)
    # ?finding=3 opens the page that holds it, and its evidence is the inspected span
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": run, "finding": "3"})
    assert at.number_input(key=f"findings_{run}_page").value == 2
    shown = at.dataframe[0].value
    assert list(shown["#"]) == list(range(3, min(len(whole), 4) + 1))
    assert list(shown["evidence"]) == list(whole["evidence"][2:4])
    third = whole["evidence"][2].split(", ")[0]
    assert at.subheader[2].value == f"Attributes of span {third}"
    # the first page lists the first two, worst first, as the whole table did
    at.number_input(key=f"findings_{run}_page").set_value(1).run()
    assert list(at.dataframe[0].value["#"]) == [1, 2]
    assert list(at.dataframe[0].value["what_happened"]) == list(whole["what_happened"][:2])
    assert at.metric[3].value == str(len(whole))  # the count is of every finding of the run


def test_loops_page_reads_a_huge_tables_evidence_links_only_when_asked(monkeypatch, db_path):
    from dashboard import ui

    whole = _run_page(monkeypatch, str(db_path), "loops")
    assert whole.dataframe[0].value["evidence"].str.len().min() > 0
    monkeypatch.setattr(ui, "EVIDENCE_ROWS", 1)  # every table with two or more rows counts as huge
    at = _run_page(monkeypatch, str(db_path), "loops")
    big = [t for t in at.toggle if t.label == "Evidence span links"]
    assert big and all(not t.value for t in big)
    assert any("evidence-span links are not loaded" in c.value for c in at.caption)
    for before, after in zip(whole.dataframe, at.dataframe, strict=True):
        shown, kept = after.value, before.value
        if len(kept) > 1:  # the same rows and cells, only the evidence-span column left empty
            assert set(shown["evidence"]) == {""}
            pd.testing.assert_frame_equal(shown.drop(columns="evidence"), kept.drop(columns="evidence"))
        else:
            pd.testing.assert_frame_equal(shown, kept)
    # switched on, a table is the whole table again
    key = big[0].key
    at.toggle(key=key).set_value(True).run()
    assert not at.exception
    pd.testing.assert_frame_equal(at.dataframe[0].value, whole.dataframe[0].value)


def test_constraints_page_reads_only_the_ledger_columns_it_shows(monkeypatch, db_path):
    from analytics.read import describe_metrics
    from dashboard import ui
    from dashboard.datasource import DuckDBFileSource

    ledger = next(m for m in describe_metrics() if m["name"] == "constraint_ledger")
    asked: list = []
    real = DuckDBFileSource.metric

    def recorded(source, name, window, filters, columns=None):  # the real read, its arguments noted
        asked.append((name, columns))
        return real(source, name, window, filters, columns)

    monkeypatch.setattr(DuckDBFileSource, "metric", recorded)
    ui.cached_metric.clear()  # frames earlier tests' pages read are shared by every session
    at = _run_page(monkeypatch, str(db_path), "constraints")
    read = [columns for name, columns in asked if name == "constraint_ledger"]
    assert read and all(c is not None and "span_ids" not in c for c in read)
    assert set(read[0]) < set(ledger["columns"])
    assert len(at.get("plotly_chart")) == 1 and at.selectbox(key="origin_task").options
