"""driftscope analytics: coordination-failure detectors over the ``spans`` table.

Importing the package registers every detector in ``analytics.registry.METRICS``.
"""

from analytics import constraints, context, goals, loops, runaway, state, summary  # noqa: F401  (registers)
from analytics.registry import METRICS, Metric, list_metrics, register, run_metric
from analytics.types import Filters, Window

__all__ = ["METRICS", "Filters", "Metric", "Window", "list_metrics", "register", "run_metric"]
