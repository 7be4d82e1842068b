"""One writer per ClickHouse database: the lease a resolving, materializing process holds.

A ClickHouse database driftscope writes (its resolve passes rewriting `spans`, the change log it
numbers in process, the findings tables and their prunes) must have one such writer: two of them
(a second ``serve --store`` behind a load balancer, ``clickhouse resolve --follow`` beside a
serve) number changes on their own, and one's prune can delete rows the other just wrote. A chdb
path is one process's anyway (the embedded server locks it); a server is shared by whoever
reaches it, so the writer takes this lease first.

ClickHouse has no transactions, so the lease is a row per claim in ``driftscope_writer``
(ReplacingMergeTree: the newest claim by version is the holder), with every time and version
taken from the server's clock. A claim is refused while another holder's newest row is younger
than ``LEASE_S``; a granted claim is read back after ``SETTLE_S`` (two claims at the same moment:
the newer one holds). The holder renews it every ``RENEW_S`` in a thread of its own, first
checking that it still holds it: a holder that finds another claim newer than its own (it was
stopped for longer than the lease, and another writer took over) has lost it and must stop
writing (``on_lost``). At most one renewal interval passes before a loser sees it. A process
killed without releasing it holds it ``LEASE_S`` more.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from collector import clickhouse_schema as schema

logger = logging.getLogger(__name__)

LEASE_S = 30.0  # a holder not heard from for this long has stopped
RENEW_S = 5.0
SETTLE_S = 1.0  # a claim read back after this, so a claim made at the same moment is seen


class WriterLeaseTaken(RuntimeError):
    """Another process writes this database; the message says which and what to do."""


@dataclass(frozen=True)
class Claim:
    """The newest claim of the lease: who, and how many seconds ago by the server's clock."""

    holder: str
    role: str
    host: str
    pid: int
    age_s: float

    def describe(self) -> str:
        return f"{self.role} on {self.host}, pid {self.pid}, last renewed {self.age_s:.0f} s ago"


class WriterLease:
    """The writer lease of ``store``'s database for this process, in the role ``role`` (what
    the refusal tells the other process: "serve --store", "clickhouse resolve --follow").
    ``acquire`` claims it or raises ``WriterLeaseTaken``; ``start_renewing`` renews it in a
    thread until ``release``. ``store`` is used by that thread alone once it runs (a server
    session is one statement at a time): give it a store of its own."""

    def __init__(self, store, role: str, lease_s: float = LEASE_S, renew_s: float = RENEW_S,
                 settle_s: float = SETTLE_S) -> None:  # fmt: skip
        self.store, self.role = store, role
        self.lease_s, self.renew_s, self.settle_s = lease_s, renew_s, settle_s
        self.holder = uuid.uuid4().hex
        self.lost: Claim | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._table = schema.qualified(store.database, schema.WRITER_LEASE)

    def current(self) -> Claim | None:
        """The newest claim (None: never claimed, or released)."""
        rows = self.store.execute(
            "SELECT argMax(holder, ver) AS holder, argMax(role, ver) AS role, argMax(host, ver) AS host, "
            "argMax(pid, ver) AS pid, dateDiff('millisecond', argMax(claimed_at, ver), now64(3, 'UTC')) AS age_ms, "
            f"count() AS n FROM {self._table}"
        ).to_pylist()[0]
        if not rows["n"] or not rows["holder"]:
            return None
        return Claim(rows["holder"], rows["role"], rows["host"], int(rows["pid"]), rows["age_ms"] / 1000)

    def _claim(self, holder: str) -> None:
        self.store.command(
            f"INSERT INTO {self._table} SELECT {{holder:String}}, {{role:String}}, {{host:String}}, "
            "{pid:UInt32}, now64(3, 'UTC'), toUInt64(toUnixTimestamp64Nano(now64(9, 'UTC')))",
            {"holder": holder, "role": self.role, "host": socket.gethostname(), "pid": os.getpid()},
        )

    def _refusal(self, claim: Claim) -> WriterLeaseTaken:
        return WriterLeaseTaken(
            f"ClickHouse database {self.store.database} is written by another driftscope ({claim.describe()}): "
            "one process per database resolves spans and keeps the findings tables (two number their "
            "changes on their own and prune each other's rows). Stop that one first, or send spans to it "
            "(more ingest: point more OpenTelemetry Collector exporters at ClickHouse and keep one "
            f"`driftscope clickhouse resolve --follow`). A writer killed without stopping holds the "
            f"database {self.lease_s:.0f} s after its last renewal."
        )

    def acquire(self, take_over: bool = False) -> None:
        """Claim the lease, or raise ``WriterLeaseTaken`` while another holder renews it.
        ``take_over``: claim it whoever holds it (a chdb path, which no other process can have
        open: a claim left there is a stopped process's)."""
        self.store.command(schema.writer_lease_ddl(self.store.database))  # a store from before it
        held = self.current()
        if held is not None and held.holder != self.holder and held.age_s < self.lease_s and not take_over:
            raise self._refusal(held)
        self._claim(self.holder)
        if take_over:
            return
        self._stop.wait(self.settle_s)
        held = self.current()
        if held is None or held.holder != self.holder:
            raise (
                self._refusal(held)
                if held is not None
                else WriterLeaseTaken("the writer lease was released meanwhile")
            )

    def renew(self) -> bool:
        """Renew the claim if this process still holds it; False (and ``lost`` says to whom) when
        another claim is newer."""
        held = self.current()
        if held is not None and held.holder != self.holder:
            self.lost = held
            return False
        self._claim(self.holder)
        return True

    def start_renewing(self, on_lost: Callable[[Claim], None]) -> None:
        """Renew every ``renew_s`` until ``release``; on losing the lease call ``on_lost`` once
        (the process must stop writing) and stop renewing. A renewal that fails (the server
        unreachable) is tried again; the lease lapses if it keeps failing."""

        def run() -> None:
            while not self._stop.wait(self.renew_s):
                try:
                    if not self.renew():
                        logger.error(
                            "lost the writer lease of %s to %s: stopping writes",
                            self.store.database,
                            self.lost.describe(),
                        )
                        on_lost(self.lost)
                        return
                except Exception as exc:  # noqa: BLE001 - the next renewal tries again
                    logger.warning(
                        "writer lease renewal failed (tried again in %.0f s): %s", self.renew_s, exc
                    )

        self._thread = threading.Thread(target=run, name="driftscope-writer-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and give the lease up (if still held), so the next writer need not
        wait for it to lapse."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        try:
            held = self.current()
            if held is not None and held.holder == self.holder:
                self._claim("")
        except Exception as exc:  # noqa: BLE001 - it lapses by itself
            logger.warning("could not release the writer lease of %s (it lapses in %.0f s): %s",
                           self.store.database, self.lease_s, exc)  # fmt: skip
