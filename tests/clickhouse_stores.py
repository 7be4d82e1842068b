"""Where the ClickHouse tests run: chdb in process always, and a ClickHouse server too when
DRIFTSCOPE_CLICKHOUSE_URL names one (the same tests, the same statements)."""

from __future__ import annotations

import os

import pytest

SERVER_URL = os.environ.get("DRIFTSCOPE_CLICKHOUSE_URL")


def store_params(dropped: str) -> list:
    """A module fixture's params: "chdb", and "server" skipped without a server URL
    (``dropped``: the databases of that server the tests drop, for the skip reason)."""
    reason = (
        "needs a ClickHouse server: set DRIFTSCOPE_CLICKHOUSE_URL="
        f"clickhouse://127.0.0.1:8123/driftscope_test ({dropped} dropped)"
    )
    return ["chdb", pytest.param("server", marks=pytest.mark.skipif(not SERVER_URL, reason=reason))]
