"""Scripted crew for stale context: a policy superseded while agents hold the old version."""

from __future__ import annotations

from guards.objectives import ObjectiveRegistry, PolicyGate
from guards.side_effects import traced_call
from guards.simulator.runtime import SimRun
from guards.telemetry import content_hash
from guards.unguarded import PlainStore, UnguardedOutbox

POLICY_V1 = "Refunds are accepted within 30 days of purchase, for any amount."
POLICY_V2 = "Refunds are accepted within 14 days of purchase; refunds over $200 need a manager's approval."
TICKET = "T-4411"


def context_drift(run: SimRun) -> None:
    """A responder drafts a refund reply, the policy changes, and the reply goes out anyway.

    Unguarded: the send carries the superseded policy version and goes through. Guarded: the
    policy gate refuses it with the current policy; the holders were marked stale and the
    responder re-reads and redrafts. Not injected: the policy does not change during the run.
    """
    with run.crew("Support crew: refund request on ticket T-4411"):
        if not run.inject:
            _context_current(run)
        elif run.guarded:
            _context_drift_guarded(run)
        else:
            _context_drift_unguarded(run)


def _reply(policy: str) -> str:
    return f"Hello, about order 7731: per our policy ({policy}) we have approved your refund of $340."


def _context_current(run: SimRun) -> None:
    """The same crew and tools, the refund policy unchanged while the reply and article go out."""
    if run.guarded:
        registry = ObjectiveRegistry(run.telemetry, salt=run.salt())
        gate = PolicyGate(registry, "policy/refunds")
        with run.agent("manager"):
            gate.publish_policy(POLICY_V1)
            registry.set_objective(TICKET, "Resolve the refund request for order 7731")
        with run.agent("responder"):
            registry.get_objective(TICKET, "responder")
            policy = gate.read_policy("responder")
        with run.agent("kb_writer"):
            kb_policy = gate.read_policy("kb_writer")
        with run.agent("responder"):
            gate.send_customer_message(TICKET, _reply(policy["objective"]), policy["version"])
        with run.agent("kb_writer"):
            registry.get_objective("policy/refunds", "kb_writer", version=kb_policy["version"])
            traced_call(
                run.telemetry,
                "publish_kb_article",
                {"title": "Refunds", "body": kb_policy["objective"]},
                lambda: "kb-12",
            )
        return
    plain = PlainStore(run.telemetry)
    outbox = UnguardedOutbox(run.telemetry)
    with run.agent("manager"):
        plain.set("policy/refunds", POLICY_V1)
        plain.set(f"objective/{TICKET}", "Resolve the refund request for order 7731")
    with run.agent("responder"):
        plain.get(f"objective/{TICKET}")
        policy = plain.get("policy/refunds")
    with run.agent("kb_writer"):
        plain.get("policy/refunds")
    with run.agent("responder"):
        outbox.send_customer_message(TICKET, _reply(policy), policy_version=content_hash(policy))
    with run.agent("kb_writer"):
        traced_call(
            run.telemetry, "publish_kb_article", {"title": "Refunds", "body": policy}, lambda: "kb-12"
        )


def _context_drift_unguarded(run: SimRun) -> None:
    plain = PlainStore(run.telemetry)
    outbox = UnguardedOutbox(run.telemetry)
    with run.agent("manager"):
        plain.set("policy/refunds", POLICY_V1)
        plain.set(f"objective/{TICKET}", "Resolve the refund request for order 7731")
    holders: dict[str, str] = {}
    with run.agent("responder"):
        plain.get(f"objective/{TICKET}")
        policy = plain.get("policy/refunds")
        holders["responder"] = run.last_span
    with run.agent("kb_writer"):
        plain.get("policy/refunds")
        holders["kb_writer"] = run.last_span
    with run.agent("manager"):
        plain.set("policy/refunds", POLICY_V2)
        supersede_span = run.last_span
    with run.agent("responder"):
        outbox.send_customer_message(TICKET, _reply(policy), policy_version=content_hash(policy))
        send_span = run.last_span
    with run.agent("kb_writer"):
        traced_call(
            run.telemetry, "publish_kb_article", {"title": "Refunds", "body": POLICY_V1}, lambda: "kb-12"
        )
    for agent, span_id in holders.items():
        run.record(
            "stale_holders",
            agent=agent,
            objective_id="policy/refunds",
            held_version=content_hash(POLICY_V1),
            read_span_id=span_id,
            current_version=content_hash(POLICY_V2),
            supersede_span_id=supersede_span,
            refreshed=False,
        )
    run.record(
        "stale_policy_sends",
        agent="responder",
        ticket_id=TICKET,
        span_id=send_span,
        policy_version=content_hash(POLICY_V1),
        current_version=content_hash(POLICY_V2),
    )


def _context_drift_guarded(run: SimRun) -> None:
    registry = ObjectiveRegistry(run.telemetry, salt=run.salt())
    gate = PolicyGate(registry, "policy/refunds")
    with run.agent("manager"):
        gate.publish_policy(POLICY_V1)
        registry.set_objective(TICKET, "Resolve the refund request for order 7731")
    holders: dict[str, str] = {}
    with run.agent("responder"):
        registry.get_objective(TICKET, "responder")
        policy = gate.read_policy("responder")
        holders["responder"] = run.last_span
    with run.agent("kb_writer"):
        kb_policy = gate.read_policy("kb_writer")
        holders["kb_writer"] = run.last_span
    with run.agent("manager"):
        superseded = gate.publish_policy(POLICY_V2, reason="finance update: shorter refund window")
        supersede_span = run.last_span
    refreshed: dict[str, str] = {}
    with run.agent("responder"):
        refusal = gate.send_customer_message(TICKET, _reply(policy["objective"]), policy["version"])
        run.record(
            "prevented",
            reason="superseded_policy",
            agent="responder",
            ticket_id=TICKET,
            span_id=run.last_span,
            policy_version=policy["version"],
            current_version=refusal["current_policy"]["version"],
        )
        fresh = gate.read_policy("responder")
        refreshed["responder"] = run.last_span
        gate.send_customer_message(TICKET, _reply(fresh["objective"]), fresh["version"])
    with run.agent("kb_writer"):
        check = registry.get_objective("policy/refunds", "kb_writer", version=kb_policy["version"])
        if check["refresh_required"]:
            fresh = gate.read_policy("kb_writer")
            refreshed["kb_writer"] = run.last_span
        traced_call(
            run.telemetry,
            "publish_kb_article",
            {"title": "Refunds", "body": fresh["objective"]},
            lambda: "kb-12",
        )
    for agent, span_id in holders.items():
        run.record(
            "stale_holders",
            agent=agent,
            objective_id="policy/refunds",
            held_version=policy["version"],
            read_span_id=span_id,
            current_version=superseded["version"],
            supersede_span_id=supersede_span,
            refreshed=True,
            refresh_span_id=refreshed[agent],
        )
