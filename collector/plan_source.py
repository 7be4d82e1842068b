"""Python source of a mapping plan: the convention table specialised on the keys spans have.

``generate_plan(present, scope)`` writes the function ``collector.mapping_plans`` compiles and runs
for a group of spans whose attributes include the read keys ``present`` (the keys of ``RULES``'
sources and conditions; others are ignored) and whose scope is ``scope``: a source whose key is
absent is dropped, a present one reads the value at its position, a condition that reads nothing
per span (the scope, an absent key) is decided here, and each column becomes one or-chain of its
sources, the first non-empty one winning as in the reference mapper
(``collector.conventions.map_coordination``). Nothing here spells a key: all comes from ``RULES``,
``CONDITIONS`` and ``READERS``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Any

from collector import conventions as conv

_INDEX = conv._INDEX
_GET_CONSTANT = re.compile(r"get\(([A-Z_]+)\)")
_COLUMN_REF = re.compile(r"out\[COLUMN\['(\w+)'\]\]")
_BARE_GET = re.compile(r"(?<![.\w])get\b")


def _condition_keys(condition: str) -> list[str]:
    return [conv._ENV[name] for name in _GET_CONSTANT.findall(condition)]


def read_keys(rules: Sequence[conv.Rule] = conv.RULES) -> frozenset[str]:
    """Every span attribute key the table reads: the plain keys of its sources and the keys its
    conditions look at (a reader's own look-ups, like smolagents' task text, read the span's
    attributes through a dict built when that reader runs)."""
    keys: set[str] = set()
    for rule in rules:
        for source in rule.sources:
            if ":" not in source.key:
                keys.add(source.key)
            if source.when:
                keys.update(_condition_keys(conv.CONDITIONS[source.when]))
    return frozenset(keys)


READ_KEYS = read_keys()
# Rules that copy one attribute as it is into a text column: key -> column index. Copied for
# every span before the plans run, which then leave them alone.
DIRECT_TEXT = {
    rule.sources[0].key: _INDEX[rule.column]
    for rule in conv.RULES
    if conv.is_direct(rule) and rule.kind == "text"
}


# Names a plan's expressions bind per span; anything else in a condition is fixed by the plan.
_PER_SPAN = frozenset({"s_vals", "s_keys", "s_off", "o", "i", "name", "events", "ev", "v", "resource_value"})
_LOCAL = re.compile(r"x\d+")


def _scopes_compared(conditions: Mapping[str, str]) -> frozenset[str]:
    """The scope names the conditions compare with. A plan is generated for one of them or for
    "any other scope", which is exact only while conditions compare ``scope`` with ``==`` / ``!=``
    against named scope constants: anything else raises here, at import."""
    known: set[str] = set()
    for when, text in conditions.items():
        tree = ast.parse(text, mode="eval")
        compared = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "scope":
                names = [c.id for c in node.comparators if isinstance(c, ast.Name)]
                if len(names) != len(node.comparators) or not all(
                    isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops
                ):
                    raise ValueError(f"condition {when!r}: compare scope only with == / != to a named scope")
                known.update(conv._ENV[n] for n in names)
                compared.add(id(node.left))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "scope" and id(node) not in compared:
                raise ValueError(f"condition {when!r}: compare scope only with == / != to a named scope")
    return frozenset(known)


KNOWN_SCOPES = _scopes_compared(conv.CONDITIONS)
OTHER_SCOPE = "\x00any other scope"


def _fold(node: ast.expr) -> ast.expr | bool:
    """``node`` with every part that reads nothing per span evaluated (and/or short-cut)."""
    if isinstance(node, ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        kept = []
        for value in node.values:
            folded = _fold(value)
            if isinstance(folded, bool):
                if folded != is_and:
                    return folded  # a False in an and, a True in an or
                continue
            kept.append(folded)
        if not kept:
            return is_and
        return kept[0] if len(kept) == 1 else ast.BoolOp(node.op, kept)
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    if names & _PER_SPAN or any(_LOCAL.fullmatch(n) for n in names):
        return node
    expression = ast.fix_missing_locations(ast.Expression(node))
    return bool(eval(compile(expression, "<fold>", "eval"), dict(conv._ENV)))  # noqa: S307 (our own table)


class _Plan:
    """Generates one plan's source: ``present`` maps each present read key to its slot in the
    positions tuple ``P`` (span ``i``'s value of that key is ``s_vals[s_off[i] + P[slot]]``);
    ``scope`` is the spans' scope (one of ``KNOWN_SCOPES`` or ``OTHER_SCOPE``)."""

    def __init__(self, present: Mapping[str, int], scope: str) -> None:
        self.present = present
        self.scope = scope
        self.constant: dict[int, Any] = {}  # columns no source of which can apply: their value
        self.lines: list[str] = []

    def get(self, key: str) -> str:
        slot = self.present.get(key)
        return "None" if slot is None else f"s_vals[o + p{slot}]"

    def column(self, name: str) -> str:
        index = _INDEX[name]
        return repr(self.constant[index]) if index in self.constant else f"x{index}"

    def condition(self, when: str) -> str | bool:
        text = conv.CONDITIONS[when]
        text = _COLUMN_REF.sub(lambda m: self.column(m.group(1)), text)
        text = _GET_CONSTANT.sub(lambda m: self.get(conv._ENV[m.group(1)]), text)
        tree = ast.parse(text, mode="eval").body
        for node in ast.walk(tree):  # the plan's one scope, as a constant (_scopes_compared)
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "scope":
                node.left = ast.Constant(self.scope)
        folded = _fold(tree)
        return folded if isinstance(folded, bool) else ast.unparse(folded)

    def raw(self, source: conv.Source) -> str | None:
        """The expression of a source's raw value (None: the key is absent from these spans)."""
        key = source.key
        if key.startswith("resource:"):
            return f"resource_value(i, {key[len('resource:') :]!r})"
        if key == "span:name":
            return "name"
        if key.startswith("column:"):
            index = _INDEX[key[len("column:") :]]
            if index in self.constant:  # a column no source of which applies to these spans
                return None if self.constant[index] in (None, "") else repr(self.constant[index])
            if index in DIRECT_TEXT.values():
                return f"c{index}[i]"
            return f"x{index}"
        if key.startswith("event:"):
            event, attribute = conv.event_key(source)
            # event_values answers None at once for a JSON text that does not name the event
            return (
                f"(((ev := events[i]).__class__ is not str or {event!r} in ev) "
                f"and event_values(ev, {event!r}, {attribute!r}))"
            )
        return self.get(key) if key in self.present else None

    def chain(self, rule: conv.Rule) -> list[str]:
        """Each applicable source as an expression that is its value, or falsy to give way."""
        parts = []
        for source in rule.sources:
            raw = self.raw(source)
            if raw is None:
                continue
            test = self.condition(source.when) if source.when else True
            if test is False:
                continue
            if source.read:
                reader = _BARE_GET.sub(
                    "dict(zip(s_keys[o : s_off[i + 1]], s_vals[o : s_off[i + 1]])).get",
                    conv.READERS[source.read],
                )
                raw = f"((v := {raw}) and ({reader}))"
            parts.append(raw if test is True else f"({test} and {raw})")
        return parts

    def rule(self, rule: conv.Rule) -> None:
        index, emit = _INDEX[rule.column], self.lines.append
        if conv.is_direct(rule):
            key = rule.sources[0].key
            if rule.kind == "text":  # copied before the plans run (copy_columns), for every span
                if key not in self.present:
                    self.constant[index] = None
                return
            if key in self.present:  # kept as it is, even ''
                emit(f"        c{index}[i] = {_DIRECT[rule.kind].format(self.get(key))}")
            else:
                self.constant[index] = None
            return
        parts = self.chain(rule)
        if rule.column == "run_id":  # a span with no run takes its trace id
            emit(f"        c{index}[i] = {' or '.join([*parts, 'trace_ids[i]'])}")
            return
        if not parts:
            self.constant[index] = rule.default
            if rule.default is not None:
                emit(f"        c{index}[i] = {rule.default!r}")
            return
        if rule.kind == "text":
            value = " or ".join([*parts, repr(rule.default)])
        else:
            chain = " or ".join([*parts, "None"])
            value = f"{_COERCER[rule.kind]}(v) if (v := ({chain})) is not None else {rule.default!r}"
        emit(f"        x{index} = c{index}[i] = {value}")


# A present direct key's value (a str: the decoders' string map) -> the column's, as the
# reference coerces it (for ints the common case, a short run of ASCII digits, first).
_DIRECT = {
    "text": "{}",
    "int": "(int(v) if (v := {}).isdigit() and v.isascii() and len(v) < 10 else int_(v))",
    "bool": "bool_({})",
    # a batch repeats few lists (constraint ids): each text is read once, each row gets a copy
    "list": "(list(t) if (t := lists.get(v := {})) is not None else list_once(v, lists))",
}
_COERCER = {"int": "int_", "bool": "bool_", "list": "str_list"}


def generate_plan(
    present: Mapping[str, int], scope: str = OTHER_SCOPE, rules: Sequence[conv.Rule] = conv.RULES
) -> str:
    """Python source of ``plan(G, s_off, s_keys, s_vals, names, events, trace_ids,
    resource_value, lists, cols, P)``, which writes the coordination columns of the spans ``G`` (row
    indices, all with the read keys ``present`` and the scope ``scope``) into ``cols`` (one list
    per column, preset to None)."""
    plan = _Plan(present, scope)
    for rule in rules:
        plan.rule(rule)
    lines = plan.lines
    for n, line in enumerate(lines):  # a local only for columns later rules read
        local = re.match(r"        (x\d+) = ", line)
        if local and not any(re.search(rf"\b{local.group(1)}\b", later) for later in lines[n + 1 :]):
            lines[n] = "        " + line[len(local.group(0)) :]
    body = "\n".join(lines)
    used = sorted({int(c) for c in re.findall(r"\bc(\d+)\[i\]", body)})
    head = ["def plan(G, s_off, s_keys, s_vals, names, events, trace_ids, resource_value, lists, cols, P):"]
    if present:
        head.append(f"    {', '.join(f'p{n}' for n in range(len(present)))}, = P")
    head += [f"    c{c} = cols[{c}]" for c in used]
    head += ["    for i in G:", "        o = s_off[i]"]
    if re.search(r"\bname\b", body):
        head.append("        name = names[i]")
    return "\n".join(head) + "\n" + body + "\n"
