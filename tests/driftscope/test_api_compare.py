"""GET /api/v1/runs/{id}/compare (issue 35) on serve's composition in process: OTLP in, the
comparison out."""

from tests.compare_crews import crew_otlp, crew_steps
from tests.otlp_builders import BASE_NS, make_request

PB = {"Content-Type": "application/x-protobuf"}


def post_crew(client) -> None:
    specs = []
    for i, steps in enumerate([crew_steps(), crew_steps(), crew_steps(searches=2)]):
        specs += crew_otlp(f"h{i}", steps, trace=i + 1, start_ns=BASE_NS + i * 10**10)
    specs += crew_otlp("bad", crew_steps(searches=4, failing=3), trace=9, start_ns=BASE_NS + 9 * 10**10)
    body = make_request(specs).SerializeToString()
    assert client.post("/v1/traces", content=body, headers=PB).status_code == 200


def test_compare_answers_the_departure_and_the_differences_with_their_spans(in_process):
    post_crew(in_process)
    answer = in_process.get("/api/v1/runs/bad/compare")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["run"]["service"] == "crew" and body["baseline"]["runs"] == 3
    assert body["departure"]["pos"] == 3 and body["departure"]["agent"] == "researcher"
    assert body["departure"]["span_id"] == (9 * 1000 + 4).to_bytes(8, "big").hex()
    kinds = {d["kind"] for d in body["differences"]}
    assert {"more", "errors"} <= kinds
    assert all(d["span_ids"] for d in body["differences"])
    assert body["alignment"] and {"run_span_id", "baseline_span_id", "status"} <= set(body["alignment"][0])


def test_compare_with_a_chosen_run_and_with_itself(in_process):
    post_crew(in_process)
    chosen = in_process.get("/api/v1/runs/bad/compare", params={"baseline": "h2"}).json()
    assert chosen["baseline"]["mode"] == "chosen run" and chosen["baseline"]["closest_run"] == "h2"
    itself = in_process.get("/api/v1/runs/bad/compare", params={"baseline": "bad"}).json()
    assert itself["departure"] is None and itself["differences"] == []


def test_compare_refuses_unknown_runs_and_parameters(in_process):
    post_crew(in_process)
    missing = in_process.get("/api/v1/runs/nope/compare")
    assert missing.status_code == 404 and "no spans for run 'nope'" in missing.json()["error"]
    gone = in_process.get("/api/v1/runs/bad/compare", params={"baseline": "gone"})
    assert gone.status_code == 404 and "baseline run 'gone'" in gone.json()["error"]
    bad = in_process.get("/api/v1/runs/bad/compare", params={"service": "crew"})
    assert bad.status_code == 400 and "allowed here: baseline, since, until" in bad.json()["error"]
    assert in_process.get("/api/v1/runs/bad/compare", params={"since": "soon"}).status_code == 400


def test_a_window_without_healthy_runs_answers_no_baseline(in_process):
    post_crew(in_process)
    # The healthy runs start before the failing one: a window from the failing run's start on
    # holds none of them.
    since = (BASE_NS + 9 * 10**10) // 10**9
    body = in_process.get("/api/v1/runs/bad/compare", params={"since": str(since)}).json()
    assert body["baseline"]["runs"] == 0 and "no baseline" in body["baseline"]["note"]
    assert body["departure"] is None
