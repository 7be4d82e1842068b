"""What a run's telemetry does not let the detectors see, said per run (run_summary's ``coverage``).

Frameworks' default telemetry often leaves content out: Google ADK records neither messages nor
tool arguments unless told to, Strands keeps them in span events. A loop then has no arguments to
compare (and invisible arguments are not equal arguments: analytics/sql/repeated_calls.sql drops
such calls) and goal drift no task to score, so the run would read "healthy" by silence. The
coverage text says which detector cannot see what, and the setting that turns content capture on
for the instrumentation that left it out (docs/semantic-conventions.md has the same table).
"""

from __future__ import annotations

# Instrumentation scope -> the setting that puts message content and tool arguments on its spans.
CONTENT_SETTINGS = {
    "gcp.vertex.agent": "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY (Google ADK)",
    "strands.telemetry.tracer": "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental (Strands Agents)",
    "agent_framework": "enable_instrumentation(enable_sensitive_data=True) or ENABLE_SENSITIVE_DATA=true "
    "(Microsoft Agent Framework)",
    "opentelemetry.instrumentation.ag2": "TelemetryMiddleware(capture_content=True) (AG2)",
}
GENERIC_SETTING = "your framework's message-content capture (docs/semantic-conventions.md)"


def coverage_text(
    tool_calls: int, tool_calls_unrecorded: int, tasks_unrecorded: int, scope: str | None
) -> str | None:
    """The run's coverage note, None when every tool call has arguments and every sub-agent
    invocation a task. ``repeated calls and duplicate side effects`` / ``goal drift`` name the
    detectors that cannot see the run (fully or in part)."""
    gaps = []
    if tool_calls_unrecorded:
        share = (
            "" if tool_calls_unrecorded == tool_calls else f" ({tool_calls_unrecorded} of {tool_calls} calls)"
        )
        gaps.append(
            f"repeated calls and duplicate side effects not measurable{share}: "
            "this framework did not record tool arguments (loops of calls failing with the same "
            "error, or returning the same substantial output, are still found)"
        )
    if tasks_unrecorded:
        gaps.append(
            "goal drift not measurable: this framework did not record the task text handed to sub-agents"
        )
    if not gaps:
        return None
    setting = CONTENT_SETTINGS.get(scope or "", GENERIC_SETTING)
    return "; ".join(gaps) + f"; enable {setting}"
