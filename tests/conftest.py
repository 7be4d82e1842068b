import os

import pytest
from starlette.testclient import TestClient

from driftscope.serve import ServeConfig, build_service
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


@pytest.fixture
def in_process_factory(tmp_path):
    """The in-process tier: serve's composition (store, single writer, workers, OTLP/HTTP receiver
    and read API) in this process, driven through an ASGI client. No sockets and no subprocess:
    for request/response behaviour; what needs a process (crash safety, SIGTERM, overload, slow
    sockets, gRPC, the SDK exporters, the browser) uses ``serve``.

    ``make(**ServeConfig fields)`` returns a started TestClient; ``client.service`` is the
    ``driftscope.serve.Service``. Every one made is stopped (writer drained, store closed)."""
    made = []

    def make(**config):
        config.setdefault("db", str(tmp_path / f"in-process-{len(made)}.duckdb"))
        config.setdefault("embeddings", False)
        service = build_service(ServeConfig(**config))
        client = TestClient(service.app, base_url="http://127.0.0.1")
        client.service = service
        made.append(client)
        return client.__enter__()

    yield make
    for client in made:
        try:
            client.__exit__(None, None, None)
        finally:
            client.service.stop()


@pytest.fixture
def in_process(in_process_factory):
    """``in_process_factory()`` with the default settings."""
    return in_process_factory()
