"""Column documentation shared by detectors (evidence columns every finding carries)."""

from __future__ import annotations

EVIDENCE = {
    "trace_id": "trace of the finding (32 hex); the first one when it spans several",
    "span_ids": "list of SpanId (16 hex) of the spans behind the finding",
    "run_id": "run (gen_ai.conversation.id / session.id; the trace id when absent)",
}
TIMES = {
    "first_seen": "start of the earliest evidence span (naive UTC timestamp)",
    "last_seen": "start of the latest evidence span (naive UTC timestamp)",
}
THRESHOLD = {
    "threshold": "threshold value in force",
    "threshold_version": "thresholds.version used; 0 = uncalibrated default",
    "calibrated": "False while the uncalibrated default is in force",
}
