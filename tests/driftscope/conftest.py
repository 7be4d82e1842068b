"""Fixtures shared by tests/driftscope."""

from __future__ import annotations

import pytest


@pytest.fixture
def sink():
    """A local HTTP receiver on 127.0.0.1 standing in for Alertmanager, a webhook and Slack
    (tests/driftscope/test_alerting.py's ``Sink``)."""
    from tests.driftscope.test_alerting import Sink

    server = Sink()
    yield server
    server.shutdown()
    server.server_close()
