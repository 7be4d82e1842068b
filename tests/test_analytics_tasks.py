"""Task-statement extraction: pure functions, no model."""

from __future__ import annotations

import json

from analytics.tasks import extract_task, last_user_message, task_from_text, truncate_task


def test_plain_short_task_is_kept():
    assert extract_task("  Book a flight to Tokyo  ") == "Book a flight to Tokyo"
    assert extract_task("") is None and extract_task(None) is None


def test_json_task_fields_win_over_other_fields():
    payload = {"system": "You are a helpful agent. " * 50, "question": "Which venues fit 25 people?"}
    assert extract_task(json.dumps(payload)) == "Which venues fit 25 people?"
    assert extract_task({"Objective": "Reduce latency"}) == "Reduce latency"
    assert extract_task({"inputs": {"task": "Summarise the trials"}}) == "Summarise the trials"


def test_chat_messages_take_last_user_message_not_system_or_tool():
    messages = [
        {"role": "system", "content": "You are a research agent. Always cite sources."},
        {"role": "user", "content": "Find hotels in Lisbon"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "search"}]},
        {"role": "tool", "content": '{"results": [1, 2, 3]}'},
        {"role": "user", "content": [{"type": "text", "text": "Only those under 150 EUR a night"}]},
    ]
    assert extract_task(json.dumps({"messages": messages})) == "Only those under 150 EUR a night"
    assert last_user_message([["system", "rules"], ["human", "do the thing"]]) == "do the thing"


def test_langchain_serialized_messages_nested_batches():
    message = {
        "lc": 1,
        "type": "constructor",
        "id": ["langchain", "schema", "messages", "HumanMessage"],
        "kwargs": {"content": "Plan the offsite agenda", "type": "human"},
    }
    system = {
        "lc": 1,
        "type": "constructor",
        "id": ["langchain", "schema", "messages", "SystemMessage"],
        "kwargs": {"content": "You are a planner", "type": "system"},
    }
    assert extract_task(json.dumps({"messages": [[system, message]]})) == "Plan the offsite agenda"


def test_plain_text_prompt_drops_preamble_before_task_marker():
    prompt = (
        "You are an expert travel agent.\nFollow the rules below.\n- be brief\n\nTask: Book a hotel in Rome"
    )
    assert extract_task(prompt) == "Book a hotel in Rome"
    assert task_from_text("Context here. Your task is to write the summary.") == "write the summary."


def test_truncation_keeps_the_task_not_the_preamble():
    preamble = "\n\n".join(f"Rule {i}: " + "always be careful " * 10 for i in range(30))
    long_prompt = preamble + "\n\nPlease compare the three vendor quotes and pick the cheapest."
    task = extract_task(long_prompt, max_chars=300)
    assert task.endswith("pick the cheapest.") and len(task) <= 300
    assert truncate_task("short", 100) == "short"
    long_task = "word " * 400
    assert len(truncate_task(long_task.strip(), 100)) <= 100
