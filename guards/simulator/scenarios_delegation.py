"""Scripted crews for handoffs: dropped constraints, goal drift and planner/worker ping-pong."""

from __future__ import annotations

from guards.delegation import ConstraintLedger, DelegationRejected
from guards.embedding import SentenceTransformerEmbedder, cosine_distance
from guards.execution import ExecutionGuard
from guards.side_effects import traced_call
from guards.simulator.runtime import SimRun
from guards.unguarded import FreeTextDelegation

OFFSITE = "T-offsite"
OFFSITE_GOAL = "Plan the Q3 customer advisory board offsite"
OFFSITE_CONSTRAINTS = [
    {"id": "C1", "text": "Total cost under $5,000"},
    {"id": "C2", "text": "Venue must be wheelchair accessible"},
    {"id": "C3", "text": "Dates between 12 and 16 May"},
]
CRITERIA = [
    {"text": "Every venue quote is under budget", "constraint_ids": ["C1"]},
    {"text": "Accessibility confirmed in writing by the venue", "constraint_ids": ["C2"]},
    {"text": "Venue available on the chosen dates", "constraint_ids": ["C3"]},
]


def _context(constraints: list[dict[str, str]]) -> str:
    return "Constraints: " + "; ".join(f"[{c['id']}] {c['text']}" for c in constraints)


def constraint_drop(run: SimRun) -> None:
    """A constraint falls out of the handoff from researcher to writer (hop 2).

    Unguarded: the free-text context simply stops mentioning C2 and the critic approves an
    inaccessible venue. Guarded: the ledger rejects the hop-2 delegation naming C2 (and, earlier,
    an acceptance criterion citing nothing); the researcher carries C2 and the writer waives C3 for
    the critic with a reason. Not injected: every hop carries every constraint (guarded: no
    delegation is rejected; the writer still waives C3 for the critic).
    """
    with run.crew("Events crew: plan the customer advisory board offsite"):
        if run.guarded:
            _constraint_drop_guarded(run)
        else:
            _constraint_drop_unguarded(run)


def _constraint_drop_unguarded(run: SimRun) -> None:
    origin = run.scoped(OFFSITE)
    handoff = FreeTextDelegation(run.telemetry)
    handoff.open_task(origin, OFFSITE_GOAL)
    kept = [c for c in OFFSITE_CONSTRAINTS if c["id"] != "C2" or not run.inject]
    with run.agent("planner", origin):
        t1 = handoff.delegate(
            "Research venues and costs for the Q3 customer advisory board offsite",
            _context(OFFSITE_CONSTRAINTS),
            to_agent="researcher",
            parent_task_id=origin,
        )
    with run.agent("researcher", t1):
        traced_call(
            run.telemetry, "search_venues", {"city": "Lisbon", "capacity": 40}, lambda: ["Palacio Azul"]
        )
        t2 = handoff.delegate(
            "Draft the venue proposal for the Q3 customer advisory board offsite",
            _context(kept),
            to_agent="writer",
            parent_task_id=t1,
        )
        drop_span = run.last_span
    with run.agent("writer", t2):
        t3 = handoff.delegate(
            "Review the Q3 customer advisory board offsite proposal",
            _context(kept),
            to_agent="critic",
            parent_task_id=t2,
        )
    with run.agent("critic", t3):
        traced_call(
            run.telemetry, "approve_proposal", {"task_id": t3, "venue": "Palacio Azul"}, lambda: "approved"
        )
    if not run.inject:
        return
    run.record(
        "constraint_drops",
        origin_task_id=origin,
        constraint_id="C2",
        constraint_text="Venue must be wheelchair accessible",
        hop=2,
        from_agent="researcher",
        to_agent="writer",
        task_id=t2,
        span_id=drop_span,
    )


def _constraint_drop_guarded(run: SimRun) -> None:
    origin = run.scoped(OFFSITE)
    ledger = ConstraintLedger(run.telemetry)
    with run.agent("planner", origin):
        ledger.open_task(origin, OFFSITE_GOAL, OFFSITE_CONSTRAINTS, to_agent="planner")
        if run.inject:
            try:
                ledger.delegate(
                    "Research venues and costs for the Q3 customer advisory board offsite",
                    origin,
                    OFFSITE_CONSTRAINTS,
                    [{"text": "Looks good to the planner", "constraint_ids": []}],
                    {},
                    to_agent="researcher",
                )
            except DelegationRejected as rejection:
                run.record(
                    "prevented",
                    reason=rejection.reason,
                    agent="planner",
                    hop=rejection.hop,
                    task_id=rejection.task_id,
                    span_id=run.last_span,
                )
        t1 = ledger.delegate(
            "Research venues and costs for the Q3 customer advisory board offsite",
            origin,
            OFFSITE_CONSTRAINTS,
            CRITERIA,
            {},
            to_agent="researcher",
        )["task_id"]
    with run.agent("researcher", t1):
        traced_call(
            run.telemetry, "search_venues", {"city": "Lisbon", "capacity": 40}, lambda: ["Casa Verde"]
        )
        if run.inject:
            kept = [c for c in OFFSITE_CONSTRAINTS if c["id"] != "C2"]
            try:
                ledger.delegate(
                    "Draft the venue proposal for the Q3 customer advisory board offsite",
                    origin,
                    kept,
                    CRITERIA[::2],
                    {},
                    to_agent="writer",
                    parent_task_id=t1,
                )
            except DelegationRejected as rejection:
                run.record(
                    "prevented",
                    reason=rejection.reason,
                    agent="researcher",
                    hop=rejection.hop,
                    task_id=rejection.task_id,
                    missing_constraints=rejection.missing_constraints,
                    message=str(rejection),
                    span_id=run.last_span,
                )
        t2 = ledger.delegate(
            "Draft the venue proposal for the Q3 customer advisory board offsite",
            origin,
            OFFSITE_CONSTRAINTS,
            CRITERIA,
            {},
            to_agent="writer",
            parent_task_id=t1,
        )["task_id"]
    with run.agent("writer", t2):
        reason = "the critic reviews copy only; dates were fixed with the venue at hop 2"
        t3 = ledger.delegate(
            "Review the Q3 customer advisory board offsite proposal",
            origin,
            OFFSITE_CONSTRAINTS[:2],
            CRITERIA[:2],
            {"C3": reason},
            to_agent="critic",
            parent_task_id=t2,
        )["task_id"]
        run.record(
            "waivers",
            constraint_id="C3",
            hop=3,
            agent="writer",
            to_agent="critic",
            reason=reason,
            task_id=t3,
            span_id=run.last_span,
        )
    with run.agent("critic", t3):
        traced_call(
            run.telemetry, "approve_proposal", {"task_id": t3, "venue": "Casa Verde"}, lambda: "approved"
        )


REVENUE = "T-q3rev"
ROOT_GOAL = "Analyze Q3 revenue trends"
# (delegator, receiver, subtask); hops 3 and 4 drift to foreign-exchange history.
DRIFT_CHAIN = [
    ("planner", "researcher", "Break down Q3 revenue trends by region and product line"),
    ("researcher", "analyst", "Estimate how currency exchange rates affected Q3 revenue in Europe"),
    (
        "analyst",
        "historian",
        "Explain how exchange rates between the euro and the dollar have moved over the past decade",
    ),
    ("historian", "writer", "Write a history of foreign exchange markets since the Bretton Woods agreement"),
]
DRIFTED_HOPS = {3, 4}
# The same hand-offs when the crew stays on the goal (the failure not injected).
ON_GOAL_CHAIN = [
    *DRIFT_CHAIN[:2],
    ("analyst", "historian", "Compare Q3 revenue with the same quarter of the previous three years"),
    ("historian", "writer", "Write the Q3 revenue trends report with the year-over-year comparison"),
]
RESCOPED = "Summarize the Q3 revenue impact of exchange rate movements"
AUDITED = [{"id": "C1", "text": "Use only audited Q3 figures"}]
AUDITED_CRITERIA = [{"text": "Every figure traces to the audited Q3 ledger", "constraint_ids": ["C1"]}]


def goal_drift(run: SimRun) -> None:
    """Handoffs drift from "Analyze Q3 revenue trends" towards foreign-exchange history.

    Unguarded: every drifting subtask is delegated. Guarded: the execution guard refuses the first
    subtask past the divergence threshold and the analyst re-scopes it to the root goal. Not
    injected: the same hand-offs stay on the goal (``ON_GOAL_CHAIN``).
    """
    chain = DRIFT_CHAIN if run.inject else ON_GOAL_CHAIN
    origin = run.scoped(REVENUE)
    embedder = run.embedder or SentenceTransformerEmbedder()
    root_vector = embedder([ROOT_GOAL])[0]

    def divergence(text: str) -> float:
        return round(cosine_distance(root_vector, embedder([text])[0]), 3)

    with run.crew("Finance crew: analyze Q3 revenue trends"):
        if not run.guarded:
            handoff = FreeTextDelegation(run.telemetry)
            handoff.open_task(origin, ROOT_GOAL)
            parent = origin
            for hop, (sender, receiver, subtask) in enumerate(chain, start=1):
                with run.agent(sender, parent):
                    parent = handoff.delegate(
                        subtask, f"Root goal: {ROOT_GOAL}", to_agent=receiver, parent_task_id=parent
                    )
                if hop in DRIFTED_HOPS and run.inject:
                    run.record(
                        "drifted_subtasks",
                        task_id=parent,
                        hop=hop,
                        agent=sender,
                        to_agent=receiver,
                        text=subtask,
                        divergence=divergence(subtask),
                        span_id=run.last_span,
                    )
            with run.agent("writer", parent):
                traced_call(run.telemetry, "write_report", {"task_id": parent}, lambda: "fx-history.md")
            return
        ledger = ConstraintLedger(run.telemetry)
        guard = ExecutionGuard(run.telemetry, root_goal=ROOT_GOAL, embedder=embedder)
        with run.agent("planner", origin):
            ledger.open_task(origin, ROOT_GOAL, AUDITED, to_agent="planner")
        parent = origin
        for hop, (sender, receiver, subtask) in enumerate(chain, start=1):
            with run.agent(sender, parent):
                decision = guard.check(
                    sender, "delegate", {"subtask": subtask, "to": receiver}, subtask_text=subtask
                )
                if not decision.allowed:
                    run.record(
                        "prevented",
                        reason=decision.reason,
                        agent=sender,
                        hop=hop,
                        text=subtask,
                        divergence=decision.divergence,
                        span_id=run.last_span,
                    )
                    subtask, receiver = RESCOPED, "writer"
                    guard.check(
                        sender, "delegate", {"subtask": subtask, "to": receiver}, subtask_text=subtask
                    )
                parent = ledger.delegate(
                    subtask, origin, AUDITED, AUDITED_CRITERIA, {}, to_agent=receiver, parent_task_id=parent
                )["task_id"]
            if receiver == "writer":
                break
        with run.agent("writer", parent):
            traced_call(run.telemetry, "write_report", {"task_id": parent}, lambda: "q3-revenue-trends.md")


CHURN = "T-churn"
CHURN_TASK = "Compile Q3 churn numbers by segment"
BOUNCE = "Need the churn definition before compiling; returning to planner"


def ping_pong(run: SimRun) -> None:
    """Planner and worker hand the same task back and forth (A->B->A->B...).

    Unguarded: three full round trips before the planner gives up. Guarded: the execution guard
    refuses the planner's second identical delegation and the planner escalates instead. Not
    injected: the worker compiles the numbers and the planner reports the task done.
    """
    with run.crew("Analytics crew: churn numbers"):
        if not run.inject:
            _churn_compiled(run)
        elif run.guarded:
            _ping_pong_guarded(run)
        else:
            _ping_pong_unguarded(run)


def _churn_compiled(run: SimRun) -> None:
    """The ping-pong crew when the worker does the task it is handed."""
    origin = run.scoped(CHURN)
    if run.guarded:
        ledger = ConstraintLedger(run.telemetry)
        guard = ExecutionGuard(run.telemetry, max_identical_calls=1)
        constraints = [{"id": "C1", "text": "Churn as defined in the Q3 metrics glossary"}]
        criteria = [{"text": "Numbers reconcile with the glossary definition", "constraint_ids": ["C1"]}]
        with run.agent("planner", origin):
            ledger.open_task(origin, CHURN_TASK, constraints, to_agent="planner")
        with run.agent("planner", origin):
            guard.check("planner", "delegate", {"subtask": CHURN_TASK, "to": "worker"})
            task = ledger.delegate(
                CHURN_TASK, origin, constraints, criteria, {}, to_agent="worker", parent_task_id=origin
            )["task_id"]
    else:
        handoff = FreeTextDelegation(run.telemetry)
        handoff.open_task(origin, CHURN_TASK)
        with run.agent("planner", origin):
            task = handoff.delegate(
                CHURN_TASK, "Use the usual definition", to_agent="worker", parent_task_id=origin
            )
    with run.agent("worker", task):
        traced_call(run.telemetry, "compile_churn", {"quarter": "Q3", "by": "segment"}, lambda: "churn.csv")
    with run.agent("planner", origin):
        traced_call(run.telemetry, "report_status", {"task_id": origin, "status": "done"}, lambda: "noted")


def _ping_pong_unguarded(run: SimRun) -> None:
    origin = run.scoped(CHURN)
    handoff = FreeTextDelegation(run.telemetry)
    handoff.open_task(origin, CHURN_TASK)
    parent, spans = origin, []
    for _ in range(3):
        with run.agent("planner", parent):
            parent = handoff.delegate(
                CHURN_TASK, "Use the usual definition", to_agent="worker", parent_task_id=parent
            )
            spans.append(run.last_span)
        with run.agent("worker", parent):
            parent = handoff.delegate(CHURN_TASK, BOUNCE, to_agent="planner", parent_task_id=parent)
            spans.append(run.last_span)
    with run.agent("planner", parent):
        traced_call(run.telemetry, "report_status", {"task_id": origin, "status": "stalled"}, lambda: "noted")
    run.record(
        "ping_pong", agents=["planner", "worker"], origin_task_id=origin, handoffs=len(spans), span_ids=spans
    )


def _ping_pong_guarded(run: SimRun) -> None:
    origin = run.scoped(CHURN)
    ledger = ConstraintLedger(run.telemetry)
    guard = ExecutionGuard(run.telemetry, max_identical_calls=1)
    constraints = [{"id": "C1", "text": "Churn as defined in the Q3 metrics glossary"}]
    criteria = [{"text": "Numbers reconcile with the glossary definition", "constraint_ids": ["C1"]}]
    with run.agent("planner", origin):
        ledger.open_task(origin, CHURN_TASK, constraints, to_agent="planner")
    parent = origin
    for sender, receiver in [("planner", "worker"), ("worker", "planner"), ("planner", "worker")]:
        with run.agent(sender, parent):
            decision = guard.check(sender, "delegate", {"subtask": CHURN_TASK, "to": receiver})
            if not decision.allowed:
                run.record(
                    "prevented",
                    reason=decision.reason,
                    agent=sender,
                    to_agent=receiver,
                    span_id=run.last_span,
                )
                traced_call(
                    run.telemetry,
                    "escalate",
                    {"task_id": origin, "reason": decision.message},
                    lambda: "ticket-88",
                )
                break
            parent = ledger.delegate(
                CHURN_TASK, origin, constraints, criteria, {}, to_agent=receiver, parent_task_id=parent
            )["task_id"]
