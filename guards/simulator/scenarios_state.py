"""Scripted crews for shared state and repeated side effects."""

from __future__ import annotations

from typing import Any

from guards.side_effects import IdempotentTool, traced_call
from guards.simulator.runtime import SimRun
from guards.state import VersionedStore
from guards.telemetry import content_hash
from guards.unguarded import ForceStore, PlainStore

DRAFT_KEY = "report/q3/draft"
STATUS_KEY = "report/q3/status"


def split_brain(run: SimRun) -> None:
    """Two agents read the same version of a key and both write back.

    Unguarded: the second write silently clobbers the first (a plain set on the draft, the
    ``force=True`` escape hatch on the status). Guarded: the stale write is rejected with the
    current value and version, and the agent merges and retries. Not injected: the writer starts
    after the researcher has written, so every read is of the current version.
    """
    with run.crew("Q3 report crew: researcher and writer edit the shared draft"):
        if not run.inject:
            _split_brain_sequential(run)
        elif run.guarded:
            _split_brain_guarded(run)
        else:
            _split_brain_unguarded(run)


def _split_brain_sequential(run: SimRun) -> None:
    """The same crew and tools, one agent after another: no stale read, no clobbered write."""
    if run.guarded:
        store = VersionedStore(run.telemetry, salt=run.salt())
        with run.agent("planner"):
            store.write_state(DRAFT_KEY, {"sections": ["outline"]}, None)
            store.write_state(STATUS_KEY, "drafting", None)
        for agent, section, status in (
            ("researcher", "findings", None),
            ("writer", "intro", "ready_for_review"),
        ):
            with run.agent(agent):
                draft = store.read_state(DRAFT_KEY)
                current = store.read_state(STATUS_KEY)
                store.write_state(
                    DRAFT_KEY, {"sections": [*draft["value"]["sections"], section]}, draft["version"]
                )
                if status is not None:
                    store.write_state(STATUS_KEY, status, current["version"])
        with run.agent("critic"):
            store.read_state(DRAFT_KEY)
            store.read_state(STATUS_KEY)
        return
    plain = PlainStore(run.telemetry)
    forced = ForceStore(run.telemetry, salt=run.salt())
    with run.agent("planner"):
        plain.set(DRAFT_KEY, {"sections": ["outline"]})
        forced.write(STATUS_KEY, "drafting", None)
    for agent, section, status in (("researcher", "findings", None), ("writer", "intro", "ready_for_review")):
        with run.agent(agent):
            draft = plain.get(DRAFT_KEY)
            _, seen = forced.read(STATUS_KEY)
            plain.set(DRAFT_KEY, {"sections": [*draft["sections"], section]})
            if status is not None:
                forced.write(STATUS_KEY, status, seen)
    with run.agent("critic"):
        plain.get(DRAFT_KEY)
        forced.read(STATUS_KEY)


def _split_brain_unguarded(run: SimRun) -> None:
    plain = PlainStore(run.telemetry)
    forced = ForceStore(run.telemetry, salt=run.salt())
    with run.agent("planner"):
        plain.set(DRAFT_KEY, {"sections": ["outline"]})
        status_version = forced.write(STATUS_KEY, "drafting", None)
    with run.agent("researcher"):
        draft = plain.get(DRAFT_KEY)
        read_researcher = run.last_span
        _, status_seen = forced.read(STATUS_KEY)
        status_read_researcher = run.last_span
    with run.agent("writer"):
        plain.get(DRAFT_KEY)
        read_writer = run.last_span
        forced.read(STATUS_KEY)
        status_read_writer = run.last_span
    with run.agent("researcher"):
        plain.set(DRAFT_KEY, {"sections": [*draft["sections"], "findings"]})
        researcher_write = run.last_span
    with run.agent("writer"):
        plain.set(DRAFT_KEY, {"sections": [*draft["sections"], "intro"]})
        writer_write = run.last_span
        writer_status = forced.write(STATUS_KEY, "ready_for_review", status_seen)
        writer_status_write = run.last_span
    with run.agent("researcher"):
        researcher_status = forced.write(STATUS_KEY, "needs_data", status_seen, force=True)
        researcher_status_write = run.last_span
    with run.agent("critic"):
        plain.get(DRAFT_KEY)
        forced.read(STATUS_KEY)

    base = content_hash({"sections": ["outline"]})
    run.record(
        "divergent_reads",
        key=DRAFT_KEY,
        version=base,
        agents=["researcher", "writer"],
        read_span_ids=[read_researcher, read_writer],
        write_span_ids=[researcher_write, writer_write],
    )
    run.record(
        "divergent_reads",
        key=STATUS_KEY,
        version=status_version,
        agents=["researcher", "writer"],
        read_span_ids=[status_read_researcher, status_read_writer],
        write_span_ids=[writer_status_write, researcher_status_write],
    )
    run.record(
        "lost_updates",
        key=DRAFT_KEY,
        clobbered_writer="researcher",
        clobbered_version=content_hash({"sections": ["outline", "findings"]}),
        clobbered_span_id=researcher_write,
        clobbered_by="writer",
        clobbering_version=content_hash({"sections": ["outline", "intro"]}),
        clobbering_span_id=writer_write,
        based_on_version=base,
        via="unversioned set",
    )
    run.record(
        "lost_updates",
        key=STATUS_KEY,
        clobbered_writer="writer",
        clobbered_version=writer_status,
        clobbered_span_id=writer_status_write,
        clobbered_by="researcher",
        clobbering_version=researcher_status,
        clobbering_span_id=researcher_status_write,
        based_on_version=status_version,
        via="force=True",
    )


def _split_brain_guarded(run: SimRun) -> None:
    store = VersionedStore(run.telemetry, salt=run.salt())
    with run.agent("planner"):
        base = store.write_state(DRAFT_KEY, {"sections": ["outline"]}, None)["version"]
        status_base = store.write_state(STATUS_KEY, "drafting", None)["version"]
    with run.agent("researcher"):
        draft = store.read_state(DRAFT_KEY)
        read_researcher = run.last_span
        status_researcher = store.read_state(STATUS_KEY)
        status_read_researcher = run.last_span
    with run.agent("writer"):
        draft_writer = store.read_state(DRAFT_KEY)
        read_writer = run.last_span
        status_writer = store.read_state(STATUS_KEY)
        status_read_writer = run.last_span
    with run.agent("researcher"):
        store.write_state(
            DRAFT_KEY, {"sections": [*draft["value"]["sections"], "findings"]}, draft["version"]
        )
        researcher_write = run.last_span
    with run.agent("writer"):
        attempt = store.write_state(
            DRAFT_KEY, {"sections": [*draft_writer["value"]["sections"], "intro"]}, draft_writer["version"]
        )
        rejected_span = run.last_span
        run.record(
            "prevented",
            reason="version_conflict",
            agent="writer",
            key=DRAFT_KEY,
            span_id=rejected_span,
            would_have_clobbered="researcher",
        )
        merged = {"sections": [*attempt["current_value"]["sections"], "intro"]}
        store.write_state(DRAFT_KEY, merged, attempt["current_version"])
        writer_retry = run.last_span
        store.write_state(STATUS_KEY, "ready_for_review", status_writer["version"])
        writer_status_write = run.last_span
    with run.agent("researcher"):
        attempt = store.write_state(STATUS_KEY, "needs_data", status_researcher["version"])
        run.record(
            "prevented",
            reason="version_conflict",
            agent="researcher",
            key=STATUS_KEY,
            span_id=run.last_span,
            would_have_clobbered="writer",
        )
        researcher_status_attempt = run.last_span
        # The researcher redoes its work on the current status instead of forcing it.
        store.read_state(STATUS_KEY)
    with run.agent("critic"):
        store.read_state(DRAFT_KEY)
        store.read_state(STATUS_KEY)
    run.record(
        "divergent_reads",
        key=DRAFT_KEY,
        version=base,
        agents=["researcher", "writer"],
        read_span_ids=[read_researcher, read_writer],
        write_span_ids=[researcher_write, rejected_span],
        resolved_by_span_id=writer_retry,
    )
    run.record(
        "divergent_reads",
        key=STATUS_KEY,
        version=status_base,
        agents=["researcher", "writer"],
        read_span_ids=[status_read_researcher, status_read_writer],
        write_span_ids=[writer_status_write, researcher_status_attempt],
        resolved_by_span_id=None,
    )


INVOICE = {"order_id": "7731", "amount": "412.50", "currency": "USD", "email": "buyer@example.com"}


def duplicate_side_effect(run: SimRun) -> None:
    """A billing run sends an invoice, crashes, and is resumed from an old checkpoint.

    Unguarded: the resumed run sends the invoice again. Guarded: the idempotency key refuses the
    duplicate and returns the first call's result. Not injected: the ledger answers, no resume.
    """
    seen: dict[str, Any] = {}
    send = IdempotentTool(
        "send_invoice", lambda payload: {"invoice_id": "INV-7731"}, run.telemetry, seen=seen
    )
    sends: list[str] = []

    def send_invoice() -> None:
        if run.guarded:
            send(INVOICE, idempotency_key="invoice:order-7731")
        else:
            traced_call(
                run.telemetry, "send_invoice", INVOICE, lambda: {"invoice_id": "INV-7731"}, side_effect=True
            )
        sends.append(run.last_span)

    def crash() -> None:
        raise ConnectionError("ledger service unavailable")

    with run.crew("Billing crew: invoice order 7731"):
        with run.agent("billing"):
            traced_call(run.telemetry, "load_order", {"order_id": "7731"}, lambda: INVOICE)
            send_invoice()
            if not run.inject:
                traced_call(
                    run.telemetry, "update_ledger", {"order_id": "7731", "status": "invoiced"}, lambda: "ok"
                )
                return
            try:
                traced_call(run.telemetry, "update_ledger", {"order_id": "7731", "status": "invoiced"}, crash)
            except ConnectionError:
                pass
    with run.crew("Billing crew: resumed from the checkpoint before the invoice", resumed=True):
        with run.agent("billing"):
            traced_call(run.telemetry, "load_order", {"order_id": "7731"}, lambda: INVOICE)
            send_invoice()
            traced_call(
                run.telemetry, "update_ledger", {"order_id": "7731", "status": "invoiced"}, lambda: "ok"
            )
    if run.guarded:
        run.record(
            "prevented",
            reason="duplicate_side_effect",
            agent="billing",
            tool="send_invoice",
            idempotency_key="invoice:order-7731",
            span_id=sends[1],
            original_span_id=sends[0],
        )
    else:
        run.record(
            "duplicate_side_effects",
            agent="billing",
            tool="send_invoice",
            arguments=INVOICE,
            idempotency_key=None,
            span_ids=sends,
        )
