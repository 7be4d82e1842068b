"""Scripted crews for runaway execution (loops, budgets) and the healthy baseline."""

from __future__ import annotations

from typing import Any

from guards.delegation import ConstraintLedger
from guards.embedding import SentenceTransformerEmbedder
from guards.execution import ExecutionGuard, call_signature
from guards.objectives import ObjectiveRegistry, PolicyGate
from guards.side_effects import IdempotentTool, traced_call
from guards.simulator.runtime import SimRun
from guards.state import VersionedStore
from guards.unguarded import FreeTextDelegation, PlainStore, Scratchpad, UnguardedOutbox

# The same failing call, varied only by surrounding whitespace, case and key order.
LOOP_VARIANTS: list[dict[str, Any]] = [
    {"database": "warehouse", "query": "SELECT revenue FROM q3_sales WHERE region = 'EU'"},
    {"query": "  select revenue from q3_sales where region = 'eu'  ", "database": "warehouse"},
    {"database": "Warehouse ", "query": "SELECT revenue FROM Q3_SALES WHERE REGION = 'EU'"},
    {"query": "\tSELECT revenue FROM q3_sales WHERE region = 'EU'\n", "database": " WAREHOUSE"},
    {"database": "warehouse", "query": "select revenue from q3_sales where region = 'EU' "},
]
UNGUARDED_LOOP_LIMIT = 5
LOOP_TOOL = "run_sql"


def _failing_query() -> Any:
    raise LookupError("relation q3_sales does not exist")


def recursion_loop(run: SimRun) -> None:
    """An analyst retries the same failing SQL call, re-typed each time.

    Unguarded: five identical (after normalisation) failing calls. Guarded: the execution guard
    allows two and refuses the third as ``repeated_call``; the analyst degrades gracefully. Not
    injected: the table exists and the first call answers.
    """
    guard = ExecutionGuard(run.telemetry, max_identical_calls=2) if run.guarded else None
    if not run.inject:
        with run.crew("Finance crew: EU revenue query"), run.agent("analyst", run.scoped("T-sql")):
            if guard is not None:
                guard.check("analyst", LOOP_TOOL, LOOP_VARIANTS[0])
            traced_call(run.telemetry, LOOP_TOOL, LOOP_VARIANTS[0], lambda: [{"revenue": 1_250_000}])
        return
    tool_spans: list[str] = []
    check_spans: list[str] = []
    with run.crew("Finance crew: EU revenue query"), run.agent("analyst", run.scoped("T-sql")):
        for args in LOOP_VARIANTS[:UNGUARDED_LOOP_LIMIT]:
            if guard is not None:
                decision = guard.check("analyst", LOOP_TOOL, args)
                check_spans.append(run.last_span)
                if not decision.allowed:
                    run.record(
                        "prevented",
                        reason=decision.reason,
                        agent="analyst",
                        tool=LOOP_TOOL,
                        signature=decision.signature,
                        span_id=run.last_span,
                    )
                    traced_call(run.telemetry, "report_failure", decision.degraded or {}, lambda: "reported")
                    break
            try:
                traced_call(run.telemetry, LOOP_TOOL, args, _failing_query)
            except LookupError:
                tool_spans.append(run.last_span)
    if not run.guarded:
        run.record(
            "looped_calls",
            agent="analyst",
            tool=LOOP_TOOL,
            signature=call_signature(LOOP_TOOL, LOOP_VARIANTS[0]),
            count=len(tool_spans),
            span_ids=tool_spans,
        )


SEARCH_TOPICS = [
    "Q3 revenue by region",
    "Q3 revenue by product line",
    "Q3 churn impact on revenue",
    "Q3 pricing changes",
    "Q3 enterprise deals",
    "Q3 self-serve growth",
    "Q3 partner revenue",
    "Q3 refunds",
    "Q3 discounts",
    "Q3 seasonality",
    "Q3 marketing spend",
    "Q3 analyst coverage",
]
MAX_STEPS_PER_AGENT = 6
MAX_TOTAL_STEPS = 8
# How many searches the researcher makes when it concludes (a healthy run), inclusive.
HEALTHY_SEARCHES = (3, 5)


def step_budget(run: SimRun) -> None:
    """A researcher keeps searching (all different queries) and never concludes.

    Unguarded: twelve searches until the script stops it. Guarded: a 6-step per-agent budget stops
    the researcher with a degraded result, and an 8-step crew budget stops the writer. Not
    injected: the researcher concludes after a few searches (how many varies by run, within the
    budget) and the writer writes.
    """
    with run.crew("Research crew: Q3 revenue background"):
        if not run.inject:
            _research_concluded(run, run.rng.randint(*HEALTHY_SEARCHES))
            return
        if not run.guarded:
            with run.agent("researcher", run.scoped("T-bg")):
                for topic in SEARCH_TOPICS:
                    traced_call(run.telemetry, "search_web", {"query": topic}, lambda: ["result"])
            run.record("runaway_steps", agent="researcher", tool="search_web", steps=len(SEARCH_TOPICS))
            with run.agent("writer", run.scoped("T-bg")):
                traced_call(
                    run.telemetry, "write_summary", {"sources": len(SEARCH_TOPICS)}, lambda: "summary.md"
                )
            return
        guard = ExecutionGuard(
            run.telemetry, max_steps_per_agent=MAX_STEPS_PER_AGENT, max_total_steps=MAX_TOTAL_STEPS
        )
        for agent, tool, topics in [
            ("researcher", "search_web", SEARCH_TOPICS),
            ("writer", "draft_section", SEARCH_TOPICS),
        ]:
            with run.agent(agent, run.scoped("T-bg")):
                for topic in topics:
                    decision = guard.check(agent, tool, {"query": topic})
                    if not decision.allowed:
                        run.record(
                            "budget_exhaustion",
                            agent=agent,
                            scope=_scope(decision.message),
                            max_steps=MAX_STEPS_PER_AGENT,
                            max_total_steps=MAX_TOTAL_STEPS,
                            steps_taken=guard.steps_of(agent),
                            span_id=run.last_span,
                        )
                        run.record("prevented", reason=decision.reason, agent=agent, span_id=run.last_span)
                        traced_call(
                            run.telemetry, "return_partial", decision.degraded or {}, lambda: "partial"
                        )
                        break
                    traced_call(run.telemetry, tool, {"query": topic}, lambda: ["result"])


def _research_concluded(run: SimRun, searches: int) -> None:
    """The step-budget crew when the researcher concludes after ``searches`` searches, each of
    which finds something new (the failure's searches all return the same result)."""
    topics = SEARCH_TOPICS[:searches]
    if not run.guarded:
        with run.agent("researcher", run.scoped("T-bg")):
            for topic in topics:
                traced_call(run.telemetry, "search_web", {"query": topic}, lambda t=topic: [f"notes on {t}"])
        with run.agent("writer", run.scoped("T-bg")):
            traced_call(run.telemetry, "write_summary", {"sources": len(topics)}, lambda: "summary.md")
        return
    guard = ExecutionGuard(
        run.telemetry, max_steps_per_agent=MAX_STEPS_PER_AGENT, max_total_steps=MAX_TOTAL_STEPS
    )
    for agent, tool, todo in [("researcher", "search_web", topics), ("writer", "draft_section", topics[:2])]:
        with run.agent(agent, run.scoped("T-bg")):
            for topic in todo:
                guard.check(agent, tool, {"query": topic})
                traced_call(run.telemetry, tool, {"query": topic}, lambda t=topic: [f"notes on {t}"])


def _scope(message: str) -> str:
    return "crew" if "crew" in message else "agent"


def healthy(run: SimRun) -> None:
    """A crew that coordinates correctly: fresh reads, carried constraints, current policy, one invoice."""
    with run.crew("Q3 report crew: healthy run"):
        if run.guarded:
            _healthy_guarded(run)
        else:
            _healthy_unguarded(run)


def _healthy_guarded(run: SimRun) -> None:
    origin = run.scoped("T-q3")
    store = VersionedStore(run.telemetry, salt=run.salt())
    ledger = ConstraintLedger(run.telemetry)
    registry = ObjectiveRegistry(run.telemetry, salt=run.salt())
    gate = PolicyGate(registry, "policy/comms")
    embedder = run.embedder or SentenceTransformerEmbedder()
    guard = ExecutionGuard(run.telemetry, root_goal="Analyze Q3 revenue trends", embedder=embedder)
    invoice = IdempotentTool("send_invoice", lambda payload: {"invoice_id": "INV-9001"}, run.telemetry)
    constraints = [{"id": "C1", "text": "Use only audited Q3 figures"}]
    criteria = [{"text": "Every figure traces to the audited Q3 ledger", "constraint_ids": ["C1"]}]
    with run.agent("planner", origin):
        gate.publish_policy("External messages must not include unaudited numbers.")
        ledger.open_task(origin, "Analyze Q3 revenue trends", constraints, to_agent="planner")
        store.write_state("report/q3/draft", {"sections": ["outline"]}, None)
        subtask = "Break down Q3 revenue trends by region and product line"
        guard.check("planner", "delegate", {"subtask": subtask, "to": "researcher"}, subtask_text=subtask)
        t1 = ledger.delegate(subtask, origin, constraints, criteria, {}, to_agent="researcher")["task_id"]
    with run.agent("researcher", t1):
        guard.check("researcher", "read_state", {"key": "report/q3/draft"})
        draft = store.read_state("report/q3/draft")
        guard.check("researcher", "write_state", {"key": "report/q3/draft", "add": "findings"})
        store.write_state(
            "report/q3/draft", {"sections": [*draft["value"]["sections"], "findings"]}, draft["version"]
        )
        subtask = "Draft the Q3 revenue trends report for the leadership team"
        guard.check("researcher", "delegate", {"subtask": subtask, "to": "writer"}, subtask_text=subtask)
        t2 = ledger.delegate(
            subtask, origin, constraints, criteria, {}, to_agent="writer", parent_task_id=t1
        )["task_id"]
    with run.agent("writer", t2):
        draft = store.read_state("report/q3/draft")
        store.write_state(
            "report/q3/draft", {"sections": [*draft["value"]["sections"], "summary"]}, draft["version"]
        )
    with run.agent("responder", t2):
        policy = gate.read_policy("responder")
        guard.check("responder", "send_customer_message", {"ticket_id": "T-5000"})
        gate.send_customer_message("T-5000", "Your Q3 report will arrive on Friday.", policy["version"])
        guard.check("responder", "send_invoice", {"order_id": "9001"})
        invoice({"order_id": "9001", "amount": "99.00"}, idempotency_key="invoice:order-9001")


def _healthy_unguarded(run: SimRun) -> None:
    origin = run.scoped("T-q3")
    plain = PlainStore(run.telemetry)
    notes = Scratchpad(run.telemetry, name="report/q3/notes")
    handoff = FreeTextDelegation(run.telemetry)
    outbox = UnguardedOutbox(run.telemetry)
    handoff.open_task(origin, "Analyze Q3 revenue trends")
    with run.agent("planner", origin):
        plain.set("report/q3/draft", {"sections": ["outline"]})
        t1 = handoff.delegate(
            "Break down Q3 revenue trends by region and product line",
            "Constraints: [C1] Use only audited Q3 figures",
            to_agent="researcher",
            parent_task_id=origin,
        )
    with run.agent("researcher", t1):
        draft = plain.get("report/q3/draft")
        plain.set("report/q3/draft", {"sections": [*draft["sections"], "findings"]})
        notes.append("EU revenue up 4% quarter on quarter")
        t2 = handoff.delegate(
            "Draft the Q3 revenue trends report for the leadership team",
            "Constraints: [C1] Use only audited Q3 figures",
            to_agent="writer",
            parent_task_id=t1,
        )
    with run.agent("writer", t2):
        notes.read_all()
        draft = plain.get("report/q3/draft")
        plain.set("report/q3/draft", {"sections": [*draft["sections"], "summary"]})
    with run.agent("responder", t2):
        outbox.send_customer_message("T-5000", "Your Q3 report will arrive on Friday.")
        traced_call(
            run.telemetry,
            "send_invoice",
            {"order_id": "9001", "amount": "99.00"},
            lambda: "INV-9001",
            side_effect=True,
        )
