"""How much of a property test's random input a tier runs (docs/testing.md).

`make test-fast` (the inner loop) sets ``DRIFTSCOPE_TEST_QUICK=1``: the random-batch properties
whose one seed is in that tier feed fewer batches there. `make test` and `make test-deep` leave it
unset and run every batch of every seed they select.
"""

from __future__ import annotations

import os

QUICK = os.environ.get("DRIFTSCOPE_TEST_QUICK") == "1"


def batches(full: int, quick: int) -> int:
    """``quick`` batches in `make test-fast`, ``full`` otherwise."""
    return quick if QUICK else full
