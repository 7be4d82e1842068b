"""The Alerts page's pieces that need no Streamlit: the table of episodes and delivery problems."""

from __future__ import annotations

import pandas as pd

# What the page shows of an alert episode, in order; span_ids (the newest finding's evidence
# span) and run_id become links to the run explorer (ui.table).
SHOWN = [
    "state", "severity", "alertname", "summary", "findings", "starts_at", "ends_at", "delivered_to",
    "run_id", "span_ids",
]  # fmt: skip


def alert_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Alert episodes as the page lists them (the evidence span as ``span_ids`` so it links)."""
    shown = frame.rename(columns={"evidence_span": "span_ids"})
    shown = shown.assign(span_ids=shown["span_ids"].map(lambda span: [span] if isinstance(span, str) else []))
    return shown.reindex(columns=SHOWN)


def split_alerts(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(firing, resolved) episodes, each newest first."""
    firing = frame[frame["state"] == "firing"]
    resolved = frame[frame["state"] != "firing"]
    return firing, resolved


def delivery_problems(health: dict | None) -> list[str]:
    """One sentence per receiver whose deliveries fail, and for an evaluation error."""
    if not health or not health.get("enabled"):
        return []
    problems = []
    for name, status in (health.get("receivers") or {}).items():
        if status.get("consecutive_failures"):
            problems.append(
                f"Delivery to {name} is failing ({status['consecutive_failures']} attempt(s) in a row, "
                f"{status.get('failures', 0)} in all; last error at {status.get('last_error_at')}: "
                f"{status.get('last_error')}). Alerts stay queued in the store and are retried."
            )
    if health.get("last_error"):
        problems.append(f"Alert evaluation failed: {health['last_error']}")
    for rule, error in (health.get("rule_errors") or {}).items():
        problems.append(f"Rule {rule} could not be evaluated: {error}")
    return problems


def rule_states(health: dict | None, frame: pd.DataFrame) -> pd.DataFrame:
    """Each rule the collector evaluates (``rule_list`` of its alerting health) with its state:
    how many of its alerts fire now, and its look-back window."""
    rules = (health or {}).get("rule_list") or []
    firing = frame[frame["state"] == "firing"] if not frame.empty else frame
    counts = firing["alertname"].value_counts() if "alertname" in firing.columns else pd.Series(dtype=int)
    return pd.DataFrame(
        [
            {
                "rule": rule["name"],
                "state": f"firing ({int(counts[rule['name']])})" if rule["name"] in counts else "not firing",
                "severity": rule["severity"],
                "detector": rule["detector"],
                "looks_back": f"{rule['window_seconds'] / 60:g} min",
            }
            for rule in rules
        ],
        columns=["rule", "state", "severity", "detector", "looks_back"],
    )


def receivers_line(health: dict | None) -> str | None:
    """Which receivers the collector delivers to, or None when it has none (alerts are evaluated
    and shown, never sent)."""
    names = list((health or {}).get("receivers") or {})
    return ", ".join(names) if names else None
