"""`driftscope alerts check FILE` and `driftscope alerts test RULE`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from driftscope.settings import BY_NAME, ConfigError


def _describe(rule) -> str:
    limit = f"rate >= {rule.rate:g}" if rule.rate is not None else f">= {rule.threshold} finding(s)"
    filters = ", ".join(
        f"{key}={value}"
        for key, value in (("service", rule.service), ("agent", rule.agent), ("run", rule.run))
        if value
    )
    return (
        f"  {rule.name}: {rule.detector} {limit} in {rule.window_s:g}s, for {rule.for_s:g}s, "
        f"severity {rule.severity}" + (f", {filters}" if filters else "")
    )


def cmd_check(path: str) -> int:
    """Validate a rules file: the rules in force, or the line that is wrong and how to fix it."""
    from analytics.alert_rules import RuleError, load_rules

    try:
        rules = load_rules(path)
    except RuleError as exc:
        print(f"driftscope alerts check: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: {len(rules)} rule(s) in force")
    for rule in rules:
        print(_describe(rule))
    return 0


def cmd_test(rule_name: str, values: dict[str, Any]) -> int:
    """Send a sample firing alert of one rule to every configured receiver."""
    from datetime import timedelta

    from analytics.alert_rules import RuleError, load_rules
    from analytics.alerts import utcnow
    from driftscope.alert_receivers import DeliveryError, sample_notification
    from driftscope.alerting import build_receivers

    try:
        rules = load_rules(values.get("alert_rules"))
    except RuleError as exc:
        raise ConfigError(str(exc)) from None
    by_name = {rule.name: rule for rule in rules}
    if rule_name not in by_name:
        raise ConfigError(f"No rule named {rule_name!r} is in force; rules: {', '.join(by_name)}")
    receivers = build_receivers(
        values.get("alertmanager_url"),
        values.get("alert_webhook_url"),
        values.get("alert_webhook_secret"),
        values.get("alert_slack_url"),
        values["alert_dashboard_url"],
    )
    if not receivers:
        names = ", ".join(
            BY_NAME[n].flag for n in ("alertmanager_url", "alert_webhook_url", "alert_slack_url")
        )
        raise ConfigError(f"No receiver is configured: set one of {names} (or their DRIFTSCOPE_* variables)")
    notification = sample_notification(by_name[rule_name], values["alert_dashboard_url"])
    failed = 0
    for receiver in receivers:
        try:
            receiver.send([notification], utcnow(), timedelta(seconds=values["alert_interval"]))
            print(f"sent a sample {rule_name} alert to {receiver.name} ({receiver.url})")
        except DeliveryError as exc:
            failed += 1
            print(
                f"driftscope alerts test: {receiver.name} ({receiver.url}) did not accept it: {exc}",
                file=sys.stderr,
            )
        finally:
            receiver.close()
    return 1 if failed else 0


def cmd_alerts(args: argparse.Namespace, values: dict[str, Any]) -> int:
    if args.action == "check":
        return cmd_check(args.target)
    return cmd_test(args.target, values)
