"""Pure functions that find the tool calls a code agent's model output makes.

A code agent (smolagents' CodeAgent and the like) acts by writing Python in a ``<code>`` or
fenced block of its model output. Real outputs mix that code with prose, escaped strings,
builtins, keywords and classes the code defines itself, so a call is only what Python's own
parser (``ast``) finds in a block that parses: ``name(...)`` where ``name`` is a plain name the
code does not bind itself (no ``def``/``class``/assignment/import/loop target of that name) and
not a Python builtin. Whether the name is a tool the agent has is decided against its declared
tool list (``declared_tool_names`` reads one), else the run's tool spans
(analytics/sql/repeated_calls.sql), not here.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
import warnings

# `<code>...</code>` (smolagents >= 1.20) and fenced ```py / ```python / bare ``` blocks.
_BLOCKS = re.compile(r"(?s)<code>(.*?)</code>|```(?:py|python|python3)?[ \t]*\n(.*?)```")
_BUILTINS = frozenset(dir(builtins))
# An argument longer than this is cut: the loop detector compares argument words, not documents.
MAX_ARGS_CHARS = 2000


def code_blocks(output: str) -> list[str]:
    """The code blocks of a model output (its message content when the output is a JSON message)."""
    if not isinstance(output, str) or ("<code>" not in output and "```" not in output):
        return []
    text = output
    if text.startswith("{"):
        try:
            message = json.loads(text)
        except ValueError:
            message = None
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            text = message["content"]
    return [first if first is not None and first != "" else second for first, second in _BLOCKS.findall(text)]


# Invalid escapes in the model's strings warn while a block is parsed (DeprecationWarning before
# Python 3.12, SyntaxWarning since): ignored for the blocks parsed here only, by the file name
# they are parsed under. A filter set once, not catch_warnings around each parse, which swaps the
# process's filters and is not safe beside other threads (the materializer parses while reads run).
_BLOCK_FILE = "<driftscope-code-action>"
for _category in (SyntaxWarning, DeprecationWarning):
    warnings.filterwarnings("ignore", category=_category, module=re.escape(_BLOCK_FILE))


def _parse(block: str) -> ast.Module | None:
    try:
        return ast.parse(block, filename=_BLOCK_FILE)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _bound_names(tree: ast.Module) -> set[str]:
    """Names the code binds itself: its own functions, classes, variables, imports, loop targets."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".", 1)[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound


def _arguments(call: ast.Call, block: str) -> str:
    """A call's arguments as compact JSON: keyword arguments as an object, positional ones as a
    list (``{"args": [...], "kwargs": {...}}`` when it has both); a value that is not a literal is
    its source text."""

    def value(node: ast.expr) -> object:
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return ast.get_source_segment(block, node) or ""

    args = [value(node) for node in call.args if not isinstance(node, ast.Starred)]
    kwargs = {kw.arg: value(kw.value) for kw in call.keywords if kw.arg is not None}
    if kwargs and args:
        found: object = {"args": args, "kwargs": kwargs}
    elif kwargs:
        found = kwargs
    elif len(args) == 1 and isinstance(args[0], str):
        return args[0][:MAX_ARGS_CHARS]
    else:
        found = args[0] if len(args) == 1 else args
    text = json.dumps(found, ensure_ascii=False, separators=(",", ":"), default=str)
    return text[:MAX_ARGS_CHARS]


def code_calls(output: str) -> list[tuple[str, str]]:
    """``(name, arguments)`` of every call of a free name in the code blocks of a model output,
    in source order. Blocks that do not parse as Python (prose in a fence) give nothing."""
    found: list[tuple[str, str]] = []
    for block in code_blocks(output):
        tree = _parse(block)
        if tree is None:
            continue
        bound = _bound_names(tree)
        calls = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id not in bound
            and node.func.id not in _BUILTINS
        ]
        calls.sort(key=lambda node: (node.lineno, node.col_offset))
        found.extend((node.func.id, _arguments(node, block)) for node in calls)
    return found


def declared_tool_names(value: str) -> list[str]:
    """The tool names in one declared tool list attribute (analytics/sql/_declared_tool_key.sql):
    a JSON list of names (``["web_search", "final_answer"]``) or of definitions (``{"name": ...}``
    or ``{"type": "function", "function": {"name": ...}}``), or one definition. Anything else
    declares nothing."""
    try:
        found = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return []
    names = []
    for item in found if isinstance(found, list) else [found]:
        if isinstance(item, dict):
            function = item.get("function")
            item = function.get("name") if isinstance(function, dict) else item.get("name")
        if isinstance(item, str) and item:
            names.append(item)
    return names
