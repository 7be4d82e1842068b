"""Counters the receivers keep for /api/v1/health (in memory; reset at restart)."""

from __future__ import annotations

import threading
from collections import Counter


class IngestStats:
    """Thread-safe counters: requests by transport and outcome, spans accepted / rejected."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
