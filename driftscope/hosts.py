"""The Host header check that keeps DNS rebinding out (issue 32).

A web page on ``evil.example`` can re-point its name at 127.0.0.1 and then reach a loopback
server as same-origin: the browser sends ``Host: evil.example``. serve and the dashboard answer
only requests whose Host is a loopback name, the address serve binds (any IP address when it
binds all of them), or a name listed in ``--allowed-hosts`` (``*`` turns the check off). An IP
address in Host cannot be a rebinding attack (the page's origin would be that address itself),
a name can. A request without a Host header (HTTP/1.0 clients) is let through: browsers always
send one.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_name(header: str) -> str:
    """The host of a Host header value, lower case, without port, brackets or a trailing dot."""
    text = header.strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text[1:]
    if text.count(":") == 1:
        text = text.split(":", 1)[0]
    return text.rstrip(".")


@dataclass(frozen=True)
class AllowedHosts:
    """The names a server answers to (see the module docstring)."""

    names: frozenset[str]
    any_ip: bool = False
    anything: bool = False

    @classmethod
    def for_bind(cls, bind_host: str, extra: Iterable[str] | None = ()) -> AllowedHosts:
        extra = tuple(extra or ())
        names = {host_name(n) for n in (*LOOPBACK_NAMES, bind_host, *extra)}
        try:
            any_ip = ipaddress.ip_address(bind_host.strip("[]")).is_unspecified
        except ValueError:
            any_ip = False
        return cls(frozenset(names), any_ip=any_ip, anything="*" in extra)

    def allows(self, header: str | None) -> bool:
        if header is None or self.anything:
            return True
        name = host_name(header)
        if name in self.names or name.endswith(".localhost"):
            return True
        if self.any_ip:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                return False
            return True
        return False


def refusal_message(header: str) -> str:
    return (
        f"Host {header[:100]!r} is not a name this server answers to (a guard against DNS rebinding); "
        "if you reach it by that name, add it with --allowed-hosts (DRIFTSCOPE_ALLOWED_HOSTS)"
    )


class HostCheckMiddleware:
    """ASGI middleware answering 400 to HTTP requests (and closing websockets) whose Host is
    not in ``allowed``, before any endpoint runs."""

    def __init__(self, app, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed.anything:
            await self.app(scope, receive, send)
            return
        header = None
        for key, value in scope.get("headers", ()):
            if key == b"host":
                header = value.decode("latin-1")
                break
        if self.allowed.allows(header):
            await self.app(scope, receive, send)
            return
        logger.info("refused a request with Host %r (not in the allowed hosts)", (header or "")[:100])
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": refusal_message(header or "")}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
