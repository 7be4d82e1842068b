"""One writer per ClickHouse database (collector.clickhouse_lease): a second writer is refused
with who holds it, a lapsed or released lease is taken, two claims at once leave one holder, and
a holder that lost the lease to another says so and stops renewing. On chdb in process (each
lease here plays one process) and on a server when DRIFTSCOPE_CLICKHOUSE_URL names one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")

from collector.clickhouse_lease import WriterLease, WriterLeaseTaken  # noqa: E402
from collector.clickhouse_store import ChdbStore, open_store_url  # noqa: E402
from tests.clickhouse_stores import SERVER_URL, store_params  # noqa: E402


@pytest.fixture(scope="module", params=store_params("the database driftscope_test_lease"))
def store(request, tmp_path_factory):
    if request.param == "chdb":
        store = ChdbStore(str(tmp_path_factory.mktemp("lease")))
    else:
        store = open_store_url(SERVER_URL.rsplit("/", 1)[0] + "/driftscope_test_lease")
    store.command(f"DROP DATABASE IF EXISTS `{store.database}`")
    store.command(f"CREATE DATABASE `{store.database}`")
    yield store
    store.close()


@pytest.fixture
def fresh(store):
    """The store with no claim in force (each test starts from a released lease)."""
    store.command(f"DROP TABLE IF EXISTS `{store.database}`.driftscope_writer")
    return store


def _lease(store, role: str, **timing) -> WriterLease:
    return WriterLease(store, role, **{"settle_s": 0.05, "renew_s": 0.1, **timing})


def test_a_second_writer_is_refused_naming_the_first_until_it_releases(fresh):
    first, second = _lease(fresh, "serve --store"), _lease(fresh, "clickhouse resolve --follow")
    first.acquire()
    with pytest.raises(WriterLeaseTaken) as refused:
        second.acquire()
    message = str(refused.value)
    assert (
        f"ClickHouse database {fresh.database} is written by another driftscope (serve --store on " in message
    )
    assert f"pid {os.getpid()}" in message and "clickhouse resolve --follow" in message
    first.release()
    assert first.current() is None
    second.acquire()  # released: no wait for it to lapse
    assert second.current().role == "clickhouse resolve --follow"
    second.release()


def test_a_lease_not_renewed_lapses_and_the_old_holder_finds_it_lost(fresh):
    stale = _lease(fresh, "serve --store")
    stale.acquire()
    newcomer = _lease(fresh, "serve --store", lease_s=0.3)
    time.sleep(0.4)  # the holder stopped renewing (killed, or stopped past the lease)
    newcomer.acquire()
    assert not stale.renew()  # it must not write on
    assert stale.lost is not None and stale.lost.holder == newcomer.holder
    assert newcomer.renew() and newcomer.current().holder == newcomer.holder
    newcomer.release()


def test_a_renewing_holder_keeps_the_lease_and_calls_on_lost_once_taken_over(fresh):
    holder = _lease(fresh, "serve --store")
    holder.acquire()
    lost = []
    holder.start_renewing(lost.append)
    time.sleep(0.35)  # renewed meanwhile: a newcomer with the default lease is refused
    with pytest.raises(WriterLeaseTaken):
        _lease(fresh, "serve --store").acquire()
    assert holder.current().age_s < 0.3
    taker = _lease(fresh, "serve --store")
    taker.acquire(take_over=True)  # a chdb path's restart: the claim there is a stopped process's
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [claim.holder for claim in lost] == [taker.holder]
    time.sleep(0.3)
    assert len(lost) == 1  # it stopped renewing: the taker's claim stays the newest
    assert taker.current().holder == taker.holder
    holder.release()  # not its to give up any more: the taker keeps it
    assert taker.current().holder == taker.holder
    taker.release()


def test_two_claims_at_the_same_moment_leave_exactly_one_holder(fresh):
    leases = [_lease(fresh, f"writer {n}", settle_s=0.3) for n in range(2)]
    outcome: dict[int, str] = {}
    start = threading.Barrier(2)

    def claim(n: int) -> None:
        start.wait()
        try:
            leases[n].acquire()
            outcome[n] = "held"
        except WriterLeaseTaken:
            outcome[n] = "refused"

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcome.values()) == ["held", "refused"]
    winner = next(n for n, result in outcome.items() if result == "held")
    assert leases[0].current().holder == leases[winner].holder
    leases[winner].release()


REPO = Path(__file__).resolve().parents[2]

# A writer that claims the lease of a chdb path and dies without releasing it (kill -9).
_DIES_HOLDING = """
import os, sys
from collector.clickhouse_lease import WriterLease
from collector.clickhouse_store import ChdbStore

store = ChdbStore(sys.argv[1])
store.migrate()
WriterLease(store, "serve --store").acquire(take_over=True)
os._exit(0)
"""


def _driftscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "driftscope", *args], cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_a_chdb_path_is_taken_over_from_a_writer_that_died_holding_it(tmp_path):
    """No other process can have a chdb path open, so a claim left there is a dead writer's: the
    next one does not wait for it to lapse."""
    path = tmp_path / "ch"
    died = subprocess.run(
        [sys.executable, "-c", _DIES_HOLDING, str(path)], cwd=REPO, capture_output=True, text=True,
        timeout=180, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert died.returncode == 0, died.stderr
    done = _driftscope("clickhouse", "resolve", "--store", f"chdb:{path}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("resolved: ")


@pytest.mark.skipif(
    not SERVER_URL,
    reason="needs a ClickHouse server (DRIFTSCOPE_CLICKHOUSE_URL; database driftscope_test_lease_cli dropped): "
    "a chdb path cannot be open in two processes",
)
def test_clickhouse_resolve_is_refused_while_another_process_writes_the_server_database():
    """The CLI side of the refusal (serve --store takes the same path): exit 2, the holder named."""
    url = SERVER_URL.rsplit("/", 1)[0] + "/driftscope_test_lease_cli"
    store = open_store_url(url)
    store.command(f"DROP DATABASE IF EXISTS `{store.database}`")
    store.migrate()
    holder = _lease(store, "serve --store")
    holder.acquire()
    holder.start_renewing(lambda claim: None)
    try:
        for args in (
            ("clickhouse", "resolve", "--store", url),
            ("clickhouse", "resolve", "--follow", "--store", url),
        ):
            done = _driftscope(*args)
            assert done.returncode == 2, done.stderr
            assert "is written by another driftscope (serve --store on " in done.stderr
    finally:
        holder.release()
    done = _driftscope("clickhouse", "resolve", "--store", url)
    assert done.returncode == 0, done.stderr
    store.close()
