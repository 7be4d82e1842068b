"""The code-action parser on model outputs as real CodeAgent runs write them."""

from __future__ import annotations

import json

from analytics.code_actions import code_blocks, code_calls, declared_tool_names


def _message(content: str) -> str:
    return json.dumps({"role": "assistant", "content": content})


def test_a_tool_call_in_a_code_block_is_found_with_its_arguments():
    output = _message('Thought: search.\n<code>\nr = web_search(query="EU revenue 2024")\nprint(r)\n</code>')
    assert code_calls(output) == [("web_search", '{"query":"EU revenue 2024"}')]


def test_escape_sequences_prose_and_keywords_are_not_calls():
    # GAIA-style output: the regex parser read `\n(` as a call of `n` and "the (...)" as `the`.
    content = (
        "Thought: I will check the (cached) value and not (re)compute it, True (as before).\n"
        "<code>\n"
        'text = "line one\\n(two)\\t(three)"\n'
        "if not (len(text) > 3) and True:\n"
        '    print(f"{text!r} (done)")\n'
        "</code>"
    )
    assert code_calls(_message(content)) == []


def test_builtins_classes_and_functions_the_code_defines_are_not_calls():
    content = (
        "```py\n"
        "class TrieNode:\n"
        "    def __init__(self):\n"
        "        self.children = {}\n"
        "def insert(root, word):\n"
        "    node = root\n"
        "    for ch in word:\n"
        "        node = node.children.setdefault(ch, TrieNode())\n"
        "root = TrieNode()\n"
        "for w in sorted(set(words)):\n"
        "    insert(root, w)\n"
        "print(root.__contains__('x'), len(words))\n"
        "result = lookup_word(word='trie')\n"
        "```"
    )
    assert code_calls(content) == [("lookup_word", '{"word":"trie"}')]


def test_a_fenced_block_that_is_prose_gives_no_calls():
    content = "Here is the plan:\n```\nfirst search the web (for the report) and then answer (briefly).\n```"
    assert code_blocks(content) == ["first search the web (for the report) and then answer (briefly).\n"]
    assert code_calls(content) == []


def test_calls_keep_source_order_and_non_literal_arguments_are_their_source():
    content = (
        "<code>\nfor q in queries:\n    web_search(q)\nsend_report(to=ADDRESS, body=summary(x))\n</code>"
    )
    assert code_calls(content) == [
        ("web_search", "q"),
        ("send_report", '{"to":"ADDRESS","body":"summary(x)"}'),
        ("summary", "x"),
    ]


def test_output_without_code_or_not_text_gives_nothing():
    assert code_calls("I will call web_search(query='x') next.") == []
    assert code_calls(None) == []  # type: ignore[arg-type]


def test_declared_tool_names_read_names_and_definitions_of_every_convention():
    assert declared_tool_names('["web_search", "final_answer"]') == ["web_search", "final_answer"]
    genai = '[{"type": "function", "name": "web_search", "parameters": null}, {"name": "send_report"}]'
    assert declared_tool_names(genai) == ["web_search", "send_report"]
    openinference = '{"type": "function", "function": {"name": "web_search", "parameters": {}}}'
    assert declared_tool_names(openinference) == ["web_search"]
    for nothing in ("", "not json", "42", '{"type": "function"}', '[null, 3, {"function": "x"}]'):
        assert declared_tool_names(nothing) == []
