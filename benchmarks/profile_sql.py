"""Where a detector's SQL spends its time: `python -m benchmarks.profile_sql DB NAME [NAME ...]`.

Runs ``EXPLAIN ANALYZE`` of ``analytics/sql/<NAME>.sql`` (all spans, no filters) on a read-only
copy of a span database and prints the most expensive operators; used for docs/performance.md.
"""

from __future__ import annotations

import json
import sys

import duckdb

# Extra parameters some detectors pass to their SQL (their default thresholds; goal SQL: the
# scorer whose stored scores it joins, the default threshold and listing limits).
EXTRA_PARAMS = {"similarity": 0.8, "threshold": 0.45, "max_chains": 40, "pending_limit": 100_000,
                # repeated_calls: its neighbour window, minimum calls and (no) agent task statements
                "neighbours": 4, "min_calls": 3, "agent_inputs": [], "agent_tasks": [],
                "min_output_words": 5, "code_outputs": [], "code_tools": [], "code_args": [],
                "declared_runs": [], "declared_agents": [], "declared_tools": [],
                "loop_runs": None, "group_runs": [], "group_tools": [], "loop_whole_runs": [],
                "all_calls": False}  # fmt: skip


def operator_times(conn: duckdb.DuckDBPyConnection, name: str, top: int = 8) -> dict:
    """Total seconds and the ``top`` operators by their own time for detector SQL ``name``."""
    from analytics.goals import SCORER, ensure_scores_table
    from analytics.sql_loader import filter_params, load_sql, mentioned_params, prune_unset_filters
    from analytics.types import Filters, Window

    ensure_scores_table(conn)  # the goal SQL reads the stored and this connection's scores
    sql = load_sql(name)
    params = {**filter_params(Window(), Filters()), **EXTRA_PARAMS, "scorer": SCORER}
    sql = prune_unset_filters(sql, params)  # what query_df runs: unset filters dropped
    used = mentioned_params(sql)
    conn.execute("PRAGMA enable_profiling = 'json'")
    conn.execute("PRAGMA profiling_output = ''")
    rows = conn.execute("EXPLAIN ANALYZE " + sql, {k: params[k] for k in used}).fetchall()
    conn.execute("PRAGMA disable_profiling")
    plan = json.loads(rows[0][1])
    found: list[tuple[float, str, int]] = []

    def walk(node: dict) -> None:
        timing = node.get("timing", node.get("operator_timing"))
        if timing is not None and node.get("name") not in ("RESULT_COLLECTOR", "EXPLAIN_ANALYZE"):
            label = node.get("name") or node.get("operator_name") or "?"
            extra = node.get("extra_info") or {}
            detail = (
                extra.get("Conditions")
                or extra.get("Aggregates")
                or extra.get("Groups")
                or extra.get("Table")
                or ""
            )
            rows = int(node.get("intermediate_rows", node.get("operator_cardinality", 0)) or 0)
            found.append((float(timing), f"{label.strip()} {str(detail)[:120]}", rows))
        for child in node.get("children", []) + node.get("operator", []):
            walk(child)

    walk(plan)
    found.sort(reverse=True)
    return {
        "latency_s": plan.get("latency"),
        "operator_seconds_total": round(sum(t for t, _, _ in found), 3),
        "top_operators": [{"seconds": round(t, 3), "operator": o, "rows": r} for t, o, r in found[:top]],
    }


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) < 2:
        print(__doc__)
        return 2
    conn = duckdb.connect(args[0], read_only=True)
    for name in args[1:]:
        print(name, json.dumps(operator_times(conn, name), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
