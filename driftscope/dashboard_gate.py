"""What the dashboard checks before it shows anything (issue 32): the Host header (DNS
rebinding, see ``driftscope.hosts``) and, when the collector has a token, the token itself.

The dashboard holds the collector's token to read through the API; without this gate anyone who
could open the dashboard's port read every span through it. With ``--token`` set, each browser
session enters the token once (compared in constant time) before any page runs.
"""

from __future__ import annotations

import hmac
import os

from driftscope.hosts import AllowedHosts, refusal_message
from driftscope.settings import BY_NAME, ConfigError, parse_host_list

_AUTHENTICATED = "_driftscope_authenticated"


def allowed_hosts_from_env(environ: dict[str, str] | None = None) -> AllowedHosts:
    """The dashboard's allowed hosts: loopback names plus ``DRIFTSCOPE_ALLOWED_HOSTS``."""
    setting = BY_NAME["allowed_hosts"]
    raw = (os.environ if environ is None else environ).get(setting.env, "")
    return AllowedHosts.for_bind("127.0.0.1", parse_host_list(setting.env, raw) if raw else ())


def token_accepted(entered: str, token: str) -> bool:
    return hmac.compare_digest(entered.strip().encode(), token.encode())


def require_access() -> None:
    """Stop the Streamlit script unless the Host is allowed and, with a token set, the session
    has entered it."""
    import streamlit as st

    try:
        allowed = allowed_hosts_from_env()
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    host = st.context.headers.get("Host")
    if not allowed.allows(host):
        st.error(refusal_message(host or ""))
        st.stop()
    token = os.environ.get(BY_NAME["token"].env)
    if not token or st.session_state.get(_AUTHENTICATED):
        return
    st.title("driftscope")
    entered = st.text_input("This collector needs its token (--token) to show its spans", type="password")
    if entered and token_accepted(entered, token):
        st.session_state[_AUTHENTICATED] = True
        st.rerun()
    if entered:
        st.error("That is not the collector's token.")
    st.stop()
