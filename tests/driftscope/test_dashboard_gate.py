"""The dashboard's gate (issue 32, items 4 and 10): with --token set the dashboard asks for it
before any page runs; a Host header that is not an allowed name is refused. Before issue 32 the
dashboard showed every span to whoever reached its port, whatever the Host."""

from streamlit.testing.v1 import AppTest

from driftscope.dashboard_gate import allowed_hosts_from_env

TOKEN = "gate-token-1234"


def _gated_page():
    import streamlit as st

    from driftscope.dashboard_gate import require_access

    require_access()
    st.markdown("the dashboard's pages")


def _shown(at: AppTest) -> bool:
    return any("the dashboard's pages" in m.value for m in at.markdown)


def test_without_a_token_the_pages_run(monkeypatch):
    monkeypatch.delenv("DRIFTSCOPE_TOKEN", raising=False)
    at = AppTest.from_function(_gated_page).run()
    assert _shown(at) and not at.text_input


def test_with_a_token_the_dashboard_asks_for_it_first(monkeypatch):
    monkeypatch.setenv("DRIFTSCOPE_TOKEN", TOKEN)
    at = AppTest.from_function(_gated_page).run()
    assert not _shown(at) and len(at.text_input) == 1
    at.text_input[0].set_value("wrong").run()
    assert not _shown(at) and "not the collector's token" in at.error[0].value
    at.text_input[0].set_value(TOKEN).run()
    assert _shown(at) and not at.text_input
    at.run()  # the session stays in
    assert _shown(at)


def test_the_dashboard_answers_loopback_names_and_listed_hosts_only():
    allowed = allowed_hosts_from_env({})
    for host in ("127.0.0.1:8501", "localhost:8501", "[::1]:8501", "LOCALHOST"):
        assert allowed.allows(host), host
    for host in ("evil.example.com:8501", "evil.example.com", "10.0.0.5:8501", "127.0.0.1.evil.example"):
        assert not allowed.allows(host), host
    listed = allowed_hosts_from_env({"DRIFTSCOPE_ALLOWED_HOSTS": "dash.internal, 10.0.0.5"})
    assert listed.allows("dash.internal:8501") and listed.allows("10.0.0.5:8501")
    assert not listed.allows("evil.example.com")
