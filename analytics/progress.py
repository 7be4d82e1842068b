"""No progress: an agent whose repeated calls of one tool keep returning the same result.

A crew can run far short of any length or loop threshold and still never converge: the demo's
unguarded step-budget run has a researcher send twelve different searches that all return the
same answer, and no other detector names it (its arguments differ, so it is no repeated-call loop;
it is 16 spans, under the runaway baseline). The signal, as no-progress checks in agent harnesses
use it, is the output: successful calls whose results are identical. Calls that fail every time
are repeated_calls' failing loops, and a group a guard refused calls of was stopped (a budget or
loop guard; budget_exhaustion names it), so neither is a finding here.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics._evidence import EVIDENCE, TIMES
from analytics.registry import register
from analytics.sql_loader import run_sql
from analytics.types import Filters, Window

# Successful calls of one tool by one agent, all with the same result, that make a finding. The
# sample crews' healthy runs return one result at most once per agent and tool (the largest
# group of calls sharing a result has 1 call); the never-converging run reaches 12 (searches that
# never find anything new). 4 leaves a healthy crew room for a retry or two.
MIN_NO_PROGRESS_CALLS = 4


@register(
    "no_progress",
    description="Repeated calls of one tool by one agent, with different arguments, that all "
    "returned the same result: the agent is not getting anywhere.",
    columns={
        **EVIDENCE,
        "agent": "agent that kept calling",
        "tool_name": "tool it called",
        "calls": f"executed calls of the tool in the run, all with one result ({MIN_NO_PROGRESS_CALLS}+)",
        "distinct_arguments": "distinct argument strings among them (2+)",
        "result": "the result every call returned (first 200 characters)",
        **TIMES,
    },
    row="one tool called by one agent in one run",
    failure_mode="no progress: repeated calls keep returning the same result",
    mast_category="task verification",
    title="no progress (same result)",
    findings=True,
    needs=(
        f"tool calls with their results (`gen_ai.tool.call.result`): one agent calling one tool "
        f"{MIN_NO_PROGRESS_CALLS} or more times with different arguments and the same result"
    ),
    counted=True,
    failing=True,
    rank_column="calls",
    page="loops",
    kept="run_id",
    order=[("first_seen", False), ("run_id", False), ("agent", False), ("tool_name", False)],
)
def no_progress(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Groups of one agent's calls of one tool whose executed calls all returned one result."""
    return run_sql(conn, "no_progress", window, filters, min_calls=MIN_NO_PROGRESS_CALLS)
