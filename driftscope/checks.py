"""Checks of command-line values that need the machine: a database path, a free port.

The CLI and the commands it dispatches to (``driftscope.commands``, ``driftscope.calibrate``) call
them; they live here so those modules need not import the CLI that imports them.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from driftscope.settings import BY_NAME, ConfigError


def check_db_path(path: str, flag: str | None = None, create_dirs: bool = True) -> None:
    """Refuse a database path that cannot be created, naming the flag and variable to change.

    Creates missing parent folders (as the store would) when ``create_dirs``; otherwise a missing
    folder is refused (a typo'd path would get a database nobody reads). Never creates the file.
    """
    flag = flag or BY_NAME["db"].flag
    where = f"Pass {flag} PATH (or set {BY_NAME['db'].env}) to a file in a writable folder."
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{flag} {path} is a folder, not a database file. {where}")
    existing = next((p for p in [target.parent, *target.parent.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"{flag} {path}: {existing} is a file, not a folder. {where}")
    if not create_dirs and not target.parent.exists():
        raise ConfigError(
            f"{flag} {path}: the folder {target.parent} does not exist (a typo?). Create it first "
            f"(mkdir -p {target.parent}) or give a path in an existing folder."
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {path}: cannot create the folder {target.parent} ({exc.strerror}). {where}"
        ) from exc
    if not os.access(target.parent, os.W_OK | os.X_OK) or (
        target.exists() and not os.access(target, os.W_OK)
    ):
        raise ConfigError(f"{flag} {path}: no permission to write there. {where}")


def check_port_free(host: str, port: int, name: str) -> None:
    """Refuse a port another process listens on, naming the flag and variable that move it.

    A probe bind with SO_REUSEADDR (as servers bind): a port in TIME_WAIT passes, a listening
    socket does not. The port is released at once; the server binds it moments later.
    """
    setting = BY_NAME[name]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"Cannot resolve host {host!r} for {setting.flag} {port}: {exc}") from exc
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            reason = (
                "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            )
            raise ConfigError(
                f"Port {port} on {host} ({setting.flag}) {reason}: another collector, dashboard or program "
                f"holds it. Stop that, or choose another port with {setting.flag} PORT or {setting.env}=PORT."
            ) from exc
