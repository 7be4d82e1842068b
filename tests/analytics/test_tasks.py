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


# smolagents' managed-agent prompt (smolagents/prompts/toolcalling_agent.yaml, `managed_agent.task`),
# as the sub-agent's `<name>.run` span carries it in OpenInference `input.value`.
SMOLAGENTS_MANAGED_TASK = """You're a helpful agent named 'search_agent'.
You have been submitted this task by your manager.
---
Task:
{task}
---
You're helping your manager solve a wider task: so make sure to not provide a one-line answer, \
but give as much information as possible to give them a clear understanding of the answer.

Your final_answer WILL HAVE to contain these parts:
### 1. Task outcome (short version):
### 2. Task outcome (extremely detailed version):
### 3. Additional context (if relevant):

Put all these in your final_answer tool, everything that you do not pass as an argument to \
final_answer will be lost.
And even if your task resolution is not successful, please return as much context as possible, \
so that your manager can act upon this feedback."""


def test_smolagents_managed_agent_prompt_gives_the_request_not_the_boilerplate():
    request = "Find Northwind Traders' EU revenue for fiscal year 2024."
    prompt = SMOLAGENTS_MANAGED_TASK.format(task=request)
    run_input = json.dumps({"task": prompt, "stream": False, "reset": True, "images": None})
    assert extract_task(run_input) == request
    # a long request keeps its own paragraphs, still without the template's instructions
    long_request = "Compare Globex's revenue in 2023 and 2024.\n\n" + "Use the annual reports. " * 60
    extracted = extract_task(json.dumps({"task": SMOLAGENTS_MANAGED_TASK.format(task=long_request)}))
    assert extracted.startswith("Compare Globex's revenue") and "final_answer" not in extracted


def test_a_rule_line_closes_the_task_section_only_after_a_marker():
    assert task_from_text("Task: Book a room\n---\nAlways answer in JSON.") == "Book a room"
    assert task_from_text("Intro\n---\nBook a room for 5") == "Intro\n---\nBook a room for 5"


def test_genai_semconv_messages_with_parts():
    messages = [
        {"role": "system", "parts": [{"type": "text", "content": "You find facts about companies."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What was Northwind's EU revenue in 2024?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "ask", "arguments": "{}"}]},
        {"role": "user", "parts": [{"type": "tool_call_response", "id": "c1", "result": "EUR 412 million"}]},
    ]
    assert extract_task(json.dumps(messages)) == "What was Northwind's EU revenue in 2024?"


def test_crewai_task_prompt_gives_the_description_not_the_instructions():
    # CrewAI's translations (en.json): the task description, then `expected_output` and `task`.
    prompt = (
        "Find a recipe for Neapolitan pizza dough with high hydration.\n\n"
        "This is the expected criteria for your final answer: Your best answer to your coworker.\n"
        "you MUST return the actual complete content as the final answer, not a summary.\n\n"
        "This is the context you're working with:\nThe user asked the crew this question."
    )
    assert extract_task(prompt) == "Find a recipe for Neapolitan pizza dough with high hydration."
    react = "\nCurrent Task: What is Fabrikam's market share?\n\nBegin! This is VERY important to you, use the tools"
    assert extract_task(react) == "What is Fabrikam's market share?"
