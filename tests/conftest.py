import os

import pytest

from tests.serve_helpers import new_serve

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def serve(tmp_path):
    """A running `driftscope serve` on free loopback ports, stopped after the test."""
    server = new_serve(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def module_serve(tmp_path_factory):
    """One `driftscope serve` shared by a module's tests, for tests that add their own spans and
    read back only those (or count what they added): a start costs seconds, a test milliseconds."""
    server = new_serve(tmp_path_factory.mktemp("serve")).start()
    yield server
    server.stop()


@pytest.fixture
def serve_factory(tmp_path):
    """Build servers with custom options; every one started is stopped (or killed) afterwards."""
    started = []

    def make(**kwargs):
        server = new_serve(tmp_path, **kwargs)
        started.append(server)
        return server

    yield make
    for server in started:
        try:
            server.stop()
        except Exception:
            server.kill()
