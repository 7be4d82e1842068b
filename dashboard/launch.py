"""Start the Streamlit dashboard as a child process (the CLI's `driftscope dashboard` / `up`)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from dashboard import app_main

logger = logging.getLogger(__name__)

SOURCE_ENV = "DRIFTSCOPE_SOURCE"
TOKEN_ENV = "DRIFTSCOPE_TOKEN"
ALLOWED_HOSTS_ENV = "DRIFTSCOPE_ALLOWED_HOSTS"
# A database-file source runs analytics in the dashboard process, with this side-effect tool pattern.
SIDE_EFFECT_TOOLS_ENV = "DRIFTSCOPE_SIDE_EFFECT_TOOLS"


def dashboard_command(port: int, host: str = "127.0.0.1", script: str = app_main) -> list[str]:
    """The ``streamlit run`` command line for the dashboard on ``host:port``; ``script`` is the
    entry script (the composition's own, which hands the dashboard a store opener, or ours)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        script,
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "viewer",
    ]


def run_dashboard(
    source: str,
    port: int,
    host: str = "127.0.0.1",
    token: str | None = None,
    script: str = app_main,
    allowed_hosts: tuple[str, ...] | None = None,
) -> subprocess.Popen:
    """Start the dashboard reading ``source`` (read-API URL or DuckDB file path); return the process.

    The source travels in ``DRIFTSCOPE_SOURCE`` (a token in ``DRIFTSCOPE_TOKEN``, extra host
    names in ``DRIFTSCOPE_ALLOWED_HOSTS``) because
    ``streamlit run`` passes no arguments of its own to the script. The caller owns the process:
    terminate and wait for it when done.
    """
    env = dict(os.environ)
    env[SOURCE_ENV] = source
    if token:
        env[TOKEN_ENV] = token
    if allowed_hosts:
        env[ALLOWED_HOSTS_ENV] = ",".join(allowed_hosts)
    command = dashboard_command(port, host, script)
    logger.info("starting dashboard on http://%s:%s for %s", host, port, source)
    return subprocess.Popen(command, env=env)
