"""driftscope analytics: coordination-failure detectors over the ``spans`` table.

Importing the package registers every detector in ``analytics.registry.METRICS``. The order of
the imports below is the catalogue order (pages, tiles and reports list metrics in it): shared
state, constraints, goals, context, loops and budgets, then the tables built on them.
"""

# isort: off
from analytics import (  # noqa: F401  (registers)
    state,
    constraints,
    goals,
    context,
    context_fold,
    loops,
    loops_live,
    progress,
    runaway,
    summary,
    compare_kept,
    read_clickhouse,  # ClickHouse's reads of the findings tables (materialize.use_clickhouse_reads)
)

# isort: on
from analytics.registry import METRICS, Metric, list_metrics, register, run_metric
from analytics.types import Filters, Window

__all__ = ["METRICS", "Filters", "Metric", "Window", "list_metrics", "register", "run_metric"]
