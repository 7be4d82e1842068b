"""The read API runs no SQL of a client's choosing and reads no files; tokens stay secret.

Request/response checks run in process (the ``in_process`` ASGI client over serve's real
composition); the token-logging check needs a real ``serve`` and its log."""

import httpx
import pytest

from tests.otlp_builders import make_request

INJECTIONS = [
    "' OR '1'='1",
    "x'; DROP TABLE spans; --",
    '" OR ""="',
    "1) UNION SELECT * FROM read_csv('/etc/passwd') --",
    "read_text('/etc/passwd')",
    "ATTACH '/tmp/evil.duckdb' AS evil",
    "../../../../etc/passwd",
    "%27%20OR%201%3D1",
    "$since",
    "?",
    "\\x00",
    "☃' OR 1=1 /*",
    "a" * 512,
]


@pytest.fixture
def loaded(in_process):
    body = make_request(
        [
            {
                "attrs": {
                    "gen_ai.agent.id": "planner",
                    "gen_ai.conversation.id": "run-1",
                    "driftscope.op": "write",
                }
            }
        ]
    ).SerializeToString()
    response = in_process.post("/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert response.status_code == 200
    return in_process


@pytest.mark.slow  # over 5 s on an idle machine (make test runs it)
def test_injection_strings_in_every_filter_match_nothing_and_change_nothing(loaded):
    client = loaded
    metrics = [m["name"] for m in client.get("/api/v1/metrics").json()["metrics"]]
    for i, name in enumerate(metrics):
        # Every filter at once: each one is bound as a value, so none can match or inject. Every
        # metric gets five of the strings, in turn, so each string reaches several metrics (the
        # filters are one shared SQL fragment; all 13 x every metric cost a minute of detectors).
        for value in (INJECTIONS * 2)[i % len(INJECTIONS) :][:5]:
            params = dict.fromkeys(("service", "agent", "run", "origin_task"), value)
            response = client.get(f"/api/v1/metrics/{name}", params=params)
            assert response.status_code == 200, (name, value, response.text[:200])
            assert response.json()["rows"] == [], (name, value)
    for value in INJECTIONS:
        for param in ("since", "until"):
            response = client.get("/api/v1/runs", params={param: value})
            assert response.status_code == 400 and "Expected" in response.json()["error"]
        response = client.get("/api/v1/runs", params={"agent": value})
        assert response.status_code == 200 and response.json()["rows"] == []
        response = client.get(f"/api/v1/runs/{value}/spans", follow_redirects=True)
        assert response.status_code in (400, 404)
        params = dict.fromkeys(("service", "agent", "run", "origin_task"), value)
        response = client.get("/api/v1/runs/totals", params=params)
        assert response.status_code == 200 and response.json()["rows"] == [], value
        response = client.post("/api/v1/runs/details", json={"run_ids": [value, "run-1"]})
        assert response.status_code in (200, 400), value
        if response.status_code == 200:  # only the real run answers
            assert [r["run_id"] for r in response.json()["rows"]] == ["run-1"]
        response = client.post("/api/v1/evidence-spans", json={"keys": [[value, value]]})
        assert response.status_code in (200, 400) and response.json().get("rows", []) == [], value
    too_long = client.get("/api/v1/runs", params={"service": "x" * 513})
    assert too_long.status_code == 400 and "longer than 512" in too_long.json()["error"]
    control = client.get("/api/v1/runs", params={"service": "a\x01b"})
    assert control.status_code == 400
    assert client.get("/api/v1/health").json()["spans"] == 1
    runs = client.get("/api/v1/runs").json()["rows"]
    assert [r["run_id"] for r in runs] == ["run-1"]


def test_no_route_accepts_sql_or_writes(loaded):
    for path in ("/api/v1/sql", "/api/v1/query", "/api/v1/metrics/../../v1/traces"):
        assert loaded.get(path, params={"q": "select 1"}).status_code in (404, 405)
    assert loaded.post("/api/v1/runs", content=b"select 1").status_code == 405
    assert loaded.delete("/api/v1/runs/run-1/spans").status_code == 405
    assert loaded.get("/api/v1/health").json()["spans"] == 1


def test_token_is_never_logged(serve_factory):
    server = serve_factory(token="tok-very-secret-123").start()
    httpx.get(f"{server.http_url}/api/v1/runs", headers={"Authorization": "Bearer wrong-guess"})
    httpx.get(f"{server.http_url}/api/v1/runs", headers={"Authorization": "Bearer tok-very-secret-123"})
    server.stop()
    assert "tok-very-secret-123" not in server.log() and "wrong-guess" not in server.log()


def test_token_comparison_is_constant_time():
    import inspect

    from collector import auth

    assert "hmac.compare_digest" in inspect.getsource(auth.token_matches)
    assert auth.token_matches("Bearer abc", "abc") and not auth.token_matches("Bearer abd", "abc")
    assert not auth.token_matches("abc", "abc") and auth.token_matches(None, None)
